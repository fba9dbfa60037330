"""Compile a :class:`~policyport.graph.model.Graph` once into straight-line Python over numpy.

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

A large graph is compiled in pieces: CPython compiles one huge function in superlinear time and
memory, so past :data:`CHUNK_LINES` generated lines the tensors live in a list (``s[3]`` for
``t3``) and the lines are split into functions of at most that many lines, called in turn. A graph
of more nodes than :attr:`policyport.io.limits.Limits.nodes` (``POLICYPORT_MAX_NODES``) is refused.
``record`` and ``observe`` are compiled on first use.

A graph that computes row by row (followed while compiling, see :class:`_RowTracker`) runs a batch
of :data:`~policyport.runtime.numpy.rows.SPLIT_ROWS` rows or more in row blocks, on every core: the
first lines of ``run`` and ``record`` hand it to :class:`~policyport.runtime.numpy.rows.RowBlocks`.
Smaller batches run the straight-line code alone, as before.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...errors import BadModelError, LimitExceededError, PolicyportError, UnsupportedOpError, listing
from ...io.limits import ENV_NODES, limits
from ...graph.model import Graph, onnx_dtype
from .registry import NEWEST_OPSET, Static, missing_ops, resolve
from .rows import SPLIT_ROWS, RowBlocks

#: What a node's numpy code raises on shapes or values the model cannot take (MemoryError: numpy
#: could not allocate a result).
_NODE_FAILURES = (ArithmeticError, ValueError, TypeError, IndexError, KeyError, MemoryError)
#: The most generated lines in one function; a larger plan is split into functions of this size.
CHUNK_LINES = 2000
#: A local of the generated code (a feed ``x3`` or a node output ``t3``), as it appears in its text.
_LOCAL = re.compile(r"\b([xt])(\d+)\b")
#: Producers whose result is a fresh array that nothing else references (Gemm: always 2-D).
_FRESH = {"Gemm", "Conv"}
#: Producers whose result is fresh but may be a numpy scalar (0-d operands): in-place is guarded.
_FRESH_IF_ARRAY = {"MatMul", "Add", "Sub", "Mul", "Div"}
#: Ops whose implementation always returns new memory (never an input or a view of one). Any other
#: op's result may share memory with its inputs (Identity, Reshape, Slice, Squeeze ... return views).
NEW_MEMORY = {
    "Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal",
    "Relu", "LeakyRelu", "Elu", "Selu", "Sigmoid", "Tanh", "Softplus", "Softsign", "Erf", "Gelu",
    "Softmax", "LogSoftmax", "Concat", "ArgMax", "ArgMin",
    "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "RNN", "GRU", "LSTM",
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli",
}
#: Ops whose output has the shape and element type of their first input.
_SAME_AS_INPUT = {
    "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "ThresholdedRelu", "Sigmoid", "HardSigmoid", "HardSwish",
    "Tanh", "Softplus", "Softsign", "Mish", "Gelu", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Sign",
    "Floor", "Ceil", "Round", "Erf", "Identity", "Softmax", "LogSoftmax", "Hardmax", "Clip", "Dropout", "Not",
}
#: Element-wise ops whose inputs broadcast and share one element type, which the output has too.
_BROADCASTING = {"Add", "Sub", "Mul", "Div"}
_COMPARISONS = {"Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "And", "Or"}
#: Inputs that the operator page gives one type variable (T): op -> input positions (None: all).
_ONE_TYPE: dict[str, tuple[int, ...] | None] = {
    **{o: (0, 1) for o in _BROADCASTING | _COMPARISONS}, "MatMul": (0, 1), "Gemm": (0, 1, 2), "PRelu": (0, 1),
    "Concat": None, "Sum": None, "Mean": None, "Max": None, "Min": None, "Where": (1, 2),
}
#: Unary ops whose in-place numpy ufunc beats allocating: op type -> ufunc name. (Relu is absent:
#: np.maximum with an out= array is slower than allocating its result.)
_IN_PLACE: dict[str, str] = {"Tanh": "tanh", "Exp": "exp", "Neg": "negative", "Abs": "absolute", "Sqrt": "sqrt"}
#: Unary ops whose registered function is one ufunc call, written into a given array instead:
#: op type -> the call with ``out`` (the same ufunc on the same operands: the same bits).
_INTO: dict[str, str] = {**{op: f"{fn}({{src}}, {{out}})" for op, fn in _IN_PLACE.items()},
                         "Relu": "maximum({src}, {src}.dtype.type(0), out={out})"}


def node_generator(seed: float) -> np.random.Generator:
    """The Generator of a random op whose node has a ``seed`` attribute (a float in ONNX).

    An integral non-negative seed seeds numpy's default generator with that integer (``seed=5.0``
    draws what ``numpy.random.default_rng(5)`` draws); any other value with its float64 bit pattern.
    """
    seed = float(seed)
    if seed.is_integer() and seed >= 0:
        return np.random.default_rng(int(seed))
    return np.random.default_rng(int(np.float64(seed).view(np.uint64)))


@dataclass(frozen=True)
class Step:
    """One compiled node.

    ``kind`` says how the generated line computes it: ``"call"`` (``fn(*args)``), ``"gemm"``
    (``dot(a, b)`` then an in-place ``add`` of the bias, if any), ``"index"`` (``a[k]`` with a
    constant index) or ``"relu"`` (``maximum(a, zero)``, zero of the input's dtype).
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
        fed: names of ``graph.optional_inputs`` that this plan reads from the feeds instead of
            binding their initializers as constants (every feed dict it runs on holds them).
        seed: seed of the ``numpy.random.Generator`` that random ops (RandomNormal, Multinomial ...)
            draw from; None (default) seeds it from fresh OS entropy. A node with its own ``seed``
            attribute draws from a Generator of its own seeded with that (see :func:`node_generator`).
            Each generator is created once here, so successive runs draw successive numbers and
            two plans with the same seed draw the same sequence.
        threads: threads sharing the row blocks of a large batch (see :mod:`.rows`); 0 (default)
            one per usable core. An attribute: it may be changed between runs.

    Raises:
        UnsupportedOpError: ops (at the graph's opset) without an implementation; one error
            naming every missing op and its nodes.
        BadModelError: a node reads a tensor that no graph input, initializer or earlier node makes.
    """

    def __init__(self, graph: Graph, fed: frozenset[str] = frozenset(), seed: int | None = None, threads: int = 0):
        limit = limits().nodes
        if len(graph.nodes) > limit:
            raise LimitExceededError(
                f"the graph has {len(graph.nodes):,} nodes, more than the numpy backend's limit of {limit:,}; "
                f"if you trust the model, raise the limit with {ENV_NODES}={len(graph.nodes)} (loading takes "
                "some 3 s of CPU and 250 MB per 100,000 nodes), or run it with --backend onnxruntime"
            )
        if graph.opsets.get("", 0) > NEWEST_OPSET:
            raise UnsupportedOpError(
                f"the model declares default-domain opset {graph.opsets['']}, newer than the operator sets the "
                f"numpy backend knows (up to {NEWEST_OPSET}); its ops may mean something else there — re-export "
                f"it with --opset {NEWEST_OPSET} or older")
        missing = missing_ops(graph)
        if missing:
            raise UnsupportedOpError(missing)
        self.graph = graph
        self.seed = seed
        self.threads = threads
        self._rng: np.random.Generator | None = None
        self.input_names = [v.name for v in graph.inputs] + [v.name for v in graph.optional_inputs if v.name in fed]
        self.output_names = [v.name for v in graph.outputs]
        self.tensor_names = graph.tensor_names
        self._consts: dict[str, object] = {}
        local: dict[str, str] = {}  # tensor name -> local/constant identifier
        for name, arr in graph.initializers.items():
            local[name] = self._const(arr)
        for i, name in enumerate(self.input_names):
            local[name] = f"x{i}"
        consumers: dict[str, int] = {}
        for n in graph.nodes:
            for t in n.inputs:
                if t:
                    consumers[t] = consumers.get(t, 0) + 1
        self.steps: list[Step] = []
        producer: dict[str, str] = {}
        static = {name: Static(arr.dtype, tuple(arr.shape), arr) for name, arr in graph.initializers.items()}
        for v in [*graph.inputs, *graph.optional_inputs]:
            if v.name in self.input_names:
                shape = None if v.shape is None else tuple(d if isinstance(d, int) else None for d in v.shape)
                static[v.name] = Static(v.dtype, shape)
        rows = _RowTracker(graph, self.input_names)
        for idx, node in enumerate(graph.nodes):
            opset = graph.opsets.get(node.domain, graph.opset)
            impl = resolve(node.op_type, opset, node.domain, node.name)
            known = [static.get(t, Static()) if t else Static() for t in node.inputs]
            self._check(node, impl, known, opset)
            static.update(_infer(node, impl, known))
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
            kind, fn = self._specialize(node, impl, args, known)
            results = []
            for j, t in enumerate(node.outputs):
                results.append(f"t{len(producer)}" if t else "_")
                if t:
                    local[t] = results[-1]
                    producer[t] = node.op_type
            self.steps.append(Step(idx, node.op_type, kind, fn, tuple(args), tuple(results)))
            rows.node(node, impl, kind, args, known, static, self._consts)
        missing = [o for o in self.output_names if o not in local]
        if missing:
            raise BadModelError(f"graph outputs {missing} are produced by no node, input or initializer")
        self._local = local
        self._tensor_of = {loc: t for t, loc in local.items()}  # one tensor per local
        self._producer = producer
        self._consumers = consumers
        self._shared = self._memory_roots()
        self._rows = rows.result()
        self._line_steps: dict[str, dict[int, Step]] = {}  # function -> generated line number -> step
        self._compiled: dict[str, Callable] = {}
        self.run = self._compile("run")

    @property
    def row_split(self) -> RowSplit | None:
        """How the graph splits into blocks of rows that give the same rows as the whole batch
        (:class:`RowSplit`), or ``None`` when it does not compute row by row."""
        return self._rows

    @property
    def record(self) -> Callable:
        """``record(feeds)``: every node output in node order, then the graph outputs that are not."""
        if "record" not in self._compiled:
            self._compiled["record"] = self._compile("record")
        return self._compiled["record"]

    @property
    def observe(self) -> Callable:
        """``observe(feeds, observer)``: the graph outputs, ``observer`` called after every node."""
        if "observe" not in self._compiled:
            self._compiled["observe"] = self._compile("observe")
        return self._compiled["observe"]

    def _const(self, value) -> str:
        """Bind ``value`` as a constant of the generated code; arrays through a read-only view, so
        that neither an op nor an observer can change the model's weights by writing in place."""
        name = f"k{len(self._consts)}"
        if isinstance(value, np.ndarray):
            value = value.view()
            value.flags.writeable = False
        self._consts[name] = value
        return name

    @property
    def rng(self) -> np.random.Generator:
        """The generator of the random ops without a seed of their own, made on first use (a plan
        without random ops never imports numpy.random)."""
        if self._rng is None:
            self._rng = np.random.default_rng(self.seed)
        return self._rng

    @staticmethod
    def _check(node, impl, known: list[Static], opset: int) -> None:
        """Refuse at compile time a node whose known inputs and attributes contradict its operator
        page: inputs of one type variable with different element types, and the op's own check."""
        try:
            given = len(node.inputs)
            if impl.max_inputs is not None and given > impl.max_inputs:
                raise ValueError(f"it has {given} inputs; the operator takes at most {impl.max_inputs} "
                                 f"({', '.join(impl.input_names)})")
            for i, name in enumerate(impl.input_names[:impl.required_inputs]):
                if i >= given or not node.inputs[i]:
                    raise ValueError(f"input {i} ({name}) is required but {'omitted' if i < given else 'missing'}")
            unknown = sorted(set(node.attrs) - impl.attribute_names) if impl.attribute_names is not None else []
            if unknown:
                raise ValueError(f"attribute(s) {listing(unknown, show=str)} are not attributes of {node.op_type}-{impl.since} "
                                 f"(it takes {', '.join(sorted(impl.attribute_names)) or 'none'})")
            positions = _ONE_TYPE.get(node.op_type, ()) if node.domain == "" else ()
            typed = [(i, known[i].dtype) for i in (range(len(known)) if positions is None else positions)
                     if i < len(known) and known[i].dtype is not None]
            if len({d for _, d in typed}) > 1:
                found = ", ".join(f"input {i} {d.name}" for i, d in typed)
                raise ValueError(f"its inputs must share one element type; found {found}")
            if impl.check is not None:
                impl.check(known, node.attrs, len(node.outputs))
        except (ValueError, TypeError, IndexError) as e:
            raise BadModelError(f'{node.op_type} node "{node.name}" (opset {opset}): {e}') from e

    def _specialize(self, node, impl, args: list[str], known: list[Static]) -> tuple[str, Callable | None]:
        attrs = dict(node.attrs)
        if impl.wants_node_outputs:
            attrs["node_outputs"] = len(node.outputs)
        if impl.wants_rng:
            attrs["rng"] = self.rng if attrs.get("seed") is None else node_generator(attrs["seed"])
        if (node.op_type == "Gemm" and len(args) >= 2 and known[0].rank == 2  # A's rank checked by the feeds
                and self._gemm_fast_path(attrs, args)):
            return "gemm", None
        if node.op_type == "Slice" and impl.since >= 10 and self._slice_fast_path(args):
            return "index", None
        if node.op_type == "Relu" and node.domain == "" and len(args) == 1 and known[0].dtype is not None:
            # the registered np.maximum(x, 0), without its frame. The zero is an array, which a ufunc takes
            # as it is (a numpy scalar it converts on every call: 1.2 against 0.7 µs at batch 1), and a row
            # of zeros where the last axis is known: np.maximum against a 0-d zero takes numpy's
            # scalar loop, 1.3x (batch 1) to 4x (batch 64 and up) slower than against a row (numpy 2.4)
            shape = known[0].shape
            row = (1,) * (len(shape) - 1) + (shape[-1],) if shape and shape[-1] is not None else ()
            args.append(self._const(np.zeros(row, known[0].dtype)))
            return "relu", None
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
        return step is not None and (step.kind == "gemm" or step.op_type in NEW_MEMORY)

    def _compile(self, mode: str, hooks: dict[str, int] | None = None, split: bool = True,
                 into: list[str] | None = None) -> Callable:
        """Generate ``run(feeds)``, ``record(feeds)`` or ``observe(feeds, observer)``.

        Each returns a dict: ``run`` and ``observe`` the graph outputs, ``record`` every node output
        in node order followed by any graph output that is not a node output. With ``hooks``
        (tensor -> position), the function takes ``(feeds, edits)`` and replaces each hooked tensor
        by ``edits[position](value)`` right after its node (see :meth:`steered`).

        ``run`` and ``record`` (and their override variants) of a graph that computes row by row
        hand a batch of :data:`~policyport.runtime.numpy.rows.SPLIT_ROWS` rows or more to a
        :class:`~policyport.runtime.numpy.rows.RowBlocks`, which runs the same code compiled with
        ``split=False`` on row blocks; ``observe`` runs every batch whole, so that the observer sees
        whole tensors.

        With ``into`` (tensor names), the function takes ``(feeds, out[, edits])`` and, instead of
        returning a dict, writes each of those tensors into the array at its position in ``out``
        (a Gemm's product and an activation's ufunc straight into it, anything else copied while
        it is in cache): how :class:`~policyport.runtime.numpy.rows.RowBlocks` fills a batch's
        results block by block.
        """
        env: dict[str, object] = {"dot": np.dot, "add": np.add, "ndarray": np.ndarray, **self._consts}
        for name in _IN_PLACE.values():
            env[name] = getattr(np, name)

        def key(text: str) -> str:  # tensor names reach the code only as bound constants
            ident = f"n{len(env)}"
            env[ident] = text
            return ident

        env.update(array=np.array, asarray=np.asarray, copyto=np.copyto, maximum=np.maximum, PolicyportError=PolicyportError,
                   LimitExceededError=LimitExceededError, FAILURES=_NODE_FAILURES, explain=self.explain)
        feeds = [f"x{i} = feeds[{key(name)}]" for i, name in enumerate(self.input_names)]
        rows = self._rows if split and mode in ("run", "record") else None
        if rows is not None and all(rows.ranks.get(t, 0) >= 2 for t in hooks or ()):  # neurons: the last axis
            edits = ", edits" if hooks is not None else ""
            names = [n for n in self._returned(mode) if n not in rows.whole]
            env["split"] = RowBlocks(lambda: self._compile(mode, hooks, split=False),
                                     lambda: self._compile(mode, hooks, split=False, into=names),
                                     names, rows.inputs, lambda: self.threads)
            first = self.input_names.index(rows.inputs[0])
            feeds.append(f"if x{first}.shape[0] >= {SPLIT_ROWS}: return split(feeds{edits})")
        views: dict[str, str] = {}  # result local -> its view in out
        copies: list[str] = []  # tensors returned twice, or feeds returned: copied at the end
        for i, name in enumerate(into or ()):
            loc = self._local[name]
            if loc[0] == "t" and loc not in views:
                views[loc] = f"out[{i}]"
            else:
                copies.append(f"copyto(out[{i}], {loc})")
        body: list[tuple[str, Step]] = []  # generated line, the step it computes
        outputs = set(self.output_names)
        for s in self.steps:
            body += [(line, s) for line in self._emit(s, mode, env, outputs, views, scratch=into is not None)]
            if mode == "observe":
                body += [(f"{r} = observer({s.index}, {j}, {r})", s) for j, r in enumerate(s.results) if r != "_"]
            if hooks:
                for r in s.results:
                    if self._tensor_of.get(r) in hooks:
                        body.append((f"{r} = edits[{hooks[self._tensor_of[r]]}]({r})", s))
                        if r in views:  # an edit that copied instead of writing in place
                            body.append((f"if {r} is not {views[r]}: copyto({views[r]}, {r})", s))
        body += [(line, self.steps[-1]) for line in copies]
        results = [] if into is not None else self._results(mode, key)
        label = mode if hooks is None else f"{mode}+{len(self._line_steps)}"  # names the code objects
        label += "" if split or self._rows is None else ("/into" if into is not None else "/rows")
        if len(feeds) + len(body) + len(results) <= CHUNK_LINES:
            lines = feeds + [line for line, _ in body]
            first = len(feeds)
            steps = {first + k: step for k, (_, step) in enumerate(body)}
            lines.append("return None" if into is not None else f"return {{{', '.join(f'{k}: {v}' for k, v in results)}}}")
        else:
            lines, steps = self._chunks(mode, label, env, feeds, body, results), {}
        params = ("feeds" + (", out, buf" if into is not None else "") + (", observer" if mode == "observe" else "")
                  + (", edits" if hooks is not None else ""))
        return self._define(mode, label, params, lines, steps, env, guarded=mode != "observe")

    def _returned(self, mode: str) -> list[str]:
        """The tensors ``mode`` returns, in order."""
        if mode == "record":
            return list(dict.fromkeys([*self.tensor_names, *self.output_names]))
        return self.output_names

    def _results(self, mode: str, key: Callable[[str], str]) -> list[tuple[str, str]]:
        """(name constant, value expression) of each tensor the mode returns, in order."""
        names = self._returned(mode)
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
            items.append((key(n), value))
        return items

    def _chunks(self, mode: str, label: str, env: dict, feeds: list[str], body: list[tuple[str, Step]],
                results: list[tuple[str, str]]) -> list[str]:
        """The lines of a large plan's main function, which calls the chunk functions it defines.

        Every tensor lives in the list ``s`` (feed ``x{i}`` at ``s[i]``, node output ``t{j}`` after
        the feeds), the result dict is ``r``; each chunk holds whole steps, at most
        :data:`CHUNK_LINES` lines unless one step has more.
        """
        inputs = len(self.input_names)

        def slot(line: str) -> str:
            return _LOCAL.sub(lambda m: f"s[{int(m[2]) + (inputs if m[1] == 't' else 0)}]", line)

        pieces: list[list[tuple[str, Step | None]]] = [[]]
        for line, step in [*body, *((f"r[{k}] = {v}", None) for k, v in results)]:
            starts_step = step is None or not pieces[-1] or pieces[-1][-1][1] is not step
            if len(pieces[-1]) >= CHUNK_LINES and starts_step:
                pieces.append([])
            pieces[-1].append((line, step))
        main = [f"s = [None] * {inputs + len(self._producer)}", "r = {}", *map(slot, feeds)]
        for c, piece in enumerate(pieces):
            name = f"c{c}"
            steps = {k: step for k, (_, step) in enumerate(piece) if step is not None}
            self._define(name, f"{label}.{c}", "s, r, observer, edits, out, buf", [slot(line) for line, _ in piece], steps,
                         env, guarded=False)
            main.append(f"{name}(s, r, {'observer' if mode == 'observe' else 'None'}, "
                        f"{'edits' if '+' in label else 'None'}, {'out, buf' if label.endswith('/into') else 'None, None'})")
        return main + ["return r"]

    def _define(self, name: str, label: str, params: str, lines: list[str], steps: dict[int, Step], env: dict,
                guarded: bool) -> Callable:
        """Compile ``def name(params):`` with ``lines`` as its body into ``env``; ``steps`` maps body
        line indexes to the step they compute, for :meth:`explain`."""
        pad = "        " if guarded else "    "
        source = [f"def {name}({params}):", *(["    try:"] if guarded else []), *(pad + line for line in lines)]
        if guarded:  # a numpy error inside the model becomes a BadModelError naming the node
            source += ["    except LimitExceededError as e:", "        raise explain(e) from e",
                       "    except PolicyportError:", "        raise",
                       "    except FAILURES as e:", "        raise explain(e) from e"]
        offset = 3 if guarded else 2  # the line number of body line 0
        self._line_steps[label] = {offset + k: step for k, step in steps.items()}
        code = compile("\n".join(source), f"<policyport plan:{label}:{id(self)}>", "exec")
        exec(code, env)  # the source holds generated identifiers only (see module docstring)
        return env[name]

    def _emit(self, s: Step, mode: str, env: dict, outputs: set[str], views: dict[str, str] | None = None,
              scratch: bool = False) -> list[str]:
        """The generated lines of one step. ``views`` (result local -> the expression of a view of
        the batch's result array) makes the step write those results there (see :meth:`_compile`);
        with ``scratch`` (a row block's code), a Gemm's product that is not returned goes to the
        thread's :class:`~policyport.runtime.numpy.rows.Scratch` ``buf``, and a ReLU takes its
        zeros from there and overwrites such a product when it is its only reader."""
        res, args = s.results, s.args
        views = views or {}
        view = views.get(res[0]) if res else None
        if s.kind == "gemm":
            out = view or (f"buf.product({s.index}, {args[0]}, {args[1]})" if scratch and self._batched(args[0]) else "")
            lines = [f"{res[0]} = dot({args[0]}, {args[1]}{', ' + out if out else ''})"]
            if len(args) > 2:
                lines.append(f"add({res[0]}, {args[2]}, {res[0]})")  # out positional: less parsing
            return lines
        env[f"f{s.index}"] = s.fn
        src = args[0] if len(args) == 1 else ""
        if scratch and s.kind == "relu" and self._batched(args[0]):
            src = args[0]  # the zero constant is args[1]
            mine = (mode == "run" and src not in views and self._overwritable(src, outputs)
                    and self._producer.get(self._tensor_of[src]) in _FRESH)
            out = view or (src if mine else f"buf.like({s.index}, {src})")
            return [f"{res[0]} = maximum({src}, buf.zeros({src}), out={out})"]
        if view and len(res) == 1 and (s.kind == "relu" or s.kind == "call" and src) and s.op_type in _INTO:
            return [f"{res[0]} = {_INTO[s.op_type].format(src=args[0], out=view)}"]  # the op's own ufunc, into the view
        copies = [f"copyto({views[r]}, {r})" for r in res if r in views]
        if s.kind == "index":
            return [f"{res[0]} = {args[0]}[{args[1]}]", *copies]
        if s.kind == "relu":
            if mode == "run" and not copies and self._overwrites(s, outputs):
                return [f"{res[0]} = maximum({args[0]}, {args[1]}, out={args[0]})"]
            return [f"{res[0]} = maximum({args[0]}, {args[1]})", *copies]
        if copies:  # any other op: computed, then copied into the view while it is in cache
            return [*self._emit(s, mode, env, outputs), *copies]
        if mode == "run" and self._overwrites(s, outputs):
            in_place = f"{_IN_PLACE[s.op_type]}({src}, {src})"  # out positional: less parsing
            if self._producer.get(self._tensor_of[src]) in _FRESH:
                return [f"{res[0]} = {in_place}"]
            return [f"{res[0]} = {in_place} if type({src}) is ndarray else f{s.index}({src})"]
        call = f"f{s.index}({', '.join(args)})"
        if len(res) == 1:
            return [f"{res[0]} = {call}"]
        lines = [f"_r = {call}", "if not isinstance(_r, tuple): _r = (_r,)"]
        return lines + [f"{r} = _r[{j}]" for j, r in enumerate(res) if r != "_"]

    def _batched(self, local: str) -> bool:
        """Whether the feed or node output ``local`` holds a row block's rows (not a constant, nor
        a tensor computed from constants alone, the same in every block)."""
        rows, tensor = self._rows, self._tensor_of.get(local)
        if rows is None or local[:1] not in ("x", "t"):
            return False
        return tensor in rows.inputs if local[0] == "x" else tensor not in rows.whole

    def _overwrites(self, s: Step, outputs: set[str]) -> bool:
        """Whether ``run``, on a batch it runs whole, computes step ``s`` over the array of its one
        input: a ReLU of a Gemm's or Conv's fresh result, or an op of :data:`_IN_PLACE` of one (or
        of an arithmetic op's, when that is an array), which nothing else reads."""
        if s.kind == "relu":
            fresh = _FRESH
        elif s.kind == "call" and s.op_type in _IN_PLACE and len(s.results) == 1 and len(s.args) == 1:
            fresh = _FRESH | _FRESH_IF_ARRAY
        else:
            return False
        src = s.args[0]
        return self._overwritable(src, outputs) and self._producer.get(self._tensor_of[src]) in fresh

    def overwritten(self) -> frozenset[str]:
        """The node outputs that ``run``, on a batch it runs whole, computes over the array of the
        tensor they are computed from (``tanh(t, t)``): the two share one array."""
        outputs = set(self.output_names)
        return frozenset(self._tensor_of[r] for s in self.steps if self._overwrites(s, outputs)
                         for r in s.results if r != "_")

    def aliases(self, mode: str = "run") -> frozenset[str]:
        """The node outputs whose array, on a batch ``mode`` (``"run"`` or ``"record"``) runs whole,
        is the array of a feed or of another node output, or a view of it, holding no memory of its
        own: an Identity's, an inference Dropout's, a constant Slice's, a Transpose's, Squeeze's,
        Unsqueeze's or Split's, and a Reshape's or Flatten's of an array its producer made fresh
        (contiguous). Not those that ``mode`` returns after copying them, as it does a returned
        tensor that may share a feed's or a weight's memory."""
        views = {"Identity", "Transpose", "Squeeze", "Unsqueeze", "Split"}
        fresh = {loc for s in self.steps if s.kind == "gemm" or s.op_type in NEW_MEMORY for loc in s.results}
        returned = set(self._returned(mode))
        found = set()
        for s in self.steps:
            src = s.args[0] if s.args else ""
            if not (s.kind == "index" or s.op_type in views or (s.op_type in ("Reshape", "Flatten") and src in fresh)
                    or (s.op_type == "Dropout" and len(s.args) < 3)) or src[:1] not in ("t", "x"):
                continue
            for r in s.results if s.op_type == "Split" else s.results[:1]:
                tensor = self._tensor_of.get(r)
                if tensor is not None and not (tensor in returned and self._shared.get(r)):
                    found.add(tensor)
        return frozenset(found)

    def _overwritable(self, src: str, outputs: set[str]) -> bool:
        """Whether the node output ``src`` has one reader and is not a graph output: that reader
        may write its result over it (if its producer made it fresh)."""
        return (src.startswith("t") and self._consumers.get(self._tensor_of[src], 0) == 1
                and self._tensor_of[src] not in outputs)

    def explain(self, error: Exception) -> BadModelError:
        """A :class:`BadModelError` naming the node whose computation raised ``error``.

        Generated lines map to steps, so the innermost frame of this plan's code in the traceback
        tells which node failed (a numpy shape or type error from the model itself).
        """
        tb, step = error.__traceback__, None
        while tb is not None:
            filename = tb.tb_frame.f_code.co_filename
            if filename.startswith("<policyport plan:") and filename.endswith(f":{id(self)}>"):
                label = filename.split(":")[1]
                step = self._line_steps[label].get(tb.tb_lineno, step)
            tb = tb.tb_next
        where = "the numpy backend"
        if step is not None:
            node = self.graph.nodes[step.index]
            where = f'{node.op_type} node "{node.name}" on the numpy backend'
        if isinstance(error, LimitExceededError):
            return LimitExceededError(f"{where}: {error}")
        if isinstance(error, MemoryError):
            return LimitExceededError(f"{where} ran out of memory: {error or 'MemoryError'}")
        return BadModelError(f"{where} failed: {type(error).__name__}: {error}")

    def _memory_roots(self) -> dict[str, set[str]]:
        """Local -> the feeds (``x*``) and constants (``k*``) whose memory it may share.

        A result of an op in ``NEW_MEMORY`` (or of the Gemm fast path) shares nothing; any other
        op's results may share memory with every array it reads.
        """
        shared: dict[str, set[str]] = {}
        for s in self.steps:
            if s.kind == "gemm" or s.op_type in NEW_MEMORY:
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


def _infer(node, impl, known: list[Static]) -> dict[str, Static]:
    """What is known of a node's outputs before running: a Constant's value; the element type and
    shape of an op that keeps its input's; the rank of a Gemm (2) or a broadcasting op's result."""
    outs = [o for o in node.outputs if o]
    if not outs or node.domain != "":
        return {}
    first = known[0] if known else Static()
    op_type = node.op_type
    if op_type == "Constant":
        try:
            value = np.asarray(impl.fn(**node.attrs))
        except (ValueError, TypeError, PolicyportError):
            return {}  # the run raises the error, naming the node
        return {outs[0]: Static(value.dtype, tuple(value.shape), value)}
    if op_type in _SAME_AS_INPUT:
        return {outs[0]: Static(first.dtype, first.shape)}
    if op_type == "Gemm":  # (M, N), N from a constant B
        b = known[1].value if len(known) > 1 else None
        n = int(b.shape[0 if node.attrs.get("transB", 0) else 1]) if isinstance(b, np.ndarray) and b.ndim == 2 else None
        return {outs[0]: Static(first.dtype, (None, n))}
    if op_type == "Flatten":
        return {outs[0]: Static(first.dtype, (None, None))}
    if op_type == "Concat" and first.rank is not None:  # its inputs share one rank
        return {outs[0]: Static(first.dtype, (None,) * first.rank)}
    ranks = [k.rank for k in known[:2]]
    rank = max(ranks) if len(ranks) == 2 and None not in ranks else None
    if op_type in _BROADCASTING or (op_type == "MatMul" and rank is not None and min(ranks) >= 2):
        return {outs[0]: Static(first.dtype, None if rank is None else (None,) * rank)}
    if op_type in _COMPARISONS:
        return {outs[0]: Static(np.dtype(bool), None if rank is None else (None,) * rank)}
    if op_type == "Cast":
        try:
            return {outs[0]: Static(onnx_dtype(node.attrs.get("to", 0)), first.shape)}
        except PolicyportError:
            return {}
    return {}


#: Ops each of whose output elements comes from the same element of the first input alone (other
#: inputs, if any, are attributes-like constants: Clip's bounds, Cast's nothing).
_ROW_UNARY = (_SAME_AS_INPUT - {"Softmax", "LogSoftmax", "Hardmax", "Dropout", "PRelu"}) | {"Cast"}
#: Element-wise ops whose inputs broadcast numpy's way.
_ROW_BROADCAST = _BROADCASTING | _COMPARISONS | {"Pow", "PRelu", "Where", "Max", "Min", "Sum", "Mean"}
#: Ops over axis 0 = N of an (N, C, ...) tensor, each sample on its own, with constant other inputs.
_ROW_SAMPLES = {"Conv", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}


@dataclass(frozen=True)
class RowSplit:
    """How a graph that computes row by row is split: ``inputs``, the graph inputs whose axis 0 is
    the batch axis; ``whole``, the tensors computed from constants alone (the same in every block);
    ``ranks``, the rank of each batched tensor (None where unknown)."""

    inputs: tuple[str, ...]
    whole: frozenset[str]
    ranks: dict[str, int | None]


class _RowTracker:
    """Follows the batch axis through a graph, node by node, while the plan compiles it.

    A tensor is *batched* when its axis 0 is the batch axis of the graph inputs (row ``i`` belongs
    to observation ``i``). The graph computes row by row when every node that reads a batched
    tensor is known to compute row ``i`` of its outputs, all batched, from row ``i`` of its batched
    inputs and from whole constants; anything else (a reduction or a Reshape across rows, a Shape,
    a random op, an unknown rank where it matters, another domain) makes the whole graph run whole.
    """

    def __init__(self, graph: Graph, input_names: list[str]):
        declared = {v.name: v for v in [*graph.inputs, *graph.optional_inputs]}
        self.ok = True
        self.batched: dict[str, bool] = {name: False for name in graph.initializers}
        self.rank: dict[str, int | None] = {name: arr.ndim for name, arr in graph.initializers.items()}
        self.inputs: list[str] = []
        for name in input_names:
            v = declared[name]
            if v.shape is None:
                self.ok = False
                continue
            self.rank[name], self.batched[name] = len(v.shape), v.has_batch_axis
            if v.has_batch_axis:
                self.inputs.append(name)
        self.ok = self.ok and bool(self.inputs)

    def node(self, node, impl, kind: str, args: list[str], known: list[Static], static: dict, consts: dict) -> None:
        """Account for one compiled node (``static`` already holds what is known of its outputs)."""
        if not self.ok:
            return
        ins = [t for t in node.inputs if t]
        outs = [o for o in node.outputs if o]
        flags = [self.batched.get(t, False) for t in ins]
        if impl.wants_rng or node.op_type in ("Shape", "Size") or node.domain not in ("", "ai.onnx"):
            self.ok = False  # draws differ per block; a batch's shape is not a block's
            return
        if not any(flags):
            for o in outs:
                self.batched[o], self.rank[o] = False, static.get(o, Static()).rank
            return
        ranks = _row_ranks(node, impl, kind, args, ins, flags, [self.rank.get(t) for t in ins], known, consts)
        if ranks is None:
            self.ok = False
            return
        for o in outs:
            self.batched[o], self.rank[o] = True, ranks

    def result(self) -> RowSplit | None:
        if not self.ok:
            return None
        return RowSplit(tuple(self.inputs), frozenset(t for t, b in self.batched.items() if not b),
                        {t: self.rank.get(t) for t, b in self.batched.items() if b})


def _axis(axis: int, rank: int | None) -> int | None:
    """``axis`` counted from the front (None when it cannot be told or is out of range)."""
    if rank is None or not -rank <= axis < rank:
        return None
    return axis % rank


def _row_ranks(node, impl, kind, args, ins, flags, ranks, known, consts) -> int | None:
    """The rank of a row-wise node's outputs (all batched), or None when the node is not known to
    compute row by row. ``flags`` tell which of ``ins`` are batched, ``ranks`` their ranks."""
    op, attrs, rank = node.op_type, node.attrs, ranks[0]
    only_first = flags[0] and not any(flags[1:])
    if kind == "gemm":  # constant weights, transA = 0
        return 2 if only_first else None
    if kind == "index":  # a constant Slice: rows untouched unless axis 0 is sliced
        index = consts[args[1]]
        return rank if only_first and (not index or index[0] == slice(None)) else None
    if op in _ROW_UNARY or (op == "Dropout" and len(ins) < 3):  # Dropout without training_mode
        return rank if only_first else None
    if op in _ROW_BROADCAST:
        if None in ranks:
            return None
        out = max(ranks)
        for t, batched, r, k in zip(ins, flags, ranks, known):
            if (r != out) if batched else (r == out and k.dim(0) != 1):
                return None  # a batched input without the batch axis first, or a constant along it
        return out
    if op == "Concat":  # along a feature axis, every input batched
        axis = _axis(attrs.get("axis", 0), rank)
        return rank if all(flags) and len(set(ranks)) == 1 and axis else None
    if not only_first:
        return None
    if op in ("Softmax", "LogSoftmax", "Hardmax", "LayerNormalization", "ArgMax", "ArgMin", "Flatten"):
        default = {"Flatten": 1, "ArgMax": 0, "ArgMin": 0, "LayerNormalization": -1}.get(op, 1 if impl.since < 13 else -1)
        axis = _axis(attrs.get("axis", default), rank)
        if not axis:  # None or 0
            return None
        if op == "Flatten":
            return 2
        if op in ("ArgMax", "ArgMin"):
            return rank if attrs.get("keepdims", 1) else rank - 1
        return rank
    if op == "Gemm":  # the call form: a constant B, C broadcast along rows
        c = ranks[2] if len(ins) > 2 else 0
        return 2 if not attrs.get("transA", 0) and (c is not None and c < 2 or known[2].dim(0) == 1) else None
    if op == "MatMul":
        return rank if rank is not None and rank >= 2 and ranks[1] == 2 else None
    if op in _ROW_SAMPLES or (op in ("MaxPool", "BatchNormalization") and len(node.outputs) == 1):
        return rank
    if op == "Reshape":  # a constant shape that keeps axis 0 (0 = copy the dimension)
        shape = known[1].value
        keeps = shape is not None and np.ndim(shape) == 1 and len(shape) > 0 and int(shape[0]) == 0
        return len(shape) if keeps and not attrs.get("allowzero", 0) else None
    if op == "Transpose":
        perm = attrs.get("perm")
        return rank if perm is not None and len(perm) > 0 and perm[0] == 0 else None
    return None
