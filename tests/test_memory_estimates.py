"""Every memory estimate that gates a command, against the peak the work it gates reaches.

Each case runs in a fresh process: the peak resident set size is reset (Linux's
``/proc/self/clear_refs``) after the model, the observations and a first run on two rows are in
memory, and read back (``VmHWM``) after the work; the peak is what the work added to what the
process held when it was checked. An estimate must be at least that peak and at most twice it.
Inputs are tens of MB; the user's 25-million-row run is the one large case (slow).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_cli import invoke  # noqa: E402  (pytest puts tests/ on sys.path)


def _can_reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _can_reset_peak(), reason="measuring a peak needs Linux's /proc/self/clear_refs")

#: What every measured script starts with: ``peak(work)`` runs ``work`` and gives the bytes it added
#: at its peak to what the process held before.
HARNESS = '''
import gc, json, sys
import numpy as np
import policyport as pp


def _status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def peak(work):
    gc.collect()
    before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    work()
    return _status("VmHWM") - before


def checks(*modules):
    """The bytes and messages of every memory check ``modules`` make, in order, the checks still made."""
    asked, real = [], modules[0].check_memory

    def check(nbytes, what):
        asked.append((nbytes, what))
        real(nbytes, what)

    for module in modules:
        module.check_memory = check
    return asked
'''


def measure(script: str, **values) -> dict:
    """Run ``script`` (after :data:`HARNESS`, with ``values`` bound) in a fresh process; the JSON it prints last."""
    bound = "".join(f"{k} = {v!r}\n" for k, v in values.items())
    proc = subprocess.run([sys.executable, "-c", HARNESS + bound + script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def mlp(path: Path, sizes: list[int], activation: str = "Tanh", centered: bool = False, seed: int = 0) -> Path:
    """An MLP ``obs -> Gemm -> activation ... -> logits`` (``centered``: the batch's mean taken off the
    observations first, which mixes rows, so the numpy backend runs every batch whole)."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "obs"
    if centered:
        nodes += [helper.make_node("ReduceMean", ["obs"], ["mean"], name="mean", axes=[0], keepdims=1),
                  helper.make_node("Sub", ["obs", "mean"], ["centered"], name="centered")]
        prev = "centered"
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        inits += [numpy_helper.from_array((rng.standard_normal((n_in, n_out)) * 0.3).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array((rng.standard_normal(n_out) * 0.1).astype(np.float32), f"b{i}")]
        out = "logits" if i == len(sizes) - 2 else f"fc_{i + 1}/linear"
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [out], name=out))
        prev = out
        if out != "logits":
            prev = f"fc_{i + 1}/{activation.lower()}"
            nodes.append(helper.make_node(activation, [out], [prev], name=prev))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", sizes[0]])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", sizes[-1]])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def within_twice(estimate: int, peak: int) -> bool:
    return peak <= estimate <= 2 * peak


SESSION = '''
session = pp.load(model, backend=backend, threads=threads)
obs = np.random.default_rng(0).uniform(0, 1, (rows, session.inputs[0].shape[1])).astype(np.float32)
session.run(obs[:2])
estimate = session.memory_needed(obs, tensors)
work = (lambda: session.run(obs)) if tensors is None else (lambda: session.record(obs, tensors))
print(json.dumps({"estimate": estimate, "peak": peak(work)}))
'''


@pytest.mark.parametrize("sizes, activation, centered, backend, tensors, rows, threads", [
    ([16, 128, 128, 64], "Tanh", False, "numpy", None, 200_000, 0),  # row blocks: the outputs, 51 MB
    ([16, 128, 128, 64], "Tanh", False, "numpy", None, 200_000, 1),
    ([16, 128, 128, 64], "Tanh", False, "numpy", "*", 20_000, 0),  # every tensor, 46 MB
    ([16, 128, 128, 64], "Tanh", False, "numpy", "fc_2/*", 40_000, 0),
    ([32, 256, 256, 8], "Relu", True, "numpy", None, 20_000, 0),  # run whole, ReLUs over their Gemms' arrays
    ([32, 256, 256, 8], "Relu", True, "numpy", "*", 20_000, 0),
    ([16, 128, 128, 64], "Tanh", False, "onnxruntime", None, 50_000, 0),  # two layers at once, 51 MB
    ([16, 128, 128, 64], "Tanh", False, "onnxruntime", "*", 20_000, 0),
    ([32, 256, 256, 8], "Relu", True, "onnxruntime", None, 20_000, 0),
])
def test_a_run_or_record_needs_what_its_estimate_says(tmp_path, sizes, activation, centered, backend, tensors, rows,
                                                      threads):
    model = mlp(tmp_path / "m.onnx", sizes, activation, centered)
    got = measure(SESSION, model=str(model), backend=backend, tensors=tensors, rows=rows, threads=threads)
    assert got["peak"] > 10 << 20  # the case measures tens of MB, not the allocator's noise
    assert within_twice(got["estimate"], got["peak"]), got


def wide(path: Path, width: int, log_std: bool = True, seed: int = 0) -> Path:
    """A policy of one wide hidden layer, ``obs (8) -> Gemm (width) -> Tanh -> Gemm (16) -> Tanh -> Gemm
    (2) -> action``; ``log_std``: with a free log_std expanded to the action's shape and concatenated after
    it, as SB3 exports a Box policy (Shape and Expand: the numpy backend runs every batch whole)."""
    rng = np.random.default_rng(seed)
    inits, nodes, prev = [], [], "obs"
    for i, (n_in, n_out) in enumerate([(8, width), (width, 16), (16, 2)]):
        inits += [numpy_helper.from_array((rng.standard_normal((n_out, n_in)) * 0.3).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array((rng.standard_normal(n_out) * 0.1).astype(np.float32), f"b{i}")]
        out = "action" if i == 2 else f"fc_{i + 1}/linear"
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [out], name=out, transB=1))
        prev = out
        if i < 2:
            prev = f"fc_{i + 1}/tanh"
            nodes.append(helper.make_node("Tanh", [out], [prev], name=prev))
    outputs = [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 2])]
    if log_std:
        inits.append(numpy_helper.from_array(np.full(2, -0.5, np.float32), "log_std/parameter"))
        nodes += [helper.make_node("Shape", ["action"], ["action/shape"], name="action/shape"),
                  helper.make_node("Expand", ["log_std/parameter", "action/shape"], ["log_std"], name="log_std"),
                  helper.make_node("Concat", ["action", "log_std"], ["logits"], name="logits", axis=1)]
        outputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", w]) for n, w in (("log_std", 2),
                                                                                                  ("logits", 4))]
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 8])],
                              outputs, inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.parametrize("backend, tensors, log_std", [
    ("numpy", None, True),  # run whole (Shape, Expand): the tanh over its Gemm's array; the next Gemm copies nothing
    ("numpy", "*", True),
    ("onnxruntime", None, True),  # the tanh written over its Gemm's buffer
    ("onnxruntime", None, False),
    ("onnxruntime", "*", True),
])
def test_a_wide_layer_is_held_once_where_the_backend_computes_its_activation_over_it(tmp_path, backend, tensors,
                                                                                      log_std):
    """A user's SB3-like policy with a 16,384-unit layer, at 200,000 rows, was refused for 24.4 GiB (numpy)
    and 30.5 GiB (onnxruntime) where it took 12.3 and 12.8: here 4,096 units on 2,000 rows, 31 MB a tensor."""
    model = wide(tmp_path / "m.onnx", 4096, log_std)
    got = measure(SESSION, model=str(model), backend=backend, tensors=tensors, rows=2000, threads=0)
    assert got["peak"] > 25 << 20
    assert within_twice(got["estimate"], got["peak"]), got


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_16384_unit_layer_on_40000_rows_needs_about_the_one_array_it_holds(tmp_path, backend):
    """The user's model at a fifth of the rows: 2.4 GiB a tensor."""
    model = wide(tmp_path / "m.onnx", 16384)
    got = measure(SESSION, model=str(model), backend=backend, tensors=None, rows=40_000, threads=0)
    assert got["peak"] > 2 << 30
    assert within_twice(got["estimate"], got["peak"]) and got["estimate"] < 1.3 * got["peak"], got


def keras_layers(path: Path, sizes: list[int], activation: str) -> Path:
    """An MLP as tf2onnx writes a Keras model: each layer a MatMul, an Add of its bias, then the activation."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "obs"
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        inits += [numpy_helper.from_array((rng.standard_normal((n_in, n_out)) * 0.3).astype(np.float32), f"fc_{i}/kernel"),
                  numpy_helper.from_array((rng.standard_normal(n_out) * 0.1).astype(np.float32), f"fc_{i}/bias")]
        last = i == len(sizes) - 2
        nodes += [helper.make_node("MatMul", [prev, f"fc_{i}/kernel"], [f"fc_{i}/MatMul"]),
                  helper.make_node("Add", [f"fc_{i}/MatMul", f"fc_{i}/bias"], ["logits" if last else f"fc_{i}/BiasAdd"])]
        prev = "logits" if last else f"fc_{i}/BiasAdd"
        if not last:
            nodes.append(helper.make_node(activation, [prev], [f"fc_{i}"]))
            prev = f"fc_{i}"
    graph = helper.make_graph(nodes, "keras", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", sizes[0]])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", sizes[-1]])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.parametrize("activation, backend, tensors, layers", [
    ("Sigmoid", "numpy", None, "gemm"),  # exp(-|x|), 1 + e, two ratios and a mask while it runs
    ("Erf", "numpy", None, "gemm"),  # evaluated in float64
    ("LeakyRelu", "numpy", "*", "gemm"),
    ("Sigmoid", "onnxruntime", None, "gemm"),  # written over its input
    ("HardSwish", "onnxruntime", None, "gemm"),  # run as its function body: HardSigmoid, then Mul
    ("Relu", "onnxruntime", None, "keras"),  # MatMul and Add fused into one Gemm
])
def test_what_an_activation_holds_while_it_runs_is_counted(tmp_path, activation, backend, tensors, layers):
    """A 4,096-unit layer, 65 MB a tensor (which the C library maps apart: smaller arrays come from its
    heap, which keeps some of what is freed); on numpy, batches run whole (a batch's mean taken off the
    observations)."""
    sizes = [16, 4096, 512, 8]
    if layers == "keras":
        model = keras_layers(tmp_path / "m.onnx", sizes, activation)
    else:
        model = mlp(tmp_path / "m.onnx", sizes, activation, centered=True)
    got = measure(SESSION, model=str(model), backend=backend, tensors=tensors, rows=4000, threads=0)
    assert got["peak"] > 60 << 20
    assert within_twice(got["estimate"], got["peak"]), got


VERIFY = '''
import policyport.verification.verify as verification
asked = checks(verification)
obs = np.random.default_rng(0).uniform(0, 1, (rows, 8)).astype(np.float32)
verification.BLOCK_BYTES = block_bytes
pp.verify(model, obs[:3], **options)
asked.clear()
report = {}
used = peak(lambda: report.update(pp.verify(model, obs, **options).to_dict()))
print(json.dumps({"peak": used, "asked": asked, "oracle": report["oracle"]}))
'''


@pytest.mark.parametrize("rows, block_bytes, forced", [(20_000, 256 << 20, False), (20_000, 256 << 20, True),
                                                       (60_000, 48 << 20, False), (60_000, 48 << 20, True)])
def test_verify_needs_what_its_checks_say_for_the_comparison_and_the_float64_run(tmp_path, rows, block_bytes, forced):
    """The comparison's check covers a verification that passes; with zero tolerances the float64 run
    of the rounding rule follows, and its own check covers it."""
    model = mlp(tmp_path / "m.onnx", [8, 64, 64, 2])
    options = {"backends": ["numpy", "onnxruntime"], **({"atol": 0.0, "rtol": 0.0} if forced else {})}
    got = measure(VERIFY, model=str(model), rows=rows, block_bytes=block_bytes, options=options)
    (compare, what), *oracle = got["asked"]
    assert what.startswith(f"verifying {rows:,} observations") and ("blocks" in what) == (rows == 60_000)
    assert got["peak"] > 10 << 20
    if forced:
        assert got["oracle"] == "numpy float64" and oracle[0][1].startswith("the rounding rule's float64 run")
        assert within_twice(oracle[0][0], got["peak"]), got
    else:
        assert got["oracle"] is None and oracle == []
        assert within_twice(compare, got["peak"]), got


HAND_OFF = '''
import policyport.handoff.pack as bundle, policyport.handoff.export_numpy as export, policyport.io.limits as files
import policyport.verification.verify as verification
asked = checks(bundle, files, verification)
def work():
    if command == "pack":
        pp.pack(model, out, samples=samples)
    else:
        pp.export_numpy(model, out + ".py", samples=samples)
used = peak(work)
print(json.dumps({"peak": used, "asked": asked}))
'''


@pytest.mark.parametrize("command", ["pack", "export-numpy"])
def test_pack_and_export_numpy_need_what_their_checks_say(tmp_path, command):
    """Their checks one after another (the observations drawn, the golden data or the module's check,
    the verification) add up to the work they gate."""
    model = mlp(tmp_path / "m.onnx", [32, 256, 256, 8], "Relu")
    got = measure(HAND_OFF, model=str(model), out=str(tmp_path / "out"), samples=20_000, command=command)
    whats = [what for _, what in got["asked"]]
    assert whats[0] == "drawing 20,000 observations for 1 input(s)"
    assert whats[1] == ("recording the golden data of 20,000 observations (5 tensors each) and reading it back"
                        if command == "pack" else "checking the module on 20,000 observations")
    assert got["peak"] > 10 << 20
    assert within_twice(sum(n for n, _ in got["asked"]), got["peak"]), got


def _run_needs(model: Path, obs: Path) -> dict:
    return measure('''
session = pp.load(model)
obs = np.load(obs_path)
session.run(obs[:2])
print(json.dumps({"estimate": session.memory_needed(obs), "peak": peak(lambda: session.run(obs))}))
''', model=str(model), obs_path=str(obs))


def test_run_on_many_rows_of_few_features_is_not_refused_for_memory_it_does_not_need(tmp_path, monkeypatch):
    """2,000,000 rows of 8 features (64 MB) through an 8-64-64-2 MLP: the run holds its 16 MB of logits
    and a few row blocks, not every layer's activations of every row (2 GB)."""
    model = mlp(tmp_path / "m.onnx", [8, 64, 64, 2])
    np.save(tmp_path / "obs.npy", np.random.default_rng(1).uniform(0, 1, (2_000_000, 8)).astype(np.float32))
    got = _run_needs(model, tmp_path / "obs.npy")
    assert within_twice(got["estimate"], got["peak"]) and got["estimate"] < 32 << 20, got
    monkeypatch.setenv("POLICYPORT_MAX_MEMORY", str(2 * got["estimate"]))
    assert invoke("run", model, "-i", tmp_path / "obs.npy", "-o", tmp_path / "y.npz").exit_code == 0
    monkeypatch.setenv("POLICYPORT_MAX_MEMORY", "8M")
    result = invoke("run", model, "-i", tmp_path / "obs.npy", "-o", tmp_path / "z.npz")
    assert result.exit_code == 3 and not (tmp_path / "z.npz").exists()
    from policyport.io.limits import format_size

    assert f"running 2,000,000 rows of {tmp_path / 'obs.npy'} needs about {format_size(got['estimate'])}, more " \
           "than 8 MiB" in result.stderr.replace("\n", " ")


@pytest.mark.slow
def test_run_on_25_million_rows_of_8_features_needs_about_what_it_holds(tmp_path):
    """The 800 MB input of a user's report: the run needs its 200 MB of logits, not 24 GiB."""
    model = mlp(tmp_path / "m.onnx", [8, 64, 64, 2])
    np.save(tmp_path / "obs.npy", np.random.default_rng(2).uniform(0, 1, (25_000_000, 8)).astype(np.float32))
    got = _run_needs(model, tmp_path / "obs.npy")
    assert within_twice(got["estimate"], got["peak"]) and got["estimate"] < 256 << 20, got
