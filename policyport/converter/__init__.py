"""Converters: one module per source kind, each producing an ONNX model named after the source.

:func:`convert` is the public entry point; :func:`convert_source` also returns the source's own
reference forward pass, which :func:`policyport.verify` compares the backends against.

Every source kind is one entry of :data:`SOURCES`: a function ``convert(source, options) ->
Converted`` in the kind's own module, imported only when that kind is converted (so torch or
tensorflow load only for their sources). :func:`detect_kind` tells the kind of a path or object
from its name, its contents' layout (never by unpickling) or its type.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ..errors import (
    ArgumentTypeError,
    BadModelError,
    InputMismatchError,
    OptionError,
    TrustRequiredError,
    UnreadableFileError,
    check_argument,
)
from .assumptions import Assumption, Oracle, reconstruction, record_assumptions
from .build import DEFAULT_OPSET, HEADS, MIN_OPSET, NO_HEAD

#: Source kind -> ``"module:function"`` converting it; the function takes ``(source, options)``
#: and returns a :class:`Converted`.
SOURCES: dict[str, str] = {
    "npz": "policyport.converter.sources.rllib_weights:convert_npz",
    "torch": "policyport.converter.sources.torch_module:convert_torch",
    "torchscript": "policyport.converter.sources.torch_module:convert_torchscript",
    "state-dict": "policyport.converter.sources.state_dict:convert_state_dict",
    "sb3": "policyport.converter.sources.sb3:convert_sb3",
    "rllib-torch": "policyport.converter.sources.state_dict:convert_rllib_torch",
    "keras": "policyport.converter.sources.keras:convert_keras",
    "savedmodel": "policyport.converter.sources.keras:convert_savedmodel",
    "rllib": "policyport.converter.sources.rllib:convert_rllib",
}

#: Source kinds ``--from`` accepts, in the order the help lists them.
KINDS = tuple(SOURCES)

#: The :class:`ConvertOptions` fields each source kind reads; any other field given a value is
#: refused before conversion rather than ignored (an SB3 zip's head comes from its action space, a
#: Keras model records its own activations ...). ``trust`` is a permission, not a setting, and is
#: accepted everywhere.
READS: dict[str, frozenset[str]] = {
    "npz": frozenset({"activation", "head", "opset", "keep_value"}),
    "torch": frozenset({"opset", "exporter", "input_shape", "output_names"}),
    "torchscript": frozenset({"opset", "exporter", "input_shape", "output_names"}),
    "state-dict": frozenset({"activation", "head", "opset", "keep_value", "input_shape", "exporter",
                             "output_names"}),  # the last two for a whole pickled module loaded with trust
    "sb3": frozenset({"activation", "opset", "keep_value", "obs_filter", "obs_norm"}),
    "rllib-torch": frozenset({"activation", "head", "opset", "keep_value", "input_shape"}),
    "keras": frozenset({"head", "opset"}),
    "savedmodel": frozenset({"head", "opset"}),
    "rllib": frozenset({"activation", "head", "opset", "keep_value", "obs_filter", "policy_id"}),
}

#: Options a source kind reads only for some of its files, and which files: a ``.pt`` of the state-dict
#: kind holds either a state_dict (weights: policyport builds the graph) or, read with ``trust``, a
#: whole pickled module (exported by torch.onnx); :mod:`.state_dict` refuses the other file's options.
READS_ONLY_FOR = {
    ("state-dict", "exporter"): "files holding a whole pickled module read with --trust",
    ("state-dict", "output_names"): "files holding a whole pickled module read with --trust",
}

#: Where a source kind records its own activation, for the refusal of a list of them.
_RECORDED_ACTIVATION = {
    "sb3": "; an SB3 zip records its activation in policy_kwargs (leave --activation out to use it)",
    "rllib": "; an RLlib checkpoint records its activation in its model config (fcnet_activation)",
}

#: How the CLI spells each option, for messages.
_FLAGS = {"activation": "--activation", "head": "--head", "opset": "--opset", "keep_value": "--keep-value",
          "exporter": "--exporter", "policy_id": "--policy-id", "obs_filter": "--no-filter", "obs_norm": "--obs-norm",
          "input_shape": "--input-shape", "output_names": "--output-names"}

#: Source kinds that are files or folders (``torch`` is a live module), as ``--from`` takes them.
FILE_KINDS = tuple(k for k in KINDS if k != "torch")

#: How :func:`detect_kind` tells each kind of file, for messages.
FILE_KINDS_TEXT = ("npz (.npz), sb3 (.zip), torchscript or state-dict (.pt, .pth), "
                   "state-dict (.safetensors), keras (.keras, .h5, .hdf5), savedmodel (a folder with saved_model.pb) and "
                   "rllib (checkpoint-N, or a folder with rllib_checkpoint.json or checkpoint-N) by their names")


#: Source kinds whose files hold code that loading them runs: kind -> (what such a source is, what of
#: it runs and when). They are read only with ``trust``; without it :func:`refuse_code_without_trust`
#: refuses them before anything loads them. No list of allowed or refused ops stands in for that: the
#: code is the policy, and whatever it does runs.
RUNS_CODE: dict[str, tuple[str, str]] = {
    "torchscript": (
        "a TorchScript file (torch.jit.save), and loading it runs code the file holds",
        ("its __setstate__ methods run while torch.jit.load loads it and its forward when policyport traces and "
         "checks it, and TorchScript code can create, read and write files"),
    ),
    "savedmodel": (
        "a TensorFlow SavedModel, and loading it runs code the folder holds",
        ("its resources' initializers run while tf.saved_model.load loads it and its serving signature when "
         "policyport traces and checks it, and TensorFlow ops can read and write files"),
    ),
}


def refuse_code_without_trust(path, kind: str, trust: bool) -> None:
    """Refuse ``path``, a source of a kind in :data:`RUNS_CODE`, unless ``trust``.

    Called by the converters of those kinds once the path is known to be of the kind (by its
    layout, never by loading it) and before anything loads it.

    Raises:
        TrustRequiredError: ``trust`` is false (exit 2), naming what the source is, what of it would
            run and ``--trust``.
    """
    if trust:
        return
    what, runs = RUNS_CODE[kind]
    raise TrustRequiredError(f"{path} is {what}: {runs}. policyport refused it without loading it (nothing from it "
                             "ran); if you trust it, pass --trust (trust=True)")


class UnknownKindError(BadModelError):
    """A source whose kind cannot be told from its name or layout (exit 3); ``kind=`` / ``--from`` names it."""


#: The model metadata key under which a converter records the options it was run with, so that
#: ``verify --source`` can rebuild the same source forward pass.
OPTIONS_KEY = "policyport.convert_options"


@dataclass(frozen=True)
class ConvertOptions:
    """What a user can tell a converter beyond the source itself.

    Attributes:
        activation: hidden-layer activation for sources whose files do not record it (an ``.npz``
            or a ``state_dict``); ``None`` lets the converter use the source's default (RLlib's
            ``tanh`` for an ``.npz``).
        head: ``None`` (the source's own outputs: an SB3 zip's or an RLlib checkpoint's action, an
            ``.npz``'s logits), ``"none"`` (``logits`` only, no action head) or a name from :data:`HEADS`.
        opset: ONNX default-domain opset (default 17).
        keep_value: also export the value function as output ``value``.
        exporter: for live torch modules: ``"torchscript"`` (default) or ``"dynamo"``.
        policy_id: which policy of a multi-policy checkpoint (default ``default_policy``).
        obs_filter: bake the source's observation filter into the graph (default true).
        obs_norm: an observation-normalisation file to bake in (SB3's ``vecnormalize.pkl``).
        trust: allow loading files that run code they hold: a whole pickled module (unpickled), a
            TorchScript file, a SavedModel, a Keras file with a ``Lambda`` stored as bytecode.
        input_shape: the observation's shape without the batch axis, for torch modules whose first
            layer does not tell it (a ``Flatten`` of ``(batch, 2, 3)``); ``None``: from the first Linear.
        output_names: names for a torch module's outputs, in the order it returns them; ``None``:
            ``logits`` for one tensor, ``output_<i>`` for a tuple, the keys of a dict.
    """

    activation: str | None = None
    head: str | None = None
    opset: int = DEFAULT_OPSET
    keep_value: bool = False
    exporter: str = "torchscript"
    policy_id: str | None = None
    obs_filter: bool = True
    obs_norm: str | None = None
    trust: bool = False
    input_shape: tuple[int, ...] | None = None
    output_names: tuple[str, ...] | None = None

    def to_metadata(self) -> str:
        """The options that shape the graph, as the JSON recorded under :data:`OPTIONS_KEY`."""
        recorded = dataclasses.asdict(self)
        recorded.pop("trust")
        return json.dumps(recorded, sort_keys=True)

    @classmethod
    def from_metadata(cls, text: str | None) -> ConvertOptions:
        """Options recorded by :meth:`to_metadata`; unknown keys are ignored. ``trust`` is never read,
        nor ``obs_norm``: a path a model records is never opened (the command line gives it again).

        Raises:
            BadModelError: the text is not a JSON object, or an option in it is not of its type (the
                model file is damaged: not the user's options).
        """
        if not text:
            return cls()
        try:
            recorded = json.loads(text)
            if not isinstance(recorded, dict):
                raise ValueError(f"expected an object, got {type(recorded).__name__}")
        except (ValueError, RecursionError) as e:
            raise BadModelError(f"model metadata {OPTIONS_KEY!r} is malformed: {e}") from e
        known = {f.name for f in dataclasses.fields(cls)} - {"trust", "obs_norm"}
        values = {k: v for k, v in recorded.items() if k in known}
        for key, kind in (("input_shape", int), ("output_names", str)):  # JSON lists back to tuples
            value = values.get(key)
            if value is not None and not (isinstance(value, list) and all(type(v) is kind for v in value)):
                raise BadModelError(f"model metadata {OPTIONS_KEY!r} is malformed: {key} must be a list of "
                                    f"{kind.__name__} or null, not {value!r:.80}")
            if value is not None:
                values[key] = tuple(value)
        options = cls(**values)
        try:
            _check_types(options)
        except (ArgumentTypeError, InputMismatchError) as e:
            raise BadModelError(f"model metadata {OPTIONS_KEY!r} is malformed: {str(e).removeprefix('convert(): ')}; "
                                "the model file is damaged or was not written by policyport convert") from None
        return options


@dataclass
class Converted:
    """A converted policy.

    Attributes:
        model: the ``onnx.ModelProto``.
        reference: ``reference(obs) -> {tensor name: array}``, the source's own forward pass on
            ``obs`` (float array, shape ``(batch, *obs_shape)``; for a model of several graph
            inputs, a mapping input name -> array), naming tensors as the graph does (every layer
            the source computes that the graph also names).
        kind: the source kind.
        notes: what the converter did that a user should hear about (parts of the source it
            dropped), one sentence each.
        assumptions: what the model rests on that the source file does not record (an activation
            a state_dict cannot tell, a head, the absence of a normaliser, a normaliser file found
            beside the source), each an :class:`~policyport.converter.assumptions.Assumption`;
            recorded in the model's metadata.
        oracle: what ``reference`` is: the framework running the source's own code, or policyport's
            reconstruction (an :class:`~policyport.converter.assumptions.Oracle`).
    """

    model: object
    reference: Callable[[np.ndarray], dict[str, np.ndarray]]
    kind: str
    notes: list[str] = field(default_factory=list)
    assumptions: list[Assumption] = field(default_factory=list)
    oracle: Oracle = field(default_factory=lambda: reconstruction("the source's arrays"))


def _is_zip_with(path: Path, *members: str) -> bool:
    """Whether ``path`` is a zip archive holding every name in ``members`` (at any folder depth)."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = {n.rsplit("/", 1)[-1] for n in zf.namelist()} | set(zf.namelist())
    except (zipfile.BadZipFile, OSError):
        return False
    return all(m in names for m in members)


def detect_kind(source) -> str:
    """The source kind of a path or object (``--from`` overrides this).

    Files are told apart by name and layout, never by loading them: an ``.npz`` is RLlib-layout
    weights; a ``.zip`` is a Stable-Baselines3 save (one lacking its ``policy.pth`` or ``data`` is
    refused by the SB3 reader, saying so); a
    ``.pt``/``.pth`` zip holding TorchScript ``code/`` is a TorchScript file, any other is a
    ``state_dict``; ``.safetensors`` is a ``state_dict``; ``.keras``/``.h5`` are Keras files; a folder
    with ``saved_model.pb`` is a TF SavedModel; a folder with ``rllib_checkpoint.json`` or a file
    named ``checkpoint-<N>`` is an RLlib checkpoint. Objects: a mapping of arrays is ``npz``, a
    ``torch.nn.Module`` is ``torch``, a Keras model or ``tf.function`` is ``keras``.

    Raises:
        UnreadableFileError: a path that does not exist.
        BadModelError: a source of no known kind.
    """
    if isinstance(source, Mapping):
        return "npz"
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.exists():
            raise UnreadableFileError(f"{path}: no such file")
        kind = _detect_path(path)
        if kind is None:
            what = "folder" if path.is_dir() else "file"
            raise UnknownKindError(
                f"cannot tell what kind of policy the {what} {path} is: policyport tells {FILE_KINDS_TEXT}; "
                f"name the kind of a source named otherwise with --from KIND (kind=KIND in Python), one of "
                f"{', '.join(FILE_KINDS)}"
            )
        return kind
    module = type(source).__module__.split(".")[0]
    if module == "torch" or any(c.__module__.startswith("torch.nn") for c in type(source).__mro__):
        return "torch"
    if any(c.__module__.split(".")[0] in ("keras", "tensorflow", "tf_keras") for c in type(source).__mro__):
        return "keras"  # a Keras model (subclasses too) or a tf.function
    raise BadModelError(f"cannot convert a {type(source).__name__}; supported sources: {', '.join(KINDS)}")


def _detect_path(path: Path) -> str | None:
    name = path.name.lower()
    if path.is_dir():
        if (path / "saved_model.pb").is_file():
            return "savedmodel"
        if (path / "rllib_checkpoint.json").is_file() or any(path.glob("checkpoint-*")):
            return "rllib"
        return None
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return "npz"
    if suffix == ".zip":  # a damaged one gets the SB3 reader's own account of what is wrong
        return "sb3"
    if suffix in (".pt", ".pth"):
        return "torchscript" if _is_zip_with(path, "data.pkl", "constants.pkl") else "state-dict"
    if suffix == ".safetensors":
        return "state-dict"
    if suffix in (".keras", ".h5", ".hdf5"):
        return "keras"
    if name.startswith("checkpoint-") and name.split("-", 1)[1].isdigit():
        return "rllib"
    return None


#: What each kind of file source is, for the refusal of a folder given as one.
_FILE_TAKES = {"npz": "an .npz (or .npy) file of weights", "torchscript": "a TorchScript .pt file",
               "state-dict": "a .pt, .pth or .safetensors file", "sb3": "an SB3 .zip file",
               "rllib-torch": "a .pt or .pth file of RLlib torch weights", "keras": "a .keras or .h5 file"}

#: The folder kinds :func:`detect_kind` tells, for the hint naming the kind a folder is.
_FOLDERS = {"savedmodel": "a SavedModel folder", "rllib": "an RLlib checkpoint folder"}


def wrong_shape_of_source(path: Path, kind: str) -> str | None:
    """Why ``path`` cannot be a ``kind`` source because it is a folder where a file is expected or a
    file where a folder is, naming the ``--from`` it would convert with when its layout tells; ``None``
    when the shape fits (or the path does not exist).
    """
    path = Path(path)
    if path.is_dir() and kind in _FILE_TAKES:
        detected = _detect_path(path)
        if detected in _FOLDERS:
            return f"{path} is a folder; {_FOLDERS[detected]} converts with --from {detected}"
        return f"{path} is a folder; --from {kind} takes {_FILE_TAKES[kind]}"
    if path.is_file() and kind == "savedmodel":
        detected = _detect_path(path)
        hint = f"; a {path.suffix or 'file'} file like this converts with --from {detected}" if detected else ""
        return f"{path} is a file; --from savedmodel takes a SavedModel folder (holding saved_model.pb){hint}"
    return None


def convert_source(source, *, kind: str | None = None, options: ConvertOptions | None = None,
                   **option_values) -> Converted:
    """Convert a policy and keep the source's reference forward pass.

    Args:
        source: as for :func:`convert`.
        kind: the source kind; detected from ``source`` when ``None``.
        options: a :class:`ConvertOptions`; or give its fields as keyword arguments.

    Returns:
        A :class:`Converted` whose model records ``options`` in its metadata (:data:`OPTIONS_KEY`).

    Raises:
        As :func:`convert`.
    """
    if options is None:
        unknown = sorted(set(option_values) - {f.name for f in dataclasses.fields(ConvertOptions)})
        if unknown:
            raise ArgumentTypeError(f"convert() got unexpected keyword argument(s) {', '.join(unknown)}")
        options = ConvertOptions(**option_values)
    elif option_values:
        options = dataclasses.replace(options, **option_values)
    _check_types(options)
    if options.head not in (None, NO_HEAD, *HEADS):
        raise OptionError(f"unknown head {options.head!r}; choose one of {', '.join(HEADS)} (or none)")
    kind = kind or detect_kind(source)
    if kind not in SOURCES:
        raise OptionError(f"unknown source kind {kind!r}; choose one of {', '.join(KINDS)}")
    _check_applies(options, kind)
    if options.obs_norm is not None and not options.obs_filter:
        raise OptionError(f"--obs-norm (obs_norm=) {str(options.obs_norm)!r} bakes in observation normalisation, "
                          "which --no-filter (obs_filter=False) leaves out; give one or the other")
    if isinstance(source, (str, os.PathLike)) and (wrong := wrong_shape_of_source(source, kind)):
        raise UnreadableFileError(wrong)
    _check_activation(options.activation)
    module, function = SOURCES[kind].split(":")
    converted = getattr(importlib.import_module(module), function)(source, options)
    _record_options(converted.model, kind, options)
    record_assumptions(converted.model, converted.assumptions)
    return converted


#: The plain types each option takes (None aside, which every option but these booleans and opset takes).
_OPTION_TYPES = {"activation": str, "head": str, "exporter": str, "policy_id": str, "obs_norm": (str, os.PathLike),
                 "keep_value": bool, "obs_filter": bool, "trust": bool}


def _check_types(options: ConvertOptions) -> None:
    """Refuse an option of the wrong type before any file is read.

    Raises:
        ArgumentTypeError: naming the option, the type it takes and what it got.
    """
    check_argument(options.opset, "opset", "int", 1)
    for name, wanted in _OPTION_TYPES.items():
        value = getattr(options, name)
        if value is None and wanted is not bool:
            continue
        if not isinstance(value, wanted):
            shown = " or ".join(t.__name__ for t in (wanted if isinstance(wanted, tuple) else (wanted,)))
            raise ArgumentTypeError(f"convert(): {name} must be {shown}, not {type(value).__name__} {value!r:.80}")


def _check_applies(options: ConvertOptions, kind: str) -> None:
    """Refuse options given a value that ``kind`` never reads (:data:`READS`), naming the kinds that do;
    then a list of activations for a kind that reads one activation name.

    Raises:
        OptionError: such an option (exit 2).
    """
    given = given_fields(options)
    ignored = [name for name in given if name not in READS.get(kind, frozenset(given))]
    if ignored:
        raise OptionError(f"{flag_list(ignored)} {'does' if len(ignored) == 1 else 'do'} not apply to {kind} sources "
                          f"({where_they_apply(ignored)})")
    if options.activation and "," in options.activation and kind != "state-dict":  # a kind that reads one name
        raise OptionError(f"--activation (activation=) {options.activation!r} is a list, one activation per "
                          "parameter-free module, which applies to state-dict sources of a plain nn.Sequential; "
                          f"{kind} sources take one activation name{_RECORDED_ACTIVATION.get(kind, '')}")


def given_fields(options: ConvertOptions) -> list[str]:
    """The :class:`ConvertOptions` fields given a value other than their default (``trust`` aside)."""
    defaults = ConvertOptions()
    return [f.name for f in dataclasses.fields(options)
            if f.name != "trust" and getattr(options, f.name) != getattr(defaults, f.name)]


def flag_list(names) -> str:
    """Option fields as the command line spells them: ``"--exporter, --output-names"``."""
    return ", ".join(_FLAGS.get(n, n) for n in names)


def where_they_apply(names) -> str:
    """The source kinds that read each option of ``names``, options read by the same kinds together:
    ``"--exporter, --output-names apply to state-dict files holding a whole pickled module read with
    --trust, torch, torchscript"``."""
    groups: dict[str, list[str]] = {}
    for name in names:
        kinds = sorted(k for k, reads in READS.items() if name in reads)
        text = ", ".join(f"{k} {READS_ONLY_FOR[k, name]}" if (k, name) in READS_ONLY_FOR else k for k in kinds)
        groups.setdefault(text, []).append(name)
    return "; ".join(f"{flag_list(group)} appl{'ies' if len(group) == 1 else 'y'} to {kinds}" for kinds, group in groups.items())


def _check_activation(activation: str | None) -> None:
    """Refuse an ``activation`` option naming no activation policyport knows (each name of a list).

    Raises:
        OptionError: such a value (exit 2).
    """
    from .activations import parse_activation

    for name in activation.split(",") if activation is not None else ():
        try:
            parse_activation(name)
        except BadModelError as e:
            raise OptionError(str(e)) from None


def _record_options(model, kind: str, options: ConvertOptions) -> None:
    props = {p.key: p for p in model.metadata_props}
    for key, value in ((OPTIONS_KEY, options.to_metadata()), ("policyport.source_kind", kind)):
        if key in props:
            props[key].value = value
        else:
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value


def convert(source, *, kind: str | None = None, **options):
    """Convert a trained policy to ONNX.

    Args:
        source: a path to a policy file or folder, or a live object; the kinds are :data:`KINDS`
            (see :func:`detect_kind`). ``npz``: a path to an ``.npz`` of weights, or a dict
            name -> array, in RLlib's TF FullyConnectedNetwork layout (``[prefix/]fc_<i>/kernel``
            ``[in, out]``, ``.../bias``, ``fc_out/...``; see :mod:`policyport.converter.sources.rllib_weights`).
            ``keras``: a ``.keras``/``.h5`` file, a ``keras.Model`` or a ``tf.function`` with an
            input signature (:mod:`policyport.converter.sources.keras`); ``savedmodel``: a SavedModel folder;
            ``rllib``: a checkpoint file or folder of any Ray version (:mod:`policyport.converter.sources.rllib`).
        kind: the source kind (one of :data:`KINDS`); detected from ``source`` when ``None``.
        **options: fields of :class:`ConvertOptions`: ``activation`` (tanh, relu, elu, selu,
            swish/silu, softplus, leaky_relu[:slope], gelu, linear; default: the source's own or
            RLlib's tanh), ``head`` (``None`` = the source's own outputs, ``"none"`` = ``logits`` only
            without an action head, ``"diag-gaussian"`` adds ``action`` = mean
            and ``log_std``, ``"categorical"`` adds ``action`` = argmax, int64), ``opset`` (11 up to
            the installed onnx's newest; default 17), ``keep_value`` (export the value branch as
            ``value``), ``exporter``, ``policy_id``, ``obs_filter``, ``obs_norm``, ``trust`` (load a
            file that runs code it holds: a TorchScript file, a SavedModel, a whole pickled module).

    Returns:
        An ``onnx.ModelProto``: input ``obs`` (float, shape ``(batch, obs_dim)``), output
        ``logits``, tensors named after the source's layers, initializers after its parameters.

    Raises:
        UnreadableFileError: the file is missing or unreadable.
        TrustRequiredError: a TorchScript file or a SavedModel (:data:`RUNS_CODE`), which loading runs
            code from, and ``trust`` is false (exit 2).
        UntrustedFileError: the file could run code when loaded (a whole pickled module, a ``Lambda``
            stored as bytecode) and ``trust`` is false.
        BadModelError: arrays that cannot be placed (listed), bad shapes.
        OptionError: an option value the source cannot take (an unknown activation, head or kind, an
            opset out of range, a per-layer activation list for a source of one activation, an
            option the kind does not read, a value branch the source lacks ...).
        MissingDependencyError: the source's framework (torch, tensorflow ...) is not installed.
    """
    return convert_source(source, kind=kind, **options).model


__all__ = ["KINDS", "FILE_KINDS", "HEADS", "UnknownKindError", "MIN_OPSET", "DEFAULT_OPSET", "SOURCES", "OPTIONS_KEY", "ConvertOptions",
           "Converted", "convert", "convert_source", "detect_kind"]
