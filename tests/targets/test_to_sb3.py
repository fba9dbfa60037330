"""to-sb3: a policy as a Stable-Baselines3 zip (PPO, A2C, SAC, TD3, DDPG, DQN): SB3's own load accepts it,
its predict equals the source's action, every weight trains, and learn() continues in an environment of the
same spaces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app

pytestmark = pytest.mark.slow
sb3 = pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).parents[2]
EXPERT = ROOT / "fixtures/real/metadrive_ppo_expert.npz"
SB3 = ROOT / "fixtures/sb3"
MLA = ROOT / "fixtures/ml_agents/exports"


class ToyEnv(gym.Env):
    """Observations drawn uniformly from [0, 1), reward -|action|² (or 1 for the all-zero discrete action),
    32 steps an episode: spaces to continue training in, nothing more. ``observation``: the observation
    size (a Box(-inf, inf)) or the space itself."""

    def __init__(self, observation, action_space):
        self.observation_space = (observation if isinstance(observation, gym.spaces.Space)
                                  else gym.spaces.Box(-np.inf, np.inf, (observation,), np.float32))
        self.action_space = action_space
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self.np_random.uniform(0, 1, self.observation_space.shape).astype(np.float32), {}

    def step(self, action):
        self.steps += 1
        reward = -float(np.sum(np.square(action))) if isinstance(self.action_space, gym.spaces.Box) else float(np.all(action == 0))
        obs = self.np_random.uniform(0, 1, self.observation_space.shape).astype(np.float32)
        return obs, reward, False, self.steps >= 32, {}


def every_parameter_trains(policy, obs: np.ndarray) -> list[str]:
    """One step of the policy's own optimiser on a loss of its outputs; the parameters left unchanged
    (SAC's and TD3's target networks follow by Polyak averaging in learn(), not by a gradient: left out)."""
    before = {k: v.detach().clone() for k, v in policy.named_parameters()}
    x = torch.from_numpy(obs)
    if hasattr(policy, "critic"):  # SAC, TD3, DDPG: the actor's and the critics' own optimisers
        if hasattr(policy.actor, "action_log_prob"):  # SAC: a sampled (reparametrised) action and its log prob
            sampled, log_prob = policy.actor.action_log_prob(x)
            actor_loss = log_prob.sum() + (sampled ** 2).sum()
        else:
            actor_loss = (policy.actor(x) ** 2).sum()
        actions = torch.full((len(obs), *policy.action_space.shape), 0.5)
        critic_loss = sum((q ** 2).sum() for q in policy.critic(x, actions))
        for optimiser, loss in ((policy.actor.optimizer, actor_loss), (policy.critic.optimizer, critic_loss)):
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        return [k for k, v in policy.named_parameters()
                if not k.startswith(("actor_target.", "critic_target.")) and torch.equal(before[k], v.detach())]
    if hasattr(policy, "q_net"):
        loss = (policy.q_net(x) ** 2).sum() + (policy.q_net_target(x) ** 2).sum()
        optimiser = torch.optim.SGD(policy.parameters(), lr=0.1)
    else:
        distribution = policy.get_distribution(x)
        actions = torch.ones((len(obs), *policy.action_space.shape)) if policy.action_space.shape else torch.zeros(len(obs))
        loss = -distribution.log_prob(actions).sum() + (policy.predict_values(x) ** 2).sum()
        optimiser = policy.optimizer
    optimiser.zero_grad()
    loss.backward()
    optimiser.step()
    return [k for k, v in policy.named_parameters() if torch.equal(before[k], v.detach())]


def test_metadrive_expert_becomes_a_ppo_that_sb3_loads_predicts_and_trains(tmp_path):
    from stable_baselines3 import PPO

    out = tmp_path / "metadrive_ppo.zip"
    done = pp.to_sb3(str(EXPERT), out, algo="ppo", activation="tanh", head="diag-gaussian", log_std=-0.5,
                     action_space=(-1.0, 1.0))
    assert done.vecnormalize is None and done.net_arch == [256, 256] and done.activation_fn == "Tanh"
    assert any("log_std -0.5" in a for a in done.assumptions)
    w = np.load(EXPERT)
    obs = np.random.default_rng(4).uniform(0, 1, (1000, 275)).astype(np.float32)
    h = np.tanh(obs.astype(np.float64) @ w["default_policy/fc_1/kernel"] + w["default_policy/fc_1/bias"])
    h = np.tanh(h @ w["default_policy/fc_2/kernel"] + w["default_policy/fc_2/bias"])
    mean = (h @ w["default_policy/fc_out/kernel"] + w["default_policy/fc_out/bias"])[:, :2]
    env = ToyEnv(275, gym.spaces.Box(-1, 1, (2,), np.float32))
    model = PPO.load(out, env=env, device="cpu", n_steps=128, batch_size=64, n_epochs=1)
    action, _ = model.predict(obs, deterministic=True)
    np.testing.assert_allclose(action, np.clip(mean, -1, 1), atol=2e-5, rtol=0)
    np.testing.assert_array_equal(model.policy.log_std.detach().numpy(), [-0.5, -0.5])
    assert every_parameter_trains(model.policy, obs[:16]) == []
    model.learn(256)
    assert model.num_timesteps == 256


def test_sb3_ppo_with_vecnormalize_round_trips_through_sb3(tmp_path):
    import pickle

    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    out = tmp_path / "pendulum.zip"
    done = pp.to_sb3(str(SB3 / "ppo_pendulum_vecnorm.zip"), out, algo="ppo", low=-2, high=2)
    assert done.vecnormalize == tmp_path / "pendulum_vecnormalize.pkl" and done.action_space == repr(
        gym.spaces.Box(-2, 2, (1,), np.float32))
    assert done.observation_space == repr(gym.make("Pendulum-v1").observation_space)  # the zip's own
    source = PPO.load(SB3 / "ppo_pendulum_vecnorm.zip", device="cpu")
    with open(SB3 / "ppo_pendulum_vecnorm/vecnormalize.pkl", "rb") as f:  # this project's own fixture
        source_norm = pickle.load(f)
    venv = DummyVecEnv([lambda: gym.make("Pendulum-v1")])
    norm = VecNormalize.load(str(done.vecnormalize), venv)
    np.testing.assert_array_equal(norm.obs_rms.mean, source_norm.obs_rms.mean)
    np.testing.assert_array_equal(norm.obs_rms.var, source_norm.obs_rms.var)
    assert (norm.clip_obs, norm.epsilon) == (source_norm.clip_obs, source_norm.epsilon)
    model = PPO.load(out, env=norm, device="cpu", n_steps=128, batch_size=64, n_epochs=1)
    obs = np.random.default_rng(0).uniform(-2, 2, (1000, 3)).astype(np.float32)
    want, _ = source.predict(source_norm.normalize_obs(obs), deterministic=True)
    got, _ = model.predict(norm.normalize_obs(obs), deterministic=True)
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    np.testing.assert_array_equal(model.policy.log_std.detach().numpy(), source.policy.log_std.detach().numpy())
    assert every_parameter_trains(model.policy, obs[:16]) == []
    model.learn(256)
    assert model.num_timesteps == 256


def test_sb3_dqn_round_trips_through_sb3(tmp_path):
    from stable_baselines3 import DQN

    out = tmp_path / "dqn.zip"
    done = pp.to_sb3(str(SB3 / "dqn_cartpole.zip"), out, algo="dqn", low=-2, high=2)
    assert not [a for a in done.assumptions if a.startswith("Q-values")]  # SB3's q_net: its logits are Q-values
    source = DQN.load(SB3 / "dqn_cartpole.zip", device="cpu")
    model = DQN.load(out, env=gym.make("CartPole-v1"), device="cpu", learning_starts=64)
    obs = np.random.default_rng(1).uniform(-2, 2, (1000, 4)).astype(np.float32)
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], source.predict(obs, deterministic=True)[0])
    with torch.no_grad():
        np.testing.assert_allclose(model.q_net(torch.from_numpy(obs)).numpy(), source.q_net(torch.from_numpy(obs)).numpy(),
                                   atol=1e-6, rtol=0)
        np.testing.assert_array_equal(model.q_net_target(torch.from_numpy(obs)).numpy(), model.q_net(torch.from_numpy(obs)).numpy())
    assert every_parameter_trains(model.policy, obs[:16]) == []
    model.learn(256)
    assert model.num_timesteps == 256


def test_a_policy_gradient_policy_as_dqn_says_its_logits_are_taken_for_q_values(tmp_path):
    from stable_baselines3 import DQN, PPO

    source = ROOT / "fixtures/real/sb3_ppo_cartpole.zip"
    done = pp.to_sb3(str(source), tmp_path / "dqn.zip", algo="dqn", low=-2, high=2)
    said = [a for a in done.assumptions if a.startswith("Q-values")]
    assert len(said) == 1 and "source layout sb3, not a Q-network policyport knows" in said[0]
    assert "learn() starts from values trained as logits, not as Q-values" in said[0]
    obs = np.random.default_rng(2).uniform(-2, 2, (1000, 4)).astype(np.float32)
    got = DQN.load(tmp_path / "dqn.zip", device="cpu").predict(obs, deterministic=True)[0]
    spaces = {"observation_space": gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),  # its pickled ones need gym
              "action_space": gym.spaces.Discrete(2), "lr_schedule": lambda _: 0.0, "clip_range": lambda _: 0.2}
    want = PPO.load(source, device="cpu", custom_objects=spaces).predict(obs, deterministic=True)[0]
    np.testing.assert_array_equal(got, want)


def pendulum_observations(n: int, seed: int) -> np.ndarray:
    """``n`` observations drawn uniformly from Pendulum-v1's observation space (cos, sin, angular velocity)."""
    return np.random.default_rng(seed).uniform([-1, -1, -8], [1, 1, 8], (n, 3)).astype(np.float32)


def test_sb3_sac_round_trips_through_sb3_with_its_critics(tmp_path):
    """An SB3 SAC zip: SAC.load takes the result, its predict equals the source SAC's on 1,000 observations, the
    log_std layer, critics and entropy coefficient are the zip's, every actor and critic weight trains, and
    learn() continues on Pendulum-v1."""
    from stable_baselines3 import SAC

    out = tmp_path / "sac.zip"
    done = pp.to_sb3(str(SB3 / "sac_pendulum.zip"), out, algo="sac", low=-2, high=2)
    assert (done.algo, done.net_arch, done.activation_fn) == ("sac", [32, 32], "ReLU")
    assert done.action_space == repr(gym.spaces.Box(-2, 2, (1,), np.float32))
    assert any(n.startswith("carried from the zip's policy.pth, which the ONNX model leaves out: actor.log_std, critic, "
                            "critic_target (26 tensors") for n in done.notes)
    source = SAC.load(SB3 / "sac_pendulum.zip", device="cpu")
    model = SAC.load(out, env=gym.make("Pendulum-v1"), device="cpu", learning_starts=64, batch_size=64)
    obs = pendulum_observations(1000, 2)
    want, _ = source.predict(obs, deterministic=True)
    got, _ = model.predict(obs, deterministic=True)
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    theirs, mine = source.policy.state_dict(), model.policy.state_dict()
    assert sorted(mine) == sorted(theirs)
    for key, value in mine.items():  # the actor through the ONNX model, the rest from policy.pth: all as stored
        np.testing.assert_array_equal(value.numpy(), theirs[key].numpy(), err_msg=key)
    np.testing.assert_allclose(model.log_ent_coef.detach().numpy(), source.log_ent_coef.detach().numpy(), atol=1e-6, rtol=0)
    assert every_parameter_trains(model.policy, obs[:16]) == []
    model.learn(256)
    assert model.num_timesteps == 256


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_sb3_td3_and_ddpg_round_trip_through_sb3(algo, tmp_path):
    """TD3 (and DDPG, TD3 in SB3 with one critic): the actor tanh-squashed and rescaled as the source's,
    actor_target and the critics the zip's."""
    from stable_baselines3 import DDPG, TD3

    cls = {"td3": TD3, "ddpg": DDPG}[algo]
    out = tmp_path / f"{algo}.zip"
    done = pp.to_sb3(str(SB3 / f"{algo}_pendulum.zip"), out, algo=algo, low=-2, high=2)
    noise = {"td3": "target_policy_noise 0.2, target_noise_clip 0.5, policy_delay 2",  # SB3's defaults (td3.py, ddpg.py)
             "ddpg": "target_policy_noise 0.1, target_noise_clip 0, policy_delay 1"}[algo]
    assert any(f"action noise none, {noise}: SB3's training defaults" in a for a in done.assumptions)
    source = cls.load(SB3 / f"{algo}_pendulum.zip", device="cpu")
    model = cls.load(out, env=gym.make("Pendulum-v1"), device="cpu", learning_starts=64, batch_size=64)
    obs = pendulum_observations(1000, 3)
    np.testing.assert_allclose(model.predict(obs, deterministic=True)[0], source.predict(obs, deterministic=True)[0],
                               atol=1e-6, rtol=0)
    theirs = source.policy.state_dict()
    mine = model.policy.state_dict()
    assert len(mine) == len(theirs) and {k for k in mine if k.startswith("critic.qf")} == {
        k for k in theirs if k.startswith("critic.qf")}
    for key in (k for k in mine if k.startswith(("critic", "actor_target."))):  # as training left them
        np.testing.assert_array_equal(mine[key].numpy(), theirs[key].numpy(), err_msg=key)
    assert not any(a.startswith("actor_target") for a in done.assumptions)
    assert any(n.startswith("carried from the zip's policy.pth: actor_target (6 tensors)") for n in done.notes)
    assert every_parameter_trains(model.policy, obs[:16]) == []
    model.learn(256)
    assert model.num_timesteps == 256


def test_an_onnx_sac_actor_becomes_a_sac_with_fresh_critics_said_so(tmp_path):
    """The ONNX model of an SB3 SAC holds the actor's mean path only: the log_std layer and critics are SB3's
    fresh ones, said so; --log-std makes the log_std layer a constant; predict still equals the source SAC's."""
    import onnx
    from stable_baselines3 import SAC

    onnx.save(pp.convert(str(SB3 / "sac_pendulum.zip")), tmp_path / "sac.onnx")
    out = tmp_path / "sac.zip"
    result = CliRunner().invoke(app, ["to-sb3", str(tmp_path / "sac.onnx"), "-o", str(out), "--algo", "sac",
                                      "--log-std", "-1", "--json"])
    assert result.exit_code == 0, result.output
    done = json.loads(result.stdout)
    assert done["observation_space"] == repr(gym.spaces.Box(-np.inf, np.inf, (3,), np.float32))
    assert any(a.startswith("critic, critic_target: SB3's fresh initialisation") for a in done["assumptions"])
    assert any(a.startswith("actor.log_std: weight 0 and bias -1.0") for a in done["assumptions"])
    assert any(a.startswith("ent_coef auto starting at 1.0") for a in done["assumptions"])
    source = SAC.load(SB3 / "sac_pendulum.zip", device="cpu")
    model = SAC.load(out, env=ToyEnv(3, gym.spaces.Box(-2, 2, (1,), np.float32)), device="cpu", learning_starts=64,
                     batch_size=64)
    obs = pendulum_observations(1000, 4)
    np.testing.assert_allclose(model.predict(obs, deterministic=True)[0], source.predict(obs, deterministic=True)[0],
                               atol=1e-6, rtol=0)
    np.testing.assert_array_equal(model.policy.actor.log_std.weight.detach().numpy(), np.zeros((1, 32), np.float32))
    np.testing.assert_array_equal(model.policy.actor.log_std.bias.detach().numpy(), [-1.0])
    assert every_parameter_trains(model.policy, obs[:16]) == []
    model.learn(256)
    assert model.num_timesteps == 256


def test_sb3_multidiscrete_a2c_round_trips_through_sb3(tmp_path):
    from stable_baselines3 import A2C

    out = tmp_path / "multi.zip"
    done = pp.to_sb3(str(SB3 / "a2c_multidiscrete.zip"), out, algo="a2c")
    assert done.action_space == repr(gym.spaces.MultiDiscrete([3, 4]))
    source = A2C.load(SB3 / "a2c_multidiscrete.zip", device="cpu")
    model = A2C.load(out, env=ToyEnv(source.observation_space, gym.spaces.MultiDiscrete([3, 4])), device="cpu", n_steps=8)
    obs = np.random.default_rng(5).uniform(-3, 3, (1000, 4)).astype(np.float32)
    want, _ = source.predict(obs, deterministic=True)
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], want)
    assert [len(set(want[:, i].tolist())) for i in range(2)] == [3, 4]  # every action of each branch is chosen
    with torch.no_grad():
        x = torch.from_numpy(obs)
        np.testing.assert_allclose(model.policy.action_net(model.policy.mlp_extractor.forward_actor(x)).numpy(),
                                   source.policy.action_net(source.policy.mlp_extractor.forward_actor(x)).numpy(),
                                   atol=1e-6, rtol=0)
    assert every_parameter_trains(model.policy, obs[:16]) == []
    model.learn(256)
    assert model.num_timesteps == 256


def test_ml_agents_multi_branch_export_becomes_a_multidiscrete_ppo(tmp_path):
    """ML-Agents' PushBlock export (two discrete branches, each its own layer): SB3's action_net holds both
    branches' rows; predict equals the actions ML-Agents' actor computed at export time (where every action was
    allowed) and the numpy backend's with all actions allowed."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    done = pp.to_sb3(str(MLA / "PushBlock.onnx"), tmp_path / "policy.zip", algo="ppo")
    assert done.action_space == repr(gym.spaces.MultiDiscrete([3, 4])) and done.activation_fn == "SiLU"
    assert any(a.startswith("action_masks all ones") for a in done.assumptions)
    reference = np.load(MLA / "PushBlock.reference.npz")
    obs = np.concatenate([reference["inputs/obs_0"],
                          (np.random.default_rng(6).standard_normal((936, 9)) * 4).astype(np.float32)])
    venv = DummyVecEnv([lambda: ToyEnv(9, gym.spaces.MultiDiscrete([3, 4]))])
    norm = VecNormalize.load(str(done.vecnormalize), venv)
    model = PPO.load(tmp_path / "policy.zip", env=norm, device="cpu", n_steps=128, batch_size=64, n_epochs=1)
    action, _ = model.predict(norm.normalize_obs(obs), deterministic=True)
    allowed = reference["inputs/action_masks"].all(axis=1)
    assert allowed.sum() > 30
    np.testing.assert_array_equal(action[:64][allowed], reference["torch32/deterministic_discrete_actions"][allowed])
    numpy_out = pp.load(MLA / "PushBlock.onnx", "numpy").run({"obs_0": obs, "action_masks": np.ones((1000, 7), np.float32)})
    np.testing.assert_array_equal(action, numpy_out["deterministic_discrete_actions"])
    assert every_parameter_trains(model.policy, norm.normalize_obs(obs[:16])) == []
    model.learn(256)
    assert model.num_timesteps == 256


def test_what_sb3_cannot_express_is_refused(tmp_path):
    runner = CliRunner()
    out = tmp_path / "x.zip"
    no_log_std = runner.invoke(app, ["to-sb3", str(EXPERT), "-o", str(out), "--algo", "ppo", "--activation", "tanh",
                                     "--head", "diag-gaussian", "--json"])
    assert no_log_std.exit_code == 2 and "--log-std" in json.loads(no_log_std.stdout)["error"]
    dqn = runner.invoke(app, ["to-sb3", str(EXPERT), "-o", str(out), "--algo", "dqn", "--activation", "tanh",
                              "--head", "diag-gaussian"])
    assert dqn.exit_code == 2 and "discrete-action policy" in dqn.output
    bad = runner.invoke(app, ["to-sb3", str(EXPERT), "-o", str(out), "--algo", "trpo"])
    assert bad.exit_code == 2 and "'trpo'; choose one of ppo, a2c, sac, td3, ddpg, dqn" in bad.output
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("source, algo, options, code, said", [
    (MLA / "Hybrid.onnx", "ppo", [], 3, "the head is hybrid (both continuous and discrete actions); SB3 has no action space"),
    (MLA / "Hybrid.onnx", "sac", [], 3, "the head is hybrid"),
    (MLA / "Crawler.onnx", "sac", [], 3, "the action is layer action_model._continuous_distribution.mu's output itself, "
                                         "not squashed by tanh"),
    (SB3 / "a2c_multidiscrete.zip", "dqn", [], 2, "--algo dqn: the head is multi-categorical"),
    (SB3 / "a2c_multidiscrete.zip", "sac", [], 2, "--algo sac: the head is multi-categorical"),
    (SB3 / "ppo_pendulum.zip", "sac", [], 2, "--algo sac writes an actor whose action is tanh of its last layer"),
    (SB3 / "sac_pendulum.zip", "ppo", [], 2, "--algo ppo: the action is tanh of layer actor.mu rescaled"),
    (SB3 / "td3_pendulum.zip", "td3", ["--log-std", "-1"], 2, "log_std applies to SAC's actor"),
    (SB3 / "sac_pendulum.zip", "sac", ["--action-space", "-1:1"], 2, "the model rescales its tanh output to [-2, 2]"),
    (ROOT / "fixtures/cleanrl/ppo_continuous_action.cleanrl_model", "ppo", [], 2,  # SB3 asserts finite Box bounds
     "the model does not clip its action to finite bounds, and SB3 needs a continuous action space's"),
    (ROOT / "fixtures/cleanrl/ppo_continuous_action.cleanrl_model", "ppo", ["--action-space=-inf:1"], 2,
     "SB3 takes a continuous action space with finite bounds only"),
])
def test_a_head_sb3_cannot_express_or_a_wrong_algo_is_refused_naming_why(source, algo, options, code, said, tmp_path):
    result = CliRunner().invoke(app, ["to-sb3", str(source), "-o", str(tmp_path / "x.zip"), "--algo", algo, *options,
                                      "--json"])
    assert result.exit_code == code and said in json.loads(result.stdout)["error"]
    assert not list(tmp_path.iterdir())


def test_the_readme_section_runs_as_written(tmp_path, monkeypatch):
    """The README's 'Into another framework' section: its commands print what it shows, and its Python
    blocks run after them (the MetaDrive expert trains on as an SB3 PPO)."""
    import re
    import shlex

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Into another framework: train on\n", 1)[1].split("\n## ", 1)[0]
    (tmp_path / "fixtures").symlink_to(ROOT / "fixtures")
    monkeypatch.chdir(tmp_path)
    made = CliRunner().invoke(app, ["convert", str(EXPERT), "-o", "metadrive.onnx", "--activation", "tanh",
                                    "--head", "diag-gaussian"])  # as the tour makes it
    assert made.exit_code == 0, made.output
    blocks = re.findall(r"```console\n(.*?)```", section, re.S)
    assert len(blocks) == 7
    for block in blocks:
        command, *shown = block.strip("\n").split("\n")
        result = CliRunner().invoke(app, shlex.split(command[2:])[1:])
        assert result.exit_code == 0, result.output
        for line in shown:
            assert line in result.output.splitlines(), line
    import sys

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))  # the block's sys.path.insert is undone after the test
    monkeypatch.delitem(sys.modules, "policy", raising=False)
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        namespace: dict = {}
        exec(compile(block, "README.md (Into another framework)", "exec"), namespace)
    assert namespace["model"].num_timesteps == 256 and (tmp_path / "metadrive_ppo_tuned.zip").exists()
    w = np.load(EXPERT)
    h = np.tanh(np.full((1, 275), 0.5) @ w["default_policy/fc_1/kernel"] + w["default_policy/fc_1/bias"])
    h = np.tanh(h @ w["default_policy/fc_2/kernel"] + w["default_policy/fc_2/bias"])
    mean = (h @ w["default_policy/fc_out/kernel"] + w["default_policy/fc_out/bias"])[:, :2]
    np.testing.assert_allclose(namespace["action"], np.clip(mean, -1, 1), atol=2e-5, rtol=0)
