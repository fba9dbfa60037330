"""verify --observer: recording and patch points change nothing they should not, replayed nodes give
their recorded outputs, and a patch point that moves nothing (or what it does not feed) is named."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import policyport as pp
from policyport.runtime import Session
from policyport.verification.observer import downstream, observer_check
from test_cli import invoke

BACKENDS = list(pp.BACKENDS)


def test_the_expert_passes_bit_for_bit_on_numpy(metadrive_model, metadrive_obs):
    report = observer_check(metadrive_model, metadrive_obs[:64])
    assert report.passed and report.samples == 64 and report.backends == BACKENDS
    numpy_side = [c for c in report.transparency if c.backend == "numpy"]
    assert len(numpy_side) == 6 and all(c.exact for c in numpy_side)  # record and patch points x 3 outputs
    assert [r.node for r in report.replay if r.backend == "numpy"] == [
        "fc_1/linear", "fc_1/tanh", "fc_2/linear", "fc_2/tanh", "logits", "action", "log_std"]
    assert {(s.tensor, s.status) for s in report.sensitivity if s.backend == "onnxruntime"} == {
        ("fc_1/linear", "moves"), ("fc_1/tanh", "moves"), ("fc_2/linear", "moves"), ("fc_2/tanh", "moves"),
        ("logits", "moves"), ("action", "moves"), ("log_std", "moves")}
    fed = {s.tensor: s.feeds for s in report.sensitivity if s.backend == "numpy"}
    assert fed["action"] == ["action"] and fed["fc_2/tanh"] == ["logits", "action", "log_std"]


def test_a_recording_that_is_not_what_the_nodes_compute_fails_the_replay(metadrive_model, metadrive_obs, monkeypatch):
    record = Session.record

    def tampered(self, feeds, tensors="*", overrides=None):
        values = record(self, feeds, tensors, overrides)
        if "fc_1/tanh" in values:
            values = {**values, "fc_1/tanh": values["fc_1/tanh"] + np.float32(1e-3)}
        return values

    monkeypatch.setattr(Session, "record", tampered)
    report = observer_check(metadrive_model, metadrive_obs[:16], backends=["numpy"])
    failed = [(r.node, round(r.max_abs, 6)) for r in report.replay if not r.passed]
    assert [name for name, _ in failed] == ["fc_1/tanh", "fc_2/linear"]  # its node, and the node that reads it
    assert failed[0][1] == pytest.approx(1e-3, rel=1e-2)
    assert not report.passed and all(c.passed for c in report.transparency)


def test_an_instrumented_run_that_changes_an_output_fails_transparency(metadrive_model, metadrive_obs, monkeypatch):
    record = Session.record

    def leaky(self, feeds, tensors="*", overrides=None):
        values = record(self, feeds, tensors, overrides)
        return {**values, "logits": np.nextafter(values["logits"], np.float32(np.inf))}

    monkeypatch.setattr(Session, "record", leaky)
    report = observer_check(metadrive_model, metadrive_obs[:8], backends=["numpy"])
    bad = [(c.instrument, c.output) for c in report.transparency if not c.passed]
    assert bad == [("record", "logits")]  # one ulp: numpy's side must be bit for bit


def dead_model():
    """``h = tanh(x)``; ``dead = h * 0`` feeds ``y = dead + x``; ``n`` only reaches ``Shape``."""
    zero = numpy_helper.from_array(np.zeros(3, np.float32), "zero")
    nodes = [helper.make_node("Tanh", ["x"], ["h"], name="h"), helper.make_node("Mul", ["h", "zero"], ["dead"], name="dead"),
             helper.make_node("Add", ["dead", "x"], ["y"], name="y"), helper.make_node("Neg", ["x"], ["n"], name="n"),
             helper.make_node("Shape", ["n"], ["s"], name="s")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
                               helper.make_tensor_value_info("s", TensorProto.INT64, [2])], [zero])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_patch_point_that_moves_nothing_it_feeds_is_dead(backend):
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    report = observer_check(dead_model(), x, backends=[backend])
    status = {s.tensor: s.status for s in report.sensitivity}
    assert status == {"h": "dead", "dead": "moves", "y": "moves", "n": "feeds no output", "s": "skipped"}
    assert [s.tensor for s in report.dead] == ["h"] and not report.passed
    assert downstream(pp.load(dead_model()).backend.graph, "n") == set()  # Shape reads no value


def test_verify_observer_cli(tmp_path, metadrive_model, metadrive_obs):
    onnx.save(metadrive_model, tmp_path / "md.onnx")
    np.save(tmp_path / "obs.npy", metadrive_obs[:20])
    result = invoke("verify", tmp_path / "md.onnx", "--observer", "-i", tmp_path / "obs.npy", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["passed"] is True and doc["samples"] == 20 and doc["dead"] == []
    assert len(doc["transparency"]) == 12 and len(doc["replay"]) == 14 and len(doc["sensitivity"]) == 14
    onnx.save(dead_model(), tmp_path / "dead.onnx")
    result = invoke("verify", tmp_path / "dead.onnx", "--observer", "--samples", "4", "--backends", "numpy")
    assert result.exit_code == 1
    assert "FAIL: 1 of" in result.stdout and "dead patch points: h" in result.stdout
    refused = invoke("verify", tmp_path / "md.onnx", "--observer", "--source", tmp_path / "obs.npy")
    assert refused.exit_code == 2 and "--observer checks the model on its backends" in " ".join(refused.output.split())
