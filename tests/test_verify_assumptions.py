"""What a verdict against a source claims: every assumption of either side is named, by who makes it;
an assumption the framework's own code computed is tested on the compared observations only, and the
verdict says so; two sides that assume different things on a topic are said to differ there; a
source kind whose file cannot record a normaliser applied outside the network assumes none.

Every expected policy output here is computed by the framework itself (torch running the module,
SB3's own policy and VecNormalize), never by policyport's reconstruction.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.verification.compare import verdict
from policyport.converter import convert_source

torch = pytest.importorskip("torch")
nn = torch.nn

ROOT = Path(__file__).resolve().parents[1]


def invoke(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, " ".join(result.output.split())


def sides(report) -> list[tuple[str, str, bool, bool]]:
    return [(a["topic"], a["side"], a["checked"], a["differs"]) for a in report.assumptions]


# ------------------------------------------------------------------ a normaliser outside the network


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """An nn.Sequential (Tanh, then ReLU): its state_dict, the module as TorchScript and pickled whole,
    observations, and torch's own output on them."""
    folder = tmp_path_factory.mktemp("mixed")
    torch.manual_seed(3)
    module = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3)).eval()
    torch.save(module.state_dict(), folder / "seq.pt")
    torch.jit.save(torch.jit.script(module), str(folder / "seq.torchscript.pt"))
    torch.save(module, folder / "whole.pt")
    obs = np.random.default_rng(0).uniform(-2, 2, (300, 6)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(obs)).numpy()
    return folder, module, obs, expected


def _torch_sources(folder, module):
    return {"torch module": (module, {}), "TorchScript file": (folder / "seq.torchscript.pt", {"trust": True}),
            "whole pickled module": (folder / "whole.pt", {"trust": True})}


@pytest.mark.parametrize("kind", ["torch module", "TorchScript file", "whole pickled module"])
def test_a_torch_module_assumes_no_normaliser_outside_it_and_its_oracle_does_not_check_one(mixed, kind):
    folder, module, obs, expected = mixed
    source, options = _torch_sources(folder, module)[kind]
    c = convert_source(source, **options)
    np.testing.assert_allclose(pp.load(c.model).run({"obs": obs})["logits"], expected, atol=1e-5, rtol=1e-5)
    recorded = json.loads({p.key: p.value for p in c.model.metadata_props}["policyport.assumptions"])
    assert [(a["topic"], a["assumes"]) for a in recorded] == [("observation normalisation", "none")]
    assert "a normaliser applied to the observations outside it (an environment wrapper such as gymnasium's " \
           "NormalizeObservation, which CleanRL's scripts train under) is not in it" in recorded[0]["because"]
    assert c.oracle.framework and c.oracle.checks == frozenset({"activation", "layout"})
    report = pp.verify(c.model, obs, reference=c.reference, reference_oracle=c.oracle)
    assert report.passed and sides(report) == [("observation normalisation", "both", False, False)]
    assert ", given observation normalisation none: " in verdict(report)


@pytest.mark.parametrize("source, kind", [("mlp_norm.keras", "keras"), ("savedmodel", "savedmodel")])
def test_a_keras_model_or_savedmodel_assumes_no_normaliser_outside_it(source, kind):
    pytest.importorskip("tensorflow")
    c = convert_source(ROOT / "fixtures" / "keras" / source, trust=kind == "savedmodel")
    assert c.kind == kind
    assert [(a.topic, a.assumes) for a in c.assumptions] == [("observation normalisation", "none")]
    assert c.assumptions[0].because.startswith(f"a {'SavedModel' if kind == 'savedmodel' else 'Keras model'} records "
                                               "the network alone: a normaliser applied to the observations outside it")
    assert "observation normalisation" not in c.oracle.checks and c.oracle.framework


def test_a_state_dict_model_against_its_torchscript_module_shares_the_normaliser_and_tests_the_activations(mixed, tmp_path):
    """torch runs the module's own activations (tested, on these observations), not a normaliser
    outside it (both sides assume none), nor the categorical head a state_dict conversion puts on it
    (the module does not compute the action: the model alone assumes it)."""
    folder, _, obs, expected = mixed
    model = tmp_path / "m.onnx"
    assert invoke("convert", folder / "seq.pt", "-o", model, "--activation", "tanh,relu", "--head", "categorical")[0] == 0
    np.testing.assert_array_equal(pp.load(str(model)).run({"obs": obs})["action"], expected.argmax(axis=1))
    report = pp.verify(str(model), obs, source=folder / "seq.torchscript.pt", trust=True)
    assert report.passed
    assert sides(report) == [("activation", "model", True, False), ("layout", "model", True, False),
                             ("head", "model", False, False), ("observation normalisation", "both", False, False)]
    np.save(tmp_path / "obs.npy", obs)
    code, text = invoke("verify", model, "-i", tmp_path / "obs.npy", "--source", folder / "seq.torchscript.pt",
                        "--trust")
    assert code == 0 and "which checked" not in text
    assert ("running the TorchScript module's own forward, which tested, on these observations only: activation tanh "
            "at module 1, relu at module 3: ") in text
    assert "the model and the source side both assume (not in the source file): observation normalisation none: " in text
    assert "the model assumes (the source side makes no assumption on it): head categorical, " in text
    assert (f"PASS against torch {torch.__version__} running the TorchScript module's own forward, given head "
            "categorical, action = argmax of module 4's 3 outputs; observation normalisation none; tested on these "
            "observations only: activation tanh at module 1, relu at module 3; layout nothing after module 4, the last "
            "layer: ") in text


# ------------------------------------------------------------ tested on these observations only


sb3 = pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")


@pytest.fixture(scope="module")
def shifted(tmp_path_factory):
    """SB3's Pendulum PPO with its action_net bias moved so that the Gaussian means straddle the upper
    bound 2: the zip, its bare policy.pth, the activation SB3 built it with, and observations whose
    means SB3's own policy puts inside the bounds and outside them."""
    from stable_baselines3 import PPO

    folder = tmp_path_factory.mktemp("shifted")
    policy = PPO.load(str(ROOT / "fixtures" / "sb3" / "ppo_pendulum.zip"), device="cpu")
    obs = np.random.default_rng(4).uniform([-1, -1, -8], [1, 1, 8], (2000, 3)).astype(np.float32)

    def means() -> np.ndarray:
        with torch.no_grad():
            return policy.policy.get_distribution(torch.from_numpy(obs)).distribution.mean.numpy()[:, 0]

    with torch.no_grad():
        policy.policy.action_net.bias += float(2.0 - np.median(means()))
    mean = means()
    policy.save(folder / "shifted.zip")
    with zipfile.ZipFile(folder / "shifted.zip") as zf:
        (folder / "policy.pth").write_bytes(zf.read("policy.pth"))
    activation = {nn.ReLU: "relu", nn.Tanh: "tanh"}[policy.policy.activation_fn]
    inside, outside = obs[np.abs(mean) < 2], obs[np.abs(mean) > 2]
    clipped, _ = policy.predict(outside, deterministic=True)
    assert len(inside) > 100 and len(outside) > 100 and np.abs(clipped[:, 0] - mean[np.abs(mean) > 2]).min() > 0
    return folder, activation, inside, outside


def test_a_pass_of_the_frameworks_own_code_names_what_it_tested_on_these_observations_only(shifted, tmp_path):
    """policy.pth assumes the unclipped mean; SB3's own predict clips to the bounds. On observations
    whose means stay inside them the model passes, and the verdict keeps the assumption, tested on
    these observations only; on observations whose means leave them it fails."""
    folder, activation, inside, outside = shifted
    model = tmp_path / "pth.onnx"
    assert invoke("convert", folder / "policy.pth", "-o", model, "--activation", activation)[0] == 0
    report = pp.verify(str(model), inside, source=folder / "shifted.zip")
    assert report.passed
    bounds = next(a for a in report.assumptions if a["topic"] == "action bounds")
    assert (bounds["assumes"], bounds["side"], bounds["checked"]) == (
        "none: the action is the Gaussian mean, unclipped", "model", True)
    assert any(note.startswith(f"the source side's own code tested what the model assumes on the {len(inside):,} "
                               "observations compared only, and an assumption they do not exercise")
               for note in report.notes)
    text = verdict(report)
    assert text.startswith(f"PASS against SB3 {sb3.__version__}'s own ActorCriticPolicy.predict(deterministic=True), "
                           f"given activation {activation} at modules mlp_extractor.policy_net.1 and "
                           "mlp_extractor.policy_net.3; observation normalisation none; tested on these observations "
                           "only: action bounds none: the action is the Gaussian mean, unclipped: ")
    np.save(tmp_path / "inside.npy", inside)
    code, said = invoke("verify", model, "-i", tmp_path / "inside.npy", "--source", folder / "shifted.zip")
    assert code == 0 and "which tested, on these observations only: action bounds none: " in said
    assert "which checked" not in said

    failed = pp.verify(str(model), outside, source=folder / "shifted.zip")
    assert not failed.passed and failed.first_divergence.tensor == "action"
    assert "; tested on these observations only: action bounds none: " in verdict(failed)


# ----------------------------------------------------------------------- sides that assume differently


@pytest.fixture(scope="module")
def normalised(tmp_path_factory):
    """A Pendulum PPO saved with the VecNormalize statistics it acts under (far from the identity), in
    a folder whose name holds a space, with its bare policy.pth; observations, and SB3's own actions
    with and without the statistics."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    folder = tmp_path_factory.mktemp("normalised") / "my runs"
    folder.mkdir()
    venv = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    venv.obs_rms.mean = np.array([-0.3, 0.1, 0.8])
    venv.obs_rms.var = np.array([0.4, 0.3, 6.0])
    model = PPO("MlpPolicy", venv, seed=2, device="cpu")
    with torch.no_grad():
        weight = model.policy.action_net.weight
        weight.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(1)))
    model.save(folder / "policy.zip")
    venv.save(str(folder / "vec_normalize.pkl"))
    with zipfile.ZipFile(folder / "policy.zip") as zf:
        (folder / "policy.pth").write_bytes(zf.read("policy.pth"))
    obs = np.random.default_rng(9).uniform([-1, -1, -8], [1, 1, 8], (200, 3)).astype(np.float32)
    statistics = VecNormalize.load(str(folder / "vec_normalize.pkl"), DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    policy = PPO.load(str(folder / "policy.zip"), device="cpu")
    with_statistics, _ = policy.predict(statistics.normalize_obs(obs), deterministic=True)
    without, _ = policy.predict(obs, deterministic=True)
    return folder, obs, with_statistics, without


def test_sides_that_assume_different_normalisers_are_said_to_differ_which_explains_the_fail(normalised, monkeypatch,
                                                                                             tmp_path):
    folder, obs, with_statistics, without = normalised
    assert np.abs(with_statistics - without).max() > 0.1  # SB3's own actions: the statistics change the policy
    monkeypatch.chdir(folder)
    model = convert_source("policy.zip").model
    np.testing.assert_allclose(pp.load(model).run({"obs": obs})["action"], with_statistics, atol=1e-5, rtol=1e-5)
    report = pp.verify(model, obs, source=folder / "policy.pth")
    assert not report.passed
    assert report.disagreements == [{"topic": "observation normalisation",
                                     "model": ["VecNormalize statistics of vec_normalize.pkl"], "source": ["none"]}]
    assert [(t, s, d) for t, s, _, d in sides(report) if t == "observation normalisation"] == [
        ("observation normalisation", "model", True), ("observation normalisation", "source", True)]
    assert ("the model and the source side assume differently on observation normalisation (the model: VecNormalize "
            "statistics of vec_normalize.pkl; the source side: none): they compute different things there, so a "
            "mismatch may come from that difference alone") in report.notes
    assert ("; the model and the source side assume differently on observation normalisation (the model: VecNormalize "
            "statistics of vec_normalize.pkl; the source side: none): ") in verdict(report)
    assert report.to_dict()["disagreements"] == report.disagreements

    onnx_path = tmp_path / "m.onnx"
    import onnx

    onnx.save(model, onnx_path)
    code, text = invoke("verify", onnx_path, "--source", folder / "policy.pth", "--samples", "20")
    assert code == 1 and "the model and the source side both assume" not in text
    assert ("the model and the source side assume differently (they compute different things there): the model: "
            "observation normalisation VecNormalize statistics of vec_normalize.pkl: ") in text
    assert "the source side: observation normalisation none: a state_dict holds no normaliser statistics" in text


def test_one_statistics_file_named_relatively_and_absolutely_is_one_shared_assumption(normalised, monkeypatch):
    folder, obs, _, _ = normalised
    monkeypatch.chdir(folder)
    model = convert_source("policy.zip").model  # found as vec_normalize.pkl
    report = pp.verify(model, obs, source=folder / "policy.zip")  # found as <folder>/vec_normalize.pkl
    assert report.passed and not report.disagreements
    assert sides(report) == [("observation normalisation", "both", False, False)]
    assert report.assumptions[0]["assumes"] == "VecNormalize statistics of vec_normalize.pkl"
    copied = folder.parent / "copied"  # the same statistics copied along with the policy: the same assumption
    shutil.copytree(folder, copied)
    assert sides(pp.verify(model, obs, source=copied / "policy.zip")) == [("observation normalisation", "both", False,
                                                                           False)]


def test_other_statistics_beside_the_source_are_a_disagreement(normalised, monkeypatch, tmp_path):
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    folder, obs, _, _ = normalised
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(folder / "policy.zip", other / "policy.zip")
    statistics = VecNormalize.load(str(folder / "vec_normalize.pkl"), DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    statistics.obs_rms.mean = statistics.obs_rms.mean + 1.0
    statistics.save(str(other / "vec_normalize.pkl"))
    monkeypatch.chdir(folder)
    model = convert_source("policy.zip").model
    report = pp.verify(model, obs, source=other / "policy.zip")
    assert not report.passed
    assert report.disagreements == [{"topic": "observation normalisation",
                                     "model": ["VecNormalize statistics of vec_normalize.pkl"],
                                     "source": [f"VecNormalize statistics of {other / 'vec_normalize.pkl'}"]}]
