"""RLlib FullyConnectedNetwork weights -> ONNX: placement, naming, activations, heads, errors."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import onnx
import pytest

import policyport as pp
from policyport.converter import convert_source
from policyport.converter.activations import parse_activation


def fcnet(sizes=(6, 16, 16, 4), prefix="default_policy/", dtype=np.float32, seed=0, value=None, log_std=None):
    """Random weights in RLlib's TF layout: kernels [in, out]."""
    rng = np.random.default_rng(seed)
    w = {}
    names = [f"fc_{i}" for i in range(1, len(sizes) - 1)] + ["fc_out"]
    for name, n_in, n_out in zip(names, sizes, sizes[1:]):
        w[f"{prefix}{name}/kernel"] = rng.normal(0, 1 / math.sqrt(n_in), (n_in, n_out)).astype(dtype)
        w[f"{prefix}{name}/bias"] = rng.normal(0, 0.1, n_out).astype(dtype)
    if value is not None:
        vnames = [f"fc_value_{i}" for i in range(1, len(value) - 1)] + ["value_out"]
        for name, n_in, n_out in zip(vnames, value, value[1:]):
            w[f"{prefix}{name}/kernel"] = rng.normal(0, 1 / math.sqrt(n_in), (n_in, n_out)).astype(dtype)
            w[f"{prefix}{name}/bias"] = rng.normal(0, 0.1, n_out).astype(dtype)
    if log_std is not None:
        w[f"{prefix}log_std"] = np.asarray(log_std, dtype=dtype)
    return w


def forward(w, obs, act=np.tanh, prefix="default_policy/"):
    h = obs.astype(np.float64)
    i = 1
    while f"{prefix}fc_{i}/kernel" in w:
        h = act(h @ w[f"{prefix}fc_{i}/kernel"] + w[f"{prefix}fc_{i}/bias"])
        i += 1
    return h @ w[f"{prefix}fc_out/kernel"] + w[f"{prefix}fc_out/bias"]


def obs_for(w, n=32, seed=1, dtype=np.float32):
    first = next(v for k, v in w.items() if k.endswith("fc_1/kernel"))
    return np.random.default_rng(seed).uniform(-2, 2, (n, first.shape[0])).astype(dtype)


def run_both(model, obs):
    return {b: pp.load(model, backend=b).record({"obs": obs}) for b in pp.BACKENDS}


def test_layer_order_comes_from_names_not_key_order():
    w = fcnet(sizes=(5, 7, 9, 11, 3))
    keys = list(w)
    random.Random(3).shuffle(keys)
    model = pp.convert({k: w[k] for k in keys}, activation="tanh")
    assert [n.name for n in model.graph.node] == [
        "fc_1/linear", "fc_1/tanh", "fc_2/linear", "fc_2/tanh", "fc_3/linear", "fc_3/tanh", "logits"]
    obs = obs_for(w)
    for out in run_both(model, obs).values():
        assert np.abs(out["logits"] - forward(w, obs)).max() <= 1e-5


def test_initializers_carry_the_source_parameter_names_unchanged(metadrive_model, metadrive_weights):
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in metadrive_model.graph.initializer}
    for name, arr in metadrive_weights.items():
        assert inits[name].dtype == arr.dtype and inits[name].tobytes() == arr.tobytes()
    assert [i.name for i in metadrive_model.graph.input] == ["obs"]
    dims = metadrive_model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and dims[1].dim_value == 275


@pytest.mark.parametrize("opset", [11, 13, 17, 20, onnx.defs.onnx_opset_version()])
def test_model_passes_the_full_onnx_checker_at_every_opset(opset):
    w = fcnet()
    model = pp.convert(w, opset=opset, activation="gelu", head="diag-gaussian")
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == opset
    assert ("Gelu" in {n.op_type for n in model.graph.node}) == (opset >= 20)
    obs = obs_for(w)
    ref = convert_source(w, activation="gelu", head="diag-gaussian").reference(obs)
    for out in run_both(model, obs).values():
        for name in ("logits", "action", "log_std"):
            assert np.abs(out[name] - ref[name]).max() <= 1e-5


ACTIVATIONS = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0),
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
    "selu": lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(np.minimum(x, 0))),
    "swish": lambda x: x / (1 + np.exp(-x)),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "softplus": lambda x: np.log1p(np.exp(x)),
    "leaky_relu": lambda x: np.where(x >= 0, x, 0.01 * x),
    "leaky_relu:0.2": lambda x: np.where(x >= 0, x, 0.2 * x),
    "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    "linear": lambda x: x,
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_each_activation_matches_its_textbook_formula_on_both_backends(name):
    w = fcnet(sizes=(6, 12, 12, 4), seed=5)
    obs = obs_for(w, n=64)
    expected = forward(w, obs, ACTIVATIONS[name])
    model = pp.convert(w, activation=name)
    label = parse_activation(name).label
    for backend, out in run_both(model, obs).items():
        assert np.abs(out["logits"] - expected).max() <= 1e-5, backend
        assert f"fc_1/{label}" in out and "fc_1/linear" in out


def test_tf_variable_suffix_and_missing_prefix_are_accepted():
    w = {k.replace("default_policy/", "") + ":0": v for k, v in fcnet().items()}
    model = pp.convert(w, activation="tanh")
    assert pp.extract_weights(model).keys() == w.keys()


def test_free_log_std_is_concatenated_after_the_mean():
    w = fcnet(sizes=(6, 16, 2), log_std=[-0.5, 0.25])
    obs = obs_for(w)
    model = pp.convert(w, activation="tanh", head="diag-gaussian")
    for out in run_both(model, obs).values():
        assert out["logits"].shape == (32, 4)
        assert np.abs(out["action"] - forward(w, obs)).max() <= 1e-5
        np.testing.assert_array_equal(out["log_std"], np.tile(np.float32([-0.5, 0.25]), (32, 1)))


@pytest.mark.parametrize("prefix", ["default_policy/", ""])
def test_free_log_std_converts_with_or_without_a_prefix(prefix):
    w = fcnet(sizes=(6, 16, 2), prefix=prefix, log_std=[-0.5, 0.25])
    model = pp.convert(w, activation="tanh", head="diag-gaussian")
    assert [o.name for o in model.graph.output] == ["logits", "action", "log_std"]
    weights = pp.extract_weights(model)
    assert list(weights) == list(w) and weights[f"{prefix}log_std"].tobytes() == w[f"{prefix}log_std"].tobytes()
    out = pp.load(model).run({"obs": obs_for(w)})
    np.testing.assert_array_equal(out["log_std"], np.tile(np.float32([-0.5, 0.25]), (32, 1)))


def test_value_branch_only_with_keep_value():
    w = fcnet(sizes=(6, 16, 4), value=(6, 8, 1))
    assert [o.name for o in pp.convert(w, activation="tanh").graph.output] == ["logits"]
    model = pp.convert(w, activation="tanh", keep_value=True)
    assert [o.name for o in model.graph.output] == ["logits", "value"]
    obs = obs_for(w)
    p = "default_policy/"
    v = np.tanh(obs @ w[p + "fc_value_1/kernel"] + w[p + "fc_value_1/bias"]) @ w[p + "value_out/kernel"] + w[p + "value_out/bias"]
    for out in run_both(model, obs).values():
        assert np.abs(out["value"] - v).max() <= 1e-5
    assert set(pp.extract_weights(model)) == set(w)


def test_shared_value_layers_read_the_last_policy_hidden_layer():
    w = fcnet(sizes=(6, 16, 4))
    w["default_policy/value_out/kernel"] = np.ones((16, 1), np.float32)
    w["default_policy/value_out/bias"] = np.zeros(1, np.float32)
    model = pp.convert(w, activation="tanh", keep_value=True)
    obs = obs_for(w)
    p = "default_policy/"
    hidden = np.tanh(obs @ w[p + "fc_1/kernel"] + w[p + "fc_1/bias"])
    out = pp.load(model).run(obs)
    assert np.abs(out["value"][:, 0] - hidden.sum(axis=1)).max() <= 1e-5


def test_categorical_head_is_argmax_as_int64():
    w = fcnet(sizes=(6, 16, 5))
    obs = obs_for(w, n=100)
    model = pp.convert(w, activation="tanh", head="categorical")
    for out in run_both(model, obs).values():
        assert out["action"].dtype == np.int64 and out["action"].shape == (100,)
        np.testing.assert_array_equal(out["action"], np.argmax(forward(w, obs), axis=1))


def test_float64_weights_give_a_float64_model():
    w = fcnet(dtype=np.float64)
    obs = obs_for(w, dtype=np.float64)
    model = pp.convert(w, activation="tanh")
    for out in run_both(model, obs).values():
        assert out["logits"].dtype == np.float64
        assert np.abs(out["logits"] - forward(w, obs)).max() <= 1e-12


@pytest.mark.parametrize("mutate, message", [
    (lambda w: w.update({"default_policy/extra/thing": np.zeros(3, np.float32), "optimizer/beta": np.zeros(1, np.float32)}),
     "cannot place 2 array(s)"),
    (lambda w: w.update({"default_policy/fc_4/kernel": np.zeros((16, 16), np.float32)}), "numbered 1..N without gaps"),
    (lambda w: w.pop("default_policy/fc_out/kernel"), "fc_out/kernel"),
    (lambda w: w.update({"default_policy/fc_2/kernel": np.zeros((15, 16), np.float32)}), "do not chain"),
    (lambda w: w.update({"default_policy/fc_1/bias": np.zeros(3, np.float32)}), "expected (16,)"),
    (lambda w: w.update({"other_policy/fc_9/bias": np.zeros(3, np.float32)}), "more than one prefix"),
    (lambda w: w.update({"default_policy/fc_1/kernel": np.zeros((6, 16), np.int32)}), "one float dtype"),
])
def test_unplaceable_weights_raise_a_bad_model_error_naming_them(mutate, message):
    w = fcnet()
    mutate(w)
    with pytest.raises(pp.BadModelError) as e:
        pp.convert(w, activation="tanh")
    assert message in str(e.value)


def test_unplaced_names_are_all_listed():
    w = fcnet()
    w["default_policy/extra/thing"] = np.zeros(3, np.float32)
    w["optimizer/beta"] = np.zeros(1, np.float32)
    with pytest.raises(pp.BadModelError, match=r"default_policy/extra/thing, optimizer/beta"):
        pp.convert(w)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"activation": "sigmoidish"}, pp.OptionError, r"^unknown activation 'sigmoidish'; choose one of tanh, relu"),
    ({"activation": "leaky_relu:abc"}, pp.OptionError, "^leaky_relu slope must be a number, got 'abc'$"),
    ({"activation": "tanh,relu"}, pp.OptionError, (r"^--activation \(activation=\) 'tanh,relu' is a list, one activation "
                                                   r"per parameter-free module, which applies to state-dict sources of a "
                                                   r"plain nn.Sequential; npz sources take one activation name$")),
    ({"head": "beta"}, pp.OptionError, "^unknown head 'beta'"),
    ({"opset": 7, "activation": "tanh"}, pp.OptionError, r"^opset 7 is out of range: policyport builds opset 11 to \d+$"),
    ({"head": "diag-gaussian", "activation": "tanh"}, pp.OptionError,
     r"^--head diag-gaussian splits logits into mean and log_std halves, but there are 3 logits \(an odd number\)"),
])
def test_bad_options_raise(kwargs, error, message):
    w = fcnet(sizes=(6, 8, 3))
    with pytest.raises(error, match=message) as caught:
        pp.convert(w, **kwargs)
    assert caught.value.exit_code == (2 if error is pp.OptionError else 3)


def test_non_finite_weights_are_refused():
    w = fcnet()
    w["default_policy/fc_2/kernel"][3, 4] = np.nan
    with pytest.raises(pp.BadModelError, match=r"non-finite values .* default_policy/fc_2/kernel"):
        pp.convert(w)


def test_one_missing_bias_looks_truncated():
    w = fcnet()
    del w["default_policy/fc_2/bias"]
    with pytest.raises(pp.BadModelError, match=r"fc_2 have no bias while fc_1, fc_out do"):
        pp.convert(w)


def test_layers_without_any_bias_are_fine():
    w = {k: v for k, v in fcnet().items() if not k.endswith("bias")}
    model = pp.convert(w, activation="tanh")
    obs = obs_for(w)
    p = "default_policy/"
    expected = np.tanh(np.tanh(obs @ w[p + "fc_1/kernel"]) @ w[p + "fc_2/kernel"]) @ w[p + "fc_out/kernel"]
    assert np.abs(pp.load(model).run(obs)["logits"] - expected).max() <= 1e-5


def _without(w, *names):
    return {k: v for k, v in w.items() if k not in names}


P = "default_policy/"
REFUSALS = {
    "same-parameter": (lambda w: {**w, P + "fc_1/kernel:0": w[P + "fc_1/kernel"]},
                       "'default_policy/fc_1/kernel:0' and 'default_policy/fc_1/kernel' are the same parameter fc_1/kernel"),
    "same-log-std": (lambda w: {**w, P + "log_std": np.zeros(4, np.float32), P + "log_std:0": np.zeros(4, np.float32)},
                     "'default_policy/log_std:0' and 'default_policy/log_std' are the same parameter log_std/"),
    "no-output": (lambda w: _without(w, P + "fc_out/kernel", P + "fc_out/bias", P + "fc_2/bias"),
                  "no output layer: expected an array named <prefix>fc_out/kernel; found default_policy/fc_1/bias, "
                  "default_policy/fc_1/kernel, default_policy/fc_2/kernel"),
    "nothing": (lambda w: {}, "no output layer: expected an array named <prefix>fc_out/kernel; found no arrays"),
    "mixed-floats": (lambda w: {**w, P + "fc_1/bias": w[P + "fc_1/bias"].astype(np.float64)},
                     "the weights are float32 (default_policy/fc_1/kernel, default_policy/fc_2/kernel, "
                     "default_policy/fc_2/bias … and 2 more) and float64 (default_policy/fc_1/bias): a policy's "
                     "parameters share one float dtype, which the model computes in; cast them to one (np.savez(path, "
                     "**{k: v.astype(np.float32) for k, v in weights.items()})) and save that"),
    "integers": (lambda w: {k: v.astype(np.int32) for k, v in w.items()},
                 "the weights are int32 (default_policy/fc_1/kernel, default_policy/fc_1/bias, "
                 "default_policy/fc_2/kernel … and 3 more): a policy's weights are floating point; integer ones are a "
                 "quantized model's (whose scales these arrays do not hold) or no policy's; save the float weights the "
                 "policy computes with"),
    "bias-no-kernel": (lambda w: _without(w, P + "fc_1/kernel"), "layer 'fc_1' has a bias but no kernel"),
    "kernel-rank": (lambda w: {**w, P + "fc_1/kernel": w[P + "fc_1/kernel"][..., None]},
                    "default_policy/fc_1/kernel must be a 2-D kernel [in, out], got shape (6, 16, 1)"),
    "truncated": (lambda w: _without(w, P + "fc_1/bias", P + "fc_2/bias"),
                  "layer(s) fc_1, fc_2 have no bias while fc_out do; RLlib's layers all carry one — is the file "
                  "truncated?"),
    "log-std-rank": (lambda w: {**w, P + "log_std": np.zeros((1, 4), np.float32)},
                     "default_policy/log_std must be a vector, got shape (1, 4)"),
}


@pytest.mark.parametrize("change, message", REFUSALS.values(), ids=REFUSALS)
def test_each_refusal_says_exactly_what_is_wrong(change, message):
    from policyport.converter.sources.rllib_weights import parse_rllib_fcnet

    with pytest.raises(pp.BadModelError) as caught:
        parse_rllib_fcnet(change(fcnet()), parse_activation("tanh"))
    assert str(caught.value) == message


def test_a_value_layer_is_found_by_its_kernel_or_its_bias():
    from policyport.converter.sources.rllib_weights import parse_rllib_fcnet

    unbiased = {k: v for k, v in fcnet(sizes=(6, 8, 4), value=(6, 5, 1)).items() if not k.endswith("bias")}
    spec = parse_rllib_fcnet(unbiased, None, keep_value=True)
    assert spec.value_output.weight_name == P + "value_out/kernel" and spec.value_output.bias is None
    assert [d.name for d in spec.value_hidden] == ["fc_value_1"]
    bias_only = _without(fcnet(sizes=(6, 8, 4), value=(6, 5, 1)), P + "value_out/kernel")
    with pytest.raises(pp.BadModelError, match=r"^layer 'value_out' has a bias but no kernel$"):
        parse_rllib_fcnet(bias_only, None, keep_value=True)
    without_value = parse_rllib_fcnet(fcnet(sizes=(6, 8, 4), value=(6, 5, 1)), None)
    assert without_value.value_hidden == [] and without_value.value_output is None


def test_provenance_names_the_file_and_its_digest(tmp_path):
    import hashlib

    from policyport.converter.sources.rllib_weights import parse_rllib_fcnet, read_weights

    w = fcnet(sizes=(6, 8, 4))
    assert read_weights(w)[1] == {"kind": "npz"} and parse_rllib_fcnet(w, None).source == {"kind": "npz"}
    path = tmp_path / "weights.npz"
    np.savez(path, **w)
    arrays, provenance = read_weights(path)
    assert provenance == {"kind": "npz", "file": "weights.npz", "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    assert list(arrays) == list(w) and all(arrays[k].tobytes() == w[k].tobytes() for k in w)
    assert parse_rllib_fcnet(arrays, None, source=provenance).source is provenance
    unnamed = ("does not record the activation after its hidden layers (fc_1); name it with --activation NAME "
               "(activation= in Python): RLlib's fcnet_activation defaults to tanh, but relu, elu and others are as "
               "common, and a wrong one converts to another policy that still passes a check against the same "
               "reconstruction")
    for source, what in ((path, "an .npz of weights"), (w, "a dict of weights")):  # no activation is taken by default
        with pytest.raises(pp.OptionError) as caught:
            pp.convert(source)
        assert str(caught.value) == f"{what} {unnamed}" and caught.value.exit_code == 2
    metadata = {p.key: p.value for p in pp.convert(path, activation="tanh").metadata_props}
    assert json.loads(metadata["policyport.source"]) == provenance and metadata["policyport.activation"] == "tanh"
    assert {p.key: p.value for p in pp.convert(w, activation="relu").metadata_props}["policyport.activation"] == "relu"
    single = tmp_path / "one.npy"
    np.save(single, np.zeros(3, np.float32))
    with pytest.raises(pp.BadModelError, match=rf"^{single} is a single \.npy array; a policy's weights must be an "
                                               r"\.npz of named arrays$"):
        read_weights(single)


def test_an_observation_normalisation_file_is_refused_for_weights():
    from policyport.converter import ConvertOptions
    from policyport.converter.sources.rllib_weights import convert_npz

    with pytest.raises(pp.BadModelError, match=r"^an observation-normalisation file applies to SB3 sources, not to an "
                                               r"\.npz of weights$"):
        convert_npz(fcnet(), ConvertOptions(obs_norm="vecnormalize.pkl"))


@pytest.mark.parametrize("prefix", ["default_policy/", ""])
@pytest.mark.parametrize("verify", ["--verify", "--no-verify"])
def test_a_free_log_std_narrower_than_the_output_layer_is_refused_naming_both(tmp_path, metadrive_weights, prefix, verify):
    from typer.testing import CliRunner

    from policyport.cli import app

    arrays = {name.replace("default_policy/", prefix): a for name, a in metadrive_weights.items()}
    arrays[f"{prefix}log_std"] = np.zeros(2, np.float32)  # fc_out outputs 4
    src, out = tmp_path / "policy.npz", tmp_path / "m.onnx"
    np.savez(src, **arrays)
    message = (f"{prefix}log_std has 2 entries, but 'fc_out' outputs 4: a free log_std holds one entry per action "
               "dimension, as many as the means it follows in logits (a diag-gaussian policy with 4 means needs a "
               "log_std of 4); are the weights of two different policies?")
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(src, activation="tanh")
    assert str(caught.value) == message
    result = CliRunner().invoke(app, ["convert", str(src), "-o", str(out), "--activation", "tanh", verify])
    assert result.exit_code == 3 and message in " ".join(result.stderr.split()) and not out.exists()
    arrays[f"{prefix}log_std"] = np.zeros(4, np.float32)  # as wide as fc_out: the means' log_std
    assert [o.name for o in convert_source(arrays, activation="tanh", head="diag-gaussian").model.graph.output] == [
        "logits", "action", "log_std"]


@pytest.mark.parametrize("names, hint", [
    (["_hidden_layers.0._model.0.weight", "_hidden_layers.0._model.0.bias", "_logits._model.0.weight", "_logits._model.0.bias"],
     "; the names are those of an RLlib torch model's state_dict: convert with --from rllib-torch (kind='rllib-torch' in Python)"),
    (["0.weight", "0.bias", "2.weight", "2.bias"],
     "; the names are those of a torch state_dict: convert with --from state-dict (kind='state-dict' in Python)"),
    (["policy/w", "policy/b"], ""),
])
def test_arrays_named_in_a_torch_layout_are_sent_to_the_kind_that_reads_them(tmp_path, names, hint):
    from typer.testing import CliRunner

    from policyport.cli import app

    path = tmp_path / "weights.npz"
    np.savez(path, **{name: np.ones((2, 2) if name.endswith("weight") else 2, np.float32) for name in names})
    result = CliRunner().invoke(app, ["convert", str(path), "-o", str(tmp_path / "m.onnx")])
    assert result.exit_code == 3
    assert result.stderr == (f"error: cannot place {len(names)} array(s) in RLlib's FullyConnectedNetwork layout (expected "
                             "[prefix/]fc_<i>/kernel|bias, fc_out/..., fc_value_<i>/..., value_out/..., log_std): "
                             f"{', '.join(sorted(names))}{hint}\n")
