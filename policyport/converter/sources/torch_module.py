"""Live ``torch.nn.Module`` s and TorchScript files to ONNX, named by module path, verified with hooks.

The module is exported with ``torch.onnx.export`` — the TorchScript-based exporter
(``dynamo=False``, the default here) or the ``torch.export``-based one (``dynamo=True``, which needs
``onnxscript`` and writes opset 18 or newer) — in eval mode (each submodule's mode is restored
afterwards), with a dynamic batch axis, and without constant folding (``do_constant_folding=False``;
the dynamo exporter runs with ``optimize=False``). Folding would turn state_dict entries into
anonymous constants of another layout: a ``GRU``/``LSTM``'s ``weight_ih_l<k>``, ``weight_hh_l<k>``,
``bias_*`` re-laid into the ``W``, ``R``, ``B`` inputs of ONNX ``GRU``/``LSTM`` (gates reordered, biases
concatenated), a normaliser's ``_std + eps`` or ``sqrt(running_var + eps)`` computed into one tensor.
Unfolded, every entry the forward reads is an initializer holding the entry as stored, and the graph
computes the rest at run time, as torch does. Then one graph pass makes the result read like the
source, whichever exporter ran:

* every node is attributed to the module that computed it — the TorchScript exporter encodes the
  module scope in node names (``/mlp_extractor/policy_net/policy_net.0/Gemm``), the dynamo exporter
  records it in each node's ``pkg.torch.onnx.name_scopes`` metadata — and its output tensor is
  renamed ``<module path>/<role>`` (``mlp_extractor.policy_net.0/linear``,
  ``mlp_extractor.policy_net.1/tanh``); the nodes inside one module call (a GELU decomposition) are
  ``<module path>/<role>/<op>``; functional ops in a custom ``forward`` are ``<module path>/<op>``;
* graph input ``obs`` for a module of one input; for a ``forward`` of several, one graph input per
  parameter under the parameter's name, in ``forward``'s order (:func:`module_examples`); outputs
  ``logits`` (one tensor), the names given, ``output_<i>`` (a tuple) or the keys (a dict);
* each initializer is matched to the ``state_dict`` tensor it holds, by bytes, directly or
  transposed (a bias-free ``Linear`` becomes ``MatMul`` on ``Transpose(weight)``, which is laid out
  in the initializer once), renamed to that key where no other tensor has the name, and recorded in
  ``metadata_props["policyport.parameters"]`` (with the transpose, and the other keys of a tied or
  de-duplicated tensor), so that :func:`policyport.graph.passes.extract_weights` returns the state_dict;
  a small integer entry no op reads (``num_batches_tracked``, a normaliser's sample count) is recorded
  as a value, and any other entry the graph does not hold is named in a note.

The reference forward pass runs the module in torch with a forward hook on every submodule and
names each submodule's output as the graph names it. A TorchScript module takes no hooks; its
``nn.Sequential`` parts are run child by child instead.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...errors import BadModelError, OptionError, UnsupportedOpError, listing, require
from ...io.schema import load_json

#: Output-tensor roles of common leaf modules (any other class: its name in snake_case).
ROLES = {
    "Linear": "linear", "Tanh": "tanh", "ReLU": "relu", "ELU": "elu", "SELU": "selu", "LeakyReLU": "leaky_relu",
    "SiLU": "silu", "GELU": "gelu", "Softplus": "softplus", "Mish": "mish", "Hardswish": "hardswish",
    "Sigmoid": "sigmoid", "LayerNorm": "layer_norm", "BatchNorm1d": "batch_norm", "Flatten": "flatten",
    "Dropout": "dropout", "Identity": "identity", "Softmax": "softmax", "ReLU6": "relu6", "Hardtanh": "hardtanh",
}
DYNAMO_MIN_OPSET = 18


def _torch(purpose: str = "converting a torch module"):
    return require("torch", "torch", purpose)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


@dataclass
class Export:
    """What the export pass learnt: the model, and where each module's output went.

    Attributes:
        model: the renamed ``onnx.ModelProto``.
        module_tensors: module path -> the graph tensor holding that module's output.
        module_inputs: leaf module path -> the graph tensor it reads (its one non-constant input).
        output_names: the graph outputs, in the order the module returns them.
        notes: what a user should hear about.
        training: the module, or one of its submodules, was in training mode (it was exported in
            eval mode, which :func:`module_assumptions` records).
        input_names: the graph inputs, in ``forward``'s order (``["obs"]`` for a module of one input).
    """

    model: object
    module_tensors: dict[str, str]
    output_names: list[str]
    notes: list[str] = field(default_factory=list)
    module_inputs: dict[str, str] = field(default_factory=dict)
    training: bool = False
    input_names: list[str] = field(default_factory=lambda: ["obs"])


# ---------------------------------------------------------------------------------------------
# export


def input_shape_of(module, given: tuple[int, ...] | None) -> tuple[int, ...]:
    """The observation shape (without batch): ``given``, or the first ``Linear``'s ``in_features``.

    Raises:
        BadModelError: no shape given and no ``Linear`` (or a ``Flatten`` before it) to read it from.
    """
    if given:
        return tuple(int(d) for d in given)
    for _, sub in module.named_modules():
        kind = _class_name(sub)
        if kind in ("Flatten", "Unflatten", "Conv1d", "Conv2d", "Embedding"):
            break
        if kind == "Linear":
            return (int(sub.weight.shape[1]),)
    raise BadModelError(
        "cannot tell the observation shape from the module (its first layer is not a Linear); "
        "give it with --input-shape (input_shape=(2, 3) in Python), without the batch axis"
    )


def forward_parameters(module) -> tuple[list[tuple[str, bool]], str | None]:
    """``forward``'s positional parameters after ``self``: ``[(name, required)]`` in order, and the
    name of its ``*args`` (``None`` without one). A TorchScript module's come from its compiled
    schema (``module.forward.schema``), any other's from :func:`inspect.signature`."""
    import inspect

    torch = _torch()
    if isinstance(module, torch.jit.ScriptModule):
        arguments = module.forward.schema.arguments[1:]  # the first is self
        return [(a.name, not a.has_default_value()) for a in arguments], None
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):  # a forward inspect cannot read (a builtin): one input
        return [("input", True)], None
    named, varargs = [], None
    for p in signature.parameters.values():
        if p.kind == p.VAR_POSITIONAL:
            varargs = p.name
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            named.append((p.name, p.default is p.empty))
    return named, varargs


def module_examples(module, *, input_shape=None, input_dtypes: dict[str, str] | None = None,
                    example_inputs=None) -> dict[str, object]:
    """The inputs ``module`` is traced and checked with, by graph input name, in ``forward``'s order.

    A module that takes one input (one required parameter, or one example) keeps the graph input name
    ``obs``; a module taking several names each after its ``forward`` parameter. ``example_inputs``
    (a tuple in ``forward``'s order, or a mapping by parameter name; numpy arrays or torch tensors of
    shape ``(batch, ...)``) are used as given, dtype included; else each input is made from its shape
    (``input_shape``: a tuple for one input, read from the first ``Linear`` when not given, or a mapping
    by parameter name) and dtype (``input_dtypes`` by parameter name, or ``obs`` for the one input;
    default the module's floating dtype): floating inputs standard normal (seed 0), bool inputs True,
    integer inputs 0.

    Returns:
        graph input name -> ``torch.Tensor`` of shape ``(batch, *shape)``.

    Raises:
        OptionError: an example, shape or dtype for a parameter ``forward`` does not take; a required
            parameter with none (naming it); examples and shapes both given; examples that do not share
            one batch size.
        ArgumentTypeError: an example that is neither a numpy array nor a torch tensor, or has no batch axis.
        BadModelError: one input, no shape given and no first ``Linear`` to read it from.
    """
    params, varargs = forward_parameters(module)
    if not params and not varargs:
        raise BadModelError("the module's forward takes no input; policyport exports a policy of its observations")
    if example_inputs is not None:
        if input_shape is not None or input_dtypes:
            raise OptionError("example_inputs carry their own shapes and dtypes; leave input_shape and input_dtypes out")
        given = _named_examples(params, varargs, example_inputs)
        if not given:
            raise OptionError(f"example_inputs is empty; give forward{_signature(params)} its inputs")
    else:
        given = _made_examples(module, params, input_shape, input_dtypes or {})
    required = [name for name, needed in params if needed and name not in given]
    if required:
        raise OptionError(f"forward{_signature(params)} needs {listing(required)} too; give "
                          + ("each input: example_inputs=(...) or {name: array}" if example_inputs is not None else
                             " ".join(f"--input-shape {n}=D[,D...]" for n in required) + " (input_shape={name: shape} in Python)"))
    order = [name for name, _ in params] + sorted(set(given) - {name for name, _ in params})
    skipped = [name for name in order[:max(order.index(n) for n in given) + 1] if name not in given]
    if skipped:
        raise OptionError(f"forward{_signature(params)} takes its inputs by position: give {listing(skipped)} too "
                          "(an input left at its default can only follow every input given)")
    tensors = [given[name] for name in order if name in given]
    if len({int(t.shape[0]) for t in tensors}) > 1:
        raise OptionError("example_inputs must share their first (batch) axis; got shapes "
                          + ", ".join(f"{n} {tuple(given[n].shape)}" for n in order if n in given))
    if len(tensors) == 1:
        return {"obs": tensors[0]}
    return {name: given[name] for name in order if name in given}


def _signature(params) -> str:
    return "(" + ", ".join(name for name, _ in params) + ")"


def _named_examples(params, varargs: str | None, examples) -> dict[str, object]:
    """``example_inputs`` by parameter name, as torch tensors (see :func:`module_examples`)."""
    from ...errors import ArgumentTypeError

    torch = _torch()
    names = [name for name, _ in params]
    if isinstance(examples, dict):
        unknown = [k for k in examples if k not in names]
        if unknown:
            raise OptionError(f"example_inputs names {listing(unknown)}, which forward{_signature(params)} does not take")
        named = dict(examples)
    elif isinstance(examples, (tuple, list)):
        if len(examples) > len(names) and varargs is None:
            raise OptionError(f"forward{_signature(params)} takes {len(names)} input{'s' * (len(names) != 1)}; "
                              f"example_inputs holds {len(examples)}")
        names += [f"{varargs}_{i}" for i in range(len(examples) - len(names))]
        named = dict(zip(names, examples))
    else:
        raise ArgumentTypeError(f"example_inputs must be a tuple of inputs in forward's order or a dict by parameter "
                                f"name, not {type(examples).__name__}")
    tensors = {}
    for name, value in named.items():
        if not isinstance(value, (np.ndarray, torch.Tensor)) or value.ndim < 1 or value.shape[0] < 1:
            raise ArgumentTypeError(f"example input {name!r} must be a numpy array or torch tensor with a batch axis "
                                    f"(shape (batch, ...)), not {type(value).__name__} {getattr(value, 'shape', value)!r:.80}")
        tensors[name] = torch.as_tensor(np.ascontiguousarray(value) if isinstance(value, np.ndarray) else value).detach().cpu()
    return tensors


def _made_examples(module, params, input_shape, dtypes: dict[str, str]) -> dict[str, object]:
    """Inputs made from their shapes and dtypes (see :func:`module_examples`)."""
    torch = _torch()
    names = [name for name, _ in params]
    if isinstance(input_shape, dict):
        shapes = dict(input_shape)
    else:
        first = [name for name, needed in params if needed][:2] or names[:1]
        if len(first) > 1:
            raise OptionError(f"forward{_signature(params)} takes several inputs; give each one's shape without the "
                              f"batch axis: " + " ".join(f"--input-shape {n}=D[,D...]" for n in first)
                              + " (input_shape={name: shape}, or example_inputs=, in Python)")
        if not first:
            raise OptionError("the module's forward takes its inputs as *args, which name none; give example_inputs=(...)")
        shapes = {first[0]: input_shape_of(module, input_shape)}
        if "obs" in dtypes and "obs" not in names:  # the one input by its graph name
            dtypes = {first[0] if k == "obs" else k: v for k, v in dtypes.items()}
    unknown = [k for k in [*shapes, *dtypes] if k not in names]
    if unknown:
        raise OptionError(f"{listing(dict.fromkeys(unknown))}: forward{_signature(params)} takes no such input "
                          "(--input-shape and --input-dtype name forward's parameters)")
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for name, shape in shapes.items():
        dtype = getattr(torch, dtypes[name]) if name in dtypes else _param_dtype(module)
        if dtype.is_floating_point:
            tensors[name] = torch.randn((2, *shape), generator=generator).to(dtype)
        elif dtype == torch.bool:
            tensors[name] = torch.ones((2, *shape), dtype=dtype)
        else:
            tensors[name] = torch.zeros((2, *shape), dtype=dtype)
    no_shape = [k for k in dtypes if k not in shapes]
    if no_shape:
        raise OptionError(f"--input-dtype names {listing(no_shape)}, whose shape is not given; add "
                          + " ".join(f"--input-shape {n}=D[,D...]" for n in no_shape))
    return tensors


def _param_dtype(module):
    torch = _torch()
    for p in list(module.parameters()) + list(module.buffers()):
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def _output_names(result, given: tuple[str, ...] | None, inputs: tuple[str, ...] = ("obs",)) -> list[str]:
    torch = _torch()
    if isinstance(result, torch.Tensor):
        names = ["logits"]
    elif isinstance(result, dict):
        names = [str(k) for k in result]
    elif isinstance(result, (tuple, list)) and all(isinstance(r, torch.Tensor) for r in result):
        names = [f"output_{i}" for i in range(len(result))]
    else:
        raise BadModelError(
            f"the module returns {type(result).__name__}; policyport exports a tensor, a tuple of tensors or a dict of tensors"
        )
    if given:
        if len(given) != len(names):
            raise OptionError(f"{len(given)} output names given ({', '.join(given)}) for a module with {len(names)} outputs")
        if set(inputs) & set(given):
            raise OptionError(f"output names must not be {listing(inputs, show=repr)}, the graph input"
                              f"{'s' * (len(inputs) > 1)}: {', '.join(given)}")
        names = list(given)
    if len(set(names)) != len(names) or set(inputs) & set(names):
        raise BadModelError(f"output names must be distinct and not {listing(inputs, show=repr)}: {names}")
    return names


@contextlib.contextmanager
def _eval_mode(module):
    """Eval mode for the export, each submodule's own mode restored afterwards."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


@contextlib.contextmanager
def _quiet():
    """Silence the exporters' progress prints, deprecation warnings, logging and the graph dumps
    torch's C++ side writes to file descriptors 1 and 2 on failure (library code never prints)."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "onnxscript", "torch.export", "torch._dynamo", "torch")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    saved: dict[int, int] = {}
    try:
        with open(os.devnull, "w") as devnull:
            for fd in (1, 2):  # torch's C++ logging (a graph dump on failure) writes to the descriptors
                saved[fd] = os.dup(fd)
                os.dup2(devnull.fileno(), fd)
    except OSError:  # no descriptors to silence (an embedded interpreter): carry on
        pass
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _export_raw(module, examples: dict, names: list[str], exporter: str, opset: int):
    """``torch.onnx.export`` of ``module`` on ``examples`` (graph input name -> tensor, in ``forward``'s
    order), every input and output with a dynamic batch axis 0."""
    torch = _torch()
    inputs, args = list(examples), tuple(examples.values())
    if exporter == "dynamo":
        require("onnxscript", "torch", "the dynamo exporter (--exporter dynamo)")
        batch = torch.export.Dim("batch")  # one batch size shared by every input
        program = torch.onnx.export(
            module, args, dynamo=True, input_names=inputs, output_names=names, opset_version=opset,
            dynamic_shapes=tuple({0: batch} for _ in args), verbose=False, optimize=False,
        )
        return program.model_proto
    f = io.BytesIO()
    torch.onnx.register_custom_op_symbolic("aten::softplus", _softplus_symbolic, opset)
    try:
        torch.onnx.export(
            module, args, f, dynamo=False, input_names=inputs, output_names=names, opset_version=opset,
            dynamic_axes={n: {0: "batch"} for n in [*inputs, *names]}, do_constant_folding=False,
        )
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::softplus", opset)
    onnx = require("onnx", "onnx", "building an ONNX model")
    return onnx.load_from_string(f.getvalue())


def _softplus_symbolic(g, x, beta, threshold):
    """``nn.Softplus(beta, threshold)`` exactly: ``x`` where ``beta * x > threshold``, else
    ``log(1 + exp(beta * x)) / beta`` (``torch.nn.functional.softplus``). The TorchScript exporter's
    own form drops the threshold; ONNX ``Softplus`` has neither parameter, and onnxruntime runs it in
    float32 only, so a float64 graph spells it with Exp and Log."""
    torch = _torch()
    from torch.onnx import symbolic_helper

    dtype = {"Double": torch.float64, "Half": torch.float16}.get(x.type().scalarType(), torch.float32)
    beta_v = float(symbolic_helper._maybe_get_const(beta, "f"))
    threshold_v = float(symbolic_helper._maybe_get_const(threshold, "f"))
    const = lambda v: g.op("Constant", value_t=torch.tensor(v, dtype=dtype))  # noqa: E731
    scaled = x if beta_v == 1 else g.op("Mul", x, const(beta_v))
    if dtype == torch.float64:
        soft = g.op("Log", g.op("Add", g.op("Exp", scaled), const(1.0)))
    else:
        soft = g.op("Softplus", scaled)
    if beta_v != 1:
        soft = g.op("Div", soft, const(beta_v))
    return g.op("Where", g.op("Greater", scaled, const(threshold_v)), x, soft)


def export_module(module, *, exporter: str = "torchscript", opset: int = 17,
                  input_shape: tuple[int, ...] | dict | None = None, output_names: tuple[str, ...] | None = None,
                  state_dict: dict[str, np.ndarray] | None = None, input_dtypes: dict[str, str] | None = None,
                  example_inputs=None) -> Export:
    """Export ``module`` and rename the result after the source (see the module docstring).

    Args:
        module: a ``torch.nn.Module`` or TorchScript module taking one observation tensor, or several.
        exporter: ``"torchscript"`` or ``"dynamo"``.
        opset: the ONNX opset (the dynamo exporter writes 18 or newer).
        input_shape: the observation shape without the batch axis (default: from the first Linear), or
            one per ``forward`` parameter by name (see :func:`module_examples`).
        input_dtypes, example_inputs: see :func:`module_examples`.
        output_names: names for the module's outputs (default: ``logits`` / ``output_<i>`` / the dict keys).
        state_dict: the source's parameters by name (default: ``module.state_dict()``).

    A bfloat16 module is exported as a float32 copy of itself (exact), since torch.onnx writes its
    graph in bfloat16, for which onnxruntime's CPU provider has no kernels; its parameters are then
    stored back as bfloat16 initializers, each followed by a ``Cast`` to float32
    (:func:`~policyport.converter.build.store_half_parameters`), and the graph takes float32 observations.

    Raises:
        BadModelError: a module the exporter refuses, or outputs that cannot be named.
        OptionError: inputs that do not fit ``forward`` (:func:`module_examples`), an unknown exporter, dynamo on a TorchScript module, an opset newer than the exporter writes.
        UnsupportedOpError: an op with no ONNX form at ``opset`` (names the module and the op).
        MissingDependencyError: torch (or onnxscript for dynamo) is not installed.
    """
    torch = _torch()
    notes: list[str] = []
    if exporter not in ("torchscript", "dynamo"):
        raise OptionError(f"unknown exporter {exporter!r}; choose torchscript or dynamo")
    if exporter == "dynamo" and isinstance(module, torch.jit.ScriptModule):
        raise OptionError("the dynamo exporter cannot trace a TorchScript module; use --exporter torchscript")
    newest = _newest_opset(torch, exporter)
    if opset > newest:
        raise OptionError(f"opset {opset} is out of range for the {exporter} exporter: torch {torch.__version__.split('+')[0]} "
                          f"writes opset {newest} at most with it; choose --opset {newest} or lower"
                          + (" (or --exporter dynamo)" if exporter == "torchscript" else ""))
    if exporter == "dynamo" and opset < DYNAMO_MIN_OPSET:
        notes.append(f"the dynamo exporter writes opset {DYNAMO_MIN_OPSET} or newer; exported at opset {DYNAMO_MIN_OPSET}")
        opset = DYNAMO_MIN_OPSET
    examples = module_examples(module, input_shape=input_shape, input_dtypes=input_dtypes,
                               example_inputs=example_inputs)
    examples = {k: t.repeat(2, *[1] * (t.ndim - 1)) if t.shape[0] == 1 else t  # the dynamo exporter
                for k, t in examples.items()}  # specialises a batch of 1: trace on two rows
    training = any(m.training for m in module.modules())
    exported, exported_examples = module, examples
    with _eval_mode(module), torch.no_grad():
        if _param_dtype(module) == torch.bfloat16:
            # torch.onnx writes a bfloat16 graph, which onnxruntime's CPU provider has no kernels for: a float32
            # copy (in eval mode, as the module now is) is exported, exactly, and the bfloat16 parameters are
            # stored back (store_half_parameters)
            import copy

            with warnings.catch_warnings():  # a TorchScript copy's note on .grad of non-leaf tensors
                warnings.simplefilter("ignore", UserWarning)
                exported = copy.deepcopy(module).float()
            exported_examples = {k: t.float() if t.dtype == torch.bfloat16 else t for k, t in examples.items()}
        try:
            result = module(*examples.values())
        except Exception as e:  # noqa: BLE001 - the user's forward failed on an observation
            raise BadModelError(_forward_failure(examples, input_shape, example_inputs, e)) from e
        names = _output_names(result, output_names, tuple(examples))
        try:
            with _quiet():
                raw = _export_raw(exported, exported_examples, names, exporter, opset)
        except Exception as e:  # noqa: BLE001 - the exporter's own errors: find the module behind them
            raise _export_error(module, examples, exporter, opset, e) from e
    from .reference import from_torch

    params = state_dict if state_dict is not None else {k: from_torch(v) for k, v in module.state_dict().items()}
    module_names = {name for name, _ in module.named_modules()}
    classes = {name: _class_name(sub) for name, sub in module.named_modules()}
    leaves = [name for name, sub in module.named_modules() if name and not list(sub.children())]
    model, module_tensors, module_inputs = rename_graph(raw, exporter, names, module_names, classes, leaves)
    if exported is not module:
        from ..build import store_half_parameters

        model, unmatched = match_parameters(model, {k: v.astype(np.float32) if v.dtype.name == "bfloat16" else v
                                                    for k, v in params.items()})
        model = store_half_parameters(model, params)
    else:
        model, unmatched = match_parameters(model, params)
    from ..readers.torch_files import keep_state_dict_layout

    kept = keep_state_dict_layout(model, params, every_integer=True)
    unmatched = [k for k in unmatched if k not in kept]
    read = _read_entries(module, examples, unmatched)
    if read:
        raise BadModelError(
            f"the module's forward reads the state_dict entr{'y' if len(read) == 1 else 'ies'} {listing(read)}, but the "
            f"graph the {exporter} exporter wrote does not hold {'it' if len(read) == 1 else 'them'}: the values were "
            "taken as constants (a Python number read from a tensor, float(t) or t.item(), is traced as one), so "
            f"extract could not give {'it' if len(read) == 1 else 'them'} back; compute with the tensor itself"
            + (", or use the dynamo exporter" if exporter == "torchscript" else ""))
    if unmatched:
        one = len(unmatched) == 1
        notes.append(f"{len(unmatched)} state_dict entr{'y is' if one else 'ies are'} not in the graph, which the module's "
                     f"forward does not read (changing {'it' if one else 'them'} changes no output): "
                     f"{listing(unmatched, show=str)}")
    return Export(model, module_tensors, names, notes, module_inputs, training, list(examples))


def _forward_failure(examples: dict, input_shape, example_inputs, error: Exception) -> str:
    """Why the module's forward failed on the inputs it was given or made, and what to check."""
    if list(examples) == ["obs"] and example_inputs is None:
        shape = ", ".join(map(str, examples["obs"].shape[1:]))
        what = "check --input-shape (the observation's shape without the batch axis)" if input_shape else \
            "give the shape with --input-shape"
        return f"the module's forward fails on an observation of shape (batch, {shape}): {torch_error_text(error)}; {what}"
    given = ", ".join(f"{name} {str(t.dtype).removeprefix('torch.')} (batch, {', '.join(map(str, t.shape[1:]))})"
                      for name, t in examples.items())
    what = "check example_inputs" if example_inputs is not None else \
        "check --input-shape and --input-dtype (input_shape= and input_dtypes= in Python)"
    return f"the module's forward fails on inputs {given}: {torch_error_text(error)}; {what}"


def _read_entries(module, example, names: list[str]) -> list[str]:
    """The numeric ``state_dict`` entries among ``names`` that the module's forward reads:
    changing one (each element ``x`` to ``x + |x| + 1``) changes an output on ``example`` (the one
    observation tensor, or graph input name -> tensor for a ``forward`` of several), or makes
    the forward fail (a size read from it). The module runs in eval mode, without gradients, with torch's random generator seeded
    alike for each run (a forward that samples draws the same numbers); each entry is restored bit for
    bit afterwards."""
    torch = _torch()
    entries = module.state_dict()
    names = [n for n in names if n in entries and entries[n].dtype != torch.bool and not entries[n].is_complex()
             and entries[n].numel()]
    if not names:
        return []

    def outputs():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            result = module(*example.values()) if isinstance(example, dict) else module(example)
        values = [result] if isinstance(result, torch.Tensor) else list(result.values()) if isinstance(result, dict) \
            else list(result)
        return [v.detach().clone() for v in values]

    read = []
    with _eval_mode(module), torch.no_grad():
        before = outputs()
        for name in names:
            tensor = entries[name]
            saved = tensor.clone()
            try:
                tensor.add_(tensor.abs() + 1)
                after = outputs()
            except Exception:  # noqa: BLE001 - the forward fails on the changed entry (a size read from it): it reads it
                after = None
            finally:
                tensor.copy_(saved)
            if after is None or any(a.shape != b.shape or not torch.equal(a, b) for a, b in zip(before, after)):
                read.append(name)
    return read


def _newest_opset(torch, exporter: str) -> int:
    """The newest opset torch's ``exporter`` writes (``torch/onnx/_constants.py``)."""
    constants = torch.onnx._constants
    if exporter == "torchscript":
        return int(getattr(constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", 20))
    return int(getattr(constants, "ONNX_MAX_OPSET", 23))


def _class_name(module) -> str:
    return getattr(module, "original_name", None) or type(module).__name__


def torch_error_text(error: BaseException, typed: bool = True) -> str:
    """The line of a torch error that says what went wrong, prefixed with its type when ``typed``.

    A TorchScript module's failure is a ``RuntimeError`` whose text is the interpreter's two
    tracebacks (the serialized code's and the original source's, with the paths of the machine that
    scripted it) ending in the exception the code raised, ``RuntimeError: mat1 and mat2 shapes cannot
    be multiplied (2x7 and 6x16)``: that last line is the message. Any other error: its first line.
    ANSI colours (the dynamo exporter's) are dropped.
    """
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip()
    lines = text.splitlines()
    if "Traceback of TorchScript" in text:
        raised = [line for line in lines if re.match(r"[A-Za-z_][\w.]*(Error|Exception): ", line)]
        if raised:
            return raised[-1] if typed else raised[-1].split(": ", 1)[1]
    first = lines[0] if lines else ""
    if not typed:
        return first or type(error).__name__
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _export_error(module, examples: dict, exporter: str, opset: int, error: Exception) -> Exception:
    """The exporter's failure, attributed to the first leaf module that fails to export on its own.
    ``examples``: graph input name -> tensor, or the one observation tensor."""
    torch = _torch()
    examples = examples if isinstance(examples, dict) else {"obs": examples}
    inputs: dict[str, object] = {}
    hooks = []
    for name, sub in module.named_modules():
        if name and not list(sub.children()) and not isinstance(sub, torch.jit.ScriptModule):
            hooks.append(sub.register_forward_pre_hook(
                lambda m, args, name=name: inputs.setdefault(name, args[0]) if args and isinstance(args[0], torch.Tensor) else None))
    try:
        with torch.no_grad():
            module(*examples.values())
    except Exception:  # noqa: BLE001 - only looking for the culprit
        pass
    finally:
        for h in hooks:
            h.remove()
    message = torch_error_text(error, typed=False)
    op = re.search(r"(aten::\w+|aten\.\w+)", str(error))
    failing, exported = None, False
    for name, x in inputs.items():
        sub = module.get_submodule(name)
        try:
            with _quiet():
                _export_raw(sub, {"x": x}, ["y"], exporter, opset)  # pragma: no mutate (a trial: its output's name is never read)
            exported = True
        except Exception:  # noqa: BLE001
            failing = failing or (name, sub)
    if failing and exported:  # some layers export, this one does not: it is the culprit
        name, sub = failing
        what = f"op {op.group(1)}" if op else "its op"
        return UnsupportedOpError(
            f"module {name!r} ({_class_name(sub)}) cannot be exported to ONNX opset {opset} by the {exporter} "
            f"exporter: {what} has no ONNX form there ({message}); try another --opset or --exporter"
        )
    return BadModelError(f"torch.onnx.export ({exporter} exporter, opset {opset}) failed: {message}")


# ---------------------------------------------------------------------------------------------
# the renaming pass


def _scope_of_ts_name(node_name: str, module_names: set[str]) -> str | None:
    """The module path of a TorchScript-exporter node name ``/a/b/b.0/Gemm`` (``None``: no scope)."""
    if not node_name.startswith("/"):
        return None
    parts = node_name.strip("/").split("/")[:-1]
    path = ""
    for part in parts:
        joined = f"{path}.{part}" if path else part
        if joined in module_names:
            path = joined
            continue
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        extended = f"{parent}.{part}" if parent else part  # Sequential children: ``policy_net.0`` under ``policy_net``
        if extended in module_names:
            path = extended
            continue
        return path  # a scope that is not a module (a function): stop at the last module
    return path


def _scope_of_dynamo_node(node, module_names: set[str]) -> str | None:
    props = {p.key: p.value for p in node.metadata_props}
    scopes = props.get("pkg.torch.onnx.name_scopes")
    if not scopes:
        return None
    try:
        names = load_json(scopes.replace("'", '"'), "an exported node's name scopes")
    except BadModelError:
        return None
    if not isinstance(names, list):
        return None
    for candidate in reversed(names[:-1]):
        if candidate in module_names:
            return candidate
    return None


def rename_graph(model, exporter: str, output_names: list[str], module_names: set[str], classes: dict[str, str],
                 leaves: list[str]):
    """Rename the exported graph's nodes and tensors by module path and role.

    Returns:
        ``(model, module_tensors, module_inputs)``: a new ``onnx.ModelProto``, module path -> its
        output tensor, and leaf module path -> the one non-constant tensor it reads.
    """
    onnx = require("onnx", "onnx", "building an ONNX model")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    _separate_initializers(graph)
    _drop_initializer_identities(graph)
    _fold_initializer_transposes(graph)
    protected = {i.name for i in graph.input} | {o.name for o in graph.output} | {t.name for t in graph.initializer}
    # group nodes by the module that computed them
    groups: dict[tuple, list] = {}
    order: list[tuple] = []
    leaf_set, initializers, previous = set(leaves), {t.name for t in graph.initializer}, None
    for i, node in enumerate(graph.node):
        scope = (_scope_of_dynamo_node(node, module_names) if exporter == "dynamo"
                 else _scope_of_ts_name(node.name, module_names))
        scope = scope or ""
        if scope not in leaf_set:  # a scope the exporter lost (TorchScript shares one type's methods)
            scope = _leaf_of(node, scope, previous, leaves, classes, initializers) or scope
        previous = scope if scope in leaf_set else previous
        if scope in leaf_set and scope:
            key = (scope, ROLES.get(classes[scope], _snake(classes[scope])))
        else:
            key = (scope, _snake(node.op_type), i)  # a functional op in a custom forward: its own group
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(node)
    used: set[str] = set(protected)
    renames: dict[str, str] = {}
    module_tensors: dict[str, str] = {}
    module_inputs: dict[str, str] = {}
    constants = {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}

    def unique(name: str) -> str:
        candidate, n = name, 1
        while candidate in used:
            candidate, n = f"{name}_{n}", n + 1
        used.add(candidate)
        return candidate

    for key in order:
        scope, role = key[0], key[1]
        base = f"{scope}/{role}" if scope else role
        nodes = groups[key]
        last = nodes[-1]
        for node in nodes:
            for j, o in enumerate(node.output):
                if not o or o in protected:
                    continue
                if node is last and j == 0:
                    renames[o] = unique(base)
                else:
                    renames[o] = unique(f"{base}/{_snake(node.op_type)}")
            node.name = (renames.get(node.output[0], node.output[0]) if node.output else unique(base))
        if len(key) == 2:
            module_tensors[scope] = renames.get(last.output[0], last.output[0])
            inside = {o for node in nodes for o in node.output}
            outside = list(dict.fromkeys(i for node in nodes for i in node.input
                                         if i and i not in inside and i not in constants))
            if len(outside) == 1:
                module_inputs[scope] = outside[0]
    for node in graph.node:
        node.input[:] = [renames.get(i, i) for i in node.input]
        node.output[:] = [renames.get(o, o) for o in node.output]
        del node.metadata_props[:]
    for vi in graph.value_info:
        vi.name = renames.get(vi.name, vi.name)
    for v in [*graph.input, *graph.output]:
        del v.metadata_props[:]
        for d in v.type.tensor_type.shape.dim[:1]:
            if d.HasField("dim_param") or not d.HasField("dim_value"):
                d.dim_param = "batch"
    del out.metadata_props[:]
    return out, module_tensors, {path: renames.get(t, t) for path, t in module_inputs.items()}


def _separate_initializers(graph) -> None:
    """Rename initializers that share a name with a node output (the dynamo exporter can name a
    parameter and the output computed from it alike, e.g. ``log_std``), in place: the nodes up to
    the one computing that output read the parameter, the nodes after it read the output."""
    produced = {o for node in graph.node for o in node.output}
    taken = produced | {t.name for t in graph.initializer} | {i.name for i in graph.input}
    for init in graph.initializer:
        if init.name in produced:
            new, n = f"{init.name}.param", 1
            while new in taken:
                new, n = f"{init.name}.param{n}", n + 1
            taken.add(new)
            old, init.name = init.name, new
            for node in graph.node:  # in node order: the nodes from the one computing ``old`` on read its output
                node.input[:] = [new if i == old else i for i in node.input]
                if old in node.output:
                    break


def _leaf_of(node, scope: str, previous: str | None, leaves: list[str], classes: dict[str, str],
             initializers: set[str]) -> str | None:
    """The leaf module under ``scope`` that computed ``node``, when the exporter named only an
    ancestor: the module owning a parameter the node reads (``<path>.weight``), or else the leaf
    right after the previous node's, when that leaf has no parameters and its role is the node's op."""
    under = (lambda path: path.startswith(scope + ".")) if scope else (lambda path: True)
    for name in node.input:
        path = name.rsplit(".", 1)[0]
        if name in initializers and path in leaves and under(path):
            return path
    if previous in leaves:
        following = leaves.index(previous) + 1
        if following < len(leaves) and under(leaves[following]):
            leaf = leaves[following]
            if ROLES.get(classes[leaf], _snake(classes[leaf])) == _snake(node.op_type):
                return leaf
    return None


def _drop_initializer_identities(graph) -> None:
    """Remove ``Identity`` nodes that only alias an initializer (exporters' de-duplication), in place."""
    inits = {t.name for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    alias = {}
    keep = []
    for node in graph.node:
        if node.op_type == "Identity" and node.input[0] in inits and node.output[0] not in outputs:
            alias[node.output[0]] = alias.get(node.input[0], node.input[0])
        else:
            keep.append(node)
    _bypass(graph, alias, keep)


def _bypass(graph, alias: dict[str, str], keep: list) -> None:
    """Keep only the nodes ``keep``, their inputs read through ``alias`` (a dropped node's output ->
    the tensor to read instead), in place; the dropped outputs' ``value_info`` goes with them."""
    if not alias:
        return
    for node in keep:
        node.input[:] = [alias.get(i, i) for i in node.input]
    del graph.node[:]
    graph.node.extend(keep)
    infos = [vi for vi in graph.value_info if vi.name not in alias]
    del graph.value_info[:]
    graph.value_info.extend(infos)


def _fold_initializer_transposes(graph) -> None:
    """Lay out in the initializer itself each ``Transpose`` that is the only reader of an
    initializer (a bias-free ``Linear`` exported without constant folding reads ``MatMul(x,
    Transpose(weight))``), in place: the initializer keeps its name and holds the transposed array,
    which :func:`match_parameters` recognises as the entry transposed."""
    onnx = require("onnx", "onnx", "building an ONNX model")
    numpy_helper = onnx.numpy_helper

    def inputs_of(nodes):
        for node in nodes:
            yield from node.input
            for attribute in node.attribute:
                for sub in [attribute.g, *attribute.graphs]:
                    yield from inputs_of(sub.node)

    readers: dict[str, int] = {}
    for name in inputs_of(graph.node):
        readers[name] = readers.get(name, 0) + 1
    inputs = {i.name for i in graph.input}  # an initializer that is also a graph input can be fed: left as it is
    inits = {t.name: t for t in graph.initializer if t.name not in inputs}
    outputs = {o.name for o in graph.output}
    alias, keep = {}, []
    for node in graph.node:
        source = node.input[0] if node.op_type == "Transpose" and node.input else None
        if source in inits and readers[source] == 1 and source not in outputs and node.output[0] not in outputs:
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            init = inits[source]
            init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(np.transpose(numpy_helper.to_array(init), perm)),
                                                  source))
            alias[node.output[0]] = source
        else:
            keep.append(node)
    _bypass(graph, alias, keep)


# ---------------------------------------------------------------------------------------------
# parameters: initializer -> state_dict key


def match_parameters(model, state_dict: dict[str, np.ndarray]):
    """Name each initializer after the state_dict tensor it holds and record the mapping.

    An initializer matches a state_dict entry when dtype, shape and bytes are equal, or when it is
    the entry transposed (2-D). Its own name wins when it is one of the matching keys; otherwise
    the first unclaimed matching key in state_dict order. Keys left over whose bytes equal a
    claimed initializer (tied weights, equal tensors the exporter merged) become its aliases.

    Returns:
        ``(model, unmatched keys)``: a new model with initializers renamed to their key where no
        other tensor has that name, and ``metadata_props["policyport.parameters"]`` set.
    """
    onnx = require("onnx", "onnx", "building an ONNX model")
    numpy_helper = onnx.numpy_helper
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph

    def fingerprint(a: np.ndarray):
        a = np.ascontiguousarray(a)
        return a.dtype.str, a.shape, a.tobytes()

    by_print: dict[tuple, list[str]] = {}
    for key, arr in state_dict.items():
        arr = np.asarray(arr)
        if arr.dtype.kind not in "fiub" or arr.size == 0:
            continue
        by_print.setdefault(fingerprint(arr), []).append(key)
    claimed: dict[str, dict] = {}
    taken: set[str] = set()
    entries: list[tuple[object, dict]] = []
    for init in graph.initializer:
        arr = numpy_helper.to_array(init)
        direct = by_print.get(fingerprint(arr), [])
        transposed = by_print.get(fingerprint(arr.T), []) if arr.ndim == 2 else []
        choice, transpose = None, None
        for keys, perm in ((direct, None), (transposed, [1, 0])):
            free = [k for k in keys if k not in taken]
            if init.name in free:
                choice, transpose = init.name, perm
                break
            if free and choice is None:
                choice, transpose = free[0], perm
        if choice is None:
            continue
        taken.add(choice)
        entry = {"name": choice, "transpose": transpose, "also": []}
        claimed[init.name] = entry
        entries.append((init, entry))
    for init, entry in entries:  # aliases: tied or merged tensors
        arr = numpy_helper.to_array(init)
        if entry["transpose"]:
            arr = arr.T
        for key in by_print.get(fingerprint(arr), []):
            if key not in taken:
                entry["also"].append(key)
                taken.add(key)
    names = {n for node in graph.node for n in [*node.input, *node.output]} | {i.name for i in graph.input}
    renames = {}
    for init, entry in entries:
        if init.name != entry["name"] and entry["name"] not in names and entry["name"] not in renames.values():
            renames[init.name] = entry["name"]
    for init in graph.initializer:
        init.name = renames.get(init.name, init.name)
    for node in graph.node:
        node.input[:] = [renames.get(i, i) for i in node.input]
    for vi in graph.input:
        vi.name = renames.get(vi.name, vi.name)
    mapping = {}
    for old, entry in claimed.items():
        value = {"name": entry["name"]}
        if entry["transpose"]:
            value["transpose"] = entry["transpose"]
        if entry["also"]:
            value["also"] = entry["also"]
        mapping[renames.get(old, old)] = value if len(value) > 1 else entry["name"]
    unmatched = [k for k, a in state_dict.items() if k not in taken]
    onnx.helper.set_model_props(out, {"policyport.parameters": json.dumps(mapping)})
    return out, unmatched


# ---------------------------------------------------------------------------------------------
# the reference: torch with forward hooks


def module_reference(module, export: Export) -> Callable:
    """``obs -> {tensor name: array}``: the module run in torch (eval mode, no grad), every mapped
    submodule's output recorded by a forward hook, and the outputs under the graph's output names.
    ``obs`` is the observation array of a module of one input (cast to the module's floating dtype
    when floating), or for several a mapping graph input name -> array, passed to ``forward`` in
    the graph's input order as tensors of the arrays' own dtypes.

    A TorchScript module takes no hooks: an ``nn.Sequential`` root runs child by child; inside a
    scripted custom ``forward``, each leaf module runs on the input the graph gives it (recorded
    by policyport's numpy backend), so that each layer is compared on its own.
    """
    from .reference import from_torch

    torch = _torch()
    module_tensors, output_names = export.module_tensors, export.output_names

    def forward(obs) -> dict[str, np.ndarray]:
        recorded: dict[str, np.ndarray] = {}
        feeds = _named_feeds(obs, export.input_names)
        args = [torch.as_tensor(np.asarray(feeds[name])) for name in export.input_names]
        if len(args) == 1 and args[0].is_floating_point():
            args[0] = args[0].to(_param_dtype(module))

        def keep(path: str, value) -> None:
            if path in module_tensors and isinstance(value, torch.Tensor):
                recorded[module_tensors[path]] = from_torch(value.detach().clone())

        with _eval_mode(module), torch.no_grad():
            if isinstance(module, torch.jit.ScriptModule):
                result = _run_scripted(module, "", args, keep)
                if not recorded:  # a scripted custom forward: each leaf on the graph's own input
                    _run_leaves_on_graph_inputs(module, export, feeds, keep)
            else:
                hooks = [sub.register_forward_hook(lambda m, i, o, path=path: keep(path, o))
                         for path, sub in module.named_modules() if path in module_tensors]
                try:
                    result = module(*args)
                finally:
                    for h in hooks:
                        h.remove()
        values = [result] if isinstance(result, torch.Tensor) else list(result.values()) if isinstance(result, dict) else list(result)
        for name, value in zip(output_names, values):
            recorded[name] = from_torch(value)
        return recorded

    return forward


def _named_feeds(obs, names: list[str]) -> dict[str, np.ndarray]:
    """The reference's argument as graph input name -> array: the array itself for one input.

    Raises:
        InputMismatchError: a mapping that lacks one of ``names``, or an array for several inputs.
    """
    from ...errors import InputMismatchError

    if not isinstance(obs, dict):
        if len(names) != 1:
            raise InputMismatchError(f"the module takes inputs {listing(names)}; pass a dict of arrays by input name")
        return {names[0]: obs}
    missing = [n for n in names if n not in obs]
    if missing:
        raise InputMismatchError(f"the module takes inputs {listing(names)}; missing {listing(missing)}")
    return {n: obs[n] for n in names}


def _run_leaves_on_graph_inputs(module, export: Export, feeds: dict, keep) -> None:
    from ...runtime import load

    torch = _torch()
    inputs = {p: t for p, t in export.module_inputs.items() if p in export.module_tensors}
    wanted = sorted(set(inputs.values()) - set(feeds))
    recorded = load(export.model, backend="numpy").record(  # pragma: no mutate (more tensors or the default backend: the same values)
        {k: np.asarray(v) for k, v in feeds.items()}, tensors=wanted) if wanted else {}
    submodules = dict(module.named_modules())  # get_submodule is not supported on ScriptModules
    for path, tensor in inputs.items():
        if (tensor in recorded or tensor in feeds) and path in submodules:
            value = np.asarray(feeds[tensor]) if tensor in feeds else recorded[tensor]
            keep(path, submodules[path](torch.as_tensor(value)))


def _run_scripted(module, path: str, x, keep):
    """Run a TorchScript module on ``x`` (a tensor, or a list of them for a ``forward`` of several
    inputs), descending into an ``nn.Sequential``'s children (which take one input) to see their outputs."""
    args = list(x) if isinstance(x, list) else [x]
    children = list(module.named_children())
    if getattr(module, "original_name", None) == "Sequential" and children and len(args) == 1:
        x = args[0]
        for name, child in children:
            x = _run_scripted(child, f"{path}.{name}" if path else name, x, keep)
    else:
        x = module(*args)
    keep(path, x)
    return x


# ---------------------------------------------------------------------------------------------
# converters


def convert_torch(source, options):
    """Convert a live ``torch.nn.Module`` (see the module docstring).

    Args:
        source: the module; it takes one observation tensor ``(batch, *obs_shape)``, or several
            inputs (see :func:`module_examples`).
        options: :class:`~policyport.converter.ConvertOptions`: ``exporter``, ``opset``,
            ``input_shape``, ``input_dtypes``, ``example_inputs``, ``output_names``.

    Returns:
        A :class:`~policyport.converter.Converted` whose reference runs the module with forward hooks.
    """
    from ..options import Converted

    _refuse_weight_options(options, "a torch module")
    export = export_module(source, exporter=options.exporter, opset=options.opset, input_shape=options.input_shape,
                           output_names=options.output_names, **_input_options(options))
    _finish(export.model, {"kind": "torch", "class": type(source).__name__, "exporter": options.exporter})
    reference = module_reference(source, export)
    return Converted(export.model, reference, "torch", export.notes,
                     module_assumptions("a torch module", training=export.training), module_oracle("the module"))


def convert_torchscript(source, options):
    """Convert a TorchScript file (``torch.jit.save``), loaded with ``torch.jit.load`` on the CPU.

    Loading a TorchScript file runs the TorchScript code it holds (its ``__setstate__`` methods while
    it loads, its ``forward`` when traced and checked), so it is read only with ``options.trust``;
    without it the file is refused once its layout (a zip archive holding ``data.pkl`` and
    ``constants.pkl``) says it is TorchScript, before torch is imported.

    Raises:
        UnreadableFileError: a missing file, or not a TorchScript archive (saying what it is instead).
        TrustRequiredError: a TorchScript file and ``options.trust`` is false (exit 2).
        MissingDependencyError: torch is not installed.
    """
    from pathlib import Path

    from ...errors import UnreadableFileError
    from ..kinds import refuse_code_without_trust
    from ..options import Converted

    _refuse_weight_options(options, "a TorchScript file")
    path = Path(source)
    if not path.is_file():
        raise UnreadableFileError(f"{path}: no such file" if not path.exists() else f"{path} is not a file")
    from ..readers.torch_files import check_torch_file, not_torchscript

    check_torch_file(path)
    if refusal := not_torchscript(path):
        raise UnreadableFileError(refusal)
    refuse_code_without_trust(path, "torchscript", options.trust)
    torch = _torch("converting a TorchScript file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript itself
            module = torch.jit.load(str(path), map_location="cpu")
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError for anything unreadable
        raise UnreadableFileError(f"{path} is not a readable TorchScript file: {str(e).strip().splitlines()[0]}") from e
    export = export_module(module, exporter=options.exporter, opset=options.opset, input_shape=options.input_shape,
                           output_names=options.output_names, **_input_options(options))
    _finish(export.model, {"kind": "torchscript", "file": path.name, "sha256": _sha256(path), "exporter": options.exporter})
    reference = module_reference(module, export)
    return Converted(export.model, reference, "torchscript", export.notes,
                     module_assumptions("a TorchScript file", training=export.training),
                     module_oracle("the TorchScript module"))


def _input_options(options) -> dict:
    """The options that shape a module's inputs beyond ``input_shape``, for :func:`export_module`."""
    return {"input_dtypes": options.input_dtypes, "example_inputs": options.example_inputs}


def module_assumptions(what: str, training: bool = False) -> list:
    """What a model converted from a torch module (``what``: ``"a TorchScript file"``) rests on beyond
    the module: no normaliser applied to the observations outside it, which the module cannot record;
    and, when the module (or a submodule) was in ``training`` mode (default ``False``), that it is
    used in eval mode, as it was exported: ``Dropout`` off, ``BatchNorm`` on its running statistics
    (``torch.nn.Module.eval``), where training mode would drop activations at random and normalise
    each batch by its own statistics."""
    from ..assumptions import Assumption, outside_normaliser

    assumptions = [outside_normaliser(what, "export a module whose forward applies the normaliser")]
    if training:
        scripted = "TorchScript" in what
        was = "the file holds a module saved" if scripted else "the module was"
        settle = ("save the module in eval mode (module.eval() before torch.jit.save)" if scripted
                  else "put the module in eval mode (module.eval()) before converting it")
        assumptions.append(Assumption(
            "mode", "eval (Dropout off, BatchNorm on its running statistics)",
            f"{was} in training mode; it was exported and is checked in eval mode (and put back in training mode "
            "afterwards), where training mode draws Dropout masks and normalises each batch by its own statistics",
            settle))
    return assumptions


#: What torch running a module's own forward settles from the module itself: its activations and its
#: layers. Not what it does not compute: an action distribution a converter puts on its outputs (the
#: ``action`` of a ``--head``), or a normaliser applied outside it.
MODULE_CHECKS = frozenset({"activation", "layout"})


def module_oracle(what: str):
    """torch running ``what``'s own forward: it settles the activations and the layers from the
    module itself (:data:`MODULE_CHECKS`)."""
    from ..assumptions import Oracle

    return Oracle(f"torch {_torch('naming the oracle').__version__} running {what}'s own forward", framework=True,
                  checks=MODULE_CHECKS)


def _refuse_weight_options(options, what: str) -> None:
    if options.head is not None:
        raise OptionError(f"--head applies to weight files; {what} exports its own outputs")
    if options.obs_norm is not None:
        raise BadModelError(f"an observation-normalisation file applies to SB3 sources, not to {what}")
    if options.activation is not None:
        raise OptionError(f"--activation applies to weight files; {what} carries its own activations")


def _sha256(path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _finish(model, source: dict) -> None:
    """Provenance metadata and the checker."""
    onnx = require("onnx", "onnx", "building an ONNX model")
    from ..build import _version

    model.producer_name, model.producer_version = "policyport", _version()
    props = {p.key: p.value for p in model.metadata_props}
    props.update({"policyport.head": "none", "policyport.source": json.dumps(source)})
    onnx.helper.set_model_props(model, props)
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as e:
        raise BadModelError(f"the exported model fails onnx.checker: {e}") from e


