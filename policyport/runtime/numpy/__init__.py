"""policyport's own ONNX interpreter in pure numpy: an op registry and a compiled execution plan."""

from __future__ import annotations

import functools
from typing import Callable, Mapping

import numpy as np

from ...graph.model import Graph
from ..base import Backend, TensorSizes
from ..overrides import Steering
from . import ops  # noqa: F401  (each op module registers its ops as it is imported)
from .floating import quiet
from .plan import NEW_MEMORY, Plan
from .registry import op, resolve, supported_ops
from .rows import BOUNDS_BYTES, SPLIT_ROWS, WORKER_BYTES, blocks, usable_cores, workers

__all__ = ["NumpyBackend", "Plan", "op", "resolve", "supported_ops"]

#: What the BLAS keeps for a whole batch's matrix products beyond the panels it packs (below).
BLAS_BUFFER_BYTES = 4 << 20
#: The most a BLAS thread packs of a product's operands at once: OpenBLAS's buffer per thread
#: (``BUFFER_SIZE``, 32 MiB on x86-64). A whole batch's products run on one BLAS thread per core.
BLAS_THREAD_BYTES = 32 << 20
#: How much of each row of a product's left operand the BLAS packs, in elements: the rows of its
#: share, a block of their K columns at a time (OpenBLAS: 384 to 448). Measured (peak resident set of
#: ``np.dot`` on two threads, OpenBLAS 0.3.31 Haswell kernel): 1,800 bytes a float32 row and 3,100 a
#: float64 row of K = 1,024 to 16,384, up to 64 MiB in all; a row of K under the block is packed whole.
BLAS_PANEL = 512
#: Ops whose numpy code computes the result in one call, or returns a view, with no temporary array
#: of its size.
_NO_TEMPORARIES = frozenset({
    "Relu", "Tanh", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Not",
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Greater", "Less", "And", "Or", "Where", "Cast",
    "ArgMax", "ArgMin", "Softplus", "Hardmax", "BatchNormalization",
    "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Transpose", "Split",
    "Expand", "Tile", "Concat", "Gather", "Constant", "ConstantOfShape", "Shape", "Size",
})
#: How many arrays the size of the largest tensor it reads or writes an op's numpy code holds while
#: it runs, beyond its inputs and outputs, for the ops that hold other than one. Measured (the peak
#: resident set of the op's registered function on float32 arrays of 16 MB, which the C library
#: takes from its heap, and of 64 MB, which it maps apart; the larger figure): a sigmoid's
#: exp(-|x|), 1 + e, two ratios and a mask; Erf and Gelu evaluated in float64; a mask (a quarter of
#: a float32 array) and one more array where a leaky activation picks a branch. Any other op not in
#: :data:`_NO_TEMPORARIES` is taken to hold one (Softmax, Clip, HardSwish ...).
#: Ops whose numpy code returns a contiguous array when its input is one (the same array, or a view of it).
_CONTIGUOUS_VIEWS = frozenset({"Identity", "Dropout", "Reshape", "Flatten", "Squeeze", "Unsqueeze"})
_TEMPORARIES = {
    "Sigmoid": 4.0, "Erf": 4.25, "Gelu": 7.25, "LayerNormalization": 2.0, "LeakyRelu": 1.25, "PRelu": 1.25,
    "Elu": 1.25, "Selu": 1.25, "Celu": 1.25, "ThresholdedRelu": 0.25, "Dropout": 0.25,
}


class NumpyBackend(Backend):
    """Runs a graph with numpy alone (no onnx, protobuf or onnxruntime needed at run time).

    Args:
        graph: the graph; compiled once here.
        seed: seed of the random ops' generator (see :class:`Plan`); None draws fresh entropy.
        threads: threads that share the row blocks of a large batch (see
            :mod:`~policyport.runtime.numpy.rows`); 0 (default) one per usable core, 1 the calling
            thread alone. Results are the same bits whatever the number.

    Raises:
        UnsupportedOpError: ops without an implementation at the graph's opset (all of them named).
    """

    name = "numpy"

    def __init__(self, graph: Graph, seed: int | None = None, threads: int = 0):
        self.graph = graph
        self.seed = seed
        self.threads = threads
        self.plan = Plan(graph, seed=seed, threads=threads)
        self.inputs = list(graph.inputs)
        self.optional_inputs = list(graph.optional_inputs)
        self.outputs = list(graph.outputs)
        self.tensor_names = list(self.plan.tensor_names)
        self._out_names = tuple(self.plan.output_names)
        self._optional = frozenset(v.name for v in graph.optional_inputs)
        self._plans = {frozenset(): self.plan}
        self._steered: dict[tuple, Callable] = {}  # (mode, overridden tensors[, optional inputs fed]) -> function
        self._writable = functools.lru_cache(maxsize=None)(self.plan.writable)
        if not self._optional:  # the generated function itself, under ONNX's floating-point semantics
            self.run = quiet(self.plan.run)

    def _plan_for(self, feeds: Mapping[str, np.ndarray]) -> Plan:
        """The plan that reads the optional inputs present in ``feeds`` (compiled once per set);
        the plan with every initializer constant when none is fed."""
        if not self._optional:
            return self.plan
        fed = self._optional.intersection(feeds)
        plan = self._plans.get(fed)
        if plan is None:
            plan = self._plans[fed] = Plan(self.graph, fed, seed=self.seed, threads=self.threads)
        return plan

    def memory_needed(self, sizes: TensorSizes, rows: int, names: list[str] | None) -> int:
        """The most bytes a run (``names=None``) or a record of ``names`` holds at once, beyond its
        feeds, as the plan runs it (:mod:`.plan`, :mod:`.rows`).

        A batch the plan splits into row blocks (a graph that computes row by row, from
        :data:`~.rows.SPLIT_ROWS` rows on) holds the arrays it returns, whole — a run its graph
        outputs, a record every tensor (``names`` are picked from them) — and the bounds of its
        blocks (:data:`~.rows.BOUNDS_BYTES` each), and on each thread that runs blocks
        (:func:`~.rows.workers`) one block's tensors (its scratch buffers) and
        :data:`~.rows.WORKER_BYTES`.

        A batch run whole keeps every node output it computes until it returns, but for those
        that have no array of their own: a run's activation computed over the array it reads
        (:meth:`Plan.overwritten`), and views of another tensor (:meth:`Plan.aliases`). At its peak
        it holds those, the arrays the node being computed holds while it runs (:func:`temporary`)
        and :data:`BLAS_BUFFER_BYTES`.
        """
        nbytes = sizes.nbytes(rows)
        if self.plan.row_split is not None and rows >= SPLIT_ROWS:
            bounds = blocks(rows)
            block = sizes.nbytes(max(stop - start for start, stop in bounds))
            per_worker = sum(block.values()) + WORKER_BYTES
            returned = sum(nbytes[n] for n in self._out_names) if names is None else sum(nbytes.values())
            return returned + len(bounds) * BOUNDS_BYTES + workers(self.plan.threads, len(bounds)) * per_worker
        shared = (self.plan.overwritten() if names is None else frozenset()) | self.plan.aliases("run" if names is None else "record")
        steps = list(zip(self.plan.steps, self.graph.nodes))
        fresh: set[str] = set()  # node outputs in contiguous memory of their own or of another's
        for step, node in steps:
            if (step.kind == "gemm" or node.op_type in NEW_MEMORY
                    or (node.op_type in _CONTIGUOUS_VIEWS and node.inputs and node.inputs[0] in fresh)):
                fresh.update(t for t in node.outputs[:1] if t)
        packing = BLAS_THREAD_BYTES * usable_cores()

        def packed(tensor: str) -> int:  # what the BLAS packs of a product's left operand
            if tensor in sizes.one:
                (b1, e1), (_, e2) = sizes.one[tensor], sizes.two[tensor]
                width, itemsize = e2 - e1, b1 // max(e1, 1)
            else:  # a feed
                width, itemsize = sizes.inputs[1] - sizes.inputs[0], max(v.dtype.itemsize for v in self.inputs)
            return min(rows * min(width, BLAS_PANEL) * itemsize, packing)

        held = peak = 0
        for step, node in steps:
            held += sum(nbytes.get(t, 0) for t in node.outputs if t and t not in shared)
            peak = max(peak, held + temporary(step.kind, node, nbytes, fresh, packed))
        return peak + BLAS_BUFFER_BYTES

    # NaN and infinities propagate without numpy's warnings (see .floating), in every entry point.
    @quiet
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._plan_for(feeds).run(feeds)

    @quiet
    def record(self, feeds: Mapping[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        return self._select(self._plan_for(feeds).record(feeds), names)

    def _select(self, everything: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        if len(names) == len(self.tensor_names):  # every node output: names is tensor_names
            return everything
        result = {n: everything[n] for n in names}
        for n in self._out_names:
            result[n] = everything[n]
        return result

    @quiet
    def record_steered(self, feeds: Mapping[str, np.ndarray], names: list[str] | None,
                       steering: Steering) -> dict[str, np.ndarray]:
        """Run (``names=None``) or record with overrides, on a variant of the plan compiled once
        per set of overridden tensors (see :meth:`Plan.steered`)."""
        plan = self._plan_for(feeds)
        mode = "run" if names is None else "record"
        fed = self._optional.intersection(feeds)
        key = (mode, steering.tensors, fed) if fed else (mode, steering.tensors)
        fn = self._steered.get(key)
        if fn is None:
            fn = self._steered[key] = plan.steered(mode, steering.tensors)
        result = fn(feeds, steering.appliers(self._writable))
        return result if names is None else self._select(result, names)

    @quiet
    def observe(self, feeds: Mapping[str, np.ndarray], observer: Callable) -> dict[str, np.ndarray]:
        """Run with ``observer(node_index, output_index, value) -> value`` called after every node.

        What the observer returns replaces the tensor for the rest of the run, so an observer can
        record, accumulate statistics, or override neurons. ``self.graph.nodes[node_index]`` is
        the node. An exception the observer raises propagates unchanged.
        """
        return self._plan_for(feeds).observe(feeds, observer)


def temporary(kind: str, node, nbytes: Mapping[str, int], fresh: set[str], packed: Callable[[str], int]) -> int:
    """The bytes one node's numpy code holds while it runs, beyond its inputs and outputs.

    A matrix product (a Gemm on the plan's fast path, a MatMul) hands contiguous operands to the
    BLAS as they are, and copies those that are not: an operand not in ``fresh`` (the node outputs
    that ops made in new memory, and contiguous views of them) is counted as copied; the BLAS packs
    panels of the left one (``packed``). Gemm's general form adds its
    bias to the product: one array of the output's size. Any other op holds its
    :data:`_TEMPORARIES` (one, none for :data:`_NO_TEMPORARIES`) arrays of the size of the largest
    tensor it reads or writes.

    Args:
        kind: the plan's kind of step (``"gemm"`` for the fast path).
        node: the graph node.
        nbytes: node output -> bytes (feeds and weights are not in it).
        fresh: the node outputs known to be contiguous.
        packed: a product's left operand -> the bytes the BLAS packs of it.
    """
    if kind == "gemm" or node.op_type == "MatMul":
        copies = sum(nbytes.get(t, 0) for t in node.inputs[:2] if t in nbytes and t not in fresh)
        return copies + packed(node.inputs[0])
    if node.op_type == "Gemm":  # np.matmul, then the bias added into a new array
        return max((nbytes.get(t, 0) for t in node.outputs if t), default=0) + packed(node.inputs[0])
    factor = 0.0 if node.op_type in _NO_TEMPORARIES else _TEMPORARIES.get(node.op_type, 1.0)
    return int(factor * max((nbytes.get(t, 0) for t in (*node.inputs, *node.outputs) if t), default=0))
