"""A packed folder that runs itself: copied alone to a machine with Python and numpy only, its run.py
runs and re-verifies the policy, other programs import it by path, and what it carries is the numpy
runtime and nothing more."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import policyport as pp
from policyport.handoff import pack as packing
from policyport.graph import folder as fmt
from numpy_venv import ABSENT, make_venv, run

ROOT = Path(__file__).parents[1]
EXPERT = ROOT / "fixtures/real/metadrive_ppo_expert.npz"
NODE_ORDER = ["fc_1/linear", "fc_1/tanh", "fc_2/linear", "fc_2/tanh", "logits", "action", "log_std"]
#: Modules the runtime must never import, by top-level name, and policyport modules it must not carry.
FORBIDDEN_TOP = {"onnx", "onnxruntime", "google", "typer", "rich", "click", "torch", "tensorflow", "tf2onnx", "ray"}
NOT_CARRIED = {"verification/verify.py", "handoff/pack.py", "graph/passes.py", "verification/summary.py",
               "handoff/export_numpy.py", "runtime/ort.py", "runtime/expose.py"}


@pytest.fixture(scope="module")
def model(metadrive_model):
    return metadrive_model


@pytest.fixture(scope="module")
def packed(model, tmp_path_factory) -> Path:
    return pp.pack(model, tmp_path_factory.mktemp("handoff") / "metadrive_bundle", samples=16)


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """The python of a fresh venv holding numpy alone."""
    return make_venv(tmp_path_factory.mktemp("target") / "venv")


@pytest.fixture
def copied(packed, tmp_path) -> Path:
    """The folder as a user copies it to the target (copytree, as cp -r or scp -r would)."""
    return Path(shutil.copytree(packed, tmp_path / "metadrive_bundle"))


@pytest.fixture(scope="module")
def obs() -> np.ndarray:
    return np.random.default_rng(11).uniform(0, 1, (50, 275)).astype(np.float32)


def read_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def test_the_target_venv_has_numpy_and_nothing_else(target):
    probe = "import importlib.util as u, json; print(json.dumps({m: u.find_spec(m.split('.')[0]) is not None for m in %r}))"
    found = json.loads(run(target, "-c", probe % (ABSENT + ("numpy",),)).stdout)
    assert found == {**{m: False for m in ABSENT}, "numpy": True}


# -------------------------------------------------------------------------------------- run.py


def test_run_py_verifies_the_copied_folder_where_only_numpy_exists(target, copied):
    before = tree(copied)
    result = run(target, copied / "run.py", "--verify")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "max abs error on 16 observations (atol 1e-05, rtol 1e-05)"
    assert [line.split()[0] for line in lines[2:9]] == NODE_ORDER
    assert lines[9:-1] == ASSUMED  # what the model rests on, as policyport verify prints it
    assert lines[-1] == ("PASS: 7 comparisons within atol 1e-05, rtol 1e-05; "
                         "worst 0 on fc_1/linear (numpy vs golden)")
    assert tree(copied) == before  # nothing written into the folder (no __pycache__)


#: What the expert, converted from its .npz with --activation tanh --head diag-gaussian, assumes.
ASSUMED = [
    "the model assumes (not in its source file):",
    "  activation tanh at fc_1 and fc_2: given by --activation; an .npz of weights does not record it, and RLlib's "
    "FullyConnectedNetwork uses one fcnet_activation for every hidden layer; --activation names another",
    "  head diagonal Gaussian, fc_out = [mean (2, the action), log_std (2)]: given by --head; RLlib's DiagGaussian "
    "splits its inputs so (ray/rllib/models/tf/tf_action_dist.py); --head none exports fc_out alone",
    "  observation normalisation none: an .npz of weights holds no normaliser statistics (RLlib keeps a "
    "MeanStdFilter's in the checkpoint); convert the RLlib checkpoint to bake its filter in",
]


def test_run_py_verify_names_the_assumptions_as_policyport_verify_does(packed):
    from policyport.cli import app
    from typer.testing import CliRunner

    printed = CliRunner().invoke(app, ["verify", str(packed)], env={"COLUMNS": "300"})
    assert printed.exit_code == 0, printed.output
    lines = printed.stdout.splitlines()
    assert lines[lines.index(ASSUMED[0]):-1] == ASSUMED


def test_run_py_runs_bit_identical_to_the_numpy_backend_and_close_to_onnxruntime(target, copied, model, obs, tmp_path):
    np.save(tmp_path / "obs.npy", obs)
    result = run(target, copied / "run.py", "-i", "obs.npy", "-o", "actions.npz", "--record", "acts.npz",
                 "--tensors", "fc_2/*", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "numpy: outputs written to actions.npz, 5 tensors to acts.npz"
    actions, acts = read_npz(tmp_path / "actions.npz"), read_npz(tmp_path / "acts.npz")
    here = pp.load(model, backend="numpy")
    want = here.run({"obs": obs})
    assert list(actions) == ["logits", "action", "log_std"]
    for name, value in want.items():
        assert actions[name].dtype == value.dtype and actions[name].tobytes() == value.tobytes(), name
    recorded = here.record({"obs": obs}, "fc_2/*")
    assert list(acts) == list(recorded) == ["fc_2/linear", "fc_2/tanh", "logits", "action", "log_std"]
    assert all(acts[k].tobytes() == recorded[k].tobytes() for k in recorded)
    ort = pp.load(model, backend="onnxruntime").run({"obs": obs})
    assert max(float(np.abs(actions[k] - ort[k]).max()) for k in ort) <= 1e-5


def test_run_py_exit_codes(target, copied, tmp_path):
    np.save(tmp_path / "obs.npy", np.zeros((2, 275), np.float32))
    np.save(tmp_path / "bad.npy", np.zeros((2, 274), np.float32))
    usage = run(target, copied / "run.py", "-i", tmp_path / "obs.npy")
    assert usage.returncode == 2 and "give -i INPUT and -o OUTPUT" in usage.stderr
    mixed = run(target, copied / "run.py", "--verify", "-o", "x.npz")
    assert mixed.returncode == 2 and "-o does not apply" in mixed.stderr
    bad = run(target, copied / "run.py", "-i", tmp_path / "bad.npy", "-o", tmp_path / "y.npz")
    assert bad.returncode == 3
    assert bad.stderr == ("error: input 'obs' expects shape (batch, 275), got (2, 274) (axis 1 is 274, the model "
                          "needs 275)\n")
    (tmp_path / "y.npz").write_bytes(b"mine")
    exists = run(target, copied / "run.py", "-i", tmp_path / "obs.npy", "-o", tmp_path / "y.npz")
    assert exists.returncode == 3 and "exists; overwrite it with --force" in exists.stderr
    assert (tmp_path / "y.npz").read_bytes() == b"mine"
    inside = run(target, copied / "run.py", "-i", tmp_path / "obs.npy", "-o", copied / "y.npz")
    assert inside.returncode == 3 and "is inside the packed folder" in inside.stderr
    assert not (copied / "y.npz").exists() and "Traceback" not in bad.stderr + exists.stderr + inside.stderr


def test_run_py_has_the_max_bytes_option_its_messages_suggest(target, copied, tmp_path):
    np.save(tmp_path / "obs.npy", np.zeros((2, 275), np.float32))  # 2,200 bytes
    small = run(target, copied / "run.py", "-i", tmp_path / "obs.npy", "-o", tmp_path / "y.npz", "--max-bytes", "1K")
    assert small.returncode == 3 and not (tmp_path / "y.npz").exists()
    assert "would take 2.15 KiB (2,200 bytes), above the limit of 1 KiB" in small.stderr
    suggested = small.stderr.split("raise the limit with --max-bytes ")[1].split()[0]
    raised = run(target, copied / "run.py", "-i", tmp_path / "obs.npy", "-o", tmp_path / "y.npz", "--max-bytes", suggested)
    assert raised.returncode == 0, raised.stderr
    bad = run(target, copied / "run.py", "--verify", "--max-bytes", "lots")
    assert bad.returncode == 2 and "--max-bytes: 'lots' is not a size" in bad.stderr


def test_run_py_refuses_a_tampered_folder_and_fails_a_changed_golden_file(target, copied):
    weights = read_npz(copied / "weights.npz")
    weights["default_policy/fc_1/bias"][0] += 1
    packing.write_npz(copied / "weights.npz", weights)
    result = run(target, copied / "run.py", "--verify")
    assert result.returncode == 3
    assert result.stderr.endswith("weights.npz: its content differs from the sha256 policy.json records; the file "
                                  "was changed or damaged after packing — restore the file, or pack the model again into a "
                                  "new folder (pack --force replaces only an intact bundle)\n")


def test_run_py_verify_exits_1_when_the_golden_data_disagrees(target, copied):
    golden = read_npz(copied / "golden.npz")
    golden["activations/fc_2/tanh"][0, 3] += np.float32(0.01)
    packing.write_npz(copied / "golden.npz", golden)
    policy = json.loads((copied / "policy.json").read_text())
    policy["files"]["golden.npz"] = hashlib.sha256((copied / "golden.npz").read_bytes()).hexdigest()
    (copied / "policy.json").write_text(json.dumps(policy))
    result = run(target, copied / "run.py", "--verify", "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["passed"] is False and report["first_divergence"]["tensor"] == "fc_2/tanh"


def test_run_py_without_numpy_says_what_to_install(copied, tmp_path):
    bare = make_venv(tmp_path / "bare", numpy=False)
    result = run(bare, copied / "run.py", "--verify")
    assert result.returncode == 4
    assert result.stderr == "error: this policy needs numpy, which is not installed; install it with: pip install numpy\n"


def test_a_broken_runtime_file_is_named_not_a_traceback(target, copied):
    (copied / "_policyport" / "io" / "schema.py").write_text("def broken(:\n")  # part of the check itself
    result = run(target, copied / "run.py", "--verify")
    assert result.returncode == 3 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: cannot import the runtime in _policyport/ (SyntaxError")


PAYLOAD = "import pathlib; pathlib.Path({marker!r}).write_text('ran')\n"


@pytest.mark.parametrize("planted", ["hashlib.py", "numpy.py", "policyport.py", "json/__init__.py",
                                     "_policyport/runtime/shadow.py"])
def test_python_code_planted_in_the_folder_is_never_imported_and_is_refused(target, copied, tmp_path, planted):
    marker = tmp_path / "payload-ran"
    (copied / planted).parent.mkdir(parents=True, exist_ok=True)
    (copied / planted).write_text(PAYLOAD.format(marker=str(marker)))
    for cwd in (None, copied):  # run from elsewhere, and from inside the folder
        result = run(target, copied / "run.py", "--verify", cwd=cwd)
        assert not marker.exists(), f"{planted} was imported"
        assert result.returncode == 3 and "Traceback" not in result.stderr
        assert f"holds Python code that {copied / 'policy.json'} does not list ('{planted}')" in result.stderr
    (copied / planted).unlink()
    if planted == "json/__init__.py":
        (copied / "json").rmdir()
    assert run(target, copied / "run.py", "--verify").returncode == 0


def test_bytecode_planted_for_a_runtime_module_is_never_read(target, copied, tmp_path):
    """An unchecked-hash .pyc in __pycache__ would be run in place of the checked source."""
    import py_compile

    marker = tmp_path / "payload-ran"
    (tmp_path / "errors.py").write_text(PAYLOAD.format(marker=str(marker)))
    tag = run(target, "-c", "import sys; print(sys.implementation.cache_tag)").stdout.strip()
    py_compile.compile(str(tmp_path / "errors.py"), cfile=str(copied / f"_policyport/__pycache__/errors.{tag}.pyc"),
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH, doraise=True)
    result = run(target, copied / "run.py", "--verify")
    assert not marker.exists()
    assert result.returncode == 3 and "does not list ('_policyport/__pycache__', " in result.stderr


def test_run_path_takes_the_folder_off_sys_path_and_never_imports_planted_code(target, copied, tmp_path):
    marker = tmp_path / "payload-ran"
    (copied / "zipfile.py").write_text(PAYLOAD.format(marker=str(marker)))  # zipfile: imported lazily by the runtime
    driver = ("import runpy, sys; sys.path.insert(0, {f!r})\n"
              "try:\n    runpy.run_path({f!r} + '/run.py')['verify']()\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
              "print({f!r} in sys.path)\n").format(f=str(copied))
    result = run(target, "-c", driver, cwd=copied)
    assert not marker.exists()
    assert result.returncode == 0 and result.stdout.startswith("BadModelError")
    assert result.stdout.endswith("False\n")


# --------------------------------------------------------------------------- import by path


DRIVER = """
import importlib.abc, json, runpy, sys
attempts = []
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in FORBIDDEN:
            attempts.append(name)
            raise ImportError("blocked: " + name)
        return None
FORBIDDEN = set(sys.argv[2].split(","))
sys.meta_path.insert(0, Refuse())
import numpy as np
policy = runpy.run_path(sys.argv[1])["load"]()
obs = np.load(sys.argv[3])
outputs = policy.run({"obs": obs})
recorded = policy.record({"obs": obs}, "*")
report = runpy.run_path(sys.argv[1])["verify"]()
np.savez(sys.argv[4], **outputs)
print(json.dumps({"attempts": attempts, "passed": report.passed, "recorded": list(recorded),
                  "modules": sorted({m.split(".")[0] for m in sys.modules}),
                  "session": type(policy).__module__}))
"""


def test_another_program_imports_the_folder_by_path_with_numpy_alone(target, copied, model, obs, tmp_path):
    np.save(tmp_path / "obs.npy", obs)
    (tmp_path / "driver.py").write_text(DRIVER)
    # A "policyport" on the path that must never be imported: the folder's runtime has a private name.
    (tmp_path / "shadow" / "policyport").mkdir(parents=True)
    (tmp_path / "shadow" / "policyport" / "__init__.py").write_text("raise ImportError('the installed policyport was used')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {"PYTHONPATH": str(tmp_path / "shadow")}
    result = run(target, tmp_path / "driver.py", copied / "run.py", ",".join(sorted(FORBIDDEN_TOP)),
                 tmp_path / "obs.npy", tmp_path / "out.npz", env=env)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["attempts"] == [] and doc["passed"] is True and doc["recorded"] == NODE_ORDER
    stdlib = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    third_party = [m for m in doc["modules"] if m not in stdlib and not m.startswith("_")]
    assert third_party == ["numpy"]
    assert doc["session"].startswith("_policyport_") and doc["session"].endswith(".runtime")
    got = read_npz(tmp_path / "out.npz")
    want = pp.load(model, backend="numpy").run({"obs": obs})
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)


def test_an_installed_policyport_reads_the_folder_without_importing_its_code(copied):
    (copied / "_policyport" / "runtime" / "numpy" / "plan.py").write_text("raise SystemExit('ran')\n")
    policy = json.loads((copied / "policy.json").read_text())
    policy["files"]["_policyport/runtime/numpy/plan.py"] = hashlib.sha256(
        (copied / "_policyport/runtime/numpy/plan.py").read_bytes()).hexdigest()
    policy["runtime"]["digest"] = fmt.runtime_digest(policy["files"])
    (copied / "policy.json").write_text(json.dumps(policy))
    assert pp.verify_bundle(copied).passed  # the folder's plan.py was never executed
    assert not any(m.startswith("_policyport") for m in sys.modules)


# ------------------------------------------------------------------------- what it carries


def test_the_runtime_is_the_installed_modules_byte_for_byte_and_nothing_higher(packed):
    sources = packing.runtime_sources()
    root = Path(pp.__file__).parent
    carried = {name.removeprefix("_policyport/") for name in sources}
    assert {"__init__.py", "errors.py", "graph/folder.py", "io/schema.py", "graph/model.py", "verification/compare.py",
            "runtime/packed.py", "handoff/folder_run.py", "handoff/golden.py", "runtime/numpy/plan.py",
            "runtime/numpy/registry.py", "runtime/numpy/ops/tensor.py"} <= carried
    assert not carried & NOT_CARRIED and not any(n.startswith(("cli/", "converter/")) for n in carried)
    for name, data in sources.items():
        assert (root / name.removeprefix("_policyport/")).read_bytes() == data
        assert (packed / name).read_bytes() == data
    policy = json.loads((packed / "policy.json").read_text())
    assert policy["runtime"] == {"package": "_policyport", "entry_point": "run.py", "policyport_version": pp.__version__,
                                 "digest": fmt.runtime_digest(policy["files"]), "requires_python": ">=3.10",
                                 "requires": ["numpy>=1.24"]}


def test_the_runtime_imports_nothing_but_the_standard_library_numpy_and_itself():
    stdlib = set(sys.stdlib_module_names)
    for name, data in packing.runtime_sources().items():
        for node in ast.walk(ast.parse(data, name)):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                tops = [node.module.split(".")[0]]
            else:
                continue
            assert all(t in stdlib or t in ("numpy", "ml_dtypes") for t in tops), f"{name}: imports {tops}"
            assert not FORBIDDEN_TOP & set(tops) and "policyport" not in tops, name


def test_run_py_and_the_folder_check_import_the_standard_library_only(packed):
    """What run.py executes before the check passes (errors, schema, folder) needs no numpy."""
    bootstrap = ["run.py", "_policyport/errors.py", "_policyport/io/__init__.py", "_policyport/io/schema.py",
                 "_policyport/graph/__init__.py", "_policyport/graph/folder.py"]
    for name in bootstrap:
        for node in ast.walk(ast.parse((packed / name).read_bytes())):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "level", 0) == 0:
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert all(n.split(".")[0] in sys.stdlib_module_names for n in names), (name, names)


def test_pack_without_runtime_keeps_the_smaller_folder(model, tmp_path):
    out = pp.pack(model, tmp_path / "b", samples=4, runtime=False)
    assert sorted(p.name for p in out.iterdir()) == sorted([*fmt.DATA_FILES, "policy.json"])
    assert "runtime" not in json.loads((out / "policy.json").read_text())
    assert pp.verify_bundle(out).passed
