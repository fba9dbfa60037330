"""Keras / TF sources: parity on every layer against Keras, Keras-named weights bit for bit, safe loading.

TensorFlow is imported once per test session; each fixture file is converted once (module scope).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter import convert_source

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "keras"
CASES = {  # fixture -> (convert options, Keras layers that must each be compared with Keras)
    "mlp_activations.keras": ({}, ["fc_1", "fc_2", "fc_3", "fc_4", "fc_5", "fc_6", "fc_7", "leaky", "fc_out"]),
    "mlp_norm.keras": ({}, ["fc_1", "bn", "fc_2", "ln", "drop", "fc_out"]),
    "mlp_norm.h5": ({}, ["fc_1", "bn", "fc_2", "ln", "drop", "fc_out"]),
    "three_heads.keras": ({}, ["trunk_1", "trunk_2", "steer", "brake", "gear"]),
    "gaussian_lambda.keras": ({"trust": True}, ["fc_1", "fc_out", "split/0", "split/1", "mean", "log_std"]),
    "mlp_norm.keras@opset13": ({"opset": 13}, ["fc_1", "bn", "fc_2", "ln", "drop", "fc_out"]),
}


def _path(case: str) -> Path:
    return FIXTURES / case.split("@")[0]


@pytest.fixture(scope="module")
def keras():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras

    return keras


@pytest.fixture(scope="module")
def converted(keras):
    return {case: convert_source(_path(case), **opts) for case, (opts, _) in CASES.items()}


@pytest.fixture(scope="module")
def keras_models(keras):
    return {name: keras.saving.load_model(FIXTURES / name, compile=False, safe_mode=False)
            for name in {c.split("@")[0] for c in CASES}}


@pytest.fixture(scope="module")
def obs():
    return np.random.default_rng(5).normal(0, 2, size=(500, 6)).astype(np.float32)


@pytest.mark.parametrize("case", list(CASES))
def test_numpy_onnxruntime_and_keras_agree_on_every_layer(case, converted, obs):
    c = converted[case]
    report = pp.verify(c.model, obs, reference=c.reference)
    assert report.passed, report.first_divergence
    against_keras = {(x.tensor, x.candidate) for x in report.comparisons if x.reference == "source"}
    for layer in CASES[case][1]:
        for backend in ("numpy", "onnxruntime"):
            assert (layer, backend) in against_keras, f"{layer} on {backend} was not compared with Keras"
    worst = max(x.max_abs for x in report.comparisons)
    assert worst <= 1e-5


@pytest.mark.parametrize("case", ["mlp_activations.keras", "mlp_norm.keras", "mlp_norm.h5", "three_heads.keras",
                                  "gaussian_lambda.keras"])
def test_extract_returns_every_keras_weight_by_layer_and_name_bit_for_bit(case, converted, keras_models):
    weights = pp.extract_weights(converted[case].model)
    expected = {f"{layer.name}/{w.name}": np.asarray(w.numpy()) for layer in keras_models[case].layers for w in layer.weights}
    assert list(weights) == list(expected)
    for name, value in expected.items():
        assert weights[name].dtype == value.dtype and weights[name].shape == value.shape, name
        assert weights[name].tobytes() == value.tobytes(), name


@pytest.mark.parametrize("case, zero", [("mlp_activations.keras", "fc_2/bias"), ("three_heads.keras", "gear/bias")])
def test_zero_biases_tf2onnx_drops_come_back_from_the_metadata(case, zero, converted, keras_models):
    model = converted[case].model
    assert zero not in {i.name for i in model.graph.initializer}  # tf2onnx dropped it ...
    layer, name = zero.split("/")
    value = next(w for w in keras_models[case].get_layer(layer).weights if w.name == name)
    assert not np.asarray(value).any()
    rebuilt = pp.extract_weights(model)[zero]  # ... and extract rebuilds it
    assert rebuilt.dtype == np.float32 and rebuilt.shape == tuple(value.shape) and not rebuilt.any()


@pytest.mark.parametrize("case, count", [("mlp_activations.keras", 524), ("three_heads.keras", 331),
                                         ("mlp_norm.keras", 531), ("mlp_norm.h5", 531)])
def test_inspect_counts_the_parameters_keras_counts_zero_biases_included(case, count, keras_models):
    """mlp_activations' fc_2 bias (8) and three_heads' gear bias (5) are zeros tf2onnx drops from the graph."""
    assert keras_models[case].count_params() == count
    runner = CliRunner()
    doc = json.loads(runner.invoke(app, ["inspect", str(FIXTURES / case), "--json"]).stdout)
    assert doc["parameter_count"] == count and sum(p["size"] for p in doc["parameters"]) == count
    assert [p["name"] for p in doc["parameters"]] == [f"{layer.name}/{w.name}" for layer in keras_models[case].layers
                                                      for w in layer.weights]
    result = runner.invoke(app, ["inspect", str(FIXTURES / case)])
    assert result.exit_code == 0 and f" nodes, {count:,} parameters" in result.stdout


def test_layer_outputs_and_initializers_carry_keras_names(converted):
    model = converted["mlp_norm.keras"].model
    produced = {o for n in model.graph.node for o in n.output}
    assert {"fc_1", "bn", "fc_2", "ln", "drop", "fc_out"} <= produced
    assert {i.name for i in model.graph.initializer} >= {"fc_1/kernel", "bn/gamma", "bn/moving_variance", "ln/beta"}
    assert all(n.name == n.output[0] for n in model.graph.node)
    drop = next(n for n in model.graph.node if n.output[0] == "drop")
    assert (drop.op_type, list(drop.input)) == ("Identity", ["ln"])  # Dropout passes its input on at inference
    assert [i.name for i in model.graph.input] == ["obs"]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_normalization_epsilons_are_the_keras_layers_exactly(converted, keras_models):
    model = converted["mlp_norm.keras"].model
    eps = {n.op_type: onnx.helper.get_attribute_value(a) for n in model.graph.node for a in n.attribute if a.name == "epsilon"}
    k = keras_models["mlp_norm.keras"]
    assert eps["BatchNormalization"] == np.float32(k.get_layer("bn").epsilon) == np.float32(1e-3)
    assert eps["LayerNormalization"] == np.float32(k.get_layer("ln").epsilon)
    spelled = converted["mlp_norm.keras@opset13"].model  # LayerNormalization is spelled out below opset 17
    const = {i.name: onnx.numpy_helper.to_array(i) for i in spelled.graph.initializer}
    assert const["ln/epsilon"] == np.float32(k.get_layer("ln").epsilon)


def test_three_heads_keep_their_names_and_order_and_match_keras_by_name(converted, keras_models, obs):
    model = converted["three_heads.keras"].model
    assert [o.name for o in model.graph.output] == ["steer", "brake", "gear"]
    expected = dict(zip(["steer", "brake", "gear"], keras_models["three_heads.keras"].predict(obs, verbose=0)))
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(model, backend=backend).run({"obs": obs})
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, atol=1e-5, rtol=1e-5, err_msg=f"{backend} {name}")


def test_a_lambda_file_is_refused_without_trust():
    with pytest.raises(pp.UntrustedFileError, match="Lambda"):
        pp.convert(FIXTURES / "gaussian_lambda.keras")
    result = CliRunner().invoke(app, ["convert", str(FIXTURES / "gaussian_lambda.keras"), "-o", "unused.onnx"])
    assert result.exit_code == 3 and "--trust" in result.output and "Traceback" not in result.output
    assert not Path("unused.onnx").exists()


def test_savedmodel_converts_with_variable_named_weights(keras_models, obs):
    c = convert_source(FIXTURES / "savedmodel", trust=True)
    report = pp.verify(c.model, obs, reference=c.reference)
    assert report.passed and any(x.reference == "source" for x in report.comparisons)
    weights = pp.extract_weights(c.model)
    for layer in keras_models["mlp_activations.keras"].layers:
        for w in layer.weights:
            assert weights[f"mlp_activations/{layer.name}/{w.name}"].tobytes() == np.asarray(w.numpy()).tobytes()


def test_live_models_and_tf_functions_convert(keras, obs):
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="relu", name="hidden"),
                              keras.layers.Dense(2, name="logits")])
    onnx_model = pp.convert(model, head="categorical")
    assert [o.name for o in onnx_model.graph.output] == ["logits", "action"]
    got = pp.load(onnx_model, backend="numpy").run({"obs": obs})
    np.testing.assert_array_equal(got["action"], np.argmax(model.predict(obs, verbose=0), axis=1))

    fn = tf.function(lambda x: {"policy": model(x) * 2.0}, input_signature=[tf.TensorSpec((None, 6), tf.float32)])
    c = convert_source(fn)
    assert [o.name for o in c.model.graph.output] == ["policy"]
    np.testing.assert_allclose(pp.load(c.model).run({"obs": obs})["policy"], 2 * model.predict(obs, verbose=0),
                               atol=1e-5, rtol=1e-5)
    with pytest.raises(pp.BadModelError, match="input_signature"):
        pp.convert(tf.function(lambda x: model(x)), kind="keras")
    plain = convert_source(tf.function(lambda x: model(x) * 2.0, input_signature=[tf.TensorSpec((None, 6), tf.float32)]))
    assert [o.name for o in plain.model.graph.output] == ["output"]  # a function's one unnamed result


def test_cli_convert_then_verify_against_the_keras_file_layer_by_layer(tmp_path):
    runner = CliRunner()
    out = tmp_path / "norm.onnx"
    result = runner.invoke(app, ["convert", str(FIXTURES / "mlp_norm.keras"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["verify", str(out), "--source", str(FIXTURES / "mlp_norm.keras"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    vs_source = {c["tensor"] for c in doc["comparisons"] if c["reference"] == "source"}
    assert {"fc_1", "bn", "fc_2", "ln", "drop", "fc_out"} <= vs_source
    result = runner.invoke(app, ["extract", str(out), "-o", str(tmp_path / "w.npz")])
    assert result.exit_code == 0 and "bn/moving_variance" in result.output


def test_an_incompatible_tf2onnx_names_both_versions(monkeypatch, keras):
    import tensorflow as tf
    import tf2onnx

    def broken(*args, **kwargs):
        raise AttributeError("'Sequential' object has no attribute 'output_names'")

    monkeypatch.setattr(tf2onnx.convert, "from_function", broken)
    with pytest.raises(pp.MissingDependencyError) as info:
        pp.convert(FIXTURES / "mlp_norm.keras")
    assert f"tensorflow {tf.__version__}" in str(info.value) and f"tf2onnx {tf2onnx.__version__}" in str(info.value)


def test_without_tensorflow_the_error_names_the_tf_extra(tmp_path):
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('tensorflow', 'tf2onnx'):\n"
        "            raise ImportError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from policyport.cli import main\n"
        "sys.argv = ['policyport', 'convert', sys.argv[1], '-o', sys.argv[2]]\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(FIXTURES / "mlp_norm.keras"), str(tmp_path / "o.onnx")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4, proc.stderr
    assert "policyport[tf]" in proc.stderr and "Traceback" not in proc.stderr


def test_subclassed_and_nested_models_name_their_inner_layers(keras, obs):
    layers = keras.layers

    class Policy(keras.Model):
        def __init__(self):
            super().__init__(name="policy")
            self.fc_1 = layers.Dense(16, activation="tanh", name="fc_1")
            self.bn = layers.BatchNormalization(name="bn", epsilon=0.01)
            self.fc_out = layers.Dense(4, name="fc_out")

        def call(self, x, training=False):
            return self.fc_out(self.bn(self.fc_1(x), training=training))

    keras.utils.set_random_seed(4)
    sub = Policy()
    sub(obs[:2])
    trunk = keras.Sequential([layers.Dense(8, activation="relu", name="a"), layers.Dense(8, activation="elu", name="b")],
                             name="trunk")
    inp = keras.Input((6,))
    nested = keras.Model(inp, layers.Dense(2, name="head")(trunk(inp)))
    for model, names in ((sub, ["fc_1", "bn", "fc_out"]), (nested, ["a", "b", "head"])):
        c = convert_source(model)
        assert [i.name for i in c.model.graph.input] == ["obs"]  # a subclassed model's: from the shape it was built with
        report = pp.verify(c.model, obs, reference=c.reference)
        assert report.passed
        assert {x.tensor for x in report.comparisons if x.reference == "source"} >= set(names)
        weights = pp.extract_weights(c.model)
        assert list(weights) == [f"{layer}/{w.name}" for layer in names for w in _leaf(model, layer).weights]
    bn = next(n for n in convert_source(sub).model.graph.node if n.op_type == "BatchNormalization")
    assert onnx.helper.get_attribute_value(bn.attribute[0]) == np.float32(0.01)


def _leaf(model, name):
    return next(layer for layer in model._flatten_layers() if layer.name == name)


def test_a_model_of_two_inputs_converts_and_verifies_against_keras_taking_each_input_by_name(tmp_path, keras):
    path, out = FIXTURES / "two_inputs.keras", tmp_path / "two.onnx"
    result = CliRunner().invoke(app, ["convert", str(path), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    check = json.loads(result.stdout)["verification"]
    assert check["passed"] and {"joined", "trunk", "head"} <= {c["tensor"] for c in check["comparisons"]
                                                               if c["reference"] == "source"}
    model = onnx.load(out)
    assert [i.name for i in model.graph.input] == ["pos", "vel"]
    result = CliRunner().invoke(app, ["verify", str(out), "--source", str(path), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["passed"], result.output

    rng = np.random.default_rng(4)
    feeds = {"pos": rng.uniform(-2, 2, (64, 3)).astype(np.float32), "vel": rng.uniform(-2, 2, (64, 2)).astype(np.float32)}
    expected = np.asarray(keras.saving.load_model(path, compile=False)([feeds["pos"], feeds["vel"]], training=False))
    source = convert_source(path).reference(feeds)
    np.testing.assert_allclose(source["head"], expected, rtol=1e-6, atol=1e-6)
    for backend in ("numpy", "onnxruntime"):
        np.testing.assert_allclose(pp.load(model, backend=backend).run(feeds)["head"], expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(pp.BadModelError, match=r"the model takes inputs pos, vel; no observations for vel"):
        convert_source(path).reference({"pos": feeds["pos"]})


def test_a_frameworks_error_is_reported_by_its_first_line_or_its_type():
    from policyport.converter.sources.keras import _first_line

    assert _first_line(ValueError("  \n first line \nsecond")) == "first line "  # the text stripped, then its first line
    assert _first_line(KeyError()) == "KeyError" and _first_line(OSError("   ")) == "OSError"


def test_an_incompatible_pair_of_frameworks_names_tf2onnx_and_the_extra_that_installs_the_pair():
    from policyport.converter.sources.keras import EXTRA, IncompatibleFrameworkError

    error = IncompatibleFrameworkError("tf2onnx failed inside itself")
    assert isinstance(error, pp.MissingDependencyError) and error.exit_code == 4
    assert (error.module, error.extra, str(error)) == ("tf2onnx", EXTRA, "tf2onnx failed inside itself")
    assert EXTRA in __import__("tomllib").loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]


def _graph(nodes, inputs=("obs",), inits=()):
    from onnx import TensorProto, helper, numpy_helper

    from policyport.converter.sources.keras import _Graph

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, [None, 2]) for i in inputs],
                              [], [numpy_helper.from_array(np.ones(2, np.float32), n) for n in inits])
    return _Graph(helper.make_model(graph))


def test_the_graph_view_lists_each_tensors_readers():
    from onnx import helper

    g = _graph([helper.make_node("Relu", ["obs"], ["a"], name="r"), helper.make_node("Add", ["a", "obs"], ["b"], name="s")])
    assert {k: [n.name for n in v] for k, v in g.consumers().items()} == {"obs": ["r", "s"], "a": ["s"]}


def test_an_identity_cycle_ends_the_walk_back_to_a_tensors_root():
    import threading

    from onnx import helper

    from policyport.converter.sources.keras import _root

    g = _graph([helper.make_node("Identity", ["b"], ["a"]), helper.make_node("Identity", ["a"], ["b"]),
                helper.make_node("Identity", ["obs"], ["c"]), helper.make_node("Identity", ["c"], ["d"])])
    found = {}
    walker = threading.Thread(target=lambda: found.update(a=_root(g, "a", g.producers()), d=_root(g, "d", g.producers())),
                              daemon=True)
    walker.start()
    walker.join(10)
    assert not walker.is_alive() and found == {"a": "a", "d": "obs"}


def test_names_of_a_graph_input_or_an_initializer_become_identities_and_the_source_keeps_its_name():
    from onnx import helper

    from policyport.converter.sources.keras import _settle_names

    g = _graph([helper.make_node("Identity", ["obs"], ["input_layer"]), helper.make_node("Identity", ["W"], ["dense/kernel"]),
                helper.make_node("Add", ["input_layer", "dense/kernel"], ["sum"])], inits=["W"])
    _settle_names(g, ["input_layer", "dense/kernel"])
    got = [(n.op_type, list(n.input), list(n.output)) for n in g.g.node]  # identities first, at the start
    assert sorted(got[:2]) == [("Identity", ["W"], ["dense/kernel"]), ("Identity", ["obs"], ["input_layer"])]
    assert got[2:] == [("Add", ["input_layer", "dense/kernel"], ["sum"])]
    assert set(g.init) == {"W"} and g.inputs == ["obs"]


def test_traced_tensors_are_one_when_they_are_the_same_object_or_share_a_name():
    from types import SimpleNamespace

    from policyport.converter.sources.keras import _same_tensor

    a = SimpleNamespace(name="dense/BiasAdd:0")
    assert _same_tensor(a, a) and _same_tensor(a, SimpleNamespace(name="dense/BiasAdd:0"))
    assert not _same_tensor(a, SimpleNamespace(name="dense_1/BiasAdd:0")) and not _same_tensor(a, object())
    unnamed = SimpleNamespace(name=None)
    assert _same_tensor(unnamed, unnamed) and not _same_tensor(unnamed, SimpleNamespace(name=None))


def test_a_keras_model_never_built_is_refused_saying_how_to_build_it(keras):
    model = keras.Sequential([keras.layers.Dense(2)], name="policy")
    with pytest.raises(pp.BadModelError) as caught:
        pp.convert(model)
    assert str(caught.value) == ("cannot tell the input shape of the Sequential model 'policy': it was never built; call it "
                                 "once on an observation batch (or save it after that) before converting")


@pytest.mark.parametrize("option, value, message", [
    ("activation", "relu", "activation does not apply to a Keras model: the model records its own layers"),
    ("policy_id", "p0", "policy_id does not apply to a Keras model: the model records its own layers"),
    ("obs_norm", "vecnormalize.pkl", "obs_norm does not apply to a Keras model: the model records its own layers"),
    ("keep_value", True, "--keep-value does not apply to a Keras model: every output the model has is exported"),
])
def test_called_directly_the_keras_converters_refuse_options_of_other_sources(option, value, message):
    from policyport.converter import ConvertOptions
    from policyport.converter.sources.keras import _check_options

    with pytest.raises(pp.OptionError) as caught:
        _check_options(ConvertOptions(**{option: value}), "a Keras model")
    assert str(caught.value) == message


def test_a_diag_gaussian_head_splits_a_keras_models_output_into_action_and_log_std(obs):
    with pytest.raises(pp.OptionError) as caught:  # nothing in the model says fc_out holds both halves
        convert_source(FIXTURES / "mlp_activations.keras", head="diag-gaussian")
    assert str(caught.value) == (
        "--head diag-gaussian: nothing in the Keras model says that fc_out's 4 outputs are a mean and a log_std half (it "
        "holds no log_std parameter, and its layout is not one whose convention splits them, as RLlib's is). If the "
        "first 2 are the mean and the last 2 the log_std, say so with --head diag-gaussian:halves; if all 4 are the "
        "mean (the log std kept elsewhere), --head none exports them as logits")
    c = convert_source(FIXTURES / "mlp_activations.keras", head="diag-gaussian:halves")
    outputs = [(o.name, [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]) for o in c.model.graph.output]
    assert outputs == [("fc_out", ["batch", 4]), ("action", ["batch", 2]), ("log_std", ["batch", 2])]
    assert {"head/axes", "head/zero", "head/mid", "head/end"} <= {i.name for i in c.model.graph.initializer}
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(c.model, backend=backend).run({"obs": obs})
        np.testing.assert_array_equal(got["action"], got["fc_out"][:, :2])
        np.testing.assert_array_equal(got["log_std"], got["fc_out"][:, 2:])
    assert pp.verify(c.model, obs, reference=c.reference).passed


def test_a_keras_head_needs_an_output_it_can_split_and_categorical_takes_the_argmax(obs):
    with pytest.raises(pp.OptionError) as caught:
        convert_source(FIXTURES / "mlp_norm.keras", head="diag-gaussian")
    assert str(caught.value) == ("--head diag-gaussian splits 'fc_out' into mean and log_std halves, but it has 3 outputs "
                                 "(an odd number); use --head categorical (or none)")
    c = convert_source(FIXTURES / "mlp_norm.keras", head="categorical")
    got = pp.load(c.model).run({"obs": obs})
    np.testing.assert_array_equal(got["action"], np.argmax(got["fc_out"], axis=1))


def test_a_saved_model_without_serving_default_lists_the_signatures_it_has(tmp_path):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    module = tf.Module()
    module.w = tf.Variable(tf.ones((3, 2)))
    module.act = tf.function(lambda x: tf.matmul(x, module.w), input_signature=[tf.TensorSpec((None, 3), tf.float32)])
    path = tmp_path / "policy_savedmodel"
    tf.saved_model.save(module, str(path), signatures={"act_greedy": module.act.get_concrete_function()})
    with pytest.raises(pp.UnreadableFileError) as caught:
        convert_source(path, trust=True)
    assert str(caught.value) == f"{path} has no serving_default signature; it has: act_greedy"


def test_below_opset_17_a_layer_norm_is_spelled_out_in_nodes_named_after_their_step():
    c = convert_source(FIXTURES / "mlp_norm.keras", opset=13)
    assert [n.name for n in c.model.graph.node if n.name.startswith("ln/")] == [
        "ln/mean", "ln/centered", "ln/squared", "ln/variance", "ln/variance_eps", "ln/std", "ln/normalized", "ln/scaled"]


def test_a_layers_internal_tensors_and_constants_are_named_under_the_layer():
    from onnx import helper

    from policyport.converter.sources.keras import _readable_names

    g = _graph([helper.make_node("Add", ["obs", "Const_3"], ["StatefulPartitionedCall/fc_1/BiasAdd:0"]),
                helper.make_node("Mul", ["StatefulPartitionedCall/fc_1/BiasAdd:0", "fc"], ["fc_out"])], inits=["Const_3", "fc"])
    _readable_names(g, {"fc": list(g.g.node)}, {"obs", "fc_out"})
    assert [(n.name, list(n.input), list(n.output)) for n in g.g.node] == [
        ("fc/BiasAdd", ["obs", "fc/Const_3"], ["fc/BiasAdd"]),  # TF's call wrappers, scope and :0 gone
        ("fc_out", ["fc/BiasAdd", "fc/constant"], ["fc_out"])]  # a constant named like the layer itself
    assert sorted(g.init) == ["fc/Const_3", "fc/constant"]


def test_loading_a_keras_file_is_safe_unless_trusted():
    from policyport.converter.sources.keras import load_keras_file

    with pytest.raises(pp.UntrustedFileError, match="Lambda"):
        load_keras_file(FIXTURES / "gaussian_lambda.keras")  # safe mode by default
    assert load_keras_file(FIXTURES / "gaussian_lambda.keras", trust=True).name


def test_nested_outputs_of_a_tf_function_are_named_by_their_path(keras, obs):
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="fc")])
    fn = tf.function(lambda x: {"policy": {"mean": model(x)[:, :2], "log_std": model(x)[:, 2:]}},
                     input_signature=[tf.TensorSpec((None, 6), tf.float32)])
    c = convert_source(fn)
    assert sorted(o.name for o in c.model.graph.output) == ["policy/log_std", "policy/mean"]
    got = pp.load(c.model).run({"obs": obs})
    np.testing.assert_allclose(got["policy/mean"], model.predict(obs, verbose=0)[:, :2], rtol=1e-5, atol=1e-5)


def test_a_layer_norm_without_beta_or_gamma_is_rebuilt_with_their_neutral_values(keras, obs):
    keras.utils.set_random_seed(5)
    inp = keras.Input((6,))
    out = keras.layers.Dense(3, name="fc_out")(keras.layers.LayerNormalization(center=False, scale=False, name="ln")(
        keras.layers.Dense(8, name="fc_1")(inp)))
    model = keras.Model(inp, out)
    expected = model.predict(obs, verbose=0)
    for opset, spelled_out in ((17, False), (13, True)):  # below 17 the norm is spelled out in primitive ops
        c = convert_source(model, opset=opset)
        assert ("LayerNormalization" not in {n.op_type for n in c.model.graph.node}) == spelled_out
        np.testing.assert_allclose(pp.load(c.model).run({"obs": obs})["fc_out"], expected, rtol=1e-4, atol=1e-4)


def test_a_folder_without_saved_model_pb_or_without_signatures_is_refused_saying_so(tmp_path):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    empty = tmp_path / "empty_savedmodel"
    empty.mkdir()
    with pytest.raises(pp.UnreadableFileError) as caught:
        convert_source(empty, kind="savedmodel")
    assert str(caught.value) == f"{empty} is not a TF SavedModel folder (it has no saved_model.pb)"
    module = tf.Module()
    module.w = tf.Variable(tf.ones((3, 2)))
    bare = tmp_path / "bare_savedmodel"
    tf.saved_model.save(module, str(bare), signatures={})
    with pytest.raises(pp.UnreadableFileError) as caught:
        convert_source(bare, trust=True)
    assert str(caught.value) == f"{bare} has no serving_default signature; it has: none"


def test_a_head_on_a_model_of_several_outputs_is_a_usage_error_on_the_command_line(tmp_path):
    out = tmp_path / "k.onnx"
    result = CliRunner().invoke(app, ["convert", str(FIXTURES / "three_heads.keras"), "-o", str(out), "--head", "categorical"])
    assert result.exit_code == 2 and not out.exists()
    assert "a categorical head needs a model with one output; this one has 3: steer, brake, gear" in " ".join(result.stderr.split())
