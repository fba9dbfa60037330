"""Graph passes: pure functions of an ONNX model that never modify their argument or any file.

* :func:`extract_weights` — the initializers as the source's parameters, under the source's names
  and in its layout;
* :func:`expose` — intermediate tensors made graph outputs (the "mark every tensor as an output"
  pass of Polygraphy), so any runtime can return them;
* :func:`free_dims` — dimensions declared as 0 or negative made unknown, as policyport reads them;
* :func:`prune` — only what chosen outputs need;
* :func:`widen_to_float64` — a :class:`~policyport.graph.Graph` computed in float64, the oracle of
  the float32-rounding rule.
"""

from __future__ import annotations

import json

import numpy as np

from .errors import BadModelError, require
from .files import ensure_model
from .runtime.base import select_tensors

PARAMETERS_KEY = "policyport.parameters"


def parameter_map(model) -> dict[str, dict]:
    """Initializer name -> ``{"name": source parameter name, "transpose": perm or None}``.

    Read from ``metadata_props["policyport.parameters"]``, which policyport's converters write; a
    value may be a plain source name (no layout change) or such a dict. A model policyport did not
    write maps every initializer to itself.

    Raises:
        BadModelError: the metadata is not valid JSON of that form.
    """
    props = {p.key: p.value for p in model.metadata_props}
    if PARAMETERS_KEY not in props:
        return {t.name: {"name": t.name, "transpose": None} for t in model.graph.initializer}
    try:
        raw = json.loads(props[PARAMETERS_KEY])
        return {
            k: {"name": v, "transpose": None} if isinstance(v, str)
            else {"name": str(v["name"]), "transpose": v.get("transpose")}
            for k, v in raw.items()
        }
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise BadModelError(f"metadata {PARAMETERS_KEY!r} is malformed: {e}") from e


def extract_weights(model) -> dict[str, np.ndarray]:
    """The model's parameters under the source's names, in the source's layout, bit for bit.

    Args:
        model: an ``onnx.ModelProto`` or a path to an ``.onnx`` file (external data is loaded).

    Returns:
        source parameter name -> array (dtype and shape as the source stored it, e.g.
        ``default_policy/fc_1/kernel``: float32 ``(275, 256)``), in initializer order. Constants the
        converter added (Slice bounds of a head) are not parameters and are left out.

    Raises:
        BadModelError: malformed parameter metadata, or a parameter named twice.
        UnreadableFileError: the path cannot be read.
    """
    numpy_helper = require("onnx.numpy_helper", "onnx", "extracting weights")
    model = ensure_model(model)
    mapping = parameter_map(model)
    weights: dict[str, np.ndarray] = {}
    for init in model.graph.initializer:
        if init.name not in mapping:
            continue
        spec = mapping[init.name]
        arr = numpy_helper.to_array(init)
        if spec["transpose"] is not None:
            arr = np.ascontiguousarray(np.transpose(arr, np.argsort(spec["transpose"])))
        if spec["name"] in weights:
            raise BadModelError(f"two initializers map to the source parameter {spec['name']!r}")
        weights[spec["name"]] = arr
    return weights


def expose(model, tensors: str | list[str] | None = "*"):
    """A copy of ``model`` whose graph outputs also include intermediate tensors.

    Args:
        model: an ``onnx.ModelProto`` or a path to an ``.onnx`` file (left untouched).
        tensors: ``fnmatch`` globs over node-output names, comma-separated or a list; ``"*"`` or
            ``None`` exposes every node output.

    Returns:
        A new ``onnx.ModelProto``: the original graph outputs first, then each selected node output
        (in node order) with the element type and shape that ONNX shape inference gives it.

    Raises:
        InputMismatchError: a pattern matches no tensor.
        BadModelError: shape inference cannot type a selected tensor.
    """
    onnx = require("onnx", "onnx", "exposing tensors")
    source = ensure_model(model)
    node_outputs = [o for n in source.graph.node for o in n.output if o]
    chosen = select_tensors(node_outputs, tensors)
    copy = onnx.ModelProto()
    copy.CopyFrom(source)
    try:
        inferred = onnx.shape_inference.infer_shapes(copy)
    except Exception as e:  # InferenceError and friends
        raise BadModelError(f"ONNX shape inference failed on the model: {e}") from e
    known = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]}
    present = {o.name for o in copy.graph.output}
    for name in chosen:
        if name in present:
            continue
        info = known.get(name)
        if info is None or not info.type.tensor_type.elem_type:
            raise BadModelError(f"cannot expose {name!r}: ONNX shape inference gives it no element type")
        copy.graph.output.append(info)
        present.add(name)
    return copy


def free_dims(model):
    """``model`` with every dimension declared as 0 or a negative number made unknown.

    Exporters write ``-1`` (Paddle2ONNX) or 0 for a free dimension; policyport reads both as free
    (:func:`policyport.graph.free_dim`). onnxruntime agrees for a negative one but takes 0
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
        return [d for d in t.shape.dim if d.HasField("dim_value") and d.dim_value <= 0] if t.HasField("shape") else []

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
    """The graph computed in float64: the oracle of the rounding rule (:mod:`policyport.compare`).

    A pure pass over a :class:`~policyport.graph.Graph` (numpy only; the argument is unchanged).
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
        A new :class:`~policyport.graph.Graph`.
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
        if n.op_type == "LayerNormalization" and "stash_type" not in attrs:
            attrs["stash_type"] = 11
        for key in ("value_float", "value_floats"):
            if n.op_type == "Constant" and key in attrs:
                attrs["value"] = np.array(attrs.pop(key), dtype=np.float64)
        if n.op_type == "ConstantOfShape" and "value" not in attrs:
            attrs["value"] = np.zeros(1, np.float64)
        nodes.append(replace(n, attrs=attrs))
    return replace(
        graph,
        nodes=nodes,
        inputs=[wide_info(v) for v in graph.inputs],
        outputs=[wide_info(v) for v in graph.outputs],
        optional_inputs=[wide_info(v) for v in graph.optional_inputs],
        initializers={k: wide(v) for k, v in graph.initializers.items()},
    )


def prune(model, outputs: str | list[str]):
    """A copy of ``model`` that computes only the graph outputs ``outputs`` and what they need.

    Nodes no chosen output depends on are dropped, and so are the initializers and graph inputs
    nothing reads any more (so a feed for a dropped input is refused as unexpected).

    Args:
        model: an ``onnx.ModelProto`` or a path to an ``.onnx`` file (left untouched).
        outputs: graph output names, a list or one comma-separated string; each must be a graph
            output or a node output (which then becomes a graph output, typed as ONNX shape
            inference gives it).

    Returns:
        A new ``onnx.ModelProto``.

    Raises:
        InputMismatchError: no name given, or a name that is no tensor of the model (the message
            lists the graph outputs).
    """
    from .errors import InputMismatchError

    source = ensure_model(model)
    names = [o.strip() for o in outputs.split(",")] if isinstance(outputs, str) else [str(o) for o in outputs]
    names = list(dict.fromkeys(o for o in names if o))
    declared = [o.name for o in source.graph.output]
    produced = {o for n in source.graph.node for o in n.output if o}
    unknown = [o for o in names if o not in declared and o not in produced]
    if not names or unknown:
        raise InputMismatchError(
            f"--outputs {unknown or names!r}: not tensors of the model; its graph outputs are {', '.join(declared)}"
        )
    extra = [o for o in names if o not in declared]
    if extra:
        source = expose(source, extra)
    needed = set(names)
    keep = []
    for n in reversed(source.graph.node):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(i for i in n.input if i)
    copy = type(source)()
    copy.CopyFrom(source)
    by_name = {o.name: o for o in source.graph.output}
    del copy.graph.node[:]
    copy.graph.node.extend(reversed(keep))
    del copy.graph.output[:]
    copy.graph.output.extend(by_name[o] for o in names)
    kept_inits = [t for t in source.graph.initializer if t.name in needed]
    del copy.graph.initializer[:]
    copy.graph.initializer.extend(kept_inits)
    kept_inputs = [v for v in source.graph.input if v.name in needed]
    del copy.graph.input[:]
    copy.graph.input.extend(kept_inputs)
    kept_infos = [v for v in source.graph.value_info if v.name in needed or v.name in names]
    del copy.graph.value_info[:]
    copy.graph.value_info.extend(kept_infos)
    return copy
