"""What a recording's headers and metadata declare is checked against what it holds and against the
limits before it is read: statistics read as many rows at once as the array limit allows."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import policyport as pp
from policyport.analysis import open_recording, statistics
from policyport.analysis.recording import npy_header
from policyport.analysis.tables import META_FILE_BYTES, META_KEY
from policyport.io.limits import MIB, using_limits


def test_statistics_read_fewer_rows_at_once_where_a_block_would_pass_the_array_limit(tmp_path):
    acts = np.random.default_rng(3).standard_normal((1000, 1000)).astype(np.float32)
    np.save(tmp_path / "rec.npy", acts)
    whole = statistics(tmp_path / "rec.npy")
    seen = []
    with using_limits(array_bytes=10 * MIB):  # 16,384 rows would take some 590 MiB
        small = statistics(tmp_path / "rec.npy", progress=lambda done, total: seen.append(done))
    assert seen[0] == (10 * MIB - (72 + 140) * 1000) // (4 * 1000 + 34 * 1000) == 270
    assert seen[-1] == 1000
    np.testing.assert_allclose(small.tensors[0].moments.mean, whole.tensors[0].moments.mean, rtol=1e-12)
    np.testing.assert_allclose(small.tensors[0].moments.std, whole.tensors[0].moments.std, rtol=1e-9)


def _npz(path, members: dict[str, bytes]):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


ROW = {"x.npy": npy_header("float32", (2, 3)) + bytes(24)}


def test_an_npz_recordings_description_is_read_only_when_it_holds_what_it_declares_and_fits_a_description(tmp_path):
    unheld = npy_header(f"<U{META_FILE_BYTES}", ()) + bytes(16)  # 256 MiB of text declared, 16 bytes held
    with pytest.raises(pp.UnreadableFileError, match=r"member 'policyport.recording' is truncated or damaged: its "
                                                      r"header says str\d+ \(\), which needs 268,435,\d+ bytes; it holds"):
        open_recording(_npz(tmp_path / "a.npz", {f"{META_KEY}.npy": unheld, **ROW}))
    chars = META_FILE_BYTES // 4 + 1  # held in full (deflated), one character more than a description
    held = npy_header(f"<U{chars}", ()) + bytes(4 * chars)
    with pytest.raises(pp.UnreadableFileError, match=r"declares 67,108,\d+ bytes, more than a recording's description "
                                                      r"\(67,108,864\); it is not one"):
        open_recording(_npz(tmp_path / "b.npz", {f"{META_KEY}.npy": held, **ROW}))


def test_an_npz_member_declaring_more_rows_than_it_holds_is_refused_before_any_row_is_read(tmp_path):
    path = _npz(tmp_path / "rec.npz", {"x.npy": npy_header("float32", (1000, 1000)) + bytes(400)})
    with pytest.raises(pp.UnreadableFileError, match=r"member 'x' is truncated or damaged: its header says float32 "
                                                      r"\(1000, 1000\), which needs 4,000,\d+ bytes; it holds \d+"):
        open_recording(path)


def test_a_parquet_row_of_more_values_than_its_declared_width_is_refused_before_it_is_decoded(tmp_path):
    values = pa.array(np.zeros(1000, np.float32))
    table = pa.table({"logits": pa.ListArray.from_arrays(pa.array([0, 1000], pa.int32()), values)})
    described = {"format": "policyport.recording/1", "rows": 1,
                 "tensors": [{"name": "logits", "op_type": None, "dtype": "float32", "shape": [4]}]}
    pq.write_table(table.replace_schema_metadata({META_KEY: json.dumps(described)}), tmp_path / "rec.parquet")
    with pytest.raises(pp.UnreadableFileError, match="row group 0 of column 'logits' holds 1,000 values in 1 row, more "
                                                     "than rows of 4 values hold"):
        open_recording(tmp_path / "rec.parquet")
