"""``to-sb3``: an MLP policy as a Stable-Baselines3 zip that SB3 loads, predicts with and trains on.

:func:`to_sb3` maps the :class:`~.plan.LayerPlan` of a model onto SB3's own policy classes
(stable_baselines3/common/policies.py ``ActorCriticPolicy`` for PPO and A2C,
stable_baselines3/dqn/policies.py ``DQNPolicy`` for DQN): the hidden dense layers become
``mlp_extractor.policy_net`` (``q_net.q_net`` for DQN, and its target network), the last layer
``action_net`` (the mean rows of an RLlib-style ``[mean, log_std]`` layer, or the logits), a
state-independent ``log_std`` SB3's ``log_std``. A VecNormalize-shaped observation normaliser
becomes a ``VecNormalize`` file beside the zip (stable_baselines3/common/vec_env/vec_normalize.py).

What SB3's MLP policies cannot express is refused (exit 3), naming it: a layer that is not in one
chain, differing hidden activations, a normaliser of another form, a recurrent core (refused by the
layer plan already). What the source does not hold and SB3 needs is an assumption the result
names: the value function (or nothing for DQN) is SB3's fresh initialisation; the observation
space is ``Box(-inf, inf)`` unless given; an RLlib-style state-dependent ``log_std`` needs an
explicit ``log_std`` value (SB3's is one parameter per action dimension).

Before anything is written SB3 loads the zip (``PPO.load`` ...) and, on sample observations
(normalised by the VecNormalize file when there is one), every hidden tensor of SB3's network, the
action net's output and ``predict(obs, deterministic=True)`` must equal the numpy backend's (the
action clipped to the action space's bounds, as ``predict`` clips it); both files are then written
together (:func:`policyport.io.outputs.write_outputs`).
"""

from __future__ import annotations

import io
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import BadModelError, OptionError, UnsupportedOpError, VerificationError
from .plan import ML_AGENTS_DISCRETE, Dense, LayerPlan, layer_plan

#: Algorithms whose policies to-sb3 writes, by ``--algo`` name.
ALGOS = ("ppo", "a2c", "dqn")
#: ONNX activation op -> SB3 ``activation_fn`` (a torch.nn class name); LeakyRelu with torch's default slope only.
_ACTIVATION_FN = {"Tanh": "Tanh", "Relu": "ReLU", "Elu": "ELU", "Selu": "SELU", "Sigmoid": "Sigmoid",
                  "Softplus": "Softplus", "Gelu": "GELU", "Mish": "Mish", "HardSwish": "Hardswish", "LeakyRelu": "LeakyReLU",
                  "Swish": "SiLU"}
#: ML-Agents' action-mask input (model_serialization.py ``TensorNames.action_mask_placeholder``), fed all ones.
MASKS = "action_masks"


@dataclass
class Sb3Export:
    """What :func:`to_sb3` wrote.

    Attributes:
        zip: the model zip; vecnormalize: the VecNormalize file, or None.
        algo: ``"ppo"``, ``"a2c"`` or ``"dqn"``; net_arch: the hidden layer sizes.
        activation_fn: the torch class name of the hidden activation.
        observation_space, action_space: ``repr`` of the gymnasium spaces.
        samples: observations checked; max_abs: the largest absolute difference over the tensors
            compared; tensors: how many were compared.
        assumptions: what SB3 needs that the source does not hold, as sentences.
        notes: what converting the source said; model_assumptions: what the model itself assumes
            beyond its source file (its metadata, :func:`policyport.graph.model.recorded_assumptions`).
    """

    zip: Path
    vecnormalize: Path | None
    algo: str
    net_arch: list[int]
    activation_fn: str
    observation_space: str
    action_space: str
    samples: int
    max_abs: float
    tensors: int
    assumptions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    model_assumptions: list[dict] | None = None


def to_sb3(source, output: str | os.PathLike, *, algo: str, kind: str | None = None,
           obs_space: tuple[float, float] | None = None, action_space: tuple[float, float] | None = None,
           log_std: float | None = None, samples: int = 1000, low: float = 0.0, high: float = 1.0, seed: int = 0,
           force: bool = False, **options) -> Sb3Export:
    """Write ``output`` (an SB3 ``.zip``) and, for a normalised policy, ``<stem>_vecnormalize.pkl`` beside it.

    Args:
        source: an ``onnx.ModelProto`` or ``.onnx`` path, or any source :func:`policyport.convert`
            reads (converted and verified first, :func:`.sources.source_model`).
        output: the zip to write (ends in ``.zip``).
        algo: ``"ppo"``, ``"a2c"`` (a diagonal-Gaussian or categorical head) or ``"dqn"`` (Q-values
            as logits, a categorical head).
        kind, options: as for :func:`policyport.convert`.
        obs_space: ``(low, high)`` of the observation space's Box; default ``(-inf, inf)``.
        action_space: ``(low, high)`` of a continuous action space's Box; default: the bounds the
            graph clips the action to (an SB3 source), else ``(-inf, inf)``.
        log_std: SB3's state-independent ``log_std`` (every action dimension) for a source whose
            ``log_std`` is computed from the observation (RLlib's ``[mean, log_std]`` layer); refused
            for a source whose ``log_std`` is a parameter, which is used.
        samples, low, high, seed: the float32 observations drawn for the check (default 1000 from
            ``[0, 1)`` with ``default_rng(0)``, :func:`policyport.verification.verify.sample_inputs`).
        force: replace existing files.

    Returns:
        :class:`Sb3Export`.

    Raises:
        OptionError: an unknown ``algo``, an ``algo`` the head does not fit, a missing or needless
            ``log_std``, bounds that are not ``low < high`` (exit 2).
        UnsupportedOpError: a graph SB3's MLP policies cannot express, named (exit 3).
        VerificationError: SB3's forward or ``predict`` differs from the numpy backend; nothing is written.
        OutputExistsError: an output exists (without ``force``).
        MissingDependencyError: stable-baselines3 or gymnasium is not installed.
        As :func:`policyport.convert` for a source converted here.
    """
    from ...converter.sources.sb3_policy import import_sb3
    from ...errors import require
    from ...graph.model import recorded_assumptions
    from ...io.outputs import check_writable
    from ..export_numpy import check_arguments
    from .to_torch import resolve_source

    check_arguments(samples, low, high, seed)
    if algo not in ALGOS:
        raise OptionError(f"algo {algo!r}: to-sb3 writes {', '.join(ALGOS)} policies")
    for name, bounds in (("obs_space", obs_space), ("action_space", action_space)):
        if bounds is not None and not (len(bounds) == 2 and float(bounds[0]) < float(bounds[1])):
            raise OptionError(f"{name} {bounds!r}: give (low, high) with low < high")
    try:
        import_sb3()  # without TensorFlow, which torch.utils.tensorboard would import
    except ImportError:
        pass  # require() names the extra to install
    require("stable_baselines3", "sb3", "writing a Stable-Baselines3 zip")
    output = Path(output)
    if output.suffix != ".zip":
        raise OptionError(f"{output}: the SB3 model to write must end in .zip")
    vec_path = output.with_name(output.stem + "_vecnormalize.pkl")
    check_writable(output, force)
    given = resolve_source(source, kind, options, samples, low, high, seed)
    plan = layer_plan(given.model)
    layout = _layout(plan, algo, log_std)
    built, assumptions = _build(plan, layout, algo, obs_space, action_space, log_std, seed)
    model, vecnorm = built
    if vecnorm is not None:
        check_writable(vec_path, force)
    buffer = io.BytesIO()
    model.save(buffer)
    zip_bytes = buffer.getvalue()
    vec_bytes = pickle.dumps(vecnorm) if vecnorm is not None else None
    feeds = _feeds(plan, samples, low, high, seed)
    max_abs, count = check_sb3(zip_bytes, vec_bytes, algo, plan, layout, feeds)
    from ...io.outputs import write_outputs

    writers = {output: lambda f: f.write(zip_bytes)}
    if vec_bytes is not None:
        writers[vec_path] = lambda f: f.write(vec_bytes)
    write_outputs(writers, force)
    return Sb3Export(output, vec_path if vec_bytes is not None else None, algo, layout["net_arch"],
                     layout["activation_fn"], repr(model.observation_space), repr(model.action_space), samples,
                     max_abs, count, assumptions, given.notes + plan.notes, recorded_assumptions(plan.graph.metadata))


def _feeds(plan: LayerPlan, samples: int, low: float, high: float, seed: int) -> np.ndarray:
    from ...verification.verify import input_ranges, sample_inputs

    feeds = sample_inputs(plan.graph.inputs, samples, low, high, seed, input_ranges(plan.graph.metadata))
    if MASKS in feeds:  # every action allowed: SB3's policies have no action masks
        feeds[MASKS] = np.ones_like(feeds[MASKS])
    return feeds


def _layout(plan: LayerPlan, algo: str, log_std: float | None) -> dict:
    """How the plan maps onto SB3's network, or a refusal naming what does not fit."""
    graph = plan.graph
    layers = plan.layers
    head = plan.head
    if head.kind in ("multi-categorical", "hybrid"):
        raise UnsupportedOpError(f"the head is {head.kind} (several discrete branches, or both kinds of action); "
                                 "to-sb3 writes SB3 policies of one diagonal-Gaussian (Box) or categorical (Discrete) "
                                 "action")
    mean_layer = next((d for d in layers if d.output == head.mean), None)
    if mean_layer is not None and mean_layer is not layers[-1]:
        raise UnsupportedOpError(f"the action mean is layer {mean_layer.name}'s output and layer {layers[-1].name} (a log std "
                                 "computed from the observation, as ML-Agents' SAC actor has) follows it: SB3's PPO "
                                 "and A2C keep log_std as a parameter")
    masks = plan.head.action == ML_AGENTS_DISCRETE and [v.name for v in graph.inputs][1:] == [MASKS]
    if len(graph.inputs) != 1 + masks or graph.inputs[0].shape is None or len(graph.inputs[0].shape) != 2:
        raise UnsupportedOpError("SB3's MLP policies take one flat observation (batch, obs_dim); the graph takes "
                                 + ", ".join(f"{v.name} {v.shape}" for v in graph.inputs))
    hidden, last = layers[:-1], layers[-1]
    activations = {d.activation for d in hidden}
    if None in activations or len(activations) > 1:
        raise UnsupportedOpError("SB3's MLP policies use one activation_fn after every hidden layer; the hidden "
                                 "layers here have " + ", ".join(f"{d.name}: {d.activation or 'none'}" for d in hidden))
    activation = activations.pop() if activations else "Tanh"
    if activation not in _ACTIVATION_FN:
        raise UnsupportedOpError(f"hidden activation {activation} has no torch class SB3 takes as activation_fn")
    producer = {}
    for step in plan.steps:
        for out in ((step.output,) if isinstance(step, Dense) else step.outputs):
            producer[out] = step
    observation = graph.inputs[0].name
    normalised = observation
    if plan.normaliser is not None:
        if plan.normaliser.vec_normalize is None:
            raise UnsupportedOpError(f"the observation normaliser (nodes {', '.join(plan.normaliser.nodes)}) is not "
                                     "SB3's VecNormalize form clip((obs - mean) / sqrt(var + epsilon), ±clip_obs); "
                                     "SB3 has no other observation normaliser")
        normalised = layers[0].input
    chain = [normalised]
    for d in layers:
        if d.input != chain[-1]:
            raise UnsupportedOpError(f"layer {d.name} reads {d.input!r}, not the previous layer's output "
                                     f"{chain[-1]!r}: SB3's MLP policies are one chain of layers")
        if d is not last:
            act = next((s for s in plan.steps if not isinstance(s, Dense) and d.output in s.inputs
                        and (s.op_type == "Mul" if d.activation == "Swish" else s.inputs[:1] == (d.output,))), None)
            chain.append(act.outputs[0])
    if activation == "LeakyRelu":
        node = next(s for s in plan.steps if not isinstance(s, Dense) and s.op_type == "LeakyRelu")
        if float(node.attrs.get("alpha", 0.01)) != np.float32(0.01):
            raise UnsupportedOpError("LeakyRelu with a slope other than torch's 0.01 is no activation_fn class")
    init = graph.initializers
    layout = {"net_arch": [d.out_features for d in hidden], "activation_fn": _ACTIVATION_FN[activation],
              "hidden": hidden, "last": last, "rows": last.out_features, "log_std": None, "chain": chain}
    if algo == "dqn" or head.kind == "categorical":
        if head.kind != "categorical":
            raise OptionError(f"--algo {algo} writes a discrete-action policy; this one's head is {head.kind} "
                              "(choose --algo ppo or a2c for a continuous one)")
        if log_std is not None:
            raise OptionError("log_std applies to a diagonal-Gaussian policy; this one is categorical")
        return layout
    if head.kind in ("none", "") or head.action is None:
        raise OptionError(f"--algo {algo} writes a diagonal-Gaussian or categorical policy; this model has no action "
                          "head: convert its source with --head diag-gaussian or categorical")
    if "gaussian" not in head.kind or head.mean is None:
        raise UnsupportedOpError(f"the head is {head.kind}; to-sb3 writes SB3 policies of a diagonal-Gaussian "
                                 "(Box) or categorical (Discrete) action")
    mean_node = producer.get(head.mean)
    if head.mean == last.output:
        rows = last.out_features
    elif mean_node is not None and mean_node.op_type == "Slice" and mean_node.inputs[0] == last.output:
        rows = int(np.asarray(init[mean_node.inputs[2]]).reshape(-1)[0])
        if int(np.asarray(init[mean_node.inputs[1]]).reshape(-1)[0]) != 0:
            raise UnsupportedOpError("the mean is not the first rows of the last layer")
    else:
        raise UnsupportedOpError(f"the action mean {head.mean!r} is not the last layer's output or its first rows")
    layout["rows"] = rows
    parameter = next((t for t, r in plan.roles.items() if r == "parameter" and init[t].size in (1, rows)
                      and head.log_std is not None), None)
    if rows < last.out_features:  # RLlib's [mean, log_std]: the log_std is computed from the observation
        if log_std is None:
            raise OptionError(f"the log_std here is outputs {rows} to {last.out_features - 1} of the last layer "
                              f"{last.name} (computed from the observation), and SB3's is one parameter per action dimension: give its value "
                              "with --log-std (log_std=), e.g. -0.5; the deterministic action does not depend on it")
    elif parameter is not None:
        if log_std is not None:
            raise OptionError("the source's log_std is a parameter, which to-sb3 uses; drop --log-std (log_std=)")
        layout["log_std"] = parameter
    elif log_std is None:
        raise OptionError("the model has no log_std; give SB3's initial one with --log-std (log_std=)")
    return layout


def _build(plan: LayerPlan, layout: dict, algo: str, obs_space, action_space_bounds, log_std, seed: int):
    """The SB3 model (and VecNormalize) holding the plan's weights; the assumptions made."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import A2C, DQN, PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    init = plan.graph.initializers
    obs_dim = int(plan.layers[0].in_features)
    assumptions = []
    lo, hi = (-np.inf, np.inf) if obs_space is None else map(float, obs_space)
    if obs_space is None:
        assumptions.append(f"observation space Box(-inf, inf, ({obs_dim},), float32): the model does not record "
                           "its bounds; give them with --obs-space LOW:HIGH to match an environment's")
    observation_space = gym.spaces.Box(lo, hi, (obs_dim,), np.float32)
    head = plan.head
    if head.kind == "categorical":
        action_space = gym.spaces.Discrete(layout["rows"])
    else:
        if action_space_bounds is not None:
            a_lo, a_hi = np.full(layout["rows"], float(action_space_bounds[0]), np.float32), \
                np.full(layout["rows"], float(action_space_bounds[1]), np.float32)
        elif head.action_low is not None:  # (ML-Agents' clamp(mean, -3, 3) / 3: the mean divided, Box(-1, 1))
            a_lo, a_hi = head.action_low.astype(np.float32), head.action_high.astype(np.float32)
        else:
            a_lo, a_hi = np.full(layout["rows"], -np.inf, np.float32), np.full(layout["rows"], np.inf, np.float32)
            assumptions.append("action space Box(-inf, inf): the model does not clip the action; give the "
                               "environment's bounds with --action-space LOW:HIGH (SB3's predict clips to them)")
        action_space = gym.spaces.Box(a_lo, a_hi, dtype=np.float32)
    if head.divisor:
        assumptions.append(f"action space Box(-1, 1) with action_net and log_std divided by {head.divisor:g}: the "
                           f"source's action is clamp(mean, -{head.divisor:g}, {head.divisor:g}) / {head.divisor:g} "
                           f"(ML-Agents' clip_action), the same Gaussian clipped as SB3 clips it")
    if plan.head.action == ML_AGENTS_DISCRETE:
        assumptions.append("action_masks all ones (every action allowed): SB3's policies take no action masks")
    if layout["log_std"] is None and log_std is not None:
        assumptions.append(f"log_std {log_std} for every action dimension (given by --log-std): the source computes "
                           "its log_std from the observation, SB3's is a parameter")
    env = DummyVecEnv([lambda: _SpacesOnly(observation_space, action_space)])
    arch = layout["net_arch"]
    activation_fn = getattr(torch.nn, layout["activation_fn"])
    if algo == "dqn":
        model = DQN("MlpPolicy", env, policy_kwargs={"net_arch": arch, "activation_fn": activation_fn}, seed=seed,
                    device="cpu")
        nets = [model.policy.q_net.q_net, model.policy.q_net_target.q_net]
    else:
        kwargs = {"net_arch": {"pi": arch, "vf": arch}, "activation_fn": activation_fn}
        if head.kind != "categorical":
            kwargs["log_std_init"] = float(log_std) if log_std is not None else 0.0
        model = (PPO if algo == "ppo" else A2C)("MlpPolicy", env, policy_kwargs=kwargs, seed=seed, device="cpu")
        nets = [model.policy.mlp_extractor.policy_net]
        assumptions.append(f"value function: SB3's fresh initialisation (seed {seed}), net_arch vf={arch}: the "
                           "policy converted holds no value function; the first updates of learn() fit it")
    with torch.no_grad():
        for net in nets:
            for i, d in enumerate(layout["hidden"]):
                _copy(net[2 * i], d, init)
        if algo == "dqn":
            _copy(nets[0][2 * len(layout["hidden"])], layout["last"], init)
            _copy(nets[1][2 * len(layout["hidden"])], layout["last"], init)
        else:
            _copy(model.policy.action_net, layout["last"], init, rows=layout["rows"], divisor=head.divisor)
            if layout["log_std"] is not None:
                value = np.array(init[layout["log_std"]], np.float32).reshape(-1)
                value = torch.from_numpy(value - np.float32(np.log(head.divisor)) if head.divisor else value)
                model.policy.log_std.copy_(value.expand_as(model.policy.log_std))
    vecnorm = None
    stats = plan.normaliser.vec_normalize if plan.normaliser is not None else None
    if stats is not None:
        vecnorm = VecNormalize(env, training=False, norm_obs=True, norm_reward=False, clip_obs=stats["clip_obs"],
                               epsilon=stats["epsilon"])
        vecnorm.obs_rms.mean = stats["mean"].copy()
        vecnorm.obs_rms.var = stats["var"].copy()
        assumptions.append("VecNormalize training=False and count 1e-4: the model holds the statistics, not how many "
                           "observations made them; set training = True to update them as learning goes on")
    return (model, vecnorm), assumptions


def _copy(linear, d: Dense, init, rows: int | None = None, divisor: float | None = None) -> None:
    """Set an ``nn.Linear`` to layer ``d`` (its first ``rows`` outputs), its weight and bias divided by
    ``divisor`` when given."""
    import torch

    w = init[d.weight]
    w = w.T if d.transposed else w
    rows = rows or w.shape[0]
    if tuple(linear.weight.shape) != (rows, w.shape[1]):
        raise BadModelError(f"layer {d.name}: SB3 built {tuple(linear.weight.shape)}, the source has {(rows, w.shape[1])}")
    bias = np.zeros(rows, np.float32) if d.bias is None else np.asarray(init[d.bias]).reshape(-1)[:rows]
    weight, bias = np.array(w[:rows], np.float32), np.array(bias, np.float32)
    if divisor:
        weight, bias = weight / np.float32(divisor), bias / np.float32(divisor)
    linear.weight.copy_(torch.from_numpy(weight))
    linear.bias.copy_(torch.from_numpy(bias))


class _SpacesOnly:
    """A gymnasium environment holding only the spaces SB3 builds a policy for; never stepped."""

    def __new__(cls, observation_space, action_space):
        import gymnasium as gym

        class Spaces(gym.Env):
            def __init__(self):
                self.observation_space, self.action_space = observation_space, action_space

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                return np.zeros(observation_space.shape, observation_space.dtype), {}

            def step(self, action):
                raise NotImplementedError("to-sb3 builds the policy without an environment; give yours to "
                                          "PPO.load(path, env=...) to train")

        return Spaces()


def check_sb3(zip_bytes: bytes, vec_bytes: bytes | None, algo: str, plan: LayerPlan, layout: dict,
              feeds: dict[str, np.ndarray]) -> tuple[float, int]:
    """Load the zip with SB3's own ``load``, run SB3's network and ``predict`` on ``feeds`` (normalised
    by the VecNormalize pickle), and compare with the numpy backend per tensor.

    Returns:
        (largest absolute difference, tensors compared).

    Raises:
        VerificationError: a difference beyond the tolerance of float32 (nothing is written).
    """
    import torch
    from stable_baselines3 import A2C, DQN, PPO

    from ...runtime import load
    from ...verification.compare import compare

    model = {"ppo": PPO, "a2c": A2C, "dqn": DQN}[algo].load(io.BytesIO(zip_bytes), device="cpu")
    obs = feeds[plan.graph.inputs[0].name]
    session = load(plan.graph, backend="numpy")
    want = session.record(feeds, "*")
    want.update(session.run(feeds))
    normalised = obs if vec_bytes is None else pickle.loads(vec_bytes).normalize_obs(obs)
    pairs = []
    net = model.policy.q_net.q_net if algo == "dqn" else model.policy.mlp_extractor.policy_net
    x = torch.from_numpy(np.asarray(normalised, np.float32))
    with torch.no_grad():
        if plan.normaliser is not None:
            pairs.append((layout["chain"][0], x.numpy()))
        for i, d in enumerate(layout["hidden"]):
            x = net[2 * i](x)
            pairs.append((d.output, x.numpy()))
            x = net[2 * i + 1](x)
            pairs.append((layout["chain"][i + 1], x.numpy()))
        last = net[2 * len(layout["hidden"])](x) if algo == "dqn" else model.policy.action_net(x)
    action, _ = model.predict(normalised, deterministic=True)
    head = plan.head
    worst, count = 0.0, 0
    if head.divisor:
        want["sb3 mean"] = want[layout["last"].output] / np.float32(head.divisor)
        pairs.append(("sb3 mean", last.numpy()))
    elif layout["rows"] == layout["last"].out_features:
        pairs.append((layout["last"].output, last.numpy()))
    else:
        want["sb3 mean"] = want[layout["last"].output][:, : layout["rows"]]
        pairs.append(("sb3 mean", last.numpy()))
    if head.kind == "categorical":
        pairs.append((head.action, np.asarray(action).astype(want[head.action].dtype).reshape(want[head.action].shape)))
    else:
        space = model.action_space
        want["sb3 action"] = want[head.action] if head.divisor else np.clip(
            want[head.mean] if head.mean != layout["last"].output or layout["rows"] == layout["last"].out_features
            else want["sb3 mean"], space.low, space.high)
        pairs.append(("sb3 action", np.asarray(action, np.float32)))
        if layout["log_std"] is not None:
            want["sb3 log_std"] = want[head.log_std][:1].reshape(-1) - np.float32(np.log(head.divisor or 1.0))
            pairs.append(("sb3 log_std", model.policy.log_std.detach().numpy()))
    for name, found in pairs:
        value = want[name]
        if found.shape != value.shape:
            raise VerificationError(f"SB3's {name!r} has shape {found.shape}, the numpy backend's {value.shape}; "
                                    "nothing was written")
        result = compare(name, "sb3", found, "numpy", value)
        if not result.passed:
            raise VerificationError(f"the SB3 model differs from the numpy backend at {name!r} (max abs "
                                    f"{result.max_abs:.3g}); nothing was written")
        worst, count = max(worst, float(result.max_abs or 0.0)), count + 1
    return worst, count
