"""Large batches in row blocks, on every core.

A graph whose every node computes each row of its output from the same row of its batched inputs
(a Gemm with constant weights, activations, a Slice along a feature axis ...; see
:class:`policyport.runtime.numpy.plan._RowTracker`) gives the same rows whether it runs
on a whole batch or on its rows in pieces. From :data:`SPLIT_ROWS` rows on, the plan's ``run``,
``record`` and override variants run such a graph in blocks of at most :data:`BLOCK_ROWS` rows:
each block's activations stay in the core's cache between one node and the next (a bias added
and a tanh taken on memory just written), and the blocks are shared among threads, since numpy's
ufuncs and the BLAS release the GIL. Each block writes its rows straight into the batch's result
arrays (a Gemm's product and an activation's ufunc into them, any other op's result copied while it
is in cache).

The blocks depend on the batch's row count alone, never on the thread count, and every block's BLAS
call runs on its thread alone (threadpoolctl, :mod:`policyport.runtime.blas`): a batch gives the
same bits on 1 thread or 16, on any machine's core count. Without threadpoolctl the blocks run on
the calling thread, one after another, with the BLAS's own threads.
"""

from __future__ import annotations

import contextvars
import itertools
import os
import threading
from typing import Callable

import numpy as np

#: A batch of at least this many rows runs in blocks; smaller ones run whole, as one call each.
SPLIT_ROWS = 1024
#: The most rows in a block: 512 rows of 256 float32 activations are 512 KiB, which stay in a
#: core's L2 cache from one node to the next; a BLAS call of 512 rows runs at full speed.
BLOCK_ROWS = 512


def blocks(rows: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each block of a batch of ``rows`` rows: as few blocks of at most
    :data:`BLOCK_ROWS` rows as can hold them, of sizes differing by at most one row."""
    count = -(-rows // BLOCK_ROWS)
    size, extra = divmod(rows, count)
    bounds, start = [], 0
    for i in range(count):
        stop = start + size + (i < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


_POOL = None
_POOL_SIZE = 0
_POOL_LOCK = threading.Lock()


def _pool(workers: int):
    """The shared worker threads: created on first use, grown when more are asked for."""
    global _POOL, _POOL_SIZE
    with _POOL_LOCK:
        if _POOL is None or _POOL_SIZE < workers:
            from concurrent.futures import ThreadPoolExecutor

            old = _POOL
            _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="policyport-rows")
            _POOL_SIZE = workers
            if old is not None:
                old.shutdown(wait=False)
        return _POOL


def _forget_pool() -> None:
    """In a forked child: the parent's pool has no threads there (it would wait forever), and its
    lock may have been held by a thread that does not exist there."""
    global _POOL, _POOL_SIZE, _POOL_LOCK
    _POOL, _POOL_SIZE, _POOL_LOCK = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _blas_one_thread():
    """The BLAS one-thread limiter, or None where threadpoolctl (or the module that uses it, left
    out of a packed folder's runtime) is missing."""
    try:
        from ..blas import one_thread
    except ImportError:
        return None
    return one_thread()


class RowBlocks:
    """Runs one compiled function of a plan over the row blocks of a large batch.

    The first call for feeds of a given row shape runs the plan on two rows to learn each
    result's dtype and row shape (kept per row shape); then every call allocates the batch's
    result arrays and the blocks, on as many threads as there are blocks or ``threads()`` allows,
    write their rows straight into them.

    Args:
        compile_probe: makes the function of the mode (``feeds[, edits] -> dict``) without the jump
            to this driver; called on first use.
        compile_into: makes the same function writing the tensors ``names`` into given arrays
            (``feeds, out[, edits]``; see ``Plan._compile``); called on first use.
        names: the batched tensors the mode returns (every other one is the same for every block
            and is taken from the probe, copied).
        batched: the feed names whose axis 0 is the batch axis (sliced); other feeds go to every
            block whole.
        threads: a callable returning the plan's thread setting (0 = one per usable core).
    """

    def __init__(self, compile_probe: Callable[[], Callable], compile_into: Callable[[], Callable], names: list[str],
                 batched: tuple[str, ...], threads: Callable[[], int]):
        self._compile_probe, self._compile_into = compile_probe, compile_into
        self._probe: Callable | None = None
        self._into: Callable | None = None
        self.names = names
        self.batched = batched
        self._threads = threads
        self._layouts: dict[tuple, tuple[list, dict]] = {}  # feed row shapes -> result layout, whole tensors

    def _layout(self, feeds, extra) -> tuple[list, dict]:
        """Each returned tensor in order, ``(name, row shape, dtype)`` (row shape None for a tensor
        that is the same for every block), and those tensors' values."""
        key = tuple((n, v.shape[1:] if n in self.batched else v.shape, v.dtype.str) for n, v in feeds.items())
        found = self._layouts.get(key)
        if found is None:
            if self._probe is None:
                self._probe = self._compile_probe()
            sample = self._probe({n: (v[:2] if n in self.batched else v) for n, v in feeds.items()}, *extra)
            wanted = set(self.names)
            layout = [(n, v.shape[1:] if n in wanted else None, v.dtype) for n, v in sample.items()]
            found = (layout, {n: v for n, v in sample.items() if n not in wanted})
            if len(self._layouts) < 16:
                self._layouts[key] = found
        return found

    def __call__(self, feeds, *extra) -> dict[str, np.ndarray]:
        counts = {feeds[n].shape[0] for n in self.batched}
        if len(counts) != 1:  # batched inputs of different lengths (free dims of different names)
            if self._probe is None:
                self._probe = self._compile_probe()
            return self._probe(feeds, *extra)
        rows = counts.pop()
        layout, whole = self._layout(feeds, extra)
        if self._into is None:
            self._into = self._compile_into()
        into = self._into
        results = {n: (np.array(whole[n]) if shape is None else np.empty((rows, *shape), dtype))
                   for n, shape, dtype in layout}
        outs = [results[n] for n in self.names]
        bounds = blocks(rows)
        limit = _blas_one_thread()
        threads = min(self._threads() or usable_cores(), len(bounds)) if limit is not None else 1
        claim = itertools.count()
        failed: list[BaseException] = []

        def work() -> None:
            while not failed:
                i = next(claim)  # itertools.count is atomic under the GIL
                if i >= len(bounds):
                    return
                lo, hi = bounds[i]
                try:
                    into({n: (v[lo:hi] if n in self.batched else v) for n, v in feeds.items()},
                         [o[lo:hi] for o in outs], *extra)
                except BaseException as e:  # re-raised by the calling thread
                    failed.append(e)
                    return

        if limit is None:
            work()
        else:
            with limit:  # also on one thread: the BLAS's own threads could sum a long row in other pieces
                # each in a copy of the caller's context: numpy's error state (see .floating) is in it
                helpers = [_pool(threads - 1).submit(contextvars.copy_context().run, work) for _ in range(threads - 1)]
                work()
                for h in helpers:
                    h.result()
        if failed:
            raise failed[0]
        return results
