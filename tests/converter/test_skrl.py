"""skrl checkpoints: the fixtures are made by skrl itself (``fixtures/skrl/make_fixtures.py``), and every
expected action is what skrl's own agent returned (``policy.act``'s ``mean_actions`` after its
``observation_preprocessor``) after loading the saved files."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from library_checkpoints import NORMALISERS, convert_verify_pack, elu_policy_under, fixture_script, invoke

import policyport as pp
from policyport.converter import convert_source, detect_kind
from policyport.converter.readers.checkpoints import read_checkpoint
from policyport.converter.sources import skrl

ROOT = Path(__file__).resolve().parents[2]
SKRL = ROOT / "fixtures" / "skrl"
AGENT = SKRL / "isaaclab_elu" / "checkpoints" / "agent_1000.pt"
SEPARATE = SKRL / "separate_tanh" / "checkpoints" / "policy_500.pt"
#: The separate run's action space (make_fixtures.py's LOW and HIGH).
LOW = (-1.0, -2.0, -0.5, -1.0, -3.0, 0.0)
HIGH = (1.0, 2.0, 0.5, 3.0, 1.0, 0.5)
BOUNDS = f"{','.join(map(str, LOW))}:{','.join(map(str, HIGH))}"


@pytest.fixture(scope="module")
def obs() -> np.ndarray:
    return np.load(SKRL / "observations.npy")


def expected(run: str) -> dict[str, np.ndarray]:
    with np.load(SKRL / run / "expected.npz") as f:
        return {k: f[k] for k in f.files}


def test_agent_files_and_separately_stored_policies_are_told_from_their_keys():
    assert detect_kind(AGENT) == "skrl"
    assert detect_kind(SEPARATE) == "skrl"
    assert detect_kind(SEPARATE.with_name("observation_preprocessor_500.pt")) == "state-dict"
    assert detect_kind(ROOT / "fixtures" / "rl_games" / "ant_elu" / "nn" / "ant_elu.pth") == "rl-games"
    assert detect_kind(ROOT / "fixtures" / "torch" / "gaussian.state_dict.pt") == "state-dict"


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_the_action_is_skrls_own_mean_action(backend, obs):
    want = expected("isaaclab_elu")
    np.seterr(all="raise")
    try:
        out = pp.load(pp.convert(AGENT), backend).run({"obs": obs})
    finally:
        np.seterr(all="warn")
    assert out["action"].shape == want["action"].shape == (1000, 6)
    assert np.abs(out["action"] - want["action"]).max() <= 1e-5
    assert np.abs(out["log_std"] - want["log_std"]).max() <= 1e-6
    assert (want["log_std"][0] == -1.5).any() and (want["log_std"][0] == 2.0).any()  # clip_log_std's clamp matters
    assert np.abs(out["std"] - np.exp(want["log_std"])).max() <= 1e-5


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_separately_stored_policy_with_its_preprocessor_and_clip_mean_actions(backend, obs):
    want = expected("separate_tanh")
    out = pp.load(pp.convert(SEPARATE, activation="tanh", action_bounds=(LOW, HIGH)), backend).run({"obs": obs})
    assert np.abs(out["action"] - want["action"]).max() <= 1e-5
    assert np.abs(out["mean"] - want["action"]).max() > 0.1  # the clamp to the bounds matters on these
    assert np.abs(out["log_std"] - want["log_std"]).max() <= 1e-6


def test_the_normaliser_is_skrls_and_no_other_librarys(obs, monkeypatch):
    """skrl adds 1e-8 to the std (not the variance) and clips at 5; each other library's formula moves the action."""
    loaded = read_checkpoint(AGENT, "skrl")
    layout = skrl.read_policy(loaded["policy"], "agent")
    skrl.read_normalizer(loaded["observation_preprocessor"], "observation_preprocessor", layout, "agent")
    assert layout.normalizer["running_variance"][1].dtype == np.float64
    want = expected("isaaclab_elu")
    assert np.abs(skrl.normalize(layout, obs) - want["normalized"]).max() <= 1e-6
    assert np.abs(skrl.normalize(layout, obs)).max() == 5.0  # the observations reach past the clip
    mean, var = (layout.normalizer[r][1] for r in ("running_mean", "running_variance"))
    under = functools.partial(elu_policy_under, obs, mean, var, layout.layers, layout.head)
    assert np.abs(under(**NORMALISERS["skrl"]) - want["action"]).max() <= 1e-5
    others = {**{k: v for k, v in NORMALISERS.items() if k != "skrl"}, "no clip": dict(eps_on_std=1e-8)}
    for name, formula in others.items():
        assert np.abs(under(**formula) - want["action"]).max() > 1e-3, name
    for attribute, value in (("NORMALIZER_CLIP", 10.0), ("NORMALIZER_EPS", 1e-2)):
        with monkeypatch.context() as patched:  # the converter itself with another constant gives another action
            patched.setattr(skrl, attribute, value)
            out = pp.load(pp.convert(SEPARATE, activation="tanh", action_bounds=(LOW, HIGH))).run({"obs": obs})
            assert np.abs(out["action"] - expected("separate_tanh")["action"]).max() > 1e-3, attribute


def test_extract_gives_every_array_back_bit_for_bit():
    torch = pytest.importorskip("torch")
    saved = torch.load(AGENT, weights_only=False)
    weights = pp.extract_weights(pp.convert(AGENT))
    policy = {f"policy.{k}": v for k, v in saved["policy"].items() if not k.startswith("value_layer")}
    policy.update({f"observation_preprocessor.{k}": v for k, v in saved["observation_preprocessor"].items()})
    assert sorted(weights) == sorted(policy)
    for name, tensor in policy.items():
        array = tensor.numpy()
        assert weights[name].dtype == array.dtype and weights[name].shape == array.shape, name
        assert weights[name].tobytes() == array.tobytes(), name
    assert weights["observation_preprocessor.running_variance"].dtype == np.float64


def test_the_configuration_settles_the_activation_else_it_must_be_given(tmp_path, obs):
    read = convert_source(AGENT)
    assert [a.topic for a in read.assumptions] == ["activation"]
    assert "agent.yaml" in read.assumptions[0].because and "elu" in read.assumptions[0].assumes
    shutil.copy(AGENT, tmp_path / "agent_1000.pt")
    refused = invoke("convert", tmp_path / "agent_1000.pt", "-o", tmp_path / "a.onnx")
    assert refused.exit_code == 2 and "--activation" in refused.output
    given = convert_source(tmp_path / "agent_1000.pt", activation="elu")
    assert [a.topic for a in given.assumptions] == ["activation", "head", "observation normalisation"]
    # without the configuration, skrl's default clip_log_std range (-20, 2) is assumed: the run's -1.5 is not known
    assert np.abs(pp.load(given.model).run({"obs": obs})["action"] - expected("isaaclab_elu")["action"]).max() <= 1e-5
    contradicted = invoke("convert", AGENT, "--activation", "relu", "-o", tmp_path / "b.onnx")
    assert contradicted.exit_code == 2 and "contradicts" in contradicted.output


def test_clip_mean_actions_needs_the_bounds_and_bounds_need_it(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(SKRL / "isaaclab_elu", run)
    text = (run / "params" / "agent.yaml").read_text()
    (run / "params" / "agent.yaml").write_text(text.replace("clip_mean_actions: false", "clip_mean_actions: true"))
    refused = invoke("convert", run / "checkpoints" / "agent_1000.pt", "-o", tmp_path / "a.onnx")
    assert refused.exit_code == 2 and "--action-bounds" in refused.output and "clip_mean_actions" in refused.output
    off = invoke("convert", AGENT, "--action-bounds", "-1:1", "-o", tmp_path / "a.onnx")
    assert off.exit_code == 2 and "clip_mean_actions off" in off.output
    wrong_width = invoke("convert", SEPARATE, "--activation", "tanh", "--action-bounds", "-1,-1:1,1", "-o", tmp_path / "a.onnx")
    assert wrong_width.exit_code == 2 and "6 actions" in wrong_width.output
    assert not (tmp_path / "a.onnx").exists()


def test_without_its_preprocessor_file_the_policy_reads_raw_observations(tmp_path, obs):
    shutil.copy(SEPARATE, tmp_path / "policy_500.pt")
    alone = convert_source(tmp_path / "policy_500.pt", activation="tanh")
    normalisation = [a for a in alone.assumptions if a.topic == "observation normalisation"]
    assert normalisation and normalisation[0].assumes == "none"
    assert "observation_preprocessor_500.pt" in normalisation[0].because
    filtered = invoke("convert", AGENT, "--no-filter", "-o", tmp_path / "raw.onnx")
    assert filtered.exit_code == 0, filtered.output
    assert "observation_preprocessor.running_mean" not in pp.extract_weights(str(tmp_path / "raw.onnx"))


def test_a_pickled_payload_that_would_run_code_converts_without_running_it(tmp_path, obs):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(marker)],))

    saved = torch.load(AGENT, weights_only=False)
    saved["extra"] = {"hook": Payload()}
    shutil.copytree(SKRL / "isaaclab_elu" / "params", tmp_path / "run" / "params")
    (tmp_path / "run" / "checkpoints").mkdir()
    torch.save(saved, tmp_path / "run" / "checkpoints" / "agent_1000.pt")
    assert detect_kind(tmp_path / "run" / "checkpoints" / "agent_1000.pt") == "skrl"
    out = pp.load(pp.convert(tmp_path / "run" / "checkpoints" / "agent_1000.pt")).run({"obs": obs})
    assert not marker.exists()
    assert np.abs(out["action"] - expected("isaaclab_elu")["action"]).max() <= 1e-5


def test_bad_files_are_refused_cleanly(tmp_path):
    torch = pytest.importorskip("torch")
    saved = torch.load(AGENT, weights_only=False)
    del saved["policy"]["log_std_parameter"]
    torch.save(saved, tmp_path / "agent_1.pt")
    refused = invoke("convert", tmp_path / "agent_1.pt", "--from", "skrl", "--activation", "elu", "-o", tmp_path / "a.onnx")
    assert refused.exit_code == 3 and "log_std_parameter" in refused.output
    other = invoke("convert", ROOT / "fixtures" / "rl_games" / "ant_elu" / "nn" / "ant_elu.pth", "--from", "skrl",
                   "-o", tmp_path / "a.onnx")
    assert other.exit_code == 3 and "neither an skrl agent file" in other.output
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    junk = invoke("convert", tmp_path / "junk.pt", "--from", "skrl", "-o", tmp_path / "a.onnx")
    assert junk.exit_code == 3


def test_convert_verify_pack_and_the_packed_run_on_the_cli(tmp_path):
    topics = convert_verify_pack(tmp_path, SEPARATE, "--activation", "tanh", "--action-bounds", BOUNDS)
    assert topics == ["activation", "head", "action bounds", "observation normalisation"]


@pytest.mark.slow
def test_skrls_own_agent_agrees_now(obs):
    """The expected actions, recomputed by the installed skrl from the saved agent file."""
    pytest.importorskip("skrl")
    make_fixtures = fixture_script(SKRL)
    cfg = make_fixtures.RUNS["isaaclab_elu"][0]
    agent = make_fixtures.build_agent(make_fixtures.build_models(cfg))
    agent.load(str(AGENT))
    want = make_fixtures.deterministic(agent, obs)["action"]
    out = pp.load(pp.convert(AGENT), "onnxruntime").run({"obs": obs})
    assert np.abs(out["action"] - want).max() <= 1e-5


def test_the_output_expressions_skrl_writes_are_read_and_others_refused():
    assert skrl.parse_output("ACTIONS", "cfg") == (1.0, None)
    assert skrl.parse_output("tanh(ACTIONS)", "cfg") == (1.0, "tanh")
    assert skrl.parse_output("2 * tanh(ACTIONS)", "cfg") == (2.0, "tanh")
    assert skrl.parse_output("ACTIONS * 0.5", "cfg") == (0.5, None)
    for expression in ("ACTIONS + 1", "softmax(ACTIONS)", "tanh(ACTIONS, 2)", "concatenate([ACTIONS])", "("):
        with pytest.raises(pp.BadModelError):
            skrl.parse_output(expression, "cfg")


def test_a_state_preprocessor_without_an_observation_one_is_applied_and_said(tmp_path, obs):
    """skrl 1.x named the policy's input preprocessor state_preprocessor."""
    torch = pytest.importorskip("torch")
    saved = torch.load(AGENT, weights_only=False)
    saved["state_preprocessor"] = saved.pop("observation_preprocessor")
    torch.save(saved, tmp_path / "agent_1000.pt")
    converted = convert_source(tmp_path / "agent_1000.pt", activation="elu")
    normalisation = [a for a in converted.assumptions if a.topic == "observation normalisation"]
    assert normalisation and normalisation[0].assumes.startswith("state_preprocessor")
    out = pp.load(converted.model).run({"obs": obs})
    assert np.abs(out["action"] - expected("isaaclab_elu")["action"]).max() <= 1e-5
    assert "state_preprocessor.running_variance" in pp.extract_weights(converted.model)


@pytest.mark.slow
def test_the_configurations_output_and_preprocessor_kwargs_are_skrls(tmp_path, obs):
    """A separate model whose output is 2 * tanh(ACTIONS) and whose preprocessor has another epsilon and
    clip, made and run by skrl, read from its params/agent.yaml."""
    pytest.importorskip("skrl")
    import torch
    import yaml

    make_fixtures = fixture_script(SKRL)
    cfg = make_fixtures.models_cfg("relu", separate=True)
    cfg["policy"]["output"] = "2 * tanh(ACTIONS)"
    kwargs = {"epsilon": 0.05, "clip_threshold": 2.0}
    torch.manual_seed(3)
    agent = make_fixtures.build_agent(make_fixtures.build_models(cfg))
    scaler = agent._observation_preprocessor = type(agent._observation_preprocessor)(obs.shape[1], device="cpu", **kwargs)
    agent.checkpoint_modules["observation_preprocessor"] = scaler
    scaler(torch.from_numpy(obs[:500] * 0.01), train=True)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "params").mkdir()
    agent.save(str(tmp_path / "run" / "checkpoints" / "agent_10.pt"))
    agent_section = {"class": "PPO", "observation_preprocessor": "RunningStandardScaler",
                     "observation_preprocessor_kwargs": kwargs}
    (tmp_path / "run" / "params" / "agent.yaml").write_text(yaml.dump({"models": cfg, "agent": agent_section}))
    want = make_fixtures.deterministic(agent, obs)["action"]
    out = pp.load(pp.convert(tmp_path / "run" / "checkpoints" / "agent_10.pt")).run({"obs": obs})
    assert np.abs(out["action"] - want).max() <= 1e-5
    assert np.abs(want).max() > 1.0 and np.abs(want).max() <= 2.0  # the output expression's scale matters
    del agent_section["observation_preprocessor_kwargs"]  # skrl's default epsilon and clip give another action
    (tmp_path / "run" / "params" / "agent.yaml").write_text(yaml.dump({"models": cfg, "agent": agent_section}))
    defaults = pp.load(pp.convert(tmp_path / "run" / "checkpoints" / "agent_10.pt")).run({"obs": obs})
    assert np.abs(defaults["action"] - want).max() > 1e-3


def test_best_and_otherwise_named_policies(tmp_path, obs):
    checkpoints = SEPARATE.parent
    shutil.copy(SEPARATE, tmp_path / "best_policy.pt")
    shutil.copy(checkpoints / "observation_preprocessor_500.pt", tmp_path / "best_observation_preprocessor.pt")
    assert detect_kind(tmp_path / "best_policy.pt") == "skrl"
    best = pp.load(pp.convert(tmp_path / "best_policy.pt", activation="tanh", action_bounds=(LOW, HIGH))).run({"obs": obs})
    assert np.abs(best["action"] - expected("separate_tanh")["action"]).max() <= 1e-5
    shutil.copy(SEPARATE, tmp_path / "actor.pt")
    named = convert_source(tmp_path / "actor.pt", kind="skrl", activation="tanh")
    assert [a.assumes for a in named.assumptions if a.topic == "observation normalisation"] == ["none"]


def test_one_activation_per_layer_in_the_configuration(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(SKRL / "isaaclab_elu", run)
    text = (run / "params" / "agent.yaml").read_text()
    (run / "params" / "agent.yaml").write_text(text.replace("- activations: elu", "- activations: [elu, tanh]", 1))
    read = convert_source(run / "checkpoints" / "agent_1000.pt")
    assert read.assumptions[0].assumes == "elu,tanh at policy.net_container.1 and policy.net_container.3"
    weights = pp.extract_weights(read.model)
    assert "policy.net_container.2.weight" in weights
    ops = {node.name: node.op_type for node in read.model.graph.node}
    assert ops["policy.net_container.1/elu"] == "Elu" and ops["policy.net_container.3/tanh"] == "Tanh"
    refused = invoke("convert", run / "checkpoints" / "agent_1000.pt", "--activation", "elu", "-o", tmp_path / "a.onnx")
    assert refused.exit_code == 2 and "one per layer" in refused.output


def test_a_state_dict_keyed_by_anything_but_names_is_refused(tmp_path):
    import torch

    saved = torch.load(SKRL / "separate_tanh" / "checkpoints" / "policy_500.pt", weights_only=True)
    saved[0.5] = saved.pop("net_container.2.weight")
    torch.save(saved, tmp_path / "policy_500.pt")
    refused = invoke("convert", tmp_path / "policy_500.pt", "--activation", "tanh", "-o", tmp_path / "a.onnx")
    assert refused.exit_code == 3, refused.output
    assert "is not a state_dict of tensors (parameter names to arrays)" in " ".join(refused.output.split())
