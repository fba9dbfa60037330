"""CleanRL's ``runs/<run>/<exp_name>.cleanrl_model`` files, their layout read from their keys.

CleanRL is a repository of single-file scripts (vwxyzjn/cleanrl, ``cleanrl/*.py``); each saves its
networks with one call when run with ``--save-model``, and the file records weights alone. The
layouts, told apart by their keys (never by running anything from the file):

* ``ppo_continuous_action.py``: ``torch.save(agent.state_dict())``: ``actor_mean.{0,2,4}.*``
  (``nn.Sequential`` of Linear and ``nn.Tanh``), ``actor_logstd`` ``(1, A)``, ``critic.{0,2,4}.*``.
  Deterministic action: ``actor_mean(obs)``; ``log_std`` = ``actor_logstd.expand_as(mean)``.
* ``ppo.py`` (discrete): ``actor.{0,2,4}.*`` and ``critic.*`` (Tanh); action = argmax of the logits.
* ``dqn.py``: ``torch.save(q_network.state_dict())``: ``network.{0,2,4}.*`` (``nn.ReLU``); action =
  argmax of the Q-values.
* ``c51.py``: ``torch.save({"model_weights": q_network.state_dict(), "args": vars(args)})``: the
  state_dict holds ``atoms`` ``(n_atoms,)`` and ``network.{0,2,4}.*`` whose last Linear outputs
  ``n * n_atoms``; ``pmfs = softmax(logits.view(batch, n, n_atoms), dim=2)``, ``q_values =
  (pmfs * atoms).sum(2)``, action = argmax.
* ``ddpg_continuous_action.py`` / ``td3_continuous_action.py``: ``torch.save((actor.state_dict(),
  qf1.state_dict()[, qf2.state_dict()]))``: the actor's ``fc1``, ``fc2`` (``F.relu``), ``fc_mu`` and the
  buffers ``action_scale``, ``action_bias``; action = ``tanh(fc_mu(.)) * action_scale + action_bias``.
  The Q-functions are not exported.
* ``sac_continuous_action.py`` does not save its networks; an ``actor.state_dict()`` saved the same
  way (alone, or first of a tuple) holds ``fc1``, ``fc2``, ``fc_mean``, ``fc_logstd``, ``action_scale``,
  ``action_bias``; action = ``tanh(fc_mean(.)) * action_scale + action_bias`` (``get_action``'s third
  value), ``log_std = -5 + 0.5 * (2 - -5) * (tanh(fc_logstd(.)) + 1)``.
* The JAX scripts write ``flax.serialization.to_bytes`` (read by
  :mod:`~policyport.converter.readers.flax_msgpack`, without JAX): ``dqn_jax.py`` the Q-network's
  ``{"params": {"Dense_0": {"kernel" (in, out), "bias"}, ...}}``; ``c51_jax.py``
  ``{"model_weights": params, "args": vars(args)}``, the atoms being ``linspace(v_min, v_max,
  n_atoms)`` of the args; ``td3_continuous_action_jax.py`` / ``ddpg_continuous_action_jax.py`` the list
  ``[actor params, qf1 params[, qf2 params]]``, whose actor's ``action_scale`` and ``action_bias`` are
  module attributes, not parameters: the file does not hold them, so the action bounds are given.

What no CleanRL file records, and this converter therefore assumes and reports: the hidden activation
(the scripts' own: tanh for PPO, relu for the others; ``--activation`` names another), the action
bounds of a PPO policy (``ClipAction`` clips its action in the environment) and of a JAX TD3/DDPG actor
(``--action-bounds``), and the observation normaliser (``ppo_continuous_action.py``
trains under gymnasium's ``NormalizeObservation``, whose statistics it never saves).

Initializers keep CleanRL's keys (``actor_mean.0.weight``; ``params/Dense_0/kernel`` for Flax,
prefixed by the path to the actor's params, ``0/params/...`` for a list), so ``extract`` gives the
actor's arrays back bit for bit.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import BadModelError, OptionError, UnreadableFileError
from ..activations import Activation, parse_activation
from ..assumptions import Assumption, joined
from ..build import ActionHead, Dense, MlpSpec, Step
from .cleanrl_keys import SCRIPTS

#: LOG_STD_MAX and LOG_STD_MIN of ``sac_continuous_action.py``.
SAC_LOG_STD_MAX, SAC_LOG_STD_MIN = 2.0, -5.0

#: The hidden activation each script builds its networks with.
SCRIPT_ACTIVATION = {"ppo-continuous": "tanh", "ppo": "tanh"}

_SEQ = re.compile(r"^(?P<module>[\w.]+?)\.(?P<index>\d+)\.(?P<param>weight|bias)$")


@dataclass
class CleanRLFile:
    """What a CleanRL file holds, placed.

    Attributes:
        layout: a key of :data:`SCRIPTS`.
        actor: the policy network's arrays, by the key the file names them.
        value: the PPO critic's arrays (``critic.*``), empty otherwise.
        ignored: what the file holds that is not exported (``"qf1"``, ``"args"``), for the note.
        args: the C51 script's ``vars(args)``, when saved.
        prefix: the path to the actor's Flax params (``"0/params/"``), ``""`` for torch files.
    """

    layout: str
    actor: dict[str, np.ndarray]
    value: dict[str, np.ndarray] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    args: dict | None = None
    prefix: str = ""

    @property
    def jax(self) -> bool:
        return self.layout.endswith("-jax")


def read_cleanrl(path) -> tuple[CleanRLFile, dict]:
    """Read a ``.cleanrl_model`` (a torch zip or a Flax MessagePack file) without running its code.

    A torch file goes through policyport's restricted unpickler (no torch needed): tensors and plain
    containers are rebuilt, any other class an inert record; a function the pickle would call is refused.

    Returns:
        ``(the placed file, provenance for the model metadata)``.

    Raises:
        UnreadableFileError: neither a torch zip nor MessagePack, or damaged.
        UntrustedFileError: a pickle that asks to call a function.
        BadModelError: a layout of no CleanRL script (the keys listed).
    """
    from ..readers import flax_msgpack
    from ..readers.torch_files import read_torch_zip

    path = Path(path)
    if not path.is_file():
        raise UnreadableFileError(f"{path}: no such file")
    data = path.read_bytes()
    provenance = {"kind": "cleanrl", "file": path.name, "sha256": hashlib.sha256(data).hexdigest()}
    if data[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        import io

        return place_torch(read_torch_zip(io.BytesIO(data), what=str(path)), str(path)), provenance
    if flax_msgpack.looks_like_msgpack_map(data[:1]):
        return place_flax(flax_msgpack.load(data, what=str(path)), str(path)), provenance
    raise UnreadableFileError(f"{path} is neither a torch.save zip archive nor a Flax MessagePack file, the two "
                              "formats CleanRL's scripts save with (torch.save; flax.serialization.to_bytes); it "
                              f"starts with {data[:8]!r}")


def _arrays(value, what: str) -> dict[str, np.ndarray]:
    from ..readers.torch_files import as_state_dict

    return as_state_dict(value, what)


def place_torch(value, what: str) -> CleanRLFile:
    """Place what a CleanRL torch file holds (see the module docstring)."""
    if isinstance(value, (tuple, list)):
        if not value:
            raise BadModelError(f"{what} holds an empty {type(value).__name__}")
        actor = _arrays(value[0], f"{what}'s first state_dict")
        names = ["qf1", "qf2", "qf3"][:len(value) - 1]
        layout = _actor_layout(actor, what)
        return CleanRLFile(layout, actor, ignored=[f"{n} (a Q-function)" for n in names])
    if isinstance(value, dict) and "model_weights" in value:
        args = value.get("args")
        state = _arrays(value["model_weights"], f"{what}'s model_weights")
        if "atoms" not in state:
            raise BadModelError(f"{what} holds model_weights without atoms, which c51.py's QNetwork registers")
        return CleanRLFile("c51", state, ignored=["args"] if args is not None else [],
                           args=args if isinstance(args, dict) else None)
    state = _arrays(value, what)
    keys = set(state)
    if any(k.startswith("actor_mean.") for k in keys):
        return CleanRLFile("ppo-continuous", _under(state, "actor_mean.", "actor_logstd"), _under(state, "critic."),
                           ignored=_other(state, "actor_mean.", "actor_logstd", "critic."))
    if any(k.startswith("actor.") for k in keys) and any(k.startswith("critic.") for k in keys):
        return CleanRLFile("ppo", _under(state, "actor."), _under(state, "critic."), ignored=_other(state, "actor.", "critic."))
    if all(k.startswith("network.") for k in keys):
        return CleanRLFile("dqn", state)
    return CleanRLFile(_actor_layout(state, what), state)


def _under(state, *prefixes) -> dict[str, np.ndarray]:
    return {k: v for k, v in state.items() if k.startswith(prefixes)}


def _other(state, *prefixes) -> list[str]:
    return [k for k in state if not k.startswith(prefixes)]


def _actor_layout(actor: dict, what: str) -> str:
    keys = set(actor)
    if {"fc_mu.weight", "action_scale", "action_bias"} <= keys:
        return "td3"  # ddpg_continuous_action.py's Actor is the same module
    if {"fc_mean.weight", "fc_logstd.weight", "action_scale", "action_bias"} <= keys:
        return "sac"
    raise BadModelError(
        f"{what} holds keys of no CleanRL script's network: {', '.join(sorted(keys)[:12])}; policyport reads "
        "ppo_continuous_action (actor_mean.*, actor_logstd), ppo (actor.*, critic.*), dqn (network.*), c51 "
        "(model_weights, atoms), ddpg/td3 (fc1, fc2, fc_mu, action_scale, action_bias) and sac (fc_mean, fc_logstd)")


def _flax_params(tree, where: str) -> dict[str, np.ndarray]:
    """``{"params": {"Dense_0": {"kernel", "bias"}}}`` flattened to ``{where + "params/Dense_0/kernel": ...}``."""
    if not (isinstance(tree, dict) and isinstance(tree.get("params"), dict)):
        raise BadModelError(f"{where or 'the file'} holds no Flax variables {{'params': ...}}")
    out = {}
    for layer, params in tree["params"].items():
        if not isinstance(params, dict):
            raise BadModelError(f"params/{layer} is not a layer's parameters")
        for name, array in params.items():
            if not isinstance(array, np.ndarray):
                raise BadModelError(f"params/{layer}/{name} is not an array")
            out[f"{where}params/{layer}/{name}"] = array
    return out


def place_flax(tree, what: str) -> CleanRLFile:
    """Place what a CleanRL Flax file holds (see the module docstring)."""
    if not isinstance(tree, dict):
        raise BadModelError(f"{what} holds a {type(tree).__name__}, not a Flax state dict")
    if "model_weights" in tree:
        args = tree.get("args") if isinstance(tree.get("args"), dict) else None
        if args is None or not {"n_atoms", "v_min", "v_max"} <= set(args):
            raise BadModelError(f"{what} holds model_weights without the args n_atoms, v_min, v_max that c51_jax.py "
                                "saves beside them; the atoms cannot be rebuilt")
        return CleanRLFile("c51-jax", _flax_params(tree["model_weights"], "model_weights/"), ignored=["args"],
                           args=args, prefix="model_weights/")
    if "params" in tree:
        return CleanRLFile("dqn-jax", _flax_params(tree, ""))
    if "0" in tree and all(k.isdigit() for k in tree):
        actor = _flax_params(tree["0"], "0/")
        qfs = sorted(k for k in tree if k != "0")
        layout = "td3-jax" if len(qfs) == 2 else "ddpg-jax"
        return CleanRLFile(layout, actor, ignored=[f"qf{k} (a Q-function)" for k in qfs], prefix="0/")
    raise BadModelError(f"{what} is a Flax state dict of no CleanRL script: its top-level keys are "
                        f"{', '.join(map(str, list(tree)[:10]))}")


# --------------------------------------------------------------------------------------- layers


def _sequential(arrays: dict, module: str, act: Activation | None) -> list[Dense]:
    """The Linear layers of ``module.<i>`` (an ``nn.Sequential``), the activation module between
    each two named by its own index (``actor_mean.1/tanh``)."""
    found: dict[int, dict[str, tuple[str, np.ndarray]]] = {}
    for key, array in arrays.items():
        m = _SEQ.match(key)
        if m and m["module"] == module:
            found.setdefault(int(m["index"]), {})[m["param"]] = (key, array)
    if not found:
        raise BadModelError(f"no layers {module}.<i>.weight")
    indices = sorted(found)
    layers = []
    for i, index in enumerate(indices):
        if "weight" not in found[index] or found[index]["weight"][1].ndim != 2:
            raise BadModelError(f"{module}.{index} is not a Linear layer (CleanRL's MLP scripts build Linear layers only; "
                                "the Atari scripts' convolutions are not read)")
        wname, w = found[index]["weight"]
        bname, b = found[index].get("bias", (None, None))
        post = []
        if i < len(indices) - 1 and act is not None:
            post = [Step("activation", f"{module}.{index + 1}", act)]
        layers.append(Dense(f"{module}.{index}", w, wname, b, bname, "out_in", act if post else None, post))
    return layers


def _named(arrays: dict, names: list[str], act: Activation | None, layout: str = "out_in",
           prefix: str = "", w: str = "weight", b: str = "bias", sep: str = ".") -> list[Dense]:
    """Layers by name (``fc1``, ``fc2`` ...), all but the last followed by ``act``."""
    layers = []
    for i, name in enumerate(names):
        wkey, bkey = f"{prefix}{name}{sep}{w}", f"{prefix}{name}{sep}{b}"
        if wkey not in arrays:
            raise BadModelError(f"missing {wkey}")
        if arrays[wkey].ndim != 2:
            raise BadModelError(f"{wkey} has shape {tuple(arrays[wkey].shape)}; a Dense layer's is 2-D")
        layers.append(Dense(name, arrays[wkey], wkey, arrays.get(bkey), bkey if bkey in arrays else None, layout,
                            act if i < len(names) - 1 else None))
    return layers


def _flax_dense(arrays: dict, prefix: str, act: Activation | None) -> list[Dense]:
    found = sorted({int(m[1]) for k in arrays if (m := re.match(rf"^{re.escape(prefix)}params/Dense_(\d+)/kernel$", k))})
    if found != list(range(len(found))) or not found:
        raise BadModelError(f"the Flax params hold Dense layers {found}; expected Dense_0 ... Dense_N")
    names = [f"Dense_{i}" for i in found]
    return _named(arrays, names, act, "in_out", f"{prefix}params/", "kernel", "bias", "/")


# ----------------------------------------------------------------------------------- conversion


def _activation(options, layout: str) -> tuple[Activation | None, str]:
    name = options.activation or SCRIPT_ACTIVATION.get(layout.removesuffix("-jax"), "relu")
    act = parse_activation(name)
    return (None if act.name == "linear" else act), name


def _bounds(options, width: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``--action-bounds`` as float32 arrays of ``width`` (one number stands for all).

    Raises:
        OptionError: a side of another width than 1 or ``width``, a bound not finite, a low above its high.
    """
    if options.action_bounds is None:
        return None
    out = []
    for name, values in zip(("low", "high"), options.action_bounds, strict=True):
        values = np.asarray(values, np.float32)
        if values.size == 1:
            values = np.full(width, values.reshape(()), np.float32)
        if values.shape != (width,):
            raise OptionError(f"--action-bounds gives {values.size} {name} bounds; the policy has {width} action "
                              f"dimensions (give one number for all, or {width})")
        out.append(values)
    low, high = out
    if not (np.isfinite(low).all() and np.isfinite(high).all() and (low <= high).all()):
        raise OptionError(f"--action-bounds: every bound must be finite and every low at most its high (low "
                          f"{list(map(float, low))}, high {list(map(float, high))})")
    return low, high


def convert_cleanrl(source, options):
    """Convert a CleanRL ``.cleanrl_model`` (see the module docstring for the layouts).

    Args:
        source: the file's path.
        options: a :class:`~policyport.converter.options.ConvertOptions`; reads ``activation``
            (default: the script's own), ``keep_value`` (PPO's critic as ``value``), ``action_bounds``
            (a PPO policy's clip, a JAX TD3/DDPG actor's bounds), ``opset``.

    Returns:
        A :class:`~policyport.converter.options.Converted`: graph input ``obs``, outputs ``logits``
        (the last layer's raw output), ``action`` (CleanRL's deterministic action), ``log_std``
        (PPO continuous, SAC), ``q_values`` (C51), ``value`` (PPO with ``keep_value``).

    Raises:
        UnreadableFileError, UntrustedFileError: see :func:`read_cleanrl`.
        BadModelError: a layout of no CleanRL script, layers that do not chain.
        OptionError: an option the layout does not take.
    """
    from ..assumptions import reconstruction
    from ..build import build_mlp
    from ..options import Converted
    from .state_dict import check_dtypes, has_torch, reference_for

    if isinstance(source, dict) or not isinstance(source, (str, Path)) and not hasattr(source, "__fspath__"):
        raise BadModelError("a CleanRL source is a .cleanrl_model file path")
    placed, provenance = read_cleanrl(source)
    check_dtypes({**placed.actor, **placed.value}, "the CleanRL network's parameters")
    layout, script = placed.layout, SCRIPTS[placed.layout]
    act, act_name = _activation(options, layout)
    if options.keep_value and not placed.value:
        raise OptionError(f"--keep-value: {script}'s saved network has no value function (only PPO's Agent has a critic)")
    notes = [f"read as CleanRL's {script}"] + ([f"not exported: {joined(placed.ignored)}"] if placed.ignored else [])
    tail = None
    spec_kwargs = {}
    if layout in ("ppo-continuous", "ppo"):
        module = "actor_mean" if layout == "ppo-continuous" else "actor"
        layers = _sequential(placed.actor, module, act)
        if options.keep_value:
            value = _sequential(placed.value, "critic", act)
            spec_kwargs = {"value_hidden": value[:-1], "value_output": value[-1]}
    elif layout in ("dqn", "c51"):
        layers = _sequential(placed.actor, "network", act)
    elif layout in ("td3", "sac"):
        layers = _named(placed.actor, ["fc1", "fc2", "fc_mu" if layout == "td3" else "fc_mean"], act)
    else:
        layers = _flax_dense(placed.actor, placed.prefix, act)
    spec = MlpSpec(hidden=layers[:-1], output=layers[-1], **spec_kwargs)
    width = spec.output.out_features
    if options.action_bounds is not None and layout not in ("ppo-continuous", "td3-jax", "ddpg-jax"):
        held = "its file holds action_scale and action_bias" if layout in ("td3", "sac") else "it acts in a Discrete space"
        raise OptionError(f"--action-bounds does not apply to {script}'s network: {held}")
    bounds = _bounds(options, width)
    assumptions = _assumptions(layout, script, act_name, options, spec, bounds)

    if layout == "ppo-continuous":
        logstd = placed.actor.get("actor_logstd")
        if logstd is None or logstd.shape != (1, width):
            raise BadModelError(f"actor_logstd is {None if logstd is None else tuple(logstd.shape)}; "
                                f"ppo_continuous_action.py's Agent holds one of shape (1, {width})")
        low, high = bounds if bounds is not None else (np.full(width, -np.inf, spec.dtype), np.full(width, np.inf, spec.dtype))
        spec.action = ActionHead("clip", low.astype(spec.dtype), high.astype(spec.dtype))
        tail = ExpandLogStd(logstd)
    elif layout in ("ppo", "dqn", "dqn-jax"):
        spec.action = ActionHead("argmax")
    elif layout in ("c51", "c51-jax"):
        atoms = placed.actor["atoms"] if layout == "c51" else _linspace_atoms(placed.args)
        if width % atoms.shape[0]:
            raise BadModelError(f"the last layer outputs {width} values, not a multiple of the {atoms.shape[0]} atoms")
        tail = Distributional(atoms, "atoms" if layout == "c51" else None)
    else:
        if layout in ("td3", "sac"):
            scale, bias = placed.actor["action_scale"], placed.actor["action_bias"]
            names = ("action_scale", "action_bias")
        else:
            low, high = bounds if bounds is not None else (np.full(width, -1, np.float32), np.full(width, 1, np.float32))
            scale, bias = (high - low) / 2.0, (high + low) / 2.0  # the scripts' own formulas, in float32
            names = (None, None)
        log_std = None
        if layout == "sac":
            log_std = _named(placed.actor, ["fc_logstd"], None)[0]
        tail = Squash(spec.output.name, np.asarray(scale, spec.dtype), np.asarray(bias, spec.dtype), names, log_std,
                      spec.hidden[-1] if spec.hidden else None)
    spec.source = {**provenance, "layout": layout, "script": script}
    model = build_mlp(spec, opset=options.opset, postlude=tail.build if tail else None,
                      metadata={"policyport.activation": act_name, "policyport.layout": f"cleanrl-{layout}"})
    from ..readers.torch_files import keep_state_dict_layout

    keep_state_dict_layout(model, {k: v for k, v in {**placed.actor, **placed.value}.items()})
    base = reference_for(spec, None)

    def reference(obs):
        out = base(obs)
        if tail is not None:
            out.update(tail.reference(out, spec, np.asarray(obs)))
        return out

    runner = "torch modules" if has_torch() else "numpy"
    return Converted(model, reference, "cleanrl", notes, assumptions,
                     reconstruction(f"the arrays of CleanRL's {script} network", runner))


def _linspace_atoms(args: dict) -> np.ndarray:
    """c51_jax.py's atoms: ``jnp.asarray(np.linspace(v_min, v_max, num=n_atoms))``, float32 under JAX's
    default 32-bit mode."""
    return np.linspace(float(args["v_min"]), float(args["v_max"]), num=int(args["n_atoms"])).astype(np.float32)


def _assumptions(layout, script, act_name, options, spec, bounds) -> list[Assumption]:
    hidden = [s.scope for layer in [*spec.hidden, *spec.value_hidden] for s in layer.steps()]
    hidden = hidden or [layer.name for layer in spec.hidden]
    because = ("given by --activation; a CleanRL file does not record it" if options.activation else
               f"{script} builds its networks with {act_name}, and the file does not record it")
    found = [Assumption("activation", f"{act_name} at {joined(hidden)}", because, "--activation names another")] if hidden else []
    if layout == "ppo-continuous":
        if bounds is None:
            found.append(Assumption("action bounds", "none: the action is actor_mean's output, unclipped",
                                    f"{script} clips it in the environment (gymnasium's ClipAction) to bounds the file "
                                    "does not hold", "--action-bounds LOW:HIGH clips it as ClipAction does"))
        else:
            found.append(Assumption("action bounds", f"[{_show(bounds[0])}, {_show(bounds[1])}]: actor_mean's output "
                                    "clipped as gymnasium's ClipAction does", "given by --action-bounds", ""))
        found.append(Assumption("observation normalisation", "none",
                                f"{script} trains under gymnasium's NormalizeObservation (clip((x - mean) / sqrt(var + "
                                "1e-8), -10, 10)) and never saves its statistics, so the file holds none",
                                "normalise the observations before the policy as the environment did"))
    elif layout in ("td3-jax", "ddpg-jax"):
        if bounds is None:
            found.append(Assumption("action bounds", "[-1, 1]: action_scale 1, action_bias 0",
                                    f"{script}'s Actor keeps action_scale and action_bias as module attributes, which "
                                    "flax.serialization does not save", "--action-bounds LOW:HIGH gives the Box"))
        else:
            found.append(Assumption("action bounds", f"[{_show(bounds[0])}, {_show(bounds[1])}]",
                                    f"given by --action-bounds; {script}'s file does not save action_scale "
                                    "and action_bias", ""))
    return found


def _show(values: np.ndarray) -> str:
    values = [float(v) for v in values]
    return f"{values[0]:g}" if len(set(values)) == 1 else "(" + ", ".join(f"{v:g}" for v in values) + ")"


# -------------------------------------------------------------- what follows the last layer


def _output_tensor(layer: Dense) -> str:
    """The tensor a hidden layer outputs: its last step's, or its affine map's."""
    steps = layer.steps()
    return steps[-1].tensor if steps else f"{layer.name}/linear"


@dataclass
class ExpandLogStd:
    """``ppo_continuous_action.py``'s ``actor_logstd.expand_as(action_mean)``: output ``log_std``."""

    logstd: np.ndarray

    def build(self, b, logits, value, outputs):
        import onnx

        p = b.initializer(self.logstd, "actor_logstd", "actor_logstd")
        shape = b.node("Shape", [logits], "actor_logstd/shape")
        b.node("Expand", [p, shape], "log_std")
        outputs.append(onnx.helper.make_tensor_value_info("log_std", onnx.helper.np_dtype_to_tensor_dtype(b.dtype),
                                                          ["batch", self.logstd.shape[1]]))

    def reference(self, out, spec, obs):
        shape = out["logits"].shape
        return {"actor_logstd/shape": np.array(shape, np.int64), "log_std": np.broadcast_to(self.logstd, shape).copy()}


@dataclass
class Distributional:
    """C51's greedy action (``c51.py``, ``QNetwork.get_action``): ``pmfs = softmax(logits.view(batch,
    n, n_atoms), dim=2)``, ``q_values = (pmfs * atoms).sum(2)``, ``action = argmax(q_values, 1)``."""

    atoms: np.ndarray
    atoms_name: str | None

    def build(self, b, logits, value, outputs):
        import onnx

        n_atoms = self.atoms.shape[0]
        shape = b.constant([0, -1, n_atoms], "pmfs/shape")
        per_action = b.node("Reshape", [logits, shape], "pmfs/logits")
        pmfs = b.node("Softmax", [per_action], "pmfs", axis=2)
        atoms = b.initializer(np.asarray(self.atoms, b.dtype), self.atoms_name or "atoms", self.atoms_name)
        weighted = b.node("Mul", [pmfs, atoms], "q_values/weighted")
        if b.opset >= 13:
            q = b.node("ReduceSum", [weighted, b.constant([2], "q_values/axes")], "q_values", keepdims=0)
        else:
            q = b.node("ReduceSum", [weighted], "q_values", axes=[2], keepdims=0)
        b.node("ArgMax", [q], "action", axis=1, keepdims=0)
        elem = onnx.helper.np_dtype_to_tensor_dtype(b.dtype)
        outputs += [onnx.helper.make_tensor_value_info("q_values", elem, ["batch", None]),
                    onnx.helper.make_tensor_value_info("action", onnx.TensorProto.INT64, ["batch"])]

    def reference(self, out, spec, obs):
        logits = out["logits"]
        x = logits.reshape(len(logits), -1, self.atoms.shape[0])
        e = np.exp(x - x.max(axis=2, keepdims=True))
        pmfs = e / e.sum(axis=2, keepdims=True)
        weighted = pmfs * self.atoms.astype(logits.dtype)
        q = weighted.sum(axis=2)
        return {"pmfs/logits": x, "pmfs": pmfs, "q_values/weighted": weighted, "q_values": q,
                "action": np.argmax(q, axis=1).astype(np.int64)}


@dataclass
class Squash:
    """TD3/DDPG/SAC's deterministic action ``tanh(out) * action_scale + action_bias`` in the scripts'
    operation order, and SAC's ``log_std`` from ``fc_logstd``."""

    output: str
    scale: np.ndarray
    bias: np.ndarray
    names: tuple[str | None, str | None]
    log_std: Dense | None = None
    last_hidden: Dense | None = None

    def build(self, b, logits, value, outputs):
        import onnx

        elem = onnx.helper.np_dtype_to_tensor_dtype(b.dtype)
        t = b.node("Tanh", [logits], f"{self.output}/tanh")
        scale = b.initializer(self.scale, self.names[0] or "action_scale", self.names[0])
        bias = b.initializer(self.bias, self.names[1] or "action_bias", self.names[1])
        b.node("Add", [b.node("Mul", [t, scale], "action/scaled"), bias], "action")
        outputs.append(onnx.helper.make_tensor_value_info("action", elem, ["batch", self.scale.shape[0]]))
        if self.log_std is not None:
            hidden = _output_tensor(self.last_hidden) if self.last_hidden else "obs"
            raw = b.dense(self.log_std, hidden, f"{self.log_std.name}/linear")
            squashed = b.node("Tanh", [raw], f"{self.log_std.name}/tanh")
            one = b.initializer(np.array(1, b.dtype), "log_std/one")
            half_range = b.initializer(np.array(0.5 * (SAC_LOG_STD_MAX - SAC_LOG_STD_MIN), b.dtype), "log_std/half_range")
            low = b.initializer(np.array(SAC_LOG_STD_MIN, b.dtype), "log_std/min")
            shifted = b.node("Mul", [half_range, b.node("Add", [squashed, one], "log_std/plus_one")], "log_std/scaled")
            b.node("Add", [low, shifted], "log_std")
            outputs.append(onnx.helper.make_tensor_value_info("log_std", elem, ["batch", self.scale.shape[0]]))

    def reference(self, out, spec, obs):
        logits = out["logits"]
        t = np.tanh(logits)
        scaled = t * self.scale
        result = {f"{self.output}/tanh": t, "action/scaled": scaled, "action": scaled + self.bias}
        if self.log_std is not None:
            h = out[_output_tensor(self.last_hidden)] if self.last_hidden else obs
            raw = h @ self.log_std.weight.T + self.log_std.bias
            squashed = np.tanh(raw)
            dt = logits.dtype.type
            plus_one = squashed + dt(1)
            spread = dt(0.5 * (SAC_LOG_STD_MAX - SAC_LOG_STD_MIN)) * plus_one
            result.update({f"{self.log_std.name}/linear": raw, f"{self.log_std.name}/tanh": squashed,
                           "log_std/plus_one": plus_one, "log_std/scaled": spread, "log_std": dt(SAC_LOG_STD_MIN) + spread})
        return result
