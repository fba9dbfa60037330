"""Every JSON policyport reads from outside — a model's metadata, a file given by an option, a member
of an archive, a recording's description — that is deeply nested, not UTF-8 or not JSON ends in its
exit code and a message naming it, never in "a bug in policyport" (Python's parser raises
RecursionError, not ValueError, for ``[[[[...``)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.graph.model import recorded_assumptions
from policyport.io.schema import load_json

#: JSON nested past any recursive parser's stack.
DEEP = "[" * 100_000 + "]" * 100_000
TOO_DEEP = "its arrays and objects nest deeper than Python parses (about 1,000 levels)"


def cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output and "a bug in policyport" not in result.output, result.output
    return result


def said(result) -> str:
    return " ".join(result.stderr.split())


@pytest.mark.parametrize("text, error, message", [
    ('{"a": [1, 2]}', None, None),
    (DEEP, pp.BadModelError, f"the text: {TOO_DEEP}"),
    ("{no", pp.BadModelError, "the text is not valid JSON: Expecting property name enclosed in double quotes: line 1 "
                              "column 2 (char 1)"),
    (b'"\xff"', pp.BadModelError, "the text is not UTF-8 text: 'utf-8' codec can't decode byte 0xff in position 1: "
                                  "invalid start byte"),
    (b"[[[1]]]", pp.OptionError, None),
])
def test_load_json_turns_every_decoding_failure_into_the_error_asked_for(text, error, message):
    if message is None:
        assert load_json(text, "the text", error=error or pp.BadModelError) == json.loads(text)
        return
    with pytest.raises(error) as caught:
        load_json(text, "the text", error=error)
    assert str(caught.value) == message


def test_load_json_with_a_depth_refuses_deeper_documents_without_recursing():
    assert load_json("[[1]]", "doc", depth=2) == [[1]]
    with pytest.raises(pp.BadModelError, match=r"^doc: nested deeper than 2 levels of arrays and objects$"):
        load_json("[[[1]]]", "doc", depth=2)
    with pytest.raises(pp.BadModelError, match=r"^doc: nested deeper than 32 levels of arrays and objects$"):
        load_json(DEEP, "doc", depth=32)
    with pytest.raises(pp.OptionError, match=r"^doc: nested deeper than 32 levels"):
        load_json(DEEP, "doc", error=pp.OptionError, depth=32)


def _with_metadata(src, dst, key, value):
    model = onnx.load(src)
    props = {p.key: p for p in model.metadata_props}
    if key in props:
        props[key].value = value
    else:
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, dst)
    return dst


@pytest.mark.parametrize("key, args, message", [
    ("policyport.parameters", ["extract", "{model}", "-o", "{tmp}/w.npz"],
     f"model metadata 'policyport.parameters': {TOO_DEEP}"),
    ("policyport.parameter_order", ["extract", "{model}", "-o", "{tmp}/w.npz"],
     f"model metadata 'policyport.parameter_order': {TOO_DEEP}"),
    ("policyport.input_ranges", ["verify", "{model}", "--samples", "2"],
     f"model metadata 'policyport.input_ranges': {TOO_DEEP}"),
    ("policyport.convert_options", ["verify", "{model}", "--samples", "2", "--source", "{src}"],
     f"model metadata 'policyport.convert_options': {TOO_DEEP}"),
])
def test_deeply_nested_model_metadata_is_a_bad_model(place, tmp_path, key, args, message):
    model = _with_metadata(place / "md.onnx", tmp_path / "deep.onnx", key, DEEP)
    result = cli(*(a.format(model=model, tmp=tmp_path, src=place / "src.npz") for a in args))
    assert result.exit_code == 3, result.output
    assert said(result) == f"error: {message}"
    assert not (tmp_path / "w.npz").exists()


@pytest.mark.parametrize("key", ["policyport.assumptions", "policyport.source"])
def test_deeply_nested_metadata_that_only_informs_reads_as_absent(place, tmp_path, key):
    """The assumptions a model records are shown when readable; the source's recorded digest only
    tells whether --source is the converted file: neither stops a command."""
    model = _with_metadata(place / "md.onnx", tmp_path / "deep.onnx", key, DEEP)
    assert cli("inspect", model).exit_code == 0
    assert recorded_assumptions({key: DEEP}) == ([] if key == "policyport.assumptions" else None)
    result = cli("verify", model, "--samples", "2", "--source", place / "src.npz")
    assert result.exit_code == 0, result.output


def test_a_deeply_nested_metadata_value_is_packed_as_text(place, tmp_path):
    model = _with_metadata(place / "md.onnx", tmp_path / "deep.onnx", "policyport.source", DEEP)
    result = cli("pack", model, "-o", tmp_path / "packed")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "packed" / "policy.json").read_text())["provenance"]["source"] == DEEP


def test_a_deeply_nested_overrides_file_is_unreadable(place, tmp_path):
    overrides = tmp_path / "sets.json"
    overrides.write_text(DEEP)
    result = cli("run", place / "md.onnx", "-i", place / "obs.npy", "-o", tmp_path / "out.npz", "--steer", "brake",
                 "--overrides", overrides)
    assert result.exit_code == 3, result.output
    assert said(result) == f"error: {overrides}: {TOO_DEEP}"
    assert not (tmp_path / "out.npz").exists()


def test_a_deeply_nested_report_is_unreadable(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(DEEP)
    result = cli("plot", report, "-o", tmp_path / "plots")
    assert result.exit_code == 3, result.output
    assert said(result) == f"error: {report}: {TOO_DEEP}"


@pytest.mark.parametrize("description, message", [
    (DEEP, f"its policyport.recording metadata: {TOO_DEEP}"),
    ('{"rows": 4, "tensors": "abc"}', "its policyport.recording metadata's tensors is a str, not a list"),
    ('{"rows": 4, "tensors": [1]}', "its policyport.recording metadata's tensors[0] is 1, not an object with a name"),
    ('{"rows": 4, "tensors": [{"shape": [3]}]}',
     "its policyport.recording metadata's tensors[0] is {'shape': [3]}, not an object with a name"),
    ('{"rows": 4, "tensors": [{"name": "a", "shape": "3"}]}',
     "its policyport.recording metadata's tensors[0].shape is '3', not a list of whole numbers"),
])
def test_a_recording_whose_description_is_malformed_is_unreadable(tmp_path, description, message):
    recording = tmp_path / "rec.npz"
    np.savez(recording, **{"fc_1/tanh": np.zeros((4, 3), np.float32), "policyport.recording": np.array(description)})
    result = cli("stats", recording)
    assert result.exit_code == 3, result.output
    assert said(result) == f"error: {recording}: {message}"


@pytest.mark.parametrize("header, message", [
    (DEEP, f"is not a .safetensors file: its header: {TOO_DEEP}"),
    ("[1]", "is not a .safetensors file: its header is a JSON list, not an object"),
])
def test_a_safetensors_header_that_is_no_json_object_is_unreadable_without_the_library(tmp_path, header, message):
    """policyport's own reader of the layout, used where the safetensors package is not installed."""
    from policyport.converter.readers.torch_files import _read_safetensors_layout

    path = tmp_path / "weights.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header.encode())
    with pytest.raises(pp.UnreadableFileError) as caught:
        _read_safetensors_layout(path)
    assert str(caught.value) == f"{path} {message}"


def test_a_graph_json_that_is_not_an_object_is_a_bad_model():
    from policyport.graph.model import Graph

    with pytest.raises(pp.BadModelError, match=r"^malformed graph JSON: expected an object, got list$"):
        Graph.from_json("[1]", {})
    with pytest.raises(pp.BadModelError, match=rf"^graph JSON: {TOO_DEEP.replace('(', '[(]').replace(')', '[)]')}$"):
        Graph.from_json(DEEP, {})
