"""Outputs written relative to descriptors: a packed folder lands where its parent was opened even when
the parent is swapped for a link meanwhile, and what writers killed with SIGKILL left behind is
removed by the next write to the same folder, never a live writer's file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import policyport as pp
from policyport.handoff import pack as packing
from policyport.io.outputs import STALE_AFTER, FolderBuild, remove_stale_temporaries, write_atomic
from policyport.handoff import golden as reader

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="descriptor-relative calls and flock")

OLD = time.time() - 2 * STALE_AFTER  # a modification time old enough to be stale


def test_pack_lands_in_the_folder_it_opened_when_the_parent_is_swapped_for_a_link(metadrive_model, tmp_path,
                                                                                   monkeypatch):
    work, moved, attacker = tmp_path / "work", tmp_path / "moved", tmp_path / "attacker"
    work.mkdir()
    attacker.mkdir()
    real = packing.write_npz

    def swapping(file, arrays):
        if any(key.startswith("inputs/") for key in arrays):  # golden.npz: most of the folder is written
            os.rename(work, moved)
            os.symlink(attacker, work)
        real(file, arrays)

    monkeypatch.setattr(packing, "write_npz", swapping)
    pp.pack(metadrive_model, work / "b", samples=4)
    assert os.listdir(attacker) == []
    assert os.listdir(moved) == ["b"]  # the bundle, and no temporary folder beside it
    assert reader.verify_bundle(moved / "b").passed


def _writer(code: str, ready: Path) -> subprocess.Popen:
    """A Python process running ``code`` (which creates ``ready`` once its temporary output exists),
    returned when ``ready`` exists."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)])
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the writer did not start"
        time.sleep(0.05)
    return proc


def _write_and_wait(folder: Path) -> subprocess.Popen:
    """A process in the middle of writing ``folder/out.bin`` (its temporary file created and locked)."""
    return _writer(f"""
        import time
        from pathlib import Path
        from policyport.io.outputs import write_atomic
        def write(f):
            f.write(b"partial")
            Path({str(folder / "ready")!r}).touch()
            time.sleep(600)
        write_atomic({str(folder / "out.bin")!r}, write)
        """, folder / "ready")


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_a_temporary_file_a_killed_writer_left_is_removed_by_the_next_write_in_its_folder(tmp_path):
    proc = _write_and_wait(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    [left] = _temporaries(tmp_path)
    assert left.startswith(".out.bin.")
    write_atomic(tmp_path / "other.bin", lambda f: f.write(b"x"))
    assert _temporaries(tmp_path) == [left]  # changed moments ago: it may still be in the making
    os.utime(tmp_path / left, (OLD, OLD))
    write_atomic(tmp_path / "other.bin", lambda f: f.write(b"y"), force=True)
    assert _temporaries(tmp_path) == []
    assert (tmp_path / "other.bin").read_bytes() == b"y"


def test_a_live_writers_temporary_file_is_never_removed_however_old(tmp_path):
    proc = _write_and_wait(tmp_path)
    try:
        [live] = _temporaries(tmp_path)
        os.utime(tmp_path / live, (OLD, OLD))
        write_atomic(tmp_path / "other.bin", lambda f: f.write(b"x"))
        fd = os.open(tmp_path, os.O_RDONLY)
        try:
            assert remove_stale_temporaries(fd) == []
        finally:
            os.close(fd)
        assert _temporaries(tmp_path) == [live]
    finally:
        proc.kill()
        proc.wait()


def test_only_entries_of_policyports_exact_temporary_naming_are_taken_for_stale(tmp_path):
    names = [".notes.tmp", ".out.bin.DEADBEEF.tmp", ".out.bin.deadbee.tmp", "out.bin.deadbeef.tmp",
             ".out.bin.deadbeef.tmp.bak", ".out.bin.deadbeef.old"]
    for name in names:
        (tmp_path / name).write_bytes(b"mine")
    (tmp_path / "target").write_bytes(b"kept")
    os.symlink(tmp_path / "target", tmp_path / ".link.0123abcd.tmp")  # a link is never followed or removed
    (tmp_path / ".dir.0123abcd.tmp").mkdir()  # a folder under a file's naming
    os.mkfifo(tmp_path / ".fifo.0123abcd.tmp")
    (tmp_path / ".b.0123abcd.unknown").mkdir()  # a folder of another purpose
    for p in tmp_path.iterdir():
        os.utime(p, (OLD, OLD), follow_symlinks=False)
    before = sorted(os.listdir(tmp_path))
    write_atomic(tmp_path / "out.bin", lambda f: f.write(b"x"))
    assert sorted(os.listdir(tmp_path)) == sorted([*before, "out.bin"])
    assert (tmp_path / "target").read_bytes() == b"kept"


def test_a_folder_a_killed_pack_left_is_removed_by_the_next_folder_built_beside_it(tmp_path):
    proc = _writer(f"""
        import time
        from pathlib import Path
        from policyport.io.outputs import FolderBuild
        with FolderBuild(Path({str(tmp_path / "b")!r}), "packing") as build:
            build.write_bytes("sub/model.onnx", b"partial")
            Path({str(tmp_path / "ready")!r}).touch()
            time.sleep(600)
        """, tmp_path / "ready")
    [left] = [p for p in tmp_path.iterdir() if p.name.endswith(".packing")]
    os.utime(left, (OLD, OLD))
    with FolderBuild(tmp_path / "c", "packing"):  # the writer still holds it: kept
        assert left.is_dir()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with FolderBuild(tmp_path / "c", "packing") as build:
        build.write_bytes("policy.json", b"{}")
        build.commit()
    assert sorted(os.listdir(tmp_path)) == ["c", "ready"]
    assert (tmp_path / "c" / "policy.json").read_bytes() == b"{}"


def test_a_folder_build_refuses_an_existing_destination_it_is_not_told_it_may_replace(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "mine.txt").write_text("mine")
    with FolderBuild(tmp_path / "b", "plots") as build:
        build.write_bytes("a.png", b"png")
        with pytest.raises(pp.OutputExistsError, match="is not a folder this command replaces"):
            build.commit()
    assert os.listdir(tmp_path / "b") == ["mine.txt"]
    assert os.listdir(tmp_path) == ["b"]  # the temporary folder removed


def test_a_written_folder_gets_the_umask_mode_and_a_replaced_one_keeps_its_own(tmp_path):
    import stat

    old = os.umask(0o022)
    try:
        with FolderBuild(tmp_path / "new", "plots") as build:
            assert stat.S_IMODE(build.path.stat().st_mode) == 0o700  # private while it is built
            build.write_bytes("a.png", b"x")
            build.commit()
        assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o755
        assert stat.S_IMODE((tmp_path / "new/a.png").stat().st_mode) == 0o644
        os.chmod(tmp_path / "new", 0o750)
        with FolderBuild(tmp_path / "new", "plots") as build:
            build.write_bytes("b.png", b"y")
            build.commit(lambda contents: ["a.png"])
        assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o750
        assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["b.png"]
    finally:
        os.umask(old)
