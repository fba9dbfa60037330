"""Shared fixtures: the real MetaDrive expert and observations drawn as the spine's acceptance asks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
METADRIVE = ROOT / "fixtures" / "real" / "metadrive_ppo_expert.npz"


@pytest.fixture(scope="session")
def metadrive_path() -> Path:
    return METADRIVE


@pytest.fixture(scope="session")
def metadrive_weights() -> dict[str, np.ndarray]:
    with np.load(METADRIVE) as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="session")
def metadrive_model():
    import policyport as pp

    return pp.convert(METADRIVE, activation="tanh", head="diag-gaussian")


@pytest.fixture(scope="session")
def metadrive_obs() -> np.ndarray:
    """1,000 observations drawn uniformly from [0, 1]^275 (MetaDrive's lidar features live there)."""
    return np.random.default_rng(2024).uniform(0, 1, size=(1000, 275)).astype(np.float32)


@pytest.fixture(scope="module")
def place(tmp_path_factory, metadrive_obs):
    """A folder of the module's own holding md.onnx (the MetaDrive expert, converted by the CLI), its
    source src.npz and obs.npy (5 rows)."""
    import shutil

    from typer.testing import CliRunner

    from policyport.cli import app

    folder = tmp_path_factory.mktemp("place")
    shutil.copy(METADRIVE, folder / "src.npz")
    result = CliRunner().invoke(app, ["convert", str(folder / "src.npz"), "-o", str(folder / "md.onnx"),
                                      "--activation", "tanh", "--head", "diag-gaussian", "--samples", "8"])
    assert result.exit_code == 0, result.output
    np.save(folder / "obs.npy", metadrive_obs[:5])
    return folder


@pytest.fixture
def strict_numpy():
    """Turn numpy floating-point warnings into errors (overflow, invalid, divide)."""
    with np.errstate(all="raise"):
        yield
