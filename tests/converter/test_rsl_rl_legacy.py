"""rsl_rl 1.x to 4.x checkpoints: their save formats reproduced from each release's source
(``fixtures/rsl_rl/legacy/make_legacy.py`` names the tag and file each follows); the converted action is
held against that release's deterministic forward, run in torch on the reproduced modules here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import policyport as pp
from policyport.converter import convert_source, detect_kind
from policyport.converter.sources import rsl_rl

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
LEGACY = ROOT / "fixtures" / "rsl_rl" / "legacy"
#: run -> (layout policyport reports, --activation needed, normaliser keys read)
RUNS = {
    "v1": ("1.x", "elu", None),
    "v2_0": ("2.x", None, "obs_norm_state_dict."),
    "v2_3": ("2.x", None, "obs_norm_state_dict."),
    "v3_0": ("3.x", None, "actor_obs_normalizer."),
    "v3_1": ("3.x", None, "actor_obs_normalizer."),
    "v4": ("4.x", None, "obs_normalizer."),
    "v4_sds": ("4.x", None, "obs_normalizer."),
}


@pytest.fixture(scope="module")
def legacy():
    spec = importlib.util.spec_from_file_location("make_legacy", LEGACY / "make_legacy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def obs() -> np.ndarray:
    return np.load(ROOT / "fixtures" / "rsl_rl" / "observations.npy")


def release_forward(legacy, run: str, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The release's deterministic action (and the std its distribution uses, where it is one
    parameter), from the checkpoint loaded into the reproduced modules, in torch."""
    saved = torch.load(LEGACY / run / "model_0.pt", weights_only=True)
    policy, obs_normalizer, _ = legacy.build(run)
    policy.load_state_dict(saved["actor_state_dict" if run.startswith("v4") else "model_state_dict"])
    if obs_normalizer is not None:
        obs_normalizer.load_state_dict(saved["obs_norm_state_dict"])
    action = legacy.deterministic_action(run, policy, obs_normalizer, torch.from_numpy(obs)).numpy()
    std = None
    if hasattr(policy, "std"):
        std = policy.std.detach().numpy()
    elif hasattr(policy, "log_std"):
        std = torch.exp(policy.log_std).detach().numpy()
    return action, std


@pytest.mark.parametrize("run", RUNS)
def test_the_action_is_the_releases_own(run, legacy, obs):
    version, activation, normaliser = RUNS[run]
    path = LEGACY / run / "model_0.pt"
    assert detect_kind(path) == "rsl-rl"
    layout = rsl_rl.read_layout(rsl_rl.read_checkpoint(path), run)
    rsl_rl._head(layout, rsl_rl.read_run_config(path), run)  # a state-dependent std's layout is told with agent.yaml
    assert layout.version == version
    assert (sorted(name for name, _ in layout.normalizer.values()) if normaliser else []) == \
        sorted(normaliser + role for role in ("_mean", "_var", "_std", "count")
               if normaliser and not (run == "v2_0" and role == "count"))  # 2.0.0 kept count out of its state_dict
    want, std = release_forward(legacy, run, obs)
    assert np.abs(want - np.load(LEGACY / run / "expected.npz")["action"]).max() == 0  # the fixture is this forward
    converted = convert_source(path, activation=activation)
    with np.errstate(all="raise"):
        for backend in ("numpy", "onnxruntime"):
            out = pp.load(converted.model, backend).run({"obs": obs})
            assert out["action"].shape == want.shape == (1000, 12)
            assert np.abs(out["action"] - want).max() <= 1e-5, backend
            if std is not None:
                assert np.abs(out["std"] - std).max() <= 1e-6, backend
    # extract gives the actor's arrays back under rsl_rl's keys, bit for bit (std and log_std included)
    weights = pp.extract_weights(converted.model)
    saved = torch.load(path, weights_only=True)
    held = saved["actor_state_dict"] if run.startswith("v4") else {
        k: v for k, v in saved["model_state_dict"].items() if not k.startswith(("critic", "critic_obs_normalizer"))}
    held.update({f"obs_norm_state_dict.{k}": v for k, v in saved.get("obs_norm_state_dict", {}).items()})
    assert sorted(weights) == sorted(held)
    for key, tensor in held.items():
        assert weights[key].tobytes() == tensor.numpy().tobytes() and weights[key].shape == tuple(tensor.shape), key
    # the normaliser matters: without it the action moves
    if normaliser:
        with np.errstate(invalid="ignore"):  # 4.x's unclamped state-dependent std may dip below 0: log_std NaN
            assert np.abs(converted.reference(obs)["action"] - want).max() <= 1e-5
        layout.normalizer.clear()
        head = rsl_rl._head(layout, rsl_rl.read_run_config(path), run)
        with np.errstate(invalid="ignore"):
            unnormalised = rsl_rl.reference_forward(layout, head, pp_activation("elu" if run != "v2_3" else "tanh"), obs)
        assert np.abs(unnormalised["action"] - want).max() > 1e-2


def pp_activation(name):
    from policyport.converter.activations import parse_activation

    return parse_activation(name)


def test_a_state_dependent_std_is_row_1_of_the_last_layer_unclamped(legacy, obs):
    """rsl_rl 3.1's state-dependent log std: the last Linear is 2 x A wide, row 1 the log std."""
    saved = torch.load(LEGACY / "v3_1" / "model_0.pt", weights_only=True)
    policy, _, _ = legacy.build("v3_1")
    policy.load_state_dict(saved["model_state_dict"])
    policy.eval()
    with torch.no_grad():
        both = policy.actor(policy.actor_obs_normalizer(torch.from_numpy(obs))).numpy()
    assert both.shape == (1000, 2, 12)
    out = pp.load(pp.convert(LEGACY / "v3_1" / "model_0.pt")).run({"obs": obs})
    assert np.abs(out["log_std"] - both[:, 1]).max() <= 1e-5
    assert np.abs(out["std"] - np.exp(both[:, 1])).max() <= 1e-5


def test_rsl_rl_4s_state_dependent_std_is_not_clamped_as_5x_clamps_it(legacy, obs, tmp_path):
    """4.x's state_dependent_std (no std parameter, the flag in agent.yaml) uses row 1 as it is; 5.x's
    heteroscedastic distribution clamps it to [1e-6, 1e6]. Row 1 moved below 1e-6 tells them apart."""
    import json
    import shutil

    saved = torch.load(LEGACY / "v4_sds" / "model_0.pt", weights_only=True)
    saved["actor_state_dict"]["mlp.4.bias"][12:] -= 0.55  # a std trained towards 0 (or past it, unclamped)
    shutil.copytree(LEGACY / "v4_sds" / "params", tmp_path / "params")
    torch.save(saved, tmp_path / "model_9.pt")
    policy, _, _ = legacy.build("v4_sds")
    policy.load_state_dict(saved["actor_state_dict"])
    policy.eval()
    with torch.no_grad():
        both = policy.mlp(policy.obs_normalizer(torch.from_numpy(obs))).numpy()
        action = policy(torch.from_numpy(obs)).numpy()
    assert (both[:, 1] < 1e-6).any() and (both[:, 1] > 1e-6).any()
    model = pp.convert(tmp_path / "model_9.pt")
    assert json.loads({p.key: p.value for p in model.metadata_props}["policyport.source"])["rsl_rl_layout"] == "4.x"
    with np.errstate(invalid="ignore"):  # log_std of a negative std
        out = pp.load(model).run({"obs": obs})
    assert np.abs(out["action"] - action).max() <= 1e-5
    assert np.abs(out["std"] - both[:, 1]).max() <= 1e-5


def test_legged_gym_checkpoints_need_the_activation(tmp_path):
    """1.x runs (legged_gym) write no params/agent.yaml: the activation must be given."""
    with pytest.raises(pp.PolicyportError, match="--activation"):
        pp.convert(LEGACY / "v1" / "model_0.pt")
