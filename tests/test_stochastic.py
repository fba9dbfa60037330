"""Stochastic nodes in verification, and --outputs: a policy with a sampled action beside the
deterministic one (as ML-Agents exports) verifies and packs on everything that is not random."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

import policyport as pp
import policyport.runtime
from policyport.cli import app
from policyport.runtime.expose import prune
from policyport.runtime.numpy import registry

runner = CliRunner()
RNG = np.random.default_rng(0)
W = RNG.standard_normal((6, 2)).astype(np.float32)


@pytest.fixture(autouse=True)
def random_normal_like():
    """RandomNormalLike on the numpy backend: the registry's own if it has one, else a stand-in."""
    registry.supported_ops()
    key = ("", "RandomNormalLike")
    if key in registry._REGISTRY:
        yield
        return

    def fn(x, *, dtype=None, mean=0.0, scale=1.0, seed=None):
        return np.random.default_rng(None if seed is None else int(seed)).normal(mean, scale, x.shape).astype(x.dtype)

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(registry._REGISTRY, key, {1: registry.OpImpl("RandomNormalLike", 1, fn)})
        yield


def sampled_policy():
    """obs (batch, 6) -> mu = obs @ W; noise = RandomNormalLike(mu); sampled = mu + noise * 0.1;
    outputs: deterministic action ``mu``, stochastic ``sampled``, and ``version_number``."""
    nodes = [helper.make_node("MatMul", ["obs", "W"], ["mu"], name="mu"),
             helper.make_node("RandomNormalLike", ["mu"], ["noise"], name="noise"),
             helper.make_node("Mul", ["noise", "std"], ["scaled"], name="scaled"),
             helper.make_node("Add", ["mu", "scaled"], ["sampled"], name="sampled"),
             helper.make_node("Identity", ["version"], ["version_number"], name="version_number")]
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(np.array(0.1, np.float32), "std"),
             numpy_helper.from_array(np.array([3.0], np.float32), "version")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 6])],
        [helper.make_tensor_value_info("mu", TensorProto.FLOAT, ["batch", 2]),
         helper.make_tensor_value_info("sampled", TensorProto.FLOAT, ["batch", 2]),
         helper.make_tensor_value_info("version_number", TensorProto.FLOAT, [1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


REASON = "depends on the random RandomNormalLike node 'noise'"


def test_random_tensors_are_skipped_with_the_reason_and_the_rest_decides():
    report = pp.verify(sampled_policy(), samples=32)
    assert report.passed
    assert [(s.tensor, s.reason) for s in report.skipped] == [(t, REASON) for t in ("noise", "scaled", "sampled")]
    assert [c.tensor for c in report.comparisons] == ["mu", "version_number"]
    doc = report.to_dict()
    assert doc["skipped"] == [{"tensor": t, "reason": REASON} for t in ("noise", "scaled", "sampled")]


def test_a_real_mismatch_beside_random_tensors_still_fails(monkeypatch):
    model = sampled_policy()
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    w = W.copy()
    w[0, 0] += 1e-3
    changed.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "W"))
    load = policyport.runtime.load
    monkeypatch.setattr(policyport.runtime, "load",
                        lambda m, backend="numpy", **k: load(changed if backend == "onnxruntime" else m, backend, **k))
    report = pp.verify(model, samples=32)
    assert not report.passed and report.first_divergence.tensor == "mu"
    assert [s.tensor for s in report.skipped] == ["noise", "scaled", "sampled"]


def test_outputs_prunes_the_graph_to_what_they_need():
    report = pp.verify(sampled_policy(), samples=8, outputs="mu")
    assert report.passed and report.skipped == [] and [c.tensor for c in report.comparisons] == ["mu"]
    pruned = pp.load(prune(sampled_policy(), ["mu"]))
    assert [n.op_type for n in pruned.backend.graph.nodes] == ["MatMul"]
    assert list(pruned.backend.graph.initializers) == ["W"]
    with pytest.raises(pp.InputMismatchError, match=r"--outputs \['action'\]: not tensors of the model; its graph "
                                                     r"outputs are mu, sampled, version_number"):
        pp.verify(sampled_policy(), samples=8, outputs="action")


def test_an_intermediate_named_in_outputs_becomes_the_output():
    pruned = prune(sampled_policy(), "noise")
    assert [o.name for o in pruned.graph.output] == ["noise"] and [n.name for n in pruned.graph.node] == ["mu", "noise"]
    onnx.checker.check_model(pruned, full_check=True)


def test_only_random_outputs_leave_nothing_to_compare():
    with pytest.raises(pp.InputMismatchError, match="^nothing to compare: every tensor depends on a random node; "
                                                "choose deterministic outputs with --outputs$"):
        pp.verify(sampled_policy(), samples=8, outputs="sampled", tensors="")


def test_cli_lists_skipped_tensors_and_exits_on_the_rest(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(sampled_policy(), path)
    result = runner.invoke(app, ["verify", str(path), "--samples", "16"])
    assert result.exit_code == 0, result.output
    assert f"skipped sampled: {REASON}" in result.stdout and "3 random tensor(s) skipped" in result.stdout
    doc = json.loads(runner.invoke(app, ["verify", str(path), "--samples", "16", "--json"]).stdout)
    assert [s["tensor"] for s in doc["skipped"]] == ["noise", "scaled", "sampled"]
    doc = json.loads(runner.invoke(app, ["verify", str(path), "--samples", "16", "--outputs", "mu,version_number",
                                         "--json"]).stdout)
    assert doc["skipped"] == [] and [c["tensor"] for c in doc["comparisons"]] == ["mu", "version_number"]


def test_pack_and_its_folder_skip_random_tensors(tmp_path):
    folder = pp.pack(sampled_policy(), tmp_path / "b", samples=8)
    parity = json.loads((folder / "policy.json").read_text())["parity"]
    assert parity["passed"] and [s["tensor"] for s in parity["skipped"]] == ["noise", "scaled", "sampled"]
    report = pp.verify_bundle(folder)
    assert report.passed and [s.tensor for s in report.skipped] == ["noise", "scaled", "sampled"]


def test_run_outputs_computes_only_the_chosen_outputs(tmp_path):
    path, obs, out = tmp_path / "m.onnx", tmp_path / "obs.npy", tmp_path / "out.npz"
    onnx.save(sampled_policy(), path)
    np.save(obs, np.ones((3, 6), np.float32))
    for backend in pp.BACKENDS:
        result = runner.invoke(app, ["run", str(path), "-i", str(obs), "-o", str(out), "--outputs", "mu",
                                     "--backend", backend, "--force"])
        assert result.exit_code == 0, result.output
        with np.load(out) as f:
            assert list(f.files) == ["mu"]
            np.testing.assert_allclose(f["mu"], np.ones((3, 6), np.float32) @ W, rtol=1e-6)


@pytest.mark.parametrize("tensors", ["", ","])
def test_an_empty_tensor_list_is_refused_and_the_graph_outputs_are_recorded_by_name(tmp_path, tensors):
    path, obs = tmp_path / "m.onnx", tmp_path / "obs.npy"
    onnx.save(sampled_policy(), path)
    np.save(obs, np.ones((2, 6), np.float32))
    run = ["run", str(path), "-i", str(obs), "-o", str(tmp_path / "o.npz"), "--record", str(tmp_path / "r.npz"), "--tensors"]
    refused = runner.invoke(app, [*run, tensors])  # an unset shell variable, say: not "the outputs only"
    assert refused.exit_code == 2 and "holds no tensor name or glob" in refused.stderr
    assert not (tmp_path / "o.npz").exists() and not (tmp_path / "r.npz").exists()
    assert runner.invoke(app, [*run, "mu"]).exit_code == 0
    with np.load(tmp_path / "r.npz") as f:  # the graph outputs, always recorded, and the description
        assert sorted(f.files) == ["mu", "policyport.recording", "sampled", "version_number"]
        described = [t["name"] for t in json.loads(str(f["policyport.recording"]))["tensors"]]
    assert described == ["mu", "sampled"]  # version_number is a constant: no row per observation
    doc = json.loads(runner.invoke(app, ["verify", str(path), "--samples", "4", "--tensors", "mu", "--json"]).stdout)
    assert [c["tensor"] for c in doc["comparisons"]] == ["mu", "version_number"]  # 'sampled' is random: skipped
