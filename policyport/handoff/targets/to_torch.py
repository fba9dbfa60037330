"""``to-torch``: a policy as a readable, trainable PyTorch module, checked before it is written.

:func:`to_torch` writes a folder from the :class:`~.plan.LayerPlan` of a model:

- ``policy.py``: a generated ``nn.Module`` (``Policy``) with one ``nn.Linear`` per source layer,
  one activation module per activation node, other trained tensors (a state-independent
  ``log_std``) as ``nn.Parameter`` and observation normaliser statistics and constants as buffers,
  nested as the source nests them so that the ``state_dict`` keys are the source's parameter names
  (``mlp_extractor.policy_net.0.weight``; see :func:`generate` for the names torch cannot hold);
  ``forward`` computes each graph node as one line of torch and returns the graph outputs by name.
  ``load()`` returns the module with its weights. It imports torch alone.
- ``policy.pt``: the ``state_dict`` (``torch.save``; ``load()`` reads it with ``weights_only=True``);
  ``policy.safetensors``: the same tensors in the safetensors format.
- ``parameters.json``: each ``state_dict`` key -> the source's parameter name, the initializer it
  came from, its role, its layout (``"transposed"`` where a ``[in, out]`` kernel became
  ``nn.Linear``'s ``[out, in]`` weight) and ``"key"``: ``"the source's name"``, or why the key
  is a sanitized one (``"sanitized: the source's names are not a torch layer's (NAME.weight,
  NAME.bias); the layer's weight is stored [in, out] by the source, [out, in] by nn.Linear"`` for a
  Keras ``fc_1/kernel``).

Before anything is written the module is imported from the staging folder, loaded by its own
``load()`` and run by torch on sample observations; every tensor must equal the numpy backend's
within the comparison rule of :mod:`policyport.verification.compare`. The folder appears whole or
not at all (:class:`policyport.io.outputs.FolderBuild`).
"""

from __future__ import annotations

import functools
import json
import keyword
import os
import re
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
source layer is an nn.Linear, nested as the source nests it, so that state_dict keys are the
source's parameter names where torch allows them; parameters.json maps each key to the source's
name. Weights are nn.Parameters (trained), observation-normaliser
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
        renamed: the ``state_dict`` keys that are not the source's parameter names (a Keras
            ``fc_1/kernel``, stored transposed, is ``fc_1.weight``) -> those names; empty when every key is.
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
    renamed: dict[str, str] | None = None


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
    source, state, names, renamed = generate(plan)
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
                       count, recorded_assumptions(plan.graph.metadata), given.notes + plan.notes, renamed)


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


class _Member:
    """One thing the generated module holds: a layer or activation module, an ``nn.Parameter`` or a buffer.

    ``path`` is the source's dotted name it should sit at (``mlp_extractor.policy_net.0``), None when the
    source gives none; ``wanted`` the flat attribute name it takes when it cannot (or has no path);
    ``tensors`` its ``state_dict`` entries as (suffix after the path, array, ``parameters.json`` entry).
    An activation module has no path of its own: ``follows`` is the layer it follows and ``slots`` the
    indices it may take in that layer's container (its node's name, then the next index).
    """

    def __init__(self, kind: str, ctor: str, wanted: str, path: str | None = None, comment: str = ""):
        self.kind, self.ctor, self.wanted, self.path, self.comment = kind, ctor, wanted, path, comment
        self.tensors: list[tuple[str, np.ndarray, dict]] = []
        self.follows: _Member | None = None
        self.slots: tuple[str, ...] = ()
        self.placed: tuple[str, ...] | None = None  # where it sits: the segments of its key
        self.why = "the source has no name for it" if path is None else ""


class _Container:
    """A module of the generated tree that only holds other members (``mlp_extractor``)."""

    def __init__(self):
        self.children: dict[str, _Member | _Container] = {}


def _index(segment: str) -> bool:
    """Whether ``segment`` is a position in an ``nn.Sequential`` / ``nn.ModuleList`` (``0``, ``12``)."""
    return re.fullmatch(r"0|[1-9][0-9]*", segment) is not None


def _segment(segment: str) -> bool:
    """Whether ``segment`` can name a child of a generated module: a position, or an identifier that
    names no attribute an ``nn.Module`` has (``training``, ``forward``, ``_parameters`` ...) and that a
    class body does not mangle (``__x``)."""
    if _index(segment):
        return True
    return (segment.isidentifier() and segment.isascii() and not keyword.iskeyword(segment)
            and not segment.startswith("__") and not hasattr(_module_instance(), segment))


class _Writer:
    """Names, state and code lines of the generated module, built step by step: members first, laid
    out as a module tree at the end (:meth:`layout`), so that ``state_dict`` keys are the source's names."""

    def __init__(self, plan: LayerPlan):
        self.plan = plan
        self.init = plan.graph.initializers
        self.taken: set[str] = {"self", "record", "torch", "nn", "Path", "Policy", "load"}  # locals
        self.members: set[str] = {"training", "forward", "load_state_dict", "state_dict"}  # attributes
        self.locals: dict[str, str] = {}
        self.attrs: dict[str, str] = {}  # initializer -> the token of the member that holds it
        self.held: list[_Member] = []
        self.dense_members: dict[str, _Member] = {}  # a Dense's output tensor -> its member
        self.body: list[str] = []
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

    def hold(self, member: _Member) -> str:
        """Register ``member``; the token that reads it in forward (replaced once the tree is laid out)."""
        self.held.append(member)
        return f"\x00{len(self.held) - 1}\x00"

    def tensor(self, t: str) -> str:
        """The code that reads tensor ``t`` inside forward."""
        if t in self.locals:
            return self.locals[t]
        if t in self.init:
            if t not in self.attrs:
                self._stored(t)
            return self.attrs[t]
        raise BadModelError(f"tensor {t!r} is read before any node computes it")

    def _stored(self, t: str) -> None:
        """Register initializer ``t`` as an nn.Parameter (trained) or a buffer, at its source name."""
        value = self.init[t]
        role = self.plan.roles.get(t, "constant")
        source = self.plan.source_names.get(t, t)
        empty = f"torch.empty({tuple(value.shape)!r}, dtype={_torch_dtype(value.dtype, t)})"
        named = t in self.plan.source_names or role != "constant"  # not a graph constant (torch.onnx's "x.1")
        member = _Member("parameter" if role == "parameter" else "buffer", empty, source, source if named else None)
        member.tensors.append(("", value, {"source": source, "initializer": t, "role": role, "layout": "as stored"}))
        self.attrs[t] = self.hold(member)

    def define(self, t: str) -> str:
        """A new local for tensor ``t``."""
        name = self.fresh(t, attribute=False)
        self.locals[t] = name
        return name

    def dense(self, d: Dense) -> None:
        w = self.init[d.weight]
        dtype = "" if w.dtype == np.float32 else f", dtype={_torch_dtype(w.dtype, d.weight)}"
        has_bias = d.bias is not None or d.bias_source is not None
        flat_bias = d.bias is not None and self.init[d.bias].ndim != 1
        torch_named = (d.weight_source == f"{d.name}.weight" and (not has_bias or d.bias_source == f"{d.name}.bias"))
        member = _Member("module", f"nn.Linear({d.in_features}, {d.out_features}, bias={has_bias}{dtype})", d.attribute,
                         d.name if torch_named and not d.transposed and not flat_bias else None, _comment(d.name))
        member.why = "; ".join(why for why, wrong in (
            ("the source's names are not a torch layer's (NAME.weight, NAME.bias)", not torch_named),
            ("the layer's weight is stored [in, out] by the source, [out, in] by nn.Linear", d.transposed),
            ("the source's bias has another shape", flat_bias)) if wrong)
        member.tensors.append(("weight", np.ascontiguousarray(w.T if d.transposed else w),
                               {"source": d.weight_source, "initializer": d.weight, "role": "weight",
                                "layout": "transposed" if d.transposed else "as stored"}))
        if d.bias is not None:
            member.tensors.append(("bias", self.init[d.bias].reshape(-1),
                                   {"source": d.bias_source, "initializer": d.bias, "role": "bias",
                                    "layout": "flattened" if flat_bias else "as stored"}))
        elif has_bias:  # a bias of zeros the model left out: trained from zeros, as in the source
            member.tensors.append(("bias", np.zeros(d.out_features, w.dtype),
                                   {"source": d.bias_source, "initializer": None, "role": "bias",
                                    "layout": "zeros the model leaves out"}))
        x = self.tensor(d.input)
        self.body.append(f"{self.define(d.output)} = {self.hold(member)}({x})")
        self.dense_members[d.output] = member

    def node(self, node) -> None:
        op, attrs = node.op_type, node.attrs
        reads = node.inputs[:1] if op in ("BatchNormalization", "LayerNormalization") else node.inputs  # a module's own
        args = [self.tensor(t) if t and t not in self.literal_only else None for t in reads]
        if op in _MODULES:
            member = _Member("module", _MODULES[op](attrs), node.name or node.outputs[0])
            layer = self.dense_members.get(node.inputs[0])
            dense = next((d for d in self.plan.layers if d.output == node.inputs[0]), None)
            if layer is not None and dense is not None and dense.activation == op:  # its layer's activation
                if identifier(member.wanted) == identifier(dense.name):  # a Keras activation shares its layer's name
                    member.wanted = f"{member.wanted}_{ACTIVATIONS[op]}"
                member.follows = layer
                member.slots = (node.name.split("/")[0],)
            code = f"{self.hold(member)}({args[0]})"
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
        eps = float(node.attrs.get("epsilon", 1e-5))
        tensors = list(zip(("weight", "bias", "running_mean", "running_var"), node.inputs[1:5],
                           ("parameter", "parameter", "normaliser", "normaliser")))
        member = self._norm(node, f"nn.BatchNorm1d({scale.size}, eps={eps!r})", tensors)
        member.comment = "eval(): stored statistics"
        member.tensors.append(("num_batches_tracked", np.array(0, np.int64),
                               {"source": None, "initializer": None, "role": "constant",
                                "layout": "torch's own counter"}))
        return f"{self.hold(member)}({args[0]})"

    def _layer_norm(self, node, args) -> str:
        scale = self.init.get(node.inputs[1])
        axis = int(node.attrs.get("axis", -1))
        if scale is None or scale.ndim != 1 or axis != -1:
            raise BadModelError(f'LayerNormalization node "{node.name}" normalises over axes other than the last '
                                "with a stored scale; targets write nn.LayerNorm over the last axis")
        bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
        eps = float(node.attrs.get("epsilon", 1e-5))
        tensors = [(key, t, "parameter") for key, t in (("weight", node.inputs[1]), ("bias", bias)) if t]
        member = self._norm(node, f"nn.LayerNorm({scale.size}, eps={eps!r}, bias={bias is not None})", tensors)
        return f"{self.hold(member)}({args[0]})"

    def _norm(self, node, ctor: str, tensors: list[tuple[str, str, str]]) -> _Member:
        """The member of a norm layer holding ``tensors`` ((key in the torch layer, initializer, role));
        it sits at the source's name ``P`` when the source names them ``P.weight``, ``P.bias`` ... as torch does."""
        sources = [self.plan.source_names.get(t, t) for _, t, _ in tensors]
        prefix = sources[0][: -len(tensors[0][0]) - 1] if sources[0].endswith(f".{tensors[0][0]}") else None
        torch_named = prefix and all(s == f"{prefix}.{key}" for s, (key, _, _) in zip(sources, tensors))
        member = _Member("module", ctor, node.name or node.outputs[0], prefix if torch_named else None)
        if not torch_named:
            member.why = "the source's names are not a torch norm layer's (NAME.weight, NAME.bias ...)"
        for (key, t, role), source in zip(tensors, sources):
            member.tensors.append((key, self.init[t], {"source": source, "initializer": t, "role": role,
                                                       "layout": "as stored"}))
        return member


    def layout(self) -> tuple[list[str], dict[str, np.ndarray], dict[str, dict], dict[str, str]]:
        """Place every member in the module tree: at the source's dotted name where torch can hold it
        there (so that its ``state_dict`` key is the source's name), else at a flat attribute named after it.

        Returns:
            (the lines of ``__init__``, the ``state_dict``, ``parameters.json``, and the keys that are not
            the source's names -> the source's names).
        """
        root = _Container()
        for m in self.held:  # the source's names first, so that an activation never takes a layer's place
            if m.path is not None:
                segments = tuple(m.path.split("."))
                if not all(_segment(x) for x in segments):
                    m.why = "the name is not a path of torch module names"
                elif (clash := _place(root, segments, m)) is not None:
                    m.why = clash
        for m in self.held:  # an activation at its node's position in its layer's container, or the next one
            layer = m.follows.placed if m.follows is not None else None
            if layer and _index(layer[-1]):
                for slot in m.slots + (".".join(layer[:-1] + (str(int(layer[-1]) + 1),)),):
                    segments = tuple(slot.split("."))
                    if segments[:-1] == layer[:-1] and _index(segments[-1]) and _place(root, segments, m) is None:
                        break
        self.members |= set(root.children)
        for m in self.held:
            if m.placed is not None and m.comment == _comment(".".join(m.placed)):
                m.comment = ""  # the key says it
            if m.placed is None:
                m.placed = (self.fresh(m.wanted),)
                root.children[m.placed[0]] = m
        order = {id(m): i for i, m in enumerate(self.held)}
        lines = _fill(root, "self", order)
        state, names, renamed = {}, {}, {}
        for m in self.held:
            for suffix, value, entry in m.tensors:
                key = ".".join(m.placed + ((suffix,) if suffix else ()))
                source = entry["source"]
                named = source is not None and (entry["initializer"] is None or entry["initializer"] in self.plan.source_names)
                state[key] = value
                names[key] = {**entry, "key": ("torch's own" if source is None else "the source's name" if key == source
                                               else f"sanitized: {m.why}")}
                if named and key != source:
                    renamed[key] = source
        return lines, state, names, renamed


def _place(root: _Container, segments: tuple[str, ...], member: _Member) -> str | None:
    """Put ``member`` at ``segments`` under ``root``; None, or why it cannot sit there."""
    node = root
    for i, segment in enumerate(segments):
        child = node.children.get(segment)
        if child is None:
            break
        if isinstance(child, _Member):
            return f"{'.'.join(segments[:i + 1])} is another of the source's layers or tensors"
        if i == len(segments) - 1:
            return f"{'.'.join(segments)} is a module holding other names of the source"
        node = child
    node = root
    for segment in segments[:-1]:
        node = node.children.setdefault(segment, _Container())
    node.children[segments[-1]] = member
    member.placed = segments
    return None


def _container_kind(container: _Container) -> str:
    """``"Sequential"`` for modules at the positions 0..n-1 (layers and activations), ``"ModuleList"`` where
    some are themselves containers, ``"ModuleDict"`` for modules at positions with gaps, else ``"Module"``."""
    kids = container.children
    if not all(_index(k) and (isinstance(v, _Container) or v.kind == "module") for k, v in kids.items()):
        return "Module"
    if sorted(int(k) for k in kids) != list(range(len(kids))):
        return "ModuleDict"
    return "Sequential" if all(isinstance(v, _Member) for v in kids.values()) else "ModuleList"


def _construct(container: _Container, ref: str, order: dict) -> tuple[list[str], list[str]]:
    """The lines of the expression that builds ``container`` (read as ``ref`` in the code), and the lines
    that fill it afterwards (the members of an ``nn.Module`` container)."""
    kind = _container_kind(container)
    if kind == "Module":
        return ["nn.Module()"], _fill(container, ref, order)
    opening, closing = {"Sequential": ("nn.Sequential(", ")"), "ModuleList": ("nn.ModuleList([", "])"),
                        "ModuleDict": ("nn.ModuleDict({", "})")}[kind]
    lines, after = [opening], []
    for key, child in sorted(container.children.items(), key=lambda kv: int(kv[0])):
        child_ref = f"{ref}[{key!r}]" if kind == "ModuleDict" else f"{ref}[{key}]"
        if isinstance(child, _Member):
            child.ref, built, comment = child_ref, [child.ctor], child.comment
        else:
            (built, more), comment = _construct(child, child_ref, order), ""
            after += more
        built = [(f"{key!r}: " if kind == "ModuleDict" else "") + built[0]] + built[1:]
        built[-1] += "," + (f"  # {comment}" if comment else "")
        lines += ["    " + line for line in built]
    return lines + [closing], after


def _fill(container: _Container, ref: str, order: dict) -> list[str]:
    """The lines that set the members of an ``nn.Module`` container read as ``ref`` (``self`` at the top):
    attributes for identifiers, ``add_module`` / ``register_parameter`` for positions, ``register_buffer``."""
    def first(node) -> int:
        return order[id(node)] if isinstance(node, _Member) else min(first(c) for c in node.children.values())

    lines = []
    for key, child in sorted(container.children.items(), key=lambda kv: first(kv[1])):
        child_ref = f"getattr({ref}, {key!r})" if _index(key) else f"{ref}.{key}"
        after, comment = [], ""
        if isinstance(child, _Member):
            child.ref, comment = child_ref, child.comment
            if child.kind == "buffer":
                lines.append(f"{ref}.register_buffer({key!r}, {child.ctor})")
                continue
            built = [child.ctor if child.kind == "module" else f"nn.Parameter({child.ctor})"]
        else:
            built, after = _construct(child, child_ref, order)
        if _index(key):
            method = "register_parameter" if isinstance(child, _Member) and child.kind == "parameter" else "add_module"
            built = [f"{ref}.{method}({key!r}, {built[0]}"] + built[1:]
            built[-1] += ")"
        else:
            built = [f"{child_ref} = {built[0]}"] + built[1:]
        built[-1] += f"  # {comment}" if comment else ""
        lines += built + after
    return lines


def _comment(name: str) -> str:
    """``name`` for a comment of the generated code: as it is when printable, else its ``repr`` (a
    name holding a line break must not end the comment)."""
    return name if name.isprintable() else repr(name)


@functools.lru_cache(maxsize=1)
def _module_instance():
    """An ``nn.Module``: the attributes every module of the generated tree has (methods, ``training``,
    ``_parameters`` ...), which a child's name must not shadow."""
    import torch

    return torch.nn.Module()


def _module_base():
    """``torch.nn.Module`` (whose methods and attributes a generated attribute must not shadow)."""
    import torch

    return torch.nn.Module


def _torch_dtype(dtype: np.dtype, where: str) -> str:
    text = _TORCH_DTYPES.get(np.dtype(dtype).name)
    if text is None:
        raise BadModelError(f"{where}: element type {np.dtype(dtype).name} has no torch dtype to-torch writes")
    return text


def generate(plan: LayerPlan) -> tuple[str, dict[str, np.ndarray], dict[str, dict], dict[str, str]]:
    """The module's text, its ``state_dict`` (key -> array), ``parameters.json`` (key -> source) and
    the keys that are not the source's names (-> those names).

    The module's tree is the source's: ``mlp_extractor.policy_net.0.weight`` is the weight of an
    ``nn.Linear`` at position 0 of an ``nn.Sequential`` ``policy_net`` (with the activation modules
    at the positions the source's hold) inside an ``nn.Module`` ``mlp_extractor``, so that
    ``state_dict`` keys are the source's names and ``load_state_dict`` takes the source's own tensors.
    A name torch cannot hold as a key (a segment that is no identifier or position, or an attribute
    every ``nn.Module`` has; a weight the source stores ``[in, out]``; a name another one uses as a
    module) becomes a flat attribute made from it (:func:`~.plan.identifier`), and
    ``parameters.json`` says why (``"key"``).

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
    init_lines, state, names, renamed = w.layout()
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
    init = "".join(f"        {line}\n" for line in init_lines)
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
    text = re.sub("\x00([0-9]+)\x00", lambda m: w.held[int(m.group(1))].ref, text)  # members, as laid out
    return text, state, names, renamed
