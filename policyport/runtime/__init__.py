"""Run a model on any backend behind one :class:`Session` interface.

``BACKENDS`` is the one mapping of backend names that the CLI's choices, :func:`load` and the
conformance tests all read.
"""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Iterable, Iterator, Mapping
from typing import Callable

import numpy as np

from ..errors import BadModelError, PolicyportError
from ..graph.model import Graph, ValueInfo
from .base import Backend, TensorSizes, compile_feed_check, select_tensors
from .overrides import Steering, parse_overrides

#: Backend name -> one-line description. ``"numpy"`` needs numpy only at run time.
BACKENDS: dict[str, str] = {
    "numpy": "policyport's own interpreter, pure numpy",
    "onnxruntime": "onnxruntime, CPU execution provider",
}

#: The most threads a session may be asked for: far beyond any core count a run can use, below
#: what would exhaust the process's threads (onnxruntime starts every one it is given).
MAX_THREADS = 1024

Feeds = Mapping[str, np.ndarray] | np.ndarray


class Session:
    """A model loaded on one backend.

    Feeds are checked (names, dtype, rank, fixed widths, consistent symbolic dims) before the
    backend sees them, identically for every backend.
    """

    def __init__(self, backend: Backend):
        self.backend = backend
        graph = getattr(backend, "graph", None)
        kept = graph.metadata.get("policyport.batch_kept") if graph is not None else None  # batch.BATCH_KEPT_KEY
        self._check = compile_feed_check(backend.inputs, backend.optional_inputs, kept_batch=kept)
        self._run = backend.run
        self._selections: dict[object, list[str]] = {}

    @property
    def inputs(self) -> list[ValueInfo]:
        """The graph inputs (name, dtype, shape)."""
        return self.backend.inputs

    @property
    def optional_inputs(self) -> list[ValueInfo]:
        """Inputs that may be fed to override their default (initializers that are graph inputs too)."""
        return self.backend.optional_inputs

    @property
    def outputs(self) -> list[ValueInfo]:
        """The graph outputs (name, dtype, shape)."""
        return self.backend.outputs

    @property
    def tensor_names(self) -> list[str]:
        """Every node output in node order: what :meth:`record` can return."""
        return self.backend.tensor_names

    def _feeds(self, feeds: Feeds) -> Mapping[str, np.ndarray]:
        if type(feeds) is dict:
            return self._check(feeds)
        if not isinstance(feeds, Mapping):
            if len(self.inputs) != 1:
                raise BadModelError(
                    f"the model has {len(self.inputs)} inputs {[v.name for v in self.inputs]}; pass a dict of feeds"
                )
            feeds = {self.inputs[0].name: feeds}
        return self._check(feeds)

    def run(self, feeds: Feeds, overrides=None) -> dict[str, np.ndarray]:
        """Run the model.

        Args:
            feeds: input name -> array (for a single-input model, the array alone), e.g.
                ``{"obs": float32 array, shape (batch, obs_dim)}``.
            overrides: neurons to set, scale or clamp, by tensor name: ``{"fc_2/tanh": {17: 1.0}}``,
                a text spec ``"fc_1/tanh[*]*=0.5"`` or a list of them (grammar in
                :mod:`policyport.runtime.overrides`); applied right after the producing node, on
                every backend alike. Default: none.

        Returns:
            graph output name -> array, in graph-output order.

        Raises:
            InputMismatchError: the feeds do not match the graph inputs, or an override is malformed,
                names a tensor no node produces, or a neuron beyond the tensor's width.
        """
        if overrides is not None and (steering := self.steering(overrides)).tensors:
            return self.backend.record_steered(self._feeds(feeds), None, steering)
        return self._run(self._check(feeds) if type(feeds) is dict else self._feeds(feeds))

    def record(self, feeds: Feeds, tensors: str | list[str] | None = "*", overrides=None) -> dict[str, np.ndarray]:
        """Run the model and return every requested intermediate tensor as well as the outputs.

        Args:
            feeds: as for :meth:`run`.
            tensors: node-output names or ``fnmatch`` globs over them, comma-separated or a list
                (a tensor's exact name selects that tensor only, even with ``[`` or ``*`` in it);
                ``"*"`` (default) records every node output.
            overrides: as for :meth:`run`; the recorded tensors are the steered ones.

        Returns:
            tensor name -> array: the matching node outputs in node order, then any graph output
            not among them. Each array has the batch axis first, as the graph computes it.

        Raises:
            InputMismatchError: bad feeds or overrides, or a pattern that matches no tensor.
        """
        names = self.selection(tensors)
        if overrides is not None and (steering := self.steering(overrides)).tensors:
            return self.backend.record_steered(self._feeds(feeds), names, steering)
        return self.backend.record(self._feeds(feeds), names)

    def record_iter(self, batches: Iterable[Feeds], tensors: str | list[str] | None = "*",
                    overrides=None) -> Iterator[dict[str, np.ndarray]]:
        """:meth:`record` over a stream of batches, one result per batch, computed as it is consumed.

        Nothing is kept between batches, so memory is bounded by one batch however long the stream
        (``policyport.analysis.record_dataset`` streams the results to disk).

        Args:
            batches: an iterable of feeds (each as for :meth:`run`).
            tensors, overrides: as for :meth:`record`; checked before the first batch is read.

        Yields:
            tensor name -> array for each batch, as :meth:`record` returns it.
        """
        names = self.selection(tensors)
        steering = None if overrides is None else self.steering(overrides)
        return self._record_iter(batches, names, steering if steering is not None and steering.tensors else None)

    def _record_iter(self, batches, names, steering):
        for feeds in batches:
            if steering is None:
                yield self.backend.record(self._feeds(feeds), names)
            else:
                yield self.backend.record_steered(self._feeds(feeds), names, steering)

    def per_observation(self, feeds: Feeds, tensors: str | list[str] | None = "*", overrides=None
                        ) -> tuple[dict[str, tuple[np.dtype, tuple[int, ...]]], list[str]] | None:
        """Which of the tensors a :meth:`record` of ``tensors`` returns hold one row per observation
        (the batch axis first): those with 2 rows when the model runs on 2 observations and 3 rows
        on 3, each time of the same row shape. A constant, a shape (an SB3 policy's
        ``action_net/mean_shape`` is ``(2,)``) or anything else of a fixed length keeps its length:
        a single run could take one whose length happens to be the batch's rows for a tensor with rows.

        The observations are the first row of ``feeds`` repeated, so that the model runs on values it
        expects (zeros of a row's shape where ``feeds`` hold none). Inputs with a batch axis are cut,
        and so is an input of unknown rank fed an array (counted by its axis 0, as
        :func:`~policyport.runtime.base.count_observations` counts it); the others are fed as they are.

        Args:
            feeds: as for :meth:`run` (the first row of each input with a batch axis is used).
            tensors, overrides: as for :meth:`record`.

        Returns:
            (tensor name -> (dtype, shape of one row) for those with rows, in the order :meth:`record`
            returns them; the names of the others), or ``None`` when no input is cut (each run of the
            model is one observation).

        Raises:
            InputMismatchError: bad feeds, tensors or overrides.
        """
        feeds = self._feeds(feeds)
        batched = {v.name for v in self.inputs if v.name in feeds
                   and (v.has_batch_axis or (v.shape is None and np.ndim(feeds[v.name]) >= 1))}
        if not batched:
            return None

        def observations(k: int) -> dict[str, np.ndarray]:
            fed = {}
            for name, a in feeds.items():
                if name in batched:
                    first = a[:1] if len(a) else np.zeros((1, *a.shape[1:]), a.dtype)
                    a = np.repeat(first, k, axis=0)
                fed[name] = a
            return fed

        two, three = (self.record(observations(k), tensors, overrides=overrides) for k in (2, 3))
        kept, others = {}, []
        for name, v in three.items():
            if v.ndim >= 1 and v.shape[0] == 3 and two[name].shape == (2, *v.shape[1:]):
                kept[name] = (v.dtype, tuple(v.shape[1:]))
            else:
                others.append(name)
        return kept, others

    def selection(self, tensors: str | list[str] | None = "*") -> list[str]:
        """The node outputs that ``tensors`` (globs, as for :meth:`record`) select, in node order.

        Raises:
            InputMismatchError: a pattern matches no tensor.
        """
        try:
            key = tensors if isinstance(tensors, (str, type(None))) else tuple(tensors)
            names = self._selections.get(key)
        except TypeError:  # not iterable, or unhashable items: select_tensors says what is wrong
            return select_tensors(self.tensor_names, tensors)
        if names is None:
            names = self._selections[key] = select_tensors(self.tensor_names, tensors)
        return names

    def steering(self, overrides) -> Steering:
        """``overrides`` (any form :meth:`run` takes) checked against this model.

        Raises:
            InputMismatchError: a malformed override, or one naming a tensor no node produces.
        """
        if isinstance(overrides, Steering):
            return overrides
        return Steering(parse_overrides(overrides), self.tensor_names)

    def tensor_sizes(self, feeds: Feeds) -> TensorSizes | None:
        """Every tensor's bytes and elements on one and on two rows of ``feeds``, from a record of
        every tensor on those rows (:class:`~policyport.runtime.base.TensorSizes`).

        The rows are cut along every batch axis: axis 0 where it is free, and any axis named like a
        batch axis (an LSTM's initial state ``(1, batch, hidden)``).

        Args:
            feeds: as for :meth:`run`.

        Returns:
            The sizes; ``None`` when they cannot be told: no batched input, batch axes of different
            lengths, at most two rows, or a model that does not run on one or two rows.
        """
        feeds = self._feeds(feeds)
        symbols = {v.shape[0] for v in self.inputs if v.has_batch_axis and isinstance(v.shape[0], str)}
        cuts = {v.name: {axis for axis, d in enumerate(v.shape)
                         if (axis == 0 and not isinstance(d, int)) or d in symbols}
                for v in self.inputs if v.shape and v.name in feeds}
        counts = {np.shape(feeds[name])[axis] for name, axes in cuts.items() for axis in axes
                  if np.ndim(feeds[name]) > axis}
        if len(counts) != 1 or min(counts) <= 2:
            return None

        def measured(k: int) -> tuple[dict[str, tuple[int, int]], int]:
            part = {name: a[tuple(slice(k) if axis in cuts.get(name, ()) else slice(None) for axis in range(np.ndim(a)))]
                    for name, a in feeds.items()}
            values = {name: np.asarray(v) for name, v in self.record(part, "*").items()}
            return {name: (v.nbytes, v.size) for name, v in values.items()}, sum(np.size(a) for a in part.values())

        try:
            (one, inputs_one), (two, inputs_two) = measured(1), measured(2)
        except PolicyportError:
            return None
        return TensorSizes(counts.pop(), one, two, (inputs_one, inputs_two))

    def memory_needed(self, feeds: Feeds, tensors: str | list[str] | None = None) -> int:
        """About how many bytes a run (``tensors=None``) or :meth:`record` of ``tensors`` on ``feeds``
        will take at its peak, beyond the feeds: the tensors it holds at once, measured on one and
        two of the rows and extrapolated to all (:meth:`tensor_sizes`), held as the backend holds
        them (:meth:`~policyport.runtime.base.Backend.memory_needed`). On the MLPs of
        ``tests/test_memory_estimates.py`` (peaks measured as the resident set size), at least the
        peak and at most twice it, on either backend.

        Args:
            feeds: as for :meth:`run`.
            tensors: what :meth:`record` would be asked for; ``None`` for :meth:`run`.

        Returns:
            The estimate in bytes; 0 when it cannot be told (see :meth:`tensor_sizes`).

        Raises:
            InputMismatchError: bad feeds, or a pattern that matches no tensor.
        """
        names = None if tensors is None else self.selection(tensors)
        sizes = self.tensor_sizes(feeds)
        return 0 if sizes is None else self.backend.memory_needed(sizes, sizes.rows, names)

    def observe(self, feeds: Feeds, observer: Callable) -> dict[str, np.ndarray]:
        """Run on the numpy backend calling ``observer(node_index, output_index, value) -> value``
        after every node; the returned value replaces the tensor (to steer neurons).

        Raises:
            BadModelError: the backend is not ``numpy``.
        """
        if not hasattr(self.backend, "observe"):
            raise BadModelError(f"observers need the numpy backend; this session runs on {self.backend.name}")
        return self.backend.observe(self._feeds(feeds), observer)


def load(model, backend: str = "numpy", *, threads: int = 0, seed: int | None = None,
         free: bool = True) -> Session:
    """Load a model on a backend.

    Args:
        model: an ``onnx.ModelProto``, a path to an ``.onnx`` file, a :class:`~policyport.graph.model.Graph`,
            or a folder written by ``policyport pack`` (which the numpy backend runs with numpy alone).
        backend: a key of :data:`BACKENDS`: ``"numpy"`` (default) or ``"onnxruntime"``.
        threads: how many threads a run may use. ``numpy``: threads sharing the row blocks of a
            batch of 1,024 rows or more (:mod:`policyport.runtime.numpy.rows`), the BLAS held to
            one thread each (needs threadpoolctl, the ``threads`` extra; without it, 1); the result
            is the same bits whatever the number. ``onnxruntime``: intra-op threads. 0 (default):
            one per usable core (onnxruntime's own default); at most :data:`MAX_THREADS` (1,024).
        seed: seed of the random ops (RandomNormalLike, Multinomial ...; a node's own ``seed``
            attribute takes precedence): the same seed gives the same sequence of results from a
            new session. None (default) draws fresh entropy. The backends use different
            generators, so numpy and onnxruntime draw different numbers from the same seed.
            onnxruntime's seed is process-wide (``onnxruntime.set_seed``): it is set before each of
            the session's onnxruntime sessions is built, and stays set for later ones.
        free: free a graph input's batch fixed at 1 (an exporter's traced example, such as rsl_rl's
            ``obs [1, 48]``) where every node computes each row alone and the freed graph, checked on a few
            observations, computes each as the file's graph does at batch 1
            (:func:`policyport.runtime.batch.free_checked`; default). A batch that stays fixed is
            explained in the error a larger batch gets. ``False``: the graph as the file declares it.

    Returns:
        A :class:`Session`.

    Raises:
        InputMismatchError: unknown backend name; threads beyond 0 to :data:`MAX_THREADS`, a
            negative seed.
        ArgumentTypeError: threads or seed not a whole number.
        UnreadableFileError: the path cannot be read.
        UnsupportedOpError: the numpy backend lacks ops of the model (every one is named).
        MissingDependencyError: the backend's library (or onnx, to read a .onnx file) is missing.
    """
    from ..errors import InputMismatchError, check_argument

    if backend not in BACKENDS:
        raise InputMismatchError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    check_argument(threads, "threads (0: one per core)", "int", 0, MAX_THREADS)
    check_argument(seed, "seed", "int", 0, none=True)
    proto = None
    if isinstance(model, Graph):
        graph = model
    elif isinstance(model, (str, os.PathLike)) and Path(model).is_dir():
        from ..graph.onnx_files import check_model_folder
        from .packed import load_graph

        check_model_folder(model)  # a SavedModel, an RLlib checkpoint, a plain folder: say what it is
        graph = load_graph(model)
        if backend != "numpy":
            from ..graph.onnx_files import load_onnx

            proto = load_onnx(model)
    else:
        from ..graph.onnx_files import ensure_model
        from ..graph.model import from_onnx

        proto = ensure_model(model)
        kept = None
        if free:  # an exporter's fixed batch of 1, freed where the graph allows and checked against it at batch 1
            from .batch import BATCH_KEPT_KEY, free_checked

            freeing = free_checked(proto, backend)
            proto, kept = freeing.model, freeing.describe() if freeing.reason else None
        graph = from_onnx(proto)
        if kept:
            graph.metadata[BATCH_KEPT_KEY] = kept
    if backend == "numpy":
        from .numpy import NumpyBackend

        return Session(NumpyBackend(graph, seed=seed, threads=threads))
    from .ort import OrtBackend

    if proto is None:
        raise BadModelError("the onnxruntime backend needs an ONNX model: pass the ModelProto or the .onnx path")
    return Session(OrtBackend(proto, graph, threads=threads, seed=seed))
