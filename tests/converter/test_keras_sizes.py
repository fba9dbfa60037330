"""The weights a Keras config declares, estimated from the config alone, and refused above the array
limit before Keras builds anything."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

import policyport as pp
from policyport.converter.keras_sizes import _walk, check_keras_config

ROOT = Path(__file__).parents[2]


def _layer(kind, name, config, width=None):
    layer = {"class_name": kind, "config": {"name": name, **config}}
    if width is not None:
        layer["build_config"] = {"input_shape": [None, width]}
    return layer


def _archive(path, layers):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("config.json", json.dumps({"class_name": "Functional", "config": {"name": "m", "layers": layers}}))
    return path


@pytest.mark.parametrize("layer, elements", [
    (_layer("Dense", "fc", {"units": 3}, 5), 5 * 3 + 3),
    (_layer("Conv2D", "conv", {"filters": 8, "kernel_size": [3, 3]}, 4), 3 * 3 * 4 * 8 + 8),
    (_layer("Embedding", "emb", {"input_dim": 100, "output_dim": 7}), 700),
    (_layer("LSTM", "lstm", {"units": 10}, 6), 4 * 10 * (6 + 10 + 1)),
    (_layer("GRU", "gru", {"units": 10}, 6), 3 * 10 * (6 + 10 + 2)),
    (_layer("BatchNormalization", "bn", {}, 12), 48),
    (_layer("Bidirectional", "bi", {"layer": _layer("LSTM", "inner", {"units": 2})}, 3), 2 * 4 * 2 * (3 + 2 + 1)),
    (_layer("Activation", "act", {"activation": "tanh"}, 9), 0),
])
def test_each_layer_kind_declares_its_weights_on_its_input_width(layer, elements):
    found = []
    _walk({"layers": [layer]}, None, found)
    assert [(name, count) for name, _, count, _ in found] == [(layer["config"]["name"], elements)]


def test_widths_are_followed_from_the_input_through_nested_models():
    inner = {"class_name": "Sequential", "config": {"name": "inner", "layers": [_layer("Dense", "b", {"units": 7})]}}
    found = []
    _walk({"layers": [_layer("InputLayer", "obs", {"batch_shape": [None, 11]}), _layer("Dense", "a", {"units": 5}),
                      inner, _layer("Dense", "c", {"units": 2})]}, None, found)
    assert [(name, count) for name, _, count, _ in found] == [("obs", 0), ("a", 11 * 5 + 5), ("b", 5 * 7 + 7),
                                                               ("c", 7 * 2 + 2)]


@pytest.mark.parametrize("layer, largest", [
    (_layer("Conv2D", "conv", {"filters": 1_000_000, "kernel_size": [3, 3]}, 64), "577,000,000 in the Conv2D layer 'conv'"),
    (_layer("Embedding", "emb", {"input_dim": 10**6, "output_dim": 1000, "dtype": "float64"}), "1,000,000,000 in the Embedding"),
    (_layer("LSTM", "lstm", {"units": 20_000}, 100), "1,608,080,000 in the LSTM layer 'lstm'"),
])
def test_weights_above_the_array_limit_are_refused_naming_the_largest_layer(tmp_path, layer, largest):
    with pytest.raises(pp.LimitExceededError) as caught:
        check_keras_config(_archive(tmp_path / "m.keras", [_layer("Dense", "small", {"units": 2}, 2), layer]))
    assert f"the weights its config declares ({largest}" in str(caught.value)
    assert "above the limit of 1 GiB for the weights of a model, sized from its config" in str(caught.value)


def test_the_estimate_of_a_real_keras_file_covers_its_weights_and_stays_near_them():
    h5py = pytest.importorskip("h5py")
    path = ROOT / "fixtures/keras/mlp_norm.keras"
    with zipfile.ZipFile(path) as zf:
        config = json.loads(zf.read("config.json"))
        weights = h5py.File(io.BytesIO(zf.read("model.weights.h5")), "r")
        held = []
        weights.visititems(lambda name, item: held.append(item.size) if isinstance(item, h5py.Dataset) else None)
    found = []
    _walk(config["config"], None, found)
    declared = sum(count for _, _, count, _ in found)
    assert sum(held) <= declared <= 2 * sum(held)
    check_keras_config(path)  # within every limit
