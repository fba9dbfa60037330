"""Layers and checkpoints are ordered by their numbers, never as text (``fc_10`` after ``fc_9``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import policyport as pp
from policyport.converter import ConvertOptions, convert_source

ROOT = Path(__file__).resolve().parents[2]
LEGACY = ROOT / "fixtures" / "rllib" / "legacy" / "checkpoint_000120" / "checkpoint-120"
DEPTH = 11  # fc_1 ... fc_11: as text, fc_10 and fc_11 would come before fc_2


def _kernels(rng, count: int, width: int = 3) -> list[np.ndarray]:
    return [rng.normal(size=(width, width)).astype(np.float32) for _ in range(count)]


def _run(model, obs: np.ndarray) -> np.ndarray:
    return pp.load(model, backend="numpy").run({"obs": obs})["logits"]


def test_npz_hidden_layers_run_in_numeric_order():
    rng = np.random.default_rng(7)
    kernels, out = _kernels(rng, DEPTH), rng.normal(size=(3, 2)).astype(np.float32)
    arrays = {f"default_policy/fc_{i}/kernel": k for i, k in enumerate(kernels, 1)}
    arrays |= {f"default_policy/fc_{i}/bias": np.full(3, i / 10, np.float32) for i in range(1, DEPTH + 1)}
    arrays |= {"default_policy/fc_out/kernel": out, "default_policy/fc_out/bias": np.zeros(2, np.float32)}
    shuffled = dict(sorted(arrays.items()))  # the file's own order is text order; it must not matter
    model = convert_source(shuffled, kind="npz", activation="tanh").model
    linear = [n.output[0] for n in model.graph.node if n.output[0].endswith("/linear")]
    assert linear == [f"fc_{i}/linear" for i in range(1, DEPTH + 1)]
    obs = rng.uniform(-1, 1, (5, 3)).astype(np.float32)
    h = obs
    for i, k in enumerate(kernels, 1):
        h = np.tanh(h @ k + np.float32(i / 10))
    np.testing.assert_allclose(_run(model, obs), h @ out, rtol=1e-5, atol=1e-6)


def test_sequential_state_dict_modules_run_in_numeric_order():
    rng = np.random.default_rng(8)
    weights = _kernels(rng, 12)  # nn.Sequential of 12 Linear(3, 3): modules 0 ... 11
    state = {f"{i}.weight": w for i, w in enumerate(weights)} | {f"{i}.bias": np.zeros(3, np.float32) for i in range(12)}
    model = convert_source(dict(sorted(state.items())), kind="state-dict").model
    obs = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
    h = obs
    for w in weights:
        h = h @ w.T
    np.testing.assert_allclose(_run(model, obs), h, rtol=1e-4, atol=1e-5)


def test_rllib_torch_hidden_layers_run_in_numeric_order():
    rng = np.random.default_rng(9)
    weights = _kernels(rng, DEPTH)
    state = {f"_hidden_layers.{i}._model.0.weight": w for i, w in enumerate(weights)}
    state |= {f"_hidden_layers.{i}._model.0.bias": np.zeros(3, np.float32) for i in range(DEPTH)}
    logits = rng.normal(size=(2, 3)).astype(np.float32)
    state |= {"_logits._model.0.weight": logits, "_logits._model.0.bias": np.zeros(2, np.float32)}
    model = convert_source(dict(sorted(state.items())), kind="rllib-torch", options=ConvertOptions(activation="tanh")).model
    obs = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
    h = obs
    for w in weights:
        h = np.tanh(h @ w.T)
    np.testing.assert_allclose(_run(model, obs), h @ logits.T, rtol=1e-5, atol=1e-6)


def test_a_legacy_checkpoint_folder_is_read_from_its_latest_file(tmp_path):
    folder = tmp_path / "checkpoint_000010"
    folder.mkdir()
    shutil.copy(LEGACY, folder / "checkpoint-10")
    (folder / "checkpoint-9").write_bytes(b"an older, damaged checkpoint")
    model = pp.convert(folder)
    assert model.graph.input[0].name == "obs" and any(n.output[0] == "logits" for n in model.graph.node)


@pytest.mark.parametrize("name", ["checkpoint-9", "checkpoint-10"])
def test_a_checkpoint_file_given_by_name_is_that_file(tmp_path, name):
    path = tmp_path / name
    shutil.copy(LEGACY, path)
    assert pp.convert(path).graph.node
