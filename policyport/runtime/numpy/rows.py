"""Large batches in row blocks, on every core.

A graph whose every node computes each row of its output from the same row of its batched inputs
(a Gemm with constant weights, activations, a Slice along a feature axis ...; see
:meth:`Plan._row_split <policyport.runtime.numpy.plan.Plan>`) gives the same rows whether it runs
on a whole batch or on its rows in pieces. From :data:`SPLIT_ROWS` rows on, the plan's ``run``,
``record`` and override variants run such a graph in blocks of at most :data:`BLOCK_ROWS` rows:
each block's activations stay in the core's cache between one node and the next (a bias added
and a tanh taken on memory just written), and the blocks are shared among threads, since numpy's
ufuncs and the BLAS release the GIL. Each block's result is copied into the batch's result arrays
by the thread that made it, while it is still in cache.

The blocks depend on the batch's row count alone, never on the thread count, and every block's BLAS
call runs on its thread alone (threadpoolctl, :mod:`policyport.runtime.blas`): a batch gives the
same bits on 1 thread or 16, on any machine's core count. Without threadpoolctl the blocks run on
the calling thread, one after another, with the BLAS's own threads.
"""

from __future__ import annotations

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
_POOL_LOCK = threading.Lock()


def _pool(workers: int):
    """The shared worker threads (created on first use, grown when more are asked for)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers < workers:
            from concurrent.futures import ThreadPoolExecutor

            old, _POOL = _POOL, ThreadPoolExecutor(max_workers=workers, thread_name_prefix="policyport-rows")
            if old is not None:
                old.shutdown(wait=False)
        return _POOL


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

    Args:
        compile_block: makes the function that computes one block (the plan's code for the mode,
            without the jump to this driver); called on first use.
        batched: the feed names whose axis 0 is the batch axis (sliced); other feeds go to every
            block whole.
        whole_tensors: names of the results that are the same for every block (computed from
            constants only): taken from the first block.
        threads: a callable returning the plan's thread setting (0 = one per usable core).
    """

    def __init__(self, compile_block: Callable[[], Callable], batched: tuple[str, ...], whole_tensors: frozenset[str],
                 threads: Callable[[], int]):
        self._compile_block = compile_block
        self._block: Callable | None = None
        self.batched = batched
        self.whole_tensors = whole_tensors
        self._threads = threads

    def __call__(self, feeds, *extra) -> dict[str, np.ndarray]:
        block = self._block
        if block is None:
            block = self._block = self._compile_block()
        counts = {feeds[n].shape[0] for n in self.batched}
        if len(counts) != 1:  # batched inputs of different lengths (free dims of different names)
            return block(feeds, *extra)
        rows = counts.pop()
        bounds = blocks(rows)
        limit = _blas_one_thread()
        threads = min(self._threads() or usable_cores(), len(bounds)) if limit is not None else 1
        full: list[dict[str, np.ndarray]] = []  # the batch's results, made by the first block to finish
        lock = threading.Lock()
        claim = itertools.count()
        failed: list[BaseException] = []

        def work() -> None:
            while not failed:
                i = next(claim)  # itertools.count is atomic under the GIL
                if i >= len(bounds):
                    return
                lo, hi = bounds[i]
                try:
                    part = {n: (v[lo:hi] if n in self.batched else v) for n, v in feeds.items()}
                    value = block(part, *extra)
                    if not full:
                        with lock:
                            if not full:
                                full.append({name: v if name in self.whole_tensors else np.empty((rows, *v.shape[1:]), v.dtype)
                                             for name, v in value.items()})
                    results = full[0]
                    for name, v in value.items():
                        if name not in self.whole_tensors:
                            results[name][lo:hi] = v
                except BaseException as e:  # re-raised by the calling thread
                    failed.append(e)
                    return

        if limit is None:
            work()
        else:
            with limit:  # also on one thread: the BLAS's own threads could sum a long row in other pieces
                helpers = [_pool(threads - 1).submit(work) for _ in range(threads - 1)]
                work()
                for h in helpers:
                    h.result()
        if failed:
            raise failed[0]
        return full[0]
