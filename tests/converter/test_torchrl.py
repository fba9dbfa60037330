"""TorchRL actors: the fixtures are made by TorchRL itself (``fixtures/torchrl/make_fixtures.py``), and
every expected action is what TorchRL's own ``ProbabilisticActor`` returned in deterministic mode after
``load_state_dict`` of the saved file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner


import policyport as pp
from library_checkpoints import fixture_script
from policyport.cli import app
from policyport.converter import convert_source, detect_kind
from policyport.converter.activations import parse_activation
from policyport.converter.sources import torchrl_actor

ROOT = Path(__file__).resolve().parents[2]
TRL = ROOT / "fixtures" / "torchrl"
#: tanh_normal's action bounds (make_fixtures.py's LOW and HIGH).
LOW = (-1.0, -2.0, -0.5, 0.0, -3.0, -1.0)
HIGH = (1.0, 2.0, 0.5, 1.0, 1.0, 3.0)
BOUNDS = f"{','.join(map(str, LOW))}:{','.join(map(str, HIGH))}"
TANH = dict(activation="tanh", distribution="tanh-normal", action_bounds=(LOW, HIGH))
FOLDER = TRL / "tanh_normal_checkpoint"
NORMED = TRL / "normal_relu_obsnorm_checkpoint"
RELU = dict(activation="relu", distribution="normal")


@pytest.fixture(scope="module")
def obs() -> np.ndarray:
    return np.load(TRL / "observations.npy")


def expected(name: str) -> dict[str, np.ndarray]:
    with np.load(TRL / f"{name}.expected.npz") as f:
        return {k: f[k] for k in f.files}


def invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def test_files_and_folders_are_told_from_their_keys_and_manifest():
    for name in ("tanh_normal.pt", "normal_relu.pt", "discrete_elu.pt", "tanh_normal_checkpoint",
                 "normal_relu_obsnorm_checkpoint", "tanh_normal_ppo_loss.pt"):
        assert detect_kind(TRL / name) == "torchrl", name
    assert detect_kind(ROOT / "fixtures" / "torch" / "gaussian.state_dict.pt") == "state-dict"
    assert detect_kind(ROOT / "fixtures" / "rl_games" / "ant_elu" / "nn" / "ant_elu.pth") == "rl-games"


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("source", ["tanh_normal.pt", "tanh_normal_checkpoint"])
def test_the_action_is_torchrls_own_deterministic_sample(source, backend, obs):
    """TanhNormal: tanh(loc) rescaled to low/high; the scale through NormalParamExtractor's mapping."""
    want = expected("tanh_normal")
    np.seterr(all="raise")
    try:
        out = pp.load(pp.convert(TRL / source, **TANH), backend).run({"obs": obs})
        bare = pp.load(pp.convert(TRL / source, activation="tanh", distribution="tanh-normal"), backend).run({"obs": obs})
    finally:
        np.seterr(all="warn")
    assert out["action"].shape == want["action"].shape == (1000, 6)
    assert np.abs(out["action"] - want["action"]).max() <= 1e-5
    assert np.abs(out["mean"] - want["loc"]).max() <= 1e-5
    assert np.abs(out["std"] - want["scale"]).max() <= 1e-5
    assert np.abs(out["log_std"] - np.log(want["scale"])).max() <= 1e-5
    assert np.abs(bare["action"] - np.tanh(want["loc"])).max() <= 1e-5  # TanhNormal's default bounds, -1 and 1
    assert np.abs(bare["action"] - want["action"]).max() > 0.5  # the bounds matter on these actions
    assert (np.abs(np.tanh(want["loc"])) > 0.99).any()  # some actions reach the bounds' neighbourhood


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_normal_actors_action_is_loc_and_a_discrete_actors_the_argmax(backend, obs):
    want = expected("normal_relu")
    out = pp.load(pp.convert(TRL / "normal_relu.pt", activation="relu", distribution="normal"), backend).run({"obs": obs})
    assert np.abs(out["action"] - want["action"]).max() <= 1e-5
    assert np.abs(out["std"] - want["scale"]).max() <= 1e-5
    discrete = pp.load(pp.convert(TRL / "discrete_elu.pt", activation="elu"), backend).run({"obs": obs})
    want = expected("discrete_elu")
    assert discrete["action"].dtype == np.int64 and (discrete["action"] == want["action"]).all()
    assert (want["one_hot"].argmax(1) == want["action"]).all() and len(set(want["action"].tolist())) > 1


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_an_observation_norm_in_the_checkpoint_is_baked_in_as_torchrl_computes_it(backend, obs):
    """(x - loc) / scale, no epsilon and no clip: every other library's formula moves the action."""
    converted = convert_source(NORMED, **RELU)
    out = pp.load(converted.model, backend).run({"obs": obs})
    want = expected("normal_relu_obsnorm")["action"]
    # scales down to 1e-3 make hidden activations and actions of up to some 1,500, where float32's spacing is
    # 1.2e-4: machines' BLAS kernels sum them in different orders, a few ulps of the largest value apart. The other
    # libraries' formulas below move the action by far more than this bound.
    bound = 1e-6 * np.abs(want).max()
    assert 1e-5 < bound < 5e-3 and np.abs(out["action"] - want).max() <= bound
    assert "observation normalisation" not in [a.topic for a in converted.assumptions]
    assert any("ObservationNorm of component 'obs_norm'" in note for note in converted.notes)
    state = torchrl_actor.read_normalizers(NORMED, "normed", "policy")[0]
    assert state.standard_normal and state.scale.min() < 2e-3
    raw = (obs - state.loc) / state.scale
    assert np.abs(raw).max() > 100  # far past any library's clip, where the scale's epsilon matters too
    layout = torchrl_actor.read_layout(*torchrl_actor.read_folder(NORMED, "normed", None)[1:3], "normed")
    plan = torchrl_actor.Plan(parse_activation("relu"), "normal")
    others = {"rl_games": np.clip((obs - state.loc) / np.sqrt(state.scale ** 2 + 1e-5), -5, 5),
              "skrl": np.clip((obs - state.loc) / (state.scale + 1e-8), -5, 5),
              "gymnasium": np.clip((obs - state.loc) / np.sqrt(state.scale ** 2 + 1e-8), -10, 10),
              "rsl_rl": (obs - state.loc) / (state.scale + 1e-2)}
    for library, normalised in others.items():
        moved = torchrl_actor.reference_forward(layout, plan, normalised.astype(np.float32))["action"]
        assert np.abs(moved - want).max() > 100 * bound, library


def test_no_filter_leaves_the_observation_norm_out_and_vecnorm_is_refused(tmp_path, obs):
    bare = convert_source(NORMED, obs_filter=False, **RELU)
    assert np.abs(pp.load(bare.model).run({"obs": obs})["action"] - expected("normal_relu")["action"]).max() <= 1e-5
    assert [a.assumes for a in bare.assumptions if a.topic == "observation normalisation"] == ["left out (--no-filter)"]
    folder = tmp_path / "vecnorm"
    shutil.copytree(NORMED, folder)
    schema = folder / "components" / "0000-obs_norm" / "state.json"
    schema.write_text(schema.read_text().replace('"value":"loc"', '"value":"observation_sum"'))
    refused = invoke("convert", folder, "--activation", "relu", "--distribution", "normal", "-o", tmp_path / "a.onnx")
    assert refused.exit_code == 3 and "VecNorm" in refused.output and "--no-filter" in refused.output
    alone = invoke("convert", folder, "--activation", "relu", "--distribution", "normal", "--no-filter",
                   "-o", tmp_path / "a.onnx")
    assert alone.exit_code == 0, alone.output


def test_a_loss_modules_state_dict_gives_its_actor_once_the_distribution_is_named(tmp_path, obs):
    """ClipPPOLoss keeps no module paths that tell a NormalParamExtractor: --distribution settles it."""
    source = TRL / "tanh_normal_ppo_loss.pt"
    unsaid = invoke("convert", source, "--activation", "tanh", "-o", tmp_path / "a.onnx")
    assert unsaid.exit_code == 2 and "--distribution" in unsaid.output and "loss module" in unsaid.output
    converted = convert_source(source, **TANH)
    out = pp.load(converted.model).run({"obs": obs})
    assert np.abs(out["action"] - expected("tanh_normal")["action"]).max() <= 1e-5
    assert any("critic_network_params.module.0.weight" in note for note in converted.notes)
    assert sorted(pp.extract_weights(converted.model)) == sorted(
        f"actor_network_params.{k}" for k in pp.extract_weights(pp.convert(TRL / "tanh_normal.pt", **TANH)))


def test_extract_gives_every_array_back_bit_for_bit():
    torch = pytest.importorskip("torch")
    saved = torch.load(TRL / "tanh_normal.pt", weights_only=True)
    for source in (TRL / "tanh_normal.pt", FOLDER):
        weights = pp.extract_weights(pp.convert(source, **TANH))
        assert sorted(weights) == sorted(saved)
        for name, tensor in saved.items():
            assert weights[name].dtype == tensor.numpy().dtype and weights[name].tobytes() == tensor.numpy().tobytes()
    weights = pp.extract_weights(pp.convert(NORMED, **RELU))
    state = torchrl_actor.read_normalizers(NORMED, "normed", "policy")[0]
    for key in ("loc", "scale"):
        stored = np.fromfile(NORMED / "components" / "0000-obs_norm" / "state" /
                             f"tensor_0000000{1 if key == 'loc' else 2}.memmap", "<f4")
        assert weights[f"obs_norm.{key}"].tobytes() == stored.tobytes() == getattr(state, key).tobytes()


def test_what_no_file_records_must_be_given(tmp_path):
    no_activation = invoke("convert", TRL / "tanh_normal.pt", "-o", tmp_path / "a.onnx")
    assert no_activation.exit_code == 2 and "--activation" in no_activation.output
    no_distribution = invoke("convert", TRL / "tanh_normal.pt", "--activation", "tanh", "-o", tmp_path / "a.onnx")
    assert no_distribution.exit_code == 2 and "--distribution tanh-normal" in no_distribution.output
    not_continuous = invoke("convert", TRL / "discrete_elu.pt", "--activation", "elu", "--distribution", "normal",
                            "-o", tmp_path / "a.onnx")
    assert not_continuous.exit_code == 2 and "NormalParamExtractor" in not_continuous.output
    unknown = invoke("convert", TRL / "tanh_normal.pt", "--activation", "tanh", "--distribution", "beta",
                     "-o", tmp_path / "a.onnx")
    assert unknown.exit_code == 2 and "tanh-normal, normal, categorical" in unknown.output
    bounds_on_normal = invoke("convert", TRL / "normal_relu.pt", "--activation", "relu", "--distribution", "normal",
                              "--action-bounds", "-1:1", "-o", tmp_path / "a.onnx")
    assert bounds_on_normal.exit_code == 2 and "TanhNormal" in bounds_on_normal.output
    wrong_width = invoke("convert", TRL / "tanh_normal.pt", "--activation", "tanh", "--distribution", "tanh-normal",
                         "--action-bounds", "-1,-1:1,1", "-o", tmp_path / "a.onnx")
    assert wrong_width.exit_code == 2 and "6 actions" in wrong_width.output
    elsewhere = invoke("convert", ROOT / "fixtures" / "rl_games" / "ant_elu" / "nn" / "ant_elu.pth",
                       "--distribution", "normal", "-o", tmp_path / "a.onnx")
    assert elsewhere.exit_code == 2 and "--distribution" in elsewhere.output
    assert not (tmp_path / "a.onnx").exists()
    converted = convert_source(TRL / "tanh_normal.pt", activation="tanh", distribution="tanh-normal")
    topics = [a.topic for a in converted.assumptions]
    assert topics == ["activation", "head", "action bounds", "observation normalisation"]
    assert "-1 and 1" in converted.assumptions[2].assumes


def test_a_damaged_checkpoint_folder_is_refused_before_anything_large_is_allocated(tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(FOLDER, folder)
    state = folder / "components" / "0001-policy" / "state"
    weight = state / "tensor_00000002.memmap"
    weight.write_bytes(weight.read_bytes()[:-4])
    short = invoke("convert", folder, *_tanh_args(), "-o", tmp_path / "a.onnx")
    assert short.exit_code == 3 and "tensor_00000002.memmap holds" in short.output and "truncated" in short.output
    shutil.rmtree(folder)
    shutil.copytree(FOLDER, folder)
    meta = json.loads((state / "meta.json").read_text())
    meta["tensor_00000002"]["shape"] = [1 << 20, 1 << 20]
    (state / "meta.json").write_text(json.dumps(meta))
    huge = invoke("convert", folder, *_tanh_args(), "-o", tmp_path / "a.onnx")
    assert huge.exit_code == 3 and "above the limit" in huge.output
    meta["tensor_00000002"]["shape"] = [32, 32]
    meta["tensor_00000002"]["dtype"] = "torch.complex64"
    (state / "meta.json").write_text(json.dumps(meta))
    dtype = invoke("convert", folder, *_tanh_args(), "-o", tmp_path / "a.onnx")
    assert dtype.exit_code == 3 and "torch.complex64" in dtype.output
    manifest = json.loads((FOLDER / "manifest.json").read_text())
    manifest["components"]["policy"]["path"] = "../../etc"
    shutil.rmtree(folder)
    shutil.copytree(FOLDER, folder)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    outside = invoke("convert", folder, *_tanh_args(), "-o", tmp_path / "a.onnx")
    assert outside.exit_code == 3 and "not a folder inside the checkpoint" in outside.output
    assert not (tmp_path / "a.onnx").exists()


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "state.json").write_text(json.dumps({"kind": "dict", "items": [
        [{"kind": "dict", "items": []}, {"kind": "value", "value": 1}]]})), "a mapping key is a dict"),
    (lambda d: (d / "state.json").write_text('{"kind":"dict","items":[[{"kind":"value","value":"k"},' * 400
                                            + '{"kind":"value","value":1}' + "]]}" * 400), "state.json"),
    (lambda d: (d / "state" / "meta.json").write_text(json.dumps({"../../x": {"shape": [1], "dtype": "torch.float32"}})),
     "not a file name tensordict writes"),
    (lambda d: ((d / "state" / "tensor_00000000.memmap").unlink(),
                (d / "state" / "tensor_00000000.memmap").symlink_to("/etc/hostname")), "links outside"),
    (lambda d: shutil.rmtree(d / "state"), "not the tensordict archives"),
])
def test_a_hostile_checkpoint_folder_is_refused_naming_what_is_wrong(tmp_path, damage, message):
    folder = tmp_path / "ckpt"
    shutil.copytree(FOLDER, folder)
    damage(folder / "components" / "0001-policy")
    result = invoke("convert", folder, *_tanh_args(), "--policy-id", "policy", "-o", tmp_path / "a.onnx")
    assert result.exit_code == 3 and message in " ".join(result.output.split()), result.output


def _tanh_args():
    return ("--activation", "tanh", "--distribution", "tanh-normal")


def test_a_pickled_payload_that_would_run_code_converts_without_running_it(tmp_path, obs):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(marker)],))

    saved = torch.load(TRL / "tanh_normal.pt", weights_only=True)
    saved["module.1.extra"] = Payload()
    torch.save(saved, tmp_path / "actor.pt")
    assert detect_kind(tmp_path / "actor.pt") == "torchrl"
    out = pp.load(pp.convert(tmp_path / "actor.pt", **TANH)).run({"obs": obs})
    assert not marker.exists()
    assert np.abs(out["action"] - expected("tanh_normal")["action"]).max() <= 1e-5


def test_convert_verify_pack_and_the_packed_run_on_the_cli(tmp_path):
    for source in (TRL / "tanh_normal.pt", FOLDER):
        out = tmp_path / f"{source.stem}.onnx"
        converted = invoke("convert", source, *_tanh_args(), "--action-bounds", BOUNDS, "-o", out, "--json")
        assert converted.exit_code == 0, converted.output
        topics = [a["topic"] for a in json.loads(converted.stdout)["assumptions"]]
        assert topics == ["activation", "head", "action bounds", "observation normalisation"]
        verified = invoke("verify", out, "--source", source, "--json")
        assert verified.exit_code == 0 and json.loads(verified.stdout)["passed"] is True
        packed = invoke("pack", out, "-o", tmp_path / f"pack_{source.stem}")
        assert packed.exit_code == 0, packed.output
        run = subprocess.run([sys.executable, str(tmp_path / f"pack_{source.stem}" / "run.py"), "--verify"],
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "PASS" in run.stdout


@pytest.mark.slow
def test_torchrls_own_actor_agrees_now(obs):
    """The expected actions, recomputed by the installed TorchRL from the saved file and the folder."""
    pytest.importorskip("torchrl")
    make_fixtures = fixture_script(TRL)
    import torch
    from torchrl.checkpoint import Checkpoint

    actor = make_fixtures.build("tanh_normal")
    Checkpoint(policy=actor).load(FOLDER)
    want = make_fixtures.run(actor, obs)["action"]
    for source in (TRL / "tanh_normal.pt", FOLDER):
        out = pp.load(pp.convert(source, **TANH), "onnxruntime").run({"obs": obs})
        assert np.abs(out["action"] - want).max() <= 1e-5
    loaded = make_fixtures.build("tanh_normal")
    loaded.load_state_dict(torch.load(TRL / "tanh_normal.pt", weights_only=True))
    assert np.abs(make_fixtures.run(loaded, obs)["action"] - want).max() == 0
    assert torchrl_actor.FORMAT == Checkpoint.manifest(FOLDER)["format"]


@pytest.mark.slow
def test_an_observation_norm_without_standard_normal_is_torchrls_too(tmp_path, obs):
    """standard_normal off: x * scale + loc, checked against TorchRL's ObservationNorm loaded from the folder."""
    pytest.importorskip("torchrl")
    make_fixtures = fixture_script(TRL)
    import torch
    from torchrl.checkpoint import Checkpoint
    from torchrl.envs.transforms import ObservationNorm

    folder = tmp_path / "affine"
    shutil.copytree(NORMED, folder)
    (folder / "components" / "0000-obs_norm" / "state" / "tensor_00000000.memmap").write_bytes(b"\x00")
    actor = make_fixtures.build("normal_relu")
    norm = ObservationNorm(loc=torch.zeros(11), scale=torch.ones(11), in_keys=["observation"], standard_normal=True)
    Checkpoint(policy=actor, obs_norm=norm).load(folder)
    assert not bool(norm.standard_normal)
    want = make_fixtures.run(actor, obs, norm)["action"]
    out = pp.load(pp.convert(folder, **RELU), "onnxruntime").run({"obs": obs})
    assert np.abs(out["action"] - want).max() <= 1e-5
    assert np.abs(out["action"] - expected("normal_relu_obsnorm")["action"]).max() > 0.1
