"""Where a run's time goes, node by node: the numpy backend timed between nodes, onnxruntime by
its own profiler.

* numpy: the plan's ``observe`` variant with an observer that only reads the clock, so each
  node's time is the wall time from the previous node's end to its own (the observer's call, about
  a tenth of a microsecond, included). ``observe`` runs a batch whole, on the calling thread, so
  the figures are those of the straight-line code; :attr:`Profile.run_seconds` is what
  :meth:`Session.run <policyport.runtime.Session.run>` takes on the same feeds (row blocks and
  threads included).
* onnxruntime: a session built with ``SessionOptions.enable_profiling``; each node's figure is its
  ``<node>_kernel_time`` event (``dur``, µs) in the profile file, which is written to a temporary
  folder and removed.

Figures are medians over the runs; the first run (warm-up) is not counted.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeTime:
    """One node's time: ``node`` and ``op_type`` as in the graph, ``tensor`` its first output,
    ``seconds`` the median over the runs."""

    node: str
    op_type: str
    tensor: str
    seconds: float


@dataclass
class Profile:
    """A profile of one backend on one set of feeds.

    Attributes:
        backend: ``"numpy"`` or ``"onnxruntime"``.
        nodes: one entry per node timed, in the order they ran.
        run_seconds: median wall time of a plain run on the same feeds, in seconds.
        runs: how many runs the medians are taken over.
        notes: how the figures were taken.
    """

    backend: str
    nodes: list[NodeTime]
    run_seconds: float
    runs: int
    notes: list[str] = field(default_factory=list)

    @property
    def node_seconds(self) -> float:
        """The nodes' times added up."""
        return sum(n.seconds for n in self.nodes)


def _runs_for(call, budget: float) -> int:
    """How many runs of ``call`` fit in ``budget`` seconds (at least 5, at most 1,000)."""
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-7)
    return int(min(1000, max(5, budget / once)))


def _median_run(call, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def profile_numpy(session, feeds, budget: float = 0.5) -> Profile:
    """Per-node times of the numpy backend on ``feeds``.

    Args:
        session: a :class:`~policyport.runtime.Session` on the numpy backend.
        feeds: as for :meth:`Session.run <policyport.runtime.Session.run>`.
        budget: about how many seconds the timed runs may take, all together (default 0.5).

    Raises:
        InputMismatchError: the feeds do not fit the model.
    """
    feeds = session._feeds(feeds)
    backend = session.backend
    plan = backend._plan_for(feeds)
    marks: list[tuple[int, int]] = []

    def observer(node_index, output_index, value):
        marks.append((node_index, time.perf_counter_ns()))
        return value

    def observed():
        marks.clear()
        marks.append((-1, time.perf_counter_ns()))
        plan.observe(feeds, observer)

    runs = _runs_for(observed, budget / 2)
    per_node: dict[int, list[int]] = {}
    for _ in range(runs):
        observed()
        previous = marks[0][1]
        for i, (node, t) in enumerate(marks[1:], 1):
            if marks[i - 1][0] != node:  # the first output of a node: its end
                per_node.setdefault(node, []).append(t - previous)
            previous = t
    nodes = backend.graph.nodes
    timed = [NodeTime(nodes[i].name, nodes[i].op_type, next((o for o in nodes[i].outputs if o), ""),
                      statistics.median(ns) * 1e-9) for i, ns in per_node.items()]
    run_seconds = _median_run(lambda: session.run(feeds), _runs_for(lambda: session.run(feeds), budget / 2))
    return Profile("numpy", timed, run_seconds, runs,
                   ["per node: the whole batch on one thread (observe); run: Session.run as it runs "
                    "(row blocks on several threads from 1,024 rows)"])


def profile_onnxruntime(session, feeds, budget: float = 0.5) -> Profile:
    """Per-node times from onnxruntime's own profiler for the model of an onnxruntime ``session``.

    The profiled session is built like the backend's own (same model and threads), with profiling
    on; ``feeds`` and ``budget`` as for :func:`profile_numpy`.
    """
    feeds = session._feeds(feeds)
    import json
    import shutil
    import tempfile
    from pathlib import Path

    backend = session.backend
    ort = backend._ort
    folder = Path(tempfile.mkdtemp(prefix="policyport-profile-"))
    try:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = backend.threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 4
        opts.enable_profiling = True
        opts.profile_file_prefix = str(folder / "ort")
        profiled = ort.InferenceSession(backend.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        names = [v.name for v in backend.outputs]
        plain = dict(feeds)
        runs = _runs_for(lambda: profiled.run(names, plain), budget / 2)
        for _ in range(runs):
            profiled.run(names, plain)
        events = json.loads(Path(profiled.end_profiling()).read_text())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    durations: dict[str, list[float]] = {}
    ops: dict[str, str] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            node = e["name"][: -len("_kernel_time")]
            durations.setdefault(node, []).append(float(e.get("dur", 0)))
            ops[node] = e.get("args", {}).get("op_name", "")
    outputs = {n.name: next((o for o in n.outputs if o), "") for n in backend.graph.nodes}
    timed = [NodeTime(node, ops[node], outputs.get(node.removeprefix("fused "), ""), statistics.median(us[1:] or us) * 1e-6)
             for node, us in durations.items()]
    run_seconds = _median_run(lambda: session.run(feeds), _runs_for(lambda: session.run(feeds), budget / 2))
    return Profile("onnxruntime", timed, run_seconds, runs,
                   ["per node: onnxruntime's profiler (kernel time); run: Session.run as it runs"])
