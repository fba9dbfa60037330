"""Per-node profiles (policyport.runtime.profile) on a clock the test controls: how many runs a budget
buys, which marks make a node's time, medians and units, and how onnxruntime's profile file is read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import policyport as pp
from policyport.runtime import profile as profile_module
from policyport.runtime.profile import NodeTime, Profile, profile_numpy, profile_onnxruntime


class Clock:
    """``time`` as the profile module sees it: every reading advances by ``step`` (seconds) or
    ``step_ns`` (nanoseconds)."""

    def __init__(self, step: float = 0.001, step_ns: int = 1000):
        self.step, self.step_ns, self.now, self.now_ns = step, step_ns, 0.0, 0

    def perf_counter(self) -> float:
        self.now += self.step
        return self.now

    def perf_counter_ns(self) -> int:
        self.now_ns += self.step_ns
        return self.now_ns


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(profile_module, "time", clock)
    return clock


def split_model():
    """obs (batch, 4) -> h = obs @ W -> Split into a, b (a node with two outputs) -> y = Tanh(a)."""
    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 16, "W")
    nodes = [helper.make_node("MatMul", ["obs", "W"], ["h"], name="mm"),
             helper.make_node("Split", ["h"], ["a", "b"], name="split", axis=1, num_outputs=2),
             helper.make_node("Tanh", ["a"], ["y"], name="act")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 2])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("once, budget, runs", [
    (0.125, 5.0, 40),         # budget / one run
    (0.375, 5.0, 13),         # rounded down
    (2.0, 5.0, 5),            # at least 5
    (0.0009765625, 1.0, 1000),  # at most 1,000 (1,024 would fit)
    (0.0, 1e-4, 1000),        # a run too quick to measure counts as 0.1 µs: 1,000, not 5
])
def test_runs_for_fits_the_budget_between_5_and_1000_runs(monkeypatch, once, budget, runs):
    monkeypatch.setattr(profile_module, "time", Clock(step=once))  # two readings around the call
    calls = []
    assert profile_module._runs_for(lambda: calls.append(1), budget) == runs
    assert calls == [1]  # the call timed once


def test_median_run_is_the_median_of_each_runs_wall_time(monkeypatch):
    readings = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])  # runs of 3 s, 1 s and 2 s
    monkeypatch.setattr(profile_module, "time", type("T", (), {"perf_counter": staticmethod(lambda: next(readings))}))
    calls = []
    assert profile_module._median_run(lambda: calls.append(1), 3) == 2.0
    assert len(calls) == 3


def test_a_profile_adds_up_its_nodes():
    profile = Profile("numpy", [NodeTime("a", "MatMul", "h", 0.25), NodeTime("b", "Tanh", "y", 0.5)], 1.0, 7)
    assert profile.node_seconds == 0.75 and profile.notes == [] and Profile("numpy", [], 0.0, 1).node_seconds == 0


def timed(profile: Profile) -> list[tuple[str, str, str, float]]:
    """Each node's figures, its time in whole nanoseconds."""
    return [(n.node, n.op_type, n.tensor, round(n.seconds * 1e9)) for n in profile.nodes]


def test_numpy_times_each_node_from_the_previous_nodes_end_to_its_first_output(clock):
    session = pp.load(split_model())
    obs = np.ones((3, 4), np.float32)
    runs, plain = [], session.run
    session.run = lambda feeds: runs.append(1) or plain(feeds)
    result = profile_numpy(session, obs, budget=0.02)
    # 0.01 s for the observed runs; one run reads perf_counter twice, 1 ms apart: 1 ms a run, 10 runs
    assert result.backend == "numpy" and result.runs == 10
    assert len(runs) == 11  # the other 0.01 s: Session.run timed once, then 10 times for the median
    # every mark is 1 µs after the one before: each node is one mark after the previous node's last one
    assert timed(result) == [("mm", "MatMul", "h", 1000), ("split", "Split", "a", 1000), ("act", "Tanh", "y", 1000)]
    assert result.run_seconds == pytest.approx(0.001)
    assert result.notes == ["per node: the whole batch on one thread (observe); run: Session.run as it runs "
                            "(row blocks on several threads from 1,024 rows)"]


def test_numpy_profile_figures_are_medians_over_the_runs(monkeypatch):
    # five marks a run: the start, then h, a, b (one node, two outputs) and y; three runs
    marks = iter([0, 2000, 5000, 6000, 10000,
                  0, 4000, 5000, 5500, 9500,
                  0, 3000, 5000, 5200, 6200])
    clock = Clock()
    clock.perf_counter_ns = lambda: next(marks)
    monkeypatch.setattr(profile_module, "time", clock)
    monkeypatch.setattr(profile_module, "_runs_for", lambda call, budget: 3)
    result = profile_numpy(pp.load(split_model()), np.ones((2, 4), np.float32))
    # mm: 2, 4, 3 µs; split: 3, 1, 2 µs (to its first output); act: 4, 4, 1 µs (from the split's last output)
    assert result.runs == 3
    assert timed(result) == [("mm", "MatMul", "h", 3000), ("split", "Split", "a", 2000), ("act", "Tanh", "y", 4000)]


def test_numpy_profile_checks_the_feeds_first(clock):
    with pytest.raises(pp.InputMismatchError, match=r"input 'obs' expects shape \(batch, 4\), got \(3, 5\)"):
        profile_numpy(pp.load(split_model()), np.ones((3, 5), np.float32))


class FakeOrt:
    """onnxruntime as profile_onnxruntime uses it, writing the profile file the test gives."""

    def __init__(self, events):
        self.events, self.options, self.providers, self.runs = events, None, None, []

    def SessionOptions(self):  # noqa: N802 (onnxruntime's name)
        return type("Options", (), {})()

    def InferenceSession(self, data, options, providers):  # noqa: N802
        fake = self
        fake.options, fake.providers = options, providers

        class Profiled:
            def run(self, names, feeds):
                fake.runs.append((list(names), dict(feeds)))

            def end_profiling(self):
                path = Path(options.profile_file_prefix + "_1.json")
                path.write_text(json.dumps(fake.events))
                return str(path)

        return Profiled()


def test_onnxruntime_profile_reads_kernel_times_from_the_profile_file(monkeypatch, clock):
    model = split_model()
    session = pp.load(model, backend="onnxruntime", threads=3)
    events = [
        {"cat": "Session", "name": "model_run", "dur": 999},
        *({"cat": "Node", "name": "mm_kernel_time", "dur": d, "args": {"op_name": "MatMul"}} for d in (900, 2, 6, 4)),
        *({"cat": "Node", "name": "mm_fence_before", "dur": d} for d in (50, 50, 50, 50)),
        *({"cat": "Node", "name": "fused split_kernel_time", "dur": d, "args": {"op_name": "Split"}} for d in (7, 3)),
        {"cat": "Node", "name": "act_kernel_time", "dur": 8, "args": {"op_name": "Tanh"}},
        {"cat": "Node", "name": "other_kernel_time", "args": {}},
    ]
    fake = FakeOrt(events)
    monkeypatch.setattr(session.backend, "_ort", fake)
    obs = np.ones((3, 4), np.float32)
    plain_runs, plain = [], session.run
    session.run = lambda feeds: plain_runs.append(1) or plain(feeds)
    result = profile_onnxruntime(session, obs, budget=0.02)
    assert len(plain_runs) == 11  # Session.run timed once, then 10 times for the median
    opts = fake.options
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads, opts.log_severity_level, opts.enable_profiling) == \
        (3, 1, 4, True)
    assert fake.providers == ["CPUExecutionProvider"]
    folder = Path(opts.profile_file_prefix).parent
    assert folder.name.startswith("policyport-profile-") and Path(opts.profile_file_prefix).name == "ort"
    assert not folder.exists()  # the profile file and its folder are removed
    assert result.backend == "onnxruntime" and result.runs == 10 and len(fake.runs) == 11  # timed once, then 10 runs
    assert all(names == ["y", "b"] and list(feeds) == ["obs"] for names, feeds in fake.runs)
    # the first event of each node (warm-up) is left out unless it is the only one; µs to seconds
    assert timed(result) == [("mm", "MatMul", "h", 4000), ("fused split", "Split", "a", 3000),
                             ("act", "Tanh", "y", 8000), ("other", "", "", 0)]
    assert result.run_seconds == pytest.approx(0.001)
    assert result.notes == ["per node: onnxruntime's profiler (kernel time); run: Session.run as it runs"]


def test_onnxruntime_profile_of_the_real_profiler_names_every_node(metadrive_model):
    obs = np.random.default_rng(4).uniform(0, 1, (8, 275)).astype(np.float32)
    result = profile_onnxruntime(pp.load(metadrive_model, backend="onnxruntime", threads=1), obs, budget=0.02)
    assert {n.tensor for n in result.nodes} >= {"fc_1/linear", "fc_2/linear", "logits"}  # fused or not
    assert all(n.op_type and n.seconds >= 0 for n in result.nodes) and 5 <= result.runs <= 1000
    with pytest.raises(pp.InputMismatchError, match=r"input 'obs' expects shape \(batch, 275\), got \(8, 10\)"):
        profile_onnxruntime(pp.load(metadrive_model, backend="onnxruntime"), obs[:, :10])
