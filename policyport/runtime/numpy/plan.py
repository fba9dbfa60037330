"""Compile a :class:`~policyport.graph.Graph` once into straight-line Python over numpy.

Every node's implementation is resolved from the registry at compile time and bound to its
attributes; initializers are bound as constants in the layout the kernel wants (a Gemm with a
constant ``B`` and ``transB=1`` gets ``B.T`` made contiguous once). The plan is then generated as one
Python function per mode, with one line per node and locals for tensors, so a run does no
dictionary look-ups, validation or dispatch per node:

* ``run``: the graph outputs only; a fresh intermediate with one consumer that is an activation
  is overwritten in place (``np.tanh(t, out=t)``), never a feed, an initializer or a view of them;
* ``record``: also returns every node output, nothing written in place;
* ``observe``: calls ``observer(node_index, value)`` after each node and continues with what it
  returns, so recording, statistics and neuron overrides are observers of the run loop.

The generated source names only locals ``t0, t1, ...`` and constants ``k0, k1, ...``; no string
from the model ever reaches it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...errors import BadModelError
from ...graph import Graph
from .registry import resolve

#: Producers whose result is always a fresh array that nothing else references.
_FRESH = {"Gemm", "MatMul", "Add", "Sub", "Mul", "Div"}
#: Unary activations with an in-place numpy kernel: op type -> kernel(x) that overwrites x.
_IN_PLACE: dict[str, Callable] = {
    "Tanh": lambda x: np.tanh(x, out=x),
    "Relu": lambda x: np.maximum(x, 0, out=x),
    "Exp": lambda x: np.exp(x, out=x),
    "Neg": lambda x: np.negative(x, out=x),
    "Abs": lambda x: np.absolute(x, out=x),
    "Sqrt": lambda x: np.sqrt(x, out=x),
}


@dataclass(frozen=True)
class Step:
    """One compiled node: the callable, its argument and result locals."""

    index: int
    op_type: str
    fn: Callable
    args: tuple[str, ...]  # local or constant names, "None" for an omitted optional input
    results: tuple[str, ...]


class Plan:
    """A graph compiled for the numpy backend.

    Args:
        graph: the graph to compile.

    Raises:
        UnsupportedOpError: a node's op (at the graph's opset) has no implementation.
        BadModelError: a node reads a tensor that no graph input, initializer or earlier node makes.
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        self.input_names = [v.name for v in graph.inputs]
        self.output_names = [v.name for v in graph.outputs]
        self.tensor_names: list[str] = [o for n in graph.nodes for o in n.outputs if o]
        self._consts: dict[str, object] = {}
        local: dict[str, str] = {}  # tensor name -> local/constant identifier
        for i, name in enumerate(self.input_names):
            local[name] = f"x{i}"
        for name, arr in graph.initializers.items():
            local[name] = self._const(arr)
        consumers: dict[str, int] = {}
        for n in graph.nodes:
            for t in n.inputs:
                if t:
                    consumers[t] = consumers.get(t, 0) + 1
        self.steps: list[Step] = []
        producer: dict[str, str] = {}
        for idx, node in enumerate(graph.nodes):
            impl = resolve(node.op_type, graph.opsets.get(node.domain, graph.opset), node.domain, node.name)
            args = []
            for t in node.inputs:
                if not t:
                    args.append("None")
                elif t in local:
                    args.append(local[t])
                else:
                    raise BadModelError(
                        f'{node.op_type} node "{node.name}" reads tensor {t!r}, which no graph input, '
                        "initializer or earlier node produces (nodes must be topologically sorted)"
                    )
            while args and args[-1] == "None":
                args.pop()
            fn = self._specialize(node, impl, args)
            results = []
            for j, t in enumerate(node.outputs):
                results.append(f"t{len(producer)}" if t else "_")
                if t:
                    local[t] = results[-1]
                    producer[t] = node.op_type
            self.steps.append(Step(idx, node.op_type, fn, tuple(args), tuple(results)))
        missing = [o for o in self.output_names if o not in local]
        if missing:
            raise BadModelError(f"graph outputs {missing} are produced by no node, input or initializer")
        self._local = local
        self._producer = producer
        self._consumers = consumers
        self.run = self._compile("run")
        self.record = self._compile("record")
        self.observe = self._compile("observe")

    def _const(self, value) -> str:
        name = f"k{len(self._consts)}"
        self._consts[name] = value
        return name

    def _specialize(self, node, impl, args: list[str]) -> Callable:
        attrs = dict(node.attrs)
        if impl.wants_node_outputs:
            attrs["node_outputs"] = len(node.outputs)
        if node.op_type == "Gemm" and len(args) >= 2:
            fast = self._gemm_fast_path(attrs, args)
            if fast is not None:
                return fast
        if node.op_type == "Slice" and impl.since >= 10:
            fast = self._slice_fast_path(args)
            if fast is not None:
                return fast
        return functools.partial(impl.fn, **attrs) if attrs else impl.fn

    def _gemm_fast_path(self, attrs: dict, args: list[str]) -> Callable | None:
        """Gemm with a constant B (and C): pre-transpose B once, then matmul and add in place."""
        b = self._consts.get(args[1])
        if not isinstance(b, np.ndarray) or attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0:
            return None
        c_name = args[2] if len(args) > 2 else None
        c = self._consts.get(c_name) if c_name else None
        if c_name and (not isinstance(c, np.ndarray) or attrs.get("beta", 1.0) != 1.0 or c.dtype != b.dtype):
            return None
        args[1] = self._const(np.ascontiguousarray(b.T if attrs.get("transB", 0) else b))
        dot, add = np.dot, np.add  # np.dot: same BLAS call as matmul for 2-D, less dispatch
        if c is None:
            del args[2:]
            return dot
        args[2] = self._const(np.ascontiguousarray(c))

        def gemm(a, b, c):
            y = dot(a, b)
            add(y, c, out=y)
            return y

        return gemm

    def _slice_fast_path(self, args: list[str]) -> Callable | None:
        """Slice-10+ whose starts, ends, axes and steps are constants: the index tuple is built once.

        Only for non-negative axes (a negative axis needs the data's rank). Python slicing clamps
        out-of-range bounds exactly as the Slice operator page prescribes.
        """
        consts = [self._consts.get(a) for a in args[1:]]
        if len(consts) < 2 or not all(isinstance(c, np.ndarray) and c.ndim == 1 for c in consts):
            return None
        starts, ends = consts[0].tolist(), consts[1].tolist()
        axes = consts[2].tolist() if len(consts) > 2 else list(range(len(starts)))
        steps = consts[3].tolist() if len(consts) > 3 else [1] * len(starts)
        if min(axes, default=0) < 0 or len(set(axes)) != len(axes) or 0 in steps:
            return None
        index = [slice(None)] * (max(axes, default=-1) + 1)
        for a, start, end, step in zip(axes, starts, ends, steps):
            index[a] = slice(start, end, step)
        key = tuple(index)
        del args[1:]
        return lambda data: data[key]

    def _compile(self, mode: str) -> Callable:
        params = [f"x{i}" for i in range(len(self.input_names))] + (["observer"] if mode == "observe" else [])
        lines = [f"def {mode}({', '.join(params)}):"]
        env = dict(self._consts)
        outputs = set(self.output_names)
        for s in self.steps:
            env[f"f{s.index}"] = s.fn
            call = f"f{s.index}({', '.join(s.args)})"
            src = s.args[0] if s.args else None
            if (mode == "run" and s.op_type in _IN_PLACE and len(s.args) == 1 and src.startswith("t")
                    and self._is_fresh(src) and self._consumers_of(src) == 1 and not self._is_output(src, outputs)):
                env[f"g{s.index}"] = _IN_PLACE[s.op_type]
                call = f"g{s.index}({src})"
            if len(s.results) == 1:
                lines.append(f"    {s.results[0]} = {call}")
                if mode == "observe":
                    lines.append(f"    {s.results[0]} = observer({s.index}, 0, {s.results[0]})")
            else:
                lines.append(f"    _r = {call}")
                lines.append("    if not isinstance(_r, tuple): _r = (_r,)")
                for j, r in enumerate(s.results):
                    if r != "_":
                        lines.append(f"    {r} = _r[{j}]")
                        if mode == "observe":
                            lines.append(f"    {r} = observer({s.index}, {j}, {r})")
        outs = ", ".join(self._local[o] for o in self.output_names)
        if mode == "record":
            inter = ", ".join(self._local[t] for t in self.tensor_names)
            lines.append(f"    return ({outs},), ({inter},)")
        else:
            lines.append(f"    return ({outs},)")
        code = compile("\n".join(lines), f"<policyport plan:{mode}>", "exec")
        exec(code, env)  # the source holds generated identifiers only (see module docstring)
        return env[mode]

    def _is_fresh(self, local_name: str) -> bool:
        for t, loc in self._local.items():
            if loc == local_name:
                return self._producer.get(t) in _FRESH
        return False

    def _consumers_of(self, local_name: str) -> int:
        return sum(self._consumers.get(t, 0) for t, loc in self._local.items() if loc == local_name)

    def _is_output(self, local_name: str, outputs: set[str]) -> bool:
        return any(loc == local_name for t, loc in self._local.items() if t in outputs)
