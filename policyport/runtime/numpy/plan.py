"""Compile a :class:`~policyport.graph.Graph` once into straight-line Python over numpy.

Every node's implementation is resolved from the registry at compile time and bound to its
attributes; initializers are bound as constants in the layout the kernel wants (a Gemm with a
constant ``B`` and ``transB=1`` gets ``B.T`` made contiguous once). The plan is then generated as one
Python function per mode, with one line per node and locals for tensors, so a run does no
dictionary look-ups, validation or dispatch per node:

* ``run``: the graph outputs only; a fresh intermediate with one consumer that is an activation
  is overwritten in place (``np.tanh(t, out=t)``), never a feed, an initializer or a view of them;
* ``record``: also returns every node output, nothing written in place;
* ``observe``: calls ``observer(node_index, output_index, value)`` after each node and continues
  with what it returns, so recording, statistics and neuron overrides are observers of the run loop.

A Gemm with constant weights becomes ``dot`` plus an in-place ``add`` of the bias, a Slice with
constant bounds one indexing with a prebuilt tuple; every other node calls its registered function.
The generated source names only locals (``x0``, ``t0`` ...) and bound constants (``k0``, ``n0`` ...,
tensor names among them); no string from the model ever reaches the source text.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...errors import BadModelError, PolicyportError
from ...graph import Graph
from .registry import resolve

#: What a node's numpy code raises on shapes or values the model cannot take.
_NODE_FAILURES = (ArithmeticError, ValueError, TypeError, IndexError, KeyError)
#: Producers whose result is a fresh array that nothing else references (Gemm: always 2-D).
_FRESH = {"Gemm"}
#: Producers whose result is fresh but may be a numpy scalar (0-d operands): in-place is guarded.
_FRESH_IF_ARRAY = {"MatMul", "Add", "Sub", "Mul", "Div"}
#: Ops whose implementation always returns new memory (never an input or a view of one). Any other
#: op's result may share memory with its inputs (Identity, Reshape, Slice, Squeeze ... return views).
_NEW_MEMORY = {
    "Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal",
    "Relu", "LeakyRelu", "Elu", "Selu", "Sigmoid", "Tanh", "Softplus", "Softsign", "Erf", "Gelu",
    "Softmax", "LogSoftmax", "Concat", "ArgMax", "ArgMin",
}
#: Unary ops whose in-place numpy ufunc beats allocating: op type -> ufunc name. (Relu is absent:
#: np.maximum with an out= array is slower than allocating its result.)
_IN_PLACE: dict[str, str] = {"Tanh": "tanh", "Exp": "exp", "Neg": "negative", "Abs": "absolute", "Sqrt": "sqrt"}


@dataclass(frozen=True)
class Step:
    """One compiled node.

    ``kind`` says how the generated line computes it: ``"call"`` (``fn(*args)``), ``"gemm"``
    (``dot(a, b)`` then an in-place ``add`` of the bias, if any) or ``"index"`` (``a[k]`` with a
    constant index).
    """

    index: int
    op_type: str
    kind: str
    fn: Callable | None
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
        self.tensor_names = graph.tensor_names
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
            kind, fn = self._specialize(node, impl, args)
            results = []
            for j, t in enumerate(node.outputs):
                results.append(f"t{len(producer)}" if t else "_")
                if t:
                    local[t] = results[-1]
                    producer[t] = node.op_type
            self.steps.append(Step(idx, node.op_type, kind, fn, tuple(args), tuple(results)))
        missing = [o for o in self.output_names if o not in local]
        if missing:
            raise BadModelError(f"graph outputs {missing} are produced by no node, input or initializer")
        self._local = local
        self._tensor_of = {loc: t for t, loc in local.items()}  # one tensor per local
        self._producer = producer
        self._consumers = consumers
        self._shared = self._memory_roots()
        self._line_steps: dict[str, dict[int, Step]] = {}  # mode -> generated line number -> step
        self.run = self._compile("run")
        self.record = self._compile("record")
        self.observe = self._compile("observe")

    def _const(self, value) -> str:
        """Bind ``value`` as a constant of the generated code; arrays through a read-only view, so
        that neither an op nor an observer can change the model's weights by writing in place."""
        name = f"k{len(self._consts)}"
        if isinstance(value, np.ndarray):
            value = value.view()
            value.flags.writeable = False
        self._consts[name] = value
        return name

    def _specialize(self, node, impl, args: list[str]) -> tuple[str, Callable | None]:
        attrs = dict(node.attrs)
        if impl.wants_node_outputs:
            attrs["node_outputs"] = len(node.outputs)
        if node.op_type == "Gemm" and len(args) >= 2 and self._gemm_fast_path(attrs, args):
            return "gemm", None
        if node.op_type == "Slice" and impl.since >= 10 and self._slice_fast_path(args):
            return "index", None
        return "call", functools.partial(impl.fn, **attrs) if attrs else impl.fn

    def _gemm_fast_path(self, attrs: dict, args: list[str]) -> bool:
        """Gemm with a constant B (and C), alpha = beta = 1, no transA: B laid out [K, N] once,
        a bias vector stored as a (1, N) row (numpy adds same-rank operands faster)."""
        b = self._consts.get(args[1])
        if not isinstance(b, np.ndarray) or b.ndim != 2 or attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0:
            return False
        c_name = args[2] if len(args) > 2 else None
        c = self._consts.get(c_name) if c_name else None
        if c_name and (not isinstance(c, np.ndarray) or attrs.get("beta", 1.0) != 1.0 or c.dtype != b.dtype
                       or c.ndim > 2):
            return False
        args[1] = self._const(np.ascontiguousarray(b.T if attrs.get("transB", 0) else b))
        if c is not None:
            args[2] = self._const(np.ascontiguousarray(c).reshape(1, -1) if c.ndim == 1 else np.ascontiguousarray(c))
        else:
            del args[2:]
        return True

    def _slice_fast_path(self, args: list[str]) -> bool:
        """Slice-10+ whose starts, ends, axes and steps are constants: the index tuple is built once.

        Only for non-negative axes (a negative axis needs the data's rank). Python slicing clamps
        out-of-range bounds exactly as the Slice operator page prescribes.
        """
        consts = [self._consts.get(a) for a in args[1:]]
        if len(consts) < 2 or not all(isinstance(c, np.ndarray) and c.ndim == 1 for c in consts):
            return False
        starts, ends = consts[0].tolist(), consts[1].tolist()
        axes = consts[2].tolist() if len(consts) > 2 else list(range(len(starts)))
        steps = consts[3].tolist() if len(consts) > 3 else [1] * len(starts)
        if min(axes, default=0) < 0 or len(set(axes)) != len(axes) or 0 in steps:
            return False
        index = [slice(None)] * (max(axes, default=-1) + 1)
        for a, start, end, step in zip(axes, starts, ends, steps):
            index[a] = slice(start, end, step)
        args[1:] = [self._const(tuple(index))]
        return True

    def steered(self, mode: str, tensors: tuple[str, ...]) -> Callable:
        """``run`` or ``record`` compiled with an override hook: ``f(feeds, edits)``.

        Right after the node that produces ``tensors[i]``, the generated code continues with
        ``edits[i](value)`` in its place, so every later node, and the recorded or returned value,
        sees the steered tensor. The plain ``run``/``record`` are not touched; callers cache the
        result per tuple of tensors (the edit functions are arguments, so new values need no new
        compilation). ``edits[i]`` may write in place only where :meth:`writable` says so.
        """
        return self._compile(mode, hooks={t: i for i, t in enumerate(tensors)})

    def writable(self, tensor: str) -> bool:
        """Whether a run owns the memory of ``tensor``: made fresh by its node and shared with no
        feed, weight or other tensor (an override may then write into it in place)."""
        loc = self._local.get(tensor)
        step = next((s for s in self.steps if loc in s.results), None)
        return step is not None and (step.kind == "gemm" or step.op_type in _NEW_MEMORY)

    def _compile(self, mode: str, hooks: dict[str, int] | None = None) -> Callable:
        """Generate ``run(feeds)``, ``record(feeds)`` or ``observe(feeds, observer)``.

        Each returns a dict: ``run`` and ``observe`` the graph outputs, ``record`` every node output
        in node order followed by any graph output that is not a node output. With ``hooks``
        (tensor -> position), the function takes ``(feeds, edits)`` and replaces each hooked tensor
        by ``edits[position](value)`` right after its node (see :meth:`steered`).
        """
        env: dict[str, object] = {"dot": np.dot, "add": np.add, "ndarray": np.ndarray, **self._consts}
        for name in _IN_PLACE.values():
            env[name] = getattr(np, name)

        def key(text: str) -> str:  # tensor names reach the code only as bound constants
            ident = f"n{len(env)}"
            env[ident] = text
            return ident

        label = mode if hooks is None else f"{mode}+{len(self._line_steps)}"  # names the code object
        line_steps = self._line_steps[label] = {}
        env.update(array=np.array, asarray=np.asarray, PolicyportError=PolicyportError,
                   FAILURES=_NODE_FAILURES, explain=self.explain)
        guarded = mode != "observe"  # an observer's own exceptions propagate unchanged
        pad = "        " if guarded else "    "
        lines = [f"def {mode}(feeds" + (", observer" if mode == "observe" else "") + (", edits" if hooks is not None else "") + "):"]
        if guarded:
            lines.append("    try:")
        lines += [f"{pad}x{i} = feeds[{key(name)}]" for i, name in enumerate(self.input_names)]
        outputs = set(self.output_names)
        for s in self.steps:
            emitted = self._emit(s, mode, env, outputs)
            line_steps.update({len(lines) + 1 + k: s for k in range(len(emitted))})
            lines += [f"{pad}{line}" for line in emitted]
            if hooks:
                hooked = [(r, hooks[self._tensor_of[r]]) for r in s.results if self._tensor_of.get(r) in hooks]
                line_steps.update({len(lines) + 1 + k: s for k in range(len(hooked))})
                lines += [f"{pad}{r} = edits[{i}]({r})" for r, i in hooked]
            if mode == "observe":
                lines += [f"{pad}{r} = observer({s.index}, {j}, {r})" for j, r in enumerate(s.results) if r != "_"]
        if mode == "record":
            names = list(dict.fromkeys([*self.tensor_names, *self.output_names]))
        else:
            names = self.output_names
        declared = {v.name: v.shape for v in self.graph.outputs}
        returned: set[str] = set()
        items = []
        for n in names:
            loc = self._local[n]
            if loc in returned or loc[0] in "xk" or self._shared.get(loc):
                value = f"array({loc})"  # would alias a feed, a weight or another output: copy
            elif mode == "record" or not declared.get(n):  # rank 0 or unknown: numpy may give a scalar
                value = f"({loc} if type({loc}) is ndarray else asarray({loc}))"
            else:
                value = loc
            returned.add(loc)
            items.append(f"{key(n)}: {value}")
        lines.append(f"{pad}return {{{', '.join(items)}}}")
        if guarded:  # a numpy error inside the model becomes a BadModelError naming the node
            lines += ["    except PolicyportError:", "        raise",
                      "    except FAILURES as e:", "        raise explain(e) from e"]
        code = compile("\n".join(lines), f"<policyport plan:{label}:{id(self)}>", "exec")
        exec(code, env)  # the source holds generated identifiers only (see module docstring)
        return env[mode]

    def _emit(self, s: Step, mode: str, env: dict, outputs: set[str]) -> list[str]:
        """The generated lines of one step."""
        res, args = s.results, s.args
        if s.kind == "gemm":
            lines = [f"{res[0]} = dot({args[0]}, {args[1]})"]
            if len(args) > 2:
                lines.append(f"add({res[0]}, {args[2]}, {res[0]})")  # out positional: less parsing
            return lines
        if s.kind == "index":
            return [f"{res[0]} = {args[0]}[{args[1]}]"]
        env[f"f{s.index}"] = s.fn
        src = args[0] if len(args) == 1 else ""
        if (mode == "run" and s.op_type in _IN_PLACE and src.startswith("t") and len(res) == 1
                and self._consumers.get(self._tensor_of[src], 0) == 1 and self._tensor_of[src] not in outputs):
            in_place = f"{_IN_PLACE[s.op_type]}({src}, {src})"  # out positional: less parsing
            producer = self._producer.get(self._tensor_of[src])
            if producer in _FRESH:
                return [f"{res[0]} = {in_place}"]
            if producer in _FRESH_IF_ARRAY:
                return [f"{res[0]} = {in_place} if type({src}) is ndarray else f{s.index}({src})"]
        call = f"f{s.index}({', '.join(args)})"
        if len(res) == 1:
            return [f"{res[0]} = {call}"]
        lines = [f"_r = {call}", "if not isinstance(_r, tuple): _r = (_r,)"]
        return lines + [f"{r} = _r[{j}]" for j, r in enumerate(res) if r != "_"]

    def explain(self, error: Exception) -> BadModelError:
        """A :class:`BadModelError` naming the node whose computation raised ``error``.

        Generated lines map to steps, so the innermost frame of this plan's code in the traceback
        tells which node failed (a numpy shape or type error from the model itself).
        """
        tb, step = error.__traceback__, None
        while tb is not None:
            filename = tb.tb_frame.f_code.co_filename
            if filename.startswith("<policyport plan:") and filename.endswith(f":{id(self)}>"):
                mode = filename.split(":")[1]
                step = self._line_steps[mode].get(tb.tb_lineno, step)
            tb = tb.tb_next
        where = "the numpy backend"
        if step is not None:
            node = self.graph.nodes[step.index]
            where = f'{node.op_type} node "{node.name}" on the numpy backend'
        return BadModelError(f"{where} failed: {type(error).__name__}: {error}")

    def _memory_roots(self) -> dict[str, set[str]]:
        """Local -> the feeds (``x*``) and constants (``k*``) whose memory it may share.

        A result of an op in ``_NEW_MEMORY`` (or of the Gemm fast path) shares nothing; any other
        op's results may share memory with every array it reads.
        """
        shared: dict[str, set[str]] = {}
        for s in self.steps:
            if s.kind == "gemm" or s.op_type in _NEW_MEMORY:
                roots: set[str] = set()
            else:
                roots = set()
                for a in s.args[:1] if s.kind == "index" else s.args:
                    if a[0] == "x" or (a[0] == "k" and isinstance(self._consts[a], np.ndarray)):
                        roots.add(a)
                    else:
                        roots |= shared.get(a, set())
            for r in s.results:
                shared[r] = roots
        return shared
