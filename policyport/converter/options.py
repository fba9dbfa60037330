"""What a conversion is given and gives back: :class:`ConvertOptions` (every option, as the command
line spells it in messages) and :class:`Converted` (the ONNX model with what it assumes)."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import (
    ArgumentTypeError,
    BadModelError,
    InputMismatchError,
    OptionError,
    check_argument,
)
from ..io.schema import load_json
from .assumptions import Assumption, Oracle, reconstruction
from .build import DEFAULT_OPSET


#: The :class:`ConvertOptions` fields each source kind reads; any other field given a value is
#: refused before conversion rather than ignored (an SB3 zip's head comes from its action space, a
#: Keras model records its own activations ...). ``trust`` is a permission, not a setting, and is
#: accepted everywhere.
READS: dict[str, frozenset[str]] = {
    "npz": frozenset({"activation", "head", "opset", "keep_value"}),
    "torch": frozenset({"opset", "exporter", "input_shape", "output_names", "input_dtypes", "example_inputs"}),
    "torchscript": frozenset({"opset", "exporter", "input_shape", "output_names", "input_dtypes", "example_inputs"}),
    "state-dict": frozenset({"activation", "head", "opset", "keep_value", "input_shape", "weights_dtype", "exporter",
                             "output_names", "input_dtypes",
                             "example_inputs"}),  # the last four for a whole pickled module loaded with trust
    "sb3": frozenset({"activation", "opset", "keep_value", "obs_filter", "obs_norm", "weights_dtype"}),
    "rllib-torch": frozenset({"activation", "head", "opset", "keep_value", "input_shape", "weights_dtype"}),
    "keras": frozenset({"head", "opset"}),
    "savedmodel": frozenset({"head", "opset"}),
    "rllib": frozenset({"activation", "head", "opset", "keep_value", "obs_filter", "policy_id"}),
    "rl-games": frozenset({"activation", "opset", "action_bounds"}),
    "skrl": frozenset({"activation", "opset", "action_bounds", "obs_filter"}),
    "ml-agents": frozenset({"opset"}),
    "tianshou": frozenset({"activation", "opset", "action_bounds", "action_bound_method"}),
    "sample-factory": frozenset({"activation", "head", "opset"}),
    "torchrl": frozenset({"activation", "opset", "action_bounds", "distribution", "policy_id", "obs_filter"}),
    "cleanrl": frozenset({"activation", "opset", "keep_value", "action_bounds"}),
    "brax": frozenset({"activation", "opset"}),
    "rsl-rl": frozenset({"activation", "opset"}),
}


#: Options a source kind reads only for some of its files, and which files: a ``.pt`` of the state-dict
#: kind holds either a state_dict (weights: policyport builds the graph) or, read with ``trust``, a
#: whole pickled module (exported by torch.onnx); :mod:`.state_dict` refuses the other file's options.
READS_ONLY_FOR = {
    ("state-dict", "exporter"): "files holding a whole pickled module read with --trust",
    ("state-dict", "output_names"): "files holding a whole pickled module read with --trust",
    ("state-dict", "input_dtypes"): "files holding a whole pickled module read with --trust",
    ("state-dict", "example_inputs"): "files holding a whole pickled module read with --trust",
}


#: How the CLI spells each option, for messages.
_FLAGS = {"activation": "--activation", "head": "--head", "opset": "--opset", "keep_value": "--keep-value",
          "exporter": "--exporter", "policy_id": "--policy-id", "obs_filter": "--no-filter", "obs_norm": "--obs-norm",
          "input_shape": "--input-shape", "output_names": "--output-names", "action_bounds": "--action-bounds",
          "action_bound_method": "--action-bound-method",
          "distribution": "--distribution", "weights_dtype": "--weights-dtype", "input_dtypes": "--input-dtype",
          "example_inputs": "example_inputs="}


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
            For a torch module whose ``forward`` takes several inputs, a mapping from each parameter's
            name to its shape without the batch axis (``{"obs": (8,), "action_mask": (4,)}``).
        input_dtypes: for a torch module, parameter name -> the dtype of that input (numpy's name:
            ``"bool"``, ``"int64"``, ``"float32"`` ...); ``None``, or an input not named: the module's
            floating dtype (its first floating parameter's).
        example_inputs: for a torch module, the inputs its ``forward`` is traced with: a tuple in
            ``forward``'s order, or a mapping keyed by its parameter names, or one array for a module
            of one input; each a numpy array or torch tensor of shape ``(batch, ...)``, whose dtype the
            graph input keeps. Never recorded
            in the model's metadata (the graph inputs record their names, shapes and dtypes).
        output_names: names for a torch module's outputs, in the order it returns them; ``None``:
            ``logits`` for one tensor, ``output_<i>`` for a tuple, the keys of a dict.
        action_bounds: ``(low, high)``, the environment's action bounds (each one number for every
            action dimension, or one per dimension), for sources whose player maps the policy's
            output to them (rl_games' ``clip_actions``, skrl's ``clip_mean_actions``), or whose file does not hold them (a CleanRL PPO
            policy's ``ClipAction``, a CleanRL JAX TD3/DDPG actor's ``action_scale`` and ``action_bias``);
            ``None``: the action as the policy outputs it, or the source's default, reported as an assumption.
        action_bound_method: how the policy bounds a continuous action to [-1, 1] before scaling it
            to ``action_bounds`` (Tianshou's ``action_bound_method``): ``"clip"``, ``"tanh"`` or
            ``"none"``; ``None``: not given (a source that needs it refuses to guess).
        distribution: the action distribution of a source whose files do not record it (a TorchRL
            actor's ``distribution_class``): ``tanh-normal``, ``normal`` or ``categorical``; ``None``:
            the source's own, or refused where a wrong guess is plausible.
        weights_dtype: how half-precision (float16, bfloat16) parameters are built
            (:data:`policyport.converter.build.WEIGHTS_DTYPES`): ``"keep"`` (default) keeps each
            initializer in the source's dtype (a float16 model; bfloat16 initializers each followed
            by a ``Cast`` to float32, the model computing in float32), ``"float32"`` casts each to
            float32 (exact) for a float32 model.
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
    action_bounds: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    action_bound_method: str | None = None
    distribution: str | None = None
    weights_dtype: str = "keep"
    input_dtypes: dict[str, str] | None = None
    example_inputs: tuple | dict | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.action_bounds is not None:  # arrays or lists to plain tuples of floats, as metadata records them
            object.__setattr__(self, "action_bounds", bounds_tuple(self.action_bounds))
        if isinstance(self.input_shape, dict):  # lists to tuples of ints, as metadata records them
            object.__setattr__(self, "input_shape", named_shapes(self.input_shape))
        if self.input_dtypes is not None:
            object.__setattr__(self, "input_dtypes", dtype_names(self.input_dtypes))
        if self.example_inputs is not None and not isinstance(self.example_inputs, (tuple, list, dict)):
            object.__setattr__(self, "example_inputs", (self.example_inputs,))  # one array: the one input

    def to_metadata(self) -> str:
        """The options that shape the graph, as the JSON recorded under :data:`OPTIONS_KEY`
        (``trust`` and ``example_inputs`` aside: the graph inputs record what the examples were)."""
        recorded = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                    if f.name not in ("trust", "example_inputs")}
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
        recorded = load_json(text, f"model metadata {OPTIONS_KEY!r}")
        if not isinstance(recorded, dict):
            raise BadModelError(f"model metadata {OPTIONS_KEY!r} is malformed: expected an object, got "
                                f"{type(recorded).__name__}")
        known = {f.name for f in dataclasses.fields(cls)} - {"trust", "obs_norm", "example_inputs"}
        values = {k: v for k, v in recorded.items() if k in known}
        for key, kind in (("input_shape", int), ("output_names", str)):  # JSON lists back to tuples
            value = values.get(key)
            if key == "input_shape" and isinstance(value, dict):  # one shape per named input
                continue
            if value is not None and not (isinstance(value, list) and all(type(v) is kind for v in value)):
                raise BadModelError(f"model metadata {OPTIONS_KEY!r} is malformed: {key} must be a list of "
                                    f"{kind.__name__} or null, not {value!r:.80}")
            if value is not None:
                values[key] = tuple(value)
        try:  # action_bounds are checked as the options are made
            options = cls(**values)
            _check_types(options)
        except (ArgumentTypeError, InputMismatchError, OptionError) as e:
            raise BadModelError(f"model metadata {OPTIONS_KEY!r} is malformed: {str(e).removeprefix('convert(): ')}; "
                                "the model file is damaged or was not written by policyport convert") from None
        return options


class ConversionNote(UserWarning):
    """What :func:`policyport.convert` did that a user should hear about (a part of the source it left
    out, such as SB3's value function), issued through :mod:`warnings` once per note; the command
    line prints the same sentences. ``warnings.filterwarnings("ignore", category=ConversionNote)``
    silences them; :func:`policyport.converter.convert_source` returns them as ``Converted.notes``."""


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


def bounds_tuple(bounds) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(low, high)``, each a number or a sequence of numbers, as two tuples of floats.

    Raises:
        ArgumentTypeError: anything but two numbers or sequences of numbers.
    """
    from ..errors import ArgumentTypeError

    try:
        low, high = bounds
        return tuple(tuple(float(v) for v in np.ravel(side)) for side in (low, high))
    except (TypeError, ValueError) as e:
        raise ArgumentTypeError(f"action_bounds must be (low, high), each a number or a sequence of numbers, "
                                f"not {bounds!r:.80}") from e


#: The dtypes a torch module's graph input can be given (``input_dtypes``), by numpy's name.
INPUT_DTYPES = ("float32", "float64", "float16", "bool", "int64", "int32", "int16", "int8", "uint8")


def named_shapes(shapes) -> dict[str, tuple[int, ...]]:
    """``input_shape`` given per input: input name -> shape without the batch axis, as tuples of ints.

    Raises:
        ArgumentTypeError: not a mapping from names to sequences of positive whole numbers.
    """
    import numbers

    problem = None
    if not shapes:
        problem = "an empty mapping"
    for name, shape in shapes.items():
        if not isinstance(name, str) or not name:
            problem = f"the name {name!r}"
        elif not isinstance(shape, (tuple, list)) or not all(
                isinstance(d, numbers.Integral) and not isinstance(d, bool) and d > 0 for d in shape):
            problem = f"{name!r}: {shape!r:.80}"
        if problem:
            break
    if problem:
        raise ArgumentTypeError(f"input_shape given per input must map each input's name to its shape without the "
                                f"batch axis, a tuple of positive whole numbers ({{'obs': (8,), 'action_mask': (4,)}}); "
                                f"got {problem}")
    return {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}


def dtype_names(dtypes) -> dict[str, str]:
    """``input_dtypes`` as input name -> numpy's name of the dtype (``"bool"``, ``"int64"``): each
    given as that name, a numpy dtype or type, or a ``torch.dtype``.

    Raises:
        ArgumentTypeError: not a mapping from names to dtypes.
        OptionError: a dtype outside :data:`INPUT_DTYPES`.
    """
    from ..errors import OptionError

    if not isinstance(dtypes, dict) or not all(isinstance(k, str) and k for k in dtypes):
        raise ArgumentTypeError(f"input_dtypes must map input names to dtypes ({{'action_mask': 'bool'}}), "
                                f"not {dtypes!r:.80}")
    names = {}
    for name, dtype in dtypes.items():
        text = str(dtype).removeprefix("torch.") if type(dtype).__module__ == "torch" else dtype  # torch.bool
        try:
            names[name] = np.dtype(text).name
        except TypeError:
            names[name] = str(text)
        if names[name] not in INPUT_DTYPES:
            raise OptionError(f"input {name!r}: dtype {dtype!r} is not one a graph input takes here; choose one of "
                              f"{', '.join(INPUT_DTYPES)}")
    return names


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


#: The plain types each option takes (None aside, which every option but these booleans and opset takes).
_OPTION_TYPES = {"activation": str, "head": str, "action_bound_method": str, "exporter": str, "policy_id": str, "obs_norm": (str, os.PathLike),
                 "keep_value": bool, "obs_filter": bool, "trust": bool,
                 "distribution": str, "weights_dtype": str}


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
