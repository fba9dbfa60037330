"""ONNX's floating-point semantics on numpy: NaN and infinities propagate silently.

numpy warns (``RuntimeWarning: invalid value encountered in dot``) where IEEE 754 arithmetic
produces a NaN or an infinity; ONNX, like onnxruntime, computes the value and says nothing. The
numpy backend therefore runs with numpy's floating-point warnings off, unless the caller set
numpy's error handling itself (``np.errstate(all="raise")`` in a test, to catch an op that
overflows on valid input): the caller's setting is kept, and the threads that share a batch's
row blocks run under it too (:mod:`.rows` runs them in a copy of the caller's context).

numpy 2 keeps its error state in a context variable, which :func:`quiet` sets for the length of a
call (a fraction of a microsecond, so the batch-1 path stays fast); on numpy 1 it falls back to
``np.errstate``.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Callable

import numpy as np

#: What the backend runs under when the caller left numpy's defaults.
SILENT = {"divide": "ignore", "over": "ignore", "under": "ignore", "invalid": "ignore"}
#: numpy's own defaults (``np.geterr()`` of a fresh process).
NUMPY_DEFAULTS = {"divide": "warn", "over": "warn", "under": "ignore", "invalid": "warn"}

try:  # numpy >= 2: the error state is this context variable's value
    from numpy._core._ufunc_config import _extobj_contextvar as _STATE
except ImportError:  # numpy 1
    _STATE = None


def _silent_state():
    with np.errstate(**SILENT):
        return _STATE.get()


if _STATE is not None:  # read in an empty context: whatever the importing code had set
    _DEFAULT = contextvars.Context().run(_STATE.get)
    _SILENT = contextvars.Context().run(_silent_state)


def quiet(fn: Callable) -> Callable:
    """``fn`` run with numpy's floating-point warnings off when the caller left numpy's defaults."""
    if _STATE is None:
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if np.geterr() != NUMPY_DEFAULTS:
                return fn(*args, **kwargs)
            with np.errstate(**SILENT):
                return fn(*args, **kwargs)

        return call

    get, set_, reset = _STATE.get, _STATE.set, _STATE.reset

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if get() is not _DEFAULT:
            return fn(*args, **kwargs)
        token = set_(_SILENT)
        try:
            return fn(*args, **kwargs)
        finally:
            reset(token)

    return call

