"""Output the reader stops taking (``policyport inspect m.onnx | head -1``) is not an error: the
command ends with its own exit code (the verdict), its files written, and no traceback — for the
``policyport`` command and for a packed folder's ``run.py``. Each case runs in a real subprocess
whose stdout pipe is closed before the command writes anything, so its first write meets EPIPE."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import policyport as pp

POLICYPORT = [sys.executable, "-m", "policyport"]


def closed_reader(*command) -> tuple[int, str]:
    """Run ``command`` with its stdout a pipe nobody reads (closed at once); (exit code, stderr)."""
    proc = subprocess.Popen([str(c) for c in command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    stderr = proc.stderr.read()
    proc.stderr.close()
    return proc.wait(timeout=300), stderr


@pytest.fixture(scope="module")
def files(tmp_path_factory, metadrive_model, metadrive_path):
    """The expert as .onnx, its packed folder, 3,000 observations, and its weights with one changed."""
    import onnx

    place = tmp_path_factory.mktemp("pipe")
    onnx.save(metadrive_model, place / "m.onnx")
    pp.pack(metadrive_model, place / "bundle", samples=8)
    obs = np.random.default_rng(5).uniform(0, 1, (3000, 275)).astype(np.float32)
    np.save(place / "obs.npy", obs)
    with np.load(metadrive_path) as f:
        weights = {k: f[k] for k in f.files}
    name = next(k for k, v in weights.items() if v.ndim == 2)
    weights[name] = weights[name] * np.float32(1.5)
    np.savez(place / "changed.npz", **weights)
    return place


def test_inspect_into_a_closed_pipe_is_exit_0_without_a_traceback(files):
    code, stderr = closed_reader(*POLICYPORT, "inspect", files / "m.onnx")
    assert (code, stderr) == (0, "")


def test_run_json_into_a_closed_pipe_writes_its_outputs_and_exits_0(files, tmp_path):
    code, stderr = closed_reader(*POLICYPORT, "run", files / "m.onnx", "-i", files / "obs.npy", "-o",
                                 tmp_path / "out.npz", "--record", tmp_path / "acts.npz", "--json")
    assert (code, stderr) == (0, "")
    want = pp.load(files / "m.onnx").run({"obs": np.load(files / "obs.npy")})
    with np.load(tmp_path / "out.npz") as out:
        assert sorted(out.files) == sorted(want) and all(np.array_equal(out[k], want[k]) for k in want)


def test_a_verdict_is_kept_when_the_reader_has_gone(files):
    """A mismatch stays exit 1 and a usage error exit 2, also with --json."""
    code, stderr = closed_reader(*POLICYPORT, "verify", files / "m.onnx", "--source", files / "changed.npz",
                                 "--samples", "500")
    assert code == 1 and "Traceback" not in stderr and "Broken pipe" not in stderr
    code, stderr = closed_reader(*POLICYPORT, "verify", files / "m.onnx", "--source", files / "changed.npz",
                                 "--samples", "500", "--json")
    assert (code, stderr) == (1, "")
    code, stderr = closed_reader(*POLICYPORT, "verify", files / "m.onnx", "--samples", "0", "--json")
    assert code == 2 and "--samples" in stderr and "Traceback" not in stderr and "Broken pipe" not in stderr


def test_a_packed_folder_into_a_closed_pipe_keeps_its_exit_code(files, tmp_path):
    run_py = files / "bundle" / "run.py"
    code, stderr = closed_reader(sys.executable, run_py, "-i", files / "obs.npy", "-o", tmp_path / "out.npz")
    assert (code, stderr) == (0, "")
    want = pp.load(files / "bundle").run({"obs": np.load(files / "obs.npy")})
    with np.load(tmp_path / "out.npz") as out:  # the folder's numpy-only runtime cannot hold the BLAS to one thread
        for k in want:  # as the numpy backend does in its row blocks: equal within float32 rounding
            np.testing.assert_allclose(out[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)
    assert closed_reader(sys.executable, run_py, "--verify", "--json") == (0, "")
    assert closed_reader(sys.executable, run_py, "-h") == (0, "")
    code, stderr = closed_reader(sys.executable, run_py, "-i", files / "missing.npy", "-o", tmp_path / "o2.npz", "--json")
    assert code == 3 and "missing.npy" in stderr and "Traceback" not in stderr and "Broken pipe" not in stderr


def test_output_taken_in_full_is_unchanged(files, metadrive_model):
    """The guard passes everything through while the reader reads."""
    proc = subprocess.run([*POLICYPORT, "inspect", str(files / "m.onnx"), "--json"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == ""
    opset = next(o.version for o in metadrive_model.opset_import if o.domain in ("", "ai.onnx"))
    assert json.loads(proc.stdout)["opset"] == opset
