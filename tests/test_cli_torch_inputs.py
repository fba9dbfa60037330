"""The CLI on torch modules of several inputs: --input-shape NAME=D per forward parameter and
--input-dtype, then run, verify, record and pack fed one .npz array per graph input, each value equal
to torch's own forward; refusals with their exit codes."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from policyport.cli import app

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
TORCH_DIR = ROOT / "fixtures" / "torch"
runner = CliRunner()
MASKED = ["--input-shape", "obs=8", "--input-shape", "action_mask=4", "--input-dtype", "action_mask=bool"]
THREE = ["--input-shape", "obs=8", "--input-shape", "h=16", "--input-shape", "action_mask=4",
         "--input-dtype", "action_mask=int64", "--output-names", "logits,h_next"]


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


def scripted(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.load(str(TORCH_DIR / f"{name}.torchscript.pt"))


def feeds(path: Path, mask_dtype, rows: int = 40, hidden: bool = False, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {"obs": rng.normal(0, 1.5, (rows, 8)).astype(np.float32)}
    if hidden:
        arrays["h"] = rng.uniform(-1, 1, (rows, 16)).astype(np.float32)
    arrays["action_mask"] = rng.integers(0, 2, (rows, 4)).astype(mask_dtype)
    np.savez(path, **arrays)
    return arrays


def test_a_masked_torchscript_policy_converts_and_every_command_takes_its_named_inputs(tmp_path):
    out = tmp_path / "masked.onnx"
    result = invoke("convert", TORCH_DIR / "masked.torchscript.pt", "-o", out, *MASKED, "--trust", "--samples", 200, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["verification"]["passed"] and doc["verification"]["samples"] == 200
    assert {c["tensor"] for c in doc["verification"]["comparisons"] if c["reference"] == "source"} >= {
        "body.0/linear", "body.3/tanh", "action_net/linear", "logits"}
    arrays = feeds(tmp_path / "feeds.npz", bool)
    with torch.no_grad():
        want = scripted("masked")(torch.as_tensor(arrays["obs"]), torch.as_tensor(arrays["action_mask"])).numpy()
    for backend in ("numpy", "onnxruntime"):
        ran = invoke("run", out, "-i", tmp_path / "feeds.npz", "-o", tmp_path / f"{backend}.npz", "--backend", backend)
        assert ran.exit_code == 0, ran.output
        np.testing.assert_allclose(np.load(tmp_path / f"{backend}.npz")["logits"], want, atol=1e-5, rtol=1e-5)
    verified = invoke("verify", out, "-i", tmp_path / "feeds.npz", "--source", TORCH_DIR / "masked.module.pt", "--trust", "--json")
    assert verified.exit_code == 0, verified.output
    report = json.loads(verified.stdout)
    assert report["passed"] and report["samples"] == 40 and "source" in {c["reference"] for c in report["comparisons"]}
    recorded = invoke("record", out, "-i", tmp_path / "feeds.npz", "-o", tmp_path / "rec.npz", "--json")
    assert recorded.exit_code == 0, recorded.output
    np.testing.assert_allclose(np.load(tmp_path / "rec.npz")["logits"], want, atol=1e-5, rtol=1e-5)
    packed = invoke("pack", out, "-o", tmp_path / "bundle", "-i", tmp_path / "feeds.npz")
    assert packed.exit_code == 0, packed.output
    assert "run.py -i FEEDS.npz (one array per input: obs, action_mask)" in packed.stdout
    golden = json.loads((tmp_path / "bundle" / "policy.json").read_text())
    assert [(i["name"], i["dtype"]) for i in golden["inputs"]] == [("obs", "float32"), ("action_mask", "bool")]


def test_a_pickled_module_of_three_inputs_with_an_int64_mask_converts_on_given_feeds(tmp_path):
    arrays = feeds(tmp_path / "feeds.npz", np.int64, hidden=True, seed=1)
    out = tmp_path / "three.onnx"
    result = invoke("convert", TORCH_DIR / "recurrent_masked.module.pt", "-o", out, *THREE, "--trust",
                    "-i", tmp_path / "feeds.npz", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["verification"]["passed"]
    ran = invoke("run", out, "-i", tmp_path / "feeds.npz", "-o", tmp_path / "y.npz")
    assert ran.exit_code == 0, ran.output
    with torch.no_grad():
        logits, h_next = scripted("recurrent_masked")(*[torch.as_tensor(a) for a in arrays.values()])
    got = np.load(tmp_path / "y.npz")
    np.testing.assert_allclose(got["logits"], logits.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(got["h_next"], h_next.numpy(), atol=1e-5, rtol=1e-5)
    assert (got["logits"][arrays["action_mask"] == 0] == np.float32(-1e8)).all()
    inspected = invoke("inspect", out, "--json")
    assert inspected.exit_code == 0, inspected.output
    inputs = json.loads(inspected.stdout)["inputs"]
    assert [(i["name"], i["dtype"]) for i in inputs] == [("obs", "float32"), ("h", "float32"), ("action_mask", "int64")]


def test_an_integer_input_is_drawn_from_the_range_asked_for(tmp_path):
    out = tmp_path / "three.onnx"
    refused = invoke("convert", TORCH_DIR / "recurrent_masked.torchscript.pt", "-o", out, *THREE, "--trust")
    assert refused.exit_code == 3 and "cannot draw samples for input 'action_mask' (int64" in refused.stderr
    assert not out.exists()
    drawn = invoke("convert", TORCH_DIR / "recurrent_masked.torchscript.pt", "-o", out, *THREE, "--trust",
                   "--low", 0, "--high", 2, "--samples", 100, "--json")
    assert drawn.exit_code == 0 and json.loads(drawn.stdout)["verification"]["passed"]


def test_the_single_shape_of_one_observation_still_converts(tmp_path):
    result = invoke("convert", TORCH_DIR / "tuple_wrapper.torchscript.pt", "-o", tmp_path / "w.onnx",
                    "--input-shape", "2,8", "--trust", "--samples", 50, "--json")
    assert result.exit_code == 0, result.output
    assert {c["tensor"] for c in json.loads(result.stdout)["verification"]["comparisons"]} >= {"conv/conv1d", "output_0", "output_1"}


@pytest.mark.parametrize("args, exit_code, says", [
    ([], 2, "forward(obs, action_mask) takes several inputs; give each one's shape without the batch axis: "
            "--input-shape obs=D[,D...] --input-shape action_mask=D[,D...]"),
    (["--input-shape", "8"], 2, "forward(obs, action_mask) takes several inputs"),
    (["--input-shape", "obs=8"], 2, "forward(obs, action_mask) needs 'action_mask' too; give --input-shape action_mask=D[,D...]"),
    (["--input-shape", "obs=8", "--input-shape", "mask=4"], 2, "'mask': forward(obs, action_mask) takes no such input"),
    (["--input-shape", "obs=8", "--input-shape", "action_mask=4", "--input-dtype", "mask=bool"], 2,
     "'mask': forward(obs, action_mask) takes no such input"),
    (["--input-shape", "obs=8", "--input-shape", "obs=4"], 2, "input 'obs' is given twice"),
    (["--input-shape", "obs=8", "--input-shape", "4"], 2, "'4'; give NAME=VALUE for each input of the module's forward"),
    (["--input-shape", "obs=8", "--input-shape", "action_mask=0"], 2, "'0'; give positive integers separated by commas"),
    (["--input-shape", "obs=8", "--input-shape", "action_mask=4", "--input-dtype", "action_mask=bool8"], 2,
     "action_mask=bool8; choose one of float32, float64, float16, bool, int64"),
    (["--input-shape", "obs=8", "--input-dtype", "action_mask=bool"], 2,
     "--input-dtype names 'action_mask', whose shape is not given; add --input-shape action_mask=D[,D...]"),
    (["--input-shape", "obs=8", "--input-shape", "action_mask=4"], 3,
     "the module's forward fails on inputs obs float32 (batch, 8), action_mask float32 (batch, 4): RuntimeError: "
     "where expected condition to be a boolean tensor"),
])
def test_shapes_and_dtypes_that_do_not_fit_forward_are_refused(tmp_path, args, exit_code, says):
    out = tmp_path / "m.onnx"
    result = invoke("convert", TORCH_DIR / "masked.torchscript.pt", "-o", out, "--trust", *args)
    assert result.exit_code == exit_code, result.output
    assert says in " ".join(result.stderr.split()) and not out.exists()


def test_a_state_dict_refuses_a_named_shape(tmp_path):
    result = invoke("convert", TORCH_DIR / "norms.state_dict.pt", "-o", tmp_path / "m.onnx", "--activation", "tanh,relu",
                    "--input-shape", "obs=5")
    assert result.exit_code == 2
    assert ("a state_dict holds no module code, and the network policyport builds from it takes one observation: give its "
            "shape alone (--input-shape 5)") in " ".join(result.stderr.split())


def test_feeds_that_miss_or_add_an_input_are_refused(tmp_path):
    out = tmp_path / "masked.onnx"
    assert invoke("convert", TORCH_DIR / "masked.torchscript.pt", "-o", out, *MASKED, "--trust", "--samples", 20).exit_code == 0
    arrays = feeds(tmp_path / "feeds.npz", bool)
    np.savez(tmp_path / "missing.npz", obs=arrays["obs"])
    np.savez(tmp_path / "extra.npz", **arrays, h=np.zeros((40, 16), np.float32))
    np.save(tmp_path / "one.npy", arrays["obs"])
    for name, says in (("missing.npz", "the feeds have missing ['action_mask']"),
                       ("extra.npz", "the feeds have unexpected ['h']"),
                       ("one.npy", "holds one array but the model has inputs ['obs', 'action_mask']; use an .npz keyed by "
                                   "input name")):
        for command in (["run", out, "-i", tmp_path / name, "-o", tmp_path / "y.npz"], ["verify", out, "-i", tmp_path / name]):
            result = invoke(*command)
            assert result.exit_code == 3, (command, result.output)
            assert says in " ".join(result.stderr.split()), (command, result.stderr)


def test_inspect_takes_the_named_inputs_of_a_module_of_several(tmp_path):
    result = invoke("inspect", TORCH_DIR / "masked.torchscript.pt", "--trust", *MASKED, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    module = scripted("masked")
    assert [(i["name"], i["dtype"], i["shape"]) for i in doc["inputs"]] == [
        ("obs", "float32", ["batch", 8]), ("action_mask", "bool", ["batch", 4])]
    assert doc["parameter_count"] == sum(p.numel() for p in module.parameters())
    without = invoke("inspect", TORCH_DIR / "masked.torchscript.pt", "--trust")
    assert without.exit_code == 2 and "--input-shape obs=D[,D...] --input-shape action_mask=D[,D...]" in without.stderr
    assert "not of policyport inspect" not in without.stderr  # inspect takes it now


@pytest.mark.parametrize("target, message", [
    ("sb3/ppo_pendulum.zip", "--input-shape does not apply to sb3 sources"),
    ("real/metadrive_ppo_expert.onnx", "is a model already"),
])
def test_inspect_refuses_input_shapes_where_nothing_reads_them(tmp_path, target, message):
    path = ROOT / "fixtures" / target
    if not path.exists():  # the .onnx: converted here
        assert invoke("convert", ROOT / "fixtures/real/metadrive_ppo_expert.npz", "-o", tmp_path / "m.onnx",
                      "--activation", "tanh", "--no-verify").exit_code == 0
        path = tmp_path / "m.onnx"
    result = invoke("inspect", path, "--input-shape", "3")
    assert result.exit_code == 2 and message in " ".join(result.stderr.split())
