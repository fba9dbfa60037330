"""to-sb3: a policy as a Stable-Baselines3 zip: SB3's own load accepts it, its predict equals the
source's action, every weight trains, and learn() continues in an environment of the same spaces."""

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


class ToyEnv(gym.Env):
    """Observations drawn uniformly from [0, 1), reward -|action|², 32 steps an episode: spaces to
    continue training in, nothing more."""

    def __init__(self, obs_dim: int, action_space):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.action_space = action_space
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self.np_random.uniform(0, 1, self.observation_space.shape).astype(np.float32), {}

    def step(self, action):
        self.steps += 1
        reward = -float(np.sum(np.square(action))) if isinstance(self.action_space, gym.spaces.Box) else float(action == 0)
        obs = self.np_random.uniform(0, 1, self.observation_space.shape).astype(np.float32)
        return obs, reward, False, self.steps >= 32, {}


def every_parameter_trains(policy, obs: np.ndarray) -> list[str]:
    """One step of the policy's own optimiser on a loss of its outputs; the parameters left unchanged."""
    before = {k: v.detach().clone() for k, v in policy.named_parameters()}
    x = torch.from_numpy(obs)
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
    source = PPO.load(SB3 / "ppo_pendulum_vecnorm.zip", device="cpu")
    with open(SB3 / "ppo_pendulum_vecnorm/vecnormalize.pkl", "rb") as f:  # this project's own fixture
        source_norm = pickle.load(f)
    venv = DummyVecEnv([lambda: ToyEnv(3, gym.spaces.Box(-2, 2, (1,), np.float32))])
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
    pp.to_sb3(str(SB3 / "dqn_cartpole.zip"), out, algo="dqn", low=-2, high=2)
    source = DQN.load(SB3 / "dqn_cartpole.zip", device="cpu")
    model = DQN.load(out, env=ToyEnv(4, gym.spaces.Discrete(2)), device="cpu", learning_starts=64)
    obs = np.random.default_rng(1).uniform(-2, 2, (1000, 4)).astype(np.float32)
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], source.predict(obs, deterministic=True)[0])
    with torch.no_grad():
        np.testing.assert_allclose(model.q_net(torch.from_numpy(obs)).numpy(), source.q_net(torch.from_numpy(obs)).numpy(),
                                   atol=1e-6, rtol=0)
        np.testing.assert_array_equal(model.q_net_target(torch.from_numpy(obs)).numpy(), model.q_net(torch.from_numpy(obs)).numpy())
    assert every_parameter_trains(model.policy, obs[:16]) == []
    model.learn(256)
    assert model.num_timesteps == 256


def test_what_sb3_cannot_express_is_refused(tmp_path):
    runner = CliRunner()
    out = tmp_path / "x.zip"
    multi = runner.invoke(app, ["to-sb3", str(SB3 / "a2c_multidiscrete.zip"), "-o", str(out), "--algo", "a2c", "--json"])
    assert multi.exit_code == 3 and "the head is multi-categorical" in json.loads(multi.stdout)["error"]
    no_log_std = runner.invoke(app, ["to-sb3", str(EXPERT), "-o", str(out), "--algo", "ppo", "--activation", "tanh",
                                     "--head", "diag-gaussian", "--json"])
    assert no_log_std.exit_code == 2 and "--log-std" in json.loads(no_log_std.stdout)["error"]
    dqn = runner.invoke(app, ["to-sb3", str(EXPERT), "-o", str(out), "--algo", "dqn", "--activation", "tanh",
                              "--head", "diag-gaussian"])
    assert dqn.exit_code == 2 and "discrete-action policy" in dqn.output
    bad = runner.invoke(app, ["to-sb3", str(EXPERT), "-o", str(out), "--algo", "sac"])
    assert bad.exit_code == 2 and "'sac'; choose one of ppo, a2c, dqn" in bad.output
    assert not out.exists() and not list(tmp_path.iterdir())


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
    assert len(blocks) == 6
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
