"""Stable-Baselines3 zips: the action equals SB3's own predict(obs, deterministic=True) on 1,000
observations; conversion imports neither SB3 nor gymnasium and unpickles nothing the zip pickled;
VecNormalize statistics become graph nodes; what cannot be converted is refused saying why."""

from __future__ import annotations

import base64
import json
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import policyport as pp
from policyport.converter import convert_source

from torch_fixtures import CARTPOLE, ROOT, SB3_DIR

sb3 = pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")

ZIPS = {
    "cartpole": (CARTPOLE, "PPO"),
    "ppo_pendulum": (SB3_DIR / "ppo_pendulum.zip", "PPO"),
    "a2c_multidiscrete": (SB3_DIR / "a2c_multidiscrete.zip", "A2C"),
    "sac_pendulum": (SB3_DIR / "sac_pendulum.zip", "SAC"),
    "td3_pendulum": (SB3_DIR / "td3_pendulum.zip", "TD3"),
    "ppo_pendulum_vecnorm": (SB3_DIR / "ppo_pendulum_vecnorm.zip", "PPO"),
}


def load_sb3(path, algo):
    """SB3's own loader; the 2021 CartPole zip pickled ``gym`` spaces, given here as gymnasium's."""
    custom = {"learning_rate": 0.0, "lr_schedule": lambda _: 0.0, "clip_range": lambda _: 0.0}
    if path == CARTPOLE:
        big = np.finfo(np.float32).max
        high = np.array([4.8, big, 0.41887903, big], np.float32)
        custom.update(observation_space=gym.spaces.Box(-high, high, (4,), np.float32), action_space=gym.spaces.Discrete(2))
    return getattr(sb3, algo).load(path, device="cpu", custom_objects=custom)


def observations(model_proto, n=1000, seed=7):
    """Observations spread beyond the training range (uniform in [-3, 3] per feature)."""
    d = model_proto.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    return np.random.default_rng(seed).uniform(-3, 3, (n, d)).astype(np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ZIPS))
def test_action_equals_sb3_predict_on_1000_observations(name):
    path, algo = ZIPS[name]
    c = convert_source(path)
    obs = observations(c.model)
    agent = load_sb3(path, algo)
    policy_obs = obs
    if name.endswith("vecnorm"):
        from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

        venv = VecNormalize.load(str(SB3_DIR / "ppo_pendulum_vecnorm" / "vecnormalize.pkl"),
                                 DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
        policy_obs = venv.normalize_obs(obs)
    expected, _ = agent.predict(policy_obs, deterministic=True)
    for backend in ("numpy", "onnxruntime"):
        action = pp.load(c.model, backend=backend).run({"obs": obs})["action"]
        assert action.dtype == expected.dtype and action.shape == expected.shape
        if expected.dtype.kind == "i":
            assert np.array_equal(action, expected), f"{np.sum(action != expected)} of 1000 actions differ"
        else:
            np.testing.assert_allclose(action, expected, rtol=1e-5, atol=1e-5)
    report = pp.verify(c.model, obs, reference=c.reference)
    assert report.passed, report.first_divergence


def test_conversion_never_imports_sb3_or_gymnasium():
    script = """
import sys, json
from policyport.converter import convert_source
kinds = [convert_source(p).kind for p in sys.argv[1:]]
print(json.dumps({"kinds": kinds, "loaded": sorted(m for m in ("stable_baselines3", "gymnasium", "gym", "cloudpickle") if m in sys.modules)}))
"""
    paths = [str(p) for p, _ in ZIPS.values()]
    result = subprocess.run([sys.executable, "-c", script, *paths], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc == {"kinds": ["sb3"] * len(paths), "loaded": []}


def test_heads_and_names_follow_the_action_space():
    outputs = {name: [o.name for o in convert_source(path).model.graph.output] for name, (path, _) in ZIPS.items()}
    assert outputs["cartpole"] == ["logits", "action"]
    assert outputs["ppo_pendulum"] == ["logits", "action", "log_std"]
    assert outputs["a2c_multidiscrete"] == ["logits", "action"]
    assert outputs["sac_pendulum"] == outputs["td3_pendulum"] == ["logits", "action"]
    c = convert_source(ZIPS["ppo_pendulum"][0], keep_value=True)
    nodes = [n.output[0] for n in c.model.graph.node]
    assert "mlp_extractor.policy_net.1/relu" in nodes and "mlp_extractor.value_net.3/relu" in nodes
    assert [o.name for o in c.model.graph.output][-1] == "value"
    obs = observations(c.model, 5)
    got = pp.load(c.model).run({"obs": obs})
    np.testing.assert_array_equal(got["log_std"], np.broadcast_to(got["logits"][:, 1:], (5, 1)))
    td3 = [n.output[0] for n in convert_source(ZIPS["td3_pendulum"][0]).model.graph.node]
    assert "actor.mu.5/tanh" in td3 and td3[-1] == "action"


def test_the_metadata_names_the_head_each_zip_was_built_with():
    heads = {name: {p.key: p.value for p in convert_source(path).model.metadata_props}["policyport.head"]
             for name, (path, _) in ZIPS.items()}
    assert heads == {"cartpole": "categorical", "ppo_pendulum": "clipped-diag-gaussian",
                     "a2c_multidiscrete": "multi-categorical", "sac_pendulum": "squashed", "td3_pendulum": "squashed",
                     "ppo_pendulum_vecnorm": "clipped-diag-gaussian"}


def test_the_metadata_holds_the_vecnormalize_statistics_baked_in():
    from policyport.converter.sources.sb3 import read_vecnormalize

    pkl = SB3_DIR / "ppo_pendulum_vecnorm" / "vecnormalize.pkl"
    props = {p.key: p.value for p in convert_source(ZIPS["ppo_pendulum_vecnorm"][0]).model.metadata_props}
    norm = read_vecnormalize(pkl)
    assert json.loads(props["policyport.observation_filter"]) == {
        "type": "VecNormalize", "epsilon": norm.epsilon, "clip_obs": norm.clip_obs,
        "mean": norm.mean.tolist(), "var": norm.var.tolist()}
    plain = convert_source(ZIPS["ppo_pendulum_vecnorm"][0], obs_filter=False).model
    assert "policyport.observation_filter" not in {p.key for p in plain.metadata_props}


def test_extract_gives_policy_pth_and_the_normalisation_back_bit_for_bit():
    import torch

    c = convert_source(ZIPS["ppo_pendulum_vecnorm"][0], keep_value=True)
    weights = pp.extract_weights(c.model)
    with zipfile.ZipFile(ZIPS["ppo_pendulum_vecnorm"][0]) as zf:
        import io

        state = torch.load(io.BytesIO(zf.read("policy.pth")), weights_only=True)
    for key, tensor in state.items():
        assert weights[key].dtype == tensor.numpy().dtype and weights[key].tobytes() == tensor.numpy().tobytes(), key
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    venv = VecNormalize.load(str(SB3_DIR / "ppo_pendulum_vecnorm" / "vecnormalize.pkl"), DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    assert weights["obs_rms.mean"].tobytes() == venv.obs_rms.mean.tobytes()
    assert weights["obs_rms.var"].tobytes() == venv.obs_rms.var.tobytes()


def test_vecnormalize_beside_the_zip_is_said_and_can_be_skipped_or_named(tmp_path):
    from policyport.converter.assumptions import Assumption

    c = convert_source(ZIPS["ppo_pendulum_vecnorm"][0])
    beside = SB3_DIR / "ppo_pendulum_vecnorm" / "vecnormalize.pkl"
    unrecorded = "an SB3 zip does not record whether the policy was trained under VecNormalize"
    assert c.assumptions == [Assumption("observation normalisation", f"VecNormalize statistics of {beside}",
                                        f"found in the folder named after the zip, where RL Zoo saves it; {unrecorded}",
                                        "--obs-norm FILE names another, --no-filter leaves it out")]
    assert not any("VecNormalize" in n for n in c.notes)  # an assumption, no longer a note
    assert "vec_normalize/obs" in {n.output[0] for n in c.model.graph.node}
    plain = convert_source(ZIPS["ppo_pendulum_vecnorm"][0], obs_filter=False)
    assert not any(n.output[0].startswith("vec_normalize") for n in plain.model.graph.node)
    assert plain.assumptions == [Assumption("observation normalisation", "none", f"left out by --no-filter ({beside} "
                                            "would be baked in otherwise)", "convert without --no-filter")]
    moved = tmp_path / "policy.zip"
    shutil.copy(ZIPS["ppo_pendulum_vecnorm"][0], moved)
    named = convert_source(moved, obs_norm=str(SB3_DIR / "ppo_pendulum_vecnorm" / "vecnormalize.pkl"))
    assert pp.extract_weights(named.model)["obs_rms.mean"].tobytes() == pp.extract_weights(c.model)["obs_rms.mean"].tobytes()
    assert named.assumptions == [Assumption("observation normalisation", f"VecNormalize statistics of {beside}",
                                            f"given by --obs-norm; {unrecorded}")]


def test_a_named_vecnormalize_and_no_filter_contradict_each_other(tmp_path):
    pkl = SB3_DIR / "ppo_pendulum_vecnorm" / "vecnormalize.pkl"
    message = (f"--obs-norm (obs_norm=) {str(pkl)!r} bakes in observation normalisation, which --no-filter "
               "(obs_filter=False) leaves out; give one or the other")
    with pytest.raises(pp.OptionError) as caught:
        convert_source(ZIPS["ppo_pendulum_vecnorm"][0], obs_norm=str(pkl), obs_filter=False)
    assert str(caught.value) == message
    out = tmp_path / "m.onnx"
    result = cli("convert", ZIPS["ppo_pendulum_vecnorm"][0], "-o", out, "--obs-norm", pkl, "--no-filter")
    assert result.exit_code == 2 and message in " ".join(result.stderr.split()) and not out.exists()


class _Hostile:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def cli(*args):
    from typer.testing import CliRunner

    from policyport.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


def test_a_hostile_vecnormalize_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    pkl = tmp_path / "vecnormalize.pkl"
    pkl.write_bytes(pickle.dumps({"obs_rms": _Hostile(marker)}))
    result = cli("convert", ZIPS["ppo_pendulum"][0], "-o", tmp_path / "m.onnx", "--obs-norm", pkl)
    assert result.exit_code == 3 and "system" in result.stderr and "--trust" in result.stderr
    assert not marker.exists() and not (tmp_path / "m.onnx").exists()


def rewrite_zip(src, dst, *, data=None, state=None):
    """A copy of an SB3 zip with its ``data`` JSON changed by ``data(dict)`` or its policy.pth replaced."""
    import io

    import torch

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            content = zin.read(name)
            if name == "data" and data is not None:
                doc = json.loads(content)
                data(doc)
                content = json.dumps(doc).encode()
            if name == "policy.pth" and state is not None:
                sd = torch.load(io.BytesIO(content), weights_only=True)
                buf = io.BytesIO()
                torch.save(state(sd), buf)
                content = buf.getvalue()
            zout.writestr(name, content)
    return dst


def _policy_class(name: str):
    """A zip data edit naming the policy class ``name`` as SB3 pickles it (a GLOBAL opcode)."""
    module, _, cls = name.rpartition(".")
    serialized = base64.b64encode(b"\x80\x02c" + f"{module}\n{cls}\n".encode() + b"q\x00.").decode()
    return lambda d: d["policy_class"].update({":serialized:": serialized})


def _policy_kwargs_edit(**kwargs):
    """A zip data edit giving the policy ``kwargs`` as SB3 writes them: readable entries beside their
    pickle, by SB3's own ``data_to_json``."""
    from stable_baselines3.common.save_util import data_to_json

    def edit(data):
        data["policy_kwargs"] = json.loads(data_to_json({"policy_kwargs": kwargs}))["policy_kwargs"]

    return edit


#: How a refusal of a policy whose forward pass the zip records only as code ends: what to do.
EXPORT_FROM_PYTHON = ("to convert it, load the zip with SB3 in Python (PPO.load and the like, its classes importable) "
                      "and convert a torch module whose forward returns model.policy._predict(obs, deterministic=True): "
                      "pp.convert(module, input_shape=<observation shape>)")


def unbuilt_activation(text: str, detail: str = "") -> str:
    """The refusal of an ``activation_fn`` policyport does not build."""
    return (f"the policy's activation_fn is {text!r}, which policyport does not build{f' ({detail})' if detail else ''}. "
            "It builds torch.nn's Tanh, Sigmoid, Identity, ReLU, SELU, SiLU, Mish, Hardswish, LeakyReLU with any "
            "negative_slope, and ELU, CELU, GELU and Softplus with their default parameters (in functools.partial "
            f"too). The zip records its activation, so --activation cannot stand in for it; {EXPORT_FROM_PYTHON}")


GSDE = ("the policy uses gSDE (use_sde=True): its exploration noise depends on the latent features and its log_std is "
        "a matrix; policyport converts the plain Gaussian and squashed policies")
DICT_OBS = "the policy takes dict observations (MultiInputPolicy); policyport converts a single Box observation"


def _space_edit(kind: str, name: str, **attributes):
    """A zip data edit making the observation or action space a gymnasium ``name`` with ``attributes``."""
    return lambda d: d[f"{kind}_space"].update({":type:": f"<class 'gymnasium.spaces.{name}'>", **attributes})


def _refusals(tmp_path):
    """(name, the zip, the whole message) of every policy an SB3 zip can hold that policyport refuses."""
    import torch

    pendulum = ZIPS["ppo_pendulum"][0]
    data_cases = [
        ("gsde", lambda d: d.update(use_sde=True), GSDE),
        ("gsde_kwargs", lambda d: d["policy_kwargs"].update(use_sde=True), GSDE),
        ("dict", _space_edit("observation", "dict.Dict"), DICT_OBS),
        ("multi_input", _policy_class("stable_baselines3.common.policies.MultiInputActorCriticPolicy"), DICT_OBS),
        ("image", lambda d: d["observation_space"].update(_shape=[3, 64, 64]),
         "stable_baselines3.common.policies.ActorCriticPolicy takes image observations (3, 64, 64) through a CNN "
         "features extractor; policyport converts MLP policies"),
        ("cnn", _policy_class("stable_baselines3.common.policies.ActorCriticCnnPolicy"),
         "stable_baselines3.common.policies.ActorCriticCnnPolicy takes image observations (3,) through a CNN "
         "features extractor; policyport converts MLP policies"),
        ("recurrent_contrib", _policy_class("sb3_contrib.common.recurrent.policies.RecurrentActorCriticPolicy"),
         "sb3_contrib.common.recurrent.policies.RecurrentActorCriticPolicy is a recurrent policy; policyport converts "
         "feed-forward MLP policies"),
        ("recurrent_own", _policy_class("mypolicies.RecurrentPolicy"),
         "mypolicies.RecurrentPolicy is a recurrent policy; policyport converts feed-forward MLP policies"),
        ("tuple_obs", _space_edit("observation", "tuple.Tuple"),
         "the observation space is Tuple; policyport converts Box, Discrete and MultiDiscrete observations"),
        ("multibinary", _space_edit("action", "multi_binary.MultiBinary"),
         "the action space is MultiBinary; policyport builds the deterministic action of Box, Discrete and "
         "MultiDiscrete spaces"),
        ("activation", _policy_kwargs_edit(net_arch=[32, 32], activation_fn=torch.nn.Softsign),
         unbuilt_activation("<class 'torch.nn.modules.activation.Softsign'>")),
        ("no_space", lambda d: d.pop("observation_space"), "the zip's data has no readable observation_space"),
        ("box_shape", lambda d: d["action_space"].update(_shape=[2], low="[-2. -2.]", high="[2. 2.]"),
         "a Box action space of shape (2,), but the action network outputs 1 values"),
        ("discrete", _space_edit("action", "discrete.Discrete", n=3),
         "a Discrete(3) action space, but the action network outputs 1 values"),
        ("multidiscrete", _space_edit("action", "multi_discrete.MultiDiscrete", nvec="[2 3]"),
         "a MultiDiscrete[2, 3] action space, but the action network outputs 1 logits"),
        ("nvec_text", _space_edit("action", "multi_discrete.MultiDiscrete", nvec="[a b]"),
         "{path}: the zip's action_space.nvec is not a list of numbers: '[a b]'"),
    ]
    cases = []
    for name, edit, message in data_cases:
        path = rewrite_zip(pendulum, tmp_path / f"{name}.zip", data=edit)
        cases.append((name, path, message.format(path=path)))
    state_cases = [
        ("extractor", lambda sd: {**sd, "features_extractor.cnn.0.weight": torch.zeros(8, 3, 3, 3)},
         "the policy has a features extractor with parameters (features_extractor.cnn.0.weight): a CNN or custom "
         "extractor; policyport converts MLP policies (FlattenExtractor) only"),
        ("lstm", lambda sd: {**sd, "lstm_actor.weight_ih_l0": torch.zeros(4, 3)},
         "{path} is a recurrent policy (LSTM weights); policyport converts feed-forward MLP policies"),
        ("no_log_std", lambda sd: {k: v for k, v in sd.items() if k != "log_std"},
         "a Box action space, but the policy has no log_std: not a Gaussian policy"),
    ]
    for name, edit, message in state_cases:
        path = rewrite_zip(pendulum, tmp_path / f"{name}.zip", state=edit)
        cases.append((name, path, message.format(path=path)))
    return cases


def _set(*keys_and_value):
    """A zip data edit setting ``data[k1][k2]...`` to the last argument."""
    *keys, value = keys_and_value

    def edit(d):
        for key in keys[:-1]:
            d = d[key]
        d[keys[-1]] = value
    return edit


@pytest.mark.parametrize("zip_name, edit, message", [
    ("ppo_pendulum", _set("policy_class", -2**31),
     "{path}: the policy class the zip records cannot be read (its pickle names no class), so policyport cannot tell "
     "whether it is one of the SB3 or sb3-contrib policy classes it converts (…"),
    ("ppo_pendulum", _set("action_space", "low", [[1], [2, 3]]),
     "{path}: the zip's action_space.low is [[1], [2, 3]], not an array of numbers; cannot read the action bounds"),
    ("ppo_pendulum", _set("action_space", "low", ["a"]),
     "{path}: the zip's action_space.low is ['a'], not numbers; cannot read the action bounds"),
    ("ppo_pendulum", _set("action_space", "low", [None]),
     "{path}: the zip's action_space.low is [None], not numbers; cannot read the action bounds"),
    ("ppo_pendulum", _set("action_space", "high", "[nan]"),
     "{path}: the zip's action_space.high holds NaN; cannot read the action bounds"),
    ("ppo_pendulum", _set("action_space", "high", 10**400),
     "{path}: the zip's action_space.high is 1" + "0" * 56 + "..., not an array of numbers; cannot read the action "
     "bounds"),
    ("ppo_pendulum", _set("observation_space", "_shape", ["3"]),
     "{path}: the zip's observation_space._shape[0] is '3', not a whole number"),
    ("dqn_cartpole", _set("action_space", "n", "two"), "{path}: the zip's action_space.n is 'two', not a whole number"),
    ("dqn_cartpole", _set("action_space", "n", None), "{path}: the zip's action_space.n is None, not a whole number"),
    ("dqn_cartpole", _set("action_space", "n", float("inf")),
     "{path}: the zip's action_space.n is inf, not a whole number"),
    ("dqn_cartpole", _set("action_space", "n", [2]), "{path}: the zip's action_space.n is [2], not a whole number"),
    ("dqn_cartpole", _set("action_space", "n", 2.5), "{path}: the zip's action_space.n is 2.5, not a whole number"),
    ("ppo_discrete_obs", _set("observation_space", "n", 0), "{path}: the zip's observation_space.n is 0; it must be at least 1"),
    ("a2c_multidiscrete", _set("action_space", "nvec", "[nan 3]"), "{path}: the zip's action_space.nvec holds NaN"),
    ("a2c_multidiscrete", _set("action_space", "nvec", "[inf 3]"),
     "{path}: the zip's action_space.nvec is inf, not a whole number"),
    ("a2c_multidiscrete", _set("action_space", "nvec", [[3, 4.5]]),
     "{path}: the zip's action_space.nvec is 4.5, not a whole number"),
    ("a2c_multidiscrete_obs", _set("observation_space", "nvec", ["a"]),
     "{path}: the zip's observation_space.nvec is ['a'], not numbers"),
])
def test_a_space_field_that_is_not_numbers_is_refused_naming_the_zip_and_the_field(tmp_path, zip_name, edit, message):
    path = rewrite_zip(SB3_DIR / f"{zip_name}.zip", tmp_path / f"{zip_name}.zip", data=edit)
    result = cli("convert", path, "-o", tmp_path / "m.onnx")
    assert result.exit_code == 3, result.output
    shown, expected = " ".join(result.stderr.split()), f"error: {message.format(path=path)}"
    assert shown.startswith(expected[:-1]) if expected.endswith("…") else shown == expected, shown  # … ends a prefix
    assert not (tmp_path / "m.onnx").exists()


def _vecnormalize(path, change):
    """A copy of the fixture's vecnormalize.pkl at ``path``, its VecNormalize changed by ``change(venv)``."""
    with open(SB3_DIR / "ppo_pendulum_vecnorm" / "vecnormalize.pkl", "rb") as f:
        venv = pickle.load(f)  # noqa: S301 - the repository's own fixture
    venv.venv, venv.class_attributes, venv.returns = None, {}, None  # what VecNormalize.__getstate__ drops
    change(venv)
    path.write_bytes(pickle.dumps(venv))
    return path


@pytest.mark.parametrize("change, message", [
    (lambda v: setattr(v, "epsilon", "x"), "{path}: epsilon is 'x', not a number"),
    (lambda v: setattr(v, "epsilon", None), "{path}: epsilon is None, not a number"),
    (lambda v: setattr(v, "epsilon", np.array([1.0, 2.0])), "{path}: epsilon is array([1., 2.]), not a number"),
    (lambda v: setattr(v, "epsilon", -1.0), "{path}: epsilon is -1; a variance's epsilon is at least 0"),
    (lambda v: setattr(v, "clip_obs", [1]), "{path}: clip_obs is [1], not a number"),
    (lambda v: setattr(v, "clip_obs", 10**400),
     "{path}: clip_obs is 1" + "0" * 56 + "..., too large for a number policyport computes with"),
    (lambda v: setattr(v.obs_rms, "mean", np.array(["a", "b", "c"])),
     "{path}: obs_rms.mean is an array of text (<U1), not of real numbers"),
    (lambda v: setattr(v.obs_rms, "var", np.array([1, None, 2], dtype=object)),
     "{path}: obs_rms.var is an array of Python objects (object), not of real numbers"),
    (lambda v: setattr(v.obs_rms, "var", np.full(3, np.nan)), "{path}: obs_rms.var holds NaN"),
    (lambda v: setattr(v.obs_rms, "var", -np.ones(3)), "{path}: obs_rms.var holds negative variances (-1)"),
])
def test_vecnormalize_statistics_that_are_not_numbers_are_refused_naming_the_file_and_field(tmp_path, change, message):
    pkl = _vecnormalize(tmp_path / "vecnormalize.pkl", change)
    result = cli("convert", SB3_DIR / "ppo_pendulum_vecnorm.zip", "-o", tmp_path / "m.onnx", "--obs-norm", pkl)
    assert result.exit_code == 3, result.output
    assert " ".join(result.stderr.split()) == f"error: {message.format(path=pkl)}"
    assert not (tmp_path / "m.onnx").exists()


def test_what_cannot_be_converted_is_refused_saying_why(tmp_path):
    for name, path, message in _refusals(tmp_path):
        with pytest.raises(pp.BadModelError) as caught:
            convert_source(path)
        assert str(caught.value) == message, name
        result = cli("convert", path, "-o", tmp_path / "m.onnx")
        assert result.exit_code == 3 and " ".join(result.stderr.split()) == f"error: {message}", (name, result.output)
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.slow
def test_a_real_gsde_policy_is_refused(tmp_path):
    sb3.PPO("MlpPolicy", "Pendulum-v1", use_sde=True, n_steps=64, batch_size=32, device="cpu", seed=0).save(tmp_path / "sde.zip")
    result = cli("convert", tmp_path / "sde.zip", "-o", tmp_path / "m.onnx")
    assert result.exit_code == 3 and "gSDE" in result.stderr


def test_verify_against_the_zip_finds_a_different_policy(tmp_path):
    out = tmp_path / "pendulum.onnx"
    assert cli("convert", ZIPS["ppo_pendulum"][0], "-o", out, "--samples", "32").exit_code == 0
    same = cli("verify", out, "--source", ZIPS["ppo_pendulum"][0], "--low", "-3", "--high", "3", "--json")
    assert same.exit_code == 0 and json.loads(same.stdout)["passed"]
    other = rewrite_zip(ZIPS["ppo_pendulum"][0], tmp_path / "other.zip",
                        state=lambda sd: {**sd, "mlp_extractor.policy_net.2.bias": sd["mlp_extractor.policy_net.2.bias"] + 0.01})
    result = cli("verify", out, "--source", other, "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code == 1 and not doc["passed"]
    assert doc["first_divergence"]["tensor"] == "mlp_extractor.policy_net.2/linear"


DEFAULT_BUILT = "SB3's default for this policy (its policy_kwargs name no activation_fn)"


@pytest.mark.parametrize("path,given,recorded,what", [
    (CARTPOLE, "relu", "tanh", DEFAULT_BUILT),  # policy_kwargs {}: SB3's ActorCriticPolicy default built it
    (SB3_DIR / "ppo_pendulum.zip", "tanh", "relu", "the zip's policy_kwargs"),  # policy_kwargs names activation_fn ReLU
    (SB3_DIR / "sac_pendulum.zip", "tanh", "relu", DEFAULT_BUILT),  # an actor: SAC's default
])
def test_an_activation_contradicting_the_zip_is_refused(path, given, recorded, what):
    with pytest.raises(pp.OptionError) as caught:
        pp.convert(path, activation=given)
    assert str(caught.value) == (f"--activation {given} contradicts {what}, which names {recorded}; leave --activation out "
                                 "to use the recorded one")
    agreeing = convert_source(path, activation=recorded)
    assert not any(a.topic == "activation" for a in agreeing.assumptions)  # the zip records it: nothing assumed
    assert [n.op_type for n in agreeing.model.graph.node if n.op_type in ("Relu", "Tanh")][0].lower() == recorded


def test_vec_normalize_nodes_clip_both_ways_and_add_epsilon_to_the_variance():
    """Every tensor of the VecNormalize step, by name, against SB3's formula on observations beyond the clip
    and a variance of 0 (where only epsilon keeps the division finite)."""
    from policyport.converter.build import Dense, MlpSpec, ObsNorm, build_mlp
    from policyport.converter.sources.reference import reference_forward

    rng = np.random.default_rng(23)
    norm = ObsNorm(np.array([1.0, -2.0, 0.0]), np.array([4.0, 0.0, 0.25]), epsilon=0.25, clip_obs=2.5,
                   mean_name="norm.mean", var_name="norm.var")
    out = Dense("out", rng.normal(size=(2, 3)).astype(np.float32), "out.weight", np.zeros(2, np.float32), "out.bias",
                "out_in", None)
    spec = MlpSpec([], out, obs_norm=norm)
    obs = np.array([[9.0, -2.0, 0.1], [-9.0, -1.9, -3.0], [1.0, -2.2, 0.2]], np.float32)
    x64 = obs.astype(np.float64)
    std = np.sqrt(norm.var + 0.25)
    expected = {"vec_normalize/obs_float64": x64, "vec_normalize/centered": x64 - norm.mean,
                "vec_normalize/var_eps": norm.var + 0.25, "vec_normalize/std": std,
                "vec_normalize/scaled": (x64 - norm.mean) / std,
                "vec_normalize/clipped": np.clip((x64 - norm.mean) / std, -2.5, 2.5)}
    expected["vec_normalize/obs"] = expected["vec_normalize/clipped"].astype(np.float32)
    assert (expected["vec_normalize/clipped"] == 2.5).any() and (expected["vec_normalize/clipped"] == -2.5).any()
    ref = reference_forward(spec, obs)
    assert ref["vec_normalize/obs"].dtype == np.float32
    np.testing.assert_array_equal(ref["vec_normalize/obs"], expected["vec_normalize/obs"])
    model = build_mlp(spec)
    assert {"norm.mean", "norm.var", "vec_normalize/epsilon", "vec_normalize/clip_low", "vec_normalize/clip_high"} <= {
        t.name for t in model.graph.initializer}
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(model, backend=backend).record({"obs": obs}, "*")
        for name, value in expected.items():
            assert got[name].dtype == value.dtype and np.abs(got[name] - value).max() <= 1e-12, (backend, name)
    weights = pp.extract_weights(model)
    assert weights["norm.mean"].tobytes() == norm.mean.tobytes() and weights["norm.var"].tobytes() == norm.var.tobytes()


def test_a_multi_discrete_action_takes_one_argmax_per_sub_space_of_three():
    """SB3's MultiCategoricalDistribution splits the logits by nvec: (2, 3, 4) reads columns 0-1, 2-4, 5-8."""
    from policyport.converter.build import ActionHead, Dense, MlpSpec, build_mlp

    rng = np.random.default_rng(24)
    out = Dense("action_net", rng.normal(size=(9, 3)).astype(np.float32), "action_net.weight",
                rng.normal(size=9).astype(np.float32), "action_net.bias", "out_in", None)
    spec = MlpSpec([], out, action=ActionHead("multi_argmax", nvec=(2, 3, 4)))
    model = build_mlp(spec)
    action = next(o for o in model.graph.output if o.name == "action")
    assert [d.dim_param or d.dim_value for d in action.type.tensor_type.shape.dim] == ["batch", 3]
    obs = rng.normal(size=(64, 3)).astype(np.float32)
    logits = obs @ out.weight.T + out.bias
    expected = np.stack([np.argmax(logits[:, a:b], axis=1) for a, b in ((0, 2), (2, 5), (5, 9))], axis=1)
    assert len(set(map(tuple, expected))) > 10  # many combinations: a wrong split shows
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(model, backend=backend).record({"obs": obs}, "*")
        assert got["action"].dtype == np.int64
        np.testing.assert_array_equal(got["action"], expected)
        for i, (a, b) in enumerate(((0, 2), (2, 5), (5, 9))):
            np.testing.assert_array_equal(got[f"action/logits_{i}"], got["logits"][:, a:b])
            np.testing.assert_array_equal(got[f"action/argmax_{i}"], expected[:, i:i + 1])


class VecNormalize:
    """Pickled under this module's name: the reader must take any class's state as SB3's, inertly."""

    def __init__(self, **state):
        self.__dict__.update(state)


class RunningMeanStd(VecNormalize):
    pass


MEAN32, VAR32 = np.array([0.1, -2.5, 3.0], np.float32), np.array([0.3, 1.7, 1e-7], np.float32)


@pytest.mark.parametrize("state, epsilon, clip_obs", [
    ({"norm_obs": True, "epsilon": 0.01, "clip_obs": 3.5}, 0.01, 3.5),
    ({}, 1e-8, 10.0),  # an older save without these attributes: SB3's defaults
])
def test_vecnormalize_statistics_are_read_in_float64_with_epsilon_and_clip(tmp_path, state, epsilon, clip_obs):
    from policyport.converter.sources.sb3 import read_vecnormalize

    pkl = tmp_path / "vecnormalize.pkl"
    pkl.write_bytes(pickle.dumps(VecNormalize(obs_rms=RunningMeanStd(mean=MEAN32, var=VAR32, count=4.0), **state)))
    norm = read_vecnormalize(pkl)
    assert norm.mean.dtype == norm.var.dtype == np.float64
    assert norm.mean.tolist() == MEAN32.tolist() and norm.var.tolist() == VAR32.tolist()
    assert (type(norm.epsilon), norm.epsilon, type(norm.clip_obs), norm.clip_obs) == (float, epsilon, float, clip_obs)
    assert (norm.mean_name, norm.var_name) == ("obs_rms.mean", "obs_rms.var")


def test_a_vecnormalize_that_does_not_normalise_observations_gives_none(tmp_path):
    from policyport.converter.sources.sb3 import read_vecnormalize

    pkl = tmp_path / "vecnormalize.pkl"
    pkl.write_bytes(pickle.dumps(VecNormalize(norm_obs=False, obs_rms=RunningMeanStd(mean=MEAN32, var=VAR32))))
    assert read_vecnormalize(pkl) is None
    c = convert_source(ZIPS["ppo_pendulum"][0], obs_norm=str(pkl))
    assert c.notes[-1] == f"{pkl} normalises no observation (its norm_obs is false): nothing baked in"
    assert not any(n.output[0].startswith("vec_normalize") for n in c.model.graph.node)


@pytest.mark.slow
def test_a_vecnormalize_without_observation_statistics_is_named_as_no_normalisation(tmp_path):
    from stable_baselines3.common.vec_env import DummyVecEnv
    from stable_baselines3.common.vec_env import VecNormalize as SB3VecNormalize

    shutil.copy(ZIPS["ppo_pendulum"][0], tmp_path / "policy.zip")
    venv = SB3VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]), norm_obs=False, norm_reward=True)
    pkl = tmp_path / "vec_normalize.pkl"
    venv.save(str(pkl))
    obs = np.random.default_rng(4).uniform(-3, 3, (500, 3)).astype(np.float32)
    expected, _ = load_sb3(tmp_path / "policy.zip", "PPO").predict(venv.normalize_obs(obs), deterministic=True)
    for options, because in (({}, "found beside the zip, under the name SB3's documentation saves it with"),
                             ({"obs_norm": str(pkl)}, "given by --obs-norm")):
        c = convert_source(tmp_path / "policy.zip", **options)
        a = c.assumptions[-1]
        assert (a.topic, a.assumes) == ("observation normalisation",
                                        f"none: {pkl} normalises no observation (its norm_obs is false)")
        assert a.because.startswith(because) and "--no-filter" not in a.settle
        assert not any(n.output[0].startswith("vec_normalize") for n in c.model.graph.node)
        for backend in ("numpy", "onnxruntime"):
            np.testing.assert_allclose(pp.load(c.model, backend=backend).run({"obs": obs})["action"], expected,
                                       rtol=1e-5, atol=1e-5)
        report = pp.verify(c.model, obs, reference=c.reference, reference_oracle=c.oracle)
        assert report.passed and [s["assumes"] for s in report.shared_assumptions] == [a.assumes]


@pytest.mark.parametrize("content, message", [
    ({"obs_rms": {"mean": MEAN32}}, "{pkl} holds a dict, not a pickled VecNormalize"),
    (VecNormalize(obs_rms={"position": RunningMeanStd(), "speed": RunningMeanStd()}),
     "{pkl} normalises a dict observation (position, speed); policyport converts Box observations"),
    (VecNormalize(), "{pkl} has no obs_rms mean/var arrays; is it a VecNormalize save?"),
    (VecNormalize(obs_rms=[MEAN32, VAR32]), "{pkl} has no obs_rms mean/var arrays; is it a VecNormalize save?"),
    (VecNormalize(obs_rms=RunningMeanStd(mean=MEAN32)), "{pkl} has no obs_rms mean/var arrays; is it a VecNormalize save?"),
    (VecNormalize(obs_rms=RunningMeanStd(var=VAR32)), "{pkl} has no obs_rms mean/var arrays; is it a VecNormalize save?"),
    (VecNormalize(obs_rms=RunningMeanStd(mean=[0.0], var=VAR32)),
     "{pkl} has no obs_rms mean/var arrays; is it a VecNormalize save?"),
])
def test_what_is_not_a_box_vecnormalize_is_refused_naming_the_file(tmp_path, content, message):
    from policyport.converter.sources.sb3 import read_vecnormalize

    pkl = tmp_path / "vecnormalize.pkl"
    pkl.write_bytes(pickle.dumps(content))
    with pytest.raises(pp.BadModelError) as caught:
        read_vecnormalize(pkl)
    assert str(caught.value) == message.format(pkl=pkl)


def test_a_hostile_vecnormalize_is_refused_naming_the_file_and_the_function(tmp_path):
    from policyport.converter.sources.sb3 import read_vecnormalize

    marker = tmp_path / "pwned"
    pkl = tmp_path / "vecnormalize.pkl"
    pkl.write_bytes(pickle.dumps(VecNormalize(obs_rms=_Hostile(marker))))
    with pytest.raises(pp.UntrustedFileError) as caught:
        read_vecnormalize(pkl)
    assert str(caught.value).startswith(f"{pkl} asks to call {os.system.__module__}.system while unpickling")
    assert not marker.exists()


def _zip(path, members: dict[str, bytes]):
    with zipfile.ZipFile(path, "w") as zf:
        for name, content in members.items():
            zf.writestr(name, content)
    return path


@pytest.mark.parametrize("members, message", [
    (None, "{path} is not a readable zip archive: File is not a zip file"),
    (b"", "{path} is empty (an SB3 save is a zip archive)"),
    ({"policy.pth": b"x"}, "{path} is not a Stable-Baselines3 save: it lacks ['data']"),
    ({"data": b"{}"}, "{path} is not a Stable-Baselines3 save: it lacks ['policy.pth']"),
    ({"other": b""}, "{path} is not a Stable-Baselines3 save: it lacks ['data', 'policy.pth']"),
    ({"policy.pth": b"x", "data": b"{no"},
     "{path}: its data member is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 "
     "(char 1)"),
    ({"policy.pth": b"x", "data": b"[1]"}, "{path}: its data member is not a JSON object"),
    ({"policy.pth": b"x", "data": b"[" * 100_000 + b"]" * 100_000},
     "{path}: its data member: its arrays and objects nest deeper than Python parses (about 1,000 levels)"),
    ({"policy.pth": b"x", "data": b'{"a": "\xff"}'},
     "{path}: its data member is not UTF-8 text: 'utf-8' codec can't decode byte 0xff in position 7: invalid start byte"),
])
def test_a_zip_that_is_not_an_sb3_save_is_refused_saying_what_it_lacks(tmp_path, members, message):
    from policyport.converter.sources.sb3 import read_zip

    path = tmp_path / "policy.zip"
    if members is None or isinstance(members, bytes):
        path.write_bytes(b"not a zip" if members is None else members)
    else:
        _zip(path, members)
    with pytest.raises(pp.UnreadableFileError) as caught:
        read_zip(path)
    assert str(caught.value) == message.format(path=path)


def test_a_zip_gives_its_data_policy_and_version(tmp_path):
    from policyport.converter.sources.sb3 import read_zip

    with zipfile.ZipFile(ZIPS["ppo_pendulum"][0]) as zf:
        data, policy = json.loads(zf.read("data")), zf.read("policy.pth")
    assert read_zip(ZIPS["ppo_pendulum"][0]) == (data, policy, "2.9.2")
    unversioned = _zip(tmp_path / "old.zip", {"data": b'{"n": 1}', "policy.pth": b"weights"})
    assert read_zip(unversioned) == ({"n": 1}, b"weights", None)
    spaced = _zip(tmp_path / "spaced.zip", {"data": b"{}", "policy.pth": b"", "_stable_baselines3_version": b" 1.8.0\n"})
    assert read_zip(spaced)[2] == "1.8.0"


def test_options_an_sb3_zip_cannot_take_are_refused(tmp_path):
    from policyport.converter import ConvertOptions
    from policyport.converter.sources.sb3 import convert_sb3

    with pytest.raises(pp.OptionError) as caught:
        convert_sb3(ZIPS["ppo_pendulum"][0], ConvertOptions(head="categorical"))
    assert str(caught.value) == "--head does not apply to an SB3 zip: its action head comes from its action space"
    norm = SB3_DIR / "ppo_pendulum_vecnorm" / "vecnormalize.pkl"
    with pytest.raises(pp.OptionError) as caught:  # the option names statistics of another policy: a usage error
        convert_source(CARTPOLE, obs_norm=str(norm))
    assert str(caught.value) == (f"{norm} (--obs-norm) normalises observations of shape (3,), and the policy takes 4 "
                                 "features: it is not this policy's; --obs-norm FILE names the right one, --no-filter "
                                 "converts without")
    with pytest.raises(pp.UnreadableFileError) as caught:
        convert_source(CARTPOLE, obs_norm=str(tmp_path / "none.pkl"))
    assert str(caught.value) == f"{tmp_path / 'none.pkl'}: no such file"


def _pickled(obj, protocol) -> str:
    return base64.b64encode(pickle.dumps(obj, protocol=protocol)).decode()


def test_the_policy_class_is_read_from_its_pickles_opcodes_alone():
    from collections import OrderedDict

    from policyport.converter.sources.sb3 import pickled_global

    # GLOBAL (protocols 0-2) and STACK_GLOBAL (4, 5) name the class; anything else first names none
    assert [pickled_global(_pickled(OrderedDict, p)) for p in (0, 2, 4, 5)] == ["collections.OrderedDict"] * 4
    assert [pickled_global(s) for s in (_pickled({"a": 1}, 4), _pickled(3, 2), base64.b64encode(b"garbage").decode(),
                                        "!!not base64", "")] == [None] * 5
    one_string = base64.b64encode(b"\x80\x04\x8c\x0bOrderedDict\x94\x93\x94.").decode()  # STACK_GLOBAL after one string
    assert pickled_global(one_string) is None
    # the long-string and memo opcodes a pickler may write between the two names (BINUNICODE, BINPUT)
    long_form = (b"\x80\x04X\x0b\x00\x00\x00collectionsq\x00X\x0b\x00\x00\x00OrderedDictr\x01\x00\x00\x00\x93q\x02.")
    assert pickled_global(base64.b64encode(long_form).decode()) == "collections.OrderedDict"
    # STACK_GLOBAL takes the last two strings pushed
    three = b"\x80\x04\x8c\x05extra\x94\x8c\x0bcollections\x94\x8c\x0bOrderedDict\x94\x93\x94."
    assert pickled_global(base64.b64encode(three).decode()) == "collections.OrderedDict"


@pytest.mark.parametrize("text, values", [
    ("[-1. -1. -8.]", [-1.0, -1.0, -8.0]), ("[[1 2]\n [3 4]]", [1.0, 2.0, 3.0, 4.0]), ([1, 2], [1.0, 2.0]),
    (3, 3.0), (2.5, 2.5), ("[ 1e-3  -inf]", [1e-3, -np.inf]),
])
def test_a_printed_array_is_read_as_float64(text, values):
    from policyport.converter.sources.sb3 import _array

    got = _array(text, "observation_space.low")
    assert got.dtype == np.float64 and got.tolist() == values


@pytest.mark.parametrize("text, message", [
    (None, "the zip's observation_space.low is missing"),
    ({"0": 1}, "the zip's observation_space.low is a dict (\"{'0': 1}\"), not numbers or their text"),
    ("[1. 1. ... 1. 1.]", "the zip's observation_space.low is not readable text ('[1. 1. ... 1. 1.]'): numpy summarised it"),
    ("[a b]", "the zip's observation_space.low is not a list of numbers: '[a b]'"),
])
def test_an_array_that_is_not_printed_numbers_is_refused(text, message):
    from policyport.converter.sources.sb3 import _array

    with pytest.raises(pp.BadModelError) as caught:
        _array(text, "observation_space.low")
    assert str(caught.value) == message


@pytest.mark.parametrize("text, name", [
    ("<class 'torch.nn.modules.activation.Tanh'>", "tanh"), ("torch.nn.modules.activation.ELU", "elu"),
    ("<class 'torch.nn.modules.activation.ReLU'>  ", "relu"), ("<class 'torch.nn.modules.linear.Identity'>", "linear"),
    ("<class 'torch.nn.modules.activation.SiLU'>", "silu"), ("<class 'torch.nn.modules.activation.CELU'>", "elu"),
    # functools.partial as SB3 writes it (str of the partial): the slope positional or by keyword
    ("functools.partial(<class 'torch.nn.modules.activation.LeakyReLU'>, 0.2)", "leaky_relu:0.2"),
    ("functools.partial(<class 'torch.nn.modules.activation.LeakyReLU'>, negative_slope=0.25, inplace=True)",
     "leaky_relu:0.25"),
    ("<class 'torch.nn.modules.activation.LeakyReLU'>", "leaky_relu"),
    ("functools.partial(<class 'torch.nn.modules.activation.ELU'>, alpha=1.0)", "elu"),
    ("functools.partial(<class 'torch.nn.modules.activation.GELU'>, approximate='none')", "gelu"),
    ("functools.partial(<class 'torch.nn.modules.activation.ReLU'>, True)", "relu"),
])
def test_the_activation_is_read_from_the_class_text_of_policy_kwargs(text, name):
    from policyport.converter.activations import parse_activation
    from policyport.converter.sources.sb3 import torch_activation

    assert parse_activation(torch_activation(text).name) == parse_activation(name)


@pytest.mark.parametrize("text, detail", [
    ("LeakyReLU", ""),  # SB3 writes a class with its module: a bare name could be any class
    ("<class 'myext.Tanh'>", ""),  # a class of its own that shares a torch.nn name
    ("<class 'torch.nn.modules.activation.Hardtanh'>", ""),
    ("functools.partial(<class 'torch.nn.modules.activation.ELU'>, alpha=3.0)", "ELU with alpha=3.0; policyport's elu is alpha=1.0"),
    ("functools.partial(<class 'torch.nn.modules.activation.GELU'>, approximate='tanh')",
     "GELU with approximate='tanh'; policyport's gelu is approximate='none'"),
    ("functools.partial(<class 'torch.nn.modules.activation.Softplus'>, 5.0)", "Softplus with beta=5.0; policyport's softplus is beta=1.0"),
    ("functools.partial(<class 'torch.nn.modules.activation.LeakyReLU'>, 'x')", "its negative_slope 'x' is not a number"),
    ("functools.partial(<class 'torch.nn.modules.activation.LeakyReLU'>, 0.1, False, 3)",
     "arguments that torch.nn.LeakyReLU(negative_slope, inplace) does not take"),
    ("functools.partial(<class 'torch.nn.modules.activation.Tanh'>, slope=2)", "arguments that torch.nn.Tanh() does not take"),
    ("functools.partial(<class 'torch.nn.modules.activation.LeakyReLU'>, 0.1, negative_slope=0.2)",
     "arguments that torch.nn.LeakyReLU(negative_slope, inplace) does not take"),
    ("functools.partial(<class 'torch.nn.modules.activation.LeakyReLU'>, <object at 0x1>)", "its arguments are not literals"),
])
def test_an_activation_policyport_does_not_build_is_refused_saying_what_it_builds(text, detail):
    from policyport.converter.sources.sb3 import torch_activation

    with pytest.raises(pp.BadModelError) as caught:
        torch_activation(text).name
    assert str(caught.value) == unbuilt_activation(text, detail)


def test_policy_kwargs_keep_only_their_readable_entries():
    from policyport.converter.sources.sb3 import _policy_kwargs

    assert _policy_kwargs({"policy_kwargs": {":type:": "<class 'dict'>", ":serialized:": "gA==", "net_arch": [8]}}) == {
        "net_arch": [8]}
    assert _policy_kwargs({"policy_kwargs": None}) == _policy_kwargs({"policy_kwargs": [1]}) == _policy_kwargs({}) == {}


@pytest.mark.parametrize("entry, space", [
    ({":type:": "<class 'gymnasium.spaces.discrete.Discrete'>", "n": "5", "shape": []},
     {"type": "Discrete", "shape": (), "dtype": None, "n": 5}),
    ({":type:": "<class 'gym.spaces.multi_discrete.MultiDiscrete'>", "nvec": "[2 3]", "_shape": [2], "dtype": "int64"},
     {"type": "MultiDiscrete", "shape": (2,), "dtype": "int64", "nvec": (2, 3)}),
    ({":type:": "Box", "_shape": [2], "shape": [9], "low": "[0. 1.]", "high": [2, 3], "dtype": "float32"},
     {"type": "Box", "shape": (2,), "dtype": "float32", "low": [0.0, 1.0], "high": [2.0, 3.0]}),
    ({":type:": "<class 'gymnasium.spaces.box.Box'>", "shape": [1], "low": "[0.]", "high": "[1.]"},
     {"type": "Box", "shape": (1,), "dtype": None, "low": [0.0], "high": [1.0]}),
    ({":type:": "<class 'gymnasium.spaces.box.Box'>", "low": "[0.]", "high": "[1.]"},
     {"type": "Box", "shape": None, "dtype": None, "low": [0.0], "high": [1.0]}),
])
def test_a_space_is_read_from_its_readable_attributes(entry, space):
    from policyport.converter.sources.sb3 import _space

    got = _space({"action_space": entry}, "action_space", Path("policy.zip"))
    assert {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in got.items()} == space
    assert type(got.get("n", 0)) is int and all(type(n) is int for n in got.get("nvec", ()))


@pytest.mark.parametrize("name, layout, activation, policy_class, action_space", [
    ("ppo_pendulum", "sb3", "relu", "stable_baselines3.common.policies.ActorCriticPolicy", "Box"),
    ("sac_pendulum", "sb3-actor", "relu", "stable_baselines3.sac.policies.SACPolicy", "Box"),
    ("td3_pendulum", "sb3-actor", "relu", "stable_baselines3.td3.policies.TD3Policy", "Box"),
    ("a2c_multidiscrete", "sb3", "tanh", "stable_baselines3.common.policies.ActorCriticPolicy", "MultiDiscrete"),
    ("ppo_pendulum_vecnorm", "sb3", "tanh", "stable_baselines3.common.policies.ActorCriticPolicy", "Box"),
])
def test_an_sb3_model_records_its_source_layout_and_activation(name, layout, activation, policy_class, action_space):
    import hashlib

    path = ZIPS[name][0]
    c = convert_source(path, opset=13)
    metadata = {p.key: p.value for p in c.model.metadata_props}
    with zipfile.ZipFile(path) as zf:
        version = zf.read("_stable_baselines3_version").decode().strip()
    expected = {"kind": "sb3", "file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                "policy_class": policy_class, "sb3_version": version, "action_space": action_space}
    if name.endswith("_vecnorm"):
        expected["obs_norm"] = "vecnormalize.pkl"
    assert json.loads(metadata["policyport.source"]) == expected
    assert (metadata["policyport.layout"], metadata["policyport.activation"]) == (layout, activation)
    assert c.kind == "sb3" and c.model.opset_import[0].version == 13
    obs = observations(c.model, n=5)
    assert pp.verify(c.model, obs, reference=c.reference).passed


@pytest.mark.parametrize("name, scope", [("ppo_pendulum", "features_extractor.flatten"),
                                         ("sac_pendulum", "actor.features_extractor.flatten")])
def test_an_observation_of_more_than_one_axis_is_flattened_by_the_extractor_it_names(tmp_path, name, scope):
    path = rewrite_zip(ZIPS[name][0], tmp_path / f"{name}_2d.zip", data=lambda d: d["observation_space"].update(_shape=[1, 3]))
    c = convert_source(path)
    dims = c.model.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims[1:]] == [1, 3]
    assert [n.op_type for n in c.model.graph.node if n.name.startswith(f"/{scope}/") or scope in n.output[0]][:1] == ["Flatten"]
    flat = convert_source(ZIPS[name][0])
    obs = np.random.default_rng(2).uniform(-1, 1, (4, 1, 3)).astype(np.float32)
    np.testing.assert_array_equal(pp.load(c.model).run({"obs": obs})["action"],
                                  pp.load(flat.model).run({"obs": obs.reshape(4, 3)})["action"])


def test_a_zip_with_an_lstm_critic_alone_is_refused_as_recurrent(tmp_path):
    import torch

    path = rewrite_zip(ZIPS["ppo_pendulum"][0], tmp_path / "lstm_critic.zip",
                       state=lambda sd: {**sd, "lstm_critic.weight_ih_l0": torch.zeros(4, 3)})
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(path)
    assert str(caught.value) == f"{path} is a recurrent policy (LSTM weights); policyport converts feed-forward MLP policies"


def test_a_policy_pth_that_is_not_a_state_dict_is_named_inside_its_zip(tmp_path):
    path = rewrite_zip(ZIPS["ppo_pendulum"][0], tmp_path / "listed.zip", state=lambda sd: [sd["log_std"]])
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(path)
    assert str(caught.value) == (f"{path}:policy.pth holds a list, not a state_dict (a mapping of parameter names to "
                                 "tensors)")


def test_the_policy_class_is_read_from_protocol_0_strings_and_memo_puts_too():
    from policyport.converter.sources.sb3 import pickled_global

    crafted = b"\x80\x04Vmypolicies\np0\nVMlpPolicy\np1\n\x93."  # UNICODE strings, PUT memo entries, STACK_GLOBAL
    assert pickled_global(base64.b64encode(crafted).decode()) == "mypolicies.MlpPolicy"


def test_a_space_class_is_read_without_its_module_and_a_space_without_one_is_refused(tmp_path):
    dotless = rewrite_zip(ZIPS["ppo_pendulum"][0], tmp_path / "dotless.zip",
                          data=lambda d: d["observation_space"].update({":type:": "<class 'Box'>"}))
    assert convert_source(dotless).model.graph.input[0].type.tensor_type.shape.dim[1].dim_value == 3
    untyped = rewrite_zip(ZIPS["ppo_pendulum"][0], tmp_path / "untyped.zip", data=lambda d: d["action_space"].pop(":type:"))
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(untyped)
    assert str(caught.value) == "the zip's action_space does not name its space class (no :type: entry)"


def test_an_activation_fn_that_is_not_a_class_name_is_refused_as_written(tmp_path):
    import torch

    # an instance where SB3 expects a class: SB3 writes its str() and pickles it, which policyport does not run
    path = rewrite_zip(ZIPS["ppo_pendulum"][0], tmp_path / "called.zip",
                       data=_policy_kwargs_edit(net_arch=[32, 32], activation_fn=torch.nn.Tanh()))
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(path)
    assert str(caught.value) == unbuilt_activation("Tanh()")


@pytest.mark.parametrize("name, edit, message", [
    ("ppo_pendulum", _space_edit("action", "discrete.Discrete", n=1),  # one output, but a log_std: Gaussian
     "a Discrete(1) action space, but the action network outputs 1 values"),
    ("sac_pendulum", _space_edit("action", "discrete.Discrete", n=1),  # an actor's squashed mean is no logits
     "a Discrete(1) action space, but the action network outputs 1 values"),
    ("sac_pendulum", _space_edit("action", "multi_discrete.MultiDiscrete", nvec="[1]"),
     "a MultiDiscrete[1] action space, but the action network outputs 1 logits"),
    ("ppo_pendulum", lambda d: d["action_space"].update(low="[-2. -2.]"),  # low of 2 values, high of 1
     "a Box action space of shape (1,), but the action network outputs 1 values"),
    ("ppo_pendulum", lambda d: d["action_space"].update(high="[2. 2.]"),
     "a Box action space of shape (1,), but the action network outputs 1 values"),
])
def test_an_action_space_that_does_not_fit_the_network_is_refused(tmp_path, name, edit, message):
    path = rewrite_zip(ZIPS[name][0], tmp_path / "spaced.zip", data=edit)
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(path)
    assert str(caught.value) == message


def test_a_sac_actions_tanh_is_named_action_and_a_td3_actors_after_its_last_linear():
    for name, scope in (("sac_pendulum", "action"), ("td3_pendulum", "actor.mu.5")):
        nodes = {n.output[0]: n.op_type for n in convert_source(ZIPS[name][0]).model.graph.node}
        assert nodes.get(f"{scope}/tanh") == "Tanh", (name, sorted(nodes))


def _list_dag(depth: int) -> list:
    value: list = [0]
    for _ in range(depth):
        value = [value, value]
    return value


def test_a_pickle_in_data_is_read_as_the_dag_it_is_and_compared_along_the_readable_json():
    from policyport.converter.sources.sb3 import _as_written, _same, pickled_value

    text = base64.b64encode(pickle.dumps({"net_arch": _list_dag(25), "pi": [64, 64]}, protocol=4)).decode()
    value = pickled_value(text)  # 3 * 2**25 objects as a tree (under the limit), read in 25 steps
    assert value["net_arch"][0] is value["net_arch"][1]
    written = _as_written(value)
    assert written["net_arch"][0] is written["net_arch"][1] and written["pi"] == [64, 64]
    assert not _same(written["net_arch"], [64, 64]) and not _same(written, {"net_arch": [[0]], "pi": [64, 64]})
    assert _same({"a": (1, [2.0])}, {"a": [1, [2.0]]}) and not _same({"a": 1}, {"a": 1, "b": 2})
    assert not _same([1], 1) and not _same({"a": 1}, [("a", 1)])
    big = base64.b64encode(pickle.dumps(_list_dag(40), protocol=4)).decode()
    with pytest.raises(pp.LimitExceededError, match=r"^the policy's pickle holds objects that, written out with every "
                                                    r"object its pickle shares repeated where it appears, are "
                                                    r"3,298,534,883,327 objects"):
        pickled_value(big, "the policy's pickle")
    nested_key = base64.b64encode(b"\x80\x04}(K\x00\x85K\x01u.").decode()  # {(0,): 1}: a container as a key
    assert pickled_value(nested_key) is None
