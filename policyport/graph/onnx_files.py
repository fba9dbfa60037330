"""ONNX files (:func:`load_onnx`, :func:`ensure_model`, :func:`save_onnx`): every initializer
and tensor attribute must hold exactly the data its dims call for; external data is
size-checked before it is read."""

from __future__ import annotations

import os
from pathlib import Path


from ..errors import (BadModelError, UnreadableFileError, require)
from ..io.kinds import check_not_a_source
from ..io.limits import check_array_bytes
from ..io.outputs import write_atomic


def load_onnx(path: str | os.PathLike):
    """An ``onnx.ModelProto`` from an ``.onnx`` file (external data included) or a packed folder
    (checked first by :func:`policyport.graph.folder.read_bundle`, as every reader of a folder is).

    Every initializer and tensor attribute is checked against its dims (:func:`check_model_tensors`);
    external data, which onnx reads only from the model's folder, is size-checked before it is read.

    Raises:
        BadModelError: a packed folder that fails its check (a changed, missing or refused file); a
            tensor whose data does not match its dims, or external data that does.
        UnreadableFileError: missing, unparsable, or without a graph (an empty file parses as one).
        LimitExceededError: external data larger than the array limit.
        MissingDependencyError: onnx is not installed.
    """
    onnx = require("onnx", "onnx", "reading an .onnx file")
    path = Path(path)
    if path.is_dir():  # a packed folder: its model.onnx, after the check every reader of a folder makes
        from .folder import MODEL_FILE, read_bundle

        check_model_folder(path)
        data = read_bundle(path, (MODEL_FILE,))[1][MODEL_FILE]
        path = path / MODEL_FILE
    elif not path.is_file():
        raise UnreadableFileError(f"{path}: no such file")
    else:
        data = None
    try:
        model = onnx.load(str(path), load_external_data=False) if data is None else onnx.load_model_from_string(data)
    except Exception as e:  # protobuf DecodeError, onnx ValidationError, OSError ...
        check_not_a_source(path)
        raise UnreadableFileError(f"{path} is not a readable ONNX model: {e}") from e
    if not model.graph.output:
        check_not_a_source(path)
        raise UnreadableFileError(f"{path} is not an ONNX model: it holds no graph with outputs")
    external = check_model_tensors(model)
    if external:
        check_array_bytes(external, f"{path}: its external data", None)
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
        except Exception as e:  # onnx refuses paths outside the folder, links, short files ...
            raise UnreadableFileError(f"{path}: cannot read its external data: {e}") from e
        check_model_tensors(model)
    return model


def check_model_tensors(model) -> int:
    """Check every initializer and tensor attribute of the main graph against its dims.

    Returns:
        The bytes the tensors stored in external files take (0 when there are none).

    Raises:
        BadModelError: a tensor whose data does not match its dims (see
            :func:`policyport.graph.model.check_tensor`), naming it.
    """
    from .model import EXTERNAL, check_tensor

    AttributeProto = require("onnx", "onnx", "checking an ONNX model").AttributeProto  # noqa: N806

    external = 0
    for t in model.graph.initializer:
        nbytes = check_tensor(t, "initializer")
        external += nbytes if t.data_location == EXTERNAL else 0
    for n in model.graph.node:
        for a in n.attribute:
            tensors = [a.t] if a.type == AttributeProto.TENSOR else list(a.tensors) if a.type == AttributeProto.TENSORS else []
            for t in tensors:
                nbytes = check_tensor(t, f'{n.op_type} node "{n.name}" attribute {a.name!r}: tensor')
                external += nbytes if t.data_location == EXTERNAL else 0
    return external


def save_onnx(path: str | os.PathLike, model, force: bool = False) -> Path:
    """Serialize ``model`` to ``path`` atomically."""
    data = model.SerializeToString()
    return write_atomic(path, lambda f: f.write(data), force)


def ensure_model(model):
    """An ``onnx.ModelProto`` from a ModelProto or a path to an ``.onnx`` file, its tensors checked.

    Raises:
        BadModelError: ``model`` is neither, or a tensor's data does not match its dims.
    """
    if isinstance(model, (str, os.PathLike)):
        return load_onnx(model)
    if type(model).__name__ == "ModelProto":
        check_model_tensors(model)
        return model
    raise BadModelError(f"expected an onnx.ModelProto or a path to an .onnx file, got {type(model).__name__}")


def check_model_folder(path: str | os.PathLike) -> None:
    """Refuse a folder given where a model goes unless ``policyport pack`` wrote it (it holds
    ``policy.json``): a source's folder (a SavedModel, an RLlib checkpoint) is named as what it is,
    with how to convert it (:func:`check_not_a_source`); any other folder is said to be neither an
    ``.onnx`` model nor a packed folder, naming the ``.onnx`` files it holds. Anything else passes.

    Raises:
        UnreadableFileError: such a folder (exit 3).
    """
    from ..graph.folder import POLICY_FILE, not_packed

    path = Path(path)
    if path.is_dir() and not (path / POLICY_FILE).exists() and not (path / POLICY_FILE).is_symlink():
        check_not_a_source(path)
        raise UnreadableFileError(not_packed(path))
