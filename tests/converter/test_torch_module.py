"""Live torch modules and TorchScript files -> ONNX: both exporters, names by module path, parity with
torch layer by layer at batch 1 and 7, extract bit for bit, eval mode restored, refusals."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import policyport as pp  # noqa: E402
from policyport.converter import convert_source  # noqa: E402
from policyport.converter.sources.torch_module import ROLES  # noqa: E402

from torch_fixtures import TORCH_DIR, load_module, observations, torch_leaf_outputs  # noqa: E402

MODULES = ["activations", "norms", "gaussian", "float64", "tied", "rllib_fcnet"]
EXPORTERS = ["torchscript", pytest.param("dynamo", marks=pytest.mark.slow)]


def tolerance(dtype) -> float:
    return 1e-12 if dtype == np.float64 else 1e-5


def role(module) -> str:
    return ROLES[type(module).__name__]


@pytest.fixture(scope="module")
def converted():
    cache = {}

    def get(name, exporter):
        if (name, exporter) not in cache:
            module, shape = load_module(name)
            cache[(name, exporter)] = (module, shape, convert_source(module, exporter=exporter, input_shape=shape))
        return cache[(name, exporter)]

    return get


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", MODULES)
@pytest.mark.parametrize("batch", [1, 7])
def test_numpy_onnxruntime_and_torch_agree_on_every_layer(converted, name, exporter, batch):
    module, shape, c = converted(name, exporter)
    dtype = np.float64 if name == "float64" else np.float32
    obs = observations(shape, batch, dtype, seed=batch)
    tol = tolerance(dtype)
    report = pp.verify(c.model, obs, reference=c.reference, atol=tol, rtol=tol)
    assert report.passed, report.first_divergence
    # independently of policyport's reference: every leaf module's output, hooked here, equals the
    # tensor named <module path>/<role> on both backends (the last layer's output is a graph output)
    leaves = torch_leaf_outputs(module, obs)
    outputs = [o.name for o in c.model.graph.output]
    for backend in ("numpy", "onnxruntime"):
        recorded = pp.load(c.model, backend=backend).record({"obs": obs})
        as_output = []
        for path, expected in leaves.items():
            sub = module.get_submodule(path)
            if isinstance(sub, torch.nn.Dropout):
                continue  # eval mode: no node, the tensor passes through
            tensor = f"{path}/{role(sub)}"
            if tensor not in recorded:  # a module whose output is a graph output carries that name
                tensor = next(o for o in outputs if recorded[o].shape == expected.shape
                              and np.allclose(recorded[o], expected, rtol=tol, atol=tol))
                as_output.append(tensor)
            np.testing.assert_allclose(recorded[tensor], expected, rtol=tol, atol=tol, err_msg=f"{tensor} on {backend}")
        assert len(as_output) == len(set(as_output)) <= len(outputs)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", MODULES)
def test_extract_gives_the_state_dict_back_bit_for_bit(converted, name, exporter):
    module, _, c = converted(name, exporter)
    weights = pp.extract_weights(c.model)
    state = {k: v.numpy() for k, v in module.state_dict().items()}
    assert list(weights) == list(state)  # every entry, num_batches_tracked included, in the state_dict's order
    for key, value in state.items():
        assert weights[key].dtype == value.dtype and weights[key].shape == value.shape, key
        assert weights[key].tobytes() == value.tobytes(), key


def test_the_paths_the_exporters_take_are_undone(converted):
    """Tied weights share one initializer, zero biases may be merged, a bias-free Linear is a MatMul on
    a transposed constant: the metadata records each, and the initializers carry state_dict names."""
    _, _, c = converted("tied", "torchscript")
    props = {p.key: p.value for p in c.model.metadata_props}
    import json

    params = json.loads(props["policyport.parameters"])
    head = params["head.weight"]
    assert head == {"name": "head.weight", "transpose": [1, 0]}
    assert [n.op_type for n in c.model.graph.node if "head.weight" in n.input] == ["MatMul"]
    tied = next(v for k, v in params.items() if isinstance(v, dict) and "block_b.weight" in [v["name"], *v.get("also", [])])
    assert {tied["name"], *tied["also"]} >= {"block_a.weight", "block_b.weight"}
    names = {t.name for t in c.model.graph.initializer}
    assert {"encoder.weight", "block_a.weight"} <= names and not any(n.startswith("onnx::") for n in names)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_both_exporters_name_tensors_by_module_path_and_role(converted, exporter):
    _, _, c = converted("gaussian", exporter)
    nodes = {n.output[0] for n in c.model.graph.node}
    assert {"mlp_extractor.policy_net.0/linear", "mlp_extractor.policy_net.1/tanh", "mlp_extractor.value_net.1/tanh"} <= nodes
    assert [o.name for o in c.model.graph.output] == ["output_0", "output_1", "output_2"]
    assert [d.dim_param for d in c.model.graph.input[0].type.tensor_type.shape.dim] == ["batch", ""]


def test_outputs_take_the_names_given_and_dict_keys():
    module, shape = load_module("gaussian")
    c = convert_source(module, output_names=("mean", "value", "log_std"))
    assert [o.name for o in c.model.graph.output] == ["mean", "value", "log_std"]
    assert c.reference(observations(shape, 3))["log_std"].shape == (3, 2)

    class Dict(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pi, self.vf = torch.nn.Linear(4, 2), torch.nn.Linear(4, 1)

        def forward(self, obs):
            return {"action": self.pi(obs), "value": self.vf(obs)}

    c = convert_source(Dict())
    assert [o.name for o in c.model.graph.output] == ["action", "value"]
    assert pp.verify(c.model, observations((4,), 5), reference=c.reference).passed


def test_export_runs_in_eval_mode_and_restores_the_modes():
    module, shape = load_module("norms")
    module.train()
    module[5].eval()  # a submodule in its own mode stays so
    c = convert_source(module)
    assert module.training and module[0].training and not module[5].training
    assert [a.topic for a in c.assumptions] == ["observation normalisation", "mode"]
    obs = observations(shape, 7)
    with torch.no_grad():
        expected = module.eval()(torch.as_tensor(obs)).numpy()  # eval: Dropout off, running statistics
    np.testing.assert_allclose(pp.load(c.model).run({"obs": obs})["logits"], expected, rtol=1e-5, atol=1e-5)


def test_an_op_without_onnx_form_is_refused_naming_the_module_and_op():
    class Odd(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.matrix_exp(x.reshape(-1, 2, 2)).reshape(-1, 4)

    module = torch.nn.Sequential(torch.nn.Linear(4, 4), Odd(), torch.nn.Linear(4, 2))
    with pytest.raises(pp.UnsupportedOpError, match=r"module '1' \(Odd\).*opset 17.*aten::linalg_matrix_exp"):
        pp.convert(module)


class Spectrum(torch.nn.Module):
    """A leaf whose op (aten::fft_fft) the TorchScript exporter has no ONNX form for."""

    def forward(self, x):
        return torch.fft.fft(x).real


FFT_REFUSED = "Exporting the operator 'aten::fft_fft' to ONNX opset version 17 is not supported"


def test_the_leaf_that_fails_to_export_is_named_inside_nested_containers():
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Tanh(), Spectrum()), torch.nn.Linear(4, 2))
    with pytest.raises(pp.UnsupportedOpError) as caught:
        pp.convert(module)
    assert str(caught.value) == ("module '1.1' (Spectrum) cannot be exported to ONNX opset 17 by the torchscript exporter: "
                                 f"op aten::fft_fft has no ONNX form there ({FFT_REFUSED}); try another --opset or --exporter")


class Gain(torch.nn.Module):
    def forward(self, k, x):  # a number first: no layer input to export the leaf on alone
        return k * x


class GainThenSpectrum(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gain, self.fc, self.spectrum = Gain(), torch.nn.Linear(4, 4), Spectrum()

    def forward(self, x):
        return self.spectrum(self.fc(self.gain(2.0, x)))


def test_a_leaf_called_with_something_else_than_a_tensor_first_is_not_tried_alone():
    with pytest.raises(pp.UnsupportedOpError, match=r"^module 'spectrum' \(Spectrum\) cannot be exported"):
        pp.convert(GainThenSpectrum(), input_shape=(4,))


def test_a_failure_no_exported_leaf_tells_apart_is_the_exporters_own_message():
    """With no leaf that exports on its own, no culprit can be told apart: the exporter's first line."""
    with pytest.raises(pp.BadModelError) as caught:
        pp.convert(torch.nn.Sequential(Spectrum()), input_shape=(4,))
    assert type(caught.value) is pp.BadModelError
    assert str(caught.value) == f"torch.onnx.export (torchscript exporter, opset 17) failed: {FFT_REFUSED}"


def test_an_export_error_is_reported_by_its_first_plain_line_and_op():
    from policyport.converter.sources.torch_module import _export_error

    module = torch.nn.Sequential(torch.nn.Linear(4, 4), Spectrum())
    example = torch.zeros(1, 4)
    coloured = RuntimeError("\x1b[31mno form for aten.fft_fft\x1b[0m here\nsecond line")
    error = _export_error(module, example, "torchscript", 17, coloured)
    assert str(error) == ("module '1' (Spectrum) cannot be exported to ONNX opset 17 by the torchscript exporter: op aten.fft_fft "
                          "has no ONNX form there (no form for aten.fft_fft here); try another --opset or --exporter")
    error = _export_error(module, example, "torchscript", 17, RuntimeError("  "))
    assert str(error).endswith(": its op has no ONNX form there (RuntimeError); try another --opset or --exporter")
    error = _export_error(torch.nn.Sequential(torch.nn.Linear(4, 4)), example, "torchscript", 17, ValueError(""))
    assert type(error) is pp.BadModelError and str(error) == "torch.onnx.export (torchscript exporter, opset 17) failed: ValueError"


def test_export_module_defaults_to_the_torchscript_exporter_at_opset_17():
    from policyport.converter.sources.torch_module import export_module

    export = export_module(torch.nn.Sequential(torch.nn.Linear(3, 2)))
    assert export.model.opset_import[0].version == 17


@pytest.mark.parametrize("node_name, scope", [
    ("/mlp_extractor/policy_net/policy_net.0/Gemm", "mlp_extractor.policy_net.0"),  # a Sequential's child
    ("/mlp_extractor/policy_net/Tanh", "mlp_extractor.policy_net"),
    ("/mlp_extractor/helper/Gemm", "mlp_extractor"),  # a scope that is no module: the last module
    ("/Gemm", ""),
    ("Gemm_3", None),
])
def test_a_torchscript_node_name_gives_the_module_that_computed_it(node_name, scope):
    from policyport.converter.sources.torch_module import _scope_of_ts_name

    modules = {"mlp_extractor", "mlp_extractor.policy_net", "mlp_extractor.policy_net.0"}
    assert _scope_of_ts_name(node_name, modules) == scope


def test_a_module_whose_input_shape_is_not_readable_asks_for_it():
    module, _ = load_module("activations")  # starts with Flatten of (batch, 2, 3)
    with pytest.raises(pp.BadModelError, match="--input-shape"):
        pp.convert(module)


def test_dynamo_writes_opset_18_at_least_and_says_so():
    pytest.importorskip("onnxscript")
    module, shape = load_module("float64")
    c = convert_source(module, exporter="dynamo", opset=17)
    assert c.model.opset_import[0].version == 18 and any("opset 18" in n for n in c.notes)


@pytest.mark.parametrize("name", MODULES)
def test_torchscript_files_convert_and_match_torch(name):
    path = TORCH_DIR / f"{name}.torchscript.pt"
    module, shape = load_module(name)
    dtype = np.float64 if name == "float64" else np.float32
    c = convert_source(path, input_shape=shape, trust=True)
    assert c.kind == "torchscript"
    obs = observations(shape, 7, dtype)
    report = pp.verify(c.model, obs, reference=c.reference, atol=tolerance(dtype), rtol=tolerance(dtype))
    assert report.passed and report.reference == "source"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.load(str(path))
    with torch.no_grad():
        out = scripted(torch.as_tensor(obs))
    first = out if isinstance(out, torch.Tensor) else out[0]
    got = pp.load(c.model, backend="onnxruntime").run({"obs": obs})
    np.testing.assert_allclose(got[c.model.graph.output[0].name], first.numpy(), rtol=tolerance(dtype), atol=tolerance(dtype))
    # every leaf module is compared on its own tensor (TorchScript takes no hooks: a Sequential runs child
    # by child, a custom forward's leaves run on the graph's inputs to them)
    compared = {x.tensor for x in report.comparisons if x.reference == "source"}
    leaves = [p for p, m in module.named_modules() if p and not list(m.children()) and not isinstance(m, torch.nn.Dropout)]
    assert len(compared) >= len(leaves), sorted(compared)


def test_a_whole_pickled_module_needs_trust(tmp_path):
    module, shape = load_module("norms")
    path = tmp_path / "whole.pt"
    torch.save(module, path)
    with pytest.raises(pp.UntrustedFileError, match=r"torch\.nn\.modules\.container\.Sequential.*--trust"):
        pp.convert(path)
    c = convert_source(path, trust=True)
    assert c.kind == "state-dict" and "1/layer_norm" in {n.output[0] for n in c.model.graph.node}
    assert pp.verify(c.model, observations(shape, 7), reference=c.reference).passed


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softplus_keeps_its_beta_and_threshold_exactly(dtype):
    """torch's Softplus is x past beta * x > threshold; the exported form keeps that (the plain ONNX
    Softplus has neither parameter), so float64 agrees to 1e-12 on inputs on both sides."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Softplus(beta=2), torch.nn.Linear(8, 8),
                                 torch.nn.Softplus(), torch.nn.Linear(8, 2)).to(dtype)
    with torch.no_grad():
        module[0].weight.mul_(20)  # pre-activations far beyond the threshold too
    c = convert_source(module)
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    obs = observations((4,), 64, np_dtype)
    tol = tolerance(np_dtype)
    report = pp.verify(c.model, obs, reference=c.reference, atol=tol, rtol=tol)
    assert report.passed, report.first_divergence
    assert "Where" in {n.op_type for n in c.model.graph.node}
    with torch.no_grad():
        pre = module[0](torch.as_tensor(obs)) * 2
    assert (pre > 20).any() and (pre < 20).any()


@pytest.mark.parametrize("opset", [11, 13, 14, 17, 20])
def test_every_activation_has_an_exact_form_at_every_opset(opset):
    """GELU(tanh) before Gelu-20, Mish before Mish-18, Hardswish before HardSwish-14: decompositions that
    agree with torch layer by layer."""
    module, shape = load_module("activations")
    c = convert_source(module, input_shape=shape, opset=opset)
    ops = {n.op_type for n in c.model.graph.node}
    assert ("HardSwish" in ops) == (opset >= 14) and ("Gelu" in ops) == (opset >= 20)
    report = pp.verify(c.model, observations(shape, 7), reference=c.reference)
    assert report.passed and len({x.tensor for x in report.comparisons if x.reference == "source"}) == 20


def test_called_directly_the_module_converter_refuses_options_of_weight_files():
    from policyport.converter import ConvertOptions
    from policyport.converter.sources.torch_module import convert_torch

    with pytest.raises(pp.OptionError) as caught:
        convert_torch(torch.nn.Sequential(torch.nn.Linear(3, 2)), ConvertOptions(activation="relu"))
    assert str(caught.value) == "--activation applies to weight files; a torch module carries its own activations"


# ---------------------------------------------------------------------------------------------
# state_dict entries the TorchScript exporter would re-lay (recurrent gates) or fold (buffer
# arithmetic) when it folds constants: every one stays an initializer under its torch name


class Recurrent(torch.nn.Module):
    """A recurrent core over an observation sequence ``(batch, 3, 4)``, its last step to a linear head."""

    def __init__(self, cell: str, layers: int = 1, bidirectional: bool = False):
        super().__init__()
        self.rnn = getattr(torch.nn, cell)(4, 8, num_layers=layers, bidirectional=bidirectional, batch_first=True)
        self.head = torch.nn.Linear(16 if bidirectional else 8, 2)

    def forward(self, obs):
        sequence, _ = self.rnn(obs)
        return self.head(sequence[:, -1])


class EmpiricalNormalizer(torch.nn.Module):
    """rsl_rl's ``EmpiricalNormalization`` at inference: ``(x - _mean) / (_std + eps)``, eps 0.01."""

    def __init__(self, size: int, generator):
        super().__init__()
        self.register_buffer("_mean", torch.randn(1, size, generator=generator))
        self.register_buffer("_std", torch.rand(1, size, generator=generator) + 0.5)
        self.register_buffer("count", torch.tensor(9))

    def forward(self, x):
        return (x - self._mean) / (self._std + 0.01)


class NormalisedActor(torch.nn.Module):
    """An actor normalising its observation with buffers: rsl_rl's ``_mean``/``_std``, or a running
    mean/var with ``sqrt(var + eps)`` and a buffer scaling the action."""

    def __init__(self, kind: str, generator):
        super().__init__()
        if kind == "empirical":
            self.normalizer = EmpiricalNormalizer(4, generator)
        else:
            self.register_buffer("running_mean", torch.randn(4, generator=generator))
            self.register_buffer("running_var", torch.rand(4, generator=generator) + 0.25)
            self.register_buffer("action_scale", torch.tensor([2.0, 0.5]))
        self.kind = kind
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, obs):
        if self.kind == "empirical":
            return self.fc(self.normalizer(obs))
        return self.fc((obs - self.running_mean) / torch.sqrt(self.running_var + 1e-8)) * self.action_scale


def seeded(make):
    generator = torch.Generator().manual_seed(24)
    torch.manual_seed(24)  # the recurrent cells' own initialisation
    return make(generator).eval()


STATE_MODULES = {
    "gru": ((3, 4), lambda g: Recurrent("GRU")),
    "lstm-2-layer-bidirectional": ((3, 4), lambda g: Recurrent("LSTM", layers=2, bidirectional=True)),
    "gru-2-layer": ((3, 4), lambda g: Recurrent("GRU", layers=2)),
    "empirical-normalizer": ((4,), lambda g: NormalisedActor("empirical", g)),
    "running-mean-var-and-action-scale": ((4,), lambda g: NormalisedActor("running", g)),
}


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", list(STATE_MODULES))
def test_every_state_dict_entry_is_an_initializer_under_its_name_and_the_forward_is_torchs(name, exporter):
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
    shape, make = STATE_MODULES[name]
    module = seeded(make)
    c = convert_source(module, exporter=exporter, input_shape=shape)
    state = module.state_dict()
    initializers = {t.name for t in c.model.graph.initializer}
    # rsl_rl's sample count is read by no op: kept apart, as a value of the parameter metadata
    assert [k for k in state if k not in initializers] == (["normalizer.count"] if name == "empirical-normalizer" else [])
    weights = pp.extract_weights(c.model)
    assert list(weights) == list(state)
    for key, value in state.items():
        assert weights[key].dtype == value.numpy().dtype and np.array_equal(weights[key], value.numpy()), key
    assert not any("not in the graph" in n for n in c.notes)
    obs = observations(shape, 7, seed=3)
    with torch.no_grad():
        expected = module(torch.as_tensor(obs)).numpy()
    for backend in ("numpy", "onnxruntime"):
        np.testing.assert_allclose(pp.load(c.model, backend=backend).run({"obs": obs})["logits"], expected,
                                   rtol=1e-5, atol=1e-6)
    assert pp.verify(c.model, obs, reference=c.reference).passed
