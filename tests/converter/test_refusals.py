"""Refusals say what was refused and why: an image policy is refused for its CNN, not for the
summarised text of its bounds; option values a source cannot take are usage errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from torch_fixtures import CARTPOLE, ROOT, SB3_DIR, TORCH_DIR
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter.sources import sb3

runner = CliRunner()


def _message(result) -> str:
    return " ".join(result.stderr.split())


def test_an_image_policy_is_refused_for_its_cnn_not_for_its_summarised_bounds(tmp_path):
    result = runner.invoke(app, ["convert", str(SB3_DIR / "ppo_cnn_image.zip"), "-o", str(tmp_path / "out.onnx")])
    assert result.exit_code == 3
    assert _message(result) == ("error: stable_baselines3.common.policies.ActorCriticCnnPolicy takes image observations "
                                "(3, 36, 36) through a CNN features extractor; policyport converts MLP policies")


SUMMARISED = "[[[0 0 0 ... 0 0 0]\n  [0 0 0 ... 0 0 0]]]"


def test_box_bounds_numpy_summarised_are_read_from_their_uniform_repr_or_refused_only_when_needed():
    entry = {":type:": "<class 'gymnasium.spaces.box.Box'>", "_shape": [2, 40], "dtype": "float32",
             "low": SUMMARISED, "high": SUMMARISED.replace("0", "1"), "low_repr": "-1.0", "high_repr": "1.0"}
    space = sb3._space({"action_space": entry}, "action_space", Path("policy.zip"))
    assert np.array_equal(space["low"], np.full((2, 40), -1.0)) and np.array_equal(space["high"], np.ones((2, 40)))
    unread = sb3._space({"observation_space": {**entry, "low_repr": None}}, "observation_space", Path("policy.zip"))
    assert isinstance(unread["low"], pp.BadModelError)  # kept, not raised: an observation's bounds are never needed
    assert np.array_equal(unread["high"], np.ones((2, 40)))


def test_summarised_action_bounds_without_a_uniform_repr_are_refused_naming_them(tmp_path):
    import zipfile

    with zipfile.ZipFile(SB3_DIR / "ppo_pendulum.zip") as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    data = json.loads(members["data"])
    data["action_space"]["low"] = "[-2. -2. ... -2.]"
    data["action_space"].pop("low_repr", None)
    members["data"] = json.dumps(data).encode()
    path = tmp_path / "summarised.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for n, b in members.items():
            zf.writestr(n, b)
    with pytest.raises(pp.BadModelError, match=r"^.*summarised.zip: the zip's action_space.low is not readable text \('\[-2. -2. ... -2.\]'\): "
                                               r"numpy summarised it; cannot read the action bounds$"):
        pp.convert(path)


@pytest.mark.parametrize("args, message", [
    ([str(CARTPOLE), "--activation", "relu,elu"],
     ("--activation (activation=) 'relu,elu' is a list, one activation per parameter-free module, which applies to "
      "state-dict sources of a plain nn.Sequential; sb3 sources take one activation name; an SB3 zip records its "
      "activation in policy_kwargs (leave --activation out to use it)")),
    ([str(ROOT / "fixtures" / "rllib" / "ray" / "ppo_new"), "--activation", "tanh,relu"],
     ("--activation (activation=) 'tanh,relu' is a list, one activation per parameter-free module, which applies to "
      "state-dict sources of a plain nn.Sequential; rllib sources take one activation name; an RLlib checkpoint "
      "records its activation in its model config (fcnet_activation)")),
    ([str(CARTPOLE), "--activation", "relu"],
     ("--activation relu contradicts SB3's default for this policy (its policy_kwargs name no activation_fn), which "
      "names tanh; leave --activation out to use the recorded one")),
    ([str(ROOT / "fixtures" / "real" / "metadrive_ppo_expert.npz"), "--keep-value"],
     "a value branch was asked for (--keep-value), but the weights hold no value_out layer"),
    ([str(TORCH_DIR / "rllib_fcnet.torchscript.pt"), "--trust", "--opset", "21"],
     ("opset 21 is out of range for the torchscript exporter: torch {torch} writes opset 20 at most with it; "
      "choose --opset 20 or lower (or --exporter dynamo)")),
    ([str(TORCH_DIR / "rllib_fcnet.torchscript.pt"), "--trust", "--exporter", "dynamo"],
     "the dynamo exporter cannot trace a TorchScript module; use --exporter torchscript"),
])
def test_option_values_a_source_cannot_take_are_usage_errors(tmp_path, args, message):
    if "{torch}" in message:
        torch = pytest.importorskip("torch")
        message = message.replace("{torch}", torch.__version__.split("+")[0])
    result = runner.invoke(app, ["convert", *args, "-o", str(tmp_path / "out.onnx")])
    assert result.exit_code == 2, result.output
    assert _message(result) == f"error: {message}"
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.slow
def test_an_opset_tf2onnx_cannot_write_is_a_usage_error_naming_its_range(tmp_path):
    tf2onnx = pytest.importorskip("tf2onnx")
    newest = max(tf2onnx.constants.OPSET_TO_IR_VERSION)
    result = runner.invoke(app, ["convert", str(ROOT / "fixtures" / "keras" / "two_inputs.keras"), "--opset",
                                 str(newest + 1), "-o", str(tmp_path / "out.onnx")])
    assert result.exit_code == 2, result.output
    assert _message(result) == (f"error: opset {newest + 1} is out of range for a Keras/TF source: tf2onnx "
                                f"{tf2onnx.__version__} writes opset 11 to {newest}; choose --opset in that range")
