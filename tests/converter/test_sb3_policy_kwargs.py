"""What an SB3 zip records about its policy beyond the weights: the policy class, every
``policy_kwargs`` entry (readable, or in its pickle only), the activation with its
``functools.partial`` arguments. Each is read and converted, or refused naming what changes the
action; the zips are saved by SB3 itself, and the expected actions are SB3's own
``PPO.load(...).predict(obs, deterministic=True)``."""

from __future__ import annotations

import functools
import importlib
import json
import sys

import numpy as np
import pytest
from test_sb3 import (  # pytest puts tests/converter on sys.path
    EXPORT_FROM_PYTHON,
    ZIPS,
    _policy_class,
    _policy_kwargs_edit,
    cli,
    rewrite_zip,
    unbuilt_activation,
)

import policyport as pp
from policyport.converter import convert_source

sb3 = pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")
torch = pytest.importorskip("torch")

#: A module of the user's own, as a training script imports it: a parameter-free features extractor
#: and a policy class that clamps observations before acting.
MYEXT = '''
import torch
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor


class ScaleExtractor(BaseFeaturesExtractor):
    def __init__(self, s):
        super().__init__(s, s.shape[0])

    def forward(self, x):
        return torch.tanh(3 * x)


class ClipPolicy2(ActorCriticPolicy):
    def _predict(self, observation, deterministic=False):
        return super()._predict(observation.clamp(-0.5, 0.5), deterministic)
'''


@pytest.fixture(scope="module")
def myext(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user_code")
    (folder / "myext.py").write_text(MYEXT)
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module("myext")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("myext", None)


class Box4Discrete3(gym.Env):
    """Observations in Box(-1, 1, (4,)), actions Discrete(3)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), float(action == 0), False, False, {}


def uniform(n: int, width: int, bound: float = 3.0, seed: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-bound, bound, (n, width)).astype(np.float32)


def sb3_actions(path, obs, algorithm=None):
    agent = (algorithm or sb3.PPO).load(path, device="cpu")
    return agent.predict(obs, deterministic=True)[0]


def assert_same_actions(model, expected, obs):
    for backend in ("numpy", "onnxruntime"):
        action = pp.load(model, backend=backend).run({"obs": obs})["action"]
        assert action.shape == expected.shape
        if expected.dtype.kind == "i":
            assert np.array_equal(action, expected), f"{np.sum(action != expected)} actions differ on {backend}"
        else:
            np.testing.assert_allclose(action, expected, rtol=1e-5, atol=1e-5)


def refusal(args, tmp_path):
    """The CLI's exit code and stderr (whitespace joined) for ``convert ARGS``; nothing written."""
    result = cli("convert", *args, "-o", tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()
    return result.exit_code, " ".join(result.stderr.split())


# ------------------------------------------------------------------------------ features extractors


@pytest.mark.slow
def test_a_parameter_free_features_extractor_of_its_own_is_refused(tmp_path, myext):
    model = sb3.PPO("MlpPolicy", Box4Discrete3(), n_steps=64, batch_size=64, seed=0, device="cpu",
                    policy_kwargs=dict(features_extractor_class=myext.ScaleExtractor))
    model.learn(128)
    model.save(tmp_path / "x.zip")
    obs = uniform(1000, 4, bound=1.0)
    # the premise: the same weights behind SB3's default extractor act otherwise
    default = sb3.PPO("MlpPolicy", Box4Discrete3(), device="cpu")
    default.policy.load_state_dict(model.policy.state_dict(), strict=True)
    assert np.any(default.predict(obs, deterministic=True)[0] != sb3_actions(tmp_path / "x.zip", obs))

    message = ("the policy's features extractor is \"<class 'myext.ScaleExtractor'>\" (policy_kwargs' "
               "features_extractor_class), and policyport converts SB3's FlattenExtractor (the default) only: another "
               f"extractor's forward pass, parameter-free or not, is code the zip does not record; {EXPORT_FROM_PYTHON}")
    assert refusal([tmp_path / "x.zip"], tmp_path) == (3, f"error: {message}")
    # the same when the readable entry is gone and only the pickle names the class
    pickled = rewrite_zip(tmp_path / "x.zip", tmp_path / "pickled.zip",
                          data=lambda d: d["policy_kwargs"].pop("features_extractor_class"))
    assert refusal([pickled], tmp_path) == (3, f"error: {message}")


@pytest.mark.slow
def test_flatten_extractor_and_kwargs_that_change_no_action_convert_to_sb3s_predict(tmp_path):
    from stable_baselines3.common.torch_layers import FlattenExtractor

    kwargs = dict(net_arch=dict(pi=[16, 8], vf=[8]), activation_fn=torch.nn.ReLU, features_extractor_class=FlattenExtractor,
                  features_extractor_kwargs={}, share_features_extractor=False, ortho_init=False, log_std_init=-0.7,
                  optimizer_class=torch.optim.RMSprop, optimizer_kwargs=dict(alpha=0.9), normalize_images=False)
    sb3.PPO("MlpPolicy", "Pendulum-v1", seed=3, device="cpu", policy_kwargs=kwargs).save(tmp_path / "flat.zip")
    c = convert_source(tmp_path / "flat.zip")
    obs = uniform(1000, 3)
    assert_same_actions(c.model, sb3_actions(tmp_path / "flat.zip", obs), obs)
    assert c.oracle.framework
    assert pp.verify(c.model, obs, reference=c.reference, reference_oracle=c.oracle).passed


@pytest.mark.parametrize("kwargs, message", [
    (dict(net_arch=[32, 32], dueling=True),
     "the policy's policy_kwargs hold dueling=True, which none of the SB3 or sb3-contrib policy classes policyport "
     "converts takes, so policyport cannot tell whether it changes the action (it reads net_arch, activation_fn, "
     "features_extractor_class, features_extractor_kwargs, n_quantiles, use_sde, squash_output, and ortho_init, "
     "log_std_init, optimizer_class, optimizer_kwargs, n_critics, full_std, use_expln, sde_net_arch, clip_mean, "
     f"share_features_extractor, normalize_images change no deterministic action); {EXPORT_FROM_PYTHON}"),
    (dict(net_arch=[32, 32], features_extractor_kwargs=dict(features_dim=8)),
     "the policy's policy_kwargs give its features extractor the arguments {'features_dim': 8} "
     "(features_extractor_kwargs), which SB3's FlattenExtractor, the one policyport converts, does not take; "
     f"{EXPORT_FROM_PYTHON}"),
    (dict(net_arch=[32, 32], squash_output=True),
     "the policy's policy_kwargs set squash_output=True, which SB3 allows under gSDE only; policyport converts the "
     "plain Gaussian and squashed policies"),
])
def test_a_policy_kwargs_entry_that_may_change_the_action_is_refused_naming_it(tmp_path, kwargs, message):
    path = rewrite_zip(ZIPS["ppo_pendulum"][0], tmp_path / "kwargs.zip", data=_policy_kwargs_edit(**kwargs))
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(path)
    assert str(caught.value) == message


# ------------------------------------------------------------------------------------ policy classes


@pytest.mark.slow
def test_a_policy_class_of_its_own_is_refused_and_the_way_forward_it_names_works(tmp_path, myext):
    model = sb3.PPO(myext.ClipPolicy2, "Pendulum-v1", n_steps=64, batch_size=64, seed=0, device="cpu")
    model.learn(128)
    model.save(tmp_path / "clip.zip")
    obs = uniform(1000, 3, bound=2.0)
    expected = sb3_actions(tmp_path / "clip.zip", obs)
    # the premise: ActorCriticPolicy with the same weights acts otherwise
    base = sb3.PPO("MlpPolicy", "Pendulum-v1", device="cpu")
    base.policy.load_state_dict(model.policy.state_dict(), strict=True)
    assert np.abs(base.predict(obs, deterministic=True)[0] - expected).max() > 1e-4

    code, said = refusal([tmp_path / "clip.zip"], tmp_path)
    assert code == 3 and said == (
        f"error: {tmp_path / 'clip.zip'}: the policy class the zip records is myext.ClipPolicy2, not a policy class of "
        "SB3 or sb3-contrib that policyport converts (ActorCriticPolicy, SACPolicy, TD3Policy, DQNPolicy, "
        "QRDQNPolicy, MaskableActorCriticPolicy). A class of its own (a subclass of one of them included) can change "
        "what predict computes (_predict, extract_features, forward), and the zip holds that code only as a pickle, "
        f"which policyport does not run; {EXPORT_FROM_PYTHON}")

    class Deterministic(torch.nn.Module):
        def __init__(self, policy):
            super().__init__()
            self.policy = policy

        def forward(self, obs):
            return self.policy._predict(obs, deterministic=True)

    loaded = sb3.PPO.load(tmp_path / "clip.zip", device="cpu")
    exported = pp.convert(Deterministic(loaded.policy), input_shape=(3,))
    mean = pp.load(exported).run({"obs": obs})["logits"]
    np.testing.assert_allclose(np.clip(mean, -2, 2), expected, rtol=1e-5, atol=1e-5)  # predict clips to the bounds


@pytest.mark.slow
def test_a_policy_class_pickled_by_value_is_refused_naming_it(tmp_path, myext):
    import cloudpickle

    from policyport.converter.sources.sb3 import pickled_global

    cloudpickle.register_pickle_by_value(myext)  # as cloudpickle pickles a class its script defined
    try:
        sb3.PPO(myext.ClipPolicy2, "Pendulum-v1", device="cpu").save(tmp_path / "by_value.zip")
    finally:
        cloudpickle.unregister_pickle_by_value(myext)
    from policyport.converter.sources.sb3 import read_zip

    serialized = read_zip(tmp_path / "by_value.zip")[0]["policy_class"][":serialized:"]
    assert b"_make_skeleton_class" in __import__("base64").b64decode(serialized)
    assert pickled_global(serialized) == "myext.ClipPolicy2"
    code, said = refusal([tmp_path / "by_value.zip"], tmp_path)
    assert code == 3 and "the policy class the zip records is myext.ClipPolicy2, not a policy class of SB3" in said


@pytest.mark.parametrize("name, policy_class, message", [
    # the class's own name decides whether it is recurrent, not its module's: not recurrent, but not SB3's either
    ("ppo_pendulum", "mypolicies.Recurrent.MlpPolicy",
     "{path}: the policy class the zip records is mypolicies.Recurrent.MlpPolicy, not a policy class of SB3 or "
     "sb3-contrib that policyport converts"),
    ("ppo_pendulum", "sb3_contrib.Recurrent.MlpPolicy",  # a recurrent module of sb3_contrib
     "sb3_contrib.Recurrent.MlpPolicy is a recurrent policy; policyport converts feed-forward MLP policies"),
    ("sac_pendulum", "sb3_contrib.tqc.policies.TQCPolicy",  # sb3-contrib's own, but not converted
     "{path}: the policy class the zip records is sb3_contrib.tqc.policies.TQCPolicy, not a policy class of SB3 or "
     "sb3-contrib that policyport converts"),
    ("ppo_pendulum", "stable_baselines3.sac.policies.SACPolicy",
     "{path}: the zip records the policy class stable_baselines3.sac.policies.SACPolicy, a SAC policy, but its "
     "policy.pth holds the networks of a PPO/A2C actor-critic policy"),
])
def test_a_policy_class_policyport_does_not_convert_is_refused_saying_why(tmp_path, name, policy_class, message):
    path = rewrite_zip(ZIPS[name][0], tmp_path / "classed.zip", data=_policy_class(policy_class))
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(path)
    assert str(caught.value).startswith(message.format(path=path))


def test_a_policy_class_that_cannot_be_read_is_refused(tmp_path):
    path = rewrite_zip(ZIPS["ppo_pendulum"][0], tmp_path / "classless.zip",
                       data=lambda d: d["policy_class"].update({":serialized:": "!!not base64"}))
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(path)
    assert str(caught.value) == (
        f"{path}: the policy class the zip records cannot be read (its pickle names no class), so policyport cannot "
        "tell whether it is one of the SB3 or sb3-contrib policy classes it converts (ActorCriticPolicy, SACPolicy, "
        f"TD3Policy, DQNPolicy, QRDQNPolicy, MaskableActorCriticPolicy); {EXPORT_FROM_PYTHON}")


@pytest.mark.slow
def test_a_maskable_ppo_converts_to_its_predict_without_masks_and_says_so(tmp_path):
    contrib = pytest.importorskip("sb3_contrib")
    contrib.MaskablePPO("MlpPolicy", "CartPole-v1", seed=0, device="cpu").save(tmp_path / "maskable.zip")
    c = convert_source(tmp_path / "maskable.zip")
    obs = uniform(1000, 4)
    assert_same_actions(c.model, sb3_actions(tmp_path / "maskable.zip", obs, contrib.MaskablePPO), obs)
    assert [(a.topic, a.assumes) for a in c.assumptions][0] == ("head", "argmax over every action (no action mask)")
    assert c.oracle.name.endswith("own MaskableActorCriticPolicy.predict(deterministic=True)")
    assert pp.verify(c.model, obs, reference=c.reference, reference_oracle=c.oracle).passed


# --------------------------------------------------------------------------------------- activations


def _saved(tmp_path, name, activation_fn):
    path = tmp_path / f"{name}.zip"
    sb3.PPO("MlpPolicy", "Pendulum-v1", seed=1, device="cpu",
            policy_kwargs=dict(net_arch=[16, 16], activation_fn=activation_fn)).save(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("name, activation_fn, recorded", [
    ("leaky_positional", functools.partial(torch.nn.LeakyReLU, 0.2), "leaky_relu:0.2"),
    ("leaky_keyword", functools.partial(torch.nn.LeakyReLU, negative_slope=0.3), "leaky_relu:0.3"),
    ("celu", torch.nn.CELU, "elu"),
    ("elu_alpha_1", functools.partial(torch.nn.ELU, alpha=1.0), "elu"),
])
def test_an_activation_with_its_parameters_in_a_partial_converts_to_sb3s_predict(tmp_path, name, activation_fn, recorded):
    path = _saved(tmp_path, name, activation_fn)
    c = convert_source(path)
    obs = uniform(1000, 3)
    assert_same_actions(c.model, sb3_actions(path, obs), obs)
    assert {p.key: p.value for p in c.model.metadata_props}["policyport.activation"] == recorded
    assert not any(a.topic == "activation" for a in c.assumptions)
    report = pp.verify(c.model, obs, reference=c.reference, reference_oracle=c.oracle)
    assert report.passed and c.oracle.framework


@pytest.mark.slow
@pytest.mark.parametrize("name, activation_fn, detail", [
    ("hardtanh", torch.nn.Hardtanh, ""), ("relu6", torch.nn.ReLU6, ""), ("softsign", torch.nn.Softsign, ""),
    ("prelu", torch.nn.PReLU, ""),
    ("leaky_list", functools.partial(torch.nn.LeakyReLU, [0.2]), "its negative_slope [0.2] is not a number"),
    ("elu3", functools.partial(torch.nn.ELU, alpha=3), "ELU with alpha=3; policyport's elu is alpha=1.0"),
    ("gelu_tanh", functools.partial(torch.nn.GELU, approximate="tanh"),
     "GELU with approximate='tanh'; policyport's gelu is approximate='none'"),
])
def test_an_activation_policyport_does_not_build_is_refused_with_a_way_forward(tmp_path, name, activation_fn, detail):
    if name == "leaky_list":  # SB3 cannot build it: written into a zip SB3 saved with another slope
        path = rewrite_zip(_saved(tmp_path, "leaky", functools.partial(torch.nn.LeakyReLU, 0.2)), tmp_path / "list.zip",
                           data=_policy_kwargs_edit(net_arch=[16, 16], activation_fn=activation_fn))
    else:
        path = _saved(tmp_path, name, activation_fn)
    with zipfile_data(path) as data:
        text = data["policy_kwargs"]["activation_fn"]
    message = f"error: {unbuilt_activation(text, detail)}"
    assert refusal([path], tmp_path) == (3, message)
    assert refusal([path, "--activation", "tanh"], tmp_path) == (3, message)  # no contradiction to settle


class zipfile_data:
    """``with zipfile_data(path) as data``: the zip's ``data`` JSON."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        from policyport.converter.sources.sb3 import read_zip

        return read_zip(self.path)[0]

    def __exit__(self, *exc):
        return False


def test_sb3s_own_policy_is_built_with_the_activation_the_zip_records():
    from policyport.converter.sources.sb3 import torch_activation
    from policyport.converter.sources.sb3_policy import _activation_fn

    leaky = _activation_fn(torch, torch_activation("functools.partial(<class 'torch.nn.modules.activation.LeakyReLU'>, 0.2)"))()
    assert type(leaky) is torch.nn.LeakyReLU and leaky.negative_slope == 0.2
    celu = _activation_fn(torch, torch_activation("<class 'torch.nn.modules.activation.CELU'>"))()
    assert type(celu) is torch.nn.CELU  # the zip's class, though policyport builds it as elu
    given = _activation_fn(torch, "leaky_relu:0.3")()  # --activation where the zip's cannot be read
    assert type(given) is torch.nn.LeakyReLU and given.negative_slope == 0.3
    assert _activation_fn(torch, "silu") is torch.nn.SiLU


@pytest.mark.slow
def test_verify_against_a_zip_finds_another_leaky_slope(tmp_path):
    path = _saved(tmp_path, "leaky", functools.partial(torch.nn.LeakyReLU, 0.2))
    other = rewrite_zip(path, tmp_path / "other_slope.zip",
                        data=_policy_kwargs_edit(net_arch=[16, 16], activation_fn=functools.partial(torch.nn.LeakyReLU, 0.01)))
    assert cli("convert", other, "-o", tmp_path / "other.onnx", "--samples", "32").exit_code == 0
    result = cli("verify", tmp_path / "other.onnx", "--source", path, "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code == 1 and not doc["passed"]
    assert doc["first_divergence"]["tensor"] == "mlp_extractor.policy_net.1/leaky_relu"


# ------------------------------------------------------------------ policy_kwargs in the pickle only


@pytest.fixture(scope="module")
def relu_zip(tmp_path_factory):
    path = tmp_path_factory.mktemp("relu") / "relu.zip"
    sb3.PPO("MlpPolicy", "Pendulum-v1", seed=2, device="cpu",
            policy_kwargs=dict(net_arch=dict(pi=[16, 24], vf=[8]), activation_fn=torch.nn.ReLU, log_std_init=-0.5)).save(path)
    return path


@pytest.mark.parametrize("edit", ["activation_fn", "every entry"])
def test_an_activation_only_the_pickle_names_is_read_from_its_opcodes(tmp_path, relu_zip, edit):
    def drop(data):
        kwargs = data["policy_kwargs"]
        for key in [k for k in kwargs if not k.startswith(":") and (edit != "activation_fn" or k == edit)]:
            del kwargs[key]

    path = rewrite_zip(relu_zip, tmp_path / "pickled.zip", data=drop)
    c = convert_source(path)
    obs = uniform(1000, 3)
    assert_same_actions(c.model, sb3_actions(relu_zip, obs), obs)
    assert {p.key: p.value for p in c.model.metadata_props}["policyport.activation"] == "relu"
    assert not any(a.topic == "activation" for a in c.assumptions)  # the zip records it: nothing assumed
    with pytest.raises(pp.OptionError) as caught:
        convert_source(path, activation="tanh")
    assert str(caught.value) == ("--activation tanh contradicts the pickle of the zip's policy_kwargs, which names "
                                 "relu; leave --activation out to use the recorded one")


def test_a_partial_only_the_pickle_holds_gives_its_arguments(tmp_path):
    path = _saved(tmp_path, "leaky", functools.partial(torch.nn.LeakyReLU, negative_slope=0.2))
    pickled = rewrite_zip(path, tmp_path / "pickled.zip", data=lambda d: d["policy_kwargs"].pop("activation_fn"))
    c = convert_source(pickled)
    assert {p.key: p.value for p in c.model.metadata_props}["policyport.activation"] == "leaky_relu:0.2"
    obs = uniform(200, 3)
    assert_same_actions(c.model, sb3_actions(path, obs), obs)


def test_a_readable_entry_its_pickle_contradicts_is_refused(tmp_path, relu_zip):
    path = rewrite_zip(relu_zip, tmp_path / "edited.zip", data=lambda d: d["policy_kwargs"].update(
        activation_fn="<class 'torch.nn.modules.activation.Tanh'>"))
    code, said = refusal([path], tmp_path)
    assert (code, said) == (3, "error: the zip's policy_kwargs disagree with themselves: activation_fn reads \"<class "
                               "'torch.nn.modules.activation.Tanh'>\", and their pickle holds \"<class "
                               "'torch.nn.modules.activation.ReLU'>\"; the zip was edited after SB3 saved it: save the "
                               "model again with SB3 (model.save)")


def test_a_pickle_that_cannot_be_followed_still_needs_activation(tmp_path, relu_zip):
    import base64

    def unfollowable(data):  # a persistent id: an opcode the reader does not follow
        data["policy_kwargs"] = {":type:": "<class 'dict'>", ":serialized:": base64.b64encode(b"\x80\x04P0\n.").decode()}

    path = rewrite_zip(relu_zip, tmp_path / "unfollowable.zip", data=unfollowable)
    code, said = refusal([path], tmp_path)
    assert code == 2 and "its policy_kwargs are stored only as a pickle whose opcodes policyport cannot follow" in said
    c = convert_source(path, activation="relu")
    assert [a.topic for a in c.assumptions][0] == "activation"
    obs = uniform(200, 3)
    assert_same_actions(c.model, sb3_actions(relu_zip, obs), obs)


def test_the_pickle_reader_gives_containers_globals_and_calls_without_running_them():
    import base64
    import pickle

    from policyport.converter.sources.sb3 import PickledCall, PickledGlobal, pickled_value

    kwargs = {"net_arch": {"pi": [16, 24], "vf": (8,)}, "activation_fn": functools.partial(torch.nn.ELU, alpha=3.0),
              "fe": torch.nn.ReLU, "again": torch.nn.ReLU, "flag": True, "none": None, "x": 2.5}
    for protocol in (2, 4, 5):
        value = pickled_value(base64.b64encode(pickle.dumps(kwargs, protocol=protocol)).decode())
        assert value["net_arch"] == {"pi": [16, 24], "vf": (8,)}
        assert value["fe"] == value["again"] == PickledGlobal("torch.nn.modules.activation.ReLU")  # memoised
        assert (value["flag"], value["none"], value["x"]) == (True, None, 2.5)
        partial = value["activation_fn"]
        assert isinstance(partial, PickledCall) and partial.func == PickledGlobal("functools.partial")
        assert partial.state[:3] == (PickledGlobal("torch.nn.modules.activation.ELU"), (), {"alpha": 3.0})
