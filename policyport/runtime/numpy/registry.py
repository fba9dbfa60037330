"""The numpy backend's operator registry: the single truth of which ONNX ops it implements.

Each op is a plain function registered with ``@op("Gemm", since=13)``. Inputs are positional numpy
arrays (``None`` for an omitted optional input); attributes are keyword-only, spelled as in the ONNX
operator page, with the spec's defaults. A function returns one array, or a tuple of arrays for a
node with several outputs. An op that needs to know how many outputs its node has (Split before
opset 18) declares a keyword-only ``node_outputs`` parameter and receives that count. An op that draws
random numbers (RandomNormal, Multinomial ...) declares a keyword-only ``rng`` parameter and receives
a ``numpy.random.Generator``: the session's, or one of the node's own when the node has a ``seed``
attribute (see :class:`~policyport.runtime.numpy.plan.Plan`).

An op may also register a ``check``: a function ``check(inputs, attrs, outputs)`` that the plan calls
once at compile time with what is known before running (:class:`Static`: dtype, shape, and the value
of constant inputs), the node's attributes and its output count, and that raises ``ValueError``
when they contradict the operator page (Split sizes that do not add up, a perm that is no
permutation ...). The plan turns that into a :class:`~policyport.errors.BadModelError` naming the
node. What only the run can tell is checked inside the op, whose ``ValueError`` the plan turns into
the same error at run time.

Version selection follows the ONNX reference evaluator: for a model whose default-domain opset is
``N``, the implementation used is the newest one whose ``since`` is ``<= N``. An op is registered
again only at the opset versions where its semantics change (https://onnx.ai/onnx/operators/).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...errors import MissingOp, UnsupportedOpError

DEFAULT_DOMAIN = ""


@dataclass(frozen=True)
class OpImpl:
    """One registered implementation: ``fn`` serves ``op_type`` from opset ``since`` on; ``check``
    (optional) validates a node at compile time (see the module docstring)."""

    op_type: str
    since: int
    fn: Callable
    domain: str = DEFAULT_DOMAIN
    wants_node_outputs: bool = False
    wants_rng: bool = False
    check: Callable | None = None
    #: The function's positional parameters (the node's inputs, in order), and how many of them
    #: must be given (those without a default); ``None`` for ``max_inputs`` when it takes ``*inputs``.
    input_names: tuple[str, ...] = ()
    required_inputs: int = 0
    max_inputs: int | None = None
    #: The attributes the function takes (its keyword-only parameters), or ``None`` for any.
    attribute_names: frozenset[str] | None = frozenset()


@dataclass(frozen=True)
class Static:
    """What the plan knows of a node input before running it.

    ``dtype`` (or ``None``), ``shape`` (a tuple of ints and ``None`` for unknown dims; ``None`` when
    the rank is unknown) and ``value`` (the array, for initializers and Constant outputs; else
    ``None``). An omitted optional input is ``Static()``.
    """

    dtype: np.dtype | None = None
    shape: tuple[int | None, ...] | None = None
    value: Any = None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def dim(self, axis: int) -> int | None:
        """The size of ``axis`` (negative counts from the end) when known."""
        if self.shape is None or not -len(self.shape) <= axis < len(self.shape):
            return None
        return self.shape[axis]


_REGISTRY: dict[tuple[str, str], dict[int, OpImpl]] = {}

#: The newest default-domain opset whose operator semantics the registry follows (onnx 1.23's). A
#: model declaring a newer one is refused: its ops may mean something the registry does not know.
NEWEST_OPSET = 28


def op(op_type: str, since: int, *, domain: str = DEFAULT_DOMAIN, check: Callable | None = None
       ) -> Callable[[Callable], Callable]:
    """Register the decorated function as ``op_type`` from opset version ``since`` on.

    Args:
        op_type: the ONNX op type, e.g. ``"Gemm"``.
        since: the opset version this implementation's semantics start at.
        domain: the operator domain, ``""`` for the default ai.onnx domain.
        check: ``check(inputs: list[Static], attrs: dict, outputs: int)``, raising ``ValueError``
            for a node the operator page forbids (module docstring).

    Raises:
        ValueError: ``(domain, op_type, since)`` is registered already.
    """

    def register(fn: Callable) -> Callable:
        versions = _REGISTRY.setdefault((domain, op_type), {})
        if since in versions:
            raise ValueError(
                f"{op_type} since opset {since} is registered twice: "
                f"{versions[since].fn.__module__}.{versions[since].fn.__qualname__} and "
                f"{fn.__module__}.{fn.__qualname__}"
            )
        params = inspect.signature(fn).parameters
        positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        variadic = any(p.kind == p.VAR_POSITIONAL for p in params.values())
        versions[since] = OpImpl(
            op_type, since, fn, domain, wants_node_outputs="node_outputs" in params, wants_rng="rng" in params,
            check=check, input_names=tuple(p.name for p in positional),
            required_inputs=sum(p.default is p.empty for p in positional),
            max_inputs=None if variadic else len(positional),
            attribute_names=None if any(p.kind == p.VAR_KEYWORD for p in params.values()) else frozenset(
                p.name for p in params.values() if p.kind == p.KEYWORD_ONLY and p.name not in ("node_outputs", "rng")),
        )
        return fn

    return register


def versions(op_type: str, domain: str = DEFAULT_DOMAIN) -> list[int]:
    """The opset versions at which ``op_type`` has an implementation, ascending (empty if none)."""
    return sorted(_REGISTRY.get((domain, op_type), {}))


def supported_ops() -> dict[str, list[int]]:
    """Every registered default-domain op type -> its implementation versions, sorted by name."""
    return {name: versions(name, dom) for (dom, name) in sorted(_REGISTRY) if dom == DEFAULT_DOMAIN}


def op_table_markdown(columns: int = 4) -> str:
    """The supported ops as a Markdown table, ``columns`` ops per row: ``Gemm (7)``, ``Softmax (1, 13)``."""
    cells = [f"{name} ({', '.join(map(str, since))})" for name, since in supported_ops().items()]
    rows = [cells[i:i + columns] for i in range(0, len(cells), columns)]
    lines = ["| " + " | ".join(["op (since opset)"] * columns) + " |", "|" + "---|" * columns]
    lines += ["| " + " | ".join(row + [""] * (columns - len(row))) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def resolve(op_type: str, opset: int, domain: str = DEFAULT_DOMAIN, node_name: str = "") -> OpImpl:
    """The implementation of ``op_type`` to use in a model of opset ``opset``.

    Args:
        op_type: ONNX op type.
        opset: the model's opset version for ``domain``.
        domain: operator domain (``""`` = ai.onnx).
        node_name: the node's name, for the error message.

    Returns:
        The newest registered implementation whose ``since`` is ``<= opset``.

    Raises:
        UnsupportedOpError: no implementation exists at or below ``opset``.
    """
    impl = _usable(op_type, opset, domain)
    if impl is None:
        raise UnsupportedOpError([MissingOp(op_type, domain, opset, (node_name,), tuple(versions(op_type, domain)))])
    return impl


def _usable(op_type: str, opset: int, domain: str) -> OpImpl | None:
    impls = _REGISTRY.get((domain, op_type), {})
    usable = [v for v in impls if v <= opset]
    return impls[max(usable)] if usable else None


def missing_ops(graph) -> list[MissingOp]:
    """Every op of ``graph`` without an implementation at the graph's opset for its domain.

    Args:
        graph: a :class:`~policyport.graph.model.Graph`.

    Returns:
        One :class:`~policyport.errors.MissingOp` per (domain, op type), in order of first use,
        naming every node of that type; empty if the numpy backend can run the graph.
    """
    found: dict[tuple[str, str], list[str]] = {}
    for node in graph.nodes:
        opset = graph.opsets.get(node.domain, graph.opset)
        if _usable(node.op_type, opset, node.domain) is None:
            found.setdefault((node.domain, node.op_type), []).append(node.name)
    return [
        MissingOp(op_type, domain, graph.opsets.get(domain, graph.opset), tuple(nodes), tuple(versions(op_type, domain)))
        for (domain, op_type), nodes in found.items()
    ]
