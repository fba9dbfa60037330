"""A source file's extension names its kind, so a damaged file gets that kind's own account of what is
wrong; a folder given as a file kind (or a file as a folder kind) is refused naming the kind it is."""

from __future__ import annotations

import shutil
import zipfile

import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter import convert_source

from torch_fixtures import CARTPOLE, ROOT

SAVEDMODEL = ROOT / "fixtures/keras/savedmodel"
RLLIB_FOLDER = ROOT / "fixtures/rllib/ray/ppo_new"


def _convert(*args):
    result = CliRunner().invoke(app, ["convert", *(str(a) for a in args)])
    assert "Traceback" not in result.output
    return result


def _zip(path, **members):
    with zipfile.ZipFile(path, "w") as zf:
        for name, content in members.items():
            zf.writestr(name, content)
    return path


@pytest.mark.parametrize("make, reason", [
    (lambda p: p.write_bytes(CARTPOLE.read_bytes()[:300]), "is not a readable zip archive: File is not a zip file"),
    (lambda p: p.write_bytes(b""), "is empty (an SB3 save is a zip archive)"),
    (lambda p: _zip(p, **{"policy.pth": b"x"}), "is not a Stable-Baselines3 save: it lacks ['data']"),
    (lambda p: _zip(p, data=b"{}"), "is not a Stable-Baselines3 save: it lacks ['policy.pth']"),
])
def test_a_damaged_zip_gets_the_sb3_readers_own_message_without_from(tmp_path, make, reason):
    source = tmp_path / "trunc.zip"
    make(source)
    result = _convert(source, "-o", tmp_path / "m.onnx")
    assert result.exit_code == 3
    assert result.stderr == f"error: {source} {reason}\n"
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("kind", ["npz", "torchscript", "state-dict", "sb3", "rllib-torch", "keras"])
def test_a_savedmodel_folder_given_as_a_file_kind_names_from_savedmodel(tmp_path, kind):
    result = _convert(SAVEDMODEL, "-o", tmp_path / "m.onnx", "--from", kind)
    assert result.exit_code == 3
    assert result.stderr == f"error: {SAVEDMODEL} is a folder; a SavedModel folder converts with --from savedmodel\n"


def test_a_folder_given_as_a_file_kind_names_the_kind_it_is_or_what_the_kind_takes(tmp_path):
    with pytest.raises(pp.UnreadableFileError) as caught:
        convert_source(RLLIB_FOLDER, kind="keras")
    assert str(caught.value) == f"{RLLIB_FOLDER} is a folder; an RLlib checkpoint folder converts with --from rllib"
    with pytest.raises(pp.UnreadableFileError) as caught:
        convert_source(tmp_path, kind="sb3")
    assert str(caught.value) == f"{tmp_path} is a folder; --from sb3 takes an SB3 .zip file"


def test_a_file_given_as_a_savedmodel_names_the_kind_its_name_tells(tmp_path):
    keras_file = shutil.copy(ROOT / "fixtures/keras/mlp_norm.keras", tmp_path / "policy.keras")
    result = _convert(keras_file, "-o", tmp_path / "m.onnx", "--from", "savedmodel")
    assert result.exit_code == 3
    assert result.stderr == (f"error: {keras_file} is a file; --from savedmodel takes a SavedModel folder (holding "
                             "saved_model.pb); a .keras file like this converts with --from keras\n")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(pp.UnreadableFileError) as caught:
        convert_source(tmp_path / "notes.txt", kind="savedmodel")
    assert str(caught.value) == (f"{tmp_path / 'notes.txt'} is a file; --from savedmodel takes a SavedModel folder "
                                 "(holding saved_model.pb)")
