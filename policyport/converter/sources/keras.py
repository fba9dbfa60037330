"""Keras and TensorFlow policies to ONNX through tf2onnx, named after the Keras layers.

Sources: a Keras 3 model (``Sequential``, functional or subclassed; live, or a ``.keras`` file, or a
legacy ``.h5``), a TF SavedModel folder (its ``serving_default`` signature), and through the API a
``tf.function`` with an ``input_signature``.

How a model is converted:

1. One ``tf.function`` (batch axis ``None``) calls the model while every leaf layer's ``call`` is
   observed, and returns a dict of every layer's output keyed by the layer's name together with the
   model's own outputs keyed by their Keras names. tf2onnx's ``from_function`` converts it (its
   ``from_keras`` fails on Keras 3 ``Sequential`` models). The same function, run by TensorFlow, is
   the reference forward pass that verification compares every layer against.
2. Graph passes then settle the names: each layer's output tensor is named after the layer (a layer
   that passes its input on unchanged, such as ``Dropout`` at inference, becomes an ``Identity``);
   multi-output layers give ``<layer>/<i>``; the graph outputs are the model's outputs in the model's
   order, under their Keras names; the tensors inside a layer are ``<layer>/<op>``.
3. Parameters: every Keras weight is found among the initializers the layer's own nodes read, bit
   for bit, and the initializer is renamed ``<layer>/<weight>`` (``fc_1/kernel``, ``bn/gamma``).
   tf2onnx drops all-zero biases; those are recorded in ``policyport.parameters`` so that
   :func:`policyport.graph.passes.extract_weights` rebuilds them. ``BatchNormalization`` and
   ``LayerNormalization`` on ``(batch, features)`` tensors, which tf2onnx folds into anonymous
   constants, are rebuilt as ONNX ``BatchNormalization``/``LayerNormalization`` nodes reading the
   Keras ``gamma``, ``beta``, ``moving_mean``, ``moving_variance`` with the layer's exact epsilon
   (``LayerNormalization`` is spelled out in primitive ops below opset 17).
4. Constants a layer holds outside its variables reach the traced function as captured inputs, which
   tf2onnx makes graph inputs; each becomes an initializer of its value (``<layer>/<attribute>``
   when a layer attribute holds it), so the graph takes the model's own inputs alone. A
   preprocessing ``Normalization`` layer (whose ``mean`` and ``variance`` are such constants, copied
   from its variables when it was adapted) is rebuilt as Keras computes it, reading
   ``<layer>/mean`` and ``<layer>/variance``; a variable no computation reads (its ``count``) is
   recorded with its value, so ``extract`` gives every Keras variable back.

Loading a ``.keras``/``.h5`` file uses Keras' ``safe_mode``: a ``Lambda`` layer stored as Python
bytecode (or a ``TFSMLayer``, which loads a SavedModel) is refused unless ``trust`` is given. A
SavedModel is TensorFlow functions that loading it runs (its resources' initializers) and that
tracing it runs (its signature), so it is loaded only with ``trust``. tensorflow and tf2onnx are
imported here, lazily; a missing one raises :class:`~policyport.errors.MissingDependencyError`
naming the ``tf`` extra.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from ...errors import (
    ZIP_ERRORS,
    BadModelError,
    MissingDependencyError,
    OptionError,
    UnreadableFileError,
    UnsupportedOpError,
    UntrustedFileError,
    listing,
)
from ...io.kinds import sha256_file
from ...text import bounded_repr
from ...graph.passes import MAX_VALUE_ELEMENTS, TRAINABLE_KEY
from ..assumptions import Assumption, Oracle, head_assumption, joined, outside_normaliser
from ..build import GAUSSIAN_HEADS, MIN_OPSET, head_name
from ..keras_sizes import check_keras_config, check_savedmodel_sizes

#: The pip extra that installs tensorflow and tf2onnx.
EXTRA = "tf"

class IncompatibleFrameworkError(MissingDependencyError):
    """The installed tensorflow and tf2onnx cannot work together (exit 4)."""

    def __init__(self, message: str):
        self.module, self.extra = "tf2onnx", EXTRA
        Exception.__init__(self, message)


@dataclass
class _Frameworks:
    tf: Any
    keras: Any
    tf2onnx: Any

    @property
    def versions(self) -> str:
        return f"tensorflow {self.tf.__version__} with tf2onnx {self.tf2onnx.__version__}"


def _frameworks() -> _Frameworks:
    """tensorflow, keras and tf2onnx, imported quietly.

    Raises:
        MissingDependencyError: one of them is not installed (the ``tf`` extra).
        IncompatibleFrameworkError: they are installed but fail to import together.
    """
    import logging

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TF's C++ start-up lines would reach stderr
    modules = {}
    with _quiet_stderr():
        _import_all(modules)
    for logger in ("tf2onnx", "tensorflow", "absl"):
        logging.getLogger(logger).setLevel(logging.ERROR)
    return _Frameworks(modules["tensorflow"], modules["keras"], modules["tf2onnx"])


@contextlib.contextmanager
def _quiet_stderr():
    """Send the process's stderr (file descriptor 2) to /dev/null for a while: TensorFlow's C++
    start-up messages (oneDNN, absl) ignore ``TF_CPP_MIN_LOG_LEVEL`` and would reach the user."""
    import sys

    try:
        fd = sys.__stderr__.fileno() if sys.__stderr__ is not None else 2
        saved = os.dup(fd)
    except (OSError, ValueError, AttributeError):  # no real stderr (embedded, captured): nothing to hide
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


def _import_all(modules: dict) -> None:
    import importlib

    for name in ("tensorflow", "keras", "tf2onnx"):
        try:
            modules[name] = importlib.import_module(name)
        except ImportError as e:
            if getattr(e, "name", None) and e.name.split(".")[0] == name:
                raise MissingDependencyError(name, EXTRA, "converting a Keras/TensorFlow policy") from e
            raise IncompatibleFrameworkError(
                f"{name} is installed but cannot be imported ({type(e).__name__}: {e}); "
                f"install a working pair with: pip install 'policyport[{EXTRA}]'"
            ) from e
        except Exception as e:  # a broken pair fails inside the import (protobuf, numpy ABI ...)
            raise IncompatibleFrameworkError(
                f"importing {name} failed ({type(e).__name__}: {e}); the installed tensorflow/tf2onnx/protobuf "
                f"versions do not work together; install a working set with: pip install 'policyport[{EXTRA}]'"
            ) from e


# ---------------------------------------------------------------------------------------- loading


def load_keras_file(path: Path, trust: bool = False):
    """A Keras model from a ``.keras`` or ``.h5`` file, loaded in Keras' safe mode unless ``trust``.

    Raises:
        UntrustedFileError: the file holds what Keras' safe mode refuses (a ``Lambda`` layer's
            bytecode, a ``TFSMLayer``) and ``trust`` is false.
        UnreadableFileError: missing, damaged (a zip or HDF5 structure Keras cannot read, a
            configuration nested too deeply to parse), or not a Keras model file.
        BadModelError: the file names a custom class Keras cannot find.
        LimitExceededError: its config declares more than the limits allow
            (:func:`~policyport.converter.keras_sizes.check_keras_config`).
    """
    fw = _frameworks()
    if not path.exists():
        raise UnreadableFileError(f"{path}: no such file")
    _check_keras_file(path)
    config = check_keras_config(path)
    if not trust and config is not None:
        _refuse_code_layers(config, path)
    try:
        return fw.keras.saving.load_model(str(path), compile=False, safe_mode=not trust)
    except ValueError as e:
        if "safe_mode" in str(e):
            raise UntrustedFileError(_safe_mode_refusal(path, e)) from e
        raise UnreadableFileError(f"{path} is not a readable Keras model: {_first_line(e)}") from e
    except TypeError as e:
        raise BadModelError(f"{path} names a class Keras cannot rebuild: {_first_line(e)}") from e
    except MemoryError:
        raise
    except RecursionError:  # Keras parses the configuration's JSON recursively
        raise UnreadableFileError(f"{path} is not a readable Keras model: its configuration nests arrays and objects "
                                  "deeper than Python parses") from None
    except Exception as e:  # a damaged file: BadZipFile, h5py's RuntimeError, KeyError, IndexError ...
        raise UnreadableFileError(f"{path} is not a readable Keras model: {type(e).__name__}: {_first_line(e)}") from e


#: Layer classes whose loading runs what the file holds, and what each runs: Keras' safe mode refuses
#: them (``keras/src/saving/serialization_lib.py``), and policyport refuses them from the config first.
CODE_LAYERS = {
    "TFSMLayer": "a TFSMLayer{name}, which loads an external SavedModel and runs its graph when the model is loaded",
    "Lambda": "a Lambda layer{name}, whose function Keras deserializes as Python code (bytecode) that runs when the "
              "model is loaded",
}


def _safe_mode_refusal(path: Path, error: ValueError) -> str:
    """What Keras' safe mode refused in ``path``, told from its message ("Requested the
    deserialization of a `TFSMLayer`" ...): a TFSMLayer, a Lambda layer's bytecode, or other Python
    code of the config."""
    text = str(error)  # Keras 3.14 quotes the class (`Lambda`); 3.15 does not
    if re.search(r"\bTFSMLayer\b", text):
        what = CODE_LAYERS["TFSMLayer"].format(name="")
    elif re.search(r"\bLambda\b", text):
        what = "a Lambda layer as Python bytecode, which runs when the model is loaded"
    else:
        what = f"Python code that runs when the model is loaded ({_first_line(error)})"
    return (f"{path} stores {what}; policyport loads Keras files in Keras' safe mode and refused it (nothing from the "
            "file ran). If you trust this file, pass --trust (trust=True)")


def _refuse_code_layers(config: dict, path: Path) -> None:
    """Refuse a model config naming a layer of :data:`CODE_LAYERS` anywhere in it (nested models
    and wrapped layers too), before Keras reads the file.

    Raises:
        UntrustedFileError: naming the layer's class and name.
    """
    stack = [config]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            kind = value.get("class_name")
            if isinstance(kind, str) and kind in CODE_LAYERS:
                layer = value.get("config") if isinstance(value.get("config"), dict) else {}
                name = f" {bounded_repr(layer['name'])}" if isinstance(layer.get("name"), str) else ""
                raise UntrustedFileError(
                    f"{path} stores {CODE_LAYERS[kind].format(name=name)}; policyport refused it from the model's "
                    "config before Keras read the file (nothing from the file ran). If you trust this file, pass "
                    "--trust (trust=True)")
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


#: The 8 bytes an HDF5 file starts with (at offset 0, or 512, 1024, 2048 ... after a user block);
#: HDF5 File Format Specification, "Format Signature".
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _file_format(path: Path) -> str:
    """``"empty"``, ``"zip"`` (starts with a zip header), ``"hdf5"`` (the HDF5 signature) or ``"other"``."""
    with path.open("rb") as f:
        head = f.read(8)
        if not head:
            return "empty"
        if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
            return "zip"
        offset = 0
        while head:
            if head == _HDF5_SIGNATURE:
                return "hdf5"
            offset = 512 if offset == 0 else offset * 2
            f.seek(offset)
            head = f.read(8)
    return "other"


def _check_keras_file(path: Path) -> None:
    """Refuse a file Keras could not load, saying what the file is, before Keras reads it.

    A ``.keras`` file is a zip archive holding ``config.json`` (Keras 3 ``saving_lib``); an ``.h5``
    / ``.hdf5`` file is HDF5. Keras itself reports a damaged ``.keras`` file as "File not found".

    Raises:
        UnreadableFileError: a folder, an empty file, a file whose contents are not its name's format
            (naming the format they are), a damaged zip archive, or a name Keras does not load.
    """
    from ..kinds import wrong_shape_of_source

    if wrong := wrong_shape_of_source(path, "keras"):
        raise UnreadableFileError(wrong)
    found = _file_format(path)
    suffix = path.suffix.lower()
    if found == "empty":
        raise UnreadableFileError(f"{path} is empty")
    if suffix == ".keras":
        if found == "hdf5":
            raise UnreadableFileError(f"{path} is an HDF5 file; rename it .h5")
        if found != "zip":
            raise UnreadableFileError(f"{path} is not a .keras archive (not a zip file)")
        try:
            with zipfile.ZipFile(path) as zf:
                names = set(zf.namelist())
        except ZIP_ERRORS as e:
            raise UnreadableFileError(f"{path} is not a readable .keras archive (a damaged or truncated zip file: {e})") from e
        if "config.json" not in names:
            raise UnreadableFileError(f"{path} is a zip archive but not a .keras archive (it lacks config.json)")
    elif suffix in (".h5", ".hdf5"):
        if found == "zip":
            raise UnreadableFileError(f"{path} is a zip archive, as a .keras file is; rename it .keras")
        if found != "hdf5":
            raise UnreadableFileError(f"{path} is not an HDF5 file (it lacks the HDF5 signature)")
    else:
        named = {"zip": ".keras", "hdf5": ".h5"}.get(found)
        hint = f"; this one is {'a zip archive' if found == 'zip' else 'an HDF5 file'}: rename it {named}" if named else ""
        raise UnreadableFileError(f"{path}: Keras loads .keras and .h5 (.hdf5) files by their name{hint}")


#: Characters TensorFlow's file layer reads as a glob pattern in a path (``tf.io.gfile.glob``).
_GLOB_CHARACTERS = frozenset("*?[")


@contextlib.contextmanager
def _globless(path: Path):
    """``path``, or while the block runs a path to the same folder that holds no glob character.

    TensorFlow finds a SavedModel's ``variables/variables.*`` through ``tf.io.gfile.glob``, so a
    folder whose path holds ``[``, ``*`` or ``?`` (``runs/seed[1]/sm``) either matches nothing or
    matches other folders. Such a folder is reached through a symbolic link (a copy where links are
    not allowed) in a fresh temporary folder, removed when the block ends; TensorFlow reads the
    variables while loading, so nothing reads the link after that.
    """
    if not _GLOB_CHARACTERS & set(str(path)):
        yield path
        return
    scratch = Path(tempfile.mkdtemp(prefix="policyport-"))
    plain = scratch / "source"
    try:
        try:
            plain.symlink_to(path.resolve(), target_is_directory=path.is_dir())
        except OSError:
            shutil.copytree(path, plain) if path.is_dir() else shutil.copy2(path, plain)
        yield plain
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# ------------------------------------------------------------------------------------ the trace


@dataclass
class _Trace:
    """What one conversion knows about the source before tf2onnx runs.

    Attributes:
        function: ``tf.function`` taking the inputs positionally and returning ``{name: tensor}``:
            every named layer tensor and every model output.
        input_specs: ``tf.TensorSpec`` per graph input (batch axis ``None``), named as the graph.
        outputs: the model's output names, in the model's order.
        layer_tensors: layer tensor name -> layer name, in call order.
        weights: (source name, layer name or ``None``, array) for every parameter, in source order.
        norms: layer name -> (kind ``"bn"``/``"ln"``/``"norm"`` (a preprocessing ``Normalization``),
            the Keras layer).
        shapes: layer tensor name -> its traced shape (batch axis ``None``).
        captures: TensorFlow tensor name of a placeholder the function reads -> (the constant value
            it stands for, ``<layer>/<attribute>`` of the leaf layer holding that constant or
            ``None``): the tensors a layer holds outside its variables (a ``Normalization`` layer's
            ``mean`` and ``variance``), which tf2onnx turns into graph inputs.
        weight_names: ``id`` of a Keras variable -> its source name in ``weights``.
        unread: source names of the weights the function never reads (a ``Normalization`` layer's
            ``count``).
        trainable: source names of the weights Keras trains (``model.trainable_weights``; a
            SavedModel's variables whose ``trainable`` is set), or None where the source does not say.
    """

    function: Any
    input_specs: list
    outputs: list[str]
    layer_tensors: dict[str, str] = field(default_factory=dict)
    weights: list[tuple[str, str | None, np.ndarray]] = field(default_factory=list)
    norms: dict[str, tuple[str, Any]] = field(default_factory=dict)
    shapes: dict[str, tuple] = field(default_factory=dict)
    captures: dict[str, tuple[np.ndarray, str | None]] = field(default_factory=dict)
    weight_names: dict[int, str] = field(default_factory=dict)
    unread: set[str] = field(default_factory=set)
    trainable: set[str] | None = None


def _leaf_layers(model) -> list:
    """The layers that compute something themselves (no sub-layers), in tracking order: a bare layer
    given as the model is its own one leaf."""
    leaves = []
    for layer in model._flatten_layers(include_self=True, recursive=True):
        if type(layer).__name__ == "InputLayer":
            continue
        if not list(layer._flatten_layers(include_self=False, recursive=False)):
            leaves.append(layer)
    return leaves


@contextlib.contextmanager
def _observing(layers: list, calls: list):
    """Append ``(layer, output)`` to ``calls`` whenever one of ``layers`` computes (its ``call``)."""
    patched = []
    try:
        for layer in layers:
            original = layer.call

            def call(*args, _original=original, _layer=layer, **kwargs):
                out = _original(*args, **kwargs)
                calls.append((_layer, out))
                return out

            object.__setattr__(layer, "call", call)  # past Keras' attribute tracking
            patched.append(layer)
        yield calls
    finally:
        for layer in patched:
            object.__delattr__(layer, "call")


def _flat(name: str, value) -> list[tuple[str, Any]]:
    """``[(name, tensor)]`` for a tensor, ``name/<i>`` or ``name/<key>`` for a list/tuple/dict."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _flat(f"{name}/{k}", v)]
    if isinstance(value, (list, tuple)):
        if len(value) == 1:
            return _flat(name, value[0])
        return [p for i, v in enumerate(value) for p in _flat(f"{name}/{i}", v)]
    return [(name, value)]


def _output_names(model, out, recorded: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The model's outputs as (Keras output name, tensor), in the model's order.

    A dict output keeps its keys; otherwise ``model.output_names`` when Keras has them, else the
    name of the layer tensor the output is (a ``Sequential`` model's last layer), else ``output_<i>``.
    """
    if isinstance(out, dict):
        return [p for k, v in out.items() for p in _flat(str(k), v)]
    try:
        names = list(model.output_names)
    except (AttributeError, ValueError):
        names = []
    values = list(out) if isinstance(out, (list, tuple)) else [out]
    if len(names) != len(values) or len(set(names)) != len(names):
        names = []
        for i, v in enumerate(values):
            layer_name = next((n for n, t in reversed(recorded) if _same_tensor(t, v)), None)
            names.append(layer_name if layer_name and layer_name not in names else f"output_{i}")
    return [p for n, v in zip(names, values) for p in _flat(n, v)]


def _keras_input_specs(fw: _Frameworks, model) -> list:
    """``tf.TensorSpec`` per model input with the batch axis ``None``.

    Raises:
        BadModelError: a model that was never built (no input shape known).
    """
    tf = fw.tf
    try:
        inputs = list(model.inputs)
    except (AttributeError, ValueError, TypeError):  # not built, or no symbolic inputs (None)
        inputs = None
    if inputs:
        names = ["obs"] if len(inputs) == 1 else [str(getattr(t, "name", f"input_{i}")) for i, t in enumerate(inputs)]
        return [tf.TensorSpec((None, *tuple(t.shape)[1:]), tf.as_dtype(t.dtype), name=n) for t, n in zip(inputs, names)]
    shapes = getattr(model, "_build_shapes_dict", None) or {}
    if len(shapes) == 1:
        shape = next(iter(shapes.values()))
        if shape is not None and not isinstance(shape[0], (list, tuple)):
            dtype = tf.as_dtype(getattr(model, "compute_dtype", "float32") or "float32")
            return [tf.TensorSpec((None, *tuple(shape)[1:]), dtype, name="obs")]
    raise BadModelError(
        f"cannot tell the input shape of the {type(model).__name__} model {model.name!r}: it was never built; "
        "call it once on an observation batch (or save it after that) before converting"
    )


def _trace_keras(fw: _Frameworks, model) -> _Trace:
    """The observed ``tf.function`` of a Keras model (see the module docstring)."""
    tf = fw.tf
    specs = _keras_input_specs(fw, model)
    leaves = _leaf_layers(model)
    names: dict[int, str] = {}  # id(layer) -> unique name
    taken: set[str] = set()
    for layer in leaves:
        name = layer.name
        i = 1
        while name in taken:
            name, i = f"{layer.name}_{i}", i + 1
        names[id(layer)] = name
        taken.add(name)
    layer_tensors: dict[str, str] = {}
    shapes: dict[str, tuple] = {}
    outputs: list[str] = []

    def call(*args):
        calls: list = []
        with _observing(leaves, calls):
            out = model(args[0] if len(args) == 1 else list(args), training=False)
        recorded: list[tuple[str, str, Any]] = []  # (tensor name, layer name, tensor)
        used: dict[str, int] = {}
        for layer, value in calls:
            base = names[id(layer)]
            n = used.get(base, 0)
            used[base] = n + 1
            stem = base if n == 0 else f"{base}_call{n}"
            recorded.extend((tensor_name, base, tensor) for tensor_name, tensor in _flat(stem, value))
        model_outputs = _output_names(model, out, [(n, t) for n, _, t in recorded])
        by_output = dict(model_outputs)
        result: dict[str, Any] = {}
        for tensor_name, base, tensor in recorded:
            if tensor_name in by_output and not _same_tensor(tensor, by_output[tensor_name]):
                tensor_name = f"{tensor_name}/output"
            result[tensor_name] = tensor
            layer_tensors.setdefault(tensor_name, base)
            shapes[tensor_name] = tuple(getattr(tensor, "shape", ()))
        for name, tensor in model_outputs:
            result[name] = tensor
        outputs[:] = [n for n, _ in model_outputs]
        return result

    function = tf.function(call, input_signature=specs, autograph=False)
    try:
        concrete = function.get_concrete_function()
    except Exception as e:  # whatever the model's own code raises while it is traced
        raise BadModelError(f"calling the Keras model {model.name!r} on {[tuple(s.shape) for s in specs]} failed: "
                            f"{_layer_error(e)}") from e
    by_name = {names[id(l)]: l for l in leaves}
    owner = {}
    for layer_name, layer in by_name.items():
        for w in layer.weights:
            owner.setdefault(id(w), layer_name)
    read = {id(v) for v in concrete.variables}
    weights: list[tuple[str, str | None, np.ndarray]] = []
    weight_names: dict[int, str] = {}
    unread: set[str] = set()
    seen_names: set[str] = set()
    trained = {id(w) for w in model.trainable_weights}
    trainable: set[str] = set()
    for w in model.weights:  # Keras' own order
        if id(w) in weight_names or id(w) not in owner:
            continue
        layer_name = owner[id(w)]
        source_name = f"{layer_name}/{w.name}"
        if source_name in seen_names:
            source_name = str(getattr(w, "path", source_name))
        seen_names.add(source_name)
        weight_names[id(w)] = source_name
        if id(w) in trained:
            trainable.add(source_name)
        if id(getattr(w, "value", w)) not in read:
            unread.add(source_name)
        weights.append((source_name, layer_name, np.asarray(w.numpy())))
    norms = {}
    for layer_name, layer in by_name.items():
        kind = {"BatchNormalization": "bn", "LayerNormalization": "ln", "Normalization": "norm"}.get(type(layer).__name__)
        if kind:
            norms[layer_name] = (kind, layer)
    holders = {id(value): f"{layer_name}/{attribute}" for layer_name, layer in by_name.items()
               for attribute, value in vars(layer).items() if isinstance(value, tf.Tensor)}
    return _Trace(function, specs, list(outputs), layer_tensors, weights, norms, shapes,
                  _captured_constants(fw, concrete, holders), weight_names, unread, trainable)


def _captured_constants(fw: _Frameworks, concrete, holders: Mapping[int, str]) -> dict[str, tuple[np.ndarray, str | None]]:
    """The constants a traced function reads from outside itself, by the name of the placeholder
    standing for each inside it.

    TensorFlow passes an eager tensor a function uses (a Keras ``Normalization`` layer computes its
    ``mean`` and ``variance`` tensors once, outside any call) as a captured input, and tf2onnx's
    ``from_function`` makes every input of the concrete function that is no resource handle a graph
    input; variables are resource handles, which tf2onnx freezes into initializers.

    Args:
        concrete: the ``ConcreteFunction``.
        holders: ``id`` of a tensor -> ``<layer>/<attribute>`` of the layer attribute holding it.

    Returns:
        placeholder tensor name (``functional_1/obs_norm_1/Sub/y:0``) -> (value, holder name or ``None``).
    """
    captured = {}
    for external, internal in concrete.graph.captures:
        if external.dtype == fw.tf.resource or not hasattr(external, "numpy"):
            continue
        captured[internal.name] = (np.asarray(external.numpy()), holders.get(id(external)))
    return captured


def _layer_error(e: BaseException) -> str:
    """The first line of an error a layer raised while it was called, with the layer's own reason: Keras
    re-raises it as ``Exception encountered when calling <Layer>.call().`` and puts the reason on a
    later line, the layer's own exception being the context of the one it raises."""
    inner = e.__context__ if getattr(e, "_keras_call_info_injected", False) else None
    if inner is None:
        return _first_line(e)
    return f"{_first_line(e).removesuffix('.')}: {_first_line(inner)}"


def _same_tensor(a, b) -> bool:
    """Whether two traced tensors are one (graph tensors are named uniquely)."""
    return a is b or (getattr(a, "name", None) is not None and getattr(a, "name", None) == getattr(b, "name", None))


def _trace_function(fw: _Frameworks, fn, variables=None, input_names: list[str] | None = None) -> _Trace:
    """The trace of a ``tf.function`` with an input signature (no Keras layers to name)."""
    tf = fw.tf
    signature = getattr(fn, "input_signature", None)
    if not signature:
        raise BadModelError("a tf.function needs an input_signature (tf.TensorSpec per input, batch axis None) to be converted")
    flat = tf.nest.flatten(signature)
    names = input_names or (["obs"] if len(flat) == 1 else [s.name or f"input_{i}" for i, s in enumerate(flat)])
    specs = [tf.TensorSpec(s.shape, s.dtype, name=n) for s, n in zip(flat, names)]
    outputs: list[str] = []

    def call(*args):
        out = fn(*tf.nest.pack_sequence_as(signature, list(args)))
        named = _flat("output", out) if not isinstance(out, dict) else [p for k, v in out.items() for p in _flat(str(k), v)]
        outputs[:] = [n for n, _ in named]
        return dict(named)

    function = tf.function(call, input_signature=specs, autograph=False)
    concrete = function.get_concrete_function()
    weights = []
    seen: set[str] = set()
    for v in variables if variables is not None else concrete.graph.variables:
        name = str(getattr(v, "path", None) or v.name).removesuffix(":0")
        if name in seen:
            continue
        seen.add(name)
        weights.append((name, None, np.asarray(v.numpy())))
    return _Trace(function, specs, list(outputs), {}, weights, {}, captures=_captured_constants(fw, concrete, {}))


# ------------------------------------------------------------------------------------- tf2onnx


def _erfc(ctx, node, name, args):
    """tf2onnx handler for TF ``Erfc`` (Keras' exact gelu): ``1 - Erf(x)``, since ONNX has no Erfc."""
    from tf2onnx import utils

    dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
    erf = ctx.make_node("Erf", [node.input[0]])
    one = ctx.make_const(utils.make_name(f"{node.name}/one"), np.array(1, dtype=dtype))
    node.type = "Sub"
    ctx.replace_inputs(node, [one.output[0], erf.output[0]])
    return node


def _run_tf2onnx(fw: _Frameworks, trace: _Trace, opset: int):
    """tf2onnx's ONNX model of the traced function.

    Raises:
        OptionError: an opset tf2onnx cannot write.
        BadModelError: a graph tf2onnx cannot convert.
        UnsupportedOpError: TensorFlow ops tf2onnx has no ONNX form for (named).
        IncompatibleFrameworkError: tf2onnx fails inside itself in a way that points at the
            tensorflow/tf2onnx pair rather than at the model.
    """
    _check_opset(fw, opset)
    try:
        proto, _ = fw.tf2onnx.convert.from_function(
            trace.function, input_signature=trace.input_specs, opset=opset,
            custom_op_handlers={"Erfc": (_erfc, [])},
        )
    except (AttributeError, ImportError, KeyError, TypeError, NotImplementedError) as e:
        raise IncompatibleFrameworkError(
            f"tf2onnx failed inside itself ({type(e).__name__}: {_first_line(e)}): {fw.versions} do not work "
            f"together; install the pair policyport is tested with: pip install 'policyport[{EXTRA}]' "
            "(tensorflow-cpu 2.21, tf2onnx 1.17)"
        ) from e
    except Exception as e:  # tf2onnx raises plain ValueError/RuntimeError for graphs it cannot convert
        raise BadModelError(f"tf2onnx ({fw.versions}) could not convert the model: {type(e).__name__}: {_first_line(e)}") from e
    import onnx

    unknown = [n for n in proto.graph.node if not onnx.defs.has(n.op_type, n.domain or "")]
    if unknown:
        listed = ", ".join(f"{n.op_type} ({n.name})" for n in unknown)
        raise UnsupportedOpError(
            f"tf2onnx {fw.tf2onnx.__version__} has no ONNX form for the TensorFlow op(s) {listed}; "
            "rewrite those layers with standard ops, or try another --opset"
        )
    return proto


# ----------------------------------------------------------------------------------- graph passes


class _Graph:
    """A mutable view of an ONNX graph for the naming passes (nodes in a list, tensors renamed
    everywhere at once)."""

    def __init__(self, proto):
        self.proto = proto
        self.g = proto.graph
        self.init = {t.name: t for t in self.g.initializer}
        self.inputs = [v.name for v in self.g.input if v.name not in self.init]

    def producers(self) -> dict[str, Any]:
        return {o: n for n in self.g.node for o in n.output}

    def consumers(self) -> dict[str, list]:
        users: dict[str, list] = {}
        for n in self.g.node:
            for i in n.input:
                users.setdefault(i, []).append(n)
        return users

    def used_names(self) -> set[str]:
        names = set(self.init) | set(self.inputs)
        for n in self.g.node:
            names.update(n.output)
        return names

    def rename(self, old: str, new: str) -> None:
        if old == new:
            return
        for n in self.g.node:
            for seq in (n.input, n.output):
                for i, x in enumerate(seq):
                    if x == old:
                        seq[i] = new
        for v in self.g.value_info:
            if v.name == old:
                v.name = new
        if old in self.init:
            t = self.init.pop(old)
            t.name = new
            self.init[new] = t

    def remove_nodes(self, nodes: list) -> None:
        """Remove ``nodes`` (told by their outputs: protobuf copies node messages on every rewrite)."""
        drop = {tuple(n.output) for n in nodes}
        kept = [n for n in self.g.node if tuple(n.output) not in drop]
        del self.g.node[:]
        self.g.node.extend(kept)

    def drop_unused_initializers(self) -> None:
        read = {i for n in self.g.node for i in n.input}
        kept = [t for t in self.g.initializer if t.name in read]
        del self.g.initializer[:]
        self.g.initializer.extend(kept)
        self.init = {t.name: t for t in self.g.initializer}

    def add_initializer(self, array: np.ndarray, name: str) -> str:
        from onnx import numpy_helper

        self.g.initializer.append(numpy_helper.from_array(np.asarray(array), name))
        self.init[name] = self.g.initializer[-1]
        return name

    def topological_sort(self) -> None:
        """Order nodes so every input is produced before it is read, keeping the order otherwise."""
        available = set(self.init) | set(self.inputs) | {""}
        pending = list(self.g.node)
        ordered = []
        while pending:
            progressed = False
            rest = []
            for n in pending:
                if all(i in available for i in n.input):
                    ordered.append(n)
                    available.update(n.output)
                    progressed = True
                else:
                    rest.append(n)
            if not progressed:
                raise BadModelError(f"the converted graph has a cycle or a dangling input at node {rest[0].name!r}")
            pending = rest
        del self.g.node[:]
        self.g.node.extend(ordered)


def _root(graph: _Graph, tensor: str, producers: dict) -> str:
    """``tensor`` with chains of ``Identity`` nodes followed back to the tensor they copy."""
    seen = set()
    while tensor in producers and producers[tensor].op_type == "Identity" and tensor not in seen:
        seen.add(tensor)
        tensor = producers[tensor].input[0]
    return tensor


def _settle_names(graph: _Graph, order: list[str]) -> None:
    """Give every named tensor (``order``: layer tensors in call order, then model outputs) its own
    tensor: the first name of a group that is one value owns the producing node, each later name is
    an ``Identity`` of it."""
    from onnx import helper

    producers = graph.producers()
    groups: dict[str, list[str]] = {}
    for name in order:
        if name in producers or name in graph.inputs:
            groups.setdefault(_root(graph, name, producers), []).append(name)
    for root, names in groups.items():
        producers = graph.producers()
        identities = [producers[n] for n in names if n in producers and producers[n].op_type == "Identity"]
        graph.remove_nodes(identities)
        if root in graph.inputs or root in graph.init:
            source, rest = root, names
        else:
            graph.rename(root, names[0])
            source, rest = names[0], names[1:]
        nodes = list(graph.g.node)
        at = next((i + 1 for i, node in enumerate(nodes) if source in node.output), 0)
        nodes[at:at] = [helper.make_node("Identity", [source], [n], name=n) for n in rest if n != source]
        del graph.g.node[:]
        graph.g.node.extend(nodes)
    graph.topological_sort()


def _span(graph: _Graph, tensors: list[str], stops: set[str], producers: dict) -> list:
    """The nodes computing ``tensors`` back to (not including) tensors in ``stops``, graph inputs
    and initializers: one layer's own nodes."""
    nodes, seen, todo = [], set(), list(tensors)
    while todo:
        t = todo.pop()
        n = producers.get(t)
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        nodes.append(n)
        for i in n.input:
            if i and i not in stops and i not in graph.init:
                todo.append(i)
    return nodes


def _external_inputs(graph: _Graph, nodes: list) -> list[str]:
    produced = {o for n in nodes for o in n.output}
    return list(dict.fromkeys(i for n in nodes for i in n.input if i and i not in produced and i not in graph.init))


def _rebuild_norm(graph: _Graph, layer_name: str, kind: str, layer, shape: tuple, span: list, opset: int,
                  parameters: dict, claimed: set[str]) -> bool:
    """Replace tf2onnx's folded normalization by ONNX nodes reading the Keras parameters.

    Returns:
        Whether it was rebuilt (only for a single ``(batch, features)`` input normalized over the
        feature axis; else tf2onnx's form stays).
    """
    from onnx import helper

    inputs = _external_inputs(graph, span)
    axis = layer.axis if isinstance(layer.axis, int) else (list(layer.axis) if len(layer.axis) == 1 else None)
    axis = axis[0] if isinstance(axis, list) else axis
    if len(inputs) != 1 or len(shape) != 2 or axis not in (-1, 1) or getattr(layer, "rms_scaling", False):
        return False
    x = inputs[0]
    dtype = np.dtype(layer.compute_dtype or "float32")
    values = {w.name: np.asarray(w.numpy()) for w in layer.weights}
    width = int(shape[-1])

    def param(weight: str, default: float) -> str:
        if weight in values:
            name = f"{layer_name}/{weight}"
            graph.add_initializer(values[weight], name)
            parameters[name] = name
            claimed.add(name)
            return name
        return graph.add_initializer(np.full((width,), default, dtype=dtype), f"{layer_name}/{weight}_default")

    graph.remove_nodes(span)
    eps = float(layer.epsilon)
    if kind == "bn":
        ins = [x, param("gamma", 1.0), param("beta", 0.0), param("moving_mean", 0.0), param("moving_variance", 1.0)]
        graph.g.node.append(helper.make_node("BatchNormalization", ins, [layer_name], name=layer_name, epsilon=eps))
    elif opset >= 17:
        ins = [x, param("gamma", 1.0), param("beta", 0.0)]
        graph.g.node.append(helper.make_node("LayerNormalization", ins, [layer_name], name=layer_name, axis=-1, epsilon=eps))
    else:  # LayerNormalization arrived in opset 17: (x - mean) / sqrt(var + eps) * gamma + beta
        gamma, beta = param("gamma", 1.0), param("beta", 0.0)
        e = graph.add_initializer(np.array(eps, dtype=dtype), f"{layer_name}/epsilon")
        p = f"{layer_name}/"
        nodes = [
            helper.make_node("ReduceMean", [x], [p + "mean"], name=p + "mean", axes=[-1], keepdims=1),
            helper.make_node("Sub", [x, p + "mean"], [p + "centered"], name=p + "centered"),
            helper.make_node("Mul", [p + "centered", p + "centered"], [p + "squared"], name=p + "squared"),
            helper.make_node("ReduceMean", [p + "squared"], [p + "variance"], name=p + "variance", axes=[-1], keepdims=1),
            helper.make_node("Add", [p + "variance", e], [p + "variance_eps"], name=p + "variance_eps"),
            helper.make_node("Sqrt", [p + "variance_eps"], [p + "std"], name=p + "std"),
            helper.make_node("Div", [p + "centered", p + "std"], [p + "normalized"], name=p + "normalized"),
            helper.make_node("Mul", [p + "normalized", gamma], [p + "scaled"], name=p + "scaled"),
            helper.make_node("Add", [p + "scaled", beta], [layer_name], name=layer_name),
        ]
        graph.g.node.extend(nodes)
    return True


def _captures_as_initializers(proto, trace: _Trace) -> dict[str, str]:
    """Turn the graph inputs tf2onnx made of captured constants (:func:`_captured_constants`) into
    initializers holding their values, and drop those no node reads; the graph keeps only the
    model's own inputs.

    Returns:
        initializer name -> ``<layer>/<attribute>`` of the layer holding the constant, for those
        a layer holds.
    """
    from onnx import numpy_helper

    read = {i for n in proto.graph.node for i in n.input}
    holders: dict[str, str] = {}
    kept = []
    for info in proto.graph.input:
        if info.name not in trace.captures:
            kept.append(info)
            continue
        value, holder = trace.captures[info.name]
        if info.name in read:
            proto.graph.initializer.append(numpy_helper.from_array(value, info.name))
            if holder is not None:
                holders[info.name] = holder
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    return holders


def _name_held_constants(graph: _Graph, holders: Mapping[str, str], weight_names: set[str], parameters: dict,
                         claimed: set[str]) -> None:
    """Name each captured constant still read after the rebuilds after the layer attribute holding
    it (``<layer>/<attribute>``), and record it as a parameter; one whose name a weight or another
    initializer has keeps its TensorFlow name (made readable later)."""
    read = {i for n in graph.g.node for i in n.input}
    for initializer, holder in holders.items():
        if initializer in read and holder not in weight_names and holder not in graph.init and holder not in claimed:
            graph.rename(initializer, holder)
            parameters[holder] = holder
            claimed.add(holder)


def _rebuild_normalization(graph: _Graph, layer_name: str, layer, calls: list[tuple[str, list]],
                           weight_names: Mapping[int, str], parameters: dict, claimed: set[str]) -> bool:
    """Replace tf2onnx's form of a Keras preprocessing ``Normalization`` layer by ONNX nodes reading
    its statistics under the layer's names, computed as Keras computes them.

    ``keras/src/layers/preprocessing/normalization.py`` (Keras 3): an adapted layer (or one loaded
    from a file) keeps ``mean`` and ``variance`` as non-trainable variables of the kept axes' shape
    and reshapes them to a broadcast shape and casts them to the compute dtype in
    ``finalize_state``; a layer given ``mean=`` and ``variance=`` holds those, broadcast and cast,
    as constant tensors ``mean`` and ``variance`` and has no variables. ``call`` computes
    ``(x - mean) / maximum(sqrt(variance), epsilon)``, or ``mean + x * maximum(sqrt(variance),
    epsilon)`` with ``invert=True``, with ``epsilon`` Keras' ``keras.config.epsilon()`` (1e-07 by
    default). tf2onnx would leave the statistics as graph inputs and fold ``1 / maximum(...)`` into
    one anonymous constant (a multiplication where Keras divides).

    The initializers are the variables (``obs_norm/mean``, ``obs_norm/variance``, as
    ``layer.get_weights()`` gives them), or the held constants under the same names, followed by a
    ``Reshape`` to the broadcast shape where broadcasting the variable would differ, and a ``Cast``
    where the compute dtype differs from the variable's. A layer called several times reads them once.

    Args:
        calls: per call of the layer, its output tensor (``obs_norm``, ``obs_norm_call1``) and the
            nodes tf2onnx computes it with.

    Returns:
        Whether it was rebuilt: only where every call reads one input of the compute dtype (one input
        to its nodes outside initializers, no ``Cast`` among them) and no node serves two calls.
    """
    import keras
    from onnx import helper

    inputs = [_external_inputs(graph, span) for _, span in calls]
    nodes_of_calls = [id(n) for _, span in calls for n in span]
    if getattr(layer, "mean", None) is None or any(len(i) != 1 for i in inputs) \
            or len(set(nodes_of_calls)) != len(nodes_of_calls) or any(n.op_type == "Cast" for _, sp in calls for n in sp):
        return False
    dtype = np.dtype(layer.compute_dtype)
    shape = [int(d) for d in layer._broadcast_shape]
    p = f"{layer_name}/"
    adapted = layer.input_mean is None
    statistics = {}
    for which in ("mean", "variance"):
        variable = getattr(layer, f"adapt_{which}", None) if adapted else None
        if variable is not None:
            name, value = weight_names.get(id(variable), p + which), np.asarray(variable.numpy())
        else:
            name, value = p + which, np.asarray(getattr(layer, which))
        if name in graph.init or name in claimed:
            return False
        statistics[which] = (name, value)
    graph.remove_nodes([n for _, span in calls for n in span])
    nodes = []
    tensors = {}
    for which, (name, value) in statistics.items():
        graph.add_initializer(value, name)
        parameters[name] = name
        claimed.add(name)
        tensor = name
        if value.dtype != dtype:
            nodes.append(helper.make_node("Cast", [tensor], [p + f"{which}_cast"], name=p + f"{which}_cast",
                                          to=helper.np_dtype_to_tensor_dtype(dtype)))
            tensor = p + f"{which}_cast"
        lead = len(shape) - value.ndim
        if lead < 0 or list(value.shape) != shape[lead:] or any(d != 1 for d in shape[:lead]):
            target = graph.add_initializer(np.array(shape, np.int64), p + f"{which}_shape")
            nodes.append(helper.make_node("Reshape", [tensor, target], [p + f"{which}_reshaped"],
                                          name=p + f"{which}_reshaped"))
            tensor = p + f"{which}_reshaped"
        tensors[which] = tensor
    eps = graph.add_initializer(np.array(keras.config.epsilon(), dtype=dtype), p + "epsilon")
    mean, std = tensors["mean"], p + "std_floor"
    nodes += [helper.make_node("Sqrt", [tensors["variance"]], [p + "std"], name=p + "std"),
              helper.make_node("Max", [p + "std", eps], [std], name=std)]
    for (out, _), (x,) in zip(calls, inputs):
        step = f"{out}/{'scaled' if layer.invert else 'centered'}"
        if layer.invert:
            nodes += [helper.make_node("Mul", [x, std], [step], name=step),
                      helper.make_node("Add", [mean, step], [out], name=out)]
        else:
            nodes += [helper.make_node("Sub", [x, mean], [step], name=step),
                      helper.make_node("Div", [step, std], [out], name=out)]
    graph.g.node.extend(nodes)
    return True


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _name_parameters(graph: _Graph, trace: _Trace, spans: dict[str, list], parameters: dict,
                     claimed: set[str]) -> list[str]:
    """Rename every initializer holding a Keras weight to the weight's name; record dropped zeros.

    A weight the model never reads (:attr:`_Trace.unread`, a ``Normalization`` layer's ``count``)
    and no initializer holds is recorded with its value when it has at most
    :data:`~policyport.graph.passes.MAX_VALUE_ELEMENTS` numbers.

    Returns:
        The names of weights found nowhere in the graph that tf2onnx folded into other constants,
        and of those the model never reads that are too large to record.
    """
    from onnx import numpy_helper

    consumers = graph.consumers()
    missing, unread = [], []
    for source_name, layer_name, value in trace.weights:
        if source_name in claimed:
            continue
        span = spans.get(layer_name) if layer_name is not None else list(graph.g.node)
        span = span if span is not None else []
        inside = {id(n) for n in span}
        candidates = list(dict.fromkeys(i for n in span for i in n.input if i in graph.init and i not in claimed))
        match = next((c for c in candidates if _same_bits(numpy_helper.to_array(graph.init[c]), value)), None)
        if match is None:
            if not value.any() and np.issubdtype(value.dtype, np.number):
                parameters[source_name] = {"name": source_name, "zeros": {"shape": list(value.shape), "dtype": value.dtype.name}}
            elif source_name in trace.unread and value.size <= MAX_VALUE_ELEMENTS and value.dtype.kind in "biuf":
                parameters[source_name] = {"name": source_name, "value": {
                    "shape": list(value.shape), "dtype": value.dtype.name, "data": value.ravel().tolist()}}
            else:
                (unread if source_name in trace.unread else missing).append(source_name)
            continue
        if any(id(n) not in inside for n in consumers.get(match, [])):  # shared with another layer: copy it
            graph.add_initializer(value, source_name)
            for n in span:
                for i, x in enumerate(n.input):
                    if x == match:
                        n.input[i] = source_name
        else:
            graph.rename(match, source_name)
        parameters[source_name] = source_name
        claimed.add(source_name)
    return missing, unread


_TF_SUFFIX = re.compile(r"(__\d+)?(:\d+)?$")


def _readable_names(graph: _Graph, spans: dict[str, list], keep: set[str]) -> None:
    """Name each tensor a layer computes internally ``<layer>/<TF op>`` and each node after its
    first output; constants a layer reads ``<layer>/<TF name>``."""
    used = graph.used_names()

    def unique(name: str) -> str:
        candidate, i = name, 1
        while candidate in used:
            candidate, i = f"{name}_{i}", i + 1
        used.add(candidate)
        return candidate

    def short(tf_name: str, layer: str, fallback: str) -> str:
        parts = [_TF_SUFFIX.sub("", p) for p in tf_name.split("/")]
        scope = re.compile(re.escape(layer) + r"(_\d+)?$")
        idx = max((i for i, p in enumerate(parts) if scope.fullmatch(p)), default=None)
        tail = [p for p in parts[idx + 1:]] if idx is not None else parts[-1:]
        return "/".join(p for p in tail if p) or fallback

    for layer, span in spans.items():
        for n in span:
            for o in n.output:
                if o and o not in keep and not o.startswith(f"{layer}/"):
                    graph.rename(o, unique(f"{layer}/{short(o, layer, n.op_type)}"))
            for i in n.input:
                if i in graph.init and i not in keep and not i.startswith(f"{layer}/"):
                    graph.rename(i, unique(f"{layer}/{short(i, layer, 'constant')}"))
    if not spans:  # a bare TF graph: TF's own scopes, without the call wrappers and suffixes
        for n in list(graph.g.node):
            for o in n.output:
                if o and o not in keep:
                    parts = [_TF_SUFFIX.sub("", p) for p in o.split("/") if not p.startswith("StatefulPartitionedCall")]
                    graph.rename(o, unique("/".join(p for p in parts if p) or n.op_type))
    for n in graph.g.node:
        if n.output and n.output[0]:
            n.name = n.output[0]


def _add_head(graph: _Graph, output: str, head: str, opset: int) -> list:
    """The head's nodes on the model's single output; returns the new graph outputs' value infos.

    Raises:
        OptionError: ``diag-gaussian`` or ``diag-gaussian:halves`` (named as given) on an output of an
            odd or undeclared width, which has no mean and log_std halves.
    """
    from onnx import TensorProto, helper

    info = next(v for v in graph.g.output if v.name == output)
    t = info.type.tensor_type
    width = t.shape.dim[-1].dim_value if t.HasField("shape") and len(t.shape.dim) == 2 else 0
    if head == "categorical":
        graph.g.node.append(helper.make_node("ArgMax", [output], ["action"], name="action", axis=1, keepdims=0))
        return [helper.make_tensor_value_info("action", TensorProto.INT64, ["batch"])]
    if not width or width % 2:
        found = (f"it has {width} outputs (an odd number)" if width else
                 "its declared shape is not (batch, width) of a fixed width")
        raise OptionError(f"--head {head} splits {output!r} into mean and log_std halves, but {found}; "
                          "use --head categorical (or none)")
    half = width // 2
    axes = graph.add_initializer(np.array([1], np.int64), "head/axes")
    mid = graph.add_initializer(np.array([half], np.int64), "head/mid")
    zero = graph.add_initializer(np.array([0], np.int64), "head/zero")
    end = graph.add_initializer(np.array([width], np.int64), "head/end")
    graph.g.node.append(helper.make_node("Slice", [output, zero, mid, axes], ["action"], name="action"))
    graph.g.node.append(helper.make_node("Slice", [output, mid, end, axes], ["log_std"], name="log_std"))
    return [helper.make_tensor_value_info(n, t.elem_type, ["batch", half]) for n in ("action", "log_std")]


def _finish(fw: _Frameworks, trace: _Trace, proto, options, provenance: dict) -> tuple[Any, list[str]]:
    """Apply the naming passes to tf2onnx's model; returns the model and notes."""
    import onnx

    holders = _captures_as_initializers(proto, trace)
    graph = _Graph(proto)
    output_infos = {v.name: v for v in proto.graph.output}
    layer_names = list(trace.layer_tensors)
    _settle_names(graph, layer_names + [o for o in trace.outputs if o not in trace.layer_tensors])
    producers = graph.producers()
    named = set(layer_names) | set(trace.outputs) | set(graph.inputs)
    per_layer: dict[str, list[str]] = {}
    for tensor, layer in trace.layer_tensors.items():
        per_layer.setdefault(layer, []).append(tensor)
    spans = {layer: _span(graph, tensors, named - set(tensors), producers) for layer, tensors in per_layer.items()}

    parameters: dict[str, Any] = {}
    claimed: set[str] = set()
    notes: list[str] = []
    for layer, (kind, keras_layer) in trace.norms.items():
        if kind == "norm":
            producers = graph.producers()
            calls = [(t, _span(graph, [t], named - {t}, producers)) for t in per_layer[layer]]
            if not _rebuild_normalization(graph, layer, keras_layer, calls, trace.weight_names, parameters, claimed):
                notes.append(f"{layer}: kept tf2onnx's form of this Normalization layer (on an input it casts to its "
                             "compute dtype); its statistics are not initializers of their own")
            continue
        shape = trace.shapes[per_layer[layer][0]]
        if not _rebuild_norm(graph, layer, kind, keras_layer, shape, spans[layer], options.opset, parameters, claimed):
            notes.append(f"{layer}: kept tf2onnx's folded form of this normalization (not a (batch, features) "
                         "tensor over its feature axis); its parameters are not extractable")
    graph.topological_sort()
    producers = graph.producers()
    spans = {layer: _span(graph, tensors, named - set(tensors), producers) for layer, tensors in per_layer.items()}
    missing, unread = _name_parameters(graph, trace, spans, parameters, claimed)
    if missing:
        notes.append(f"tf2onnx folded {', '.join(missing)} into other constants; extract cannot return them")
    if unread:
        notes.append(f"the model never reads {', '.join(unread)}, each larger than {MAX_VALUE_ELEMENTS} numbers; "
                     "the graph does not hold them and extract cannot return them")
    _name_held_constants(graph, holders, {w[0] for w in trace.weights}, parameters, claimed)
    rank = {source_name: i for i, (source_name, _, _) in enumerate(trace.weights)}  # Keras' weight order, then
    ordered = dict(sorted(parameters.items(), key=lambda kv: rank.get(  # the constants layers hold
        kv[1] if isinstance(kv[1], str) else kv[1]["name"], len(rank))))
    graph.drop_unused_initializers()
    _readable_names(graph, spans, named | set(claimed))

    outputs = [type(output_infos[n])() for n in trace.outputs]
    for info, n in zip(outputs, trace.outputs):
        info.CopyFrom(output_infos[n])
    del graph.g.output[:]
    graph.g.output.extend(outputs)
    del graph.g.value_info[:]
    for v in [*graph.g.input, *graph.g.output]:
        if v.type.tensor_type.HasField("shape") and v.type.tensor_type.shape.dim:
            dim = v.type.tensor_type.shape.dim[0]
            if not dim.dim_value:
                dim.dim_param = "batch"
    head = options.head
    if head is not None:
        if len(trace.outputs) != 1:
            raise OptionError(f"a {head} head needs a model with one output; this one has {len(trace.outputs)}: {', '.join(trace.outputs)}")
        if head in GAUSSIAN_HEADS:  # refused before any node is added where nothing says the outputs split
            info = output_infos[trace.outputs[0]].type.tensor_type
            width = info.shape.dim[-1].dim_value if info.HasField("shape") and len(info.shape.dim) == 2 else 0
            if width and width % 2 == 0:
                head_assumption(head, output=trace.outputs[0], width=width, log_std=None, what="the Keras model")
        graph.g.output.extend(_add_head(graph, trace.outputs[0], head, options.opset))
    graph.g.name = "policy"
    proto.producer_name, proto.producer_version = "policyport", _version()
    del proto.metadata_props[:]
    props = {
        "policyport.parameters": json.dumps(ordered),
        "policyport.head": head_name(head),
        "policyport.source": json.dumps(provenance),
    }
    if trace.trainable is not None:  # what Keras trains; the other parameters are statistics or constants
        props[TRAINABLE_KEY] = json.dumps([n for n in (v if isinstance(v, str) else v["name"] for v in ordered.values())
                                           if n in trace.trainable])
    onnx.helper.set_model_props(proto, props)
    try:
        onnx.checker.check_model(proto, full_check=True)
    except onnx.checker.ValidationError as e:
        raise BadModelError(f"the converted model fails onnx.checker: {e}") from e
    return proto, notes


def _version() -> str:
    from ...version import __version__

    return __version__


def _reference(trace: _Trace, head: str | None, fw: _Frameworks) -> Callable[..., dict[str, np.ndarray]]:
    """TensorFlow running the traced function: every layer's output and the model's outputs; it
    takes the observation array of a single-input model, or a mapping input name -> array (every
    input of the model, as the graph names them)."""
    single = trace.outputs[0] if len(trace.outputs) == 1 else None

    def reference(obs) -> dict[str, np.ndarray]:
        feeds = obs if isinstance(obs, Mapping) else {trace.input_specs[0].name: obs}
        missing = [s.name for s in trace.input_specs if s.name not in feeds]
        if missing:
            raise BadModelError(f"the model takes inputs {', '.join(s.name for s in trace.input_specs)}; "
                                f"no observations for {', '.join(missing)}")
        result = trace.function(*(fw.tf.convert_to_tensor(np.asarray(feeds[s.name]), dtype=s.dtype)
                                  for s in trace.input_specs))
        out = {k: np.asarray(v) for k, v in result.items()}
        if head is not None and single is not None:
            y = out[single]
            if head == "categorical":
                out["action"] = np.argmax(y, axis=1).astype(np.int64)
            else:
                half = y.shape[1] // 2
                out["action"], out["log_std"] = y[:, :half], y[:, half:]
        return out

    return reference


def _check_opset(fw: _Frameworks, opset: int) -> None:
    """Refuse an opset tf2onnx cannot write (its ``constants.OPSET_TO_IR_VERSION``), before any loading.

    Raises:
        OptionError: such an opset (exit 2).
    """
    newest = max(fw.tf2onnx.constants.OPSET_TO_IR_VERSION)
    if not MIN_OPSET <= opset <= newest:
        raise OptionError(f"opset {opset} is out of range for a Keras/TF source: tf2onnx {fw.tf2onnx.__version__} writes "
                          f"opset {MIN_OPSET} to {newest}; choose --opset in that range")


def _check_options(options, what: str) -> None:
    for name, value in (("activation", options.activation), ("policy_id", options.policy_id),
                        ("obs_norm", options.obs_norm)):
        if value is not None:
            raise OptionError(f"{name} does not apply to {what}: the model records its own layers")
    if options.keep_value:
        raise OptionError(f"--keep-value does not apply to {what}: every output the model has is exported")


def _convert_trace(fw: _Frameworks, trace: _Trace, options, provenance: dict, kind: str):
    import dataclasses

    from ..options import Converted
    from ..build import NO_HEAD

    if options.head == NO_HEAD:  # the model's own outputs, as without a head
        options = dataclasses.replace(options, head=None)

    proto = _run_tf2onnx(fw, trace, options.opset)
    provenance = {**provenance, "tensorflow": fw.tf.__version__, "keras": fw.keras.__version__,
                  "tf2onnx": fw.tf2onnx.__version__}
    model, notes = _finish(fw, trace, proto, options, provenance)
    what = "the SavedModel" if kind == "savedmodel" else "the Keras model"
    assumptions = []
    if options.head is not None:
        output = trace.outputs[0]
        shape = next(v for v in model.graph.output if v.name == output).type.tensor_type.shape
        assumptions.append(head_assumption(options.head, output=output, width=shape.dim[-1].dim_value, log_std=None,
                                           what=what))
    normalizations = [layer for layer, (k, _) in trace.norms.items() if k == "norm"]
    if normalizations:
        assumptions.append(_epsilon_assumption(fw, normalizations))
    assumptions.append(outside_normaliser("a SavedModel" if kind == "savedmodel" else "a Keras model",
                                          "convert a model that applies the normaliser in its own layers (a "
                                          "Normalization layer)"))
    oracle = Oracle(f"TensorFlow {fw.tf.__version__} running {what}'s own "
                    f"{'serving signature' if kind == 'savedmodel' else 'layers'}", framework=True, checks=_KERAS_CHECKS)
    return Converted(model, _reference(trace, options.head, fw), kind, notes, assumptions, oracle)


def _epsilon_assumption(fw: _Frameworks, layers: list[str]) -> Assumption:
    """That the Keras ``epsilon`` the model was trained with is this machine's: a ``Normalization``
    layer divides by ``maximum(sqrt(variance), keras.config.epsilon())``
    (``keras/src/layers/preprocessing/normalization.py``), a global Keras reads from
    ``~/.keras/keras.json`` (default 1e-07) that a Keras file does not record; TensorFlow running the
    layers reads the same global, so verification cannot tell."""
    return Assumption(
        "epsilon", f"{fw.keras.config.epsilon():g} in {joined(layers)}",
        "Keras' epsilon (keras.config.epsilon(), from this machine's ~/.keras/keras.json or Keras' default 1e-07) "
        "floors the standard deviation a Normalization layer divides by, and a Keras file does not record it",
        "set keras.config.set_epsilon(...) (or ~/.keras/keras.json) to the training machine's value before converting")


#: What TensorFlow running the model settles from the model itself: its activations, its layers
#: (a Normalization layer included) and the order they run in; not a normaliser applied outside it.
_KERAS_CHECKS = frozenset({"activation", "layout"})


def convert_keras(source, options):
    """Convert a Keras model (live, ``.keras`` or ``.h5``) or a ``tf.function`` to ONNX.

    Args:
        source: a path to a ``.keras``/``.h5`` file, a built ``keras.Model``, or a ``tf.function``
            with an ``input_signature``.
        options: a :class:`~policyport.converter.ConvertOptions`; ``opset`` (11 to 18, tf2onnx's
            newest), ``head`` (on a single-output model; ``"none"`` or ``None``: the model's own
            outputs), ``trust`` (load ``Lambda`` bytecode).

    Returns:
        A :class:`~policyport.converter.Converted`: graph input ``obs`` (one input; else the Keras
        input names), outputs under the Keras output names, every layer's output named after the
        layer; ``reference`` runs the model in TensorFlow and returns every layer's output.

    Raises:
        MissingDependencyError: tensorflow or tf2onnx is not installed (extra ``tf``).
        OptionError: options of other sources, an opset tf2onnx cannot write, a head on a model of
            several outputs, a diag-gaussian head on an output of odd or unknown width.
        UntrustedFileError: a file with Python bytecode and ``trust`` false.
        UnreadableFileError, BadModelError, UnsupportedOpError: see :func:`load_keras_file` and tf2onnx.
    """
    fw = _frameworks()
    _check_options(options, "a Keras model")
    _check_opset(fw, options.opset)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        model = load_keras_file(path, options.trust)
        provenance = {"kind": "keras", "file": path.name, "sha256": sha256_file(path)}
    else:
        model, provenance = source, {"kind": "keras", "object": type(source).__name__}
    if isinstance(model, fw.keras.Model) or isinstance(model, fw.keras.layers.Layer):
        trace = _trace_keras(fw, model)
    elif hasattr(model, "get_concrete_function"):
        trace = _trace_function(fw, model)
    else:
        raise BadModelError(f"cannot convert a {type(model).__name__} as Keras: expected a keras.Model or a tf.function")
    return _convert_trace(fw, trace, options, provenance, "keras")


def convert_savedmodel(source, options):
    """Convert a TF SavedModel folder (its ``serving_default`` signature) to ONNX.

    Loading a SavedModel runs TensorFlow functions the folder holds (its resources' initializers
    inside ``tf.saved_model.load``, its signature when traced and checked), so it is loaded only
    with ``options.trust``; without it the folder is refused before anything of it is read but the
    presence of ``saved_model.pb``.

    Args:
        source: the folder holding ``saved_model.pb``.
        options: as for :func:`convert_keras`; ``trust`` allows loading the folder.

    Returns:
        A :class:`~policyport.converter.Converted` with the signature's inputs (``obs`` when there is
        one) and outputs (its keys), initializers named after the SavedModel's variables.

    Raises:
        UnreadableFileError: not a loadable SavedModel, or no ``serving_default`` signature.
        TrustRequiredError: ``options.trust`` is false (exit 2).
        LimitExceededError: a tensor its graph sizes from a constant above the array limit
            (:func:`~policyport.converter.keras_sizes.check_savedmodel_sizes`).
        BadModelError, UnsupportedOpError, MissingDependencyError: as :func:`convert_keras`.
    """
    from ..kinds import refuse_code_without_trust, wrong_shape_of_source

    fw = _frameworks()
    _check_options(options, "a SavedModel")
    _check_opset(fw, options.opset)
    path = Path(source)
    if wrong := wrong_shape_of_source(path, "savedmodel"):
        raise UnreadableFileError(wrong)
    if not (path / "saved_model.pb").is_file():
        raise UnreadableFileError(f"{path} is not a TF SavedModel folder (it has no saved_model.pb)")
    refuse_code_without_trust(path, "savedmodel", options.trust)
    check_savedmodel_sizes(path, fw.tf)
    with _globless(path) as plain:
        try:
            loaded = fw.tf.saved_model.load(str(plain))
        except Exception as e:  # tf raises OSError, ValueError, NotFoundError ... for a broken folder
            reason = _first_line(e).replace(str(plain), str(path))
            raise UnreadableFileError(f"{path} is not a loadable SavedModel: {type(e).__name__}: {reason}") from e
    signatures = dict(getattr(loaded, "signatures", {}) or {})
    if "serving_default" not in signatures:
        raise UnreadableFileError(f"{path} has no serving_default signature; it has: {listing(signatures, show=str) or 'none'}")
    signature = signatures["serving_default"]
    keys = sorted(signature.structured_input_signature[1])
    specs = [signature.structured_input_signature[1][k] for k in keys]
    tf = fw.tf
    names = ["obs"] if len(keys) == 1 else keys

    def call(*args):
        return signature(**dict(zip(keys, args)))

    fn = tf.function(call, input_signature=[tf.TensorSpec(s.shape, s.dtype, name=n) for s, n in zip(specs, names)])
    variables = list(getattr(loaded, "variables", None) or signature.variables)
    trace = _trace_function(fw, fn, variables, names)
    provenance = {"kind": "savedmodel", "file": path.name, "sha256": sha256_file(path / "saved_model.pb")}
    return _convert_trace(fw, trace, options, provenance, "savedmodel")
