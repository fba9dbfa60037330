"""Sample Factory 2.x checkpoints: ``train_dir/<experiment>/checkpoint_p<policy>/checkpoint_<step>_<env_steps>.pth``.

The learner saves ``torch.save`` of a dict (``sample_factory/algo/learning/learner.py``,
``Learner._get_checkpoint_dict``): ``train_step``, ``env_steps``, ``best_performance``, ``model`` (the
``ActorCritic``'s ``state_dict``), ``optimizer`` and ``curr_lr``; the run's configuration lies two
folders up, ``<experiment>/config.json`` (``algo/runners/runner.py``, ``Runner._save_cfg``; ``cfg.json``
before 2.0.2). ``model`` holds, for the vector-observation actor-critic of
``sample_factory/model/actor_critic.py`` (``ActorCriticSharedWeights``; ``ActorCriticSeparateWeights``
puts ``actor_``/``critic_`` before ``encoder``, ``core`` and ``decoder``):

* ``obs_normalizer.running_mean_std.running_mean_std.obs.{running_mean, running_var, count}``: float64,
  with ``normalize_input`` (``utils/normalize.py``, ``ObservationNormalizer``;
  ``algo/utils/running_mean_std.py``, ``RunningMeanStdInPlace``);
* ``encoder.encoders.obs.mlp_head.{0,2,...}.{weight,bias}`` (``model/encoder.py``, ``MlpEncoder``:
  ``Linear`` then the activation, ``encoder_mlp_layers``);
* ``core.core.{weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0}`` (``_l1`` ... for ``rnn_num_layers``
  above 1): a ``torch.nn.GRU`` (or ``LSTM``, ``rnn_type``) of ``rnn_size`` units (``model/core.py``, ``ModelCoreRNN``), absent when ``use_rnn`` is off;
* ``decoder.mlp.{0,2,...}.*`` (``model/decoder.py``, ``decoder_mlp_layers``, empty by default);
* ``action_parameterization.distribution_linear.{weight,bias}`` and, without ``adaptive_stddev``,
  ``action_parameterization.learned_stddev`` (a log std) (``model/action_parameterization.py``);
* ``critic_linear.*`` (the value function) and ``returns_normalizer.*``.

What the policy computes, as Sample Factory computes it (``enjoy.py``):

* ``ObservationNormalizer.forward``: ``x - obs_subtract_mean`` when ``|obs_subtract_mean| > 1e-8``, then
  ``x * (1 / obs_scale)`` when ``|obs_scale - 1| > 1e-8``, then ``RunningMeanStdInPlace.forward`` in eval
  mode: ``clamp((x - mean) * (1 / sqrt(var + 1e-5)), -5, 5)`` in float32, the float64 statistics cast
  down (``.float()``) — the epsilon on the variance and the clip at 5 are rl_games' (Sample Factory's
  module is rl_games' own, made in-place), unlike rsl_rl's (1e-2 on the std, no clip) or skrl's;
* the encoder MLP; the GRU core, one step: with ``h`` the recurrent state, torch's
  ``r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)``, ``z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)``,
  ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``, ``h' = (h - n) * z + n`` (the rows of
  ``weight_ih_l0`` are r, z, n in that order), ``h'`` both the core's output and the new state; an LSTM's
  state is ``[h, c]`` (``ModelCoreRNN`` splits and concatenates them), its gates i, f, g, o of
  ``linear(h, W_hh, b_hh) + linear(x, W_ih, b_ih)``: ``c' = sigmoid(f) * c + sigmoid(i) * tanh(g)``,
  ``h' = sigmoid(o) * tanh(c')`` (``LSTMCell``), ``h'`` the core's output and ``[h', c']`` the new state;
* the decoder MLP, then ``distribution_linear``;
* the deterministic action of ``enjoy.py`` with ``eval_deterministic``
  (``algo/utils/action_distributions.py``, ``argmax_actions``): for a ``Box`` action space the
  ``ContinuousActionDistribution``'s means — the first half of ``distribution_linear``'s outputs, the
  second half the log std (std ``clamp(exp(log_std), 1e-4, 1e4)``), or without ``adaptive_stddev`` all of
  them, through ``tanh(mu / s) * s`` when ``continuous_tanh_scale`` s > 0, with ``learned_stddev`` as the
  log std; Sample Factory clips nothing. For a ``Discrete`` one the argmax of ``softmax(logits)``.

The recurrent state is a graph input, ``rnn_state_in`` (float32, ``(batch, rnn_size)``, ``2 * rnn_size``
for an LSTM, zeros at an episode's start as ``enjoy.py`` makes it), and a graph output, ``rnn_state_out``, to feed back at the
next step. What the files do not record is read from ``config.json`` (``nonlinearity``,
``obs_subtract_mean``, ``obs_scale``, ``continuous_tanh_scale``), else from options or Sample Factory's
defaults, each reported; neither file records whether the action space is ``Box`` or ``Discrete`` when
``adaptive_stddev`` is on (the default), so ``--head`` says so then. Nothing is unpickled beyond tensors
and plain containers (see :mod:`..readers.checkpoints`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import BadModelError, OptionError, OptionNeeded
from ..assumptions import Assumption

#: ``RunningMeanStdInPlace``'s epsilon (``sample_factory/algo/utils/running_mean_std.py``, ``_NORM_EPS``),
#: added to the variance before the square root.
NORMALIZER_EPS = 1e-5
#: ``_DEFAULT_CLIP``: the normalised observation is clamped to [-5, 5].
NORMALIZER_CLIP = 5.0
#: ``algo/utils/misc.py``'s ``EPS``: ``ObservationNormalizer`` subtracts ``obs_subtract_mean`` only when
#: its magnitude exceeds it, and scales only when ``|obs_scale - 1|`` does.
SCALING_EPS = 1e-8
#: ``ContinuousActionDistribution.stddev_min`` and ``stddev_max``.
STDDEV_MIN, STDDEV_MAX = 1e-4, 1e4
#: ``model/model_utils.py``, ``nonlinearity``: the activations Sample Factory builds.
ACTIVATIONS = ("elu", "relu", "tanh")
#: The keys that tell a Sample Factory checkpoint: the learner's top-level keys and its model's head.
MARKERS = frozenset({"train_step", "env_steps", "model"})
MODEL_KEY = "action_parameterization.distribution_linear.weight"
#: Where ``RunningMeanStdDictInPlace`` keeps the statistics of the ``obs`` observation.
NORMALIZER_PREFIX = "obs_normalizer.running_mean_std.running_mean_std.obs."
HEAD = "action_parameterization.distribution_linear"
LEARNED_STDDEV = "action_parameterization.learned_stddev"
#: The graph's recurrent state input and output.
STATE_IN, STATE_OUT = "rnn_state_in", "rnn_state_out"


Linear = tuple  # (weight name, weight (out, in), bias name, bias (out,))


@dataclass
class Rnn:
    """A ``torch.nn.GRU`` or ``torch.nn.LSTM`` (``model/core.py``), names as the checkpoint keys them.

    Attributes:
        scope: the module path (``core.core``), the prefix of its tensors' names.
        kind: ``"gru"`` (3 gates) or ``"lstm"`` (4 gates).
        params: for each layer k, ``weight_ih_l<k>`` (gH, in; in = H from layer 1 on), ``weight_hh_l<k>``
            (gH, H), ``bias_ih_l<k>`` (gH,), ``bias_hh_l<k>`` (gH,) -> (key, float32 array), g the number of gates.
        layers: ``rnn_num_layers``.
    """

    scope: str
    kind: str
    params: dict[str, tuple[str, np.ndarray]]
    layers: int = 1

    def layer(self, k: int) -> Rnn:
        """Layer ``k`` alone, its parameters under the ``_l0`` roles (their keys kept), its tensors under
        ``<scope>/layer_<k>`` when there are several."""
        roles = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        scope = self.scope if self.layers == 1 else f"{self.scope}/layer_{k}"
        return Rnn(scope, self.kind, {f"{r}_l0": self.params[f"{r}_l{k}"] for r in roles})

    @property
    def layer_state(self) -> int:
        """One layer's state: H for a GRU, 2H (``[h, c]``) for an LSTM."""
        return self.size * (2 if self.kind == "lstm" else 1)

    @property
    def size(self) -> int:
        """``rnn_size``, H."""
        return int(self.params["weight_hh_l0"][1].shape[1])

    @property
    def state_size(self) -> int:
        """The width of Sample Factory's recurrent state (``model_utils.get_rnn_size``): each layer's, in turn."""
        return self.layer_state * self.layers

    @property
    def in_features(self) -> int:
        return int(self.params["weight_ih_l0"][1].shape[1])


@dataclass
class Layout:
    """A Sample Factory actor, as the checkpoint holds it.

    Attributes:
        encoder: ``Linear`` layers of the encoder's ``mlp_head``, in order.
        core: the GRU or LSTM, or ``None`` (``use_rnn`` off).
        decoder: ``Linear`` layers of the decoder's ``mlp``, in order.
        head: ``distribution_linear``.
        learned_stddev: ``(name, array (A,))`` without ``adaptive_stddev``, else ``None``.
        normalizer: role (``running_mean``, ``running_var``, ``count``) -> (name, float64 array).
        separate: the actor of ``ActorCriticSeparateWeights`` (``actor_`` modules).
        critic_encoder, critic_core: with separate networks and a recurrent core, the critic's encoder and
            core, which the new recurrent state needs (its second half); else empty and ``None``.
        left_out: keys the graph does not compute (the value function, the returns' normaliser).
    """

    encoder: list[Linear]
    core: Rnn | None
    decoder: list[Linear]
    head: Linear
    learned_stddev: tuple[str, np.ndarray] | None = None
    normalizer: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)
    separate: bool = False
    critic_encoder: list[Linear] = field(default_factory=list)
    critic_core: Rnn | None = None
    left_out: list[str] = field(default_factory=list)

    @property
    def state_size(self) -> int:
        """The recurrent state's width (``model_utils.get_rnn_size``): the core's, twice with a critic core."""
        return self.core.state_size * (2 if self.critic_core is not None else 1)

    @property
    def obs_dim(self) -> int:
        if self.encoder:
            return int(self.encoder[0][1].shape[1])
        if self.core is not None:
            return self.core.in_features
        return int((self.decoder[0] if self.decoder else self.head)[1].shape[1])

    @property
    def width(self) -> int:
        """``distribution_linear``'s outputs."""
        return int(self.head[1].shape[0])


def is_sample_factory_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a torch zip whose pickle names the learner's top-level keys and the model's
    ``action_parameterization.distribution_linear``, read without unpickling anything."""
    from ..readers.checkpoints import pickled_strings

    strings = pickled_strings(path)
    return MARKERS <= strings and MODEL_KEY in strings


def _numbered(sd: dict, prefix: str, what: str) -> list[Linear]:
    """The ``Linear`` layers ``<prefix>.<i>`` of a ``create_mlp`` ``nn.Sequential`` (Linear, activation, ...)."""
    from ..readers.checkpoints import linear_layer

    found: dict[int, set[str]] = {}
    for name in sd:
        if name.startswith(prefix + "."):
            m = re.fullmatch(re.escape(prefix) + r"\.(\d+)\.(weight|bias)", name)
            if not m:
                raise BadModelError(f"{what}: {name} is not a parameter of the Linear layers Sample Factory's "
                                    f"create_mlp puts in {prefix}")
            found.setdefault(int(m[1]), set()).add(m[2])
    if any(i % 2 for i in found):
        raise BadModelError(f"{what}: {prefix} holds parameters at odd indices ({sorted(found)}), where Sample Factory "
                            "puts the activations")
    return [linear_layer(sd, f"{prefix}.{i}", what) for i in sorted(found)]


def _rnn(sd: dict, core: str, what: str) -> Rnn | None:
    """The GRU or LSTM ``<core>.core`` of a state_dict (``ModelCoreRNN``), or ``None`` when there is none."""
    rnn = {k: v for k, v in sd.items() if k.startswith(f"{core}.")}
    if not rnn:
        return None
    roles = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    layers = len({m[1] for k in rnn if (m := re.fullmatch(re.escape(f"{core}.core.") + r"\w+_l(\d+)", k))})
    names = {f"{core}.core.{r}_l{k}" for r in roles for k in range(layers)}
    if not layers or set(rnn) != names:
        raise BadModelError(f"{what}'s model holds {', '.join(sorted(set(rnn) - names) or sorted(names - set(rnn)))}: "
                            "policyport reads a GRU or LSTM core (torch.nn.GRU, torch.nn.LSTM) with its biases")
    params = {k.rsplit(".", 1)[1]: (k, v) for k, v in rnn.items()}
    hh0 = params["weight_hh_l0"][1]
    h = hh0.shape[1] if hh0.ndim == 2 else 0
    gates = hh0.shape[0] // h if h and hh0.shape[0] % h == 0 else 0
    for k in range(layers):
        ih, hh = params[f"weight_ih_l{k}"][1], params[f"weight_hh_l{k}"][1]
        if gates not in (3, 4) or ih.ndim != 2 or ih.shape[0] != gates * h or hh.shape != (gates * h, h) or (
                k and ih.shape[1] != h) or any(params[f"{b}_l{k}"][1].shape != (gates * h,) for b in ("bias_ih", "bias_hh")):
            raise BadModelError(f"{what}: {core}.core's layer {k} weights {ih.shape}, {hh.shape} are neither a GRU's "
                                "(3H, in) and (3H, H) nor an LSTM's (4H, in) and (4H, H), in = H from the second layer on")
    return Rnn(f"{core}.core", "gru" if gates == 3 else "lstm", params, layers)


def read_layout(ckpt: dict, what: str) -> Layout:
    """Place the actor's arrays of a Sample Factory checkpoint's ``model``.

    Raises:
        BadModelError: no ``model`` state_dict; no ``distribution_linear``; a convolutional encoder or
            observations other than one ``obs`` vector; an RNN core whose parameters are not a GRU's or an
            LSTM's; separate actor and critic cores that differ; layers that do not chain; statistics of
            another width.
    """
    from ..readers.checkpoints import linear_layer, state_dict

    if "model" not in ckpt:
        raise BadModelError(f"{what} holds {', '.join(map(str, ckpt))}: no 'model', the state_dict Sample Factory's "
                            "learner saves")
    sd = state_dict(ckpt["model"], f"{what}'s model")
    if f"{HEAD}.weight" not in sd:
        raise BadModelError(f"{what}'s model has no {HEAD}.weight: not a Sample Factory actor-critic")
    separate = any(k.startswith("actor_encoder.") for k in sd)
    encoder, core, decoder = ("actor_encoder", "actor_core", "actor_decoder") if separate else ("encoder", "core", "decoder")
    mlp_head = f"{encoder}.encoders.obs.mlp_head"
    odd = sorted(k for k in sd if k.startswith(f"{encoder}.") and not k.startswith(f"{mlp_head}."))
    if odd:
        raise BadModelError(f"{what}'s model holds {', '.join(odd[:4])}{' ...' if len(odd) > 4 else ''}: policyport reads "
                            "Sample Factory's MLP encoder of one 'obs' vector (encoders.obs.mlp_head); convolutional "
                            "encoders and dict observations are not read")
    layout = Layout(_numbered(sd, mlp_head, what), None, _numbered(sd, f"{decoder}.mlp", what), linear_layer(sd, HEAD, what),
                    separate=separate)
    layout.core = _rnn(sd, core, what)
    if separate and layout.core is not None:
        # ActorCriticSeparateWeights._core_rnn: the critic's core reads the critic encoder's output, and its state
        # is the second half of the recurrent state: the new state needs both
        layout.critic_encoder = _numbered(sd, "critic_encoder.encoders.obs.mlp_head", what)
        layout.critic_core = _rnn(sd, "critic_core", what)
        critic = layout.critic_core
        if critic is None or (critic.kind, critic.size, critic.layers) != (layout.core.kind, layout.core.size, layout.core.layers):
            raise BadModelError(f"{what}: actor_core is a {layout.core.kind.upper()} of {layout.core.size} but critic_core "
                                f"is {'missing' if critic is None else f'a {critic.kind.upper()} of {critic.size}'}")
        chain = [(n, w.shape[1], w.shape[0]) for n, w, _, _ in layout.critic_encoder]
        chain.append((critic.params["weight_ih_l0"][0], critic.in_features, critic.size))
        for (a, _, out), (b, into, _) in zip(chain, chain[1:]):
            if out != into:
                raise BadModelError(f"{what}: {a} outputs {out} features but {b} takes {into}")
        if layout.critic_encoder and layout.critic_encoder[0][1].shape[1] != layout.obs_dim:
            raise BadModelError(f"{what}: critic_encoder reads {layout.critic_encoder[0][1].shape[1]} observations, "
                                f"actor_encoder {layout.obs_dim}")
    chain = [(name, w.shape[1], w.shape[0]) for name, w, _, _ in layout.encoder]
    if layout.core is not None:
        chain.append((layout.core.params["weight_ih_l0"][0], layout.core.in_features, layout.core.size))
    chain += [(name, w.shape[1], w.shape[0]) for name, w, _, _ in [*layout.decoder, layout.head]]
    for (a, _, out), (b, into, _) in zip(chain, chain[1:]):
        if out != into:
            raise BadModelError(f"{what}: {a} outputs {out} features but {b} takes {into}")
    if LEARNED_STDDEV in sd:
        stddev = sd[LEARNED_STDDEV]
        if stddev.shape != (layout.width,):
            raise BadModelError(f"{what}: {LEARNED_STDDEV} has shape {stddev.shape}, {HEAD} outputs {layout.width}")
        layout.learned_stddev = (LEARNED_STDDEV, stddev)
    statistics = {k for k in sd if k.startswith("obs_normalizer.")}
    for role in ("running_mean", "running_var", "count"):
        if NORMALIZER_PREFIX + role in sd:
            layout.normalizer[role] = (NORMALIZER_PREFIX + role, sd[NORMALIZER_PREFIX + role])
    if statistics - {n for n, _ in layout.normalizer.values()}:
        raise BadModelError(f"{what}'s model holds {', '.join(sorted(statistics))}: policyport reads the normaliser of "
                            "one 'obs' vector")
    if layout.normalizer:
        if len(layout.normalizer) != 3:
            lacking = {"running_mean", "running_var", "count"} - set(layout.normalizer)
            raise BadModelError(f"{what}: the observation normaliser lacks {NORMALIZER_PREFIX}{lacking.pop()}")
        for role in ("running_mean", "running_var"):
            name, array = layout.normalizer[role]
            if array.shape != (layout.obs_dim,):
                raise BadModelError(f"{what}: {name} has shape {array.shape}; the actor reads {layout.obs_dim} "
                                    "observations (a per-channel normaliser is not read)")
    used = {n for layer in [*layout.encoder, *layout.decoder, layout.head] for n in (layer[0], layer[2])}
    used |= {n for n, _ in layout.normalizer.values()}
    for rnn in (layout.core, layout.critic_core):
        used |= {n for n, _ in rnn.params.values()} if rnn else set()
    used |= {n for layer in layout.critic_encoder for n in (layer[0], layer[2])}
    used |= {LEARNED_STDDEV} if layout.learned_stddev else set()
    layout.left_out = sorted(k for k in sd if k not in used)
    return layout


# ---------------------------------------------------------------- the run's configuration


@dataclass
class RunConfig:
    """What ``config.json`` says (``None``: not said), and where it lies."""

    path: Path
    values: dict

    def get(self, key: str):
        return self.values.get(key)


def find_run_config(checkpoint: Path) -> Path | None:
    """``<experiment>/config.json`` (``cfg.json`` before Sample Factory 2.0.2) of a checkpoint in
    ``<experiment>/checkpoint_p<N>/`` (or its ``milestones/``), or beside it; ``None`` when there is none."""
    for folder in (checkpoint.parent, checkpoint.parent.parent, checkpoint.parent.parent.parent):
        for name in ("config.json", "cfg.json"):
            if (folder / name).is_file():
                return folder / name
    return None


def read_run_config(checkpoint: Path) -> RunConfig | None:
    """The run's configuration (:func:`find_run_config`), a JSON object.

    Raises:
        BadModelError: a configuration file that is not a JSON object.
    """
    path = find_run_config(checkpoint)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        raise BadModelError(f"{path}, the run configuration beside {checkpoint}, is not readable JSON: {e}") from e
    if not isinstance(values, dict):
        raise BadModelError(f"{path}, the run configuration beside {checkpoint}, holds a {type(values).__name__}, "
                            "not the object Sample Factory writes")
    return RunConfig(path, values)


def _number(config: RunConfig, key: str) -> float | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise BadModelError(f"{config.path}: {key} is {value!r}, not a finite number")
    return float(value)


def _check_agrees(layout: Layout, config: RunConfig, what: str) -> None:
    """Refuse a configuration that describes another network than the checkpoint holds."""
    said = {"use_rnn": config.get("use_rnn"), "rnn_type": config.get("rnn_type"), "rnn_size": config.get("rnn_size"),
            "normalize_input": config.get("normalize_input"), "adaptive_stddev": config.get("adaptive_stddev"),
            "rnn_num_layers": config.get("rnn_num_layers")}
    holds = {"use_rnn": layout.core is not None, "normalize_input": bool(layout.normalizer)}
    if layout.core is not None:
        holds.update(rnn_type=layout.core.kind, rnn_size=layout.core.size, rnn_num_layers=layout.core.layers)
    if layout.learned_stddev is not None:
        holds["adaptive_stddev"] = False
    for key, value in holds.items():
        if said[key] is not None and said[key] != value:
            raise BadModelError(f"{config.path} says {key} {said[key]!r} but {what} holds a network with {key} "
                                f"{value!r}: the configuration belongs to another run")


# ---------------------------------------------------------------- the graph


@dataclass
class Plan:
    """What the graph computes beyond the arrays.

    Attributes:
        activation: the hidden activation (``None``: no hidden layers).
        continuous: a ``Box`` action space (else ``Discrete``).
        subtract: ``obs_subtract_mean`` when the normaliser subtracts it, else ``None``.
        scale: ``obs_scale`` when the normaliser scales by it, else ``None``.
        tanh_scale: ``continuous_tanh_scale`` when it applies (> 0, without adaptive stddev), else ``None``.
    """

    activation: object
    continuous: bool
    subtract: float | None = None
    scale: float | None = None
    tanh_scale: float | None = None


def _hidden(layers: list[Linear], scope: str) -> list[str]:
    """The activation modules' paths after each ``Linear`` of a ``create_mlp`` ``nn.Sequential``."""
    return [f"{scope}.{int(w.rsplit('.', 2)[1]) + 1}" for w, *_ in layers]


def _build(layout: Layout, plan: Plan, opset: int, metadata: dict[str, str]):
    import onnx

    from ..build import Dense, MlpBuilder, Step, add_running_mean_std, policy_model

    helper, f32 = onnx.helper, np.float32
    b = MlpBuilder(opset, np.dtype(f32))
    FLOAT = onnx.TensorProto.FLOAT

    def const(value, name):
        return b.initializer(np.asarray(value, f32), name)

    x = "obs"
    if plan.subtract is not None:  # obs_clone["obs"].sub_(self.sub_mean)
        x = b.node("Sub", [x, const(plan.subtract, "obs_normalizer/obs_subtract_mean")], "obs_normalizer/subtracted")
    if plan.scale is not None:  # obs_clone["obs"].mul_(1.0 / self.scale), the reciprocal taken in Python's float64
        x = b.node("Mul", [x, const(1.0 / plan.scale, "obs_normalizer/inverse_obs_scale")], "obs_normalizer/scaled")
    if layout.normalizer:
        # RunningMeanStdInPlace.forward: x.sub_(mean.float()).mul_(1 / sqrt(var.float() + eps)).clamp_(-clip, clip)
        x = add_running_mean_std(b, x, layout.normalizer, NORMALIZER_PREFIX.rstrip("."), NORMALIZER_EPS, NORMALIZER_CLIP,
                                 reciprocal=True)

    def mlp(layers, scope, x):
        for (wname, w, bname, bias), act_scope in zip(layers, _hidden(layers, scope)):
            post = [] if plan.activation is None else [Step("activation", act_scope, plan.activation)]
            x = b.dense(Dense(wname.rsplit(".", 1)[0], w, wname, bias, bname, "out_in", None, post), x)
        return x

    prefix = "actor_" if layout.separate else ""
    normalized = x
    x = mlp(layout.encoder, f"{prefix}encoder.encoders.obs.mlp_head", x)
    if layout.critic_core is not None:  # _core_rnn: rnn_states.chunk(2, dim=1), the actor's half first
        half = layout.core.state_size
        axis = b.constant([1], "rnn_state_in/axis")
        halves = [b.node("Slice", [STATE_IN, b.constant([i * half], f"rnn_state_in/{who}_start"),
                                   b.constant([(i + 1) * half], f"rnn_state_in/{who}_end"), axis], f"rnn_state_in/{who}")
                  for i, who in enumerate(("actor", "critic"))]
        critic = mlp(layout.critic_encoder, "critic_encoder.encoders.obs.mlp_head", normalized)
        x = _core(b, layout.core, x, halves[0], "actor_core/new_state")
        _core(b, layout.critic_core, critic, halves[1], "critic_core/new_state")
        b.node("Concat", ["actor_core/new_state", "critic_core/new_state"], STATE_OUT, axis=1)
    elif layout.core is not None:
        x = _core(b, layout.core, x, STATE_IN, STATE_OUT)
    x = mlp(layout.decoder, f"{prefix}decoder.mlp", x)
    wname, w, bname, bias = layout.head
    logits = b.dense(Dense(HEAD, w, wname, bias, bname, "out_in"), x, "logits")
    outputs = [helper.make_tensor_value_info("logits", FLOAT, ["batch", layout.width])]
    if not plan.continuous:
        probs = b.node("Softmax", [logits], "probs", axis=1)
        b.node("ArgMax", [probs], "action", axis=1, keepdims=0)
        outputs += [helper.make_tensor_value_info("probs", FLOAT, ["batch", layout.width]),
                    helper.make_tensor_value_info("action", onnx.TensorProto.INT64, ["batch"])]
    else:
        if layout.learned_stddev is None:  # torch.chunk(params, 2, dim=1): means, log_std
            n = layout.width // 2
            b.node("Slice", [logits, b.constant([0], "logits/mean_start"), b.constant([n], "logits/mean_end"),
                             b.constant([1], "logits/axes")], "action", )
            b.node("Slice", [logits, b.constant([n], "logits/log_std_start"), b.constant([2 * n], "logits/log_std_end"),
                             b.constant([1], "logits/log_std_axes")], "log_std")
        else:
            n = layout.width
            if plan.tanh_scale is None:
                b.node("Identity", [logits], "action")
            else:  # torch.tanh(action_means / self.tanh_scale) * self.tanh_scale
                s = const(plan.tanh_scale, "action/tanh_scale")
                t = b.node("Tanh", [b.node("Div", [logits, s], "action/over_scale")], "action/tanh")
                b.node("Mul", [t, s], "action")
            name, array = layout.learned_stddev  # self.learned_stddev.repeat(batch_size, 1)
            b.node("Expand", [b.initializer(array, name, name), b.node("Shape", [logits], "log_std/batch_shape")], "log_std")
        b.node("Clip", [b.node("Exp", ["log_std"], "std/unclamped"), const(STDDEV_MIN, "std/min"), const(STDDEV_MAX, "std/max")],
               "std")
        outputs += [helper.make_tensor_value_info(t, FLOAT, ["batch", n]) for t in ("action", "log_std", "std")]
    inputs = [helper.make_tensor_value_info("obs", FLOAT, ["batch", layout.obs_dim])]
    if layout.core is not None:
        inputs.append(helper.make_tensor_value_info(STATE_IN, FLOAT, ["batch", layout.state_size]))
        outputs.append(helper.make_tensor_value_info(STATE_OUT, FLOAT, ["batch", layout.state_size]))
    head = "diag-gaussian" if plan.continuous else "categorical"
    return policy_model(b, inputs, outputs, {"policyport.head": head, **metadata})


def _core(b, rnn: Rnn, x: str, state_in: str, state_out: str) -> str:
    """The nodes of one step of ``rnn`` (:func:`_gru` or :func:`_lstm`, layer by layer, each reading the one
    before; ``ModelCoreRNN`` keeps layer k's state at ``[k * s, (k + 1) * s)``); returns the core's output."""
    step = _gru if rnn.kind == "gru" else _lstm
    if rnn.layers == 1:
        return step(b, rnn.layer(0), x, state_in, state_out)
    axis, s, states = b.constant([1], f"{rnn.scope}/state_axis"), rnn.layer_state, []
    for k in range(rnn.layers):
        layer = rnn.layer(k)
        state = b.node("Slice", [state_in, b.constant([k * s], f"{layer.scope}/state_start"),
                                 b.constant([(k + 1) * s], f"{layer.scope}/state_end"), axis], f"{layer.scope}/state")
        states.append(f"{layer.scope}/new_state")
        x = step(b, layer, x, state, states[-1])
    b.node("Concat", states, state_out, axis=1)
    return x


def _gru(b, gru: Rnn, x: str, state_in: str, state_out: str) -> str:
    """One step of ``torch.nn.GRU`` as torch's CPU cell computes it (``aten/src/ATen/native/RNN.cpp``,
    ``GRUCell``): gates ``linear(x, W_ih, b_ih)`` and ``linear(h, W_hh, b_hh)``, chunked r, z, n;
    ``h' = (h - n) * z + n``. The weights stay single initializers under torch's names."""
    from ..build import Dense

    p, scope, h = gru.params, gru.scope, gru.size
    gi = b.dense(Dense(scope, p["weight_ih_l0"][1], p["weight_ih_l0"][0], p["bias_ih_l0"][1], p["bias_ih_l0"][0], "out_in"),
                 x, f"{scope}/input_gates")
    gh = b.dense(Dense(scope, p["weight_hh_l0"][1], p["weight_hh_l0"][0], p["bias_hh_l0"][1], p["bias_hh_l0"][0], "out_in"),
                 state_in, f"{scope}/hidden_gates")
    axes = b.constant([1], f"{scope}/gate_axis")
    bounds = {gate: (b.constant([i * h], f"{scope}/{gate}_start"), b.constant([(i + 1) * h], f"{scope}/{gate}_end"))
              for i, gate in enumerate(("r", "z", "n"))}

    def part(gates, gate, which):
        return b.node("Slice", [gates, *bounds[gate], axes], f"{scope}/{which}_{gate}")

    r = b.node("Sigmoid", [b.node("Add", [part(gh, "r", "hidden"), part(gi, "r", "input")], f"{scope}/reset_sum")],
               f"{scope}/reset_gate")
    z = b.node("Sigmoid", [b.node("Add", [part(gh, "z", "hidden"), part(gi, "z", "input")], f"{scope}/update_sum")],
               f"{scope}/update_gate")
    n = b.node("Tanh", [b.node("Add", [part(gi, "n", "input"), b.node("Mul", [part(gh, "n", "hidden"), r],
                                                                      f"{scope}/reset_hidden")], f"{scope}/new_sum")],
               f"{scope}/new_gate")
    kept = b.node("Mul", [b.node("Sub", [state_in, n], f"{scope}/state_minus_new"), z], f"{scope}/kept")
    return b.node("Add", [kept, n], state_out)


def _lstm(b, lstm: Rnn, x: str, state_in: str, state_out: str) -> str:
    """One step of ``torch.nn.LSTM`` as torch's CPU cell computes it (``aten/src/ATen/native/RNN.cpp``,
    ``LSTMCell``) on Sample Factory's state ``[h, c]``: gates ``linear(h, W_hh, b_hh) + linear(x, W_ih, b_ih)``
    chunked i, f, g, o; ``c' = f * c + i * g``, ``h' = o * tanh(c')``; the new state ``[h', c']``. Returns
    ``h'``, the core's output."""
    from ..build import Dense

    p, scope, n = lstm.params, lstm.scope, lstm.size
    axis = b.constant([1], f"{scope}/axis")

    def cut(x, start, end, name):
        return b.node("Slice", [x, b.constant([start], f"{name}_start"), b.constant([end], f"{name}_end"), axis], name)

    h = cut(state_in, 0, n, f"{scope}/h")
    c = cut(state_in, n, 2 * n, f"{scope}/c")
    gi = b.dense(Dense(scope, p["weight_ih_l0"][1], p["weight_ih_l0"][0], p["bias_ih_l0"][1], p["bias_ih_l0"][0], "out_in"),
                 x, f"{scope}/input_gates")
    gh = b.dense(Dense(scope, p["weight_hh_l0"][1], p["weight_hh_l0"][0], p["bias_hh_l0"][1], p["bias_hh_l0"][0], "out_in"),
                 h, f"{scope}/hidden_gates")
    gates = b.node("Add", [gh, gi], f"{scope}/gates")
    i, f, g, o = (b.node(op, [cut(gates, k * n, (k + 1) * n, f"{scope}/{gate}_sum")], f"{scope}/{gate}_gate")
                  for k, (gate, op) in enumerate((("input", "Sigmoid"), ("forget", "Sigmoid"), ("cell", "Tanh"),
                                                  ("output", "Sigmoid"))))
    c_new = b.node("Add", [b.node("Mul", [f, c], f"{scope}/kept_cell"), b.node("Mul", [i, g], f"{scope}/written_cell")],
                   f"{scope}/cell")
    h_new = b.node("Mul", [o, b.node("Tanh", [c_new], f"{scope}/cell_tanh")], f"{scope}/hidden")
    b.node("Concat", [h_new, c_new], state_out, axis=1)
    return h_new


def normalize(layout: Layout, plan: Plan, obs: np.ndarray) -> np.ndarray:
    """``ObservationNormalizer.forward`` in eval mode, in numpy float32 (see the module docstring)."""
    f32 = np.float32
    x = np.asarray(obs, f32)
    if plan.subtract is not None:
        x = x - f32(plan.subtract)
    if plan.scale is not None:
        x = x * f32(1.0 / plan.scale)
    if layout.normalizer:
        mean = layout.normalizer["running_mean"][1].astype(f32)
        var = layout.normalizer["running_var"][1].astype(f32)
        x = np.clip((x - mean) * (f32(1) / np.sqrt(var + f32(NORMALIZER_EPS))), f32(-NORMALIZER_CLIP), f32(NORMALIZER_CLIP))
    return x


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1 / (1 + np.exp(-x.astype(np.float64)))).astype(np.float32)


def _core_reference(rnn: Rnn, x: np.ndarray, state: np.ndarray, out: dict) -> tuple[np.ndarray, np.ndarray]:
    """One step of ``rnn`` in numpy float32, layer by layer: ``(output, new state)``; the gates go into ``out``."""
    s, states = rnn.layer_state, []
    for k in range(rnn.layers):
        x, new = _layer_reference(rnn.layer(k), x, state[:, k * s:(k + 1) * s], out)
        states.append(new)
    return x, np.concatenate(states, axis=1)


def _layer_reference(rnn: Rnn, x: np.ndarray, state: np.ndarray, out: dict) -> tuple[np.ndarray, np.ndarray]:
    p, n, scope = rnn.params, rnn.size, rnn.scope
    h = state[:, :n]
    gi = x @ p["weight_ih_l0"][1].T + p["bias_ih_l0"][1]
    gh = h @ p["weight_hh_l0"][1].T + p["bias_hh_l0"][1]
    if rnn.kind == "gru":
        r = out[f"{scope}/reset_gate"] = _sigmoid(gh[:, :n] + gi[:, :n])
        z = out[f"{scope}/update_gate"] = _sigmoid(gh[:, n:2 * n] + gi[:, n:2 * n])
        new = out[f"{scope}/new_gate"] = np.tanh(gi[:, 2 * n:] + gh[:, 2 * n:] * r)
        h_new = (h - new) * z + new
        return h_new, h_new
    gates = gh + gi
    i, f, o = (_sigmoid(gates[:, k * n:(k + 1) * n]) for k in (0, 1, 3))
    g = np.tanh(gates[:, 2 * n:3 * n])
    c = out[f"{scope}/cell"] = f * state[:, n:] + i * g
    h_new = out[f"{scope}/hidden"] = o * np.tanh(c)
    return h_new, np.concatenate([h_new, c], axis=1)


def reference_forward(layout: Layout, plan: Plan, feeds) -> dict[str, np.ndarray]:
    """Sample Factory's actor in numpy float32, in its order of operations, tensors named as the graph
    names them. ``feeds``: the observations (float32, ``(batch, obs_dim)``), or with a recurrent core
    a mapping with ``obs`` and ``rnn_state_in`` (float32, ``(batch, rnn_size)``, twice as wide for an LSTM)."""
    f32 = np.float32
    out: dict[str, np.ndarray] = {}
    obs = feeds["obs"] if isinstance(feeds, dict) else feeds
    x = normalize(layout, plan, obs)
    if layout.normalizer:
        out[NORMALIZER_PREFIX.rstrip(".")] = x
    prefix = "actor_" if layout.separate else ""

    def mlp(layers, scope, x):
        for (wname, w, _, bias), act_scope in zip(layers, _hidden(layers, scope)):
            x = out[f"{wname.rsplit('.', 1)[0]}/linear"] = x @ w.T + bias
            if plan.activation is not None:
                x = out[f"{act_scope}/{plan.activation.label}"] = plan.activation.reference(x).astype(f32)
        return x

    normalized = x
    x = mlp(layout.encoder, f"{prefix}encoder.encoders.obs.mlp_head", x)
    if layout.core is not None:
        state = np.asarray(feeds[STATE_IN], f32)
        if layout.critic_core is None:
            x, out[STATE_OUT] = _core_reference(layout.core, x, state, out)
        else:
            half = layout.core.state_size
            critic = mlp(layout.critic_encoder, "critic_encoder.encoders.obs.mlp_head", normalized)
            x, actor_state = _core_reference(layout.core, x, state[:, :half], out)
            _, critic_state = _core_reference(layout.critic_core, critic, state[:, half:], out)
            out[STATE_OUT] = np.concatenate([actor_state, critic_state], axis=1)
    x = mlp(layout.decoder, f"{prefix}decoder.mlp", x)
    _, w, _, bias = layout.head
    logits = out["logits"] = x @ w.T + bias
    if not plan.continuous:
        e = np.exp(logits.astype(np.float64) - logits.max(axis=1, keepdims=True))
        out["probs"] = (e / e.sum(axis=1, keepdims=True)).astype(f32)
        out["action"] = np.argmax(out["probs"], axis=1).astype(np.int64)
        return out
    if layout.learned_stddev is None:
        half = layout.width // 2
        out["action"], out["log_std"] = logits[:, :half], logits[:, half:]
    else:
        s = plan.tanh_scale
        out["action"] = logits if s is None else np.tanh(logits / f32(s)) * f32(s)
        out["log_std"] = np.broadcast_to(layout.learned_stddev[1], logits.shape).copy()
    out["std"] = np.clip(np.exp(out["log_std"]), f32(STDDEV_MIN), f32(STDDEV_MAX))
    return out


def convert_sample_factory(source, options):
    """Convert a Sample Factory 2.x checkpoint (see the module docstring) to ONNX.

    Args:
        source: the checkpoint's path (``checkpoint_<step>_<env_steps>.pth``).
        options: a :class:`~policyport.converter.ConvertOptions`: ``activation`` (required when no
            ``config.json`` names ``nonlinearity``; must agree with it when one does), ``head``
            (``categorical`` for a ``Discrete`` action space, ``diag-gaussian`` for a ``Box`` one;
            required unless the checkpoint holds ``learned_stddev``, which only a ``Box`` policy has),
            ``opset``.

    Returns:
        A :class:`~policyport.converter.Converted`: inputs ``obs`` (float32, ``(batch, obs_dim)``, raw
        observations) and, with a recurrent core, ``rnn_state_in`` (float32, ``(batch, rnn_size)``, for an
        LSTM ``(batch, 2 * rnn_size)``, ``[h, c]``; zeros at an
        episode's start); outputs ``logits`` (``distribution_linear``'s), ``action`` (``argmax_actions``:
        the means, float32 ``(batch, A)``, or the argmax, int64 ``(batch,)``), ``log_std`` and ``std`` or
        ``probs``, and ``rnn_state_out``; initializers under Sample Factory's keys (``core.core.weight_ih_l0``,
        the normaliser's float64 statistics ...); the reference is Sample Factory's forward rebuilt in numpy.

    Raises:
        UnreadableFileError: not a torch zip holding a dict.
        BadModelError: a network this reader does not read (see :func:`read_layout`); a ``config.json``
            that is not JSON or describes another network.
        OptionError: no activation anywhere, or one contradicting ``config.json``; no ``--head`` where
            the files do not tell the action space, or one contradicting them.
    """
    from ...io.kinds import sha256_file
    from ..activations import choose_activation, parse_activation, required_activation
    from ..assumptions import joined, reconstruction
    from ..options import Converted
    from ..readers.checkpoints import read_checkpoint

    path = Path(os.fspath(source))
    what = str(path)
    layout = read_layout(read_checkpoint(path, "Sample Factory"), what)
    config = read_run_config(path)
    if config is not None:
        _check_agrees(layout, config, what)
    where = str(config.path) if config else what
    prefix = "actor_" if layout.separate else ""
    hidden = (_hidden(layout.encoder, f"{prefix}encoder.encoders.obs.mlp_head")
              + _hidden(layout.decoder, f"{prefix}decoder.mlp"))
    recorded = config.get("nonlinearity") if config else None
    if recorded is not None and recorded not in ACTIVATIONS:
        raise BadModelError(f"{where} names the nonlinearity {recorded!r}, which Sample Factory does not build "
                            f"({', '.join(ACTIVATIONS)})")
    activation_name, notes = choose_activation(options.activation, recorded, where)
    if activation_name is None:
        activation_name = required_activation(None, f"{what} (a Sample Factory checkpoint)", hidden,
                                              "Sample Factory's nonlinearity defaults to elu, and the run writes it to "
                                              "config.json in the experiment folder, " + (
                                                  f"but {config.path} does not name it" if config else
                                                  "which does not lie above this checkpoint"))
    act = parse_activation(activation_name)
    assumptions: list[Assumption] = []
    if hidden:
        because = (f"read from {config.path}'s nonlinearity; the checkpoint does not record it" if recorded is not None
                   else f"given by --activation; {what} does not record it and "
                   + (f"{config.path} does not name it" if config else "no config.json lies above it"))
        assumptions.append(Assumption("activation", f"{activation_name} at {joined(hidden)}", because,
                                      "--activation must agree with it" if recorded is not None else "--activation names another"))

    # the action space: learned_stddev exists only for a Box; otherwise --head says
    if layout.learned_stddev is not None:
        if options.head not in (None, "diag-gaussian", "diag-gaussian:halves"):
            raise OptionError(f"--head {options.head}: {what} holds {LEARNED_STDDEV}, which Sample Factory makes only for "
                              "a Box action space (adaptive_stddev off): its action is the means (diag-gaussian)")
        continuous = True
    else:
        if options.head in (None, "none"):
            raise OptionNeeded(f"{what} does not record whether its action space is Discrete or Box: with adaptive_stddev "
                               f"(Sample Factory's default) {HEAD} outputs a Discrete space's {layout.width} logits or a "
                               f"Box's means and log stds alike, and config.json does not record the space; say which with "
                               "--head categorical (Discrete: action = argmax) or --head diag-gaussian (Box: action = the "
                               "first half, the means)", "head", "categorical")
        continuous = options.head != "categorical"
        if continuous and layout.width % 2:
            raise OptionError(f"--head {options.head}: {HEAD} outputs {layout.width} values, which a Box's means and "
                              "log stds (two halves) cannot be; is the action space Discrete (--head categorical)?")
        space = "Sample Factory's ContinuousActionDistribution chunks a Box's parameters so" if continuous else \
            "Sample Factory's CategoricalActionDistribution reads a Discrete space's logits so"
        half = layout.width // 2
        assumptions.append(Assumption(
            "head", (f"Box: action = the first {half} of {HEAD}'s {layout.width} outputs (the means), the last {half} "
                     "the log std") if continuous else f"Discrete: action = argmax of {HEAD}'s {layout.width} logits",
            f"given by --head {options.head}; {what} (adaptive_stddev) does not record its action space, and {space} "
            "(sample_factory/algo/utils/action_distributions.py)",
            "--head categorical for a Discrete action space" if continuous else "--head diag-gaussian for a Box one"))

    plan = Plan(None if act.name == "linear" else act, continuous)
    subtract = _number(config, "obs_subtract_mean") if config else None
    scale = _number(config, "obs_scale") if config else None
    if scale is not None and scale == 0:
        raise BadModelError(f"{config.path}: obs_scale is 0, which Sample Factory divides by")
    plan.subtract = subtract if subtract is not None and abs(subtract) > SCALING_EPS else None
    plan.scale = scale if scale is not None and abs(scale - 1.0) > SCALING_EPS else None
    if config is None or config.get("obs_subtract_mean") is None or config.get("obs_scale") is None:
        assumptions.append(Assumption(
            "observation scaling", f"obs_subtract_mean {subtract or 0:g}, obs_scale {1 if scale is None else scale:g}",
            "Sample Factory's defaults; ObservationNormalizer subtracts and scales by them before its statistics, and "
            + (f"{config.path} does not name them" if config else "no config.json lies above the checkpoint"),
            "put the run's config.json in the experiment folder above checkpoint_p0"))
    if continuous and layout.learned_stddev is not None:
        tanh_scale = _number(config, "continuous_tanh_scale") if config else None
        plan.tanh_scale = tanh_scale if tanh_scale is not None and tanh_scale > 0 else None
        if tanh_scale is None:
            assumptions.append(Assumption(
                "head", "action = the means as distribution_linear outputs them (continuous_tanh_scale 0)",
                "Sample Factory's default; the checkpoint does not record continuous_tanh_scale and "
                + (f"{config.path} does not name it" if config else "no config.json lies above it"),
                "put the run's config.json in the experiment folder above checkpoint_p0"))
    if continuous:
        notes.append("the action is the means as Sample Factory's argmax_actions gives them; Sample Factory clips "
                     "nothing (an environment may clip them to its Box)")
    if not layout.normalizer:
        notes.append(f"{what} holds no observation normaliser statistics (normalize_input was off)")
    if layout.core is not None:
        held = "[h, c]" if layout.core.kind == "lstm" else "h"
        held = f"each of its {layout.core.layers} layers' {held} in turn" if layout.core.layers > 1 else held
        held = (f"the actor core's {held}, then the critic core's, which the graph computes with critic_encoder and "
                "critic_core for it" if layout.critic_core else held)
        notes.append(f"the {layout.core.kind.upper()}'s state is the input {STATE_IN} ({layout.state_size} wide: {held}; "
                     "zeros at an episode's start) "
                     f"and the output {STATE_OUT}, fed back at the next step")
    if layout.left_out:
        notes.append(f"left out of the graph (the value function): {', '.join(layout.left_out)}")
    source_info = {"kind": "sample-factory", "file": path.name, "sha256": sha256_file(path)}
    if config is not None:
        source_info["config"] = str(config.path)
    metadata = {"policyport.source": json.dumps(source_info), "policyport.activation": activation_name}
    if layout.normalizer or plan.subtract is not None or plan.scale is not None:
        metadata["policyport.observation_filter"] = json.dumps(
            {"type": "ObservationNormalizer", "library": "sample_factory",
             "formula": "clip(((x - obs_subtract_mean) * (1 / obs_scale) - mean) * (1 / sqrt(var + eps)), -clip, clip)",
             "obs_subtract_mean": plan.subtract or 0.0, "obs_scale": plan.scale or 1.0,
             "statistics": bool(layout.normalizer), "epsilon": NORMALIZER_EPS, "clip": NORMALIZER_CLIP,
             **({"count": float(layout.normalizer["count"][1].reshape(-1)[0])} if layout.normalizer else {})})
    if layout.core is not None:
        metadata["policyport.recurrent_state"] = json.dumps({"input": STATE_IN, "output": STATE_OUT,
                                                             "size": layout.state_size, "rnn_type": layout.core.kind,
                                                             "initial": "zeros"})
    model = _build(layout, plan, options.opset, metadata)
    return Converted(model, lambda feeds: reference_forward(layout, plan, feeds), "sample-factory", notes=notes,
                     assumptions=assumptions, oracle=reconstruction("the arrays of a Sample Factory checkpoint"))
