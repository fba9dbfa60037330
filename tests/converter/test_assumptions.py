"""A PASS means the trained policy: what a converter takes from anywhere but the file is an assumption,
named in the output, the model's metadata and every verdict, or refused (exit 2) where a wrong guess is
plausible; the source side of a verification is the framework's own code where it is installed.

Every expected action here is computed by the framework itself (torch running the module, SB3's own
``PPO.load`` and ``VecNormalize.load``), never by policyport's reconstruction.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter import convert_source

torch = pytest.importorskip("torch")
nn = torch.nn

ROOT = Path(__file__).resolve().parents[2]
SB3_DIR = ROOT / "fixtures" / "sb3"
METADRIVE = ROOT / "fixtures" / "real" / "metadrive_ppo_expert.npz"
KERAS_DIR = ROOT / "fixtures" / "keras"


def invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def metadata(model) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def assumed(model) -> dict[str, str]:
    """topic -> what the model's metadata says it assumes."""
    return {a["topic"]: a["assumes"] for a in json.loads(metadata(model)["policyport.assumptions"])}


# --------------------------------------------------------------------------------- nn.Sequential


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """An nn.Sequential whose two activation modules differ (Tanh, ReLU): its state_dict, the same
    module as TorchScript, observations, and torch's own output on them."""
    folder = tmp_path_factory.mktemp("mixed")
    torch.manual_seed(3)
    module = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    torch.save(module.state_dict(), folder / "seq.pt")
    torch.jit.save(torch.jit.script(module), folder / "seq.torchscript.pt")
    obs = np.random.default_rng(0).uniform(-3, 3, (500, 8)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(obs)).numpy()
    return folder, obs, expected


def test_one_activation_name_for_several_modules_is_refused_naming_the_list(mixed, tmp_path):
    folder, _, _ = mixed
    result = invoke("convert", folder / "seq.pt", "-o", tmp_path / "m.onnx", "--activation", "tanh")
    assert result.exit_code == 2
    assert ("nn.Sequential: --activation tanh names one activation, and 2 parameter-free modules at 1, 3 each hold one "
            "that the state_dict cannot tell (an nn.Sequential may mix them); give one per module, in order: "
            "--activation tanh,tanh if they are all tanh") in " ".join(result.output.split())
    assert not (tmp_path / "m.onnx").exists()
    with pytest.raises(pp.OptionError):
        pp.convert(folder / "seq.pt", activation="tanh")


def test_the_activations_named_per_module_give_torchs_own_output(mixed):
    folder, obs, expected = mixed
    model = pp.convert(folder / "seq.pt", activation="tanh,relu")
    got = pp.load(model).run({"obs": obs})["logits"]
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
    assert assumed(model)["activation"] == "tanh at module 1, relu at module 3"


def test_a_wrong_list_passes_only_against_the_reconstruction_that_assumes_it(mixed, tmp_path):
    """tanh,tanh is a wrong guess (the module has ReLU at 3): the action is off, the reconstruction
    (which makes the same assumption) passes and says so, torch's own TorchScript module fails it."""
    folder, obs, expected = mixed
    model_path = tmp_path / "wrong.onnx"
    assert invoke("convert", folder / "seq.pt", "-o", model_path, "--activation", "tanh,tanh").exit_code == 0
    wrong = pp.load(str(model_path)).run({"obs": obs})["logits"]
    assert np.abs(wrong - expected).max() > 0.05  # the guess changes the policy

    circular = pp.verify(str(model_path), obs, source=folder / "seq.pt")
    assert circular.passed
    assert circular.source_oracle == {"name": "policyport's reconstruction from the state_dict's arrays, run in torch "
                                      "modules", "framework": False, "checks": []}
    assert [(a["topic"], a["assumes"], a["checked"]) for a in circular.assumptions] == [
        ("activation", "tanh at modules 1 and 3", False), ("layout", "nothing after module 4, the last layer", False),
        ("observation normalisation", "none", False)]
    text = invoke("verify", model_path, "-i", _npy(tmp_path, obs), "--source", folder / "seq.pt").output
    assert "PASS against a reconstruction that assumes activation tanh at modules 1 and 3; layout nothing after " \
           "module 4, the last layer; observation normalisation none: " in " ".join(text.split())

    oracle = pp.verify(str(model_path), obs, source=folder / "seq.torchscript.pt", trust=True)
    assert not oracle.passed and oracle.source_oracle["framework"]
    assert oracle.source_oracle["name"] == f"torch {torch.__version__} running the TorchScript module's own forward"
    # torch runs the module's own activations; a normaliser outside the module it cannot know of: both sides assume none
    assert [(a["topic"], a["side"], a["checked"]) for a in oracle.assumptions] == [
        ("activation", "model", True), ("layout", "model", True), ("observation normalisation", "both", False)]
    result = invoke("verify", model_path, "-i", _npy(tmp_path, obs), "--source", folder / "seq.torchscript.pt",
                    "--trust")
    assert result.exit_code == 1
    assert "FAIL against torch" in result.output and "checked against" not in result.output.split("FAIL")[1]


def _npy(folder: Path, obs: np.ndarray) -> Path:
    path = folder / "obs.npy"
    np.save(path, obs)
    return path


# ---------------------------------------------------------------------------------- CleanRL actor


@pytest.fixture(scope="module")
def cleanrl_actor(tmp_path_factory):
    """CleanRL's continuous PPO actor (``cleanrl/ppo_continuous_action.py``): ``actor_mean`` ends in a
    6-wide Linear, the mean; the log std is the separate parameter ``actor_logstd``. The file holds
    ``actor_mean``'s state_dict."""
    folder = tmp_path_factory.mktemp("cleanrl")
    torch.manual_seed(5)
    actor_mean = nn.Sequential(nn.Linear(17, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 6)).eval()
    torch.save(actor_mean.state_dict(), folder / "cleanrl_actor.pt")
    obs = np.random.default_rng(1).normal(size=(300, 17)).astype(np.float32)
    with torch.no_grad():
        mean = actor_mean(torch.from_numpy(obs)).numpy()
    return folder / "cleanrl_actor.pt", obs, mean


def test_a_gaussian_split_without_evidence_is_refused_naming_the_options(cleanrl_actor, tmp_path):
    path, _, _ = cleanrl_actor
    result = invoke("convert", path, "-o", tmp_path / "m.onnx", "--activation", "tanh,tanh", "--head", "diag-gaussian")
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert ("--head diag-gaussian: nothing in the state_dict says that module 4's 6 outputs are a mean and a log_std "
            "half") in said
    assert "say so with --head diag-gaussian:halves" in said and "--head none exports them as logits" in said
    assert not (tmp_path / "m.onnx").exists()


def test_the_actor_mean_converts_whole_and_equals_torch(cleanrl_actor):
    path, obs, mean = cleanrl_actor
    model = pp.convert(path, activation="tanh,tanh", head="none")
    out = pp.load(model).run({"obs": obs})
    assert list(out) == ["logits"] and out["logits"].shape == (300, 6)
    np.testing.assert_allclose(out["logits"], mean, atol=1e-5, rtol=1e-5)


def test_halves_state_the_split_and_the_model_names_it(cleanrl_actor):
    path, obs, mean = cleanrl_actor
    c = convert_source(path, activation="tanh,tanh", head="diag-gaussian:halves")
    out = pp.load(c.model).run({"obs": obs})
    np.testing.assert_array_equal(out["action"], out["logits"][:, :3])
    np.testing.assert_allclose(out["action"], mean[:, :3], atol=1e-5, rtol=1e-5)
    assert assumed(c.model)["head"] == "diagonal Gaussian, module 4 = [mean (3, the action), log_std (3)]"
    assert metadata(c.model)["policyport.head"] == "diag-gaussian"
    assert [a.because for a in c.assumptions if a.topic == "head"] == ["given by --head diag-gaussian:halves"]


# ------------------------------------------------------------------------------ SB3 + VecNormalize


sb3 = pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")


@pytest.fixture(scope="module")
def vecnorm(tmp_path_factory):
    """A PPO Pendulum policy saved by SB3 with the VecNormalize statistics it acts under, as SB3's
    documentation saves them (``model.save``, ``vec_env.save``): its action_net drawn at unit scale so
    that the actions span the bounds, and statistics far from the identity, so a missing normaliser shows.
    Observations over Pendulum's space, and SB3's own deterministic action computed by ``PPO.load``
    and ``VecNormalize.load``, with and without the statistics."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    folder = tmp_path_factory.mktemp("vecnorm")
    venv = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    venv.obs_rms.mean = np.array([-0.3, 0.1, 0.8])
    venv.obs_rms.var = np.array([0.4, 0.3, 6.0])
    model = PPO("MlpPolicy", venv, seed=11, device="cpu")
    with torch.no_grad():  # SB3 starts action_net at gain 0.01: actions near 0 whatever the observation
        weight = model.policy.action_net.weight
        weight.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)))
    model.save(folder / "policy.zip")
    venv.save(str(folder / "vec_normalize.pkl"))

    obs = np.random.default_rng(7).uniform([-1, -1, -8], [1, 1, 8], (400, 3)).astype(np.float32)
    loaded = VecNormalize.load(str(folder / "vec_normalize.pkl"), DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    policy = PPO.load(str(folder / "policy.zip"), device="cpu")
    expected, _ = policy.predict(loaded.normalize_obs(obs), deterministic=True)
    unnormalised, _ = policy.predict(obs, deterministic=True)
    return folder / "policy.zip", folder / "vec_normalize.pkl", obs, expected, unnormalised


#: Where SB3's documentation and RL Zoo put the statistics of ``<folder>/<zip>``: (zip name, pkl path).
PLACES = {
    "sb3-docs": ("policy.zip", "vec_normalize.pkl"),
    "beside": ("policy.zip", "vecnormalize.pkl"),
    "rl-zoo": ("Pendulum-v1.zip", "Pendulum-v1/vecnormalize.pkl"),
    "checkpoint-callback": ("rl_model_512_steps.zip", "rl_model_vecnormalize_512_steps.pkl"),
    "rl-zoo-best-model": ("best_model.zip", "Pendulum-v1/vecnormalize.pkl"),
}


def _placed(tmp_path: Path, vecnorm, zip_name: str, pkl: str) -> Path:
    policy, statistics = vecnorm[:2]
    shutil.copy(policy, tmp_path / zip_name)
    (tmp_path / pkl).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(statistics, tmp_path / pkl)
    if zip_name == "best_model.zip":
        (tmp_path / "Pendulum-v1" / "config.yml").write_text("!!python/object/apply:collections.OrderedDict []\n")
    return tmp_path / zip_name


@pytest.mark.parametrize("place", list(PLACES))
def test_a_normaliser_where_sb3_and_rl_zoo_save_it_is_found_and_named(place, tmp_path, vecnorm):
    *_, obs, expected, unnormalised = vecnorm
    path = _placed(tmp_path, vecnorm, *PLACES[place])
    c = convert_source(path)
    got = pp.load(c.model).run({"obs": obs})["action"]
    assert np.abs(expected - unnormalised).max() > 0.5  # without the statistics the action is another
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
    norm = tmp_path / PLACES[place][1]
    assert assumed(c.model)["observation normalisation"] == f"VecNormalize statistics of {norm}"
    assert c.oracle.framework and c.oracle.name == f"SB3 {sb3.__version__}'s own ActorCriticPolicy.predict(deterministic=True)"
    report = pp.verify(c.model, obs, reference=c.reference, reference_oracle=c.oracle)
    assert report.passed and report.source_oracle["framework"]
    assert [a["topic"] for a in report.shared_assumptions] == ["observation normalisation"]


def test_two_normalisers_that_disagree_are_refused(tmp_path, vecnorm):
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    path = _placed(tmp_path, vecnorm, "policy.zip", "vec_normalize.pkl")
    other = VecNormalize.load(str(vecnorm[1]), DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    other.obs_rms.mean = other.obs_rms.mean + 1.0
    (tmp_path / "policy").mkdir()
    other.save(str(tmp_path / "policy" / "vecnormalize.pkl"))
    result = invoke("convert", path, "-o", tmp_path / "m.onnx")
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert f"VecNormalize files found for policy.zip disagree: {tmp_path / 'policy' / 'vecnormalize.pkl'} and " \
           f"{tmp_path / 'vec_normalize.pkl'} hold other statistics" in said
    assert "--obs-norm FILE" in said and "--no-filter" in said and not (tmp_path / "m.onnx").exists()
    chosen = convert_source(path, obs_norm=str(tmp_path / "vec_normalize.pkl"))
    assert assumed(chosen.model)["observation normalisation"] == f"VecNormalize statistics of {tmp_path / 'vec_normalize.pkl'}"


def test_the_same_statistics_in_two_places_are_used_and_both_named(tmp_path, vecnorm):
    path = _placed(tmp_path, vecnorm, "policy.zip", "vec_normalize.pkl")
    shutil.copy(vecnorm[1], tmp_path / "vecnormalize.pkl")
    c = convert_source(path)
    assert "the same statistics as" in c.assumptions[-1].because
    assert str(tmp_path / "vec_normalize.pkl") in c.assumptions[-1].because + c.assumptions[-1].assumes


def test_a_normaliser_of_another_width_is_refused(tmp_path, vecnorm):
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    shutil.copy(vecnorm[0], tmp_path / "policy.zip")
    VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")])).save(str(tmp_path / "vec_normalize.pkl"))
    result = invoke("convert", tmp_path / "policy.zip", "-o", tmp_path / "m.onnx")
    assert result.exit_code == 2
    assert "normalises observations of shape (4,), and the policy takes 3 features: it is not this policy's" in \
        " ".join(result.output.split())


def test_no_normaliser_found_and_one_left_out_are_assumptions(tmp_path, vecnorm):
    shutil.copy(vecnorm[0], tmp_path / "policy.zip")
    none = convert_source(tmp_path / "policy.zip")
    a = none.assumptions[-1]
    assert (a.topic, a.assumes, a.settle) == ("observation normalisation", "none", "--obs-norm FILE bakes one in")
    assert a.because.startswith(f"no VecNormalize statistics where SB3 and RL Zoo save them ({tmp_path / 'policy' / 'vecnormalize.pkl'}")
    path = _placed(tmp_path, vecnorm, "policy.zip", "vec_normalize.pkl")
    left = convert_source(path, obs_filter=False)
    assert left.assumptions[-1].because == f"left out by --no-filter ({tmp_path / 'vec_normalize.pkl'} would be baked in otherwise)"
    assert not any(n.output[0].startswith("vec_normalize/") for n in left.model.graph.node)


def test_convert_json_and_verify_name_the_oracle_and_the_assumptions(tmp_path, vecnorm):
    obs = vecnorm[2]
    path = _placed(tmp_path, vecnorm, "policy.zip", "vec_normalize.pkl")
    doc = json.loads(invoke("convert", path, "-o", tmp_path / "m.onnx", "--json", "--samples", "50").stdout)
    assert doc["source_oracle"]["framework"] is True
    assert [a["topic"] for a in doc["assumptions"]] == ["observation normalisation"]
    assert doc["verification"]["assumptions"][0]["checked"] is False
    obs_path = _npy(tmp_path, obs)
    verdict = invoke("verify", tmp_path / "m.onnx", "-i", obs_path, "--source", path).output
    assert f"PASS against SB3 {sb3.__version__}'s own ActorCriticPolicy.predict(deterministic=True), given observation " \
           f"normalisation VecNormalize statistics of {tmp_path / 'vec_normalize.pkl'}: " in " ".join(verdict.split())
    plain = invoke("verify", tmp_path / "m.onnx", "-i", obs_path).output
    assert "the model assumes (not in its source file):" in plain


# ------------------------------------------------------------------------- the same on every kind


def test_weights_that_do_not_record_their_activation_need_it(tmp_path):
    for source, kind in ((METADRIVE, "npz"), (ROOT / "fixtures" / "torch" / "rllib_fcnet.state_dict.pt", "rllib-torch")):
        result = invoke("convert", source, "-o", tmp_path / "m.onnx", "--from", kind)
        assert result.exit_code == 2, result.output
        assert "--activation" in result.output and "does not record the activation" in " ".join(result.output.split())
    converted = convert_source(METADRIVE, activation="tanh", head="diag-gaussian")
    assert [(a.topic, a.assumes) for a in converted.assumptions] == [
        ("activation", "tanh at fc_1 and fc_2"),
        ("head", "diagonal Gaussian, fc_out = [mean (2, the action), log_std (2)]"),
        ("observation normalisation", "none")]
    assert converted.assumptions[1].because == ("given by --head; RLlib's DiagGaussian splits its inputs so "
                                                "(ray/rllib/models/tf/tf_action_dist.py)")
    assert not converted.oracle.framework


def test_inspect_shows_the_layers_of_weights_that_need_an_activation(tmp_path):
    result = invoke("inspect", METADRIVE)
    assert result.exit_code == 0, result.output
    assert "does not record its activation: its layers are shown without one" in " ".join(result.output.split())
    assert "137,476 parameters" in result.output  # 275*256+256 + 256*256+256 + 256*4+4


def test_an_sb3_state_dict_names_what_its_zip_would_have_told(tmp_path):
    import zipfile

    with zipfile.ZipFile(SB3_DIR / "ppo_pendulum.zip") as zf:
        (tmp_path / "policy.pth").write_bytes(zf.read("policy.pth"))
    result = invoke("convert", tmp_path / "policy.pth", "-o", tmp_path / "m.onnx")
    assert result.exit_code == 2 and "convert the SB3 zip, whose policy_kwargs record it" in " ".join(result.output.split())
    c = convert_source(tmp_path / "policy.pth", activation="tanh")
    assert assumed(c.model) == {"activation": "tanh at modules mlp_extractor.policy_net.1 and mlp_extractor.policy_net.3",
                                "action bounds": "none: the action is the Gaussian mean, unclipped",
                                "observation normalisation": "none"}


def test_an_rllib_checkpoint_left_unfiltered_says_so():
    checkpoint = ROOT / "fixtures" / "rllib" / "legacy" / "checkpoint_000120"
    filtered = convert_source(checkpoint)
    assert "observation normalisation" not in assumed(filtered.model)
    unfiltered = convert_source(checkpoint, obs_filter=False)
    assert assumed(unfiltered.model)["observation normalisation"] == "none"
    assert "the checkpoint's MeanStdFilter is not applied" in unfiltered.assumptions[-1].because
    headed = convert_source(checkpoint, head="diag-gaussian")  # the checkpoint records no action space
    assert assumed(headed.model)["head"].startswith("diagonal Gaussian, fc_out = [mean")


def test_a_keras_head_split_needs_saying(tmp_path):
    pytest.importorskip("tensorflow")
    source = KERAS_DIR / "mlp_activations.keras"
    with pytest.raises(pp.OptionError, match="say so with --head diag-gaussian:halves"):
        convert_source(source, head="diag-gaussian")
    c = convert_source(source, head="diag-gaussian:halves")
    assert assumed(c.model)["head"].startswith("diagonal Gaussian, ")
    assert c.oracle.framework and "running the Keras model's own layers" in c.oracle.name
    categorical = convert_source(source, head="categorical")
    assert assumed(categorical.model)["head"].startswith("categorical, action = argmax of ")
    plain = convert_source(source)  # a normaliser outside the model is not in its file
    assert assumed(plain.model) == {"observation normalisation": "none"}
    assert plain.assumptions[0].because.startswith("a Keras model records the network alone: a normaliser applied to "
                                                   "the observations outside it")
    assert plain.oracle.checks == frozenset({"activation", "layout"})


def test_a_torch_module_assumes_no_outside_normaliser_and_is_its_own_oracle(mixed, tmp_path):
    """A module's file cannot record a normaliser applied to the observations outside it (gymnasium's
    NormalizeObservation wrapper, which CleanRL trains under): that is assumed, and named in the PASS."""
    folder, obs, expected = mixed
    c = convert_source(folder / "seq.torchscript.pt", trust=True)
    assert assumed(c.model) == {"observation normalisation": "none"}
    assert "NormalizeObservation" in c.assumptions[0].because
    assert c.oracle.checks == frozenset({"activation", "layout"})
    report = pp.verify(c.model, obs, reference=c.reference, reference_oracle=c.oracle)
    assert report.passed and [(a["topic"], a["side"], a["checked"]) for a in report.assumptions] == [
        ("observation normalisation", "both", False)]
    from policyport.verification.compare import verdict

    assert verdict(report).startswith(f"PASS against torch {torch.__version__} running the TorchScript module's own "
                                      "forward, given observation normalisation none: ")
    module = torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()  # a live module, and a whole pickled one, alike
    assert assumed(convert_source(module).model) == {"observation normalisation": "none"}
    torch.save(module, tmp_path / "whole.pt")
    assert assumed(convert_source(tmp_path / "whole.pt", trust=True).model) == {"observation normalisation": "none"}


def test_a_packed_folder_carries_the_assumptions(tmp_path, mixed):
    folder, obs, _ = mixed
    model = tmp_path / "m.onnx"
    assert invoke("convert", folder / "seq.pt", "-o", model, "--activation", "tanh,relu").exit_code == 0
    assert invoke("pack", model, "-o", tmp_path / "bundle", "--samples", "8", "--source", folder / "seq.pt").exit_code == 0
    policy = json.loads((tmp_path / "bundle" / "policy.json").read_text())
    assert [a["assumes"] for a in policy["assumptions"]] == ["tanh at module 1, relu at module 3",
                                                             "nothing after module 4, the last layer", "none"]
    assert policy["parity"]["source_oracle"]["framework"] is False
    result = invoke("verify", tmp_path / "bundle")
    assert result.exit_code == 0 and "activation tanh at module 1, relu at module 3" in " ".join(result.output.split())


def test_a_model_converted_when_weights_defaulted_to_tanh_verifies_with_the_activation_it_used():
    """Models written before an .npz needed --activation record no activation option, but name the one
    they were built with (``policyport.activation``); verify --source rebuilds the source with it."""
    from policyport.converter import OPTIONS_KEY

    model = pp.convert(METADRIVE, activation="tanh", head="diag-gaussian")
    for prop in model.metadata_props:
        if prop.key == OPTIONS_KEY:
            options = json.loads(prop.value)
            prop.value = json.dumps({**options, "activation": None})
    obs = np.random.default_rng(0).uniform(0, 1, (20, 275)).astype(np.float32)
    report = pp.verify(model, obs, source=METADRIVE)
    assert report.passed and report.comparisons
    assert [a["assumes"] for a in report.assumptions][0] == "tanh at fc_1 and fc_2"


def test_inspect_names_what_the_model_assumes(tmp_path):
    model = tmp_path / "m.onnx"
    assert invoke("convert", METADRIVE, "-o", model, "--activation", "relu", "--samples", "8").exit_code == 0
    text = " ".join(invoke("inspect", model).output.split())
    assert "the model assumes (not in its source file): activation relu at fc_1 and fc_2: given by --activation" in text
    doc = json.loads(invoke("inspect", model, "--json").stdout)
    assert [a["topic"] for a in json.loads(doc["metadata"]["policyport.assumptions"])] == [
        "activation", "observation normalisation"]


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


@pytest.mark.parametrize("source, shown", [
    ("tianshou/a2c_tanh/policy_state_dict.pt", "--activation linear, --action-bound-method none"),
    ("sample_factory/train_dir/discrete_relu/checkpoint_p0/checkpoint_000000050_409600.pth",
     "--activation linear, --head categorical"),
    ("torchrl/tanh_normal.pt", "--activation linear, --distribution normal"),
])
def test_inspect_shows_the_layers_of_a_source_that_needs_options_its_file_does_not_settle(source, shown):
    from policyport.converter import convert_source
    from policyport.errors import OptionNeeded

    path = FIXTURES / source
    with pytest.raises(OptionNeeded):  # what convert refuses without the options, inspect shows ...
        convert_source(path, **{k: v for k, v in (("activation", "linear"),)})
    result = invoke("inspect", path)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"its layers are shown with {shown}, which may not be the policy's" in text  # ... saying with what
    assert "policyport convert' needs" in text and "parameters" in text
