"""The TensorFlow-facing half of the Keras converter, function by function: importing the frameworks,
loading files, tracing a model or a tf.function (input specs, layer tensor names, output names,
weights, norms, shapes), running tf2onnx and every refusal on the way, and the provenance a
converted model records.

TensorFlow is imported once for the module; the models are a few units wide and each converted
model is converted once.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

import policyport as pp
from policyport.converter import ConvertOptions, convert_source
from policyport.converter.sources import keras as kc
from policyport.converter.build import MIN_OPSET
from policyport.io.kinds import sha256_file

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "keras"


@pytest.fixture(scope="module")
def fw():
    return kc._frameworks()


@pytest.fixture(scope="module")
def layers(fw):
    return fw.keras.layers


def _names(weights):
    return [(name, layer, value.shape) for name, layer, value in weights]


# ------------------------------------------------------------------------------ importing frameworks


def test_the_frameworks_are_the_three_modules_imported_quietly(fw, monkeypatch):
    import keras
    import tensorflow
    import tf2onnx

    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    for name in ("tf2onnx", "tensorflow", "absl"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.DEBUG)
    got = kc._frameworks()
    assert (got.tf, got.keras, got.tf2onnx) == (tensorflow, keras, tf2onnx)
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"
    assert [logging.getLogger(n).level for n in ("tf2onnx", "tensorflow", "absl")] == [logging.ERROR] * 3
    assert got.versions == f"tensorflow {tensorflow.__version__} with tf2onnx {tf2onnx.__version__}"
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")  # a level the user chose is kept
    kc._frameworks()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"


def _importing(monkeypatch, failures: dict):
    """importlib.import_module that raises ``failures[name]`` for those names and records each call."""
    real, asked = importlib.import_module, []

    def fake(name, *args):
        asked.append(name)
        if name in failures:
            raise failures[name]
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", fake)
    return asked


def test_import_all_fills_the_three_modules_in_order(fw, monkeypatch):
    asked = _importing(monkeypatch, {})
    modules = {}
    kc._import_all(modules)
    assert asked == ["tensorflow", "keras", "tf2onnx"]
    assert list(modules) == asked and modules["keras"] is fw.keras and modules["tf2onnx"] is fw.tf2onnx


@pytest.mark.parametrize("failing, missing_name", [
    ("tensorflow", "tensorflow"), ("keras", "keras"), ("tf2onnx", "tf2onnx"),
    ("tensorflow", "tensorflow.python.pywrap"),  # a submodule of the package itself is missing
])
def test_a_framework_not_installed_names_itself_and_the_tf_extra(fw, monkeypatch, failing, missing_name):
    _importing(monkeypatch, {failing: ImportError(f"No module named {missing_name!r}", name=missing_name)})
    with pytest.raises(pp.MissingDependencyError) as caught:
        kc._import_all({})
    assert type(caught.value) is pp.MissingDependencyError
    assert (caught.value.module, caught.value.extra) == (failing, "tf")
    assert str(caught.value) == (f"converting a Keras/TensorFlow policy needs the Python package {failing!r}, which is not "
                                 "installed; install it with: pip install 'policyport[tf]'")


@pytest.mark.parametrize("missing_name", ["google.protobuf", None])
def test_a_framework_that_cannot_import_a_dependency_of_its_own_is_an_incompatible_set(fw, monkeypatch, missing_name):
    _importing(monkeypatch, {"tf2onnx": ImportError("cannot import name 'x'", name=missing_name)})
    with pytest.raises(kc.IncompatibleFrameworkError) as caught:
        kc._import_all({})
    assert (caught.value.module, caught.value.extra, caught.value.exit_code) == ("tf2onnx", "tf", 4)
    assert str(caught.value) == ("tf2onnx is installed but cannot be imported (ImportError: cannot import name 'x'); "
                                 "install a working pair with: pip install 'policyport[tf]'")


def test_a_framework_failing_inside_its_import_is_an_incompatible_set(fw, monkeypatch):
    _importing(monkeypatch, {"keras": RuntimeError("numpy ABI")})
    with pytest.raises(kc.IncompatibleFrameworkError) as caught:
        kc._import_all({})
    assert str(caught.value) == ("importing keras failed (RuntimeError: numpy ABI); the installed tensorflow/tf2onnx/protobuf "
                                 "versions do not work together; install a working set with: pip install 'policyport[tf]'")


# ------------------------------------------------------------------------------------ loading files


def test_loading_a_missing_file_or_a_folder_is_refused(fw, tmp_path):
    with pytest.raises(pp.UnreadableFileError) as caught:
        kc.load_keras_file(tmp_path / "none.keras")
    assert str(caught.value) == f"{tmp_path / 'none.keras'}: no such file"
    with pytest.raises(pp.UnreadableFileError) as caught:
        kc.load_keras_file(tmp_path)
    assert str(caught.value) == f"{tmp_path} is a folder; --from keras takes a .keras or .h5 file"


def _keras_archive(path):
    """A zip archive holding config.json, which is what policyport checks of a .keras file before Keras reads it."""
    import zipfile

    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("config.json", "{}")
    return path


def test_a_file_is_loaded_uncompiled_in_safe_mode_unless_trusted(fw, monkeypatch, tmp_path):
    path = _keras_archive(tmp_path / "p.keras")
    calls = []
    monkeypatch.setattr(fw.keras.saving, "load_model", lambda *a, **k: calls.append((a, k)) or "model")
    assert kc.load_keras_file(path) == "model" and kc.load_keras_file(path, trust=True) == "model"
    assert calls == [((str(path),), {"compile": False, "safe_mode": True}),
                     ((str(path),), {"compile": False, "safe_mode": False})]


@pytest.mark.parametrize("error, kind, message", [
    (ValueError("Requested the deserialization of a Lambda layer whose safe_mode=True\nmore"), pp.UntrustedFileError,
     ("{p} stores a Lambda layer as Python bytecode, which runs when the model is loaded; policyport loads Keras files "
      "in Keras' safe mode and refused it (nothing from the file ran). If you trust this file, pass --trust (trust=True)")),
    (ValueError("File format not supported\nsecond line"), pp.UnreadableFileError,
     "{p} is not a readable Keras model: File format not supported"),
    (TypeError("Could not locate class 'Policy'\ndetails"), pp.BadModelError,
     "{p} names a class Keras cannot rebuild: Could not locate class 'Policy'"),
    (OSError("truncated\nx"), pp.UnreadableFileError, "{p} is not a readable Keras model: OSError: truncated"),
    (KeyError("layers"), pp.UnreadableFileError, "{p} is not a readable Keras model: KeyError: 'layers'"),
    (AttributeError("no config"), pp.UnreadableFileError, "{p} is not a readable Keras model: AttributeError: no config"),
    (EOFError(), pp.UnreadableFileError, "{p} is not a readable Keras model: EOFError: EOFError"),
])
def test_each_way_keras_fails_to_load_a_file_is_refused_saying_why(fw, monkeypatch, tmp_path, error, kind, message):
    path = _keras_archive(tmp_path / "p.keras")

    def load_model(*args, **kwargs):
        raise error

    monkeypatch.setattr(fw.keras.saving, "load_model", load_model)
    with pytest.raises(kind) as caught:
        kc.load_keras_file(path)
    assert type(caught.value) is kind and str(caught.value) == message.format(p=path)
    assert caught.value.__cause__ is error


def test_a_file_that_is_no_keras_model_is_unreadable(fw, tmp_path):
    path = tmp_path / "noise.keras"
    path.write_bytes(b"not a zip archive")
    with pytest.raises(pp.UnreadableFileError) as caught:
        kc.load_keras_file(path)
    assert str(caught.value) == f"{path} is not a .keras archive (not a zip file)"


# ------------------------------------------------------------------------------- small tracing parts


def test_flat_names_nested_results_by_key_and_position_and_collapses_one_element_lists():
    assert kc._flat("a", 7) == [("a", 7)]
    assert kc._flat("a", [7]) == [("a", 7)] and kc._flat("a", ([7],)) == [("a", 7)]
    assert kc._flat("a", (1, 2)) == [("a/0", 1), ("a/1", 2)]
    assert kc._flat("a", {"k": [1, 2], "j": (3,), "m": {"n": 4}}) == [("a/k/0", 1), ("a/k/1", 2), ("a/j", 3), ("a/m/n", 4)]
    assert kc._flat("a", [[1, 2], 3]) == [("a/0/0", 1), ("a/0/1", 2), ("a/1", 3)]


def _t(name):
    return SimpleNamespace(name=name)


class _Named:
    def __init__(self, names):
        self._names = names

    @property
    def output_names(self):
        if isinstance(self._names, Exception):
            raise self._names
        return self._names


def test_output_names_follow_dict_keys_then_keras_names_then_the_layer_then_output_i():
    x, y, z = _t("x:0"), _t("y:0"), _t("z:0")
    recorded = [("fc", x), ("head", y), ("head_call1", z)]
    assert kc._output_names(_Named(["ignored"]), {"mean": x, 3: [y, z]}, recorded) == [
        ("mean", x), ("3/0", y), ("3/1", z)]
    assert kc._output_names(_Named(["steer", "gear"]), [x, y], recorded) == [("steer", x), ("gear", y)]
    assert kc._output_names(_Named(("pi",)), x, recorded) == [("pi", x)]
    assert kc._output_names(_Named(["pi"]), (x,), recorded) == [("pi", x)]
    # no names, wrong count, or repeated names: the layer tensor each output is, else output_<i>
    for model in (object(), _Named(AttributeError("none")), _Named(ValueError("none")), _Named(["a"]), _Named(["a", "a"])):
        assert kc._output_names(model, [y, _t("w:0")], recorded) == [("head", y), ("output_1", _t("w:0"))]
    assert kc._output_names(object(), [z, z], recorded) == [("head_call1", z), ("output_1", z)]  # a name once only
    assert kc._output_names(object(), x, [("first", x), ("last", x)]) == [("last", x)]  # the latest layer giving it
    assert kc._output_names(object(), (x, y), [("", x)]) == [("output_0", x), ("output_1", y)]


def test_traced_tensors_are_one_when_named_alike_and_otherwise_only_when_they_are_the_same_object():
    a = _t("d/BiasAdd:0")
    assert kc._same_tensor(a, _t("d/BiasAdd:0")) and not kc._same_tensor(a, _t("d/BiasAdd:1"))
    nameless = object()
    assert kc._same_tensor(nameless, nameless) and not kc._same_tensor(nameless, object())
    assert not kc._same_tensor(_t(None), _t(None)) and not kc._same_tensor(a, object())
    assert not kc._same_tensor(object(), a)


def test_leaf_layers_are_the_computing_layers_of_every_depth(fw, layers):
    keras = fw.keras
    inp = keras.Input((3,), name="x")
    trunk = keras.Sequential([layers.Dense(4, name="a"), layers.Dense(4, name="b")], name="trunk")
    model = keras.Model(inp, layers.Dense(2, name="head")(trunk(inp)), name="m")
    assert sorted(layer.name for layer in kc._leaf_layers(model)) == ["a", "b", "head"]  # no Input, no container
    assert sorted(layer.name for layer in kc._leaf_layers(trunk)) == ["a", "b"]
    assert kc._leaf_layers(trunk.layers[0]) == [trunk.layers[0]]  # a bare layer is its own leaf


def test_observing_records_each_call_and_puts_the_layers_back(fw, layers):
    dense = layers.Dense(2, name="d")
    dense.build((None, 3))
    x = np.ones((1, 3), np.float32)
    original = dense.call
    calls = []
    with kc._observing([dense], calls) as seen:
        assert seen is calls
        y = dense(x)
        dense(x)
    assert [layer for layer, _ in calls] == [dense, dense]
    np.testing.assert_array_equal(np.asarray(calls[0][1]), np.asarray(y))
    assert "call" not in dense.__dict__ and dense.call == original
    dense(x)
    assert len(calls) == 2  # no longer observed
    with pytest.raises(RuntimeError), kc._observing([dense], calls):
        raise RuntimeError("inside")
    assert "call" not in dense.__dict__


# ------------------------------------------------------------------------------------- input specs


def _spec(s):
    return (tuple(s.shape), s.dtype.name, s.name)


def test_one_input_is_obs_and_several_keep_their_keras_names(fw, layers):
    keras = fw.keras
    one = keras.Sequential([keras.Input((5, 2)), layers.Flatten(), layers.Dense(2)])
    assert [_spec(s) for s in kc._keras_input_specs(fw, one)] == [((None, 5, 2), "float32", "obs")]
    pos, vel = keras.Input((3,), name="pos"), keras.Input((2,), name="vel", dtype="float64")
    two = keras.Model([pos, vel], layers.Dense(1)(layers.Concatenate()([pos, layers.Activation("linear", dtype="float32")(vel)])))
    assert [_spec(s) for s in kc._keras_input_specs(fw, two)] == [((None, 3), "float32", "pos"), ((None, 2), "float64", "vel")]
    fake = SimpleNamespace(inputs=[SimpleNamespace(shape=(None, 3), dtype="float32"),
                                   SimpleNamespace(shape=(4, 2), dtype="int32", name="mask")])
    assert [_spec(s) for s in kc._keras_input_specs(fw, fake)] == [((None, 3), "float32", "input_0"),
                                                                   ((None, 2), "int32", "mask")]


class _Built:
    """A model known only by what build() recorded."""

    def __init__(self, shapes, dtype="float32", inputs=AttributeError, name="policy"):
        self._build_shapes_dict, self.compute_dtype, self._inputs, self.name = shapes, dtype, inputs, name

    @property
    def inputs(self):
        if isinstance(self._inputs, type):
            raise self._inputs("no inputs")
        return self._inputs


@pytest.mark.parametrize("model, expected", [
    (_Built({"input_shape": (7, 4)}), ((None, 4), "float32", "obs")),  # the batch axis becomes None
    (_Built({"input_shape": (None, 2, 3)}, "float64"), ((None, 2, 3), "float64", "obs")),
    (_Built({"input_shape": (None, 4)}, "float16", ValueError), ((None, 4), "float16", "obs")),
    (_Built({"input_shape": (None, 4)}, None, []), ((None, 4), "float32", "obs")),
    (_Built({"input_shape": (None, 6)}, "float32", None), ((None, 6), "float32", "obs")),  # inputs None: not iterable
    (_Built({"x": [None, 4]}), ((None, 4), "float32", "obs")),
    (SimpleNamespace(_build_shapes_dict={"input_shape": (None, 5)}), ((None, 5), "float32", "obs")),  # no compute_dtype
])
def test_a_model_known_only_by_its_build_shape_takes_obs_in_its_compute_dtype(fw, model, expected):
    assert [_spec(s) for s in kc._keras_input_specs(fw, model)] == [expected]


@pytest.mark.filterwarnings("ignore:`build\\(\\)` was called on layer:UserWarning")  # Keras' own notice: the point here
def test_the_build_shape_of_a_real_subclassed_model_gives_its_spec(fw, layers):
    keras = fw.keras

    class Policy(keras.Model):
        def __init__(self):
            super().__init__(name="policy", dtype="float64")
            self.fc = layers.Dense(2, name="fc")

        def call(self, x):
            return self.fc(x)

    model = Policy()
    model.build((None, 4))
    assert [_spec(s) for s in kc._keras_input_specs(fw, model)] == [((None, 4), "float64", "obs")]


@pytest.mark.parametrize("shapes", [None, {}, {"a": (None, 3), "b": (None, 2)}, {"input_shape": None},
                                    {"input_shape": ((None, 3), (None, 2))}, {"input_shape": [[None, 3]]}])
def test_a_model_whose_input_shape_cannot_be_told_is_refused(fw, shapes):
    with pytest.raises(pp.BadModelError) as caught:
        kc._keras_input_specs(fw, _Built(shapes))
    assert str(caught.value) == ("cannot tell the input shape of the _Built model 'policy': it was never built; call it "
                                 "once on an observation batch (or save it after that) before converting")


# ------------------------------------------------------------------------------- tracing a Keras model


def _pair(fw):
    """A layer returning a (sum, difference) pair of its two halves."""

    class Halves(fw.keras.layers.Layer):
        def call(self, x):
            a, b = x[:, :2], x[:, 2:]
            return a + b, a - b

    return Halves


def test_a_traced_model_names_every_layer_tensor_output_weight_norm_and_shape(fw, layers):
    keras = fw.keras
    keras.utils.set_random_seed(2)
    inp = keras.Input((3,), name="x")
    shared = layers.Dense(4, name="d")
    h = shared(shared(layers.Dense(4, name="d_in")(inp)))  # one layer called twice
    s, dif = _pair(fw)(name="split")(h)
    inner = keras.Sequential([layers.Dense(2, name="d"), layers.LayerNormalization(name="ln")], name="inner")  # "d" again
    n = layers.BatchNormalization(name="bn")(s)
    model = keras.Model(inp, {"mean": inner(n), "log_std": dif}, name="m")
    t = kc._trace_keras(fw, model)
    assert [_spec(s) for s in t.input_specs] == [((None, 3), "float32", "obs")]
    assert t.outputs == ["mean", "log_std"]
    assert t.layer_tensors == {"d_in": "d_in", "d": "d", "d_call1": "d", "split/0": "split", "split/1": "split",
                               "bn": "bn", "d_1": "d_1", "ln": "ln"}
    assert t.shapes == {"d_in": (None, 4), "d": (None, 4), "d_call1": (None, 4), "split/0": (None, 2),
                        "split/1": (None, 2), "bn": (None, 2), "d_1": (None, 2), "ln": (None, 2)}
    assert _names(t.weights) == [
        ("d_in/kernel", "d_in", (3, 4)), ("d_in/bias", "d_in", (4,)), ("d/kernel", "d", (4, 4)), ("d/bias", "d", (4,)),
        ("bn/gamma", "bn", (2,)), ("bn/beta", "bn", (2,)), ("bn/moving_mean", "bn", (2,)),
        ("bn/moving_variance", "bn", (2,)), ("d_1/kernel", "d_1", (2, 2)), ("d_1/bias", "d_1", (2,)),
        ("ln/gamma", "ln", (2,)), ("ln/beta", "ln", (2,))]
    by_name = {w.path: np.asarray(w.numpy()) for w in model.weights}
    assert t.weights[2][2].tobytes() == by_name[shared.kernel.path].tobytes()
    assert {k: (kind, layer.name) for k, (kind, layer) in t.norms.items()} == {"bn": ("bn", "bn"), "ln": ("ln", "ln")}
    obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    got = {k: np.asarray(v) for k, v in t.function(obs).items()}
    expected = model(obs, training=False)
    assert sorted(got) == sorted([*t.layer_tensors, "mean", "log_std"])
    np.testing.assert_allclose(got["mean"], np.asarray(expected["mean"]), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got["ln"], got["mean"])
    np.testing.assert_allclose(got["split/1"], got["d_call1"][:, :2] - got["d_call1"][:, 2:], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["d_call1"], np.asarray(shared(shared(
        model.get_layer("d_in")(obs)))), rtol=1e-6, atol=1e-6)


def test_a_repeated_layer_name_takes_the_next_number_no_other_layer_has(fw, layers):
    keras = fw.keras
    inp = keras.Input((3,))
    h = layers.Dense(4, name="fc_1")(layers.Dense(4, name="fc")(inp))
    model = keras.Model(inp, keras.Sequential([layers.Dense(2, name="fc")], name="inner")(h))  # "fc" again, inside
    t = kc._trace_keras(fw, model)
    assert list(t.layer_tensors) == ["fc", "fc_1", "fc_2"]  # fc_1 is taken by a layer of that name
    assert [name for name, _, _ in t.weights] == ["fc/kernel", "fc/bias", "fc_1/kernel", "fc_1/bias", "fc_2/kernel",
                                                  "fc_2/bias"]


def test_a_layer_tensor_named_like_a_different_output_is_kept_apart(fw, layers):
    keras = fw.keras
    inp = keras.Input((3,))
    a = layers.Dense(2, name="a")(inp)
    model = keras.Model(inp, {"a": layers.Dense(2, name="b")(a), "raw": a})
    t = kc._trace_keras(fw, model)
    assert t.outputs == ["a", "raw"] and t.layer_tensors == {"a/output": "a", "b": "b"}
    obs = np.ones((2, 3), np.float32)
    got = t.function(obs)
    np.testing.assert_array_equal(np.asarray(got["a/output"]), np.asarray(got["raw"]))
    np.testing.assert_array_equal(np.asarray(got["a"]), np.asarray(got["b"]))


def test_output_names_and_a_one_element_list_of_a_sequential_and_a_functional_model(fw, layers):
    keras = fw.keras
    seq = keras.Sequential([keras.Input((3,)), layers.Dense(2, name="a"), layers.Dense(2, name="b")])
    t = kc._trace_keras(fw, seq)
    assert (t.outputs, list(t.layer_tensors)) == (["b"], ["a", "b"])  # a Sequential's output is its last layer

    class Single(keras.layers.Layer):
        def call(self, x):
            return [x * 2.0]

    inp = keras.Input((3,), name="x")
    model = keras.Model(inp, [layers.Dense(2, name="p")(Single(name="one")(inp)[0]), layers.Dense(1, name="v")(inp)])
    t = kc._trace_keras(fw, model)
    assert (t.outputs, t.layer_tensors) == (["p", "v"], {"one": "one", "p": "p", "v": "v"})
    assert t.shapes["one"] == (None, 3)


def test_weights_not_owned_by_a_leaf_are_left_out_and_a_repeated_weight_name_falls_back_to_its_path(fw, layers):
    keras = fw.keras

    class Twin(keras.layers.Layer):
        def build(self, shape):
            self.first = self.add_weight(shape=(shape[-1],), name="w", initializer="ones")
            self.second = self.add_weight(shape=(shape[-1],), name="w", initializer="zeros")

        def call(self, x):
            return x * self.first + self.second

    class Policy(keras.Model):
        def __init__(self):
            super().__init__(name="policy")
            self.twin = Twin(name="twin")
            self.out = layers.Dense(1, name="out")

        def build(self, shape):
            self.scale = self.add_weight(shape=(), name="scale", initializer="ones")  # the model's own, no layer's
            super().build(shape)

        def call(self, x):
            return self.out(self.twin(x)) * self.scale

    model = Policy()
    model(np.ones((1, 2), np.float32))
    t = kc._trace_keras(fw, model)
    assert _names(t.weights) == [("twin/w", "twin", (2,)), (model.twin.second.path, "twin", (2,)),
                                 ("out/kernel", "out", (2, 1)), ("out/bias", "out", (1,))]
    assert model.twin.second.path != "twin/w"
    assert t.weights[1][2].tolist() == [0.0, 0.0] and t.weights[0][2].tolist() == [1.0, 1.0]
    assert t.outputs == ["output_0"] and t.norms == {}  # a subclassed model's output is no layer tensor


def test_a_weight_two_layers_share_is_listed_once_under_its_first_layer(fw, layers):
    keras = fw.keras

    class Tied(keras.layers.Layer):
        def __init__(self, dense, **kwargs):
            super().__init__(**kwargs)
            self.kernel = dense.kernel

        def call(self, x):
            return keras.ops.matmul(x, keras.ops.transpose(self.kernel))

    inp = keras.Input((3,))
    enc = layers.Dense(2, use_bias=False, name="enc")
    z = enc(inp)
    model = keras.Model(inp, Tied(enc, name="dec")(z))
    t = kc._trace_keras(fw, model)
    assert _names(t.weights) == [("enc/kernel", "enc", (3, 2))]


def test_a_model_that_fails_when_traced_is_refused_with_the_first_line_of_its_error(fw, layers):
    keras = fw.keras

    class Fragile(keras.layers.Layer):
        broken = False

        def call(self, x):
            if self.broken:
                raise ValueError("shapes do not fit\ntraceback noise")
            return x

    layer = Fragile(name="fragile")
    inp = keras.Input((3,))
    model = keras.Model(inp, layers.Dense(2)(layer(inp)), name="policy")
    layer.broken = True
    with pytest.raises(pp.BadModelError) as caught:
        kc._trace_keras(fw, model)
    assert str(caught.value) == ("calling the Keras model 'policy' on [(None, 3)] failed: "
                                 "Exception encountered when calling Fragile.call(): shapes do not fit")
    assert "call" not in layer.__dict__  # the observed layers are put back


def test_an_error_keras_did_not_wrap_is_reported_by_its_own_first_line():
    plain = ValueError("bad shape\nmore")
    try:
        raise plain
    except ValueError:
        try:
            raise RuntimeError("while handling")
        except RuntimeError as e:
            assert kc._layer_error(e) == "while handling"  # a context of its own is not the layer's reason
    assert kc._layer_error(plain) == "bad shape"


def test_a_model_of_two_inputs_is_called_with_both_in_order(fw, layers):
    keras = fw.keras
    pos, vel = keras.Input((3,), name="pos"), keras.Input((2,), name="vel")
    model = keras.Model([pos, vel], layers.Dense(1, name="head")(layers.Concatenate(name="cat")([pos, vel])))
    t = kc._trace_keras(fw, model)
    assert [s.name for s in t.input_specs] == ["pos", "vel"] and t.outputs == ["head"]
    a, b = np.ones((2, 3), np.float32), np.full((2, 2), 2.0, np.float32)
    assert np.asarray(t.function(a, b)["cat"]).tolist() == [[1, 1, 1, 2, 2]] * 2


# ---------------------------------------------------------------------------------- tf.function


def test_a_tf_functions_inputs_outputs_and_variables_are_named(fw):
    tf = fw.tf
    w = tf.Variable(np.arange(6, dtype=np.float32).reshape(3, 2), name="w")
    b = tf.Variable(np.ones(2, np.float32), name="b")
    one = tf.function(lambda x: {"pi": {"mean": tf.matmul(x, w) + b, "all": [x, x * 2.0]}},
                      input_signature=[tf.TensorSpec((None, 3), tf.float32, name="ignored")])
    t = kc._trace_function(fw, one)
    assert [_spec(s) for s in t.input_specs] == [((None, 3), "float32", "obs")]
    assert t.outputs == ["pi/mean", "pi/all/0", "pi/all/1"]
    assert sorted(_names(t.weights)) == [("b", None, (2,)), ("w", None, (3, 2))]  # ":0" removed
    assert (t.layer_tensors, t.norms, t.shapes) == ({}, {}, {})
    got = t.function(np.ones((1, 3), np.float32))
    assert np.asarray(got["pi/mean"]).tolist() == [[7.0, 10.0]]

    two = tf.function(lambda a, c: (a + 1.0, [c]),
                      input_signature=[tf.TensorSpec((None, 2), tf.float32, name="pos"), tf.TensorSpec((None, 2), tf.float64)])
    t = kc._trace_function(fw, two)
    assert [_spec(s) for s in t.input_specs] == [((None, 2), "float32", "pos"), ((None, 2), "float64", "input_1")]
    assert t.outputs == ["output/0", "output/1"] and t.weights == []
    got = t.function(np.zeros((1, 2), np.float32), np.full((1, 2), 3.0))
    assert np.asarray(got["output/0"]).tolist() == [[1.0, 1.0]] and np.asarray(got["output/1"]).dtype == np.float64

    t = kc._trace_function(fw, two, [w, w, b], ["p", "q"])  # variables and names given (a SavedModel's)
    assert [s.name for s in t.input_specs] == ["p", "q"]
    assert _names(t.weights) == [("w", None, (3, 2)), ("b", None, (2,))]
    assert t.weights[0][2].tolist() == [[0, 1], [2, 3], [4, 5]]


def test_a_tf_function_nested_input_signature_is_passed_in_its_structure(fw):
    tf = fw.tf
    fn = tf.function(lambda pair: pair[0] - pair[1],
                     input_signature=[(tf.TensorSpec((None, 2), tf.float32), tf.TensorSpec((None, 2), tf.float32))])
    t = kc._trace_function(fw, fn)
    assert [s.name for s in t.input_specs] == ["input_0", "input_1"] and t.outputs == ["output"]
    got = t.function(np.full((1, 2), 5.0, np.float32), np.ones((1, 2), np.float32))
    assert np.asarray(got["output"]).tolist() == [[4.0, 4.0]]


def test_keras_variables_of_a_tf_function_are_named_by_their_path(fw, layers):
    tf = fw.tf
    dense = layers.Dense(2, name="fc")
    dense.build((None, 3))
    fn = tf.function(lambda x: dense(x), input_signature=[tf.TensorSpec((None, 3), tf.float32)])
    t = kc._trace_function(fw, fn)
    assert sorted(n for n, _, _ in t.weights) == ["fc/bias", "fc/kernel"]


def test_a_tf_function_without_an_input_signature_is_refused(fw):
    for fn in (fw.tf.function(lambda x: x), lambda x: x):
        with pytest.raises(pp.BadModelError) as caught:
            kc._trace_function(fw, fn)
        assert str(caught.value) == ("a tf.function needs an input_signature (tf.TensorSpec per input, batch axis None) "
                                     "to be converted")


# ------------------------------------------------------------------------------------------ tf2onnx


def test_the_opset_range_is_tf2onnxs_from_the_oldest_policyport_writes(fw):
    newest = max(fw.tf2onnx.constants.OPSET_TO_IR_VERSION)
    assert kc._check_opset(fw, MIN_OPSET) is None and kc._check_opset(fw, newest) is None
    for opset in (MIN_OPSET - 1, newest + 1):
        with pytest.raises(pp.OptionError) as caught:
            kc._check_opset(fw, opset)
        assert str(caught.value) == (f"opset {opset} is out of range for a Keras/TF source: tf2onnx "
                                     f"{fw.tf2onnx.__version__} writes opset {MIN_OPSET} to {newest}; "
                                     "choose --opset in that range")


@pytest.fixture(scope="module")
def tiny_trace(fw):
    keras = fw.keras
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc")])
    return kc._trace_keras(fw, model)


INCOMPATIBLE = ("tf2onnx failed inside itself ({kind}: {first}): {versions} do not work together; install the pair "
                "policyport is tested with: pip install 'policyport[tf]' (tensorflow-cpu 2.21, tf2onnx 1.17)")
REFUSED = "tf2onnx ({versions}) could not convert the model: {kind}: {first}"


@pytest.mark.parametrize("error, refusal, message", [
    (AttributeError("x has no y\nz"), kc.IncompatibleFrameworkError, INCOMPATIBLE),
    (ImportError("no z"), kc.IncompatibleFrameworkError, INCOMPATIBLE),
    (KeyError("Erfc"), kc.IncompatibleFrameworkError, INCOMPATIBLE),
    (TypeError("bad arg"), kc.IncompatibleFrameworkError, INCOMPATIBLE),
    (NotImplementedError("later"), kc.IncompatibleFrameworkError, INCOMPATIBLE),
    (ValueError("cannot convert\nmore"), pp.BadModelError, REFUSED),  # a graph tf2onnx cannot convert
    (RuntimeError("cannot convert"), pp.BadModelError, REFUSED),
])
def test_tf2onnx_failing_inside_itself_is_an_incompatible_pair_and_refusing_the_graph_a_bad_model(
        fw, tiny_trace, monkeypatch, error, refusal, message):
    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(fw.tf2onnx.convert, "from_function", broken)
    with pytest.raises(refusal) as caught:
        kc._run_tf2onnx(fw, tiny_trace, 17)
    assert type(caught.value) is refusal and caught.value.__cause__ is error
    first = str(error).strip().splitlines()[0]
    assert str(caught.value) == message.format(kind=type(error).__name__, first=first, versions=fw.versions)


def test_tf2onnx_is_given_the_traced_function_and_an_erfc_handler_and_unknown_ops_are_named(fw, tiny_trace, monkeypatch):
    from onnx import helper

    calls = []
    nodes = [helper.make_node("Relu", ["obs"], ["r"], name="r"), helper.make_node("Erfc", ["r"], ["e"], name="gelu/Erfc"),
             helper.make_node("Mystery", ["e"], ["m"], name="m", domain="custom.domain")]
    proto = helper.make_model(helper.make_graph(nodes, "g", [], []))

    def from_function(function, **kwargs):
        calls.append((function, kwargs))
        return proto, None

    monkeypatch.setattr(fw.tf2onnx.convert, "from_function", from_function)
    with pytest.raises(pp.UnsupportedOpError) as caught:
        kc._run_tf2onnx(fw, tiny_trace, 15)
    assert str(caught.value) == (f"tf2onnx {fw.tf2onnx.__version__} has no ONNX form for the TensorFlow op(s) "
                                 "Erfc (gelu/Erfc), Mystery (m); rewrite those layers with standard ops, or try another --opset")
    assert calls == [(tiny_trace.function, {"input_signature": tiny_trace.input_specs, "opset": 15,
                                            "custom_op_handlers": {"Erfc": (kc._erfc, [])}})]
    del proto.graph.node[1:]
    assert kc._run_tf2onnx(fw, tiny_trace, 15) is proto
    with pytest.raises(pp.OptionError):
        kc._run_tf2onnx(fw, tiny_trace, MIN_OPSET - 1)
    assert len(calls) == 2  # an opset out of range is refused before tf2onnx runs


def test_exact_gelu_converts_through_erf_and_matches_keras(fw, layers):
    keras = fw.keras
    keras.utils.set_random_seed(6)
    model = keras.Sequential([keras.Input((3,)), layers.Dense(4, activation=lambda x: keras.activations.gelu(
        x, approximate=False), name="fc"), layers.Dense(2, name="out")])
    c = convert_source(model, opset=13)
    ops = [n.op_type for n in c.model.graph.node]
    assert "Erf" in ops and "Erfc" not in ops
    one = [i for i in c.model.graph.initializer if onnx.numpy_helper.to_array(i).shape == () and
           onnx.numpy_helper.to_array(i).item() == 1.0]
    assert one and all(i.data_type == onnx.TensorProto.FLOAT for i in one)
    obs = np.random.default_rng(1).normal(0, 3, size=(64, 3)).astype(np.float32)
    expected = np.asarray(model(obs, training=False))
    for backend in ("numpy", "onnxruntime"):
        np.testing.assert_allclose(pp.load(c.model, backend=backend).run({"obs": obs})["out"], expected,
                                   rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- conversions and provenance


def _source(model):
    return json.loads({p.key: p.value for p in model.metadata_props}["policyport.source"])


def test_a_keras_file_records_its_name_digest_and_the_framework_versions(fw):
    path = FIXTURES / "two_inputs.keras"
    c = kc.convert_keras(str(path), ConvertOptions())
    assert c.kind == "keras" and [i.name for i in c.model.graph.input] == ["pos", "vel"]
    assert _source(c.model) == {"kind": "keras", "file": "two_inputs.keras", "sha256": sha256_file(path),
                                "tensorflow": fw.tf.__version__, "keras": fw.keras.__version__,
                                "tf2onnx": fw.tf2onnx.__version__}
    feeds = {"pos": np.ones((2, 3), np.float32), "vel": np.zeros((2, 2), np.float32)}
    np.testing.assert_allclose(c.reference(feeds)["head"], pp.load(c.model).run(feeds)["head"], rtol=1e-5, atol=1e-6)


def test_a_live_model_a_layer_and_a_tf_function_record_their_type(fw, layers):
    keras, tf = fw.keras, fw.tf
    keras.utils.set_random_seed(3)
    dense = layers.Dense(2, name="fc")
    dense.build((None, 3))
    fn = tf.function(lambda x: {"twice": x * 2.0}, input_signature=[tf.TensorSpec((None, 3), tf.float32)])
    obs = np.arange(6, dtype=np.float32).reshape(2, 3)
    c = kc.convert_keras(fn, ConvertOptions(head="categorical"))
    assert _source(c.model) == {"kind": "keras", "object": type(fn).__name__, "tensorflow": fw.tf.__version__,
                                "keras": fw.keras.__version__, "tf2onnx": fw.tf2onnx.__version__}
    assert [o.name for o in c.model.graph.output] == ["twice", "action"]
    assert c.reference(obs)["action"].tolist() == [2, 2] and c.kind == "keras"
    bare = kc.convert_keras(dense, ConvertOptions())  # a bare layer is a model of one layer
    assert [o.name for o in bare.model.graph.output] == ["fc"] and _source(bare.model)["object"] == "Dense"
    weights = pp.extract_weights(bare.model)
    assert list(weights) == ["fc/kernel", "fc/bias"]
    assert weights["fc/kernel"].tobytes() == np.asarray(dense.kernel.numpy()).tobytes()
    np.testing.assert_allclose(pp.load(bare.model).run({"obs": obs})["fc"], np.asarray(dense(obs)), rtol=1e-6, atol=1e-6)
    with pytest.raises(pp.BadModelError) as caught:
        kc.convert_keras(3, ConvertOptions())
    assert str(caught.value) == "cannot convert a int as Keras: expected a keras.Model or a tf.function"


def test_converters_refuse_options_and_opsets_before_loading_anything(fw, tmp_path):
    missing = tmp_path / "absent"
    for convert, what in ((kc.convert_keras, "a Keras model"), (kc.convert_savedmodel, "a SavedModel")):
        with pytest.raises(pp.OptionError) as caught:
            convert(missing, ConvertOptions(activation="tanh"))
        assert str(caught.value) == f"activation does not apply to {what}: the model records its own layers"
        with pytest.raises(pp.OptionError, match=f"opset {MIN_OPSET - 1} is out of range"):
            convert(missing, ConvertOptions(opset=MIN_OPSET - 1))
    with pytest.raises(pp.UnreadableFileError):
        kc.convert_keras(missing, ConvertOptions())


def test_a_savedmodel_converts_its_serving_signature_and_records_its_digest(fw):
    path = FIXTURES / "savedmodel"
    c = kc.convert_savedmodel(path, ConvertOptions(trust=True))
    assert c.kind == "savedmodel" and [i.name for i in c.model.graph.input] == ["obs"]
    assert _source(c.model) == {"kind": "savedmodel", "file": "savedmodel", "sha256": sha256_file(path / "saved_model.pb"),
                                "tensorflow": fw.tf.__version__, "keras": fw.keras.__version__,
                                "tf2onnx": fw.tf2onnx.__version__}
    loaded = fw.tf.saved_model.load(str(path))
    signature = loaded.signatures["serving_default"]
    assert [o.name for o in c.model.graph.output] == list(signature.structured_outputs)
    obs = np.random.default_rng(2).normal(size=(4, 6)).astype(np.float32)
    expected = signature(**{next(iter(signature.structured_input_signature[1])): obs})
    got = pp.load(c.model).run({"obs": obs})
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], np.asarray(value), rtol=1e-5, atol=1e-5)
    names = set(pp.extract_weights(c.model))
    assert names == {str(v.path if hasattr(v, "path") else v.name).removesuffix(":0") for v in loaded.variables}


def test_a_savedmodel_of_two_float64_inputs_takes_them_by_their_sorted_keys_in_their_dtype(fw, tmp_path):
    tf = fw.tf

    class Two(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(np.array([[1.0], [2.0]], np.float64), name="w")

        @tf.function(input_signature=[tf.TensorSpec((None, 2), tf.float64, name="vel"),
                                      tf.TensorSpec((None, 2), tf.float64, name="pos")])
        def __call__(self, vel, pos):
            return {"value": tf.matmul(pos - vel, self.w)}

    module = Two()
    tf.saved_model.save(module, str(tmp_path / "two"), signatures=module.__call__)
    c = kc.convert_savedmodel(tmp_path / "two", ConvertOptions(trust=True))
    assert [i.name for i in c.model.graph.input] == ["pos", "vel"] and [o.name for o in c.model.graph.output] == ["value"]
    assert {v.type.tensor_type.elem_type for v in [*c.model.graph.input, *c.model.graph.output]} == {onnx.TensorProto.DOUBLE}
    feeds = {"pos": np.array([[3.0, 1.0]]), "vel": np.array([[1.0, 1.0]])}
    assert pp.load(c.model).run(feeds)["value"].tolist() == [[2.0]]
    assert c.reference(feeds)["value"].tolist() == [[2.0]]
    assert pp.extract_weights(c.model)["w"].tolist() == [[1.0], [2.0]]


def test_a_broken_savedmodel_folder_is_unreadable(fw, tmp_path):
    (tmp_path / "saved_model.pb").write_bytes(b"\x08\x01garbage")
    with pytest.raises(pp.UnreadableFileError) as caught:
        kc.convert_savedmodel(tmp_path, ConvertOptions(trust=True))
    # its graph is read (and sized) before TensorFlow loads anything: the damaged file is named
    assert str(caught.value).startswith(f"{tmp_path / 'saved_model.pb'} is not a readable SavedModel: Error parsing message")


def test_a_savedmodel_is_loaded_only_with_trust(fw, tmp_path):
    """Without trust nothing of the folder is loaded, whatever its functions hold (tests/test_code_sources.py
    has a canary for every way a SavedModel runs code); with it, it converts."""
    tf = fw.tf

    class Writes(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec((None, 2), tf.float32)])
        def __call__(self, x):
            tf.print(x)
            tf.io.write_file(str(tmp_path / "ran"), "ran")
            return {"y": x * 2.0}

    module = Writes()
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures=module.__call__)
    with pytest.raises(pp.TrustRequiredError) as caught:
        kc.convert_savedmodel(tmp_path / "sm", ConvertOptions())
    assert str(caught.value).startswith(f"{tmp_path / 'sm'} is a TensorFlow SavedModel, and loading it runs code the "
                                        "folder holds: ")
    assert str(caught.value).endswith("policyport refused it without loading it (nothing from it ran); if you trust it, "
                                      "pass --trust (trust=True)")
    assert not (tmp_path / "ran").exists()
    trusted = kc.convert_savedmodel(tmp_path / "sm", ConvertOptions(trust=True))
    assert [o.name for o in trusted.model.graph.output] == ["y"]


