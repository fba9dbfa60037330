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


def _numpy_error_state_now():
    """numpy's floating-point error state: numpy 2's context variable value (compared by identity by
    the runtime's ``quiet``) or numpy 1's settings."""
    from policyport.runtime.numpy import floating

    return floating._STATE, (floating._STATE.get() if floating._STATE is not None else np.geterr())


#: numpy's floating-point error state before any test module is imported.
_NUMPY_STATE_VAR, _NUMPY_STATE = _numpy_error_state_now()


def _restore_numpy_error_state():
    if _NUMPY_STATE_VAR is None:
        np.seterr(**_NUMPY_STATE)
    elif _NUMPY_STATE_VAR.get() is not _NUMPY_STATE:
        _NUMPY_STATE_VAR.set(_NUMPY_STATE)


@pytest.fixture(autouse=True)
def _numpy_error_state():
    """numpy's floating-point error state as the session began, for every test: an RL library
    imported as an oracle (at collection or in a test) may change it for the whole process
    (rl_games sets ``under='warn'``), which would leak into the runtime's warning tests."""
    _restore_numpy_error_state()
    yield
    _restore_numpy_error_state()
