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
                "policyport.converter", "policyport.verification.verify", "policyport.analysis.engines",
                "policyport.cli.analysis", "policyport.cli.convert", "policyport.cli.model", "policyport.cli.pack",
                "policyport.cli.verify", "policyport.cli.handoff",
                "policyport.runtime.ort", "policyport.handoff.pack",
                "secrets", "hashlib",  # temporary names come from os.urandom; only provenance hashes files
                "rich"]  # JSON, or a table written as Rich would draw it on a pipe (tests/test_cli_plain_table.py)
    assert [m for m in unwanted if m in modules] == []
    import onnx

    from policyport.graph import schemas as onnx_schemas

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
    with pytest.raises(ImportError, match=r"^No module named 'rich'$") as raised:
        cli._app(["run"])
    assert raised.value.name == "rich"


@pytest.mark.parametrize("argv, code", [
    (["--version"], 0), (["--max-bytes", "1G", "--version"], 0),
    (["run", "--version"], 4), (["--", "--version"], 4), (["--", "--version", "--"], 4),
])
def test_without_typer_the_version_is_printed_and_anything_else_names_the_extra(monkeypatch, capsys, argv, code):
    import policyport
    import policyport.cli as cli

    def no_typer(argv=None):
        raise ImportError("No module named 'typer'", name="typer")

    monkeypatch.setattr(cli, "_app", no_typer)
    monkeypatch.setattr(sys, "argv", ["policyport", *argv])
    with pytest.raises(SystemExit) as ended:
        cli.main()
    printed = capsys.readouterr()
    assert ended.value.code == code
    if code == 0:
        assert (printed.out, printed.err) == (f"policyport {policyport.__version__}\n", "")
    else:
        assert printed.out == "" and printed.err.startswith("error: the policyport command needs the Python "
                                                            "package 'typer', which is not installed; install it with")


def test_an_import_error_of_another_package_is_not_taken_for_a_missing_extra(monkeypatch):
    import policyport.cli as cli

    def broken(argv=None):
        raise ImportError("cannot import name 'x' from 'numpy'", name="numpy")

    monkeypatch.setattr(cli, "_app", broken)
    monkeypatch.setattr(sys, "argv", ["policyport", "--version"])
    with pytest.raises(ImportError, match="from 'numpy'"):
        cli.main()


@pytest.fixture
def fake_profiles(monkeypatch):
    """profile_numpy / profile_onnxruntime replaced by fixed figures; the sessions they were given, kept."""
    import policyport.runtime.profile as profile
    from policyport.runtime.profile import NodeTime, Profile

    given = []

    def numpy_profile(session, feeds):
        given.append(session)
        return Profile("numpy", [NodeTime("gemm_1", "Gemm", "fc_1/linear", 1.5),  # seconds: µs to the last digit
                                 NodeTime("tanh_1", "Tanh", "fc_1/tanh", 0.5),
                                 NodeTime("unnamed", "Identity", "", 0.5)], 2.75, 7, ["per node: a", "run: b"])

    def onnxruntime_profile(session, feeds):
        given.append(session)
        return Profile("onnxruntime", [NodeTime("fused gemm_1", "FusedGemm", "fc_1/linear", 2.0),
                                       NodeTime("cast_9", "Cast", "", 0.5)], 1.2345, 11, ["kernel time"])

    monkeypatch.setattr(profile, "profile_numpy", numpy_profile)
    monkeypatch.setattr(profile, "profile_onnxruntime", onnxruntime_profile)
    return given


def _rows(stdout: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("│")[1:-1]] for line in stdout.splitlines() if line.startswith("│")]


def test_the_profile_table_joins_both_backends_node_by_node(converted, big_obs, fake_profiles):
    result = invoke("run", converted, "-i", big_obs, "--profile", "--outputs", "logits", "--threads", 1)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "where the time goes: 2,100 rows"
    assert [c.strip() for c in lines[2].split("┃")[1:-1]] == ["tensor", "op", "numpy µs", "numpy %", "onnxruntime µs",
                                                              "onnxruntime %"]
    figures = [line.split("│")[3:-1] for line in lines if line.startswith("│")]
    assert all(c[1:-1] == c[1:-1].strip().rjust(len(c) - 2) for row in figures for c in row)  # right-justified
    assert _rows(result.stdout) == [
        ["fc_1/linear", "Gemm / FusedGemm", "1,500,000.0", "60.0", "2,000,000.0", "80.0"],
        ["fc_1/tanh", "Tanh", "500,000.0", "20.0", "", ""],
        ["unnamed", "Identity", "500,000.0", "20.0", "", ""],
        ["cast_9", "Cast", "", "", "500,000.0", "20.0"],
        ["nodes, added up", "", "2,500,000.0", "100.0", "2,500,000.0", "100.0"]]
    assert result.stderr.splitlines() == ["numpy: run 2,750,000.0 µs (median of 7 runs); per node: a; run: b",
                                          "onnxruntime: run 1,234,500.0 µs (median of 11 runs); kernel time"]
    numpy_session, ort_session = fake_profiles
    assert (numpy_session.backend.name, ort_session.backend.name) == ("numpy", "onnxruntime")
    for session in fake_profiles:  # both on the graph pruned to --outputs, with --threads
        assert [v.name for v in session.outputs] == ["logits"] and session.backend.threads == 1
    fake_profiles.clear()
    assert invoke("run", converted, "-i", big_obs, "--profile", "--threads", 2).exit_code == 0
    assert [v.name for v in fake_profiles[1].outputs] == ["logits", "action", "log_std"]
    assert fake_profiles[1].backend.threads == 2


def test_the_profile_without_onnxruntime_shows_the_numpy_figures_and_says_why(converted, big_obs, fake_profiles,
                                                                              monkeypatch):
    import policyport.runtime as runtime
    from policyport.errors import MissingDependencyError

    load = runtime.load

    def numpy_only(model, backend="numpy", **kwargs):
        if backend == "onnxruntime":
            raise MissingDependencyError("onnxruntime", "onnx", "the onnxruntime backend")
        return load(model, backend, **kwargs)

    monkeypatch.setattr(runtime, "load", numpy_only)
    result = invoke("run", converted, "-i", big_obs, "--profile")
    assert result.exit_code == 0, result.output
    assert _rows(result.stdout)[-1] == ["nodes, added up", "", "2,500,000.0", "100.0"]
    assert result.stderr.splitlines()[0] == (
        "onnxruntime's figures are left out: the onnxruntime backend needs the Python package 'onnxruntime', which "
        "is not installed; install it with: pip install 'policyport[onnx]'")


def test_profile_refuses_overrides(converted, big_obs, tmp_path):
    for steering in (["--override", "fc_2/tanh[0]=1"], ["--override", "fc_2/tanh[0]=1", "-o", tmp_path / "y.npz"]):
        result = invoke("run", converted, "-i", big_obs, "--profile", *steering)
        assert result.exit_code == 2
        assert "Invalid value for --profile: --profile times the model as it is; leave out --override/--steer" in \
            " ".join(result.stderr.split())
    assert list(tmp_path.iterdir()) == []
