"""Fixtures of the analysis tests: the MetaDrive expert as an .onnx file and a dataset of observations."""

from __future__ import annotations

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
