"""The CLI's speed-related options and start-up: --threads, --profile, and what `policyport run` imports."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from test_cli import converted, invoke  # noqa: F401  (pytest puts tests/ on sys.path; converted is a fixture)

from policyport.cli import COMMANDS, app

@pytest.fixture(scope="module")
def big_obs(tmp_path_factory):
    path = tmp_path_factory.mktemp("obs") / "obs.npy"
    np.save(path, np.random.default_rng(3).uniform(0, 1, (2100, 275)).astype(np.float32))
    return path


def test_profile_prints_every_node_with_both_backends_and_writes_nothing(converted, big_obs, tmp_path):
    result = invoke("run", converted, "-i", big_obs, "--profile")
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in result.stdout.splitlines() if line.startswith("│")}
    for tensor in ("fc_1/linear", "fc_1/tanh", "fc_2/linear", "fc_2/tanh", "logits", "action", "log_std"):
        assert float(rows[tensor][1].replace(",", "")) > 0, tensor  # numpy µs
    numpy_pct = sum(float(cells[2]) for name, cells in rows.items() if name != "nodes, added up" and cells[2])
    assert abs(numpy_pct - 100) < 0.5
    assert "onnxruntime µs" in result.stdout and float(rows["logits"][3].replace(",", "")) > 0
    assert rows["nodes, added up"][2] == "100.0" and rows["nodes, added up"][4] == "100.0"
    assert "numpy: run" in result.stderr and "onnxruntime: run" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_profile_with_outputs_also_writes_them(converted, big_obs, tmp_path):
    result = invoke("run", converted, "-i", big_obs, "-o", tmp_path / "y.npz", "--profile", "--backend", "onnxruntime")
    assert result.exit_code == 0, result.output
    assert "onnxruntime µs" in result.stdout and "numpy µs" not in result.stdout
    assert np.load(tmp_path / "y.npz")["logits"].shape == (2100, 4)


@pytest.mark.parametrize("args, message", [
    ([], "give the .npz to write the outputs to"),
    (["--profile", "--record", "acts.npz"], "give the .npz to write the outputs to"),
    (["-o", "y.npz", "--threads", "-1"], "Invalid value for '--threads'"),
])
def test_run_usage_errors_exit_2(converted, big_obs, tmp_path, args, message):
    result = invoke("run", converted, "-i", big_obs, *[tmp_path / a if a.endswith(".npz") else a for a in args])
    assert result.exit_code == 2 and message in result.output
    assert list(tmp_path.iterdir()) == []


def test_any_thread_count_writes_the_same_bytes(converted, big_obs, tmp_path):
    for n in (1, 2):
        assert invoke("run", converted, "-i", big_obs, "-o", tmp_path / f"y{n}.npz", "--record", tmp_path / f"r{n}.npz",
                      "--threads", n).exit_code == 0
        assert invoke("record", converted, "-i", big_obs, "-o", tmp_path / f"rec{n}.npz", "--batch-size", 2100,
                      "--threads", n, "--quiet").exit_code == 0
    for stem in ("y", "r", "rec"):
        one, two = np.load(tmp_path / f"{stem}1.npz"), np.load(tmp_path / f"{stem}2.npz")
        assert one.files == two.files
        for name in one.files:
            assert one[name].tobytes() == two[name].tobytes(), (stem, name)


def test_each_command_is_registered_by_the_module_the_table_names():
    registered = {(c.name or c.callback.__name__.replace("_", "-")): c.callback.__module__.rsplit(".", 1)[1]
                  for c in app.registered_commands}
    assert registered == COMMANDS


@pytest.mark.parametrize("as_json", [False, True])
def test_run_on_the_numpy_backend_imports_only_what_it_needs(converted, tmp_path, as_json):
    obs = tmp_path / "one.npy"
    np.save(obs, np.zeros((1, 275), np.float32))
    args = ["run", str(converted), "-i", str(obs), "-o", str(tmp_path / "y.npz"), *(["--json"] if as_json else [])]
    script = ("import atexit, json, sys\n"
              "import onnx.defs\n"
              "asked, get_schema = [], onnx.defs.get_schema\n"
              "onnx.defs.get_schema = lambda *a: asked.append(a) or get_schema(*a)\n"
              "atexit.register(lambda: sys.stderr.write('MODULES' + json.dumps([sorted(sys.modules), asked])))\n"
              "from policyport.cli import main\n"
              f"sys.argv = ['policyport', *{args!r}]\n"
              "main()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    if as_json:
        assert [t["name"] for t in json.loads(done.stdout)["tensors"]] == ["logits", "action", "log_std"]
    else:
        assert done.stdout.startswith(f"numpy: outputs written to {tmp_path / 'y.npz'}") and "┃ tensor" in done.stdout
    modules, asked = json.loads(done.stderr.split("MODULES", 1)[1])
    unwanted = ["onnxruntime", "torch", "tensorflow", "pyarrow", "matplotlib", "ray", "threadpoolctl",
                "policyport.converter", "policyport.verification", "policyport.analysis.engines",
                "policyport.cli.analysis", "policyport.cli.convert", "policyport.cli.model", "policyport.cli.pack",
                "policyport.cli.verify", "policyport.cli.handoff",
                "policyport.runtime.ort", "policyport.bundle",
                "secrets", "hashlib",  # temporary names come from os.urandom; only provenance hashes files
                "rich"]  # JSON, or a table written as Rich would draw it on a pipe (tests/test_cli_plain_table.py)
    assert [m for m in unwanted if m in modules] == []
    import onnx

    from policyport import onnx_schemas

    if onnx.__version__ == onnx_schemas.ONNX_VERSION:  # the table answers: onnx's schema registry is never built
        assert asked == []


def test_verify_takes_threads_and_passes_on_a_large_sample(converted):
    result = invoke("verify", converted, "--samples", 2100, "--threads", 2, "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code == 0 and doc["passed"] is True and doc["samples"] == 2100


def test_the_profile_functions_time_every_node_in_order_and_check_the_feeds(metadrive_model):
    import policyport as pp
    from policyport.runtime.profile import profile_numpy, profile_onnxruntime

    obs = np.random.default_rng(4).uniform(0, 1, (64, 275)).astype(np.float32)
    numpy_profile = profile_numpy(pp.load(metadrive_model), obs, budget=0.05)
    assert [n.node for n in numpy_profile.nodes] == [n.name for n in metadrive_model.graph.node]
    assert all(n.seconds > 0 for n in numpy_profile.nodes) and numpy_profile.run_seconds > 0
    assert numpy_profile.node_seconds == pytest.approx(sum(n.seconds for n in numpy_profile.nodes))
    ort_profile = profile_onnxruntime(pp.load(metadrive_model, backend="onnxruntime"), obs, budget=0.05)
    assert {n.tensor for n in ort_profile.nodes} >= {"fc_1/linear", "fc_2/linear", "logits"}  # fused or not
    for profile in (profile_numpy, profile_onnxruntime):
        with pytest.raises(pp.InputMismatchError, match="expects shape"):
            profile(pp.load(metadrive_model, backend="numpy" if profile is profile_numpy else "onnxruntime"),
                    obs[:, :10])


def test_rich_missing_is_reported_before_any_command_runs(monkeypatch, capsys):
    import importlib.util

    import policyport.cli as cli

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rich" else find_spec(name, *a))
    monkeypatch.setattr(sys, "argv", ["policyport", "run", "m.onnx", "-i", "x.npy", "-o", "y.npz", "--json"])
    with pytest.raises(SystemExit) as ended:
        cli.main()
    assert ended.value.code == 4
    assert capsys.readouterr().err == ("error: the policyport command needs the Python package 'rich', which is not "
                                       "installed; install it with: pip install 'policyport[cli]' (or pip install -e '.[cli]' in a "
                                       "clone of the repository)\n")
