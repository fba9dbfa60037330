"""The BLAS's own threads, limited through threadpoolctl while the numpy backend runs row blocks.

The numpy backend runs a large batch as row blocks on several threads (see
:mod:`policyport.runtime.numpy.rows`); each block's matrix products must then run on the calling
thread alone, or every block's BLAS call would start a thread per core of its own. threadpoolctl
(the ``threads`` extra, part of ``cli``) finds the BLAS that numpy loaded (OpenBLAS, MKL, BLIS) and
sets its thread count. Without it, or without a BLAS it can control, :func:`one_thread` returns
None and the row blocks run on one thread.

This module is not part of a packed folder's runtime, which stays numpy and the standard library.
"""

from __future__ import annotations

import os
import threading


class OneThread:
    """A re-entrant, process-wide "the BLAS runs on one thread" context manager.

    The BLAS's thread count is a process-wide setting: the first caller to enter sets it to 1 and
    the last one to leave restores what it was, so calls that overlap from several threads of the
    user's program never restore it under each other's feet.
    """

    def __init__(self, controller):
        self._controller = controller
        self._lock = threading.Lock()
        self._depth = 0
        self._limiter = None

    def __enter__(self) -> OneThread:
        with self._lock:
            if self._depth == 0:
                self._limiter = self._controller.limit(limits=1)
            self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self._limiter.restore_original_limits()
                self._limiter = None

    def describe(self) -> list[dict]:
        """threadpoolctl's description of each BLAS it controls (library, version, kernel, threads)."""
        return [dict(lib.info()) for lib in self._controller.lib_controllers]


    def _forget(self) -> None:
        """In a forked child: no call of the parent's is running there."""
        self._lock = threading.Lock()
        self._depth = 0
        self._limiter = None


_ONE_THREAD: OneThread | None = None
_LOOKED = False
_LOOK_LOCK = threading.Lock()


def one_thread() -> OneThread | None:
    """The shared :class:`OneThread` of the BLAS numpy uses; None without threadpoolctl or without
    a BLAS it controls (the caller then runs its blocks on one thread)."""
    global _ONE_THREAD, _LOOKED
    if not _LOOKED:
        with _LOOK_LOCK:
            if not _LOOKED:
                try:
                    import numpy  # noqa: F401  (its BLAS must be loaded before threadpoolctl looks)
                    from threadpoolctl import ThreadpoolController
                except ImportError:
                    controller = None
                else:
                    controller = ThreadpoolController().select(user_api="blas")
                    controller = controller if controller.lib_controllers else None
                _ONE_THREAD = None if controller is None else OneThread(controller)
                if _ONE_THREAD is not None and hasattr(os, "register_at_fork"):
                    os.register_at_fork(after_in_child=_ONE_THREAD._forget)
                _LOOKED = True
    return _ONE_THREAD
