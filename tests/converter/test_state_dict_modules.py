"""What the parameters of a plain nn.Sequential's state_dict cannot tell, and what converting one says
about it: the kind and eps of a module with a 1-D weight, a module after the last layer, which of several
parameter-free modules in a row is which. Every expected output is torch running the module itself,
never policyport's reconstruction of it."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter import convert_source
from policyport.converter.assumptions import Assumption
from policyport.converter.sources.state_dict import CONVERT_THE_MODULE, MODULE_ITSELF

torch = pytest.importorskip("torch")
nn = torch.nn

OBS = np.random.default_rng(0).normal(0, 1.5, (256, 6)).astype(np.float32)
NO_NORMALISER = Assumption("observation normalisation", "none", "a state_dict holds no normaliser statistics (a "
                           "normaliser applied outside the module is not in its state_dict)")


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


def _layer_norm(scope: str, width: int) -> Assumption:
    return Assumption("layout", f"module {scope} = nn.LayerNorm({width}, eps=1e-05)",
                      "a 1-D weight and bias fit LayerNorm, GroupNorm and BatchNorm1d without running statistics, and "
                      "the state_dict records neither which it is nor its eps", MODULE_ITSELF)


def _batch_norm(scope: str, width: int) -> Assumption:
    return Assumption("layout", f"module {scope} = nn.BatchNorm1d({width}, eps=1e-05) in eval mode",
                      "running statistics fit BatchNorm1d, which normalises with them in eval mode, and the "
                      "state_dict does not record its eps", MODULE_ITSELF)


def _nothing_after(scope: str, last: str = "layer") -> Assumption:
    return Assumption("layout", f"nothing after module {scope}, the last {last}",
                      "a parameter-free module there, a Tanh or Softmax, is not in a state_dict", MODULE_ITSELF)


# ------------------------------------------------------------------ a module with a 1-D weight


@pytest.mark.parametrize("norm, assumed", [(lambda: nn.LayerNorm(32), _layer_norm("1", 32)),
                                           (lambda: nn.BatchNorm1d(32), _batch_norm("1", 32))])
def test_a_normalisation_read_as_torchs_default_gives_torchs_output_and_says_what_it_assumed(tmp_path, norm, assumed):
    module = _trained(nn.Sequential(nn.Linear(6, 32), norm(), nn.Tanh(), nn.Linear(32, 2)))
    state_dict, script, expected = _saved(tmp_path, module)
    c = convert_source(state_dict, activation="tanh")
    np.testing.assert_allclose(_logits(c.model), expected, atol=1e-5, rtol=1e-5)
    assert c.assumptions == [
        Assumption("activation", "tanh at module 2", "given by --activation; a state_dict does not record it",
                   "--activation names another"),
        assumed, _nothing_after("3"), NO_NORMALISER]
    report = pp.verify(c.model, OBS, source=script, trust=True)  # torch's own module checks what the model assumed
    assert report.passed and ("layout", True) in [(a["topic"], a["checked"]) for a in report.assumptions]


@pytest.mark.parametrize("norm, assumed", [
    (lambda: nn.GroupNorm(4, 32), _layer_norm("1", 32)),
    (lambda: nn.BatchNorm1d(32, track_running_stats=False), _layer_norm("1", 32)),  # in eval: the batch's statistics
    (lambda: nn.LayerNorm(32, eps=0.5), _layer_norm("1", 32)),
    (lambda: nn.BatchNorm1d(32, eps=0.5), _batch_norm("1", 32)),
], ids=["GroupNorm", "BatchNorm1d-without-running-statistics", "LayerNorm-eps", "BatchNorm1d-eps"])
def test_a_module_the_parameters_do_not_tell_apart_is_named_as_an_assumption_that_torch_refutes(tmp_path, norm, assumed):
    """These modules hold what torch's default LayerNorm or BatchNorm1d holds and compute something else:
    the conversion says what it took them for, in every verdict against the state_dict."""
    module = _trained(nn.Sequential(nn.Linear(6, 32), norm(), nn.Tanh(), nn.Linear(32, 2)))
    state_dict, _, expected = _saved(tmp_path, module)
    c = convert_source(state_dict, activation="tanh")
    assert assumed in c.assumptions
    assert np.abs(_logits(c.model) - expected).max() > 0.05  # what the assumption stands for
    text = " ".join(_invoke("verify", _written(tmp_path, c.model), "-i", _npy(tmp_path), "--source", state_dict).output.split())
    assert f"PASS against a reconstruction that assumes activation tanh at module 2; {assumed.short}; " in text


def _written(folder, model):
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _npy(folder):
    path = folder / "obs.npy"
    np.save(path, OBS)
    return path


@pytest.mark.parametrize("module, message", [
    (lambda: nn.PReLU(32), None),
    (lambda: nn.RMSNorm(32), None),  # whose TorchScript torch.onnx (2.13) does not export before opset 23
    (lambda: nn.LayerNorm(32, bias=False), None),
    (lambda: nn.PReLU(), "nn.Sequential: module 1 holds weight (1,) after module 0, which outputs 32 features; a "
     "LayerNorm or BatchNorm1d over them holds 32 values in each parameter, so it is neither (one weight alone is an "
     f"nn.PReLU()'s, which policyport does not build from a state_dict): {CONVERT_THE_MODULE}"),
], ids=["PReLU", "RMSNorm", "LayerNorm-without-bias", "PReLU-one-slope"])
def test_a_weight_without_bias_is_refused_naming_the_modules_it_fits_and_the_way_forward(tmp_path, module, message):
    net = _trained(nn.Sequential(nn.Linear(6, 32), module(), nn.Tanh(), nn.Linear(32, 2)))
    state_dict, script, expected = _saved(tmp_path, net)
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(state_dict, activation="tanh")
    assert str(caught.value) == message or (
        "nn.Sequential: module 1 holds a weight (32,) and no bias, which fits nn.LayerNorm(32, bias=False), "
        "nn.RMSNorm(32) and nn.PReLU(32) alike; they compute different things, and the state_dict cannot say which "
        f"it is: {CONVERT_THE_MODULE}")
    result = _invoke("convert", state_dict, "-o", tmp_path / "m.onnx", "--activation", "tanh")
    assert result.exit_code == 3 and not (tmp_path / "m.onnx").exists()
    if not isinstance(net[1], nn.RMSNorm):
        converted = convert_source(script, trust=True)  # the way forward the refusal names
        np.testing.assert_allclose(_logits(converted.model), expected, atol=1e-5, rtol=1e-5)


def test_a_module_with_parameters_before_the_first_linear_is_refused_not_left_out(tmp_path):
    net = _trained(nn.Sequential(nn.LayerNorm(6), nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 2)))
    state_dict, _, _ = _saved(tmp_path, net)
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(state_dict, activation="tanh")
    assert str(caught.value) == (
        "nn.Sequential: module 0 holds parameters (weight, bias) before the first Linear layer, module 1; policyport "
        "reads a state_dict's nn.Sequential from its first Linear on, with only parameter-free modules before it (an "
        f"nn.Flatten): {CONVERT_THE_MODULE}")


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
    assert pp.verify(c.model, OBS, source=script, trust=True).passed is (last is None)
    if last is not None:
        assert np.abs(_logits(c.model) - expected).max() > 0.05


def test_a_module_with_parameters_after_the_last_linear_is_the_last_one_named(tmp_path):
    module = _trained(nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 4), nn.LayerNorm(4)))
    state_dict, _, expected = _saved(tmp_path, module)
    c = convert_source(state_dict, activation="relu")
    np.testing.assert_allclose(_logits(c.model), expected, atol=1e-5, rtol=1e-5)
    assert c.assumptions[1:3] == [_layer_norm("3", 4), _nothing_after("3", "module with parameters")]


def test_the_layouts_of_sb3_and_rllib_assume_nothing_after_their_last_layer():
    from torch_fixtures import CARTPOLE, TORCH_DIR

    for source, options in ((CARTPOLE, {}), (TORCH_DIR / "rllib_fcnet.state_dict.pt", {"activation": "tanh"})):
        assert not [a for a in convert_source(source, **options).assumptions if a.assumes.startswith("nothing after")]


# ------------------------------------------------------------ parameter-free modules in a row


def test_one_activation_per_module_names_each_of_several_in_a_row(tmp_path):
    module = _trained(nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.ReLU(), nn.Linear(32, 2)))
    state_dict, _, expected = _saved(tmp_path, module)
    c = convert_source(state_dict, activation="tanh,relu")
    np.testing.assert_allclose(_logits(c.model), expected, atol=1e-5, rtol=1e-5)
    assert [n.name for n in c.model.graph.node if n.op_type in ("Tanh", "Relu")] == ["1/tanh", "2/relu"]
    assert c.assumptions[0].assumes == "tanh at module 1, relu at module 2"
    assert not [a for a in c.assumptions if "Dropout" in a.assumes]  # each module is named

    one = convert_source(state_dict, activation="tanh")  # one per run: the ReLU is taken for a Dropout, and said to be
    assert Assumption("layout", "modules 1 to 2 = one activation, then modules without effect in eval mode (Dropout)",
                      "2 modules in a row hold no parameters, so the state_dict cannot say what they are",
                      MODULE_ITSELF) in one.assumptions
    assert np.abs(_logits(one.model) - expected).max() > 0.05

    with pytest.raises(pp.OptionError) as caught:
        convert_source(state_dict, activation="tanh,relu,elu")
    assert str(caught.value) == (
        "nn.Sequential: --activation (activation=) gives 3 activations; the state_dict holds 2 parameter-free modules "
        "(1, 2) in 1 run of modules in a row (1 to 2): give one per module, in order (2 names, linear for a Dropout), "
        "or one per run (1 name; the others in a run are then taken for Dropout); a module after the last layer (a "
        f"Tanh, a Softmax) holds no parameters and is not in a state_dict, so no name reaches it: {CONVERT_THE_MODULE}")


@pytest.mark.parametrize("activation", ["tanh,linear,relu", "tanh,relu"])
def test_a_dropout_is_linear_in_a_list_per_module_and_left_out_of_one_per_run(tmp_path, activation):
    module = _trained(nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Dropout(0.5), nn.Linear(32, 32), nn.ReLU(),
                                    nn.Linear(32, 2)))
    state_dict, script, expected = _saved(tmp_path, module)
    c = convert_source(state_dict, activation=activation)
    np.testing.assert_allclose(_logits(c.model), expected, atol=1e-5, rtol=1e-5)
    assert pp.verify(c.model, OBS, source=script, trust=True).passed
    assert c.assumptions[0].assumes == ("tanh at module 1, linear at module 2, relu at module 4"
                                        if activation.count(",") == 2 else "tanh at module 1, relu at module 4")


def test_a_name_for_the_module_after_the_last_layer_is_refused_saying_none_reaches_it(tmp_path):
    module = _trained(nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2), nn.Tanh()))
    state_dict, _, _ = _saved(tmp_path, module)
    result = _invoke("convert", state_dict, "-o", tmp_path / "m.onnx", "--activation", "relu,tanh")
    assert result.exit_code == 2 and not (tmp_path / "m.onnx").exists()
    assert ("nn.Sequential: --activation (activation=) gives 2 activations for 1 parameter-free module(s) at 1; give "
            "one per module, in order; a module after the last layer (a Tanh, a Softmax) holds no parameters and is "
            "not in a state_dict, so no name reaches it") in " ".join(result.stderr.split())
