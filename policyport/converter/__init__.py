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
import os
import warnings

from ..errors import (
    ArgumentTypeError,
    BadModelError,
    OptionError,
    UnreadableFileError,
)
from .assumptions import record_assumptions
from .build import DEFAULT_OPSET, HEADS, MIN_OPSET, NO_HEAD
from .kinds import (FILE_KINDS, FILE_KINDS_TEXT, KINDS, RUNS_CODE, SOURCES, UnknownKindError,  # noqa: F401  (the API)
                    detect_kind, refuse_code_without_trust, wrong_shape_of_source)
from .options import (OPTIONS_KEY, READS, READS_ONLY_FOR, ConversionNote, ConvertOptions, Converted, _check_types,  # noqa: F401  (the API)
                      flag_list, given_fields, where_they_apply)


#: Where a source kind records its own activation, for the refusal of a list of them.
_RECORDED_ACTIVATION = {
    "sb3": "; an SB3 zip records its activation in policy_kwargs (leave --activation out to use it)",
    "rllib": "; an RLlib checkpoint records its activation in its model config (fcnet_activation)",
}


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
            file that runs code it holds: a TorchScript file, a SavedModel, a whole pickled module);
            for a torch module (a TorchScript file, a whole pickled module) whose ``forward`` takes
            several inputs: ``example_inputs`` (a tuple in ``forward``'s order or a dict by parameter
            name, numpy arrays or torch tensors of shape ``(batch, ...)``, dtypes kept), or
            ``input_shape`` as a dict by parameter name with ``input_dtypes``
            (:func:`policyport.converter.sources.torch_module.module_examples`).

    Returns:
        An ``onnx.ModelProto``: input ``obs`` (float, shape ``(batch, obs_dim)``; for a torch module
        of several inputs one graph input per ``forward`` parameter, under its name), output
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
            option the kind does not read, a value branch the source lacks, torch inputs that do not
            fit ``forward`` ...).
        MissingDependencyError: the source's framework (torch, tensorflow ...) is not installed.

    Warns:
        ConversionNote: one per note of the conversion (a part of the source left out, as the value
            function of an SB3 zip without ``keep_value``); the command line prints the same.
    """
    converted = convert_source(source, kind=kind, **options)
    for note in converted.notes:
        warnings.warn(note, ConversionNote, stacklevel=2)
    return converted.model


__all__ = ["KINDS", "FILE_KINDS", "HEADS", "UnknownKindError", "MIN_OPSET", "DEFAULT_OPSET", "SOURCES", "OPTIONS_KEY", "ConvertOptions",
           "ConversionNote", "Converted", "convert", "convert_source", "detect_kind"]
