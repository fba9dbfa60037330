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
is in cache). The intermediates a block does not return (a Gemm's product that a Tanh overwrites,
a ReLU's zeros) live in its thread's :class:`Scratch` buffers, kept from one block and call to the
next: allocated afresh, each would cost a page fault per 4 KiB whenever the C library has given
the memory back.

The blocks depend on the batch's row count alone, never on the thread count, and every block's BLAS
call runs on its thread alone (threadpoolctl, :mod:`policyport.runtime.blas`): a batch gives the
same bits on 1 thread or 16, on any machine's core count. Without threadpoolctl the blocks run on
the calling thread, one after another, with the BLAS's own threads.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import os
import threading
import weakref
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


#: What a thread running row blocks takes beyond its blocks' arrays: its stack, its BLAS's packing
#: buffers for a block's products. Measured (``ru_maxrss``, MLPs of 64 and 256 units): under 1 MiB.
WORKER_BYTES = 1 << 20
#: What one block's ``(start, stop)`` takes as Python objects (a tuple of two ints, and its place in
#: the list of :func:`blocks`), held while the batch runs: 120 bytes on 64-bit CPython.
BOUNDS_BYTES = 128


def workers(threads: int, count: int) -> int:
    """How many threads run ``count`` row blocks for a plan set to ``threads`` threads (0: one per
    usable core): no more than there are blocks, and one without a BLAS limiter (see
    :func:`_blas_one_thread`)."""
    return min(threads or usable_cores(), count) if _blas_one_thread() is not None else 1


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


#: The most bytes one scratch buffer keeps between calls; a larger one is allocated per block.
SCRATCH_BYTES = 4 << 20


class Scratch:
    """One thread's block buffers, kept between blocks and calls, one per compiled step.

    A 512-row block of a 256-wide float32 layer is 512 KiB. Allocating it for every block costs
    a page fault per 4 KiB whenever the C library has returned the memory to the system (measured:
    4,864 faults and some 10 ms per 4096-row call of a three-layer 256-wide ReLU MLP, as long as
    its BLAS calls). Every buffer holds :data:`BLOCK_ROWS` rows (or the block's, if more) and is
    handed out as a view of its first rows; one larger than :data:`SCRATCH_BYTES` is not kept.
    """

    __slots__ = ("_buffers", "_zeros")

    def __init__(self):
        self._buffers: dict[int, np.ndarray] = {}
        self._zeros: dict[tuple, np.ndarray] = {}

    @staticmethod
    def _fits(buffer: np.ndarray | None, rows: int, row_shape: tuple, dtype) -> bool:
        return buffer is not None and buffer.shape[0] >= rows and buffer.shape[1:] == row_shape and buffer.dtype == dtype

    def _take(self, store: dict, key, rows: int, row_shape: tuple, dtype, fill: bool) -> np.ndarray:
        buffer = store.get(key)
        if not self._fits(buffer, rows, row_shape, dtype):
            size = max(rows, BLOCK_ROWS)
            if size * int(np.prod(row_shape)) * np.dtype(dtype).itemsize > SCRATCH_BYTES:
                return (np.zeros if fill else np.empty)((rows, *row_shape), dtype)
            buffer = store[key] = (np.zeros if fill else np.empty)((size, *row_shape), dtype)
        return buffer[:rows]

    def product(self, step: int, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
        """The buffer for ``a @ b`` of 2-D ``a`` (block rows, K) and ``b`` (K, N) of one dtype
        (step ``step``'s), or None for ``np.dot`` to allocate (operands of two dtypes)."""
        if a.dtype != b.dtype or a.ndim != 2 or b.ndim != 2:
            return None
        return self._take(self._buffers, step, a.shape[0], (b.shape[1],), a.dtype, False)

    def like(self, step: int, a: np.ndarray) -> np.ndarray:
        """A buffer of ``a``'s shape and dtype for step ``step``'s result."""
        return self._take(self._buffers, step, a.shape[0], a.shape[1:], a.dtype, False)

    def zeros(self, a: np.ndarray) -> np.ndarray:
        """Zeros of ``a``'s shape and dtype, never written: ``np.maximum(a, zeros)`` over two
        contiguous arrays runs 3.6 times as fast as against a broadcast 0 (numpy 2.4, AVX-512)."""
        return self._take(self._zeros, (a.shape[1:], a.dtype.str), a.shape[0], a.shape[1:], a.dtype, True)


class ResultPool:
    """Result arrays handed out again once their holder has given them back.

    A 4096-row record of the MetaDrive expert returns 17 MB of fresh arrays; numpy takes arrays
    that large from the system, which hands out zeroed pages, each faulted in on first write
    (several ms of kernel time per batch). A caller that streams the results away (a recording
    written block by block) keeps a pool, runs ``record`` inside :func:`reusing`, and gives each
    batch's arrays back once written: the next batches take them again.

    Thread-safe; arrays are matched by shape and dtype. The pool takes back only arrays it handed
    out (others, such as onnxruntime's results, are left to the garbage collector), so it never
    holds more than were in use at once. Give back only arrays that nothing else references any
    more: they will be overwritten.
    """

    def __init__(self):
        self._free: dict[tuple, list[np.ndarray]] = {}
        self._out = weakref.WeakValueDictionary()  # id -> each array handed out, while it lives
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """A free array of ``shape`` and ``dtype`` (contents undefined), or a new one."""
        key = (tuple(shape), np.dtype(dtype).str)
        with self._lock:
            free = self._free.get(key)
            a = free.pop() if free else None
        if a is None:
            a = np.empty(shape, dtype)
        with self._lock:
            self._out[id(a)] = a
        return a

    def give_back(self, arrays) -> None:
        """Return arrays (the values of a result dict) for later ``take`` calls; arrays the pool did
        not hand out are ignored."""
        with self._lock:
            for a in arrays:
                if self._out.get(id(a)) is a:
                    del self._out[id(a)]
                    self._free.setdefault((a.shape, a.dtype.str), []).append(a)


_RESULTS: contextvars.ContextVar[ResultPool | None] = contextvars.ContextVar("policyport_results", default=None)


@contextlib.contextmanager
def reusing(pool: ResultPool):
    """Within the block, row-block runs in this context take their result arrays from ``pool``."""
    token = _RESULTS.set(pool)
    try:
        yield pool
    finally:
        _RESULTS.reset(token)


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
            (``feeds, out, scratch[, edits]``, ``scratch`` the thread's :class:`Scratch`; see
            ``Plan._compile``); called on first use.
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
        self._local = threading.local()  # each thread's Scratch

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
        pool = _RESULTS.get()
        empty = np.empty if pool is None else pool.take
        results = {n: (np.array(whole[n]) if shape is None else empty((rows, *shape), dtype)) for n, shape, dtype in layout}
        outs = [results[n] for n in self.names]
        bounds = blocks(rows)
        limit = _blas_one_thread()
        threads = workers(self._threads(), len(bounds))
        claim = itertools.count()
        failed: list[BaseException] = []

        local = self._local

        def work() -> None:
            scratch = getattr(local, "scratch", None)
            if scratch is None:
                scratch = local.scratch = Scratch()
            while not failed:
                i = next(claim)  # itertools.count is atomic under the GIL
                if i >= len(bounds):
                    return
                lo, hi = bounds[i]
                try:
                    into({n: (v[lo:hi] if n in self.batched else v) for n, v in feeds.items()},
                         [o[lo:hi] for o in outs], scratch, *extra)
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
