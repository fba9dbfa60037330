"""Unity ML-Agents checkpoints: ``results/<run_id>/<Behavior>/<Behavior>-<step>.pt`` and ``checkpoint.pt``.

ML-Agents' trainer saves ``torch.save`` of ``{name: module.state_dict()}`` over the modules its policy and
optimizer register (``mlagents/trainers/model_saver/torch_model_saver.py``, ``save_checkpoint``):
``Policy`` (the actor, ``policy/torch_policy.py``'s ``get_modules``), ``global_step`` and the optimizer's
(``Optimizer:value_optimizer``, ``Optimizer:critic`` for PPO ...). ``Policy`` holds, for a
vector-observation actor (``mlagents/trainers/torch_entities/networks.py``, ``SimpleActor``):

* constants the ONNX export outputs: ``version_number`` (3), ``is_continuous_int_deprecated``,
  ``continuous_act_size_vector``, ``discrete_act_size_vector`` (shape ``(1, branches)``),
  ``act_size_vector_deprecated``, ``memory_size_vector``: float32;
* with ``normalize: true``, each vector observation's ``Normalizer`` (``torch_entities/encoders.py``):
  ``network_body.observation_encoder.processors.N.normalizer.{normalization_steps (int64, 0-d),
  running_mean, running_variance}`` — and the same buffers again under ``network_body.processors.N``,
  since ``NetworkBody`` registers the encoder's ``processors`` a second time;
* ``network_body._body_endoder.seq_layers.{0,2,...}.{weight,bias}`` (``torch_entities/layers.py``,
  ``LinearEncoder``: Linear, Swish, ...; ``_body_endoder`` is ML-Agents' own spelling);
* continuous actions: ``action_model._continuous_distribution.mu.*`` and ``log_sigma``, a ``(1, A)``
  parameter, or with ``conditional_sigma`` (SAC) a ``Linear`` (``torch_entities/distributions.py``,
  ``GaussianDistribution``); discrete actions: ``action_model._discrete_distribution.branches.N.*``.

What the actor computes, as ML-Agents computes it:

* the normaliser, ``clamp((x - running_mean) / sqrt(running_variance / normalization_steps), -5, 5)``:
  no epsilon (``running_variance`` is a sum of squared deviations, divided by the count here), the clip
  at 5 (rl_games adds 1e-5 to the variance, rsl_rl 1e-2 to the std);
* the body, ``x * sigmoid(x)`` (Swish) after every Linear: ML-Agents has no setting for it;
* the export's deterministic actions (``torch_entities/action_model.py``, ``get_action_out``): continuous,
  the Gaussian's mean, clamped to [-3, 3] and divided by 3 unless the actor was built with ``tanh_squash``
  (``clip_action = not tanh_squash``), in which case the mean as it is (``TanhGaussianDistInstance`` does not
  override ``deterministic_sample``); discrete, the argmax of each branch's softmax of its masked logits,
  ``logits * mask - 1e8 * (1 - mask)``, the mask an optional input ``action_masks`` as in ML-Agents' export
  (1 allowed; by default all ones); a hybrid action space has both (the discrete actions then named
  ``discrete_action``).

``tanh_squash`` is not in the checkpoint: ML-Agents' trainers build PPO's and POCA's actor with
``conditional_sigma`` and ``tanh_squash`` off (``ppo/trainer.py``, ``poca/trainer.py``) and SAC's with both
on (``sac/trainer.py``); it is read from the run's ``configuration.yaml`` (``behaviors.<Behavior>.trainer_type``,
written by ``learn.py``'s ``write_run_options`` two folders above the checkpoint), else told from the
layout (a ``log_sigma`` layer is SAC's), and reported as an assumption either way.
Nothing is unpickled beyond tensors and plain containers (see :mod:`..readers.checkpoints`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import BadModelError
from ..fields import shown, whole_number

#: ``Normalizer.forward`` clamps the normalised observation to [-5, 5]; it adds no epsilon.
NORMALIZER_CLIP = 5.0
#: ``ActionModel.get_action_out`` clamps a continuous action to [-ACTION_CLIP, ACTION_CLIP] and divides it
#: by ACTION_CLIP when ``clip_action``.
ACTION_CLIP = 3.0
#: ``GaussianDistribution.forward`` clamps a state-dependent log sigma to [-20, 2].
LOG_SIGMA_RANGE = (-20.0, 2.0)
#: ``MultiCategoricalDistribution._mask_branch`` subtracts this from a masked action's logit.
MASK_PENALTY = 1e8
#: The discrete actions' mask input, as ML-Agents' export names it (``action_masks``: 1 allowed, 0 masked).
MASKS = "action_masks"
#: Where ``SimpleActor`` keeps its parts (``torch_entities/networks.py``).
BODY = "network_body._body_endoder.seq_layers"
ENCODER = "network_body.observation_encoder.processors"
ALIAS = "network_body.processors"
CONTINUOUS = "action_model._continuous_distribution"
DISCRETE = "action_model._discrete_distribution.branches"
#: ``SimpleActor``'s constants, which its ONNX export outputs and no computation reads.
CONSTANTS = ("version_number", "is_continuous_int_deprecated", "continuous_act_size_vector",
             "discrete_act_size_vector", "act_size_vector_deprecated", "memory_size_vector")
#: The trainers whose actor ML-Agents builds with ``tanh_squash`` (and ``conditional_sigma``) on, and off.
SQUASHING_TRAINERS, CLIPPING_TRAINERS = ("sac",), ("ppo", "poca")


@dataclass
class Layout:
    """An ML-Agents actor, as ``Policy`` holds it (names are ML-Agents' keys).

    Attributes:
        layers: ``(weight name, weight (out, in), bias name, bias (out,))`` of ``seq_layers``, in order.
        normalizers: per vector observation, in order, role (``running_mean``, ``running_variance``,
            ``normalization_steps``) -> (name, array); empty without ``normalize``.
        aliases: a normaliser buffer's name under ``network_body.observation_encoder`` -> its second name
            under ``network_body.processors`` (the same tensor).
        mu: ``(weight name, weight, bias name, bias)`` of the Gaussian's mean, or ``None``.
        log_sigma: ``(name, array (1, A))``, or ``None``.
        log_sigma_layer: ``(weight name, weight, bias name, bias)`` of a state-dependent log sigma, or ``None``.
        branches: ``(weight name, weight, bias name, bias)`` of each discrete branch.
        constants: the constants of :data:`CONSTANTS` the state_dict holds, name -> array.
        left_out: keys of ``Policy`` that the graph does not compute (a shared critic's ``value_heads``).
    """

    layers: list[tuple[str, np.ndarray, str, np.ndarray]]
    normalizers: list[dict[str, tuple[str, np.ndarray]]] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)
    mu: tuple[str, np.ndarray, str, np.ndarray] | None = None
    log_sigma: tuple[str, np.ndarray] | None = None
    log_sigma_layer: tuple[str, np.ndarray, str, np.ndarray] | None = None
    branches: list[tuple[str, np.ndarray, str, np.ndarray]] = field(default_factory=list)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)

    @property
    def obs_dim(self) -> int:
        return int(self.layers[0][1].shape[1])

    @property
    def actions(self) -> int:
        return int(self.mu[1].shape[0]) if self.mu else 0

    @property
    def branch_sizes(self) -> list[int]:
        return [int(w.shape[0]) for _, w, _, _ in self.branches]


def is_ml_agents_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a torch zip whose pickle names an ML-Agents checkpoint's ``Policy`` and
    ``global_step`` and an actor's body, read from the pickle's opcodes without unpickling anything."""
    from ..readers.checkpoints import pickled_strings

    strings = pickled_strings(path)
    return {"Policy", "global_step"} <= strings and f"{BODY}.0.weight" in strings


def _indices(sd: dict, prefix: str) -> list[int]:
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)\.")
    return sorted({int(m[1]) for k in sd if (m := pattern.match(k))})


def read_layout(ckpt: dict, what: str) -> Layout:
    """Place the actor's arrays of an ML-Agents checkpoint's ``Policy``.

    Raises:
        BadModelError: no ``Policy`` state_dict; an LSTM memory, a visual or variable-length observation
            encoder, a goal-conditioned (hypernetwork) body (only vector observations into the MLP body
            are read); no action head; layers that do not chain; normaliser statistics that do not
            cover the body's input.
    """
    from ..readers.checkpoints import linear_layer, state_dict

    if "Policy" not in ckpt:
        raise BadModelError(f"{what} holds {', '.join(map(str, ckpt))}: no 'Policy', the actor's state_dict "
                            "ML-Agents saves")
    sd = state_dict(ckpt["Policy"], f"{what}'s Policy")
    memory = sd.get("memory_size_vector")
    if any(k.startswith("network_body.lstm.") for k in sd) or (memory is not None and memory.size and memory.ravel()[0]):
        raise BadModelError(f"{what}'s Policy has an LSTM memory (network_settings.memory): policyport reads "
                            "ML-Agents' feed-forward actors, not recurrent ones")
    body = [k for k in sd if k.startswith("network_body._body_endoder.")]
    if not any(k.startswith(f"{BODY}.") for k in sd) or any(not k.startswith(f"{BODY}.") for k in body):
        raise BadModelError(f"{what}'s Policy has no {BODY} (a LinearEncoder body): a goal-conditioned "
                            "(hypernetwork) body is not read")
    for key in sd:
        if key.startswith((f"{ENCODER}.", f"{ALIAS}.")) and ".normalizer." not in key \
                or key.startswith(("network_body.observation_encoder.rsa", "network_body.observation_encoder.x_self")):
            raise BadModelError(f"{what}'s Policy holds {key}: policyport reads vector observations only; visual "
                                "encoders and variable-length (attention) observations are not read")
    numbered = _indices(sd, BODY)
    if any(i % 2 for i in numbered):
        raise BadModelError(f"{what}: {BODY} holds parameters at odd indices ({numbered}), where ML-Agents puts Swish")
    layout = Layout([linear_layer(sd, f"{BODY}.{i}", what) for i in numbered])
    if f"{CONTINUOUS}.mu.weight" in sd:
        layout.mu = linear_layer(sd, f"{CONTINUOUS}.mu", what)
        if f"{CONTINUOUS}.log_sigma" in sd:
            log_sigma = sd[f"{CONTINUOUS}.log_sigma"]
            if log_sigma.shape != (1, layout.actions):
                raise BadModelError(f"{what}: {CONTINUOUS}.log_sigma has shape {log_sigma.shape}; mu outputs "
                                    f"{layout.actions} (a (1, {layout.actions}) parameter was expected)")
            layout.log_sigma = (f"{CONTINUOUS}.log_sigma", log_sigma)
        elif f"{CONTINUOUS}.log_sigma.weight" in sd:
            layout.log_sigma_layer = linear_layer(sd, f"{CONTINUOUS}.log_sigma", what)
        else:
            raise BadModelError(f"{what}'s Policy has {CONTINUOUS}.mu but no log_sigma")
    layout.branches = [linear_layer(sd, f"{DISCRETE}.{i}", what) for i in _indices(sd, DISCRETE)]
    if layout.mu is None and not layout.branches:
        raise BadModelError(f"{what}'s Policy has neither {CONTINUOUS}.mu (continuous actions) nor {DISCRETE} "
                            "(discrete actions)")
    heads = [layout.mu, layout.log_sigma_layer, *layout.branches]
    for (wa, a, _, _), (wb, b, _, _) in zip(layout.layers, layout.layers[1:]):
        if a.shape[0] != b.shape[1]:
            raise BadModelError(f"{what}: {wa} outputs {a.shape[0]} features but {wb} takes {b.shape[1]}")
    hidden = layout.layers[-1][1].shape[0]
    for wname, w, _, _ in filter(None, heads):
        if w.shape[1] != hidden:
            raise BadModelError(f"{what}: the body outputs {hidden} features but {wname} takes {w.shape[1]}")
    for i in _indices(sd, ENCODER):
        roles = {}
        for role in ("running_mean", "running_variance", "normalization_steps"):
            name = f"{ENCODER}.{i}.normalizer.{role}"
            if name not in sd:
                raise BadModelError(f"{what}: {ENCODER}.{i}.normalizer lacks {role}")
            roles[role] = (name, sd[name])
            alias = f"{ALIAS}.{i}.normalizer.{role}"
            if alias in sd:
                if sd[alias].shape != sd[name].shape or sd[alias].tobytes() != sd[name].tobytes():
                    raise BadModelError(f"{what}: {alias} differs from {name}, which ML-Agents keeps as one tensor")
                layout.aliases[name] = alias
        mean, var, steps = (roles[r][1] for r in ("running_mean", "running_variance", "normalization_steps"))
        if mean.ndim != 1 or var.shape != mean.shape or steps.size != 1:
            raise BadModelError(f"{what}: {ENCODER}.{i}.normalizer holds running_mean {mean.shape}, running_variance "
                                f"{var.shape}, normalization_steps {steps.shape}: not a Normalizer's buffers")
        layout.normalizers.append(roles)
    if layout.normalizers:
        widths = [roles["running_mean"][1].shape[0] for roles in layout.normalizers]
        if sum(widths) != layout.obs_dim:
            raise BadModelError(f"{what}: the normalisers cover {' + '.join(map(str, widths))} observations but "
                                f"{BODY}.0 takes {layout.obs_dim}")
    layout.constants = {k: sd[k] for k in CONSTANTS if k in sd}
    used = {n for layer in [*layout.layers, *filter(None, heads)] for n in (layer[0], layer[2])}
    used |= {name for roles in layout.normalizers for name, _ in roles.values()} | set(layout.aliases.values())
    used |= {layout.log_sigma[0]} if layout.log_sigma else set()
    used |= set(layout.constants)
    layout.left_out = [k for k in sd if k not in used]
    layout.order = [k for k in sd if k in used]
    return layout


# ---------------------------------------------------------------- the run's configuration


@dataclass
class RunConfig:
    """What ``configuration.yaml`` says of the checkpoint's behaviour (``None``: not said), and where."""

    path: Path
    behavior: str
    trainer_type: str | None = None
    normalize: bool | None = None
    hidden_units: int | None = None
    num_layers: int | None = None


def behavior_name(checkpoint: Path) -> str:
    """The behaviour a checkpoint belongs to: ``<Behavior>`` of ``<Behavior>-<step>.pt``, else (``checkpoint.pt``)
    the folder ML-Agents names after the behaviour (``trainer_factory.py``: ``os.path.join(output_path,
    brain_name)``)."""
    stem, _, step = checkpoint.stem.rpartition("-")
    return stem if stem and step.isdigit() else checkpoint.parent.name


def read_run_config(checkpoint: Path) -> RunConfig | None:
    """The behaviour's settings from ``results/<run_id>/configuration.yaml`` (``learn.py``,
    ``write_run_options``; the checkpoint lies in ``results/<run_id>/<Behavior>/``), looked for in the
    checkpoint's folder and the one above it; ``None`` when there is none or it names no such behaviour."""
    from ..readers.checkpoints import lookup, read_yaml

    name = behavior_name(checkpoint)
    for folder in (checkpoint.parent.parent, checkpoint.parent):
        path = folder / "configuration.yaml"
        if not path.is_file():
            continue
        settings = lookup(read_yaml(path), "behaviors", name)
        if not isinstance(settings, dict):
            continue
        config = RunConfig(path, name)
        trainer = lookup(settings, "trainer_type")
        config.trainer_type = None if trainer is None else str(trainer).lower()
        network = lookup(settings, "network_settings", default={})
        for key in ("normalize", "hidden_units", "num_layers"):
            value = lookup(network, key)
            where = f"{path}: behaviors.{name}.network_settings.{key}"
            if value is None:
                continue
            if key == "normalize":
                if not isinstance(value, bool):
                    raise BadModelError(f"{where} is {shown(value)}, not true or false")
                config.normalize = value
            else:
                setattr(config, key, whole_number(value, where))
        return config
    return None


def _check_against(config: RunConfig, layout: Layout, what: str) -> None:
    """Refuse a checkpoint its configuration contradicts (another run's file, most likely).

    Raises:
        BadModelError: ``normalize``, ``hidden_units`` or ``num_layers`` differ from the arrays.
    """
    found = {"normalize": bool(layout.normalizers), "hidden_units": int(layout.layers[0][1].shape[0]),
             "num_layers": len(layout.layers)}
    for key, value in found.items():
        said = getattr(config, key)
        if said is not None and said != value:
            raise BadModelError(f"{config.path} gives {config.behavior} network_settings.{key}: {said}, but {what} "
                                f"holds an actor with {key} {value}: the checkpoint is not this run's")
    if config.trainer_type in SQUASHING_TRAINERS and layout.mu is not None and layout.log_sigma_layer is None:
        raise BadModelError(f"{config.path} gives {config.behavior} trainer_type {config.trainer_type}, whose actor has a "
                            f"log_sigma layer, but {what} holds a log_sigma parameter: the checkpoint is not this run's")


# ---------------------------------------------------------------- the graph


def _build(layout: Layout, tanh_squash: bool, opset: int, metadata: dict[str, str]):
    import onnx

    from ..activations import parse_activation
    from ..build import Dense, MlpBuilder, Step, _max_ir_version, _version

    helper, f32 = onnx.helper, np.float32
    FLOAT, INT64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    b = MlpBuilder(opset, np.dtype(f32))

    def const(value, name):
        return b.initializer(np.asarray(value, f32), name)

    x = "obs"
    if layout.normalizers:
        parts, start = [], 0
        for i, roles in enumerate(layout.normalizers):
            scope = f"{ENCODER}.{i}.normalizer"
            width = roles["running_mean"][1].shape[0]
            part = x
            if len(layout.normalizers) > 1:  # this observation's columns of the concatenated input
                part = b.node("Slice", [x, b.constant([start], f"{scope}/start"), b.constant([start + width], f"{scope}/end"),
                                        b.constant([1], f"{scope}/axis")], f"{scope}/observation")
            start += width
            # clamp((x - running_mean) / sqrt(running_variance / normalization_steps), -5, 5); the int64 count
            # cast to float32 as torch promotes it
            names = {role: b.initializer(array, name, name) for role, (name, array) in roles.items()}
            steps = b.node("Cast", [names["normalization_steps"]], f"{scope}/steps_float32", to=FLOAT)
            variance = b.node("Div", [names["running_variance"], steps], f"{scope}/variance")
            std = b.node("Sqrt", [variance], f"{scope}/std")
            scaled = b.node("Div", [b.node("Sub", [part, names["running_mean"]], f"{scope}/centered"), std], f"{scope}/scaled")
            parts.append(b.node("Clip", [scaled, const(-NORMALIZER_CLIP, f"{scope}/clip_min"),
                                         const(NORMALIZER_CLIP, f"{scope}/clip_max")], scope))
        x = parts[0] if len(parts) == 1 else b.node("Concat", parts, "network_body.observation_encoder", axis=1)
    swish = parse_activation("swish")
    for wname, w, bname, bias in layout.layers:
        scope = wname.rsplit(".", 1)[0]
        index = int(scope.rsplit(".", 1)[1])
        x = b.dense(Dense(scope, w, wname, bias, bname, "out_in", None, [Step("activation", f"{BODY}.{index + 1}", swish)]), x)
    outputs = []
    if layout.mu is not None:
        n = layout.actions
        wname, w, bname, bias = layout.mu
        mean = b.dense(Dense(f"{CONTINUOUS}.mu", w, wname, bias, bname, "out_in"), x, "mean")
        if layout.log_sigma is not None:  # mu * 0 + log_sigma: the (1, A) parameter for every row
            name, array = layout.log_sigma
            b.node("Expand", [b.initializer(array, name, name), b.node("Shape", [mean], "log_sigma/batch_shape")], "log_std")
        else:
            swname, sw, sbname, sbias = layout.log_sigma_layer
            raw = b.dense(Dense(f"{CONTINUOUS}.log_sigma", sw, swname, sbias, sbname, "out_in"), x)
            low, high = LOG_SIGMA_RANGE
            b.node("Clip", [raw, const(low, "log_sigma/clip_min"), const(high, "log_sigma/clip_max")], "log_std")
        b.node("Exp", ["log_std"], "std")
        if tanh_squash:
            b.node("Identity", [mean], "action")
        else:
            clamped = b.node("Clip", [mean, const(-ACTION_CLIP, "action/clip_min"), const(ACTION_CLIP, "action/clip_max")],
                             "action/clamped")
            b.node("Div", [clamped, const(ACTION_CLIP, "action/clip")], "action")
        outputs += [helper.make_tensor_value_info(t, FLOAT, ["batch", n]) for t in ("action", "mean", "std", "log_std")]
    inputs = [helper.make_tensor_value_info("obs", FLOAT, ["batch", layout.obs_dim])]
    if layout.branches:
        chosen = discrete_output(layout)
        # the export's action_masks input (1: allowed), here optional: its default, a row of ones, allows every action
        masks = b.initializer(np.ones((1, sum(layout.branch_sizes)), f32), MASKS)
        # its own batch dimension: 1 for the default, the batch when fed (broadcast against the logits)
        inputs.append(helper.make_tensor_value_info(masks, FLOAT, ["mask_batch", sum(layout.branch_sizes)]))
        logits, choices, start = [], [], 0
        for i, (wname, w, bname, bias) in enumerate(layout.branches):
            scope = f"{DISCRETE}.{i}"
            branch = b.dense(Dense(scope, w, wname, bias, bname, "out_in"), x, f"{scope}/logits")
            allow = b.node("Slice", [masks, b.constant([start], f"{scope}/mask_start"),
                                     b.constant([start + w.shape[0]], f"{scope}/mask_end"),
                                     b.constant([1], f"{scope}/mask_axis")], f"{scope}/allow_mask")
            start += w.shape[0]
            # MultiCategoricalDistribution._mask_branch: logits * allow - 1e8 * (-1 * allow + 1)
            block = b.node("Add", [b.node("Mul", [allow, const(-1.0, f"{scope}/minus_one")], f"{scope}/minus_allow"),
                                   const(1.0, f"{scope}/one")], f"{scope}/block_mask")
            masked = b.node("Sub", [b.node("Mul", [branch, allow], f"{scope}/allowed_logits"),
                                    b.node("Mul", [block, const(MASK_PENALTY, f"{scope}/penalty")], f"{scope}/blocked")],
                            f"{scope}/masked_logits")
            probs = b.node("Softmax", [masked], f"{scope}/probs", axis=-1)
            logits.append(branch)
            choices.append(b.node("ArgMax", [probs], f"{scope}/action", axis=1, keepdims=1))
        b.node("Concat", logits, "logits", axis=1)
        b.node("Concat", choices, chosen, axis=1)
        outputs += [helper.make_tensor_value_info(chosen, INT64, ["batch", len(layout.branches)]),
                    helper.make_tensor_value_info("logits", FLOAT, ["batch", sum(layout.branch_sizes)])]
    parameters: dict[str, object] = dict(b.parameters)
    for initializer, source in b.parameters.items():
        if source in layout.aliases:
            parameters[initializer] = {"name": source, "also": [layout.aliases[source]]}
    for name, array in layout.constants.items():  # outputs of ML-Agents' export, read by no computation
        parameters[name] = {"name": name, "value": {"shape": list(array.shape), "dtype": array.dtype.name,
                                                    "data": array.ravel().tolist()}}
    graph = helper.make_graph(b.nodes, "policy", inputs, outputs, b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="policyport",
                              producer_version=_version())
    model.ir_version = min(model.ir_version, _max_ir_version(onnx, opset))
    head = "diag-gaussian" if tanh_squash else "clipped-diag-gaussian"
    head = head if not layout.branches else "categorical" if layout.mu is None else f"{head}+categorical"
    helper.set_model_props(model, {"policyport.parameters": json.dumps(parameters), "policyport.head": head,
                                   "policyport.parameter_order": json.dumps(layout.order), **metadata})
    onnx.checker.check_model(model, full_check=True)
    return model


def normalize(layout: Layout, obs: np.ndarray) -> np.ndarray:
    """Every vector observation's ``Normalizer.forward``, concatenated, in numpy float32 (see the module docstring)."""
    f32 = np.float32
    obs, parts, start = np.asarray(obs, f32), [], 0
    for roles in layout.normalizers:
        mean, var = roles["running_mean"][1], roles["running_variance"][1]
        steps = f32(roles["normalization_steps"][1].reshape(()))
        part = obs[:, start:start + mean.shape[0]]
        start += mean.shape[0]
        parts.append(np.clip((part - mean) / np.sqrt(var / steps), f32(-NORMALIZER_CLIP), f32(NORMALIZER_CLIP)))
    return np.concatenate(parts, axis=1)


def reference_forward(layout: Layout, tanh_squash: bool, feeds) -> dict[str, np.ndarray]:
    """ML-Agents' actor and its export's deterministic actions in numpy float32, in ML-Agents' order of
    operations; tensors named as the graph names them. ``feeds``: the observations (float32, ``(batch,
    obs_dim)``), or a mapping of ``obs`` and, for discrete actions, ``action_masks`` (``(batch, sum of branch
    sizes)``, 1 allowed; every action allowed without it)."""
    from ..activations import parse_activation

    f32 = np.float32
    out: dict[str, np.ndarray] = {}
    feeds = dict(feeds) if isinstance(feeds, dict) else {"obs": feeds}
    x = np.asarray(feeds["obs"], f32)
    if layout.normalizers:
        x = normalize(layout, x)
        name = f"{ENCODER}.0.normalizer" if len(layout.normalizers) == 1 else "network_body.observation_encoder"
        out[name] = x
    swish = parse_activation("swish")
    for wname, w, _, bias in layout.layers:
        scope = wname.rsplit(".", 1)[0]
        x = out[f"{scope}/linear"] = x @ w.T + bias
        x = out[f"{BODY}.{int(scope.rsplit('.', 1)[1]) + 1}/swish"] = swish.reference(x).astype(f32)
    if layout.mu is not None:
        _, w, _, bias = layout.mu
        mean = out["mean"] = x @ w.T + bias
        if layout.log_sigma is not None:
            log_std = mean * f32(0) + layout.log_sigma[1]
        else:
            _, sw, _, sb = layout.log_sigma_layer
            log_std = np.clip(x @ sw.T + sb, f32(LOG_SIGMA_RANGE[0]), f32(LOG_SIGMA_RANGE[1]))
        out["log_std"], out["std"] = log_std, np.exp(log_std)
        out["action"] = mean if tanh_squash else np.clip(mean, f32(-ACTION_CLIP), f32(ACTION_CLIP)) / f32(ACTION_CLIP)
    if not layout.branches:
        return out
    logits = [x @ w.T + bias for _, w, _, bias in layout.branches]
    out["logits"] = np.concatenate(logits, axis=1)
    masks = np.asarray(feeds.get(MASKS, np.ones((1, out["logits"].shape[1]))), f32)
    choices, start = [], 0
    for branch in logits:
        allow = masks[:, start:start + branch.shape[1]]
        start += branch.shape[1]
        masked = branch * allow - f32(MASK_PENALTY) * (f32(-1) * allow + f32(1))
        e = np.exp(masked - masked.max(axis=1, keepdims=True))  # CategoricalDistInstance: argmax of the softmax
        choices.append(np.argmax(e / e.sum(axis=1, keepdims=True), axis=1))
    out[discrete_output(layout)] = np.stack(choices, axis=1).astype(np.int64)
    return out


def discrete_output(layout: Layout) -> str:
    """The name of the discrete actions' output: ``action``, or ``discrete_action`` beside a continuous ``action``
    in a hybrid action space."""
    return "action" if layout.mu is None else "discrete_action"


def convert_ml_agents(source, options):
    """Convert an ML-Agents ``.pt`` checkpoint (see the module docstring) to ONNX.

    Args:
        source: the checkpoint's path (``<Behavior>-<step>.pt`` or ``checkpoint.pt``).
        options: a :class:`~policyport.converter.ConvertOptions`; only ``opset`` applies.

    Returns:
        A :class:`~policyport.converter.Converted`: input ``obs`` (float32, ``(batch, obs_dim)``, the raw
        vector observations concatenated in the behaviour's sensor order, as ML-Agents' ``obs_0``,
        ``obs_1`` ... inputs side by side), for discrete actions also the optional input ``action_masks``
        (float32, ``(batch, sum of branch sizes)``, 1 allowed, 0 masked; default one row of ones); continuous outputs ``action`` (the export's
        ``deterministic_continuous_actions``), ``mean``, ``std`` and ``log_std``, each ``(batch, A)``;
        discrete outputs ``action`` (int64, ``(batch, branches)``, the export's
        ``deterministic_discrete_actions``) and ``logits`` (``(batch, sum of branch sizes)``, the branches'
        logits side by side); a hybrid action space has both, its discrete actions named
        ``discrete_action``; initializers under ML-Agents' keys (``network_body._body_endoder.seq_layers.0.weight``,
        ``network_body.observation_encoder.processors.0.normalizer.running_mean`` ...), the normaliser's
        second names and the export's constants recorded so that ``extract`` gives every array back; the
        reference is ML-Agents' forward rebuilt in numpy.

    Raises:
        UnreadableFileError: not a torch zip holding a dict.
        BadModelError: an actor this reader does not read (LSTM, visual or attention encoders, a goal-
            conditioned body), or a configuration.yaml that contradicts the checkpoint.
    """
    from ...io.kinds import sha256_file
    from ..assumptions import Assumption, joined, reconstruction
    from ..options import Converted
    from ..readers.checkpoints import read_checkpoint

    path = Path(os.fspath(source))
    what = str(path)
    layout = read_layout(read_checkpoint(path, "ML-Agents"), what)
    config = read_run_config(path)
    notes: list[str] = []
    if config is not None:
        _check_against(config, layout, what)
    swish_at = [f"{BODY}.{int(w.rsplit('.', 2)[1]) + 1}" for w, *_ in layout.layers]
    assumptions = [Assumption("activation", f"swish at {joined(swish_at)}",
                              "ML-Agents' LinearEncoder puts Swish (x * sigmoid(x)) after every layer and has no setting "
                              "for it (mlagents/trainers/torch_entities/layers.py); the checkpoint does not record it")]
    tanh_squash = False
    if layout.mu is not None:
        conditional = layout.log_sigma_layer is not None
        trainer = config.trainer_type if config else None
        if trainer in SQUASHING_TRAINERS or trainer in CLIPPING_TRAINERS:
            tanh_squash = trainer in SQUASHING_TRAINERS
            because = (f"read from {config.path} (trainer_type {trainer}); ML-Agents builds the {trainer} actor with "
                       f"tanh_squash {'on' if tanh_squash else 'off'} ({trainer}/trainer.py), which the checkpoint does "
                       "not record")
        else:
            tanh_squash = conditional
            said = (f"{config.path} gives trainer_type {trainer}, which ML-Agents does not ship" if trainer
                    else "no configuration.yaml of the run lies two folders above it")
            told = ("a layer (conditional_sigma), as only SAC builds it, and SAC builds it with tanh_squash on"
                    if conditional else "a parameter, as PPO and POCA build it, with tanh_squash off")
            because = (f"told from the layout: log_sigma is {told} (ppo/trainer.py, sac/trainer.py); the checkpoint "
                       f"does not record tanh_squash and {said}")
        if tanh_squash:
            assumes = ("tanh_squash on: action = mean as the network outputs it (the export's deterministic action; "
                       "TanhGaussianDistInstance does not squash it)")
        else:
            assumes = f"tanh_squash off: action = clamp(mean, -{ACTION_CLIP:g}, {ACTION_CLIP:g}) / {ACTION_CLIP:g}"
        assumptions.append(Assumption("head", assumes, because))
    if layout.branches:
        assumptions.append(Assumption("action masks", "every action of every branch allowed unless action_masks "
                                      "is fed", "ML-Agents' export takes action_masks from the environment at each "
                                      "step; the graph's action_masks input is optional, its default a mask of ones",
                                      "feed action_masks (1 allowed, 0 masked)"))
    if not layout.normalizers:
        notes.append(f"{what} holds no normaliser (network_settings.normalize was off): the policy reads the "
                     "observations as the environment gives them")
    if config is None:
        notes.append(f"no configuration.yaml naming the behaviour {behavior_name(path)} lies beside {what}; "
                     "hidden units, layers and normalisation were read from the arrays")
    if layout.left_out:
        notes.append(f"left out of the graph: {', '.join(layout.left_out)}")
    source_info = {"kind": "ml-agents", "file": path.name, "sha256": sha256_file(path), "behavior": behavior_name(path)}
    if config is not None:
        source_info["config"] = str(config.path)
    metadata = {"policyport.source": json.dumps(source_info), "policyport.activation": "swish"}
    if layout.normalizers:
        metadata["policyport.observation_filter"] = json.dumps(
            {"type": "Normalizer", "library": "ml-agents",
             "formula": "clip((x - running_mean) / sqrt(running_variance / normalization_steps), -clip, clip)",
             "epsilon": 0.0, "clip": NORMALIZER_CLIP,
             "normalization_steps": [int(r["normalization_steps"][1].reshape(())) for r in layout.normalizers]})
    model = _build(layout, tanh_squash, options.opset, metadata)
    return Converted(model, lambda obs: reference_forward(layout, tanh_squash, obs), "ml-agents", notes=notes,
                     assumptions=assumptions, oracle=reconstruction("the arrays of an ML-Agents checkpoint"))
