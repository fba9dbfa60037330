"""Tianshou ``.pt`` / ``.pth`` files: a policy's or an algorithm's ``state_dict``, alone or saved with the
environment's observation statistics.

Tianshou writes (or its users' scripts write) three kinds of file:

* ``policy_state_dict.pt`` (the high-level API's ``PolicyPersistence.Mode.POLICY_STATE_DICT``,
  ``tianshou/highlevel/persistence.py``): ``torch.save(algorithm.state_dict())``. Tianshou 2.0's
  ``Algorithm`` holds the policy as ``policy``, so the actor's keys start ``policy.actor.``;
  ``Algorithm.state_dict`` adds ``_optimizers``, a list of the optimizers' states. A 1.x policy's
  ``state_dict`` (``PPOPolicy`` held the actor itself) starts ``actor.``.
* ``policy.pth`` in the MuJoCo examples (``examples/mujoco/mujoco_ppo.py``, ``save_best_fn``):
  ``torch.save({"model": <that state_dict>, "obs_rms": train_envs.get_obs_rms()})``, ``obs_rms``
  being a pickled ``tianshou.utils.statistics.RunningMeanStd`` object (``mean``, ``var`` float64,
  ``count``, ``clip_max``, ``eps``), read here as an inert record: nothing from it runs.
* ``policy.pt`` (the high-level API's default mode ``POLICY``): ``torch.save(algorithm)``, the whole
  pickled object, which unpickling runs code to rebuild: refused without ``--trust``; with it, loaded
  with ``torch.load`` and read through its ``state_dict()``, the activation modules, the policy's
  ``action_bound_method`` and ``action_scaling`` bounds read from the object (:class:`Recorded`).

The actor, as ``tianshou/utils/net/continuous.py`` (``ContinuousActorProbabilistic``, 1.x's
``ActorProb``) and ``discrete.py`` (``DiscreteActor``) build it around a ``common.Net``:

* ``actor.preprocess.model.model.{0,2,...}.{weight,bias}``: the ``Net``'s ``MLP``, a ``Linear`` then
  the activation module per hidden layer (``miniblock``), so odd indices are the activations (ReLU by
  default; the MuJoCo examples use Tanh; the file does not say which);
* continuous: ``actor.mu.model.0.*`` (the ``MLP`` head, one ``Linear``), and ``actor.sigma_param``
  (A, 1), a log std, or with ``conditioned_sigma`` ``actor.sigma.model.0.*`` whose output is
  clamped to [-20, 2] before ``exp``; discrete: ``actor.last.model.0.*`` (softmax of it with
  ``softmax_output``, the default: the argmax is the same).

What the policy computes, as Tianshou computes it:

* the observation normaliser, applied by the environment wrapper (``VectorEnvNormObs``,
  ``tianshou/env/venv_wrappers.py``) with ``RunningMeanStd.norm`` (``tianshou/utils/statistics.py``):
  ``clip((x - mean) / sqrt(var + eps), -clip_max, clip_max)``, in float64 (numpy, float64 statistics),
  ``eps`` = ``np.finfo(np.float32).eps`` (1.19e-7) and ``clip_max`` = 10 by default, both read from
  the pickled object; the actor then reads the result as float32 (``MLP.forward``'s
  ``torch.as_tensor(obs, dtype=torch.float32)``);
* ``mu`` = ``actor.mu`` of the hidden features (an actor built with ``unbounded=True``, as every
  Tianshou example and the high-level API build it);
* the deterministic action (``ProbabilisticActorPolicy.forward`` with ``deterministic_eval``: the
  distribution's mode, ``mu``; ``tianshou/algorithm/modelfree/reinforce.py``), then
  ``Policy.map_action`` (``tianshou/algorithm/algorithm_base.py``): ``action_bound_method``
  ``"clip"`` -> ``clip(a, -1, 1)``, ``"tanh"`` -> ``tanh(a)``, ``None`` -> ``a``; then with
  ``action_scaling`` ``low + (high - low) * (a + 1) / 2`` in float32, the bounds being the
  environment's action space. Neither the bound method nor the bounds are in the file:
  ``--action-bound-method`` is required (``clip`` and ``tanh`` are both common), ``--action-bounds``
  builds the scaling. An actor built with ``unbounded=False`` (``max_action`` 1) computes
  ``tanh(mu)`` itself; with ``clip`` its action is the one ``--action-bound-method tanh`` gives.
  A discrete policy's deterministic action is the argmax.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import BadModelError, OptionError, OptionNeeded, TrustRequiredError, UnreadableFileError
from ..assumptions import Assumption
from ..action_bounds import action_bounds, shown
from .actor import ActorLayout, actor_reference, add_actor, next_module

#: ``RunningMeanStd``'s defaults (``tianshou/utils/statistics.py``): ``epsilon=np.finfo(np.float32).eps``
#: added to the variance, ``clip_max=10.0``; a pickled object records its own.
NORMALIZER_EPS = float(np.finfo(np.float32).eps)
NORMALIZER_CLIP = 10.0
#: ``ContinuousActorProbabilistic``'s clamp of a conditioned sigma's log before ``exp``.
SIGMA_MIN, SIGMA_MAX = -20.0, 2.0
#: Where the actor sits in the state_dicts Tianshou writes: an algorithm's (2.x), a policy's (1.x).
ACTOR_PREFIXES = ("policy.actor.", "actor.")
#: ``action_bound_method`` values (``Policy.__init__``), ``none`` for ``None``.
BOUND_METHODS = ("clip", "tanh", "none")
#: A key of the actor's hidden layers and of its head, as the pickle of a Tianshou file names them.
_FIRST_LAYER = "preprocess.model.model.0.weight"
_HEADS = ("mu.model.0.weight", "last.model.0.weight")


@dataclass
class Layout(ActorLayout):
    """A Tianshou actor (:class:`~.actor.ActorLayout`): ``layers`` are the preprocess ``Net``'s, ``head``
    is ``mu.model.0`` or ``last.model.0``, ``sigma`` is ``sigma_param`` (A, 1), ``sigma_layer`` a
    conditioned sigma's ``sigma.model.0``, ``normalizer`` the saved ``obs_rms``'s ``mean``, ``var``,
    ``count``, ``left_out`` the critic and the optimizers' states.

    Attributes:
        eps, clip: the ``obs_rms`` object's ``eps`` and ``clip_max`` (``None``: no clip).
    """

    eps: float = NORMALIZER_EPS
    clip: float | None = NORMALIZER_CLIP


def is_tianshou_file(path: Path) -> bool:
    """Whether ``path`` is a torch zip whose pickle names a Tianshou actor's keys (a state_dict, alone
    or under ``model``) or a Tianshou class (a whole pickled algorithm or policy), read from the
    pickle's opcodes without unpickling anything."""
    from ..readers.checkpoints import pickled_class_names, pickled_strings

    strings = pickled_strings(path)
    if any(s.endswith("actor." + _FIRST_LAYER) for s in strings) and \
            any(s.endswith(tuple("actor." + h for h in _HEADS)) for s in strings):
        return True
    return _pickles_tianshou_object(pickled_class_names(path))


def _pickles_tianshou_object(globals_named) -> bool:
    return any(g.startswith("tianshou.") and not g.startswith("tianshou.utils.statistics.") for g in globals_named)


def _numbered(sd: dict, prefix: str) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    for name in sd:
        m = re.fullmatch(re.escape(prefix) + r"\.(\d+)\.(\w+)", name)
        if m:
            found.setdefault(int(m[1]), set()).add(m[2])
    return found


def read_layout(saved: dict, what: str) -> Layout:
    """Place the actor's arrays of a Tianshou file (a state_dict, or ``{"model", "obs_rms"}``).

    Args:
        saved: what :func:`~policyport.converter.readers.checkpoints.read_checkpoint` read.
        what: the file, for messages.

    Raises:
        BadModelError: no actor (``actor.preprocess``, ``actor.mu`` or ``actor.last``); normalisation
            layers or hidden layers in the head; layers that do not chain; an ``obs_rms`` that is not
            a ``RunningMeanStd`` of the actor's width.
    """
    from ..readers.checkpoints import linear_layer

    obs_rms = None
    if "model" in saved and isinstance(saved["model"], dict):
        obs_rms = saved.get("obs_rms")
        saved = saved["model"]
    sd = {k: v for k, v in saved.items() if isinstance(v, np.ndarray)}
    prefix = next((p for p in ACTOR_PREFIXES if p + _FIRST_LAYER in sd), None)
    if prefix is None:
        raise BadModelError(f"{what} holds no Tianshou actor ({' or '.join(p + _FIRST_LAYER for p in ACTOR_PREFIXES)}); "
                            "policyport reads the actor of Tianshou's policy-gradient algorithms (PPO, A2C, REINFORCE, "
                            "NPG, TRPO) and discrete actors")
    hidden = _numbered(sd, prefix + "preprocess.model.model")
    if any(i % 2 or parts != {"weight", "bias"} for i, parts in hidden.items()) or \
            sorted(hidden) != list(range(0, 2 * len(hidden), 2)):
        raise BadModelError(f"{what}: {prefix}preprocess.model.model holds parameters at {sorted(hidden)}; a Net of "
                            "Linear layers and activations has them at 0, 2, 4 ... (a norm_layer or a dueling Net is not read)")
    layers = [linear_layer(sd, f"{prefix}preprocess.model.model.{i}", what) for i in sorted(hidden)]
    continuous = prefix + "mu.model.0.weight" in sd
    head_scope = prefix + ("mu.model" if continuous else "last.model")
    if not continuous and head_scope + ".0.weight" not in sd:
        raise BadModelError(f"{what} has {prefix}preprocess but neither {prefix}mu (a continuous actor) nor {prefix}last "
                            "(a discrete actor); SAC, DDPG, TD3 and DQN networks are not read")
    if set(_numbered(sd, head_scope)) != {0}:
        raise BadModelError(f"{what}: {head_scope} has hidden layers ({sorted(_numbered(sd, head_scope))}); policyport "
                            "reads the head Tianshou builds by default, one Linear (hidden_sizes=())")
    head = linear_layer(sd, head_scope + ".0", what)
    chain = [*layers, head]
    for (wa, a, _, _), (wb, b, _, _) in zip(chain, chain[1:]):
        if a.shape[0] != b.shape[1]:
            raise BadModelError(f"{what}: {wa} outputs {a.shape[0]} features but {wb} takes {b.shape[1]}")
    layout = Layout(layers, head, continuous)
    if continuous:
        if prefix + "sigma_param" in sd:
            sigma = sd[prefix + "sigma_param"]
            if sigma.shape != (layout.actions, 1):
                raise BadModelError(f"{what}: {prefix}sigma_param has shape {sigma.shape}; mu outputs {layout.actions} "
                                    f"(Tianshou's is ({layout.actions}, 1))")
            layout.sigma = (prefix + "sigma_param", sigma)
        elif prefix + "sigma.model.0.weight" in sd:
            if set(_numbered(sd, prefix + "sigma.model")) != {0}:
                raise BadModelError(f"{what}: {prefix}sigma.model has hidden layers; policyport reads one Linear")
            layout.sigma_layer = linear_layer(sd, prefix + "sigma.model.0", what)
        else:
            raise BadModelError(f"{what} has {prefix}mu but neither {prefix}sigma_param nor {prefix}sigma")
    if obs_rms is not None:
        _read_obs_rms(layout, obs_rms, what)
    used = {n for layer in chain for n in (layer[0], layer[2])}
    used |= {layout.sigma[0]} if layout.sigma else set()
    used |= {layout.sigma_layer[0], layout.sigma_layer[2]} if layout.sigma_layer else set()
    layout.left_out = sorted(k for k in saved if k not in used)
    return layout


def _read_obs_rms(layout: Layout, obs_rms, what: str) -> None:
    """The statistics of a pickled ``RunningMeanStd`` (an inert record: its pickled ``__dict__``)."""
    state = getattr(obs_rms, "state", None)
    name = getattr(obs_rms, "global_name", type(obs_rms).__name__)
    if not isinstance(state, dict) or not {"mean", "var"} <= set(state):
        raise BadModelError(f"{what}'s obs_rms is a {name}, not the RunningMeanStd (mean, var, count, clip_max, eps) "
                            "Tianshou's VectorEnvNormObs keeps")
    for role in ("mean", "var", "count"):
        value = state.get(role, 0)
        array = value if isinstance(value, np.ndarray) else np.asarray(value)  # count: a Python int or float
        if array.dtype.kind not in "fiu":
            raise BadModelError(f"{what}: obs_rms.{role} is {type(value).__name__}, not a number or an array")
        if role != "count" and array.shape not in ((), (layout.obs_dim,)):
            raise BadModelError(f"{what}: obs_rms.{role} has shape {array.shape}; the actor reads {layout.obs_dim} "
                                "observations")
        layout.normalizer[role] = (f"obs_rms.{role}", array)
    eps, clip = state.get("eps", NORMALIZER_EPS), state.get("clip_max", NORMALIZER_CLIP)
    if not isinstance(eps, (int, float)) or (clip is not None and not isinstance(clip, (int, float))):
        raise BadModelError(f"{what}: obs_rms.eps ({eps!r:.40}) or obs_rms.clip_max ({clip!r:.40}) is not a number")
    layout.eps, layout.clip = float(eps), (float(clip) if clip else None)


# ---------------------------------------------------------------- the graph


@dataclass
class Plan:
    """What the graph computes beyond the arrays: the hidden activation, ``action_bound_method``
    (``"clip"``, ``"tanh"`` or ``"none"``) and the scaling's bounds (``None``: no scaling)."""

    activation: object
    bound: str = "clip"
    bounds: tuple[np.ndarray, np.ndarray] | None = None


def _build(layout: Layout, plan: Plan, opset: int, metadata: dict[str, str]):
    import onnx

    from ..build import Dense, MlpBuilder, policy_model

    helper, f32 = onnx.helper, np.float32
    b = MlpBuilder(opset, np.dtype(f32))
    FLOAT, DOUBLE = onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE

    def const(value, name, dtype=f32):
        return b.initializer(np.asarray(value, dtype), name)

    x = "obs"
    if layout.normalizer:
        # RunningMeanStd.norm in numpy float64, then MLP.forward's float32 tensor
        names = {role: b.initializer(array, name, name) for role, (name, array) in layout.normalizer.items()}
        x64 = b.node("Cast", [x], "obs_rms/obs_float64", to=DOUBLE)
        mean, var = names["mean"], names["var"]
        if layout.normalizer["mean"][1].dtype != np.float64:
            mean = b.node("Cast", [mean], "obs_rms/mean_float64", to=DOUBLE)
        if layout.normalizer["var"][1].dtype != np.float64:
            var = b.node("Cast", [var], "obs_rms/var_float64", to=DOUBLE)
        std = b.node("Sqrt", [b.node("Add", [var, const(layout.eps, "obs_rms/eps", np.float64)], "obs_rms/var_plus_eps")],
                     "obs_rms/std")
        y = b.node("Div", [b.node("Sub", [x64, mean], "obs_rms/centered"), std], "obs_rms/scaled")
        if layout.clip:
            y = b.node("Clip", [y, const(-layout.clip, "obs_rms/clip_min", np.float64),
                                const(layout.clip, "obs_rms/clip_max", np.float64)], "obs_rms/clipped")
        x = b.node("Cast", [y], "obs_rms", to=FLOAT)
    hidden, logits, outputs = add_actor(b, layout, x, plan.activation, next_module)
    n = layout.actions
    if layout.continuous:
        a = logits
        if plan.bound == "clip":
            a = b.node("Clip", [a, const(-1.0, "action/clip_min"), const(1.0, "action/clip_max")], "action/bounded")
        elif plan.bound == "tanh":
            a = b.node("Tanh", [a], "action/bounded")
        if plan.bounds is None:
            b.node("Identity", [a], "action")
        else:  # map_action: low + (high - low) * (a + 1.0) / 2.0, in float32
            low, high = plan.bounds
            shifted = b.node("Add", [a, const(1.0, "action/one")], "action/shifted")
            spread = b.node("Mul", [const(high - low, "action/range"), shifted], "action/spread")
            half = b.node("Div", [spread, const(2.0, "action/two")], "action/half")
            b.node("Add", [const(low, "action/low"), half], "action")
        outputs.append(helper.make_tensor_value_info("action", FLOAT, ["batch", n]))
        if layout.sigma is not None:
            name, array = layout.sigma
            column = b.node("Reshape", [b.initializer(array, name, name), const(np.array([1, -1]), "sigma/row", np.int64)],
                            "sigma/row_of_log_std")
            # sigma_param.view(1, -1) + zeros_like(mu): the row repeated for each observation
            log_std = b.node("Expand", [column, b.node("Shape", [logits], "sigma/batch_shape")], "log_std")
        else:
            swname, sw, sbname, sbias = layout.sigma_layer
            raw = b.dense(Dense(swname.rsplit(".", 1)[0], sw, swname, sbias, sbname, "out_in"), hidden)
            log_std = b.node("Clip", [raw, const(SIGMA_MIN, "sigma/min"), const(SIGMA_MAX, "sigma/max")], "log_std")
        b.node("Exp", [log_std], "std")
        outputs += [helper.make_tensor_value_info("std", FLOAT, ["batch", n]),
                    helper.make_tensor_value_info("log_std", FLOAT, ["batch", n])]
    graph_input = helper.make_tensor_value_info("obs", FLOAT, ["batch", layout.obs_dim])
    head = "categorical" if not layout.continuous else "diag-gaussian"
    return policy_model(b, [graph_input], outputs, {"policyport.head": head, **metadata})


def normalize(layout: Layout, obs: np.ndarray) -> np.ndarray:
    """``RunningMeanStd.norm`` in numpy float64, then float32 as the actor reads it (see the module
    docstring); ``obs`` float array, shape ``(batch, obs_dim)``; returns float32, same shape."""
    mean = layout.normalizer["mean"][1].astype(np.float64)
    var = layout.normalizer["var"][1].astype(np.float64)
    y = (np.asarray(obs, np.float64) - mean) / np.sqrt(var + layout.eps)
    if layout.clip:
        y = np.clip(y, -layout.clip, layout.clip)
    return y.astype(np.float32)


def reference_forward(layout: Layout, plan: Plan, obs: np.ndarray) -> dict[str, np.ndarray]:
    """Tianshou's normaliser, actor and ``map_action`` in numpy, in Tianshou's order of operations;
    tensors named as the graph names them."""
    f32 = np.float32
    out: dict[str, np.ndarray] = {}
    x = np.asarray(obs, f32)
    if layout.normalizer:
        x = out["obs_rms"] = normalize(layout, obs)
    hidden, logits = actor_reference(layout, x, plan.activation, out)
    if not layout.continuous:
        return out
    a = {"clip": lambda v: np.clip(v, f32(-1), f32(1)), "tanh": np.tanh, "none": lambda v: v}[plan.bound](logits)
    if plan.bounds is not None:
        low, high = plan.bounds
        a = low + (high - low) * (a + f32(1.0)) / f32(2.0)
    out["action"] = a
    if layout.sigma is not None:
        log_std = np.broadcast_to(layout.sigma[1].reshape(1, -1), logits.shape).astype(f32)
    else:
        _, sw, _, sb = layout.sigma_layer
        log_std = np.clip(hidden @ sw.T + sb, f32(SIGMA_MIN), f32(SIGMA_MAX))
    out["log_std"], out["std"] = log_std, np.exp(log_std)
    return out


@dataclass
class Recorded:
    """What a whole pickled Tianshou object (read with ``--trust``) records that a state_dict does not:
    the hidden activation, the policy's ``action_bound_method`` (``"none"`` for ``None``), and with
    ``action_scaling`` the action space's bounds (float32, shape ``(A,)``); ``None`` where it says nothing."""

    activation: str | None = None
    bound: str | None = None
    bounds: tuple[np.ndarray, np.ndarray] | None = None


def _recorded(loaded, what: str) -> Recorded:
    """Read :class:`Recorded` from a live algorithm or policy (``Policy.action_bound_method``,
    ``action_scaling``, ``action_space``; the actor's activation modules and ``_unbounded``)."""
    from ..activations import TORCH_ACTIVATIONS, TORCH_DEFAULTS

    policy = getattr(loaded, "policy", loaded)
    actor = getattr(policy, "actor", None)
    recorded = Recorded()
    names = set()
    for module in getattr(getattr(getattr(actor, "preprocess", None), "model", None), "model", []):
        kind = type(module).__name__
        if kind == "Linear":
            continue
        entry = TORCH_ACTIVATIONS.get(kind)
        if entry is None or any(getattr(module, p, None) != TORCH_DEFAULTS[p] for p in entry[1] if p in TORCH_DEFAULTS):
            raise BadModelError(f"{what}'s actor has a {kind} module in its Net; policyport reads Linear layers and "
                                f"one activation of its own ({', '.join(TORCH_ACTIVATIONS)} with torch's defaults)")
        names.add(f"leaky_relu:{module.negative_slope}" if kind == "LeakyReLU" else entry[0])
    if len(names) > 1:
        raise BadModelError(f"{what}'s actor mixes activations ({', '.join(sorted(names))}); policyport reads one")
    recorded.activation = names.pop() if names else None
    if getattr(actor, "_unbounded", True) is False:
        raise BadModelError(f"{what}'s actor was built with unbounded=False (mu = max_action * tanh(.)); policyport reads "
                            "unbounded actors, as Tianshou's examples and high-level API build them")
    low, high = getattr(getattr(policy, "action_space", None), "low", None), getattr(getattr(policy, "action_space", None), "high", None)
    if low is not None and high is not None:  # a Box: continuous actions
        method = getattr(policy, "action_bound_method", None)
        recorded.bound = "none" if method is None else str(method)
        if getattr(policy, "action_scaling", False):
            recorded.bounds = (np.asarray(low, np.float32).reshape(-1), np.asarray(high, np.float32).reshape(-1))
    return recorded


def _read(path: Path, trust: bool) -> tuple[dict, Recorded | None]:
    """The file's dict (see the module docstring), and what a whole pickled algorithm or policy records
    (read only with ``trust``; ``None`` for a state_dict)."""
    from ..readers.checkpoints import pickled_class_names, pickled_strings, read_checkpoint

    holds_keys = any(s.endswith("actor." + _FIRST_LAYER) for s in pickled_strings(path))
    if not holds_keys and _pickles_tianshou_object(pickled_class_names(path)):
        if not trust:
            raise TrustRequiredError(
                f"{path} is a whole pickled Tianshou object (torch.save of an algorithm or policy, the high-level API's "
                "policy.pt), and unpickling it runs code the file names. policyport refused it without loading it "
                "(nothing from it ran); if you trust it, pass --trust (trust=True), or convert the policy_state_dict.pt "
                "that PolicyPersistence.Mode.POLICY_STATE_DICT writes")
        from ...errors import require

        torch = require("torch", "torch", f"loading the whole pickled Tianshou object {path}")
        try:
            loaded = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # noqa: BLE001 - whatever the user's pickle raises
            raise UnreadableFileError(f"{path}: torch.load failed ({type(e).__name__}: {e}); unpickling a Tianshou "
                                      "object needs tianshou installed") from e
        if not hasattr(loaded, "state_dict"):
            raise BadModelError(f"{path} holds a {type(loaded).__name__}, not a Tianshou algorithm or policy")
        arrays = {k: v.detach().cpu().numpy() for k, v in loaded.state_dict().items() if isinstance(v, torch.Tensor)}
        return arrays, _recorded(loaded, str(path))
    return read_checkpoint(path, "Tianshou"), None


def _recorded_mapping(recorded: Recorded, options, layout: Layout, what: str):
    """``(bound method, bounds)`` of a trusted object: its own, which options given must agree with.

    Raises:
        OptionError: ``--action-bound-method`` or ``--action-bounds`` that contradict the object.
    """
    if not layout.continuous:
        return None, None
    bound, bounds = recorded.bound or "none", recorded.bounds
    if options.action_bound_method is not None and options.action_bound_method != bound:
        raise OptionError(f"--action-bound-method {options.action_bound_method} contradicts {what}, whose policy has "
                          f"action_bound_method {bound}; leave it out to use the recorded one")
    if options.action_bounds is not None:
        given = action_bounds(options.action_bounds, layout.actions, what)
        if bounds is None or not all(np.array_equal(g, r) for g, r in zip(given, bounds)):
            raise OptionError(f"--action-bounds contradicts {what}, whose policy "
                              + ("scales no action" if bounds is None else
                                 f"scales the action to low {shown(bounds[0])}, high {shown(bounds[1])}")
                              + "; leave it out to use the recorded one")
    if bounds is not None and bounds[0].shape != (layout.actions,):
        raise BadModelError(f"{what}'s action space has {bounds[0].size} dimensions; the actor outputs {layout.actions}")
    return bound, bounds


def convert_tianshou(source, options):
    """Convert a Tianshou file (see the module docstring) to ONNX.

    Args:
        source: the file's path.
        options: a :class:`~policyport.converter.ConvertOptions`: ``activation`` (required: a state_dict
            does not record it), ``action_bound_method`` (required for a continuous policy: ``clip``,
            ``tanh`` or ``none``), ``action_bounds`` (the environment's action space, for
            ``action_scaling``), ``opset``, ``trust`` (a whole pickled object, whose own activation and
            action mapping are read; options given must agree with them).

    Returns:
        A :class:`~policyport.converter.Converted`: input ``obs`` (float32, ``(batch, obs_dim)``, raw
        observations), outputs ``logits`` (``mu``, or the discrete head's output), ``action`` (the
        policy's deterministic action after ``map_action``: float32 ``(batch, A)``, or int64
        ``(batch,)`` for a discrete policy), ``std`` and ``log_std`` for continuous actions;
        initializers under Tianshou's keys (``policy.actor.mu.model.0.weight``, ``obs_rms.mean`` in
        float64 ...); the reference is Tianshou's forward rebuilt in numpy.

    Raises:
        UnreadableFileError: not a torch zip holding a dict.
        TrustRequiredError: a whole pickled object without ``trust``.
        BadModelError: a network this reader does not read.
        OptionError: no activation; no bound method for a continuous policy; a bound method or
            action bounds for a discrete one; options that contradict a trusted object.
    """
    from ...io.kinds import sha256_file
    from ..activations import choose_activation, parse_activation, required_activation
    from ..assumptions import activation_assumption, reconstruction
    from ..options import Converted

    path = Path(os.fspath(source))
    what = str(path)
    saved, recorded = _read(path, options.trust)
    layout = read_layout(saved, what)
    prefix = layout.head[0].split("mu.model.0")[0].split("last.model.0")[0]
    hidden = [f"{prefix}preprocess.model.model.{int(w.rsplit('.', 2)[1]) + 1}" for w, *_ in layout.layers]
    assumptions: list[Assumption] = []
    if recorded is not None:  # the live object says it all: nothing assumed
        activation_name, notes = choose_activation(options.activation, recorded.activation, f"{what}'s actor")
        activation_name = activation_name or "linear"
        bound, plan_bounds = _recorded_mapping(recorded, options, layout, what)
        said = [f"activation {activation_name}"]
        if layout.continuous:
            said += [f"action_bound_method {bound}", "no action_scaling" if plan_bounds is None else
                     f"action_scaling to low {shown(plan_bounds[0])}, high {shown(plan_bounds[1])}"]
        notes.append(f"read with --trust from the pickled object itself: {', '.join(said)}")
    else:
        activation_name = required_activation(options.activation, f"{what} (a Tianshou file)", hidden,
                                              "Tianshou's Net defaults to relu and its MuJoCo examples use tanh; the "
                                              "file records neither") if hidden else "linear"
        notes = []
        if hidden:
            assumptions.append(activation_assumption([(h, activation_name) for h in hidden], f"{what} (Tianshou)",
                                                     "a state_dict records no activation modules"))
        bound = options.action_bound_method
        plan_bounds = None
    act = parse_activation(activation_name)
    if recorded is None and layout.continuous:
        if bound is None:
            raise OptionNeeded(f"{what} is a continuous Tianshou policy, whose action is mu bounded by the policy's "
                               "action_bound_method (clip to [-1, 1] by default and in the MuJoCo examples, or tanh), "
                               "which the file does not record; give --action-bound-method clip, tanh or none",
                               "action_bound_method", "none")
        if bound not in BOUND_METHODS:
            raise OptionError(f"--action-bound-method {bound!r}: choose one of {', '.join(BOUND_METHODS)}")
        bounded = {"clip": "clip(mu, -1, 1)", "tanh": "tanh(mu)", "none": "mu"}[bound]
        assumptions.append(Assumption("head", f"action_bound_method {bound}: {bounded}, mu from an unbounded actor",
                                      "given by --action-bound-method; the file records neither the policy's "
                                      "action_bound_method nor the actor's unbounded", "--action-bound-method NAME"))
        if options.action_bounds is not None:
            plan_bounds = action_bounds(options.action_bounds, layout.actions, what)
            low, high = plan_bounds
            assumptions.append(Assumption(
                "action bounds", f"low {shown(low)}, high {shown(high)}: action = low + (high - low) * ({bounded} + 1) / 2",
                "given by --action-bounds; Tianshou's action_scaling (on by default) maps the action to the "
                "environment's action space, which the file does not record", "leave --action-bounds out for no scaling"))
        else:
            assumptions.append(Assumption(
                "action bounds", f"none: action = {bounded}",
                "Tianshou's action_scaling (on by default) maps the action to the environment's action space, which "
                "the file does not record", "--action-bounds LOW:HIGH builds that mapping"))
    elif not layout.continuous:
        for given, flag in ((options.action_bound_method, "--action-bound-method"), (options.action_bounds, "--action-bounds")):
            if given is not None:
                raise OptionError(f"{flag} maps a continuous action; {what} is a discrete policy ({layout.head[0]})")
    if not layout.normalizer:
        assumptions.append(Assumption(
            "observation normalisation", "none: the policy reads the observations as the environment gives them",
            f"{what} holds no obs_rms (scripts save it beside the model as {{'model', 'obs_rms'}} when the run "
            "normalised observations with VectorEnvNormObs)"))
    if layout.left_out:
        notes.append(f"left out of the graph (the critic, the optimizers): {', '.join(layout.left_out)}")
    plan = Plan(None if act.name == "linear" else act, bound or "none", plan_bounds)
    source_info = {"kind": "tianshou", "file": path.name, "sha256": sha256_file(path)}
    metadata = {"policyport.source": json.dumps(source_info), "policyport.activation": activation_name}
    if layout.normalizer:
        metadata["policyport.observation_filter"] = json.dumps(
            {"type": "RunningMeanStd", "library": "tianshou", "formula": "clip((x - mean) / sqrt(var + eps), -clip, clip)",
             "epsilon": layout.eps, "clip": layout.clip, "count": float(layout.normalizer["count"][1])})
    if plan_bounds is not None:
        metadata["policyport.action_bounds"] = json.dumps({"low": plan_bounds[0].tolist(), "high": plan_bounds[1].tolist()})
    model = _build(layout, plan, options.opset, metadata)
    return Converted(model, lambda obs: reference_forward(layout, plan, obs), "tianshou", notes=notes,
                     assumptions=assumptions, oracle=reconstruction("the arrays of a Tianshou file"))
