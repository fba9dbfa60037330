"""The CLI on torch sources: every kind converts, refusals have their exit codes and say why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from policyport.cli import app

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
TORCH_DIR = ROOT / "fixtures" / "torch"
runner = CliRunner()


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


@pytest.mark.parametrize("args, kind", [
    ([TORCH_DIR / "gaussian.torchscript.pt", "--output-names", "mean,value,log_std", "--trust"], "torchscript"),
    ([TORCH_DIR / "activations.torchscript.pt", "--input-shape", "2,3", "--trust"], "torchscript"),
    ([TORCH_DIR / "float64.state_dict.pt", "--activation", "tanh,relu"], "state-dict"),
    ([TORCH_DIR / "rllib_fcnet.state_dict.pt", "--from", "rllib-torch", "--activation", "tanh", "--keep-value"],
     "rllib-torch"),
    ([ROOT / "fixtures" / "sb3" / "a2c_multidiscrete.zip"], "sb3"),
])
def test_every_kind_converts_and_passes_its_check(args, kind, tmp_path):
    out = tmp_path / "m.onnx"
    result = invoke("convert", *args, "-o", out, "--samples", "64", "--low", "-2", "--high", "2", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["kind"] == kind and doc["verification"]["passed"] and out.exists()
    assert any(c["reference"] == "source" for c in doc["verification"]["comparisons"])


def test_a_whole_pickled_module_needs_trust_to_convert_and_to_verify(tmp_path):
    module = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ELU(), torch.nn.Linear(8, 2))
    src = tmp_path / "whole.pt"
    torch.save(module, src)
    out = tmp_path / "m.onnx"
    refused = invoke("convert", src, "-o", out)
    assert refused.exit_code == 3 and "torch.nn.modules.container.Sequential" in refused.stderr
    assert "--trust" in refused.stderr and not out.exists()
    assert invoke("convert", src, "-o", out, "--trust", "--samples", "16").exit_code == 0
    assert invoke("verify", out, "--source", src, "--samples", "16").exit_code == 3
    result = invoke("verify", out, "--source", src, "--trust", "--samples", "16", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["passed"]
    assert {c["tensor"] for c in json.loads(result.stdout)["comparisons"] if c["reference"] == "source"} >= {"0/linear", "1/elu", "logits"}


@pytest.mark.parametrize("args, exit_code, says", [
    (["--from", "torch"], 2, "Python API"),
    (["--input-shape", "2,x"], 2, "--input-shape"),
    (["--output-names", "a,a"], 2, "--output-names"),
    (["--exporter", "dynamo"], 2, "dynamo exporter cannot trace a TorchScript module"),
    (["--activation", "relu"], 2, "--activation does not apply to torchscript sources"),
    (["--output-names", "a,b"], 2, "2 output names given"),
])
def test_torch_refusals(args, exit_code, says, tmp_path):
    result = invoke("convert", TORCH_DIR / "gaussian.torchscript.pt", "-o", tmp_path / "m.onnx", "--trust", *args)
    assert result.exit_code == exit_code, result.output
    assert says in result.output
    assert not (tmp_path / "m.onnx").exists()


def test_a_torchscript_forward_failure_reports_torchs_exception_and_the_shape_tried(tmp_path):
    expected = ("the module's forward fails on an observation of shape (batch, 7): RuntimeError: mat1 and mat2 shapes "
                "cannot be multiplied (2x7 and 6x16); check --input-shape (the observation's shape without the batch axis)")
    args = ("convert", TORCH_DIR / "activations.torchscript.pt", "-o", tmp_path / "m.onnx", "--input-shape", "7",
            "--trust")
    result = invoke(*args)
    assert (result.exit_code, result.stderr) == (3, f"error: {expected}\n")
    result = invoke(*args, "--json")
    assert (result.exit_code, json.loads(result.stdout)) == (3, {"error": expected, "exit_code": 3})
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_a_torchscript_error_is_told_by_the_exception_its_code_raised():
    from policyport.converter.sources.torch_module import torch_error_text

    class Checked(torch.nn.Module):
        def forward(self, x):
            if x.shape[1] != 4:
                raise ValueError("expected 4 features")
            return x

    with pytest.raises(torch.jit.Error) as caught:  # what a scripted raise becomes
        torch.jit.script(Checked())(torch.zeros(2, 3))
    assert "Traceback of TorchScript" in str(caught.value)
    assert torch_error_text(caught.value) == "builtins.ValueError: expected 4 features"
    assert torch_error_text(caught.value, typed=False) == "expected 4 features"
    assert torch_error_text(RuntimeError("\x1b[31mshape mismatch\x1b[0m\nmore")) == "RuntimeError: shape mismatch"
    assert torch_error_text(KeyError()) == "KeyError"


def test_without_torch_a_torchscript_file_asks_for_the_extra(tmp_path):
    script = ("import sys; sys.modules['torch'] = None\n"
              "from policyport.cli import main\nsys.argv = ['policyport', *sys.argv[1:]]\nmain()")
    result = subprocess.run([sys.executable, "-c", script, "convert", str(TORCH_DIR / "tied.torchscript.pt"),
                             "-o", str(tmp_path / "m.onnx"), "--trust"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 4, result.stderr
    assert "policyport[torch]" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("activation,code", [("tanh,relu", 0), ("relu,tanh", 1)])
def test_a_state_dict_conversion_is_checked_against_its_torchscript_module(tmp_path, activation, code):
    """The module's own TorchScript carries the real activations: a wrong --activation given for the
    state_dict is caught by verifying against it, tensor by tensor."""
    model = tmp_path / "norms.onnx"
    assert invoke("convert", TORCH_DIR / "norms.state_dict.pt", "-o", model, "--activation", activation).exit_code == 0
    result = invoke("verify", model, "--source", TORCH_DIR / "norms.torchscript.pt", "--trust", "--samples", "16",
                    "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code == code and doc["source"] == "source"
    compared = {c["tensor"] for c in doc["comparisons"] if c["reference"] == "source"}
    assert {"0/linear", "4/linear", "logits"} <= compared
    if code:  # the model names its wrong activation 2/relu, the module's own is 2/tanh: the next layer differs
        assert doc["first_divergence"]["tensor"] == "4/linear" and doc["first_divergence"]["reference"] == "source"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.save` is deprecated:DeprecationWarning")
def test_a_module_saved_in_training_mode_converts_in_eval_mode_and_every_output_says_so(tmp_path):
    torch.manual_seed(5)
    module = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Dropout(0.5),
                                 torch.nn.Linear(8, 2))
    with torch.no_grad():
        module[1].running_mean.uniform_(-1, 1)
        module[1].running_var.uniform_(0.5, 2)
    src = tmp_path / "training.pt"
    torch.jit.save(torch.jit.script(module), src)  # training mode, as modules start
    out = tmp_path / "m.onnx"
    result = invoke("convert", src, "-o", out, "--trust", "--samples", "32")
    assert result.exit_code == 0, result.output
    assumed = ("mode eval (Dropout off, BatchNorm on its running statistics): the file holds a module saved in "
               "training mode")
    assert assumed in " ".join(result.output.split())
    assert "PASS against" in result.stdout and "given observation normalisation none; mode eval (Dropout off" in \
        " ".join(result.stdout.split())
    result = invoke("convert", src, "-o", out, "--trust", "--samples", "32", "--json", "--force")
    doc = json.loads(result.stdout)
    assert [a["topic"] for a in doc["assumptions"]] == ["observation normalisation", "mode"]
    assert [a["topic"] for a in doc["verification"]["assumptions"]] == ["observation normalisation", "mode"]
    import numpy as np

    import policyport as pp

    obs = np.random.default_rng(1).normal(size=(6, 3)).astype(np.float32)
    with torch.no_grad():
        expected = module.eval()(torch.as_tensor(obs)).numpy()  # eval: no Dropout, the running statistics
    np.testing.assert_allclose(pp.load(str(out)).run({"obs": obs})["logits"], expected, rtol=1e-5, atol=1e-6)
