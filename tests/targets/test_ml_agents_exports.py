"""ONNX files exported as ML-Agents exports them (``fixtures/ml_agents/export_onnx.py``, following
ml-agents/mlagents/trainers/torch_entities/model_serialization.py) into to-torch: the sampled actions are
left out and said so, the deterministic ones equal the numpy backend's and the actor's own torch outputs
recorded at export time, the normaliser stays buffers and every trained parameter of ML-Agents' actor is an
nn.Parameter under its ML-Agents name that trains."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import policyport as pp

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")

ROOT = Path(__file__).parents[2]
MLA = ROOT / "fixtures/ml_agents"
EXPORTED = MLA / "exports"
#: export -> (the run's checkpoint, the sampled outputs the export also holds)
EXPORTS = {
    "Walker": ("walker_ppo/Walker/Walker-5000.pt", ["continuous_actions"]),
    "Crawler": ("crawler_sac/Crawler/Crawler-3000.pt", ["continuous_actions"]),
    "PushBlock": ("pushblock_discrete/PushBlock/PushBlock-2000.pt", ["discrete_actions"]),
    "Hybrid": ("hybrid_ppo/Hybrid/Hybrid-1000.pt", ["continuous_actions", "discrete_actions"]),
    "Basic": ("basic_discrete/Basic/Basic-1500.pt", ["discrete_actions"]),
    "Walker-0": (None, ["continuous_actions"]),  # as initialised: zero biases merged, one read through Identity
}
#: ML-Agents' actor constants and normaliser statistics: buffers or parameters with requires_grad=False there.
NOT_TRAINED = ("version_number", "is_continuous_int_deprecated", "continuous_act_size_vector", "discrete_act_size_vector",
               "act_size_vector_deprecated", "memory_size_vector", "normalizer.")


def import_policy(folder: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"policy_{abs(hash(folder))}", folder / "policy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", params=list(EXPORTS))
def exported(request, tmp_path_factory):
    name = request.param
    folder = tmp_path_factory.mktemp("mla") / "policy"
    done = pp.to_torch(str(EXPORTED / f"{name}.onnx"), folder)
    return name, done, import_policy(folder).load(), folder


def feeds(name: str, n: int | None = None) -> dict[str, np.ndarray]:
    reference = np.load(EXPORTED / f"{name}.reference.npz")
    return {k.split("/", 1)[1]: reference[k][:n] for k in reference.files if k.startswith("inputs/")}


def test_the_deterministic_actions_equal_ml_agents_own_and_the_numpy_backends(exported):
    name, done, module, _ = exported
    reference = np.load(EXPORTED / f"{name}.reference.npz")
    fed = feeds(name)
    with torch.no_grad():
        got = module(**{k: torch.from_numpy(v) for k, v in fed.items()})
    numpy_out = pp.load(EXPORTED / f"{name}.onnx", "numpy").run(fed)
    sampled = EXPORTS[name][1]
    assert not set(sampled) & set(got)
    compared = 0
    for key in reference.files:
        if not key.startswith("torch32/"):
            continue
        output = key.split("/", 1)[1]
        value = got[output].numpy()
        assert value.dtype == reference[key].dtype and value.shape == reference[key].shape, output
        if value.dtype.kind == "f":  # the actor's torch forward at export time, and the numpy backend
            np.testing.assert_allclose(value, reference[key], atol=2e-6, rtol=1e-6)
            np.testing.assert_allclose(value, numpy_out[output], atol=2e-6, rtol=1e-6)
        else:
            np.testing.assert_array_equal(value, reference[key])
            np.testing.assert_array_equal(value, numpy_out[output])
        compared += 1
    assert compared == len(reference.files) - len(fed)
    assert done.max_abs < 1e-5
    assert done.notes[0].startswith(f"left out the sampled output{'s' if len(sampled) > 1 else ''} {', '.join(sampled)}")


def test_every_trained_parameter_of_the_actor_is_an_nn_parameter_under_its_name_and_trains(exported):
    name, done, module, folder = exported
    if EXPORTS[name][0] is None:  # the actor as ML-Agents initialises it, made again by the fixture script
        import importlib.util

        spec = importlib.util.spec_from_file_location("ml_agents_export_onnx", MLA / "export_onnx.py")
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        policy = script.load_actor(name).state_dict()
    else:
        policy = torch.load(MLA / EXPORTS[name][0], weights_only=False)["Policy"]
    trained = {k for k in policy if not any(part in k for part in NOT_TRAINED)}
    names = json.loads((folder / "parameters.json").read_text())
    assert {names[k]["source"] for k in done.parameters} == trained
    for key in done.parameters:  # the values are the checkpoint's, bit for bit
        np.testing.assert_array_equal(module.state_dict()[key].numpy(), policy[names[key]["source"]].numpy())
    assert any("normaliser" == names[k]["role"] for k in done.buffers) == ("normalizer" in " ".join(policy))
    fed = feeds(name, 16)
    module.train()
    before = {k: v.detach().clone() for k, v in module.state_dict().items()}
    record: dict = {}
    module(**{k: torch.from_numpy(v) for k, v in fed.items()}, record=record)
    loss = sum((v.double() ** 2).clamp(max=1e6).sum() for v in record.values() if v.dtype.is_floating_point
               and v.requires_grad)
    torch.optim.SGD(module.parameters(), lr=0.1).zero_grad()
    loss.backward()
    torch.optim.SGD(module.parameters(), lr=0.1).step()
    params = dict(module.named_parameters())
    assert [k for k, p in params.items() if torch.equal(before[k], p.detach())] == []
    assert [k for k, v in module.state_dict().items() if k not in params and not torch.equal(before[k], v)] == []


@pytest.mark.parametrize("name, space", [("Walker", "Box(-1.0, 1.0, (3,), float32)"),
                                         ("Basic", "Discrete(3)")])
def test_to_sb3_predicts_the_deterministic_action_and_trains_on(name, space, tmp_path, monkeypatch):
    """SB3's own PPO.load and VecNormalize.load take the files; predict on 1,000 observations equals the
    export's deterministic action (the numpy backend's, masks all ones) and the actor's own at export time."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    from test_to_sb3 import ToyEnv, every_parameter_trains

    done = pp.to_sb3(str(EXPORTED / f"{name}.onnx"), tmp_path / "policy.zip", algo="ppo")
    assert done.action_space == space and done.activation_fn == "SiLU" and done.vecnormalize is not None
    assert done.notes[0].startswith("left out the sampled output")
    rng = np.random.default_rng(6)
    fed = feeds(name)
    obs = np.concatenate([fed["obs_0"], (rng.standard_normal((1000 - len(fed["obs_0"]), fed["obs_0"].shape[1])) * 4)
                          .astype(np.float32)])
    numpy_out = pp.load(EXPORTED / f"{name}.onnx", "numpy").run(
        {"obs_0": obs, **({"action_masks": np.ones((1000, 3), np.float32)} if "action_masks" in fed else {})})
    reference = np.load(EXPORTED / f"{name}.reference.npz")
    import gymnasium as gym

    action_space = gym.spaces.Box(-1, 1, (3,), np.float32) if space.startswith("Box") else gym.spaces.Discrete(3)
    venv = DummyVecEnv([lambda: ToyEnv(obs.shape[1], action_space)])
    norm = VecNormalize.load(str(done.vecnormalize), venv)
    model = PPO.load(tmp_path / "policy.zip", env=norm, device="cpu", n_steps=128, batch_size=64, n_epochs=1)
    action, _ = model.predict(norm.normalize_obs(obs), deterministic=True)
    if space.startswith("Box"):
        want = numpy_out["deterministic_continuous_actions"]
        np.testing.assert_allclose(action, want, atol=2e-6, rtol=0)
        np.testing.assert_allclose(action[:64], reference["torch32/deterministic_continuous_actions"], atol=2e-6, rtol=0)
        assert (np.abs(want) == 1).any() and (np.abs(want) < 1).any()  # the clamp at 3 bites and does not always
    else:
        want = numpy_out["deterministic_discrete_actions"][:, 0]
        np.testing.assert_array_equal(action, want)
        unmasked = reference["inputs/action_masks"].all(axis=1)
        np.testing.assert_array_equal(action[:64][unmasked], reference["torch32/deterministic_discrete_actions"][unmasked, 0])
        assert len(set(want.tolist())) == 3
    assert every_parameter_trains(model.policy, norm.normalize_obs(obs[:16])) == []
    model.learn(256)
    assert model.num_timesteps == 256


@pytest.mark.parametrize("name, said", [
    ("Hybrid", "the head is hybrid"),
    ("Crawler", "the action mean is layer action_model._continuous_distribution.mu's output and layer "
                            "action_model._continuous_distribution.log_sigma"),
])
def test_to_sb3_refuses_what_sb3_cannot_express_naming_it(name, said, tmp_path):
    from typer.testing import CliRunner

    from policyport.cli import app

    result = CliRunner().invoke(app, ["to-sb3", str(EXPORTED / f"{name}.onnx"), "-o", str(tmp_path / "x.zip"), "--algo", "ppo",
                                      "--json"])
    assert result.exit_code == 3 and json.loads(result.stdout)["error"].startswith(said)
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------ to-keras


@pytest.fixture(scope="module", params=list(EXPORTS))
def keras_exported(request, tmp_path_factory):
    keras = pytest.importorskip("keras")
    name = request.param
    path = tmp_path_factory.mktemp("mla_keras") / "policy.keras"
    done = pp.to_keras(str(EXPORTED / f"{name}.onnx"), path)
    return name, done, keras.saving.load_model(path, safe_mode=True, compile=False), path


def actor_state(name: str) -> dict:
    """The actor's state_dict as ML-Agents holds it: the run's checkpoint, or the freshly initialised actor the
    fixture script makes again."""
    if EXPORTS[name][0] is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("ml_agents_export_onnx", MLA / "export_onnx.py")
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        return script.load_actor(name).state_dict()
    return torch.load(MLA / EXPORTS[name][0], weights_only=False)["Policy"]


def test_keras_predicts_ml_agents_own_deterministic_actions(keras_exported):
    name, done, model, _ = keras_exported
    reference = np.load(EXPORTED / f"{name}.reference.npz")
    fed = feeds(name)
    ordered = [fed[k] for k in ("obs_0", "action_masks") if k in fed]
    got = {k: np.asarray(v) for k, v in model.predict(ordered if len(ordered) > 1 else ordered[0], verbose=0,
                                                      batch_size=16).items()}  # Keras' own forward, in batches
    numpy_out = pp.load(EXPORTED / f"{name}.onnx", "numpy").run(fed)
    deterministic = [k.split("/", 1)[1] for k in reference.files
                     if k.startswith("torch32/deterministic_")]
    constants = [k.split("/", 1)[1] for k in reference.files
                 if k.startswith("torch32/") and k.split("/", 1)[1] not in deterministic]
    assert set(deterministic) <= set(got) and not set(constants) & set(got)
    assert not set(EXPORTS[name][1]) & set(got)  # the sampled outputs are left out
    for output in deterministic:
        want = reference[f"torch32/{output}"]
        assert got[output].dtype == want.dtype and got[output].shape == want.shape, output
        if want.dtype.kind == "f":  # ML-Agents' actor at export time, and the numpy backend
            np.testing.assert_allclose(got[output], want, atol=2e-6, rtol=1e-6)
            np.testing.assert_allclose(got[output], numpy_out[output], atol=2e-6, rtol=1e-6)
        else:
            np.testing.assert_array_equal(got[output], want)
            np.testing.assert_array_equal(got[output], numpy_out[output])
    for output in constants:  # left out of the Keras model, said so with ML-Agents' values
        assert np.asarray(done.constants[output], np.float32).tobytes() == reference[f"torch32/{output}"].tobytes()
        assert output in done.notes[-1]
    assert done.max_abs < 1e-5


def test_every_trained_parameter_of_the_actor_is_a_trainable_keras_weight_that_trains(keras_exported):
    name, done, model, path = keras_exported
    from test_to_keras import one_step_leaves

    policy = actor_state(name)
    trained = {k for k in policy if not any(part in k for part in NOT_TRAINED)}
    names = json.loads(path.with_name("policy_parameters.json").read_text())
    assert {names[w.path]["source"] for w in model.trainable_weights} == trained
    assert len(model.trainable_weights) == len(trained) == len(done.trainable)
    for w in model.trainable_weights:  # ML-Agents' values: [in, out] kernels of its [out, in] weights
        value = policy[names[w.path]["source"]].numpy()
        np.testing.assert_array_equal(w.numpy(), value.T if names[w.path]["layout"] == "transposed" else value)
    statistics = [names[w.path] for w in model.non_trainable_weights if w.path in names]  # the normaliser's
    assert all(e["role"] == "normaliser" for e in statistics) and bool(statistics) == ("normalizer" in " ".join(policy))
    assert all(e["source"] in policy for e in statistics[:1])  # the actor's running_mean, under its name
    assert all(e["source"].endswith("normalizer.running_mean") for e in statistics[:1])
    if "log_sigma" in " ".join(trained) and not any(k.startswith("action_model._continuous_distribution.log_sigma.")
                                                       for k in trained):  # a free log_sigma: an Embedding row
        layer = model.get_layer("action_model__continuous_distribution_log_sigma")
        assert type(layer).__name__ == "Embedding"
        assert layer.embeddings.numpy().tobytes() == policy["action_model._continuous_distribution.log_sigma"].numpy().tobytes()
    fed = feeds(name, 16)
    ordered = [fed[k] for k in ("obs_0", "action_masks") if k in fed]
    frozen, moved = one_step_leaves(model, ordered if len(ordered) > 1 else ordered[0], every_layer=True)
    assert frozen == [] and moved == []
