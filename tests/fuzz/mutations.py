"""Mutations of ONNX models, the way broken exporters and hostile files break them.

Each mutation is a function ``(model, rng) -> None`` that changes a *copy* of a model in place; the
randomness comes from ``rng`` (a ``random.Random``) so that a failing case is reproduced by its
(seed model, [(mutation, seed), ...]) recipe alone.
"""

from __future__ import annotations

import random

import numpy as np
from onnx import AttributeProto, ModelProto, TensorProto, helper, numpy_helper


def _pick(rng: random.Random, items):
    items = list(items)
    return rng.choice(items) if items else None


def drop_initializer(model: ModelProto, rng: random.Random) -> None:
    if model.graph.initializer:
        del model.graph.initializer[rng.randrange(len(model.graph.initializer))]


def rename_initializer(model: ModelProto, rng: random.Random) -> None:
    init = _pick(rng, model.graph.initializer)
    if init is not None:
        init.name = rng.choice(["renamed", init.name + "_x", "", "obs", "logits"])


def dangle_node_input(model: ModelProto, rng: random.Random) -> None:
    node = _pick(rng, [n for n in model.graph.node if n.input])
    if node is not None:
        node.input[rng.randrange(len(node.input))] = rng.choice(["nowhere", "", "obs", node.output[0]])


def duplicate_output(model: ModelProto, rng: random.Random) -> None:
    if len(model.graph.node) >= 2:
        a, b = rng.sample(range(len(model.graph.node)), 2)
        model.graph.node[a].output[0] = model.graph.node[b].output[0]


def reorder_nodes(model: ModelProto, rng: random.Random) -> None:
    nodes = list(model.graph.node)
    rng.shuffle(nodes)
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def corrupt_attribute(model: ModelProto, rng: random.Random) -> None:
    node = _pick(rng, model.graph.node)
    if node is None:
        return
    choice = rng.randrange(6)
    if choice == 0 and node.attribute:  # drop one
        del node.attribute[rng.randrange(len(node.attribute))]
    elif choice == 1 and node.attribute:  # same name, another type
        a = node.attribute[rng.randrange(len(node.attribute))]
        name = a.name
        node.attribute.remove(a)
        node.attribute.append(rng.choice([
            helper.make_attribute(name, "text"), helper.make_attribute(name, 2.5),
            helper.make_attribute(name, [1, 2, 3]), helper.make_attribute(name, -(2**40)),
            helper.make_attribute(name, [0.5, 1.5]),
        ]))
    elif choice == 2:  # a string attribute that is not UTF-8
        a = AttributeProto(name=rng.choice(["mode", "direction", "auto_pad", "x"]), type=AttributeProto.STRING,
                           s=b"\xff\xfe\x00bad")
        node.attribute.append(a)
    elif choice == 3:  # an unknown attribute
        node.attribute.append(helper.make_attribute("policyport_unknown", 1))
    elif choice == 4:  # extreme ints on an existing int attribute
        ints = [a for a in node.attribute if a.type == AttributeProto.INT]
        if ints:
            ints[rng.randrange(len(ints))].i = rng.choice([-1, 2**62, -(2**62), 7])
    else:  # a tensor attribute with the wrong payload
        node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(np.zeros((2, 2), np.float32))))


def unknown_domain(model: ModelProto, rng: random.Random) -> None:
    node = _pick(rng, model.graph.node)
    if node is not None:
        node.domain = rng.choice(["com.evil", "ai.onnx.ml", "com.microsoft"])


def change_op_type(model: ModelProto, rng: random.Random) -> None:
    node = _pick(rng, model.graph.node)
    if node is not None:
        node.op_type = rng.choice(["Gemm", "Tanh", "Concat", "Split", "Reshape", "NoSuchOp", "Slice", "MatMul",
                                   "Softmax", "Expand", "Gather", "Transpose", ""])


def odd_element_type(model: ModelProto, rng: random.Random) -> None:
    target = rng.choice(["input", "output", "initializer"])
    code = rng.choice([0, 8, 16, 17, 99, TensorProto.INT64, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BOOL])
    if target == "initializer" and model.graph.initializer:
        model.graph.initializer[rng.randrange(len(model.graph.initializer))].data_type = code
    else:
        values = model.graph.input if target == "input" else model.graph.output
        if values:
            values[rng.randrange(len(values))].type.tensor_type.elem_type = code


def odd_dims(model: ModelProto, rng: random.Random) -> None:
    value = _pick(rng, [*model.graph.input, *model.graph.output])
    if value is None or not value.type.tensor_type.HasField("shape"):
        return
    dims = value.type.tensor_type.shape.dim
    if not dims:
        return
    d = dims[rng.randrange(len(dims))]
    choice = rng.randrange(5)
    if choice == 0:
        d.dim_value = rng.choice([0, -1, -7, 2**40])
    elif choice == 1:
        d.dim_param = rng.choice(["", "batch", "N", "\x1b[2J"])
    elif choice == 2:
        d.Clear()
    elif choice == 3:
        value.type.tensor_type.shape.dim.add().dim_value = 3
    else:
        value.type.tensor_type.ClearField("shape")


def initializer_dims_mismatch(model: ModelProto, rng: random.Random) -> None:
    init = _pick(rng, model.graph.initializer)
    if init is None:
        return
    if init.dims:
        init.dims[rng.randrange(len(init.dims))] += rng.choice([1, -1, 1000])
    else:
        init.dims.append(rng.choice([0, 2, 10**9]))


def truncate_raw_data(model: ModelProto, rng: random.Random) -> None:
    init = _pick(rng, [i for i in model.graph.initializer if i.raw_data])
    if init is not None:
        init.raw_data = init.raw_data[: rng.randrange(max(1, len(init.raw_data)))]


def odd_opset(model: ModelProto, rng: random.Random) -> None:
    choice = rng.randrange(3)
    if choice == 0:
        del model.opset_import[:]
    else:
        for o in model.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = rng.choice([1, 6, 99, 0])


def odd_ir_version(model: ModelProto, rng: random.Random) -> None:
    model.ir_version = rng.choice([0, 3, 99])


def break_outputs(model: ModelProto, rng: random.Random) -> None:
    choice = rng.randrange(3)
    if choice == 0 and model.graph.output:
        model.graph.output[rng.randrange(len(model.graph.output))].name = "not_produced"
    elif choice == 1:
        model.graph.output.append(helper.make_tensor_value_info(
            _pick(rng, [o for n in model.graph.node for o in n.output]) or "x", TensorProto.FLOAT, None))
    else:
        model.graph.output.append(model.graph.output[0] if model.graph.output else
                                  helper.make_tensor_value_info("y", TensorProto.FLOAT, [1]))


def initializer_as_input(model: ModelProto, rng: random.Random) -> None:
    init = _pick(rng, model.graph.initializer)
    if init is not None:
        model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))


MUTATIONS = {f.__name__: f for f in (
    drop_initializer, rename_initializer, dangle_node_input, duplicate_output, reorder_nodes, corrupt_attribute,
    unknown_domain, change_op_type, odd_element_type, odd_dims, initializer_dims_mismatch, truncate_raw_data,
    odd_opset, odd_ir_version, break_outputs, initializer_as_input,
)}


def mutate(model: ModelProto, recipe: list[tuple[str, int]]) -> ModelProto:
    """A mutated copy of ``model``: each ``(mutation name, seed)`` of ``recipe`` applied in order."""
    copy = ModelProto()
    copy.CopyFrom(model)
    for name, seed in recipe:
        MUTATIONS[name](copy, random.Random(seed))
    return copy
