"""Write the seed models the mutation fuzzer starts from (tests/fuzz/corpus/*.onnx).

Run from the repository root: ``python tests/fuzz/make_corpus.py``. Deterministic (numpy seed 0),
needs onnx and policyport. The models are small (a few KB) and shaped like real exporters' output:
a policyport-converted RLlib MLP, a torch-style graph (Gemm transB, LayerNormalization, Softmax,
ArgMax, Split, Concat, Reshape), and a two-input graph with a scalar temperature.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import policyport as pp

OUT = Path(__file__).with_name("corpus")
rng = np.random.default_rng(0)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def rllib_mlp():
    w = {"default_policy/fc_1/kernel": f32(6, 16), "default_policy/fc_1/bias": f32(16),
         "default_policy/fc_2/kernel": f32(16, 16), "default_policy/fc_2/bias": f32(16),
         "default_policy/fc_out/kernel": f32(16, 4), "default_policy/fc_out/bias": f32(4)}
    return pp.convert(w, activation="tanh", head="diag-gaussian")


def torch_style():
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("0.weight", f32(16, 8)), ("0.bias", f32(16)), ("ln.weight", f32(16)), ("ln.bias", f32(16)),
        ("2.weight", f32(6, 16)), ("2.bias", f32(6)), ("shape", np.array([0, 2, 3], np.int64)),
        ("split", np.array([3, 3], np.int64))]]
    nodes = [
        helper.make_node("Gemm", ["obs", "0.weight", "0.bias"], ["h0"], name="/0/Gemm", transB=1),
        helper.make_node("LayerNormalization", ["h0", "ln.weight", "ln.bias"], ["h1"], name="/ln/LayerNorm", axis=-1, epsilon=1e-5),
        helper.make_node("Relu", ["h1"], ["h2"], name="/1/Relu"),
        helper.make_node("Gemm", ["h2", "2.weight", "2.bias"], ["logits"], name="/2/Gemm", transB=1),
        helper.make_node("Split", ["logits", "split"], ["a", "b"], name="/split", axis=1),
        helper.make_node("Softmax", ["a"], ["probs"], name="/softmax", axis=-1),
        helper.make_node("ArgMax", ["probs"], ["action"], name="/argmax", axis=1, keepdims=0),
        helper.make_node("Concat", ["b", "a"], ["cat"], name="/concat", axis=1),
        helper.make_node("Reshape", ["cat", "shape"], ["grid"], name="/reshape"),
    ]
    graph = helper.make_graph(nodes, "torch_jit", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("action", TensorProto.INT64, ["batch"]),
                               helper.make_tensor_value_info("grid", TensorProto.FLOAT, ["batch", 2, 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")
    model.ir_version = 8
    return model


def two_inputs():
    inits = [numpy_helper.from_array(f32(4, 3), "w"), numpy_helper.from_array(np.float32(0.5), "floor")]
    nodes = [
        helper.make_node("MatMul", ["obs", "w"], ["z"], name="mm"),
        helper.make_node("Div", ["z", "temperature"], ["scaled"], name="div"),
        helper.make_node("Max", ["scaled", "floor"], ["clipped"], name="max"),
        helper.make_node("Tanh", ["clipped"], ["mean"], name="tanh"),
        helper.make_node("Cast", ["mean"], ["mean64"], name="cast", to=TensorProto.DOUBLE),
    ]
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("temperature", TensorProto.FLOAT, []),
                                             helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("mean", TensorProto.FLOAT, ["batch", 3]),
                               helper.make_tensor_value_info("mean64", TensorProto.DOUBLE, ["batch", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    return model


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    for name, make in (("rllib_mlp", rllib_mlp), ("torch_style", torch_style), ("two_inputs", two_inputs)):
        model = make()
        onnx.checker.check_model(model, full_check=True)
        onnx.save(model, OUT / f"{name}.onnx")
        print(f"wrote {OUT / name}.onnx")
