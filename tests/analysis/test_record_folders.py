"""An ``npy`` recording lands in the folder whose descriptor it opened, even when that folder is
swapped for a link while the recording is written."""

from __future__ import annotations

import os
import sys

import pytest

from policyport.analysis import open_recording, record_dataset
from policyport.analysis import recording as recording_module


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="descriptor-relative calls")
def test_an_npy_recording_lands_where_its_folder_was_opened_when_the_folder_is_swapped_for_a_link(
        tmp_path, metadrive_onnx, dataset, monkeypatch):
    path, obs = dataset
    work, moved, attacker = tmp_path / "work", tmp_path / "moved", tmp_path / "attacker"
    work.mkdir()
    attacker.mkdir()
    real = recording_module.NpyFolderWriter.append

    def swapping(self, block):
        if not moved.exists():  # the first block: the files exist, their rows are yet to come
            os.rename(work, moved)
            os.symlink(attacker, work)
        real(self, block)

    monkeypatch.setattr(recording_module.NpyFolderWriter, "append", swapping)
    record_dataset(metadrive_onnx, path, work / "rec", tensors="logits", batch_size=1000)
    assert os.listdir(attacker) == []
    assert os.listdir(moved) == ["rec"]
    rec = open_recording(moved / "rec")
    assert rec.rows == len(obs) and [t.name for t in rec.tensors][0] == "logits"
