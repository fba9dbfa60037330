"""``export-numpy``: a policy as one readable Python module over numpy, checked before it is written.

:func:`export_numpy` turns a model in the MLP op set (:data:`EXPORT_OPS`) into two files: a module
with ``forward(obs, record=None, overrides=None)`` — straight-line numpy, one line per node, each
tensor a local named after the graph's tensor — and a ``.npz`` of the same name beside it holding the
weights under the source's parameter names, in the source's layout (exactly
:func:`policyport.graph.passes.extract_weights`; the module applies the transposes the parameter map
records). It follows the numpy backend's compiled plan (:class:`~policyport.runtime.numpy.plan.Plan`):
the same numpy calls in the same order, the op implementations the plan calls copied from the
registry where one line of numpy would not be the same computation. Before anything is written the
module is imported from a temporary folder and run on observations drawn as ``pack`` draws them, and
every tensor must equal the numpy backend's bit for bit; both files are then moved into place
together (or neither is).

No string from the model reaches the generated code except as a ``repr`` literal: identifiers are
made from tensor names by keeping ``[A-Za-z0-9_]`` only, and the original names appear as quoted
``record`` keys and in ``INPUTS`` / ``OUTPUTS``.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import inspect
import keyword
import math
import os
import re
import secrets
import shutil
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import BadModelError, InputMismatchError, UnsupportedOpError, VerificationError

#: The ops export-numpy writes: the MLP op set.
EXPORT_OPS = frozenset({
    "Gemm", "MatMul", "Add", "Sub", "Mul", "Div",
    "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "ThresholdedRelu", "Sigmoid", "HardSigmoid",
    "HardSwish", "Tanh", "Softplus", "Softsign", "Mish", "Gelu", "Erf", "Exp", "Log", "Neg", "Abs", "Sqrt",
    "Reciprocal", "Slice", "Concat", "Clip", "Reshape", "Flatten", "Softmax", "LogSoftmax", "ArgMax",
    "BatchNormalization", "LayerNormalization", "Identity", "Dropout", "Constant", "Cast",
})
#: Constants with at most this many elements are written into the code; larger ones go to the .npz.
INLINE_ELEMENTS = 16
#: Plain numpy element types the generated module handles.
_PLAIN = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                    "float16", "float32", "float64"})
#: Names the module defines itself (imports, module constants, the functions of its tail, the
#: parameters and locals of forward); tensors and weights never take them, nor a builtin's, a
#: keyword's or a helper's that the module copies from the registry (see :func:`generate`).
_RESERVED = {"np", "math", "Path", "forward", "record", "overrides", "tap", "checked", "observer", "seen", "WEIGHTS",
             "INPUTS", "OUTPUTS", "TENSORS", "ASSUMPTIONS", "ONNX_DTYPES", "onnx_dtype"} | set(dir(builtins))
#: One-line numpy for ops whose plan step is a plain call of the same numpy function.
_INLINE: dict[str, Callable[[list[str]], str]] = {
    "Add": lambda a: f"{a[0]} + {a[1]}",
    "Sub": lambda a: f"{a[0]} - {a[1]}",
    "Mul": lambda a: f"{a[0]} * {a[1]}",
    "MatMul": lambda a: f"{a[0]} @ {a[1]}",
    "Tanh": lambda a: f"np.tanh({a[0]})",
    "Relu": lambda a: f"np.maximum({a[0]}, 0)",
    "Exp": lambda a: f"np.exp({a[0]})",
    "Neg": lambda a: f"-{a[0]}",
    "Abs": lambda a: f"np.abs({a[0]})",
    "Sqrt": lambda a: f"np.sqrt({a[0]})",
    "Reciprocal": lambda a: f"np.reciprocal({a[0]})",
    "Identity": lambda a: a[0],
}

_HEADER = '''"""A policy's forward pass in numpy, written by policyport {version} (policyport export-numpy).

forward() computes what policyport's numpy backend computes for this model, bit for bit: that was
checked on {samples} observations before this file was written. The weights are read from the .npz
file of the same name beside this one, under the source's own parameter names. Needs numpy only.
ASSUMPTIONS lists what the model assumes that its source file does not record (an activation given
when it was converted, no observation normaliser ...): the model matches its source given those.

    import numpy as np
    import policy                                    # this file, as policy.py beside policy.npz
    outputs = policy.forward(obs)                    # graph output name -> array (see OUTPUTS)
    record = {{}}
    policy.forward(obs, record=record)               # every tensor by name, before and after each activation
    policy.forward(obs, overrides={{"TENSOR": {{17: 1.0}}}})  # set neuron 17 (last axis) of TENSOR first
"""

{imports}from pathlib import Path

import numpy as np
'''

_TAP = '''def checked(name, value):
    """The input ``name`` as an array, after checking its dtype and shape against INPUTS."""
    value = np.asarray(value)
    dtype, shape = INPUTS[name]
    fits = shape is None or (value.ndim == len(shape) and all(
        not isinstance(d, int) or d <= 0 or d == n for d, n in zip(shape, value.shape)))
    if value.dtype != np.dtype(dtype) or not fits:
        hint = " (add a batch axis: x[None])" if shape is not None and value.ndim == len(shape) - 1 else ""
        raise ValueError(f"input {name!r} expects {dtype} of shape {shape}, got {value.dtype} of shape "
                         f"{value.shape}{hint}")
    return value


def observer(record, overrides):
    """What forward does with each tensor: set the chosen neurons (last axis), then record it."""
    if record is None and not overrides:
        return lambda name, value: value
    settings = {}  # tensor -> [(neuron, value)]; neurons given as ints or as text "17" / "3,17"
    for name, chosen in (overrides or {}).items():
        if name not in TENSORS:
            raise KeyError(f"overrides name tensor {name!r}, which this policy does not compute; it has: "
                           + ", ".join(TENSORS))
        for key, setting in chosen.items():
            parts = str(key).split(",") if isinstance(key, str) else [key]
            if not all(isinstance(n, (int, np.integer)) and n >= 0 or isinstance(n, str) and n.strip().isdigit()
                       for n in parts):
                raise ValueError(f"overrides of {name!r}: {key!r} is not a neuron number (or a comma list of them)")
            settings.setdefault(name, []).extend((int(n), setting) for n in parts)

    def seen(name, value):
        chosen = settings.get(name)
        if chosen:
            value = np.array(value)  # a copy: the tensor it came from stays as computed
            for neuron, setting in chosen:
                if neuron >= value.shape[-1]:
                    raise IndexError(f"overrides of {name!r}: neuron {neuron} is out of range; it has "
                                     f"{value.shape[-1]}")
                value[..., neuron] = setting
        if record is not None:
            record[name] = value
        return value

    return seen
'''


_BLOCKS = '''def in_blocks(compute, inputs, record, overrides):
    """A batch of SPLIT_ROWS rows or more, computed as policyport's numpy backend computes it: in as
    few blocks of at most BLOCK_ROWS rows (sizes differing by one at most) as hold it, the blocks'
    rows joined; a tensor of WHOLE (computed from constants alone) is the same in each block."""
    rows = len(inputs[BATCHED[0]])
    count = -(-rows // BLOCK_ROWS)
    size, extra = divmod(rows, count)
    outputs, records, start = [], [], 0
    for i in range(count):
        stop = start + size + (i < extra)
        part = None if record is None else {}
        args = [value[start:stop] if name in BATCHED else value for name, value in inputs.items()]
        outputs.append(compute(*args, tap=observer(part, overrides)))
        records.append(part)
        start = stop

    def joined(name, values):
        return values[0] if name in WHOLE else np.concatenate(values)

    if record is not None:
        record.update({name: joined(name, [r[name] for r in records]) for name in records[0]})
    return {name: joined(name, [o[name] for o in outputs]) for name in outputs[0]}
'''


@dataclass(frozen=True)
class Exported:
    """What :func:`export_numpy` wrote: the module, its weights, the module's length in lines, the
    number of tensors ``forward`` records and of observations it was checked on, and the model's
    assumptions as its metadata records them (:func:`policyport.graph.model.recorded_assumptions`: dicts
    of ``topic``, ``assumes``, ``because``, ``settle``; ``None`` when it records none), which the
    module lists as ``ASSUMPTIONS``."""

    module: Path
    weights: Path
    lines: int
    tensors: int
    samples: int
    assumptions: list[dict] | None = None


def export_numpy(model, output: str | os.PathLike, *, samples: int = 64, low: float = 0.0, high: float = 1.0,
                 seed: int = 0, force: bool = False) -> Exported:
    """Write ``output`` (a ``.py`` module) and the ``.npz`` of its weights beside it, checked first.

    Args:
        model: an ``onnx.ModelProto`` or a path to an ``.onnx`` file or packed folder.
        output: the module to write, ending in ``.py``; the weights go to the same path with ``.npz``.
        samples: how many observations the module is checked on (default 64), drawn uniformly from
            ``[low, high)`` (default ``[0, 1)``) with numpy ``default_rng(seed)`` (default 0), as
            :func:`policyport.verification.verify.sample_inputs` draws them; one more run checks batch 1.
        force: replace existing regular files at both paths.

    Returns:
        :class:`Exported`.

    Raises:
        UnsupportedOpError: a node outside :data:`EXPORT_OPS` (the message names it), or one the
            module cannot write (several outputs, a computed shape, a training-mode Dropout).
        BadModelError: an element type other than plain numpy's.
        InputMismatchError: ``output`` does not end in ``.py``; inputs observations cannot be drawn for.
        OutputExistsError: an output exists (without ``force``) or is not a regular file.
        VerificationError: the generated module does not reproduce the numpy backend (nothing written).
        UnreadableFileError: the outputs' folder cannot be written in, or writing fails (a full disk),
            naming both outputs; nothing is written.
        MissingDependencyError: onnx is not installed.
    """
    from ..io.outputs import check_distinct, check_writable
    from ..io.limits import check_memory
    from ..graph.onnx_files import ensure_model
    from ..graph.model import from_onnx, recorded_assumptions
    from ..runtime import load
    from ..runtime.batch import free_checked
    from ..verification.verify import input_ranges, sample_inputs

    check_arguments(samples, low, high, seed)
    output = Path(output)
    if output.suffix != ".py":
        raise InputMismatchError(f"{output}: the module to write must end in .py (its weights go beside it as .npz)")
    weights_path = output.with_suffix(".npz")
    for path in (output, weights_path):
        check_writable(path, force)
        if isinstance(model, (str, os.PathLike)):
            check_distinct(path, model)
    proto = free_checked(ensure_model(model), "numpy").model  # a fixed batch of 1 freed, as pack does
    graph = from_onnx(proto)
    source, arrays = generate(proto, samples)
    session = load(graph, backend="numpy")
    feeds = sample_inputs(graph.inputs, samples, low, high, seed, input_ranges(graph.metadata))
    check_memory(_check_needs(session, feeds), f"checking the module on {samples:,} observations")
    tmp = _staging(output)
    try:
        from ..io.outputs import weights_comment
        from ..io.arrays import write_npz

        try:
            (tmp / output.name).write_text(source, encoding="utf-8")
            write_npz(tmp / weights_path.name, arrays, weights_comment("policyport export-numpy"))
        except OSError as e:  # a full disk, a quota: say which outputs
            from ..errors import UnreadableFileError

            raise UnreadableFileError(f"writing {output} and {weights_path} failed: {e.strerror or e}; nothing was "
                                      "written") from e
        module = _import(tmp / output.name)
        names = [v.name for v in graph.inputs]
        for batch in (feeds, {k: v[:1] for k, v in feeds.items()}):
            _check(module, session, batch, names)
        _commit([(tmp / output.name, output), (tmp / weights_path.name, weights_path)], force)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Exported(output, weights_path, source.count("\n"), len(session.tensor_names), samples,
                    recorded_assumptions(graph.metadata))


def check_arguments(samples, low, high, seed) -> None:
    """How observations are drawn for a check (``pack``, ``export_numpy``), checked before any work.

    Raises:
        ArgumentTypeError, InputMismatchError: see :func:`policyport.errors.check_argument`.
    """
    from ..errors import check_argument

    check_argument(samples, "samples (observations to draw)", "int", 1)
    check_argument(low, "low (the smallest observation value drawn)", "real")
    check_argument(high, "high (the bound of the observation values drawn)", "real")
    check_argument(seed, "seed", "int", 0, none=True)


def _check_needs(session, feeds: dict[str, np.ndarray]) -> int:
    """The bytes :func:`_check` holds at its peak: the numpy backend's record of every tensor and its
    run, and the module's own record of every tensor, computed whole, as a whole batch's record; a
    batch the module computes in row blocks holds its blocks' records too while it joins them."""
    from ..runtime.numpy.rows import SPLIT_ROWS

    sizes = session.tensor_sizes(feeds)
    if sizes is None:
        return 0
    record = session.backend.memory_needed(sizes, sizes.rows, session.tensor_names)
    whole = sum(sizes.nbytes(sizes.rows).values())
    blocked = sizes.rows >= SPLIT_ROWS and getattr(session.backend, "plan", None) is not None \
        and session.backend.plan.row_split is not None
    return record + session.backend.memory_needed(sizes, sizes.rows, None) + (3 if blocked else 2) * whole


def _check(module, session, feeds: dict[str, np.ndarray], names: list[str]) -> None:
    """The generated ``forward`` against the numpy backend, every tensor bit for bit, both with the BLAS
    held to one thread as the backend holds it in its row blocks (numpy alone cannot hold it, and some
    BLAS kernels, OpenBLAS's Haswell one among them, round a product on two threads differently)."""
    import contextlib

    from ..runtime.blas import one_thread
    from ..runtime.packed import same_bits

    with one_thread() or contextlib.nullcontext():
        want = session.record(feeds, "*")
        record: dict[str, np.ndarray] = {}
        got = module.forward(*(feeds[n] for n in names), record=record)
        outputs = session.run(feeds)
    pairs = [(name, record.get(name), value) for name, value in want.items()]
    pairs += [(f"output {name}", got.get(name), value) for name, value in outputs.items()]
    for name, found, value in pairs:
        if found is None or not same_bits(np.asarray(found), value):
            raise VerificationError(
                f"the generated module does not reproduce the numpy backend on tensor {name!r} "
                f"(batch {len(next(iter(feeds.values())))}); nothing was written — this is a bug in policyport, "
                "please report it"
            )


# ----------------------------------------------------------------------------------------- codegen


def generate(model, samples: int = 64) -> tuple[str, dict[str, np.ndarray]]:
    """The module's source and the arrays of its ``.npz`` (not checked; see :func:`export_numpy`).

    Raises:
        As :func:`export_numpy`, but for writing and checking.
    """
    from ..graph.model import from_onnx
    from ..graph.passes import extract_weights, parameter_map
    from ..runtime.numpy import Plan
    from ..runtime.numpy.registry import resolve

    graph = from_onnx(model)
    for node in graph.nodes:
        if node.op_type not in EXPORT_OPS or node.domain not in ("", "ai.onnx"):
            raise UnsupportedOpError(
                f'{node.op_type} node "{node.name}" is outside the op set export-numpy writes '
                f"({', '.join(sorted(EXPORT_OPS))}); run the model with policyport.load or pack it instead"
            )
        if sum(1 for o in node.outputs if o) > 1:
            raise UnsupportedOpError(f'{node.op_type} node "{node.name}" has {len(node.outputs)} outputs; '
                                     "export-numpy writes nodes with one output")
    for v in [*graph.inputs, *graph.outputs]:
        if v.dtype.name not in _PLAIN:
            raise BadModelError(f"graph input/output {v.name!r} is {v.dtype.name}; export-numpy writes plain numpy types")
    plan = Plan(graph)
    weights, mapping = extract_weights(model), parameter_map(model)
    impls = [resolve(node.op_type, graph.opsets.get(node.domain, graph.opset), node.domain, node.name)
             for node in graph.nodes]

    def write(reserved: frozenset[str]) -> tuple[_Writer, list[str]]:
        writer = _Writer(graph, mapping, weights, reserved)
        body = []
        for step, node, impl in zip(plan.steps, graph.nodes, impls):
            expr = writer.expression(step, node, impl, plan)
            out = next(o for o in node.outputs if o)
            note = f"  # {node.op_type}" + (f" node {node.name!r}" if node.name and node.name != out else "")
            body.append(f"    {writer.local(out)} = tap({out!r}, {expr}){note}")
        return writer, body

    # A helper is copied when a node first needs it, after earlier tensors took their names: the
    # second pass reserves the helpers' names (and the values they read) before naming any tensor.
    writer, _ = write(frozenset())
    writer, body = write(frozenset(writer.helpers) | frozenset(writer.values))
    return writer.module(body, samples, plan.row_split), writer.stored


class _Writer:
    """Names, constants and helper functions of one generated module."""

    def __init__(self, graph, mapping: dict[str, dict], weights: dict[str, np.ndarray], reserved=frozenset()):
        self.graph = graph
        self.weights = weights
        self.used = set(_RESERVED) | set(keyword.kwlist) | set(keyword.softkwlist) | set(reserved)
        self.locals: dict[str, str] = {}
        self.constants: dict[tuple[str, str], str] = {}  # (initializer, layout) -> name
        self.constant_lines: list[str] = []
        self.stored: dict[str, np.ndarray] = dict(weights)
        self.helpers: dict[str, str] = {}  # name -> source, in first-use order
        self.values: dict[str, str] = {}  # helper constant name -> source line
        self.params = [self.local(v.name) for v in graph.inputs]
        self.sources: dict[str, tuple[str, list[int] | None]] = {}
        for name in graph.initializers:
            spec = mapping.get(name)
            if spec is not None and spec["name"] in weights:
                perm = None if spec["transpose"] is None else [int(p) for p in spec["transpose"]]
                self.sources[name] = (spec["name"], perm)
        names = [key for key, _ in self.sources.values()]
        cut = os.path.commonprefix(names).rfind("/") + 1 if len(names) > 1 else 0
        self.prefix = cut

    def _name(self, text: str, upper: bool) -> str:
        ident = re.sub(r"[^0-9A-Za-z_]+", "_", text).strip("_")
        ident = ident.upper() if upper else ident.lower()
        if not ident or ident[0].isdigit():
            ident = ("W_" if upper else "t_") + ident
        candidate, n = ident, 2
        while candidate in self.used or keyword.iskeyword(candidate):
            candidate, n = f"{ident}_{n}", n + 1
        self.used.add(candidate)
        return candidate

    def local(self, tensor: str) -> str:
        if tensor not in self.locals:
            self.locals[tensor] = self._name(tensor, upper=False)
        return self.locals[tensor]

    def operand(self, tensor: str, layout: str = "as stored") -> str:
        """The code for an input of a node: a local, a weight constant or a small literal."""
        if not tensor:
            return "None"
        if tensor not in self.graph.initializers:
            return self.local(tensor)
        key = (tensor, layout)
        if key in self.constants:
            return self.constants[key]
        value = self.graph.initializers[tensor]
        if value.dtype.name not in _PLAIN:
            raise BadModelError(f"initializer {tensor!r} is {value.dtype.name}; export-numpy writes plain numpy types")
        if tensor in self.sources:
            stored, perm = self.sources[tensor]
            name = self._name(stored[self.prefix:], upper=True)
            code = f"WEIGHTS[{stored!r}]"
            if layout == "gemm B":  # the plan lays B out [K, N] once: transpose(B) if transB
                perm = _compose(perm, [1, 0]) if perm is not None else [1, 0]
            if perm is not None and perm != list(range(len(perm))):
                code = f"np.ascontiguousarray({code}.T)" if perm == [1, 0] else \
                    f"np.ascontiguousarray(np.transpose({code}, {tuple(perm)!r}))"
        else:
            if layout == "gemm B":
                value = np.ascontiguousarray(value.T)
            name = self._name(tensor, upper=True)
            if value.size <= INLINE_ELEMENTS:
                code = _literal(value)
            else:
                key_name = tensor if tensor not in self.stored else f"constants/{tensor}"
                if key_name in self.stored:
                    raise BadModelError(f"initializer {tensor!r} collides with a parameter of the same name")
                self.stored[key_name] = value
                code = f"WEIGHTS[{key_name!r}]"
        self.constant_lines.append(f"{name} = {code}")
        self.constants[key] = name
        return name

    def expression(self, step, node, impl, plan) -> str:
        attrs = dict(node.attrs)
        op = node.op_type
        if step.kind == "gemm":
            layout = "gemm B" if attrs.get("transB", 0) else "as stored"
            a, b = self.operand(node.inputs[0]), self.operand(node.inputs[1], layout)
            c = self.operand(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
            return f"np.dot({a}, {b})" + (f" + {c}" if c else "")
        if step.kind == "index":
            return f"{self.operand(node.inputs[0])}[{_index(plan._consts[step.args[1]])}]"
        args = [self.operand(t) for t in node.inputs]
        while args and args[-1] == "None":
            args.pop()
        if op == "Dropout":
            mode = node.inputs[2] if len(node.inputs) > 2 else ""
            if mode and (mode not in self.graph.initializers or self.graph.initializers[mode].any()):
                raise UnsupportedOpError(f'Dropout node "{node.name}" may run in training mode; '
                                         "export-numpy writes inference only")
            return args[0]
        if op in _INLINE and not attrs:
            return _INLINE[op](args)
        if op == "Div" and self._floating(node.inputs[0]):
            return f"{args[0]} / {args[1]}"
        if op == "Concat":
            return f"np.concatenate(({', '.join(args)},), axis={int(attrs['axis'])})"
        if op == "Cast":
            dtype = _dtype_name(int(attrs["to"]), node)
            return f"{args[0]}.astype(np.{dtype}, copy=False)"
        if op == "Constant":
            value = impl.fn(**attrs)
            if value.dtype.name not in _PLAIN:
                raise UnsupportedOpError(f'Constant node "{node.name}" holds {value.dtype.name} values; '
                                         "export-numpy writes plain numpy types")
            return _literal(value)
        if op == "Reshape" and node.inputs[1] in self.graph.initializers:
            shape = self.graph.initializers[node.inputs[1]].tolist()
            keep = not attrs.get("allowzero", 0)
            dims = [f"{args[0]}.shape[{i}]" if d == 0 and keep else str(int(d)) for i, d in enumerate(shape)]
            return f"np.reshape({args[0]}, ({', '.join(dims)},))"
        if op == "Reshape":
            raise UnsupportedOpError(f'Reshape node "{node.name}" takes its shape from tensor {node.inputs[1]!r}, '
                                     "computed at run time; export-numpy writes constant shapes only")
        if op == "Slice" and any(t and t not in self.graph.initializers for t in node.inputs[1:]):
            raise UnsupportedOpError(f'Slice node "{node.name}" takes its bounds from tensors computed at run '
                                     "time; export-numpy writes constant bounds only")
        name = self._helper(impl.fn)
        if "node_outputs" in inspect.signature(impl.fn).parameters:
            attrs["node_outputs"] = 1
        keywords = [f"{k}={_literal(v)}" for k, v in attrs.items()]
        return f"{name}({', '.join(args + keywords)})"

    def _floating(self, tensor: str) -> bool:
        value = self.graph.initializers.get(tensor)
        if value is not None:
            return value.dtype.kind == "f"
        info = next((v for v in self.graph.inputs if v.name == tensor), None)
        if info is not None:
            return info.dtype.kind == "f"
        return False  # unknown: the registered Div, which handles integers too

    def _helper(self, fn: Callable) -> str:
        """Copy ``fn`` (an op implementation) and what it uses into the module; its name there."""
        name = fn.__name__
        if name in self.helpers:
            return name
        if name == "onnx_dtype":
            self.helpers[name] = _ONNX_DTYPE
            self.values["ONNX_DTYPES"] = _onnx_dtypes_line()
            return name
        self.used.add(name)
        self.helpers[name] = ""  # reserved before its dependencies, which may call it back
        lines = textwrap.dedent(inspect.getsource(fn)).splitlines()
        while lines and lines[0].startswith("@"):
            lines.pop(0)
        self.helpers[name] = "\n".join(re.sub(r"\s*# noqa\b.*$", "", line) for line in lines) + "\n"
        for ref in _globals_used(fn):
            value = fn.__globals__.get(ref)
            if ref in ("np", "math") or value is None:
                continue
            if inspect.isfunction(value):
                self._helper(value)
            elif ref not in self.values:
                self.used.add(ref)
                self.values[ref] = f"{ref} = {_literal(value)}"
        return name

    def module(self, body: list[str], samples: int, row_split=None) -> str:
        """The module's text: the header, the values and helpers the body reads, and ``forward``.

        ``row_split`` (the numpy backend plan's :class:`~policyport.runtime.numpy.plan.RowSplit`, or
        ``None``): a graph that computes row by row gets the backend's row blocks too, so that
        ``forward`` gives the backend's bits at every batch size (a BLAS product of 512 rows may round
        otherwise than the same rows inside a larger product)."""
        from ..version import __version__
        from ..graph.model import recorded_assumptions

        def info(values) -> dict:
            return {v.name: (v.dtype.name, None if v.shape is None else tuple(v.shape)) for v in values}

        helpers = [source for source in self.helpers.values()]
        tensors = tuple(dict.fromkeys(o for n in self.graph.nodes for o in n.outputs if o))
        statements = [
            f"INPUTS = {info(self.graph.inputs)!r}\nOUTPUTS = {info(self.graph.outputs)!r}\nTENSORS = {tensors!r}",
            _assumptions_lines(recorded_assumptions(self.graph.metadata)),
            'WEIGHTS = dict(np.load(Path(__file__).with_suffix(".npz"), allow_pickle=False))',
            "\n".join(self.constant_lines),
            "\n".join(self.values.values()),
        ]
        params = ", ".join([*self.params, "record=None", "overrides=None"])
        returned = ", ".join(f"{v.name!r}: {self.local(v.name)}" for v in self.graph.outputs)
        checks = "".join(f"    {p} = checked({v.name!r}, {p})\n" for p, v in zip(self.params, self.graph.inputs))
        doc = ('    """The graph outputs by name; ``record`` (a dict) receives every tensor, ``overrides``\n'
               '    ({tensor name: {neuron: value}}) sets neurons of tensors before the rest of the graph sees them."""\n')
        parts = [*helpers, _TAP]
        if row_split is None:
            parts.append(f"def forward({params}):\n{doc}    tap = observer(record, overrides)\n{checks}"
                         + "\n".join(body) + f"\n    return {{{returned}}}")
        else:
            from ..runtime.numpy.rows import BLOCK_ROWS, SPLIT_ROWS

            names = ", ".join(self.params)
            local = dict(zip([v.name for v in self.graph.inputs], self.params))
            feeds = ", ".join(f"{v.name!r}: {p}" for p, v in zip(self.params, self.graph.inputs))
            statements.append(f"SPLIT_ROWS, BLOCK_ROWS = {SPLIT_ROWS}, {BLOCK_ROWS}\n"
                              f"BATCHED = {tuple(row_split.inputs)!r}\n"
                              f"WHOLE = {tuple(t for t in tensors if t in row_split.whole)!r}")
            parts += [_BLOCKS,
                      f"def forward({params}):\n{doc}{checks}"
                      f"    if {local[row_split.inputs[0]]}.shape[0] >= SPLIT_ROWS:\n"
                      f"        return in_blocks(compute, {{{feeds}}}, record, overrides)\n"
                      f"    return compute({names}, tap=observer(record, overrides))",
                      f"def compute({names}, tap):\n"
                      '    """The graph on one batch (or block of rows), each tensor passed through ``tap``."""\n'
                      + "\n".join(body) + f"\n    return {{{returned}}}"]
        imports = "import math\n" if any("math." in h for h in helpers) else ""
        text = _HEADER.format(version=__version__, samples=samples, imports=imports).rstrip("\n")
        text += "".join(f"\n\n{part}" for part in statements if part)
        text += "".join(f"\n\n\n{part.strip()}" for part in parts)
        return text + "\n"


def _assumptions_lines(assumptions: list[dict] | None) -> str:
    """The module's ``ASSUMPTIONS``: each assumption of the model as ``policyport verify`` words it
    (:func:`policyport.verification.compare.assumption_text`), a ``repr`` literal on a line of its own."""
    from ..verification.compare import assumption_text

    comment = "# What the model assumes that its source file does not record (policyport recorded it in the model).\n"
    if assumptions is None:
        return comment + "ASSUMPTIONS = None  # the model does not say: converted elsewhere, or by an older policyport"
    if not assumptions:
        return comment + "ASSUMPTIONS = ()  # nothing beyond its source file"
    return comment + "ASSUMPTIONS = (\n" + "".join(f"    {assumption_text(a)!r},\n" for a in assumptions) + ")"


_ONNX_DTYPE = '''def onnx_dtype(code):
    """The numpy dtype of an ONNX element type code (TensorProto.DataType in onnx.proto)."""
    return np.dtype(ONNX_DTYPES[code])
'''


def _onnx_dtypes_line() -> str:
    from ..graph.model import ONNX_TO_NUMPY

    names = {code: dtype.name for code, dtype in ONNX_TO_NUMPY.items() if dtype.name in _PLAIN}
    return f"ONNX_DTYPES = {names!r}"


def _dtype_name(code: int, node) -> str:
    from ..graph.model import ONNX_TO_NUMPY

    dtype = ONNX_TO_NUMPY.get(code)
    if dtype is None or dtype.name not in _PLAIN:
        raise UnsupportedOpError(f'Cast node "{node.name}" casts to ONNX element type {code}; '
                                 "export-numpy writes plain numpy types")
    return dtype.name


def _globals_used(fn: Callable) -> list[str]:
    """Global names a function reads: in its code (nested code objects included) and in its
    parameters' default values, which the module evaluates when it defines the function."""
    import dis

    names: list[str] = []
    defaults = [*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()]
    if defaults:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        args = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)).args
        for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            names += [n.id for n in ast.walk(default) if isinstance(n, ast.Name) and n.id not in names]
    todo = [fn.__code__]
    while todo:
        code = todo.pop()
        for instruction in dis.get_instructions(code):
            if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME") and instruction.argval not in names:
                names.append(instruction.argval)
        todo += [k for k in code.co_consts if inspect.iscode(k)]
    return names


def _compose(first: list[int], then: list[int]) -> list[int]:
    """The permutation of ``np.transpose(np.transpose(x, first), then)``."""
    return [first[i] for i in then]


def _literal(value: Any) -> str:
    """Python source for an attribute or constant: ints, floats, strings (repr), tuples, arrays."""
    if isinstance(value, (bool, np.bool_)):
        return repr(bool(value))
    if isinstance(value, (int, np.integer)):
        return repr(int(value))
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return repr(f) if math.isfinite(f) else f"float({str(f)!r})"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "(" + "".join(f"{_literal(v)}, " for v in value).rstrip(" ") + ")"
    if isinstance(value, (set, frozenset)):
        return "frozenset({" + ", ".join(_literal(v) for v in sorted(value)) + "})"
    if isinstance(value, np.ndarray) and value.dtype.name in _PLAIN:
        return f"np.array({_literal_nested(value.tolist())}, dtype=np.{value.dtype.name})"
    raise BadModelError(f"export-numpy cannot write a value of type {type(value).__name__} into the module")


def _literal_nested(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_literal_nested(v) for v in value) + "]"
    return _literal(value)


def _index(index: tuple) -> str:
    """``[:, 0:2]`` for ``(slice(None), slice(0, 2, 1))``."""
    parts = []
    for s in index:
        text = ("" if s.start is None else str(int(s.start))) + ":" + ("" if s.stop is None else str(int(s.stop)))
        if s.step not in (None, 1):
            text += f":{int(s.step)}"
        parts.append(text)
    return ", ".join(parts) + ("," if len(parts) == 1 else "")


# ------------------------------------------------------------------------------------------ files


def _staging(output: Path) -> Path:
    from ..errors import UnreadableFileError

    for _ in range(100):
        folder = output.parent / f".{output.name}.export-{secrets.token_hex(4)}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
        except OSError as e:
            raise UnreadableFileError(f"cannot write in {output.parent}: {e}") from e
    raise BadModelError(f"cannot find a free temporary name beside {output}")


def _import(path: Path):
    """The module at ``path``, imported under a private name without writing bytecode."""
    name = f"_policyport_export_{secrets.token_hex(8)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = writes
    return module


def _commit(staged: list[tuple[Path, Path]], force: bool) -> None:
    """Move every staged file onto its destination, or none of them (old files restored); noted as
    placed once all are (:func:`policyport.io.outputs.noting_placed`)."""
    from ..io.outputs import check_writable, note_placed, unnote_placed

    for _, final in staged:
        check_writable(final, force)
    aside: list[tuple[Path, Path]] = []
    placed: list[Path] = []
    try:
        for tmp, final in staged:
            if os.path.lexists(final):
                old = final.with_name(f".{final.name}.replaced-{secrets.token_hex(4)}")
                os.rename(final, old)
                aside.append((old, final))
            os.rename(tmp, final)
            placed.append(final)
        note_placed(*placed)
    except BaseException:
        for final in placed:
            os.unlink(final)
        for old, final in aside:
            os.rename(old, final)
        unnote_placed(placed)
        raise
    for old, _ in aside:
        os.unlink(old)
