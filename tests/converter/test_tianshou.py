"""Tianshou files: the fixtures are made by Tianshou itself (``fixtures/tianshou/make_fixtures.py``), and
every expected action is what Tianshou's own policy returned (``map_action`` of its deterministic action)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

import policyport as pp
from policyport.converter import convert_source, detect_kind
from policyport.converter.readers.checkpoints import read_checkpoint
from policyport.converter.sources import tianshou

from library_checkpoints import arrays, convert_verify_pack, fixture_script, invoke

ROOT = Path(__file__).resolve().parents[2]
TS = ROOT / "fixtures" / "tianshou"
#: The continuous fixtures' action space (make_fixtures.py's LOW and HIGH).
LOW = (-1.0, -2.0, 0.0)
HIGH = (1.0, 0.5, 3.0)
BOUNDS = f"{','.join(map(str, LOW))}:{','.join(map(str, HIGH))}"
#: run -> (file, activation, action_bound_method)
RUNS = {"ppo_obs_rms": ("policy.pth", "tanh", "clip"), "a2c_tanh": ("policy_state_dict.pt", "relu", "tanh"),
        "ppo_discrete": ("policy_state_dict.pt", "relu", None)}


def path(run: str) -> Path:
    return TS / run / RUNS[run][0]


@pytest.fixture(scope="module")
def obs() -> np.ndarray:
    return np.load(TS / "observations.npy")


def expected(run: str) -> dict[str, np.ndarray]:
    return arrays(TS / run / "expected.npz")


def convert(run: str, **options):
    _, activation, bound = RUNS[run]
    return pp.convert(path(run), activation=activation, action_bound_method=bound, **options)


def test_a_tianshou_file_is_told_from_its_keys():
    for run in RUNS:
        assert detect_kind(path(run)) == "tianshou", run
    assert detect_kind(TS / "ppo_discrete" / "policy.pt") == "tianshou"  # told from the classes its pickle names
    assert detect_kind(ROOT / "fixtures" / "torch" / "gaussian.state_dict.pt") == "state-dict"
    assert detect_kind(ROOT / "fixtures" / "rl_games" / "ant_elu" / "nn" / "ant_elu.pth") == "rl-games"


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("run", ["ppo_obs_rms", "a2c_tanh"])
def test_the_action_is_tianshous_own(run, backend, obs):
    """With the bounds given, map_action's bound method then scaling; without them, the bound method alone."""
    want = expected(run)
    np.seterr(all="raise")
    try:
        out = pp.load(convert(run, action_bounds=(LOW, HIGH)), backend).run({"obs": obs})
        bare = pp.load(convert(run), backend).run({"obs": obs})
    finally:
        np.seterr(all="warn")
    assert out["action"].shape == want["action"].shape == (1000, 3)
    assert np.abs(out["action"] - want["action"]).max() <= 1e-5
    assert np.abs(out["logits"] - want["mu"]).max() <= 1e-5
    assert np.abs(out["std"] - want["std"]).max() <= 1e-5
    assert np.abs(want["mu"]).max() > 1.5  # the bound method matters on these actions
    bounded = np.clip(want["mu"], -1, 1) if RUNS[run][2] == "clip" else np.tanh(want["mu"])
    assert np.abs(bare["action"] - bounded).max() <= 1e-5
    assert np.abs(bare["action"] - want["action"]).max() > 0.1  # the scaling matters on these bounds


def test_the_other_bound_method_gives_another_action(obs):
    want = expected("ppo_obs_rms")["action"]
    wrong = pp.load(pp.convert(path("ppo_obs_rms"), activation="tanh", action_bound_method="tanh",
                               action_bounds=(LOW, HIGH))).run({"obs": obs})
    assert np.abs(wrong["action"] - want).max() > 0.1


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_discrete_policys_action_is_the_argmax(backend, obs):
    out = pp.load(convert("ppo_discrete"), backend).run({"obs": obs})
    want = expected("ppo_discrete")["action"]
    assert out["action"].dtype == np.int64 and (out["action"] == want).all()
    assert len(set(want.tolist())) > 1


def _mu_under(layout, obs, eps_on_var=None, eps_on_std=None, clip=None):
    """ppo_obs_rms's mu under a normaliser of some library's formula, in float64."""
    mean, var = (layout.normalizer[r][1] for r in ("mean", "var"))
    x = (obs.astype(np.float64) - mean) / (np.sqrt(var + eps_on_var) if eps_on_var is not None else np.sqrt(var) + eps_on_std)
    if clip is not None:
        x = np.clip(x, -clip, clip)
    for _, w, _, b in layout.layers:
        x = np.tanh(x @ w.T.astype(np.float64) + b)
    _, w, _, b = layout.head
    return x @ w.T.astype(np.float64) + b


def test_the_normaliser_is_tianshous_and_no_other_librarys(obs, monkeypatch):
    """Tianshou adds float32's epsilon to the variance and clips at 10, both read from the pickled
    RunningMeanStd; each other library's formula moves mu."""
    layout = tianshou.read_layout(read_checkpoint(path("ppo_obs_rms"), "Tianshou"), "ppo_obs_rms")
    assert layout.normalizer["mean"][1].dtype == np.float64
    assert layout.eps == float(np.finfo(np.float32).eps) and layout.clip == 10.0
    want = expected("ppo_obs_rms")["mu"]
    assert np.abs(tianshou.normalize(layout, obs)).max() == 10.0  # the observations reach past the clip
    assert np.abs(_mu_under(layout, obs, eps_on_var=np.finfo(np.float32).eps, clip=10) - want).max() <= 1e-5
    others = {"rl_games": dict(eps_on_var=1e-5, clip=5), "gymnasium/CleanRL": dict(eps_on_var=1e-8, clip=10),
              "skrl": dict(eps_on_std=1e-8, clip=5), "rsl_rl": dict(eps_on_std=1e-2), "no clip": dict(eps_on_var=1.2e-7)}
    for name, formula in others.items():
        assert np.abs(_mu_under(layout, obs, **formula) - want).max() > 1e-3, name
    for attribute, value in (("clip", 5.0), ("eps", 1e-5), ("eps", 1e-8)):
        with monkeypatch.context() as patched:  # the converter itself with another constant gives another mu
            read = tianshou.read_layout

            def altered(*args, attribute=attribute, value=value):
                layout = read(*args)
                setattr(layout, attribute, value)
                return layout

            patched.setattr(tianshou, "read_layout", altered)
            out = pp.load(convert("ppo_obs_rms")).run({"obs": obs})
            assert np.abs(out["logits"] - want).max() > 1e-3, (attribute, value)


def _same_arrays(weights: dict, saved: dict) -> None:
    assert sorted(weights) == sorted(saved)
    for name, array in saved.items():
        assert weights[name].dtype == array.dtype and weights[name].shape == array.shape, name
        assert weights[name].tobytes() == array.tobytes(), name


def test_extract_gives_every_array_back_bit_for_bit():
    torch = pytest.importorskip("torch")
    saved = torch.load(path("a2c_tanh"), weights_only=True)  # a plain state_dict (and the optimizers' states)
    weights = pp.extract_weights(convert("a2c_tanh"))
    _same_arrays(weights, {k: v.numpy() for k, v in saved.items() if k.startswith("policy.actor.")})
    assert weights["policy.actor.sigma.model.0.weight"].shape == (3, 32)
    # obs_rms: the arrays the pickled RunningMeanStd holds, count included (a Python int there)
    weights = pp.extract_weights(convert("ppo_obs_rms"))
    obs_rms = read_checkpoint(path("ppo_obs_rms"), "Tianshou")["obs_rms"].state
    assert weights["obs_rms.var"].dtype == np.float64 and weights["policy.actor.sigma_param"].shape == (3, 1)
    assert weights["obs_rms.count"] == obs_rms["count"] == 40960
    for role in ("mean", "var"):
        assert weights[f"obs_rms.{role}"].tobytes() == obs_rms[role].tobytes()


def test_what_the_file_does_not_say_must_be_given(tmp_path):
    no_activation = invoke("convert", path("a2c_tanh"), "--action-bound-method", "tanh", "-o", tmp_path / "a.onnx")
    assert no_activation.exit_code == 2 and "--activation" in no_activation.output
    no_bound = invoke("convert", path("a2c_tanh"), "--activation", "relu", "-o", tmp_path / "a.onnx")
    assert no_bound.exit_code == 2 and "--action-bound-method" in no_bound.output
    unknown = invoke("convert", path("a2c_tanh"), "--activation", "relu", "--action-bound-method", "sigmoid",
                     "-o", tmp_path / "a.onnx")
    assert unknown.exit_code == 2 and "clip, tanh, none" in unknown.output
    wrong_width = invoke("convert", path("a2c_tanh"), "--activation", "relu", "--action-bound-method", "tanh",
                         "--action-bounds", "-1,-1:1,1", "-o", tmp_path / "a.onnx")
    assert wrong_width.exit_code == 2 and "3 actions" in wrong_width.output
    for flags in (["--action-bound-method", "clip"], ["--action-bounds", "-1:1"]):
        discrete = invoke("convert", path("ppo_discrete"), "--activation", "relu", *flags, "-o", tmp_path / "a.onnx")
        assert discrete.exit_code == 2 and "discrete" in discrete.output
    elsewhere = invoke("convert", ROOT / "fixtures" / "rl_games" / "ant_elu" / "nn" / "ant_elu.pth",
                       "--action-bound-method", "clip", "-o", tmp_path / "a.onnx")
    assert elsewhere.exit_code == 2 and "--action-bound-method applies to tianshou" in " ".join(elsewhere.output.split())
    assert not (tmp_path / "a.onnx").exists()
    converted = convert_source(path("a2c_tanh"), activation="relu", action_bound_method="tanh")
    assert [a.topic for a in converted.assumptions] == ["activation", "head", "action bounds", "observation normalisation"]


def test_a_whole_pickled_object_needs_trust(tmp_path):
    refused = invoke("convert", TS / "ppo_discrete" / "policy.pt", "--activation", "relu", "-o", tmp_path / "a.onnx")
    assert refused.exit_code == 2 and "--trust" in refused.output and "nothing from it ran" in " ".join(refused.output.split())
    assert not (tmp_path / "a.onnx").exists()


def test_a_pickled_payload_that_would_run_code_converts_without_running_it(tmp_path, obs):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(marker)],))

    saved = {"model": torch.load(path("a2c_tanh"), weights_only=True), "env": Payload()}
    torch.save(saved, tmp_path / "policy.pth")
    assert detect_kind(tmp_path / "policy.pth") == "tianshou"
    out = pp.load(pp.convert(tmp_path / "policy.pth", activation="relu", action_bound_method="tanh",
                             action_bounds=(LOW, HIGH))).run({"obs": obs})
    assert not marker.exists()
    assert np.abs(out["action"] - expected("a2c_tanh")["action"]).max() <= 1e-5


def test_bad_files_are_refused_with_exit_3(tmp_path):
    torch = pytest.importorskip("torch")
    saved = torch.load(path("a2c_tanh"), weights_only=False)
    saved["policy.actor.preprocess.model.model.1.weight"] = torch.ones(32)  # a LayerNorm between Linear and activation
    torch.save(saved, tmp_path / "norm.pt")
    normed = invoke("convert", tmp_path / "norm.pt", "--activation", "relu", "--action-bound-method", "tanh",
                    "-o", tmp_path / "a.onnx")
    assert normed.exit_code == 3 and "norm_layer" in normed.output
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    junk = invoke("convert", tmp_path / "junk.pt", "--from", "tianshou", "-o", tmp_path / "a.onnx")
    assert junk.exit_code == 3


def test_a_1x_policys_state_dict_reads_alike(tmp_path, obs):
    """Tianshou 1.x saved the policy's state_dict, which held the actor itself: keys actor.*."""
    torch = pytest.importorskip("torch")
    saved = {k.removeprefix("policy."): v for k, v in torch.load(path("a2c_tanh"), weights_only=True).items()
             if k != "_optimizers"}
    assert "actor.sigma.model.0.weight" in saved
    torch.save(saved, tmp_path / "policy.pth")
    assert detect_kind(tmp_path / "policy.pth") == "tianshou"
    out = pp.load(pp.convert(tmp_path / "policy.pth", activation="relu", action_bound_method="tanh",
                             action_bounds=(LOW, HIGH))).run({"obs": obs})
    assert np.abs(out["action"] - expected("a2c_tanh")["action"]).max() <= 1e-5
    assert "actor.mu.model.0.weight" in pp.extract_weights(pp.convert(tmp_path / "policy.pth", activation="relu",
                                                                      action_bound_method="tanh"))


class NarrowStatistics:
    """A RunningMeanStd's attributes for 4 observations (pickled under this module's name: read as an
    inert record all the same)."""

    def __init__(self):
        self.mean, self.var, self.count, self.clip_max, self.eps = np.zeros(4), np.ones(4), 10, 10.0, 1e-7


def test_statistics_of_another_width_are_refused(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"model": torch.load(path("a2c_tanh"), weights_only=True), "obs_rms": NarrowStatistics()}, tmp_path / "p.pth")
    refused = invoke("convert", tmp_path / "p.pth", "--activation", "relu", "--action-bound-method", "tanh",
                     "-o", tmp_path / "a.onnx")
    assert refused.exit_code == 3 and "obs_rms.mean has shape (4,); the actor reads 11 observations" in refused.output


def test_convert_verify_pack_and_the_packed_run_on_the_cli(tmp_path):
    topics = convert_verify_pack(tmp_path, path("ppo_obs_rms"), "--activation", "tanh", "--action-bound-method", "clip",
                                   "--action-bounds", BOUNDS)
    assert topics == ["activation", "head", "action bounds"]


@pytest.mark.slow
def test_tianshous_own_policy_agrees_now(tmp_path, obs):
    """Tianshou's policy, loaded from the saved files by the installed Tianshou, against the graph: the
    obs_rms run through RunningMeanStd.norm, and the whole pickled policy.pt read with --trust."""
    pytest.importorskip("tianshou")
    import torch
    from tianshou.data import Batch

    make_fixtures = fixture_script(TS)
    algorithm = make_fixtures.continuous(torch.nn.Tanh, conditioned_sigma=False, bound="clip")
    saved = torch.load(path("ppo_obs_rms"), weights_only=False)
    algorithm.load_state_dict(saved["model"])
    algorithm.policy.eval()
    with torch.no_grad():
        want = algorithm.policy.map_action(algorithm.policy(Batch(obs=saved["obs_rms"].norm(obs), info={})).act)
    converted = convert("ppo_obs_rms", action_bounds=(LOW, HIGH))
    out = pp.load(converted, "onnxruntime").run({"obs": obs})
    assert np.abs(out["action"] - want).max() <= 1e-5
    held = {k: v.numpy() for k, v in saved["model"].items() if k.startswith("policy.actor.")}
    held.update({f"obs_rms.{k}": np.asarray(getattr(saved["obs_rms"], k)) for k in ("mean", "var", "count")})
    _same_arrays(pp.extract_weights(converted), held)
    # whole pickled objects, read with --trust: the activation, bound method and bounds are their own
    whole = torch.load(TS / "ppo_discrete" / "policy.pt", weights_only=False)
    whole.policy.eval()
    with torch.no_grad():
        want = whole.policy.map_action(whole.policy(Batch(obs=obs, info={})).act)
    trusted = convert_source(TS / "ppo_discrete" / "policy.pt", trust=True)
    assert (pp.load(trusted.model).run({"obs": obs})["action"] == want).all()
    assert any("activation relu" in note for note in trusted.notes)
    torch.save(algorithm, tmp_path / "policy.pt")
    with torch.no_grad():
        want = algorithm.policy.map_action(algorithm.policy(Batch(obs=obs, info={})).act)
    trusted = convert_source(tmp_path / "policy.pt", trust=True)
    assert np.abs(pp.load(trusted.model).run({"obs": obs})["action"] - want).max() <= 1e-5
    assert [a.topic for a in trusted.assumptions] == ["observation normalisation"]
    with pytest.raises(pp.OptionError, match="contradicts"):
        convert_source(tmp_path / "policy.pt", trust=True, action_bound_method="tanh")
