"""What a failure suggests: looser tolerances only where the error is within reach of them, and every
option a message names is an option of the command that prints it."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from test_cli import invoke  # pytest puts tests/ on sys.path

import policyport as pp


@pytest.fixture(scope="module")
def changed(tmp_path_factory, metadrive_path, metadrive_model):
    """The expert as .onnx, and its weights with the first kernel scaled by 1.5 (a real mismatch)."""
    place = tmp_path_factory.mktemp("hints")
    onnx.save(metadrive_model, place / "m.onnx")
    with np.load(metadrive_path) as f:
        weights = {k: f[k] for k in f.files}
    weights["default_policy/fc_1/kernel"] = weights["default_policy/fc_1/kernel"] * np.float32(1.5)
    np.savez(place / "changed.npz", **weights)
    return place


def test_a_large_mismatch_names_the_diverging_tensor_and_no_tolerance_option(changed):
    result = invoke("verify", changed / "m.onnx", "--source", changed / "changed.npz", "--samples", "64")
    assert result.exit_code == 1
    verdict = result.stdout.strip().splitlines()[-1]
    assert verdict.startswith("FAIL: ") and "first diverging tensor 'fc_1/linear' (float32, numpy vs source)" in verdict
    assert verdict.endswith("that is more than 100 times the float32 tolerance: the values disagree beyond rounding — "
                            "look at the node that computes 'fc_1/linear', not at the tolerances")
    assert "--atol" not in result.output and "--rtol" not in result.output
    doc = json.loads(invoke("verify", changed / "m.onnx", "--source", changed / "changed.npz", "--samples", "64",
                            "--json").stdout)
    assert doc["first_divergence"]["max_abs"] > 100 * doc["first_divergence"]["atol"]


def test_pack_refuses_a_large_mismatch_without_suggesting_tolerances(changed, tmp_path):
    result = invoke("pack", changed / "m.onnx", "-o", tmp_path / "b", "--source", changed / "changed.npz")
    assert result.exit_code == 1 and not (tmp_path / "b").exists()
    assert "the values disagree beyond rounding — look at the node that computes 'fc_1/linear'" in result.stderr
    assert "--atol" not in result.stderr
    with pytest.raises(pp.VerificationError, match="not at the tolerances") as raised:
        pp.pack(changed / "m.onnx", tmp_path / "b", source=changed / "changed.npz")
    assert "atol=" not in str(raised.value)


def test_a_small_mismatch_still_suggests_the_tolerance_options(changed, tmp_path):
    result = invoke("verify", changed / "m.onnx", "--samples", "32", "--atol", "0", "--rtol", "0", "--no-rounding")
    assert result.exit_code == 1
    assert result.stdout.rstrip().endswith("if float32 differences of this size are acceptable, loosen them with "
                                           "--atol/--rtol")


# -------------------------------------------------------------------------- contradicting options


@pytest.fixture(scope="module")
def place(changed):
    """The expert as .onnx and 20 observations."""
    np.save(changed / "obs.npy", np.random.default_rng(1).uniform(0, 1, (20, 275)).astype(np.float32))
    return changed


@pytest.mark.parametrize("args,named", [
    (["record", "{m}", "-i", "{obs}", "-o", "{out}/x.npz", "--format", "parquet"],
     ["-o (out=) 'x.npz' ends in .npz but --format (format=) asks for parquet", "'x.parquet'"]),
    (["record", "{m}", "-i", "{obs}", "-o", "{out}/x.npz", "--engine", "ray"],
     ["--engine ray (engine='ray') writes a folder of .parquet files, but -o (out=) 'x.npz' ends in .npz", "'x'"]),
    (["record", "{m}", "-i", "{obs}", "-o", "{out}/x", "--engine", "ray", "--format", "npz"],
     ["--engine ray (engine='ray') writes a folder of .parquet files, but --format (format=) asks for npz"]),
    (["record", "{m}", "-i", "{obs}", "-o", "{out}/x.bin"], ["cannot tell the recording format from -o", "--format"]),
    (["convert", "{src}", "-o", "{out}/w.onnx", "--activation", "relu,tanh"],
     ["--activation (activation=) 'relu,tanh' is a list", "npz sources take one activation name"]),
    (["run", "{m}", "-i", "{obs}", "-o", "{out}/o.npz", "--record", "{out}/o.npz"], ["is also the -o file", "--record"]),
    (["run", "{m}", "-i", "{obs}", "--profile", "--override", "fc_1/tanh[0]=1"], ["--profile", "--override/--steer"]),
])
def test_an_option_contradicting_another_is_a_usage_error_naming_both(place, metadrive_path, tmp_path, args, named):
    result = invoke(*[a.format(m=place / "m.onnx", obs=place / "obs.npy", out=tmp_path, src=metadrive_path) for a in args])
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert all(" ".join(n.split()) in message for n in named), message
    assert list(tmp_path.iterdir()) == []


def test_a_packed_folder_refuses_one_file_for_both_outputs_as_a_usage_error(place, tmp_path):
    from policyport.runtime.entry import main

    folder = pp.pack(place / "m.onnx", tmp_path / "b", samples=4)
    out = tmp_path / "o.npz"
    assert main(folder, ["-i", str(place / "obs.npy"), "-o", str(out), "--record", str(out)]) == 2
    assert not out.exists()
