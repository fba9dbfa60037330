"""rsl_rl (and Isaac Lab's rsl_rl runs) ``model_<iteration>.pt`` checkpoints.

The runner saves a dict with ``torch.save`` (``rsl_rl/runners/on_policy_runner.py``, ``save``); its
layout changed with rsl_rl's versions, and the keys tell them apart (:func:`read_layout`):

* 5.x (``rsl_rl/algorithms/ppo.py``, ``PPO.save``; ``models/mlp_model.py``): ``actor_state_dict`` holds
  ``obs_normalizer.{_mean,_var,_std,count}`` (an ``EmpiricalNormalization``, ``modules/normalization.py``),
  ``mlp.{0,2,...}.{weight,bias}`` and the distribution's ``distribution.std_param`` (a std) or
  ``distribution.log_std_param`` (a log std), both clamped to ``std_range`` (1e-6, 1e6) when used
  (``modules/distribution.py``, ``GaussianDistribution.update``); a heteroscedastic Gaussian or a Beta
  head has no such parameter and a last layer twice the action width, read as ``(2, A)``: row 0 is the
  mean (or the Beta's raw alpha), row 1 the std, the log std, or the raw beta.
* 4.x: the same dict, the std as ``std`` or ``log_std`` in ``actor_state_dict`` (unclamped).
* 3.x: ``model_state_dict`` holds ``actor.{0,2,...}``, ``std`` or ``log_std``, and the normaliser as
  ``actor_obs_normalizer.*``; a state-dependent std (3.1) makes the last layer ``(2, A)`` as above.
* 2.x: ``model_state_dict`` with ``actor.*`` and ``std`` (or ``log_std``, 2.3), the normaliser beside it
  as ``obs_norm_state_dict``.
* 1.x (legged_gym): ``model_state_dict`` with ``actor.*`` and ``std``; no normaliser.

The normaliser is ``(x - _mean) / (_std + 1e-2)`` (``EmpiricalNormalization.forward``, eps 1e-2, no
clip), kept in the graph as rsl_rl computes it: ``_std`` and the epsilon apart, so ``extract`` gives
``_std`` back (rsl_rl's own ONNX export folds ``_std + 0.01`` into one constant). The deterministic
action is the mean (``deterministic_output``); a Beta head's is ``alpha / (alpha + beta) * (high - low)
+ low`` with ``alpha = softplus(.) + 1``. Isaac Lab clips and scales actions in its environment, not in
the policy: no exported file holds that, and neither does this model.

Nothing is unpickled beyond tensors and plain containers: the file is read by policyport's own reader of
torch's zip format, and whatever else it pickles (``infos``, a config object) becomes inert records,
whatever it names; nothing from the file runs. The hidden activation is not in the checkpoint: it is read
from the run's ``params/agent.yaml`` beside it (where Isaac Lab writes the agent configuration), else
``--activation`` is required.
"""

from __future__ import annotations

import _compat_pickle
import contextlib
import io
import itertools
import math
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import (
    ZIP_ERRORS,
    BadModelError,
    LimitExceededError,
    OptionError,
    UnreadableFileError,
)
from ..assumptions import Assumption, activation_assumption

#: ``EmpiricalNormalization``'s epsilon (``rsl_rl/modules/normalization.py``, ``eps: float = 1e-2``),
#: added to the standard deviation, not the variance; there is no clip.
NORMALIZER_EPS = 1e-2
#: ``GaussianDistribution``'s default ``std_range`` (``rsl_rl/modules/distribution.py``), rsl_rl 5.x.
STD_RANGE = (1e-6, 1e6)
#: rsl_rl's activation names (``rsl_rl/utils/utils.py``, ``resolve_nn_activation``) -> policyport's.
ACTIVATIONS = {"elu": "elu", "selu": "selu", "relu": "relu", "crelu": "elu", "lrelu": "leaky_relu:0.01",
               "tanh": "tanh", "sigmoid": "sigmoid", "softplus": "softplus", "gelu": "gelu", "swish": "swish",
               "mish": "mish", "identity": "linear"}
#: The top-level keys that tell an rsl_rl checkpoint (any version), for :mod:`policyport.converter.kinds`.
MARKERS = ({"actor_state_dict", "critic_state_dict", "iter"}, {"model_state_dict", "optimizer_state_dict", "iter"})


@dataclass
class Layout:
    """An rsl_rl actor, as the checkpoint holds it (names are rsl_rl's keys).

    Attributes:
        version: which rsl_rl layout (``"5.x"``, ``"4.x"``, ``"3.x"``, ``"2.x"``, ``"1.x"``).
        layers: ``(name, weight name, weight (out, in), bias name, bias (out,))`` in order.
        normalizer: role (``_mean``, ``_var``, ``_std``, ``count``) -> (name, array), empty without one;
            ``_mean``/``_std`` are float32 ``(1, obs_dim)``.
        std: ``(name, array (A,), "std" | "log_std", clamped)`` of a state-independent std, or ``None``.
        info: other top-level keys, for notes.
    """

    version: str
    layers: list[tuple[str, str, np.ndarray, str, np.ndarray]]
    normalizer: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)
    std: tuple[str, np.ndarray, str, bool] | None = None

    @property
    def obs_dim(self) -> int:
        return int(self.layers[0][2].shape[1])

    @property
    def out_width(self) -> int:
        return int(self.layers[-1][2].shape[0])


def is_rsl_rl_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a torch zip whose pickle names the top-level keys of an rsl_rl checkpoint,
    read from the pickle's string opcodes without unpickling anything."""
    strings = _pickled_strings(path)
    return any(marker <= strings for marker in MARKERS)


def _data_pkl(path: Path, max_bytes: int | None = None) -> bytes:
    """The bytes of the checkpoint's ``data.pkl``, its declared size checked against ``max_bytes`` (default:
    the array limit) before it is read; ``b""`` when the file is no zip archive holding one ``data.pkl``.

    Raises:
        LimitExceededError: ``data.pkl`` declares more than ``max_bytes``.
    """
    from ...io.arrays import read_zip_member

    try:
        with zipfile.ZipFile(path) as zf:
            pickles = [n for n in zf.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
            return read_zip_member(zf, pickles[0], str(path), max_bytes=max_bytes) if len(pickles) == 1 else b""
    except ZIP_ERRORS:  # a damaged archive (a zip version, compression or CRC zipfile refuses): no checkpoint
        return b""


def _pickled_strings(path: Path) -> set[str]:
    import pickletools

    try:
        data = _data_pkl(path, max_bytes=64 << 20)
    except LimitExceededError:
        return set()
    found = set()
    with contextlib.suppress(Exception):  # a damaged pickle: what was read so far
        for opcode, arg, _ in pickletools.genops(io.BytesIO(data)):
            if isinstance(arg, str) and "UNICODE" in opcode.name:
                found.add(arg)
    return found


def read_checkpoint(path: Path) -> dict:
    """The checkpoint's top-level dict, tensors as numpy arrays, every other object an inert record,
    read by the shared torch reader (:func:`policyport.converter.readers.torch_files.load_torch_file`:
    the archive's sizes checked before anything is read, nothing from the file called).

    Raises:
        UnreadableFileError: not a torch zip holding a dict.
        LimitExceededError: the archive, its pickle or its tensors declare more than the limits.
    """
    from ..readers.torch_files import load_torch_file
    from ..readers.unpickle import pickled_globals

    # every global the pickle names outside torch's tensor rebuilders becomes an inert record, called never;
    # under its Python 2 name too, which protocol 2 writes and the unpickler maps back (``subprocess`` as ``commands``)
    modules = set()
    for text in pickled_globals(_data_pkl(path)):
        module, _, name = text.rpartition(".")
        modules.add(module)
        modules.add(_compat_pickle.NAME_MAPPING.get((module, name), (_compat_pickle.IMPORT_MAPPING.get(module, module),))[0])
    inert = sorted(modules - {"torch", "torch._utils", "collections"})
    loaded = load_torch_file(path, inert_modules=[m for m in inert if m])
    if not isinstance(loaded, dict):
        raise UnreadableFileError(f"{path} holds a {type(loaded).__name__}, not the dict an rsl_rl runner saves")
    return loaded


def _arrays(value, what: str) -> dict[str, np.ndarray]:
    from ..readers.checkpoints import state_dict

    return state_dict(value, what)


def read_layout(ckpt: dict, what: str) -> Layout:
    """Tell the rsl_rl version from the checkpoint's keys and place its actor's arrays.

    Raises:
        BadModelError: a dict of none of the layouts, an actor without layers, layers with gaps.
    """
    if "actor_state_dict" in ckpt:
        sd = _arrays(ckpt["actor_state_dict"], f"{what}'s actor_state_dict")
        prefix, norm_prefix, norm = "mlp.", "obs_normalizer.", sd
        if "distribution.std_param" in sd:
            std, version = ("distribution.std_param", "std", True), "5.x"
        elif "distribution.log_std_param" in sd:
            std, version = ("distribution.log_std_param", "log_std", True), "5.x"
        elif "std" in sd or "log_std" in sd:
            key = "std" if "std" in sd else "log_std"
            std, version = (key, key, False), "4.x"
        else:
            std, version = None, "5.x"
    elif "model_state_dict" in ckpt:
        sd = _arrays(ckpt["model_state_dict"], f"{what}'s model_state_dict")
        prefix = "actor."
        key = "std" if "std" in sd else "log_std" if "log_std" in sd else None
        std = (key, key, False) if key else None
        if any(k.startswith("actor_obs_normalizer.") for k in sd):
            version, norm_prefix, norm = "3.x", "actor_obs_normalizer.", sd
        elif isinstance(ckpt.get("obs_norm_state_dict"), dict):
            version, norm_prefix = "2.x", ""
            norm = {f"obs_norm_state_dict.{k}": v for k, v in _arrays(ckpt["obs_norm_state_dict"],
                                                                       f"{what}'s obs_norm_state_dict").items()}
            norm_prefix = "obs_norm_state_dict."
        else:
            version, norm_prefix, norm = ("1.x" if std else "3.x"), None, {}
    else:
        raise BadModelError(f"{what} holds {', '.join(map(str, ckpt))}: neither actor_state_dict (rsl_rl 4 and 5) nor "
                            "model_state_dict (rsl_rl 1 to 3)")
    numbered = {}
    for name in sd:
        m = re.fullmatch(re.escape(prefix) + r"(\d+)\.(weight|bias)", name)
        if m:
            numbered.setdefault(int(m[1]), {})[m[2]] = name
    if not numbered:
        raise BadModelError(f"{what} holds no actor layers ({prefix}<i>.weight); found {', '.join(sorted(sd)[:12])}")
    layers = []
    for index in sorted(numbered):
        names = numbered[index]
        if set(names) != {"weight", "bias"}:
            raise BadModelError(f"{what}: actor layer {prefix}{index} lacks its {({'weight', 'bias'} - set(names)).pop()}")
        w, b = sd[names["weight"]], sd[names["bias"]]
        if w.ndim != 2 or b.shape != (w.shape[0],):
            raise BadModelError(f"{what}: {names['weight']} {w.shape} and {names['bias']} {b.shape} are not a Linear layer")
        layers.append((f"{prefix}{index}", names["weight"], w, names["bias"], b))
    for (_, wa, a, _, _), (_, wb, b, _, _) in itertools.pairwise(layers):
        if a.shape[0] != b.shape[1]:
            raise BadModelError(f"{what}: actor layers do not chain: {wa} {a.shape} then {wb} {b.shape}")
    normalizer = {}
    if norm_prefix is not None:
        for role in ("_mean", "_var", "_std", "count"):
            if norm_prefix + role in norm:
                normalizer[role] = (norm_prefix + role, norm[norm_prefix + role])
        if normalizer and not {"_mean", "_std"} <= set(normalizer):
            raise BadModelError(f"{what}: the observation normaliser {norm_prefix}* lacks _mean or _std")
        for role in ("_mean", "_std"):
            if role in normalizer and normalizer[role][1].size != layers[0][2].shape[1]:
                raise BadModelError(f"{what}: {normalizer[role][0]} holds {normalizer[role][1].size} values, the "
                                    f"actor's first layer takes {layers[0][2].shape[1]}")
    std_entry = None
    if std is not None:
        name, kind, clamped = std
        std_entry = (name, sd[name], kind, clamped)
    return Layout(version, layers, normalizer, std_entry)


# ---------------------------------------------------------------- the run's agent.yaml


@dataclass
class RunConfig:
    """What the run's ``params/agent.yaml`` says about the actor (``None``: not said)."""

    path: Path
    activation: str | None = None
    distribution: str | None = None  # "gaussian", "heteroscedastic", "beta"
    std_type: str | None = None  # "scalar" or "log"
    action_range: tuple[float, float] | None = None
    state_dependent_std: bool = False  # rsl_rl 3.1 to 4.x's flag (5.x names a heteroscedastic distribution instead)


def _block(lines: list[str], key: str) -> list[str]:
    """The lines indented under the top-level ``key:`` of a YAML document."""
    out, inside = [], False
    for line in lines:
        if re.match(rf"^{re.escape(key)}:\s*$", line):
            inside = True
            continue
        if inside:
            if line.strip() and not line[:1].isspace():
                break
            out.append(line)
    return out


def read_run_config(checkpoint: Path) -> RunConfig | None:
    """The actor's settings from ``<checkpoint's folder>/params/agent.yaml``, where Isaac Lab's
    ``train.py`` writes the agent configuration (``dump_yaml(os.path.join(log_dir, "params", "agent.yaml"),
    agent_cfg)``). Read as text, never as YAML objects (the file may hold ``!!python/`` tags): the
    actor's section is ``actor:`` (rsl_rl 5) or ``policy:`` (earlier), with ``activation``, the
    distribution's ``class_name``, ``std_type`` / ``noise_std_type``, ``state_dependent_std`` and
    ``action_range``. ``None`` when there is no such file.
    """
    path = checkpoint.parent / "params" / "agent.yaml"
    if not path.is_file():
        return None
    try:
        lines = path.read_text(errors="replace").splitlines()[:20000]
    except OSError:
        return None
    section = _block(lines, "actor") or _block(lines, "policy")
    config = RunConfig(path)
    text = "\n".join(section)

    def value(key: str) -> str | None:
        m = re.search(rf"^\s*{key}:\s*['\"]?([^'\"\n#]*?)['\"]?\s*$", text, re.MULTILINE)
        return m[1].strip() if m and m[1].strip() else None

    config.activation = value("activation")
    cls = " ".join(re.findall(r"^\s*class_name:\s*(\S+)", text, re.MULTILINE))
    if "Beta" in cls:
        config.distribution = "beta"
    elif "Heteroscedastic" in cls or (value("state_dependent_std") or "").lower() == "true":
        config.distribution = "heteroscedastic"
        config.state_dependent_std = "Heteroscedastic" not in cls
    elif "Gaussian" in cls or "ActorCritic" in cls:
        config.distribution = "gaussian"
    std_type = value("std_type") or value("noise_std_type")
    config.std_type = std_type.lower() if std_type else None
    m = re.search(r"^(\s*)action_range:\s*(.*)$", text, re.MULTILINE)
    if m:
        numbers = re.findall(r"-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?", m[2])
        if not numbers:  # a block list under it
            after = text[m.end():].splitlines()[1:3]
            numbers = [re.sub(r"^\s*-\s*", "", line).strip() for line in after]
        try:
            config.action_range = (float(numbers[0]), float(numbers[1]))
        except (IndexError, ValueError):
            config.action_range = None
    return config


# ---------------------------------------------------------------- the graph


@dataclass
class Head:
    """How the actor's output becomes the action: ``kind`` is ``"gaussian"`` (a std parameter),
    ``"heteroscedastic"`` (row 1 of the last layer is the std or log std: ``std_type``) or ``"beta"``."""

    kind: str
    std_type: str = "scalar"
    clamped: bool = True
    low: float = -1.0
    high: float = 1.0


def _head(layout: Layout, config: RunConfig | None, what: str) -> Head:
    """The head the layout and the run's configuration say the actor has.

    Raises:
        OptionError: a last layer of two rows (a heteroscedastic Gaussian or a Beta head) and no
            ``params/agent.yaml`` naming which (exit 2).
    """
    if layout.std is not None:
        name, array, kind, clamped = layout.std
        if array.shape != (layout.out_width,):
            raise BadModelError(f"{what}: {name} has shape {array.shape}, the actor outputs {layout.out_width} means")
        return Head("gaussian", "scalar" if kind == "std" else "log", clamped)
    if layout.out_width % 2:
        raise BadModelError(f"{what}: the actor has no std parameter and an odd last layer ({layout.out_width}): neither a "
                            "Gaussian, nor a heteroscedastic Gaussian or Beta head of two rows")
    if config is None or config.distribution not in ("heteroscedastic", "beta"):
        where = "no params/agent.yaml beside it" if config is None else f"{config.path} names neither"
        raise OptionError(f"{what}'s actor has no std parameter and a last layer of {layout.out_width} = 2 x "
                          f"{layout.out_width // 2} outputs: a heteroscedastic Gaussian (mean, then std or log std) or a "
                          f"Beta head (raw alpha, then raw beta); the checkpoint does not say which, and there is {where}. "
                          "Keep the run's params/agent.yaml beside the checkpoint (Isaac Lab writes it there)")
    if config.distribution == "beta":
        low, high = config.action_range or (-1.0, 1.0)
        return Head("beta", low=low, high=high)
    if layout.version == "5.x" and config.state_dependent_std:
        layout.version = "4.x"  # no std parameter in actor_state_dict, and 4.x's state_dependent_std in agent.yaml
    return Head("heteroscedastic", config.std_type or "scalar", clamped=layout.version == "5.x")


def _build(layout: Layout, head: Head, activation, opset: int, metadata: dict[str, str]):
    import onnx

    from ..build import Dense, MlpBuilder, policy_model

    helper = onnx.helper
    dtype = np.dtype(np.float32)
    b = MlpBuilder(opset, dtype)
    x = "obs"
    if layout.normalizer:
        (mean_name, mean), (std_name, std) = layout.normalizer["_mean"], layout.normalizer["_std"]
        mean_t = b.initializer(mean, mean_name, mean_name)
        std_t = b.initializer(std, std_name, std_name)
        eps = b.initializer(np.array(NORMALIZER_EPS, dtype), "obs_normalizer/eps")
        centered = b.node("Sub", [x, mean_t], "obs_normalizer/centered")
        denom = b.node("Add", [std_t, eps], "obs_normalizer/std_plus_eps")
        x = b.node("Div", [centered, denom], "obs_normalizer")
        for role in ("_var", "count"):  # not computed with, kept for extract
            if role in layout.normalizer:
                name, array = layout.normalizer[role]
                b.initializer(array, name, name)
    for i, (name, wname, w, bname, bias) in enumerate(layout.layers):
        last = i == len(layout.layers) - 1
        layer = Dense(name, w, wname, bias, bname, "out_in", None if last else activation)
        x = b.dense(layer, x, "logits" if last else None)
    width = layout.out_width
    n = width if head.kind == "gaussian" else width // 2
    outputs = [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["batch", width])]

    def const(value, name):
        return b.initializer(np.array(value, dtype), name)

    def rows():
        axes = b.constant([1], "distribution/axes")
        mid = b.constant([n], "distribution/mid")
        first = b.node("Slice", ["logits", b.constant([0], "distribution/zero"), mid, axes], "distribution/row_0")
        second = b.node("Slice", ["logits", mid, b.constant([width], "distribution/end"), axes], "distribution/row_1")
        return first, second

    lo, hi = STD_RANGE
    if head.kind == "gaussian":
        b.node("Identity", ["logits"], "action")
        name, param, _, _ = layout.std
        # rsl_rl 1.x to 4.x name the parameter std or log_std, which are the graph outputs' names: the
        # initializer takes another name and keeps rsl_rl's as its source name (extract gives it back so)
        p = b.initializer(param, f"distribution/{name}" if name in ("std", "log_std") else name, name)
        shape = b.node("Shape", ["logits"], "distribution/batch_shape")
        if head.std_type == "scalar":
            if head.clamped:
                p = b.node("Clip", [p, const(lo, "distribution/std_min"), const(hi, "distribution/std_max")],
                           "distribution/std_clamped")
            b.node("Expand", [p, shape], "std")
            b.node("Log", ["std"], "log_std")
        else:
            if head.clamped:
                p = b.node("Clip", [p, const(math.log(lo), "distribution/log_std_min"),
                                    const(math.log(hi), "distribution/log_std_max")], "distribution/log_std_clamped")
            b.node("Expand", [p, shape], "log_std")
            b.node("Exp", ["log_std"], "std")
    elif head.kind == "heteroscedastic":
        mean, second = rows()
        b.node("Identity", [mean], "action")
        if head.std_type == "scalar":
            if head.clamped:
                second = b.node("Clip", [second, const(lo, "distribution/std_min"), const(hi, "distribution/std_max")],
                                "distribution/std_clamped")
            b.node("Identity", [second], "std")
            b.node("Log", ["std"], "log_std")
        else:
            if head.clamped:
                second = b.node("Clip", [second, const(math.log(lo), "distribution/log_std_min"),
                                         const(math.log(hi), "distribution/log_std_max")], "distribution/log_std_clamped")
            b.node("Identity", [second], "log_std")
            b.node("Exp", ["log_std"], "std")
    else:  # beta: alpha / (alpha + beta) * (high - low) + low, alpha = softplus(.) + 1
        alpha_raw, beta_raw = rows()
        one = const(1.0, "distribution/one")
        alpha = b.node("Add", [b.node("Softplus", [alpha_raw], "distribution/alpha_softplus"), one], "distribution/alpha")
        beta = b.node("Add", [b.node("Softplus", [beta_raw], "distribution/beta_softplus"), one], "distribution/beta")
        unit = b.node("Div", [alpha, b.node("Add", [alpha, beta], "distribution/alpha_plus_beta")], "distribution/mean_unit")
        scaled = b.node("Mul", [unit, const(head.high - head.low, "distribution/range_scale")], "distribution/mean_scaled")
        b.node("Add", [scaled, const(head.low, "distribution/range_offset")], "action")
    outputs.append(helper.make_tensor_value_info("action", onnx.TensorProto.FLOAT, ["batch", n]))
    if head.kind != "beta":
        outputs += [helper.make_tensor_value_info("std", onnx.TensorProto.FLOAT, ["batch", n]),
                    helper.make_tensor_value_info("log_std", onnx.TensorProto.FLOAT, ["batch", n])]
    graph_input = helper.make_tensor_value_info("obs", onnx.TensorProto.FLOAT, ["batch", layout.obs_dim])
    return policy_model(b, [graph_input], outputs, {"policyport.head": "beta" if head.kind == "beta" else "diag-gaussian",
                                                    **metadata})


def reference_forward(layout: Layout, head: Head, activation, obs: np.ndarray) -> dict[str, np.ndarray]:
    """rsl_rl's deterministic forward in numpy, float32, in rsl_rl's order of operations: the
    normaliser, the MLP, the head (see the module docstring); tensors named as the graph names them."""
    f32 = np.float32
    out: dict[str, np.ndarray] = {}
    x = np.asarray(obs, f32)
    if layout.normalizer:
        mean, std = layout.normalizer["_mean"][1], layout.normalizer["_std"][1]
        x = out["obs_normalizer"] = (x - mean) / (std + f32(NORMALIZER_EPS))
    for i, (name, _, w, _, bias) in enumerate(layout.layers):
        x = x @ w.T + bias
        if i < len(layout.layers) - 1:
            out[f"{name}/linear"] = x
            if activation is not None:
                x = out[f"{name}/{activation.label}"] = activation.reference(x).astype(f32)
    out["logits"] = x
    width = layout.out_width
    lo, hi = f32(STD_RANGE[0]), f32(STD_RANGE[1])
    log_lo, log_hi = f32(math.log(STD_RANGE[0])), f32(math.log(STD_RANGE[1]))
    if head.kind == "gaussian":
        out["action"] = x
        param = layout.std[1]
        if head.std_type == "scalar":
            std = np.clip(param, lo, hi) if head.clamped else param
            out["std"] = np.broadcast_to(std, x.shape).copy()
            out["log_std"] = np.log(out["std"])
        else:
            log_std = np.clip(param, log_lo, log_hi) if head.clamped else param
            out["log_std"] = np.broadcast_to(log_std, x.shape).copy()
            out["std"] = np.exp(out["log_std"])
    elif head.kind == "heteroscedastic":
        n = width // 2
        out["action"], second = x[:, :n], x[:, n:]
        if head.std_type == "scalar":
            out["std"] = np.clip(second, lo, hi) if head.clamped else second
            out["log_std"] = np.log(out["std"])
        else:
            out["log_std"] = np.clip(second, log_lo, log_hi) if head.clamped else second
            out["std"] = np.exp(out["log_std"])
    else:
        n = width // 2

        def softplus(v):
            return np.logaddexp(f32(0), v).astype(f32)

        alpha, beta = softplus(x[:, :n]) + f32(1), softplus(x[:, n:]) + f32(1)
        out["action"] = alpha / (alpha + beta) * f32(head.high - head.low) + f32(head.low)
    return out


def convert_rsl_rl(source, options):
    """Convert an rsl_rl ``model_<iteration>.pt`` (any layout, see the module docstring) to ONNX.

    Args:
        source: the checkpoint's path.
        options: a :class:`~policyport.converter.ConvertOptions`; ``activation`` is required when the
            run's ``params/agent.yaml`` does not lie beside the checkpoint, and must agree with it when it does.

    Returns:
        A :class:`~policyport.converter.Converted`: input ``obs`` (float32, ``(batch, obs_dim)``, raw
        observations), outputs ``logits``, ``action`` (the deterministic action), and ``std``,
        ``log_std`` for a Gaussian; initializers under rsl_rl's keys (``mlp.0.weight``,
        ``obs_normalizer._mean`` ...); the reference is rsl_rl's forward rebuilt in numpy.

    Raises:
        UnreadableFileError: not a torch zip holding a dict.
        BadModelError: a layout this reader does not know.
        OptionError: no activation anywhere; one that contradicts agent.yaml; a two-row head without agent.yaml.
    """
    import json

    from ..activations import choose_activation, parse_activation, required_activation
    from ..assumptions import reconstruction
    from ..options import Converted

    path = Path(os.fspath(source))
    what = str(path)
    layout = read_layout(read_checkpoint(path), what)
    config = read_run_config(path)
    recorded = config.activation if config is not None else None
    if recorded is not None:
        if recorded.lower() not in ACTIVATIONS:
            raise BadModelError(f"{config.path} names the activation {recorded!r}, which rsl_rl does not know "
                                f"({', '.join(ACTIVATIONS)})")
        recorded = ACTIVATIONS[recorded.lower()]
    hidden = [name for name, *_ in layout.layers[:-1]]
    given = options.activation
    activation_name, notes = choose_activation(given, recorded, str(config.path) if config else what)
    if activation_name is None:
        activation_name = required_activation(None, f"{what} (an rsl_rl checkpoint)", hidden,
                                              "rsl_rl's configurations use elu, and Isaac Lab writes it to the run's "
                                              "params/agent.yaml, which is not beside this checkpoint")
    activation = parse_activation(activation_name)
    act = None if activation.name == "linear" else activation
    head = _head(layout, config, what)
    assumptions = []
    if hidden:
        if recorded is not None:
            assumptions.append(Assumption("activation", f"{activation_name} at {', '.join(hidden)}",
                                          f"read from {config.path}; the checkpoint does not record it",
                                          "--activation must agree with it"))
        else:
            assumptions.append(activation_assumption([(h, activation_name) for h in hidden], f"{what} (rsl_rl {layout.version})",
                                                     "no params/agent.yaml lies beside it"))
    if head.kind in ("heteroscedastic", "beta"):
        said = (f"{head.std_type} std in row 1" if head.kind == "heteroscedastic"
                else f"Beta, action range [{head.low:g}, {head.high:g}]")
        assumptions.append(Assumption("head", said, f"read from {config.path}; the checkpoint does not record it"))
    assumptions.append(Assumption("action bounds", "none: action = the distribution's mean as the policy outputs it",
                                  "Isaac Lab clips and scales actions in the environment's action term, which no "
                                  "rsl_rl file records"))
    if not layout.normalizer:
        notes.append(f"{what} holds no observation normaliser (rsl_rl {layout.version}): the policy reads the "
                     "observations as the environment gives them")
    source_info = {"kind": "rsl-rl", "file": path.name, "rsl_rl_layout": layout.version}
    from ...io.kinds import sha256_file

    source_info["sha256"] = sha256_file(path)
    metadata = {"policyport.source": json.dumps(source_info), "policyport.activation": activation_name}
    if layout.normalizer:
        metadata["policyport.observation_filter"] = json.dumps(
            {"type": "EmpiricalNormalization", "formula": "(x - _mean) / (_std + eps)", "epsilon": NORMALIZER_EPS,
             "clip": None, "count": int(np.asarray(layout.normalizer.get("count", ("", 0))[1]))})
    model = _build(layout, head, act, options.opset, metadata)
    return Converted(model, lambda obs: reference_forward(layout, head, act, obs), "rsl-rl", notes=notes,
                     assumptions=assumptions, oracle=reconstruction(f"the arrays of an rsl_rl {layout.version} checkpoint"))
