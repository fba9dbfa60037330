"""The numpy-only hand-off: pack the real MetaDrive expert into a folder, check every file, load and
verify it, and run it in a child interpreter that can import numpy and nothing else."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

import policyport as pp
from policyport.handoff import pack as packing
from policyport.handoff import golden as reader
from policyport.runtime.packed import SOURCES_KEY, load_graph
from policyport.graph.model import from_onnx
from policyport.verification.verify import sample_inputs

ROOT = Path(__file__).parents[1]
EXPERT = ROOT / "fixtures/real/metadrive_ppo_expert.npz"
CHECK_SCRIPT = Path(__file__).with_name("numpy_only_check.py")
BUNDLE_FILES = {"model.onnx", "graph.json", "weights.npz", "constants.npz", "golden.npz", "policy.json"}
RUNTIME = {"run.py", "_policyport"}
NODE_ORDER = ["fc_1/linear", "fc_1/tanh", "fc_2/linear", "fc_2/tanh", "logits", "action", "log_std"]

pytestmark = pytest.mark.usefixtures("strict_numpy")


@pytest.fixture(scope="module")
def model():
    return pp.convert(EXPERT, activation="tanh", head="diag-gaussian")


@pytest.fixture(scope="module")
def source_weights() -> dict[str, np.ndarray]:
    with np.load(EXPERT) as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module")
def packed(model, tmp_path_factory) -> Path:
    """A bundle of the expert that no test modifies (tests that tamper work on a copy)."""
    return pp.pack(model, tmp_path_factory.mktemp("packed") / "expert", source=EXPERT)


@pytest.fixture
def copy(packed, tmp_path) -> Path:
    return Path(shutil.copytree(packed, tmp_path / "expert"))


def read_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def rewrite_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    packing.write_npz(path, arrays)


def reseal(directory: Path, name: str) -> None:
    """Record a changed file's new sha256 in policy.json, as a careless editor would."""
    policy = json.loads((directory / "policy.json").read_text())
    policy["files"][name] = hashlib.sha256((directory / name).read_bytes()).hexdigest()
    (directory / "policy.json").write_text(json.dumps(policy))


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


# ------------------------------------------------------------------------------------------- files


def test_pack_writes_every_file_and_policy_json_holds_their_sha256(packed, model):
    assert {p.name for p in packed.iterdir()} == BUNDLE_FILES | RUNTIME
    policy = json.loads((packed / "policy.json").read_text())
    on_disk = {str(p.relative_to(packed)) for p in packed.rglob("*") if p.is_file()}
    assert set(policy["files"]) == on_disk - {"policy.json"}
    assert BUNDLE_FILES - {"policy.json"} <= set(policy["files"])
    for name, digest in policy["files"].items():
        assert hashlib.sha256((packed / name).read_bytes()).hexdigest() == digest, name
    assert (packed / "model.onnx").read_bytes() == model.SerializeToString()
    assert siblings(packed) == ["expert"]  # no temporary folder left beside it


def test_weights_npz_is_the_source_npz_bit_for_bit(packed, source_weights):
    weights = read_npz(packed / "weights.npz")
    assert list(weights) == list(source_weights)
    for key, want in source_weights.items():
        assert same_bits(weights[key], want), key


def test_constants_npz_holds_the_head_slice_bounds_and_graph_json_says_where_each_initializer_lives(packed, model):
    constants = read_npz(packed / "constants.npz")
    assert sorted(constants) == ["head/axes", "head/end", "head/mid", "head/zero"]
    assert all(a.dtype == np.int64 for a in constants.values())
    assert constants["head/mid"].tolist() == [2] and constants["head/end"].tolist() == [4]
    doc = json.loads((packed / "graph.json").read_text())
    sources = doc[SOURCES_KEY]
    assert list(sources) == [t.name for t in model.graph.initializer]
    assert sources["default_policy/fc_1/kernel"] == {
        "file": "weights.npz", "key": "default_policy/fc_1/kernel", "transpose": None}
    assert sources["head/mid"] == {"file": "constants.npz", "key": "head/mid", "transpose": None}
    assert doc["format"] == "policyport.graph/1"  # still a plain policyport graph


def test_policy_json_fields(model, tmp_path):
    before = datetime.now(timezone.utc).replace(microsecond=0)
    out = pp.pack(model, tmp_path / "b", samples=16, low=-1.0, high=2.0, seed=7)
    after = datetime.now(timezone.utc)
    policy = json.loads((out / "policy.json").read_text())
    assert policy["format"] == "policyport.bundle/1"
    assert policy["inputs"] == [{"name": "obs", "dtype": "float32", "shape": ["batch", 275]}]
    assert policy["outputs"] == [
        {"name": "logits", "dtype": "float32", "shape": ["batch", 4]},
        {"name": "action", "dtype": "float32", "shape": ["batch", 2]},
        {"name": "log_std", "dtype": "float32", "shape": ["batch", 2]},
    ]
    assert policy["head"] == "diag-gaussian"
    assert "observation_filter" in policy and policy["observation_filter"] is None
    prov = policy["provenance"]
    assert prov["source"]["kind"] == "npz"
    assert prov["source"]["sha256"] == hashlib.sha256(EXPERT.read_bytes()).hexdigest()
    assert prov["activation"] == "tanh"
    assert prov["policyport_version"] == pp.__version__
    assert prov["opset"] == 17 == model.opset_import[0].version
    created = datetime.fromisoformat(prov["created_utc"])
    assert created.utcoffset() == timedelta(0) and before <= created <= after
    golden = policy["golden"]
    assert (golden["samples"], golden["low"], golden["high"], golden["seed"]) == (16, -1.0, 2.0, 7)
    obs = read_npz(out / "golden.npz")["inputs/obs"]
    assert obs.shape == (16, 275) and -1.0 <= obs.min() and obs.max() < 2.0 and obs.min() < 0.0
    parity = policy["parity"]
    assert 0.0 <= parity["onnxruntime_vs_numpy_max_abs"] <= 1e-5
    assert parity["tensors"] == len(NODE_ORDER) and parity["passed"] is True
    assert parity["source_vs_numpy_max_abs"] is None  # no source given to this pack


def test_policy_json_says_what_the_graph_of_an_sb3_box_policy_holds(tmp_path):
    """The head SB3's action space gave (the clipped Gaussian mean, with log_std) and the VecNormalize
    statistics baked in, not "none" and null."""
    pytest.importorskip("torch")
    zip_path = ROOT / "fixtures/sb3/ppo_pendulum_vecnorm.zip"
    model = pp.convert(zip_path)
    out = pp.pack(model, tmp_path / "pendulum", samples=8, low=-8.0, high=8.0, source=zip_path)
    policy = json.loads((out / "policy.json").read_text())
    assert [o["name"] for o in policy["outputs"]] == ["logits", "action", "log_std"]
    assert policy["head"] == "clipped-diag-gaussian"
    statistics = pp.extract_weights(model)
    assert policy["observation_filter"]["type"] == "VecNormalize"
    assert policy["observation_filter"]["mean"] == statistics["obs_rms.mean"].tolist()
    assert policy["observation_filter"]["var"] == statistics["obs_rms.var"].tolist()


def test_pack_with_the_source_records_its_parity(packed):
    parity = json.loads((packed / "policy.json").read_text())["parity"]
    assert parity["source_vs_numpy_max_abs"] is not None and parity["source_vs_numpy_max_abs"] <= 1e-5


def test_golden_npz_matches_a_fresh_numpy_run(packed, model):
    golden = read_npz(packed / "golden.npz")
    groups = {}
    for key in golden:
        group, _, tensor = key.partition("/")
        groups.setdefault(group, []).append(tensor)
    assert groups == {"inputs": ["obs"], "outputs": ["logits", "action", "log_std"], "activations": NODE_ORDER}
    obs = sample_inputs(from_onnx(model).inputs, 64, 0.0, 1.0, 0)["obs"]
    assert same_bits(golden["inputs/obs"], obs)
    session = pp.load(model, backend="numpy")
    for name, value in session.run({"obs": obs}).items():
        assert same_bits(golden[f"outputs/{name}"], value), name
    for name, value in session.record({"obs": obs}, "*").items():
        assert same_bits(golden[f"activations/{name}"], value), name
    assert reader.read_golden(packed)["activations"].keys() == set(NODE_ORDER)


# -------------------------------------------------------------------------------------------- load


def test_load_graph_rebuilds_the_model_graph_exactly(packed, model):
    want = from_onnx(model)
    got = load_graph(packed)
    assert got.to_json() == want.to_json()
    assert list(got.initializers) == list(want.initializers)
    for name, array in want.initializers.items():
        assert same_bits(got.initializers[name], array), name


@pytest.mark.parametrize("backend", list(pp.BACKENDS))
def test_load_a_folder_on_each_backend(packed, model, backend):
    obs = read_npz(packed / "golden.npz")["inputs/obs"]
    got = pp.load(packed, backend=backend).run({"obs": obs})
    want = pp.load(model, backend=backend).run({"obs": obs})
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_tampered_weights_are_refused_on_load(copy):
    weights = read_npz(copy / "weights.npz")
    weights["default_policy/fc_2/kernel"][0, 0] += 1.0
    rewrite_npz(copy / "weights.npz", weights)
    with pytest.raises(pp.BadModelError, match=r"weights\.npz: its content differs from the sha256 policy\.json "
                                               r"records; the file was changed or damaged after packing") as caught:
        pp.load(copy, backend="numpy")
    found = hashlib.sha256((copy / "weights.npz").read_bytes()).hexdigest()
    assert found not in str(caught.value)  # the digest of what was found is never shown


@pytest.mark.parametrize("name", sorted(BUNDLE_FILES - {"policy.json"}) + ["run.py", "_policyport/runtime/numpy/plan.py"])
def test_any_changed_file_is_named_on_load(copy, name):
    data = bytearray((copy / name).read_bytes())
    data[-1] ^= 0xFF
    (copy / name).write_bytes(bytes(data))
    with pytest.raises(pp.BadModelError, match=rf"{name}: its content differs from the sha256"):
        load_graph(copy)


def test_a_listed_file_that_is_missing_is_named(copy):
    (copy / "constants.npz").unlink()
    with pytest.raises(pp.BadModelError, match=r"lists constants\.npz, which is missing"):
        load_graph(copy)


def test_not_a_bundle(tmp_path, copy):
    with pytest.raises(pp.UnreadableFileError, match="no such folder"):
        load_graph(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(pp.UnreadableFileError, match=r"empty is a folder without policy.json, so not one written by "
                                                     r"policyport pack; expected an \.onnx model or a folder written by "
                                                     r"policyport pack$"):
        load_graph(tmp_path / "empty")
    policy = json.loads((copy / "policy.json").read_text())
    policy["format"] = "policyport.bundle/99"
    (copy / "policy.json").write_text(json.dumps(policy))
    with pytest.raises(pp.BadModelError, match=r"expected format 'policyport.bundle/1', found 'policyport.bundle/99'"):
        load_graph(copy)


def test_a_file_name_outside_the_folder_is_refused(copy):
    policy = json.loads((copy / "policy.json").read_text())
    policy["files"]["../secret"] = "0" * 64
    (copy / "policy.json").write_text(json.dumps(policy))
    with pytest.raises(pp.BadModelError, match=r"'\.\./secret' is not a file of the bundle format"):
        load_graph(copy)


# ------------------------------------------------------------------------------------------ verify


def test_verify_bundle_passes_on_a_fresh_bundle(packed):
    report = reader.verify_bundle(packed)
    assert report.passed and report.first_divergence is None
    assert report.backends == ["numpy"] and report.reference == "golden" and report.samples == 64
    assert [c.tensor for c in report.comparisons] == NODE_ORDER  # one per tensor, in node order
    assert {(c.candidate, c.reference) for c in report.comparisons} == {("numpy", "golden")}
    assert report.worst() == 0.0  # same machine, same numpy: bit for bit


def test_verify_bundle_names_the_first_perturbed_activation(copy):
    golden = read_npz(copy / "golden.npz")
    golden["activations/fc_2/linear"][3, 17] += np.float32(1e-3)
    rewrite_npz(copy / "golden.npz", golden)
    with pytest.raises(pp.BadModelError, match=r"golden\.npz: its content differs"):
        reader.verify_bundle(copy)  # the hash catches it first ...
    reseal(copy, "golden.npz")
    report = reader.verify_bundle(copy)  # ... and the comparison when the hash is updated too
    assert not report.passed
    first = report.first_divergence
    assert first.tensor == "fc_2/linear" and first.candidate == "numpy" and first.reference == "golden"
    assert first.max_abs == pytest.approx(1e-3, rel=1e-3)
    assert [c.tensor for c in report.comparisons if not c.passed] == ["fc_2/linear"]
    assert report.to_dict()["first_divergence"]["tensor"] == "fc_2/linear"


def test_verify_bundle_checks_the_run_outputs_as_well_as_the_recorded_ones(copy):
    golden = read_npz(copy / "golden.npz")
    golden["outputs/action"][0, 1] -= np.float32(0.5)  # activations/action is left as it was
    rewrite_npz(copy / "golden.npz", golden)
    reseal(copy, "golden.npz")
    report = reader.verify_bundle(copy)
    assert [c.tensor for c in report.comparisons] == NODE_ORDER
    assert [c.tensor for c in report.comparisons if not c.passed] == ["action"]
    assert report.first_divergence.max_abs == pytest.approx(0.5, rel=1e-6)


def test_verify_bundle_refuses_a_golden_file_of_another_graph(copy):
    golden = read_npz(copy / "golden.npz")
    del golden["activations/fc_1/tanh"]
    rewrite_npz(copy / "golden.npz", golden)
    reseal(copy, "golden.npz")
    with pytest.raises(pp.BadModelError, match=r"expected activations/ keys for .*'fc_1/tanh'"):
        reader.verify_bundle(copy)


# ---------------------------------------------------------------------------------- atomic writing


def test_an_existing_folder_is_refused_without_force_and_left_intact(model, tmp_path):
    out = tmp_path / "b"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(pp.OutputExistsError, match=r"b exists; overwrite it with --force"):
        pp.pack(model, out)
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    with pytest.raises(pp.OutputExistsError, match="not a policyport bundle"):
        pp.pack(model, out, force=True)  # force replaces bundles and empty folders only
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    (tmp_path / "f").write_text("x")
    with pytest.raises(pp.OutputExistsError, match="is not a plain folder"):
        pp.pack(model, tmp_path / "f", force=True)
    assert siblings(out) == ["b", "f"]


def test_force_replaces_a_bundle_once_the_new_one_is_complete(model, tmp_path):
    out = pp.pack(model, tmp_path / "b", seed=1)
    pp.pack(model, out, seed=2, force=True)
    assert json.loads((out / "policy.json").read_text())["golden"]["seed"] == 2
    assert reader.verify_bundle(out).passed
    assert siblings(out) == ["b"]


def test_a_failure_while_writing_leaves_no_folder(model, tmp_path, monkeypatch):
    real = packing.write_npz

    def failing(file, arrays):
        if any(key.startswith("inputs/") for key in arrays):  # golden.npz, the last written
            raise OSError(28, "No space left on device")
        real(file, arrays)

    monkeypatch.setattr(packing, "write_npz", failing)
    with pytest.raises(pp.UnreadableFileError, match="No space left on device"):
        pp.pack(model, tmp_path / "b")
    assert list(tmp_path.iterdir()) == []


def test_a_failure_while_replacing_leaves_the_old_bundle(model, tmp_path, monkeypatch):
    out = pp.pack(model, tmp_path / "b", seed=1)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    monkeypatch.setattr(packing, "_check_round_trip", lambda *a: (_ for _ in ()).throw(pp.BadModelError("boom")))
    with pytest.raises(pp.BadModelError, match="boom"):
        pp.pack(model, out, seed=2, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert siblings(out) == ["b"]


def test_pack_refuses_what_is_not_a_model(tmp_path):
    with pytest.raises(pp.BadModelError, match="expected an onnx.ModelProto or a path to an .onnx file, got dict"):
        pp.pack({}, tmp_path / "b")
    with pytest.raises(pp.UnreadableFileError, match="does not exist"):
        pp.pack({}, tmp_path / "missing" / "b")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ layouts the expert does not use


def _variant(model, *, transpose_fc_1: bool = False, rename: dict[str, str] | None = None):
    """The expert with fc_1's kernel stored [out, in] (Gemm transB=1, as a torch weight would be),
    and/or source parameters renamed."""
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    props = {p.key: p for p in m.metadata_props}
    params = json.loads(props["policyport.parameters"].value)
    if transpose_fc_1:
        init = next(t for t in m.graph.initializer if t.name == "default_policy/fc_1/kernel")
        init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(init).T), init.name))
        node = next(n for n in m.graph.node if n.name == "fc_1/linear")
        kept = [a for a in node.attribute if a.name != "transB"]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("transB", 1)])
        params["default_policy/fc_1/kernel"] = {"name": "default_policy/fc_1/kernel", "transpose": [1, 0]}
    for init_name, source_name in (rename or {}).items():
        params[init_name] = source_name
    props["policyport.parameters"].value = json.dumps(params)
    return m


def test_a_transposed_parameter_is_stored_in_the_source_layout_and_rebuilt_exactly(model, source_weights, tmp_path):
    variant = _variant(model, transpose_fc_1=True)
    out = pp.pack(variant, tmp_path / "b")
    weights = read_npz(out / "weights.npz")
    assert same_bits(weights["default_policy/fc_1/kernel"], source_weights["default_policy/fc_1/kernel"])  # (275, 256)
    doc = json.loads((out / "graph.json").read_text())
    assert doc[SOURCES_KEY]["default_policy/fc_1/kernel"]["transpose"] == [1, 0]
    graph = load_graph(out)
    assert graph.initializers["default_policy/fc_1/kernel"].shape == (256, 275)
    assert same_bits(graph.initializers["default_policy/fc_1/kernel"], from_onnx(variant).initializers["default_policy/fc_1/kernel"])
    assert reader.verify_bundle(out).passed
    obs = read_npz(out / "golden.npz")["inputs/obs"]
    want = pp.load(model, backend="onnxruntime").run({"obs": obs})
    got = pp.load(out, backend="numpy").run({"obs": obs})
    assert max(float(np.abs(got[k] - want[k]).max()) for k in want) <= 1e-5


def test_parameter_names_that_collide_with_numpy_savez_arguments_survive(model, tmp_path):
    variant = _variant(model, rename={"default_policy/fc_1/bias": "file", "default_policy/fc_2/bias": "allow_pickle"})
    out = pp.pack(variant, tmp_path / "b")
    weights = read_npz(out / "weights.npz")
    assert {"file", "allow_pickle"} <= set(weights) and weights["file"].shape == (256,)
    assert reader.verify_bundle(out).passed


# ---------------------------------------------------------------------------------- numpy only


def _numpy_only_sandbox(folder: Path) -> Path:
    """A folder holding only symlinks to the installed numpy (and its bundled libraries) and to
    the repository's policyport package."""
    folder.mkdir()
    numpy_dir = Path(np.__file__).resolve().parent
    (folder / "numpy").symlink_to(numpy_dir, target_is_directory=True)
    libs = numpy_dir.with_name("numpy.libs")
    if libs.is_dir():
        (folder / "numpy.libs").symlink_to(libs, target_is_directory=True)
    (folder / "policyport").symlink_to(ROOT / "policyport", target_is_directory=True)
    return folder


def test_the_packed_expert_runs_where_only_numpy_can_be_imported(packed, model, tmp_path):
    # The modules the child must not reach are importable here, so their absence there means something.
    for name in ("onnx", "google.protobuf", "onnxruntime", "typer", "rich"):
        assert importlib.util.find_spec(name) is not None, name
    sandbox = _numpy_only_sandbox(tmp_path / "sandbox")
    out = tmp_path / "outputs.npz"
    # -S: no site, so site-packages are not on sys.path; -I: ignore PYTHON* variables and the script's folder.
    child = subprocess.run(
        [sys.executable, "-S", "-I", str(CHECK_SCRIPT), str(sandbox), str(packed), str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout)
    assert result["blocked"] == {n: True for n in ("onnx", "google.protobuf", "onnxruntime", "typer", "rich",
                                                   "torch", "tensorflow")}
    assert result["forbidden_loaded"] == []
    assert result["third_party"] == ["numpy", "policyport"]  # everything else came from the standard library
    assert result["policyport_file"] == os.path.realpath(ROOT / "policyport" / "__init__.py")
    assert result["numpy_file"] == os.path.realpath(np.__file__)
    assert not any("site-packages" in p for p in result["sys_path"])
    assert result["verify_passed"] is True and result["first_divergence"] is None

    got = read_npz(out)
    obs = read_npz(packed / "golden.npz")["inputs/obs"]
    want = pp.load(model, backend="onnxruntime").run({"obs": obs})
    assert sorted(got) == sorted(f"outputs/{k}" for k in want)
    for name, value in want.items():
        assert got[f"outputs/{name}"].dtype == np.float32
        assert float(np.abs(got[f"outputs/{name}"] - value).max()) <= 1e-5, name


def test_pack_is_exported_lazily():
    assert pp.pack is packing.pack


def test_pack_refuses_when_numpy_and_onnxruntime_disagree(model, tmp_path, monkeypatch):
    from policyport.runtime.numpy import registry

    registry.supported_ops()  # the registry is filled on first use
    versions = dict(registry._REGISTRY[("", "Tanh")])
    wrong = {v: registry.OpImpl("Tanh", v, lambda x: np.tanh(x) + np.float32(2e-4)) for v in versions}
    monkeypatch.setitem(registry._REGISTRY, ("", "Tanh"), wrong)
    with pytest.raises(pp.VerificationError, match=r"first diverging tensor 'fc_1/tanh' \(float32, onnxruntime vs "
                       r"numpy\), max abs 0\.0002\d* > atol 1e-05 .* and not float32 rounding .* pack with --atol/--rtol"):
        pp.pack(model, tmp_path / "expert")
    assert list(tmp_path.iterdir()) == []
    folder = pp.pack(model, tmp_path / "loose", atol=1e-2)  # the option the message suggests
    parity = json.loads((folder / "policy.json").read_text())["parity"]
    assert parity["passed"] and parity["atol"] == 1e-2 and parity["rtol"] is None
    assert parity["tolerances"] == {"float32": {"atol": 1e-2, "rtol": 1e-5}}


def test_pack_says_when_it_is_the_source_that_disagrees(model, source_weights, tmp_path):
    perturbed = dict(source_weights)
    perturbed["default_policy/fc_2/bias"] = perturbed["default_policy/fc_2/bias"] + np.float32(1e-2)
    np.savez(tmp_path / "perturbed.npz", **perturbed)
    with pytest.raises(pp.VerificationError, match=r"the source disagrees with the numpy backend on the golden "
                                                    r"observations; first diverging tensor 'fc_2/linear'"):
        pp.pack(model, tmp_path / "b", source=tmp_path / "perturbed.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["perturbed.npz"]
