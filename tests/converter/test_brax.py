"""Brax policies saved by Brax itself (``fixtures/brax/make_brax.py``: ``brax.io.model.save_params``): numpy's
and onnxruntime's ``action`` equal Brax's own deterministic action (``make_inference_fn(...,
deterministic=True)``) on 1,000 observations, the observation normaliser applied as Brax applies it;
``extract`` gives the arrays back bit for bit; nothing pickled in a file runs."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import policyport as pp
from policyport.converter import convert_source, detect_kind
from policyport.errors import UntrustedFileError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "brax"
NAMES = ("ppo_params", "sac_params")


@pytest.fixture(scope="module")
def make_brax():
    pytest.importorskip("brax")
    sys.path.insert(0, str(FIXTURES))
    try:
        import make_brax
    finally:
        sys.path.remove(str(FIXTURES))
    return make_brax


def observations(n: int = 1000) -> np.ndarray:
    """Observations around the normaliser's mean (about 3) and beyond its std (about 2)."""
    return np.random.default_rng(5).normal(3, 4, (n, 8)).astype(np.float32)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("name", NAMES)
def test_action_equals_brax_deterministic_action(make_brax, name, backend):
    obs = observations()
    want = make_brax.deterministic_action(name, obs)
    converted = convert_source(FIXTURES / f"{name}.pkl")
    assert converted.kind == "brax"
    got = pp.load(converted.model, backend=backend).run({"obs": obs})["action"]
    assert got.shape == want.shape == (1000, 2)
    assert np.abs(got - want).max() <= 1e-5 and np.abs(want).max() > 0.3


def test_the_normaliser_is_brax_formula_without_epsilon_or_clip(make_brax):
    """(obs - mean) / std: an epsilon (1e-8 on the variance, as gymnasium's) or a clip at 5 or 10 (as
    rl_games', skrl's) would move the action on these far observations."""
    obs = np.concatenate([observations(100), np.full((1, 8), 60, np.float32)])
    converted = convert_source(FIXTURES / "ppo_params.pkl")
    out = pp.load(converted.model).record({"obs": obs}, tensors="*")
    params = pickle.loads((FIXTURES / "ppo_params.pkl").read_bytes())  # the test trusts its own fixture
    mean, std = np.asarray(params[0].mean), np.asarray(params[0].std)
    assert np.array_equal(out["normalizer/obs"], (obs - mean) / std)
    assert out["normalizer/obs"].max() > 10
    assert np.abs(out["action"] - make_brax.deterministic_action("ppo_params", obs)).max() <= 1e-5


def test_detected_by_content_and_extract_gives_the_arrays_back(make_brax):
    assert detect_kind(FIXTURES / "ppo_params.pkl") == "brax"
    weights = pp.extract_weights(convert_source(FIXTURES / "sac_params.pkl").model)
    params = pickle.loads((FIXTURES / "sac_params.pkl").read_bytes())
    want = {"normalizer_params/mean": params[0].mean, "normalizer_params/std": params[0].std}
    want |= {f"params/{layer}/{p}": a for layer, ps in params[1]["params"].items() for p, a in ps.items()}
    assert set(weights) == set(want)
    for key, array in want.items():
        array = np.asarray(array)
        assert weights[key].dtype == array.dtype and np.array_equal(weights[key], array), key


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class Inert:
    def __init__(self):
        self.note = "a class the reader does not rebuild"


def test_a_pickled_payload_never_runs(make_brax, tmp_path):
    from brax.io import model

    params = model.load_params(str(FIXTURES / "sac_params.pkl"))
    model.save_params(str(tmp_path / "extra.pkl"), (params[0], {"params": {**params[1]["params"], "extra": Inert()}}))
    with pytest.raises(pp.PolicyportError, match="extra"):  # an inert record where a layer should be: named
        convert_source(tmp_path / "extra.pkl", kind="brax")
    model.save_params(str(tmp_path / "with_record.pkl"), (params[0], params[1], {"note": Inert()}))
    assert convert_source(tmp_path / "with_record.pkl", kind="brax", activation="relu").kind == "brax"
    marker = tmp_path / "ran"
    model.save_params(str(tmp_path / "hostile.pkl"), (params[0], params[1], RunsCode(marker)))
    with pytest.raises(UntrustedFileError, match=r"\.system"):
        convert_source(tmp_path / "hostile.pkl", kind="brax")
    assert not marker.exists()


@pytest.mark.slow
def test_convert_verify_pack_and_the_packed_run_py(make_brax, tmp_path):
    from typer.testing import CliRunner

    from policyport.cli import app

    source, out, folder = FIXTURES / "ppo_params.pkl", tmp_path / "policy.onnx", tmp_path / "packed"
    runner = CliRunner()
    result = runner.invoke(app, ["convert", str(source), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["verification"]["passed"]
    result = runner.invoke(app, ["verify", str(out), "--source", str(source), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["passed"], result.output
    result = runner.invoke(app, ["pack", str(out), "-o", str(folder), "--source", str(source), "--json"])
    assert result.exit_code == 0, result.output
    done = subprocess.run([sys.executable, str(folder / "run.py"), "--verify", "--json"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0 and json.loads(done.stdout)["passed"], done.stderr
