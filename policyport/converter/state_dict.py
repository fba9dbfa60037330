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
  LayerNorm (1-D ``weight``/``bias``), BatchNorm1d (``running_mean``/``running_var``). An index
  without parameters between two layers is an activation module (which one the keys cannot say:
  give ``activation``); leading ones are a ``Flatten``.

Tensor names follow module paths: ``mlp_extractor.policy_net.0/linear``,
``mlp_extractor.policy_net.1/tanh``; the last layer's raw output is ``logits``.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Mapping

import numpy as np

from ..errors import BadModelError, OptionError, listing
from .activations import Activation, parse_activation
from .build import NO_HEAD, ActionHead, Dense, MlpSpec, Step

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
    from ..files import load_arrays
    from .torch_files import as_state_dict, load_torch_file, read_safetensors

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


def parse_sequential(arrays: Mapping[str, np.ndarray], prefix: str, activation: Activation | list[Activation] | None, *,
                     trailing_activation: bool = False, what: str = "nn.Sequential") -> tuple[list[Dense], list[str]]:
    """The Linear layers of one ``nn.Sequential`` (keys ``<prefix><i>.<param>``), with their steps.

    Args:
        arrays: the state_dict entries of this Sequential (others are ignored).
        prefix: ``"mlp_extractor.policy_net."``; ``""`` for a bare Sequential.
        activation: the activation module at each parameter-free index between layers, or one per
            such index in order (a list); ``None`` when unknown (refused if one is needed).
        trailing_activation: an activation follows the last Linear (SB3's ``create_mlp`` and
            ``MlpExtractor`` do this), at the next index.
        what: how to name the Sequential in messages.

    Returns:
        ``(layers, notes)``: the Linear layers in order, each with its LayerNorm/BatchNorm/activation
        steps; notes on what was assumed.

    Raises:
        BadModelError: a parameter that fits no Linear/LayerNorm/BatchNorm.
        OptionError: an activation needed but not named (``activation``), or a list of the wrong length.
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
        return [], []
    kinds = {}
    for i, params in modules.items():
        w = params.get("weight", (None, None))[1]
        if "running_mean" in params or "running_var" in params:
            kinds[i] = "batch_norm"
        elif w is not None and w.ndim == 2:
            kinds[i] = "linear"
        elif w is not None and w.ndim == 1:
            kinds[i] = "layer_norm"
        else:
            raise BadModelError(f"{prefix}{i} holds {', '.join(sorted(params))} with shapes "
                                f"{[tuple(a.shape) for _, a in params.values()]}, which fit no Linear, LayerNorm or BatchNorm1d")
    linears = [i for i in sorted(kinds) if kinds[i] == "linear"]
    if not linears:
        raise BadModelError(f"{what} has no Linear layer (no 2-D weight{f' under {prefix}' if prefix else ''})")
    notes: list[str] = []
    needs_activation: list[int] = []
    layers: list[Dense] = []
    last_stop = max(kinds) + (2 if trailing_activation else 1)  # the trailing activation's index included
    for n, i in enumerate(linears):
        params = modules[i]
        wname, w = params["weight"]
        bname, b = params.get("bias", (None, None))
        stop = linears[n + 1] if n + 1 < len(linears) else last_stop
        steps: list[Step] = []
        gap_start = None
        for j in range(i + 1, stop):
            if j in kinds:
                gap_start = None
                p = modules[j]
                steps.append(Step(kinds[j], f"{prefix}{j}", params={k: v for k, v in p.items() if k != "num_batches_tracked"}))
                continue
            if gap_start is None:
                gap_start = j
                needs_activation.append(j)
                act = activation
                if isinstance(activation, list):
                    act = activation[len(needs_activation) - 1] if len(needs_activation) <= len(activation) else None
                if act is not None and act.name != "linear":
                    steps.append(Step("activation", f"{prefix}{j}", act))
            elif j == gap_start + 1:
                notes.append(f"{what}: indices {prefix}{gap_start}..{j} hold no parameters; taken as one "
                             f"activation and modules without effect in eval mode (Dropout)")
        layers.append(Dense(f"{prefix}{i}", w, wname, b, bname, "out_in", None, post=steps))
    if isinstance(activation, list) and len(activation) != len(needs_activation):
        raise OptionError(
            f"{what}: --activation (activation=) gives {len(activation)} activations for "
            f"{len(needs_activation)} parameter-free module(s) at "
            f"{', '.join(f'{prefix}{j}' for j in needs_activation)}; give one, or one per module"
        )
    if needs_activation and activation is None:  # an option this source needs (a usage error, exit 2)
        raise OptionError(
            f"{what}: the state_dict does not say which activation modules sit at "
            f"{', '.join(f'{prefix}{j}' for j in needs_activation)} (they hold no parameters); name it with --activation"
        )
    return layers, notes


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
    trunk, n1 = parse_sequential(arrays, "mlp_extractor.shared_net.", activation, trailing_activation=True, what="mlp_extractor.shared_net")
    hidden, n2 = parse_sequential(arrays, "mlp_extractor.policy_net.", activation, trailing_activation=True, what="mlp_extractor.policy_net")
    value_hidden, n3 = parse_sequential(arrays, "mlp_extractor.value_net.", activation, trailing_activation=True, what="mlp_extractor.value_net")
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
                   free_log_std_name="log_std" if log_std is not None else None)
    return spec, notes + n1 + n2 + n3


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
        hidden, n = parse_sequential(actor, "actor.latent_pi.", activation, trailing_activation=True, what="actor.latent_pi")
        notes.append("actor.log_std (the state-dependent std) is not exported: the deterministic action does not use it")
        return MlpSpec(hidden=hidden, output=_dense(actor, "actor.mu")), "sac", notes + n
    misfits = sorted(k for k in actor if not re.match(r"^actor\.mu\.\d+\.\w+$", k))
    if misfits:
        raise BadModelError(f"keys that do not fit SB3's TD3/DDPG actor (actor.mu.<i>): {listing(misfits, show=str)}")
    layers, n = parse_sequential(actor, "actor.mu.", activation, what="actor.mu")
    hidden, output = _split_output(layers, "actor.mu")
    return MlpSpec(hidden=hidden, output=output), "td3", notes + n


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
    layers, notes = parse_sequential({k: v for k, v in arrays.items() if k.startswith(f"{net}.")}, f"{net}.{net}.",
                                     activation, what=f"{net}.{net}")
    hidden, output = _split_output(layers, f"{net}.{net}")
    if any(k.startswith(f"{net}_target.") for k in arrays):
        notes.insert(0, f"not exported: {net}_target (the target network; the deterministic action needs {net} only)")
    return MlpSpec(hidden=hidden, output=output), family, notes


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
    spec = MlpSpec(hidden=hidden, output=output, value_hidden=value_hidden if keep_value else [],
                   value_output=value_output if keep_value else None, free_log_std=log_std,
                   free_log_std_name="_append_free_log_std.log_std" if log_std is not None else None)
    return spec, notes


def _with_steps(layer: Dense, steps: list[Step]) -> Dense:
    layer.post = steps
    return layer


def parse_layout(arrays: Mapping[str, np.ndarray], layout: str, activation: str | None, keep_value: bool):
    """The :class:`MlpSpec` of a state_dict in ``layout``, its extra notes, and SB3 actor family.

    Returns:
        ``(spec, notes, family)``; family is ``"ac"`` (ActorCritic), ``"sac"``, ``"td3"``, ``"dqn"``,
        ``"qrdqn"`` or ``None``.
    """
    defaults = {"sb3": "tanh", "sb3-actor": "relu", "sb3-q": "relu", "rllib-torch": "tanh", "sequential": None}
    name = activation or defaults[layout]
    if name and "," in name:
        if layout != "sequential":
            raise OptionError(f"--activation (activation=) {name!r} is a list, one activation per module, which "
                              f"applies to a plain nn.Sequential; this state_dict has the {layout} layout")
        act = [parse_activation(a) for a in name.split(",")]
    else:
        act = parse_activation(name) if name else None
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
        spec, notes = parse_rllib_torch(arrays, act, keep_value=keep_value)
        family = None
    else:
        prefixes = {SEQ_KEY.match(k)["prefix"] for k in arrays}
        if len(prefixes) != 1:
            raise BadModelError(f"the keys carry more than one prefix ({sorted(prefixes)}); give one nn.Sequential's state_dict")
        prefix = prefixes.pop()
        layers, notes = parse_sequential(arrays, prefix, act)
        if keep_value:
            raise OptionError("--keep-value: a plain nn.Sequential has no value branch")
        hidden, output = _split_output(layers, "the nn.Sequential")
        spec = MlpSpec(hidden=hidden, output=output)
        first = min(int(SEQ_KEY.match(k)["index"]) for k in arrays)
        if first > 0:
            spec.flatten_scope = f"{prefix}0"
            held = f"module {prefix}0 holds" if first == 1 else f"modules {prefix}0 to {prefix}{first - 1} hold"
            notes.append(f"{held} no parameters before the first layer: taken as nn.Flatten")
        family = None
    dtypes = {a.dtype for a in arrays.values() if a.dtype.kind == "f"}
    if len(dtypes) != 1:
        raise BadModelError(f"the parameters must share one float dtype; found {sorted(d.name for d in dtypes)}")
    return spec, notes, family


def _check_finite(arrays) -> None:
    bad = sorted(k for k, a in arrays.items() if a.dtype.kind == "f" and not np.isfinite(a).all())
    if bad:
        raise BadModelError(f"non-finite values (NaN or inf) in {', '.join(bad)}; a trained policy's weights are finite")


def bare_actor_head(spec: MlpSpec, family: str | None, notes: list[str]) -> None:
    """The action head of an SB3 state_dict given without its zip (bounds unknown: [-1, 1])."""
    if family in ("sac", "td3"):
        n = spec.output.out_features
        one = np.ones(n, spec.dtype)
        scope = td3_tanh_scope(spec) if family == "td3" else "action"
        spec.action = ActionHead("squash", -one, one, tanh_scope=scope)
        notes.append("the action bounds are not in a state_dict: the action is tanh's output in [-1, 1] "
                     "(convert the SB3 zip to rescale it to the action space)")
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
            notes.append("the action bounds are not in a state_dict: 'action' is the unclipped Gaussian mean "
                         "(convert the SB3 zip to clip it to the action space)")
        else:
            spec.action = ActionHead("argmax")
            notes.append("no log_std: taken as a Discrete action space, action = argmax of the logits "
                         "(a MultiDiscrete policy needs its SB3 zip)")


# ---------------------------------------------------------------------------------------------
# converters


def reference_for(spec: MlpSpec, head: str | None):
    """The source's forward: torch when installed (the layers as torch modules), else numpy."""
    from .reference import reference_forward, torch_forward

    try:
        import torch  # noqa: F401
    except ImportError:
        return lambda obs: reference_forward(spec, obs, head)
    return lambda obs: torch_forward(spec, obs, head)


def _convert(source, options, forced_layout: str | None, kind: str):
    from . import Converted
    from .build import build_mlp

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
        bare_actor_head(spec, family, notes)
    elif family in ("sac", "td3"):
        raise OptionError(f"--head does not apply to an SB3 {family.upper()} actor: its action is the squashed mean")
    elif family == "dqn" and options.head not in (NO_HEAD, "categorical"):
        raise OptionError(f"--head {options.head} does not apply to an SB3 DQN: its action is the argmax of its "
                          "Q-values (the categorical head)")
    elif family == "qrdqn" and options.head != NO_HEAD:
        raise OptionError(f"--head {options.head} does not apply to an SB3 QR-DQN: its action is the argmax of its "
                          "Q-values, the mean of its quantiles")
    elif family == "ac" and options.head == "diag-gaussian" and spec.free_log_std is None:
        raise OptionError("--head diag-gaussian needs a log_std, and this SB3 ActorCriticPolicy has none: SB3 keeps a "
                          "Gaussian policy's log_std as a parameter, so this one acts in a Discrete or MultiDiscrete "
                          "space (use --head categorical, or none)")
    if options.input_shape:
        spec.obs_shape = tuple(options.input_shape)
    spec.source = {"kind": kind, "layout": layout, **provenance}
    activation = options.activation or {"sb3": "tanh", "sb3-actor": "relu", "sb3-q": "relu", "rllib-torch": "tanh"}.get(layout)
    model = build_mlp(spec, head=options.head, opset=options.opset,
                      metadata={"policyport.activation": activation or "none", "policyport.layout": layout})
    from .torch_files import keep_state_dict_layout

    keep_state_dict_layout(model, arrays)
    return Converted(model, reference_for(spec, options.head), kind, notes)


#: Options only a whole pickled module reads (torch.onnx exports it), and options only a state_dict's
#: arrays read (policyport builds their graph).
MODULE_OPTIONS = ("exporter", "output_names")
WEIGHT_OPTIONS = ("activation", "head", "keep_value")


def _refuse_options_of_the_other_file(options, module: bool) -> None:
    """Refuse the options a file of the state-dict kind does not read for what it holds.

    Raises:
        OptionError: naming the options, what the file holds, and where they apply (exit 2).
    """
    from . import flag_list, given_fields, where_they_apply

    given = [n for n in given_fields(options) if n in (WEIGHT_OPTIONS if module else MODULE_OPTIONS)]
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
