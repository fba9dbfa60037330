"""What an SB3 zip records about its policy's activation: the ``torch.nn`` class with its
``functools.partial`` arguments, readable or in the pickle of ``policy_kwargs`` only. Each is read
and converted, or refused saying what policyport builds; the zips are saved by SB3 itself, and the
expected actions are SB3's own ``PPO.load(...).predict(obs, deterministic=True)``."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from test_sb3 import (  # pytest puts tests/converter on sys.path
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
        from policyport.converter.sb3 import read_zip

        return read_zip(self.path)[0]

    def __exit__(self, *exc):
        return False


def test_sb3s_own_policy_is_built_with_the_activation_the_zip_records():
    from policyport.converter.sb3 import torch_activation
    from policyport.converter.sb3_policy import _activation_fn

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

    from policyport.converter.sb3 import PickledCall, PickledGlobal, pickled_value

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
