"""verify against the source: the source's forward pass is rebuilt with what the model records (the
convert options, or the older head/activation keys), under the kind convert recorded when the file's
name does not tell it; a source that does not fit is named as such."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

import policyport as pp
from policyport.converter import OPTIONS_KEY, UnknownKindError, convert_source
from policyport.errors import BadModelError

OBS = np.random.default_rng(5).uniform(0, 1, (6, 275)).astype(np.float32)


def _props(model) -> dict:
    return {p.key: p.value for p in model.metadata_props}


def _set_props(model, values: dict) -> None:
    kept = [(p.key, p.value) for p in model.metadata_props if p.key not in values]
    del model.metadata_props[:]
    for key, value in [*kept, *((k, v) for k, v in values.items() if v is not None)]:
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value


@pytest.fixture(scope="module")
def relu_gaussian(metadrive_path):
    return convert_source(metadrive_path, activation="relu", head="diag-gaussian", keep_value=False).model


def _source_pairs(report) -> set[tuple[str, str]]:
    return {(c.tensor, c.candidate) for c in report.comparisons if c.reference == "source"}


def test_the_recorded_options_rebuild_the_source_forward_pass(relu_gaussian, metadrive_path):
    report = pp.verify(relu_gaussian, OBS, source=metadrive_path)
    assert report.passed and report.reference == "source"
    tensors = {t for t, _ in _source_pairs(report)}
    assert {"fc_1/relu", "fc_2/relu", "logits", "action", "log_std"} <= tensors
    assert {c for _, c in _source_pairs(report)} == {"numpy", "onnxruntime"}


def test_models_that_predate_the_options_key_use_the_head_and_activation_keys(relu_gaussian, metadrive_path):
    old = type(relu_gaussian)()
    old.CopyFrom(relu_gaussian)
    _set_props(old, {OPTIONS_KEY: None, "policyport.head": "diag-gaussian", "policyport.activation": "relu"})
    assert OPTIONS_KEY not in _props(old)
    report = pp.verify(old, OBS, source=metadrive_path)
    assert report.passed and {"fc_1/relu", "action", "log_std"} <= {t for t, _ in _source_pairs(report)}
    _set_props(old, {"policyport.head": "none", "policyport.activation": "tanh"})  # what it records now is wrong
    wrong = pp.verify(old, OBS, source=metadrive_path)  # a tanh source
    assert not wrong.passed and wrong.first_divergence.tensor == "fc_2/linear"  # the first layer after the activation


def test_a_value_output_in_an_old_model_asks_the_source_for_the_value_branch(tmp_path):
    rng = np.random.default_rng(1)
    arrays = {"fc_1/kernel": rng.normal(size=(3, 4)).astype(np.float32), "fc_1/bias": np.zeros(4, np.float32),
              "fc_out/kernel": rng.normal(size=(4, 2)).astype(np.float32), "fc_out/bias": np.zeros(2, np.float32),
              "fc_value_1/kernel": rng.normal(size=(3, 4)).astype(np.float32), "fc_value_1/bias": np.zeros(4, np.float32),
              "value_out/kernel": rng.normal(size=(4, 1)).astype(np.float32), "value_out/bias": np.zeros(1, np.float32)}
    src = tmp_path / "w.npz"
    np.savez(src, **arrays)
    model = convert_source(src, keep_value=True, activation="tanh").model
    _set_props(model, {OPTIONS_KEY: None})
    report = pp.verify(model, rng.uniform(0, 1, (4, 3)).astype(np.float32), source=src)
    assert report.passed and ("value", "numpy") in _source_pairs(report)


def test_a_source_named_unlike_its_kind_is_read_as_the_kind_convert_recorded(relu_gaussian, metadrive_path, tmp_path):
    renamed = tmp_path / "weights.bin"
    shutil.copy(metadrive_path, renamed)
    assert _props(relu_gaussian)["policyport.source_kind"] == "npz"
    report = pp.verify(relu_gaussian, OBS, source=renamed)
    assert report.passed and ("fc_1/relu", "numpy") in _source_pairs(report)
    live = type(relu_gaussian)()
    live.CopyFrom(relu_gaussian)
    _set_props(live, {"policyport.source_kind": "torch"})  # a live module: no file kind to fall back to
    with pytest.raises(BadModelError, match="cannot rebuild the source's forward pass for verification: cannot "
                                            "tell what kind of policy the file") as caught:
        pp.verify(live, OBS, source=renamed)
    assert isinstance(caught.value.__cause__, UnknownKindError)


def test_a_source_that_does_not_fit_is_named_as_the_source(relu_gaussian, tmp_path):
    other = tmp_path / "other.npz"
    np.savez(other, **{"fc_1/kernel": np.zeros((275, 8), np.float32), "fc_1/bias": np.zeros(8, np.float32),
                       "fc_out/kernel": np.zeros((8, 4), np.float32), "fc_out/bias": np.zeros(4, np.float32)})
    report = pp.verify(relu_gaussian, OBS, source=other)
    assert not report.passed and report.first_divergence.reference == "source"
    with pytest.raises(BadModelError, match=r"^cannot rebuild the source's forward pass for verification: "):
        pp.verify(relu_gaussian, OBS, source=_observation_file(tmp_path))


def _observation_file(folder):
    """A file of observations, where a source belongs."""
    path = folder / "obs.npy"
    np.save(path, OBS)
    return path


def test_a_source_of_another_kind_that_records_no_activation_is_rebuilt_with_the_models(tmp_path):
    """The policy.pth inside an SB3 zip is a state_dict: verified against it, a model converted from the
    zip with the value branch asks it for the value branch too. The state_dict records no activation, so
    it is rebuilt with the one the model was built with (its policyport.activation, the zip's relu), and
    the report says the source side assumes it for that reason."""
    zip_path = Path(__file__).resolve().parents[1] / "fixtures" / "sb3" / "ppo_pendulum.zip"
    with zipfile.ZipFile(zip_path) as zf:
        (tmp_path / "policy.pth").write_bytes(zf.read("policy.pth"))
    model = convert_source(zip_path, keep_value=True).model
    assert {p.key: p.value for p in model.metadata_props}["policyport.activation"] == "relu"
    obs = np.random.default_rng(0).uniform(-1, 1, (8, 3)).astype(np.float32)
    report = pp.verify(model, obs, backends=("numpy",), source=tmp_path / "policy.pth")
    assert report.passed and any(c.tensor == "value" and c.reference == "source" for c in report.comparisons)
    activation = next(a for a in report.assumptions if a["topic"] == "activation")
    assert activation["assumes"] == ("relu at modules mlp_extractor.policy_net.1, mlp_extractor.policy_net.3, "
                                     "mlp_extractor.value_net.1 and mlp_extractor.value_net.3")
    assert activation["because"].startswith("the model's own (relu, its policyport.activation), since the source does "
                                            "not record it; a state_dict does not record it")
    assert not activation["checked"] and not report.source_oracle["framework"]


def test_a_torch_source_that_cannot_tell_its_observation_shape_takes_the_models(tmp_path):
    """The TorchScript module starts with Flatten, so only the model can tell the shape it is fed; a model
    that records no input shape (converted before the options were recorded) gives its own, (batch, 6)."""
    import json

    import onnx
    from typer.testing import CliRunner

    from policyport.cli import app

    pytest.importorskip("torch")
    source = Path(__file__).resolve().parents[1] / "fixtures" / "torch" / "activations.torchscript.pt"
    model = convert_source(source, input_shape=(6,), trust=True).model
    _set_props(model, {OPTIONS_KEY: None, "policyport.source_kind": None})
    onnx.save(model, tmp_path / "m.onnx")
    np.save(tmp_path / "obs6.npy", np.random.default_rng(1).normal(0, 1.5, (16, 6)).astype(np.float32))
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "m.onnx"), "--source", str(source), "--trust",
                                      "-i", str(tmp_path / "obs6.npy"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    source_checked = {c["tensor"] for c in doc["comparisons"] if c["reference"] == "source" and c["passed"]}
    assert doc["passed"] and {"0/flatten", "1/linear", "18/hardswish", "logits"} <= source_checked


def test_the_observation_shape_comes_from_one_graph_input_with_every_axis_but_the_batch_fixed():
    from onnx import TensorProto, helper

    from policyport.verification.verify import _observation_shape

    def model(*shapes):
        inputs = [helper.make_tensor_value_info(f"in{i}", TensorProto.FLOAT, s) for i, s in enumerate(shapes)]
        out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
        return helper.make_model(helper.make_graph([helper.make_node("Identity", ["in0"], ["out"])], "g", inputs, [out]))

    assert _observation_shape(model(["batch", 2, 3])) == (2, 3)
    assert _observation_shape(model([1, 6])) == (6,)
    assert _observation_shape(model(["batch", "features"])) is None
    assert _observation_shape(model(["batch"])) is None
    assert _observation_shape(model(["batch", 6], ["batch", 2])) is None



ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_source_that_computes_none_of_the_models_tensors_is_refused():
    """Tensors are compared by name: another Keras model of the same input width names none of the model's
    tensors, so it proves nothing about it, and is refused rather than passed on the backends alone."""
    pytest.importorskip("tensorflow")
    model = convert_source(ROOT / "fixtures" / "keras" / "mlp_norm.keras").model
    with pytest.raises(BadModelError) as caught:
        pp.verify(model, samples=20, source=ROOT / "fixtures" / "keras" / "three_heads.keras")
    assert str(caught.value) == (
        "the source does not fit the model: it computes none of the model's tensors (the model's: 'fc_1/MatMul', "
        "'fc_1/BiasAdd', 'fc_1', 'bn', 'fc_2/MatMul' … and 6 more; the source's: 'trunk_1', 'trunk_2', 'gear', "
        "'brake', 'steer')")


def test_a_reference_naming_none_of_the_models_tensors_is_refused_and_one_naming_some_is_noted(tmp_path):
    rng = np.random.default_rng(4)
    arrays = {"fc_1/kernel": rng.normal(size=(3, 4)).astype(np.float32), "fc_1/bias": np.zeros(4, np.float32),
              "fc_out/kernel": rng.normal(size=(4, 2)).astype(np.float32), "fc_out/bias": np.zeros(2, np.float32)}
    np.savez(tmp_path / "w.npz", **arrays)
    model = convert_source(tmp_path / "w.npz", activation="tanh").model
    obs = OBS[:, :3]
    hidden = np.tanh(obs @ arrays["fc_1/kernel"])
    with pytest.raises(BadModelError, match=r"^the source does not fit the model: it computes none of the model's "
                                            r"tensors \(the model's: 'fc_1/linear', 'fc_1/tanh', 'logits'; the "
                                            r"source's: 'hidden'\)$"):
        pp.verify(model, obs, reference=lambda x: {"hidden": hidden})
    with pytest.raises(BadModelError, match=r"the source's: none\)$"):
        pp.verify(model, obs, reference=lambda x: {})
    report = pp.verify(model, obs, reference=lambda x: {"fc_1/tanh": hidden, "logits": hidden @ arrays["fc_out/kernel"]})
    assert report.passed and {t for t, _ in _source_pairs(report)} == {"fc_1/tanh", "logits"}
    assert report.notes == ["the source computes 2 of the model's 3 compared tensors; not compared with it: 'fc_1/linear'"]


CARTPOLE = ROOT / "fixtures" / "real" / "sb3_ppo_cartpole.zip"


def _verify_cli(model, *args):
    from typer.testing import CliRunner

    from policyport.cli import app

    return CliRunner().invoke(app, ["verify", str(model), "--samples", "20", *map(str, args)])


def test_a_source_whose_forward_pass_fails_does_not_fit_the_model(relu_gaussian, tmp_path):
    """Whatever the framework raises when the source's forward pass cannot take the model's observations
    (SB3's ValueError, torch's RuntimeError, tf's TypeError with the tensors it was given ...) is a source
    that does not fit: exit 3 with the first line of the framework's message, the tensors it prints left out."""
    import onnx

    pytest.importorskip("torch")
    with pytest.raises(BadModelError) as caught:
        pp.verify(relu_gaussian, OBS, source=CARTPOLE)
    assert str(caught.value) == ("the source does not fit the model: its forward pass fails on the model's inputs "
                                 "(6, 275) (Error: Unexpected observation shape (6, 275) for Box environment, please "
                                 "use (4,) or (n_env, 4) for the observation shape.)")  # SB3's own predict refuses it

    def binding(obs):
        raise TypeError("Binding inputs to tf.function failed due to `Can not cast TensorSpec(shape=(6, 275)) to "
                        "TensorSpec(shape=(None, 6))`. Received args: (<tf.Tensor: shape=(6, 275), numpy=\n"
                        "array([[0.63, 0.26],\n       [0.98, 0.84]]))")

    with pytest.raises(BadModelError, match=r"\(6, 275\) \(Binding inputs to tf.function failed due to `Can not cast "
                                            r"TensorSpec\(shape=\(6, 275\)\) to TensorSpec\(shape=\(None, 6\)\)`.\)$"):
        pp.verify(relu_gaussian, OBS, reference=binding)
    with pytest.raises(BadModelError, match=r"\(6, 275\) \(RuntimeError\)$"):
        pp.verify(relu_gaussian, OBS, reference=lambda obs: (_ for _ in ()).throw(RuntimeError()))
    cartpole = tmp_path / "cart.onnx"
    onnx.save(convert_source(CARTPOLE).model, cartpole)
    result = _verify_cli(cartpole, "--source", ROOT / "fixtures" / "sb3" / "ppo_pendulum.zip")
    assert result.exit_code == 3, result.output
    assert result.stderr == ("error: the source does not fit the model: its forward pass fails on the model's inputs "
                             "(20, 4) (Error: Unexpected observation shape (20, 4) for Box environment, please use (3,) "
                             "or (n_env, 3) for the observation shape.)\n")


def test_an_option_the_model_records_that_the_source_cannot_take_is_the_sources_misfit(tmp_path, metadrive_path):
    """The model was converted with --keep-value; weights with no value branch do not fit it (exit 3), and
    the message says the option comes from the conversion, not from the command being run."""
    import onnx

    model = tmp_path / "cart.onnx"
    onnx.save(convert_source(CARTPOLE, keep_value=True).model, model)
    with pytest.raises(BadModelError, match=r"^the source does not fit the model: it was converted with --keep-value, "
                                            r"and a value branch was asked for \(--keep-value\), but the weights hold "
                                            r"no value_out layer$"):
        pp.verify(model, samples=5, source=metadrive_path)
    result = _verify_cli(model, "--source", metadrive_path)
    assert result.exit_code == 3 and result.stderr.startswith(
        "error: the source does not fit the model: it was converted with --keep-value, and ")


@pytest.fixture(scope="module")
def npz_state_dict(tmp_path_factory):
    """An nn.Sequential's state_dict saved as an .npz (converted with --from state-dict: by its name it
    would be RLlib weights), the module as TorchScript under a name that tells no kind, a copy of the
    .npz with one bias changed, observations, and torch's own outputs of the module and of the changed one."""
    torch = pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("npz_state_dict")
    torch.manual_seed(7)
    module = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).eval()
    arrays = {k: v.numpy() for k, v in module.state_dict().items()}
    np.savez(folder / "policy.npz", **arrays)
    torch.jit.save(torch.jit.script(module), str(folder / "policy.bin"))
    obs = np.random.default_rng(2).uniform(-1, 1, (40, 5)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(obs)).numpy()
        module[2].bias += 0.25
        changed = module(torch.from_numpy(obs)).numpy()
    np.savez(folder / "changed.npz", **{**arrays, "2.bias": arrays["2.bias"] + np.float32(0.25)})
    model = convert_source(folder / "policy.npz", kind="state-dict", activation="tanh").model
    np.testing.assert_allclose(pp.load(model).run({"obs": obs})["logits"], expected, atol=1e-5, rtol=1e-5)
    return folder, model, obs, expected, changed


def test_the_file_converted_is_read_as_the_kind_recorded_whatever_its_name_says(npz_state_dict, tmp_path):
    """Its sha256 is the one the model records: it is read as the state_dict it was converted as."""
    import onnx
    from typer.testing import CliRunner

    from policyport.cli import app

    folder, model, obs, _, _ = npz_state_dict
    report = pp.verify(model, obs, source=folder / "policy.npz")
    assert report.passed and ("logits", "numpy") in _source_pairs(report)
    assert not any("is read as" in note for note in report.notes)
    onnx.save(model, tmp_path / "m.onnx")
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "m.onnx"), "--source", str(folder / "policy.npz")])
    assert result.exit_code == 0, result.output
    assert "--from" not in result.output


def test_another_file_its_name_cannot_read_is_read_as_the_kind_recorded_and_a_note_says_so(npz_state_dict):
    folder, model, obs, expected, changed = npz_state_dict
    assert np.abs(changed - expected).max() > 0.2  # torch's own: the changed bias changes the policy
    report = pp.verify(model, obs, source=folder / "changed.npz")
    assert not report.passed and report.first_divergence.reference == "source"
    assert report.notes[0] == (f"{folder / 'changed.npz'} is read as a state-dict source, the kind the model was "
                               "converted from; read as npz, as its name says, it cannot be: cannot place 4 array(s) in "
                               "RLlib's FullyConnectedNetwork layout")


def test_a_file_neither_its_name_nor_the_recorded_kind_reads_is_read_as_its_contents_tell(npz_state_dict):
    """A TorchScript file named policy.bin: its name tells no kind, the recorded state-dict reader
    refuses it, and its contents are a TorchScript file, which torch runs (given trust: without it, the
    refusal says the file is TorchScript and needs it)."""
    folder, model, obs, _, _ = npz_state_dict
    with pytest.raises(pp.TrustRequiredError, match=r"policy\.bin is a TorchScript file \(torch\.jit\.save\), and loading "
                       r"it runs code the file holds"):
        pp.verify(model, obs, source=folder / "policy.bin")
    report = pp.verify(model, obs, source=folder / "policy.bin", trust=True)
    assert report.passed and report.source_oracle["framework"]
    assert report.notes[0].startswith(f"{folder / 'policy.bin'} is read as a torchscript source, which its contents "
                                      "are (a TorchScript file); read as state-dict, the kind the model was converted "
                                      f"from, it cannot be: {folder / 'policy.bin'} is a TorchScript file")
