"""Linear probes: a feature planted linearly in a layer (computed by hand from the source's weights) is
recovered there and a shuffled label is not; recordings of both backends score alike; refusals."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import policyport as pp
from policyport.analysis import record_dataset
from policyport.analysis.probe import probe
from policyport.errors import InputMismatchError, MissingDependencyError, OptionError

pytest.importorskip("sklearn")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def expert_hidden(metadrive_obs):
    """The MetaDrive expert's fc_2/tanh on the 1,000 observations, by hand from the .npz."""
    with np.load(ROOT / "fixtures" / "real" / "metadrive_ppo_expert.npz") as f:
        w = {k.removeprefix("default_policy/"): f[k].astype(np.float64) for k in f.files}
    h1 = np.tanh(metadrive_obs.astype(np.float64) @ w["fc_1/kernel"] + w["fc_1/bias"])
    return np.tanh(h1 @ w["fc_2/kernel"] + w["fc_2/bias"])


@pytest.fixture(scope="module")
def recordings(tmp_path_factory, metadrive_model, metadrive_obs):
    """The expert's recording of the 1,000 observations, one per backend."""
    folder = tmp_path_factory.mktemp("probe")
    np.save(folder / "obs.npy", metadrive_obs)
    out = {}
    for backend in ("numpy", "onnxruntime"):
        out[backend] = folder / f"{backend}.npz"
        record_dataset(metadrive_model, folder / "obs.npy", out[backend], tensors="fc_*", backend=backend)
    return out


def test_a_planted_linear_feature_is_recovered_and_a_shuffled_one_is_not(tmp_path, recordings, expert_hidden):
    direction = np.random.default_rng(11).normal(size=expert_hidden.shape[1])
    feature = expert_hidden @ direction
    np.save(tmp_path / "planted.npy", feature)
    np.save(tmp_path / "shuffled.npy", np.random.default_rng(12).permutation(feature))
    scores = {}
    for backend, rec in recordings.items():
        planted = probe(rec, tmp_path / "planted.npy", tensors="fc_2/*")
        shuffled = probe(rec, tmp_path / "shuffled.npy", tensors="fc_2/*")
        assert [t.name for t in planted.tensors] == ["fc_2/linear", "fc_2/tanh"]
        by_name = {t.name: t.score for t in planted.tensors}
        assert by_name["fc_2/tanh"] >= 0.99
        assert by_name["fc_2/linear"] < by_name["fc_2/tanh"]  # tanh is not linear: the pre-activation reads it less well
        assert all(abs(t.score) < 0.05 for t in shuffled.tensors), [t.score for t in shuffled.tensors]
        assert planted.train_rows == 750 and planted.test_rows == 250 and planted.metric == "r2"
        scores[backend] = [t.score for t in planted.tensors]
    np.testing.assert_allclose(scores["numpy"], scores["onnxruntime"], atol=1e-4)


def test_a_logistic_probe_reads_a_planted_class_and_not_a_shuffled_one(tmp_path, recordings, expert_hidden):
    """The class: whether one neuron of fc_2/tanh is above its median; 750 rows to fit 256 weights."""
    neuron = expert_hidden[:, 57]
    classes = (neuron > np.median(neuron)).astype(np.int64)
    np.save(tmp_path / "classes.npy", classes)
    np.save(tmp_path / "shuffled.npy", np.random.default_rng(14).permutation(classes))
    planted = probe(recordings["numpy"], tmp_path / "classes.npy", tensors="fc_2/tanh", kind="logistic")
    shuffled = probe(recordings["numpy"], tmp_path / "shuffled.npy", tensors="fc_2/tanh", kind="logistic")
    assert planted.metric == "accuracy" and planted.tensors[0].score >= 0.9
    assert abs(shuffled.tensors[0].score - shuffled.chance) < 0.1 and 0.4 < shuffled.chance < 0.6


def test_an_sb3_policy_recording_recovers_a_planted_feature(tmp_path):
    src = ROOT / "fixtures" / "real" / "sb3_ppo_cartpole.zip"
    obs = np.random.default_rng(9).uniform(-2, 2, (800, 4)).astype(np.float32)
    np.save(tmp_path / "obs.npy", obs)
    rec = tmp_path / "rec.npz"
    record_dataset(pp.convert(src), tmp_path / "obs.npy", rec, tensors="*tanh")
    with np.load(rec) as f:
        hidden = f["mlp_extractor.policy_net.3/tanh"].astype(np.float64)
    np.save(tmp_path / "y.npy", hidden @ np.random.default_rng(2).normal(size=64))
    result = probe(rec, tmp_path / "y.npy", tensors="*tanh")
    assert [t.name for t in result.tensors] == ["mlp_extractor.policy_net.1/tanh", "mlp_extractor.policy_net.3/tanh"]
    assert {t.name: t.score for t in result.tensors}["mlp_extractor.policy_net.3/tanh"] >= 0.99


def test_refusals(tmp_path, recordings, monkeypatch):
    rec = recordings["numpy"]
    np.save(tmp_path / "short.npy", np.zeros(10))
    with pytest.raises(InputMismatchError, match="holds 10 labels and the recording 1,000 observations"):
        probe(rec, tmp_path / "short.npy")
    np.save(tmp_path / "float.npy", np.linspace(0, 1, 1000))
    with pytest.raises(InputMismatchError, match="a logistic probe fits classes"):
        probe(rec, tmp_path / "float.npy", kind="logistic")
    np.save(tmp_path / "nan.npy", np.full(1000, np.nan))
    with pytest.raises(InputMismatchError, match="1,000 labels are NaN or infinite"):
        probe(rec, tmp_path / "nan.npy")
    with pytest.raises(OptionError, match="unknown probe kind 'lasso'"):
        probe(rec, tmp_path / "float.npy", kind="lasso")
    with pytest.raises(OptionError, match="between 0 and 1"):
        probe(rec, tmp_path / "float.npy", test_fraction=1.0)
    monkeypatch.setitem(sys.modules, "sklearn", None)
    with pytest.raises(MissingDependencyError, match="probe") as e:
        probe(rec, tmp_path / "float.npy")
    assert e.value.exit_code == 4
