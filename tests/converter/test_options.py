"""Options a source kind does not read are refused (exit 2), never silently ignored; the options a model
records come back as they were given, except the trust, which is never read from a file."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter import READS, convert_source

from torch_fixtures import CARTPOLE, ROOT

EXPERT = ROOT / "fixtures/real/metadrive_ppo_expert.npz"
KERAS = ROOT / "fixtures/keras/mlp_norm.keras"


@pytest.mark.parametrize("source,options,message", [
    (EXPERT, {"exporter": "dynamo"}, r"--exporter does not apply to npz sources \(--exporter applies to state-dict, "
                                     r"torch, torchscript\)"),
    (EXPERT, {"policy_id": "p1", "input_shape": (5, 55)}, r"--policy-id, --input-shape do not apply to npz sources"),
    (EXPERT, {"obs_filter": False}, r"--no-filter does not apply to npz sources \(--no-filter applies to rllib, sb3\)"),
    (CARTPOLE, {"head": "categorical"}, r"--head does not apply to sb3 sources"),
    (KERAS, {"activation": "relu"}, r"--activation does not apply to keras sources"),
])
def test_an_option_the_source_does_not_read_is_refused(source, options, message):
    with pytest.raises(pp.OptionError, match=message):
        convert_source(source, **options)


def test_the_refusal_is_a_usage_error_on_the_command_line(tmp_path):
    result = CliRunner().invoke(app, ["convert", str(EXPERT), "-o", str(tmp_path / "m.onnx"), "--exporter", "dynamo"])
    assert result.exit_code == 2 and "--exporter does not apply to npz sources" in result.stderr
    assert not (tmp_path / "m.onnx").exists()


def test_trust_is_a_permission_every_kind_accepts():
    assert convert_source(EXPERT, trust=True).kind == "npz"


def test_every_kind_has_its_reads():
    from policyport.converter import KINDS

    assert set(READS) == set(KINDS)
    assert all("opset" in reads for reads in READS.values())


def test_recorded_options_come_back_as_given_but_never_the_trust():
    from policyport.converter import ConvertOptions

    given = ConvertOptions(activation="relu", head="categorical", opset=13, keep_value=True, exporter="dynamo",
                           policy_id="p1", obs_filter=False, obs_norm="vecnormalize.pkl", trust=True,
                           input_shape=(2, 3), output_names=("logits", "value"))
    text = given.to_metadata()
    assert "trust" not in json.loads(text)
    back = ConvertOptions.from_metadata(text)
    assert back == dataclasses.replace(given, trust=False)
    assert type(back.input_shape) is tuple and type(back.output_names) is tuple
    recorded = json.loads(text) | {"trust": True, "added_later": 1}  # a newer policyport's key, a forged trust
    assert ConvertOptions.from_metadata(json.dumps(recorded)) == back
    assert ConvertOptions.from_metadata(json.dumps({"opset": 12, "input_shape": None})) == ConvertOptions(opset=12)
    assert ConvertOptions.from_metadata(None) == ConvertOptions.from_metadata("") == ConvertOptions()


@pytest.mark.parametrize("text, reason", [
    ("[1, 2]", "expected an object, got list"),
    ('"opset"', "expected an object, got str"),
    ("{opset: 13}", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
])
def test_malformed_recorded_options_are_refused(text, reason):
    from policyport.converter import ConvertOptions

    with pytest.raises(pp.BadModelError) as caught:
        ConvertOptions.from_metadata(text)
    assert str(caught.value) == f"model metadata 'policyport.convert_options' is malformed: {reason}"
