"""policyport's own ONNX interpreter in pure numpy: an op registry and a compiled execution plan."""

from __future__ import annotations

import functools
from typing import Callable, Mapping

import numpy as np

from ...graph import Graph
from ..base import Backend, TensorSizes
from ..overrides import Steering
from .floating import quiet
from .plan import Plan
from .registry import op, resolve, supported_ops
from .rows import BOUNDS_BYTES, SPLIT_ROWS, WORKER_BYTES, blocks, workers

__all__ = ["NumpyBackend", "Plan", "op", "resolve", "supported_ops"]

#: What the BLAS keeps for a whole batch's matrix products beyond its packed copy of an operand (which
#: the estimate counts as one more array of the largest tensor's size): its threads' other buffers.
#: Measured (``ru_maxrss``, OpenBLAS 0.3 on two threads, MLPs of 256 to 1,024 units, 1,000 to 50,000
#: rows): under 2 MiB.
BLAS_BUFFER_BYTES = 4 << 20
#: Ops whose numpy code computes the result in one call, or returns a view, with no temporary array
#: of its size; any other op (a matrix product, whose BLAS packs a copy of an operand, an activation
#: written as several ufuncs, a normalization) is taken to hold one more array while it runs.
_NO_TEMPORARIES = frozenset({
    "Relu", "Tanh", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Sign", "Not",
    "Add", "Sub", "Mul", "Div", "Equal", "Greater", "Less", "And", "Or", "Where", "Cast", "ArgMax", "ArgMin",
    "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Transpose", "Dropout", "Split",
    "Expand", "Tile", "Concat", "Gather", "Constant", "ConstantOfShape", "Shape", "Size",
})


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
        :data:`~.rows.WORKER_BYTES`. A batch run whole holds every node output until it returns (a
        run shares one array between a tensor and the activation computed over it,
        :meth:`Plan.overwritten`), one more array the size of the largest tensor an op with
        temporaries reads or writes (one not in :data:`_NO_TEMPORARIES`: a matrix product, whose
        BLAS packs a copy of an operand, a sigmoid ...), and :data:`BLAS_BUFFER_BYTES`.
        """
        nbytes = sizes.nbytes(rows)
        if self.plan.row_split is not None and rows >= SPLIT_ROWS:
            bounds = blocks(rows)
            block = sizes.nbytes(max(stop - start for start, stop in bounds))
            per_worker = sum(block.values()) + WORKER_BYTES
            returned = sum(nbytes[n] for n in self._out_names) if names is None else sum(nbytes.values())
            return returned + len(bounds) * BOUNDS_BYTES + workers(self.plan.threads, len(bounds)) * per_worker
        shared = self.plan.overwritten() if names is None else frozenset()
        held = sum(b for n, b in nbytes.items() if n not in shared)
        temporary = max((nbytes.get(t, 0) for node in self.graph.nodes if node.op_type not in _NO_TEMPORARIES
                         for t in (*node.inputs, *node.outputs)), default=0)
        return held + temporary + BLAS_BUFFER_BYTES

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

