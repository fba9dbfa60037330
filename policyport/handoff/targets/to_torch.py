"""``to-torch``: a policy as a readable, trainable PyTorch module, checked before it is written.

:func:`to_torch` writes a folder from the :class:`~.plan.LayerPlan` of a model:

- ``policy.py``: a generated ``nn.Module`` (``Policy``) with one ``nn.Linear`` attribute per source
  layer, named after it (:attr:`~.plan.Dense.attribute`), one activation module per activation
  node, other trained tensors (a state-independent ``log_std``) as ``nn.Parameter`` and observation
  normaliser statistics and constants as buffers; ``forward`` computes each graph node as one line
  of torch and returns the graph outputs by name. ``load()`` returns the module with its weights.
  It imports torch alone.
- ``policy.pt``: the ``state_dict`` (``torch.save``; ``load()`` reads it with ``weights_only=True``);
  ``policy.safetensors``: the same tensors in the safetensors format.
- ``parameters.json``: each ``state_dict`` key -> the source's parameter name, the initializer it
  came from, its role and layout (``"transposed"`` where a ``[in, out]`` kernel became
  ``nn.Linear``'s ``[out, in]`` weight).

Before anything is written the module is imported from the staging folder, loaded by its own
``load()`` and run by torch on sample observations; every tensor must equal the numpy backend's
within the comparison rule of :mod:`policyport.verification.compare`. The folder appears whole or
not at all (:class:`policyport.io.outputs.FolderBuild`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import BadModelError, OutputExistsError, UnsupportedOpError, VerificationError
from .plan import ACTIVATIONS, Dense, LayerPlan, identifier, layer_plan

#: The files a to-torch folder holds.
MODULE_FILE, STATE_FILE, SAFETENSORS_FILE, NAMES_FILE = "policy.py", "policy.pt", "policy.safetensors", "parameters.json"
TORCH_FILES = (MODULE_FILE, STATE_FILE, SAFETENSORS_FILE, NAMES_FILE)
#: torch modules for activation ops (ONNX op type -> constructor text, given the node's attributes).
_MODULES = {
    "Tanh": lambda a: "nn.Tanh()",
    "Relu": lambda a: "nn.ReLU()",
    "Sigmoid": lambda a: "nn.Sigmoid()",
    "Elu": lambda a: f"nn.ELU(alpha={float(a.get('alpha', 1.0))!r})",
    "Selu": lambda a: "nn.SELU()",
    "LeakyRelu": lambda a: f"nn.LeakyReLU(negative_slope={float(a.get('alpha', 0.01))!r})",
    "Softplus": lambda a: "nn.Softplus()",
    "Softsign": lambda a: "nn.Softsign()",
    "Gelu": lambda a: f"nn.GELU(approximate={a.get('approximate', 'none')!r})",
    "Mish": lambda a: "nn.Mish()",
    "HardSwish": lambda a: "nn.Hardswish()",
}
_BINARY = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/"}
_UNARY = {"Exp": "torch.exp", "Log": "torch.log", "Sqrt": "torch.sqrt", "Abs": "torch.abs",
          "Reciprocal": "torch.reciprocal", "Erf": "torch.erf"}
_TORCH_DTYPES = {"float16": "torch.float16", "float32": "torch.float32", "float64": "torch.float64",
                 "int8": "torch.int8", "int16": "torch.int16", "int32": "torch.int32", "int64": "torch.int64",
                 "uint8": "torch.uint8", "bool": "torch.bool"}
#: Inputs of these ops read at write time and written into the code (shapes, axes, slice bounds).
_LITERAL_INPUTS = {"Slice": (1, 2, 3, 4), "Reshape": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "Expand": (1,)}

_HEADER = '''"""A policy as a trainable PyTorch module, written by policyport {version} (policyport to-torch).

Policy.forward computes what policyport's numpy backend computes for this model: that was checked
on {samples} observations before this file was written (largest difference {max_abs}). Every
source layer is an nn.Linear attribute named after it; parameters.json maps each state_dict key
to the source's parameter name. Weights are nn.Parameters (trained), observation-normaliser
statistics and constants are buffers (not trained). Needs torch only.

    import policy                          # this file, beside policy.pt
    module = policy.load()                 # Policy with its weights, in eval mode
    outputs = module(obs)                  # graph output name -> tensor: {outputs}
"""

from pathlib import Path

import torch
from torch import nn
'''


@dataclass(frozen=True)
class TorchExport:
    """What :func:`to_torch` wrote.

    Attributes:
        folder: the folder written.
        layers: the dense layers (:meth:`~.plan.LayerPlan.describe`).
        parameters: ``state_dict`` keys of the trained tensors; buffers: of the others.
        samples: observations the module was checked on; max_abs: the largest absolute difference
            from the numpy backend over every tensor compared; tensors: how many were compared.
        assumptions: the model's recorded assumptions (None when it records none).
        notes: what converting the source said, and what the layer plan left out of the model
            (sampled outputs, :func:`~.plan.deterministic_path`).
    """

    folder: Path
    layers: list[dict]
    parameters: list[str]
    buffers: list[str]
    samples: int
    max_abs: float
    tensors: int
    assumptions: list[dict] | None = None
    notes: list[str] | None = None


def to_torch(source, output: str | os.PathLike, *, kind: str | None = None, samples: int = 64, low: float = 0.0,
             high: float = 1.0, seed: int = 0, force: bool = False, **options) -> TorchExport:
    """Write ``output`` (a folder: :data:`TORCH_FILES`), checked first (see the module docstring).

    Args:
        source: an ``onnx.ModelProto`` or ``.onnx`` path, or any source :func:`policyport.convert`
            reads, which is converted and verified against its own forward pass first
            (:func:`.sources.source_model`).
        kind, options: the source kind and :class:`~policyport.converter.ConvertOptions` fields
            (``activation="tanh"``, ``head="diag-gaussian"``, ``trust=True`` ...), as for
            :func:`policyport.convert`.
        output: the folder to write; it must not exist, or (with ``force``) be a folder ``to_torch``
            wrote or an empty one.
        samples: observations the module is checked on (default 64), float32 drawn uniformly from
            ``[low, high)`` (default ``[0, 1)``) with numpy ``default_rng(seed)`` (default 0), as
            :func:`policyport.verification.verify.sample_inputs` draws them.
        force: replace an earlier to-torch folder.
        Sources other than ONNX are verified on 1000 observations drawn the same way.

    Returns:
        :class:`TorchExport`.

    Raises:
        UnsupportedOpError: a node no target writes (:data:`~.plan.TARGET_OPS`), named (exit 3).
        BadModelError: a dense layer or step torch code cannot express as written.
        OutputExistsError: ``output`` exists (without ``force``) or is not a to-torch folder.
        VerificationError: the module, run by torch, differs from the numpy backend; nothing is written.
        MissingDependencyError: torch or safetensors is not installed (``pip install 'policyport[torch]'``).
        OptionError: convert options given with an ONNX model.
        As :func:`policyport.convert` for a source converted here.
    """
    from ...errors import require
    from ...graph.model import recorded_assumptions
    from ...io.outputs import FolderBuild, check_parent
    from ..export_numpy import check_arguments

    check_arguments(samples, low, high, seed)
    torch = require("torch", "torch", "writing a policy as a PyTorch module")
    require("safetensors", "torch", "writing a policy's weights as safetensors")
    output = Path(output)
    _check_output(output, force)
    given = resolve_source(source, kind, options, samples, low, high, seed)
    plan = layer_plan(given.model)
    source, state, names = generate(plan)
    feeds = _feeds(plan, samples, low, high, seed)
    check_parent(output)
    with FolderBuild(output, "to-torch") as build:
        from safetensors.torch import save as safetensors_bytes

        tensors = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in state.items()}
        build.write_bytes(MODULE_FILE, source.replace("@SAMPLES@", str(samples)).encode())
        with build.open(STATE_FILE) as f:
            torch.save(tensors, f)
        build.write_bytes(SAFETENSORS_FILE, safetensors_bytes(tensors, {"format": "pt"}))
        build.write_bytes(NAMES_FILE, (json.dumps(names, indent=1) + "\n").encode())
        module = load_module(build.path / MODULE_FILE).load()
        max_abs, count = check_module(module, plan, feeds)
        text = (build.path / MODULE_FILE).read_text(encoding="utf-8").replace("@MAX_ABS@", f"{max_abs:.3g}")
        os.unlink(build.path / MODULE_FILE)
        build.write_bytes(MODULE_FILE, text.encode())
        build.commit(lambda found: _replaceable(output, found, force))
    trained = [k for k, v in names.items() if v["role"] in ("weight", "bias", "parameter")]
    return TorchExport(output, plan.describe(), trained, [k for k in names if k not in trained], samples, max_abs,
                       count, recorded_assumptions(plan.graph.metadata), given.notes + plan.notes)


def resolve_source(source, kind, options: dict, samples: int, low: float, high: float, seed: int):
    """:func:`.sources.source_model` of ``source``; convert options with an ONNX model are refused."""
    from ...errors import OptionError
    from .sources import is_onnx, source_model

    if is_onnx(source) and kind is None:
        if options:
            named = ", ".join(f"{k} (--{k.replace('_', '-')})" for k in sorted(options))
            raise OptionError(f"{named} applies to a source converted here; {source if isinstance(source, (str, os.PathLike)) else 'the model'} "
                              "is ONNX already (converted with its own options): give its source instead, or drop the option")
        return source_model(source)
    return source_model(source, kind=kind, options=options, samples=max(samples, 1000), low=low,
                        high=high, seed=seed)


def _check_output(output: Path, force: bool) -> None:
    if os.path.lexists(output):
        if not force:
            raise OutputExistsError(f"{output} exists; nothing was written (replace it with --force)")
        if not output.is_dir() or output.is_symlink():
            raise OutputExistsError(f"{output} exists and is not a folder; to-torch writes a folder")


def _replaceable(output: Path, found, force: bool) -> list[str]:
    """What replacing an existing folder at ``output`` deletes: a to-torch folder's files (or
    nothing of an empty one); anything else is refused."""
    if not force:
        raise OutputExistsError(f"{output} appeared meanwhile; nothing was written (replace it with --force)")
    foreign = sorted(set(found.files) - set(TORCH_FILES) | set(found.folders) | set(found.others))
    if foreign:
        raise OutputExistsError(f"{output} holds files to-torch does not write ({', '.join(foreign[:5])}); --force "
                                "replaces only a to-torch folder or an empty one — choose another name")
    return sorted(found.files)


def _feeds(plan: LayerPlan, samples: int, low: float, high: float, seed: int) -> dict[str, np.ndarray]:
    from ...verification.verify import input_ranges, sample_inputs

    graph = plan.graph
    return sample_inputs(graph.inputs, samples, low, high, seed, input_ranges(graph.metadata))


def load_module(path: Path):
    """The generated module at ``path``, imported under a private name (no bytecode written)."""
    from ..export_numpy import _import

    return _import(path)


def check_module(module, plan: LayerPlan, feeds: dict[str, np.ndarray]) -> tuple[float, int]:
    """Run ``module`` (a loaded ``Policy``) by torch on ``feeds`` and compare every tensor it records
    with the numpy backend's, per tensor (:func:`policyport.verification.compare.compare`).

    Returns:
        (the largest absolute difference, the number of tensors compared).

    Raises:
        VerificationError: a tensor differs beyond the tolerance of its dtype, or is missing.
    """
    import torch

    from ...runtime import load

    session = load(plan.graph, backend="numpy")
    want = session.record(feeds, "*")
    want.update(session.run(feeds))
    record: dict = {}
    with torch.no_grad():
        got = module(*(torch.from_numpy(np.ascontiguousarray(feeds[v.name])) for v in plan.graph.inputs), record=record)
    record.update(got)
    inner = {t for d in plan.layers for t in d.inner} | set(plan.aliases)
    found = {k: v.detach().numpy() for k, v in record.items()}
    return compare_tensors(want, found, [t for t in want if t not in inner], "torch", "the generated torch module")


def compare_tensors(want: dict[str, np.ndarray], found: dict[str, np.ndarray], names, framework: str,
                    what: str) -> tuple[float, int]:
    """Compare ``found[name]`` (a target's tensor, computed by ``framework``) with ``want[name]`` (the
    numpy backend's) for each of ``names``, per tensor (:func:`policyport.verification.compare.compare`).

    Returns:
        (the largest absolute difference, the number of tensors compared).

    Raises:
        VerificationError: a tensor is missing, has another dtype or shape, or differs beyond the
            tolerance of its dtype; the message says that nothing was written.
    """
    from ...verification.compare import compare

    worst, count = 0.0, 0
    for name in names:
        value, got = want[name], found.get(name)
        if got is None:
            raise VerificationError(f"{what} does not compute tensor {name!r}; nothing was written")
        if got.shape != value.shape or got.dtype != value.dtype:
            raise VerificationError(f"{what} computes tensor {name!r} as {got.dtype} of shape {got.shape}, the numpy "
                                    f"backend as {value.dtype} of shape {value.shape}; nothing was written")
        result = compare(name, framework, got, "numpy", value)
        if not result.passed:
            raise VerificationError(f"{what} differs from the numpy backend at tensor {name!r} "
                                    f"(max abs {result.max_abs:.3g}); nothing was written")
        worst = max(worst, float(result.max_abs or 0.0))
        count += 1
    return worst, count


# ------------------------------------------------------------------------------------------ code


class _Writer:
    """Names, state and code lines of the generated module, built step by step."""

    def __init__(self, plan: LayerPlan):
        self.plan = plan
        self.init = plan.graph.initializers
        self.taken: set[str] = {"self", "record", "torch", "nn", "Path", "Policy", "load"}  # locals
        self.members: set[str] = {"training", "forward", "load_state_dict", "state_dict"}  # attributes
        self.locals: dict[str, str] = {}
        self.attrs: dict[str, str] = {}  # initializer or node output -> attribute name
        self.init_lines: list[str] = []
        self.body: list[str] = []
        self.state: dict[str, np.ndarray] = {}
        self.names: dict[str, dict] = {}
        self.literal_only = self._literal_only()

    def _literal_only(self) -> set[str]:
        """Initializers every use of which is written as a literal (a shape, axes, slice bounds)."""
        uses: dict[str, list[bool]] = {}
        for step in self.plan.steps:
            if isinstance(step, Dense):
                continue
            for i, t in enumerate(step.inputs):
                if t in self.init:
                    uses.setdefault(t, []).append(i in _LITERAL_INPUTS.get(step.op_type, ()))
        return {t for t, flags in uses.items() if all(flags)}

    def fresh(self, wanted: str, attribute: bool = True) -> str:
        """A new identifier made from ``wanted``: a module attribute, or (``attribute=False``) a local."""
        taken = self.members if attribute else self.taken
        name = identifier(wanted)
        if name in taken or (attribute and hasattr(_module_base(), name)):
            i = 1
            while f"{name}_{i}" in taken:
                i += 1
            name = f"{name}_{i}"
        taken.add(name)
        return name

    def tensor(self, t: str) -> str:
        """The code that reads tensor ``t`` inside forward."""
        if t in self.locals:
            return self.locals[t]
        if t in self.init:
            if t not in self.attrs:
                self._stored(t)
            return f"self.{self.attrs[t]}"
        raise BadModelError(f"tensor {t!r} is read before any node computes it")

    def _stored(self, t: str) -> None:
        """Register initializer ``t`` as an nn.Parameter (trained) or a buffer."""
        value = self.init[t]
        role = self.plan.roles.get(t, "constant")
        source = self.plan.source_names.get(t, t)
        attr = self.fresh(source)
        self.attrs[t] = attr
        dtype = _torch_dtype(value.dtype, t)
        empty = f"torch.empty({tuple(value.shape)!r}, dtype={dtype})"
        if role == "parameter":
            self.init_lines.append(f"self.{attr} = nn.Parameter({empty})")
        else:
            self.init_lines.append(f"self.register_buffer({attr!r}, {empty})")
        self.state[attr] = value
        self.names[attr] = {"source": source, "initializer": t, "role": role, "layout": "as stored"}

    def define(self, t: str) -> str:
        """A new local for tensor ``t``."""
        name = self.fresh(t, attribute=False)
        self.locals[t] = name
        return name

    def dense(self, d: Dense) -> None:
        w = self.init[d.weight]
        attr = self.fresh(d.attribute)
        dtype = "" if w.dtype == np.float32 else f", dtype={_torch_dtype(w.dtype, d.weight)}"
        has_bias = d.bias is not None or d.bias_source is not None
        self.init_lines.append(f"self.{attr} = nn.Linear({d.in_features}, {d.out_features}, bias={has_bias}"
                               f"{dtype})  # {d.name}")
        self.state[f"{attr}.weight"] = np.ascontiguousarray(w.T if d.transposed else w)
        self.names[f"{attr}.weight"] = {"source": d.weight_source, "initializer": d.weight, "role": "weight",
                                        "layout": "transposed" if d.transposed else "as stored"}
        if d.bias is not None:
            self.state[f"{attr}.bias"] = self.init[d.bias].reshape(-1)
            self.names[f"{attr}.bias"] = {"source": d.bias_source, "initializer": d.bias, "role": "bias",
                                          "layout": "as stored" if self.init[d.bias].ndim == 1 else "flattened"}
        elif has_bias:  # a bias of zeros the model left out: trained from zeros, as in the source
            self.state[f"{attr}.bias"] = np.zeros(d.out_features, w.dtype)
            self.names[f"{attr}.bias"] = {"source": d.bias_source, "initializer": None, "role": "bias",
                                          "layout": "zeros the model leaves out"}
        x = self.tensor(d.input)
        self.body.append(f"{self.define(d.output)} = self.{attr}({x})")

    def node(self, node) -> None:
        op, attrs = node.op_type, node.attrs
        reads = node.inputs[:1] if op in ("BatchNormalization", "LayerNormalization") else node.inputs  # a module's own
        args = [self.tensor(t) if t and t not in self.literal_only else None for t in reads]
        if op in _MODULES:
            wanted = node.name or node.outputs[0]
            if identifier(wanted) in self.members:  # a Keras activation shares its Dense layer's name
                wanted = f"{wanted}_{ACTIVATIONS[op]}"
            attr = self.fresh(wanted)
            self.init_lines.append(f"self.{attr} = {_MODULES[op](attrs)}")
            code = f"self.{attr}({args[0]})"
        elif op in _BINARY:
            code = f"{args[0]} {_BINARY[op]} {args[1]}"
        elif op in _UNARY:
            code = f"{_UNARY[op]}({args[0]})"
        elif op == "Neg":
            code = f"-{args[0]}"
        elif op == "Pow":
            code = f"torch.pow({args[0]}, {args[1]})"
        elif op in ("Max", "Min"):
            code = args[0]
            for other in args[1:]:
                code = f"torch.{'maximum' if op == 'Max' else 'minimum'}({code}, {other})"
        elif op == "Clip":
            lo = args[1] if len(args) > 1 and args[1] else (repr(float(attrs["min"])) if "min" in attrs else None)
            hi = args[2] if len(args) > 2 and args[2] else (repr(float(attrs["max"])) if "max" in attrs else None)
            code = f"torch.clamp({args[0]}, min={lo}, max={hi})"
        elif op in ("Softmax", "LogSoftmax"):
            axis = int(attrs.get("axis", -1 if self.plan.graph.opset >= 13 else 1))
            code = f"torch.{'softmax' if op == 'Softmax' else 'log_softmax'}({args[0]}, dim={axis})"
        elif op == "ArgMax":
            if attrs.get("select_last_index", 0):
                raise BadModelError(f'ArgMax node "{node.name}" selects the last index of ties; torch.argmax '
                                    "returns the first")
            code = (f"torch.argmax({args[0]}, dim={int(attrs.get('axis', 0))}, "
                    f"keepdim={bool(attrs.get('keepdims', 1))})")
        elif op == "Slice":
            code = f"{args[0]}[{self._slice(node)}]"
        elif op == "Concat":
            code = f"torch.cat(({', '.join(args)},), dim={int(attrs['axis'])})"
        elif op == "Shape":
            if attrs.get("start", 0) or "end" in attrs:
                raise BadModelError(f'Shape node "{node.name}" takes part of the shape; targets write whole shapes')
            code = f"torch.tensor({args[0]}.shape, dtype=torch.int64)"
        elif op == "Expand":
            shape = (repr(tuple(int(d) for d in self.init[node.inputs[1]])) if node.inputs[1] in self.literal_only
                     else f"tuple({args[1]}.tolist())")
            code = f"{args[0]}.expand(torch.broadcast_shapes({args[0]}.shape, {shape}))"
        elif op == "Reshape":
            code = self._reshape(node, args)
        elif op == "Flatten":
            axis = int(attrs.get("axis", 1))
            code = f"{args[0]}.reshape(1, -1)" if axis == 0 else f"{args[0]}.flatten({axis}).flatten(0, {axis - 1})"
        elif op in ("Squeeze", "Unsqueeze"):
            code = self._axes(node, args)
        elif op in ("Identity", "Dropout"):
            code = args[0]
        elif op == "Cast":
            from ...graph.model import onnx_dtype

            code = f"{args[0]}.to({_torch_dtype(onnx_dtype(int(attrs['to'])), node.name)})"
        elif op == "Constant":
            from ...runtime.numpy import registry

            impl = registry.resolve(op, self.plan.graph.opset, node_name=node.name)
            value = np.asarray(impl.fn(**attrs))
            self.init[node.outputs[0]] = value
            self.plan.roles[node.outputs[0]] = "constant"
            code = self.tensor(node.outputs[0])
            self.locals[node.outputs[0]] = code
            return
        elif op == "BatchNormalization":
            code = self._batch_norm(node, args)
        elif op == "LayerNormalization":
            code = self._layer_norm(node, args)
        elif op in ("Gemm", "MatMul"):
            if op == "Gemm" and (attrs.get("transA", 0) or float(attrs.get("alpha", 1)) != 1
                                 or float(attrs.get("beta", 1)) != 1):
                raise BadModelError(f'Gemm node "{node.name}" uses transA, alpha or beta; targets write x @ W + b')
            b = f"{args[1]}.T" if op == "Gemm" and attrs.get("transB", 0) else args[1]
            code = f"torch.matmul({args[0]}, {b})" + (f" + {args[2]}" if len(args) > 2 and args[2] else "")
        else:
            raise UnsupportedOpError(f'{op} node "{node.name}" has no torch code in to-torch')
        if len([o for o in node.outputs if o]) != 1:
            raise UnsupportedOpError(f'{op} node "{node.name}" has several outputs; targets write one per node')
        self.body.append(f"{self.define(node.outputs[0])} = {code}")

    def _constant(self, t: str) -> list[int]:
        return [int(v) for v in np.asarray(self.init[t]).reshape(-1)]

    def _slice(self, node) -> str:
        inputs = list(node.inputs) + [""] * (5 - len(node.inputs))
        if inputs[1]:
            starts, ends = self._constant(inputs[1]), self._constant(inputs[2])
            axes = self._constant(inputs[3]) if inputs[3] else list(range(len(starts)))
            steps = self._constant(inputs[4]) if inputs[4] else [1] * len(starts)
        else:  # opset < 10: attributes
            starts, ends = list(node.attrs["starts"]), list(node.attrs["ends"])
            axes = list(node.attrs.get("axes", range(len(starts))))
            steps = [1] * len(starts)
        if any(s != 1 for s in steps) or any(a < 0 for a in axes):
            raise BadModelError(f'Slice node "{node.name}" steps or counts axes from the end; targets write '
                                "forward slices on counted axes")
        big = 2 ** 62
        parts = [":"] * (max(axes) + 1)
        for a, s, e in zip(axes, starts, ends):
            parts[a] = f"{'' if s == 0 else s}:{'' if e >= big else e}"
        return ", ".join(parts)

    def _reshape(self, node, args) -> str:
        if node.inputs[1] not in self.literal_only:
            raise BadModelError(f'Reshape node "{node.name}" takes its shape from a computed tensor; targets write '
                                "constant shapes")
        dims = self._constant(node.inputs[1])
        keep = not node.attrs.get("allowzero", 0)
        text = [f"{args[0]}.shape[{i}]" if d == 0 and keep else str(d) for i, d in enumerate(dims)]
        return f"{args[0]}.reshape({', '.join(text)})"

    def _axes(self, node, args) -> str:
        axes = (self._constant(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1]
                else list(node.attrs.get("axes", [])))
        if node.op_type == "Squeeze":
            return f"{args[0]}.squeeze({tuple(axes)!r})" if axes else f"{args[0]}.squeeze()"
        code = args[0]
        for a in sorted(axes):
            code = f"{code}.unsqueeze({a})"
        return code

    def _batch_norm(self, node, args) -> str:
        scale = self.init.get(node.inputs[1])
        if scale is None or any(t not in self.init for t in node.inputs[1:5]) or node.attrs.get("training_mode", 0):
            raise BadModelError(f'BatchNormalization node "{node.name}" reads computed statistics or trains; targets '
                                "write inference batch normalisation with stored statistics")
        attr = self.fresh(node.name or node.outputs[0])
        eps = float(node.attrs.get("epsilon", 1e-5))
        self.init_lines.append(f"self.{attr} = nn.BatchNorm1d({scale.size}, eps={eps!r})  # eval(): stored statistics")
        for key, t, role in zip(("weight", "bias", "running_mean", "running_var"), node.inputs[1:5],
                                ("parameter", "parameter", "normaliser", "normaliser")):
            self.state[f"{attr}.{key}"] = self.init[t]
            self.names[f"{attr}.{key}"] = {"source": self.plan.source_names.get(t, t), "initializer": t, "role": role,
                                           "layout": "as stored"}
        self.state[f"{attr}.num_batches_tracked"] = np.array(0, np.int64)
        self.names[f"{attr}.num_batches_tracked"] = {"source": None, "initializer": None, "role": "constant",
                                                     "layout": "torch's own counter"}
        return f"self.{attr}({args[0]})"

    def _layer_norm(self, node, args) -> str:
        scale = self.init.get(node.inputs[1])
        axis = int(node.attrs.get("axis", -1))
        if scale is None or scale.ndim != 1 or axis != -1:
            raise BadModelError(f'LayerNormalization node "{node.name}" normalises over axes other than the last '
                                "with a stored scale; targets write nn.LayerNorm over the last axis")
        bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
        attr = self.fresh(node.name or node.outputs[0])
        eps = float(node.attrs.get("epsilon", 1e-5))
        self.init_lines.append(f"self.{attr} = nn.LayerNorm({scale.size}, eps={eps!r}, bias={bias is not None})")
        for key, t in (("weight", node.inputs[1]), ("bias", bias)):
            if t:
                self.state[f"{attr}.{key}"] = self.init[t]
                self.names[f"{attr}.{key}"] = {"source": self.plan.source_names.get(t, t), "initializer": t,
                                               "role": "parameter", "layout": "as stored"}
        return f"self.{attr}({args[0]})"


def _module_base():
    """``torch.nn.Module`` (whose methods and attributes a generated attribute must not shadow)."""
    import torch

    return torch.nn.Module


def _torch_dtype(dtype: np.dtype, where: str) -> str:
    text = _TORCH_DTYPES.get(np.dtype(dtype).name)
    if text is None:
        raise BadModelError(f"{where}: element type {np.dtype(dtype).name} has no torch dtype to-torch writes")
    return text


def generate(plan: LayerPlan) -> tuple[str, dict[str, np.ndarray], dict[str, dict]]:
    """The module's text, its ``state_dict`` (key -> array) and ``parameters.json`` (key -> source).

    The text holds ``@SAMPLES@`` and ``@MAX_ABS@`` placeholders that :func:`to_torch` fills in once
    the module has been checked. No string from the model reaches the code except through
    :func:`~.plan.identifier` (identifiers) or ``repr`` (record keys, output names).
    """
    from ...version import __version__

    w = _Writer(plan)
    graph = plan.graph
    params = [w.fresh(v.name, attribute=False) for v in graph.inputs]
    for v, p in zip(graph.inputs, params):
        w.locals[v.name] = p
    for step in plan.steps:
        if isinstance(step, Dense):
            w.dense(step)
        else:
            w.node(step)
    recorded = [t for t in w.locals if t not in {v.name for v in graph.inputs}]
    returned = ", ".join(f"{v.name!r}: {w.tensor(v.name)}" for v in graph.outputs)
    record_items = "".join(f"\n                {t!r}: {w.locals[t]}," for t in recorded)
    forward = (f"    def forward(self, {', '.join(params)}, record=None):\n"
               '        """The graph outputs by name (tensors); ``record`` (a dict), when given, receives every\n'
               '        tensor the graph computes, by its ONNX name."""\n'
               + "".join(f"        {line}\n" for line in w.body)
               + "        if record is not None:\n"
               + f"            record.update({{{record_items}\n            }})\n"
               + f"        return {{{returned}}}\n")
    init = "".join(f"        {line}\n" for line in w.init_lines)
    header = _HEADER.format(version=__version__, samples="@SAMPLES@", max_abs="@MAX_ABS@",
                            outputs=", ".join(repr(v.name) for v in graph.outputs))
    text = (header + "\n\nclass Policy(nn.Module):\n"
            '    """The policy: dense layers named after the source\'s, activations, normaliser buffers, head."""\n\n'
            "    def __init__(self):\n        super().__init__()\n" + init + "\n" + forward
            + "\n\ndef load():\n"
            '    """A Policy with the weights of policy.pt (beside this file), in eval mode."""\n'
            "    module = Policy()\n"
            f'    state = torch.load(Path(__file__).with_name({STATE_FILE!r}), weights_only=True)\n'
            "    module.load_state_dict(state)\n"
            "    return module.eval()\n")
    return text, w.state, w.names
