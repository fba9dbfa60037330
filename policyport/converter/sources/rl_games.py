"""rl_games ``.pth`` checkpoints (Isaac Gym's IsaacGymEnvs, Isaac Lab's rl_games runs).

The trainer saves ``torch.save`` of a dict (``rl_games/common/a2c_common.py``, ``get_full_state_weights``;
``algos_torch/torch_ext.py``, ``save_checkpoint``): ``model`` (the whole model's ``state_dict``),
``epoch``, ``frame``, ``optimizer``, ``last_mean_rewards`` and ``env_state`` (whatever the environment
pickles). ``model`` holds, for the usual MLP actor-critic (``algos_torch/network_builder.py``,
``A2CBuilder``):

* ``running_mean_std.{running_mean, running_var, count}``: float64, with ``normalize_input``
  (``algos_torch/running_mean_std.py``, ``RunningMeanStd``);
* ``a2c_network.actor_mlp.{0,2,...}.{weight,bias}`` (a ``Linear`` then the activation module, so the
  odd indices are the activations), ``a2c_network.critic_mlp.*`` when ``separate``;
* continuous actions: ``a2c_network.mu.{weight,bias}`` and ``a2c_network.sigma``, a vector with
  ``fixed_sigma`` (a log std for ``continuous_a2c_logstd``, the model every shipped config uses) or a
  ``Linear``; discrete actions: ``a2c_network.logits.{weight,bias}``;
* ``a2c_network.value.*`` and ``value_mean_std.*`` (the value function and its normaliser).

What the model computes, as rl_games computes it:

* the observation normaliser, in float32 with the statistics cast down (``.float()``):
  ``clamp((x - mean) / sqrt(var + 1e-5), -5, 5)`` — the epsilon on the variance, 1e-5, and the clip
  at 5 are rl_games' own (rsl_rl adds 1e-2 to the std and clips nothing; skrl adds 1e-8 to the std);
* the actor MLP, then ``mu = mu_act(mu(h))`` (``mu_activation``, None in every shipped config);
* the player's deterministic action (``algos_torch/players.py``, ``PpoPlayerContinuous.get_action``):
  ``mu``, and with ``clip_actions`` (the player's default) ``rescale_actions(low, high, clamp(mu, -1, 1))``
  = ``clamp(mu, -1, 1) * (high - low) / 2 + (high + low) / 2``, the bounds being the environment's
  action space, which no file records: the mapping is built when ``--action-bounds`` gives them;
  a discrete policy's deterministic action is the argmax of its logits.

The hidden activation is not in the checkpoint: it is read from the run's configuration where the
libraries that run rl_games write it (Isaac Lab: ``<run>/params/agent.yaml``; IsaacGymEnvs:
``<run>/config.yaml``, the checkpoint lying in ``<run>/nn/``), else ``--activation`` is required.
Nothing is unpickled beyond tensors and plain containers (see :mod:`..readers.checkpoints`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import BadModelError, OptionError
from ..action_bounds import action_bounds, shown
from ..assumptions import Assumption
from .actor import ActorLayout, actor_reference, add_actor, next_module

#: ``RunningMeanStd``'s epsilon (``rl_games/algos_torch/running_mean_std.py``, ``epsilon=1e-05``), added
#: to the variance before the square root.
NORMALIZER_EPS = 1e-5
#: ``RunningMeanStd.forward`` clamps the normalised observation to [-5, 5].
NORMALIZER_CLIP = 5.0
#: rl_games' activation names (``algos_torch/network_builder.py``, ``activations_factory``) -> policyport's.
ACTIVATIONS = {"relu": "relu", "tanh": "tanh", "sigmoid": "sigmoid", "elu": "elu", "selu": "selu",
               "swish": "swish", "gelu": "gelu", "softplus": "softplus", "none": "linear"}
#: The keys that tell an rl_games checkpoint: its top-level keys and a key of its model's state_dict.
MARKERS = ({"model", "epoch", "frame"},)
MODEL_KEYS = ("a2c_network.mu.weight", "a2c_network.logits.weight")


class Layout(ActorLayout):
    """An rl_games actor (:class:`~.actor.ActorLayout`): ``layers`` are ``a2c_network.actor_mlp``'s,
    ``head`` is ``mu`` or ``logits``, ``sigma`` a ``fixed_sigma`` vector (A,), ``sigma_layer`` a
    state-dependent sigma ``Linear``, ``normalizer`` ``running_mean``, ``running_var``, ``count``
    (float64), ``left_out`` the value function."""


def is_rl_games_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a torch zip whose pickle names an rl_games checkpoint's top-level keys and
    its model's ``a2c_network`` head, read from the pickle's opcodes without unpickling anything."""
    from ..readers.checkpoints import pickled_strings

    strings = pickled_strings(path)
    return any(marker <= strings for marker in MARKERS) and any(k in strings for k in MODEL_KEYS)


def read_layout(ckpt: dict, what: str) -> Layout:
    """Place the actor's arrays of an rl_games checkpoint's ``model``.

    Raises:
        BadModelError: no ``model`` state_dict; no ``mu`` or ``logits`` head; a CNN or RNN network
            (only the MLP actor is read); layers that do not chain; statistics of another width.
    """
    from ..readers.checkpoints import linear_layer, state_dict

    if "model" not in ckpt:
        raise BadModelError(f"{what} holds {', '.join(map(str, ckpt))}: no 'model', the state_dict rl_games saves")
    sd = state_dict(ckpt["model"], f"{what}'s model")
    sd = {k.removeprefix("_orig_mod."): v for k, v in sd.items()}  # torch.compile's prefix, as load_checkpoint strips it
    others = sorted({k.split(".")[1] for k in sd if k.startswith("a2c_network.")}
                    - {"actor_mlp", "critic_mlp", "mu", "sigma", "logits", "value", "actor_cnn", "critic_cnn"})
    if any(k.startswith(("a2c_network.actor_cnn.", "a2c_network.rnn.", "a2c_network.a_rnn.")) for k in sd) or others:
        found = sorted({".".join(k.split(".")[:2]) for k in sd if k.startswith("a2c_network.")})
        raise BadModelError(f"{what}'s model holds {', '.join(found)}: policyport reads rl_games' MLP actor-critic "
                            "(actor_mlp, mu/sigma or logits, value); CNN, RNN and D2RL networks are not read")
    numbered: dict[int, set[str]] = {}
    for name in sd:
        m = re.fullmatch(r"a2c_network\.actor_mlp\.(\d+)\.(weight|bias)", name)
        if m:
            numbered.setdefault(int(m[1]), set()).add(m[2])
    layers = [linear_layer(sd, f"a2c_network.actor_mlp.{i}", what) for i in sorted(numbered)]
    if any(i % 2 for i in numbered):
        raise BadModelError(f"{what}: actor_mlp holds parameters at odd indices ({sorted(numbered)}), where rl_games "
                            "puts the activations: a normalisation layer (layer_norm, batch_norm) is not read")
    continuous = "a2c_network.mu.weight" in sd
    if not continuous and "a2c_network.logits.weight" not in sd:
        raise BadModelError(f"{what}'s model has neither a2c_network.mu (continuous actions) nor a2c_network.logits "
                            "(discrete); a multi-discrete or central-value network is not read")
    head = linear_layer(sd, "a2c_network.mu" if continuous else "a2c_network.logits", what)
    chain = [*layers, head]
    for (wa, a, _, _), (wb, b, _, _) in zip(chain, chain[1:]):
        if a.shape[0] != b.shape[1]:
            raise BadModelError(f"{what}: {wa} outputs {a.shape[0]} features but {wb} takes {b.shape[1]}")
    layout = Layout(layers, head, continuous)
    if continuous:
        if "a2c_network.sigma" in sd:
            sigma = sd["a2c_network.sigma"]
            if sigma.shape != (layout.actions,):
                raise BadModelError(f"{what}: a2c_network.sigma has shape {sigma.shape}, mu outputs {layout.actions}")
            layout.sigma = ("a2c_network.sigma", sigma)
        elif "a2c_network.sigma.weight" in sd:
            layout.sigma_layer = linear_layer(sd, "a2c_network.sigma", what)
        else:
            raise BadModelError(f"{what}'s model has a2c_network.mu but no a2c_network.sigma")
    for role in ("running_mean", "running_var", "count"):
        name = f"running_mean_std.{role}"
        if name in sd:
            layout.normalizer[role] = (name, sd[name])
    if layout.normalizer:
        if set(layout.normalizer) != {"running_mean", "running_var", "count"}:
            raise BadModelError(f"{what}: running_mean_std lacks {({'running_mean', 'running_var', 'count'} - set(layout.normalizer)).pop()}")
        for role in ("running_mean", "running_var"):
            name, array = layout.normalizer[role]
            if array.shape != (layout.obs_dim,):
                raise BadModelError(f"{what}: {name} has shape {array.shape}; the actor reads {layout.obs_dim} observations "
                                    "(a per-channel or dict normaliser is not read)")
    used = {n for layer in chain for n in (layer[0], layer[2])} | {n for n, _ in layout.normalizer.values()}
    used |= {layout.sigma[0]} if layout.sigma else set()
    used |= {layout.sigma_layer[0], layout.sigma_layer[2]} if layout.sigma_layer else set()
    layout.left_out = sorted(k for k in sd if k not in used)
    return layout


# ---------------------------------------------------------------- the run's configuration


@dataclass
class RunConfig:
    """What the run's configuration says (``None``: not said), and where it was read."""

    path: Path
    activation: str | None = None
    mu_activation: str | None = None
    sigma_activation: str | None = None
    model: str | None = None
    clip_actions: bool | None = None
    normalize_input: bool | None = None


def find_run_config(checkpoint: Path) -> Path | None:
    """The run configuration of ``checkpoint`` (``<run>/nn/<name>.pth``): ``<run>/params/agent.yaml``
    (Isaac Lab's ``train.py``, ``dump_yaml(os.path.join(log_dir, "params", "agent.yaml"), agent_cfg)``) or
    ``<run>/config.yaml`` (IsaacGymEnvs' ``train.py`` writes the Hydra config there), looked for in the
    checkpoint's folder and the one above it; ``None`` when there is none."""
    for folder in (checkpoint.parent, checkpoint.parent.parent):
        for candidate in (folder / "params" / "agent.yaml", folder / "config.yaml"):
            if candidate.is_file():
                return candidate
    return None


def read_run_config(checkpoint: Path) -> RunConfig | None:
    """The network's settings from the run configuration (:func:`find_run_config`): the rl_games
    ``params`` (top level in Isaac Lab's agent.yaml, under ``train`` in IsaacGymEnvs' config.yaml)."""
    from ..readers.checkpoints import lookup, read_yaml

    path = find_run_config(checkpoint)
    if path is None:
        return None
    document = read_yaml(path)
    params = lookup(document, "params") or lookup(document, "train", "params")
    if not isinstance(params, dict):
        return None
    config = RunConfig(path)

    def text(value):
        return None if value is None else str(value)

    config.activation = text(lookup(params, "network", "mlp", "activation"))
    config.mu_activation = text(lookup(params, "network", "space", "continuous", "mu_activation"))
    config.sigma_activation = text(lookup(params, "network", "space", "continuous", "sigma_activation"))
    config.model = text(lookup(params, "model", "name"))
    clip = lookup(params, "config", "clip_actions")
    config.clip_actions = None if clip is None else bool(clip)
    normalize = lookup(params, "config", "normalize_input")
    config.normalize_input = None if normalize is None else bool(normalize)
    return config


def _activation(name: str, where: str):
    key = str(name).lower()
    if key not in ACTIVATIONS:
        raise BadModelError(f"{where} names the activation {name!r}, which rl_games does not build "
                            f"({', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[key]


# ---------------------------------------------------------------- the graph


@dataclass
class Plan:
    """What the graph computes beyond the arrays: the hidden and mu activations, whether sigma is a
    log std, and the action mapping's bounds (``None``: the action is ``mu``)."""

    activation: object
    mu_activation: object
    log_sigma: bool = True
    bounds: tuple[np.ndarray, np.ndarray] | None = None


def _build(layout: Layout, plan: Plan, opset: int, metadata: dict[str, str]):
    import onnx

    from ..build import Dense, MlpBuilder, add_running_mean_std, policy_model

    helper, f32 = onnx.helper, np.float32
    b = MlpBuilder(opset, np.dtype(f32))
    FLOAT, const = onnx.TensorProto.FLOAT, b.scalar
    x = "obs"
    if layout.normalizer:
        # RunningMeanStd.forward: (x - mean.float()) / sqrt(var.float() + eps), clamped to [-5, 5]
        x = add_running_mean_std(b, x, layout.normalizer, "running_mean_std", NORMALIZER_EPS, NORMALIZER_CLIP)
    hidden, logits, outputs = add_actor(b, layout, x, plan.activation, next_module)
    n = layout.actions
    if layout.continuous:
        mu = logits if plan.mu_activation is None else b.activation(plan.mu_activation, logits, "mu")
        if plan.bounds is None:
            b.node("Identity", [mu], "action")
        else:  # rescale_actions(low, high, clamp(mu, -1, 1)) = clamp(mu, -1, 1) * d + m
            low, high = plan.bounds
            clamped = b.node("Clip", [mu, const(-1.0, "action/clip_min"), const(1.0, "action/clip_max")], "action/clamped")
            scaled = b.node("Mul", [clamped, const((high - low) / f32(2.0), "action/half_range")], "action/scaled")
            b.node("Add", [scaled, const((high + low) / f32(2.0), "action/center")], "action")
        outputs.append(helper.make_tensor_value_info("action", FLOAT, ["batch", n]))
        if layout.sigma is not None:
            name, array = layout.sigma
            sigma = b.node("Expand", [b.initializer(array, name, name), b.node("Shape", [logits], "sigma/batch_shape")],
                           "sigma")
        else:
            swname, sw, sbname, sbias = layout.sigma_layer
            sigma = b.dense(Dense("a2c_network.sigma", sw, swname, sbias, sbname, "out_in"), hidden, "sigma")
        if plan.log_sigma:
            b.node("Identity", [sigma], "log_std")
            b.node("Exp", ["log_std"], "std")
        else:
            b.node("Identity", [sigma], "std")
            b.node("Log", ["std"], "log_std")
        outputs += [helper.make_tensor_value_info("std", FLOAT, ["batch", n]),
                    helper.make_tensor_value_info("log_std", FLOAT, ["batch", n])]
    graph_input = helper.make_tensor_value_info("obs", FLOAT, ["batch", layout.obs_dim])
    head = "categorical" if not layout.continuous else "clipped-diag-gaussian" if plan.bounds is not None else "diag-gaussian"
    return policy_model(b, [graph_input], outputs, {"policyport.head": head, **metadata})


def normalize(layout: Layout, obs: np.ndarray) -> np.ndarray:
    """``RunningMeanStd.forward`` in eval mode, in numpy float32 (see the module docstring)."""
    f32 = np.float32
    mean = layout.normalizer["running_mean"][1].astype(f32)
    var = layout.normalizer["running_var"][1].astype(f32)
    y = (np.asarray(obs, f32) - mean) / np.sqrt(var + f32(NORMALIZER_EPS))
    return np.clip(y, f32(-NORMALIZER_CLIP), f32(NORMALIZER_CLIP))


def reference_forward(layout: Layout, plan: Plan, obs: np.ndarray) -> dict[str, np.ndarray]:
    """rl_games' model and player in numpy float32, in rl_games' order of operations; tensors named
    as the graph names them."""
    f32 = np.float32
    out: dict[str, np.ndarray] = {}
    x = np.asarray(obs, f32)
    if layout.normalizer:
        x = out["running_mean_std"] = normalize(layout, x)
    hidden, logits = actor_reference(layout, x, plan.activation, out)
    if not layout.continuous:
        return out
    mu = logits if plan.mu_activation is None else plan.mu_activation.reference(logits).astype(f32)
    if plan.bounds is None:
        out["action"] = mu
    else:
        low, high = plan.bounds
        out["action"] = np.clip(mu, f32(-1), f32(1)) * ((high - low) / f32(2.0)) + (high + low) / f32(2.0)
    if layout.sigma is not None:
        sigma = np.broadcast_to(layout.sigma[1], mu.shape).copy()
    else:
        _, sw, _, sb = layout.sigma_layer
        sigma = hidden @ sw.T + sb
    if plan.log_sigma:
        out["log_std"], out["std"] = sigma, np.exp(sigma)
    else:
        out["std"], out["log_std"] = sigma, np.log(sigma)
    return out


def convert_rl_games(source, options):
    """Convert an rl_games ``.pth`` checkpoint (see the module docstring) to ONNX.

    Args:
        source: the checkpoint's path.
        options: a :class:`~policyport.converter.ConvertOptions`: ``activation`` (required when no run
            configuration lies where Isaac Lab or IsaacGymEnvs writes it; must agree with it when one
            does), ``action_bounds`` (the environment's action space, for the player's ``clip_actions``
            mapping), ``opset``.

    Returns:
        A :class:`~policyport.converter.Converted`: input ``obs`` (float32, ``(batch, obs_dim)``, raw
        observations), outputs ``logits`` (``mu``'s affine output, or the discrete logits), ``action``
        (the player's deterministic action), ``std`` and ``log_std`` for continuous actions;
        initializers under rl_games' keys (``a2c_network.mu.weight``, ``running_mean_std.running_mean``
        in float64 ...); the reference is rl_games' forward rebuilt in numpy.

    Raises:
        UnreadableFileError: not a torch zip holding a dict.
        BadModelError: a network this reader does not read (CNN, RNN, normalisation layers).
        OptionError: no activation anywhere; one that contradicts the run configuration; action bounds
            for a discrete policy or for a run whose configuration turns ``clip_actions`` off.
    """
    from ...io.kinds import sha256_file
    from ..activations import choose_activation, parse_activation, required_activation
    from ..assumptions import activation_assumption, joined, reconstruction
    from ..options import Converted
    from ..readers.checkpoints import read_checkpoint

    path = Path(os.fspath(source))
    what = str(path)
    layout = read_layout(read_checkpoint(path, "rl_games"), what)
    config = read_run_config(path)
    where = str(config.path) if config else what
    recorded = _activation(config.activation, where) if config and config.activation else None
    hidden = [f"a2c_network.actor_mlp.{int(w.rsplit('.', 2)[1]) + 1}" for w, *_ in layout.layers]
    activation_name, notes = choose_activation(options.activation, recorded, where)
    if activation_name is None:
        activation_name = required_activation(None, f"{what} (an rl_games checkpoint)", hidden,
                                              "rl_games' configs for Isaac Gym and Isaac Lab use elu, and the run writes "
                                              "it to params/agent.yaml or config.yaml, neither of which lies beside "
                                              "this checkpoint")
    act = parse_activation(activation_name)
    assumptions: list[Assumption] = []
    if hidden:
        if recorded is not None:
            assumptions.append(Assumption("activation", f"{activation_name} at {joined(hidden)}",
                                          f"read from {config.path}; the checkpoint does not record it",
                                          "--activation must agree with it"))
        else:
            assumptions.append(activation_assumption([(h, activation_name) for h in hidden], f"{what} (rl_games)",
                                                     "no run configuration (params/agent.yaml, config.yaml) lies beside it"))
    mu_name = config.mu_activation if config and config.mu_activation else "None"
    mu_act = parse_activation(_activation(mu_name, where))
    log_sigma = True
    plan_bounds = None
    if layout.continuous:
        if config is None or config.mu_activation is None:
            assumptions.append(Assumption("head", "mu as a2c_network.mu outputs it (mu_activation None), sigma a log std "
                                          "(continuous_a2c_logstd)", "rl_games' shipped configs all say so; the "
                                          "checkpoint records neither, and no run configuration says otherwise"))
        model_name = (config.model if config else None) or "continuous_a2c_logstd"
        if model_name not in ("continuous_a2c_logstd", "continuous_a2c"):
            raise BadModelError(f"{where} names the model {model_name!r}; policyport reads continuous_a2c_logstd and "
                                "continuous_a2c")
        log_sigma = model_name == "continuous_a2c_logstd"
        sigma_name = config.sigma_activation if config and config.sigma_activation else "None"
        if _activation(sigma_name, where) != "linear":
            raise BadModelError(f"{where} names sigma_activation {sigma_name!r}; policyport reads sigma as it is (None)")
        clip = config.clip_actions if config and config.clip_actions is not None else True
        if options.action_bounds is not None:
            if not clip:
                raise OptionError(f"--action-bounds gives the bounds the player's clip_actions maps the action to, but "
                                  f"{config.path} turns clip_actions off: the player's action is mu as it is")
            plan_bounds = action_bounds(options.action_bounds, layout.actions, what)
            low, high = plan_bounds
            assumptions.append(Assumption(
                "action bounds", f"low {shown(low)}, high {shown(high)}: action = clamp(mu, -1, 1) rescaled to them",
                "given by --action-bounds; the player's clip_actions "
                + (f"(on in {config.path})" if config and config.clip_actions is not None else "(its default, on)")
                + " maps the action to the environment's action space, which the checkpoint does not record",
                "leave --action-bounds out for mu as it is"))
        elif clip:
            assumptions.append(Assumption(
                "action bounds", "none: action = mu as the network outputs it",
                "the player's clip_actions " + (f"(on in {config.path})" if config and config.clip_actions is not None
                                                else "(its default, on)")
                + " clamps mu to [-1, 1] and rescales it to the environment's action space, which the checkpoint does "
                "not record", "--action-bounds LOW:HIGH builds that mapping"))
    elif options.action_bounds is not None:
        raise OptionError(f"--action-bounds maps a continuous action; {what} is a discrete policy (a2c_network.logits)")
    if not layout.normalizer:
        notes.append(f"{what} holds no running_mean_std (normalize_input was off): the policy reads the observations "
                     "as the environment gives them")
    if layout.left_out:
        notes.append(f"left out of the graph (the value function): {', '.join(layout.left_out)}")
    plan = Plan(None if act.name == "linear" else act, None if mu_act.name == "linear" else mu_act, log_sigma, plan_bounds)
    source_info = {"kind": "rl-games", "file": path.name, "sha256": sha256_file(path)}
    if config is not None:
        source_info["config"] = str(config.path)
    metadata = {"policyport.source": json.dumps(source_info), "policyport.activation": activation_name}
    if layout.normalizer:
        metadata["policyport.observation_filter"] = json.dumps(
            {"type": "RunningMeanStd", "library": "rl_games", "formula": "clip((x - mean) / sqrt(var + eps), -clip, clip)",
             "epsilon": NORMALIZER_EPS, "clip": NORMALIZER_CLIP, "count": float(layout.normalizer["count"][1])})
    if plan_bounds is not None:
        metadata["policyport.action_bounds"] = json.dumps({"low": plan_bounds[0].tolist(), "high": plan_bounds[1].tolist()})
    model = _build(layout, plan, options.opset, metadata)
    return Converted(model, lambda obs: reference_forward(layout, plan, obs), "rl-games", notes=notes,
                     assumptions=assumptions, oracle=reconstruction("the arrays of an rl_games checkpoint"))

