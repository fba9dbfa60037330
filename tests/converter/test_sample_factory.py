"""Sample Factory checkpoints: the fixtures are made by Sample Factory itself
(``fixtures/sample_factory/make_fixtures.py``), and every expected action and recurrent state is what
Sample Factory's own ``ActorCritic`` returned after loading the saved file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter import convert_source, detect_kind
from policyport.converter.readers.checkpoints import read_checkpoint
from policyport.converter.sources import sample_factory

ROOT = Path(__file__).resolve().parents[2]
SF = ROOT / "fixtures" / "sample_factory"
TRAIN_DIR = SF / "train_dir"


def checkpoint(experiment: str) -> Path:
    return TRAIN_DIR / experiment / "checkpoint_p0" / "checkpoint_000000050_409600.pth"


def expected(experiment: str) -> dict[str, np.ndarray]:
    with np.load(TRAIN_DIR / experiment / "expected.npz") as f:
        return {k: f[k] for k in f.files}


def random_states(rows: int, size: int) -> np.ndarray:
    """make_fixtures.random_states: uniform in [-1, 1), default_rng(5)."""
    return np.random.default_rng(5).uniform(-1.0, 1.0, (rows, size)).astype(np.float32)


@pytest.fixture(scope="module")
def obs() -> np.ndarray:
    return np.load(SF / "observations.npy")


def invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def run(model, backend, feeds):
    np.seterr(all="raise")
    try:
        return pp.load(model, backend).run(feeds)
    finally:
        np.seterr(all="warn")


def test_a_checkpoint_is_told_from_its_keys():
    for experiment in ("gru_elu", "mlp_tanh", "discrete_relu", "lstm_elu", "separate_gru_tanh", "two_layer_gru_relu"):
        assert detect_kind(checkpoint(experiment)) == "sample-factory"
    assert detect_kind(ROOT / "fixtures" / "rl_games" / "ant_elu" / "nn" / "ant_elu.pth") == "rl-games"
    assert detect_kind(ROOT / "fixtures" / "torch" / "gaussian.state_dict.pt") == "state-dict"


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_the_gru_policys_action_and_state_are_sample_factorys_own(backend, obs):
    """Zero states (an episode's start) and random ones: the action (the means), the std and the new state."""
    want = expected("gru_elu")
    model = pp.convert(checkpoint("gru_elu"), head="diag-gaussian")
    assert [i.name for i in model.graph.input] == ["obs", "rnn_state_in"]
    for states, suffix in ((np.zeros((1000, 12), np.float32), ""), (random_states(1000, 12), "_random")):
        out = run(model, backend, {"obs": obs, "rnn_state_in": states})
        assert out["action"].shape == want["action" + suffix].shape == (1000, 6)
        assert np.abs(out["action"] - want["action" + suffix]).max() <= 1e-5
        assert np.abs(out["std"] - want["stddevs" + suffix]).max() <= 1e-5
        assert np.abs(out["rnn_state_out"] - want["new_rnn_states" + suffix]).max() <= 1e-5
    # the state matters: the random states move the action far beyond the tolerance
    assert np.abs(want["action"] - want["action_random"]).max() > 0.1


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_feed_forward_policy_with_a_learned_stddev_and_tanh_scale(backend, obs):
    want = expected("mlp_tanh")
    model = pp.convert(checkpoint("mlp_tanh"))
    assert [i.name for i in model.graph.input] == ["obs"]
    out = run(model, backend, {"obs": obs})
    assert np.abs(out["action"] - want["action"]).max() <= 1e-5
    assert np.abs(out["std"] - want["stddevs"]).max() <= 1e-5
    assert np.abs(out["action"]).max() <= 2.0 and np.abs(out["logits"]).max() > 2.0  # tanh(mu / 2) * 2 bounds it


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_discrete_policys_action_is_the_argmax(backend, obs):
    want = expected("discrete_relu")
    model = pp.convert(checkpoint("discrete_relu"), activation="relu", head="categorical")
    for states, suffix in ((np.zeros((1000, 16), np.float32), ""), (random_states(1000, 16), "_random")):
        out = run(model, backend, {"obs": obs, "rnn_state_in": states})
        assert out["action"].dtype == np.int64 and (out["action"] == want["action" + suffix]).all()
        assert np.abs(out["rnn_state_out"] - want["new_rnn_states" + suffix]).max() <= 1e-5
    assert len(set(want["action"].tolist())) > 1


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_an_lstm_policys_state_is_h_then_c(backend, obs):
    """Sample Factory's LSTM state is [h, c], 2 * rnn_size wide; the action and both halves of the new state."""
    want = expected("lstm_elu")
    model = pp.convert(checkpoint("lstm_elu"), head="categorical")
    assert [d.dim_value for d in model.graph.input[1].type.tensor_type.shape.dim][1:] == [16]
    for states, suffix in ((np.zeros((1000, 16), np.float32), ""), (random_states(1000, 16), "_random")):
        out = run(model, backend, {"obs": obs, "rnn_state_in": states})
        assert (out["action"] == want["action" + suffix]).all()
        assert np.abs(out["rnn_state_out"] - want["new_rnn_states" + suffix]).max() <= 1e-5
    assert (want["action"] != want["action_random"]).any()


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_separate_actor_and_critic_cores_share_the_state(backend, obs):
    """ActorCriticSeparateWeights: the state is the actor core's, then the critic core's; the new state needs both."""
    want = expected("separate_gru_tanh")
    converted = convert_source(checkpoint("separate_gru_tanh"), head="categorical")
    weights = pp.extract_weights(converted.model)
    assert "critic_core.core.weight_hh_l0" in weights and "critic_linear.weight" not in weights
    for states, suffix in ((np.zeros((1000, 16), np.float32), ""), (random_states(1000, 16), "_random")):
        out = run(converted.model, backend, {"obs": obs, "rnn_state_in": states})
        assert (out["action"] == want["action" + suffix]).all()
        assert np.abs(out["rnn_state_out"] - want["new_rnn_states" + suffix]).max() <= 1e-5
    assert (want["action"] != want["action_random"]).any()


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_core_of_two_layers_keeps_each_layers_state_in_turn(backend, obs):
    want = expected("two_layer_gru_relu")
    model = pp.convert(checkpoint("two_layer_gru_relu"), head="categorical")
    assert "core.core.weight_ih_l1" in pp.extract_weights(model)
    for states, suffix in ((np.zeros((1000, 16), np.float32), ""), (random_states(1000, 16), "_random")):
        out = run(model, backend, {"obs": obs, "rnn_state_in": states})
        assert (out["action"] == want["action" + suffix]).all()
        assert np.abs(out["rnn_state_out"] - want["new_rnn_states" + suffix]).max() <= 1e-5
    assert (want["action"] != want["action_random"]).any()


def _means_under(layout, obs, eps_on_var=None, eps_on_std=None, clip=None):
    """mlp_tanh's action under a normaliser of some library's formula, in float64."""
    mean, var = (layout.normalizer[r][1] for r in ("running_mean", "running_var"))
    x = (obs - mean) / (np.sqrt(var + eps_on_var) if eps_on_var is not None else np.sqrt(var) + eps_on_std)
    if clip is not None:
        x = np.clip(x, -clip, clip)
    for _, w, _, b in [*layout.encoder, *layout.decoder]:
        x = np.tanh(x @ w.T.astype(np.float64) + b)
    _, w, _, b = layout.head
    return np.tanh((x @ w.T.astype(np.float64) + b) / 2.0) * 2.0


def test_the_normaliser_is_sample_factorys_and_no_other_librarys(obs, monkeypatch):
    """1e-5 on the variance and a clip at 5 (rl_games' module); each other library's formula moves the action."""
    layout = sample_factory.read_layout(read_checkpoint(checkpoint("mlp_tanh"), "Sample Factory"), "mlp_tanh")
    assert layout.normalizer["running_mean"][1].dtype == np.float64
    want = expected("mlp_tanh")["action"]
    assert np.abs(_means_under(layout, obs, eps_on_var=1e-5, clip=5) - want).max() <= 1e-5
    others = {"rsl_rl": dict(eps_on_std=1e-2), "skrl": dict(eps_on_std=1e-8, clip=5),
              "gymnasium": dict(eps_on_var=1e-8, clip=10), "no clip": dict(eps_on_var=1e-5)}
    for name, formula in others.items():
        assert np.abs(_means_under(layout, obs, **formula) - want).max() > 1e-3, name
    for attribute, value in (("NORMALIZER_CLIP", 10.0), ("NORMALIZER_EPS", 1e-2)):
        with monkeypatch.context() as patched:  # the converter itself with another constant gives another action
            patched.setattr(sample_factory, attribute, value)
            out = pp.load(pp.convert(checkpoint("mlp_tanh"))).run({"obs": obs})
            assert np.abs(out["action"] - want).max() > 1e-3, attribute


def test_obs_subtract_mean_and_obs_scale_come_before_the_statistics(obs, tmp_path):
    """gru_elu's config.json says obs_subtract_mean 0.5, obs_scale 2; without them the action moves."""
    want = expected("gru_elu")["action"]
    feeds = {"obs": obs, "rnn_state_in": np.zeros((1000, 12), np.float32)}
    shutil.copytree(TRAIN_DIR / "gru_elu", tmp_path / "gru_elu")
    config = json.loads((tmp_path / "gru_elu" / "config.json").read_text())
    assert (config["obs_subtract_mean"], config["obs_scale"]) == (0.5, 2.0)
    config.update(obs_subtract_mean=0.0, obs_scale=1.0)
    (tmp_path / "gru_elu" / "config.json").write_text(json.dumps(config))
    moved = pp.load(pp.convert(tmp_path / "gru_elu" / "checkpoint_p0" / checkpoint("gru_elu").name,
                               head="diag-gaussian")).run(feeds)
    assert np.abs(moved["action"] - want).max() > 1e-2


def test_extract_gives_every_array_back_bit_for_bit():
    torch = pytest.importorskip("torch")
    for experiment, options in (("gru_elu", {"head": "diag-gaussian"}), ("mlp_tanh", {}), ("lstm_elu", {"head": "categorical"})):
        saved = torch.load(checkpoint(experiment), weights_only=False)["model"]
        weights = pp.extract_weights(pp.convert(checkpoint(experiment), **options))
        policy = {k: v for k, v in saved.items() if not k.startswith(("critic_", "returns_normalizer"))}
        assert sorted(weights) == sorted(policy)
        for name, tensor in policy.items():
            array = tensor.numpy()
            assert weights[name].dtype == array.dtype and weights[name].shape == array.shape, name
            assert weights[name].tobytes() == array.tobytes(), name
    assert weights["obs_normalizer.running_mean_std.running_mean_std.obs.running_var"].dtype == np.float64
    assert "core.core.weight_hh_l0" in pp.extract_weights(pp.convert(checkpoint("gru_elu"), head="diag-gaussian"))


def test_the_activation_and_head_come_from_the_files_or_must_be_given(tmp_path):
    out = tmp_path / "a.onnx"
    no_activation = invoke("convert", checkpoint("discrete_relu"), "--head", "categorical", "-o", out)
    assert no_activation.exit_code == 2 and "--activation" in no_activation.output
    no_head = invoke("convert", checkpoint("discrete_relu"), "--activation", "relu", "-o", out)
    assert no_head.exit_code == 2 and "--head categorical" in " ".join(no_head.output.split())
    odd = invoke("convert", checkpoint("discrete_relu"), "--activation", "relu", "--head", "diag-gaussian", "-o", out)
    assert odd.exit_code == 2 and "5 values" in " ".join(odd.output.split())
    contradicted = invoke("convert", checkpoint("gru_elu"), "--activation", "relu", "--head", "diag-gaussian", "-o", out)
    assert contradicted.exit_code == 2 and "contradicts" in contradicted.output
    learned = invoke("convert", checkpoint("mlp_tanh"), "--head", "categorical", "-o", out)
    assert learned.exit_code == 2 and "learned_stddev" in learned.output
    assert not out.exists()
    given = convert_source(checkpoint("discrete_relu"), activation="relu", head="categorical")
    assert [a.topic for a in given.assumptions] == ["activation", "head", "observation scaling"]
    assert "given by --activation" in given.assumptions[0].because
    read = convert_source(checkpoint("gru_elu"), head="diag-gaussian")
    assert [a.topic for a in read.assumptions] == ["activation", "head"]
    assert "config.json" in read.assumptions[0].because and "elu" in read.assumptions[0].assumes


def test_a_configuration_of_another_run_is_refused(tmp_path):
    shutil.copytree(TRAIN_DIR / "gru_elu", tmp_path / "gru_elu")
    config = json.loads((tmp_path / "gru_elu" / "config.json").read_text())
    (tmp_path / "gru_elu" / "config.json").write_text(json.dumps({**config, "rnn_size": 512}))
    refused = invoke("convert", tmp_path / "gru_elu" / "checkpoint_p0" / checkpoint("gru_elu").name, "--head",
                     "diag-gaussian", "-o", tmp_path / "a.onnx")
    assert refused.exit_code == 3 and "another run" in refused.output
    (tmp_path / "gru_elu" / "config.json").write_text("{not json")
    damaged = invoke("convert", tmp_path / "gru_elu" / "checkpoint_p0" / checkpoint("gru_elu").name, "--head",
                     "diag-gaussian", "-o", tmp_path / "a.onnx")
    assert damaged.exit_code == 3 and "config.json" in damaged.output


def test_networks_it_does_not_read_are_refused_with_exit_3(tmp_path):
    torch = pytest.importorskip("torch")
    saved = torch.load(checkpoint("gru_elu"), weights_only=False)
    cases = {
        "five_gates": {**saved["model"], "core.core.weight_hh_l0": torch.zeros(60, 12),
                       "core.core.weight_ih_l0": torch.zeros(60, 64), "core.core.bias_ih_l0": torch.zeros(60),
                       "core.core.bias_hh_l0": torch.zeros(60)},
        "half_a_second_layer": {**saved["model"], "core.core.weight_ih_l1": torch.zeros(36, 12)},
        "conv": {**saved["model"], "encoder.encoders.obs.enc.conv_head.0.weight": torch.zeros(8, 3, 3, 3)},
    }
    for name, model in cases.items():
        path = tmp_path / name / "checkpoint_p0" / "checkpoint_000000001_10.pth"
        path.parent.mkdir(parents=True)
        torch.save({**saved, "model": model}, path)
        result = invoke("convert", path, "--activation", "elu", "--head", "diag-gaussian", "-o", tmp_path / "a.onnx")
        assert result.exit_code == 3, (name, result.output)
    (tmp_path / "cut.pth").write_bytes(checkpoint("gru_elu").read_bytes()[:5000])
    cut = invoke("convert", tmp_path / "cut.pth", "--from", "sample-factory", "-o", tmp_path / "a.onnx")
    assert cut.exit_code == 3


def test_a_pickled_entry_that_would_run_code_converts_without_running_it(tmp_path, obs):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(marker)],))

    saved = torch.load(checkpoint("mlp_tanh"), weights_only=False)
    saved["best_performance"] = Payload()
    shutil.copytree(TRAIN_DIR / "mlp_tanh", tmp_path / "mlp_tanh")
    path = tmp_path / "mlp_tanh" / "checkpoint_p0" / checkpoint("mlp_tanh").name
    torch.save(saved, path)
    assert detect_kind(path) == "sample-factory"
    out = pp.load(pp.convert(path)).run({"obs": obs})
    assert not marker.exists()
    assert np.abs(out["action"] - expected("mlp_tanh")["action"]).max() <= 1e-5


def test_convert_verify_pack_and_the_packed_run_on_the_cli(tmp_path):
    source = checkpoint("gru_elu")
    converted = invoke("convert", source, "--head", "diag-gaussian", "-o", tmp_path / "a.onnx", "--json")
    assert converted.exit_code == 0, converted.output
    assert [a["topic"] for a in json.loads(converted.stdout)["assumptions"]] == ["activation", "head"]
    verified = invoke("verify", tmp_path / "a.onnx", "--source", source, "--json")
    assert verified.exit_code == 0 and json.loads(verified.stdout)["passed"] is True
    packed = invoke("pack", tmp_path / "a.onnx", "-o", tmp_path / "pack")
    assert packed.exit_code == 0, packed.output
    result = subprocess.run([sys.executable, str(tmp_path / "pack" / "run.py"), "--verify"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout


@pytest.mark.slow
def test_sample_factorys_own_forward_agrees_now(obs):
    """Sample Factory's own forward, rebuilt from the saved file and its config.json, over an episode whose
    states each side feeds back itself."""
    pytest.importorskip("sample_factory")
    import importlib.util

    import torch

    # under a name of its own: rl_games' fixtures have a make_fixtures module too
    spec = importlib.util.spec_from_file_location("sample_factory_make_fixtures", SF / "make_fixtures.py")
    make_fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_fixtures)

    cfg = make_fixtures.config("gru_elu")
    model = make_fixtures.actor_critic(cfg, "gru_elu")
    model.load_state_dict(torch.load(checkpoint("gru_elu"), weights_only=False)["model"])
    session = pp.load(pp.convert(checkpoint("gru_elu"), head="diag-gaussian"), "onnxruntime")
    # an episode of 5 steps over 200 environments, each step's new state fed back, from zeros as enjoy.py starts
    ours = theirs = np.zeros((200, 12), np.float32)
    for step in range(5):
        want = make_fixtures.forward(model, cfg, obs[step * 200:(step + 1) * 200], theirs)
        out = session.run({"obs": obs[step * 200:(step + 1) * 200], "rnn_state_in": ours})
        assert np.abs(out["action"] - want["action"]).max() <= 1e-5, step
        assert np.abs(out["rnn_state_out"] - want["new_rnn_states"]).max() <= 1e-5, step
        ours, theirs = out["rnn_state_out"], want["new_rnn_states"]
    assert np.abs(ours).max() > 0.1
