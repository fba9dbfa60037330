"""export-numpy: one readable numpy module per policy, bit for bit the numpy backend, written only
after it is checked, and no string from the model in it but as a quoted literal."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import policyport as pp
from policyport.handoff import export_numpy as exporter
from policyport.cli import app
from numpy_venv import make_venv, run

ROOT = Path(__file__).parents[1]
EXPERT = ROOT / "fixtures/real/metadrive_ppo_expert.npz"
NODE_ORDER = ["fc_1/linear", "fc_1/tanh", "fc_2/linear", "fc_2/tanh", "logits", "action", "log_std"]
#: A hand-written numpy forward of the MetaDrive expert (load the weights, three layers, split the
#: head) with activation recording runs to about this many lines.
HAND_WRITTEN_LINES = 60


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"exported_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def ruff(path: Path) -> subprocess.CompletedProcess:
    """ruff's default rules, then pycodestyle, pyflakes, isort and pyupgrade (line length aside)."""
    default = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--output-format", "concise", str(path)],
                             capture_output=True, text=True)
    if default.returncode:
        return default
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--output-format", "concise",
                           "--select", "E,W,F,I,UP", "--ignore", "E501", str(path)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def expert(metadrive_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "metadrive_policy.py"
    return pp.export_numpy(metadrive_model, out), load_module(out)


# -------------------------------------------------------------------------------------- MetaDrive


def test_the_expert_module_is_as_short_as_a_hand_written_one_and_imports_numpy_only(expert):
    done, _ = expert
    text = done.module.read_text()
    # about a hand-written one's length, plus the input and override checks one usually leaves out,
    # the row blocks that keep the backend's bits on batches of 1,024 rows or more, and the model's
    # three assumptions (two lines of the docstring, and ASSUMPTIONS)
    assert done.lines == len(text.splitlines()) <= HAND_WRITTEN_LINES + 32 + 33 + 2 + 7  # row blocks: 33 lines
    assert (done.tensors, done.samples) == (7, 64)
    imported = {a.name for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom)}
    assert imported == {"numpy", "pathlib"}
    forward = text[text.index("def forward"):].splitlines()
    assert forward[3:6] == ["    obs = checked('obs', obs)", "    if obs.shape[0] >= SPLIT_ROWS:",
                            "        return in_blocks(compute, {'obs': obs}, record, overrides)"]
    body = text[text.index("def compute"):].splitlines()
    assert body[2:9] == [
        "    fc_1_linear = tap('fc_1/linear', np.dot(obs, FC_1_KERNEL) + FC_1_BIAS)  # Gemm",
        "    fc_1_tanh = tap('fc_1/tanh', np.tanh(fc_1_linear))  # Tanh",
        "    fc_2_linear = tap('fc_2/linear', np.dot(fc_1_tanh, FC_2_KERNEL) + FC_2_BIAS)  # Gemm",
        "    fc_2_tanh = tap('fc_2/tanh', np.tanh(fc_2_linear))  # Tanh",
        "    logits = tap('logits', np.dot(fc_2_tanh, FC_OUT_KERNEL) + FC_OUT_BIAS)  # Gemm",
        "    action = tap('action', logits[:, 0:2])  # Slice",
        "    log_std = tap('log_std', logits[:, 2:4])  # Slice",
    ]


#: What the expert, converted from its .npz with --activation tanh --head diag-gaussian, assumes, as
#: policyport verify words it.
EXPERT_ASSUMES = (
    "activation tanh at fc_1 and fc_2: given by --activation; an .npz of weights does not record it, and RLlib's "
    "FullyConnectedNetwork uses one fcnet_activation for every hidden layer; --activation names another",
    "head diagonal Gaussian, fc_out = [mean (2, the action), log_std (2)]: given by --head; RLlib's DiagGaussian "
    "splits its inputs so (ray/rllib/models/tf/tf_action_dist.py); --head none exports fc_out alone",
    "observation normalisation none: an .npz of weights holds no normaliser statistics (RLlib keeps a "
    "MeanStdFilter's in the checkpoint); convert the RLlib checkpoint to bake its filter in",
)


def test_the_expert_module_lists_what_the_model_assumes(expert):
    done, module = expert
    assert module.ASSUMPTIONS == EXPERT_ASSUMES
    assert [a["topic"] for a in done.assumptions] == ["activation", "head", "observation normalisation"]
    assert "ASSUMPTIONS lists what the model assumes that its source file does not record" in module.__doc__


@pytest.mark.parametrize("recorded, listed", [
    (None, None),  # the model does not say
    ("[]", ()),  # it says it assumes nothing
    ('[{"topic": "activation", "assumes": "tanh\\n\\"\\"\\"\\nimport os; os.system(\\"touch PWNED\\")\\n#", '
     '"because": "\'\'\')", "settle": ""}]',
     ('activation tanh\n"""\nimport os; os.system("touch PWNED")\n#: \'\'\')',)),
])
def test_assumptions_reach_the_module_only_as_literals(tmp_path, monkeypatch, recorded, listed):
    monkeypatch.chdir(tmp_path)
    model = _single("Tanh", {"x": X})
    if recorded is not None:
        entry = model.metadata_props.add()
        entry.key, entry.value = "policyport.assumptions", recorded
    done = pp.export_numpy(model, tmp_path / "policy.py")
    module = load_module(done.module)
    assert module.ASSUMPTIONS == listed and not (tmp_path / "PWNED").exists()
    assert ruff(done.module).returncode == 0, ruff(done.module).stdout


def test_the_expert_module_passes_ruff(expert):
    result = ruff(expert[0].module)
    assert result.returncode == 0, result.stdout + result.stderr


def test_forward_is_the_numpy_backend_bit_for_bit_and_records_every_tensor(expert, metadrive_model, metadrive_obs):
    _, module = expert
    session = pp.load(metadrive_model, backend="numpy")
    record: dict = {}
    got = module.forward(metadrive_obs, record=record)
    want = session.record({"obs": metadrive_obs}, "*")
    assert list(record) == NODE_ORDER == list(want)
    assert all(same_bits(record[k], want[k]) for k in want)
    assert list(got) == ["logits", "action", "log_std"]
    assert all(same_bits(got[k], v) for k, v in session.run({"obs": metadrive_obs}).items())
    ort = pp.load(metadrive_model, backend="onnxruntime").run({"obs": metadrive_obs})
    assert max(float(np.abs(got[k] - ort[k]).max()) for k in ort) <= 1e-5


@pytest.mark.parametrize("rows", [1023, 1024, 2100, 3001])
def test_forward_is_the_backend_bit_for_bit_on_batches_it_splits_into_row_blocks(expert, metadrive_model, rows):
    """From 1,024 rows the numpy backend computes in blocks of at most 512 rows, whose BLAS products
    can round otherwise than one product of every row; the module computes in the same blocks."""
    _, module = expert
    obs = np.random.default_rng(rows).uniform(0, 1, (rows, 275)).astype(np.float32)
    session = pp.load(metadrive_model, backend="numpy")
    record: dict = {}
    # the module, numpy alone, leaves the BLAS its own threads, where the backend holds each block to one; some
    # kernels (OpenBLAS's Haswell one) round a product on two threads differently, so both run on one here
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        got = module.forward(obs, record=record)
        want = session.record({"obs": obs}, "*")
        assert list(record) == list(want) and all(same_bits(record[k], want[k]) for k in want)
        assert all(same_bits(got[k], v) for k, v in session.run({"obs": obs}).items())
        steered = module.forward(obs, overrides={"fc_2/tanh": {17: 1.0}})
        assert (steered["logits"] != got["logits"]).any()
        assert same_bits(steered["logits"], session.run({"obs": obs}, overrides={"fc_2/tanh": {17: 1.0}})["logits"])


def test_export_checks_a_sample_the_backend_splits(metadrive_model, tmp_path):
    done = pp.export_numpy(metadrive_model, tmp_path / "p.py", samples=2100)
    assert done.samples == 2100


def test_the_weights_file_is_the_source_npz_under_its_own_names(expert, metadrive_weights):
    with np.load(expert[0].weights, allow_pickle=False) as f:
        stored = {k: f[k] for k in f.files}
    assert list(stored) == list(metadrive_weights)
    assert all(same_bits(stored[k], v) for k, v in metadrive_weights.items())


def test_overrides_set_neurons_as_an_observer_of_the_backend_does(expert, metadrive_model, metadrive_obs):
    _, module = expert
    session = pp.load(metadrive_model, backend="numpy")
    obs = metadrive_obs[:32]

    def steer(node_index, output_index, value):
        if session.backend.graph.nodes[node_index].outputs[output_index] == "fc_2/tanh":
            value = value.copy()
            value[..., 17] = 1.0
        return value

    want = session.observe({"obs": obs}, steer)
    record: dict = {}
    got = module.forward(obs, record=record, overrides={"fc_2/tanh": {"17": 1.0}})
    assert all(same_bits(got[k], want[k]) for k in want)
    assert (record["fc_2/tanh"][:, 17] == 1.0).all() and not (record["fc_2/linear"][:, 17] == 1.0).all()
    plain = module.forward(obs)
    assert not np.array_equal(plain["action"], got["action"])  # the override moves the action


def test_the_module_runs_where_only_numpy_exists(expert, metadrive_model, tmp_path):
    python = make_venv(tmp_path / "venv")
    done, _ = expert
    script = ("import importlib.util, json, sys, numpy as np\n"
              "spec = importlib.util.spec_from_file_location('policy', sys.argv[1])\n"
              "policy = importlib.util.module_from_spec(spec); spec.loader.exec_module(policy)\n"
              "out = policy.forward(np.full((2, 275), 0.25, np.float32))\n"
              "print(json.dumps({'action': out['action'].tolist(), 'modules': sorted(m for m in sys.modules if '.' not in m)}))\n")
    result = run(python, "-c", script, done.module)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    want = pp.load(metadrive_model, backend="numpy").run({"obs": np.full((2, 275), 0.25, np.float32)})
    assert doc["action"] == want["action"].tolist()
    third_party = [m for m in doc["modules"] if m not in sys.stdlib_module_names and not m.startswith("_")]
    assert third_party == ["numpy"]


# -------------------------------------------------------------------------------------- injection


PAYLOAD = '"); __import__("pathlib").Path("PWNED").touch() #'
NASTY = {
    "obs": 'obs"""\n__import__("os")',
    "h1": PAYLOAD,
    "h2": "a/b\nimport os\r\u2028\u202e",
    "h3": "a_b",  # sanitizes like "a/b..."
    "h4": "lambda",
    "out": "forward",  # a name the module defines itself
    "np": "np",
}


def _nasty_model():
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.normal(size=(4, 4)).astype(np.float32), "np")
    b = numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "b'''\nos.system('x')")
    nodes = [
        helper.make_node("Gemm", [NASTY["obs"], "np", b.name], [NASTY["h1"]], name=PAYLOAD, transB=1),
        helper.make_node("Tanh", [NASTY["h1"]], [NASTY["h2"]], name="n2"),
        helper.make_node("Relu", [NASTY["h2"]], [NASTY["h3"]], name="n3"),
        helper.make_node("Neg", [NASTY["h3"]], [NASTY["h4"]], name="n4"),
        helper.make_node("Add", [NASTY["h4"], NASTY["h2"]], [NASTY["out"]], name="n5"),
    ]
    graph = helper.make_graph(nodes, "g\"\"\"", [helper.make_tensor_value_info(NASTY["obs"], TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info(NASTY["out"], TensorProto.FLOAT, ["batch", 4])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_names_from_the_model_reach_the_code_only_as_literals(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    done = pp.export_numpy(_nasty_model(), tmp_path / "nasty.py", low=-1, high=1)
    assert not (tmp_path / "PWNED").exists()
    text = done.module.read_text()
    tree = ast.parse(text)
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert not any("import" in c or "system" in c or "touch" in c for c in calls)
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert set(NASTY.values()) - {"np"} <= strings  # the record keys and OUTPUTS, quoted
    module = load_module(done.module)
    record: dict = {}
    out = module.forward(np.ones((2, 4), np.float32), record=record)
    assert list(out) == ["forward"] and list(record) == [NASTY[k] for k in ("h1", "h2", "h3", "h4", "out")]
    assert not (tmp_path / "PWNED").exists()
    assert ruff(done.module).returncode == 0, ruff(done.module).stdout


# ----------------------------------------------------------------------------------- the op set


def _single(op: str, inputs: dict[str, np.ndarray], opset: int = 17, out_type=TensorProto.FLOAT, chain=(), **attrs):
    """x -> [chain ops] -> op(x, *initializers) -> y."""
    names = list(inputs)
    nodes, current = [], "x"
    for i, step in enumerate(chain):
        nodes.append(helper.make_node(step, [current], [f"pre{i}"], name=f"pre{i}"))
        current = f"pre{i}"
    nodes.append(helper.make_node(op, [current, *names[1:]], ["y"], name="node", **attrs))
    x = inputs[names[0]]
    inits = [numpy_helper.from_array(v, k) for k, v in list(inputs.items())[1:]]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", *x.shape[1:]])],
                              [helper.make_tensor_value_info("y", out_type, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


X = np.zeros((4, 6), np.float32)
V6 = np.linspace(-1, 1, 6, dtype=np.float32)
W = np.linspace(-1, 1, 30, dtype=np.float32).reshape(5, 6)
I64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
OPS = {
    "Gemm fast path, transB": ("Gemm", {"x": X, "w": W, "c": V6[:5]}, {"transB": 1}),
    "Gemm alpha beta": ("Gemm", {"x": X, "w": W, "c": V6[:5]}, {"transB": 1, "alpha": 0.5, "beta": 2.0}),
    "MatMul": ("MatMul", {"x": X, "w": W.T.copy()}, {}),
    "Add": ("Add", {"x": X, "v": V6}, {}), "Sub": ("Sub", {"x": X, "v": V6}, {}),
    "Mul": ("Mul", {"x": X, "v": V6}, {}), "Div": ("Div", {"x": X, "v": V6 + 2}, {}),
    **{op: (op, {"x": X}, {}) for op in ("Relu", "Sigmoid", "HardSwish", "Tanh", "Softplus", "Softsign", "Exp",
                                         "Neg", "Abs", "Erf", "Identity")},
    "LeakyRelu": ("LeakyRelu", {"x": X}, {"alpha": 0.2}),
    "PRelu": ("PRelu", {"x": X, "slope": V6}, {}),
    "Elu": ("Elu", {"x": X}, {"alpha": 0.7}), "Selu": ("Selu", {"x": X}, {}), "Celu": ("Celu", {"x": X}, {"alpha": 2.0}),
    "ThresholdedRelu": ("ThresholdedRelu", {"x": X}, {"alpha": 0.3}),
    "HardSigmoid": ("HardSigmoid", {"x": X}, {"alpha": 0.3, "beta": 0.4}),
    "Mish opset 18": ("Mish", {"x": X}, {"opset": 18}),
    "Gelu opset 20": ("Gelu", {"x": X}, {"opset": 20}),
    "Gelu tanh opset 20": ("Gelu", {"x": X}, {"opset": 20, "approximate": "tanh"}),
    "Log": ("Log", {"x": X}, {"chain": ("Abs",)}), "Sqrt": ("Sqrt", {"x": X}, {"chain": ("Abs",)}),
    "Reciprocal": ("Reciprocal", {"x": X}, {"chain": ("Exp",)}),
    "Slice constant": ("Slice", {"x": X, "s": I64(1), "e": I64(4), "a": I64(1)}, {}),
    "Slice negative axis and step": ("Slice", {"x": X, "s": I64(5), "e": I64(0), "a": I64(-1), "st": I64(-2)}, {}),
    "Slice opset 9": ("Slice", {"x": X}, {"opset": 9, "starts": [0], "ends": [3], "axes": [1]}),
    "Concat": ("Concat", {"x": X}, {"axis": 1, "twice": True}),
    "Clip opset 6": ("Clip", {"x": X}, {"opset": 6, "min": -0.5, "max": 0.5}),
    "Clip opset 13": ("Clip", {"x": X, "lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)}, {"opset": 13}),
    "Reshape": ("Reshape", {"x": X, "shape": I64(0, 3, 2)}, {}),
    "Flatten": ("Flatten", {"x": X}, {"axis": 0}),
    "Softmax opset 11": ("Softmax", {"x": X}, {"opset": 11, "axis": 1}),
    "Softmax": ("Softmax", {"x": X}, {"axis": -1}),
    "LogSoftmax": ("LogSoftmax", {"x": X}, {}),
    "ArgMax": ("ArgMax", {"x": X}, {"axis": 1, "keepdims": 0, "out_type": TensorProto.INT64}),
    "BatchNormalization": ("BatchNormalization", {"x": X, "s": V6 + 2, "b": V6, "m": V6 / 3, "v": V6 * V6 + 1}, {"opset": 15}),
    "LayerNormalization": ("LayerNormalization", {"x": X, "s": V6 + 2, "b": V6}, {}),
    "Dropout": ("Dropout", {"x": X}, {"opset": 13}),
    "Cast": ("Cast", {"x": X}, {"to": TensorProto.DOUBLE, "out_type": TensorProto.DOUBLE}),
}


@pytest.mark.parametrize("case", sorted(OPS))
def test_every_op_of_the_set_exports_bit_for_bit(case, tmp_path):
    op, inputs, attrs = OPS[case]
    attrs = dict(attrs)
    opset, out_type, chain = attrs.pop("opset", 17), attrs.pop("out_type", TensorProto.FLOAT), attrs.pop("chain", ())
    twice = attrs.pop("twice", False)
    model = _single(op, inputs, opset, out_type, chain, **attrs)
    if twice:
        model.graph.node[-1].input.append("x")  # x concatenated with itself
    done = pp.export_numpy(model, tmp_path / "m.py", low=-3, high=3)
    module = load_module(done.module)
    obs = np.random.default_rng(9).uniform(-3, 3, (7, 6)).astype(np.float32)
    record: dict = {}
    got = module.forward(obs, record=record)
    want = pp.load(model, backend="numpy").record({"x": obs}, "*")
    assert list(record) == list(want) and all(same_bits(record[k], want[k]) for k in want)
    assert same_bits(got["y"], want["y"])
    assert ruff(done.module).returncode == 0, ruff(done.module).stdout


# -------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("model,pattern", [
    (lambda: _single("Transpose", {"x": X}), r'Transpose node "node" is outside the op set export-numpy writes \(Abs, '),
    (lambda: _single("Dropout", {"x": X, "r": np.array(0.5, np.float32), "t": np.array(True)}, 13),
     r'Dropout node "node" may run in training mode'),
    (lambda: _single("LayerNormalization", {"x": X, "s": V6}), None),
])
def test_what_it_cannot_write_is_refused_naming_the_node_and_nothing_is_written(model, pattern, tmp_path):
    m = model()
    if pattern is None:  # a second output
        m.graph.node[-1].output.append("mean")
        pattern = r'LayerNormalization node "node" has 2 outputs'
    with pytest.raises(pp.UnsupportedOpError, match=pattern):
        pp.export_numpy(m, tmp_path / "m.py")
    assert list(tmp_path.iterdir()) == []


def test_a_reshape_to_a_computed_shape_is_refused(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="r"),
             helper.make_node("Reshape", ["r", "x_shape"], ["y"], name="reshape")]
    shape = helper.make_node("Constant", [], ["x_shape"], name="shape", value=numpy_helper.from_array(I64(0, 6)))
    graph = helper.make_graph([shape, *nodes], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(pp.UnsupportedOpError, match=r"Reshape node \"reshape\" takes its shape from tensor 'x_shape'"):
        pp.export_numpy(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.py")


def test_a_module_that_does_not_reproduce_the_backend_is_not_written(metadrive_model, tmp_path, monkeypatch):
    (tmp_path / "p.py").write_text("old module")
    (tmp_path / "p.npz").write_bytes(b"old weights")
    real = exporter.generate

    def off_by_a_bit(model, samples=64):
        source, arrays = real(model, samples)
        return source.replace("np.tanh(fc_2_linear)", "np.tanh(fc_2_linear * np.float32(1.0000001))"), arrays

    monkeypatch.setattr(exporter, "generate", off_by_a_bit)
    with pytest.raises(pp.VerificationError, match=r"does not reproduce the numpy backend on tensor 'fc_2/tanh'"):
        pp.export_numpy(metadrive_model, tmp_path / "p.py", force=True)
    assert (tmp_path / "p.py").read_text() == "old module" and (tmp_path / "p.npz").read_bytes() == b"old weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.npz", "p.py"]


def test_existing_outputs_need_force_and_are_replaced_together(metadrive_model, tmp_path):
    (tmp_path / "p.npz").write_bytes(b"mine")
    with pytest.raises(pp.OutputExistsError, match=r"p\.npz exists; overwrite it with --force"):
        pp.export_numpy(metadrive_model, tmp_path / "p.py")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.npz"]
    pp.export_numpy(metadrive_model, tmp_path / "p.py", force=True, samples=4)
    assert load_module(tmp_path / "p.py").forward(np.zeros((1, 275), np.float32))["action"].shape == (1, 2)


# ------------------------------------------------------------------------------------------- CLI


def test_the_command(metadrive_model, tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(metadrive_model.SerializeToString())
    runner = CliRunner()
    ok = runner.invoke(app, ["export-numpy", str(model), "-o", str(tmp_path / "policy.py")])
    assert ok.exit_code == 0, ok.output
    assert f"policy.py: {len((tmp_path / 'policy.py').read_text().splitlines())} lines, numpy only; forward() " \
           "reproduces the numpy backend bit for bit on 64 observations, all 7 tensors" in ok.stdout
    assert ok.stdout.splitlines()[-4:] == ["the model assumes (not in its source file):",
                                           *(f"  {line}" for line in EXPERT_ASSUMES)]  # as verify prints them
    as_json = runner.invoke(app, ["export-numpy", str(model), "-o", str(tmp_path / "policy.py"), "--force", "--json"])
    doc = json.loads(as_json.stdout)
    assert doc["tensors"] == 7
    assert [f"{a['topic']} {a['assumes']}: {a['because']}; {a['settle']}" for a in doc["assumptions"]] == list(EXPERT_ASSUMES)
    usage = runner.invoke(app, ["export-numpy", str(model), "-o", str(tmp_path / "policy.txt")])
    assert usage.exit_code == 2 and "must end in .py" in usage.stderr
    transposed = tmp_path / "t.onnx"
    transposed.write_bytes(_single("Transpose", {"x": X}).SerializeToString())
    refused = runner.invoke(app, ["export-numpy", str(transposed), "-o", str(tmp_path / "t.py")])
    assert refused.exit_code == 3 and 'Transpose node "node" is outside the op set' in refused.stderr


def test_the_module_checks_its_inputs_and_overrides(tmp_path):
    model = pp.convert(EXPERT, activation="tanh", head="diag-gaussian")
    done = pp.export_numpy(model, tmp_path / "policy.py")
    policy = load_module(done.module)
    obs = np.random.default_rng(0).uniform(0, 1, (3, 275)).astype(np.float32)
    base = policy.forward(obs)["action"]
    with pytest.raises(ValueError, match=r"input 'obs' expects float32 of shape \('batch', 275\), got float64"):
        policy.forward(obs.astype(np.float64))
    with pytest.raises(ValueError, match=r"got float32 of shape \(275,\) \(add a batch axis: x\[None\]\)"):
        policy.forward(obs[0])
    with pytest.raises(KeyError, match="overrides name tensor 'fc2/tanh', which this policy does not compute"):
        policy.forward(obs, overrides={"fc2/tanh": {17: 1.0}})
    for bad in (-1, 1.5, "x"):
        with pytest.raises(ValueError, match="is not a neuron number"):
            policy.forward(obs, overrides={"fc_2/tanh": {bad: 1.0}})
    with pytest.raises(IndexError, match="neuron 256 is out of range; it has 256"):
        policy.forward(obs, overrides={"fc_2/tanh": {256: 1.0}})
    steered = policy.forward(obs, overrides={"fc_2/tanh": {"3,17": 1.0}}, record=(rec := {}))
    np.testing.assert_array_equal(rec["fc_2/tanh"][:, [3, 17]], 1.0)
    assert not np.array_equal(steered["action"], base)


# ------------------------------------------------------------------------------- names and collisions

#: Names the generated module, Python or numpy already use, as tensors and weights might be called.
TAKEN = ["checked", "record", "overrides", "tap", "observer", "seen", "forward", "np", "math", "Path", "WEIGHTS",
         "weights", "INPUTS", "inputs", "OUTPUTS", "TENSORS", "tensors", "ONNX_DTYPES", "onnx_dtype", "leaky_relu",
         "softplus", "_softplus", "hard_sigmoid", "list", "len", "print", "id", "type", "object", "class", "def",
         "lambda", "None", "True", "match", "_", "__name__", "__file__", "__builtins__", "__init__", "__dict__",
         "obs", "obs_", "OBS", "1x", "x-y", "x y", "é", "ñ_2"]
NAMES = st.one_of(st.sampled_from(TAKEN),
                  st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1, max_size=12))


def _named_model(obs, w, b, h1, h2, h3, out):
    """obs -> Gemm(w, b) -> h1 -> LeakyRelu -> h2 -> Tanh -> h3 -> Softplus -> out: inline code and helpers."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.normal(size=(3, 4)).astype(np.float32), w),
             numpy_helper.from_array(rng.normal(size=(3,)).astype(np.float32), b)]
    nodes = [helper.make_node("Gemm", [obs, w, b], [h1], name="fc", transB=1),
             helper.make_node("LeakyRelu", [h1], [h2], name="leak", alpha=0.1),
             helper.make_node("Tanh", [h2], [h3], name="squash"),
             helper.make_node("Softplus", [h3], [out], name="soft")]
    graph = helper.make_graph(nodes, "names", [helper.make_tensor_value_info(obs, TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch", 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("names", [
    ("obs", "w", "b", "checked", "h2", "h3", "y"),  # a tensor named like the input check
    ("checked", "w", "b", "h1", "h2", "h3", "y"),  # an input named like it
    ("record", "overrides", "np", "tap", "leaky_relu", "softplus", "forward"),
    ("obs", "weights", "WEIGHTS", "_softplus", "observer", "TENSORS", "seen"),
])
def test_tensors_named_like_the_modules_own_names_export_and_reproduce_the_backend(tmp_path, names):
    _check_named_export(tmp_path, names)


@settings(max_examples=40, deadline=None)
@given(st.lists(NAMES, min_size=7, max_size=7, unique=True))
def test_any_tensor_names_export_and_reproduce_the_backend(tmp_path_factory, names):
    _check_named_export(tmp_path_factory.mktemp("named"), names)


def test_a_weight_named_with_a_nul_character_is_refused_and_nothing_is_written(tmp_path):
    with pytest.raises(pp.BadModelError, match=r"'w\\x00x' holds a NUL character \(\\x00\), which the member names of an "
                                               r"\.npz \(a zip archive\) cannot hold"):
        pp.export_numpy(_named_model("obs", "w\0x", "b", "h1", "h2", "h3", "y"), tmp_path / "policy.py")
    assert list(tmp_path.iterdir()) == []


def _check_named_export(folder: Path, names) -> None:
    model = _named_model(*names)
    done = pp.export_numpy(model, folder / "policy.py", samples=8, low=-2, high=2)
    module = load_module(done.module)
    obs = np.random.default_rng(9).uniform(-2, 2, (5, 4)).astype(np.float32)
    record: dict = {}
    got = module.forward(obs, record=record)
    session = pp.load(model, backend="numpy")
    want = session.record({names[0]: obs}, "*")
    assert list(record) == list(want) == [names[3], names[4], names[5], names[6]]
    assert all(same_bits(record[k], want[k]) for k in want)
    assert list(got) == [names[6]] and same_bits(got[names[6]], session.run({names[0]: obs})[names[6]])
