"""The graph view checks what every backend relies on: each tensor defined once, before it is read."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import policyport as pp
from policyport.graph.model import from_onnx


def chain(order=(0, 1, 2), tanh_reads="h"):
    """obs -> Gemm(w) -> Tanh -> Relu -> y, nodes listed in ``order``."""
    nodes = [helper.make_node("Gemm", ["obs", "w"], ["h"], name="gemm"),
             helper.make_node("Tanh", [tanh_reads], ["t"], name="tanh"),
             helper.make_node("Relu", ["t"], ["y"], name="relu")]
    graph = helper.make_graph([nodes[i] for i in order], "g",
                              [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
                              [numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2) / 6, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_nodes_out_of_order_are_sorted_and_run_like_onnxruntime():
    model = chain(order=(2, 0, 1))
    assert [n.name for n in from_onnx(model).nodes] == ["gemm", "tanh", "relu"]
    obs = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    got = pp.load(model).run({"obs": obs})["y"]
    want = pp.load(model, backend="onnxruntime").run({"obs": obs})["y"]
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(got, np.maximum(np.tanh(obs @ (np.arange(6, dtype=np.float32).reshape(3, 2) / 6)), 0), atol=1e-6)


def test_an_ordered_graph_keeps_its_node_list():
    model = chain()
    graph = from_onnx(model)
    assert [n.name for n in graph.nodes] == ["gemm", "tanh", "relu"]


@pytest.mark.parametrize("model,message", [
    (lambda: chain(tanh_reads="nowhere"), 'Tanh node "tanh" reads tensor \'nowhere\', which no graph input'),
    (lambda: chain(tanh_reads="y"), 'Tanh node "tanh" depends on its own output'),
])
def test_undefined_and_cyclic_tensors_are_refused_naming_the_node(model, message):
    with pytest.raises(pp.BadModelError, match=message.replace("(", r"\(")):
        from_onnx(model())


def test_a_tensor_defined_twice_is_refused():
    model = chain()
    model.graph.node[2].output[0] = "h"
    model.graph.output[0].name = "h"
    with pytest.raises(pp.BadModelError, match='Relu node "relu" outputs tensor \'h\', which Gemm node "gemm" already defines'):
        from_onnx(model)


def test_an_undefined_graph_output_is_refused():
    model = chain()
    model.graph.output[0].name = "not_produced"
    with pytest.raises(pp.BadModelError, match="graph output 'not_produced' is not defined"):
        from_onnx(model)


def _single(node, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph([node], "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def test_an_omitted_required_input_is_refused_naming_the_node_and_input():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])
    model = _single(helper.make_node("Slice", ["x", "starts", ""], ["y"], name="cut"), [x], [y],
                    [numpy_helper.from_array(np.array([0], np.int64), "starts")])
    with pytest.raises(pp.BadModelError, match=r'Slice node "cut" \(opset 17\): input 2 \(ends\) is required but omitted'):
        pp.load(model)
    too_many = _single(helper.make_node("Tanh", ["x", "x"], ["y"], name="t"), [x], [y])
    with pytest.raises(pp.BadModelError, match=r'Tanh node "t" \(opset 17\): it has 2 inputs; the operator takes at most 1'):
        pp.load(too_many)


def _schema_from_onnx(onnx, op_type, opset, domain):
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None
    return schema.since_version, {name: (a.type.value, bool(a.required)) for name, a in schema.attributes.items()}


def test_schema_attributes_answer_as_onnx_defs_for_every_op_and_opset():
    import onnx
    import onnx.defs

    from policyport.graph.model import schema_attributes

    newest = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        key = (schema.domain, schema.name)
        newest[key] = max(newest.get(key, 0), schema.since_version)
    keys = [*newest, ("ai.onnx", "Gemm"), ("", "NoSuchOp"), ("com.example", "Relu")]
    checked = 0
    for domain, op_type in keys:
        for opset in range(0, newest.get((domain, op_type), 1) + 3):
            got = schema_attributes(onnx, op_type, opset, domain)
            # onnx.defs knows the default domain as "" only; ONNX names it "ai.onnx" too, and so does policyport
            want = _schema_from_onnx(onnx, op_type, opset, "" if domain == "ai.onnx" else domain)
            assert got == want, (domain, op_type, opset)
            if want is not None:  # the order of attributes too: it orders the "missing" message
                assert list(got[1]) == list(want[1]), (domain, op_type, opset)
                checked += 1
    assert checked > 2000 and len(newest) > 200


def test_schema_attributes_come_from_the_table_for_its_onnx_version(monkeypatch):
    import onnx
    import onnx.defs

    from policyport.graph import schemas as onnx_schemas
    from policyport.graph.model import schema_attributes

    if onnx.__version__ != onnx_schemas.ONNX_VERSION:
        pytest.skip(f"the table is of onnx {onnx_schemas.ONNX_VERSION}, onnx {onnx.__version__} is installed: "
                    "run scripts/update_onnx_schemas.py")

    asked = []
    real = onnx.defs.get_schema

    def recording(*args):
        asked.append(args)
        return real(*args)

    monkeypatch.setattr(onnx.defs, "get_schema", recording)
    assert schema_attributes(onnx, "Gemm", 17, "") == (13, {"alpha": (1, False), "beta": (1, False),
                                                            "transA": (2, False), "transB": (2, False)})
    assert schema_attributes(onnx, "Cast", 12, "")[0] == 9 and schema_attributes(onnx, "Gemm", 17, "x.y") is None
    assert asked == []
    monkeypatch.setattr(onnx_schemas, "ONNX_VERSION", "0.0")  # another onnx: asked directly
    assert schema_attributes(onnx, "Gemm", 17, "")[0] == 13 and asked == [("Gemm", 17, "")]


def test_attributes_of_the_wrong_type_or_missing_are_refused_as_onnxruntime_refuses_them():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["batch", 4])
    wrong = _single(helper.make_node("Cast", ["x"], ["y"], name="c", to=[0.5, 1.5]), [x], [y])
    with pytest.raises(pp.BadModelError, match=r'Cast node "c": attribute \'to\' is a list of floats; Cast-13 makes it an int'):
        from_onnx(wrong)
    with pytest.raises(pp.BadModelError):
        pp.load(wrong, backend="onnxruntime")  # onnxruntime refuses it too
    missing = _single(helper.make_node("Cast", ["x"], ["y"], name="c"), [x], [y])
    with pytest.raises(pp.BadModelError, match=r'Cast node "c": required attribute\(s\) to missing \(Cast-13\)'):
        from_onnx(missing)
