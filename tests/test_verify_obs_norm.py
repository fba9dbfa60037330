"""``verify --source`` opens only the files the command line names: never the observation-normalisation
path a model's metadata records, which a model file could set to any file on the machine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
from typer.testing import CliRunner

from policyport.cli import app
from policyport.converter import OPTIONS_KEY
from policyport.converter.sources import sb3 as sb3_converter

ROOT = Path(__file__).parents[1]
ZIP = ROOT / "fixtures/sb3/ppo_pendulum_vecnorm.zip"
NORM = ROOT / "fixtures/sb3/ppo_pendulum_vecnorm/vecnormalize.pkl"
runner = CliRunner()


@pytest.fixture
def forged(tmp_path):
    """The Pendulum policy converted with --obs-norm, its zip alone in a folder (no normaliser beside
    it), and the model's recorded --obs-norm rewritten to a secret file's path."""
    source = Path(shutil.copy(ZIP, tmp_path / "policy.zip"))
    model = tmp_path / "policy.onnx"
    done = runner.invoke(app, ["convert", str(source), "--obs-norm", str(NORM), "-o", str(model), "--samples", "16"])
    assert done.exit_code == 0, done.output
    secret = tmp_path / "secret"
    secret.write_text("not for a model to read")
    proto = onnx.load(model)
    entry = next(p for p in proto.metadata_props if p.key == OPTIONS_KEY)
    entry.value = json.dumps({**json.loads(entry.value), "obs_norm": str(secret)})
    onnx.save(proto, model)
    return model, source, secret


def test_verify_never_opens_the_normaliser_path_a_model_records(forged, monkeypatch):
    model, source, secret = forged
    opened = []
    real = sb3_converter.read_vecnormalize
    monkeypatch.setattr(sb3_converter, "read_vecnormalize", lambda path: opened.append(Path(path)) or real(path))
    result = runner.invoke(app, ["verify", str(model), "--source", str(source), "--samples", "16"])
    assert opened == []
    assert result.exit_code == 1, result.output  # the source read without the normaliser the model applies
    said = " ".join(result.stderr.split())
    assert (f"the model was converted with --obs-norm {secret}, a path its metadata records and verify never opens; "
            "the source is read without it") in said
    assert "give it again with --obs-norm (obs_norm=)" in said


def test_verify_rebuilds_the_source_with_the_normaliser_the_command_line_gives(forged, monkeypatch):
    model, source, secret = forged
    opened = []
    real = sb3_converter.read_vecnormalize
    monkeypatch.setattr(sb3_converter, "read_vecnormalize", lambda path: opened.append(Path(path)) or real(path))
    result = runner.invoke(app, ["verify", str(model), "--source", str(source), "--obs-norm", str(NORM),
                                 "--samples", "16"])
    assert result.exit_code == 0, result.output
    assert opened == [NORM] and "--obs-norm" not in result.stderr


def test_obs_norm_without_a_source_is_a_usage_error(forged):
    model, _, _ = forged
    result = runner.invoke(app, ["verify", str(model), "--obs-norm", str(NORM)])
    assert result.exit_code == 2 and "give --source too" in " ".join(result.stderr.split())
