"""A plain-Python view of an ONNX graph that needs only numpy.

The numpy backend executes this view, not the protobuf, so that a packed policy runs on a machine
with numpy alone: :func:`from_onnx` reads a ``ModelProto`` (and imports ``onnx`` lazily), and
:meth:`Graph.to_json` / :meth:`Graph.from_json` round-trip everything but the initializer arrays,
which travel in an ``.npz`` beside the JSON.

Element types follow the ``TensorProto.DataType`` enumeration of onnx.proto
(https://github.com/onnx/onnx/blob/main/onnx/onnx.proto).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BadModelError, require
from ..io.schema import load_json

#: Model metadata key: graph input -> the values it may take, for inputs whose valid range the
#: source knows (a ``Discrete``/``MultiDiscrete`` observation's indices). JSON
#: ``{input: {"low": L, "high": H}}``, ``high`` exclusive; ``L``/``H`` an integer, or a list that runs
#: along the input's last axis (one per ``MultiDiscrete`` sub-space). Verification, ``pack`` and
#: ``export-numpy`` draw observations from it (:func:`policyport.verification.verify.sample_inputs`).
INPUT_RANGES_KEY = "policyport.input_ranges"

#: Model metadata key: what a converted model rests on that its source file does not record (an
#: activation given with --activation, a head, no normaliser ...), a JSON list of
#: ``{"topic", "assumes", "because", "settle"}`` (:mod:`policyport.converter.assumptions` writes it).
ASSUMPTIONS_KEY = "policyport.assumptions"


def recorded_assumptions(metadata: dict[str, str]) -> list[dict[str, str]] | None:
    """The assumptions in a model's metadata (``{key: value}``), each a dict of the four keys;
    ``None`` when the model records none (converted by an older policyport, or not by policyport).
    Entries of another shape are skipped, a malformed value reads as none."""
    if ASSUMPTIONS_KEY not in metadata:
        return None
    try:
        values = load_json(metadata[ASSUMPTIONS_KEY], f"model metadata {ASSUMPTIONS_KEY!r}")
    except BadModelError:
        return []
    keys = ("topic", "assumes", "because")
    return [{**{k: v[k] for k in keys}, "settle": str(v.get("settle", ""))}
            for v in (values if isinstance(values, list) else [])
            if isinstance(v, dict) and all(isinstance(v.get(k), str) for k in keys)]

#: ``TensorProto.DataType`` code -> numpy dtype, for every element type numpy can hold.
ONNX_TO_NUMPY: dict[int, np.dtype] = {
    1: np.dtype("float32"),
    2: np.dtype("uint8"),
    3: np.dtype("int8"),
    4: np.dtype("uint16"),
    5: np.dtype("int16"),
    6: np.dtype("int32"),
    7: np.dtype("int64"),
    8: np.dtype("object"),
    9: np.dtype("bool"),
    10: np.dtype("float16"),
    11: np.dtype("float64"),
    12: np.dtype("uint32"),
    13: np.dtype("uint64"),
    14: np.dtype("complex64"),
    15: np.dtype("complex128"),
}
NUMPY_TO_ONNX: dict[np.dtype, int] = {v: k for k, v in ONNX_TO_NUMPY.items()}

#: ``TensorProto.DataType`` code -> name of the type in the optional ``ml_dtypes`` package (also the
#: numpy dtype's ``.name``), for the element types plain numpy cannot hold. They are usable only when
#: ``ml_dtypes`` is installed, and it is imported only when a model actually uses one of them.
ONNX_TO_ML_DTYPES: dict[int, str] = {
    16: "bfloat16",
    17: "float8_e4m3fn",
    18: "float8_e4m3fnuz",
    19: "float8_e5m2",
    20: "float8_e5m2fnuz",
    21: "uint4",
    22: "int4",
    23: "float4_e2m1fn",
    24: "float8_e8m0fnu",
    25: "uint2",
    26: "int2",
    27: "float6_e2m3fn",
    28: "float6_e3m2fn",
}
#: The dtype names of those types (a dtype's ``kind`` tells them apart from numpy's own poorly:
#: it is "V" for most, "f" for float8_e5m2).
ML_DTYPE_NAMES = frozenset(ONNX_TO_ML_DTYPES.values())

#: The operator set of the default ("ai.onnx") domain is keyed by the empty string, as in ONNX.
DEFAULT_DOMAIN = ""

Dim = int | str | None

#: Ops that draw random numbers (ai.onnx): tensors computed from them differ run to run.
RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                        "Multinomial", "Bernoulli"})


def onnx_dtype(code: int) -> np.dtype:
    """The numpy dtype of an ONNX element type code.

    bfloat16, float8, float6, float4, int4/uint4 and int2/uint2 map to the dtypes of the optional
    ``ml_dtypes`` package, which is imported here, and only for those codes.

    Raises:
        BadModelError: the code has no numpy equivalent (bfloat16, float8, int4 ... without
            ``ml_dtypes`` installed, or an unknown code).
    """
    dtype = ONNX_TO_NUMPY.get(int(code))
    if dtype is not None:
        return dtype
    name = ONNX_TO_ML_DTYPES.get(int(code))
    dtype = None if name is None else _ml_dtype(name)
    if dtype is not None:
        return dtype
    hint = f" ({name}: install the ml_dtypes package for it)" if name else ""
    raise BadModelError(
        f"ONNX element type {code}{hint} has no numpy equivalent; policyport's numpy backend supports "
        f"{sorted(ONNX_TO_NUMPY)} (see TensorProto.DataType in onnx.proto)"
    )


def _ml_dtype(name: str) -> np.dtype | None:
    """The ``ml_dtypes`` dtype called ``name``, or None if ml_dtypes (or that type) is missing."""
    try:
        import ml_dtypes  # optional: only models that use its element types need it
    except ImportError:
        return None
    scalar = getattr(ml_dtypes, name, None)
    return None if scalar is None else np.dtype(scalar)


def dtype_from_name(name: str) -> np.dtype:
    """The dtype whose ``.name`` is ``name``; ml_dtypes names ("bfloat16" ...) import ml_dtypes.

    Raises:
        BadModelError: ``name`` is an ml_dtypes type and ml_dtypes is not installed.
        TypeError: ``name`` is no dtype at all.
    """
    if name in ML_DTYPE_NAMES:
        dtype = _ml_dtype(name)
        if dtype is None:
            raise BadModelError(f"element type {name!r} needs the ml_dtypes package, which is not installed")
        return dtype
    return np.dtype(name)


@dataclass(frozen=True)
class ValueInfo:
    """A graph input or output: its name, element type and shape.

    ``shape`` holds an int for a fixed dimension, a string for a named symbolic one (``"batch"``)
    and ``None`` for an unknown one; ``shape`` itself is ``None`` when the rank is unknown. A
    dimension written as 0 or a negative number (how Paddle2ONNX and some older exporters mark a
    free batch) is read as unknown, as onnxruntime treats a negative one.
    """

    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...] | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype.name,
            "shape": None if self.shape is None else list(self.shape),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ValueInfo:
        shape = d.get("shape")
        return cls(d["name"], dtype_from_name(d["dtype"]), None if shape is None else tuple(map(free_dim, shape)))

    @property
    def has_batch_axis(self) -> bool:
        """Whether axis 0 is free (symbolic or unknown), i.e. holds one observation per row.

        A scalar, an input of fixed shape such as ``(1, 480)`` or ``(54,)``, and an input of
        unknown rank have none: each feed of them is one observation (or, for unknown rank, as many
        as its axis 0 says; see :func:`policyport.runtime.base.count_observations`).
        """
        return bool(self.shape) and not isinstance(self.shape[0], int)


def free_dim(d: Dim) -> Dim:
    """A dimension as policyport holds it: a fixed size ``>= 1``, a symbol, or ``None`` (unknown).

    0 and negative sizes become ``None``: exporters write ``-1`` (or 0) for a free dimension.
    """
    return None if isinstance(d, int) and d <= 0 else d


@dataclass(frozen=True)
class Node:
    """One ONNX node: op type, input and output tensor names, attributes by their ONNX spelling.

    An omitted optional input is the empty string, as in ONNX. Attribute values are Python ints,
    floats, strings, tuples of those, or numpy arrays (TENSOR attributes).
    """

    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    domain: str = DEFAULT_DOMAIN

    def __post_init__(self):
        # ONNX names the default domain both "" and "ai.onnx" (onnx/onnx.proto: NodeProto.domain); one
        # spelling here, so that every lookup by domain finds the default operators under either.
        if self.domain == "ai.onnx":
            object.__setattr__(self, "domain", DEFAULT_DOMAIN)


@dataclass
class Graph:
    """A model's main graph with its initializers and operator-set versions.

    Attributes:
        nodes: in a topological order, as ONNX requires.
        inputs: the graph inputs that are not initializers (the feeds).
        outputs: the graph outputs.
        initializers: name -> array, exactly as stored in the model.
        opsets: domain -> opset version; ``opsets[""]`` is the default domain's.
        metadata: the model's ``metadata_props``.
        optional_inputs: graph inputs that are initializers too (from IR version 4 on, torch's
            ``keep_initializers_as_inputs=True``): a feed of that name overrides the initializer,
            which is the default, as in onnxruntime. Their declared type and shape (the
            initializer's where the input declares none) are checked like any feed's.
    """

    nodes: list[Node]
    inputs: list[ValueInfo]
    outputs: list[ValueInfo]
    initializers: dict[str, np.ndarray]
    opsets: dict[str, int]
    metadata: dict[str, str] = field(default_factory=dict)
    optional_inputs: list[ValueInfo] = field(default_factory=list)

    @property
    def tensor_names(self) -> list[str]:
        """Every node output, in node order (what a backend's ``record`` can return)."""
        return [o for n in self.nodes for o in n.outputs if o]

    def downstream(self, sources: dict[str, str]) -> dict[str, str]:
        """Every tensor computed from one of ``sources``, with the reason of the first it depends on.

        Args:
            sources: tensor name -> reason (e.g. ``"RandomNormal node 'noise'"``).

        Returns:
            tensor name -> reason, for the sources and every node output that reads one of them,
            directly or through other nodes, in node order.
        """
        found = dict(sources)
        for n in self.nodes:
            reason = next((found[t] for t in n.inputs if t in found), None)
            if reason is not None:
                for o in n.outputs:
                    if o:
                        found.setdefault(o, reason)
        return found

    def stochastic_tensors(self) -> dict[str, str]:
        """Tensors that depend on a random node, with the node that makes them random.

        Random nodes are those of :data:`RANDOM_OPS`, and Dropout whose ``training_mode`` input is
        given and not a constant false (in training mode it draws a mask). Two backends, or two
        runs, cannot be expected to draw the same numbers, so verification leaves these out.
        """
        sources = {}
        for n in self.nodes:
            training = n.op_type == "Dropout" and len(n.inputs) > 2 and n.inputs[2] != ""
            if training and n.inputs[2] in self.initializers and not self.initializers[n.inputs[2]].any():
                training = False
            if (n.domain == DEFAULT_DOMAIN and n.op_type in RANDOM_OPS) or training:
                for o in n.outputs:
                    if o:
                        sources[o] = f"{n.op_type} node {n.name!r}"
        return self.downstream(sources)

    @property
    def opset(self) -> int:
        """The default ("ai.onnx") domain's opset version."""
        return self.opsets.get(DEFAULT_DOMAIN, self.opsets.get("ai.onnx", 0))

    def to_json(self) -> str:
        """Everything but the initializer arrays, as JSON (initializers are listed by name, dtype, shape)."""
        return json.dumps(
            {
                "format": "policyport.graph/1",
                "opsets": self.opsets,
                "metadata": self.metadata,
                "inputs": [v.to_dict() for v in self.inputs],
                "optional_inputs": [v.to_dict() for v in self.optional_inputs],
                "outputs": [v.to_dict() for v in self.outputs],
                "initializers": [
                    {"name": k, "dtype": v.dtype.name, "shape": list(v.shape)}
                    for k, v in self.initializers.items()
                ],
                "nodes": [
                    {
                        "op_type": n.op_type,
                        "domain": n.domain,
                        "name": n.name,
                        "inputs": list(n.inputs),
                        "outputs": list(n.outputs),
                        "attrs": {k: _attr_to_json(v) for k, v in n.attrs.items()},
                    }
                    for n in self.nodes
                ],
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str, initializers: dict[str, np.ndarray]) -> Graph:
        """Rebuild a graph from :meth:`to_json` output and its initializer arrays.

        Raises:
            BadModelError: the JSON is not a policyport graph, or an initializer is missing or
                differs in dtype or shape from what the JSON lists.
        """
        d = load_json(text, "graph JSON")
        try:
            if not isinstance(d, dict):
                raise BadModelError(f"malformed graph JSON: expected an object, got {type(d).__name__}")
            if d.get("format") != "policyport.graph/1":
                raise BadModelError(f"not a policyport graph (format {d.get('format')!r})")
            inits = {}
            for spec in d["initializers"]:
                name = spec["name"]
                if name not in initializers:
                    raise BadModelError(f"initializer {name!r} is listed in the graph but missing from the weights")
                arr = _ml_view(np.asarray(initializers[name]), spec["dtype"])
                if arr.dtype.name != spec["dtype"] or list(arr.shape) != spec["shape"]:
                    raise BadModelError(
                        f"initializer {name!r}: the graph expects {spec['dtype']}{spec['shape']}, "
                        f"the weights hold {arr.dtype.name}{list(arr.shape)}"
                    )
                inits[name] = arr
            nodes = [
                Node(
                    n["op_type"],
                    tuple(n["inputs"]),
                    tuple(n["outputs"]),
                    {k: _attr_from_json(v) for k, v in n["attrs"].items()},
                    n.get("name", ""),
                    n.get("domain", DEFAULT_DOMAIN),
                )
                for n in d["nodes"]
            ]
            return sort_nodes(cls(
                nodes=nodes,
                inputs=[ValueInfo.from_dict(v) for v in d["inputs"]],
                outputs=[ValueInfo.from_dict(v) for v in d["outputs"]],
                initializers=inits,
                opsets={k: int(v) for k, v in d["opsets"].items()},
                metadata=dict(d.get("metadata", {})),
                optional_inputs=[ValueInfo.from_dict(v) for v in d.get("optional_inputs", [])],
            ))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, BadModelError):
                raise
            raise BadModelError(f"malformed graph JSON: {e}") from e


def sort_nodes(graph: Graph) -> Graph:
    """``graph`` with its nodes in a topological order, after checking that every tensor is defined once.

    ONNX requires nodes in topological order, but exporters and hand edits break it and onnxruntime
    sorts on load; so does policyport (a stable sort: an already ordered graph keeps its order).

    Raises:
        BadModelError: a node reads a tensor nothing defines (not a graph input, initializer or node
            output), a tensor is defined twice, a graph output is never defined, or the nodes form
            a cycle — each naming the node and tensor.
    """
    defined: dict[str, str] = {v.name: "graph input" for v in graph.inputs}
    defined.update({name: "initializer" for name in graph.initializers})
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for out in node.outputs:
            if not out:
                continue
            if out in producer or out in defined:
                first = (f'{graph.nodes[producer[out]].op_type} node "{graph.nodes[producer[out]].name}"'
                         if out in producer else f"a {defined[out]}")
                raise BadModelError(
                    f'{node.op_type} node "{node.name}" outputs tensor {out!r}, which {first} already defines; '
                    "every tensor of an ONNX graph is defined once")
            producer[out] = i
    for node in graph.nodes:
        for name in node.inputs:
            if name and name not in producer and name not in defined:
                raise BadModelError(
                    f'{node.op_type} node "{node.name}" reads tensor {name!r}, which no graph input, initializer '
                    "or node defines")
    for v in graph.outputs:
        if v.name not in producer and v.name not in defined:
            raise BadModelError(f"graph output {v.name!r} is not defined by any node, input or initializer")
    order, state = [], [0] * len(graph.nodes)  # 0 new, 1 on the stack, 2 placed
    for start in range(len(graph.nodes)):
        stack = [(start, iter(graph.nodes[start].inputs))] if state[start] == 0 else []
        if stack:
            state[start] = 1
        while stack:
            i, pending = stack[-1]
            for name in pending:
                j = producer.get(name)
                if j is None or state[j] == 2:
                    continue
                if state[j] == 1:
                    node = graph.nodes[j]
                    raise BadModelError(f'{node.op_type} node "{node.name}" depends on its own output {name!r} (a cycle)')
                state[j] = 1
                stack.append((j, iter(graph.nodes[j].inputs)))
                break
            else:
                stack.pop()
                state[i] = 2
                order.append(i)
    if order == list(range(len(graph.nodes))):
        return graph
    return Graph([graph.nodes[i] for i in order], graph.inputs, graph.outputs, graph.initializers, graph.opsets,
                 graph.metadata, graph.optional_inputs)


def _ml_view(arr: np.ndarray, name: str) -> np.ndarray:
    """An ml_dtypes array that came back from ``.npy``/``.npz`` as raw bytes (``|V2`` ...) viewed
    as ``name`` again; any other array unchanged."""
    if name in ML_DTYPE_NAMES and arr.dtype.kind == "V" and arr.dtype.names is None and arr.dtype.name != name:
        dtype = dtype_from_name(name)
        if dtype.itemsize == arr.dtype.itemsize:
            return arr.view(dtype)
    return arr


def _attr_to_json(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return {"tensor": {"dtype": v.dtype.name, "shape": list(v.shape), "data": v.ravel().tolist()}}
    if isinstance(v, tuple):
        return {"list": [_attr_to_json(x) for x in v]}
    if isinstance(v, (np.integer, np.floating)):
        return v.item()
    return v


def _attr_from_json(v: Any) -> Any:
    if isinstance(v, dict) and "tensor" in v:
        t = v["tensor"]
        return np.array(t["data"], dtype=dtype_from_name(t["dtype"])).reshape(t["shape"])
    if isinstance(v, dict) and "list" in v:
        return tuple(_attr_from_json(x) for x in v["list"])
    return v


#: Bits one element of each ``TensorProto.DataType`` takes in ``raw_data`` (STRING has none: it is
#: stored in ``string_data``). The 4-, 2- and 6-bit types are packed, the last byte padded (onnx.proto).
RAW_BITS: dict[int, int] = {
    1: 32, 2: 8, 3: 8, 4: 16, 5: 16, 6: 32, 7: 64, 9: 8, 10: 16, 11: 64, 12: 32, 13: 64, 14: 64, 15: 128,
    16: 16, 17: 8, 18: 8, 19: 8, 20: 8, 21: 4, 22: 4, 23: 4, 24: 8, 25: 2, 26: 2, 27: 6, 28: 6,
}
#: The typed field that holds each element type when ``raw_data`` is not used, and how many of the
#: field's entries one element takes (a complex number is two), or for the packed integer types how
#: many elements one entry holds (as a negative number).
_TYPED_FIELD: dict[int, tuple[str, int]] = {
    1: ("float_data", 1), 14: ("float_data", 2), 11: ("double_data", 1), 15: ("double_data", 2),
    7: ("int64_data", 1), 12: ("uint64_data", 1), 13: ("uint64_data", 1), 8: ("string_data", 1),
    21: ("int32_data", -2), 22: ("int32_data", -2), 23: ("int32_data", -2), 25: ("int32_data", -4),
    26: ("int32_data", -4),
    **{code: ("int32_data", 1) for code in (2, 3, 4, 5, 6, 9, 10, 16, 17, 18, 19, 20, 24, 27, 28)},
}
#: The most axes numpy arrays may have (numpy 2's limit; numpy 1's was 32).
MAX_RANK = 64
#: ``TensorProto.DataLocation.EXTERNAL``.
EXTERNAL = 1


def check_tensor(tensor, subject: str = "initializer") -> int:
    """Check that an ``onnx.TensorProto`` holds exactly the data its dims and element type call for.

    Nothing is allocated: the dims are multiplied as Python integers and compared with the length
    of ``raw_data`` (the packed 4-, 2- and 6-bit types rounded up to whole bytes) or with the number
    of entries of the typed field (``float_data``, ``int32_data`` ...), as onnx.proto lays them out.
    A tensor whose data lives in an external file is checked only for its dims here (its length is
    checked where the file is read, :func:`policyport.graph.onnx_files.load_onnx`).

    Args:
        tensor: the ``TensorProto``.
        subject: what the tensor is, for the message (``"initializer"``, ``'Constant node "c" attribute value'``).

    Returns:
        The number of bytes the tensor's elements take in ``raw_data`` (0 for strings).

    Raises:
        BadModelError: negative dims, too many axes, an unknown or UNDEFINED element type, a
            ``segment``, or data whose length does not match the dims (the message names the tensor,
            the dims and both lengths).
    """
    name = f"{subject} {tensor.name!r}"
    dims = [int(d) for d in tensor.dims]
    if any(d < 0 for d in dims) or len(dims) > MAX_RANK:
        raise BadModelError(f"{name} has dims {dims}; dims must be non-negative, at most {MAX_RANK} of them")
    code = int(tensor.data_type)
    if code not in _TYPED_FIELD:
        raise BadModelError(f"{name} has element type {code}, which is not an ONNX tensor element type")
    if tensor.HasField("segment"):
        raise BadModelError(f"{name} is stored in segments, which policyport does not read")
    count = 1
    for d in dims:
        count *= d
    nbytes = -(-count * RAW_BITS.get(code, 0) // 8)
    if tensor.data_location == EXTERNAL:
        return nbytes
    field_name, per = _TYPED_FIELD[code]
    if tensor.HasField("raw_data") and code != 8:
        found, expected, unit = len(tensor.raw_data), nbytes, "bytes of raw_data"
    else:
        found = len(getattr(tensor, field_name))
        expected, unit = (count * per if per > 0 else -(-count // -per)), f"entries of {field_name}"
    if found != expected:
        raise BadModelError(
            f"{name} has dims {dims} ({count:,} {_type_name(code)} elements), which take {expected:,} {unit}, "
            f"but it holds {found:,}; the model is damaged or was not written by an ONNX exporter"
        )
    return nbytes


def _type_name(code: int) -> str:
    """``float32``, ``bfloat16``, ``string``: an ONNX element type's name (numpy's spelling)."""
    if code == 8:
        return "string"
    return ONNX_TO_NUMPY[code].name if code in ONNX_TO_NUMPY else ONNX_TO_ML_DTYPES.get(code, f"type-{code}")


def tensor_array(tensor, subject: str = "initializer") -> np.ndarray:
    """An ``onnx.TensorProto`` as a numpy array, after :func:`check_tensor` (imports ``onnx``).

    Raises:
        BadModelError: as :func:`check_tensor`; data still in an external file (load the model with
            :func:`policyport.graph.onnx_files.load_onnx`, which reads it from the model's folder); an element
            type numpy cannot hold; strings that are not UTF-8.
    """
    numpy_helper = require("onnx.numpy_helper", "onnx", "reading an ONNX tensor")
    check_tensor(tensor, subject)
    if tensor.data_location == EXTERNAL:
        raise BadModelError(
            f"{subject} {tensor.name!r} is stored in an external file that was not loaded; read the model "
            "with policyport.graph.onnx_files.load_onnx (or onnx.load from its folder) first"
        )
    if tensor.data_type in ONNX_TO_ML_DTYPES:
        onnx_dtype(tensor.data_type)  # says which package is missing, if one is
    try:
        return numpy_helper.to_array(tensor)
    except (ValueError, TypeError) as e:  # a string that is not UTF-8, an element type numpy lacks
        raise BadModelError(f"{subject} {tensor.name!r} cannot be read: {e}") from e


def from_onnx(model) -> Graph:
    """Read an ``onnx.ModelProto`` into a :class:`Graph` (imports ``onnx``).

    Args:
        model: the model; its main graph must not use subgraph attributes (If, Loop, Scan).

    Returns:
        The graph, with initializers as numpy arrays (external data must already be loaded).

    Raises:
        BadModelError: a node has a graph-valued attribute, or an element type numpy cannot hold.
    """
    onnx = require("onnx", "onnx", "reading an ONNX model")
    AttributeProto, helper = onnx.AttributeProto, onnx.helper  # noqa: N806
    g = model.graph
    inits = {t.name: tensor_array(t) for t in g.initializer}
    nodes = []
    opsets = {(o.domain if o.domain != "ai.onnx" else DEFAULT_DOMAIN): o.version for o in model.opset_import}
    for n in g.node:
        where = f'{n.op_type} node "{n.name}"'
        domain = DEFAULT_DOMAIN if n.domain == "ai.onnx" else n.domain
        _check_attributes(onnx, n, opsets.get(domain, opsets.get(DEFAULT_DOMAIN, 0)), where)

        attrs = {}
        for a in n.attribute:
            if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
                raise BadModelError(
                    f"{n.op_type} node {n.name!r} has a subgraph attribute {a.name!r}; "
                    "control flow (If, Loop, Scan) is not supported by the numpy backend"
                )
            if a.ref_attr_name:
                raise BadModelError(f"{n.op_type} node {n.name!r}: attribute references are not supported")
            value = helper.get_attribute_value(a)
            if a.type == AttributeProto.TENSOR:
                value = tensor_array(value, f"{where} attribute {a.name!r}: tensor")
            elif a.type == AttributeProto.TENSORS:
                value = tuple(tensor_array(t, f"{where} attribute {a.name!r}: tensor") for t in value)
            elif a.type == AttributeProto.STRING:
                value = _utf8(value, where, a.name)
            elif a.type == AttributeProto.STRINGS:
                value = tuple(_utf8(s, where, a.name) for s in value)
            elif isinstance(value, list):
                value = tuple(value)
            attrs[a.name] = value
        nodes.append(Node(n.op_type, tuple(n.input), tuple(n.output), attrs, n.name, n.domain))
    return sort_nodes(Graph(
        nodes=nodes,
        inputs=[_value_info(v) for v in g.input if v.name not in inits],
        outputs=[_value_info(v) for v in g.output],
        initializers=inits,
        opsets=opsets,
        metadata={p.key: p.value for p in model.metadata_props},
        optional_inputs=_overridable(g, inits) if model.ir_version >= 4 else [],
    ))


def _overridable(g, inits: dict[str, np.ndarray]) -> list[ValueInfo]:
    """The graph inputs that are initializers too, with the initializer's type and shape where the
    input declares none (before IR version 4 every initializer was listed as an input and none
    could be fed, which is why only IR >= 4 models have them)."""
    found = []
    for v in g.input:
        if v.name not in inits:
            continue
        arr = inits[v.name]
        info = _value_info(v) if v.type.tensor_type.elem_type else ValueInfo(v.name, arr.dtype, None)
        if info.dtype != arr.dtype:
            raise BadModelError(
                f"graph input {v.name!r} is declared {info.dtype.name} but its initializer is {arr.dtype.name}"
            )
        found.append(info if info.shape is not None else ValueInfo(v.name, arr.dtype, tuple(arr.shape)))
    return found


def _utf8(value: bytes, where: str, attribute: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadModelError(f"{where}: attribute {attribute!r} is not UTF-8 text ({e})") from e


_ATTRIBUTE_TYPES = {0: "undefined", 1: "a float", 2: "an int", 3: "a string", 4: "a tensor", 5: "a graph",
                    6: "a list of floats", 7: "a list of ints", 8: "a list of strings", 9: "a list of tensors",
                    10: "a list of graphs", 11: "a sparse tensor", 12: "a list of sparse tensors",
                    13: "a type proto", 14: "a list of type protos"}


def schema_attributes(onnx, op_type: str, opset: int, domain: str) -> tuple[int, dict[str, tuple[int, bool]]] | None:
    """The attributes of ``op_type``'s schema at ``opset``, as ``onnx.defs.get_schema`` gives it.

    Read from :mod:`policyport.graph.schemas` when the installed onnx is the version that table was
    written from (asking ``onnx.defs`` first builds onnx's whole schema registry, some 15-25 ms of
    a command's start-up), else from ``onnx.defs`` itself.

    Args:
        onnx: the imported ``onnx`` module.
        op_type: the node's op type.
        opset: the model's opset for ``domain``.
        domain: the node's domain (``""`` or ``"ai.onnx"``: the default domain).

    Returns:
        ``(since_version, {attribute: (AttributeProto type code, required)})`` of the newest schema
        whose since-version is at most ``opset``; None when onnx has no such schema.
    """
    from . import schemas as onnx_schemas

    domain = DEFAULT_DOMAIN if domain == "ai.onnx" else domain
    if onnx.__version__ == onnx_schemas.ONNX_VERSION:
        versions = onnx_schemas.SCHEMAS.get((domain, op_type), {})
        usable = [v for v in versions if v <= opset]
        if not usable:
            return None
        since = max(usable)
        return since, {name: (code, required) for name, code, required in versions[since]}
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # SchemaError: an op or domain onnx does not know
        return None
    return schema.since_version, {name: (a.type.value, bool(a.required)) for name, a in schema.attributes.items()}


def _check_attributes(onnx, node, opset: int, where: str) -> None:
    """Refuse attributes whose type contradicts the operator's schema at ``opset``, and missing
    required ones (what onnxruntime refuses on load); ops onnx has no schema for are left alone
    (a backend says so later)."""
    found = schema_attributes(onnx, node.op_type, opset, node.domain)
    if found is None:
        return
    since, specs = found
    for a in node.attribute:
        spec = specs.get(a.name)
        if spec is not None and a.type != spec[0]:
            raise BadModelError(
                f"{where}: attribute {a.name!r} is {_ATTRIBUTE_TYPES.get(a.type, f'of type {a.type}')}; "
                f"{node.op_type}-{since} makes it {_ATTRIBUTE_TYPES.get(spec[0], f'of type {spec[0]}')}")
    given = {a.name for a in node.attribute}
    missing = [name for name, (_, required) in specs.items() if required and name not in given]
    if missing:
        raise BadModelError(f"{where}: required attribute(s) {', '.join(missing)} missing "
                            f"({node.op_type}-{since})")


def _value_info(v) -> ValueInfo:
    t = v.type.tensor_type
    if not v.type.HasField("tensor_type"):
        raise BadModelError(f"graph input/output {v.name!r} is not a tensor")
    shape = None
    if t.HasField("shape"):
        shape = tuple(
            free_dim(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim
        )
    return ValueInfo(v.name, onnx_dtype(t.elem_type), shape)
