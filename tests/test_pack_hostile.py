"""Packed folders that cannot be turned against their reader: sizes checked before anything is
hashed or read, regular files inside the folder only, one integrity check for every reader, a
schema for both JSON documents, and `pack --force` that replaces only what is provably a bundle."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.graph import folder as fmt
from policyport.cli import app
from policyport.io.arrays import write_npz
from policyport.handoff import golden as reader

ROOT = Path(__file__).parents[1]
EXPERT = ROOT / "fixtures/real/metadrive_ppo_expert.npz"
DIGEST = re.compile(r"[0-9a-f]{64}")
runner = CliRunner()


@pytest.fixture(scope="module")
def model(metadrive_model):
    return metadrive_model


@pytest.fixture(scope="module")
def packed(model, tmp_path_factory) -> Path:
    return pp.pack(model, tmp_path_factory.mktemp("hostile") / "expert", samples=4)


@pytest.fixture
def copy(packed, tmp_path) -> Path:
    return Path(shutil.copytree(packed, tmp_path / "expert"))


def policy_of(folder: Path) -> dict:
    return json.loads((folder / "policy.json").read_text())


def reseal(folder: Path, *names: str) -> None:
    """Record changed files' sha256 (and the runtime digest) in policy.json, as an attacker would."""
    policy = policy_of(folder)
    for name in names:
        policy["files"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    if "runtime" in policy:
        policy["runtime"]["digest"] = fmt.runtime_digest(policy["files"])
    (folder / "policy.json").write_text(json.dumps(policy))


def edit_graph(folder: Path, change) -> None:
    doc = json.loads((folder / "graph.json").read_text())
    change(doc)
    (folder / "graph.json").write_text(json.dumps(doc))
    reseal(folder, "graph.json")


def refused(folder: Path, pattern: str) -> str:
    """The message of the BadModelError that loading ``folder`` raises; it must match ``pattern``."""
    with pytest.raises(pp.BadModelError, match=pattern) as caught:
        pp.load(folder, backend="numpy")
    return str(caught.value)


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


# ------------------------------------------------------------------------------------------ sizes


def test_a_20_gb_sparse_data_file_is_refused_by_its_size_before_it_is_hashed(copy):
    os.truncate(copy / "model.onnx", 20 * 1024**3)  # sparse: no disk used, 20 GB to hash
    message = refused(copy, r"model\.onnx is 21,474,836,480 bytes; a bundle's model\.onnx may be at most "
                            r"1,073,741,824 bytes \(raise it with POLICYPORT_BUNDLE_MAX_BYTES=BYTES\)")
    assert not DIGEST.search(message)


def test_the_data_limit_is_raised_by_the_environment(copy, monkeypatch):
    monkeypatch.setenv("POLICYPORT_BUNDLE_MAX_BYTES", "1000")
    refused(copy, r"model\.onnx is [\d,]+ bytes; a bundle.s model\.onnx may be at most 1,000 bytes")
    monkeypatch.setenv("POLICYPORT_BUNDLE_MAX_BYTES", "lots")
    refused(copy, r"POLICYPORT_BUNDLE_MAX_BYTES='lots': expected a positive number of bytes")


def test_a_60_mb_policy_json_is_refused_before_it_is_read(copy):
    os.truncate(copy / "policy.json", 60 * 1024**2)
    refused(copy, r"policy\.json is 62,914,560 bytes; a bundle's policy\.json may be at most 1,048,576 bytes")


def test_an_oversized_runtime_file_is_refused(copy):
    os.truncate(copy / "_policyport/runtime/numpy/plan.py", 2 * 1024**2)
    refused(copy, r"plan\.py is 2,097,152 bytes; a bundle's _policyport/runtime/numpy/plan\.py may be at most 1,048,576")


def test_a_graph_json_attribute_of_a_2_gb_string_dtype_is_refused_by_the_schema(copy):
    def huge_attribute(doc):
        doc["nodes"][0]["attrs"]["value"] = {"tensor": {"dtype": "S2000000000", "shape": [1], "data": ["x"]}}

    edit_graph(copy, huge_attribute)
    refused(copy, r"graph\.json: nodes\[0\]\.attrs\.value\.tensor\.dtype must be a real or boolean element type "
                  r"name, found string 'S2000000000'")


def test_an_attribute_tensor_whose_data_does_not_fit_its_shape_is_refused(copy):
    edit_graph(copy, lambda d: d["nodes"][0]["attrs"].update(
        value={"tensor": {"dtype": "float32", "shape": [1000000, 1000000], "data": [1.0]}}))
    refused(copy, r"nodes\[0\]\.attrs\.value\.tensor: holds 1 values but its shape \[1000000, 1000000\] has "
                  r"1000000000000 elements")


def _npz_bytes(members: dict[str, bytes], compression=zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data, compress_type=compression)
    return buffer.getvalue()


def _npy_header(descr: str, shape: tuple) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


@pytest.mark.parametrize("member,pattern", [
    (_npy_header("<f4", (10**12,)), r"is truncated or damaged: its header describes float32 \(1000000000000,\) "
                                    r"\(3.64 TiB\), but it holds 0 B of data"),
    (_npy_header("|V1000000000", (1,)), r"has elements of 1,000,000,000 raw bytes \(dtype \|V1000000000\); policyport "
                                        r"reads plain arrays only"),
    (_npy_header("|O", (1,)), r"is an object array \(object\), which numpy can only load by unpickling it"),
])
def test_npy_headers_are_checked_before_an_array_is_allocated(copy, member, pattern):
    (copy / "constants.npz").write_bytes(_npz_bytes({"head/mid.npy": member}))
    reseal(copy, "constants.npz")
    refused(copy, r"constants\.npz: array 'head/mid':? " + pattern)


def test_a_deflated_npz_is_refused_whatever_it_expands_to(copy):
    zeros = io.BytesIO()
    np.save(zeros, np.zeros(1_000_000, dtype=np.float32))
    (copy / "golden.npz").write_bytes(_npz_bytes({"inputs/obs.npy": zeros.getvalue()}, zipfile.ZIP_DEFLATED))
    reseal(copy, "golden.npz")
    with pytest.raises(pp.BadModelError, match=r"member 'inputs/obs\.npy' is compressed; a bundle's \.npz files are uncompressed"):
        pp.verify_bundle(copy)


# ------------------------------------------------------------------------- regular files, inside


def test_a_symlinked_weights_file_is_refused_even_when_its_target_matches(copy, tmp_path):
    outside = tmp_path / "outside.npz"
    shutil.copy(copy / "weights.npz", outside)  # same bytes: the sha256 would pass
    (copy / "weights.npz").unlink()
    (copy / "weights.npz").symlink_to(outside)
    refused(copy, r"weights\.npz is \(or lies behind\) a symbolic link or is not a regular file; a bundle holds "
                  r"regular files inside its folder only")


def test_a_symlink_to_a_system_file_is_never_hashed_nor_its_hash_shown(copy):
    secret = Path("/etc/hostname") if Path("/etc/hostname").is_file() else Path(os.__file__)
    (copy / "run.py").unlink()
    (copy / "run.py").symlink_to(secret)
    message = refused(copy, r"run\.py is \(or lies behind\) a symbolic link")
    assert hashlib.sha256(secret.read_bytes()).hexdigest() not in message and not DIGEST.search(message)
    result = invoke("verify", copy)
    assert result.exit_code == 3 and not DIGEST.search(result.output)


def test_a_symlinked_runtime_folder_is_refused(copy, tmp_path):
    shutil.move(copy / "_policyport", tmp_path / "elsewhere")
    (copy / "_policyport").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    refused(copy, r"_policyport/__init__\.py is \(or lies behind\) a symbolic link")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_is_refused_without_being_opened(copy):
    (copy / "graph.json").unlink()
    os.mkfifo(copy / "graph.json")  # opening it for reading would block forever
    refused(copy, r"graph\.json is \(or lies behind\) a symbolic link or is not a regular file")


@pytest.mark.parametrize("name", ["notes.txt", "../secret", "/etc/passwd", "_policyport/../../x.py",
                                  "_policyport/Evil.py", "_policyport/a/b/c/d/e/f.py"])
def test_only_the_files_the_format_defines_may_be_listed(copy, name):
    policy = policy_of(copy)
    policy["files"][name] = "0" * 64
    (copy / "policy.json").write_text(json.dumps(policy))
    refused(copy, re.escape(repr(name)) + r" is not a file of the bundle format")


def test_runtime_files_without_a_runtime_section_are_refused(copy):
    policy = policy_of(copy)
    del policy["runtime"]
    (copy / "policy.json").write_text(json.dumps(policy))
    refused(copy, r"policy\.json lists .*_policyport/.* but has no 'runtime' section")


def test_a_runtime_file_changed_and_resealed_breaks_the_runtime_digest(copy):
    (copy / "_policyport/runtime/numpy/plan.py").write_text("raise SystemExit('owned')\n")
    policy = policy_of(copy)
    policy["files"]["_policyport/runtime/numpy/plan.py"] = hashlib.sha256(
        (copy / "_policyport/runtime/numpy/plan.py").read_bytes()).hexdigest()
    (copy / "policy.json").write_text(json.dumps(policy))
    refused(copy, r"the runtime files do not add up to the runtime digest it records")


# ------------------------------------------------------------------------ one check, every reader


@pytest.fixture
def swapped(copy, model, tmp_path) -> Path:
    """The bundle with another valid model.onnx in place of its own (policy.json untouched)."""
    other = pp.convert(EXPERT, activation="tanh")  # no head: another graph, a valid model
    (copy / "model.onnx").write_bytes(other.SerializeToString())
    return copy


@pytest.mark.parametrize("command", [
    ["inspect", "{f}"], ["extract", "{f}", "-o", "{t}/w.npz"], ["expose", "{f}", "-o", "{t}/e.onnx"],
    ["run", "{f}", "-i", "{t}/obs.npy", "-o", "{t}/y.npz"],
    ["run", "{f}", "-i", "{t}/obs.npy", "-o", "{t}/y.npz", "--backend", "onnxruntime"],
    ["verify", "{f}"], ["verify", "{f}", "-i", "{t}/obs.npy"],
])
def test_every_command_refuses_a_swapped_model_onnx(swapped, tmp_path, command):
    np.save(tmp_path / "obs.npy", np.zeros((2, 275), np.float32))
    result = invoke(*[a.format(f=swapped, t=tmp_path) for a in command])
    assert result.exit_code == 3, result.output
    assert "model.onnx: its content differs from the sha256 policy.json records" in result.stderr
    assert "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".npz", ".onnx")) == []


def test_the_python_api_refuses_it_on_both_backends(swapped):
    for backend in pp.BACKENDS:
        with pytest.raises(pp.BadModelError, match="model.onnx: its content differs"):
            pp.load(swapped, backend=backend)
    with pytest.raises(pp.BadModelError, match="model.onnx: its content differs"):
        pp.extract_weights(swapped)


# --------------------------------------------------------------------------------- malformed files


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


MALFORMED = {
    "deeply nested policy.json": (
        lambda f: (f / "policy.json").write_text(_nested(100_000)),
        r"policy\.json: nested deeper than 32 levels of arrays and objects"),
    "policy.json nested within Python's stack but past the limit": (
        lambda f: (f / "policy.json").write_text(json.dumps({**policy_of(f), "parity": {"x": json.loads(_nested(40))}})),
        r"policy\.json: nested deeper than 32 levels"),
    "policy.json of {}": (
        lambda f: (f / "policy.json").write_text("{}"),
        r"expected format 'policyport\.bundle/1', found None"),
    "policy.json not an object": (
        lambda f: (f / "policy.json").write_text("[1, 2]"),
        r"policy\.json: the document must be an object, found an array"),
    "policy.json files as a list": (
        lambda f: (f / "policy.json").write_text(json.dumps({**policy_of(f), "files": ["model.onnx"]})),
        r"policy\.json: files must be an object, found an array"),
    "a digest that is not hex": (
        lambda f: (f / "policy.json").write_text(json.dumps({**policy_of(f), "files": {
            **policy_of(f)["files"], "model.onnx": "not a digest"}})),
        r"files\['model\.onnx'\] must be a sha256 hex digest, found string 'not a digest'"),
    "an unknown key in policy.json": (
        lambda f: (f / "policy.json").write_text(json.dumps({**policy_of(f), "exec": "rm -rf /"})),
        r"policy\.json: the document has the key\(s\) 'exec', which the format does not define"),
    "non-UTF-8 policy.json": (
        lambda f: (f / "policy.json").write_bytes(b'{"format": "\xff\xfe"}'),
        r"policy\.json is not UTF-8 text"),
    "non-UTF-8 graph.json": (
        lambda f: ((f / "graph.json").write_bytes(b"\xff" + (f / "graph.json").read_bytes()), reseal(f, "graph.json")),
        r"graph\.json is not UTF-8 text"),
    "deeply nested graph.json": (
        lambda f: ((f / "graph.json").write_text(_nested(50_000)), reseal(f, "graph.json")),
        r"graph\.json: nested deeper than 32 levels"),
    "graph.json not JSON": (
        lambda f: ((f / "graph.json").write_text("{nodes"), reseal(f, "graph.json")),
        r"graph\.json is not valid JSON: Expecting property name"),
    "a node's attrs as a list": (
        lambda f: edit_graph(f, lambda d: d["nodes"][0].update(attrs=[1, 2])),
        r"graph\.json: nodes\[0\]\.attrs must be an object, found an array"),
    "transpose: 5": (
        lambda f: edit_graph(f, lambda d: next(iter(d["initializer_sources"].values())).update(transpose=5)),
        r"initializer_sources\['default_policy/fc_1/kernel'\]\.transpose must be null or an array, found integer 5"),
    "a transpose that is no permutation": (
        lambda f: edit_graph(f, lambda d: next(iter(d["initializer_sources"].values())).update(transpose=[0, 0])),
        r"initializer 'default_policy/fc_1/kernel' has transpose \[0, 0\], which is not a permutation"),
    "a list as an initializer key": (
        lambda f: edit_graph(f, lambda d: next(iter(d["initializer_sources"].values())).update(key=["a", "b"])),
        r"initializer_sources\['default_policy/fc_1/kernel'\]\.key must be a string, found an array"),
    "an initializer stored in another file": (
        lambda f: edit_graph(f, lambda d: next(iter(d["initializer_sources"].values())).update(file="/etc/passwd")),
        r"\.file must be one of 'weights\.npz', 'constants\.npz', found string '/etc/passwd'"),
    "a boolean where an opset belongs": (
        lambda f: edit_graph(f, lambda d: d["opsets"].update({"": True})),
        r"graph\.json: opsets\[''\] must be an integer >= 1 and <= 10000, found boolean True"),
    "an integer attribute beyond int64": (
        lambda f: edit_graph(f, lambda d: d["nodes"][0]["attrs"].update(
            value={"tensor": {"dtype": "int64", "shape": [1], "data": [2**70]}})),
        r"graph\.json: an attribute tensor holds a value its element type cannot \(Python int too large"),
    "an npz that is not a zip": (
        lambda f: ((f / "weights.npz").write_bytes(b"PK\x03\x04 not really"), reseal(f, "weights.npz")),
        r"weights\.npz is not a readable \.npz of plain arrays"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_folders_give_clear_errors(copy, case):
    damage, pattern = MALFORMED[case]
    damage(copy)
    refused(copy, pattern)
    result = invoke("verify", copy)
    assert result.exit_code == 3 and "Traceback" not in result.output
    assert re.search(pattern, " ".join(result.stderr.split())), result.stderr


#: Malformed contents behind a resealed policy.json, one of each kind, for every reader of a folder.
RESEALED = {
    "non-UTF-8 graph.json": MALFORMED["non-UTF-8 graph.json"],
    "a node's attrs as a list": MALFORMED["a node's attrs as a list"],
    "a 50,000-deep graph.json": MALFORMED["deeply nested graph.json"],
    "an attribute of dtype S2000000000": (
        lambda f: edit_graph(f, lambda d: d["nodes"][0]["attrs"].update(
            value={"tensor": {"dtype": "S2000000000", "shape": [1], "data": ["x"]}})),
        r"dtype must be a real or boolean element type name, found string 'S2000000000'"),
    "a |V1000000000 weights member": (
        lambda f: ((f / "weights.npz").write_bytes(_npz_bytes({"w.npy": _npy_header("|V1000000000", (1,))})),
                   reseal(f, "weights.npz")),
        r"weights\.npz: array 'w':? has elements of 1,000,000,000 raw bytes"),
    "a deflated golden member": (
        lambda f: ((f / "golden.npz").write_bytes(_npz_bytes({"inputs/obs.npy": _npy_header("<f4", (10**9,))
                                                              + bytes(4 * 10**6)}, zipfile.ZIP_DEFLATED)),
                   reseal(f, "golden.npz")),
        r"golden\.npz: member 'inputs/obs\.npy' is compressed"),
}

READERS = {
    "inspect": ["inspect", "{f}"], "inspect --json": ["inspect", "{f}", "--json"],
    "extract": ["extract", "{f}", "-o", "{t}/w.npz"], "expose": ["expose", "{f}", "-o", "{t}/e.onnx"],
    "run": ["run", "{f}", "-i", "{t}/obs.npy", "-o", "{t}/y.npz"],
    "run onnxruntime": ["run", "{f}", "-i", "{t}/obs.npy", "-o", "{t}/y.npz", "--backend", "onnxruntime"],
    "verify": ["verify", "{f}"], "verify -i": ["verify", "{f}", "-i", "{t}/obs.npy"],
    "pack": ["pack", "{f}", "-o", "{t}/again"], "export-numpy": ["export-numpy", "{f}", "-o", "{t}/policy.py"],
}


@pytest.mark.parametrize("case", sorted(RESEALED))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_of_a_folder_makes_the_same_full_check(copy, tmp_path, case, reader):
    damage, pattern = RESEALED[case]
    damage(copy)
    np.save(tmp_path / "obs.npy", np.zeros((2, 275), np.float32))
    result = invoke(*[a.format(f=copy, t=tmp_path) for a in READERS[reader]])
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output and "this is a bug" not in result.output
    assert re.search(pattern, " ".join(result.stderr.split())), result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["expert", "obs.npy"]  # nothing written


@pytest.mark.parametrize("case", sorted(RESEALED))
def test_every_api_reader_of_a_folder_makes_the_same_full_check(copy, case):
    damage, pattern = RESEALED[case]
    damage(copy)
    readers = [lambda: pp.load(copy, backend="numpy"), lambda: pp.load(copy, backend="onnxruntime"),
               lambda: pp.extract_weights(copy), lambda: pp.verify_bundle(copy), lambda: reader.read_golden(copy),
               lambda: fmt.read_bundle(copy)]
    for read in readers:
        with pytest.raises(pp.BadModelError) as caught:
            read()
        assert re.search(pattern, " ".join(str(caught.value).split())), str(caught.value)


# ----------------------------------------------------------------------------------- pack --force


def test_force_refuses_an_empty_policy_json_beside_a_model_onnx_folder_and_deletes_nothing(model, tmp_path):
    out = tmp_path / "b"
    (out / "model.onnx").mkdir(parents=True)
    (out / "model.onnx" / "thesis.tex").write_text("years of work")
    (out / "policy.json").write_text("{}")
    with pytest.raises(pp.OutputExistsError, match=r"is not provably a policyport bundle \(.*expected format"):
        pp.pack(model, out, force=True)
    assert (out / "model.onnx" / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_force_refuses_a_bundle_with_a_symlink_or_an_unlisted_file(model, packed, tmp_path):
    out = Path(shutil.copytree(packed, tmp_path / "b"))
    (out / "notes.txt").write_text("mine")
    with pytest.raises(pp.OutputExistsError, match=r"holds files a bundle does not write \(notes\.txt\)"):
        pp.pack(model, out, force=True)
    (out / "notes.txt").unlink()
    (out / "link").symlink_to(tmp_path)
    with pytest.raises(pp.OutputExistsError, match=r"holds files a bundle does not write \(link\)"):
        pp.pack(model, out, force=True)
    (out / "link").unlink()
    (out / "_policyport" / "cache").mkdir()
    with pytest.raises(pp.OutputExistsError, match=r"\(_policyport/cache\)"):
        pp.pack(model, out, force=True)
    assert (out / "_policyport" / "cache").is_dir()


def test_force_refuses_a_bundle_whose_files_were_changed(model, packed, tmp_path):
    out = Path(shutil.copytree(packed, tmp_path / "b"))
    write_npz(out / "weights.npz", {"mine": np.ones(3, np.float32)})
    with pytest.raises(pp.OutputExistsError, match=r"not provably a policyport bundle \(.*weights\.npz: its content differs"):
        pp.pack(model, out, force=True)
    assert fmt._read_npz((out / "weights.npz").read_bytes(), out)["mine"].tolist() == [1, 1, 1]


def test_force_replaces_an_intact_bundle_with_or_without_runtime(model, packed, tmp_path):
    out = Path(shutil.copytree(packed, tmp_path / "b"))
    pp.pack(model, out, force=True, runtime=False, samples=2)
    assert sorted(p.name for p in out.iterdir()) == sorted([*fmt.DATA_FILES, "policy.json"])
    pp.pack(model, out, force=True, samples=3)
    assert (out / "run.py").is_file() and pp.verify_bundle(out).samples == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_pack_force_on_the_cli_names_why_it_refuses(model, tmp_path):
    src = tmp_path / "m.onnx"
    src.write_bytes(model.SerializeToString())
    out = tmp_path / "b"
    (out / "model.onnx").mkdir(parents=True)
    (out / "policy.json").write_text("{}")
    result = invoke("pack", src, "-o", out, "--force")
    assert result.exit_code == 3 and "not provably a policyport bundle" in result.stderr
    assert (out / "model.onnx").is_dir()
