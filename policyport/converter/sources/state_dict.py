"""torch ``state_dict`` files whose architecture is read from their keys and shapes.

Layouts (the first that fits every key wins; a file that fits none is refused with the keys that
did not fit):

* **SB3 ``ActorCriticPolicy``** (PPO, A2C; ``stable_baselines3/common/policies.py``, ``torch_layers.py``):
  ``mlp_extractor.policy_net.<i>`` / ``value_net.<i>`` (``nn.Sequential`` of Linear and activation,
  an activation after every Linear), optional ``mlp_extractor.shared_net.<i>`` before both (SB3 < 1.8),
  ``action_net`` (logits, or the Gaussian mean), ``log_std`` (Box actions), ``value_net``;
  parameter-free ``features_extractor`` (``nn.Flatten``). Activation: tanh unless told.
* **SB3 actors**: SAC ``actor.latent_pi.<i>``, ``actor.mu``, ``actor.log_std``; TD3/DDPG ``actor.mu.<i>``
  ending in ``nn.Tanh``; critics (``critic.*``, ``critic_target.*``, ``actor_target.*``) are not exported.
  Activation: relu unless told.
* **SB3 Q-networks**: DQN ``q_net.q_net.<i>`` (``stable_baselines3/dqn/policies.py``, ``QNetwork``: a
  ``create_mlp`` Sequential whose last Linear outputs one Q-value per action) and sb3-contrib's QR-DQN
  ``quantile_net.quantile_net.<i>`` (``sb3_contrib/qrdqn/policies.py``, ``QuantileNetwork``: the last
  Linear outputs ``n_quantiles * n_actions`` values); the target network (``q_net_target.*``,
  ``quantile_net_target.*``) is not exported. Activation: relu unless told.
* **RLlib torch ``FullyConnectedNetwork``** (``ray/rllib/models/torch/fcnet.py``; ``SlimFC`` is
  ``nn.Sequential(Linear, activation)``): ``_hidden_layers.<i>._model.0``, ``_logits._model.0``,
  ``_value_branch_separate.<i>._model.0``, ``_value_branch._model.0``,
  ``_append_free_log_std.log_std``. Activation: tanh (RLlib's ``fcnet_activation``) unless told.
* **``nn.Sequential``**: ``<i>.weight`` ... with an optional common prefix. Linear (2-D ``weight``),
  LayerNorm (1-D ``weight`` and ``bias``; GroupNorm and a BatchNorm1d without running statistics hold
  the same, so it is an assumption, as is the eps of torch's default), BatchNorm1d in eval mode
  (``running_mean``/``running_var``; its eps assumed). A 1-D ``weight`` alone (LayerNorm without bias,
  RMSNorm and PReLU hold one) is refused. An index without parameters between two layers is an
  activation module (which one the keys cannot say: give ``activation``, one per run of such indices
  or one per index); leading ones are a ``Flatten``; a module after the last one with parameters (a
  Tanh, a Softmax) is not in the keys, and none is assumed.

Tensor names follow module paths: ``mlp_extractor.policy_net.0/linear``,
``mlp_extractor.policy_net.1/tanh``; the last layer's raw output is ``logits``.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Mapping

import numpy as np

from ...errors import BadModelError, OptionError, listing
from ..activations import Activation, ActivationNeeded, parse_activation
from ..assumptions import Assumption, joined
from ..build import GAUSSIAN_HEADS, NO_HEAD, ActionHead, Dense, MlpSpec, Step

SB3_AC_PREFIXES = ("mlp_extractor.", "action_net.", "value_net.", "log_std", "features_extractor.",
                   "pi_features_extractor.", "vf_features_extractor.")
RLLIB_KEY = re.compile(r"^(_hidden_layers\.\d+|_logits|_value_branch_separate\.\d+|_value_branch)\._model\.0\.(weight|bias)$"
                       r"|^_append_free_log_std\.log_std$")
#: A key of the Q-network of SB3's DQN (``q_net.q_net.0.weight``) or sb3-contrib's QR-DQN
#: (``quantile_net.quantile_net.0.weight``); their target networks are ``q_net_target.q_net...``.
SB3_Q_KEY = re.compile(r"^(q_net|quantile_net)\.\1\.")
SEQ_KEY = re.compile(r"^(?P<prefix>(?:.*\.)?)(?P<index>\d+)\.(?P<param>weight|bias|running_mean|running_var|num_batches_tracked)$")


def read_arrays(path, trust: bool = False):
    """The arrays of a ``.pt``/``.pth``/``.safetensors``/``.npz`` file (or a dict of arrays) and provenance.

    Returns:
        ``(arrays or a torch module, provenance)``: a whole pickled module (``trust`` only) comes
        back as the module itself.
    """
    from ...io.arrays import load_arrays
    from ..readers.torch_files import as_state_dict, load_torch_file, read_safetensors

    if isinstance(path, Mapping):  # a dict of arrays (RLlib's policy.get_weights())
        return as_state_dict({str(k): np.asarray(v) for k, v in path.items()}, "the weights"), {}
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        value = read_safetensors(path)
    elif suffix == ".npz":
        value = load_arrays(path)
    else:
        value = load_torch_file(path, trust=trust)
    if trust and _is_module(value):
        return value, {"kind": "torch", "file": path.name}
    provenance = {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], dict):
        from .cleanrl_keys import cleanrl_script_of

        script = cleanrl_script_of(value[0])
        if script is not None:
            raise BadModelError(f"{path} holds a {type(value).__name__} of {len(value)} state_dicts, the first with the keys of "
                                f"CleanRL's {script} actor; convert it with --from cleanrl (kind='cleanrl' in Python)")
    return as_state_dict(value, path), provenance


def _is_module(value) -> bool:
    try:
        import torch
    except ImportError:
        return False
    return isinstance(value, torch.nn.Module)


def td3_tanh_scope(spec: MlpSpec) -> str:
    """The module path of the ``nn.Tanh`` that ends a TD3/DDPG ``actor.mu`` (after its last Linear)."""
    return f"actor.mu.{int(spec.output.name.rsplit('.', 1)[1]) + 1}"


# ---------------------------------------------------------------------------------------------
# nn.Sequential, the building block of every layout


#: The end of the refusal of an SB3 state_dict converted without ``--activation``.
SB3_UNNAMED = (" (SB3 builds them all with one activation_fn: tanh by default for PPO/A2C, relu for SAC/TD3/DQN, "
               "and RL Zoo's tunings often change it), or convert the SB3 zip, whose policy_kwargs record it")

#: How to convert a source whose modules the state_dict cannot tell (refusals end with it).
CONVERT_THE_MODULE = "convert the module itself (a TorchScript file or a whole pickled module, with --trust)"
#: How to settle an assumption about modules the state_dict cannot tell.
MODULE_ITSELF = f"{CONVERT_THE_MODULE}, which records them"

#: The ``eps`` of torch's ``nn.LayerNorm`` and ``nn.BatchNorm1d`` unless told otherwise; a state_dict
#: does not record it, so the module read from one is assumed to have it.
TORCH_NORM_EPS = 1e-5


def parse_sequential(arrays: Mapping[str, np.ndarray], prefix: str, activation: Activation | list[Activation] | None, *,
                     trailing_activation: bool = False, what: str = "nn.Sequential", one_for_all: bool = False,
                     unnamed: str = "") -> tuple[list[Dense], list[Assumption], list[tuple[str, str]]]:
    """The Linear layers of one ``nn.Sequential`` (keys ``<prefix><i>.<param>``), with their steps.

    What each index holds is read from its parameters: a 2-D ``weight`` is an ``nn.Linear``
    (``[out, in]``); ``running_mean`` and ``running_var`` an ``nn.BatchNorm1d`` in eval mode; a 1-D
    ``weight`` and ``bias`` as wide as the features an ``nn.LayerNorm``. The last two are assumed, and
    each becomes an :class:`Assumption`: a state_dict records no ``eps`` (torch's default
    :data:`TORCH_NORM_EPS` is taken), and a weight and bias fit ``nn.GroupNorm`` and an
    ``nn.BatchNorm1d`` without running statistics as well. An index without parameters is an
    activation module, named by ``activation``; several in a row are either one activation then
    modules without effect in eval mode (Dropout), or one named activation each (see ``activation``).

    Args:
        arrays: the state_dict entries of this Sequential (others are ignored).
        prefix: ``"mlp_extractor.policy_net."``; ``""`` for a bare Sequential.
        activation: the activation modules at the parameter-free indices after the first layer: a
            list, one per run of such indices in a row (the run's first index; the others are taken
            for Dropout), or one per index (``linear`` for a Dropout), whichever its length is; or one
            for every run; ``None`` when unknown (refused if one is needed).
        trailing_activation: an activation follows the last Linear (SB3's ``create_mlp`` and
            ``MlpExtractor`` do this), at the next index.
        what: how to name the Sequential in messages.
        one_for_all: the library that built the Sequential uses one activation for every place
            (SB3's ``activation_fn``), so one name may stand for several places; otherwise one name
            for several places is refused (a forgotten list would apply it to modules it does not
            fit), and ``tanh,tanh`` says it.
        unnamed: what to add to the refusal when ``activation`` is ``None`` (the library's default,
            where the activation is recorded instead).

    Returns:
        ``(layers, assumptions, slots)``: the Linear layers in order, each with its
        LayerNorm/BatchNorm/activation steps; what was taken as fact about the modules, in module
        order (a normalisation's kind and eps, a run of parameter-free modules read as one activation
        and Dropout); ``(module path, activation)`` of every place an activation was named.

    Raises:
        BadModelError: parameters that fit no Linear, LayerNorm or BatchNorm1d, or that fit several
            modules computing different things (a 1-D weight without bias: ``nn.LayerNorm(bias=False)``,
            ``nn.RMSNorm``, ``nn.PReLU``), a module with parameters before the first Linear, a
            normalisation as wide as no layer's output (exit 3: convert the module itself).
        OptionError: an activation needed but not named (``activation``), a list of another length
            than both counts, or one name for several places without ``one_for_all``.
    """
    modules: dict[int, dict[str, tuple[str, np.ndarray]]] = {}
    for name, arr in arrays.items():
        if not name.startswith(prefix):
            continue
        m = re.fullmatch(r"(\d+)\.(weight|bias|running_mean|running_var|num_batches_tracked)", name[len(prefix):])
        if not m:
            raise BadModelError(f"{name!r} does not fit {what} (expected {prefix}<index>.weight|bias|running_mean|running_var)")
        modules.setdefault(int(m[1]), {})[m[2]] = (name, np.asarray(arr))
    if not modules:
        return [], [], []
    kinds = {i: _kind_of(f"{prefix}{i}", params) for i, params in modules.items()}
    linears = [i for i in sorted(kinds) if kinds[i] == "linear"]
    if not linears:
        raise BadModelError(f"{what} has no Linear layer (no 2-D weight{f' under {prefix}' if prefix else ''})")
    before = [i for i in sorted(kinds) if i < linears[0]]
    if before:
        i = before[0]
        raise BadModelError(f"{what}: module {prefix}{i} holds parameters ({', '.join(modules[i])}) before the first "
                            f"Linear layer, module {prefix}{linears[0]}; policyport reads a state_dict's nn.Sequential "
                            "from its first Linear on, with only parameter-free modules before it (an nn.Flatten): "
                            f"{CONVERT_THE_MODULE}")
    last_stop = max(kinds) + (2 if trailing_activation else 1)  # the trailing activation's index included
    runs: list[list[int]] = []  # each run of parameter-free indices after a layer, in order
    for n, i in enumerate(linears):
        stop = linears[n + 1] if n + 1 < len(linears) else last_stop
        for j in range(i + 1, stop):
            if j in kinds:
                continue
            if runs and runs[-1][-1] == j - 1:
                runs[-1].append(j)
            else:
                runs.append([j])
    acts, per_module = _activations_for(activation, runs, prefix, what, one_for_all, unnamed,
                                        after_last=not trailing_activation)
    named = [j for run in runs for j in run] if per_module else [run[0] for run in runs]
    slot_of = dict(zip(named, acts))
    assumed: dict[int, Assumption] = {} if per_module else {
        run[0]: Assumption("layout", f"modules {prefix}{run[0]} to {prefix}{run[-1]} = one activation, then modules "
                           "without effect in eval mode (Dropout)", f"{len(run)} modules in a row hold no parameters, "
                           "so the state_dict cannot say what they are", MODULE_ITSELF)
        for run in runs if len(run) > 1}
    layers: list[Dense] = []
    for n, i in enumerate(linears):
        params = modules[i]
        wname, w = params["weight"]
        bname, b = params.get("bias", (None, None))
        stop = linears[n + 1] if n + 1 < len(linears) else last_stop
        steps: list[Step] = []
        for j in range(i + 1, stop):
            if j in kinds:
                scope = f"{prefix}{j}"
                held = {k: v for k, v in modules[j].items() if k != "num_batches_tracked"}
                assumed[j] = _normalisation(kinds[j], scope, held, width=w.shape[0], after=f"{prefix}{i}", what=what)
                steps.append(Step(kinds[j], scope, params=held, eps=TORCH_NORM_EPS))
            elif j in slot_of and slot_of[j].name != "linear":
                steps.append(Step("activation", f"{prefix}{j}", slot_of[j]))
        layers.append(Dense(f"{prefix}{i}", w, wname, b, bname, "out_in", None, post=steps))
    slots = [(f"{prefix}{j}", _spelled(act)) for j, act in zip(named, acts)]
    return layers, [assumed[j] for j in sorted(assumed)], slots


def _kind_of(scope: str, params: Mapping[str, tuple[str, np.ndarray]]) -> str:
    """``"linear"``, ``"batch_norm"`` or ``"layer_norm"``: what the parameters of the module at
    ``scope`` can be (a 2-D weight; running statistics; a 1-D weight), before their widths are checked.

    Raises:
        BadModelError: parameters that fit none of them.
    """
    shapes = {role: a.shape for role, (_, a) in params.items()}
    vectors = all(len(shape) == 1 for role, shape in shapes.items() if role != "num_batches_tracked")
    weight = shapes.get("weight")
    if "running_mean" in shapes or "running_var" in shapes:
        if "running_mean" in shapes and "running_var" in shapes and vectors:
            return "batch_norm"
    elif weight is not None and len(weight) == 2 and set(shapes) <= {"weight", "bias"}:
        return "linear"
    elif weight is not None and vectors and set(shapes) <= {"weight", "bias"}:
        return "layer_norm"
    raise BadModelError(f"{scope} holds {', '.join(sorted(params))} with shapes "
                        f"{[tuple(a.shape) for _, a in params.values()]}, which fit no Linear, LayerNorm or BatchNorm1d")


def _normalisation(kind: str, scope: str, params: Mapping[str, tuple[str, np.ndarray]], *, width: int, after: str,
                   what: str) -> Assumption:
    """What reading the module at ``scope`` as ``kind`` assumes, after the Linear ``after`` of ``width``
    outputs; or the refusal of parameters that fit several modules computing different things.

    Raises:
        BadModelError: a parameter that is not ``width`` wide (no normalisation of those features
            holds it), or a 1-D weight without bias, which ``nn.LayerNorm(bias=False)``,
            ``nn.RMSNorm`` and ``nn.PReLU`` all hold (exit 3: no option can tell them apart).
    """
    held = ", ".join(f"{role} {tuple(a.shape)}" for role, (_, a) in params.items())
    if any(a.shape != (width,) for _, a in params.values()):
        prelu = (" (one weight alone is an nn.PReLU()'s, which policyport does not build from a state_dict)"
                 if kind == "layer_norm" and set(params) == {"weight"} and params["weight"][1].shape == (1,) else "")
        raise BadModelError(f"{what}: module {scope} holds {held} after module {after}, which outputs {width} features; "
                            f"a LayerNorm or BatchNorm1d over them holds {width} values in each parameter, so it is neither"
                            f"{prelu}: {CONVERT_THE_MODULE}")
    if kind == "batch_norm":
        return Assumption("layout", f"module {scope} = nn.BatchNorm1d({width}, eps={TORCH_NORM_EPS:g}) in eval mode",
                          "running statistics fit BatchNorm1d, which normalises with them in eval mode, and the "
                          "state_dict does not record its eps", MODULE_ITSELF)
    if "bias" not in params:
        raise BadModelError(f"{what}: module {scope} holds a weight ({width},) and no bias, which fits "
                            f"nn.LayerNorm({width}, bias=False), nn.RMSNorm({width}) and nn.PReLU({width}) alike; they "
                            f"compute different things, and the state_dict cannot say which it is: {CONVERT_THE_MODULE}")
    return Assumption("layout", f"module {scope} = nn.LayerNorm({width}, eps={TORCH_NORM_EPS:g})",
                      "a 1-D weight and bias fit LayerNorm, GroupNorm and BatchNorm1d without running statistics, and "
                      "the state_dict records neither which it is nor its eps", MODULE_ITSELF)


def _spelled(act: Activation) -> str:
    """An activation as ``--activation`` spells it: ``tanh``, ``leaky_relu:0.2``."""
    return act.name if act.alpha is None else f"{act.name}:{act.alpha:g}"


def _activations_for(activation, runs: list[list[int]], prefix: str, what: str, one_for_all: bool, unnamed: str, *,
                     after_last: bool = False) -> tuple[list[Activation], bool]:
    """The activations named for ``runs`` of parameter-free indices (see :func:`parse_sequential`).

    A list may give one per run or one per index: its length says which where the two counts differ
    (where no run holds more than one index they are the same).

    Returns:
        ``(activations, per_module)``: one per index of every run when ``per_module``, else one per run.

    Raises:
        OptionError: none named while some are needed; a list as long as neither count (naming
            both; ``after_last``: saying that a module after the last layer cannot be named); one name
            for several runs where the library does not use one for all.
    """
    if not runs:
        return [], False
    indices = [j for run in runs for j in run]
    each = len(indices) > len(runs)  # some run holds several modules: the two counts differ
    at = ", ".join(_run_text(prefix, run) for run in runs)
    per_index = ", ".join(f"{prefix}{j}" for j in indices)
    if activation is None:  # an option this source needs (a usage error, exit 2)
        if each and not one_for_all:
            how = (f"name them with --activation (activation= in Python), one per module ({_names(len(indices))}, "
                   "linear for a Dropout, which does nothing in eval mode), or one per run of modules in a row "
                   f"({_names(len(runs))}; the others in a run are then taken for Dropout)")
        else:
            how = (f"name {'it' if one_for_all or len(runs) == 1 else 'them, one per module,'} with --activation "
                   "(activation= in Python)")
        raise ActivationNeeded(f"{what}: the state_dict does not say which activation modules sit at "
                               f"{per_index if each and not one_for_all else at} (they hold no parameters); {how}{unnamed}",
                               len(runs), listed=not one_for_all)
    if isinstance(activation, list):
        if len(activation) == len(runs):
            return list(activation), False
        if len(activation) == len(indices):
            return list(activation), True
        if each:
            text = (f"{what}: --activation (activation=) gives {len(activation)} activations; the state_dict holds "
                    f"{len(indices)} parameter-free modules ({per_index}) in {len(runs)} run{'s' if len(runs) > 1 else ''} "
                    f"of modules in a row ({at}): give one per module, in order ({_names(len(indices))}, linear for a "
                    f"Dropout), or one per run ({_names(len(runs))}; the others in a run are then taken for Dropout)")
        else:
            text = (f"{what}: --activation (activation=) gives {len(activation)} activations for {len(runs)} "
                    f"parameter-free module(s) at {at}; give one per module, in order")
        if after_last and len(activation) in (len(runs) + 1, len(indices) + 1):
            text += ("; a module after the last layer (a Tanh, a Softmax) holds no parameters and is not in a "
                     f"state_dict, so no name reaches it: {CONVERT_THE_MODULE}")
        raise OptionError(text)
    if len(runs) > 1 and not one_for_all:
        name = _spelled(activation)
        held = f"runs of parameter-free modules at {at} each begin with" if each else \
            f"parameter-free modules at {at} each hold"
        raise OptionError(f"{what}: --activation {name} names one activation, and {len(runs)} {held} one that the "
                          "state_dict cannot tell (an nn.Sequential may mix them); give one per "
                          f"{'run' if each else 'module'}, in order: --activation {','.join([name] * len(runs))} if "
                          f"they are all {name}")
    return [activation] * len(runs), False


def _names(n: int) -> str:
    return f"{n} name{'s' if n != 1 else ''}"


def _run_text(prefix: str, run: list[int]) -> str:
    """``"2"`` for a run of one index, ``"2 to 3"`` for several."""
    return f"{prefix}{run[0]}" if len(run) == 1 else f"{prefix}{run[0]} to {prefix}{run[-1]}"


def _split_output(layers: list[Dense], what: str) -> tuple[list[Dense], Dense]:
    if not layers:
        raise BadModelError(f"{what} has no Linear layer")
    return layers[:-1], layers[-1]


def _dense(arrays, prefix: str, name: str | None = None) -> Dense | None:
    """A single ``nn.Linear`` at ``prefix`` (``action_net``), or ``None``."""
    w = arrays.get(f"{prefix}.weight")
    if w is None:
        return None
    if w.ndim != 2:
        raise BadModelError(f"{prefix}.weight must be a 2-D Linear weight [out, in], got shape {tuple(w.shape)}")
    b = arrays.get(f"{prefix}.bias")
    return Dense(name or prefix, w, f"{prefix}.weight", b, f"{prefix}.bias" if b is not None else None, "out_in")


# ---------------------------------------------------------------------------------------------
# layouts


def detect_layout(arrays: Mapping[str, np.ndarray]) -> str:
    """``"sb3"``, ``"sb3-actor"``, ``"sb3-q"``, ``"rllib-torch"`` or ``"sequential"``.

    Raises:
        BadModelError: keys that fit none of them (listed).
    """
    keys = list(arrays)
    from .cleanrl_keys import cleanrl_script_of

    script = cleanrl_script_of(keys)
    if script is not None:
        raise BadModelError(f"the state_dict's keys are those of CleanRL's {script} network ({listing(sorted(keys), 4, show=str)}); "
                            "convert it with --from cleanrl (kind='cleanrl' in Python), which reads its layout and action")
    if keys and all(RLLIB_KEY.match(k) for k in keys):
        return "rllib-torch"
    if any(k.startswith(("mlp_extractor.", "action_net.")) for k in keys):
        return "sb3"
    if any(k.startswith("actor.") for k in keys):
        return "sb3-actor"
    if any(SB3_Q_KEY.match(k) for k in keys):
        return "sb3-q"
    if keys and all(SEQ_KEY.match(k) for k in keys):
        return "sequential"
    misfits = [k for k in keys if not SEQ_KEY.match(k)]
    raise BadModelError(
        f"the state_dict's keys fit no layout policyport knows (nn.Sequential <i>.weight, SB3 mlp_extractor/action_net, "
        f"SB3 actor.*, SB3 q_net.*/quantile_net.*, RLlib _hidden_layers.<i>._model.0/_logits): {len(misfits)} key(s) do not fit: "
        f"{listing(misfits, 20, show=str)}"
    )


def parse_sb3_actor_critic(arrays, activation: Activation, *, keep_value: bool = False) -> tuple[MlpSpec, list[str]]:
    """SB3's ``ActorCriticPolicy`` state_dict (see the module docstring) as an :class:`MlpSpec`.

    The action head is left for the caller (it depends on the action space); ``log_std`` becomes
    the free log_std when it is a vector.

    Raises:
        BadModelError: keys that do not fit, a gSDE ``log_std`` matrix, a features extractor with
            parameters (a CNN or custom extractor).
    """
    extractor = sorted(k for k in arrays if k.startswith(("features_extractor.", "pi_features_extractor.", "vf_features_extractor.")))
    if extractor:
        raise BadModelError(
            f"the policy has a features extractor with parameters ({', '.join(extractor[:4])}{' ...' if len(extractor) > 4 else ''}): "
            "a CNN or custom extractor; policyport converts MLP policies (FlattenExtractor) only"
        )
    known = re.compile(r"^(mlp_extractor\.(shared_net|policy_net|value_net)\.\d+\.\w+|action_net\.(weight|bias)|value_net\.(weight|bias)|log_std)$")
    misfits = sorted(k for k in arrays if not known.match(k))
    if misfits:
        raise BadModelError(f"keys that do not fit SB3's ActorCriticPolicy: {listing(misfits, show=str)}")
    notes: list[str] = []
    sb3 = {"trailing_activation": True, "one_for_all": True, "unnamed": SB3_UNNAMED}
    trunk, a1, s1 = parse_sequential(arrays, "mlp_extractor.shared_net.", activation, what="mlp_extractor.shared_net", **sb3)
    hidden, a2, s2 = parse_sequential(arrays, "mlp_extractor.policy_net.", activation, what="mlp_extractor.policy_net", **sb3)
    value_hidden, a3, s3 = parse_sequential(arrays, "mlp_extractor.value_net.", activation, what="mlp_extractor.value_net", **sb3)
    output = _dense(arrays, "action_net")
    if output is None:
        raise BadModelError("no action_net.weight: an SB3 ActorCriticPolicy state_dict has one")
    log_std = arrays.get("log_std")
    if log_std is not None and log_std.ndim != 1:
        raise BadModelError(
            f"log_std has shape {tuple(log_std.shape)}: a gSDE policy (use_sde=True), whose exploration noise depends on "
            "the latent features; policyport converts the plain Gaussian policies (a log_std vector)"
        )
    value_output = _dense(arrays, "value_net")
    if keep_value and value_output is None:
        raise OptionError("a value branch was asked for (--keep-value), but the state_dict has no value_net")
    if not value_hidden and (hidden or trunk) and keep_value:
        notes.append("the value branch shares the policy's latent features")
    if not keep_value and value_output is not None:
        notes.append("the value function (mlp_extractor.value_net, value_net) is not exported; --keep-value exports it as 'value'")
    spec = MlpSpec(hidden=hidden, output=output, trunk=trunk, value_hidden=value_hidden if keep_value else [],
                   value_output=value_output if keep_value else None, free_log_std=log_std,
                   free_log_std_name="log_std" if log_std is not None else None,
                   activation_slots=s1 + s2 + (s3 if keep_value else []), assumptions=a1 + a2 + (a3 if keep_value else []))
    return spec, notes


def parse_sb3_actor(arrays, activation: Activation) -> tuple[MlpSpec, str, list[str]]:
    """The actor of SB3's SAC (``actor.latent_pi``, ``actor.mu``) or TD3/DDPG (``actor.mu.<i>``).

    Returns:
        ``(spec, algorithm family "sac" or "td3", notes)``; the action head (tanh, rescaled) is
        the caller's, which knows the bounds.
    """
    extractor = sorted(k for k in arrays if k.startswith("actor.features_extractor."))
    if extractor:
        raise BadModelError(f"the actor has a features extractor with parameters ({', '.join(extractor[:4])}): a CNN or "
                            "custom extractor; policyport converts MLP policies only")
    skipped = sorted({k.split(".")[0] for k in arrays if not k.startswith("actor.")})
    notes = [f"not exported: {', '.join(skipped)} (the deterministic action needs the actor only)"] if skipped else []
    actor = {k: v for k, v in arrays.items() if k.startswith("actor.")}
    if "actor.mu.weight" in actor:  # SAC
        misfits = sorted(k for k in actor if not re.match(r"^actor\.(latent_pi\.\d+\.\w+|mu\.(weight|bias)|log_std\.(weight|bias))$", k))
        if misfits:
            raise BadModelError(f"keys that do not fit SB3's SAC actor: {listing(misfits, show=str)}")
        if actor.get("actor.log_std.weight") is None:
            raise BadModelError("a SAC actor without actor.log_std: a gSDE actor, which policyport does not convert")
        hidden, assumed, slots = parse_sequential(actor, "actor.latent_pi.", activation, trailing_activation=True,
                                                  what="actor.latent_pi", one_for_all=True, unnamed=SB3_UNNAMED)
        notes.append("actor.log_std (the state-dependent std) is not exported: the deterministic action does not use it")
        return MlpSpec(hidden=hidden, output=_dense(actor, "actor.mu"), activation_slots=slots,
                       assumptions=assumed), "sac", notes
    misfits = sorted(k for k in actor if not re.match(r"^actor\.mu\.\d+\.\w+$", k))
    if misfits:
        raise BadModelError(f"keys that do not fit SB3's TD3/DDPG actor (actor.mu.<i>): {listing(misfits, show=str)}")
    layers, assumed, slots = parse_sequential(actor, "actor.mu.", activation, what="actor.mu", one_for_all=True,
                                              unnamed=SB3_UNNAMED)
    hidden, output = _split_output(layers, "actor.mu")
    return MlpSpec(hidden=hidden, output=output, activation_slots=slots, assumptions=assumed), "td3", notes


def parse_sb3_q_network(arrays, activation: Activation) -> tuple[MlpSpec, str, list[str]]:
    """The Q-network of SB3's DQN (``q_net.q_net.<i>``) or sb3-contrib's QR-DQN
    (``quantile_net.quantile_net.<i>``); the target network is left out.

    Returns:
        ``(spec, algorithm family "dqn" or "qrdqn", notes)``; ``logits`` are the Q-values (DQN) or
        the quantiles, ``n_quantiles * n_actions`` of them (QR-DQN). The action head (argmax) is the
        caller's, which knows the action space.

    Raises:
        BadModelError: keys that fit neither network, or a features extractor with parameters.
    """
    net = "quantile_net" if any(k.startswith("quantile_net.") for k in arrays) else "q_net"
    family = "qrdqn" if net == "quantile_net" else "dqn"
    extractor = sorted(k for k in arrays if k.startswith(f"{net}.features_extractor."))
    if extractor:
        raise BadModelError(f"the {net} has a features extractor with parameters ({', '.join(extractor[:4])}): a CNN or "
                            "custom extractor; policyport converts MLP policies only")
    misfits = sorted(k for k in arrays if not re.match(rf"^{net}(_target)?\.{net}\.\d+\.\w+$", k))
    if misfits:
        raise BadModelError(f"keys that do not fit SB3's {'QR-DQN' if family == 'qrdqn' else 'DQN'} {net} "
                            f"({net}.{net}.<i>, {net}_target.{net}.<i>): {listing(misfits, show=str)}")
    layers, assumed, slots = parse_sequential({k: v for k, v in arrays.items() if k.startswith(f"{net}.")},
                                              f"{net}.{net}.", activation, what=f"{net}.{net}", one_for_all=True,
                                              unnamed=SB3_UNNAMED)
    hidden, output = _split_output(layers, f"{net}.{net}")
    notes = []
    if any(k.startswith(f"{net}_target.") for k in arrays):
        notes.append(f"not exported: {net}_target (the target network; the deterministic action needs {net} only)")
    return MlpSpec(hidden=hidden, output=output, activation_slots=slots, assumptions=assumed), family, notes


def parse_rllib_torch(arrays, activation: Activation | None, *, keep_value: bool = False) -> tuple[MlpSpec, list[str]]:
    """RLlib's torch ``FullyConnectedNetwork`` (see the module docstring) as an :class:`MlpSpec`.

    Raises:
        BadModelError: keys that do not fit (listed), gaps in the layer numbers, no ``_logits``.
    """
    misfits = sorted(k for k in arrays if not RLLIB_KEY.match(k))
    if misfits:
        raise BadModelError(f"keys that do not fit RLlib's torch FullyConnectedNetwork: {listing(misfits, show=str)}")

    def slim(prefix: str) -> list[Dense]:
        nums = sorted({int(m[1]) for k in arrays if (m := re.match(rf"^{re.escape(prefix)}\.(\d+)\._model\.0\.weight$", k))})
        if nums != list(range(len(nums))):
            raise BadModelError(f"{prefix}.<i> must be numbered 0..N-1 without gaps; found {nums}")
        steps = lambda i: [Step("activation", f"{prefix}.{i}._model.1", activation)] if activation else []  # noqa: E731
        return [_with_steps(_dense(arrays, f"{prefix}.{i}._model.0"), steps(i)) for i in nums]

    hidden, value_hidden = slim("_hidden_layers"), slim("_value_branch_separate")
    output = _dense(arrays, "_logits._model.0")
    if output is None:
        raise BadModelError("no _logits._model.0.weight: RLlib's FullyConnectedNetwork has a _logits layer")
    value_output = _dense(arrays, "_value_branch._model.0")
    if keep_value and value_output is None:
        raise OptionError("a value branch was asked for (--keep-value), but the weights hold no _value_branch")
    log_std = arrays.get("_append_free_log_std.log_std")
    notes = [] if keep_value or value_output is None else [
        "the value function (_value_branch) is not exported; --keep-value exports it as 'value'"]
    spell = "linear" if activation is None else _spelled(activation)
    slots = [(f"{layer.name.rsplit('.', 1)[0]}.1", spell) for layer in [*hidden, *(value_hidden if keep_value else [])]]
    spec = MlpSpec(hidden=hidden, output=output, value_hidden=value_hidden if keep_value else [],
                   value_output=value_output if keep_value else None, free_log_std=log_std,
                   free_log_std_name="_append_free_log_std.log_std" if log_std is not None else None,
                   activation_slots=slots)
    return spec, notes


def _with_steps(layer: Dense, steps: list[Step]) -> Dense:
    layer.post = steps
    return layer


def parse_layout(arrays: Mapping[str, np.ndarray], layout: str, activation: str | None, keep_value: bool):
    """The :class:`MlpSpec` of a state_dict in ``layout``, its extra notes, and SB3 actor family.

    Args:
        arrays: the state_dict.
        layout: from :func:`detect_layout` (or forced by the source kind).
        activation: ``--activation``: one name, or (for a plain ``nn.Sequential``) a comma list, one
            per parameter-free module; ``None`` where nothing names it (refused wherever an
            activation is needed: a state_dict does not record one).
        keep_value: export the value branch.

    Returns:
        ``(spec, notes, family)``; family is ``"ac"`` (ActorCritic), ``"sac"``, ``"td3"``, ``"dqn"``,
        ``"qrdqn"`` or ``None``. ``spec.activation_slots`` and ``spec.assumptions`` say what was taken
        beyond the file.

    Raises:
        OptionError: an activation needed and not named, a list where one name is taken, one name
            for several modules of a plain ``nn.Sequential``.
        BadModelError: keys or shapes that do not fit ``layout``; parameters that are not of one of
            the float dtypes a model is built in (bfloat16, integers, a mix), named with what to do.
    """
    name = activation
    if name and "," in name:
        if layout != "sequential":
            raise OptionError(f"--activation (activation=) {name!r} is a list, one activation per module, which "
                              f"applies to a plain nn.Sequential; this state_dict has the {layout} layout")
        act = [parse_activation(a) for a in name.split(",")]
    else:
        act = parse_activation(name) if name else None
    check_dtypes(arrays)
    _check_finite(arrays)
    if layout == "sb3":
        spec, notes = parse_sb3_actor_critic(arrays, act, keep_value=keep_value)
        family = "ac"
    elif layout == "sb3-actor":
        if keep_value:
            raise OptionError("--keep-value: an SB3 actor has no value function (its critics estimate Q(s, a))")
        spec, family, notes = parse_sb3_actor(arrays, act)
    elif layout == "sb3-q":
        if keep_value:
            raise OptionError("--keep-value: a DQN has no value function (its network estimates Q(s, a) for every action)")
        spec, family, notes = parse_sb3_q_network(arrays, act)
    elif layout == "rllib-torch":
        hidden = sorted({k.split("._model")[0] for k in arrays if k.startswith(("_hidden_layers.", "_value_branch_separate."))})
        if act is None and hidden:
            raise ActivationNeeded(f"the state_dict does not record the activation after its hidden layers ({', '.join(hidden)}); "
                              "name it with --activation (RLlib's fcnet_activation defaults to tanh, but relu and "
                              "others are as common), or convert the RLlib checkpoint, whose config records it")
        spec, notes = parse_rllib_torch(arrays, act, keep_value=keep_value)
        family = None
    else:
        prefixes = {SEQ_KEY.match(k)["prefix"] for k in arrays}
        if len(prefixes) != 1:
            raise BadModelError(f"the keys carry more than one prefix ({sorted(prefixes)}); give one nn.Sequential's state_dict")
        prefix = prefixes.pop()
        layers, assumed, slots = parse_sequential(arrays, prefix, act, unnamed=" (e.g. --activation tanh,relu)")
        if keep_value:
            raise OptionError("--keep-value: a plain nn.Sequential has no value branch")
        hidden, output = _split_output(layers, "the nn.Sequential")
        indices = [int(SEQ_KEY.match(k)["index"]) for k in arrays]
        first, last = min(indices), max(indices)
        flatten = []
        if first > 0:
            held = f"module {prefix}0" if first == 1 else f"modules {prefix}0 to {prefix}{first - 1}"
            flatten.append(Assumption(
                "layout", f"{held} = nn.Flatten", f"{'it holds' if first == 1 else 'they hold'} no parameters before "
                "the first layer, so the state_dict cannot say what they are", MODULE_ITSELF))
        # SB3's and RLlib's layouts say what follows their last layer; a plain Sequential's state_dict cannot
        after = Assumption("layout", f"nothing after module {prefix}{last}, the last "
                           f"{'layer' if output.name == f'{prefix}{last}' else 'module with parameters'}",
                           "a parameter-free module there, a Tanh or Softmax, is not in a state_dict", MODULE_ITSELF)
        spec = MlpSpec(hidden=hidden, output=output, activation_slots=slots, assumptions=[*flatten, *assumed, after])
        if first > 0:
            spec.flatten_scope = f"{prefix}0"
        notes = []
        family = None
    return spec, notes, family


#: How to cast a torch state_dict's parameters to float32, for the refusal of other dtypes.
TORCH_CAST = "state_dict = {k: v.float() for k, v in state_dict.items()}"


def check_dtypes(arrays: Mapping[str, np.ndarray], what: str = "the state_dict's parameters",
                 cast: str = TORCH_CAST) -> None:
    """Refuse parameters that are not of one float dtype policyport builds a model from (float16,
    bfloat16, float32, float64: :func:`policyport.converter.build.compute_dtype` says which dtype the
    model computes in); ``num_batches_tracked``, an integer counter inference never reads, aside.

    Args:
        arrays: parameter name -> array.
        what: the parameters, for the message (``"the state_dict's parameters"``).
        cast: the line of code that casts them to float32, for the message.

    Raises:
        BadModelError: naming each dtype found and its parameters, and what to do.
    """
    by_dtype: dict[str, list[str]] = {}
    for key, array in arrays.items():
        if not key.endswith("num_batches_tracked"):
            by_dtype.setdefault(array.dtype.name, []).append(key)
    built = ("float16", "bfloat16", "float32", "float64")
    if len(by_dtype) <= 1 and all(d in built for d in by_dtype):
        return
    found = joined(f"{d} ({listing(keys, 3, show=str)})" for d, keys in by_dtype.items())
    if len(by_dtype) > 1:
        problem = "a policy's parameters share one float dtype, which the model computes in"
        fix = f"cast them to one ({cast}) and save that"
    elif any(d.startswith(("int", "uint", "bool")) for d in by_dtype):
        problem = ("a policy's weights are floating point; integer ones are a quantized model's (whose scales these "
                   "arrays do not hold) or no policy's")
        fix = "save the float weights the policy computes with"
    else:
        problem = "policyport builds a model from float16, bfloat16, float32 or float64 parameters"
        fix = f"cast the parameters to float32 ({cast}) and save that"
    raise BadModelError(f"{what} are {found}: {problem}; {fix}")


def weights_dtype_notes(dtype: np.dtype, weights_dtype: str, what: str, computes: np.dtype | None = None,
                        why: str = "") -> list[str]:
    """What building a model from parameters of ``dtype`` under ``weights_dtype`` does to them, for
    the notes of a conversion (empty for float32 and float64 parameters under ``keep``).

    Args:
        dtype: the parameters' dtype.
        weights_dtype: one of :data:`policyport.converter.build.WEIGHTS_DTYPES`.
        what: the parameters, for the note (``"the state_dict's parameters"``).
        computes: the dtype the source computes in when it is not the parameters' (SB3's float32
            policy); ``None``: :func:`policyport.converter.build.compute_dtype`'s.
        why: why the model computes in float32 when the parameters stay in half precision, for the
            note; default: onnxruntime's lack of bfloat16 kernels.

    Raises:
        OptionError: an unknown ``weights_dtype``, or ``float32`` for float64 parameters, which
            it would round (exit 2).
    """
    from ..build import HALF_DTYPES, WEIGHTS_DTYPES, compute_dtype

    dtype = np.dtype(dtype)
    if weights_dtype not in WEIGHTS_DTYPES:
        raise OptionError(f"--weights-dtype {weights_dtype!r} is not one of {', '.join(WEIGHTS_DTYPES)}")
    if dtype.name == "float64" and weights_dtype == "float32":
        raise OptionError(f"--weights-dtype float32 casts half-precision parameters exactly; {what} are float64, "
                          "which float32 would round: cast them yourself if that is what you want")
    if dtype.name not in HALF_DTYPES:
        return []
    if weights_dtype == "float32":
        return [f"{what} are {dtype.name}, cast to float32 (--weights-dtype float32): exact, float32 holds every "
                f"{dtype.name} value; the model computes in float32 and extract gives float32 arrays"]
    computes = compute_dtype(dtype) if computes is None else np.dtype(computes)
    if computes != dtype:
        why = why or ": onnxruntime's CPU provider has no bfloat16 kernels"
        return [f"{what} are {dtype.name} and stay so (extract gives them back bit for bit); each is cast to "
                f"{computes.name} in the graph, which computes in {computes.name}{why}"]
    return [f"{what} are {dtype.name}: the model computes in {dtype.name}, as the source module does"]


def _check_finite(arrays) -> None:
    bad = sorted(k for k, a in arrays.items() if (a.dtype.kind == "f" or a.dtype.name == "bfloat16")
                 and not np.isfinite(a).all())
    if bad:
        raise BadModelError(f"non-finite values (NaN or inf) in {', '.join(bad)}; a trained policy's weights are finite")


def bare_actor_head(spec: MlpSpec, family: str | None) -> list[str]:
    """The action head of an SB3 state_dict given without its zip, whose action space it does not
    hold: what is taken for it is added to ``spec.assumptions``; returns notes on what is known."""
    notes: list[str] = []
    settle = "convert the SB3 zip, whose data records the action space"
    if family in ("sac", "td3"):
        n = spec.output.out_features
        one = np.ones(n, spec.dtype)
        scope = td3_tanh_scope(spec) if family == "td3" else "action"
        spec.action = ActionHead("squash", -one, one, tanh_scope=scope)
        spec.assumptions.append(Assumption("action bounds", "[-1, 1]: the action is tanh's output, not rescaled",
                                           "a state_dict does not hold the action space", settle))
    elif family == "dqn":
        spec.action = ActionHead("argmax")
        notes.append("logits are the Q-values; action = their argmax, as DQN's predict(deterministic=True) acts")
    elif family == "qrdqn":
        notes.append("logits are QR-DQN's quantiles, n_quantiles per action; how many per action is not in a state_dict, "
                     "so there is no action output (convert the SB3 zip for the argmax of the mean quantile)")
    elif family == "ac":
        if spec.free_log_std is not None:
            spec.action = ActionHead("clip", np.full(spec.output.out_features, -np.inf, spec.dtype),
                                     np.full(spec.output.out_features, np.inf, spec.dtype))
            spec.assumptions.append(Assumption("action bounds", "none: the action is the Gaussian mean, unclipped",
                                               "a state_dict does not hold the action space, whose bounds SB3's "
                                               "predict clips the mean to", settle))
        else:
            spec.action = ActionHead("argmax")
            spec.assumptions.append(Assumption("action space", "Discrete: action = argmax of the logits",
                                               "a policy without log_std acts in a Discrete or MultiDiscrete space, "
                                               "and a state_dict does not say which", settle))
    return notes


# ---------------------------------------------------------------------------------------------
# converters


def reference_for(spec: MlpSpec, head: str | None, dtype: np.dtype | None = None):
    """The source's forward: torch when installed (the layers as torch modules), else numpy; in
    ``dtype`` (default: the parameters' own, see :func:`~policyport.converter.sources.reference.torch_forward`)."""
    from .reference import reference_forward, torch_forward

    if not has_torch():
        return lambda obs: reference_forward(spec, obs, head, dtype)
    return lambda obs: torch_forward(spec, obs, head, dtype)


#: Where each layout's library keeps the normaliser statistics a state_dict lacks, and how to get them.
_NORMALISERS = {
    "sb3": ("SB3 saves VecNormalize statistics apart from the policy, in vecnormalize.pkl",
            "convert the SB3 zip, which picks up the vecnormalize.pkl beside it"),
    "sb3-actor": ("SB3 saves VecNormalize statistics apart from the policy, in vecnormalize.pkl",
                  "convert the SB3 zip, which picks up the vecnormalize.pkl beside it"),
    "sb3-q": ("SB3 saves VecNormalize statistics apart from the policy, in vecnormalize.pkl",
              "convert the SB3 zip, which picks up the vecnormalize.pkl beside it"),
    "rllib-torch": ("RLlib keeps a MeanStdFilter's in the checkpoint", "convert the RLlib checkpoint to bake its filter in"),
    "sequential": ("a normaliser applied outside the module is not in its state_dict", ""),
}
#: Why one activation name stands for every place in a layout (its library uses one for all).
_ONE_ACTIVATION = {"sb3": "SB3 builds every hidden layer with one activation_fn",
                   "sb3-actor": "SB3 builds every hidden layer with one activation_fn",
                   "sb3-q": "SB3 builds every hidden layer with one activation_fn",
                   "rllib-torch": "RLlib's FullyConnectedNetwork uses one fcnet_activation for every hidden layer"}


def state_dict_assumptions(spec: MlpSpec, layout: str, options) -> list[Assumption]:
    """What a converted state_dict rests on beyond its arrays: the activations ``--activation``
    named, the parser's layout and action-space readings, the head, and no normaliser."""
    from ..assumptions import RLLIB_SPLIT, activation_assumption, head_assumption, no_normaliser

    found = [
        activation_assumption(spec.activation_slots, "a state_dict", _ONE_ACTIVATION.get(layout, ""), unit="module")
        if options.activation else None,
        *spec.assumptions,
        head_assumption(options.head, output=f"module {spec.output.name}", width=spec.output.out_features,
                        log_std=spec.free_log_std_name, what="the state_dict",
                        convention=RLLIB_SPLIT if layout == "rllib-torch" else None),
        no_normaliser("a state_dict", *_NORMALISERS[layout]),
    ]
    return [a for a in found if a is not None]


def _convert(source, options, forced_layout: str | None, kind: str):
    from ..options import Converted
    from ..assumptions import reconstruction
    from ..build import build_mlp

    arrays, provenance = read_arrays(source, trust=options.trust)
    _refuse_options_of_the_other_file(options, module=not isinstance(arrays, dict))
    if not isinstance(arrays, dict):  # a whole module, loaded with --trust
        from .torch_module import convert_torch

        converted = convert_torch(arrays, options)
        converted.kind = kind
        return converted
    layout = forced_layout or detect_layout(arrays)
    spec, notes, family = parse_layout(arrays, layout, options.activation, options.keep_value)
    if options.head is None:
        notes += bare_actor_head(spec, family)
    elif family in ("sac", "td3"):
        raise OptionError(f"--head does not apply to an SB3 {family.upper()} actor: its action is the squashed mean")
    elif family == "dqn" and options.head not in (NO_HEAD, "categorical"):
        raise OptionError(f"--head {options.head} does not apply to an SB3 DQN: its action is the argmax of its "
                          "Q-values (the categorical head)")
    elif family == "qrdqn" and options.head != NO_HEAD:
        raise OptionError(f"--head {options.head} does not apply to an SB3 QR-DQN: its action is the argmax of its "
                          "Q-values, the mean of its quantiles")
    elif family == "ac" and options.head in GAUSSIAN_HEADS and spec.free_log_std is None:
        raise OptionError(f"--head {options.head} needs a log_std, and this SB3 ActorCriticPolicy has none: SB3 keeps a "
                          "Gaussian policy's log_std as a parameter, so this one acts in a Discrete or MultiDiscrete "
                          "space (use --head categorical, or none)")
    assumptions = state_dict_assumptions(spec, layout, options)
    if options.input_shape:
        spec.obs_shape = tuple(options.input_shape)
    spec.source = {"kind": kind, "layout": layout, **provenance}
    notes += weights_dtype_notes(spec.dtype, options.weights_dtype, "the state_dict's parameters")
    model = build_mlp(spec, head=options.head, opset=options.opset, weights_dtype=options.weights_dtype,
                      metadata={"policyport.activation": options.activation or "none", "policyport.layout": layout})
    from ..readers.torch_files import keep_state_dict_layout

    keep_state_dict_layout(model, arrays)
    runner = "torch modules" if has_torch() else "numpy"
    return Converted(model, reference_for(spec, options.head), kind, notes, assumptions,
                     reconstruction("the state_dict's arrays", runner))


def has_torch() -> bool:
    """Whether torch is installed (the reconstruction then runs as torch modules)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


#: Options only a whole pickled module reads (torch.onnx exports it), and options only a state_dict's
#: arrays read (policyport builds their graph).
MODULE_OPTIONS = ("exporter", "output_names", "input_dtypes", "example_inputs")
WEIGHT_OPTIONS = ("activation", "head", "keep_value")


def _refuse_options_of_the_other_file(options, module: bool) -> None:
    """Refuse the options a file of the state-dict kind does not read for what it holds.

    Raises:
        OptionError: naming the options, what the file holds, and where they apply (exit 2).
    """
    from ..options import flag_list, given_fields, where_they_apply

    given = [n for n in given_fields(options) if n in (WEIGHT_OPTIONS if module else MODULE_OPTIONS)]
    if not module and isinstance(options.input_shape, dict):
        raise OptionError(f"--input-shape NAME=D[,D...] names an input of a module's forward; a state_dict holds no "
                          f"module code, and the network policyport builds from it takes one observation: give its "
                          f"shape alone (--input-shape {','.join(map(str, next(iter(options.input_shape.values()))))})")
    if not given:
        return
    verb = "does" if len(given) == 1 else "do"
    if module:
        raise OptionError(f"{flag_list(given)} {verb} not apply to a whole pickled module: torch.onnx exports its "
                          "forward as it is, with its own layers, activations and outputs")
    raise OptionError(f"{flag_list(given)} {verb} not apply to a state_dict, which holds weights and no module code: "
                      f"policyport builds its graph itself ({where_they_apply(given)})")


def convert_state_dict(source, options):
    """Convert a ``state_dict`` file (``.pt``/``.pth``/``.safetensors``), its layout read from its keys.

    A whole pickled module (``torch.save(model)``) is refused unless ``options.trust``; then it
    is exported as a live module.

    Raises:
        UntrustedFileError: the file needs more than tensors and containers, without ``trust``.
        BadModelError: keys that fit no layout (listed).
        OptionError: an activation that must be named (``--activation``), options of other sources.
    """
    return _convert(source, options, None, "state-dict")


def convert_rllib_torch(source, options):
    """Convert RLlib torch ``FullyConnectedNetwork`` weights (``.pt``/``.pth``/``.safetensors``/``.npz``)."""
    return _convert(source, options, "rllib-torch", "rllib-torch")
