"""Fixtures of the analysis tests: the MetaDrive expert as an .onnx file and a dataset of observations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="session")
def metadrive_onnx(tmp_path_factory, metadrive_model):
    import onnx

    path = tmp_path_factory.mktemp("model") / "metadrive.onnx"
    onnx.save(metadrive_model, path)
    return path


@pytest.fixture(scope="session")
def dataset(tmp_path_factory):
    """3,000 observations in [0, 1]^275 as .npy, and their array."""
    obs = np.random.default_rng(31).uniform(0, 1, (3000, 275)).astype(np.float32)
    path = tmp_path_factory.mktemp("data") / "obs.npy"
    np.save(path, obs)
    return path, obs


@pytest.fixture(scope="session")
def pendulum_onnx(tmp_path_factory):
    """The SB3 PPO Pendulum policy with VecNormalize statistics (a Box action space) as an .onnx file:
    its graph computes constants and shapes (``vec_normalize/std``, ``action_net/mean_shape``) beside
    the per-observation tensors."""
    pytest.importorskip("torch")  # the conversion checks the result against SB3's own forward
    import onnx

    import policyport as pp

    path = tmp_path_factory.mktemp("pendulum") / "pendulum.onnx"
    onnx.save(pp.convert(Path(__file__).resolve().parents[2] / "fixtures" / "sb3" / "ppo_pendulum_vecnorm.zip"), path)
    return path


@pytest.fixture(scope="session")
def pendulum_constants() -> dict[str, tuple[int, ...]]:
    """The tensors of :func:`pendulum_onnx` without a row per observation, and their shapes."""
    return {"vec_normalize/var_eps": (3,), "vec_normalize/std": (3,), "action_net/mean_shape": (2,)}
