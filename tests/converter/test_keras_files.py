"""Reading Keras and SavedModel files: any path loads (TensorFlow globs paths), and a damaged file is
refused saying what the file is before Keras reads it."""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter import convert_source

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "keras"


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """An empty temporary folder that ``tempfile`` uses for the test, to see what is left in it."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_a_savedmodel_folder_whose_path_holds_glob_characters_converts_and_leaves_nothing_behind(tmp_path, scratch):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras

    source = shutil.copytree(FIXTURES / "savedmodel", tmp_path / "u" / "br[1]" / "b*?" / "sm")
    shutil.copytree(FIXTURES / "savedmodel", tmp_path / "u" / "br1" / "b*?" / "sm")  # what the glob would match
    weights = pp.extract_weights(convert_source(source, trust=True).model)
    model = keras.saving.load_model(FIXTURES / "mlp_activations.keras", compile=False)
    expected = {f"mlp_activations/{layer.name}/{w.name}": np.asarray(w.numpy()) for layer in model.layers
                for w in layer.weights}
    assert {k: weights[k].tobytes() for k in expected} == {k: v.tobytes() for k, v in expected.items()}
    assert list(scratch.glob("policyport-*")) == []  # (autograph leaves its own files there)


def test_a_broken_savedmodel_under_a_glob_path_is_reported_under_the_users_path(tmp_path, scratch):
    source = shutil.copytree(FIXTURES / "savedmodel", tmp_path / "br[1]" / "sm")
    for member in (source / "variables").iterdir():
        member.unlink()
    with pytest.raises(pp.UnreadableFileError) as caught:
        convert_source(source, trust=True)
    message = str(caught.value)
    assert message.startswith(f"{source} is not a loadable SavedModel: ")
    assert str(scratch) not in message and f"{source}/variables/variables" in message
    assert list(scratch.glob("policyport-*")) == []  # (autograph leaves its own files there)


@pytest.mark.parametrize("folder", ["br[1]", "star*", "what?"])
@pytest.mark.parametrize("name", ["mlp_norm.keras", "mlp_norm.h5"])
def test_keras_files_load_from_paths_holding_glob_characters(tmp_path, folder, name):
    from policyport.converter.sources.keras import load_keras_file

    (tmp_path / folder).mkdir()
    path = shutil.copy(FIXTURES / name, tmp_path / folder / name)
    assert [layer.name for layer in load_keras_file(Path(path)).layers] == ["fc_1", "bn", "fc_2", "ln", "drop", "fc_out"]


def _zip_without_config(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("model.weights.h5", b"")


@pytest.mark.parametrize("name, make, reason", [
    ("trunc.keras", lambda p: p.write_bytes((FIXTURES / "mlp_norm.keras").read_bytes()[:300]),
     "is not a readable .keras archive (a damaged or truncated zip file: File is not a zip file)"),
    ("empty.keras", lambda p: p.write_bytes(b""), "is empty"),
    ("empty.h5", lambda p: p.write_bytes(b""), "is empty"),
    ("h5.keras", lambda p: shutil.copy(FIXTURES / "mlp_norm.h5", p), "is an HDF5 file; rename it .h5"),
    ("text.keras", lambda p: p.write_text("not a model"), "is not a .keras archive (not a zip file)"),
    ("other.keras", _zip_without_config, "is a zip archive but not a .keras archive (it lacks config.json)"),
    ("zip.h5", lambda p: shutil.copy(FIXTURES / "mlp_norm.keras", p), "is a zip archive, as a .keras file is; rename it .keras"),
    ("text.hdf5", lambda p: p.write_text("not a model"), "is not an HDF5 file (it lacks the HDF5 signature)"),
])
def test_a_damaged_keras_file_is_refused_saying_what_the_file_is(tmp_path, name, make, reason):
    path = tmp_path / name
    make(path)
    result = CliRunner().invoke(app, ["convert", str(path), "-o", str(tmp_path / "m.onnx")])
    assert result.exit_code == 3 and "Traceback" not in result.output
    assert result.stderr == f"error: {path} {reason}\n"


@pytest.mark.parametrize("source, reason", [
    ("mlp_norm.keras", "; this one is a zip archive: rename it .keras"),
    ("mlp_norm.h5", "; this one is an HDF5 file: rename it .h5"),
    ("make_fixtures.py", ""),
])
def test_from_keras_on_a_file_named_otherwise_says_keras_goes_by_the_name(tmp_path, source, reason):
    path = Path(shutil.copy(FIXTURES / source, tmp_path / "policy.bin"))
    with pytest.raises(pp.UnreadableFileError) as caught:
        convert_source(path, kind="keras")
    assert str(caught.value) == f"{path}: Keras loads .keras and .h5 (.hdf5) files by their name{reason}"
