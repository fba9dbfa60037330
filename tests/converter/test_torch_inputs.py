"""Torch modules whose forward takes several inputs (``(obs, action_mask)``, ``(obs, h)``, a third
input), or one observation whose shape no Linear tells: example inputs or a shape per named input, graph
inputs named after forward's parameters with their dtypes, values equal to torch's own forward, and the
refusals of inputs that do not fit forward."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import policyport as pp  # noqa: E402
from policyport.converter import OPTIONS_KEY, ConvertOptions, convert_source  # noqa: E402

from torch_fixtures import TORCH_DIR, modules_file  # noqa: E402

pytestmark = pytest.mark.slow
EXPORTERS = ["torchscript", "dynamo"]
#: ONNX TensorProto element types (onnx/onnx.proto): FLOAT, BOOL, INT64.
FLOAT, BOOL, INT64 = 1, 9, 7


def load(name: str):
    """``(module in eval mode with the weights of fixtures/torch/<name>.torchscript.pt, its input specs)``."""
    make, specs = modules_file("multi_input_modules.py").MODULES[name]
    module = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module.load_state_dict(torch.jit.load(str(TORCH_DIR / f"{name}.torchscript.pt")).state_dict())
    return module.eval(), specs


def feeds_for(specs, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs by forward parameter: floats normal, bool and int64 masks of 0 and 1."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, (shape, dtype) in specs.items():
        if dtype.is_floating_point:
            feeds[name] = rng.normal(0, 1.5, (batch, *shape)).astype(np.float32)
        else:
            feeds[name] = rng.integers(0, 2, (batch, *shape)).astype(str(dtype).removeprefix("torch."))
    return feeds


def torch_forward(module, feeds) -> list[np.ndarray]:
    """The module's own outputs on ``feeds``, computed here in torch."""
    with torch.no_grad():
        out = module(*[torch.as_tensor(a) for a in feeds.values()])
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name, outputs, layer", [
    ("masked", ["logits"], "body.0/linear"),
    ("recurrent", ["output_0", "output_1"], "core/linear"),
    ("recurrent_masked", ["output_0", "output_1"], "core/linear"),
])
def test_example_inputs_give_named_graph_inputs_with_their_dtypes_and_torchs_values(name, outputs, layer, exporter):
    module, specs = load(name)
    example = feeds_for(specs, 3, seed=1)
    c = convert_source(module, example_inputs=tuple(example.values()), exporter=exporter)
    graph_inputs = [(i.name, i.type.tensor_type.elem_type) for i in c.model.graph.input]
    dtypes = {torch.float32: FLOAT, torch.bool: BOOL, torch.int64: INT64}
    assert graph_inputs == [(n, dtypes[dtype]) for n, (_, dtype) in specs.items()]
    assert [o.name for o in c.model.graph.output] == outputs
    feeds = feeds_for(specs, 64, seed=2)
    expected = torch_forward(module, feeds)
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(c.model, backend=backend).run(feeds)
        for out, want in zip(outputs, expected):
            np.testing.assert_allclose(got[out], want, atol=1e-5, rtol=1e-5)
    if "action_mask" in feeds:  # a masked-out action is the module's -1e8, exactly
        masked = ~feeds["action_mask"].astype(bool)
        assert masked.any() and (got[outputs[0]][masked] == np.float32(-1e8)).all()
    report = pp.verify(c.model, feeds, reference=c.reference)
    assert report.passed and report.reference == "source"
    assert {x.tensor for x in report.comparisons if x.reference == "source"} >= {layer, *outputs}


def test_a_dict_of_tensors_and_a_shape_per_named_input_give_the_same_model():
    module, specs = load("masked")
    example = {k: torch.as_tensor(v) for k, v in feeds_for(specs, 2).items()}
    by_example = convert_source(module, example_inputs=dict(reversed(example.items())))  # forward's order, not the dict's
    by_shape = convert_source(module, input_shape={"obs": (8,), "action_mask": (4,)}, input_dtypes={"action_mask": torch.bool})
    for c in (by_example, by_shape):
        assert [(i.name, i.type.tensor_type.elem_type) for i in c.model.graph.input] == [("obs", FLOAT), ("action_mask", BOOL)]
        assert [d.dim_param or d.dim_value for d in c.model.graph.input[1].type.tensor_type.shape.dim] == ["batch", 4]
    feeds = feeds_for(specs, 16, seed=3)
    (want,) = torch_forward(module, feeds)
    np.testing.assert_allclose(pp.load(by_shape.model).run(feeds)["logits"], want, atol=1e-5, rtol=1e-5)
    recorded = json.loads({p.key: p.value for p in by_shape.model.metadata_props}[OPTIONS_KEY])
    assert recorded["input_shape"] == {"obs": [8], "action_mask": [4]} and recorded["input_dtypes"] == {"action_mask": "bool"}
    options = ConvertOptions.from_metadata(json.dumps(recorded))
    assert options.input_shape == {"obs": (8,), "action_mask": (4,)} and options.input_dtypes == {"action_mask": "bool"}
    assert "example_inputs" not in json.loads({p.key: p.value for p in by_example.model.metadata_props}[OPTIONS_KEY])


def test_extract_gives_the_state_dict_of_a_module_of_several_inputs_back():
    module, specs = load("recurrent_masked")
    c = convert_source(module, example_inputs=feeds_for(specs, 2))
    weights = pp.extract_weights(c.model)
    state = module.state_dict()
    assert sorted(weights) == sorted(state)
    for key, value in state.items():
        assert np.array_equal(weights[key], value.numpy()), key


def test_verify_against_the_module_rebuilds_its_inputs_from_the_graph():
    module, specs = load("recurrent_masked")
    model = pp.convert(module, example_inputs=feeds_for(specs, 2), output_names=("logits", "h_next"))
    feeds = feeds_for(specs, 32, seed=4)
    report = pp.verify(model, feeds, source=module)
    assert report.passed and report.reference == "source"
    source_side = {x.tensor for x in report.comparisons if x.reference == "source"}
    assert {"core/linear", "logits", "h_next"} <= source_side


def test_one_observation_whose_shape_no_linear_tells_converts_from_an_example():
    module, specs = load("tuple_wrapper")
    with pytest.raises(pp.BadModelError, match="first layer is not a Linear"):
        pp.convert(module)
    obs = feeds_for(specs, 1)["obs"]  # a batch of one: traced on two rows, the batch axis stays free
    c = convert_source(module, example_inputs=(obs,), exporter="dynamo")
    assert [i.name for i in c.model.graph.input] == ["obs"]
    alone = convert_source(module, example_inputs=torch.as_tensor(obs))  # one tensor, not in a tuple
    assert [i.name for i in alone.model.graph.input] == ["obs"]
    feeds = feeds_for(specs, 9, seed=5)
    logits, value = torch_forward(module, feeds)
    got = pp.load(c.model, backend="onnxruntime").run(feeds)
    np.testing.assert_allclose(got["output_0"], logits, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(got["output_1"], value, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(pp.load(alone.model).run(feeds)["output_0"], logits, atol=1e-5, rtol=1e-5)
    assert pp.verify(c.model, feeds["obs"], reference=c.reference).passed


def test_a_torchscript_file_of_several_inputs_names_them_from_its_schema():
    path = TORCH_DIR / "recurrent.torchscript.pt"
    module, specs = load("recurrent")
    c = convert_source(path, input_shape={"obs": (8,), "h": (16,)}, trust=True)
    assert [i.name for i in c.model.graph.input] == ["obs", "h"]
    feeds = feeds_for(specs, 8, seed=6)
    logits, h_next = torch_forward(module, feeds)
    got = pp.load(c.model).run(feeds)
    np.testing.assert_allclose(got["output_0"], logits, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(got["output_1"], h_next, atol=1e-5, rtol=1e-5)
    report = pp.verify(c.model, feeds, reference=c.reference)
    assert report.passed and "core/linear" in {x.tensor for x in report.comparisons if x.reference == "source"}


@pytest.mark.parametrize("options, error, says", [
    ({"example_inputs": {"obs": np.zeros((2, 8), np.float32), "mask": np.ones((2, 4), bool)}}, pp.OptionError,
     r"example_inputs names 'mask', which forward\(obs, action_mask\) does not take"),
    ({"example_inputs": (np.zeros((2, 8), np.float32), np.ones((2, 4), bool), np.ones((2, 4), bool))}, pp.OptionError,
     r"forward\(obs, action_mask\) takes 2 inputs; example_inputs holds 3"),
    ({"example_inputs": (np.zeros((2, 8), np.float32),)}, pp.OptionError,
     r"forward\(obs, action_mask\) needs 'action_mask' too"),
    ({"example_inputs": (np.zeros((2, 8), np.float32), np.ones((3, 4), bool))}, pp.OptionError,
     r"must share their first \(batch\) axis; got shapes obs \(2, 8\), action_mask \(3, 4\)"),
    ({"example_inputs": ([0.0] * 8, np.ones((2, 4), bool))}, pp.ArgumentTypeError,
     r"example input 'obs' must be a numpy array or torch tensor with a batch axis"),
    ({"example_inputs": (np.zeros((2, 8), np.float32), np.ones((2, 4), bool)), "input_shape": {"obs": (8,)}},
     pp.OptionError, "example_inputs carry their own shapes and dtypes"),
    ({"input_shape": {"obs": (8,), "action_mask": (4,), "h": (16,)}}, pp.OptionError,
     r"'h': forward\(obs, action_mask\) takes no such input"),
    ({"input_shape": {"obs": (8,)}}, pp.OptionError,
     r"needs 'action_mask' too; give --input-shape action_mask=D\[,D\.\.\.\]"),
    ({"input_shape": (8,)}, pp.OptionError,
     r"takes several inputs; give each one's shape without the batch axis: --input-shape obs=D\[,D\.\.\.\] "
     r"--input-shape action_mask=D\[,D\.\.\.\]"),
    ({}, pp.OptionError, r"forward\(obs, action_mask\) takes several inputs"),
    ({"input_shape": {"obs": (8,), "action_mask": (4,)}, "input_dtypes": {"action_mask": "bfloat16"}}, pp.OptionError,
     "input 'action_mask': dtype 'bfloat16' is not one a graph input takes here"),
    ({"input_shape": {"obs": (8,), "action_mask": (4,)}, "input_dtypes": {"mask": "bool"}}, pp.OptionError,
     r"'mask': forward\(obs, action_mask\) takes no such input"),
    ({"input_shape": {"obs": (8,), "action_mask": (0,)}}, pp.ArgumentTypeError,
     r"a tuple of positive whole numbers .*; got 'action_mask': \(0,\)"),
    ({"input_shape": {"obs": (8,), "action_mask": (4,)}}, pp.BadModelError,
     r"forward fails on inputs obs float32 \(batch, 8\), action_mask float32 \(batch, 4\): RuntimeError: where expected "
     r"condition to be a boolean tensor.*; check --input-shape and --input-dtype"),
    ({"input_shape": {"obs": (8,), "action_mask": (4,)}, "input_dtypes": {"action_mask": "bool"},
      "output_names": ("obs",)}, pp.OptionError, "output names must not be 'obs', 'action_mask', the graph inputs: obs"),
])
def test_inputs_that_do_not_fit_forward_are_refused_naming_them(options, error, says):
    module, _ = load("masked")
    with pytest.raises(error, match=says) as caught:
        pp.convert(module, **options)
    assert caught.value.exit_code == (2 if error in (pp.OptionError, pp.ArgumentTypeError) else 3)


def test_inputs_left_at_their_default_must_follow_every_input_given():
    class Optional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, obs, h=None, action_mask=None):
            return self.fc(obs)

    with pytest.raises(pp.OptionError, match=r"give 'h' too \(an input left at its default can only follow"):
        pp.convert(Optional(), example_inputs={"obs": np.zeros((2, 4), np.float32), "action_mask": np.ones((2, 2), bool)})
    model = pp.convert(Optional())  # the optional inputs left out: one observation, read from the Linear
    assert [i.name for i in model.graph.input] == ["obs"]


def test_the_reference_of_several_inputs_names_the_ones_missing():
    module, specs = load("masked")
    c = convert_source(module, example_inputs=feeds_for(specs, 2))
    with pytest.raises(pp.InputMismatchError, match=r"the module takes inputs 'obs', 'action_mask'; missing 'action_mask'"):
        c.reference({"obs": np.zeros((2, 8), np.float32)})
    with pytest.raises(pp.InputMismatchError, match="pass a dict of arrays by input name"):
        c.reference(np.zeros((2, 8), np.float32))


def test_no_example_and_a_forward_of_no_input_are_refused():
    module, _ = load("recurrent")
    with pytest.raises(pp.OptionError, match=r"example_inputs is empty; give forward\(obs, h\) its inputs"):
        pp.convert(module, example_inputs={})

    class Constant(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.zeros(2))

        def forward(self):
            return self.bias

    with pytest.raises(pp.BadModelError, match="the module's forward takes no input"):
        pp.convert(Constant())


def test_one_integer_observation_keeps_its_dtype_through_convert_and_verify():
    class Tokens(torch.nn.Module):  # an Embedding first: no Linear tells the shape, the dtype is int64
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.flatten = torch.nn.Flatten()
            self.action_net = torch.nn.Linear(12, 3)

        def forward(self, tokens):
            return self.action_net(self.flatten(self.embed(tokens)))

    torch.manual_seed(0)
    module = Tokens().eval()
    tokens = np.random.default_rng(7).integers(0, 10, (20, 3))
    model = pp.convert(module, example_inputs=(tokens[:2],))
    assert [(i.name, i.type.tensor_type.elem_type) for i in model.graph.input] == [("obs", INT64)]
    (want,) = torch_forward(module, {"obs": tokens})
    np.testing.assert_allclose(pp.load(model).run({"obs": tokens})["logits"], want, atol=1e-5, rtol=1e-5)
    report = pp.verify(model, tokens, source=module)  # rebuilt with the graph input's shape and dtype
    assert report.passed and "embed/embedding" in {x.tensor for x in report.comparisons if x.reference == "source"}
    by_name = convert_source(module, input_shape=(3,), input_dtypes={"obs": "int64"})  # the one input by its graph name
    np.testing.assert_allclose(pp.load(by_name.model).run({"obs": tokens})["logits"], want, atol=1e-5, rtol=1e-5)
