"""The layer plan of a converted policy: what another framework needs to rebuild it as trainable layers.

:func:`layer_plan` reads any ONNX model (one policyport converted, or one written elsewhere) and
returns a :class:`LayerPlan`: the graph's nodes in order, where every dense layer — a ``Gemm``, or a
``MatMul`` whose sum with a bias initializer is its only use, as tf2onnx writes Keras' ``Dense`` —
becomes one :class:`Dense` that names its weight and bias initializers (also through ``Identity``
nodes that alias them, as ML-Agents exports) and the activation node that follows it; the other
nodes stay as they are, to be written as code. Every initializer gets a role: ``"weight"`` /
``"bias"`` of a dense layer, ``"parameter"`` (another trained tensor, such as a state-independent
``log_std``), ``"normaliser"`` (statistics applied to the observation before the first layer, or
others the source records as not trained, such as an action de-normaliser's: a target keeps them as
buffers, not trained) or ``"constant"`` (shapes, slice bounds, clip bounds).
A node no target writes (:data:`TARGET_OPS`) is refused, naming it.

The plan holds names and arrays only; it imports neither torch nor TensorFlow.
"""

from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass, field

import numpy as np

from ...errors import BadModelError, UnsupportedOpError

#: Ops a target writes: the MLP op set (dense layers, activations, normalisers, heads).
TARGET_OPS = frozenset({
    "Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Pow", "Erf",
    "Max", "Min", "Clip", "Relu", "LeakyRelu", "Elu", "Selu", "Sigmoid", "Tanh", "Softplus", "Softsign", "Gelu",
    "Mish", "HardSwish", "Softmax", "LogSoftmax", "ArgMax", "Slice", "Concat", "Shape", "Expand", "Reshape",
    "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Cast", "Constant", "BatchNormalization",
    "LayerNormalization",
})
#: Activation ops that directly follow a dense layer, as the plan records them (ONNX op type -> name).
ACTIVATIONS = {"Tanh": "tanh", "Relu": "relu", "Sigmoid": "sigmoid", "Elu": "elu", "Selu": "selu",
               "LeakyRelu": "leaky_relu", "Softplus": "softplus", "Softsign": "softsign", "Gelu": "gelu",
               "Mish": "mish", "HardSwish": "hardswish", "Swish": "swish"}
#: The deterministic actions of an ML-Agents export (model_serialization.py, ``TensorNames``).
ML_AGENTS_CONTINUOUS, ML_AGENTS_DISCRETE = "deterministic_continuous_actions", "deterministic_discrete_actions"
#: Suffixes of a weight's source name that the layer's name drops (torch ``.weight``, Keras/TF ``/kernel``).
_WEIGHT_SUFFIXES = (".weight", "/kernel", ".kernel", "/weights", "/weight", "/W", "/kernel:0")


@dataclass(frozen=True)
class Dense:
    """One dense layer of the source: ``y = x @ W (+ b)``, then ``activation`` when one follows.

    Attributes:
        name: the source layer's name, from its weight's source name without ``.weight`` or
            ``/kernel`` (``"mlp_extractor.policy_net.0"``, ``"default_policy/fc_1"``).
        attribute: ``name`` as a Python identifier (every character outside ``[A-Za-z0-9_]``
            becomes ``_``): the module attribute a target names the layer by.
        weight, bias: initializer names (``bias`` is None for a layer without one).
        weight_source, bias_source: the source's parameter names for them (a bias read through an
            ``Identity`` of an initializer other nodes also read is one of equal initializers the exporter
            merged, as ML-Agents' exports merge zero biases: it is named by the ``Identity``'s output);
            ``bias_source`` also
            names a bias of zeros the model left out but records (``policyport.parameters``
            ``{"zeros": ...}``), which a target restores as a trainable bias.
        transposed: True when the weight is stored ``[in, out]`` (a Keras/TF kernel, ``MatMul``'s B,
            ``Gemm`` with ``transB=0``); False when stored ``[out, in]`` (torch's ``nn.Linear``,
            ``Gemm`` with ``transB=1``). See the ONNX Gemm operator page (opset 13).
        in_features, out_features: the layer's sizes.
        input, output: the tensor it reads and the tensor of its sum (the bias added).
        nodes: the names of the nodes it covers (``Gemm``, or ``MatMul`` and ``Add``).
        inner: tensors of those nodes before ``output`` (a ``MatMul``'s product before its bias),
            which a layer computes inside itself.
        activation: the activation's ONNX op type when its only use is one (``"Tanh"``), ``"Swish"``
            for ``x * Sigmoid(x)``, else None; the activation nodes themselves stay steps of the plan.
    """

    name: str
    attribute: str
    weight: str
    bias: str | None
    weight_source: str
    bias_source: str | None
    transposed: bool
    in_features: int
    out_features: int
    input: str
    output: str
    nodes: tuple[str, ...]
    inner: tuple[str, ...] = ()
    activation: str | None = None


@dataclass(frozen=True)
class Normaliser:
    """The observation normaliser: the nodes between the graph input and the first dense layer.

    Attributes:
        nodes: their names, in order.
        statistics: the floating initializers they read (kept as buffers, never trained).
        vec_normalize: when the nodes compute exactly SB3's ``VecNormalize.normalize_obs``
            (``clip((obs - mean) / sqrt(var + epsilon), -clip_obs, clip_obs)``, stable_baselines3/
            common/vec_env/vec_normalize.py), or ML-Agents' ``Normalizer`` as exported (its
            ``sqrt(running_variance / normalization_steps)`` folded; ``var`` is its square,
            ``epsilon`` 0): ``{"mean", "var", "epsilon", "clip_obs"}`` as arrays and floats; None otherwise.
    """

    nodes: tuple[str, ...]
    statistics: tuple[str, ...]
    vec_normalize: dict | None = None


@dataclass(frozen=True)
class Head:
    """What the graph returns after its last dense layer.

    Attributes:
        kind: the model's recorded head (``policyport.head`` metadata: ``"diag-gaussian"``,
            ``"clipped-diag-gaussian"``, ``"categorical"``, ``"none"`` ...), or what the graph shows
            when it records none: ``"categorical"`` (an ``ArgMax`` output), ``"diag-gaussian"`` (a
            ``log_std`` output) or ``"none"``.
        logits: the last dense layer's output tensor (RLlib's action-distribution inputs).
        action: the deterministic action's graph output, or None.
        log_std: the ``log_std`` graph output, or None.
        mean: the tensor of the Gaussian's mean (before any clipping to the action bounds), or None.
        action_low, action_high: float64 arrays, shape (action_dim,): the bounds a ``Max``/``Min``
            (or ``Clip``) pair of the graph clips the action to; None when it does not clip.
        divisor: for ML-Agents' ``clamp(mean, -3, 3) / 3`` (``ActionModel.get_action_out`` with
            ``clip_action``, ml-agents/mlagents/trainers/torch_entities/action_model.py), 3.0: the action
            is the mean clipped to ``[low, high] * divisor`` and divided by it; None otherwise.

    An ML-Agents export (outputs ``deterministic_continuous_actions`` / ``deterministic_discrete_actions``,
    ml-agents/mlagents/trainers/torch_entities/model_serialization.py ``TensorNames``) has ``kind``
    ``"diag-gaussian"`` (its ``log_std`` the tensor ``mu * 0 + log_sigma``), ``"categorical"`` (one
    discrete branch), ``"multi-categorical"`` (several) or ``"hybrid"`` (both kinds of action).
    """

    kind: str
    logits: str
    action: str | None = None
    log_std: str | None = None
    mean: str | None = None
    action_low: np.ndarray | None = None
    action_high: np.ndarray | None = None
    divisor: float | None = None


@dataclass
class LayerPlan:
    """A policy as layers and steps, in graph order (see the module docstring).

    Attributes:
        graph: the :class:`policyport.graph.model.Graph` it was read from (initializers as stored).
        steps: :class:`Dense` layers and :class:`policyport.graph.model.Node` steps, in order; a
            dense layer's own nodes are not repeated as steps.
        roles: initializer name -> ``"weight"``, ``"bias"``, ``"parameter"``, ``"normaliser"`` or
            ``"constant"``.
        source_names: initializer name -> the source's parameter name (``policyport.parameters``
            metadata; the initializer's own name where it records none).
        normaliser: the :class:`Normaliser`, or None when the first layer reads the observation.
        head: the :class:`Head`.
        activation_defaults: each dense layer's activation, by layer name (None: none).
        aliases: outputs of ``Identity`` nodes that only alias a layer's initializer; the layer
            reads the initializer itself, and those nodes are no steps.
        notes: what the plan left out of the model (sampled outputs, :func:`deterministic_path`).
    """

    graph: object
    steps: list
    roles: dict[str, str]
    source_names: dict[str, str]
    normaliser: Normaliser | None
    head: Head
    activation_defaults: dict[str, str | None] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)

    @property
    def layers(self) -> list[Dense]:
        """The dense layers, in order."""
        return [s for s in self.steps if isinstance(s, Dense)]

    @property
    def trainable(self) -> list[str]:
        """The initializers a target trains: weights, biases and other parameters, in graph order."""
        return [name for name, role in self.roles.items() if role in ("weight", "bias", "parameter")]

    def describe(self) -> list[dict]:
        """One dict per dense layer (name, attribute, sizes, activation, source names), for ``--json``."""
        return [{"layer": d.name, "attribute": d.attribute, "in": d.in_features, "out": d.out_features,
                 "activation": ACTIVATIONS.get(d.activation) if d.activation else None,
                 "weight": d.weight_source, "bias": d.bias_source,
                 "layout": "[in, out], transposed for nn.Linear" if d.transposed else "[out, in]"} for d in self.layers]


def identifier(name: str) -> str:
    """``name`` as a Python identifier: characters outside ``[A-Za-z0-9_]`` become ``_``, a leading
    digit or a keyword gets a ``_`` in front; leading underscores become one (``self.__x`` inside a
    class body would be name-mangled to ``self._Policy__x``)."""
    text = re.sub(r"^_{2,}", "_", re.sub(r"\W", "_", name, flags=re.ASCII)) or "_"
    if text[0].isdigit() or keyword.iskeyword(text):
        text = "_" + text
    return text


def layer_plan(model) -> LayerPlan:
    """The :class:`LayerPlan` of ``model``.

    Args:
        model: an ``onnx.ModelProto``, a path to an ``.onnx`` file, or a
            :class:`policyport.graph.model.Graph`.

    Returns:
        :class:`LayerPlan`.

    Raises:
        UnsupportedOpError: a node whose op no target writes (an ``LSTM``, a ``Conv``, a sampling
            ``Multinomial`` ...), a node outside the default domain, or a graph without a dense layer;
            the message names the node and its op (exit 3).
        BadModelError: a ``Gemm`` with ``transA``, or ``alpha``/``beta`` other than 1, or a bias
            whose size is not the layer's.
    """
    from ...graph.model import Graph, Node, from_onnx
    from ...graph.onnx_files import ensure_model

    graph = model if isinstance(model, Graph) else from_onnx(ensure_model(model))
    graph, notes = deterministic_path(graph)
    _refuse_unwritable(graph)
    init = graph.initializers
    aliases = {n.outputs[0]: n.inputs[0] for n in graph.nodes
               if n.op_type == "Identity" and n.inputs[0] in init}  # an initializer seen through Identity
    consumers: dict[str, list] = {}
    for node in graph.nodes:
        for t in node.inputs:
            consumers.setdefault(t, []).append(node)
    outputs = {v.name for v in graph.outputs}
    source_names = _source_names(graph.metadata, init)
    zeros = _zero_parameters(graph.metadata)

    def stored(tensor: str) -> str | None:
        tensor = aliases.get(tensor, tensor)
        return tensor if tensor in init else None

    shared: dict[str, int] = {}  # initializer -> the nodes that read it, itself or through an Identity alias
    for node in graph.nodes:
        if node.op_type != "Identity":
            for t in set(node.inputs):
                if stored(t):
                    shared[stored(t)] = shared.get(stored(t), 0) + 1

    steps: list = []
    covered: set[str] = set()
    roles: dict[str, str] = {}
    for node in graph.nodes:
        if id(node) in covered:
            continue
        dense = _dense(node, stored, consumers, outputs, init, source_names, zeros, shared)
        if dense is None:
            steps.append(node)
            continue
        layer, parts = dense
        covered.update(id(p) for p in parts)
        roles[layer.weight] = "weight"
        if layer.bias:
            roles[layer.bias] = "bias"
        steps.append(layer)
    layers = [s for s in steps if isinstance(s, Dense)]
    if not layers:
        raise UnsupportedOpError("the graph has no dense layer (a Gemm, or a MatMul by an initializer) for a target "
                                 "to write as nn.Linear / Dense; targets write MLP policies")
    # Identity nodes that only alias an initializer are not steps: the layer reads the initializer itself.
    used_aliases = {a for a in aliases if all(isinstance(s, Dense) or a not in s.inputs for s in steps)}
    steps = [s for s in steps if not (isinstance(s, Node) and s.op_type == "Identity"
                                      and s.outputs[0] in used_aliases and s.outputs[0] not in outputs)]
    normaliser = _normaliser(graph, steps, layers[0])
    for name in (normaliser.statistics if normaliser else ()):
        roles.setdefault(name, "normaliser")
    for node in (s for s in steps if not isinstance(s, Dense) and s.op_type != "Identity"):
        for t in node.inputs:
            t = aliases.get(t, t)
            if t in init and t not in roles:
                roles[t] = _role(t, node, init[t], graph.metadata, source_names)
    for layer in layers:
        for t in (layer.weight, layer.bias):
            if t:
                source_names.setdefault(t, t)
    head = _head(graph, steps, layers[-1])
    activations = {d.name: ACTIVATIONS.get(d.activation) if d.activation else None for d in layers}
    dropped = tuple(a for a in aliases if a in used_aliases and a not in outputs)
    return LayerPlan(graph, steps, roles, source_names, normaliser, head, activations, dropped, notes)


def deterministic_path(graph):
    """``graph`` without the outputs it samples, when it also computes deterministic ones.

    An export that samples its action (ML-Agents' ``continuous_actions``, ``mean + RandomNormalLike *
    std``, and ``discrete_actions``, ``Multinomial`` of each branch's log-probabilities;
    ml-agents/mlagents/trainers/torch_entities/action_model.py, ``get_action_out``) returns the
    deterministic action beside it (``deterministic_continuous_actions``, ``deterministic_discrete_actions``).
    No module computes a draw that matches the model's, so the sampled outputs (those that depend on a
    node of :data:`policyport.graph.model.RANDOM_OPS`, :meth:`~policyport.graph.model.Graph.stochastic_tensors`)
    are left out with the nodes only they need. A tensor that fed a sampling node and reads a trained
    initializer nothing else reads (the Gaussian's ``std = exp(mu * 0 + log_sigma)``) becomes a graph output
    instead, so its parameters stay in the policy.

    Args:
        graph: a :class:`policyport.graph.model.Graph`; not modified.

    Returns:
        (the graph, or a new one without the sampled outputs; the notes saying what was left out).

    Raises:
        UnsupportedOpError: every output is sampled (nothing deterministic to write), naming the nodes.
    """
    from ...graph.model import Graph, ValueInfo

    random = graph.stochastic_tensors()
    sampled = [v.name for v in graph.outputs if v.name in random]
    if not sampled:
        return graph, []
    kept = [v for v in graph.outputs if v.name not in random]
    if not kept:
        raise UnsupportedOpError(f"every output of the graph is sampled ({', '.join(sorted(set(random[o] for o in sampled)))}): "
                                 "no module computes the same draws, and the graph has no deterministic output to write")
    producer = {o: n for n in graph.nodes for o in n.outputs if o}

    def needed(tensors) -> set[int]:
        seen, todo = set(), list(tensors)
        while todo:
            node = producer.get(todo.pop())
            if node is not None and id(node) not in seen:
                seen.add(id(node))
                todo.extend(t for t in node.inputs if t)
        return seen

    live = needed(v.name for v in kept)
    read = {t for n in graph.nodes if id(n) in live for t in n.inputs}
    init = graph.initializers
    # deterministic tensors the sampling nodes read, outside the kept path
    frontier = list(dict.fromkeys(t for n in graph.nodes if any(o in random for o in n.outputs)
                                  for t in n.inputs if t and t not in random and t not in init
                                  and (producer.get(t) is None or id(producer[t]) not in live)))
    added = []
    for tensor in frontier:
        reads = {t for n in graph.nodes if id(n) in needed([tensor]) for t in n.inputs}
        unique = sorted(t for t in reads - read if t in init and init[t].dtype.kind == "f")
        if unique:
            added.append((tensor, unique, init[unique[0]].dtype))
            read |= reads
    live = needed([v.name for v in kept] + [t for t, _, _ in added])
    outputs = kept + [ValueInfo(t, np.dtype(dtype), None) for t, _, dtype in added]
    nodes = [n for n in graph.nodes if id(n) in live]
    reasons = sorted(set(random[o] for o in sampled))
    notes = [f"left out the sampled output{'s' if len(sampled) > 1 else ''} {', '.join(sampled)} (drawn by "
             f"{', '.join(reasons)}): no module draws the same numbers; the policy computes the deterministic "
             f"one{'s' if len(kept) > 1 else ''}, {', '.join(v.name for v in kept)}"]
    for tensor, unique, _ in added:
        notes.append(f"tensor {tensor!r}, which only the sampling read, is an output so that "
                     f"{', '.join(unique)} stay{'s' if len(unique) == 1 else ''} in the policy")
    return Graph(nodes, list(graph.inputs), outputs, {k: v for k, v in init.items()
                                                      if any(k in n.inputs for n in nodes)},
                 dict(graph.opsets), dict(graph.metadata), list(graph.optional_inputs)), notes


def _refuse_unwritable(graph) -> None:
    missing: dict[str, list[str]] = {}
    for node in graph.nodes:
        if node.domain not in ("", "ai.onnx") or node.op_type not in TARGET_OPS:
            missing.setdefault(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}",
                               []).append(node.name or "(unnamed)")
        elif node.op_type == "Dropout" and len(node.inputs) > 2 and node.inputs[2]:
            mode = graph.initializers.get(node.inputs[2])
            if mode is None or mode.any():
                raise UnsupportedOpError(f'Dropout node "{node.name}" may run in training mode; targets write the '
                                         "policy's inference forward")
    if missing:
        listed = "; ".join(f'{op} (node{"s" if len(n) > 1 else ""} {", ".join(repr(x) for x in n[:3])}'
                           f'{" ..." if len(n) > 3 else ""})' for op, n in missing.items())
        raise UnsupportedOpError(f"{listed}: no layer or module of a target computes "
                                 f"{'this op' if len(missing) == 1 else 'these ops'}; targets write MLP policies "
                                 f"(ops: {', '.join(sorted(TARGET_OPS))})")


def _source_names(metadata: dict[str, str], init: dict[str, np.ndarray]) -> dict[str, str]:
    """initializer -> source parameter name, from ``policyport.parameters`` (initializer -> source
    name, as :func:`policyport.graph.passes.extract_weights` reads it)."""
    try:
        recorded = json.loads(metadata.get("policyport.parameters", "{}"))
    except ValueError:
        recorded = {}
    names = {}
    if isinstance(recorded, dict):
        for tensor, source in recorded.items():
            if tensor in init and isinstance(source, str):
                names[tensor] = source
    return names


def _zero_parameters(metadata: dict[str, str]) -> dict[str, tuple]:
    """Source parameters of zeros the model leaves out (``policyport.parameters`` entries
    ``{"name": ..., "zeros": {"shape": ...}}``): source name -> shape."""
    try:
        recorded = json.loads(metadata.get("policyport.parameters", "{}"))
    except ValueError:
        return {}
    found = {}
    for entry in (recorded.values() if isinstance(recorded, dict) else ()):
        if isinstance(entry, dict) and isinstance(entry.get("zeros"), dict) and isinstance(entry.get("name"), str):
            found[entry["name"]] = tuple(entry["zeros"].get("shape", ()))
    return found


def _dense(node, stored, consumers, outputs, init, source_names, zeros, shared):
    """The :class:`Dense` that starts at ``node`` and the nodes it covers, or None."""
    if node.op_type == "Gemm":
        if len(node.inputs) < 2 or stored(node.inputs[1]) is None:
            return None
        attrs = node.attrs
        if attrs.get("transA", 0):
            raise BadModelError(f'Gemm node "{node.name}" transposes its input (transA=1); targets write x @ W + b')
        if float(attrs.get("alpha", 1.0)) != 1.0 or float(attrs.get("beta", 1.0)) != 1.0:
            raise BadModelError(f'Gemm node "{node.name}" scales by alpha={attrs.get("alpha", 1.0)}, '
                                f'beta={attrs.get("beta", 1.0)}; targets write alpha = beta = 1 (nn.Linear)')
        weight = stored(node.inputs[1])
        bias = stored(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
        read = node.inputs[2] if bias else None
        if len(node.inputs) > 2 and node.inputs[2] and bias is None:
            return None
        transposed = not attrs.get("transB", 0)
        parts, output = [node], node.outputs[0]
    elif node.op_type == "MatMul":
        weight = stored(node.inputs[1])
        if weight is None or init[weight].ndim != 2:
            return None
        transposed, parts, output, bias, read = True, [node], node.outputs[0], None, None
        following = consumers.get(output, [])
        if len(following) == 1 and following[0].op_type == "Add" and output not in outputs:
            add = following[0]
            other = add.inputs[1] if add.inputs[0] == output else add.inputs[0]
            if stored(other) is not None and init[stored(other)].size == init[weight].shape[1]:
                bias, parts, output, read = stored(other), [node, add], add.outputs[0], other
    else:
        return None
    w = init[weight]
    if w.ndim != 2 or w.dtype.kind != "f":
        return None
    in_f, out_f = (w.shape if transposed else w.shape[::-1])
    if bias is not None and (init[bias].size != out_f or init[bias].dtype != w.dtype):
        raise BadModelError(f'{node.op_type} node "{node.name}": bias {bias!r} holds {init[bias].size} '
                            f"{init[bias].dtype} values for a layer of {out_f} {w.dtype} outputs")
    weight_source = source_names.get(weight, weight)
    name = weight_source
    for suffix in _WEIGHT_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    bias_source = source_names.get(bias, bias) if bias else None
    if bias and read != bias and bias not in source_names and shared.get(bias, 0) > 1:
        bias_source = read  # one of equal initializers the exporter merged (ML-Agents): the alias bears its name
    if bias is None:
        bias_source = next((n for n in (f"{name}/bias", f"{name}.bias") if zeros.get(n) == (out_f,)), None)
    following = consumers.get(output, [])
    activation = following[0].op_type if len(following) == 1 and following[0].op_type in ACTIVATIONS else None
    if _swish(output, following, consumers):
        activation = "Swish"
    layer = Dense(name=name, attribute=identifier(name), weight=weight, bias=bias, weight_source=weight_source,
                  bias_source=bias_source, transposed=transposed,
                  in_features=int(in_f), out_features=int(out_f), input=node.inputs[0], output=output,
                  nodes=tuple(p.name for p in parts), inner=tuple(p.outputs[0] for p in parts[:-1]),
                  activation=activation)
    return layer, parts


def _swish(output: str, following: list, consumers: dict) -> bool:
    """Whether the uses of ``output`` are ``output * Sigmoid(output)`` (Swish, torch's ``SiLU``, as
    ML-Agents' ``Swish`` exports: ml-agents/mlagents/trainers/torch_entities/layers.py)."""
    if sorted(n.op_type for n in following) != ["Mul", "Sigmoid"]:
        return False
    sigmoid = next(n for n in following if n.op_type == "Sigmoid")
    mul = next(n for n in following if n.op_type == "Mul")
    return (sorted(mul.inputs) == sorted((output, sigmoid.outputs[0]))
            and [c.op_type for c in consumers.get(sigmoid.outputs[0], [])] == ["Mul"])


def _ancestors(steps, tensor: str) -> list:
    """The steps that ``tensor`` depends on, in order."""
    producer = {}
    for s in steps:
        for out in ((s.output,) if isinstance(s, Dense) else s.outputs):
            producer[out] = s
    wanted, todo, seen = [], [tensor], set()
    while todo:
        t = todo.pop()
        s = producer.get(t)
        if s is None or id(s) in seen:
            continue
        seen.add(id(s))
        wanted.append(s)
        todo.extend([s.input] if isinstance(s, Dense) else [i for i in s.inputs if i])
    order = {id(s): i for i, s in enumerate(steps)}
    return sorted(wanted, key=lambda s: order[id(s)])


def _normaliser(graph, steps, first: Dense) -> Normaliser | None:
    """The steps before the first layer that compute its input from the observation."""
    before = [s for s in _ancestors(steps, first.input) if not isinstance(s, Dense)]
    if not before:
        return None
    init = graph.initializers
    stats = tuple(dict.fromkeys(t for s in before for t in s.inputs if t in init and init[t].dtype.kind == "f"))
    return Normaliser(tuple(s.name for s in before), stats, _vec_normalize(before, init))


def _vec_normalize(nodes, init) -> dict | None:
    """SB3's VecNormalize statistics when ``nodes`` compute ``normalize_obs`` as the SB3 converter
    writes it (Sub mean, Add var + epsilon, Sqrt, Div, Clip; Casts around it), else None."""
    nodes = [n for n in nodes if n.op_type != "Cast" and not (n.op_type == "Concat" and len(n.inputs) == 1)]
    ops = [n.op_type for n in nodes]
    if ops == ["Sub", "Div", "Clip"]:
        return _ml_agents_normalizer(nodes, init)
    if ops != ["Sub", "Add", "Sqrt", "Div", "Clip"]:
        return None
    sub, add, _, _, clip = (n for n in nodes if n.op_type != "Cast")
    mean = sub.inputs[1] if sub.inputs[1] in init else None
    var, eps = (add.inputs if add.inputs[0] in init and add.inputs[1] in init else (None, None))
    if mean is None or var is None or init[eps].size != 1 or len(clip.inputs) < 3:
        return None
    low, high = (init.get(t) for t in clip.inputs[1:3])
    if low is None or high is None or float(low) != -float(high):
        return None
    if init[var].ndim == 0 and init[eps].ndim == 1:
        var, eps = eps, var
    return {"mean": np.asarray(init[mean], np.float64), "var": np.asarray(init[var], np.float64),
            "epsilon": float(init[eps]), "clip_obs": float(high), "nodes": (mean, var)}


def _ml_agents_normalizer(nodes, init) -> dict | None:
    """ML-Agents' ``Normalizer`` as its exporter writes it, ``clip((obs - running_mean) / std, -5, 5)``
    with ``std = sqrt(running_variance / normalization_steps)`` folded into one initializer
    (ml-agents/mlagents/trainers/torch_entities/encoders.py; ``torch.onnx.export`` folds constants), as
    VecNormalize's statistics: ``var = std ** 2`` (exact in float64) and ``epsilon = 0``."""
    sub, div, clip = nodes
    if sub.inputs[1] not in init or div.inputs[0] != sub.outputs[0] or div.inputs[1] not in init:
        return None
    bounds = ([init.get(t) for t in clip.inputs[1:3]] if len(clip.inputs) > 1
              else [clip.attrs.get("min"), clip.attrs.get("max")])
    if any(b is None for b in bounds) or float(bounds[0]) != -float(bounds[1]) or clip.inputs[0] != div.outputs[0]:
        return None
    std = np.asarray(init[div.inputs[1]], np.float64)
    return {"mean": np.asarray(init[sub.inputs[1]], np.float64), "var": std * std, "epsilon": 0.0,
            "clip_obs": float(bounds[1]), "nodes": (sub.inputs[1], div.inputs[1])}


def _role(tensor: str, node, value: np.ndarray, metadata: dict[str, str], source_names: dict[str, str]) -> str:
    """``"parameter"`` for a trained tensor outside the dense layers, else ``"constant"``.

    An initializer only passed on by ``Identity`` nodes (ML-Agents' ``discrete_act_size_vector``, a graph
    output) gets no role here: it is a constant.

    A converted model lists its source's parameters (``policyport.parameters``): those are trained,
    unless the model also records which of them the source trains (``policyport.trainable``, Keras'
    ``model.trainable_weights``): then the others are ``"normaliser"`` statistics (a Keras
    ``Normalization`` layer's mean and variance, an action de-normaliser's), kept but never trained.
    A model without that record: a floating tensor of more than one element that feeds arithmetic
    (not a shape, slice bound or clip bound; the tensor a Clip clips is arithmetic) is taken for a
    trained one.
    """
    if value.dtype.kind != "f":
        return "constant"
    if node.op_type == "BatchNormalization" and tensor in node.inputs[3:5]:
        return "normaliser"  # running mean and variance: statistics, not trained by gradient
    if node.op_type in ("Clip", "Max", "Min", "Slice", "Reshape", "Expand", "Squeeze", "Unsqueeze"):
        # what is clipped or expanded is data (rsl_rl's clamped std_param, skrl's log_std_parameter:
        # Clip-11 input 0); the bounds, shapes and indices are not
        if node.op_type not in ("Expand", "Clip") or node.inputs[0] != tensor:
            return "constant"
    if "policyport.parameters" in metadata:
        if tensor not in source_names:
            return "constant"
        trained = _trained(metadata)
        return "parameter" if trained is None or source_names[tensor] in trained else "normaliser"
    return "parameter" if value.size > 1 or node.op_type == "Expand" else "constant"


def _trained(metadata: dict[str, str]) -> set[str] | None:
    """The source names the source trains (:data:`policyport.graph.passes.TRAINABLE_KEY`), or None
    where the model does not record them."""
    from ...graph.passes import TRAINABLE_KEY

    try:
        recorded = json.loads(metadata[TRAINABLE_KEY])
    except (KeyError, ValueError):
        return None
    return {n for n in recorded if isinstance(n, str)} if isinstance(recorded, list) else None


def _head(graph, steps, last: Dense) -> Head:
    """The :class:`Head` after the last dense layer."""
    outputs = {v.name for v in graph.outputs}
    kind = graph.metadata.get("policyport.head")
    nodes = [s for s in steps if not isinstance(s, Dense)]
    init = graph.initializers
    if kind is None and outputs & {ML_AGENTS_CONTINUOUS, ML_AGENTS_DISCRETE}:
        return _ml_agents_head(graph, nodes, last, outputs)
    action = "action" if "action" in outputs else None
    log_std = "log_std" if "log_std" in outputs else None
    if kind is None:
        kind = ("categorical" if any(n.op_type == "ArgMax" and action in n.outputs for n in nodes) else
                "diag-gaussian" if log_std else "none")
    mean = low = high = None
    producer = {o: n for n in nodes for o in n.outputs}
    if action is not None and "gaussian" in kind:
        node = producer.get(action)
        if node is not None and node.op_type == "Min":  # clip as SB3's converter writes it: Min(Max(mean, low), high)
            above = producer.get(node.inputs[0])
            if above is not None and above.op_type == "Max" and above.inputs[1] in init and node.inputs[1] in init:
                mean, low, high = above.inputs[0], init[above.inputs[1]], init[node.inputs[1]]
        elif node is not None and node.op_type == "Clip" and all(t in init for t in node.inputs[1:3]):
            mean, low, high = node.inputs[0], init[node.inputs[1]], init[node.inputs[2]]
        else:
            mean = action
    if low is not None:
        low = np.broadcast_to(np.asarray(low, np.float64).reshape(-1), (last.out_features if mean == last.output
                                                                         else np.asarray(low).size,)).copy()
        high = np.broadcast_to(np.asarray(high, np.float64).reshape(-1), low.shape).copy()
    return Head(kind, last.output, action, log_std, mean, low, high)


def _ml_agents_head(graph, nodes, last: Dense, outputs: set[str]) -> Head:
    """The :class:`Head` of an ML-Agents export (see :class:`Head`)."""
    init = graph.initializers
    producer = {o: n for n in nodes for o in n.outputs}
    if outputs >= {ML_AGENTS_CONTINUOUS, ML_AGENTS_DISCRETE}:
        return Head("hybrid", last.output, ML_AGENTS_CONTINUOUS)
    if ML_AGENTS_DISCRETE in outputs:
        node = producer.get(ML_AGENTS_DISCRETE)
        branches = len(node.inputs) if node is not None and node.op_type == "Concat" else 0
        return Head("categorical" if branches == 1 else "multi-categorical", last.output, ML_AGENTS_DISCRETE)
    mean, divisor, low = ML_AGENTS_CONTINUOUS, None, None
    node = producer.get(ML_AGENTS_CONTINUOUS)
    if node is not None and node.op_type == "Div":
        clip, by = producer.get(node.inputs[0]), _constant(node.inputs[1], producer, init)
        bounds = (None if clip is None or clip.op_type != "Clip" else
                  [clip.attrs.get("min"), clip.attrs.get("max")] if len(clip.inputs) == 1 else
                  [_constant(t, producer, init) for t in clip.inputs[1:3]])
        if by is not None and bounds and None not in bounds and float(bounds[1]) == -float(bounds[0]) == float(by):
            mean, divisor = clip.inputs[0], float(by)
            low = np.full(last.out_features, -1.0)
    log_std = next((n.outputs[0] for n in nodes if n.op_type == "Add" and len(n.inputs) == 2
                    and any(_is_times_zero(producer.get(t), mean, producer, init) for t in n.inputs)), None)
    return Head("diag-gaussian", last.output, ML_AGENTS_CONTINUOUS, log_std, mean, low,
                None if low is None else -low, divisor)


def _constant(tensor: str, producer: dict, init: dict):
    """The value of ``tensor`` when an initializer or a ``Constant`` node holds it, else None."""
    if tensor in init:
        return np.asarray(init[tensor])
    node = producer.get(tensor)
    if node is not None and node.op_type == "Constant" and "value" in node.attrs:
        return np.asarray(node.attrs["value"])
    return None


def _is_times_zero(node, mean: str, producer: dict, init: dict) -> bool:
    """Whether ``node`` is ``mean * 0`` (ML-Agents' ``mu * 0 + log_sigma``, GaussianDistribution.forward)."""
    if node is None or node.op_type != "Mul" or mean not in node.inputs:
        return False
    other = node.inputs[1] if node.inputs[0] == mean else node.inputs[0]
    value = _constant(other, producer, init)
    return value is not None and value.size == 1 and float(value) == 0.0
