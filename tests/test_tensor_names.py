"""Names are names: a tensor whose name holds glob characters is selected by it, on every backend and command."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import policyport as pp
from policyport.errors import InputMismatchError
from policyport.runtime.base import select_tensors

NAMES = ["h[0]", "h0", "fc*", "fc_1", "a,b", "obs"]


def bracket_model():
    """obs -> Tanh h[0] -> Relu h0 -> Tanh 'fc*' -> Relu fc_1 -> y; a glob 'h[0]' would match h0 only."""
    chain = ["obs", "h[0]", "h0", "fc*", "fc_1", "y"]
    ops = ["Tanh", "Relu", "Tanh", "Relu", "Identity"]
    nodes = [helper.make_node(op, [chain[i]], [chain[i + 1]], name=chain[i + 1]) for i, op in enumerate(ops)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("patterns,chosen", [
    ("h[0]", ["h[0]"]),          # the exact name, not the glob (which would pick h0)
    ("h[0-9]", ["h0"]),          # a glob the user wrote
    ("fc*", ["fc*"]),            # a name with a star is that name
    ("fc_*", ["fc_1"]),
    (["a,b"], ["a,b"]),          # a list entry is never split at commas
    ("h0,fc_1", ["h0", "fc_1"]),
    ("*", NAMES),
])
def test_exact_names_select_themselves_and_globs_match(patterns, chosen):
    assert select_tensors(NAMES, patterns) == chosen


def test_a_star_selects_everything_even_beside_a_tensor_named_star():
    names = ["tap", "*", "0"]
    assert select_tensors(names, "*") == select_tensors(names, ["*"]) == select_tensors(names, None) == names
    assert select_tensors(names, "*", exact=True) == ["*"]  # exact: names only


def test_exact_selection_never_globs_and_says_which_name_is_missing():
    assert select_tensors(NAMES, ["h[0]", "fc*"], exact=True) == ["h[0]", "fc*"]
    with pytest.raises(InputMismatchError, match=r"tensor name\(s\) \['h\[0-9\]'\] match no tensor"):
        select_tensors(NAMES, ["h[0-9]"], exact=True)
    with pytest.raises(InputMismatchError, match=r"tensor pattern\(s\) \['x\*'\] match no tensor"):
        select_tensors(NAMES, "x*")


@pytest.mark.parametrize("backend", list(pp.BACKENDS))
def test_record_by_an_exact_bracketed_name_on_every_backend(backend):
    session = pp.load(bracket_model(), backend=backend)
    obs = np.array([[-1.0, 0.0, 2.0]], np.float32)
    recorded = session.record(obs, "h[0]")
    assert list(recorded) == ["h[0]", "y"]
    np.testing.assert_allclose(recorded["h[0]"], np.tanh(obs), rtol=1e-6)
    assert list(session.record(obs, ["fc*"])) == ["fc*", "y"]


def test_verify_and_pack_a_model_whose_tensors_have_glob_characters(tmp_path):
    report = pp.verify(bracket_model(), samples=16)
    assert report.passed and [c.tensor for c in report.comparisons] == ["h[0]", "h0", "fc*", "fc_1", "y"]
    assert [c.tensor for c in pp.verify(bracket_model(), samples=4, tensors="h[0]").comparisons] == ["h[0]", "y"]
    folder = pp.pack(bracket_model(), tmp_path / "bundle", samples=4)
    assert [c.tensor for c in pp.verify_bundle(folder).comparisons] == ["h[0]", "h0", "fc*", "fc_1", "y"]


def test_expose_by_exact_name():
    exposed = pp.expose(bracket_model(), ["h[0]"], exact=True)
    assert [o.name for o in exposed.graph.output] == ["y", "h[0]"]
    assert [o.name for o in pp.expose(bracket_model(), "h[0]").graph.output] == ["y", "h[0]"]


def test_a_pattern_that_matches_nothing_lists_the_tensors_there_are_as_written():
    with pytest.raises(InputMismatchError) as caught:
        select_tensors(["fc_1/linear", "fc_1/tanh"], "fc_9/*")
    assert str(caught.value) == "tensor pattern(s) ['fc_9/*'] match no tensor of the model; it has: fc_1/linear, fc_1/tanh"
