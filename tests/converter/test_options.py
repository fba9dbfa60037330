"""Options a source kind does not read are refused (exit 2), never silently ignored."""

from __future__ import annotations

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
