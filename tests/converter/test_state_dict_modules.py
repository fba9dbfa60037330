"""What the parameters of a plain nn.Sequential's state_dict cannot tell, and what converting one says
about it: a module after the last layer. Every expected output is torch running the module itself,
never policyport's reconstruction of it."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter import convert_source
from policyport.converter.assumptions import Assumption
from policyport.converter.state_dict import MODULE_ITSELF

torch = pytest.importorskip("torch")
nn = torch.nn

OBS = np.random.default_rng(0).normal(0, 1.5, (256, 6)).astype(np.float32)


def _trained(module: nn.Sequential) -> nn.Sequential:
    """``module`` in eval mode, its normalisations' parameters and running statistics drawn away from
    their initial ones (a weight of ones and a bias of zeros would hide a wrong reading of them)."""
    torch.manual_seed(7)
    with torch.no_grad():
        for m in module:
            for name in ("weight", "bias"):
                p = getattr(m, name, None)
                if isinstance(p, torch.Tensor) and p.ndim == 1:
                    p.uniform_(0.5, 1.5) if name == "weight" else p.uniform_(-0.5, 0.5)
            if getattr(m, "running_mean", None) is not None:
                m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2)
    return module.eval()


def _saved(folder, module: nn.Module, name: str = "policy") -> tuple:
    """The module's state_dict and its TorchScript, saved in ``folder``; torch's own output on OBS."""
    state_dict, script = folder / f"{name}.pt", folder / f"{name}.torchscript.pt"
    torch.save(module.state_dict(), state_dict)
    torch.jit.save(torch.jit.script(module), script)
    with torch.no_grad():
        expected = module(torch.from_numpy(OBS)).numpy()
    return state_dict, script, expected


def _logits(model) -> np.ndarray:
    return pp.load(model).run({"obs": OBS})["logits"]


def _invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def _nothing_after(scope: str, last: str = "layer") -> Assumption:
    return Assumption("layout", f"nothing after module {scope}, the last {last}",
                      "a parameter-free module there, a Tanh or Softmax, is not in a state_dict", MODULE_ITSELF)


# ------------------------------------------------------------------- after the last layer


@pytest.mark.parametrize("last", [nn.Tanh, lambda: nn.Softmax(-1), None], ids=["Tanh", "Softmax", "nothing"])
def test_a_plain_sequential_names_that_it_assumes_nothing_after_its_last_layer(tmp_path, last):
    """A TD3-style actor ends in a Tanh, a categorical one may end in a Softmax: neither is in the
    state_dict. The model is the Sequential up to its last layer, as torch computes it, and says so."""
    module = _trained(nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2), *([last()] if last else [])))
    state_dict, script, expected = _saved(tmp_path, module)
    c = convert_source(state_dict, activation="relu")
    with torch.no_grad():
        up_to_the_last_layer = module[:3](torch.from_numpy(OBS)).numpy()
    np.testing.assert_allclose(_logits(c.model), up_to_the_last_layer, atol=1e-5, rtol=1e-5)
    assert c.assumptions[1] == _nothing_after("2")
    assert pp.verify(c.model, OBS, source=script).passed is (last is None)
    if last is not None:
        assert np.abs(_logits(c.model) - expected).max() > 0.05


def test_the_layouts_of_sb3_and_rllib_assume_nothing_after_their_last_layer():
    from torch_fixtures import CARTPOLE, TORCH_DIR

    for source, options in ((CARTPOLE, {}), (TORCH_DIR / "rllib_fcnet.state_dict.pt", {"activation": "tanh"})):
        assert not [a for a in convert_source(source, **options).assumptions if a.assumes.startswith("nothing after")]
