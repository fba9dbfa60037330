"""rl_games checkpoints: the fixtures are made by rl_games itself (``fixtures/rl_games/make_fixtures.py``),
and every expected action is what rl_games' own player returned after restoring the saved file."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import numpy as np
import pytest


import policyport as pp
from policyport.converter import convert_source, detect_kind
from policyport.converter.readers.checkpoints import read_checkpoint
from policyport.converter.sources import rl_games
from library_checkpoints import (NORMALISERS, arrays, code_running_payload, convert_verify_pack, elu_policy_under,
                                 fixture_script, invoke)


ROOT = Path(__file__).resolve().parents[2]
RLG = ROOT / "fixtures" / "rl_games"
#: The continuous fixtures' action space (make_fixtures.py's LOW and HIGH).
LOW = (-1.0, -2.0, -0.5, -1.0, -3.0, 0.0)
HIGH = (1.0, 2.0, 0.5, 3.0, 1.0, 0.5)
BOUNDS = f"{','.join(map(str, LOW))}:{','.join(map(str, HIGH))}"


def checkpoint(run: str) -> Path:
    return RLG / run / "nn" / f"{run}.pth"


@pytest.fixture(scope="module")
def obs() -> np.ndarray:
    return np.load(RLG / "observations.npy")


def expected(run: str) -> dict[str, np.ndarray]:
    return arrays(RLG / run / "expected.npz")


def test_a_checkpoint_is_told_from_its_keys():
    assert detect_kind(checkpoint("ant_elu")) == "rl-games"
    assert detect_kind(checkpoint("discrete_relu")) == "rl-games"
    assert detect_kind(ROOT / "fixtures" / "torch" / "gaussian.state_dict.pt") == "state-dict"


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("run", ["ant_elu", "humanoid_tanh"])
def test_the_action_is_the_rl_games_players_own(run, backend, obs):
    """With the bounds given, clamp(mu, -1, 1) rescaled to them, as the player's clip_actions does;
    without them, mu."""
    want = expected(run)
    np.seterr(all="raise")
    try:
        out = pp.load(pp.convert(checkpoint(run), action_bounds=(LOW, HIGH)), backend).run({"obs": obs})
        bare = pp.load(pp.convert(checkpoint(run)), backend).run({"obs": obs})
    finally:
        np.seterr(all="warn")
    assert out["action"].shape == want["action"].shape == (1000, 6)
    assert np.abs(out["action"] - want["action"]).max() <= 1e-5
    assert np.abs(out["std"] - want["sigma"]).max() <= 1e-5
    assert np.abs(bare["action"] - want["mu"]).max() <= 1e-5
    assert np.abs(bare["action"] - want["action"]).max() > 0.1  # the mapping matters on these bounds


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_discrete_policys_action_is_the_argmax(backend, obs):
    out = pp.load(pp.convert(checkpoint("discrete_relu"), activation="relu"), backend).run({"obs": obs})
    want = expected("discrete_relu")["action"]
    assert out["action"].dtype == np.int64 and (out["action"] == want).all()
    assert len(set(want.tolist())) > 1


def test_the_normaliser_is_rl_games_and_no_other_librarys(obs, monkeypatch):
    """rl_games adds 1e-5 to the variance and clips at 5; each other library's formula moves mu."""
    layout = rl_games.read_layout(read_checkpoint(checkpoint("ant_elu"), "rl_games"), "ant_elu")
    assert layout.normalizer["running_mean"][1].dtype == np.float64
    want = expected("ant_elu")["mu"]
    # the test observations reach past the clip, so a formula without it (or with another) differs
    assert np.abs(rl_games.normalize(layout, obs)).max() == 5.0
    mean, var = (layout.normalizer[r][1] for r in ("running_mean", "running_var"))
    under = functools.partial(elu_policy_under, obs, mean, var, layout.layers, layout.head)
    assert np.abs(under(**NORMALISERS["rl_games"]) - want).max() <= 1e-5
    others = {**{k: v for k, v in NORMALISERS.items() if k != "rl_games"}, "no clip": dict(eps_on_var=1e-5)}
    for name, formula in others.items():
        assert np.abs(under(**formula) - want).max() > 1e-3, name
    for attribute, value in (("NORMALIZER_CLIP", 10.0), ("NORMALIZER_EPS", 1e-2)):
        with monkeypatch.context() as patched:  # the converter itself with another constant gives another mu
            patched.setattr(rl_games, attribute, value)
            out = pp.load(pp.convert(checkpoint("ant_elu"))).run({"obs": obs})
            assert np.abs(out["action"] - want).max() > 1e-3, attribute


def test_extract_gives_every_array_back_bit_for_bit():
    torch = pytest.importorskip("torch")
    saved = torch.load(checkpoint("ant_elu"), weights_only=False)["model"]
    weights = pp.extract_weights(pp.convert(checkpoint("ant_elu")))
    policy = {k: v for k, v in saved.items() if not k.startswith(("a2c_network.value", "value_mean_std"))}
    assert sorted(weights) == sorted(policy)
    for name, tensor in policy.items():
        array = tensor.numpy()
        assert weights[name].dtype == array.dtype and weights[name].shape == array.shape, name
        assert weights[name].tobytes() == array.tobytes(), name
    assert weights["running_mean_std.running_var"].dtype == np.float64


def test_the_activation_comes_from_the_run_configuration_or_must_be_given(tmp_path, obs):
    shutil.copy(checkpoint("humanoid_tanh"), tmp_path / "humanoid_tanh.pth")
    refused = invoke("convert", tmp_path / "humanoid_tanh.pth", "-o", tmp_path / "a.onnx")
    assert refused.exit_code == 2 and "--activation" in refused.output
    given = convert_source(tmp_path / "humanoid_tanh.pth", activation="tanh", action_bounds=(LOW, HIGH))
    assert [a.topic for a in given.assumptions] == ["activation", "head", "action bounds"]
    assert "given by --activation" in given.assumptions[0].because
    assert np.abs(pp.load(given.model).run({"obs": obs})["action"] - expected("humanoid_tanh")["action"]).max() <= 1e-5
    read = convert_source(checkpoint("humanoid_tanh"))
    assert "config.yaml" in read.assumptions[0].because and "tanh" in read.assumptions[0].assumes
    contradicted = invoke("convert", checkpoint("ant_elu"), "--activation", "relu", "-o", tmp_path / "b.onnx")
    assert contradicted.exit_code == 2 and "contradicts" in contradicted.output


def test_action_bounds_are_checked_and_refused_where_the_player_maps_nothing(tmp_path):
    wrong_width = invoke("convert", checkpoint("ant_elu"), "--action-bounds", "-1,-1:1,1", "-o", tmp_path / "a.onnx")
    assert wrong_width.exit_code == 2 and "6 actions" in wrong_width.output
    malformed = invoke("convert", checkpoint("ant_elu"), "--action-bounds", "-1", "-o", tmp_path / "a.onnx")
    assert malformed.exit_code == 2 and "LOW:HIGH" in malformed.output
    discrete = invoke("convert", checkpoint("discrete_relu"), "--activation", "relu", "--action-bounds", "-1:1",
                      "-o", tmp_path / "a.onnx")
    assert discrete.exit_code == 2 and "discrete" in discrete.output
    (tmp_path / "run" / "nn").mkdir(parents=True)
    shutil.copytree(RLG / "ant_elu" / "params", tmp_path / "run" / "params")
    text = (tmp_path / "run" / "params" / "agent.yaml").read_text()
    (tmp_path / "run" / "params" / "agent.yaml").write_text(text.replace("clip_actions: true", "clip_actions: false"))
    shutil.copy(checkpoint("ant_elu"), tmp_path / "run" / "nn" / "ant.pth")
    off = invoke("convert", tmp_path / "run" / "nn" / "ant.pth", "--action-bounds", "-1:1", "-o", tmp_path / "a.onnx")
    assert off.exit_code == 2 and "clip_actions off" in off.output
    assert not (tmp_path / "a.onnx").exists()
    unmapped = convert_source(tmp_path / "run" / "nn" / "ant.pth")
    assert "action bounds" not in [a.topic for a in unmapped.assumptions]


def test_a_pickled_env_state_that_would_run_code_converts_without_running_it(tmp_path, obs):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "ran"

    saved = torch.load(checkpoint("ant_elu"), weights_only=False)
    saved["env_state"] = code_running_payload(marker)
    (tmp_path / "run" / "nn").mkdir(parents=True)
    shutil.copytree(RLG / "ant_elu" / "params", tmp_path / "run" / "params")
    torch.save(saved, tmp_path / "run" / "nn" / "ant.pth")
    assert detect_kind(tmp_path / "run" / "nn" / "ant.pth") == "rl-games"
    out = pp.load(pp.convert(tmp_path / "run" / "nn" / "ant.pth", action_bounds=(LOW, HIGH))).run({"obs": obs})
    assert not marker.exists()
    assert np.abs(out["action"] - expected("ant_elu")["action"]).max() <= 1e-5


def test_convert_verify_pack_and_the_packed_run_on_the_cli(tmp_path):
    topics = convert_verify_pack(tmp_path, checkpoint("ant_elu"), "--action-bounds", BOUNDS)
    assert topics == ["activation", "action bounds"]


@pytest.mark.slow
def test_rl_games_own_player_agrees_now(obs):
    """The fixtures' expected actions, recomputed by the installed rl_games from the saved file."""
    pytest.importorskip("rl_games")
    make_fixtures = fixture_script(RLG)
    import torch

    played = make_fixtures.player(make_fixtures.RUNS["ant_elu"][0])
    played.restore(str(checkpoint("ant_elu")))
    with torch.no_grad():
        want = played.get_action(torch.from_numpy(obs), is_deterministic=True).numpy()
    out = pp.load(pp.convert(checkpoint("ant_elu"), action_bounds=(LOW, HIGH)), "onnxruntime").run({"obs": obs})
    assert np.abs(out["action"] - want).max() <= 1e-5


def test_a_run_configuration_nested_past_the_recursion_limit_is_read_as_none(tmp_path):
    """PyYAML's parser recurses once per nested flow collection: a config nested deeper is unreadable,
    so the activation it would name must be given (exit 2), not a RecursionError (exit 70)."""
    run = tmp_path / "ant_elu"
    shutil.copytree(RLG / "ant_elu", run)
    config = run / "params" / "agent.yaml"
    config.write_text(config.read_text().replace("activation: elu", "activation: " + "[" * 5000 + "]" * 5000, 1))
    refused = invoke("convert", run / "nn" / "ant_elu.pth", "-o", tmp_path / "a.onnx")
    assert refused.exit_code == 2, refused.output
    assert "does not record the activation" in " ".join(refused.output.split())
    converted = invoke("convert", run / "nn" / "ant_elu.pth", "--activation", "elu", "-o", tmp_path / "a.onnx")
    assert converted.exit_code == 0, converted.output
