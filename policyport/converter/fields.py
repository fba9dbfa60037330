"""Values read from a source file's fields, checked before they are used.

A policy file records its numbers as whatever its writer wrote: JSON (an SB3 zip's ``data``), a pickle
(a VecNormalize save, an RLlib filter), MessagePack (RLlib's new stack). A damaged or hand-edited
file can hold text, ``None``, a list, a bool, NaN or an integer beyond any array where a number is
expected; Python's ``int()`` and ``float()`` and numpy's ``asarray`` then fail with a ``ValueError``,
``TypeError`` or ``OverflowError`` that names neither the file nor the field. Each function here
returns the value in the form the converter uses, or raises :class:`~policyport.errors.BadModelError`
naming ``what`` (the file and the field: ``"ppo.zip: the zip's action_space.n"``), what was expected
and what was found.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from ..errors import BadModelError


def shown(value: Any) -> str:
    """``value`` for a message: its repr (a numpy scalar's as the Python number's), cut to 60 characters."""
    text = repr(value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def whole_number(value: Any, what: str, minimum: int | None = 0, *, text: bool = False) -> int:
    """``value`` as an ``int``: a Python or numpy integer, or a float with no fraction (as JSON and
    ``str(array)`` write them).

    Args:
        value: the value read.
        what: the file and field, for the message.
        minimum: the least value accepted (``None``: any).
        text: also read a string of decimal digits (``"5"``: SB3 writes a numpy integer as its ``str()``).

    Raises:
        BadModelError: a bool, text (unless ``text`` and digits), ``None``, a container, a fraction,
            NaN or infinity, or less than ``minimum``.
    """
    number = None
    if text and isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]{1,30}\s*", value):
        number = int(value)
    elif isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        number = int(value)
    elif isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        number = int(value)
    if number is None:
        raise BadModelError(f"{what} is {shown(value)}, not a whole number")
    if minimum is not None and number < minimum:
        raise BadModelError(f"{what} is {number}; it must be at least {minimum}")
    return number


def real_number(value: Any, what: str, *, finite: bool = True) -> float:
    """``value`` as a ``float``: a Python or numpy integer or float (or a 0-d/one-element numeric array).

    Args:
        value: the value read.
        what: the file and field, for the message.
        finite: refuse NaN and infinity.

    Raises:
        BadModelError: a bool, text, ``None``, a container, NaN or infinity (when ``finite``), or an
            integer too large for a float.
    """
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "iuf":
        value = value.reshape(()).item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise BadModelError(f"{what} is {shown(value)}, not a number")
    try:
        number = float(value)
    except OverflowError:
        raise BadModelError(f"{what} is {shown(value)}, too large for a number policyport computes with") from None
    if finite and not math.isfinite(number):
        raise BadModelError(f"{what} is {number}; it must be a finite number")
    return number


def number_array(value: Any, what: str, *, nan: bool = False) -> np.ndarray:
    """``value`` (a numeric array, a number or a nested list of numbers) as a float64 array.

    Args:
        value: the value read.
        what: the file and field, for the message.
        nan: accept NaN elements (infinities are always accepted: a bound may be unbounded).

    Raises:
        BadModelError: text, ``None``, bools, ragged lists, an array of another dtype kind (strings,
            objects, complex numbers), NaN (unless ``nan``), or numbers too large for float64.
    """
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iuf":
            held = {"U": "text", "S": "bytes", "O": "Python objects", "c": "complex numbers", "b": "bools"}.get(
                value.dtype.kind, "values")
            raise BadModelError(f"{what} is an array of {held} ({value.dtype}), not of real numbers")
        array = value.astype(np.float64)
    else:
        if not _numbers_only(value):
            raise BadModelError(f"{what} is {shown(value)}, not numbers")
        try:
            array = np.asarray(value, dtype=np.float64)
        except (ValueError, TypeError, OverflowError):  # ragged lists, integers beyond float64
            raise BadModelError(f"{what} is {shown(value)}, not an array of numbers") from None
    if not nan and np.isnan(array).any():
        raise BadModelError(f"{what} holds NaN")
    return array


def _numbers_only(value: Any) -> bool:
    """Whether ``value`` is a number or (nested) lists/tuples of numbers only, checked without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, float, np.integer, np.floating)):
            return False
    return True


def shape(value: Any, what: str) -> tuple[int, ...]:
    """``value`` (a list, tuple or 1-d integer array of dimensions) as a tuple of non-negative ints.

    Raises:
        BadModelError: not a sequence, or a dimension that is not a whole number ≥ 0.
    """
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise BadModelError(f"{what} is {shown(value)}, not a list of dimensions")
    return tuple(whole_number(d, f"{what}[{i}]") for i, d in enumerate(value))
