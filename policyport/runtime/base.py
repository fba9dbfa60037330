"""The one interface every backend implements, and the feed checks they all share.

A backend is built from a :class:`~policyport.graph.model.Graph` view (for its inputs, outputs and tensor
names) plus whatever it executes; :class:`Session` checks feeds against the graph inputs before any
backend runs, so every backend rejects bad input with the same error and message.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import numpy as np

from ..errors import InputMismatchError, listing
from ..graph.model import Graph, Node, ValueInfo
from ..graph.selection import select_tensors  # noqa: F401  (re-exported: the runtime's callers select with it)
from .overrides import Steering


class Backend(ABC):
    """Executes one model. Implementations: ``numpy`` (own interpreter), ``onnxruntime``."""

    name: str = ""
    #: The graph the backend runs (its nodes, inputs, outputs).
    graph: Graph
    inputs: list[ValueInfo]
    #: Inputs that may be fed but need not be: initializers that are graph inputs too.
    optional_inputs: list[ValueInfo] = []
    outputs: list[ValueInfo]
    #: Every node output, in node order: the tensors :meth:`record` can return.
    tensor_names: list[str]

    @abstractmethod
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Graph outputs by name for feeds already checked by :func:`check_feeds`."""

    @abstractmethod
    def record(self, feeds: Mapping[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        """Graph outputs and the node outputs ``names``, by tensor name."""

    @abstractmethod
    def record_steered(self, feeds: Mapping[str, np.ndarray], names: list[str] | None,
                       steering: Steering) -> dict[str, np.ndarray]:
        """As :meth:`record` (``names=None``: as :meth:`run`), with ``steering``'s overrides applied
        to each overridden tensor right after the node that produces it."""

    def memory_needed(self, sizes: TensorSizes, rows: int, names: list[str] | None) -> int:
        """The most bytes a run (``names=None``) or a record of ``names`` on ``rows`` rows holds at
        once, beyond its feeds: each node output from its node until its last reader has run, and
        the tensors it returns until the end (:func:`held_in_node_order`). A backend that keeps
        more (a buffer arena) or less (results written in place) says so in its own version.

        Args:
            sizes: every tensor's size, as :meth:`policyport.runtime.Session.tensor_sizes` measures it.
            rows: the rows of the batch.
            names: the node outputs a record returns (graph outputs are returned too); ``None`` for a run.

        Returns:
            The estimate in bytes.
        """
        returned = [v.name for v in self.outputs] + list(names or ())
        return held_in_node_order(self.graph.nodes, sizes.nbytes(rows), returned)


@dataclass(frozen=True)
class TensorSizes:
    """The bytes and elements of every node output (and graph output) on one row and on two rows of
    a batch, and the elements of the feeds' batched rows: what a run on any number of rows holds,
    since a tensor that grows with the batch grows in proportion to it.

    Attributes:
        rows: the rows of the batch the sizes were measured for (its batch axis' length).
        one, two: tensor name -> ``(bytes, elements)`` on one and on two rows, in node order.
        inputs: the elements of the feeds on one and on two rows.
    """

    rows: int
    one: Mapping[str, tuple[int, int]]
    two: Mapping[str, tuple[int, int]]
    inputs: tuple[int, int]

    @staticmethod
    def _at(one: int, two: int, rows: int) -> int:
        return one + max(two - one, 0) * (rows - 1)

    def nbytes(self, rows: int) -> dict[str, int]:
        """Tensor name -> its bytes on ``rows`` rows."""
        return {name: self._at(b1, self.two[name][0], rows) for name, (b1, _) in self.one.items()}

    def elements(self, rows: int) -> dict[str, int]:
        """Tensor name -> its elements on ``rows`` rows."""
        return {name: self._at(e1, self.two[name][1], rows) for name, (_, e1) in self.one.items()}

    def input_elements(self, rows: int) -> int:
        """The elements of the feeds on ``rows`` rows."""
        return self._at(*self.inputs, rows)


def held_in_node_order(nodes: Iterable[Node], nbytes: Mapping[str, int], kept: Iterable[str] = (),
                       in_place: Callable[[Node], bool] | None = None,
                       temporary: Callable[[Node], int] | None = None) -> int:
    """The most bytes of node outputs alive at once when ``nodes`` run in order, each output alive
    from its node until the last node that reads it has run, and those in ``kept`` (what the run
    returns) until the end. Feeds and initializers are not counted.

    Args:
        nodes: the graph's nodes, in the order they run.
        nbytes: tensor name -> bytes; tensors not in it take none.
        kept: the tensors alive until the end.
        in_place: whether a node may write its first output over its first input's memory (an
            allocator that reuses the buffer of an input it is the last reader of): where it says
            so, and that input is a node output of the same size that nothing reads later and that
            is not kept, the output takes the input's bytes instead of new ones. Default: never.
        temporary: the bytes a node holds while it runs beyond its inputs and outputs (scratch
            arrays); default none.
    """
    nodes = list(nodes)
    kept = set(kept)
    last = {t: i for i, n in enumerate(nodes) for t in n.inputs if t}
    held: dict[str, int] = {}  # node output alive -> the bytes it holds
    peak = 0
    for i, n in enumerate(nodes):
        outputs = [t for t in n.outputs if t]
        src = n.inputs[0] if n.inputs else ""
        reuse = (in_place is not None and outputs and src in held and last.get(src) == i and src not in kept
                 and held[src] == nbytes.get(outputs[0], 0) and src not in outputs and in_place(n))
        for t in outputs:
            held[t] = held.get(t, 0) + (0 if reuse and t == outputs[0] else nbytes.get(t, 0))
        if reuse:
            held[outputs[0]] += held.pop(src)  # the output's bytes are the input's
        peak = max(peak, sum(held.values()) + (temporary(n) if temporary is not None else 0))
        made_here = [t for t in outputs if last.get(t, -1) <= i]  # never read after this node
        read_last = [t for t in n.inputs if t and last[t] == i]
        for t in dict.fromkeys([*made_here, *read_last]):
            if t not in kept:
                held.pop(t, None)
    return peak


def feeds_from_arrays(arrays: Mapping[str, np.ndarray], names: list[str], source: object) -> dict[str, np.ndarray]:
    """Feeds from the arrays of an input file: an ``.npz`` keyed by input name, or one array (an
    ``.npy``, loaded under the key ``""``, or an ``.npz`` holding one array under any name) for a
    single-input model.

    Args:
        arrays: name -> array, as :func:`policyport.io.arrays.load_arrays` returns them.
        names: the model's input names.
        source: what the arrays came from, for the message (a path).

    Raises:
        InputMismatchError: one array for a model with several inputs.
    """
    if list(arrays) == [""] or (len(arrays) == 1 and len(names) == 1 and names[0] not in arrays):
        if len(names) != 1:
            raise InputMismatchError(
                f"{source} holds one array but the model has inputs {names}; use an .npz keyed by input name"
            )
        return {names[0]: next(iter(arrays.values()))}
    return dict(arrays)


def compile_feed_check(inputs: list[ValueInfo], optional: list[ValueInfo] = (), kept_batch: str | None = None
                       ) -> Callable[[Mapping[str, object]], Mapping[str, np.ndarray]]:
    """:func:`check_feeds` compiled for one model's inputs, with a fast path for valid feeds.

    The returned function gives back a feed dict that names exactly the required inputs with
    ``np.ndarray`` values of the right dtype, rank and fixed dimensions as is, testing exactly those
    conditions in generated code; anything else (feeds of ``optional`` inputs, or inputs sharing a
    symbolic dimension) goes through :func:`check_feeds`, which raises the detailed error. Input
    names reach the generated source only as bound constants. ``kept_batch``: as for :func:`check_feeds`.
    """
    optional = list(optional)

    def slow(feeds: Mapping[str, object]) -> Mapping[str, np.ndarray]:
        return check_feeds(feeds, inputs, optional, kept_batch)

    symbols = [d for v in inputs if v.shape for d in v.shape if isinstance(d, str)]
    if any(v.shape is None for v in inputs) or len(symbols) != len(set(symbols)):
        return slow
    env: dict[str, object] = {"ndarray": np.ndarray, "slow": slow}
    tests = []
    for i, v in enumerate(inputs):
        env[f"name{i}"], env[f"dtype{i}"] = v.name, v.dtype
        cond = ["type(a) is not ndarray", f"a.dtype != dtype{i}", f"a.ndim != {len(v.shape)}"]
        cond += [f"a.shape[{axis}] != {d}" for axis, d in enumerate(v.shape) if isinstance(d, int)]
        tests += [f"    a = feeds.get(name{i})", f"    if {' or '.join(cond)}: return slow(feeds)"]
    source = "\n".join(["def check(feeds):", f"    if len(feeds) != {len(inputs)}: return slow(feeds)",
                        *tests, "    return feeds"])
    exec(compile(source, "<policyport feed check>", "exec"), env)
    return env["check"]


def native_order(value):
    """``value`` with its bytes in this machine's order: an array stored the other way round (``np.save``
    of a ``>f4`` array on a little-endian machine) converted, anything else as it is."""
    if isinstance(value, np.ndarray) and value.dtype.byteorder not in ("=", "|") and \
            value.dtype != value.dtype.newbyteorder("="):
        return value.astype(value.dtype.newbyteorder("="))
    return value


def check_feeds(feeds: Mapping[str, object], inputs: list[ValueInfo],
                optional: list[ValueInfo] = (), kept_batch: str | None = None) -> dict[str, np.ndarray]:
    """Validate feeds against the graph inputs and return them as numpy arrays.

    Checks, in order: every input is fed and nothing else is (an ``optional`` input may be); each
    array has the input's dtype (no silent casts; an array of that dtype in the other byte order,
    such as ``np.save`` of a ``>f4`` array, is converted to native order) and rank; each fixed dimension matches; a symbolic
    dimension (``"batch"``) has one size across all inputs that share it.

    Args:
        feeds: input name -> array-like.
        inputs: the graph inputs.
        optional: inputs that may be fed (initializers that are graph inputs too).
        kept_batch: why the model's batch, fixed at 1 in its file, stays fixed
            (:func:`policyport.runtime.batch.free_checked`): said when a feed's batch is not 1.

    Returns:
        input name -> ``np.ndarray`` in native byte order: the required inputs in graph-input
        order, then the optional ones fed.

    Raises:
        InputMismatchError: with the input's name, what was expected and what was found.
    """
    names = [v.name for v in inputs]
    allowed = names + [v.name for v in optional]
    missing = [n for n in names if n not in feeds]
    extra = [n for n in feeds if n not in allowed]
    if missing or extra:
        problems = ([f"missing [{listing(missing)}]"] if missing else []) + ([f"unexpected [{listing(extra)}]"] if extra else [])
        also = f" (and optionally [{listing(v.name for v in optional)}])" if optional else ""
        raise InputMismatchError(f"the model's inputs are [{listing(names)}]{also}; the feeds have {' and '.join(problems)}")
    out: dict[str, np.ndarray] = {}
    symbols: dict[str, tuple[int, str]] = {}
    for v in [*inputs, *(o for o in optional if o.name in feeds)]:
        arr = np.asarray(feeds[v.name])
        if arr.dtype != v.dtype and arr.dtype.newbyteorder("=") == v.dtype:  # in the other byte order
            arr = native_order(arr)
        if arr.dtype != v.dtype:
            raise InputMismatchError(
                f"input {v.name!r} expects dtype {v.dtype.name}, got {arr.dtype.name}; "
                f"convert it first (e.g. x.astype(np.{v.dtype.name}))"
            )
        if v.shape is not None:
            expected = "(" + ", ".join(str(d) if d is not None else "?" for d in v.shape) + ("," if len(v.shape) == 1 else "") + ")"
            if arr.ndim != len(v.shape):
                hint = " (add a batch axis: x[None])" if arr.ndim == len(v.shape) - 1 else ""
                raise InputMismatchError(
                    f"input {v.name!r} expects rank {len(v.shape)} with shape {expected}, "
                    f"got rank {arr.ndim} with shape {tuple(arr.shape)}{hint}"
                )
            for axis, (want, got) in enumerate(zip(v.shape, arr.shape)):
                if isinstance(want, int) and want != got:
                    why = f"; {kept_batch}" if kept_batch and axis == 0 and want == 1 else ""
                    raise InputMismatchError(
                        f"input {v.name!r} expects shape {expected}, got {tuple(arr.shape)} "
                        f"(axis {axis} is {got}, the model needs {want}){why}"
                    )
                if isinstance(want, str):
                    first = symbols.setdefault(want, (got, v.name))
                    if first[0] != got:
                        raise InputMismatchError(
                            f"dimension {want!r} is {first[0]} in input {first[1]!r} but {got} in input {v.name!r}"
                        )
        out[v.name] = arr
    return out


def count_observations(inputs: Iterable[ValueInfo], feeds: Mapping[str, np.ndarray]) -> int:
    """How many observations ``feeds`` hold: the rows of the inputs that have a batch axis.

    An input has a batch axis when its axis 0 is free (see :attr:`ValueInfo.has_batch_axis`); an
    input of unknown rank counts by its feed's axis 0 (a scalar feed: 1). When no input has a batch
    axis (only scalars and fixed shapes such as ``(1, 480)`` or ``(54,)``), a feed is one
    observation. Inputs with a batch axis should agree (a shared symbol is checked by
    :func:`check_feeds`); the first one counts.

    Args:
        inputs: the graph inputs.
        feeds: input name -> array, as checked by :func:`check_feeds`.

    Returns:
        The number of observations, ``>= 0``.
    """
    for v in inputs:
        if v.name in feeds and (v.has_batch_axis or v.shape is None):
            return int(np.shape(feeds[v.name])[0]) if np.ndim(feeds[v.name]) else 1
    return 1


def nonfinite_rows(array: np.ndarray) -> int:
    """How many rows (first axis) of ``array`` hold a NaN or an infinite value (0 for integer arrays)."""
    array = np.asarray(array)
    if array.dtype.kind not in "fc" or array.ndim == 0:
        return int(array.dtype.kind in "fc" and not np.isfinite(array))
    if array.size == 0:  # no rows, or rows of nothing
        return 0
    finite = np.isfinite(array)
    if finite.all():  # the usual case, at a third of the cost of counting rows
        return 0
    return int((~finite.reshape(len(array), -1)).any(axis=1).sum())
