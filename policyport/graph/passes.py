"""Graph passes: pure functions of an ONNX model that never modify their argument or any file.

* :func:`extract_weights` — the initializers as the source's parameters, under the source's names
  and in its layout;
* (:func:`policyport.runtime.expose.expose` and :func:`~policyport.runtime.expose.prune`, which may run
  the model to type a tensor, live with the runtime);
* :func:`folded_stds` — a normaliser's ``_std + eps`` an exporter folded into one constant (rsl_rl),
  which :func:`extract_weights` gives back as ``_std`` where it can be told bit for bit;
* :func:`free_dims` — dimensions declared as 0 or negative made unknown, as policyport reads them;
* :func:`widen_to_float64` — a :class:`~policyport.graph.model.Graph` computed in float64, the oracle of
  the float32-rounding rule.
* :func:`free_batch` — an exporter's fixed batch of 1 made free where every node computes each row alone;
* :func:`split_at` — the graph cut into stages at chosen tensors, so a runtime that executes a
  whole graph at once (onnxruntime) can hand those tensors to the caller, who may change them (neuron
  overrides), before the rest of the graph reads them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..errors import BadModelError, InputMismatchError, require
from ..io.schema import load_json
from .onnx_files import ensure_model
from .model import tensor_array

PARAMETERS_KEY = "policyport.parameters"
#: Metadata listing the source's parameter names in the source's own order (see :func:`parameter_map`).
ORDER_KEY = "policyport.parameter_order"
#: Metadata listing the source parameters the source framework trains (a JSON list of source names, as
#: Keras' ``model.trainable_weights`` says); the others it lists are statistics or constants. Absent where
#: the source does not say.
TRAINABLE_KEY = "policyport.trainable"
#: The most numbers a ``"value"`` entry of the parameter metadata may hold.
MAX_VALUE_ELEMENTS = 64


def parameter_map(model) -> dict[str, dict]:
    """Initializer name -> ``{"name": source parameter name, "transpose": perm or None, "zeros": None,
    "also": [...]}``.

    Read from ``metadata_props["policyport.parameters"]``, which policyport's converters write; a
    value may be a plain source name (no layout change) or such a dict. ``also`` lists further
    source names holding the same array (tied weights, or equal tensors an exporter merged into one
    initializer). A model policyport did not write maps each of its parameters
    (:func:`parameter_names`) to itself, under its initializer name.

    An entry may also stand for a source parameter the graph does not hold: an all-zero array an
    exporter dropped (tf2onnx removes zero biases), or a small buffer no computation reads (torch's
    ``BatchNorm.num_batches_tracked``). Its key is the source name, and ``"zeros"`` is
    ``{"shape": [...], "dtype": "float32"}``, or ``"value"`` is ``{"shape": [...], "dtype": "int64",
    "data": [...]}`` (at most :data:`MAX_VALUE_ELEMENTS` numbers), from which :func:`extract_weights`
    rebuilds it. ``metadata_props["policyport.parameter_order"]``, when present, lists the source
    names in the source's own order, which :func:`extract_weights` follows.

    Raises:
        BadModelError: the metadata is not valid JSON of that form.
    """
    props = {p.key: p.value for p in model.metadata_props}
    if PARAMETERS_KEY not in props:
        weights = parameter_names(model.graph)
        return {t.name: {"name": t.name, "transpose": None, "zeros": None, "value": None, "also": []}
                for t in model.graph.initializer if t.name in weights}
    raw = load_json(props[PARAMETERS_KEY], f"model metadata {PARAMETERS_KEY!r}")
    try:
        mapping = {}
        for k, v in raw.items():
            if isinstance(v, str):
                mapping[k] = {"name": v, "transpose": None, "zeros": None, "value": None, "also": []}
                continue
            zeros = v.get("zeros")
            if zeros is not None:
                dtype = np.dtype(zeros["dtype"])
                shape = [int(d) for d in zeros["shape"]]
                if dtype.kind not in ("b", "i", "u", "f") or any(d < 0 for d in shape):
                    raise ValueError(f"{k!r} rebuilds zeros of dtype {dtype} and shape {shape}")
                zeros = {"shape": shape, "dtype": dtype.name}
            value = v.get("value")
            if value is not None:
                dtype, shape, data = np.dtype(value["dtype"]), [int(d) for d in value["shape"]], list(value["data"])
                if dtype.kind not in ("b", "i", "u", "f") or any(d < 0 for d in shape) or len(data) != int(np.prod(shape)) \
                        or len(data) > MAX_VALUE_ELEMENTS:
                    raise ValueError(f"{k!r} rebuilds {len(data)} values of dtype {dtype} and shape {shape}")
                value = np.array(data, dtype=dtype).reshape(shape)
            transpose = v.get("transpose")
            if transpose is not None and (not isinstance(transpose, list) or any(type(p) is not int for p in transpose)
                                          or sorted(transpose) != list(range(len(transpose)))):
                raise ValueError(f"{k!r} has transpose {str(transpose)[:60]}, not a permutation of its axes "
                                 "(a list holding 0 to rank - 1 once each)")
            mapping[k] = {"name": str(v["name"]), "transpose": transpose, "zeros": zeros, "value": value,
                          "also": [str(a) for a in v.get("also", [])]}
        return mapping
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise BadModelError(f"metadata {PARAMETERS_KEY!r} is malformed: {e}") from e


#: Inputs that take a shape, indices, axes, scales, bounds or a ratio rather than a weight:
#: op type -> input positions. An initializer read only there is a constant, not a parameter.
_SETTING_INPUTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}), "Expand": frozenset({1}), "Tile": frozenset({1}), "Slice": frozenset({1, 2, 3, 4}),
    "Resize": frozenset({1, 2, 3}), "Upsample": frozenset({1}), "ConstantOfShape": frozenset({0}),
    "Range": frozenset({0, 1, 2}), "Split": frozenset({1}), "Squeeze": frozenset({1}), "Unsqueeze": frozenset({1}),
    "Pad": frozenset({1, 2, 3}), "Clip": frozenset({1, 2}), "Dropout": frozenset({1, 2}), "TopK": frozenset({1}),
    "OneHot": frozenset({1, 2}), "Gather": frozenset({1}), "GatherElements": frozenset({1}), "CumSum": frozenset({1}),
    **{op: frozenset({1}) for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                     "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
}
#: Ops that only pass a tensor on, or read its shape: reading an initializer does not make it a weight.
_PASS_ON = frozenset({"Identity", "Shape", "Size"})
_FLOAT_DTYPES = frozenset({10, 16, 1, 11})  # FLOAT16, BFLOAT16, FLOAT, DOUBLE


def parameter_names(graph) -> set[str]:
    """The initializers of an ONNX graph that are parameters (weights).

    A *parameter* is a floating-point initializer (float16, bfloat16, float32, float64) that a
    compute op reads as a weight: some node other than Identity, Shape or Size reads it — directly
    or through a chain of Identity nodes — at an input that is not a shape, index, axis, scale,
    bound or ratio (Reshape's ``shape``, Slice's ``starts``, Resize's ``scales``, Clip's ``min``
    ...). Integer initializers (shapes, indices) never are, and neither are constants a graph only
    passes on to its outputs (ML-Agents' ``version_number`` and ``memory_size``).

    Args:
        graph: an ``onnx.GraphProto``.

    Returns:
        The initializer names that are parameters.
    """
    floats = {t.name for t in graph.initializer if t.data_type in _FLOAT_DTYPES}
    alias = {name: name for name in floats}  # tensor -> the initializer it passes on unchanged
    for n in graph.node:
        if n.op_type == "Identity" and n.input and n.input[0] in alias:
            alias[n.output[0]] = alias[n.input[0]]
    found = set()
    for n in graph.node:
        if n.op_type in _PASS_ON:
            continue
        settings = _SETTING_INPUTS.get(n.op_type, frozenset())
        found.update(alias[t] for i, t in enumerate(n.input) if t in alias and i not in settings)
    return found


def extract_weights(model) -> dict[str, np.ndarray]:
    """The model's parameters under the source's names, in the source's layout, bit for bit.

    Args:
        model: an ``onnx.ModelProto`` or a path to an ``.onnx`` file (external data is loaded).

    Returns:
        source parameter name -> array (dtype and shape as the source stored it, e.g.
        ``default_policy/fc_1/kernel``: float32 ``(275, 256)``), in the order of the parameter
        metadata (the source's own order; initializer order for a model without it). All-zero
        parameters the graph does not hold (see :func:`parameter_map`) are rebuilt. Constants the
        converter added (Slice bounds of a head) are not parameters and are left out; so, in a
        model policyport did not write, is every initializer that is no parameter by
        :func:`parameter_names` (shape constants, ``version_number``). A normaliser's ``_std + eps`` that
        rsl_rl's exporter folded into one constant (:func:`folded_stds`) is given back as ``_std`` under
        its source name when every value of it can be told bit for bit, else as the constant, under
        its own name (:meth:`FoldedStd.describe` says which).

    Raises:
        BadModelError: malformed parameter metadata, or a parameter named twice.
        UnreadableFileError: the path cannot be read.
    """
    require("onnx", "onnx", "extracting weights")
    model = ensure_model(model)
    mapping = parameter_map(model)
    initializers = {init.name: init for init in model.graph.initializer}
    weights: dict[str, np.ndarray] = {}
    for key, spec in mapping.items():
        if spec["zeros"] is not None:
            if key in initializers:
                raise BadModelError(f"metadata {PARAMETERS_KEY!r} rebuilds {key!r} as zeros, but the graph holds it")
            arr = np.zeros(spec["zeros"]["shape"], dtype=spec["zeros"]["dtype"])
        elif spec.get("value") is not None:
            arr = spec["value"].copy()
        elif key in initializers:
            arr = tensor_array(initializers[key])
        else:
            continue
        if spec["transpose"] is not None:
            if len(spec["transpose"]) != arr.ndim:
                raise BadModelError(f"metadata {PARAMETERS_KEY!r} transposes {key!r} by {spec['transpose']}, but it has "
                                    f"{arr.ndim} axes (shape {arr.shape})")
            arr = np.ascontiguousarray(np.transpose(arr, np.argsort(spec["transpose"])))
        for name, value in ((spec["name"], arr), *((also, arr.copy()) for also in spec["also"])):
            if name in weights:
                raise BadModelError(f"two initializers map to the source parameter {name!r}")
            weights[name] = value
    rank = source_order(model)
    if rank:
        weights = dict(sorted(weights.items(), key=lambda kv: rank.get(kv[0], len(rank))))
    for fold in folded_stds(model):
        if fold.source_name in weights:
            continue
        if fold.initializer not in weights:  # a converter that left the folded constant unnamed (torch's exporter)
            weights[fold.initializer] = tensor_array(initializers[fold.initializer])
        if fold.std is not None:
            weights = {(fold.source_name if k == fold.initializer else k): (fold.std if k == fold.initializer else v)
                       for k, v in weights.items()}
    return weights


#: The epsilon rsl_rl's ``EmpiricalNormalization`` adds to its ``_std`` (``rsl_rl/modules/normalization.py``,
#: ``eps=1e-2``), which rsl_rl's ``export_policy_to_onnx`` folds into one constant ``_std + eps``.
RSL_RL_NORMALIZER_EPS = 1e-2


@dataclass(frozen=True)
class FoldedStd:
    """A normaliser's ``_std + eps`` that an exporter folded into one initializer.

    Attributes:
        initializer: the folded initializer's name (rsl_rl's exporter: ``add``).
        source_name: the source's name of the ``_std`` it holds (``obs_normalizer._std``).
        epsilon: the epsilon added (float32 of :data:`RSL_RL_NORMALIZER_EPS`).
        size: elements of the initializer.
        ambiguous: elements with more than one float32 ``_std`` that gives them when the epsilon is
            added in float32 (0: ``_std`` is recovered bit for bit).
        std: the recovered ``_std`` (float32, the initializer's shape) when ``ambiguous`` is 0, else ``None``.
    """

    initializer: str
    source_name: str
    epsilon: float
    size: int
    ambiguous: int
    std: np.ndarray | None

    def describe(self) -> str:
        """One sentence for people: what the constant is and what ``extract`` makes of it."""
        said = (f"{self.initializer!r} is {self.source_name} + {self.epsilon:g}, folded into one constant when rsl_rl's "
                "normaliser was exported to ONNX")
        if self.std is not None:
            return (f"{said}; written as {self.source_name}, recovered bit for bit (each of its {self.size} values is "
                    f"the only float32 that gives {self.initializer!r} when {self.epsilon:g} is added in float32)")
        return (f"{said}; written as it is, under {self.initializer!r}: {self.ambiguous} of its {self.size} values come "
                f"from more than one float32 {self.source_name.rpartition('.')[2]}, so it cannot be told bit for bit "
                f"({self.initializer} - {self.epsilon:g} is within one float32 step of it); the checkpoint "
                "(model_<iteration>.pt) holds it as saved")


def unfold_epsilon(folded: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """The float32 ``x`` with ``float32(x + epsilon) == folded``, element by element.

    Args:
        folded: float32 array, any shape: ``x + epsilon`` as float32 arithmetic rounded it.
        epsilon: the epsilon added (taken as float32).

    Returns:
        ``(x, ambiguous)``: ``x`` float32 of ``folded``'s shape, the candidate nearest ``folded - epsilon``;
        ``ambiguous`` bool, true where another float32 (or none) gives ``folded`` too.
    """
    a = np.asarray(folded, np.float32)
    eps = np.float32(epsilon)
    center = (a.astype(np.float64) - np.float64(eps)).astype(np.float32)
    steps = [center]
    for direction in (-np.inf, np.inf):
        c = center
        for _ in range(2):
            c = np.nextafter(c, np.float32(direction))
            steps.append(c)
    down2, down1, up1, up2 = steps[2], steps[1], steps[3], steps[4]
    with np.errstate(all="ignore"):
        valid = {k: (v + eps).astype(np.float32) == a for k, v in
                 {"d2": down2, "d1": down1, "c": center, "u1": up1, "u2": up2}.items()}
    count = sum(v.astype(int) for v in valid.values())
    # one candidate, and it is not at the edge of the five looked at (whose far neighbour might give folded too)
    unique = (count == 1) & (valid["c"] | valid["d1"] | valid["u1"])
    x = np.where(valid["c"], center, np.where(valid["d1"], down1, np.where(valid["u1"], up1, center))).astype(np.float32)
    return x, ~unique


def folded_stds(model) -> list[FoldedStd]:
    """Normaliser standard deviations an exporter stored as one constant ``_std + eps``.

    Recognised: rsl_rl's ``export_policy_to_onnx`` (``rsl_rl/utils/exporter.py``, the normaliser's
    forward ``(x - _mean) / (_std + eps)`` traced and its constant part folded): a ``Sub`` of an initializer
    named ``<prefix>._mean`` whose output a ``Div`` divides by a float32 initializer of the same shape that
    is not named ``<prefix>._std``, every value of it at least the epsilon, and that is no parameter policyport
    recorded (so also in a model policyport converted from rsl_rl's ``exported/policy.pt``, where torch's
    exporter folds the same sum). Nothing else is taken for one.

    Args:
        model: an ``onnx.ModelProto`` (left untouched).

    Returns:
        One :class:`FoldedStd` per folded constant, in node order.
    """
    recorded = set(parameter_map(model)) if any(p.key == PARAMETERS_KEY for p in model.metadata_props) else set()
    initializers = {t.name: t for t in model.graph.initializer}
    centered = {}
    for node in model.graph.node:
        if node.op_type == "Sub" and len(node.input) == 2 and node.input[1].endswith("._mean") \
                and node.input[1] in initializers:
            centered[node.output[0]] = node.input[1][: -len("._mean")]
    found = []
    eps = np.float32(RSL_RL_NORMALIZER_EPS)
    for node in model.graph.node:
        if node.op_type != "Div" or len(node.input) != 2 or node.input[0] not in centered:
            continue
        prefix, divisor = centered[node.input[0]], initializers.get(node.input[1])
        if divisor is None or divisor.data_type != 1 or divisor.name == f"{prefix}._std" or divisor.name in recorded:
            continue
        folded = tensor_array(divisor)
        if folded.shape != tuple(initializers[f"{prefix}._mean"].dims) or not (folded >= eps).all():
            continue
        std, ambiguous = unfold_epsilon(folded, eps)
        count = int(ambiguous.sum())
        found.append(FoldedStd(divisor.name, f"{prefix}._std", float(eps), int(folded.size), count,
                               std if count == 0 else None))
    return found


def source_order(model) -> dict[str, int]:
    """Source parameter name -> its place in the source's own order, from
    ``metadata_props["policyport.parameter_order"]``; empty when the model records none.

    Raises:
        BadModelError: the metadata is not a JSON list.
    """
    order = {p.key: p.value for p in model.metadata_props}.get(ORDER_KEY)
    if not order:
        return {}
    names = load_json(order, f"model metadata {ORDER_KEY!r}")
    if not isinstance(names, list):
        raise BadModelError(f"metadata {ORDER_KEY!r} is malformed: expected a list, got {type(names).__name__}")
    return {str(name): i for i, name in enumerate(names)}


def infer_shapes(model):
    """``onnx.shape_inference.infer_shapes`` of ``model`` (with data propagation where it works).

    Dimensions declared as 0 or negative are made free first (:func:`free_dims`): policyport reads
    them so, and onnx's C++ inference aborts the whole process on some negative ones.

    Raises:
        BadModelError: shape inference fails.
    """
    onnx = require("onnx", "onnx", "inferring tensor shapes")
    model = default_domain_spelled(free_dims(model))
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - data propagation fails where plain inference may not
        try:
            return onnx.shape_inference.infer_shapes(model)
        except Exception as e:  # InferenceError and friends
            raise BadModelError(f"ONNX shape inference failed on the model: {e}") from e


def default_domain_spelled(model):
    """``model`` with the default domain written ``""`` wherever it is written ``"ai.onnx"``.

    ONNX names the default operator set both ways (onnx.proto: ``NodeProto.domain``,
    ``OperatorSetIdProto.domain``) and onnxruntime runs either; onnx's shape inference finds no schema
    for a node of domain ``"ai.onnx"`` and leaves its outputs untyped.

    Args:
        model: an ``onnx.ModelProto`` (left untouched).

    Returns:
        ``model`` itself when nothing is spelled ``"ai.onnx"``, else a changed copy. An opset import of
        ``"ai.onnx"`` beside one of ``""`` is dropped in the copy (the ``""`` one is kept).
    """
    nodes = [n for n in model.graph.node if n.domain == "ai.onnx"]
    imports = [o for o in model.opset_import if o.domain == "ai.onnx"]
    if not nodes and not imports:
        return model
    copy = type(model)()
    copy.CopyFrom(model)
    for n in copy.graph.node:
        if n.domain == "ai.onnx":
            n.domain = ""
    kept = [o for o in copy.opset_import if o.domain != "ai.onnx"]
    if not any(o.domain == "" for o in kept):
        kept += [o for o in copy.opset_import if o.domain == "ai.onnx"][:1]
    del copy.opset_import[:]
    for o in kept:
        copy.opset_import.add(domain="" if o.domain == "ai.onnx" else o.domain, version=o.version)
    return copy


def free_dims(model):
    """``model`` with every dimension declared as 0 or a negative number made unknown.

    Exporters write ``-1`` (Paddle2ONNX) or 0 for a free dimension; policyport reads both as free
    (:func:`policyport.graph.model.free_dim`). onnxruntime agrees for a negative one but takes 0
    literally, refusing any other size, so the onnxruntime backend runs this copy.

    Args:
        model: an ``onnx.ModelProto`` (left untouched).

    Returns:
        ``model`` itself when no graph input, output or value_info declares such a dimension, else a
        changed copy.
    """
    def infos(m):
        return [*m.graph.input, *m.graph.output, *m.graph.value_info]

    def non_positive(info):
        t = info.type.tensor_type
        dims = t.shape.dim if t.HasField("shape") else []  # pragma: no mutate (a type without a shape has no dims)
        return [d for d in dims if d.HasField("dim_value") and d.dim_value <= 0]

    if not any(non_positive(v) for v in infos(model)):
        return model
    copy = type(model)()
    copy.CopyFrom(model)
    for info in infos(copy):
        for d in non_positive(info):
            d.ClearField("dim_value")
    return copy


#: Element types the float64 oracle widens: name -> ONNX ``TensorProto.DataType`` code of the wide type.
_WIDENED = {"float16": 11, "bfloat16": 11, "float32": 11, "complex64": 15}
#: ``TensorProto.DataType`` codes widened in ``to``/``dtype`` attributes: FLOAT, FLOAT16, BFLOAT16 -> DOUBLE,
#: COMPLEX64 -> COMPLEX128.
_WIDENED_CODES = {1: 11, 10: 11, 16: 11, 14: 15}
#: Attributes that name an element type, by op type.
_TYPE_ATTRS = {"Cast": "to", "RandomNormal": "dtype", "RandomUniform": "dtype", "RandomNormalLike": "dtype",
               "RandomUniformLike": "dtype", "Bernoulli": "dtype", "EyeLike": "dtype",
               "LayerNormalization": "stash_type", "Range": "stash_type"}


def widen_to_float64(graph):
    """The graph computed in float64: the oracle of the rounding rule (:mod:`policyport.verification.compare`).

    A pure pass over a :class:`~policyport.graph.model.Graph` (numpy only; the argument is unchanged).
    float16, bfloat16 and float32 become float64 (complex64 complex128) wherever the graph fixes an
    element type:

    * initializers, graph inputs, optional inputs and outputs;
    * attributes that hold a tensor (``Constant``'s ``value``, ``ConstantOfShape``'s ``value``) and
      ``Constant``'s ``value_float(s)``, which would make float32;
    * attributes that name a type: ``Cast``'s ``to`` (a Cast to float32 or float16 would round the
      wide result back), the random ops' ``dtype``, ``LayerNormalization``'s and ``Range``'s
      ``stash_type``;
    * ``ConstantOfShape`` without ``value``, whose default is a float32 zero.

    Everything else follows from the inputs (numpy keeps float64 through every op of the backend),
    and integer, bool and string tensors are untouched. What a float64 run cannot reproduce —
    a float32 comparison or rounding that lands on the other side (``Greater``, ``ArgMax``,
    ``Floor``, a Cast to an integer) — is caught by :func:`policyport.verification.verify`, which
    compares the oracle's integer and bool tensors with the backends' and does not use it downstream
    of one that differs.

    Args:
        graph: the graph.

    Returns:
        A new :class:`~policyport.graph.model.Graph`.
    """
    from dataclasses import replace

    def wide(array):
        code = _WIDENED.get(array.dtype.name)
        return array if code is None else array.astype(np.float64 if code == 11 else np.complex128)

    def wide_info(v):
        code = _WIDENED.get(v.dtype.name)
        return v if code is None else replace(v, dtype=np.dtype(np.float64 if code == 11 else np.complex128))

    nodes = []
    for n in graph.nodes:
        attrs = {k: wide(v) if isinstance(v, np.ndarray) else v for k, v in n.attrs.items()}
        key = _TYPE_ATTRS.get(n.op_type)
        if key in attrs and attrs[key] in _WIDENED_CODES:
            attrs[key] = _WIDENED_CODES[attrs[key]]
        if n.op_type == "LayerNormalization":  # its default stash_type is float32
            attrs.setdefault("stash_type", 11)
        for key in ("value_float", "value_floats"):
            if n.op_type == "Constant" and key in attrs:
                attrs["value"] = np.array(attrs.pop(key), dtype=np.float64)  # pragma: no mutate (float64 is numpy's default)
        if n.op_type == "ConstantOfShape" and "value" not in attrs:
            attrs["value"] = np.zeros(1, np.float64)  # pragma: no mutate (float64 is numpy's default)
        nodes.append(replace(n, attrs=attrs))
    return replace(
        graph,
        nodes=nodes,
        inputs=[wide_info(v) for v in graph.inputs],
        outputs=[wide_info(v) for v in graph.outputs],
        optional_inputs=[wide_info(v) for v in graph.optional_inputs],
        initializers={k: wide(v) for k, v in graph.initializers.items()},
    )


@dataclass(frozen=True)
class Stage:
    """One piece of a split graph: a model that reads ``inputs`` and returns ``outputs``."""

    model: object  # onnx.ModelProto
    inputs: list[str]
    outputs: list[str]


def split_at(model, tensors, keep=()) -> list[Stage]:
    """The model cut into stages that end at each of ``tensors``, to run one after the other.

    A node's stage is the highest stage among its inputs, where a graph input or initializer is in
    stage 0 and a tensor of ``tensors`` becomes available only in the stage after its producer's.
    So every consumer of a cut tensor runs in a later stage than its producer, and the caller can
    replace the tensor between the two. Each stage reads the graph inputs and earlier tensors it
    uses (typed by ONNX shape inference) and returns the tensors that later stages read, the cut
    tensors, and those of ``keep`` (graph outputs, recorded tensors) it produces. Nodes keep their
    order; each stage holds the initializers its nodes read. The same idea as
    ``onnx.utils.extract_model``, for several cuts at once and without files.

    Args:
        model: an ``onnx.ModelProto`` or a path (left untouched).
        tensors: node-output names to cut at.
        keep: further tensor names to return from the stage that makes them.

    Returns:
        The stages in execution order (a stage that would return nothing is left out).

    Raises:
        InputMismatchError: a name of ``tensors`` is not a node output.
        BadModelError: shape inference cannot type a tensor that crosses a cut.
    """
    onnx = require("onnx", "onnx", "splitting a model")
    source = ensure_model(model)
    g = source.graph
    cut = set(tensors)
    producers = {o for n in g.node for o in n.output if o}
    unknown = [t for t in tensors if t not in producers]
    if unknown:
        raise InputMismatchError(f"cannot split at {unknown}: no node produces them")
    level: dict[str, int] = {}
    stage_of = []
    for n in g.node:
        k = max((level.get(t, 0) for t in n.input if t), default=0)
        stage_of.append(k)
        level.update({o: k + (o in cut) for o in n.output if o})
    made_in = {o: k for n, k in zip(g.node, stage_of) for o in n.output if o}
    try:
        inferred = onnx.shape_inference.infer_shapes(source)
    except Exception as e:  # InferenceError and friends
        raise BadModelError(f"ONNX shape inference failed on the model: {e}") from e
    known = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    inits = {t.name: t for t in g.initializer}
    wanted = cut | set(keep) | {o.name for o in g.output}

    def info(name: str):
        v = known.get(name)
        if v is None or not v.type.tensor_type.elem_type:
            raise BadModelError(f"cannot split the model at {name!r}: ONNX shape inference gives it no element type")
        return v

    stages = []
    for k in range(max(stage_of, default=-1) + 1):
        nodes = [n for n, s in zip(g.node, stage_of) if s == k]
        read = list(dict.fromkeys(t for n in nodes for t in n.input if t))
        inputs = [t for t in read if t not in inits and made_in.get(t, -1) < k]
        later = {t for n, s in zip(g.node, stage_of) if s > k for t in n.input}
        outputs = [o for n in nodes for o in n.output if o and (o in later or o in wanted)]
        if not outputs:
            continue
        graph = onnx.helper.make_graph(nodes, f"{g.name or 'graph'}_stage{k}", [info(t) for t in inputs],
                                       [info(o) for o in outputs], [inits[t] for t in read if t in inits])
        piece = onnx.helper.make_model(graph, opset_imports=source.opset_import, ir_version=source.ir_version)
        piece.functions.extend(source.functions)
        stages.append(Stage(piece, inputs, outputs))
    return stages


#: Metadata a model gets from :func:`free_batch`: the graph inputs whose batch of 1 it freed (JSON list).
BATCH_FREED_KEY = "policyport.batch_freed"
#: Ops that compute each row of a ``(batch, ...)`` tensor from that row alone (with weights that have no
#: batch axis, or one of size 1 that broadcasts): a fixed batch of 1 in front of them can be freed.
ROW_WISE_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Clip", "Identity", "Relu", "Elu",
    "Selu", "LeakyRelu", "Tanh", "Sigmoid", "Softplus", "Gelu", "Mish", "HardSwish", "HardSigmoid", "Erf", "Max", "Min",
    "MatMul", "Gemm",
})


@dataclass(frozen=True)
class FixedBatch:
    """What a model declares about its batch: ``inputs`` are the graph inputs (rank >= 2, not
    initializers) whose first dimension is fixed at 1; ``reason`` says why :func:`free_batch` leaves
    that batch as it is (``None``: it frees it, or there is nothing to free)."""

    inputs: list[str]
    reason: str | None = None


def fixed_batch(model) -> FixedBatch:
    """The graph inputs declared with a batch of 1, and whether the graph allows freeing it.

    It allows it when every node is an op of :data:`ROW_WISE_OPS` (or a ``Constant``) in the default
    domain; a ``Gemm`` or ``MatMul`` multiplies the batch by a constant second input (an initializer or
    a ``Constant``'s output), a ``Gemm`` without ``transA``; and no constant operand of an element-wise
    op has a first axis longer than 1 at rank 2 or more (it would broadcast along the batch). Shapes
    are not inferred: the freed graph is checked against the file's at batch 1 where it is loaded
    (:func:`policyport.runtime.batch.free_checked`).

    Args:
        model: an ``onnx.ModelProto`` (left untouched).

    Returns:
        A :class:`FixedBatch`; ``reason`` names the first node (or initializer) that mixes rows or is not
        known to compute each row alone, when there are inputs to free.
    """
    def first_dim(info):
        t = info.type.tensor_type
        dims = t.shape.dim if t.HasField("shape") else []
        return dims[0] if dims else None

    initializers = {t.name: tuple(t.dims) for t in model.graph.initializer}
    fixed = [i.name for i in model.graph.input if (d := first_dim(i)) is not None and d.HasField("dim_value")
             and d.dim_value == 1 and len(i.type.tensor_type.shape.dim) >= 2 and i.name not in initializers]
    if not fixed:
        return FixedBatch([])
    constants = set(initializers)
    for node in model.graph.node:
        what = f'{node.op_type} node "{node.name or node.output[0]}"'
        if node.domain not in ("", "ai.onnx"):
            return FixedBatch(fixed, f"{what} is of domain {node.domain!r}, not known to compute each row alone")
        if node.op_type == "Constant":
            constants.update(node.output)
            continue
        if node.op_type not in ROW_WISE_OPS:
            return FixedBatch(fixed, f"{what} is not among the ops known to compute each row alone "
                                     f"({', '.join(sorted(ROW_WISE_OPS))})")
        if node.op_type in ("Gemm", "MatMul"):
            if node.op_type == "Gemm" and any(a.name == "transA" and a.i for a in node.attribute):
                return FixedBatch(fixed, f"{what} transposes its first input (transA), mixing rows")
            if len(node.input) < 2 or node.input[1] not in constants:
                return FixedBatch(fixed, f"{what} multiplies by {node.input[1] if len(node.input) > 1 else 'nothing'!r}, "
                                         "which is not a constant: it may mix rows")
            if node.input[0] in constants:
                return FixedBatch(fixed, f"{what} has a constant first input: the batch is not its rows")
            continue
        for name in node.input:
            dims = initializers.get(name)
            if dims is not None and len(dims) >= 2 and dims[0] != 1:
                return FixedBatch(fixed, f"{what} reads initializer {name!r} of shape {dims}, which would broadcast "
                                         "along the batch axis")
    return FixedBatch(fixed)


def free_batch(model):
    """``model`` with a batch axis fixed at 1 made free (``"batch"``) where the graph allows it.

    Some exporters write the batch of the example they traced: rsl_rl 5.x's ``export_policy_to_onnx``
    under torch >= 2.9 declares ``obs [1, 48]``, and onnxruntime then refuses a batch of 4. Where
    :func:`fixed_batch` finds that every node computes each row from that row alone, every graph input
    and output whose first dimension is 1 gets the free dimension ``batch``, and the value_info entries
    (which repeat the fixed batch) are dropped; otherwise the model is returned as it is (its
    :func:`fixed_batch` ``reason`` says why). This pass reads the graph only: the loader checks the
    freed graph against the file's at batch 1 (:func:`policyport.runtime.batch.free_checked`).

    Args:
        model: an ``onnx.ModelProto`` (left untouched).

    Returns:
        ``model`` itself when no graph input has a fixed batch of 1, the graph does not allow freeing
        it, or it was freed already; else a changed copy whose ``metadata_props[BATCH_FREED_KEY]`` lists
        the inputs freed.
    """
    found = fixed_batch(model)
    if not found.inputs or found.reason is not None or any(p.key == BATCH_FREED_KEY for p in model.metadata_props):
        return model
    copy = type(model)()
    copy.CopyFrom(model)
    for info in [*copy.graph.input, *copy.graph.output]:
        dims = info.type.tensor_type.shape.dim if info.type.tensor_type.HasField("shape") else []
        if dims and dims[0].HasField("dim_value") and dims[0].dim_value == 1 and len(dims) >= 2 \
                and (info.name in found.inputs or info in copy.graph.output):
            dims[0].dim_param = "batch"
    del copy.graph.value_info[:]
    entry = copy.metadata_props.add()
    entry.key, entry.value = BATCH_FREED_KEY, json.dumps(found.inputs)
    return copy
