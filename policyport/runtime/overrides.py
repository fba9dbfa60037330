"""Neuron overrides (steering): set, scale or clamp chosen neurons of chosen tensors.

An override replaces a tensor's value right after the node that produces it, before any other
node reads it; every backend applies the same :class:`Steering`. A neuron is a position on the
tensor's last axis (the feature axis of a ``(batch, width)`` activation).

Text form, one edit per spec (the CLI's ``--override``)::

    TENSOR[INDEX]=VALUE          set        fc_2/tanh[17]=1.0
    TENSOR[INDEX]*=FACTOR        scale      fc_1/tanh[*]*=0.5
    TENSOR[INDEX]=clip(LO,HI)    clamp      fc_2/tanh[0:8]=clip(-0.5,0.5)

INDEX is a neuron number (``17``), a comma list (``3,17,40``), a half-open range ``a:b`` or ``*``
(every neuron). Mapping form (the Python API and override files)::

    {"fc_2/tanh": {17: 1.0, "0:8": {"clip": [-0.5, 0.5]}, "*": {"scale": 0.5}}}

where a value is a number (set), ``{"set": v}``, ``{"scale": f}`` or ``{"clip": [lo, hi]}``; a list of
text specs is accepted too. Edits of one tensor apply in the order given. Needs numpy only.

Interventions that carry arrays (the mapping form with arrays, or :func:`ablate`, :func:`add_direction`
and :func:`patch`; an intervention file names the arrays' files, see
:mod:`policyport.runtime.interventions`)::

    {"add": v, "alpha": a}                 value + a * v            (a steering direction)
    {"ablate": "zero"}                     0                        (zero-ablation)
    {"ablate": "mean", "mean": m}          m                        (mean-ablation)
    {"ablate": "resample", "samples": s, "seed": 0}
                                           row r takes row j_r of s (resample-ablation), j drawn
                                           uniformly by ``numpy.random.default_rng(seed)`` afresh in
                                           every run, so a run's draws depend on its rows alone
    {"patch": p}                           p: the activations of another input (patching)

``v`` and ``m`` hold one row of the tensor (shape ``(width,)`` for a ``(batch, width)`` activation, or the
tensor's full row shape); ``s`` holds rows ``(n, *row)``; ``p`` holds one row (put into every row) or as
many rows as the run. The chosen neurons (the INDEX, on the last axis) are taken from the array at the
same positions. Mean- and resample-ablation follow the usage of the activation-patching literature
(Zhang & Nanda 2024, "Towards best practices of activation patching"; resample-ablation is Chan et
al.'s causal-scrubbing replacement by the activation on another input).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import numpy as np

from ..errors import InputMismatchError, listing

#: Index of an edit: ``None`` for every neuron, ``(start, stop)`` for a range, or a tuple of neurons.
Index = tuple[int, ...] | tuple[int, int] | None

_SPEC = re.compile(r"^\s*(?P<tensor>.+?)\[(?P<index>[^\[\]]*)\]\s*(?P<op>\*=|=)\s*(?P<value>.+?)\s*$")
_CLIP = re.compile(r"^clip\(\s*(?P<lo>[^,()]+?)\s*,\s*(?P<hi>[^,()]+?)\s*\)$")


@dataclass(frozen=True)
class Edit:
    """One override of one tensor.

    Attributes:
        tensor: the tensor's name (a node output).
        index: the neurons: ``None`` for all (``*``), ``(a, b)`` for the range ``a:b`` when
            ``is_range``, else a tuple of neuron numbers.
        is_range: whether ``index`` is a half-open range ``(start, stop)``.
        op: ``"set"``, ``"scale"``, ``"clip"``, or one that carries ``array``: ``"add"`` (value +
            alpha * array), ``"replace"`` (the array's values: mean-ablation, patching) or
            ``"resample"`` (rows drawn from the array).
        values: ``(value,)``, ``(factor,)``, ``(low, high)``, ``(alpha,)`` for ``"add"``, ``()`` for
            ``"replace"``, ``(seed,)`` for ``"resample"``.
        array: the array of ``"add"``, ``"replace"`` and ``"resample"`` (see the module docstring for
            its shapes); ``None`` for the others. Not compared: edits are equal by their text.
        source: what the array is, for the edit's text (``"dir.npy"``, ``"mean(acts.npz)"``).
    """

    tensor: str
    index: Index
    is_range: bool
    op: str
    values: tuple[float, ...]
    array: np.ndarray | None = field(default=None, compare=False, repr=False)
    source: str = ""

    @property
    def spec(self) -> str:
        """The edit in the text grammar (``fc_2/tanh[17]=1``)."""
        if self.index is None:
            index = "*"
        elif self.is_range:
            index = f"{self.index[0]}:{self.index[1]}"
        else:
            index = ",".join(map(str, self.index))
        value = {"set": lambda v: f"={v[0]:g}", "scale": lambda v: f"*={v[0]:g}",
                 "clip": lambda v: f"=clip({v[0]:g},{v[1]:g})",
                 "add": lambda v: f"+={v[0]:g}*{self.source or 'direction'}",
                 "replace": lambda v: f"={self.source or 'array'}",
                 "resample": lambda v: f"=resample({self.source or 'samples'},seed={v[0]:g})"}[self.op](self.values)
        return f"{self.tensor}[{index}]{value}"

    def largest(self) -> int:
        """The highest neuron number the edit touches (-1 for ``*``)."""
        if self.index is None:
            return -1
        return self.index[1] - 1 if self.is_range else max(self.index)

    def selector(self):
        """The last-axis index to apply to an array: a slice or an int array."""
        if self.index is None:
            return slice(None)
        if self.is_range:
            return slice(*self.index)
        return self.index[0] if len(self.index) == 1 else np.asarray(self.index, dtype=np.intp)

    def apply(self, value: np.ndarray) -> None:
        """Write the edit into ``value`` (which the caller owns).

        Raises:
            InputMismatchError: the edit's array does not fit ``value`` (see the module docstring).
        """
        where = (Ellipsis, self.selector())
        if self.op == "set":
            value[where] = self.values[0]
        elif self.op == "scale":
            value[where] = value[where] * self.values[0]
        elif self.op == "clip":
            value[where] = np.clip(value[where], self.values[0], self.values[1])
        elif self.op == "add":
            value[where] = value[where] + self.values[0] * self._row(value)[where]
        elif self.op == "replace":
            value[where] = self._rows(value)[where]
        else:  # resample
            samples = self.array
            if samples.ndim != value.ndim or samples.shape[1:] != value.shape[1:] or not len(samples):
                raise InputMismatchError(
                    f"{self.spec}: the samples have shape {samples.shape}; the tensor's rows are {value.shape[1:]}")
            drawn = np.random.default_rng(int(self.values[0])).integers(0, len(samples), size=len(value))
            value[where] = samples[drawn][where]

    def _row(self, value: np.ndarray) -> np.ndarray:
        """The edit's array as one row of ``value``: shape ``(width,)`` or ``value.shape[1:]``."""
        a = self.array
        if a.shape not in (value.shape[-1:], value.shape[1:]):
            raise InputMismatchError(
                f"{self.spec}: the array has shape {a.shape}; the tensor {self.tensor!r} has rows of shape "
                f"{value.shape[1:]} ({value.shape[-1]} neurons), so give shape {value.shape[1:]} or ({value.shape[-1]},)")
        return a

    def _rows(self, value: np.ndarray) -> np.ndarray:
        """The edit's array broadcast to ``value``: one row, or as many rows as ``value``."""
        a = self.array
        if a.shape == value.shape or (a.ndim == value.ndim and a.shape[0] == 1 and a.shape[1:] == value.shape[1:]):
            return np.broadcast_to(a, value.shape)
        return np.broadcast_to(self._row(value), value.shape) if a.ndim < value.ndim else self._mismatch(value)

    def _mismatch(self, value: np.ndarray):
        raise InputMismatchError(
            f"{self.spec}: the array has shape {self.array.shape}, which is neither one row of the tensor "
            f"{self.tensor!r} ({value.shape[1:]}) nor its {len(value):,} rows {value.shape}")


def parse_spec(text: str) -> Edit:
    """One edit from the text grammar (see the module docstring).

    Raises:
        InputMismatchError: the text does not follow the grammar, or a number is malformed.
    """
    m = _SPEC.match(text)
    if not m:
        raise InputMismatchError(
            f"override {text!r} does not read as TENSOR[INDEX]=VALUE, TENSOR[INDEX]*=FACTOR or "
            "TENSOR[INDEX]=clip(LO,HI) (INDEX: a neuron number, a comma list, a range a:b, or *)")
    tensor, value = m["tensor"].strip(), m["value"]
    clip = _CLIP.match(value)
    if m["op"] == "*=":
        op, values = "scale", (_number(value, text),)
    elif clip:
        op, values = "clip", (_number(clip["lo"], text), _number(clip["hi"], text))
    else:
        op, values = "set", (_number(value, text),)
    return _edit(tensor, m["index"], op, values, text)


def _number(text: str, spec: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise InputMismatchError(f"override {spec!r}: {text!r} is not a number") from None


def _parse_index(index: object, spec: str) -> tuple[Index, bool]:
    """``(index, is_range)`` from ``17``, ``"3,17"``, ``"0:8"``, ``"*"``, a slice or a list of ints."""
    bad = InputMismatchError(
        f"override {spec!r}: index {index!r} is not a neuron number, a comma list, a range a:b or *")
    if isinstance(index, bool):
        raise bad
    if isinstance(index, (int, np.integer)):
        index = (int(index),)
    elif isinstance(index, slice):
        if index.step not in (None, 1) or index.start is None or index.stop is None:
            raise bad
        index = f"{index.start}:{index.stop}"
    if isinstance(index, (list, tuple)):
        if not index or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in index):
            raise bad
        numbers = tuple(int(i) for i in index)
    elif isinstance(index, str):
        text = index.strip()
        if text == "*":
            return None, False
        try:
            numbers = tuple(int(p) for p in text.split(":" if ":" in text else ","))
        except ValueError:
            raise bad from None
        if ":" in text:
            if len(numbers) != 2 or numbers[0] < 0 or numbers[1] <= numbers[0]:
                raise InputMismatchError(
                    f"override {spec!r}: range {text} is empty or negative; write a:b with 0 <= a < b")
            return numbers, True
    else:
        raise bad
    if min(numbers) < 0:
        raise InputMismatchError(f"override {spec!r}: neuron numbers start at 0, got {min(numbers)}")
    return tuple(dict.fromkeys(numbers)), False


def _edit(tensor: str, index: object, op: str, values: tuple[float, ...], spec: str) -> Edit:
    if not tensor:
        raise InputMismatchError(f"override {spec!r} names no tensor")
    if op == "clip" and not values[0] <= values[1]:
        raise InputMismatchError(f"override {spec!r}: clip({values[0]:g}, {values[1]:g}) needs low <= high")
    if op == "scale" and not math.isfinite(values[0]):
        raise InputMismatchError(f"override {spec!r}: the factor must be finite")
    parsed, is_range = _parse_index(index, spec)
    return Edit(tensor, parsed, is_range, op, tuple(float(v) for v in values))


def _from_value(tensor: str, index: object, value: object) -> Edit:
    """An edit from the mapping form ``{tensor: {index: value}}``."""
    where = f"{tensor}[{index}]"
    if isinstance(value, Mapping) and {"add", "ablate", "patch"} & set(value):
        return _intervention(tensor, index, value, where)
    if isinstance(value, bool):
        raise InputMismatchError(f"override {where!r}: {value!r} is not a number")
    if isinstance(value, (int, float, np.number)):
        return _edit(tensor, index, "set", (float(value),), where)
    if isinstance(value, str):
        return parse_spec(f"{tensor}[{index}]{value if value.lstrip().startswith(('=', '*=')) else '=' + value}")
    if isinstance(value, Mapping) and len(value) == 1:
        (op, arg), = value.items()
        if op in ("set", "scale"):
            if isinstance(arg, bool) or not isinstance(arg, (int, float, np.number)):
                raise InputMismatchError(f"override {where!r}: {op} needs a number, got {arg!r}")
            return _edit(tensor, index, op, (float(arg),), where)
        if op == "clip":
            if (not isinstance(arg, (list, tuple)) or len(arg) != 2
                    or not all(isinstance(a, (int, float, np.number)) and not isinstance(a, bool) for a in arg)):
                raise InputMismatchError(f"override {where!r}: clip needs [low, high], got {arg!r}")
            return _edit(tensor, index, "clip", (float(arg[0]), float(arg[1])), where)
    raise InputMismatchError(
        f"override {where!r}: {value!r} is not a number, {{'set': v}}, {{'scale': f}} or {{'clip': [lo, hi]}}")


#: The keys each array-carrying intervention takes, by its leading key.
_INTERVENTION_KEYS = {"add": {"add", "alpha", "source"}, "patch": {"patch", "source"},
                      "ablate": {"ablate", "mean", "samples", "seed", "source"}}


def _intervention(tensor: str, index: object, value: Mapping, where: str) -> Edit:
    """An edit from ``{"add": v, "alpha": a}``, ``{"ablate": kind, ...}`` or ``{"patch": p}`` (arrays given)."""
    kind = next(k for k in ("add", "ablate", "patch") if k in value)
    extra = set(value) - _INTERVENTION_KEYS[kind]
    if extra:
        raise InputMismatchError(f"override {where!r}: {kind} takes {sorted(_INTERVENTION_KEYS[kind])}, "
                                 f"not {sorted(extra)}")
    source = str(value.get("source", ""))
    if kind == "add":
        return add_direction(tensor, value["add"], value.get("alpha", 1.0), index, source=source)
    if kind == "patch":
        return patch(tensor, value["patch"], index, source=source)
    return ablate(tensor, index, value["ablate"], mean=value.get("mean"), samples=value.get("samples"),
                  seed=value.get("seed", 0), source=source)


def _array(value: object, what: str, where: str, min_ndim: int = 1) -> np.ndarray:
    """``value`` as a finite floating array of at least ``min_ndim`` axes."""
    try:
        a = np.asarray(value)
    except (TypeError, ValueError):
        a = None
    if a is None or a.dtype.kind not in "fiu" or a.ndim < min_ndim:
        raise InputMismatchError(f"override {where!r}: the {what} must be an array of numbers with at least "
                                 f"{min_ndim} ax{'i' if min_ndim == 1 else 'e'}s, got {value!r:.80}")
    if not np.isfinite(a).all():
        raise InputMismatchError(f"override {where!r}: the {what} holds NaN or infinity")
    return a if a.dtype.kind == "f" else a.astype(np.float64)


def add_direction(tensor: str, direction, alpha: float = 1.0, neurons: object = "*", *, source: str = "") -> Edit:
    """Steering along a direction: the tensor's chosen neurons become ``value + alpha * direction``.

    Args:
        tensor: the node output to steer.
        direction: float array, shape ``(width,)`` or the tensor's row shape (``policyport direction``
            writes one: the difference of two recordings' mean activations).
        alpha: the strength (default 1.0); 0 leaves the tensor as it is.
        neurons: the neurons (INDEX as in the text grammar: a number, ``"3,17"``, ``"0:8"``, ``"*"``
            (default) or a list); the direction is read at the same positions.
        source: what the direction is, for the edit's text (a file name).

    Returns:
        An :class:`Edit` of op ``"add"``.

    Raises:
        InputMismatchError: a malformed index, alpha not a finite number, a direction that is not a
            finite array; (when applied) a direction that does not fit the tensor's rows.
    """
    where = f"{tensor}[{neurons}]"
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.number)) or not math.isfinite(alpha):
        raise InputMismatchError(f"override {where!r}: alpha must be a finite number, got {alpha!r}")
    edit = _edit(tensor, neurons, "add", (float(alpha),), where)
    return Edit(edit.tensor, edit.index, edit.is_range, "add", edit.values, _array(direction, "direction", where), source)


#: The ablations :func:`ablate` knows.
ABLATIONS = ("zero", "mean", "resample")


def ablate(tensor: str, neurons: object = "*", kind: str = "zero", *, mean=None, samples=None, seed: int = 0,
           source: str = "") -> Edit:
    """Ablation of neurons: zero-, mean- or resample-ablation (see the module docstring).

    Args:
        tensor: the node output to ablate.
        neurons: the neurons (INDEX as in the text grammar; default ``"*"``, the whole tensor).
        kind: ``"zero"`` (default; the same as setting 0), ``"mean"`` or ``"resample"``.
        mean: for ``"mean"``: float array, one row of the tensor (shape ``(width,)`` or its row shape),
            each neuron's mean over a dataset (``Statistics``' ``mean`` of a recording, for one).
        samples: for ``"resample"``: float array ``(n, *row)``, activations of the tensor on other inputs.
        seed: for ``"resample"``: the seed of the row draws (default 0).
        source: what the array is, for the edit's text.

    Returns:
        An :class:`Edit`: op ``"set"`` (zero), ``"replace"`` (mean) or ``"resample"``.

    Raises:
        InputMismatchError: an unknown kind, a missing or malformed array, a negative seed, a
            malformed index; (when applied) an array that does not fit the tensor.
    """
    where = f"{tensor}[{neurons}]"
    if kind not in ABLATIONS:
        raise InputMismatchError(f"override {where!r}: unknown ablation {kind!r}; choose one of {', '.join(ABLATIONS)}")
    given = {"mean": mean, "samples": samples}
    needed = {"zero": None, "mean": "mean", "resample": "samples"}[kind]
    stray = [k for k, v in given.items() if v is not None and k != needed]
    if stray or (needed is not None and given[needed] is None):
        raise InputMismatchError(f"override {where!r}: {kind}-ablation takes "
                                 f"{'no array' if needed is None else 'the ' + needed + ' array'}"
                                 + (f", not {' or '.join(stray)}" if stray else ", which is missing"))
    if kind == "zero":
        return _edit(tensor, neurons, "set", (0.0,), where)
    if kind == "mean":
        edit = _edit(tensor, neurons, "replace", (), where)
        return Edit(edit.tensor, edit.index, edit.is_range, "replace", (), _array(mean, "mean", where),
                    f"mean({source})" if source else "mean")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputMismatchError(f"override {where!r}: the seed must be a whole number >= 0, got {seed!r}")
    edit = _edit(tensor, neurons, "resample", (float(seed),), where)
    return Edit(edit.tensor, edit.index, edit.is_range, "resample", edit.values,
                _array(samples, "samples", where, min_ndim=2), source)


def patch(tensor: str, activations, neurons: object = "*", *, source: str = "") -> Edit:
    """Activation patching: the chosen neurons take their values from another input's activations.

    Args:
        tensor: the node output to patch.
        activations: float array: the tensor's values on the other input, one row ``(*row)`` or
            ``(1, *row)`` (put into every row) or as many rows as the run ``(rows, *row)``.
        neurons: the neurons (INDEX as in the text grammar; default ``"*"``, the whole tensor).
        source: what the activations are, for the edit's text (``"patch(clean.npy)"``).

    Returns:
        An :class:`Edit` of op ``"replace"``.

    Raises:
        InputMismatchError: a malformed index or array; (when applied) activations that fit neither
            one row nor every row of the run.
    """
    where = f"{tensor}[{neurons}]"
    edit = _edit(tensor, neurons, "replace", (), where)
    return Edit(edit.tensor, edit.index, edit.is_range, "replace", (), _array(activations, "activations", where),
                f"patch({source})" if source else "patch")


def parse_overrides(overrides: object) -> list[Edit]:
    """Edits from any accepted form, in the order given.

    Args:
        overrides: a text spec, an :class:`Edit`, an iterable of those, or a mapping
            ``{tensor: {index: value}}`` (see the module docstring).

    Raises:
        InputMismatchError: a malformed spec, index or value.
    """
    if isinstance(overrides, (str, Edit)):
        overrides = [overrides]
    if isinstance(overrides, Mapping):
        edits = []
        for tensor, neurons in overrides.items():
            if not isinstance(tensor, str) or not isinstance(neurons, Mapping):
                raise InputMismatchError(
                    f"overrides map a tensor name to {{neuron index: value}}; got {tensor!r}: {neurons!r}")
            edits += [_from_value(tensor, index, value) for index, value in neurons.items()]
        return edits
    if isinstance(overrides, Iterable):
        edits = []
        for item in overrides:
            if isinstance(item, Edit):
                edits.append(item)
            elif isinstance(item, str):
                edits.append(parse_spec(item))
            else:
                raise InputMismatchError(f"an override is a text spec or an Edit, got {item!r}")
        return edits
    raise InputMismatchError(f"overrides must be a mapping, a text spec or a list of specs; got {type(overrides).__name__}")


def load_override_sets(path) -> dict[str, list[Edit]]:
    """Named override sets from a JSON file: ``{"brake": {"fc_2/tanh": {"17": 1.0}}, ...}``.

    A set's value is the mapping form or a list of text specs.

    Raises:
        UnreadableFileError: the file is missing or not JSON.
        InputMismatchError: the JSON is not an object of sets, or a set is malformed.
    """
    from ..io.kinds import read_json

    doc = read_json(path)
    if not isinstance(doc, dict) or not doc:
        raise InputMismatchError(f"{path} must hold a JSON object of named override sets, e.g. "
                                 '{"brake": {"fc_2/tanh": {"17": 1.0}}}')
    sets = {}
    for name, overrides in doc.items():
        try:
            sets[name] = parse_overrides(overrides)
        except InputMismatchError as e:
            raise InputMismatchError(f"{path}, set {name!r}: {e}") from e
    return sets


class Steering:
    """Edits grouped by tensor, in the graph's node order: what a backend applies.

    Args:
        edits: the edits, in the order given.
        tensor_names: the model's node outputs in node order (what can be overridden).

    Raises:
        InputMismatchError: an edit names a tensor that is not a node output of the model.
    """

    def __init__(self, edits: Iterable[Edit], tensor_names: list[str]):
        by_tensor: dict[str, list[Edit]] = {}
        for e in edits:
            by_tensor.setdefault(e.tensor, []).append(e)
        known = set(tensor_names)
        unknown = [t for t in by_tensor if t not in known]
        if unknown:
            raise InputMismatchError(
                f"override(s) name [{listing(unknown)}], which no node of the model produces; it has: "
                f"{listing(tensor_names, show=str)}")
        #: The overridden tensors, in node order.
        self.tensors: tuple[str, ...] = tuple(t for t in tensor_names if t in by_tensor)
        self.edits: dict[str, tuple[Edit, ...]] = {t: tuple(by_tensor[t]) for t in self.tensors}

    @property
    def specs(self) -> list[str]:
        """Every edit in the text grammar, tensor by tensor in node order."""
        return [e.spec for t in self.tensors for e in self.edits[t]]

    def __repr__(self) -> str:
        return f"Steering({', '.join(self.specs)})"

    def appliers(self, writable: Callable[[str], bool]) -> tuple[Callable[[np.ndarray], np.ndarray], ...]:
        """One function per overridden tensor (in :attr:`tensors` order): value -> steered value.

        Args:
            writable: tensor name -> whether its value is memory the run owns (written in place);
                otherwise the value is copied first, so feeds, weights and other tensors that may
                share its memory are never written.
        """
        return tuple(_applier(t, self.edits[t], writable(t)) for t in self.tensors)


def _applier(tensor: str, edits: tuple[Edit, ...], owned: bool) -> Callable[[np.ndarray], np.ndarray]:
    largest = max(e.largest() for e in edits)

    def apply(value):
        if type(value) is not np.ndarray or value.ndim == 0:
            raise InputMismatchError(
                f"tensor {tensor!r} is a scalar here; overrides address neurons on a tensor's last axis")
        width = value.shape[-1]
        if largest >= width:
            bad = next(e for e in edits if e.largest() >= width)
            raise InputMismatchError(
                f"override {bad.spec}: tensor {tensor!r} has {width} neurons on its last axis (0 to {width - 1})")
        if not owned or not value.flags.writeable:
            value = value.copy()
        for e in edits:
            e.apply(value)
        return value

    return apply
