"""``to-sb3``: an MLP policy as a Stable-Baselines3 zip that SB3 loads, predicts with and trains on.

:func:`to_sb3` maps the :class:`~.plan.LayerPlan` of a model onto SB3's own policy classes
(stable_baselines3/common/policies.py ``ActorCriticPolicy`` for PPO and A2C,
stable_baselines3/dqn/policies.py ``DQNPolicy`` for DQN, stable_baselines3/sac/policies.py
``SACPolicy`` for SAC, stable_baselines3/td3/policies.py ``TD3Policy`` for TD3 and DDPG): the hidden
dense layers become ``mlp_extractor.policy_net`` (``q_net.q_net`` for DQN, and its target network;
``actor.latent_pi`` for SAC; ``actor.mu`` for TD3/DDPG, and ``actor_target``), the last layer
``action_net`` (the mean rows of an RLlib-style ``[mean, log_std]`` layer, the logits, or the
logits of every discrete branch one after another for a MultiDiscrete action,
stable_baselines3/common/distributions.py ``MultiCategoricalDistribution``) or SAC's ``actor.mu`` /
TD3's last ``actor.mu`` Linear, a state-independent ``log_std`` SB3's ``log_std``. SAC and TD3 take
a policy whose action is ``tanh`` of the last layer rescaled from [-1, 1] to the Box bounds (SB3's
``squash_output``: ``BasePolicy.unscale_action``; SAC's ``SquashedDiagGaussianDistribution``).
A VecNormalize-shaped observation normaliser becomes a ``VecNormalize`` file beside the zip
(stable_baselines3/common/vec_env/vec_normalize.py).

What SB3's MLP policies cannot express is refused (exit 3), naming it: a layer that is not in one
chain, differing hidden activations, a normaliser of another form, a recurrent core (refused by the
layer plan already). What the source does not hold and SB3 needs is an assumption the result
names: the value function (or nothing for DQN), SAC's ``actor.log_std`` layer and the critics of
SAC and TD3 (and TD3's ``actor_target``) are SB3's fresh initialisation, unless the source is an SB3
SAC/TD3/DDPG zip whose ``policy.pth`` holds them (they are then carried over, with SAC's learned entropy coefficient from
``pytorch_variables.pth``); the observation
space is ``Box(-inf, inf)`` unless given or read from an SB3 zip source (a continuous action space
needs finite bounds, from the graph or given); an RLlib-style state-dependent ``log_std`` needs an
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
ALGOS = ("ppo", "a2c", "sac", "td3", "ddpg", "dqn")
#: Algorithms whose actor squashes the action with tanh and rescales it to the Box bounds.
SQUASHED = ("sac", "td3", "ddpg")
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
        algo: ``"ppo"``, ``"a2c"``, ``"sac"``, ``"td3"``, ``"ddpg"`` or ``"dqn"``; net_arch: the
            actor's hidden layer sizes.
        activation_fn: the torch class name of the hidden activation.
        observation_space, action_space: ``repr`` of the gymnasium spaces.
        samples: observations checked; max_abs: the largest absolute difference over the tensors
            compared; tensors: how many were compared.
        assumptions: what SB3 needs that the source does not hold, as sentences.
        notes: what converting the source said, and what was carried from an SB3 zip source beyond
            its ONNX model (SAC/TD3/DDPG critics, SAC's log_std layer and entropy coefficient).
        model_assumptions: what the model itself assumes beyond its source file (its metadata, :func:`policyport.graph.model.recorded_assumptions`).
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
        algo: ``"ppo"``, ``"a2c"`` (a diagonal-Gaussian, categorical or multi-categorical head),
            ``"sac"``, ``"td3"``, ``"ddpg"`` (an action that is tanh of the last layer rescaled to the
            bounds, SB3's squashed actors) or ``"dqn"`` (Q-values as logits, a categorical head).
        kind, options: as for :func:`policyport.convert`.
        obs_space: ``(low, high)`` of the observation space's Box; default: the zip's own for an SB3
            zip source (the readable bounds of its ``data``), else ``(-inf, inf)``.
        action_space: ``(low, high)`` of a continuous action space's Box; default: the bounds the
            graph clips the action to (an SB3 source); required (finite: SB3 asserts it) where the graph
            does not bound its action; for SAC/TD3/DDPG the bounds the graph rescales its tanh output
            to, which a given value must equal.
        log_std: SB3's state-independent ``log_std`` (every action dimension) for a source whose
            ``log_std`` is computed from the observation (RLlib's ``[mean, log_std]`` layer); refused
            for a source whose ``log_std`` is a parameter, which is used. For SAC: the bias of
            ``actor.log_std`` (its weight 0), in place of SB3's fresh layer or the zip's; refused for TD3/DDPG.
        samples, low, high, seed: the float32 observations drawn for the check (default 1000 from
            ``[0, 1)`` with ``default_rng(0)``, :func:`policyport.verification.verify.sample_inputs`).
        force: replace existing files.

    Returns:
        :class:`Sb3Export`.

    Raises:
        OptionError: an unknown ``algo``, an ``algo`` the head does not fit (a squashed head with
            PPO, a Gaussian one with SAC, a MultiDiscrete one with DQN ...), a missing or needless
            ``log_std``, bounds that are not ``low < high`` or differ from a squashed head's (exit 2).
        UnsupportedOpError: a graph SB3's MLP policies cannot express, named (exit 3): a hybrid head
            (continuous and discrete actions), an ML-Agents SAC actor (its deterministic action is
            the mean, not tanh of it) ...
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
    if action_space is not None and not np.all(np.isfinite(np.asarray(action_space, np.float64))):
        raise OptionError(f"action_space {tuple(action_space)!r}: SB3 takes a continuous action space with finite "
                          "bounds only (stable_baselines3/common/base_class.py); give the environment's")
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
    zipped = _sb3_zip(source, given)
    carried = _carried(zipped, algo) if algo in SQUASHED else None
    if obs_space is None and zipped is not None:
        obs_space = _zip_observation_space(zipped, int(plan.layers[0].in_features))
    built, assumptions, carried_notes = _build(plan, layout, algo, obs_space, action_space, log_std, seed, carried)
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
                     max_abs, count, assumptions, given.notes + plan.notes + carried_notes,
                     recorded_assumptions(plan.graph.metadata))


def _sb3_zip(source, given) -> tuple[Path, dict, dict] | None:
    """``(path, data JSON, policy.pth arrays)`` of an SB3 zip given as the source (read without unpickling
    code, as the SB3 converter reads it: policyport/converter/sources/sb3.py ``read_zip``); None for any
    other source (an ONNX model, even one converted from a zip, is used as it is)."""
    from ...converter.readers.torch_files import as_state_dict, load_torch_file
    from ...converter.sources.sb3 import read_zip

    if not given.converted or not isinstance(source, (str, os.PathLike)) or _source_kind(given.model) != "sb3":
        return None
    path = Path(source)
    data, policy_bytes, _ = read_zip(path)
    return path, data, as_state_dict(load_torch_file(policy_bytes, what=f"{path}:policy.pth"), f"{path}:policy.pth")


def _zip_observation_space(zipped: tuple[Path, dict, dict], obs_dim: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The ``(low, high)`` float32 arrays of the zip's Box observation space (its ``data`` entry's readable
    ``low``/``high``), or None when it is no flat Box of ``obs_dim`` values with readable bounds."""
    from ...converter.sources.sb3 import _space

    path, data, _ = zipped
    try:
        space = _space(data, "observation_space", path)
    except BadModelError:
        return None
    if space["type"] != "Box" or space["shape"] != (obs_dim,) or isinstance(space["low"], Exception) \
            or isinstance(space["high"], Exception):
        return None
    return np.asarray(space["low"], np.float32), np.asarray(space["high"], np.float32)


def _carried(zipped: tuple[Path, dict, dict] | None, algo: str) -> dict | None:
    """What an SB3 SAC/TD3/DDPG zip holds beyond the actor the ONNX model has: its ``policy.pth`` arrays,
    the critics' ``net_arch`` and count from their layer shapes (stable_baselines3/common/policies.py
    ``ContinuousCritic``: ``qf0``, ``qf1`` ... each ``Linear, act, ..., Linear(., 1)``) and SAC's
    ``log_ent_coef`` (``pytorch_variables.pth``); None for another source, or a zip of another algorithm
    (whose critics learn another Q-function)."""
    import zipfile

    from ...converter.readers.torch_files import load_torch_file
    from ...io.arrays import read_zip_member

    if zipped is None:
        return None
    path, _, arrays = zipped
    critics = sorted({k.split(".")[1] for k in arrays if k.startswith("critic.qf")})
    actor = "actor.latent_pi.0.weight" if algo == "sac" else "actor_target.mu.0.weight"
    if not critics or actor not in arrays:
        return None
    linear = sorted((int(k.split(".")[2]), v.shape[0]) for k, v in arrays.items()
                    if k.startswith("critic.qf0.") and k.endswith(".weight"))
    carried = {"arrays": arrays, "qf": [n for _, n in linear[:-1]], "n_critics": len(critics)}
    with zipfile.ZipFile(path) as zf:
        if algo == "sac" and "pytorch_variables.pth" in zf.namelist():
            variables = load_torch_file(read_zip_member(zf, "pytorch_variables.pth", str(path)),
                                        what=f"{path}:pytorch_variables.pth")
            value = variables.get("log_ent_coef") if isinstance(variables, dict) else None
            if value is not None and np.asarray(value).size == 1:
                carried["log_ent_coef"] = np.asarray(value, np.float64).reshape(-1)
    return carried


def _source_kind(model) -> str | None:
    """The ``policyport.source_kind`` metadata of an ``onnx.ModelProto``, or None."""
    return next((p.value for p in model.metadata_props if p.key == "policyport.source_kind"), None)


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
    if head.kind == "hybrid":
        raise UnsupportedOpError("the head is hybrid (both continuous and discrete actions); SB3 has no action space "
                                 "of both kinds, so none of its policies expresses it")
    if head.kind == "multi-categorical" and algo not in ("ppo", "a2c"):
        raise OptionError(f"--algo {algo}: the head is multi-categorical (several discrete branches, SB3's MultiDiscrete), "
                          "which SB3 writes as a PPO or A2C policy: choose --algo ppo or a2c")
    branches = _branches(layers) if head.kind == "multi-categorical" else layers[-1:]
    mean_layer = next((d for d in layers if d.output == head.mean), None)
    if mean_layer is not None and mean_layer is not layers[-1]:
        follows = layers[-1]
        if algo in SQUASHED:
            raise UnsupportedOpError(f"the action is layer {mean_layer.name}'s output itself, not squashed by tanh, while "
                                     f"layer {follows.name} computes a log std from the observation (ML-Agents' SAC actor "
                                     f"exports its mean as the deterministic action): SB3's {algo.upper()} predicts "
                                     "tanh(mean) rescaled to the action bounds, which differs from this action")
        raise UnsupportedOpError(f"the action mean is layer {mean_layer.name}'s output and layer {follows.name} (a log std "
                                 "computed from the observation, as ML-Agents' SAC actor has) follows it: SB3's PPO "
                                 "and A2C keep log_std as a parameter")
    masks = plan.head.action == ML_AGENTS_DISCRETE and [v.name for v in graph.inputs][1:] == [MASKS]
    if len(graph.inputs) != 1 + masks or graph.inputs[0].shape is None or len(graph.inputs[0].shape) != 2:
        raise UnsupportedOpError("SB3's MLP policies take one flat observation (batch, obs_dim); the graph takes "
                                 + ", ".join(f"{v.name} {v.shape}" for v in graph.inputs))
    hidden, last = layers[: len(layers) - len(branches)], branches[0]
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
    for d in hidden + branches:
        if d.input != chain[-1] and not (d in branches and d.input == chain[len(hidden)]):
            raise UnsupportedOpError(f"layer {d.name} reads {d.input!r}, not the previous layer's output "
                                     f"{chain[-1]!r}: SB3's MLP policies are one chain of layers")
        if d in hidden:
            act = next((s for s in plan.steps if not isinstance(s, Dense) and d.output in s.inputs
                        and (s.op_type == "Mul" if d.activation == "Swish" else s.inputs[:1] == (d.output,))), None)
            chain.append(act.outputs[0])
    if activation == "LeakyRelu":
        node = next(s for s in plan.steps if not isinstance(s, Dense) and s.op_type == "LeakyRelu")
        if float(node.attrs.get("alpha", 0.01)) != np.float32(0.01):
            raise UnsupportedOpError("LeakyRelu with a slope other than torch's 0.01 is no activation_fn class")
    init = graph.initializers
    layout = {"net_arch": [d.out_features for d in hidden], "activation_fn": _ACTIVATION_FN[activation],
              "hidden": hidden, "last": last, "branches": branches, "rows": sum(d.out_features for d in branches),
              "log_std": None, "chain": chain, "nvec": None, "bounds": None}
    if head.kind == "multi-categorical":
        layout["nvec"] = _nvec(plan, branches)
        if log_std is not None:
            raise OptionError("log_std applies to a diagonal-Gaussian policy; this one is multi-categorical")
        return layout
    if algo in SQUASHED:
        return _squashed_layout(plan, layout, algo, log_std)
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
    if _squash_bounds(plan, last) is not None:
        raise OptionError(f"--algo {algo}: the action is tanh of layer {last.name} rescaled to the action bounds (a "
                          "squashed policy, as SAC's and TD3's actors compute it); choose --algo sac, td3 or ddpg")
    if "gaussian" not in head.kind or head.mean is None:
        raise UnsupportedOpError(f"the head is {head.kind}; to-sb3 writes SB3 policies of a diagonal-Gaussian "
                                 "(Box), tanh-squashed (Box, SAC/TD3), categorical (Discrete) or multi-categorical "
                                 "(MultiDiscrete) action")
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


def _branches(layers: list[Dense]) -> list[Dense]:
    """The layers of a multi-categorical head: the last layer (one for every branch's logits, SB3's
    ``action_net``), or the trailing layers that all read the same tensor, one per branch (ML-Agents'
    ``_discrete_distribution.branches``, ml-agents/mlagents/trainers/torch_entities/distributions.py)."""
    branches = [layers[-1]]
    for d in reversed(layers[:-1]):
        if d.input != layers[-1].input:
            break
        branches.insert(0, d)
    return branches


def _nvec(plan: LayerPlan, branches: list[Dense]) -> list[int]:
    """The branch sizes of a multi-categorical head, refused unless the action is the argmax of every
    branch's logits in order (masked ML-Agents logits with all actions allowed are the logits)."""
    head = plan.head
    init = plan.graph.initializers
    producer = {o: s for s in plan.steps if not isinstance(s, Dense) for o in s.outputs}
    concat = producer.get(head.action)
    if concat is None or concat.op_type != "Concat":
        raise UnsupportedOpError(f"the multi-categorical action {head.action!r} is not a Concat of one argmax per branch")
    if len(branches) > 1:
        nvec = [d.out_features for d in branches]
    else:  # SB3's converter: Slice(logits, start, end) per branch
        nvec, start = [], 0
        for part in concat.inputs:
            argmax = producer.get(part)
            piece = producer.get(argmax.inputs[0]) if argmax is not None else None
            if piece is None or piece.op_type != "Slice" or piece.inputs[0] != branches[0].output:
                raise UnsupportedOpError(f"branch {part!r} of the action is not the argmax of a slice of the logits")
            begin, end = (int(np.asarray(init[t]).reshape(-1)[0]) for t in piece.inputs[1:3])
            if begin != start:
                raise UnsupportedOpError(f"the branches of the action do not slice the logits in order ({begin} after {start})")
            nvec.append(end - begin)
            start = end
        if start != branches[0].out_features:
            raise UnsupportedOpError(f"the branches of the action take {start} of the {branches[0].out_features} logits")
    if len(nvec) != len(concat.inputs):
        raise UnsupportedOpError(f"the action concatenates {len(concat.inputs)} argmaxes for {len(nvec)} branch layers")
    return nvec


def _squash_bounds(plan: LayerPlan, last: Dense) -> tuple[np.ndarray, np.ndarray] | None:
    """``(low, high)`` (float64, shape (action_dim,)) when the action is ``tanh`` of ``last``'s output mapped
    affinely from [-1, 1] onto [low, high] (SB3's ``unscale_action``, ``low + 0.5 * (a + 1) * (high - low)``,
    stable_baselines3/common/policies.py), else None."""
    steps = [s for s in plan.steps if not isinstance(s, Dense)]
    tanh = next((s for s in steps if s.op_type == "Tanh" and s.inputs[:1] == (last.output,)), None)
    if tanh is None or plan.head.action is None:
        return None
    init = plan.graph.initializers
    scale, offset, current = np.ones(last.out_features), np.zeros(last.out_features), tanh.outputs[0]
    while current != plan.head.action:
        users = [s for s in steps if current in s.inputs]
        if len(users) != 1 or users[0].op_type not in ("Add", "Sub", "Mul", "Div") or len(users[0].inputs) != 2:
            return None
        node = users[0]
        other = node.inputs[1] if node.inputs[0] == current else node.inputs[0]
        if other not in init or init[other].dtype.kind != "f":
            return None
        value = np.asarray(init[other], np.float64).reshape(-1)
        if node.op_type == "Add":
            offset = offset + value
        elif node.op_type == "Sub" and node.inputs[0] == current:
            offset = offset - value
        elif node.op_type == "Mul":
            scale, offset = scale * value, offset * value
        elif node.op_type == "Div" and node.inputs[0] == current:
            scale, offset = scale / value, offset / value
        else:
            return None
        current = node.outputs[0]
    if scale.shape != (last.out_features,) or not (scale > 0).all():
        return None
    return offset - scale, offset + scale


def _squashed_layout(plan: LayerPlan, layout: dict, algo: str, log_std: float | None) -> dict:
    """The layout of a SAC or TD3/DDPG actor: the action tanh of the last layer rescaled to the bounds."""
    head, last = plan.head, layout["last"]
    bounds = _squash_bounds(plan, last)
    if bounds is None:
        raise OptionError(f"--algo {algo} writes an actor whose action is tanh of its last layer rescaled to the "
                          f"action bounds (SB3's squash_output); this one's head is {head.kind or 'none'}, action "
                          f"{head.action!r}: choose --algo ppo or a2c" + (" (or dqn)" if head.kind == "categorical" else ""))
    if algo != "sac" and log_std is not None:
        raise OptionError(f"log_std applies to SAC's actor; {algo.upper()}'s actor is deterministic")
    layout["bounds"] = bounds
    return layout


#: ``policyport.layout`` metadata of the converters' Q-networks (SB3's ``q_net``, CleanRL's dqn.py
#: ``QNetwork``), whose logits are Q-values; RLlib's DQN is told by its ``advantages``/``value`` streams.
Q_LAYOUTS = frozenset({"sb3-q", "cleanrl-dqn"})


def _build(plan: LayerPlan, layout: dict, algo: str, obs_space, action_space_bounds, log_std, seed: int,
           carried: dict | None = None):
    """The SB3 model (and VecNormalize) holding the plan's weights (and ``carried``'s, :func:`_carried`);
    the assumptions made; what was carried from the source zip, as notes."""
    import gymnasium as gym
    import torch
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    init = plan.graph.initializers
    obs_dim = int(plan.layers[0].in_features)
    assumptions, notes = [], []
    lo, hi = (-np.inf, np.inf) if obs_space is None else (
        obs_space if isinstance(obs_space[0], np.ndarray) else map(float, obs_space))
    if obs_space is None:
        assumptions.append(f"observation space Box(-inf, inf, ({obs_dim},), float32): the model does not record "
                           "its bounds; give them with --obs-space LOW:HIGH to match an environment's")
    observation_space = gym.spaces.Box(lo, hi, (obs_dim,), np.float32)
    head = plan.head
    if head.kind == "categorical":
        action_space = gym.spaces.Discrete(layout["rows"])
    elif layout["nvec"] is not None:
        action_space = gym.spaces.MultiDiscrete(layout["nvec"])
    elif layout["bounds"] is not None:
        a_lo, a_hi = (b.astype(np.float32) for b in layout["bounds"])
        if action_space_bounds is not None and not (np.all(a_lo == np.float32(action_space_bounds[0]))
                                                    and np.all(a_hi == np.float32(action_space_bounds[1]))):
            raise OptionError(f"action_space {tuple(action_space_bounds)!r}: the model rescales its tanh output to "
                              f"[{_listed(a_lo)}, {_listed(a_hi)}], which SB3 takes as the Box bounds; drop --action-space")
        action_space = gym.spaces.Box(a_lo, a_hi, dtype=np.float32)
    else:
        if action_space_bounds is not None:
            a_lo, a_hi = np.full(layout["rows"], float(action_space_bounds[0]), np.float32), \
                np.full(layout["rows"], float(action_space_bounds[1]), np.float32)
        elif head.action_low is not None:  # (ML-Agents' clamp(mean, -3, 3) / 3: the mean divided, Box(-1, 1))
            a_lo, a_hi = head.action_low.astype(np.float32), head.action_high.astype(np.float32)
        else:
            a_lo = a_hi = np.full(layout["rows"], np.inf, np.float32)
        if not (np.all(np.isfinite(a_lo)) and np.all(np.isfinite(a_hi))):
            # SB3 asserts finite bounds of a Box action space (stable_baselines3/common/base_class.py)
            raise OptionError("the model does not clip its action to finite bounds, and SB3 needs a continuous "
                              "action space's (its predict clips to them): give the environment's with "
                              "--action-space LOW:HIGH (action_space=(low, high))")
        action_space = gym.spaces.Box(a_lo, a_hi, dtype=np.float32)
    if head.divisor:
        assumptions.append(f"action space Box(-1, 1) with action_net and log_std divided by {head.divisor:g}: the "
                           f"source's action is clamp(mean, -{head.divisor:g}, {head.divisor:g}) / {head.divisor:g} "
                           f"(ML-Agents' clip_action), the same Gaussian clipped as SB3 clips it")
    if plan.head.action == ML_AGENTS_DISCRETE:
        assumptions.append("action_masks all ones (every action allowed): SB3's policies take no action masks")
    if layout["log_std"] is None and log_std is not None and algo not in SQUASHED:
        assumptions.append(f"log_std {log_std} for every action dimension (given by --log-std): the source computes "
                           "its log_std from the observation, SB3's is a parameter")
    env = DummyVecEnv([lambda: _SpacesOnly(observation_space, action_space)])
    arch = layout["net_arch"]
    activation_fn = getattr(torch.nn, layout["activation_fn"])
    if algo in SQUASHED:
        model = _squashed_model(algo, env, layout, activation_fn, seed, carried, log_std, assumptions, notes)
    elif algo == "dqn":
        from stable_baselines3 import DQN

        model = DQN("MlpPolicy", env, policy_kwargs={"net_arch": arch, "activation_fn": activation_fn}, seed=seed,
                    device="cpu")
        source_layout = plan.graph.metadata.get("policyport.layout")
        if source_layout not in Q_LAYOUTS and not {"advantages", "value"} <= set(plan.graph.tensor_names):
            assumptions.append(f"Q-values: the model's logits (source layout {source_layout or 'not recorded'}, not "
                               "a Q-network policyport knows: SB3's DQN, CleanRL's dqn, RLlib's dueling DQN); "
                               "predict(deterministic=True) takes their argmax, as the source acts, but learn() "
                               "starts from values trained as logits, not as Q-values")
    else:
        from stable_baselines3 import A2C, PPO

        kwargs = {"net_arch": {"pi": arch, "vf": arch}, "activation_fn": activation_fn}
        if head.kind not in ("categorical", "multi-categorical"):
            kwargs["log_std_init"] = float(log_std) if log_std is not None else 0.0
        model = (PPO if algo == "ppo" else A2C)("MlpPolicy", env, policy_kwargs=kwargs, seed=seed, device="cpu")
        assumptions.append(f"value function: SB3's fresh initialisation (seed {seed}), net_arch vf={arch}: the "
                           "policy converted holds no value function; the first updates of learn() fit it")
    with torch.no_grad():
        for net, last in _actor_nets(model, algo, len(layout["hidden"])):
            for i, d in enumerate(layout["hidden"]):
                _copy(net[2 * i], [d], init)
            _copy(last, layout["branches"], init, rows=layout["rows"], divisor=head.divisor)
        if layout.get("target_carried"):  # after the actor's copy into both: the target as training left it
            state = model.policy.state_dict()
            targets = [k for k in state if k.startswith("actor_target.")]
            for k in targets:
                state[k].copy_(torch.from_numpy(np.array(carried["arrays"][k], np.float32)))
            notes.append(f"carried from the zip's policy.pth: actor_target ({len(targets)} tensors), the target actor "
                         "as training left it (the deterministic action does not depend on it)")
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
    return (model, vecnorm), assumptions, notes


def _listed(values: np.ndarray) -> str:
    return ", ".join(f"{v:g}" for v in values)


def _actor_nets(model, algo: str, hidden: int) -> list:
    """``(sequential of the hidden layers, last Linear)`` of every network the policy's layers go into:
    PPO/A2C ``mlp_extractor.policy_net`` and ``action_net``; DQN ``q_net.q_net`` and ``q_net_target.q_net``;
    SAC ``actor.latent_pi`` and ``actor.mu``; TD3/DDPG ``actor.mu`` and ``actor_target.mu``."""
    policy = model.policy
    if algo == "dqn":
        return [(net, net[2 * hidden]) for net in (policy.q_net.q_net, policy.q_net_target.q_net)]
    if algo == "sac":
        return [(policy.actor.latent_pi, policy.actor.mu)]
    if algo in ("td3", "ddpg"):
        return [(net, net[2 * hidden]) for net in (policy.actor.mu, policy.actor_target.mu)]
    return [(policy.mlp_extractor.policy_net, policy.action_net)]


def _module(key: str) -> str:
    """The SB3 network a ``policy.pth`` key belongs to (``critic``, ``critic_target``, ``actor.log_std`` ...)."""
    return "actor.log_std" if key.startswith("actor.log_std.") else key.split(".")[0]


def _squashed_model(algo: str, env, layout: dict, activation_fn, seed: int, carried: dict | None, log_std,
                    assumptions: list[str], notes: list[str]):
    """SB3's SAC, TD3 or DDPG on ``env`` with the actor's ``net_arch``; the critics (and SAC's ``actor.log_std``
    layer) from ``carried`` when it holds them (:func:`_carried`, said in ``notes``), else SB3's fresh
    initialisation, said in ``assumptions``."""
    import torch
    from stable_baselines3 import DDPG, SAC, TD3

    arch = layout["net_arch"]
    qf, n_critics = (arch, None) if carried is None else (carried["qf"], carried["n_critics"])
    kwargs = {"net_arch": {"pi": arch, "qf": qf}, "activation_fn": activation_fn}
    if n_critics is not None and algo != "ddpg":
        kwargs["n_critics"] = n_critics
    if algo == "ddpg" and n_critics not in (None, 1):
        raise OptionError(f"the source holds {n_critics} critics, SB3's DDPG one: choose --algo td3")
    extra = {"ent_coef": f"auto_{float(np.exp(carried['log_ent_coef'][0])):.9g}"} if (
        carried is not None and "log_ent_coef" in carried and algo == "sac") else {}
    model = {"sac": SAC, "td3": TD3, "ddpg": DDPG}[algo]("MlpPolicy", env, policy_kwargs=kwargs, seed=seed,
                                                       device="cpu", **extra)
    state = model.policy.state_dict()
    actor_keys = {k for k in state if k.startswith(("actor.latent_pi.", "actor.mu.", "actor_target.mu."))}
    wanted = [k for k in state if k not in actor_keys]
    if algo == "sac" and log_std is not None:
        wanted = [k for k in wanted if not k.startswith("actor.log_std.")]
    if carried is not None:
        arrays = carried["arrays"]
        found = [k for k in wanted if k in arrays and tuple(arrays[k].shape) == tuple(state[k].shape)]
        with torch.no_grad():
            for k in found:
                state[k].copy_(torch.from_numpy(np.array(arrays[k], np.float32)))
        if found:
            notes.append(f"carried from the zip's policy.pth, which the ONNX model leaves out: "
                         f"{', '.join(sorted({_module(k) for k in found}))} ({len(found)} tensors; the deterministic "
                         "action does not depend on them)")
        if "ent_coef" in extra:
            notes.append(f"carried from the zip's pytorch_variables.pth: the learned entropy coefficient, "
                         f"ent_coef {extra['ent_coef']}")
        assumptions.append("the optimisers' state (Adam moments) starts fresh: the zip's *.optimizer.pth are "
                           "not carried")
        wanted = [k for k in wanted if k not in found]
    if algo == "sac" and log_std is not None:
        with torch.no_grad():
            model.policy.actor.log_std.weight.zero_()
            model.policy.actor.log_std.bias.fill_(float(log_std))
        assumptions.append(f"actor.log_std: weight 0 and bias {log_std} (given by --log-std), a state-independent "
                           "log std SAC's training then makes depend on the observation")
    fresh = sorted({_module(k) for k in wanted})
    if "actor.log_std" in fresh:
        fresh.remove("actor.log_std")
        assumptions.append(f"actor.log_std: SB3's fresh initialisation (seed {seed}), the source holds no log std layer; "
                           "the deterministic action does not depend on it (--log-std V makes it a constant V)")
    if fresh:
        assumptions.append(f"{', '.join(fresh)}: SB3's fresh initialisation (seed {seed}, qf net_arch {qf}): the policy "
                           "converted holds only the actor; the first updates of learn() fit the critics")
    if algo == "sac" and "ent_coef" not in extra:
        assumptions.append("ent_coef auto starting at 1.0: SB3's default for SAC (the source holds no entropy coefficient)")
    if algo in ("td3", "ddpg"):
        targets = {k: v for k, v in state.items() if k.startswith("actor_target.")}
        layout["target_carried"] = carried is not None and all(
            k in carried["arrays"] and tuple(carried["arrays"][k].shape) == tuple(v.shape) for k, v in targets.items())
        if not layout["target_carried"]:
            assumptions.append("actor_target: the actor's weights, as SB3 starts it")
        assumptions.append(f"action noise none, target_policy_noise {model.target_policy_noise:g}, target_noise_clip "
                           f"{model.target_noise_clip:g}, policy_delay {model.policy_delay}: SB3's training defaults for "
                           f"{algo.upper()} (training settings the policy does not hold)")
    return model


def _copy(linear, layers: list[Dense], init, rows: int | None = None, divisor: float | None = None) -> None:
    """Set an ``nn.Linear`` to ``layers``' outputs one after another (the first ``rows`` of them), its weight
    and bias divided by ``divisor`` when given."""
    import torch

    weights, biases = [], []
    for d in layers:
        w = init[d.weight]
        weights.append(w.T if d.transposed else w)
        biases.append(np.zeros(d.out_features, np.float32) if d.bias is None else np.asarray(init[d.bias]).reshape(-1))
    w, bias = np.concatenate(weights), np.concatenate(biases)
    rows = rows or w.shape[0]
    if tuple(linear.weight.shape) != (rows, w.shape[1]):
        raise BadModelError(f"layer {', '.join(d.name for d in layers)}: SB3 built {tuple(linear.weight.shape)}, the "
                            f"source has {(rows, w.shape[1])}")
    weight, bias = np.array(w[:rows], np.float32), np.array(bias[:rows], np.float32)
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
    by the VecNormalize pickle), and compare with the numpy backend per tensor: every hidden layer and
    activation, the last layer (the branches' logits one after another), ``predict(obs,
    deterministic=True)`` and a parameter ``log_std``; a target network (DQN's, TD3's) must equal its network.

    Returns:
        (largest absolute difference, tensors compared).

    Raises:
        VerificationError: a difference beyond the tolerance of float32 (nothing is written).
    """
    import torch
    from stable_baselines3 import A2C, DDPG, DQN, PPO, SAC, TD3

    from ...runtime import load
    from ...verification.compare import compare

    model = {"ppo": PPO, "a2c": A2C, "dqn": DQN, "sac": SAC, "td3": TD3, "ddpg": DDPG}[algo].load(
        io.BytesIO(zip_bytes), device="cpu")
    obs = feeds[plan.graph.inputs[0].name]
    session = load(plan.graph, backend="numpy")
    want = session.record(feeds, "*")
    want.update(session.run(feeds))
    normalised = obs if vec_bytes is None else pickle.loads(vec_bytes).normalize_obs(obs)
    pairs = []
    nets = _actor_nets(model, algo, len(layout["hidden"]))
    net, last_linear = nets[0]
    x = torch.from_numpy(np.asarray(normalised, np.float32))
    with torch.no_grad():
        if plan.normaliser is not None:
            pairs.append((layout["chain"][0], x.numpy()))
        for i, d in enumerate(layout["hidden"]):
            x = net[2 * i](x)
            pairs.append((d.output, x.numpy()))
            x = net[2 * i + 1](x)
            pairs.append((layout["chain"][i + 1], x.numpy()))
        last = last_linear(x)
        for target, target_last in ([] if layout.get("target_carried") else nets[1:]):  # a carried target is not
            # the ONNX model's
            y = torch.from_numpy(np.asarray(normalised, np.float32))
            for i in range(len(layout["hidden"])):
                y = target[2 * i + 1](target[2 * i](y))
            want["sb3 target network"] = last.numpy()
            pairs.append(("sb3 target network", target_last(y).numpy()))
    action, _ = model.predict(normalised, deterministic=True)
    head = plan.head
    worst, count = 0.0, 0
    if head.divisor:
        want["sb3 mean"] = want[layout["last"].output] / np.float32(head.divisor)
        pairs.append(("sb3 mean", last.numpy()))
    elif len(layout["branches"]) > 1:
        want["sb3 logits"] = np.concatenate([want[d.output] for d in layout["branches"]], axis=1)
        pairs.append(("sb3 logits", last.numpy()))
    elif layout["rows"] == layout["last"].out_features:
        pairs.append((layout["last"].output, last.numpy()))
    else:
        want["sb3 mean"] = want[layout["last"].output][:, : layout["rows"]]
        pairs.append(("sb3 mean", last.numpy()))
    if head.kind in ("categorical", "multi-categorical") or layout["bounds"] is not None:
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
