"""Sources whose few bytes declare gigabytes end in exit 3 naming the array limit, in a process whose
address space is limited to 2 GiB: every size a pickle, a torch file, an SB3 zip or an RLlib checkpoint
declares is checked before anything that large is allocated or decompressed, and what a pickle shares
(a DAG) is walked once, not once per path.

Each file is made here, in the test's folder, from the committed fixtures and at most a few MB; a
missing check shows up as another message (numpy's or torch's allocation failing under the limit, or
"not enough memory"), a timeout, or a different exit code.
"""

from __future__ import annotations

import base64
import copyreg
import io
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

resource = pytest.importorskip("resource")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="address-space limits as on Linux")

ROOT = Path(__file__).resolve().parents[2]
SB3_BOX = ROOT / "fixtures" / "sb3" / "ppo_pendulum.zip"
SB3_DISCRETE = ROOT / "fixtures" / "sb3" / "ppo_discrete_obs.zip"
RLLIB_NEW = ROOT / "fixtures" / "rllib" / "ray" / "ppo_new"
RSL_RL_GAUSSIAN = ROOT / "fixtures" / "rsl_rl" / "gaussian" / "model_0.pt"

ADDRESS_SPACE = 2 << 30
#: A command that has not ended after this many seconds hangs (each takes a few, torch's import included).
HANG = 60
LIMIT = "above the limit of 1 GiB"
#: Runs the command line with torch unimportable: torch's zip format is then read by policyport's own reader.
WITHOUT_TORCH = ("import runpy, sys; sys.modules['torch'] = None; sys.argv[0] = 'policyport'; "
                 "runpy.run_module('policyport', run_name='__main__')")


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_limited(argv, cwd: Path, torch: bool = True) -> subprocess.CompletedProcess:
    """``policyport *argv`` in a subprocess limited to :data:`ADDRESS_SPACE` (and without torch if asked)."""
    env = {**os.environ, "COLUMNS": "400"}
    for name in ("POLICYPORT_DEBUG", "POLICYPORT_MAX_ARRAY_BYTES", "POLICYPORT_MAX_MEMORY"):
        env.pop(name, None)
    start = [sys.executable, "-m", "policyport"] if torch else [sys.executable, "-c", WITHOUT_TORCH]
    return subprocess.run([*start, *map(str, argv)], capture_output=True, text=True, env=env, cwd=cwd,
                          preexec_fn=_limited, timeout=HANG)


def refused(proc: subprocess.CompletedProcess, *pieces: str) -> None:
    """Exit 3, one line of error naming each piece, no traceback."""
    message = " ".join(proc.stderr.split())
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "this is a bug" not in proc.stderr
    for piece in pieces:
        assert piece in message, message


# --------------------------------------------------------------------------------------------- makers


class _Calls:
    """Pickles as ``func(*args)``: how a hostile pickle asks for any allowed callable."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def legacy_checkpoint(folder: Path, outer: bytes) -> Path:
    """An RLlib 1.x single-file checkpoint ``checkpoint-1`` holding the pickle ``outer``."""
    folder.mkdir()
    (folder / "checkpoint-1").write_bytes(outer)
    return folder / "checkpoint-1"


def legacy_weights(folder: Path, kernel) -> Path:
    """A legacy checkpoint whose worker state holds the TF weights of a small network, ``kernel`` its first."""
    weights = {"default_policy/fc_1/kernel": kernel, "default_policy/fc_1/bias": np.zeros(8, np.float32),
               "default_policy/fc_out/kernel": np.zeros((8, 2), np.float32),
               "default_policy/fc_out/bias": np.zeros(2, np.float32)}
    worker = pickle.dumps({"state": {"default_policy": {"weights": weights}}}, protocol=1)  # 1: __newobj__ as a call
    return legacy_checkpoint(folder, pickle.dumps({"worker": worker}, protocol=4))


def torch_bytes(value) -> bytes:
    """What torch.save writes for ``value``."""
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def expanded(*shape):
    """A float32 tensor of ``shape`` over one element (stride 0): torch.save writes its storage of 4 bytes."""
    torch = pytest.importorskip("torch")
    return torch.zeros(1).expand(*shape)


def list_dag(depth: int) -> list:
    """A list nested ``depth`` deep whose two items are the same list: 3 * 2**depth - 1 objects as a tree."""
    value: list = [0]
    for _ in range(depth):
        value = [value, value]
    return value


def sb3_zip(path: Path, base: Path, replace: dict) -> Path:
    """A copy of the SB3 zip ``base`` with members replaced (name -> bytes, or a function of the old bytes)."""
    with zipfile.ZipFile(base) as old, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as new:
        for name in old.namelist():
            data = replace.get(name, old.read(name))
            new.writestr(name, data(old.read(name)) if callable(data) else data)
    return path


def deflated_zeros(prefix: bytes, size: int, *, wrapper: bool = False) -> bytes:
    """``prefix`` then zeros up to ``size`` bytes, deflated: identical fully flushed 1 MiB blocks, so
    making it takes no time; with ``wrapper``, as a zlib stream at the default level, as RLlib writes
    it (its checksum, never reached, is left wrong)."""
    deflate = zlib.compressobj(-1, zlib.DEFLATED, 15 if wrapper else -15)
    chunk = 1 << 20
    head = deflate.compress(prefix) + deflate.flush(zlib.Z_FULL_FLUSH)
    block = deflate.compress(bytes(chunk)) + deflate.flush(zlib.Z_FULL_FLUSH)
    return head + block * ((size - len(prefix)) // chunk) + deflate.flush()


def zip_bomb(path: Path, members: dict[str, bytes], bomb: str, size: int = 3 << 29) -> Path:
    """A zip archive of ``members``, stored, but ``bomb`` deflated from ``size`` bytes of zeros
    (1.5 GiB by default, about 1.5 MB in the file), written by hand (APPNOTE.TXT 4.3); the bomb's
    CRC is left 0, as nothing may read it to the end."""
    out, central = bytearray(), bytearray()
    for name, data in members.items():
        raw = name.encode()
        if name == bomb:
            data, method, crc, length = deflated_zeros(data[:2], size), 8, 0, size
        else:
            method, crc, length = 0, zlib.crc32(data), len(data)
        at = len(out)
        out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, method, 0, 0, crc, len(data), length, len(raw), 0)
        out += raw + data
        central += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, method, 0, 0, crc, len(data), length,
                               len(raw), 0, 0, 0, 0, 0, at) + raw
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), len(out), 0)
    path.write_bytes(bytes(out + central + end))
    return path


def members(path: Path | io.BytesIO) -> dict[str, bytes]:
    """The members of a zip archive, by name, in order."""
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def rllib_with_filter(folder: Path, mean_array: str) -> Path:
    """A copy of the new-stack PPO checkpoint Ray wrote whose MeanStdFilter state holds ``mean_array``
    (RLlib's serialised array: base64 of zlib of .npy bytes) as every statistics array."""
    shutil.copytree(RLLIB_NEW, folder)
    stats = {"num_pushes": 534, "num_pushes_delta": 534, "mean_array": mean_array, "mean_delta_array": mean_array,
             "sum_sq_diff_array": mean_array, "sum_sq_diff_delta_array": mean_array}
    state = {None: {"shape": np.array([4]), "de_mean_to_zero": True, "de_std_to_one": True, "clip_by_value": 10.0,
                    "running_stats": [stats]}}
    (folder / "env_runner" / "env_to_module_connector" / "MeanStdFilter" / "state.pkl").write_bytes(
        pickle.dumps(state, protocol=4))
    return folder


def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": shape})
    return header.getvalue()


# ------------------------------------------------------------------------------- restricted unpickler


def test_an_allowed_callable_asked_for_gigabytes_is_refused_before_it_is_called(tmp_path):
    """bytearray(n) in 41 bytes: 4 GB."""
    ckpt = legacy_checkpoint(tmp_path / "ckpt", pickle.dumps(_Calls(bytearray, 4 * 10**9), protocol=2))
    assert ckpt.stat().st_size < 64
    refused(run_limited(["convert", ckpt, "-o", "out.onnx"], tmp_path),
            f"{ckpt} asks for builtins.bytearray(4000000000), which would take 3.73 GiB", LIMIT)
    assert not (tmp_path / "out.onnx").exists()


def test_a_range_listed_by_an_allowed_callable_is_counted_as_the_list_it_becomes(tmp_path):
    """list(range(n)) in 66 bytes: a billion items."""
    ckpt = legacy_checkpoint(tmp_path / "ckpt", pickle.dumps(_Calls(list, range(10**9)), protocol=2))
    assert ckpt.stat().st_size < 80
    refused(run_limited(["inspect", ckpt], tmp_path),
            "asks for builtins.list(range(0, 1000000000)), which would take 7.45 GiB", LIMIT)


def test_an_array_rebuilt_with_stride_0_is_sized_by_its_shape(tmp_path):
    """copyreg.__newobj__(ndarray, shape, dtype, 4 bytes, 0, strides=(0, 0)): a view of 4 bytes
    declaring 4 GB, which every copy of the weights would allocate."""
    kernel = _Calls(copyreg.__newobj__, np.ndarray, (20000, 50000), np.float32, b"\0" * 4, 0, (0, 0))
    ckpt = legacy_weights(tmp_path / "ckpt", kernel)
    assert ckpt.stat().st_size < 2048
    refused(run_limited(["convert", ckpt, "-o", "out.onnx"], tmp_path),
            "asks for copyreg.__newobj__(numpy.ndarray, (20000, 50000), numpy.float32, bytes, ...), which would take "
            "3.73 GiB", LIMIT)


def test_a_pickled_dag_is_refused_by_the_size_it_has_written_out(tmp_path):
    """A list nested 40 deep whose two items are the same list, a few hundred bytes: walked as a tree
    it never ends."""
    ckpt = legacy_checkpoint(tmp_path / "ckpt", pickle.dumps({"worker": list_dag(40)}, protocol=4))
    refused(run_limited(["convert", ckpt, "-o", "out.onnx"], tmp_path),
            "are 3,298,534,883,329 objects, which would take 24 TiB", LIMIT)


# ----------------------------------------------------------------------------------------- torch files


@pytest.mark.parametrize("with_torch", [True, False], ids=["torch.load", "without torch"])
def test_a_tensor_with_stride_0_is_sized_by_its_shape_before_it_is_copied(tmp_path, with_torch):
    """torch.save of expand(): a 4-byte storage declaring 3.35 GB."""
    path = tmp_path / "policy.pt"
    path.write_bytes(torch_bytes({"0.weight": expanded(30000, 30000), "0.bias": expanded(30000),
                                  "2.weight": expanded(2, 30000), "2.bias": expanded(2)}))
    assert path.stat().st_size < 4096
    refused(run_limited(["convert", path, "-o", "out.onnx"], tmp_path, torch=with_torch),
            f"{path}: its float32 tensor of shape (30000, 30000) would take 3.35 GiB", LIMIT)


@pytest.mark.parametrize("with_torch", [True, False], ids=["torch.load", "without torch"])
def test_a_torch_archive_whose_storage_inflates_to_gigabytes_is_refused_before_it_is_read(tmp_path, with_torch):
    torch = pytest.importorskip("torch")
    parts = members(io.BytesIO(torch_bytes({"0.weight": torch.zeros(2, 2), "0.bias": torch.zeros(2)})))
    storage = next(name for name in parts if name.endswith("data/0"))
    path = zip_bomb(tmp_path / "policy.pt", parts, storage)
    assert path.stat().st_size < 2 << 20
    refused(run_limited(["convert", path, "-o", "out.onnx"], tmp_path, torch=with_torch),
            f"the members of {path} would take 1.5 GiB", LIMIT)


@pytest.mark.parametrize("with_torch", [True, False], ids=["torch.load", "without torch"])
def test_a_torch_pickle_asking_an_allowed_callable_for_gigabytes_is_refused_before_torch_reads_it(tmp_path, with_torch):
    """torch's weights-only unpickler allows bytearray(n) and calls it unchecked: data.pkl is read by
    policyport's restricted unpickler first."""
    torch = pytest.importorskip("torch")
    parts = members(io.BytesIO(torch_bytes({"0.weight": torch.zeros(2, 2)})))
    pickled = next(name for name in parts if name.endswith("data.pkl"))
    parts[pickled] = pickle.dumps({"0.weight": _Calls(bytearray, 3 * 10**9)}, protocol=2)
    path = tmp_path / "policy.pt"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in parts.items():
            zf.writestr(name, data)
    refused(run_limited(["convert", path, "-o", "out.onnx"], tmp_path, torch=with_torch),
            f"{path} asks for builtins.bytearray(3000000000), which would take 2.79 GiB", LIMIT)


def test_an_rsl_rl_checkpoint_whose_storage_inflates_to_gigabytes_is_refused_before_it_is_read(tmp_path):
    """rsl_rl checkpoints are read by the shared torch reader, its archive checks first."""
    parts = members(RSL_RL_GAUSSIAN)
    storage = next(name for name in parts if name.endswith("data/0"))
    path = zip_bomb(tmp_path / "model_0.pt", parts, storage)
    refused(run_limited(["convert", path, "--from", "rsl-rl", "--activation", "elu", "-o", "out.onnx"], tmp_path),
            f"the members of {path} would take 1.5 GiB", LIMIT)


@pytest.mark.parametrize("depth, said", [
    (25, "0.weight is not tensors"),  # 100,663,295 objects written out: under the limit, and walked once each
    (40, "are 3,298,534,883,329 objects, which would take 24 TiB"),
])
def test_a_torch_file_holding_a_dag_is_walked_once_per_object(tmp_path, depth, said):
    path = tmp_path / "policy.pt"
    path.write_bytes(torch_bytes({"0.weight": list_dag(depth)}))
    assert path.stat().st_size < 4096
    refused(run_limited(["convert", path, "-o", "out.onnx"], tmp_path), said)


# -------------------------------------------------------------------------------------------- SB3 zips


def test_an_sb3_policy_with_a_stride_0_tensor_is_refused_before_it_is_copied(tmp_path):
    torch = pytest.importorskip("torch")
    policy = torch.load(io.BytesIO(members(SB3_BOX)["policy.pth"]), weights_only=True)
    policy.update({"mlp_extractor.policy_net.0.weight": expanded(40000, 3), "mlp_extractor.policy_net.0.bias": expanded(40000),
                   "mlp_extractor.policy_net.2.weight": expanded(40000, 40000)})
    path = sb3_zip(tmp_path / "ppo.zip", SB3_BOX, {"policy.pth": torch_bytes(policy)})
    refused(run_limited(["convert", path, "-o", "out.onnx"], tmp_path),
            f"{path}:policy.pth: its float32 tensor of shape (40000, 40000)", "would take 5.96 GiB", LIMIT)


@pytest.mark.parametrize("member", ["data", "policy.pth"])
def test_an_sb3_member_that_inflates_to_gigabytes_is_refused_before_it_is_read(tmp_path, member):
    path = zip_bomb(tmp_path / "ppo.zip", members(SB3_BOX), member)
    refused(run_limited(["convert", path, "-o", "out.onnx"], tmp_path),
            f"{path}: its member {member} would take 1.5 GiB", LIMIT)


def test_a_discrete_observation_is_not_one_hot_encoded_through_a_table_above_the_limit(tmp_path):
    """Discrete(80000) and a first layer as wide (stride 0, so 25 KB): the n x n table is 25.6 GB."""
    torch = pytest.importorskip("torch")
    old = members(SB3_DISCRETE)
    data = json.loads(old["data"])
    data["observation_space"]["n"] = "80000"
    policy = torch.load(io.BytesIO(old["policy.pth"]), weights_only=True)
    for key in ("mlp_extractor.policy_net.0.weight", "mlp_extractor.value_net.0.weight"):
        policy[key] = expanded(policy[key].shape[0], 80000)
    path = sb3_zip(tmp_path / "ppo.zip", SB3_DISCRETE, {"data": json.dumps(data), "policy.pth": torch_bytes(policy)})
    refused(run_limited(["convert", path, "-o", "out.onnx"], tmp_path),
            "the one-hot table of the observation space Discrete(80000) (float32, shape (80000, 80000)) would take "
            "23.8 GiB", LIMIT)


def test_sb3_policy_kwargs_pickled_as_a_dag_are_read_once_per_object(tmp_path):
    """A net_arch nested 25 deep in the pickle beside the readable one: compared and named without
    being written out (100 million objects as a tree)."""
    def edit(raw: bytes) -> bytes:
        data = json.loads(raw)
        serialized = base64.b64encode(pickle.dumps({"net_arch": list_dag(25)}, protocol=4)).decode()
        data["policy_kwargs"] = {":type:": "<class 'dict'>", ":serialized:": serialized, "net_arch": [32, 32]}
        return json.dumps(data).encode()

    path = sb3_zip(tmp_path / "ppo.zip", SB3_BOX, {"data": edit})
    refused(run_limited(["convert", path, "-o", "out.onnx"], tmp_path),
            "the zip's policy_kwargs disagree with themselves: net_arch reads [32, 32], and their pickle holds [[[[")


# ---------------------------------------------------------------------------------------- RLlib filters


def test_an_rllib_filter_array_is_refused_by_its_header_before_it_is_decompressed(tmp_path):
    mean = base64.b64encode(zlib.compress(npy_header("<f8", (10**9,)) + bytes(64))).decode()
    ckpt = rllib_with_filter(tmp_path / "ckpt", mean)
    refused(run_limited(["convert", ckpt, "-o", "out.onnx"], tmp_path),
            f"{ckpt / 'env_runner/env_to_module_connector/MeanStdFilter/state.pkl'}: the MeanStdFilter's running_stats.mean_array "
            "(float64, shape (1000000000,)) would take 7.45 GiB", LIMIT)


def test_an_rllib_filter_array_decompresses_no_more_than_its_header_describes(tmp_path):
    """Four float64 behind a header saying so, then 1.5 GiB of zeros in the same zlib stream (1.5 MB
    of text): the filter is read, and the checkpoint converts within the address-space limit."""
    mean = base64.b64encode(deflated_zeros(npy_header("<f8", (4,)) + bytes(32), 3 << 29, wrapper=True)).decode()
    ckpt = rllib_with_filter(tmp_path / "ckpt", mean)
    proc = run_limited(["convert", ckpt, "-o", "out.onnx"], tmp_path)
    assert proc.returncode == 0, proc.stderr[:500]
    assert (tmp_path / "out.onnx").is_file()
