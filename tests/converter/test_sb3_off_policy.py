"""SB3's value-based and deterministic off-policy agents (DQN, sb3-contrib's QR-DQN, DDPG) as SB3 2.9.2
saves them (``fixtures/sb3/make_off_policy.py``): the action equals SB3's own
``predict(obs, deterministic=True)`` and the Q-values its Q-network's output, on observations from the
environment's observation space; the target network is left out; a DQN zip converts whatever SB3
version wrote it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from test_sb3 import (  # pytest puts tests/converter on sys.path
    _policy_class,
    rewrite_zip,
)
from torch_fixtures import ROOT, SB3_DIR
from typer.testing import CliRunner

import policyport as pp
from policyport.converter import convert_source

sb3 = pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")
torch = pytest.importorskip("torch")

#: name -> (algorithm, where the test observations come from: the space SB3 recorded, or a rollout
#: of the environment where the space's bounds are float32's largest numbers).
AGENTS = {
    "dqn_cartpole": ("DQN", "CartPole-v1"),
    "dqn_choice": ("DQN", "space"),
    "dqn_frozenlake": ("DQN", "space"),
    "qrdqn_choice": ("QRDQN", "space"),
    "ddpg_pendulum": ("DDPG", "space"),
}


def load_agent(name: str):
    algorithm = AGENTS[name][0]
    if algorithm == "QRDQN":
        module = pytest.importorskip("sb3_contrib")
    else:
        module = sb3
    return getattr(module, algorithm).load(SB3_DIR / f"{name}.zip", device="cpu")


def observations(name: str, agent, n: int = 1000, seed: int = 11) -> np.ndarray:
    """``n`` observations of the agent's environment: drawn from the observation space SB3 recorded
    (seeded), or, for CartPole (whose velocity bounds are ±3.4e38), visited by random actions."""
    where = AGENTS[name][1]
    if where == "space":
        space = agent.observation_space
        space.seed(seed)
        return np.stack([space.sample() for _ in range(n)])
    env = gym.make(where)
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    visited = []
    while len(visited) < n:
        visited.append(obs)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    return np.stack(visited).astype(np.float32)


def sb3_network_output(agent, obs: np.ndarray) -> np.ndarray:
    """The raw output of the agent's own Q-network (DQN: Q-values; QR-DQN: quantiles, flattened as
    the last Linear emits them) on ``obs``, preprocessed by SB3 itself (one-hot for Discrete)."""
    policy = agent.policy
    tensor, _ = policy.obs_to_tensor(obs)
    with torch.no_grad():
        if hasattr(policy, "quantile_net"):
            return policy.quantile_net(tensor).reshape(len(obs), -1).numpy()
        return policy.q_net(tensor).numpy()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(AGENTS))
@pytest.mark.parametrize("opset", [13, 18])
def test_action_equals_sb3_predict_on_observations_from_its_environment(name, opset):
    agent = load_agent(name)
    obs = observations(name, agent)
    expected, _ = agent.predict(obs, deterministic=True)
    c = convert_source(SB3_DIR / f"{name}.zip", opset=opset)
    for backend in ("numpy", "onnxruntime"):
        outputs = pp.load(c.model, backend=backend).run({"obs": obs})
        action = outputs["action"]
        assert action.dtype == expected.dtype and action.shape == expected.shape
        if expected.dtype.kind == "i":
            assert np.array_equal(action, expected), f"{np.sum(action != expected)} of {len(obs)} actions differ"
        else:
            np.testing.assert_allclose(action, expected, rtol=1e-5, atol=1e-5)
        if AGENTS[name][0] in ("DQN", "QRDQN"):
            np.testing.assert_allclose(outputs["logits"], sb3_network_output(agent, obs), rtol=1e-5, atol=1e-6)
    if name != "dqn_cartpole":  # 300 steps of CartPole leave one greedy action; the Q-values above still differ
        assert len(np.unique(expected, axis=0)) > 1
    report = pp.verify(c.model, obs, reference=c.reference)
    assert report.passed, report.first_divergence


def test_qr_dqn_q_values_are_the_mean_of_its_quantiles_per_action():
    agent = load_agent("qrdqn_choice")
    obs = observations("qrdqn_choice", agent, n=64)
    quantiles = sb3_network_output(agent, obs).reshape(64, agent.n_quantiles, agent.action_space.n)
    outputs = pp.load(convert_source(SB3_DIR / "qrdqn_choice.zip").model).run({"obs": obs})
    assert agent.n_quantiles == 5 and outputs["logits"].shape == (64, 15)
    np.testing.assert_allclose(outputs["q_values"], quantiles.mean(axis=1), rtol=1e-6, atol=1e-6)
    assert np.array_equal(outputs["action"], quantiles.mean(axis=1).argmax(axis=1))


TARGET_NOTE = "not exported: {0}_target (the target network; the deterministic action needs {0} only)"


@pytest.mark.parametrize("name, outputs, head, activation, note", [
    ("dqn_cartpole", ["logits", "action"], "categorical", "relu", TARGET_NOTE.format("q_net")),
    ("dqn_choice", ["logits", "action"], "categorical", "tanh", TARGET_NOTE.format("q_net")),
    ("qrdqn_choice", ["logits", "q_values", "action"], "quantile-argmax", "relu", TARGET_NOTE.format("quantile_net")),
    ("ddpg_pendulum", ["logits", "action"], "squashed", "relu",
     "not exported: actor_target, critic, critic_target (the deterministic action needs the actor only)"),
])
def test_the_model_names_its_head_and_activation_and_leaves_the_target_network_out(name, outputs, head, activation, note):
    path = SB3_DIR / f"{name}.zip"
    c = convert_source(path)
    props = {p.key: p.value for p in c.model.metadata_props}
    assert [o.name for o in c.model.graph.output] == outputs
    assert (props["policyport.head"], props["policyport.activation"]) == (head, activation)
    assert note in c.notes
    with zipfile.ZipFile(path) as zf:
        state = torch.load(io.BytesIO(zf.read("policy.pth")), weights_only=True)
    kept = {k: v.numpy() for k, v in state.items() if k.startswith(("q_net.", "quantile_net.", "actor.mu."))}
    weights = pp.extract_weights(c.model)
    assert sorted(weights) == sorted(kept)
    for key, array in kept.items():
        np.testing.assert_array_equal(weights[key], array)


def test_a_dqn_on_discrete_observations_takes_their_indices_and_one_hot_encodes_them():
    agent = load_agent("dqn_frozenlake")
    c = convert_source(SB3_DIR / "dqn_frozenlake.zip")
    assert c.model.graph.input[0].type.tensor_type.elem_type == 7  # int64
    every_state = np.arange(16, dtype=np.int64)
    expected, _ = agent.predict(every_state, deterministic=True)
    assert np.array_equal(pp.load(c.model).run({"obs": every_state})["action"], expected)


def test_a_dqn_zip_written_by_sb3_1_converts_as_the_one_2_9_2_wrote(tmp_path):
    """The zip as SB3 1.x wrote it: gym's space classes with a ``shape`` entry, the policy class pickled
    with a GLOBAL opcode, version 1.6.2; policy.pth the same ``q_net``/``q_net_target`` state_dict."""
    def as_sb3_1(data):
        _policy_class("stable_baselines3.dqn.policies.DQNPolicy")(data)
        obs_space, action_space = data["observation_space"], data["action_space"]
        obs_space[":type:"] = "<class 'gym.spaces.box.Box'>"
        obs_space["shape"] = obs_space.pop("_shape")
        action_space[":type:"] = "<class 'gym.spaces.discrete.Discrete'>"
        action_space["shape"] = action_space.pop("_shape")

    edited = rewrite_zip(SB3_DIR / "dqn_cartpole.zip", tmp_path / "edited.zip", data=as_sb3_1)
    old = tmp_path / "dqn_sb3_1.zip"
    with zipfile.ZipFile(edited) as zin, zipfile.ZipFile(old, "w") as zout:
        for member in zin.namelist():
            zout.writestr(member, b"1.6.2" if member == "_stable_baselines3_version" else zin.read(member))
    c_old, c_new = convert_source(old), convert_source(SB3_DIR / "dqn_cartpole.zip")
    source = json.loads({p.key: p.value for p in c_old.model.metadata_props}["policyport.source"])
    assert (source["sb3_version"], source["policy_class"]) == ("1.6.2", "stable_baselines3.dqn.policies.DQNPolicy")
    obs = observations("dqn_cartpole", load_agent("dqn_cartpole"), n=200)
    old_out, new_out = (pp.load(c.model).run({"obs": obs}) for c in (c_old, c_new))
    assert np.array_equal(old_out["logits"], new_out["logits"]) and np.array_equal(old_out["action"], new_out["action"])


@pytest.mark.parametrize("policy_class, rename, first", [
    ("stable_baselines3.dqn.policies.DQNPolicy", ("q_net", "critic_net"), "critic_net.critic_net.0.bias"),
    # sb3-contrib's ARS: an action_net Sequential, not ActorCriticPolicy's single Linear
    ("sb3_contrib.ars.policies.ARSPolicy", ("q_net.q_net", "action_net"), "action_net.0.bias"),
])
def test_a_policy_pth_of_no_sb3_network_is_refused_naming_the_policy_class(tmp_path, policy_class, rename, first):
    def renamed(state):
        return {k.replace(*rename): v for k, v in state.items() if not k.startswith("q_net_target.")}

    path = rewrite_zip(SB3_DIR / "dqn_choice.zip", tmp_path / "renamed.zip", state=renamed,
                       data=_policy_class(policy_class))
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: the policy.pth of {policy_class} holds {first}, ")
    assert message.endswith("which fit none of the SB3 networks policyport converts (ActorCriticPolicy "
                            "mlp_extractor.*/action_net.*, SAC/TD3/DDPG actor.*, DQN q_net.q_net.*, QR-DQN "
                            "quantile_net.quantile_net.*)")


def test_a_quantile_count_the_zip_contradicts_is_refused(tmp_path):
    path = rewrite_zip(SB3_DIR / "qrdqn_choice.zip", tmp_path / "quantiles.zip", data=lambda d: d.update(n_quantiles=4))
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(path)
    assert str(caught.value) == ("a Discrete(3) action space and n_quantiles 4, but the quantile network outputs 15 "
                                 "values, not n_quantiles per action")


def _policy_pth(name: str, tmp_path):
    with zipfile.ZipFile(SB3_DIR / f"{name}.zip") as zf:
        (tmp_path / f"{name}.pth").write_bytes(zf.read("policy.pth"))
    return tmp_path / f"{name}.pth"


def test_a_dqn_policy_pth_alone_converts_to_the_argmax_of_its_q_values(tmp_path):
    agent = load_agent("dqn_choice")
    obs = observations("dqn_choice", agent, n=200)
    c = convert_source(_policy_pth("dqn_choice", tmp_path), activation="tanh")
    assert "logits are the Q-values; action = their argmax, as DQN's predict(deterministic=True) acts" in c.notes
    expected, _ = agent.predict(obs, deterministic=True)
    assert np.array_equal(pp.load(c.model).run({"obs": obs})["action"], expected)
    with pytest.raises(pp.OptionError, match=r"^--keep-value: a DQN has no value function"):
        convert_source(_policy_pth("dqn_choice", tmp_path), activation="tanh", keep_value=True)
    with pytest.raises(pp.OptionError) as caught:
        convert_source(_policy_pth("dqn_choice", tmp_path), activation="tanh", head="diag-gaussian")
    assert str(caught.value) == ("--head diag-gaussian does not apply to an SB3 DQN: its action is the argmax of its "
                                 "Q-values (the categorical head)")


def test_a_qr_dqn_policy_pth_alone_outputs_its_quantiles_and_says_why_no_action(tmp_path):
    with pytest.raises(pp.OptionError, match="convert the SB3 zip, whose policy_kwargs record it"):
        convert_source(_policy_pth("qrdqn_choice", tmp_path))  # a bare policy.pth does not record its activation
    c = convert_source(_policy_pth("qrdqn_choice", tmp_path), activation="relu")
    assert [o.name for o in c.model.graph.output] == ["logits"]
    assert ("logits are QR-DQN's quantiles, n_quantiles per action; how many per action is not in a state_dict, so "
            "there is no action output (convert the SB3 zip for the argmax of the mean quantile)") in c.notes
    with pytest.raises(pp.OptionError, match=r"^--head categorical does not apply to an SB3 QR-DQN"):
        convert_source(_policy_pth("qrdqn_choice", tmp_path), activation="relu", head="categorical")


def test_a_module_of_ones_own_named_q_net_is_still_a_plain_sequential(tmp_path):
    """Only SB3's ``q_net.q_net.<i>`` names a DQN; a user's ``q_net.<i>`` Sequential is not one."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    torch.save({f"q_net.{k}": v for k, v in net.state_dict().items()}, tmp_path / "own.pt")
    c = convert_source(tmp_path / "own.pt", activation="relu")
    assert {p.key: p.value for p in c.model.metadata_props}["policyport.layout"] == "sequential"
    obs = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    with torch.no_grad():
        expected = net(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(pp.load(c.model).run({"obs": obs})["logits"], expected, rtol=1e-6, atol=1e-6)


def test_the_cli_converts_a_dqn_zip_and_conversion_imports_neither_sb3_nor_sb3_contrib(tmp_path):
    from policyport.cli import app

    out = tmp_path / "dqn.onnx"
    result = CliRunner().invoke(app, ["convert", str(SB3_DIR / "dqn_cartpole.zip"), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["kind"] == "sb3" and doc["verification"]["passed"] and out.exists()
    script = ("import sys, json\nfrom policyport.converter import convert_source\n"
              "kinds = [convert_source(p).kind for p in sys.argv[1:]]\n"
              "print(json.dumps({'kinds': kinds, 'loaded': sorted(m for m in ('stable_baselines3', 'sb3_contrib', "
              "'gymnasium', 'gym', 'cloudpickle') if m in sys.modules)}))\n")
    paths = [str(SB3_DIR / f"{name}.zip") for name in AGENTS]
    ran = subprocess.run([sys.executable, "-c", script, *paths], capture_output=True, text=True, cwd=ROOT, check=False)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == {"kinds": ["sb3"] * len(paths), "loaded": []}
