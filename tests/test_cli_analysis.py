"""The record, stats and plot commands, and run's overrides: exit codes, JSON, files, no partial output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_cli import converted, invoke  # noqa: F401  (the converted MetaDrive model is a fixture)

import policyport as pp


@pytest.fixture
def model(converted):
    return converted


@pytest.fixture
def obs(tmp_path, metadrive_obs):
    path = tmp_path / "obs.npy"
    np.save(path, metadrive_obs[:500])
    return path


def test_record_writes_the_recording_and_reports_it(tmp_path, model, obs, metadrive_obs, metadrive_model):
    out = tmp_path / "rec.npz"
    result = invoke("record", model, "-i", obs, "-o", out, "--batch-size", "128", "--tensors", "fc_2/*")
    assert result.exit_code == 0, result.output
    assert f"recorded 500 rows × 5 tensors to {out} (npz" in result.stderr
    assert "fc_2/tanh" in result.stdout and "(500, 256)" in result.stdout
    assert "rows/s" in result.stderr and "━" not in result.stderr  # no progress bar when not a terminal
    with np.load(out) as f:
        np.testing.assert_allclose(f["action"], pp.load(metadrive_model).run(metadrive_obs[:500])["action"], atol=1e-5)
    again = invoke("record", model, "-i", obs, "-o", out)
    assert again.exit_code == 3 and "exists" in again.stderr


def test_record_json_and_overrides(tmp_path, model, obs, metadrive_obs, metadrive_model):
    out = tmp_path / "rec.parquet"
    result = invoke("record", model, "-i", obs, "-o", out, "--override", "fc_2/tanh[17]=1.0", "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code == 0 and doc["rows"] == 500 and doc["format"] == "parquet"
    assert doc["overrides"] == ["fc_2/tanh[17]=1"] and [t["name"] for t in doc["tensors"]][:2] == ["fc_1/linear", "fc_1/tanh"]
    rec = pp.analysis.open_recording(out).head(500)
    expected = pp.load(metadrive_model).run(metadrive_obs[:500], overrides={"fc_2/tanh": {17: 1.0}})
    np.testing.assert_allclose(rec["action"], expected["action"], atol=1e-5)


def test_record_to_a_folder_of_npy_files_reads_back_as_the_npz_does(tmp_path, model, obs):
    result = invoke("record", model, "-i", obs, "-o", tmp_path / "rec", "--batch-size", "128", "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code == 0 and doc["format"] == "npy" and doc["rows"] == 500
    assert doc["bytes"] == sum(p.stat().st_size for p in (tmp_path / "rec").iterdir())
    # the same blocks of rows: the BLAS kernel may round a product of 128 rows differently from one of 500
    assert invoke("record", model, "-i", obs, "-o", tmp_path / "rec.npz", "--batch-size", "128").exit_code == 0
    folder, archive = (json.loads(invoke("stats", tmp_path / r, "--json").stdout) for r in ("rec", "rec.npz"))
    assert folder["tensors"] == archive["tensors"] and folder["rows"] == archive["rows"] == 500
    wrong = invoke("record", model, "-i", obs, "-o", tmp_path / "rec.npy")
    assert wrong.exit_code == 2 and "'rec' (no suffix) for a folder of .npy files" in " ".join(wrong.stderr.split())


@pytest.mark.parametrize("args, code, message", [
    (["--format", "zarr"], 2, "'zarr' is not one of"),
    (["--engine", "ray", "--backend", "onnxruntime"], 2, "numpy backend on every worker"),
    (["--batch-size", "0"], 2, "is not in the range x>=1"),
    (["--override", "fc_2/tanh[x]=1"], 2, "index 'x' is not a neuron number"),
    (["--override", "fc_7/tanh[1]=1"], 3, "which no node of the model produces"),
    (["--tensors", "nothing*"], 3, "match no tensor"),
])
def test_record_refuses_bad_options_and_writes_nothing(tmp_path, model, obs, args, code, message):
    result = invoke("record", model, "-i", obs, "-o", tmp_path / "rec.npz", *args)
    assert result.exit_code == code and message in " ".join(result.stderr.split())
    assert sorted(os.listdir(tmp_path)) == ["obs.npy"]


@pytest.mark.parametrize("command", ["record", "importance"])
def test_a_dataset_of_the_wrong_width_is_refused_naming_its_own_rows(tmp_path, model, command):
    np.save(tmp_path / "narrow.npy", np.zeros((8, 274), np.float32))
    out = ["-o", tmp_path / "rec.npz"] if command == "record" else []
    result = invoke(command, model, "-i", tmp_path / "narrow.npy", *out)
    assert result.exit_code == 3
    assert "input 'obs' expects shape (batch, 275), got (8, 274) (axis 1 is 274, the model needs 275)" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["narrow.npy"]


def test_record_says_how_many_observations_hold_nan_or_inf(tmp_path, model, metadrive_obs):
    x = metadrive_obs[:300].copy()
    x[5, 1], x[250, 7], x[250, 8] = np.nan, np.inf, np.nan
    np.save(tmp_path / "bad.npy", x)
    result = invoke("record", model, "-i", tmp_path / "bad.npy", "-o", tmp_path / "rec.npz", "--batch-size", "128")
    assert result.exit_code == 0 and "warning: 2 of 300 observations hold NaN or Inf" in result.stderr
    doc = json.loads(invoke("record", model, "-i", tmp_path / "bad.npy", "-o", tmp_path / "rec.parquet", "--json").stdout)
    assert doc["nonfinite_rows"] == 2


def test_stats_prints_a_table_and_writes_json(tmp_path, model, obs):
    rec = tmp_path / "rec.npz"
    assert invoke("record", model, "-i", obs, "-o", rec).exit_code == 0
    result = invoke("stats", rec, "-o", tmp_path / "stats.json")
    assert result.exit_code == 0
    lines = [line for line in result.stdout.splitlines() if "fc_2/tanh" in line]
    assert len(lines) == 1 and "Tanh" in lines[0] and "256" in lines[0]
    doc = json.loads((tmp_path / "stats.json").read_text())
    assert doc["rows"] == 500 and len(doc["tensors"][1]["per_neuron"]["mean"]) == 256
    as_json = invoke("stats", rec, "--json", "--tensors", "logits")
    doc = json.loads(as_json.stdout)
    assert [t["name"] for t in doc["tensors"]] == ["logits"] and doc["tensors"][0]["layer"]["values"] == 2000
    missing = invoke("stats", tmp_path / "none.npz", "--json")
    assert missing.exit_code == 3 and json.loads(missing.stdout)["exit_code"] == 3


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory):
    """An SB3 Box policy (PPO Pendulum with VecNormalize) converted by the CLI, and 600 observations."""
    pytest.importorskip("torch")  # convert checks the result against SB3's own forward
    folder = tmp_path_factory.mktemp("pendulum")
    source = Path(__file__).resolve().parents[1] / "fixtures" / "sb3" / "ppo_pendulum_vecnorm.zip"
    result = invoke("convert", source, "-o", folder / "p.onnx")
    assert result.exit_code == 0, result.output
    np.save(folder / "obs.npy", np.random.default_rng(12).uniform(-1, 1, (600, 3)).astype(np.float32))
    return folder


def test_stats_and_plot_read_what_run_record_writes_for_an_sb3_box_policy(tmp_path, pendulum):
    """Its recording holds constants and a shape beside the tensors with rows: those get figures,
    these are named as left out."""
    rec = tmp_path / "rec.npz"
    result = invoke("run", pendulum / "p.onnx", "-i", pendulum / "obs.npy", "-o", tmp_path / "out.npz", "--record", rec)
    assert result.exit_code == 0, result.output
    with np.load(rec) as f:
        recorded = {k: f[k] for k in f.files}
    description = json.loads(str(recorded.pop("policyport.recording")))
    with_rows = [k for k, v in recorded.items() if v.shape[:1] == (600,)]
    assert len(with_rows) == 15 and len(recorded) == 18
    assert description["rows"] == 600 and [t["name"] for t in description["tensors"]] == with_rows
    assert description["tensors"][0] == {"name": "vec_normalize/obs_float64", "op_type": "Cast", "dtype": "float64",
                                         "shape": [3]}
    assert description["backend"] == "numpy" and description["overrides"] == []
    note = ("left out (no batch axis, not one row per observation): vec_normalize/var_eps (3,), vec_normalize/std (3,), "
            "action_net/mean_shape (2,)\n")
    stats = invoke("stats", rec)
    assert stats.exit_code == 0 and stats.stderr == note
    assert "600 observations" in stats.stdout and "mlp_extractor.policy_net.3/tanh" in stats.stdout
    doc = json.loads(invoke("stats", rec, "--json").stdout)
    assert [t["name"] for t in doc["tensors"]] == with_rows
    assert doc["left_out"] == [{"name": "vec_normalize/var_eps", "shape": [3]}, {"name": "vec_normalize/std", "shape": [3]},
                               {"name": "action_net/mean_shape", "shape": [2]}]
    std = next(t for t in doc["tensors"] if t["name"] == "vec_normalize/obs")["layer"]["std"]
    assert std == pytest.approx(recorded["vec_normalize/obs"].astype(np.float64).std(), rel=1e-9)
    plot = invoke("plot", rec, "-o", tmp_path / "plots", "--tensors", "action*")
    assert plot.exit_code == 0, plot.output
    assert plot.stderr == "left out (no batch axis, not one row per observation): action_net/mean_shape (2,)\nwrote 9 PNG files to plots\n".replace(
        "plots", str(tmp_path / "plots"))
    assert sorted(os.listdir(tmp_path / "plots"))[:2] == ["heatmap-action-above_low.png", "heatmap-action.png"]
    asked = invoke("stats", rec, "--tensors", "action_net/mean_shape")
    assert asked.exit_code == 3 and "'action_net/mean_shape' (shape (2,)) has no row for each of the 600 observations" in asked.stderr


def test_run_record_says_which_tensors_have_rows_when_a_constant_is_as_long_as_the_observations(tmp_path, pendulum):
    """On 3 observations, the normaliser's std and var_eps (3 values, one per feature) are as long as
    the rows: the description that run --record writes leaves them out all the same."""
    obs = tmp_path / "three.npy"
    np.save(obs, np.load(pendulum / "obs.npy")[:3])
    rec = tmp_path / "rec.npz"
    result = invoke("run", pendulum / "p.onnx", "-i", obs, "-o", tmp_path / "out.npz", "--record", rec)
    assert result.exit_code == 0, result.output
    with np.load(rec) as f:
        assert f["vec_normalize/std"].shape == (3,) and f["vec_normalize/var_eps"].shape == (3,)
        constants = {"vec_normalize/var_eps": f["vec_normalize/var_eps"], "vec_normalize/std": f["vec_normalize/std"]}
        obs_std = f["vec_normalize/obs"].astype(np.float64).std()
    doc = json.loads(invoke("stats", rec, "--json").stdout)
    assert doc["rows"] == 3 and len(doc["tensors"]) == 15
    assert doc["left_out"] == [{"name": "vec_normalize/var_eps", "shape": [3]}, {"name": "vec_normalize/std", "shape": [3]},
                               {"name": "action_net/mean_shape", "shape": [2]}]
    assert not any(t["name"] in constants for t in doc["tensors"])
    assert next(t for t in doc["tensors"] if t["name"] == "vec_normalize/obs")["layer"]["std"] == pytest.approx(obs_std, rel=1e-9)
    plot = invoke("plot", rec, "-o", tmp_path / "plots", "--tensors", "vec_normalize/*", "--json")
    assert plot.exit_code == 0, plot.output
    assert json.loads(plot.stdout)["left_out"] == [{"name": "vec_normalize/var_eps", "shape": [3]},
                                                   {"name": "vec_normalize/std", "shape": [3]}]


NOT_A_RECORDING = ("not a recording: statistics and plots need each tensor's values on every observation; record them "
                   "with policyport record MODEL -i OBS.npy -o REC.npz (or policyport run MODEL -i OBS.npy -o OUT.npz "
                   "--record REC.npz)")


def test_stats_and_plot_refuse_weights_saying_what_makes_a_recording(tmp_path, model, metadrive_path):
    import zipfile

    weights = tmp_path / "w.npz"
    assert invoke("extract", model, "-o", weights).exit_code == 0
    with zipfile.ZipFile(weights) as zf, np.load(weights) as f, np.load(metadrive_path) as source:
        assert zf.comment == b"policyport.weights: written by policyport extract"
        assert f.files == source.files and all(np.array_equal(f[k], source[k]) for k in f.files)  # numpy ignores it
    marked = f"{weights} holds a model's weights (written by policyport extract), {NOT_A_RECORDING}"
    for command in (["stats", weights], ["stats", weights, "-o", tmp_path / "s.json"], ["plot", weights, "-o", tmp_path / "p"]):
        result = invoke(*command)
        assert result.exit_code == 3 and result.stderr == f"error: {marked}\n"
        as_json = invoke(*command, "--json")
        assert as_json.exit_code == 3 and json.loads(as_json.stdout) == {"error": marked, "exit_code": 3}
    named = invoke("stats", metadrive_path)  # a source's weights, told by their names
    assert named.exit_code == 3 and named.stderr == (
        f"error: {metadrive_path} holds a model's weights ('default_policy/fc_1/kernel', 'default_policy/fc_1/bias', "
        f"'default_policy/fc_2/kernel' … and 3 more, each named as a parameter), {NOT_A_RECORDING}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.npz"]


def test_plot_of_a_recording_and_of_a_verify_report(tmp_path, model, obs):
    rec = tmp_path / "rec.npz"
    assert invoke("record", model, "-i", obs, "-o", rec, "--tensors", "fc_1/tanh").exit_code == 0
    result = invoke("plot", rec, "-o", tmp_path / "plots", "--rows", "40")
    assert result.exit_code == 0 and "wrote 9 PNG files" in result.stderr
    assert sorted(os.listdir(tmp_path / "plots"))[:2] == ["heatmap-action.png", "heatmap-fc_1-tanh.png"]
    report = tmp_path / "report.json"
    report.write_text(invoke("verify", model, "--samples", "8", "--json").stdout)
    assert invoke("plot", report, "-o", tmp_path / "errors").exit_code == 0
    assert os.listdir(tmp_path / "errors") == ["errors.png"]
    assert invoke("plot", report, "-o", tmp_path / "errors").exit_code == 3  # exists
    as_json = invoke("plot", report, "-o", tmp_path / "errors", "--force", "--json")
    assert as_json.exit_code == 0 and as_json.stderr == ""
    assert json.loads(as_json.stdout) == {"output": str(tmp_path / "errors"), "files": [str(tmp_path / "errors" / "errors.png")]}


@pytest.mark.parametrize("backend", list(pp.BACKENDS))
def test_run_with_overrides_steers_the_action(tmp_path, model, obs, metadrive_obs, metadrive_model, backend):
    sets = tmp_path / "sets.json"
    sets.write_text('{"brake": {"fc_2/tanh": {"17": 1.0}}, "calm": ["fc_1/tanh[*]*=0.5"]}')
    out = tmp_path / "o.npz"
    result = invoke("run", model, "-i", obs, "-o", out, "--backend", backend, "--steer", "calm", "--overrides", sets,
                    "--override", "fc_2/tanh[0:8]=clip(-0.1,0.1)", "--record", tmp_path / "acts.npz")
    assert result.exit_code == 0, result.output
    assert "with overrides: fc_1/tanh[*]*=0.5; fc_2/tanh[0:8]=clip(-0.1,0.1)" in result.stderr
    expected = pp.load(metadrive_model).record(metadrive_obs[:500], overrides=["fc_1/tanh[*]*=0.5", "fc_2/tanh[0:8]=clip(-0.1,0.1)"])
    with np.load(out) as o, np.load(tmp_path / "acts.npz") as a:
        np.testing.assert_allclose(o["action"], expected["action"], atol=1e-5)
        np.testing.assert_allclose(a["fc_2/tanh"], expected["fc_2/tanh"], atol=1e-5)
        assert np.abs(a["fc_2/tanh"][:, :8]).max() <= np.float32(0.1)


@pytest.mark.parametrize("args, message", [
    (["--steer", "brake"], "--steer NAME and --overrides FILE go together"),
    (["--steer", "fast", "--overrides", "SETS"], "has no set 'fast'; it has: brake"),
    (["--override", "fc_2/tanh[17]"], "does not read as TENSOR[INDEX]=VALUE"),
])
def test_run_override_usage_errors_exit_2(tmp_path, model, obs, args, message):
    sets = tmp_path / "sets.json"
    sets.write_text('{"brake": {"fc_2/tanh": {"17": 1.0}}}')
    result = invoke("run", model, "-i", obs, "-o", tmp_path / "o.npz", *[str(sets) if a == "SETS" else a for a in args])
    assert result.exit_code == 2 and message in " ".join(result.stderr.split())
    assert not (tmp_path / "o.npz").exists()


def test_run_says_how_many_rows_hold_nan_or_inf(tmp_path, model, metadrive_obs):
    x = metadrive_obs[:50].copy()
    x[3, 0], x[7, 1], x[7, 2], x[9, 4] = np.nan, np.inf, np.nan, -np.inf
    np.save(tmp_path / "bad.npy", x)
    result = invoke("run", model, "-i", tmp_path / "bad.npy", "-o", tmp_path / "o.npz")
    assert result.exit_code == 0
    assert "warning: 3 of 50 rows of input 'obs' hold NaN or Inf" in result.stderr
    clean = invoke("run", model, "-i", tmp_path / "bad.npy", "-o", tmp_path / "o2.npz")
    assert "warning" in clean.stderr  # the same file, the same warning
    np.save(tmp_path / "good.npy", metadrive_obs[:50])
    assert "warning" not in invoke("run", model, "-i", tmp_path / "good.npy", "-o", tmp_path / "o3.npz").stderr


def test_nan_inputs_print_policyports_warning_and_no_numpy_warning(tmp_path, model, metadrive_obs):
    x = metadrive_obs[:50].copy()
    x[3, 0], x[4, :] = np.nan, np.inf  # inf - inf in a dot product: numpy's "invalid value" case
    np.save(tmp_path / "bad.npy", x)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHONWARN")}
    proc = subprocess.run([sys.executable, "-m", "policyport", "run", str(model), "-i", str(tmp_path / "bad.npy"),
                           "-o", str(tmp_path / "o.npz"), "--record", str(tmp_path / "a.npz")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "RuntimeWarning" not in proc.stderr and "encountered" not in proc.stderr
    assert "warning: 2 of 50 rows of input 'obs' hold NaN or Inf" in " ".join(proc.stderr.split())


@pytest.mark.parametrize("name", ["rec.npz", "rec"])  # a file; a folder of .npy files
def test_sigterm_during_record_leaves_no_partial_output(tmp_path, model, name):
    np.save(tmp_path / "obs.npy", np.random.default_rng(0).uniform(0, 1, (40000, 275)).astype(np.float32))
    out = tmp_path / name
    proc = subprocess.Popen([sys.executable, "-m", "policyport", "record", str(model), "-i", str(tmp_path / "obs.npy"),
                             "-o", str(out), "--batch-size", "16"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(f".{name}.") for p in tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "terminated; nothing was written" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["obs.npy"]


@pytest.fixture
def narrow_terminal(monkeypatch):
    """stdout as an 80-column terminal: what a person at a default terminal sees."""
    import io

    from rich.console import Console

    import policyport.cli.analysis as analysis
    import policyport.cli.pack as pack
    import policyport.cli.render as render

    screen = io.StringIO()
    console = Console(file=screen, width=80, force_terminal=True, color_system=None, highlight=False, soft_wrap=False,
                      markup=False, emoji=False)
    for module in (render, analysis, pack):
        monkeypatch.setattr(module, "out", console)
    return screen


def test_stats_in_a_narrow_terminal_splits_the_table_and_never_a_number(tmp_path, model, obs, narrow_terminal):
    rec = tmp_path / "rec.npz"
    assert invoke("record", model, "-i", obs, "-o", rec).exit_code == 0
    narrow_terminal.seek(0)
    narrow_terminal.truncate()
    assert invoke("stats", rec).exit_code == 0
    text = narrow_terminal.getvalue()
    assert max(len(line) for line in text.splitlines() if line[:1] in "┏┃┡│└") <= 80
    rows = [line for line in text.splitlines() if line.startswith("│ fc_2/tanh")]
    assert len(rows) == 2  # figures in one table, behaviour in the other, one line each
    doc = json.loads(invoke("stats", rec, "--json", "--tensors", "fc_2/tanh").stdout)["tensors"][0]["layer"]
    assert f"{doc['mean']:.4g}" in rows[0] and f"{100 * doc['active_fraction']:.1f}%" in rows[1]


def test_pack_in_a_narrow_terminal_shows_digest_prefixes_on_one_line(tmp_path, model, narrow_terminal):
    assert invoke("pack", model, "-o", tmp_path / "b", "--samples", "2").exit_code == 0
    policy = json.loads((tmp_path / "b" / "policy.json").read_text())
    text = narrow_terminal.getvalue()
    assert "sha256 (prefix; whole in policy.json)" in text
    row = next(line for line in text.splitlines() if line.startswith("│ weights.npz"))
    assert policy["files"]["weights.npz"][:16] + "…" in row and policy["files"]["weights.npz"] not in text


# ------------------------------------------------------------------------- small files, large work


def test_record_refuses_an_output_larger_than_the_free_space_and_writes_nothing(tmp_path, model, obs, monkeypatch):
    import shutil
    from collections import namedtuple

    probe = pp.load(str(model)).record({"obs": np.load(obs)[:2]}, "*")
    row_bytes = sum(v[0].nbytes for v in probe.values() if v.ndim and v.shape[0] == 2)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 100_000, 100_000))
    out = tmp_path / "rec.npz"
    result = invoke("record", model, "-i", obs, "-o", out, "--batch-size", "128")
    assert result.exit_code == 3, result.output
    message = " ".join(result.stderr.split())
    assert (f"the recording (500 rows of {row_bytes:,} bytes, {len(probe)} tensors) would take "
            f"{pp_size(500 * row_bytes)} ({500 * row_bytes:,} bytes), but the file system of {tmp_path} has "
            "97.7 KiB (100,000 bytes) free; nothing was written") in message
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def pp_size(nbytes: int) -> str:
    from policyport.io.limits import format_size

    return format_size(nbytes)


@pytest.fixture
def many_arrays(tmp_path):
    """An .npz of 5,000 two-element arrays (0.7 MB), more than the reader's limit of 4,096 allows."""
    from policyport.io.limits import DEFAULT_NPZ_ARRAYS
    from policyport.io.arrays import write_npz

    path = tmp_path / "many.npz"
    write_npz(path, {f"k{i:05d}": np.zeros(2, np.float32) for i in range(DEFAULT_NPZ_ARRAYS + 904)})
    return path


@pytest.mark.parametrize("command", [["run", "{m}", "-i", "{f}", "-o", "{t}/y.npz"], ["stats", "{f}"],
                                     ["record", "{m}", "-i", "{f}", "-o", "{t}/r.npz"], ["verify", "{m}", "-i", "{f}"]])
def test_an_npz_of_too_many_arrays_is_refused_before_they_are_read(tmp_path, model, many_arrays, command):
    result = invoke(*[a.format(m=model, f=many_arrays, t=tmp_path) for a in command])
    assert result.exit_code == 3, result.output
    assert (f"{many_arrays} holds 5,000 arrays, more than the limit of 4,096 arrays in one .npz; if you trust it, "
            "raise the limit with POLICYPORT_MAX_NPZ_ARRAYS=5000") in " ".join(result.stderr.split())
    assert not (tmp_path / "y.npz").exists() and not (tmp_path / "r.npz").exists()


def test_messages_list_the_first_names_of_a_long_list_and_count_the_rest(tmp_path, model, many_arrays, monkeypatch):
    monkeypatch.setenv("POLICYPORT_MAX_NPZ_ARRAYS", "5000")
    result = invoke("run", model, "-i", many_arrays, "-o", tmp_path / "y.npz")
    assert result.exit_code == 3, result.output
    names = ", ".join(f"'k{i:05d}'" for i in range(10))
    assert result.stderr == (f"error: the model's inputs are ['obs']; the feeds have missing ['obs'] and unexpected "
                             f"[{names} … and 4,990 more]\n")


# ------------------------------------------------------------------------------------ on a terminal


def test_record_on_a_terminal_counts_rows_with_separators_and_labels_the_times(tmp_path, model, metadrive_obs,
                                                                               monkeypatch):
    import io

    from rich.console import Console

    import policyport.cli.analysis as analysis

    screen = Console(file=io.StringIO(), width=100, force_terminal=True, color_system=None)
    monkeypatch.setattr(analysis, "err", screen)
    np.save(tmp_path / "obs.npy", np.tile(metadrive_obs, (3, 1)))
    result = invoke("record", model, "-i", tmp_path / "obs.npy", "-o", tmp_path / "rec.npz", "--batch-size", "500")
    assert result.exit_code == 0, result.output
    shown = screen.file.getvalue()
    assert "recording: finishing" in shown and "3,000/3,000 rows" in shown and "3000" not in shown
    assert "elapsed 0:00:0" in shown and ", remaining 0:00:0" in shown


@pytest.mark.parametrize("width", [100, 80])
def test_stats_notes_wrap_between_words_on_a_terminal_and_stay_whole_in_a_pipe(tmp_path, pendulum, monkeypatch, width):
    from test_cli_render import split_words, terminal_console

    from policyport.cli import render

    rec = tmp_path / "rec.npz"
    assert invoke("run", pendulum / "p.onnx", "-i", pendulum / "obs.npy", "-o", tmp_path / "o.npz", "--record", rec).exit_code == 0
    piped = invoke("stats", rec, "--tensors", "action*,vec*")
    note = piped.stderr.rstrip("\n")
    assert piped.exit_code == 0 and "\n" not in note and len(note) > 100  # a pipe: one line, however long
    console, screen = terminal_console(monkeypatch, width)
    monkeypatch.setattr(render, "err", console)
    assert invoke("stats", rec, "--tensors", "action*,vec*").exit_code == 0
    lines = screen.getvalue().splitlines()
    assert len(lines) > 1 and max(len(line) for line in lines) <= width and not split_words(lines, note), lines
