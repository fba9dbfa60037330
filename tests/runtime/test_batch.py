"""A model's fixed batch of 1, freed and checked against the file's own graph (runtime.batch)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import policyport as pp
from policyport.graph.passes import BATCH_FREED_KEY
from policyport.runtime.batch import BATCH_CHECKED_KEY, free_checked


def fixed_batch_model():
    """``y = relu(obs)`` declared at batch 1, as torch >= 2.9's exporter writes an rsl_rl policy."""
    graph = helper.make_graph([helper.make_node("Relu", ["obs"], ["y"])], "g",
                              [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_freed_batch_runs_at_any_batch_and_records_its_check():
    freed = free_checked(fixed_batch_model())
    assert freed.freed and freed.inputs == ["obs"] and freed.rows > 0 and freed.max_abs == 0
    obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    np.testing.assert_array_equal(pp.load(freed.model).run(obs)["y"], np.maximum(obs, 0))
    recorded = {p.key: p.value for p in freed.model.metadata_props}
    assert BATCH_FREED_KEY in recorded and BATCH_CHECKED_KEY in recorded


@pytest.mark.parametrize("recorded", ["[" * 100_000, "[1, 2]", '{"rows": "many"}', '{"max_abs": true}', "not json"])
def test_a_damaged_record_of_the_check_is_a_bad_model_not_a_bug(recorded):
    model = fixed_batch_model()
    for key, value in ((BATCH_FREED_KEY, '["obs"]'), (BATCH_CHECKED_KEY, recorded)):
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    with pytest.raises(pp.BadModelError) as caught:
        free_checked(model)
    assert f"model metadata '{BATCH_CHECKED_KEY}'" in str(caught.value)
