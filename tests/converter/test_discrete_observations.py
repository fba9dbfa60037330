"""Discrete and MultiDiscrete observations: the graph takes int64 indices and one-hot encodes them;
the converter records their valid range so that convert, verify and pack draw integers in it with
their default options; an integer input whose range is unknown is drawn from --low/--high, or
refused with the advice that fits the command."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from torch_fixtures import ROOT, SB3_DIR
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.cli.options import drawing_advice
from policyport.converter import convert_source

runner = CliRunner()
RAY = ROOT / "fixtures" / "rllib" / "ray"


@pytest.fixture(scope="module")
def box_model():
    """The checkpoint the Discrete ones were copied from, converted with its Box(4) observation: its
    logits are checked against Ray's own forward pass in test_rllib."""
    return convert_source(RAY / "ppo_old_torch").model


@pytest.mark.parametrize("name, nvec", [("ppo_old_torch_discrete", (4,)), ("ppo_old_torch_multidiscrete", (2, 2))])
def test_a_discrete_rllib_checkpoint_converts_verifies_and_packs_with_default_options(tmp_path, box_model, name, nvec):
    source, out, folder = RAY / name, tmp_path / "policy.onnx", tmp_path / "packed"
    result = runner.invoke(app, ["convert", str(source), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["verification"]["passed"] and doc["verification"]["samples"] == 1000
    assert any(c["reference"] == "source" and c["tensor"] == "obs_preprocessor/one_hot"
               for c in doc["verification"]["comparisons"])
    model = onnx.load(out)
    ranges = json.loads({p.key: p.value for p in model.metadata_props}["policyport.input_ranges"])
    assert ranges == {"obs": {"low": 0, "high": nvec[0] if len(nvec) == 1 else list(nvec)}}
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.INT64

    result = runner.invoke(app, ["verify", str(out), "--source", str(source), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["passed"]
    result = runner.invoke(app, ["pack", str(out), "-o", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    with np.load(folder / "golden.npz") as golden:
        drawn = golden["inputs/obs"]
    assert drawn.dtype == np.int64 and drawn.min() == 0
    assert (drawn.max(axis=0) == np.array(nvec) - 1).all()  # every index of every sub-space, none beyond

    # an independent forward pass: the Box policy on the one-hot rows the indices stand for
    indices = np.random.default_rng(5).integers(0, nvec, size=(200, len(nvec)))
    feed = indices[:, 0] if len(nvec) == 1 else indices
    one_hot = np.concatenate([np.eye(n, dtype=np.float32)[indices[:, i]] for i, n in enumerate(nvec)], axis=1)
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(str(out), backend=backend).run({"obs": feed})
        want = pp.load(box_model, backend=backend).run({"obs": one_hot})
        assert np.array_equal(got["logits"], want["logits"]) and np.array_equal(got["action"], want["action"])


def test_convert_checks_on_the_observations_given_with_i(tmp_path):
    source, out = RAY / "ppo_old_torch_discrete", tmp_path / "policy.onnx"
    np.save(tmp_path / "obs.npy", np.array([3, 0, 2, 1, 1], np.int64))
    result = runner.invoke(app, ["convert", str(source), "-o", str(out), "-i", str(tmp_path / "obs.npy"),
                                 "--samples", "3", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)["verification"]
    assert report["passed"] and report["samples"] == 3
    assert report["notes"] == ["using the first 3 of the 5 observations given"]
    for extra, message in ((["--low", "2"], "-i gives the observations, so --low (which shape random draws) do not apply"),
                           (["--no-verify"], "--no-verify skips the check against the source that -i would shape")):
        result = runner.invoke(app, ["convert", str(source), "-o", str(out), "--force", "-i", str(tmp_path / "obs.npy"),
                                     *extra])
        assert result.exit_code == 2 and message in " ".join(result.stderr.split()), result.output


@pytest.mark.slow
@pytest.mark.parametrize("name, algo, nvec", [("ppo_discrete_obs", "PPO", (16,)), ("a2c_multidiscrete_obs", "A2C", (3, 5))])
def test_a_discrete_sb3_observation_is_one_hot_encoded_as_sb3_does(name, algo, nvec):
    sb3 = pytest.importorskip("stable_baselines3")
    torch = pytest.importorskip("torch")
    c = convert_source(SB3_DIR / f"{name}.zip")
    assert any("one-hot encodes them, as SB3's preprocess_obs does" in n for n in c.notes)
    indices = np.random.default_rng(1).integers(0, nvec, size=(500, len(nvec)))
    obs = indices[:, 0] if len(nvec) == 1 else indices
    agent = getattr(sb3, algo).load(SB3_DIR / f"{name}.zip", device="cpu")
    expected_action, _ = agent.predict(obs, deterministic=True)
    with torch.no_grad():
        expected_logits = agent.policy.get_distribution(agent.policy.obs_to_tensor(obs)[0]).distribution.logits.numpy()
    for backend in ("numpy", "onnxruntime"):
        out = pp.load(c.model, backend=backend).run({"obs": obs})
        assert np.array_equal(out["action"], expected_action)
        # SB3's Categorical normalises its logits (minus logsumexp); the graph's are the raw ones
        np.testing.assert_allclose(out["logits"] - np.log(np.exp(out["logits"]).sum(1, keepdims=True)),
                                   expected_logits, rtol=1e-5, atol=1e-5)
    assert pp.verify(c.model, reference=c.reference).passed


def _integer_input_model(path=None):
    """``y = Cast(ids)``: an int64 input ``(batch, 2)`` with no recorded range (saved at ``path`` if given)."""
    graph = helper.make_graph([helper.make_node("Cast", ["ids"], ["y"], to=TensorProto.FLOAT)], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if path is None:
        return model
    onnx.save(model, path)
    return path


SUBJECT = ("error: cannot draw samples for input 'ids' (int64, shape ('batch', 2)): the model does not record the "
           "integers it takes, and [0, 1) holds only one integer (0); ")
SPAN = "--low/--high spanning the integers it takes (e.g. --low 0 --high 10)"


@pytest.mark.parametrize("command, advice", [
    (["verify"], f"give its observations with -i OBS.npz (an .npy for a single-input model), or {SPAN}"),
    (["pack", "-o", "{tmp}/packed"], f"give its observations with -i OBS.npz (an .npy for a single-input model), or {SPAN}"),
    (["export-numpy", "-o", "{tmp}/policy.py"], f"give {SPAN}"),
])
def test_an_integer_input_of_unknown_range_is_refused_with_the_advice_of_each_command(tmp_path, command, advice):
    model = _integer_input_model(tmp_path / "ids.onnx")
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    result = runner.invoke(app, [args[0], str(model), *args[1:]])
    assert result.exit_code == 3 and " ".join(result.stderr.split()) == SUBJECT + advice
    assert not (tmp_path / "packed").exists() and not (tmp_path / "policy.py").exists()
    result = runner.invoke(app, [args[0], str(model), *args[1:], "--low", "-2", "--high", "3", "--json"])
    assert result.exit_code == 0, result.output


def test_convert_advises_i_or_a_range_for_its_pre_write_check():
    with pytest.raises(pp.UndrawableInputError) as caught, drawing_advice("convert", takes_inputs=True):
        pp.verify(_integer_input_model(), backends=["numpy", "onnxruntime"])
    assert str(caught.value).endswith(f"; give its observations with -i OBS.npz (an .npy for a single-input model), or {SPAN}")
    assert caught.value.exit_code == 3


def test_pack_records_the_golden_observations_given_with_i(tmp_path):
    model = _integer_input_model(tmp_path / "ids.onnx")
    ids = np.array([[1, 2], [3, 4], [5, -6]], np.int64)
    np.save(tmp_path / "ids.npy", ids)
    folder = tmp_path / "packed"
    result = runner.invoke(app, ["pack", str(model), "-o", str(folder), "-i", str(tmp_path / "ids.npy"), "--samples", "2",
                                 "--json"])
    assert result.exit_code == 0, result.output
    golden = json.loads(result.stdout)["policy"]["golden"]
    assert (golden["samples"], golden["low"], golden["high"], golden["seed"]) == (2, None, None, None)
    assert golden["distribution"] == "given to pack (-i, inputs=)"
    with np.load(folder / "golden.npz") as saved:
        assert np.array_equal(saved["inputs/ids"], ids[:2]) and np.array_equal(saved["outputs/y"], ids[:2].astype(np.float32))
    result = runner.invoke(app, ["verify", str(folder)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["pack", str(model), "-o", str(tmp_path / "other"), "-i", str(tmp_path / "ids.npy"),
                                 "--seed", "3"])
    assert result.exit_code == 2 and "-i gives the golden observations, so --seed" in " ".join(result.stderr.split())
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize("name, space", [("ppo_discrete_obs", "Discrete(16)"), ("a2c_multidiscrete_obs", "MultiDiscrete[3, 5]")])
def test_an_sb3_discrete_observation_space_is_named_in_the_note_and_in_the_vecnormalize_refusal(tmp_path, name, space):
    c = convert_source(SB3_DIR / f"{name}.zip")
    assert c.notes[-1] == (f"observation space {space}: the graph takes int64 indices and one-hot encodes them, "
                           "as SB3's preprocess_obs does")
    norm = SB3_DIR / "ppo_pendulum_vecnorm" / "vecnormalize.pkl"
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(SB3_DIR / f"{name}.zip", obs_norm=str(norm))
    assert str(caught.value) == (f"{norm} normalises Box observations; this policy's observation space is {space}")
