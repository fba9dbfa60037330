"""What a model holds: inputs, outputs, nodes with their tensor shapes, parameters, ops and opset.

Feeds ``policyport inspect``; the op list is checked against the numpy backend's registry.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import PolicyportError, require


def summarize(model) -> dict:
    """A JSON-ready description of an ONNX model.

    Args:
        model: an ``onnx.ModelProto``.

    Returns:
        ``{"opset", "ir_version", "producer", "inputs", "outputs", "nodes", "parameters",
        "parameter_count", "ops", "numpy_backend_lacks", "numpy_backend_refusal", "metadata"}``;
        ``numpy_backend_refusal`` is why the numpy backend refuses the model (the message loading
        it there raises: missing ops, a newer opset than it knows ...), None when it runs it; shapes list ints and
        symbolic dimension names; ``nodes`` give each node's name, op type, output tensor(s) with
        shape and dtype from ONNX shape inference, and the parameters it reads. ``parameters`` are
        the source's, as :func:`policyport.graph.passes.extract_weights` gives them back: the graph's
        initializers that are parameters, and the all-zero arrays an exporter dropped (tf2onnx
        folds away zero biases; ``"initializer"`` None), each array once (tied weights too), in
        the source's order;
        ``parameter_count`` adds up their elements, as the source framework counts its parameters
        (Keras' ``count_params``); ``batch_fixed``, ``batch_freed``, ``batch_note``: the graph inputs
        declared with a batch of 1, whether policyport runs them at any batch, and why (:func:`_batch`).

    Raises:
        LimitExceededError: a graph of more nodes than :attr:`policyport.io.limits.Limits.nodes`, the
            numpy backend's limit (200,000 by default; ``POLICYPORT_MAX_NODES``), before anything is
            read from it.
    """
    onnx = require("onnx", "onnx", "inspecting a model")
    from ..errors import LimitExceededError
    from ..io.limits import ENV_NODES, limits
    from ..graph.model import from_onnx
    from ..graph.passes import infer_shapes, parameter_map, source_order
    from ..runtime import load
    from ..runtime.numpy.registry import missing_ops

    count, limit = len(model.graph.node), limits().nodes
    if count > limit:
        raise LimitExceededError(
            f"the graph has {count:,} nodes, more than the limit of {limit:,} nodes (the numpy backend's: describing "
            f"a graph takes time and memory in proportion to its nodes, as loading it does); if you trust the model, "
            f"raise the limit with {ENV_NODES}={count}")
    graph = from_onnx(model)
    try:
        inferred = infer_shapes(model)
        infos = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]}
    except Exception:  # a model shape inference cannot handle still gets a summary, without shapes
        infos = {}

    def describe(name: str) -> dict:
        info = infos.get(name)
        if info is None or not info.type.HasField("tensor_type"):
            return {"name": name, "dtype": None, "shape": None}
        t = info.type.tensor_type
        shape = None
        if t.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else None
        return {"name": name, "dtype": dtype, "shape": shape}

    params = parameter_map(model)
    nodes = []
    for n in graph.nodes:
        nodes.append({
            "name": n.name,
            "op_type": n.op_type,
            "outputs": [describe(o) for o in n.outputs if o],
            "parameters": [params[i]["name"] for i in n.inputs if i in params and i in graph.initializers],
            "parameter_count": int(sum(graph.initializers[i].size for i in n.inputs if i in params and i in graph.initializers)),
        })
    parameters = []  # in the metadata's order, as extract writes them
    for key, spec in params.items():
        if key in graph.initializers:
            value = graph.initializers[key]
            parameters.append({"name": spec["name"], "initializer": key, "dtype": value.dtype.name,
                               "shape": list(value.shape), "size": int(value.size)})
        elif spec["zeros"] is not None and np.dtype(spec["zeros"]["dtype"]).kind == "f":
            # an all-zero parameter the exporter dropped (tf2onnx folds away zero biases): the source holds it
            parameters.append({"name": spec["name"], "initializer": None, "dtype": spec["zeros"]["dtype"],
                               "shape": spec["zeros"]["shape"], "size": math.prod(spec["zeros"]["shape"])})
    rank = source_order(model)
    parameters.sort(key=lambda p: rank.get(p["name"], len(rank)))  # the source's order, as extract writes them
    ops = sorted({(n.domain, n.op_type) for n in graph.nodes})
    lacks = [m.op_type if not m.domain else f"{m.domain}.{m.op_type}"
             for m in sorted(missing_ops(graph), key=lambda m: (m.domain, m.op_type))]
    try:  # the numpy backend's own verdict: what policyport run --backend numpy would say
        load(graph, backend="numpy")
        refusal = None
    except PolicyportError as e:
        refusal = str(e)
    return {
        "opset": graph.opset,
        "ir_version": model.ir_version,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "inputs": [v.to_dict() for v in graph.inputs],
        "outputs": [v.to_dict() for v in graph.outputs],
        "nodes": nodes,
        "parameters": parameters,
        "parameter_count": int(sum(p["size"] for p in parameters)),
        "ops": [op if not dom else f"{dom}.{op}" for dom, op in ops],
        "numpy_backend_lacks": lacks,
        "numpy_backend_refusal": refusal,
        "metadata": graph.metadata,
        **_batch(model, lacks),
    }


def format_shape(shape) -> str:
    """``(batch, 275)`` for a shape list with symbolic names; ``?`` for unknown."""
    if shape is None:
        return "?"
    dims = ["?" if d is None else str(d) for d in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _batch(model, lacks) -> dict:
    """``batch_fixed``: the graph inputs the file declares with a batch of 1; ``batch_freed``: whether
    policyport runs them at any batch (freed, and checked against the file's graph at batch 1 on the numpy
    backend, or onnxruntime where numpy lacks an op); ``batch_note``: one sentence saying so, or why not."""
    from ..runtime.batch import free_checked

    backend = "numpy" if not lacks else "onnxruntime"
    try:
        freeing = free_checked(model, backend)
    except PolicyportError as e:
        from ..graph.passes import fixed_batch

        fixed = fixed_batch(model).inputs
        return {"batch_fixed": fixed, "batch_freed": False,
                "batch_note": f"batch fixed at 1 in the file ({', '.join(fixed)}); not checked whether it can be freed: {e}"
                if fixed else None}
    return {"batch_fixed": freeing.inputs, "batch_freed": freeing.freed, "batch_note": freeing.describe()}
