"""skrl 2.x checkpoints (``agent_<timestep>.pt``, ``best_agent.pt``, and the per-module files of
``store_separately``), as skrl's own trainers and Isaac Lab's skrl runs write them.

``Agent.save`` and ``Agent.write_checkpoint`` (``skrl/agents/torch/base.py``) ``torch.save`` a dict of
the agent's ``checkpoint_modules``' state_dicts: for PPO (``agents/torch/ppo/ppo.py``) ``policy``,
``value``, ``optimizer`` and, when configured, ``observation_preprocessor``, ``state_preprocessor`` and
``value_preprocessor``. With ``experiment.store_separately`` each module is a file of its own,
``<name>_<timestep>.pt`` (``best_<name>.pt``), beside the others in ``<run>/checkpoints/``.

The policy read is a model instantiator's Gaussian policy (``utils/model_instantiators/torch``):

* separate models (``gaussian_model``): ``<name>_container.{0,2,...}`` (a ``Linear`` then the activation
  module after each hidden layer), the output ``Linear`` last in the same container, and
  ``log_std_parameter`` (A,);
* a shared model (``shared_model``, Isaac Lab's ``models: separate: False``): the container holds the
  hidden layers, the output layer is ``policy_layer`` (``<role>_layer``) beside ``value_layer``, and
  ``policy`` and ``value`` in the agent file are the same module's state_dict.

What the policy computes, as skrl computes it:

* the observation preprocessor, ``RunningStandardScaler`` (``resources/preprocessors/torch/
  running_standard_scaler.py``) in eval mode: ``clamp((x - mean.float()) / (sqrt(var.float()) + epsilon),
  -clip_threshold, clip_threshold)`` with ``epsilon`` 1e-8 and ``clip_threshold`` 5 unless the run's
  ``*_preprocessor_kwargs`` say otherwise: the epsilon on the standard deviation, not on the variance
  (rl_games adds 1e-5 to the variance), statistics ``running_mean``, ``running_variance`` float64
  cast to float32, ``current_count``;
* the network, then ``output`` (``ACTIONS``, or an expression such as ``tanh(ACTIONS)``);
* the deterministic action (``trainers/torch/base.py``: ``outputs.get("mean_actions", actions)`` unless
  ``stochastic_evaluation``): ``GaussianMixin.act``'s ``mean_actions`` (``models/torch/gaussian.py``),
  the network's output, clamped to the action space only with ``clip_mean_actions`` (``clip_actions``
  clips the sampled action, never the mean); ``log_std`` = ``log_std_parameter`` clamped to
  [``min_log_std``, ``max_log_std``] (-20, 2) with ``clip_log_std`` (on by default).

The activation, the output expression and the clip settings are not in the checkpoint: they are read
from the run's configuration where Isaac Lab writes it (``<run>/params/agent.yaml``, the skrl runner's
``models`` and ``agent`` sections), else ``--activation`` is required and skrl's defaults are assumed.
Nothing is unpickled beyond tensors and plain containers (see :mod:`..readers.checkpoints`).
"""

from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import BadModelError, OptionError
from ..action_bounds import action_bounds, shown
from ..assumptions import Assumption

#: ``RunningStandardScaler``'s defaults (``skrl/resources/preprocessors/torch/running_standard_scaler.py``):
#: ``epsilon=1e-8``, added to the standard deviation, and ``clip_threshold=5.0``.
NORMALIZER_EPS = 1e-8
NORMALIZER_CLIP = 5.0
#: ``RunningStandardScaler``'s buffers, in the order it registers them.
NORMALIZER_KEYS = ("running_mean", "running_variance", "current_count")
#: ``GaussianMixin``'s defaults (``skrl/models/torch/gaussian.py``).
GAUSSIAN_DEFAULTS = {"clip_mean_actions": False, "clip_log_std": True, "min_log_std": -20.0, "max_log_std": 2.0}
#: skrl's activation names (``utils/model_instantiators/torch/common.py``, ``_get_activation_function``)
#: -> policyport's; ``softmax`` and ``softsign`` are not read.
ACTIVATIONS = {"elu": "elu", "leaky_relu": "leaky_relu", "relu": "relu", "selu": "selu", "sigmoid": "sigmoid",
               "softplus": "softplus", "tanh": "tanh"}
#: How a separately stored policy file is named (``write_checkpoint``: ``<name>_<tag>.pt``, ``best_<name>.pt``).
SEPARATE_POLICY = re.compile(r"(?P<best>best_)?policy(?P<tag>_[^/]+)?\.pt")
_CONTAINER = re.compile(r"(?P<container>\w+)_container\.(?P<index>\d+)\.(?P<param>weight|bias)")


@dataclass
class Layout:
    """An skrl Gaussian policy, as its checkpoint holds it (names are the checkpoint's keys, the
    agent file's module name first: ``policy.net_container.0.weight``).

    Attributes:
        layers: ``(weight name, weight (out, in), bias name, bias (out,))`` of the hidden layers, in order.
        activations_at: the module path of the activation after each hidden layer (``policy.net_container.1``),
            or ``None`` where the container holds none.
        head: the output layer, as ``layers`` holds one.
        log_std: ``(name, float32 array (A,))``.
        shared: the policy is a shared model (``policy_layer`` beside ``value_layer``).
        normalizer: buffer (``running_mean``, ``running_variance``, ``current_count``) -> (name, float64 array).
        normalizer_module: the preprocessor's name (``observation_preprocessor``), or ``None``.
        left_out: keys of the file that the graph does not compute.
    """

    layers: list[tuple[str, np.ndarray, str, np.ndarray]]
    activations_at: list[str | None]
    head: tuple[str, np.ndarray, str, np.ndarray]
    log_std: tuple[str, np.ndarray]
    shared: bool = False
    normalizer: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)
    normalizer_module: str | None = None
    left_out: list[str] = field(default_factory=list)

    @property
    def obs_dim(self) -> int:
        return int((self.layers[0][1] if self.layers else self.head[1]).shape[1])

    @property
    def actions(self) -> int:
        return int(self.head[1].shape[0])


def _is_policy_strings(strings: set[str]) -> bool:
    return "log_std_parameter" in strings and any(_CONTAINER.fullmatch(s) for s in strings)


def is_skrl_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a torch zip whose pickle names an skrl model instantiator's Gaussian policy
    (``log_std_parameter`` and ``<name>_container.N.weight``), as an agent file (a ``policy`` entry) or a
    separately stored ``policy_<tag>.pt``; read from the pickle's opcodes without unpickling anything."""
    from ..readers.checkpoints import pickled_strings

    strings = pickled_strings(path)
    if not _is_policy_strings(strings):
        return False
    return "policy" in strings or SEPARATE_POLICY.fullmatch(path.name) is not None


# ---------------------------------------------------------------- the file's arrays


def _linear(sd: dict, key: str, name: str, what: str):
    w, b = sd.get(f"{key}.weight"), sd.get(f"{key}.bias")
    if w is None or b is None:
        raise BadModelError(f"{what}: {name} lacks its {'weight' if w is None else 'bias'} (a Linear without bias is not read)")
    if w.ndim != 2 or b.shape != (w.shape[0],):
        raise BadModelError(f"{what}: {name}.weight {w.shape} and {name}.bias {b.shape} are not a Linear layer")
    return f"{name}.weight", w, f"{name}.bias", b


def read_policy(sd: dict, what: str, module: str = "policy") -> Layout:
    """Place the arrays of an skrl Gaussian policy's state_dict (see the module docstring).

    Args:
        sd: the policy's state_dict, name -> numpy array.
        what: the source, for messages.
        module: the prefix of every name (the agent file's entry, ``policy``).

    Raises:
        BadModelError: no ``log_std_parameter`` (a deterministic or categorical policy); no container, or
            several; parameters that are not Linear layers at even indices (a convolution, a flatten);
            layers that do not chain.
    """
    from ..readers.checkpoints import state_dict

    sd = state_dict(sd, what)
    if "log_std_parameter" not in sd:
        raise BadModelError(f"{what} holds {', '.join(sorted(sd)[:8])}: no log_std_parameter, so it is not a Gaussian policy "
                            "(GaussianMixin); policyport reads skrl's Gaussian policies (PPO, A2C, RPO, TRPO, SAC)")
    found: dict[str, dict[int, set[str]]] = {}
    for name in sd:
        m = _CONTAINER.fullmatch(name)
        if m:
            found.setdefault(m["container"], {}).setdefault(int(m["index"]), set()).add(m["param"])
    if len(found) != 1:
        raise BadModelError(f"{what} holds {'no' if not found else len(found)} network containers "
                            f"({', '.join(sorted(found))}): policyport reads a policy of one container (one 'network' entry)")
    (container, numbered), = found.items()
    indices = sorted(numbered)
    steps = {b - a for a, b in zip(indices, indices[1:])}
    if indices[0] != 0 or len(steps) > 1 or steps - {1, 2}:
        raise BadModelError(f"{what}: {container}_container holds parameters at {indices}; policyport reads Linear layers, "
                            "each followed by one activation or none (a convolution, flatten or normalisation layer is not read)")
    linears = [_linear(sd, f"{container}_container.{i}", f"{module}.{container}_container.{i}", what) for i in indices]
    log_std = sd["log_std_parameter"]
    layer_keys = {f"{role}_layer" for role in re.findall(r"(\w+)_layer\.weight", " ".join(sd))}
    shared = "policy_layer" in layer_keys
    if shared:
        head = _linear(sd, "policy_layer", f"{module}.policy_layer", what)
        hidden = linears
    elif layer_keys:
        raise BadModelError(f"{what} holds {', '.join(sorted(layer_keys))} but no policy_layer: a shared model whose "
                            "policy role is named otherwise is not read")
    else:
        hidden, head = linears[:-1], linears[-1]
    activation_step = 2 if steps == {2} or (not steps and shared) else 1
    activations_at = [f"{module}.{container}_container.{i + 1}" if activation_step == 2 else None
                      for i in indices[:len(hidden)]]
    if log_std.shape != (head[1].shape[0],):
        raise BadModelError(f"{what}: log_std_parameter has shape {log_std.shape}, the output layer {head[0]} gives "
                            f"{head[1].shape[0]} actions")
    chain = [*hidden, head]
    for (wa, a, _, _), (wb, b, _, _) in zip(chain, chain[1:]):
        if a.shape[0] != b.shape[1]:
            raise BadModelError(f"{what}: {wa} outputs {a.shape[0]} features but {wb} takes {b.shape[1]}")
    layout = Layout(hidden, activations_at, head, (f"{module}.log_std_parameter", log_std), shared)
    used = {n.removeprefix(f"{module}.") for layer in chain for n in (layer[0], layer[2])} | {"log_std_parameter"}
    layout.left_out = sorted(f"{module}.{k}" for k in sd if k not in used)
    return layout


def read_normalizer(sd, module: str, layout: Layout, what: str) -> None:
    """Set ``layout``'s normaliser from a ``RunningStandardScaler`` state_dict saved as ``module``.

    Raises:
        BadModelError: a buffer missing, or statistics of another width than the policy's input.
    """
    from ..readers.checkpoints import state_dict

    sd = state_dict(sd, f"{what}'s {module}")
    missing = [k for k in NORMALIZER_KEYS if k not in sd]
    if missing:
        raise BadModelError(f"{what}: {module} holds {', '.join(sorted(sd))}, not a RunningStandardScaler "
                            f"({', '.join(NORMALIZER_KEYS)}): it lacks {', '.join(missing)}")
    for role in ("running_mean", "running_variance"):
        if sd[role].shape != (layout.obs_dim,):
            raise BadModelError(f"{what}: {module}.{role} has shape {sd[role].shape}; the policy reads {layout.obs_dim} "
                                "observations")
    layout.normalizer = {k: (f"{module}.{k}", sd[k]) for k in NORMALIZER_KEYS}
    layout.normalizer_module = module
    layout.left_out += sorted(f"{module}.{k}" for k in sd if k not in NORMALIZER_KEYS)


# ---------------------------------------------------------------- the run's configuration


@dataclass
class RunConfig:
    """What an skrl runner configuration says of the policy (``None``: not said), and where it was read."""

    path: Path
    separate: bool | None = None
    policy_class: str | None = None
    input: str | None = None
    activations: object = None
    output: str | None = None
    gaussian: dict = field(default_factory=dict)
    preprocessors: dict[str, tuple[object, dict]] = field(default_factory=dict)


def find_run_config(checkpoint: Path) -> Path | None:
    """Isaac Lab's ``<run>/params/agent.yaml`` (``dump_yaml(os.path.join(log_dir, "params", "agent.yaml"),
    agent_cfg)`` in its skrl ``train.py``) for a checkpoint in ``<run>/checkpoints/``: looked for in the
    checkpoint's folder and the one above it, and taken only when it is an skrl configuration (a
    ``models`` section); ``None`` when there is none."""
    from ..readers.checkpoints import read_yaml

    for folder in (checkpoint.parent, checkpoint.parent.parent):
        candidate = folder / "params" / "agent.yaml"
        if candidate.is_file() and isinstance(read_yaml(candidate), dict) and isinstance(read_yaml(candidate).get("models"), dict):
            return candidate
    return None


def read_run_config(checkpoint: Path) -> RunConfig | None:
    """The policy's settings from the run configuration (:func:`find_run_config`), with the skrl
    runner's own renaming (``utils/runner/torch/runner.py``, ``_check_cfg_compatibility``): a
    ``state_preprocessor`` without an ``observation_preprocessor`` is the observation preprocessor."""
    from ..readers.checkpoints import lookup, read_yaml

    path = find_run_config(checkpoint)
    if path is None:
        return None
    document = read_yaml(path)
    models = document["models"]
    config = RunConfig(path)
    separate = models.get("separate")
    config.separate = None if separate is None else bool(separate)
    policy = models.get("policy") if isinstance(models.get("policy"), dict) else {}
    config.policy_class = None if policy.get("class") is None else str(policy["class"])
    network = policy.get("network")
    if isinstance(network, list) and len(network) == 1 and isinstance(network[0], dict):
        config.input = None if network[0].get("input") is None else str(network[0]["input"]).strip()
        config.activations = network[0].get("activations")
    elif network is not None:
        raise BadModelError(f"{path}: models.policy.network holds {len(network) if isinstance(network, list) else 'no list of'} "
                            "containers; policyport reads a policy of one")
    config.output = None if policy.get("output") is None else str(policy["output"])
    config.gaussian = {k: policy[k] for k in GAUSSIAN_DEFAULTS if policy.get(k) is not None}
    agent = dict(document.get("agent") or {})
    if agent.get("state_preprocessor") and "observation_preprocessor" not in agent:
        agent["observation_preprocessor"] = agent.pop("state_preprocessor")
        agent["observation_preprocessor_kwargs"] = agent.pop("state_preprocessor_kwargs", None)
    for name in ("observation_preprocessor", "state_preprocessor"):
        kwargs = lookup(agent, f"{name}_kwargs")
        config.preprocessors[name] = (agent.get(name), kwargs if isinstance(kwargs, dict) else {})
    return config


def _activation(name, where: str) -> str:
    key = str(name).lower()
    if key not in ACTIVATIONS:
        raise BadModelError(f"{where} names the activation {name!r}; policyport reads skrl's {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[key]


def parse_output(expression: str, where: str) -> tuple[float, str | None]:
    """``(scale, activation)`` of a model instantiator's ``output``: ``ACTIONS`` -> ``(1, None)``,
    ``tanh(ACTIONS)`` -> ``(1, "tanh")``, ``2 * tanh(ACTIONS)`` -> ``(2, "tanh")``.

    Raises:
        BadModelError: any other expression.
    """
    def refuse():
        return BadModelError(f"{where} names the policy's output {expression!r}; policyport reads ACTIONS, "
                             "ACTIVATION(ACTIONS) and NUMBER * ACTIVATION(ACTIONS)")

    try:
        node = ast.parse(expression.strip(), mode="eval").body
    except SyntaxError as e:
        raise refuse() from e
    scale = 1.0
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        number, node = (node.left, node.right) if isinstance(node.left, ast.Constant) else (node.right, node.left)
        if not isinstance(number, ast.Constant) or not isinstance(number.value, (int, float)):
            raise refuse()
        scale = float(number.value)
    if isinstance(node, ast.Name) and node.id == "ACTIONS":
        return scale, None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1 and not node.keywords
            and isinstance(node.args[0], ast.Name) and node.args[0].id == "ACTIONS"):
        return scale, _activation(node.func.id, where)
    raise refuse()


# ---------------------------------------------------------------- the graph


@dataclass
class Plan:
    """What the graph computes beyond the arrays (see the module docstring).

    Attributes:
        activations: the parsed activation after each hidden layer (``None``: none there).
        output_scale, output_activation: the ``output`` expression's number and function (or ``None``).
        log_std_range: ``(min_log_std, max_log_std)`` with ``clip_log_std``, else ``None``.
        bounds: ``(low, high)`` float32 (A,) that ``clip_mean_actions`` clamps the mean to, else ``None``.
        epsilon, clip: the RunningStandardScaler's.
    """

    activations: list
    output_scale: float = 1.0
    output_activation: object = None
    log_std_range: tuple[float, float] | None = (-20.0, 2.0)
    bounds: tuple[np.ndarray, np.ndarray] | None = None
    epsilon: float = NORMALIZER_EPS
    clip: float = NORMALIZER_CLIP


def _build(layout: Layout, plan: Plan, opset: int, metadata: dict[str, str]):
    import onnx

    from ..build import Dense, MlpBuilder, Step

    f32 = np.float32
    b = MlpBuilder(opset, np.dtype(f32))
    FLOAT, const = onnx.TensorProto.FLOAT, b.scalar
    x = "obs"
    if layout.normalizer:
        # RunningStandardScaler._compute: clamp((x - mean.float()) / (sqrt(var.float()) + epsilon), -clip, clip)
        module = layout.normalizer_module
        names = {role: b.initializer(array, name, name) for role, (name, array) in layout.normalizer.items()}
        mean = b.node("Cast", [names["running_mean"]], f"{module}/mean_float32", to=FLOAT)
        var = b.node("Cast", [names["running_variance"]], f"{module}/variance_float32", to=FLOAT)
        std = b.node("Sqrt", [var], f"{module}/std")
        denominator = b.node("Add", [std, const(plan.epsilon, f"{module}/epsilon")], f"{module}/std_plus_epsilon")
        scaled = b.node("Div", [b.node("Sub", [x, mean], f"{module}/centered"), denominator], f"{module}/scaled")
        x = b.node("Clip", [scaled, const(-plan.clip, f"{module}/clip_min"), const(plan.clip, f"{module}/clip_max")], module)
    for (wname, w, bname, bias), at, act in zip(layout.layers, layout.activations_at, plan.activations):
        post = [] if act is None else [Step("activation", at, act)]
        x = b.dense(Dense(wname.rsplit(".", 1)[0], w, wname, bias, bname, "out_in", None, post), x)
    wname, w, bname, bias = layout.head
    logits = b.dense(Dense(wname.rsplit(".", 1)[0], w, wname, bias, bname, "out_in"), x, "logits")
    mean = logits
    if plan.output_activation is not None:
        mean = b.activation(plan.output_activation, mean, f"output/{plan.output_activation.label}")
    if plan.output_scale != 1.0:
        mean = b.node("Mul", [mean, const(plan.output_scale, "output/scale")], "output/scaled")
    b.node("Identity", [mean], "mean")
    if plan.bounds is None:
        b.node("Identity", ["mean"], "action")
    else:  # clip_mean_actions: torch.clamp(mean_actions, min=low, max=high)
        low, high = plan.bounds
        b.node("Min", [b.node("Max", ["mean", const(low, "action/low")], "action/above_low"), const(high, "action/high")],
               "action")
    name, array = layout.log_std
    log_std = b.initializer(array, name, name)
    if plan.log_std_range is not None:
        lo, hi = plan.log_std_range
        log_std = b.node("Clip", [log_std, const(lo, "log_std/min"), const(hi, "log_std/max")], "log_std/clipped")
    b.node("Expand", [log_std, b.node("Shape", [logits], "log_std/batch_shape")], "log_std")
    b.node("Exp", ["log_std"], "std")
    outputs = [(t, onnx.TensorProto.FLOAT, ["batch", layout.actions]) for t in ("logits", "mean", "action", "log_std", "std")]
    head = "clipped-diag-gaussian" if plan.bounds is not None else "diag-gaussian"
    return b.finish(layout.obs_dim, outputs, head, metadata)


def normalize(layout: Layout, obs: np.ndarray, epsilon: float = NORMALIZER_EPS, clip: float = NORMALIZER_CLIP) -> np.ndarray:
    """``RunningStandardScaler`` in eval mode, in numpy float32 (see the module docstring).

    Args:
        layout: a layout with a normaliser.
        obs: float32 array, shape (batch, obs_dim), raw observations.
        epsilon, clip: the scaler's ``epsilon`` (added to the std) and ``clip_threshold``.

    Returns:
        float32 array, shape (batch, obs_dim).
    """
    f32 = np.float32
    mean = layout.normalizer["running_mean"][1].astype(f32)
    std = np.sqrt(layout.normalizer["running_variance"][1].astype(f32))
    return np.clip((np.asarray(obs, f32) - mean) / (std + f32(epsilon)), f32(-clip), f32(clip))


def reference_forward(layout: Layout, plan: Plan, obs: np.ndarray) -> dict[str, np.ndarray]:
    """skrl's preprocessor, network and ``GaussianMixin.act`` outputs in numpy float32; tensors named
    as the graph names them."""
    f32 = np.float32
    out: dict[str, np.ndarray] = {}
    x = np.asarray(obs, f32)
    if layout.normalizer:
        x = out[layout.normalizer_module] = normalize(layout, x, plan.epsilon, plan.clip)
    for (wname, w, _, bias), at, act in zip(layout.layers, layout.activations_at, plan.activations):
        x = out[f"{wname.rsplit('.', 1)[0]}/linear"] = x @ w.T + bias
        if act is not None:
            x = out[f"{at}/{act.label}"] = act.reference(x).astype(f32)
    _, w, _, bias = layout.head
    mean = out["logits"] = x @ w.T + bias
    if plan.output_activation is not None:
        mean = plan.output_activation.reference(mean).astype(f32)
    mean = out["mean"] = mean * f32(plan.output_scale) if plan.output_scale != 1.0 else mean
    out["action"] = mean if plan.bounds is None else np.minimum(np.maximum(mean, plan.bounds[0]), plan.bounds[1])
    log_std = layout.log_std[1].astype(f32)
    if plan.log_std_range is not None:
        log_std = np.clip(log_std, f32(plan.log_std_range[0]), f32(plan.log_std_range[1]))
    out["log_std"] = np.broadcast_to(log_std, mean.shape).copy()
    out["std"] = np.exp(out["log_std"])
    return out


# ---------------------------------------------------------------- reading a file


def _separate_files(path: Path) -> tuple[str, dict[str, Path]]:
    """The tag of a separately stored ``policy_<tag>.pt`` and the other modules' files beside it."""
    m = SEPARATE_POLICY.fullmatch(path.name)
    if m is None:  # named otherwise: no module files of its own tag to look for
        return path.stem, {}
    prefix, suffix = ("best_", "") if m["best"] else ("", m["tag"] or "")
    beside = {}
    for name in ("observation_preprocessor", "state_preprocessor", "value", "value_preprocessor", "optimizer"):
        candidate = path.with_name(f"{prefix}{name}{suffix}.pt")
        if candidate.is_file():
            beside[name] = candidate
    return f"{prefix}policy{suffix}", beside


def read_source(path: Path, input_name: str, obs_filter: bool) -> tuple[Layout, list[str], str]:
    """The policy (and the preprocessor of its input) of an agent file or a separately stored policy.

    Args:
        path: the checkpoint.
        input_name: ``OBSERVATIONS`` or ``STATES``, what the policy's network reads.
        obs_filter: read the preprocessor (``--no-filter``: leave it out).

    Returns:
        ``(layout, what was read, where the preprocessor would be)``.
    """
    from ..readers.checkpoints import read_checkpoint

    what = str(path)
    loaded = read_checkpoint(path, "skrl")
    module = "observation_preprocessor" if input_name == "OBSERVATIONS" else "state_preprocessor"
    if "policy" in loaded and isinstance(loaded["policy"], dict):
        layout = read_policy(loaded["policy"], f"{what}'s policy")
        preprocessor = loaded.get(module)
        if module == "observation_preprocessor" and preprocessor is None and "state_preprocessor" in loaded:
            module, preprocessor = "state_preprocessor", loaded["state_preprocessor"]  # skrl 1.x's name for it
        where = f"no {module} entry in {path.name}"
        others = [k for k in loaded if k not in ("policy", module)]
        read = [f"{path.name}"]
    else:
        if not any(_CONTAINER.fullmatch(str(k)) for k in loaded):
            raise BadModelError(f"{what} holds {', '.join(map(str, list(loaded)[:8]))}: neither an skrl agent file (a "
                                "'policy' entry beside 'value', 'optimizer' and the preprocessors) nor a separately stored "
                                "policy (<name>_container.N.weight, log_std_parameter)")
        layout = read_policy(loaded, what)
        stem, beside = _separate_files(path)
        if module == "observation_preprocessor" and module not in beside and "state_preprocessor" in beside:
            module = "state_preprocessor"
        preprocessor = read_checkpoint(beside[module], "skrl") if module in beside else None
        where = (f"no {stem.replace('policy', module, 1)}.pt beside {path.name}" if SEPARATE_POLICY.fullmatch(path.name)
                 else f"{path.name} is a policy's state_dict alone, not named policy_<timestep>.pt as skrl stores one")
        others = [f"{k} ({p.name})" for k, p in beside.items() if k != module]
        read = [path.name] + ([beside[module].name] if module in beside else [])
    if preprocessor is not None and obs_filter:
        read_normalizer(preprocessor, module, layout, what)
    elif preprocessor is not None:
        others.append(f"{module} (--no-filter)")
    layout.left_out += others
    return layout, read, where


def convert_skrl(source, options):
    """Convert an skrl checkpoint (see the module docstring) to ONNX.

    Args:
        source: ``agent_<timestep>.pt`` / ``best_agent.pt``, or a separately stored ``policy_<timestep>.pt``
            (its preprocessor read from ``observation_preprocessor_<timestep>.pt`` beside it).
        options: a :class:`~policyport.converter.ConvertOptions`: ``activation`` (required when no run
            configuration lies where Isaac Lab writes it; must agree with it when one does),
            ``action_bounds`` (the action space ``clip_mean_actions`` clamps the mean to), ``obs_filter``
            (false: leave the preprocessor out), ``opset``.

    Returns:
        A :class:`~policyport.converter.Converted`: input ``obs`` (float32, ``(batch, obs_dim)``, raw
        observations), outputs ``logits`` (the output layer's affine output), ``mean`` (after the
        ``output`` expression), ``action`` (``mean_actions``: the deterministic action), ``log_std`` and
        ``std`` (float32, ``(batch, A)``); initializers under the file's keys (``policy.net_container.0.weight``,
        ``observation_preprocessor.running_mean`` in float64 ...); the reference is skrl's forward rebuilt
        in numpy.

    Raises:
        UnreadableFileError: not a torch zip holding a dict.
        BadModelError: a policy this reader does not read (not Gaussian, several containers, convolutions),
            or a run configuration naming what it does not read.
        OptionError: no activation anywhere; one that contradicts the run configuration; a configuration
            with ``clip_mean_actions`` and no ``--action-bounds``, or bounds where it is off.
    """
    from ...io.kinds import sha256_file
    from ..activations import choose_activation, parse_activation, required_activation
    from ..assumptions import activation_assumption, joined, no_normaliser, reconstruction
    from ..options import Converted

    path = Path(os.fspath(source))
    what = str(path)
    config = read_run_config(path)
    where = str(config.path) if config else what
    if config and config.policy_class and config.policy_class.lower() != "gaussianmixin":
        raise BadModelError(f"{where} names the policy class {config.policy_class!r}; policyport reads GaussianMixin policies")
    input_name = (config.input if config and config.input else "OBSERVATIONS")
    if input_name not in ("OBSERVATIONS", "STATES"):
        raise BadModelError(f"{where} names the policy's input {input_name!r}; policyport reads OBSERVATIONS or STATES")
    layout, read, normaliser_place = read_source(path, input_name, options.obs_filter)
    hidden = [at for at in layout.activations_at if at is not None]
    assumptions: list[Assumption] = []
    notes: list[str] = []
    recorded = None
    if config and config.activations is not None and hidden:
        names = config.activations if isinstance(config.activations, list) else [config.activations]
        if len(names) not in (1, len(layout.layers)):
            raise BadModelError(f"{where} names {len(names)} activations for the policy's {len(layout.layers)} layers")
        names = [_activation(n, where) for n in names]
        recorded = names[0] if len(set(names)) == 1 else ",".join(names)
    if recorded is not None and "," in recorded and options.activation is not None and options.activation != recorded:
        raise OptionError(f"--activation {options.activation} contradicts {where}, which names {recorded} (one per "
                          "layer); leave --activation out to use the recorded ones")
    activation_name, notes = choose_activation(options.activation, recorded, where)
    if hidden and activation_name is None:
        activation_name = required_activation(None, f"{what} (an skrl checkpoint)", hidden,
                                              "Isaac Lab's skrl configs use elu, and the run writes it to params/agent.yaml, "
                                              "which does not lie beside this checkpoint")
    if hidden:
        names = activation_name.split(",")
        if len(names) == 1:
            names *= len(layout.layers)
        elif len(names) != len(layout.layers):
            raise OptionError(f"--activation names {len(names)} activations; {what}'s policy has {len(layout.layers)} "
                              "hidden layers: name one for all or one per layer")
        parsed = [parse_activation(n) for n in names]
        activations = [None if at is None or act.name == "linear" else act for at, act in zip(layout.activations_at, parsed)]
        if recorded is not None:
            assumptions.append(Assumption("activation", f"{activation_name} at {joined(hidden)}",
                                          f"read from {config.path}; the checkpoint does not record it",
                                          "--activation must agree with it"))
        else:
            assumptions.append(activation_assumption([(h, a) for h, a in zip(hidden, names)], f"{what} (skrl)",
                                                     "no run configuration (params/agent.yaml) lies beside it"))
    else:
        activations = [None] * len(layout.layers)
    scale, output_act = parse_output(config.output, where) if config and config.output else (1.0, None)
    gaussian = {**GAUSSIAN_DEFAULTS, **(config.gaussian if config else {})}
    if config is None:
        clamp = "" if options.action_bounds is not None else " not clamped (clip_mean_actions off)"
        assumptions.append(Assumption(
            "head", f"output ACTIONS: mean_actions = the output layer{clamp}, log_std clamped to [-20, 2]",
            "GaussianMixin's and the model instantiator's defaults; the checkpoint records none of them, and no run "
            "configuration (params/agent.yaml) lies beside it",
            "" if options.action_bounds is not None else "--action-bounds LOW:HIGH clamps the mean as clip_mean_actions does"))
    plan_bounds = None
    if gaussian["clip_mean_actions"] and options.action_bounds is None:
        raise OptionError(f"{where} turns clip_mean_actions on: skrl clamps the mean action to the environment's action "
                          "space, which the checkpoint does not record; give it with --action-bounds LOW:HIGH")
    if options.action_bounds is not None:
        if config is not None and not gaussian["clip_mean_actions"]:
            raise OptionError(f"--action-bounds gives the bounds clip_mean_actions clamps the mean action to, but {where} "
                              "leaves clip_mean_actions off: skrl's deterministic action is the mean as it is")
        plan_bounds = action_bounds(options.action_bounds, layout.actions, what)
        assumptions.append(Assumption(
            "action bounds", f"low {shown(plan_bounds[0])}, high {shown(plan_bounds[1])}: action = the mean clamped to them",
            "given by --action-bounds; clip_mean_actions " + (f"(on in {config.path})" if config else "(assumed on)")
            + " clamps the mean to the environment's action space, which the checkpoint does not record",
            "" if config else "leave --action-bounds out for the mean as it is"))
    epsilon, clip = NORMALIZER_EPS, NORMALIZER_CLIP
    if layout.normalizer:
        kwargs = config.preprocessors.get(layout.normalizer_module, (None, {}))[1] if config else {}
        epsilon = float(kwargs.get("epsilon", NORMALIZER_EPS))
        clip = float(kwargs.get("clip_threshold", NORMALIZER_CLIP))
        if config is None:
            assumptions.append(Assumption(
                "observation normalisation", f"{layout.normalizer_module} with RunningStandardScaler's defaults "
                f"(epsilon {NORMALIZER_EPS:g} on the std, clip {NORMALIZER_CLIP:g})",
                "the checkpoint holds its statistics but not its epsilon and clip_threshold, and no run configuration "
                "(params/agent.yaml) lies beside it", "--no-filter leaves it out"))
        elif layout.normalizer_module == "state_preprocessor" and input_name == "OBSERVATIONS":
            assumptions.append(Assumption(
                "observation normalisation", "state_preprocessor normalises the policy's input",
                "the file has no observation_preprocessor; state_preprocessor is skrl 1.x's name for it",
                "--no-filter leaves it out"))
    elif options.obs_filter:
        settle = "" if config else "store the preprocessor beside the policy (or convert the agent file)"
        assumptions.append(no_normaliser(what, normaliser_place, settle))
    if layout.left_out:
        notes.append(f"left out of the graph (the value function, optimizer and other preprocessors): {', '.join(layout.left_out)}")
    log_std_range = (float(gaussian["min_log_std"]), float(gaussian["max_log_std"])) if gaussian["clip_log_std"] else None
    plan = Plan(activations, scale, None if output_act is None else parse_activation(output_act), log_std_range,
                plan_bounds, epsilon, clip)
    source_info = {"kind": "skrl", "file": path.name, "sha256": sha256_file(path), "read": read}
    if config is not None:
        source_info["config"] = str(config.path)
    metadata = {"policyport.source": json.dumps(source_info)}
    if hidden:
        metadata["policyport.activation"] = activation_name
    if layout.normalizer:
        metadata["policyport.observation_filter"] = json.dumps(
            {"type": "RunningStandardScaler", "library": "skrl", "module": layout.normalizer_module,
             "formula": "clip((x - mean) / (sqrt(var) + eps), -clip, clip)", "epsilon": epsilon, "clip": clip,
             "count": float(layout.normalizer["current_count"][1])})
    if plan_bounds is not None:
        metadata["policyport.action_bounds"] = json.dumps({"low": plan_bounds[0].tolist(), "high": plan_bounds[1].tolist()})
    model = _build(layout, plan, options.opset, metadata)
    return Converted(model, lambda obs: reference_forward(layout, plan, obs), "skrl", notes=notes,
                     assumptions=assumptions, oracle=reconstruction("the arrays of an skrl checkpoint"))
