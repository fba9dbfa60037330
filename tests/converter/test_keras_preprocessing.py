"""Keras preprocessing layers: a Normalization layer's statistics are initializers under the layer's
names, the graph takes the observations alone, and every output equals Keras' own.

Keras 3 (``keras/src/layers/preprocessing/normalization.py``) keeps an adapted layer's ``mean`` and
``variance`` as non-trainable variables and computes broadcast copies of them outside any call, which
TensorFlow passes to a traced function as captured inputs and tf2onnx made graph inputs. The layer
divides by ``maximum(sqrt(variance), keras.config.epsilon())``, so a zero-variance feature is scaled
by 1 / 1e-07. Every comparison here is with Keras itself (``model.predict``, the layer called on the
observations, ``layer.get_weights()``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter import convert_source

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "keras"
FILES = ("obs_norm.keras", "obs_norm_given.keras")


@pytest.fixture(scope="module")
def models():
    """The fixtures as Keras loads them (TensorFlow imported quietly)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from keras.saving import load_model

    return {name: load_model(FIXTURES / name, compile=False) for name in FILES}


@pytest.fixture(scope="module")
def converted(models):
    return {name: convert_source(FIXTURES / name) for name in FILES}


@pytest.fixture(scope="module")
def obs():
    """Observations around the fixtures' statistics, every feature off its mean (the zero-variance
    ones included)."""
    return np.random.default_rng(11).normal(0, 3, size=(256, 6)).astype(np.float32)


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_the_fixtures_hold_a_zero_variance_feature(models):
    adapted = models["obs_norm.keras"].get_layer("obs_norm")
    assert adapted.get_weights()[1][2] == 0.0 and (np.delete(adapted.get_weights()[1], 2) > 0).all()
    given = models["obs_norm_given.keras"].get_layer("obs_norm")
    assert np.asarray(given.variance)[0, 4] == 0.0


@pytest.mark.parametrize(("name", "output"), [("obs_norm.keras", "act_denorm"), ("obs_norm_given.keras", "act_scale")])
def test_the_graph_takes_the_observations_alone(name, output, converted):
    model = converted[name].model
    assert [i.name for i in model.graph.input] == ["obs"]
    assert [o.name for o in model.graph.output] == [output]


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_run_equals_keras_predict(name, backend, converted, models, obs):
    model = models[name]
    expected = model.predict(obs, verbose=0)
    out = pp.load(converted[name].model, backend=backend).run({"obs": obs})
    (actions,) = out.values()
    assert actions.shape == expected.shape
    np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_the_normalized_observations_are_keras_bit_for_bit(name, backend, converted, models, obs):
    layer = models[name].get_layer("obs_norm")
    expected = np.asarray(layer(obs))
    zero = 2 if name == "obs_norm.keras" else 4
    assert np.abs(expected[:, zero]).max() > 1e5  # (x - mean) / 1e-07: Keras' epsilon floors the zero std
    recorded = pp.load(converted[name].model, backend=backend).record({"obs": obs}, tensors="obs_norm")
    assert _same_bits(recorded["obs_norm"], expected)


def test_the_epsilon_is_keras_own(converted):
    import keras
    from onnx import numpy_helper

    for name in FILES:
        inits = {t.name: numpy_helper.to_array(t) for t in converted[name].model.graph.initializer}
        assert _same_bits(inits["obs_norm/epsilon"], np.float32(keras.config.epsilon()))
        assumption = next(a for a in converted[name].assumptions if a.topic == "epsilon")
        layers = "obs_norm and act_denorm" if name == "obs_norm.keras" else "obs_norm"
        assert assumption.assumes == f"1e-07 in {layers}"


def test_extract_gives_every_keras_variable_back_bit_for_bit(converted, models):
    model = models["obs_norm.keras"]
    weights = pp.extract_weights(converted["obs_norm.keras"].model)
    expected = {f"{layer.name}/{w.name}": w.numpy() for layer in model.layers for w in layer.weights}
    # Keras' order (obs_norm/mean, variance, count, fc_1/kernel ...), then the constants act_denorm holds
    assert list(weights) == [*expected, "act_denorm/mean", "act_denorm/variance"]
    assert [k for k in expected if k.startswith("obs_norm/")] == ["obs_norm/mean", "obs_norm/variance", "obs_norm/count"]
    for name, value in expected.items():
        assert _same_bits(weights[name], value), name
    layer = model.get_layer("obs_norm")
    for name, value in zip(("mean", "variance", "count"), layer.get_weights()):
        assert _same_bits(weights[f"obs_norm/{name}"], value)


def test_extract_gives_a_given_mean_and_variance_back_as_the_layer_holds_them(converted, models):
    model = models["obs_norm_given.keras"]
    layer = model.get_layer("obs_norm")
    assert layer.get_weights() == []  # given statistics are constants of the layer, not variables
    weights = pp.extract_weights(converted["obs_norm_given.keras"].model)
    assert _same_bits(weights["obs_norm/mean"], np.asarray(layer.mean))
    assert _same_bits(weights["obs_norm/variance"], np.asarray(layer.variance))
    config = layer.get_config()
    np.testing.assert_array_equal(weights["obs_norm/variance"][0], np.float32(config["variance"]))
    denorm = models["obs_norm.keras"].get_layer("act_denorm")
    held = pp.extract_weights(converted["obs_norm.keras"].model)
    assert _same_bits(held["act_denorm/mean"], np.asarray(denorm.mean))
    assert _same_bits(held["act_denorm/variance"], np.asarray(denorm.variance))


def test_a_live_model_converts_as_its_file(models, obs):
    model = models["obs_norm.keras"]
    c = pp.convert(model)
    assert [i.name for i in c.graph.input] == ["obs"]
    out = pp.load(c).run({"obs": obs})
    np.testing.assert_allclose(out["act_denorm"], model.predict(obs, verbose=0), rtol=1e-5, atol=1e-5)
    weights = pp.extract_weights(c)
    for w in model.get_layer("obs_norm").weights:
        assert _same_bits(weights[f"obs_norm/{w.name}"], w.numpy())


def test_a_normalization_over_a_middle_axis_reshapes_its_statistics(models, obs):
    import keras
    from keras import layers

    x = keras.Input((3, 2), name="obs")
    norm = layers.Normalization(axis=1, name="obs_norm")
    rng = np.random.default_rng(3)
    norm.adapt(rng.normal(rng.uniform(-2, 2, (1, 3, 1)), 2, size=(200, 3, 2)).astype(np.float32))
    model = keras.Model(x, layers.Dense(2, name="fc_out", bias_initializer="ones")(layers.Flatten(name="flat")(norm(x))))
    c = convert_source(model)
    assert [i.name for i in c.model.graph.input] == ["obs"]
    reshapes = [n for n in c.model.graph.node if n.op_type == "Reshape" and n.name.startswith("obs_norm/")]
    assert sorted(n.name for n in reshapes) == ["obs_norm/mean_reshaped", "obs_norm/variance_reshaped"]
    batch = obs.reshape(-1, 3, 2)
    got = pp.load(c.model).record({"obs": batch}, tensors="obs_norm")["obs_norm"]
    assert _same_bits(got, np.asarray(norm(batch)))
    weights = pp.extract_weights(c.model)
    assert _same_bits(weights["obs_norm/mean"], norm.get_weights()[0]) and weights["obs_norm/mean"].shape == (3,)


def test_a_savedmodel_of_it_takes_the_observations_alone(models, obs, tmp_path):
    model = models["obs_norm.keras"]
    model.export(str(tmp_path / "sm"), verbose=False)
    c = convert_source(tmp_path / "sm", trust=True)
    assert [i.name for i in c.model.graph.input] == ["obs"]
    out = pp.load(c.model).run({"obs": obs})
    np.testing.assert_allclose(out["output_0"], model.predict(obs, verbose=0), rtol=1e-5, atol=1e-5)
    assert any("obs_norm/variance" in note and "folded" in note for note in c.notes)


def test_cli_convert_and_extract(tmp_path, models):
    runner = CliRunner()
    out = tmp_path / "m.onnx"
    result = runner.invoke(app, ["convert", str(FIXTURES / "obs_norm.keras"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["extract", str(out), "-o", str(tmp_path / "w.npz")])
    assert result.exit_code == 0, result.output
    with np.load(tmp_path / "w.npz") as saved:
        layer = models["obs_norm.keras"].get_layer("obs_norm")
        for name, value in zip(("mean", "variance", "count"), layer.get_weights()):
            assert _same_bits(saved[f"obs_norm/{name}"], value)


def test_one_normalization_layer_called_on_two_inputs_reads_its_statistics_once(models, obs):
    """Observation and goal normalised with the same statistics: each call's output is Keras' own."""
    import keras
    from keras import layers

    rng = np.random.default_rng(4)
    norm = layers.Normalization(name="obs_norm")
    norm.adapt(rng.normal(rng.uniform(-2, 2, 3), 2, size=(300, 3)).astype(np.float32))
    now, goal = keras.Input((3,), name="now"), keras.Input((3,), name="goal")
    joined = layers.Concatenate(name="joined")([norm(now), norm(goal)])
    model = keras.Model([now, goal], layers.Dense(2, name="fc_out", bias_initializer="ones")(joined))
    c = convert_source(model)
    assert [i.name for i in c.model.graph.input] == ["now", "goal"] and c.notes == []
    assert [n.op_type for n in c.model.graph.node].count("Sqrt") == 1
    feeds = {"now": obs[:, :3], "goal": obs[:, 3:]}
    recorded = pp.load(c.model).record(feeds, tensors="obs_norm*")
    assert _same_bits(recorded["obs_norm"], np.asarray(norm(feeds["now"])))
    assert _same_bits(recorded["obs_norm_call1"], np.asarray(norm(feeds["goal"])))
    np.testing.assert_allclose(recorded["fc_out"], model.predict([feeds["now"], feeds["goal"]], verbose=0),
                               rtol=1e-5, atol=1e-5)
    weights = pp.extract_weights(c.model)
    for name, value in zip(("mean", "variance", "count"), norm.get_weights()):
        assert _same_bits(weights[f"obs_norm/{name}"], value)
