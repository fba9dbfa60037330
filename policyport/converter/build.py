"""Build an MLP policy as an ONNX model with ``onnx.helper``, naming everything after the source.

Converters describe the network as :class:`Dense` layers holding the source's own arrays under the
source's own parameter names; :func:`build_mlp` lays them out so that no array is changed:

* a weight stored ``[in, out]`` (TF/Keras ``kernel``) becomes Gemm's ``B`` as is; one stored
  ``[out, in]`` (torch ``weight``) becomes ``B`` with ``transB=1`` (Gemm, https://onnx.ai/onnx/operators/onnx__Gemm.html);
* initializers are named by the source's parameter names (``default_policy/fc_1/kernel``), and the
  model's ``metadata_props["policyport.parameters"]`` records initializer -> source name, so
  :func:`policyport.graph.passes.extract_weights` returns the source's arrays bit for bit;
* tensors are named ``<layer>/linear`` before the activation and ``<layer>/<activation>`` after it;
  the output layer's raw output is ``logits``, a value branch's is ``value``.

Heads (``head=``): ``None`` outputs ``logits`` and the spec's own action head, if any; ``"none"``
outputs ``logits`` only; ``"diag-gaussian"`` adds ``action`` (the mean
half of ``logits``: the deterministic action) and ``log_std`` (the other half), as RLlib's
``DiagGaussian`` splits its inputs (``ray/rllib/models/tf/tf_action_dist.py``); ``"categorical"``
adds ``action`` = argmax of ``logits`` (int64). Without ``head``, a spec's own :class:`ActionHead`
(SB3's deterministic action: argmax, one argmax per MultiDiscrete sub-space, the Gaussian mean clipped
to the bounds, tanh rescaled to the bounds) is built by :func:`add_action_head`; SB3's VecNormalize
by :func:`add_obs_norm`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import BadModelError, LimitExceededError, OptionError, require
from ..graph.model import INPUT_RANGES_KEY
from .activations import Activation

#: ``head=`` values. ``diag-gaussian`` splits ``logits`` into a mean and a log_std half where the source
#: says that is what they are (a free log_std parameter, or a layout whose convention it is: RLlib's);
#: ``diag-gaussian:halves`` states that the last layer's outputs are such halves for a source that
#: cannot say (see :func:`policyport.converter.assumptions.head_assumption`).
HEADS = ("diag-gaussian", "diag-gaussian:halves", "categorical")
#: The heads that split ``logits`` into ``action`` (the mean) and ``log_std``.
GAUSSIAN_HEADS = ("diag-gaussian", "diag-gaussian:halves")
#: ``head=`` asking for no head at all: ``logits`` only, without the source's own action head
#: (``head=None`` leaves the head to the source).
NO_HEAD = "none"
MIN_OPSET = 11
DEFAULT_OPSET = 17


@dataclass
class Dense:
    """One fully connected layer, in the source's layout.

    Attributes:
        name: the source's layer name, used for tensor and node names (``"fc_1"``).
        weight: float array, shape ``(in, out)`` if ``weight_layout == "in_out"`` else ``(out, in)``.
        weight_name: the source's parameter name of ``weight``.
        bias: float array, shape ``(out,)``, or ``None`` for a layer without bias.
        bias_name: the source's parameter name of ``bias``.
        activation: applied after the affine map; ``None`` for a linear layer.
        post: the modules after the affine map, in order, each named by its own module path (a
            torch ``nn.Sequential``'s ``LayerNorm``, ``BatchNorm1d`` and activation modules); empty
            means ``activation`` alone, named after the layer.
    """

    name: str
    weight: np.ndarray
    weight_name: str
    bias: np.ndarray | None = None
    bias_name: str | None = None
    weight_layout: str = "in_out"
    activation: Activation | None = None
    post: list[Step] = field(default_factory=list)

    @property
    def in_features(self) -> int:
        return self.weight.shape[0 if self.weight_layout == "in_out" else 1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[1 if self.weight_layout == "in_out" else 0]

    def steps(self) -> list[Step]:
        """What follows the affine map: ``post``, or the one ``activation`` named after the layer."""
        if self.post:
            return self.post
        return [Step("activation", self.name, self.activation)] if self.activation is not None else []


@dataclass
class Step:
    """One module applied after a layer's affine map, named by its module path.

    Attributes:
        kind: ``"activation"``, ``"layer_norm"`` (torch ``nn.LayerNorm`` over the last axis) or
            ``"batch_norm"`` (torch ``nn.BatchNorm1d`` in eval mode: running statistics).
        scope: the module path; the step's output tensor is ``<scope>/<role>`` (role: the
            activation's label, ``layer_norm`` or ``batch_norm``).
        activation: the activation, for ``kind == "activation"``.
        params: role -> (source parameter name, array): ``weight``, ``bias`` (and
            ``running_mean``, ``running_var`` for batch_norm), float arrays of shape ``(features,)``.
        eps: the normalisation's epsilon (torch's default 1e-5).
    """

    kind: str
    scope: str
    activation: Activation | None = None
    params: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)
    eps: float = 1e-5

    @property
    def role(self) -> str:
        return self.activation.label if self.kind == "activation" else self.kind

    @property
    def tensor(self) -> str:
        return f"{self.scope}/{self.role}"


@dataclass
class ObsNorm:
    """Observation normalisation as SB3's ``VecNormalize.normalize_obs`` applies it
    (``stable_baselines3/common/vec_env/vec_normalize.py``): in float64,
    ``clip((obs - mean) / sqrt(var + epsilon), -clip_obs, clip_obs)``, then cast to the policy's dtype.

    Attributes:
        mean, var: float64 arrays, shape ``(obs_dim,)`` (``obs_rms.mean``, ``obs_rms.var``).
        epsilon: added to ``var`` (SB3's default 1e-8). clip_obs: the clip bound (default 10).
        mean_name, var_name: parameter names recorded for ``extract``.
    """

    mean: np.ndarray
    var: np.ndarray
    epsilon: float = 1e-8
    clip_obs: float = 10.0
    mean_name: str = "obs_rms.mean"
    var_name: str = "obs_rms.var"

    def to_dict(self) -> dict:
        """As the model metadata ``policyport.observation_filter`` records it."""
        return {"type": "VecNormalize", "epsilon": float(self.epsilon), "clip_obs": float(self.clip_obs),
                "mean": [float(v) for v in np.ravel(self.mean)], "var": [float(v) for v in np.ravel(self.var)]}


@dataclass
class ActionHead:
    """The deterministic action as an SB3 policy's ``predict(obs, deterministic=True)`` computes it.

    Attributes:
        kind: ``"argmax"`` (Discrete: argmax of ``logits``, int64 ``(batch,)``); ``"multi_argmax"``
            (MultiDiscrete: one argmax per sub-space of ``logits``, int64 ``(batch, len(nvec))``);
            ``"clip"`` (Box, Gaussian: the mean clipped to ``[low, high]``); ``"squash"`` (Box,
            squashed: ``tanh`` of ``logits`` rescaled from [-1, 1] to ``[low, high]``; SAC's squashed
            Gaussian, and TD3/DDPG, whose actor ends in an ``nn.Tanh``); ``"quantile_argmax"``
            (sb3-contrib's QR-DQN: ``logits`` viewed as ``(batch, quantiles, n_actions)``, averaged
            over the quantiles into ``q_values`` ``(batch, n_actions)``, then argmax, int64 ``(batch,)``;
            ``sb3_contrib/qrdqn/policies.py``, ``QuantileNetwork._predict``).
        low, high: the Box bounds, arrays of shape ``(action_dim,)`` in the policy's dtype.
        nvec: the MultiDiscrete sizes.
        quantiles: QR-DQN's quantiles per action (``n_quantiles``).
        tanh_scope: the module path naming the squashing tanh (``actor.mu.5`` for TD3) or
            ``"action"`` when the tanh is part of the distribution (SAC).
    """

    kind: str
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    nvec: tuple[int, ...] = ()
    tanh_scope: str = "action"
    quantiles: int = 0

    @property
    def name(self) -> str:
        """What the model metadata ``policyport.head`` calls this head: ``categorical``,
        ``multi-categorical``, ``diag-gaussian`` (``action`` = the mean, with ``log_std``; unbounded),
        ``clipped-diag-gaussian`` (the mean clipped to finite bounds), ``squashed`` (tanh, rescaled) or
        ``quantile-argmax`` (the argmax of the mean over quantiles)."""
        if self.kind == "clip":
            bounded = np.isfinite(self.low).any() or np.isfinite(self.high).any()
            return "clipped-diag-gaussian" if bounded else "diag-gaussian"
        return {"argmax": "categorical", "multi_argmax": "multi-categorical", "squash": "squashed",
                "quantile_argmax": "quantile-argmax"}.get(self.kind, self.kind)


@dataclass
class MlpSpec:
    """A whole policy network.

    Attributes:
        hidden: the policy branch's hidden layers, in order.
        output: the layer producing ``logits`` (or, with ``free_log_std``, the mean).
        value_hidden: the value branch's own hidden layers (empty when it shares the policy's).
        value_output: the layer producing ``value``, or ``None`` to export no value function.
        free_log_std: RLlib's state-independent ``log_std`` vector, concatenated after the mean.
        free_log_std_name: its source parameter name.
        source: provenance recorded in the model metadata (kind, file, sha256 ...).
        obs_shape: the observation's shape without the batch axis when it is not ``(obs_dim,)``:
            the graph input then has that shape and is flattened first (torch ``nn.Flatten``).
        flatten_scope: the module path naming that flatten (``<scope>/flatten``).
        obs_norm: observation normalisation applied first (SB3's VecNormalize), or ``None``.
        trunk: layers shared by the policy and value branches, before both (SB3's ``shared_net``).
        action: the source's own action head (SB3), used when no ``head`` is asked for.
        activation_slots: ``(module path, activation)`` of every place a parser put an activation
            the file does not name (a state_dict's parameter-free modules), for the assumption.
        assumptions: what the parser took as fact beyond the file (a parameter-free module read as
            ``nn.Flatten``, action bounds a state_dict does not hold ...).
    """

    hidden: list[Dense]
    output: Dense
    value_hidden: list[Dense] = field(default_factory=list)
    value_output: Dense | None = None
    free_log_std: np.ndarray | None = None
    free_log_std_name: str | None = None
    source: dict = field(default_factory=dict)
    obs_shape: tuple[int, ...] | None = None
    flatten_scope: str = "flatten"
    obs_norm: ObsNorm | None = None
    trunk: list[Dense] = field(default_factory=list)
    action: ActionHead | None = None
    activation_slots: list[tuple[str, str]] = field(default_factory=list)
    assumptions: list = field(default_factory=list)

    @property
    def obs_dim(self) -> int:
        return (self.trunk[0] if self.trunk else self.hidden[0] if self.hidden else self.output).in_features

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The observation's shape without the batch axis."""
        return tuple(self.obs_shape) if self.obs_shape else (self.obs_dim,)

    @property
    def dtype(self) -> np.dtype:
        return self.output.weight.dtype


#: The most bytes one protobuf message holds (``INT_MAX``): an ONNX model whose initializers take more
#: must keep them as external data, which the built model does not.
PROTOBUF_BYTES = 2**31 - 1


class MlpBuilder:
    """Accumulates nodes and initializers; one per model."""

    def __init__(self, opset: int, dtype: np.dtype):
        onnx = require("onnx", "onnx", "building an ONNX model")
        self.helper, self.numpy_helper = onnx.helper, onnx.numpy_helper
        self.opset = opset
        self.dtype = np.dtype(dtype)
        self.nodes = []
        self.initializers = []
        self.parameters: dict[str, str] = {}
        self._names: set[str] = set()
        self._bytes = 0

    def node(self, op_type: str, inputs: list[str], output: str, **attrs) -> str:
        if output in self._names:
            raise BadModelError(f"tensor name {output!r} would be produced twice; the source has duplicate layer names")
        self._names.add(output)
        self.nodes.append(self.helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output

    #: Tensor names the builder gives node outputs (the graph's input and outputs); a source parameter
    #: of the same name (an unprefixed RLlib ``log_std``) gets another initializer name, and
    #: ``policyport.parameters`` maps it back to the source's name.
    RESERVED = frozenset({"obs", "logits", "action", "log_std", "value"})

    def torch_mlp(self, layers, activation, x: str) -> str:
        """The hidden layers of a torch ``nn.Sequential`` MLP whose ``Linear`` layers sit at even indices
        and their activation modules at the odd ones (rl_games' ``actor_mlp``, torchrl's ``MLP``).

        Args:
            layers: ``(weight name, weight (out, in), bias name, bias (out,))`` per layer, the weight
                names ending ``<module path>.<index>.weight``.
            activation: the :class:`~policyport.converter.activations.Activation` after each, or ``None``.
            x: the input tensor's name.

        Returns:
            The last layer's output tensor: ``<module path>.<index + 1>/<activation>``, or
            ``<module path>.<index>/linear`` without an activation.
        """
        for wname, w, bname, bias in layers:
            scope = wname.rsplit(".", 1)[0]
            path, index = scope.rsplit(".", 1)
            post = [] if activation is None else [Step("activation", f"{path}.{int(index) + 1}", activation)]
            x = self.dense(Dense(scope, w, wname, bias, bname, "out_in", None, post), x)
        return x

    def initializer(self, array: np.ndarray, name: str, source_name: str | None = None) -> str:
        if name in self._names and source_name is None:
            raise BadModelError(f"parameter name {name!r} occurs twice")
        base, n = name, 1
        while name in self._names or name in self.RESERVED:
            name = f"{base}/parameter" + (f"_{n}" if n > 1 else "")
            n += 1
        self._names.add(name)
        array = np.asarray(array)
        self._bytes += array.nbytes  # the bytes it takes once written out (a stride-0 array's too)
        if self._bytes > PROTOBUF_BYTES:
            from ..io.limits import format_size

            raise LimitExceededError(
                f"the model's initializers would take {format_size(self._bytes)} once {name!r} ({array.dtype}, shape "
                f"{array.shape}) is added, more than the 2 GiB one ONNX protobuf holds; policyport writes a model's "
                "weights inside it, not as external data")
        self.initializers.append(self.numpy_helper.from_array(array, name))
        if source_name is not None:
            self.parameters[name] = source_name
        return name

    def constant(self, values, name: str) -> str:
        """An int64 constant (Slice bounds and the like): an initializer not recorded as a parameter."""
        return self.initializer(np.asarray(values, dtype=np.int64), name)

    def reduce_mean(self, x: str, axis: int, output: str, axes_name: str, *, keepdims: int) -> str:
        """``ReduceMean`` of ``x`` over ``axis``: its axes an attribute before opset 18 and an input
        (the int64 constant ``axes_name``) from 18 on (https://onnx.ai/onnx/operators/onnx__ReduceMean.html)."""
        if self.opset >= 18:
            return self.node("ReduceMean", [x, self.constant([axis], axes_name)], output, keepdims=keepdims)
        return self.node("ReduceMean", [x], output, axes=[axis], keepdims=keepdims)

    def dense(self, layer: Dense, x: str, output: str | None = None) -> str:
        """Gemm (+ activation) for ``layer``; returns the output tensor's name."""
        w = self.initializer(layer.weight, layer.weight_name, layer.weight_name)
        inputs = [x, w]
        if layer.bias is not None:
            inputs.append(self.initializer(layer.bias, layer.bias_name, layer.bias_name))
        steps = layer.steps()
        linear = output if output and not steps else f"{layer.name}/linear"
        trans_b = 1 if layer.weight_layout == "out_in" else 0
        y = self.node("Gemm", inputs, linear, transB=trans_b)
        for i, step in enumerate(steps):
            y = self.step(step, y, output if output and i == len(steps) - 1 else step.tensor)
        return y

    def step(self, step: Step, x: str, out: str) -> str:
        """The ONNX nodes of one :class:`Step` applied to ``x``; the last one is named ``out``."""
        if step.kind == "activation":
            return self.activation(step.activation, x, out)
        params = {role: self.initializer(step.params[role][1], step.params[role][0], step.params[role][0])
                  for role in ("weight", "bias", "running_mean", "running_var") if role in step.params}
        if step.kind == "layer_norm":
            if self.opset < 17:
                raise BadModelError(
                    f"LayerNorm module {step.scope!r} needs ONNX LayerNormalization, which opset {self.opset} lacks "
                    "(it exists from opset 17); convert with --opset 17 or newer"
                )
            return self.node("LayerNormalization", [x, *params.values()], out, axis=-1, epsilon=step.eps)
        if step.kind == "batch_norm":
            # BatchNormalization takes a scale and a bias; a BatchNorm1d(affine=False) has neither, and
            # a scale of 1 and a bias of 0 leave its normalised values exactly as they are
            like = step.params["running_mean"][1]
            for role, fill, name in (("weight", 1, "unit_scale"), ("bias", 0, "zero_bias")):
                if role not in params:
                    params[role] = self.initializer(np.full(like.shape, fill, like.dtype), f"{step.scope}/{name}")
            inputs = [params[role] for role in ("weight", "bias", "running_mean", "running_var")]
            return self.node("BatchNormalization", [x, *inputs], out, epsilon=step.eps)
        raise BadModelError(f"unknown layer step {step.kind!r} for {step.scope!r}")

    def activation(self, act: Activation, x: str, out: str) -> str:
        """The ONNX nodes of ``act`` applied to ``x``; the last one is named ``out``."""
        simple = {"tanh": "Tanh", "relu": "Relu", "elu": "Elu", "selu": "Selu", "softplus": "Softplus"}
        if act.name in simple:
            return self.node(simple[act.name], [x], out)
        if act.name == "leaky_relu":
            return self.node("LeakyRelu", [x], out, alpha=act.alpha)
        if act.name == "sigmoid":
            return self.node("Sigmoid", [x], out)
        if act.name == "mish":
            if self.opset >= 18:
                return self.node("Mish", [x], out)
            # x * tanh(softplus(x)), Mish's definition (the form torch.onnx exports before Mish-18)
            t = self.node("Tanh", [self.node("Softplus", [x], f"{out}/softplus")], f"{out}/tanh")
            return self.node("Mul", [x, t], out)
        if act.name == "hardswish":
            if self.opset >= 14:
                return self.node("HardSwish", [x], out)
            return self.node("Mul", [x, self.node("HardSigmoid", [x], f"{out}/hard_sigmoid", alpha=1 / 6, beta=0.5)], out)
        if act.name == "swish":
            s = self.node("Sigmoid", [x], f"{out}/sigmoid")
            return self.node("Mul", [x, s], out)
        if act.name == "gelu":
            if self.opset >= 20:
                return self.node("Gelu", [x], out)
            # x * 0.5 * (1 + erf(x / sqrt(2))), the form torch.onnx exports before Gelu-20
            sqrt2 = self.initializer(np.array(math.sqrt(2), dtype=self.dtype), f"{out}/sqrt2")
            one = self.initializer(np.array(1.0, dtype=self.dtype), f"{out}/one")
            half = self.initializer(np.array(0.5, dtype=self.dtype), f"{out}/half")
            e = self.node("Erf", [self.node("Div", [x, sqrt2], f"{out}/scaled")], f"{out}/erf")
            p = self.node("Mul", [x, self.node("Add", [e, one], f"{out}/erf_plus_one")], f"{out}/x_times")
            return self.node("Mul", [p, half], out)
        raise BadModelError(f"activation {act.name!r} has no ONNX form")  # parse_activation prevents this

    def scalar(self, value, name: str) -> str:
        """An initializer named ``name`` holding ``value`` in the builder's dtype (a clip bound, an epsilon)."""
        return self.initializer(np.asarray(value, self.dtype), name)

    def finish(self, obs_dim: int, outputs: list[tuple[str, int, list]], head: str, metadata: dict[str, str]):
        """The model of what was built (see :func:`policy_model`): graph input ``obs`` (the builder's
        dtype, ``(batch, obs_dim)``), ``outputs`` as ``(name, ONNX element type, shape)`` or ONNX value infos,
        ``policyport.head`` (``head``) beside ``metadata`` in its metadata_props.

        Raises:
            BadModelError: the model fails ``onnx.checker`` (a bug of the converter, the details kept).
        """
        helper = self.helper
        graph_input = helper.make_tensor_value_info("obs", helper.np_dtype_to_tensor_dtype(self.dtype), ["batch", obs_dim])
        return policy_model(self, [graph_input], [helper.make_tensor_value_info(*output) if isinstance(output, tuple)
                                                  else output for output in outputs],
                            {"policyport.head": head, **metadata})


def build_mlp(spec: MlpSpec, *, head: str | None = None, opset: int = DEFAULT_OPSET,
              input_name: str = "obs", metadata: dict[str, str] | None = None,
              prelude: Prelude | None = None, postlude: Callable | None = None, logits_name: str = "logits"):
    """The ONNX model of ``spec``.

    Args:
        spec: the network, with the source's arrays and names.
        head: ``None``, ``"none"``, ``"diag-gaussian"`` or ``"categorical"`` (see the module docstring).
        opset: default-domain opset, ``MIN_OPSET`` (11) up to what the installed onnx supports;
            default 17.
        input_name: the graph input, ``obs`` by convention.
        metadata: extra ``metadata_props``.
        prelude: what the source applies to the observation before the network (an observation
            preprocessor, an observation filter: see :class:`Prelude`); it may change the graph
            input's dtype and shape.
        postlude: ``postlude(builder, logits, value, outputs)`` adds nodes after the network and
            appends their graph outputs' value infos to ``outputs``, or replaces them (a dueling DQN,
            whose logits are the Q-values it combines from its advantage and value streams).
        logits_name: the output layer's tensor, ``logits`` unless a postlude computes the logits
            from it (a dueling DQN's ``advantages``).

    Returns:
        An ``onnx.ModelProto`` that passes ``onnx.checker.check_model(full_check=True)``, with graph
        input ``obs`` (dtype of the weights, shape ``("batch", obs_dim)``) and outputs ``logits``
        (+ the head's ``action``/``log_std``, + ``value`` when a value branch is given).

    Raises:
        OptionError: an unknown head, an opset out of range.
        BadModelError: layer widths that do not chain, a one-hot observation encoding or an
            observation filter whose width is not the first layer's, or a diag-gaussian head on an
            odd number of logits.
    """
    onnx = require("onnx", "onnx", "building an ONNX model")
    helper = onnx.helper
    if head not in (None, NO_HEAD, *HEADS):
        raise OptionError(f"unknown head {head!r}; choose one of {', '.join(HEADS)} (or none)")
    max_opset = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= max_opset:
        raise OptionError(f"opset {opset} is out of range: policyport builds opset {MIN_OPSET} to {max_opset}")
    _check_chain([*spec.trunk, *spec.hidden, spec.output], "policy")
    check_free_log_std(spec)
    _check_head(spec, head)
    if spec.value_output is not None:
        branch = spec.value_hidden or spec.hidden
        _check_chain([*spec.trunk, *branch, spec.value_output], "value")
        if not spec.trunk and branch and branch[0].in_features != spec.obs_dim:
            raise BadModelError(
                f"value branch layer {branch[0].name!r} takes {branch[0].in_features} inputs, the observation has {spec.obs_dim}"
            )
    if spec.obs_shape and math.prod(spec.obs_shape) != spec.obs_dim:
        raise BadModelError(f"an observation of shape {tuple(spec.obs_shape)} flattens to {math.prod(spec.obs_shape)} "
                            f"features, but the first layer takes {spec.obs_dim}")
    if prelude is not None and prelude.width is not None and prelude.width != spec.obs_dim:
        space = (f"Discrete({prelude.one_hot})" if prelude.one_hot is not None
                 else f"MultiDiscrete{list(prelude.one_hot_nvec)}")
        raise BadModelError(f"the observation space {space} one-hot encodes to {prelude.width} features, "
                            f"but the first layer takes {spec.obs_dim}")
    filt = prelude.obs_filter if prelude is not None else None
    if filt is not None and (np.size(filt.mean) != spec.obs_dim or np.size(filt.std) != spec.obs_dim):
        # checked before the statistics are written out (as graph constants and JSON metadata)
        raise BadModelError(f"the observation filter holds {np.size(filt.mean):,} means and {np.size(filt.std):,} "
                            f"standard deviations, but the first layer takes {spec.obs_dim} features")
    dtype = spec.dtype
    elem = onnx.helper.np_dtype_to_tensor_dtype(dtype)
    b = MlpBuilder(opset, dtype)

    x = input_name if prelude is None else prelude.build(b, input_name)
    if spec.obs_shape and len(spec.obs_shape) != 1:
        x = b.node("Flatten", [x], f"{spec.flatten_scope}/flatten", axis=1)
    if spec.obs_norm is not None:
        x = add_obs_norm(b, x, spec.obs_norm)
    for layer in spec.trunk:
        x = b.dense(layer, x)
    trunk_out = x
    for layer in spec.hidden:
        x = b.dense(layer, x)
    n_logits = spec.output.out_features
    if spec.free_log_std is not None:
        mean = b.dense(spec.output, x, f"{spec.output.name}/mean")
        log_std_param = b.initializer(spec.free_log_std, spec.free_log_std_name, spec.free_log_std_name)
        shape = b.node("Shape", [mean], f"{spec.output.name}/mean_shape")
        tiled = b.node("Expand", [log_std_param, shape], f"{spec.output.name}/free_log_std")
        logits = b.node("Concat", [mean, tiled], logits_name, axis=1)
        n_logits += spec.free_log_std.shape[-1]
    else:
        logits = b.dense(spec.output, x, logits_name)
    outputs = [helper.make_tensor_value_info(logits, elem, ["batch", n_logits])]

    if head in GAUSSIAN_HEADS:
        half = n_logits // 2
        axes = b.constant([1], "head/axes")
        mid = b.constant([half], "head/mid")
        b.node("Slice", [logits, b.constant([0], "head/zero"), mid, axes], "action")
        b.node("Slice", [logits, mid, b.constant([n_logits], "head/end"), axes], "log_std")
        outputs += [helper.make_tensor_value_info("action", elem, ["batch", half]),
                    helper.make_tensor_value_info("log_std", elem, ["batch", half])]
    elif head == "categorical":
        b.node("ArgMax", [logits], "action", axis=1, keepdims=0)
        outputs.append(helper.make_tensor_value_info("action", onnx.TensorProto.INT64, ["batch"]))
    elif head is None and spec.action is not None:
        outputs += add_action_head(b, spec, logits, elem)

    if spec.value_output is not None:
        v = trunk_out
        for layer in spec.value_hidden:
            v = b.dense(layer, v)
        if not spec.value_hidden:
            v = x
        b.dense(spec.value_output, v, "value")
        outputs.append(helper.make_tensor_value_info("value", elem, ["batch", spec.value_output.out_features]))
    if postlude is not None:
        postlude(b, logits, "value" if spec.value_output is not None else None, outputs)

    graph_input = (helper.make_tensor_value_info(input_name, elem, ["batch", *spec.input_shape]) if prelude is None
                   else prelude.graph_input(helper, input_name, elem, spec.input_shape))
    props = {
        "policyport.head": spec.action.name if head is None and spec.action is not None else head_name(head),
        "policyport.source": json.dumps(spec.source),
        **({"policyport.observation_filter": json.dumps(spec.obs_norm.to_dict())} if spec.obs_norm is not None else {}),
        **(prelude.metadata(input_name) if prelude is not None else {}),
        **(metadata or {}),
    }
    return policy_model(b, [graph_input], outputs, props)


def policy_model(b: MlpBuilder, inputs: list, outputs: list, props: dict[str, str]):
    """The model of the graph ``b`` built: ``b``'s nodes and initializers between the graph inputs and
    outputs (``onnx.ValueInfoProto`` lists), opset ``b.opset`` with the IR version that goes with it,
    ``policyport.parameters`` (initializer -> source parameter name) and ``props`` as metadata.

    Raises:
        BadModelError: the model fails ``onnx.checker.check_model(full_check=True)``, its type and
            shape inference included (arrays of a source that do not fit together, a bool statistic
            where a float goes; or a bug of the converter that built it: the message keeps the
            checker's details).
    """
    onnx = require("onnx", "onnx", "building an ONNX model")
    helper = onnx.helper
    graph = helper.make_graph(b.nodes, "policy", inputs, outputs, b.initializers)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", b.opset)], producer_name="policyport",
        producer_version=_version(),
    )
    model.ir_version = min(model.ir_version, _max_ir_version(onnx, b.opset))
    helper.set_model_props(model, {"policyport.parameters": json.dumps(b.parameters), **props})
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:  # keep the details
        raise BadModelError(f"the built model fails onnx.checker: {e}") from e
    return model


def add_obs_norm(b: MlpBuilder, x: str, norm: ObsNorm) -> str:
    """VecNormalize's observation normalisation (see :class:`ObsNorm`) as ONNX nodes on ``x``.

    Computed in float64 as SB3 computes it (``obs - mean`` promotes the float32 observation), then
    cast back to the policy's dtype; tensors ``vec_normalize/...``, the last ``vec_normalize/obs``.
    """
    onnx = require("onnx", "onnx", "building an ONNX model")
    f64 = onnx.TensorProto.DOUBLE
    mean = b.initializer(np.asarray(norm.mean, np.float64), norm.mean_name, norm.mean_name)
    var = b.initializer(np.asarray(norm.var, np.float64), norm.var_name, norm.var_name)
    eps = b.initializer(np.array(norm.epsilon, np.float64), "vec_normalize/epsilon")
    lo = b.initializer(np.array(-norm.clip_obs, np.float64), "vec_normalize/clip_low")
    hi = b.initializer(np.array(norm.clip_obs, np.float64), "vec_normalize/clip_high")
    x64 = b.node("Cast", [x], "vec_normalize/obs_float64", to=f64)
    centered = b.node("Sub", [x64, mean], "vec_normalize/centered")
    std = b.node("Sqrt", [b.node("Add", [var, eps], "vec_normalize/var_eps")], "vec_normalize/std")
    scaled = b.node("Div", [centered, std], "vec_normalize/scaled")
    clipped = b.node("Clip", [scaled, lo, hi], "vec_normalize/clipped")
    return b.node("Cast", [clipped], "vec_normalize/obs", to=onnx.helper.np_dtype_to_tensor_dtype(b.dtype))


def add_action_head(b: MlpBuilder, spec: MlpSpec, logits: str, elem: int) -> list:
    """The nodes of ``spec.action`` (an SB3 action head, :class:`ActionHead`) reading ``logits``.

    Returns:
        The value infos of the outputs added: ``action`` (and ``log_std`` for a Gaussian with a
        state-independent ``log_std``, ``q_values`` for QR-DQN).
    """
    onnx = require("onnx", "onnx", "building an ONNX model")
    helper, head = onnx.helper, spec.action
    int64 = onnx.TensorProto.INT64
    if head.kind == "argmax":
        b.node("ArgMax", [logits], "action", axis=1, keepdims=0)
        return [helper.make_tensor_value_info("action", int64, ["batch"])]
    if head.kind == "multi_argmax":
        return [add_multi_argmax(b, logits, head.nvec)]
    if head.kind == "quantile_argmax":
        return add_quantile_argmax(b, logits, head.quantiles, spec.output.out_features // head.quantiles, elem)
    n = spec.output.out_features
    if head.kind == "clip":
        mean = f"{spec.output.name}/mean" if spec.free_log_std is not None else logits
        low = b.initializer(np.asarray(head.low, b.dtype), "action/low")
        high = b.initializer(np.asarray(head.high, b.dtype), "action/high")
        b.node("Min", [b.node("Max", [mean, low], "action/above_low"), high], "action")  # np.clip's order
        outputs = [helper.make_tensor_value_info("action", elem, ["batch", n])]
        if spec.free_log_std is not None:
            axes, start, end = b.constant([1], "log_std/axes"), b.constant([n], "log_std/start"), b.constant([2 * n], "log_std/end")
            b.node("Slice", [logits, start, end, axes], "log_std")
            outputs.append(helper.make_tensor_value_info("log_std", elem, ["batch", n]))
        return outputs
    if head.kind == "squash":
        add_rescale(b, b.node("Tanh", [logits], f"{head.tanh_scope}/tanh"), head.low, head.high)
        return [helper.make_tensor_value_info("action", elem, ["batch", n])]
    raise BadModelError(f"unknown action head {head.kind!r}")


def add_rescale(b: MlpBuilder, x: str, low: np.ndarray, high: np.ndarray) -> str:
    """``low + 0.5 * (x + 1) * (high - low)``: SB3's ``unscale_action`` from [-1, 1] to the Box
    bounds, in its operation order and the policy's dtype; output ``action``."""
    dt = b.dtype
    low, high = np.asarray(low, dt), np.asarray(high, dt)
    one = b.initializer(np.array(1, dt), "action/one")
    half = b.initializer(np.array(0.5, dt), "action/half")
    width = b.initializer((high - low).astype(dt), "action/width")
    lo = b.initializer(low, "action/low")
    shifted = b.node("Mul", [b.node("Add", [x, one], "action/plus_one"), half], "action/unit")
    return b.node("Add", [lo, b.node("Mul", [shifted, width], "action/scaled")], "action")


def add_multi_argmax(b: MlpBuilder, logits: str, nvec: tuple[int, ...]):
    """One argmax per MultiDiscrete sub-space of ``logits`` (SB3's ``MultiCategoricalDistribution``
    splits the logits by ``nvec``): ``action``, int64 ``(batch, len(nvec))``."""
    onnx = require("onnx", "onnx", "building an ONNX model")
    axes = b.constant([1], "action/axes")
    branches, start = [], 0
    for i, n in enumerate(nvec):
        part = b.node("Slice", [logits, b.constant([start], f"action/start_{i}"), b.constant([start + n], f"action/end_{i}"), axes],
                      f"action/logits_{i}")
        branches.append(b.node("ArgMax", [part], f"action/argmax_{i}", axis=1, keepdims=1))
        start += n
    b.node("Concat", branches, "action", axis=1)
    return onnx.helper.make_tensor_value_info("action", onnx.TensorProto.INT64, ["batch", len(nvec)])


def add_quantile_argmax(b: MlpBuilder, logits: str, quantiles: int, n_actions: int, elem: int) -> list:
    """QR-DQN's greedy action (``sb3_contrib/qrdqn/policies.py``): ``logits`` viewed as
    ``(batch, quantiles, n_actions)``, their mean over the quantiles ``q_values`` (``elem``,
    ``(batch, n_actions)``), and ``action`` = its argmax (int64, ``(batch,)``)."""
    onnx = require("onnx", "onnx", "building an ONNX model")
    shape = b.constant([0, quantiles, n_actions], "q_values/shape")  # 0: the batch as it comes (allowzero=0)
    per_quantile = b.node("Reshape", [logits, shape], "q_values/quantiles")
    q = b.reduce_mean(per_quantile, 1, "q_values", "q_values/axes", keepdims=0)
    b.node("ArgMax", [q], "action", axis=1, keepdims=0)
    helper = onnx.helper
    return [helper.make_tensor_value_info(q, elem, ["batch", n_actions]),
            helper.make_tensor_value_info("action", onnx.TensorProto.INT64, ["batch"])]


def head_name(head: str | None) -> str:
    """What ``metadata_props["policyport.head"]`` calls the head ``head=`` asked for (``none`` for
    ``None``; both diag-gaussian spellings are ``diag-gaussian``)."""
    return "diag-gaussian" if head in GAUSSIAN_HEADS else head or NO_HEAD


def check_free_log_std(spec: MlpSpec) -> None:
    """Refuse a free ``log_std`` that cannot sit beside the mean the output layer computes.

    A state-independent ``log_std`` holds one entry per action dimension: RLlib's ``free_log_std``
    halves the output layer to the mean's width and adds a vector of the same width
    (``ray/rllib/models/tf/fcnet.py``, ``torch/fcnet.py``); SB3's ``DiagGaussianDistribution`` makes
    ``log_std`` as wide as ``action_net``'s output (``stable_baselines3/common/distributions.py``).

    Raises:
        BadModelError: a ``log_std`` that is not a vector, or whose width is not the output layer's.
    """
    log_std, name = spec.free_log_std, spec.free_log_std_name or "log_std"
    if log_std is None:
        return
    n = spec.output.out_features
    if log_std.ndim != 1:
        raise BadModelError(f"{name} has shape {tuple(log_std.shape)}; a free log_std is a vector, one entry per action "
                            f"dimension ({spec.output.name!r} outputs {n} means)")
    if log_std.shape[0] != n:
        raise BadModelError(
            f"{name} has {log_std.shape[0]} entries, but {spec.output.name!r} outputs {n}: a free log_std holds one entry "
            f"per action dimension, as many as the means it follows in logits (a diag-gaussian policy with {n} means "
            f"needs a log_std of {n}); are the weights of two different policies?"
        )


def _check_head(spec: MlpSpec, head: str | None) -> None:
    """Refuse a head that contradicts what the network holds.

    Raises:
        OptionError: ``categorical`` on a Gaussian policy (one with a free ``log_std``: argmax over
            means and log-standard-deviations means nothing); ``diag-gaussian`` or
            ``diag-gaussian:halves`` on an odd number of logits, which have no mean and log_std halves
            (the message names the head as given).
    """
    if head == "categorical" and spec.free_log_std is not None:
        n = spec.output.out_features
        raise OptionError(
            f"--head categorical takes the argmax of the logits, but this is a Gaussian policy: its logits are the {n} "
            f"means of {spec.output.name!r} followed by the {n} entries of its free log_std {spec.free_log_std_name!r}, "
            "and an argmax over means and log-standard-deviations picks no action; use --head diag-gaussian (or none)"
        )
    n_logits = spec.output.out_features + (0 if spec.free_log_std is None else spec.free_log_std.shape[0])
    if head in GAUSSIAN_HEADS and n_logits % 2:
        raise OptionError(f"--head {head} splits logits into mean and log_std halves, but there are {n_logits} "
                          "logits (an odd number); use --head categorical (or none)")


def _check_chain(layers: list[Dense], branch: str) -> None:
    for prev, nxt in zip(layers, layers[1:]):
        if prev.out_features != nxt.in_features:
            raise BadModelError(
                f"{branch} layers do not chain: {prev.name!r} outputs {prev.out_features} features "
                f"but {nxt.name!r} takes {nxt.in_features} ({prev.weight_name} {tuple(prev.weight.shape)}, "
                f"{nxt.weight_name} {tuple(nxt.weight.shape)})"
            )
    for layer in layers:
        if layer.bias is not None and layer.bias.shape != (layer.out_features,):
            raise BadModelError(
                f"{layer.bias_name} has shape {tuple(layer.bias.shape)}, expected ({layer.out_features},) for {layer.weight_name} {tuple(layer.weight.shape)}"
            )


def _max_ir_version(onnx, opset: int) -> int:
    """The IR version that goes with ``opset``, so older runtimes accept the model."""
    for ir, op in ((7, 13), (8, 18), (9, 20), (10, 23)):
        if opset <= op:
            return ir
    return onnx.IR_VERSION


def _version() -> str:
    from ..version import __version__

    return __version__


# ---------------------------------------------------------------- what runs before the network


@dataclass
class ObsFilter:
    """RLlib's ``MeanStdFilter`` as the policy applies it: ``y = clip((x - mean) / (std + epsilon), -clip, clip)``.

    RLlib's order (``ray/rllib/utils/filter.py``, ``MeanStdFilter.__call__``): subtract ``mean`` if
    ``demean``; divide by ``std + epsilon`` if ``destd``; clip to ``[-clip, clip]`` if ``clip`` is
    set (and non-zero). The graph holds ``mean`` and ``std + epsilon`` rounded once to the
    observation's dtype, so the division is the only rounding step the filter adds.

    Attributes:
        mean: float64 array, shape ``(obs_dim,)``: the running mean.
        std: float64 array, shape ``(obs_dim,)``: the running standard deviation.
        epsilon: added to ``std`` (1e-8 in Ray 0.x/1.x filters, 1e-6 — ``SMALL_NUMBER`` — in Ray 2.x).
        demean, destd: which steps apply.
        clip: the bound, or ``None`` for no clipping.
        count: observations the statistics were computed from.
        form: where the statistics came from (``"rs"``: ``_n``/``_M``/``_S``;
            ``"running_stats"``: ``num_pushes``/``mean_array``/``sum_sq_diff_array``).
    """

    mean: np.ndarray
    std: np.ndarray
    epsilon: float
    demean: bool = True
    destd: bool = True
    clip: float | None = None
    count: int = 0
    form: str = "running_stats"

    def constants(self, dtype) -> tuple[np.ndarray, np.ndarray]:
        """``mean`` and ``std + epsilon`` in ``dtype``, as the graph holds them."""
        return np.asarray(self.mean, dtype=dtype), np.asarray(np.asarray(self.std, np.float64) + self.epsilon, dtype=dtype)

    def to_dict(self) -> dict:
        return {"type": "MeanStdFilter", "form": self.form, "count": int(self.count), "demean": bool(self.demean),
                "destd": bool(self.destd), "clip": None if self.clip is None else float(self.clip),
                "epsilon": float(self.epsilon), "mean": [float(v) for v in np.ravel(self.mean)],
                "std": [float(v) for v in np.ravel(self.std)]}


@dataclass
class Prelude:
    """What a source applies to an observation before its network, as graph nodes.

    Attributes:
        one_hot: for a ``Discrete(n)`` observation space, ``n``: the graph input is then int64 of
            shape ``(batch,)`` and becomes a one-hot float row (RLlib's preprocessor, SB3's
            ``preprocess_obs``), as a ``Gather`` from an identity matrix.
        one_hot_nvec: for a ``MultiDiscrete(nvec)`` observation space, ``nvec``: the graph input
            is int64 of shape ``(batch, len(nvec))`` and becomes the concatenated one-hot rows of
            its columns (``(batch, sum(nvec))``, as both RLlib and SB3 encode it): each index,
            shifted by the sizes of the sub-spaces before it, picks a row of ``eye(sum(nvec))``,
            and the rows of one observation are summed.
        obs_filter: an :class:`ObsFilter` applied after the preprocessor.
    """

    one_hot: int | None = None
    one_hot_nvec: tuple[int, ...] | None = None
    obs_filter: ObsFilter | None = None

    def __bool__(self) -> bool:
        return self.one_hot is not None or self.one_hot_nvec is not None or self.obs_filter is not None

    @property
    def width(self) -> int | None:
        """Features of the one-hot encoding (``n``, or ``sum(nvec)``); ``None`` without one."""
        if self.one_hot is not None:
            return int(self.one_hot)
        return None if self.one_hot_nvec is None else int(sum(self.one_hot_nvec))

    def _offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.one_hot_nvec)[:-1]]).astype(np.int64)

    def _table(self, dtype) -> np.ndarray:
        """The identity matrix the one-hot rows are gathered from, its size checked first.

        Raises:
            LimitExceededError: ``width ** 2`` elements take more than the array limit.
        """
        from ..io.limits import check_array_bytes

        n, dtype = int(self.width), np.dtype(dtype)
        space = f"Discrete({n})" if self.one_hot is not None else f"MultiDiscrete{list(self.one_hot_nvec)}"
        check_array_bytes(n * n * dtype.itemsize, f"the one-hot table of the observation space {space} "
                          f"({dtype.name}, shape ({n}, {n}))", purpose="arrays built from sizes a file declares")
        return np.eye(n, dtype=dtype)

    def build(self, b: MlpBuilder, x: str) -> str:
        """Add the nodes after graph input ``x``; returns the tensor the network reads.

        Raises:
            LimitExceededError: the one-hot table (``width ** 2`` elements) would take more than the
                array limit.
        """
        if self.one_hot is not None:
            eye = b.initializer(self._table(b.dtype), "obs_preprocessor/one_hot_table")
            x = b.node("Gather", [eye, x], "obs_preprocessor/one_hot", axis=0)
        if self.one_hot_nvec is not None:
            eye = b.initializer(self._table(b.dtype), "obs_preprocessor/one_hot_table")
            rows = b.node("Add", [x, b.constant(self._offsets(), "obs_preprocessor/offsets")], "obs_preprocessor/rows")
            picked = b.node("Gather", [eye, rows], "obs_preprocessor/one_hot_rows", axis=0)
            if b.opset >= 13:
                x = b.node("ReduceSum", [picked, b.constant([1], "obs_preprocessor/axes")], "obs_preprocessor/one_hot",
                           keepdims=0)
            else:
                x = b.node("ReduceSum", [picked], "obs_preprocessor/one_hot", axes=[1], keepdims=0)
        if self.obs_filter is not None:
            x = add_obs_filter(b, x, self.obs_filter)
        return x

    def graph_input(self, helper, name: str, elem: int, input_shape: tuple[int, ...]):
        import onnx

        if self.one_hot is not None:
            return helper.make_tensor_value_info(name, onnx.TensorProto.INT64, ["batch"])
        if self.one_hot_nvec is not None:
            return helper.make_tensor_value_info(name, onnx.TensorProto.INT64, ["batch", len(self.one_hot_nvec)])
        return helper.make_tensor_value_info(name, elem, ["batch", *input_shape])

    def metadata(self, input_name: str = "obs") -> dict[str, str]:
        props = {}
        if self.obs_filter is not None:
            props["policyport.observation_filter"] = json.dumps(self.obs_filter.to_dict())
        if self.one_hot is not None:
            props["policyport.observation_preprocessor"] = json.dumps({"type": "one_hot", "n": int(self.one_hot)})
            props[INPUT_RANGES_KEY] = json.dumps({input_name: {"low": 0, "high": int(self.one_hot)}})
        if self.one_hot_nvec is not None:
            nvec = [int(n) for n in self.one_hot_nvec]
            props["policyport.observation_preprocessor"] = json.dumps({"type": "one_hot", "nvec": nvec})
            props[INPUT_RANGES_KEY] = json.dumps({input_name: {"low": 0, "high": nvec}})
        return props

    def reference(self, obs: np.ndarray, dtype) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The same steps in numpy: (what the network reads, {tensor name: array})."""
        out: dict[str, np.ndarray] = {}
        x = obs
        if self.one_hot is not None:
            x = out["obs_preprocessor/one_hot"] = _one_hot(np.asarray(obs, np.int64), int(self.one_hot), dtype)
        if self.one_hot_nvec is not None:
            columns = np.asarray(obs, np.int64)
            x = out["obs_preprocessor/one_hot"] = np.concatenate(
                [_one_hot(columns[:, i], int(n), dtype) for i, n in enumerate(self.one_hot_nvec)], axis=1)
        if self.obs_filter is not None:
            f = self.obs_filter
            mean, denom = f.constants(dtype)
            if f.demean:
                x = out["obs_filter/demean"] = x - mean
            if f.destd:
                x = out["obs_filter/destd"] = x / denom
            if f.clip:
                x = out["obs_filter/clip"] = np.clip(x, dtype.type(-f.clip), dtype.type(f.clip))
        return x, out


def _one_hot(indices: np.ndarray, n: int, dtype) -> np.ndarray:
    """Rows of ``eye(n)`` picked by ``indices`` (negative ones counting from the end, as numpy
    indexes; out of range raises ``IndexError``), without building ``eye(n)``: shape
    ``(*indices.shape, n)``."""
    rows = np.zeros((indices.size, n), dtype=dtype)
    rows[np.arange(indices.size), indices.ravel()] = 1
    return rows.reshape(*indices.shape, n)


def add_obs_filter(b: MlpBuilder, x: str, filt: ObsFilter) -> str:
    """The nodes of an RLlib ``MeanStdFilter`` after tensor ``x``: ``obs_filter/demean`` (Sub),
    ``obs_filter/destd`` (Div), ``obs_filter/clip`` (Clip, opset 11 form); returns the last."""
    mean, denom = filt.constants(b.dtype)
    if filt.demean:
        x = b.node("Sub", [x, b.initializer(mean, "obs_filter/mean")], "obs_filter/demean")
    if filt.destd:
        x = b.node("Div", [x, b.initializer(denom, "obs_filter/std_plus_epsilon")], "obs_filter/destd")
    if filt.clip:
        lo = b.initializer(np.array(-filt.clip, dtype=b.dtype), "obs_filter/clip_min")
        hi = b.initializer(np.array(filt.clip, dtype=b.dtype), "obs_filter/clip_max")
        x = b.node("Clip", [x, lo, hi], "obs_filter/clip")
    return x


def add_running_mean_std(b: MlpBuilder, x: str, statistics: dict, scope: str, eps: float, clip: float, *,
                         reciprocal: bool = False) -> str:
    """rl_games' ``RunningMeanStd`` in eval mode (``rl_games/algos_torch/running_mean_std.py``), and Sample
    Factory's in-place copy of it (``sample_factory/algo/utils/running_mean_std.py``), as ONNX nodes on ``x``:
    ``clamp((x - mean.float()) / sqrt(var.float() + eps), -clip, clip)`` in float32, the float64 statistics
    kept as initializers under the library's names and cast in the graph.

    Args:
        statistics: role (``running_mean``, ``running_var``, ``count``) -> (the library's name, float64 array
            of shape ``(obs_dim,)``; ``count`` ``()`` or ``(1,)``); every one becomes an initializer.
        scope: the tensors' prefix (``running_mean_std`` -> ``running_mean_std/std`` ...); the last is ``scope``.
        reciprocal: multiply by ``1 / std`` (Sample Factory's ``x.sub_(mean).mul_(1 / std)``) instead of
            dividing by ``std`` (rl_games).

    Returns:
        The normalised observations' tensor name, ``scope``.
    """
    onnx = require("onnx", "onnx", "building an ONNX model")
    f32 = onnx.TensorProto.FLOAT

    def const(value, name):
        return b.initializer(np.asarray(value, np.float32), name)

    names = {role: b.initializer(array, name, name) for role, (name, array) in statistics.items()}
    mean = b.node("Cast", [names["running_mean"]], f"{scope}/mean_float32", to=f32)
    var = b.node("Cast", [names["running_var"]], f"{scope}/var_float32", to=f32)
    std = b.node("Sqrt", [b.node("Add", [var, const(eps, f"{scope}/epsilon")], f"{scope}/var_plus_epsilon")], f"{scope}/std")
    centered = b.node("Sub", [x, mean], f"{scope}/centered")
    if reciprocal:
        scaled = b.node("Mul", [centered, b.node("Reciprocal", [std], f"{scope}/inverse_std")], f"{scope}/scaled")
    else:
        scaled = b.node("Div", [centered, std], f"{scope}/scaled")
    return b.node("Clip", [scaled, const(-clip, f"{scope}/clip_min"), const(clip, f"{scope}/clip_max")], scope)
