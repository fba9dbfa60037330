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
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
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
        op: ``"set"``, ``"scale"`` or ``"clip"``.
        values: ``(value,)``, ``(factor,)`` or ``(low, high)``.
    """

    tensor: str
    index: Index
    is_range: bool
    op: str
    values: tuple[float, ...]

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
                 "clip": lambda v: f"=clip({v[0]:g},{v[1]:g})"}[self.op](self.values)
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
        """Write the edit into ``value`` (which the caller owns)."""
        where = (Ellipsis, self.selector())
        if self.op == "set":
            value[where] = self.values[0]
        elif self.op == "scale":
            value[where] = value[where] * self.values[0]
        else:
            value[where] = np.clip(value[where], self.values[0], self.values[1])


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
