"""Intermediate tensors as graph outputs: :func:`expose` (the "mark every tensor as an output" pass
of Polygraphy, so any runtime can return them) and :func:`prune` (only what chosen outputs need).
A graph output must have an element type and a shape; where ONNX shape inference cannot tell them,
one run of the model on the numpy backend (or onnxruntime) does, which is why these passes live
with the runtime rather than with the pure graph passes of :mod:`policyport.graph.passes`."""

from __future__ import annotations

import numpy as np

from ..errors import BadModelError, PolicyportError, require
from ..graph.onnx_files import ensure_model
from ..graph.passes import infer_shapes
from ..graph.selection import select_tensors


def expose(model, tensors: str | list[str] | None = "*", *, exact: bool = False):
    """A copy of ``model`` whose graph outputs also include intermediate tensors.

    Every graph output of the copy has an element type and a shape, as ``onnx.checker`` (with
    ``full_check=True``) demands of graph outputs: what ONNX shape inference gives it (with data
    propagation, which resolves a Reshape to a computed shape), else — where inference cannot tell
    the type or the rank (an op it does not know, an input of unknown rank) — the element type and
    rank of the tensor in one run of the model on the numpy backend, with every dimension left
    unknown. Original graph outputs that declare no shape get one the same way.

    Args:
        model: an ``onnx.ModelProto`` or a path to an ``.onnx`` file (left untouched).
        tensors: node-output names or ``fnmatch`` globs over them, comma-separated or a list (a
            pattern that is a tensor's exact name selects that tensor only: see
            :func:`policyport.runtime.base.select_tensors`); ``"*"`` or ``None`` exposes every node output.
        exact: take every entry of ``tensors`` as a name, never as a glob.

    Returns:
        A new ``onnx.ModelProto``: the original graph outputs first, then each selected node output
        (in node order).

    Raises:
        InputMismatchError: a pattern matches no tensor.
        BadModelError: shape inference fails on the model, or a tensor it cannot type cannot be
            computed either.
    """
    onnx = require("onnx", "onnx", "exposing tensors")
    source = ensure_model(model)
    node_outputs = [o for n in source.graph.node for o in n.output if o]
    chosen = select_tensors(node_outputs, tensors, exact=exact)
    copy = onnx.ModelProto()
    copy.CopyFrom(source)
    inferred = infer_shapes(copy)
    known: dict = {}
    for v in [*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info]:
        if _typed(v) or v.name not in known:  # inference's result wins over a shapeless declaration
            known[v.name] = v
    present = {o.name for o in copy.graph.output}
    added = [name for name in chosen if name not in present]
    untyped = [n for n in [*present, *added] if not _typed(known.get(n))]
    probed, why = _probe(source, untyped) if untyped else ({}, "")  # pragma: no mutate (probing nothing finds nothing)

    def info(name):
        if name in probed:  # inference cannot type it, one run did
            return probed[name]
        if known.get(name) is not None and known[name].type.tensor_type.elem_type:
            return known[name]  # typed by inference, of known rank or (all that can be said) not
        raise BadModelError(f"cannot expose {name!r}: ONNX shape inference gives it no element type, {why}")

    for out in copy.graph.output:
        if not _typed(out):
            out.CopyFrom(info(out.name))
    for name in added:
        copy.graph.output.append(info(name))
    return copy


def _typed(info) -> bool:
    """Whether a value_info has what a graph output needs: an element type and a shape."""
    if info is None or not info.type.HasField("tensor_type"):
        return False
    t = info.type.tensor_type
    return bool(t.elem_type) and t.HasField("shape")


def _probe(model, names: list[str]) -> tuple[dict, str]:
    """value_infos of ``names`` from one run of what they need: element type, rank, unknown dims;
    and, when no run is possible, why (else "").

    The graph is pruned to ``names`` and run on the numpy backend, or on onnxruntime where numpy
    lacks an op; the feeds are zeros in each input's declared shape, free dimensions 1.
    """
    from onnx import helper

    from ..graph.model import NUMPY_TO_ONNX, from_onnx

    try:
        graph = from_onnx(model)
        feeds = {v.name: np.zeros([d if isinstance(d, int) else 1 for d in (v.shape or ())], v.dtype)  # pragma: no mutate (any size: only type and rank are kept)
                 for v in graph.inputs}
        values = _run_untyped(model, graph, feeds, names)
    except Exception as e:  # noqa: BLE001 - any failure leaves the tensors as inference gives them
        return {}, f"and one run of the model to find it failed ({type(e).__name__}: {e})"
    infos = {}
    for name, value in zip(names, values):
        value = np.asarray(value)
        code = NUMPY_TO_ONNX.get(value.dtype)
        if code is not None:
            infos[name] = helper.make_tensor_value_info(name, code, [None] * value.ndim)
    return infos, "nor does one run of the model"


def _run_untyped(model, graph, feeds, names: list[str]) -> list:
    """The values of tensors ``names`` for ``feeds``, computing only what they need: on the numpy
    backend, else on onnxruntime with ``names`` as untyped graph outputs."""
    from dataclasses import replace

    from ..graph.model import ValueInfo
    from .numpy import NumpyBackend

    needed = set(names)
    nodes = []
    for n in reversed(graph.nodes):
        if any(o in needed for o in n.outputs):
            nodes.append(n)
            needed.update(i for i in n.inputs if i)
    wanted = replace(graph, nodes=nodes[::-1], outputs=[ValueInfo(n, np.dtype(object), None) for n in names])
    try:
        outputs = NumpyBackend(wanted).run(feeds)
        return [outputs[n] for n in names]
    except PolicyportError:
        onnx = require("onnx", "onnx", "finding the type of a tensor")
        ort = require("onnxruntime", "onnx", "finding the type of a tensor")
        bare = type(model)()
        bare.CopyFrom(model)
        del bare.graph.output[:]
        bare.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
        session = ort.InferenceSession(bare.SerializeToString(), providers=["CPUExecutionProvider"])  # pragma: no mutate (the CPU provider is the one this package installs)
        return session.run(names, feeds)  # pragma: no mutate (names are all the outputs, in order)


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
    from ..errors import InputMismatchError

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
        source = expose(source, extra)  # pragma: no mutate (exposing more is undone below: only names stay outputs)
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
