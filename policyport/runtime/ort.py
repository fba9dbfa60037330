"""The onnxruntime backend (CPU execution provider)."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ..errors import BadModelError, require
from ..graph.model import Graph
from .base import Backend, TensorSizes, held_in_node_order
from .overrides import Steering

#: How much more than the tensors a run holds at once onnxruntime's buffer arena takes: it rounds
#: each request up to its bins and keeps every chunk it grew by. Measured (``ru_maxrss``, MLPs of
#: 64 to 256 units, 1,000 to 1,000,000 rows, onnxruntime 1.32): up to 8 % more for a record, 3 %
#: for a run; graph outputs are allocated apart from the planned buffers and handed to numpy as
#: they are, without a copy.
ARENA_SLACK = 1.25
#: Ops whose CPU kernel onnxruntime lets write its output over its input's buffer when it is that
#: input's last reader (``KernelDefBuilder().MayInplace(0, 0)``, or an output that aliases the
#: input): its allocation planner then gives the output no buffer of its own. Measured (peak
#: resident set, onnxruntime 1.32, a Gemm's 125 MiB output read by the op alone): these take one
#: buffer for both; Add, Sub, Mul, Div, Neg, Exp, Abs, Sqrt, Erf, Floor, Sign, Gelu ... take two.
IN_PLACE_OPS = frozenset({
    "Relu", "Tanh", "Sigmoid", "Elu", "Selu", "Celu", "LeakyRelu", "ThresholdedRelu", "HardSigmoid",
    "Softplus", "Softsign", "Clip", "Softmax", "LogSoftmax", "Dropout", "Identity", "Reshape", "Flatten",
    "Squeeze", "Unsqueeze",
})
#: Ops onnxruntime runs as their function body (several nodes), which holds one more array of the
#: output's size while it runs: HardSwish (HardSigmoid, then Mul with the input), Mish. Measured as
#: above: three buffers where the op's input and output make two.
EXPANDED_OPS = frozenset({"HardSwish", "Mish"})


class OrtBackend(Backend):
    """Runs a model on onnxruntime's CPU execution provider.

    Args:
        model: the ``onnx.ModelProto``.
        graph: its :class:`~policyport.graph.model.Graph` view (inputs, outputs, tensor names).
        threads: intra-op threads; 0 (default) lets onnxruntime choose (one per core).
        seed: if given, ``onnxruntime.set_seed(seed)`` (process-wide) before each session is built,
            so random ops without a ``seed`` attribute draw a reproducible sequence.

    Raises:
        MissingDependencyError: onnxruntime is not installed.
        BadModelError: onnxruntime refuses the model.
        LimitExceededError: a node output would take more than the array limit on one row
            (:func:`check_tensor_sizes`), before onnxruntime sees the model.
    """

    name = "onnxruntime"

    def __init__(self, model, graph: Graph, threads: int = 0, seed: int | None = None):
        from ..graph.passes import free_dims

        self._ort = require("onnxruntime", "onnx", "the onnxruntime backend")
        self.model = free_dims(model)  # onnxruntime takes a declared 0 literally
        check_tensor_sizes(self.model)
        self.graph = graph
        self.threads = threads
        self.seed = seed
        self.inputs = list(graph.inputs)
        self.optional_inputs = list(graph.optional_inputs)
        self.outputs = list(graph.outputs)
        self.tensor_names = graph.tensor_names
        self._out_names = [v.name for v in graph.outputs]
        self._session = self._make_session(self.model)
        self._recording: dict[tuple[str, ...], object] = {}
        self._steered: dict[tuple, list] = {}  # (overridden tensors, returned tensors) -> stages

    def _make_session(self, model):
        opts = self._ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 4  # failures are raised as BadModelError, not logged
        if self.seed is not None:
            self._ort.set_seed(int(self.seed))
        try:
            return self._ort.InferenceSession(
                model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
            )
        except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph/... types
            raise BadModelError(f"onnxruntime cannot load the model: {e}") from e

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self._out_names, self._call(self._session, self._out_names, feeds)))

    def memory_needed(self, sizes: TensorSizes, rows: int, names: list[str] | None) -> int:
        """As :meth:`Backend.memory_needed`, as onnxruntime's planner holds the tensors: each buffer
        freed after its last reader, an op of :data:`IN_PLACE_OPS` writing over its input's buffer
        when it reads it last (never over a tensor a record returns: a record makes the recorded
        tensors graph outputs, kept to the end), one more array while an op of :data:`EXPANDED_OPS`
        runs, and a MatMul's product with a constant added to it (onnxruntime fuses the two into
        a Gemm, which writes its output once: a Keras layer's MatMul and BiasAdd); with
        :data:`ARENA_SLACK` for the arena."""
        nbytes = sizes.nbytes(rows)
        returned = [v.name for v in self.outputs] + list(names or ())

        def expanded(node) -> int:
            return max((nbytes.get(t, 0) for t in node.outputs if t), default=0) if node.op_type in EXPANDED_OPS else 0

        made_by = {t: n.op_type for n in self.graph.nodes for t in n.outputs if t}
        constants = self.graph.initializers

        def in_place(node) -> bool:
            if node.domain not in ("", "ai.onnx"):
                return False
            if node.op_type == "Add" and len(node.inputs) == 2:  # MatMul + a constant bias: fused into a Gemm
                return made_by.get(node.inputs[0]) == "MatMul" and node.inputs[1] in constants
            return node.op_type in IN_PLACE_OPS

        held = held_in_node_order(self.graph.nodes, nbytes, returned, in_place=in_place, temporary=expanded)
        return int(ARENA_SLACK * held)

    @staticmethod
    def _call(session, names: list[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        try:
            return session.run(names, dict(feeds))
        except Exception as e:  # onnxruntime's Fail, InvalidArgument, RuntimeException ...
            raise BadModelError(f"onnxruntime failed to run the model: {e}") from e

    def record(self, feeds: Mapping[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        from .expose import expose

        if not names:
            return self.run(feeds)
        key = tuple(names)
        if key not in self._recording:
            self._recording[key] = self._make_session(expose(self.model, tensors=list(names), exact=True))
        sess = self._recording[key]
        wanted = list(dict.fromkeys([*names, *self._out_names]))
        return dict(zip(wanted, self._call(sess, wanted, feeds)))

    def record_steered(self, feeds: Mapping[str, np.ndarray], names: list[str] | None,
                       steering: Steering) -> dict[str, np.ndarray]:
        """Run the graph split at the overridden tensors (:func:`policyport.graph.passes.split_at`) stage by
        stage, replacing each overridden tensor between the stage that makes it and those that read it.
        The split models and their onnxruntime sessions are built once per set of tensors (and of
        optional inputs fed, which the stages then read from the feeds instead of their initializers)."""
        wanted = list(self._out_names if names is None else dict.fromkeys([*names, *self._out_names]))
        fed = tuple(v.name for v in self.optional_inputs if v.name in feeds)
        key = (steering.tensors, tuple(wanted), fed)
        stages = self._steered.get(key)
        if stages is None:
            from ..graph.passes import split_at

            # an initializer that is a graph input too and is fed: a stage reads it from the feeds
            source = _left_to_feeds(self.model, fed) if fed else self.model
            pieces = split_at(source, steering.tensors, keep=wanted)
            stages = self._steered[key] = [(p, self._make_session(p.model)) for p in pieces]
        steer = dict(zip(steering.tensors, steering.appliers(lambda tensor: True)))  # onnxruntime's arrays are ours
        values = dict(feeds)
        for piece, session in stages:
            results = self._call(session, piece.outputs, {n: values[n] for n in piece.inputs})
            for name, value in zip(piece.outputs, results):
                values[name] = steer[name](value) if name in steer else value
        return {n: np.array(values[n]) if n in feeds else values[n] for n in wanted}


def check_tensor_sizes(model) -> None:
    """Refuse a model whose node outputs, as ONNX shape inference (with data propagation) sizes them
    from the model's values, would take more than the array limit on one row of the batch (every
    dimension it cannot tell counted as 1), before onnxruntime sees it: onnxruntime folds constants
    such as a ``ConstantOfShape`` of a shape held in an initializer while it loads the model, and
    allocates what a run asks for without a limit. The numpy backend refuses the same tensors as it
    computes them, with the same limit (:func:`policyport.io.limits.check_tensor_shape`). A model shape
    inference cannot read is left to onnxruntime.

    Raises:
        LimitExceededError: naming the node, its output's shape and size, and the limit.
    """
    from ..errors import PolicyportError
    from ..io.limits import check_tensor_shape
    from ..graph.passes import infer_shapes

    helper = require("onnx", "onnx", "the onnxruntime backend").helper
    try:
        inferred = infer_shapes(_shapes_of(model))
    except PolicyportError:
        return
    infos = {v.name: v.type for v in [*inferred.graph.value_info, *inferred.graph.output]}
    for node in model.graph.node:
        for name in node.output:
            t = infos.get(name)
            if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
                continue
            try:
                dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.tensor_type.elem_type))
            except (KeyError, TypeError, ValueError):  # undefined or unknown element type
                continue
            dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in t.tensor_type.shape.dim]
            try:
                check_tensor_shape(dims, dtype if dtype.kind != "O" else np.dtype(np.intp))
            except PolicyportError as e:
                raise type(e)(f'{node.op_type} node "{node.name}" on the onnxruntime backend: {e}') from None


#: The most elements of an initializer whose values shape inference is given (shapes, axes, bounds);
#: a larger one is given as a graph input of its type and shape alone.
_VALUES_KEPT = 64


def _shapes_of(model):
    """``model`` as shape inference needs it, without copying its weights: initializers of more than
    :data:`_VALUES_KEPT` elements become graph inputs of the same type and shape (data propagation
    reads only small ones: shapes, axes, bounds)."""
    helper = require("onnx", "onnx", "the onnxruntime backend").helper
    light = type(model)()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph, source = light.graph, model.graph
    graph.name = source.name
    graph.node.extend(source.node)
    graph.input.extend(source.input)
    graph.output.extend(source.output)
    graph.value_info.extend(source.value_info)
    inputs = {v.name for v in source.input}
    for t in source.initializer:
        if math.prod(t.dims) <= _VALUES_KEPT:
            graph.initializer.append(t)
        elif t.name not in inputs:
            graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return light


def _left_to_feeds(model, names: tuple[str, ...]):
    """A copy of ``model`` without the initializers ``names`` (graph inputs too, fed by the caller)."""
    copy = type(model)()
    copy.CopyFrom(model)
    kept = [t for t in copy.graph.initializer if t.name not in names]
    del copy.graph.initializer[:]
    copy.graph.initializer.extend(kept)
    return copy
