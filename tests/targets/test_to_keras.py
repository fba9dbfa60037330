"""to-keras: a policy as a Keras 3 functional model that Keras loads in safe mode and whose outputs match
the source's own forward; every trained weight a trainable Keras weight, normaliser statistics
non-trainable, layer names from the source."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app

keras = pytest.importorskip("keras")

ROOT = Path(__file__).parents[2]
EXPERT = ROOT / "fixtures/real/metadrive_ppo_expert.npz"
SB3 = ROOT / "fixtures/sb3"


def load(path: Path):
    return keras.saving.load_model(path, safe_mode=True, compile=False)


def predict(model, obs: np.ndarray) -> dict[str, np.ndarray]:
    """Keras' own forward of the loaded model (``predict``), output name -> array."""
    return {k: np.asarray(v) for k, v in model.predict(obs, verbose=0, batch_size=len(obs)).items()}


def one_step_leaves(model, obs, every_layer: bool = False) -> tuple[list[str], list[str]]:
    """Take one SGD step on the sum of squares of every floating output (with ``every_layer``, also of every
    Dense and Embedding layer's output: a policy whose outputs are argmax indices) (TensorFlow's GradientTape);
    the trainable weights it left unchanged and the non-trainable weights it changed."""
    import tensorflow as tf

    before = {w.path: np.array(w.numpy()) for w in model.weights}
    optimiser = keras.optimizers.SGD(learning_rate=0.1)
    watched = model
    if every_layer:
        inner = {layer.name: layer.output for layer in model.layers
                 if isinstance(layer, (keras.layers.Dense, keras.layers.Embedding))}
        watched = keras.Model(model.inputs if len(model.inputs) > 1 else model.inputs[0], {**model.output, **inner})
    with tf.GradientTape() as tape:
        outputs = watched(obs, training=False)
        loss = tf.add_n([tf.reduce_sum(tf.cast(v, tf.float64) ** 2) for v in outputs.values() if v.dtype.is_floating])
    grads = tape.gradient(loss, model.trainable_weights)
    optimiser.apply_gradients(zip(grads, model.trainable_weights))
    frozen = [w.path for w in model.trainable_weights if np.array_equal(before[w.path], w.numpy())]
    moved = [w.path for w in model.non_trainable_weights if not np.array_equal(before[w.path], w.numpy())]
    return frozen, moved


@pytest.fixture(scope="module")
def expert(tmp_path_factory):
    path = tmp_path_factory.mktemp("to_keras") / "metadrive.keras"
    done = pp.to_keras(str(EXPERT), path, activation="tanh", head="diag-gaussian")
    return done, path


@pytest.mark.slow
def test_metadrive_matches_the_npz_forward_written_by_hand(expert):
    done, path = expert
    w = np.load(EXPERT)
    obs = np.random.default_rng(3).uniform(0, 1, (200, 275)).astype(np.float32)
    h = np.tanh(obs.astype(np.float64) @ w["default_policy/fc_1/kernel"] + w["default_policy/fc_1/bias"])
    h = np.tanh(h @ w["default_policy/fc_2/kernel"] + w["default_policy/fc_2/bias"])
    logits = h @ w["default_policy/fc_out/kernel"] + w["default_policy/fc_out/bias"]
    got = predict(load(path), obs)
    assert sorted(got) == ["action", "log_std", "logits"]
    np.testing.assert_allclose(got["logits"], logits, atol=2e-5, rtol=0)
    np.testing.assert_allclose(got["action"], logits[:, :2], atol=2e-5, rtol=0)
    np.testing.assert_allclose(got["log_std"], logits[:, 2:], atol=2e-5, rtol=0)
    assert done.tensors == 7 and done.max_abs < 1e-5


@pytest.mark.slow
def test_metadrive_layers_are_named_after_the_source_and_hold_its_kernels(expert):
    done, path = expert
    model = load(path)
    dense = [layer.name for layer in model.layers if isinstance(layer, keras.layers.Dense)]
    assert dense == ["default_policy_fc_1", "default_policy_fc_2", "default_policy_fc_out"]
    assert [a.name for a in model.layers if isinstance(a, keras.layers.Activation)] == ["fc_1_tanh", "fc_2_tanh"]
    names = json.loads(path.with_name("metadrive_parameters.json").read_text())
    w = np.load(EXPERT)
    weights = {v.path: v.numpy() for v in model.weights}
    assert set(weights) == set(names)
    for key, value in weights.items():  # an RLlib TF kernel is [in, out] already: stored as it is
        assert names[key]["layout"] == "as stored"
        assert value.tobytes() == w[names[key]["source"]].tobytes(), key
    assert sorted(e["source"] for e in names.values()) == sorted(w.files)


@pytest.mark.slow
def test_metadrive_every_weight_trains(expert):
    _, path = expert
    model = load(path)
    assert len(model.trainable_weights) == 6 and model.non_trainable_weights == []
    assert sum(int(np.prod(v.shape)) for v in model.trainable_weights) == sum(a.size for a in np.load(EXPERT).values())
    frozen, moved = one_step_leaves(model, np.full((4, 275), 0.5, np.float32))
    assert frozen == [] and moved == []


@pytest.mark.slow
def test_sb3_ppo_with_vecnormalize_matches_sb3(tmp_path):
    from stable_baselines3 import PPO

    done = pp.to_keras(str(SB3 / "ppo_pendulum_vecnorm.zip"), tmp_path / "ppo.keras")
    model = load(tmp_path / "ppo.keras")
    sb3 = PPO.load(SB3 / "ppo_pendulum_vecnorm.zip", device="cpu")
    with open(SB3 / "ppo_pendulum_vecnorm/vecnormalize.pkl", "rb") as f:  # a fixture this project wrote
        norm = pickle.load(f)
    obs = np.random.default_rng(0).uniform(-2, 2, (500, 3)).astype(np.float32)
    want, _ = sb3.predict(norm.normalize_obs(obs), deterministic=True)
    got = predict(model, obs)
    np.testing.assert_allclose(got["action"], want, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(got["log_std"][0], sb3.policy.log_std.detach().numpy())
    kernel = model.get_layer("mlp_extractor_policy_net_0").kernel.numpy()
    np.testing.assert_array_equal(kernel, sb3.policy.mlp_extractor.policy_net[0].weight.detach().numpy().T)
    norm_layer = model.get_layer("vec_normalize")
    assert isinstance(norm_layer, keras.layers.Normalization) and not norm_layer.trainable_weights
    np.testing.assert_array_equal(norm_layer.adapt_mean.numpy(), norm.obs_rms.mean)
    assert {w.path for w in model.non_trainable_weights} == {"vec_normalize/mean", "vec_normalize/variance",
                                                             "vec_normalize/count"}
    assert done.non_trainable == ["vec_normalize/mean", "vec_normalize/variance", "vec_normalize/count"]
    assert done.max_abs < 1e-5
    frozen, moved = one_step_leaves(model, obs[:8])
    assert frozen == [] and moved == []
    assert "log_std/embeddings" in {w.path for w in model.trainable_weights}


@pytest.mark.slow
def test_keras_round_trip_keeps_names_and_kernels_bit_for_bit(tmp_path):
    source_path = ROOT / "fixtures/keras/mlp_norm.keras"
    pp.to_keras(str(source_path), tmp_path / "again.keras")
    source, again = load(source_path), load(tmp_path / "again.keras")
    obs = np.random.default_rng(2).uniform(0, 1, (300, 6)).astype(np.float32)
    want = np.asarray(source.predict(obs, verbose=0))
    np.testing.assert_allclose(predict(again, obs)["fc_out"], want, atol=1e-5, rtol=0)
    for name in ("fc_1", "bn", "fc_2", "ln", "fc_out"):
        mine, theirs = again.get_layer(name), source.get_layer(name)
        assert type(mine) is type(theirs)
        assert [w.name for w in mine.weights] == [w.name for w in theirs.weights], name
        for a, b in zip(mine.weights, theirs.weights):
            assert a.numpy().tobytes() == b.numpy().tobytes(), a.path
    frozen, moved = one_step_leaves(again, obs[:8])
    assert frozen == [] and moved == []


@pytest.mark.slow
def test_rllib_checkpoint_with_its_filter_matches_rays_outputs(tmp_path):
    ray_folder = ROOT / "fixtures/rllib/ray"
    done = pp.to_keras(str(ray_folder / "ppo_new"), tmp_path / "rllib.keras", low=-1, high=1)
    model = load(tmp_path / "rllib.keras")
    expected = dict(np.load(ray_folder / "ppo_new_expected.npz"))  # Ray's own forward of the checkpoint
    got = predict(model, expected["obs"].astype(np.float32))
    np.testing.assert_allclose(got["logits"], expected["action_dist_inputs"], atol=1e-5, rtol=0)
    np.testing.assert_array_equal(got["action"], expected["action_dist_inputs"].argmax(axis=1))
    assert got["action"].dtype == np.int64
    assert done.non_trainable == ["obs_filter_destd/mean", "obs_filter_destd/variance", "obs_filter_destd/count"]
    assert done.non_trainable == [w.path for w in model.non_trainable_weights]
    frozen, moved = one_step_leaves(model, expected["obs"][:8].astype(np.float32))
    assert frozen == [] and moved == []


def test_an_op_without_a_layer_is_refused_naming_it(tmp_path):
    from test_to_torch import all_sampled_export

    result = CliRunner().invoke(app, ["to-keras", str(all_sampled_export(tmp_path)), "-o", str(tmp_path / "out.keras"),
                                      "--json"])
    assert result.exit_code == 3
    error = json.loads(result.stdout)["error"]
    assert error.startswith("every output of the graph is sampled (Multinomial node '/Multinomial', RandomNormalLike "
                            "node '/RandomNormalLike')")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sampled.onnx"]


@pytest.mark.slow
def test_cli_writes_once_and_refuses_what_it_cannot_write(tmp_path):
    out = tmp_path / "p.keras"
    onnx_path = tmp_path / "m.onnx"
    onnx_path.write_bytes(pp.convert(str(EXPERT), activation="tanh", head="diag-gaussian").SerializeToString())
    first = CliRunner().invoke(app, ["to-keras", str(onnx_path), "-o", str(out), "--json"])
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout)
    assert report["trainable"][:2] == ["default_policy_fc_1/kernel", "default_policy_fc_1/bias"]
    assert report["tensors"] == 7 and [entry["keras"] for entry in report["layers"]] == [
        "default_policy_fc_1", "default_policy_fc_2", "default_policy_fc_out"]
    written = out.read_bytes()
    again = CliRunner().invoke(app, ["to-keras", str(onnx_path), "-o", str(out)])
    assert again.exit_code == 3 and "exists" in again.output and out.read_bytes() == written
    suffix = CliRunner().invoke(app, ["to-keras", str(onnx_path), "-o", str(tmp_path / "p.h5")])
    assert suffix.exit_code == 2 and "must end in .keras" in suffix.output
    head = CliRunner().invoke(app, ["to-keras", str(onnx_path), "-o", str(tmp_path / "o2.keras"), "--head", "none"])
    assert head.exit_code == 2 and "head (--head) applies to a source converted here" in head.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "p.keras", "p_parameters.json"]


@pytest.mark.slow
def test_a_foreign_graph_keeps_every_parameter_trainable_and_its_names(tmp_path):
    """tf2onnx's MatMul + Add with the bias through Identity (as ML-Agents exports), then a torch-layout
    Gemm (transB=1) whose [out, in] weight becomes a [in, out] kernel."""
    from test_to_torch import _foreign_graph

    path, (w1, b1, w2, b2) = _foreign_graph(tmp_path)
    pp.to_keras(str(path), tmp_path / "out.keras")
    model = load(tmp_path / "out.keras")
    assert [w.path for w in model.trainable_weights] == ["dense/kernel", "dense/bias", "out/kernel", "out/bias"]
    assert model.get_layer("out").kernel.numpy().tobytes() == np.ascontiguousarray(w2.T).tobytes()
    names = json.loads((tmp_path / "out_parameters.json").read_text())
    assert names["out/kernel"] == {"source": "out.weight", "initializer": "out.weight", "role": "weight",
                                   "layout": "transposed"}
    assert names["dense/bias"]["source"] == "dense/bias:0"
    obs = np.random.default_rng(0).uniform(-1, 1, (50, 3)).astype(np.float32)
    np.testing.assert_allclose(predict(model, obs)["logits"], np.maximum(obs @ w1 + b1, 0) @ w2.T + b2, atol=1e-5,
                               rtol=0)
    frozen, moved = one_step_leaves(model, obs[:4])
    assert frozen == [] and moved == []


@pytest.mark.slow
def test_shape_steps_and_constants_are_keras_ops(tmp_path):
    """Unsqueeze, Squeeze, Flatten and a Constant node between two layers, as exporters write them."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    w1, b1 = rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=4).astype(np.float32)
    w2 = rng.normal(size=(4, 2)).astype(np.float32)
    shift = rng.normal(size=4).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["obs", "fc.weight", "fc.bias"], ["h"], name="fc", transB=1),
        helper.make_node("Constant", [], ["shift"], name="shift", value=numpy_helper.from_array(shift)),
        helper.make_node("Sub", ["h", "shift"], ["centred"], name="centre"),
        helper.make_node("Unsqueeze", ["centred", "axes"], ["u"], name="unsqueeze"),
        helper.make_node("Squeeze", ["u", "axes"], ["s"], name="squeeze"),
        helper.make_node("Unsqueeze", ["s", "axes"], ["u2"], name="unsqueeze_again"),
        helper.make_node("Flatten", ["u2"], ["flat"], name="flatten", axis=1),
        helper.make_node("MatMul", ["flat", "head/kernel"], ["logits"], name="head"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
                              [numpy_helper.from_array(w1, "fc.weight"), numpy_helper.from_array(b1, "fc.bias"),
                               numpy_helper.from_array(np.array([1], np.int64), "axes"),
                               numpy_helper.from_array(w2, "head/kernel")])
    path = tmp_path / "shapes.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    done = pp.to_keras(str(path), tmp_path / "shapes.keras")
    model = load(tmp_path / "shapes.keras")
    obs = rng.uniform(-1, 1, (40, 3)).astype(np.float32)
    np.testing.assert_allclose(predict(model, obs)["logits"], (obs @ w1.T + b1 - shift) @ w2, atol=1e-5, rtol=0)
    assert done.trainable == ["fc/kernel", "fc/bias", "head/kernel"] and done.non_trainable == []


@pytest.mark.slow
@pytest.mark.parametrize("name, output", [("obs_norm", "act_denorm"), ("obs_norm_given", "act_scale")])
def test_keras_normalization_layers_come_back_as_the_source_s_with_its_trainable_split(name, output, tmp_path):
    """An adapted Normalization (mean, variance, count: non-trainable weights), a given one and an
    invert=True one that turns the head's output into actions (mean= and variance= arguments, no weights):
    written again as those layers under their names, so the written model trains what the source trains."""
    source_path = ROOT / f"fixtures/keras/{name}.keras"
    done = pp.to_keras(str(source_path), tmp_path / "again.keras")
    source, again = load(source_path), load(tmp_path / "again.keras")
    obs = np.random.default_rng(5).uniform(-4, 4, (300, 6)).astype(np.float32)
    obs[:, 2] = np.where(np.arange(300) % 2, 1.5, obs[:, 2])  # obs_norm's constant feature (variance 0), and others
    np.testing.assert_allclose(predict(again, obs)[output], np.asarray(source.predict(obs, verbose=0)), atol=1e-6,
                               rtol=1e-6)
    assert done.trainable == [w.path for w in again.trainable_weights] == [w.path for w in source.trainable_weights]
    assert done.non_trainable == [w.path for w in again.non_trainable_weights] == \
        [w.path for w in source.non_trainable_weights]
    for a, b in zip(again.weights, source.weights):
        assert a.numpy().tobytes() == b.numpy().tobytes(), a.path
    for layer in source.layers:
        if isinstance(layer, keras.layers.Normalization):
            mine = again.get_layer(layer.name)
            assert type(mine) is keras.layers.Normalization and mine.invert == layer.invert
            assert (mine.input_mean is None) == (layer.input_mean is None), layer.name  # adapted, or given
            if layer.input_mean is not None:
                np.testing.assert_array_equal(np.asarray(mine.input_mean, np.float32),
                                              np.asarray(layer.input_mean, np.float32))
                np.testing.assert_array_equal(np.asarray(mine.input_variance, np.float32),
                                              np.asarray(layer.input_variance, np.float32))
    frozen, moved = one_step_leaves(again, obs[:8])
    assert frozen == [] and moved == []


@pytest.mark.slow
def test_to_torch_trains_what_keras_trains_in_a_keras_source(tmp_path):
    """The same classing reaches to-torch: the de-normaliser's statistics are buffers, not parameters."""
    pytest.importorskip("torch")
    source_path = ROOT / "fixtures/keras/obs_norm.keras"
    done = pp.to_torch(str(source_path), tmp_path / "policy")
    names = json.loads((tmp_path / "policy/parameters.json").read_text())
    source = load(source_path)
    assert [names[k]["source"] for k in done.parameters] == [w.path for w in source.trainable_weights]
    assert {"act_denorm/mean", "act_denorm/variance", "obs_norm/mean", "obs_norm/variance"} <= \
        {names[k]["source"] for k in done.buffers}


@pytest.mark.slow
def test_a_trained_tensor_no_row_of_which_broadcasts_is_refused_naming_it(tmp_path):
    """A trained (2, 3) tensor added to every observation's (1, 3) rows: no per-observation row holds it."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(8)
    nodes = [helper.make_node("Gemm", ["obs", "fc.weight", "fc.bias"], ["h"], name="fc", transB=1),
             helper.make_node("Unsqueeze", ["h", "axes"], ["rows"], name="rows"),
             helper.make_node("Add", ["rows", "offsets"], ["logits"], name="offset")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2, 3])],
                              [numpy_helper.from_array(rng.normal(size=(3, 3)).astype(np.float32), "fc.weight"),
                               numpy_helper.from_array(rng.normal(size=3).astype(np.float32), "fc.bias"),
                               numpy_helper.from_array(np.array([1], np.int64), "axes"),
                               numpy_helper.from_array(rng.normal(size=(2, 3)).astype(np.float32), "offsets")])
    path = tmp_path / "offsets.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    result = CliRunner().invoke(app, ["to-keras", str(path), "-o", str(tmp_path / "out.keras"), "--json"])
    assert result.exit_code == 3
    assert json.loads(result.stdout)["error"] == (
        "trained tensor 'offsets' of shape (2, 3) is read by an op; to-keras writes such a tensor as one row per "
        "observation, which needs a first axis of 1 (or one axis)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["offsets.onnx"]


@pytest.mark.slow
def test_an_ml_agents_export_on_the_command_line_says_what_it_leaves_out(tmp_path):
    result = CliRunner().invoke(app, ["to-keras", str(ROOT / "fixtures/ml_agents/exports/Hybrid.onnx"), "-o",
                                      str(tmp_path / "hybrid.keras"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    reference = np.load(ROOT / "fixtures/ml_agents/exports/Hybrid.reference.npz")  # ML-Agents' own values
    assert report["constants"] == {k: reference[f"torch32/{k}"].tolist() for k in (
        "version_number", "memory_size", "continuous_action_output_shape", "discrete_action_output_shape")}
    assert report["notes"][0].startswith("left out the sampled outputs continuous_actions, discrete_actions")
    assert report["trainable"][-1] == "action_model__continuous_distribution_log_sigma/embeddings"
    assert report["non_trainable"] == [f"network_body_observation_encoder_processors_0_normalizer/{k}"
                                       for k in ("mean", "variance", "count")]
    model = load(tmp_path / "hybrid.keras")
    assert sorted(model.output) == ["/_continuous_distribution/Exp_output_0", "deterministic_continuous_actions",
                                    "deterministic_discrete_actions"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["obs_norm", "mlp_norm", "obs_norm_given"])
def test_the_converter_records_what_keras_trains(name):
    from policyport.graph.passes import TRAINABLE_KEY

    source_path = ROOT / f"fixtures/keras/{name}.keras"
    recorded = {p.key: p.value for p in pp.convert(str(source_path)).metadata_props}[TRAINABLE_KEY]
    assert json.loads(recorded) == [w.path for w in load(source_path).trainable_weights]


@pytest.mark.slow
def test_a_frozen_keras_layer_stays_frozen(tmp_path):
    """A Dense layer the source froze (layer.trainable = False) is frozen in the written model too."""
    keras.utils.set_random_seed(3)
    obs = keras.Input((4,), name="obs")
    frozen = keras.layers.Dense(8, activation="tanh", name="encoder", bias_initializer="random_normal")
    source = keras.Model(obs, keras.layers.Dense(2, name="head")(frozen(obs)), name="frozen")
    frozen.trainable = False
    source.save(tmp_path / "frozen.keras")
    done = pp.to_keras(str(tmp_path / "frozen.keras"), tmp_path / "again.keras")
    again, source = load(tmp_path / "again.keras"), load(tmp_path / "frozen.keras")
    assert done.trainable == [w.path for w in again.trainable_weights] == [w.path for w in source.trainable_weights] \
        == ["head/kernel", "head/bias"]
    assert done.non_trainable == [w.path for w in source.non_trainable_weights] == ["encoder/kernel", "encoder/bias"]
    x = np.random.default_rng(3).uniform(-1, 1, (50, 4)).astype(np.float32)
    np.testing.assert_allclose(predict(again, x)["head"], np.asarray(source.predict(x, verbose=0)), atol=1e-6, rtol=0)
    frozen_after, moved = one_step_leaves(again, x[:8])
    assert frozen_after == [] and moved == []


ISAAC_LAB_SOURCES = {  # Isaac Lab's libraries: a Gaussian std (rsl_rl) or log std (skrl) clamped by a Clip, then expanded
    "rsl_rl": (ROOT / "fixtures/rsl_rl", "gaussian/model_0.pt", "gaussian/expected.npz",
               [("action", "action"), ("std", "std")], "distribution.std_param"),
    "rsl_rl_log": (ROOT / "fixtures/rsl_rl", "gaussian_log_tanh/model_0.pt", "gaussian_log_tanh/expected.npz",
                   [("std", "std")], "distribution.log_std_param"),
    "skrl": (ROOT / "fixtures/skrl", "isaaclab_elu/checkpoints/agent_1000.pt", "isaaclab_elu/expected.npz",
             [("action", "action"), ("log_std", "log_std")], "policy.log_std_parameter"),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(ISAAC_LAB_SOURCES))
def test_isaac_lab_libraries_clamped_std_trains_and_matches_the_library(kind, tmp_path):
    folder, source, expected, outputs, std_name = ISAAC_LAB_SOURCES[kind]
    done = pp.to_keras(str(folder / source), tmp_path / "policy.keras")
    model = load(tmp_path / "policy.keras")
    obs = np.load(folder / "observations.npy").astype(np.float32)
    want = np.load(folder / expected)  # the library's own forward (make_fixtures.py in the folder)
    got = predict(model, obs)
    for ours, theirs in outputs:
        np.testing.assert_allclose(got[ours], want[theirs], atol=2e-5, rtol=1e-5)
    held = {layer.name: layer for layer in model.layers if isinstance(layer, keras.layers.Embedding)}
    assert [json.loads((tmp_path / "policy_parameters.json").read_text())[f"{name}/embeddings"]["source"]
            for name in held] == [std_name]  # the clamped parameter is a weight of its own, under its name
    frozen, moved = one_step_leaves(model, obs[:8])
    assert frozen == [] and moved == []  # the std parameter trains with the Dense layers
    assert f"{next(iter(held))}/embeddings" in done.trainable
    if kind == "skrl":  # clip((x - running_mean) / (sqrt(running_variance) + eps)): a Normalization layer
        import torch

        theirs = torch.load(folder / source, map_location="cpu", weights_only=True)["observation_preprocessor"]
        norm = model.get_layer("observation_preprocessor_scaled")
        assert done.non_trainable == [f"observation_preprocessor_scaled/{k}" for k in ("mean", "variance", "count")]
        np.testing.assert_array_equal(norm.mean.numpy().reshape(-1),
                                      theirs["running_mean"].numpy().astype(np.float32).reshape(-1))
        np.testing.assert_allclose(np.sqrt(norm.variance.numpy().reshape(-1)),
                                   np.sqrt(theirs["running_variance"].numpy().reshape(-1)) + 1e-8, rtol=1e-6)
    if kind.startswith("rsl_rl"):  # (x - _mean) / (_std + eps): a Normalization layer of rsl_rl's statistics
        import torch

        theirs = torch.load(folder / source, map_location="cpu", weights_only=True)["actor_state_dict"]
        norm = model.get_layer("obs_normalizer")
        assert done.non_trainable == ["obs_normalizer/mean", "obs_normalizer/variance", "obs_normalizer/count"]
        np.testing.assert_array_equal(norm.mean.numpy().reshape(-1), theirs["obs_normalizer._mean"].numpy().reshape(-1))
        np.testing.assert_allclose(np.sqrt(norm.variance.numpy().reshape(-1)),
                                   theirs["obs_normalizer._std"].numpy().reshape(-1) + 1e-2, rtol=1e-6)
