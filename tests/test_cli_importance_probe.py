"""The importance and probe commands: JSON, tables, plots, exit codes and refusals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from test_cli import invoke

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def converted(tmp_path_factory, metadrive_model):
    """The MetaDrive expert (converted with --head diag-gaussian) as an .onnx file."""
    import onnx

    path = tmp_path_factory.mktemp("cli") / "md.onnx"
    onnx.save(metadrive_model, path)
    return path


@pytest.fixture
def obs(tmp_path, metadrive_obs):
    path = tmp_path / "obs.npy"
    np.save(path, metadrive_obs[:60])
    return path


def expert_h2(obs: np.ndarray) -> tuple[np.ndarray, dict]:
    with np.load(ROOT / "fixtures" / "real" / "metadrive_ppo_expert.npz") as f:
        w = {k.removeprefix("default_policy/"): f[k].astype(np.float64) for k in f.files}
    h1 = np.tanh(obs.astype(np.float64) @ w["fc_1/kernel"] + w["fc_1/bias"])
    return np.tanh(h1 @ w["fc_2/kernel"] + w["fc_2/bias"]), w


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_importance_json_ranks_the_neurons_by_their_hand_computed_score(converted, obs, metadrive_obs, tmp_path, backend):
    plot = tmp_path / "imp.png"
    result = invoke("importance", converted, "-i", obs, "--tensors", "fc_2/tanh", "--output", "action[0]", "--top", "5",
                    "--backend", backend, "--plot", plot, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["output"] == "action[0]" and doc["ablation"] == "zero" and doc["rows"] == 60
    (tensor,) = doc["tensors"]
    assert tensor["name"] == "fc_2/tanh" and tensor["neurons"] == 256 and len(tensor["ranked"]) == 5
    h2, w = expert_h2(metadrive_obs[:60])
    # zero-ablating neuron j of fc_2/tanh moves the mean action by -h2[:, j] * fc_out/kernel[j, 0]
    scores = np.abs(h2 * w["fc_out/kernel"][:, 0]).mean(axis=0)
    assert [r["neuron"] for r in tensor["ranked"]] == list(np.argsort(-scores)[:5])
    np.testing.assert_allclose([r["score"] for r in tensor["ranked"]], np.sort(scores)[::-1][:5], atol=2e-6)
    assert doc["plot"] == str(plot) and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = invoke("importance", converted, "-i", obs, "--tensors", "fc_2/tanh", "--plot", plot)
    assert again.exit_code == 3 and "exists" in again.stderr


def test_importance_table_and_mean_ablation(converted, obs):
    result = invoke("importance", converted, "-i", obs, "--tensors", "fc_2/tanh,log_std", "--ablation", "mean", "--top", "3")
    assert result.exit_code == 0, result.output
    assert "fc_2/tanh: top 3 of 256 neurons" in result.stdout and "set to" in result.stdout
    assert "mean-ablated 256 neurons of 1 tensor over 60 observations" in result.stderr
    assert "left out: log_std ('action' does not depend on it)" in result.stderr


@pytest.mark.parametrize("args, code, message", [
    (["--output", "value"], 3, "the model has no graph output 'value'; it has ['logits', 'action', 'log_std']"),
    (["--output", "action[5]"], 3, "positions [5] are not on its last axis"),
    (["--means", "x.npz"], 2, "is for mean ablation"),
    (["--ablation", "resample"], 2, "resample"),
    (["--tensors", "nope*"], 3, "nope*"),
    (["--tensors", "action"], 3, "no selected tensor feeds 'action': action (it is the measured output)"),
    (["--plot", "out.jpg"], 2, ".png"),
    (["--engine", "ray", "--backend", "onnxruntime"], 2, "numpy backend on every worker"),
])
def test_importance_refusals(converted, obs, args, code, message):
    result = invoke("importance", converted, "-i", obs, *args)
    assert result.exit_code == code, result.output
    assert message in " ".join(result.stderr.split())


def test_importance_json_failure_is_one_document(converted, obs):
    result = invoke("importance", converted, "-i", obs, "--output", "value", "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code == 3 and doc["exit_code"] == 3 and "no graph output 'value'" in doc["error"]


@pytest.fixture
def recording(tmp_path, converted, metadrive_obs):
    np.save(tmp_path / "obs400.npy", metadrive_obs[:400])
    rec = tmp_path / "rec.npz"
    assert invoke("record", converted, "-i", tmp_path / "obs400.npy", "-o", rec, "--tensors", "fc_2/*").exit_code == 0
    return rec


def test_probe_json_plot_and_table(tmp_path, recording, metadrive_obs):
    h2, _ = expert_h2(metadrive_obs[:400])
    np.save(tmp_path / "y.npy", h2 @ np.random.default_rng(4).normal(size=256))
    plot = tmp_path / "probe.png"
    result = invoke("probe", recording, "--labels", tmp_path / "y.npy", "--tensors", "fc_2/*", "--plot", plot, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    scores = {t["name"]: t["score"] for t in doc["tensors"]}
    assert list(scores) == ["fc_2/linear", "fc_2/tanh"] and scores["fc_2/tanh"] >= 0.99
    assert doc["metric"] == "r2" and doc["test_rows"] == 100 and plot.read_bytes()[:4] == b"\x89PNG"
    table = invoke("probe", recording, "--labels", tmp_path / "y.npy", "--tensors", "fc_2/tanh")
    assert table.exit_code == 0 and "held-out R² on 100 of 400 observations" in table.stdout
    assert "fc_2/tanh" in table.stdout


def test_probe_refusals(tmp_path, recording, monkeypatch):
    np.save(tmp_path / "short.npy", np.zeros(7))
    result = invoke("probe", recording, "--labels", tmp_path / "short.npy")
    assert result.exit_code == 3 and "holds 7 labels and the recording 400 observations" in result.stderr
    assert invoke("probe", recording, "--labels", tmp_path / "short.npy", "--kind", "lasso").exit_code == 2
    np.save(tmp_path / "y.npy", np.zeros(400))
    monkeypatch.setitem(sys.modules, "sklearn", None)
    missing = invoke("probe", recording, "--labels", tmp_path / "y.npy", "--json")
    doc = json.loads(missing.stdout)
    assert missing.exit_code == 4 and doc["exit_code"] == 4 and "probe" in doc["error"]
