"""What a Keras file's config or a SavedModel's graph declares, checked against policyport's limits
before Keras or TensorFlow reads the file and allocates it.

* A ``.keras`` archive (Keras 3 ``saving_lib``): every member stored or deflated (Python's
  ``zipfile`` decompresses bzip2 and LZMA members without an output bound, and Keras reads
  ``config.json`` whole), ``config.json`` no larger than parsing it within the array limit allows;
  an ``.h5`` file's ``model_config`` attribute likewise.
* The config's layers: no more than the node limit (each becomes at least one graph node), nor than
  the memory this process can get allows for loading them (:data:`KERAS_LAYER_BYTES` each); the
  weights each layer's config declares (``Dense(units)`` on its input width, kernels, embeddings,
  recurrent cells), added up, within the array limit.
* A SavedModel's ``saved_model.pb``: every tensor its graph and functions size from a constant
  (``Fill``, ``BroadcastTo``, random ops, ``Range``, ``Tile``, a ``Const`` of a declared shape,
  a variable's declared shape) within the array limit, the limit the numpy backend applies to a
  tensor sized from a value in the model.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import Any, Iterator

from ..errors import ZIP_ERRORS, LimitExceededError, PolicyportError, UnreadableFileError
from ..io.limits import ENV_NODES, check_array_bytes, check_json_bytes, check_memory, limits
from ..io.schema import load_json

#: Memory that loading and converting one Keras layer takes beside its weights: its Keras and
#: TensorFlow objects, its part of the traced function and of tf2onnx's graph. Measured as the
#: peak resident set of ``policyport inspect`` on 250 ``Dense(1)`` layers against one: 0.87 MB a layer.
KERAS_LAYER_BYTES = 1 << 20

#: Zip compression methods whose output ``zipfile`` bounds by the member's declared size.
_BOUNDED = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}
_METHODS = {zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "LZMA"}

# ----------------------------------------------------------------------------------- Keras files


def check_keras_config(path: Path) -> dict | None:
    """Refuse a ``.keras`` or ``.h5`` file whose config declares more than the limits allow, from
    the config alone, before Keras reads the file (see the module docstring).

    Returns:
        The model config (``config.json``, or an ``.h5`` file's ``model_config``), None where the
        file holds none that can be told.

    Raises:
        UnreadableFileError: a ``.keras`` member compressed with another method than stored or
            deflated; a config that is not a JSON object.
        LimitExceededError: a config larger than parsing it within the array limit allows; more
            layers than the node limit or than the memory this process can get holds; layer
            weights above the array limit, naming the largest layer.
    """
    config = _read_config(path)
    if config is None:
        return None
    layers: list[tuple[str, str, int, int]] = []
    _walk(config.get("config"), None, layers)
    count, limit = len(layers), limits().nodes
    if count > limit:
        raise LimitExceededError(f"{path}: its config declares {count:,} layers, more than the limit of {limit:,} "
                                 f"graph nodes (each layer becomes at least one); if you trust it, raise the limit with "
                                 f"{ENV_NODES}={count}")
    check_memory(count * KERAS_LAYER_BYTES, f"{path}: loading the {count:,} Keras layers its config declares",
                 advice="a policy network has a few layers; convert this file on a machine with more memory only if "
                        "you trust it")
    total = sum(elements * size for _, _, elements, size in layers)
    if layers:
        name, kind, elements, size = max(layers, key=lambda layer: layer[2] * layer[3])
        check_array_bytes(total, f"{path}: the weights its config declares ({elements:,} in the {kind} layer {name!r} "
                          "alone)", purpose="the weights of a model, sized from its config")
    return config


def _read_config(path: Path) -> dict | None:
    """The model config of a ``.keras`` archive (``config.json``) or an ``.h5`` file (its
    ``model_config`` attribute), read within the limits; None where the file holds none that can
    be told (Keras then says what is wrong)."""
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    if info.compress_type not in _BOUNDED:
                        method = _METHODS.get(info.compress_type, f"method {info.compress_type}")
                        raise UnreadableFileError(
                            f"{path}: member {info.filename!r} is compressed with {method}, which Python's zipfile "
                            "decompresses without a bound on its size; a .keras archive holds stored or deflated "
                            "members (Keras writes them stored) — save the model again")
                try:
                    info = zf.getinfo("config.json")
                except KeyError:
                    return None
                check_json_bytes(info.file_size, f"{path}: config.json")
                text = zf.read(info)  # no more than the size just checked: zipfile stops there
        except ZIP_ERRORS as e:
            if isinstance(e, PolicyportError):
                raise
            raise UnreadableFileError(f"{path} is not a readable .keras archive (a damaged or truncated zip file: "
                                      f"{e})") from e
    else:
        try:
            import h5py
        except ImportError:
            return None
        try:
            with h5py.File(path, "r") as f:
                if "model_config" not in f.attrs:
                    return None
                check_json_bytes(f.attrs.get_id("model_config").get_storage_size(), f"{path}: model_config")
                text = f.attrs["model_config"]
        except (OSError, KeyError, ValueError, TypeError):
            return None  # not an HDF5 file h5py reads: Keras says so
    config = load_json(text, f"{path}: its model config", error=UnreadableFileError)
    if not isinstance(config, dict):
        raise UnreadableFileError(f"{path}: its model config is not a JSON object")
    return config


def _walk(model: Any, width: int | None, found: list[tuple[str, str, int, int]], depth: int = 0) -> int | None:
    """Add ``(layer name, class name, weight elements, bytes each)`` for every layer of the model
    config ``model`` (nested models included) to ``found``, following the width of the tensor from
    layer to layer in their order (a layer's ``build_config`` input shape, where saved, says it);
    returns the width after the last layer."""
    layers = model.get("layers") if isinstance(model, dict) else None
    if not isinstance(layers, list) or depth > 64:
        return width
    for layer in layers:
        if not isinstance(layer, dict):
            continue
        kind = str(layer.get("class_name"))
        config = layer.get("config") if isinstance(layer.get("config"), dict) else {}
        built = layer.get("build_config")
        given = _last_dim(built.get("input_shape")) if isinstance(built, dict) else None
        width = given if given is not None else width
        if kind == "InputLayer":
            width = _last_dim(config.get("batch_shape", config.get("batch_input_shape"))) or width
            found.append((str(config.get("name")), kind, 0, 0))
        elif isinstance(config.get("layers"), list):  # a model inside the model
            width = _walk(config, width, found, depth + 1)
        else:
            elements, width = _weights(kind, config, width)
            found.append((str(config.get("name")), kind, elements, _itemsize(config.get("dtype"))))
    return width


def _weights(kind: str, config: dict, width: int | None) -> tuple[int, int | None]:
    """The weight elements a layer of class ``kind`` with ``config`` creates on an input of ``width``
    features (unknown: 1), and the width of its output; 0 and the same width for a class not
    listed here (its weights are not told from the config)."""
    n = width or 1
    if kind == "Bidirectional" and isinstance(config.get("layer"), dict):
        inner = config["layer"]
        elements, out = _weights(str(inner.get("class_name")), inner.get("config") or {}, width)
        return 2 * elements, None if out is None else 2 * out
    units, filters = _count(config, "units"), _count(config, "filters")
    kernel = math.prod(_count({"k": k}, "k") for k in config.get("kernel_size") or []) \
        if isinstance(config.get("kernel_size"), list) else _count(config, "kernel_size")
    if kind in ("Dense", "QuantizedDense"):
        return units * n + units, units
    if kind == "Embedding":
        out = _count(config, "output_dim")
        return _count(config, "input_dim") * out, out
    if kind.startswith(("Conv", "SeparableConv", "DepthwiseConv")):
        return kernel * n * max(filters, 1) + filters, filters or n
    if kind in ("LSTM", "LSTMCell"):
        return 4 * units * (n + units + 1), units
    if kind in ("GRU", "GRUCell"):
        return 3 * units * (n + units + 2), units
    if kind in ("SimpleRNN", "SimpleRNNCell"):
        return units * (n + units + 1), units
    if kind in ("BatchNormalization", "LayerNormalization", "GroupNormalization", "Normalization", "RMSNormalization"):
        return 4 * n, n
    if kind == "MultiHeadAttention":
        heads, key = _count(config, "num_heads"), _count(config, "key_dim")
        value = _count(config, "value_dim") or key
        return heads * (2 * key + 2 * value) * n, n
    return 0, width


def _count(config: dict, key: str) -> int:
    """A non-negative integer of a config (0 when it is not one)."""
    value = config.get(key)
    return value if type(value) is int and value >= 0 else 0


def _last_dim(shape: Any) -> int | None:
    """The last dimension of a saved shape (a list of ints and nulls; of several inputs, the widest)."""
    if not isinstance(shape, list) or not shape:
        return None
    if all(isinstance(s, list) for s in shape):
        widths = [w for w in (_last_dim(s) for s in shape) if w is not None]
        return max(widths) if widths else None
    last = shape[-1]
    return last if type(last) is int and last >= 0 else None


def _itemsize(dtype: Any) -> int:
    """Bytes of a weight of a layer's dtype policy (``float32``, ``mixed_float16`` keep float32 weights)."""
    name = dtype.get("config", {}).get("name") if isinstance(dtype, dict) else dtype
    return 8 if isinstance(name, str) and "64" in name else 4


# ------------------------------------------------------------------------------------ SavedModels

#: TensorFlow ops whose output's shape is the value of one of their inputs: op -> that input.
_SHAPE_INPUT = {"Fill": 0, "BroadcastTo": 1, "Empty": 0, "RandomUniform": 0, "RandomUniformInt": 0,
                "RandomStandardNormal": 0, "TruncatedNormal": 0, "StatelessRandomUniform": 0,
                "StatelessRandomNormal": 0, "StatelessTruncatedNormal": 0, "StatelessRandomUniformV2": 0,
                "StatelessRandomNormalV2": 0, "StatelessTruncatedNormalV2": 0, "StatelessRandomUniformIntV2": 0,
                "Tile": 1}
#: The most elements of a constant read as a shape or a range bound (a shape has a few).
_SMALL = 64


def check_savedmodel_sizes(path: Path, tf) -> None:
    """Refuse a SavedModel whose graph or functions size a tensor from a constant above the array
    limit, from ``saved_model.pb`` alone, before TensorFlow loads it (see the module docstring).

    Args:
        path: the SavedModel folder.
        tf: the ``tensorflow`` module.

    Raises:
        LimitExceededError: ``saved_model.pb`` itself, or such a tensor, above the array limit,
            naming the node, its function, shape and size.
        UnreadableFileError: ``saved_model.pb`` is not a SavedModel.
    """
    from tensorflow.core.protobuf import saved_model_pb2

    pb = path / "saved_model.pb"
    check_array_bytes(pb.stat().st_size, f"{pb}")
    saved = saved_model_pb2.SavedModel()
    try:
        saved.ParseFromString(pb.read_bytes())
    except Exception as e:  # protobuf's DecodeError
        raise UnreadableFileError(f"{pb} is not a readable SavedModel: {e}") from None
    for scope, nodes in _scopes(saved):
        consts = {n.name: n for n in nodes if n.op == "Const"}
        for node in nodes:
            shape = _declared_shape(node, consts, tf)
            if shape is not None and all(d >= 0 for d in shape):
                dtype, size = _dtype(node, tf)
                check_array_bytes(math.prod(shape) * size, f'{pb}: {node.op} node "{node.name}" in {scope}: its '
                                  f"output ({dtype}, shape {tuple(shape)})",
                                  purpose="one tensor sized from a value in the model")


def _scopes(saved) -> Iterator[tuple[str, list]]:
    """``(where, nodes)`` of every graph and function of a SavedModel."""
    for graph in (m.graph_def for m in saved.meta_graphs):
        yield "its graph", list(graph.node)
        for f in graph.library.function:
            yield f"function {f.signature.name}", list(f.node_def)


def _declared_shape(node, consts: dict, tf) -> list[int] | None:
    """The shape ``node`` gives its output from a constant or an attribute, where one does."""
    if node.op == "Const":
        return [d.size for d in node.attr["value"].tensor.tensor_shape.dim]
    if node.op in ("VarHandleOp", "VariableV2") and "shape" in node.attr:
        shape = node.attr["shape"].shape
        return None if shape.unknown_rank else [d.size for d in shape.dim]
    if node.op == "Range":
        bounds = [_const_values(node, i, consts, tf) for i in range(3)]
        if any(b is None or len(b) != 1 for b in bounds) or bounds[2][0] == 0:
            return None
        (start,), (limit,), (delta,) = bounds
        return [max(0, math.ceil((limit - start) / delta))]
    if node.op in _SHAPE_INPUT:
        values = _const_values(node, _SHAPE_INPUT[node.op], consts, tf)
        return None if values is None else [int(v) for v in values]
    return None


def _const_values(node, index: int, consts: dict, tf) -> list | None:
    """The values of the ``index``-th input of ``node`` when a small constant of the same graph or
    function makes it."""
    inputs = [i for i in node.input if not i.startswith("^")]
    if index >= len(inputs):
        return None
    const = consts.get(inputs[index].split(":")[0])
    if const is None:
        return None
    tensor = const.attr["value"].tensor
    if math.prod(d.size for d in tensor.tensor_shape.dim) > _SMALL:
        return None
    try:
        return tf.make_ndarray(tensor).reshape(-1).tolist()
    except Exception:  # noqa: BLE001 - a malformed constant: TensorFlow says so when it loads it
        return None


def _dtype(node, tf) -> tuple[str, int]:
    """The name and byte size of the element type of ``node``'s output (``?`` and 1 when unknown)."""
    for key in ("dtype", "T", "Tidx"):
        if key in node.attr:
            try:
                dtype = tf.dtypes.as_dtype(node.attr[key].type)
                return dtype.name, max(dtype.size, 1)
            except (TypeError, ValueError):
                break
    return "?", 1
