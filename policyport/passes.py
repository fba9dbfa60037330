"""Graph passes: pure functions of an ONNX model that never modify their argument or any file.

* :func:`extract_weights` — the initializers as the source's parameters, under the source's names
  and in its layout;
* :func:`expose` — intermediate tensors made graph outputs (the "mark every tensor as an output"
  pass of Polygraphy), so any runtime can return them.
"""

from __future__ import annotations

import json

import numpy as np

from .errors import BadModelError, require
from .files import ensure_model
from .graph import tensor_array
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
    require("onnx", "onnx", "extracting weights")
    model = ensure_model(model)
    mapping = parameter_map(model)
    weights: dict[str, np.ndarray] = {}
    for init in model.graph.initializer:
        if init.name not in mapping:
            continue
        spec = mapping[init.name]
        arr = tensor_array(init)
        if spec["transpose"] is not None:
            arr = np.ascontiguousarray(np.transpose(arr, np.argsort(spec["transpose"])))
        if spec["name"] in weights:
            raise BadModelError(f"two initializers map to the source parameter {spec['name']!r}")
        weights[spec["name"]] = arr
    return weights


def expose(model, tensors: str | list[str] | None = "*", *, exact: bool = False):
    """A copy of ``model`` whose graph outputs also include intermediate tensors.

    Args:
        model: an ``onnx.ModelProto`` or a path to an ``.onnx`` file (left untouched).
        tensors: node-output names or ``fnmatch`` globs over them, comma-separated or a list (a
            pattern that is a tensor's exact name selects that tensor only: see
            :func:`policyport.runtime.base.select_tensors`); ``"*"`` or ``None`` exposes every node output.
        exact: take every entry of ``tensors`` as a name, never as a glob.

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
    chosen = select_tensors(node_outputs, tensors, exact=exact)
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
