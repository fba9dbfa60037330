"""A refusal names what the file really holds and where the failure is: a TFSMLayer is no Lambda, a
damaged torch pickle is no untrusted one, and a full disk names the outputs it stopped."""

from __future__ import annotations

import importlib.util
import io
import json
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app

ROOT = Path(__file__).parents[1]
runner = CliRunner()


def said(result) -> str:
    return " ".join(result.stderr.split())


def _keras_with(path: Path, layer: dict, wrapped: bool = False) -> Path:
    """A .keras archive of a Sequential model holding ``layer`` after its input (inside a nested
    Sequential when ``wrapped``), with no weights."""
    layers = [{"module": "keras.layers", "class_name": "InputLayer", "registered_name": None,
               "config": {"name": "obs", "batch_shape": [None, 4], "dtype": "float32"}}, layer]
    if wrapped:
        layers[1:] = [{"module": "keras", "class_name": "Sequential", "config": {"name": "inner", "layers": [layer]}}]
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("metadata.json", json.dumps({"keras_version": "3.11.0"}))
        zf.writestr("config.json", json.dumps({"module": "keras", "class_name": "Sequential",
                                               "config": {"name": "policy", "layers": layers}}))
        zf.writestr("model.weights.h5", b"")
    return path


TFSM_LAYER = {"module": "keras.layers", "class_name": "TFSMLayer", "registered_name": None,
              "config": {"name": "wrapped", "filepath": "elsewhere", "call_endpoint": "serve"}}
LAMBDA_LAYER = {"module": "keras.layers", "class_name": "Lambda", "registered_name": None,
                "config": {"name": "scale", "function": {"class_name": "__lambda__", "config": {"code": "4wEAAA=="}}}}


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")
@pytest.mark.parametrize("wrapped", [False, True])
def test_a_tfsm_layer_is_refused_as_what_it_is_from_the_config_before_keras_reads_the_file(tmp_path, monkeypatch,
                                                                                          wrapped):
    import keras

    def never(*args, **kwargs):
        raise AssertionError("Keras was asked to load the file")

    monkeypatch.setattr(keras.saving, "load_model", never)
    path = _keras_with(tmp_path / "tfsm.keras", TFSM_LAYER, wrapped)
    for args in (["convert", str(path), "-o", str(tmp_path / "m.onnx")], ["inspect", str(path)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 3, result.output
        assert said(result) == (f"error: {path} stores a TFSMLayer 'wrapped', which loads an external SavedModel and "
                                "runs its graph when the model is loaded; policyport refused it from the model's config "
                                "before Keras read the file (nothing from the file ran). If you trust this file, pass "
                                "--trust (trust=True)")
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")
def test_a_lambda_layer_is_refused_from_the_config_and_trust_lets_keras_read_it(tmp_path, monkeypatch):
    import keras

    from policyport.converter.sources.keras import load_keras_file

    asked = []
    monkeypatch.setattr(keras.saving, "load_model", lambda *args, **kwargs: asked.append(kwargs) or "loaded")
    path = _keras_with(tmp_path / "lambda.keras", LAMBDA_LAYER)
    with pytest.raises(pp.UntrustedFileError) as refused:
        load_keras_file(path)
    assert str(refused.value).startswith(f"{path} stores a Lambda layer 'scale', whose function Keras deserializes "
                                         "as Python code (bytecode) that runs when the model is loaded; policyport "
                                         "refused it from the model's config before Keras read the file")
    assert asked == []
    assert load_keras_file(path, trust=True) == "loaded"
    assert asked == [{"compile": False, "safe_mode": False}]


def _zeroed_pickle(state: dict) -> bytes:
    """A torch.save archive whose data.pkl is zero-filled (its length kept)."""
    torch = pytest.importorskip("torch")
    saved = io.BytesIO()
    torch.save(state, saved)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(saved.getvalue())) as zi, zipfile.ZipFile(out, "w") as zo:
        for info in zi.infolist():
            data = zi.read(info)
            zo.writestr(info, bytes(len(data)) if info.filename.endswith("data.pkl") else data)
    return out.getvalue()


def test_a_zero_filled_torch_pickle_is_called_damaged_not_untrusted(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "policy.pth"
    path.write_bytes(_zeroed_pickle({"fc.weight": torch.ones(2, 3)}))
    with pytest.raises(pp.UnreadableFileError) as caught:
        pp.convert(path, kind="state-dict", activation="tanh")
    assert not isinstance(caught.value, pp.UntrustedFileError) and "--trust" not in str(caught.value)
    assert str(caught.value).startswith(f"{path} is damaged: its pickle (data.pkl, ")
    assert "is not one: at position 0, opcode b'\\x00' unknown, so it is not a file torch.save wrote" in str(caught.value)


def test_a_zero_filled_policy_pth_in_an_sb3_zip_is_called_damaged(tmp_path):
    torch = pytest.importorskip("torch")
    source = ROOT / "fixtures/sb3/ppo_pendulum_vecnorm.zip"
    path = tmp_path / "policy.zip"
    with zipfile.ZipFile(source) as zi, zipfile.ZipFile(path, "w") as zo:
        for info in zi.infolist():
            zo.writestr(info, _zeroed_pickle({"w": torch.ones(1)}) if info.filename == "policy.pth" else zi.read(info))
    result = runner.invoke(app, ["convert", str(path), "-o", str(tmp_path / "m.onnx")])
    assert result.exit_code == 3
    assert f"{path}:policy.pth is damaged: its pickle (data.pkl" in said(result) and "--trust" not in said(result)


def test_a_torch_pickle_asking_for_code_is_still_called_untrusted(tmp_path):
    import pickle

    torch = pytest.importorskip("torch")
    path = tmp_path / "policy.pth"
    torch.save({"w": torch.ones(1), "f": pickle.loads}, path)  # a function: beyond tensors and containers
    with pytest.raises(pp.UntrustedFileError, match="pass --trust"):
        pp.convert(path, kind="state-dict", activation="tanh")


def test_export_numpy_says_which_outputs_a_full_disk_stopped(tmp_path, metadrive_model, monkeypatch):
    import onnx

    import policyport.io.arrays as files

    onnx.save(metadrive_model, tmp_path / "m.onnx")

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files, "write_npz", full)
    result = runner.invoke(app, ["export-numpy", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "policy.py")])
    assert result.exit_code == 3
    assert said(result) == (f"error: writing {tmp_path / 'policy.py'} and {tmp_path / 'policy.npz'} failed: No space "
                            "left on device; nothing was written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
