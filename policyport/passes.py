"""Graph passes: pure functions of an ONNX model that never modify their argument or any file.

* :func:`extract_weights` — the initializers as the source's parameters, under the source's names
  and in its layout;
* :func:`expose` — intermediate tensors made graph outputs (the "mark every tensor as an output"
  pass of Polygraphy), so any runtime can return them;
* :func:`split_at` — the graph cut into stages at chosen tensors, so a runtime that executes a
  whole graph at once (onnxruntime) can hand those tensors to the caller, who may change them (neuron
  overrides), before the rest of the graph reads them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from .errors import BadModelError, InputMismatchError, require
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
