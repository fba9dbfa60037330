"""The targets compute the source's function exactly; what differs in float32 is float32's rounding.

The MetaDrive expert's outputs reach 4.6 and its pre-activations 8.7, summed over 275 and 256 terms: two
float32 implementations of it differ by a few units in the last place (policyport's numpy backend and
onnxruntime by 1.2e-6, either and torch by up to 3.3e-6), and so do both from the exact value. So each target
is checked here twice against a float64 forward of the ``.npz`` written with numpy alone (not policyport's):

* run by its own framework in float64, it equals that forward to ~1e-15: the layers, layouts, activations and
  head are the source's, to the last bit a float64 computation holds;
* run in float32, as written, its error against the exact value stays within float32 rounding of the
  outputs' scale (1e-6 of the largest output, ~8 ulp), as does the numpy backend's own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPERT = ROOT / "fixtures/real/metadrive_ppo_expert.npz"
OPTIONS = {"activation": "tanh", "head": "diag-gaussian"}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data():
    """1,000 observations in [0, 1)^275 (float32) and the expert's fc_out outputs computed in float64."""
    obs = np.random.default_rng(7).random((1000, 275)).astype(np.float32)
    with np.load(EXPERT) as z:
        w = {k.removeprefix("default_policy/"): z[k].astype(np.float64) for k in z.files}
    h = np.tanh(obs.astype(np.float64) @ w["fc_1/kernel"] + w["fc_1/bias"])
    h = np.tanh(h @ w["fc_2/kernel"] + w["fc_2/bias"])
    return obs, h @ w["fc_out/kernel"] + w["fc_out/bias"]


def float32_bound(exact: np.ndarray) -> float:
    return 1e-6 * float(np.abs(exact).max())


def test_the_numpy_backend_itself_is_within_float32_rounding(data, tmp_path):
    import onnx

    import policyport as pp

    obs, exact = data
    onnx.save(pp.convert(str(EXPERT), **OPTIONS), tmp_path / "m.onnx")
    logits = pp.load(tmp_path / "m.onnx", backend="numpy").run({"obs": obs})["logits"]
    assert 0 < np.abs(logits - exact).max() <= float32_bound(exact)


def test_to_torch_is_exact_in_float64(data, tmp_path):
    import importlib.util

    import torch

    import policyport as pp

    obs, exact = data
    pp.to_torch(str(EXPERT), tmp_path / "t", **OPTIONS)
    spec = importlib.util.spec_from_file_location("metadrive_policy", tmp_path / "t/policy.py")
    policy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(policy)
    module = policy.load()
    with torch.no_grad():
        as_written = module(torch.from_numpy(obs))["logits"].numpy()
        in_float64 = module.double()(torch.from_numpy(obs.astype(np.float64)))["logits"].numpy()
    assert in_float64.dtype == np.float64 and np.abs(in_float64 - exact).max() < 1e-12
    assert np.abs(as_written - exact).max() <= float32_bound(exact)


def test_to_keras_is_exact_in_float64(data, tmp_path):
    import keras

    import policyport as pp

    obs, exact = data
    pp.to_keras(str(EXPERT), tmp_path / "m.keras", **OPTIONS)
    model = keras.saving.load_model(tmp_path / "m.keras")

    def float64(config):  # the same layers, each with a float64 dtype policy
        if isinstance(config, dict):
            for key, value in config.items():
                if key == "dtype" and isinstance(value, dict) and value.get("class_name") == "DTypePolicy":
                    value["config"]["name"] = "float64"
                elif key == "dtype" and value == "float32":
                    config[key] = "float64"
                else:
                    float64(value)
        elif isinstance(config, list):
            for value in config:
                float64(value)
        return config

    model64 = keras.Model.from_config(float64(model.get_config()))
    model64.set_weights([w.astype(np.float64) for w in model.get_weights()])
    in_float64 = model64.predict(obs.astype(np.float64), verbose=0)["logits"]
    as_written = model.predict(obs, verbose=0)["logits"]
    assert in_float64.dtype == np.float64 and np.abs(in_float64 - exact).max() < 1e-12
    assert np.abs(as_written - exact).max() <= float32_bound(exact)


def test_to_sb3_is_exact_in_float64(data, tmp_path):
    import torch
    from stable_baselines3 import PPO

    import policyport as pp

    obs, exact = data
    pp.to_sb3(str(EXPERT), tmp_path / "ppo.zip", algo="ppo", obs_space=(0.0, 1.0), action_space=(-1.0, 1.0),
              log_std=-0.5, **OPTIONS)
    model = PPO.load(tmp_path / "ppo.zip", device="cpu")
    mean = exact[:, :2]
    as_written, _ = model.predict(obs, deterministic=True)  # SB3 clips the mean to the action space
    policy = model.policy.double()
    with torch.no_grad():  # SB3's preprocessing casts a Box observation to float32: its layers, fed directly
        latent = policy.mlp_extractor.forward_actor(torch.from_numpy(obs.astype(np.float64)))
        in_float64 = policy.action_net(latent).numpy()
    assert in_float64.dtype == np.float64 and np.abs(in_float64 - mean).max() < 1e-12
    assert np.abs(as_written - np.clip(mean, -1, 1)).max() <= float32_bound(exact)
