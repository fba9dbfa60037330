"""build_mlp's graph, pinned node by node (op, inputs, output, attributes), initializer by initializer
(name, dtype, value) and in its metadata: SB3's VecNormalize and action heads, RLlib's one-hot
preprocessors and MeanStdFilter, the normalisation modules, each activation's form at each opset, and
every refusal by its whole message. The numpy reference forward of the same spec is checked against
onnxruntime running that graph (and torch running the same layers), tensor by tensor."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from policyport.converter.activations import parse_activation
from policyport.converter.build import ActionHead, Dense, MlpSpec, ObsFilter, ObsNorm, Prelude, Step, build_mlp
from policyport.converter.sources.reference import reference_forward
from policyport.errors import BadModelError, MissingDependencyError, OptionError
from policyport.runtime.expose import expose

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def _spec(dtype=F32, obs_dim=3, n_out=2, **kw) -> MlpSpec:
    """One tanh hidden layer of 4 and an output layer of ``n_out``, seeded arrays in ``dtype``."""
    rng = np.random.default_rng(11)
    hidden = Dense("fc_1", rng.normal(size=(obs_dim, 4)).astype(dtype), "fc_1/kernel", rng.normal(size=4).astype(dtype),
                   "fc_1/bias", activation=parse_activation("tanh"))
    output = Dense("fc_out", rng.normal(size=(4, n_out)).astype(dtype), "fc_out/kernel",
                   rng.normal(size=n_out).astype(dtype), "fc_out/bias")
    return MlpSpec(hidden=[hidden], output=output, **kw)


def _nodes(model, upto: str | None = None) -> list[tuple]:
    """(op type, inputs, output, attributes) of every node, up to the one producing ``upto``."""
    rows = []
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        rows.append((node.op_type, list(node.input), node.output[0], attrs))
        if node.output[0] == upto:
            break
    return rows


def _inits(model) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _props(model) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def _io(value_info) -> tuple:
    t = value_info.type.tensor_type
    return value_info.name, t.elem_type, [d.dim_param or d.dim_value for d in t.shape.dim]


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def _onnxruntime(model, feed: dict) -> dict[str, np.ndarray]:
    """Every tensor of ``model`` as onnxruntime computes it."""
    exposed = expose(model)
    session = ort.InferenceSession(exposed.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed)))


def _agrees(model, spec, obs, *, exact: tuple[str, ...], head=None, prelude_out=None) -> dict[str, np.ndarray]:
    """onnxruntime's tensors of ``model`` on ``obs`` against the numpy reference: ``exact`` ones bit for
    bit, the rest (Gemm sums, whose order may differ) to a few float32 ulps."""
    want = dict(prelude_out or {})
    x = obs
    if prelude_out is not None:
        x = list(prelude_out.values())[-1]
    want.update(reference_forward(spec, x, head))
    got = _onnxruntime(model, {model.graph.input[0].name: obs})
    assert set(want) <= set(got)
    for name in exact:
        _same(got[name], want[name])
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-6, err_msg=name)
    return got


# ------------------------------------------------------------------------- VecNormalize


@pytest.mark.parametrize("dtype", [F32, F64])
def test_vec_normalize_is_computed_in_float64_and_cast_back_to_the_policy_dtype(dtype):
    # statistics given in float32: the graph must hold them as float64, as SB3 computes obs - mean
    norm = ObsNorm(mean=np.array([0.5, -1.0, 2.0], np.float32), var=np.array([4.0, 0.25, 1e-9], np.float32),
                   epsilon=1e-4, clip_obs=3.0, mean_name="env.obs_rms.mean", var_name="env.obs_rms.var")
    spec = _spec(dtype, obs_norm=norm)
    model = build_mlp(spec)
    assert _nodes(model, "vec_normalize/obs") == [
        ("Cast", ["obs"], "vec_normalize/obs_float64", {"to": TensorProto.DOUBLE}),
        ("Sub", ["vec_normalize/obs_float64", "env.obs_rms.mean"], "vec_normalize/centered", {}),
        ("Add", ["env.obs_rms.var", "vec_normalize/epsilon"], "vec_normalize/var_eps", {}),
        ("Sqrt", ["vec_normalize/var_eps"], "vec_normalize/std", {}),
        ("Div", ["vec_normalize/centered", "vec_normalize/std"], "vec_normalize/scaled", {}),
        ("Clip", ["vec_normalize/scaled", "vec_normalize/clip_low", "vec_normalize/clip_high"], "vec_normalize/clipped", {}),
        ("Cast", ["vec_normalize/clipped"], "vec_normalize/obs", {"to": helper.np_dtype_to_tensor_dtype(dtype)}),
    ]
    assert model.graph.node[7].input[0] == "vec_normalize/obs"  # the first layer reads the normalised obs
    inits = _inits(model)
    _same(inits["env.obs_rms.mean"], np.array([0.5, -1.0, 2.0]))
    _same(inits["env.obs_rms.var"], np.array([4.0, 0.25, 1e-9], np.float32).astype(np.float64))
    _same(inits["vec_normalize/epsilon"], np.array(1e-4))
    _same(inits["vec_normalize/clip_low"], np.array(-3.0))
    _same(inits["vec_normalize/clip_high"], np.array(3.0))
    assert json.loads(_props(model)["policyport.parameters"]) == {
        "env.obs_rms.mean": "env.obs_rms.mean", "env.obs_rms.var": "env.obs_rms.var", "fc_1/kernel": "fc_1/kernel",
        "fc_1/bias": "fc_1/bias", "fc_out/kernel": "fc_out/kernel", "fc_out/bias": "fc_out/bias"}

    # both clip bounds reached, and values inside them; the near-zero variance makes epsilon matter
    obs = np.array([[0.5, -1.0, 2.0], [100.0, -100.0, 2.0001], [-3.0, 0.2, 1.99995]], dtype)
    got = _agrees(model, spec, obs, exact=("vec_normalize/obs",))
    x64 = obs.astype(np.float64)
    want = np.clip((x64 - norm.mean.astype(np.float64)) / np.sqrt(norm.var.astype(np.float64) + 1e-4), -3.0, 3.0)
    _same(got["vec_normalize/obs"], want.astype(dtype))
    assert got["vec_normalize/obs"][1, :2].tolist() == [3.0, -3.0]


def test_vec_normalize_defaults_are_sb3s():
    norm = ObsNorm(mean=np.zeros(3), var=np.ones(3))
    assert (norm.epsilon, norm.clip_obs, norm.mean_name, norm.var_name) == (1e-8, 10.0, "obs_rms.mean", "obs_rms.var")
    model = build_mlp(_spec(obs_norm=norm))
    inits = _inits(model)
    assert (inits["vec_normalize/epsilon"], inits["vec_normalize/clip_low"], inits["vec_normalize/clip_high"]) == (1e-8, -10, 10)
    assert {"obs_rms.mean", "obs_rms.var"} <= set(inits)


def test_vec_normalize_constants_given_as_float32_scalars_are_held_in_float64():
    norm = ObsNorm(mean=np.zeros(3), var=np.ones(3), epsilon=np.float32(1e-4), clip_obs=np.float32(2.5))
    inits = _inits(build_mlp(_spec(obs_norm=norm)))
    _same(inits["vec_normalize/epsilon"], np.array(np.float32(1e-4), np.float64))
    _same(inits["vec_normalize/clip_low"], np.array(-2.5))
    _same(inits["vec_normalize/clip_high"], np.array(2.5))


# ------------------------------------------------------------------------- action heads


def test_a_squash_head_rescales_tanh_to_the_bounds_in_sb3s_order_and_the_policy_dtype():
    # bounds given in float64: the graph holds them in the policy's float32, width = high - low in float32
    low, high = np.array([-0.3, -1.910885061964363, 0.1]), np.array([0.1, 2.8572048015900964, 0.7])
    spec = _spec(n_out=3, action=ActionHead("squash", low=low, high=high, tanh_scope="actor.mu.5"))
    model = build_mlp(spec)
    nodes = _nodes(model)
    assert nodes[nodes.index(("Gemm", ["fc_1/tanh", "fc_out/kernel", "fc_out/bias"], "logits", {"transB": 0})) + 1:] == [
        ("Tanh", ["logits"], "actor.mu.5/tanh", {}),
        ("Add", ["actor.mu.5/tanh", "action/one"], "action/plus_one", {}),
        ("Mul", ["action/plus_one", "action/half"], "action/unit", {}),
        ("Mul", ["action/unit", "action/width"], "action/scaled", {}),
        ("Add", ["action/low", "action/scaled"], "action", {}),
    ]
    inits = _inits(model)
    _same(inits["action/one"], np.array(1, np.float32))
    _same(inits["action/half"], np.array(0.5, np.float32))
    low32, high32 = low.astype(np.float32), high.astype(np.float32)
    _same(inits["action/width"], high32 - low32)
    # rounded once, from the float32 bounds: from either bound in float64 it would round otherwise
    assert inits["action/width"][2] != np.float32(high[2] - low32[2]) and inits["action/width"][1] != np.float32(high32[1] - low[1])
    _same(inits["action/low"], low32)
    assert [_io(o) for o in model.graph.output] == [("logits", TensorProto.FLOAT, ["batch", 3]),
                                                    ("action", TensorProto.FLOAT, ["batch", 3])]
    obs = np.random.default_rng(2).normal(size=(50, 3)).astype(np.float32) * 3
    got = _agrees(model, spec, obs, exact=())
    for tensors in (got, reference_forward(spec, obs)):  # each from its own tanh (they may differ by an ulp)
        a = tensors["actor.mu.5/tanh"]
        _same(tensors["action"], low32 + (a + np.float32(1)) * np.float32(0.5) * (high32 - low32))


def test_a_multidiscrete_head_takes_one_argmax_per_sub_space():
    spec = _spec(n_out=7, action=ActionHead("multi_argmax", nvec=tuple(np.array([2, 3, 2], np.int32))))
    model = build_mlp(spec)
    nodes = _nodes(model)
    assert nodes[3:] == [
        ("Slice", ["logits", "action/start_0", "action/end_0", "action/axes"], "action/logits_0", {}),
        ("ArgMax", ["action/logits_0"], "action/argmax_0", {"axis": 1, "keepdims": 1}),
        ("Slice", ["logits", "action/start_1", "action/end_1", "action/axes"], "action/logits_1", {}),
        ("ArgMax", ["action/logits_1"], "action/argmax_1", {"axis": 1, "keepdims": 1}),
        ("Slice", ["logits", "action/start_2", "action/end_2", "action/axes"], "action/logits_2", {}),
        ("ArgMax", ["action/logits_2"], "action/argmax_2", {"axis": 1, "keepdims": 1}),
        ("Concat", ["action/argmax_0", "action/argmax_1", "action/argmax_2"], "action", {"axis": 1}),
    ]
    inits = _inits(model)
    for name, value in {"action/axes": [1], "action/start_0": [0], "action/end_0": [2], "action/start_1": [2],
                        "action/end_1": [5], "action/start_2": [5], "action/end_2": [7]}.items():
        _same(inits[name], np.array(value, np.int64))
    assert "action/axes" not in json.loads(_props(model)["policyport.parameters"])  # constants, not parameters
    assert _io(model.graph.output[1]) == ("action", TensorProto.INT64, ["batch", 3])
    obs = np.random.default_rng(3).normal(size=(200, 3)).astype(np.float32) * 2
    got = _agrees(model, spec, obs, exact=("action",))
    logits = got["logits"]
    want = np.stack([logits[:, :2].argmax(1), logits[:, 2:5].argmax(1), logits[:, 5:].argmax(1)], axis=1)
    _same(got["action"], want.astype(np.int64))
    assert all(len(set(column)) > 1 for column in want.T)  # no sub-space decides alone


# ------------------------------------------------------------------------- observation preprocessors


def _one_hot_rows(obs, nvec, dtype=np.float32):
    return np.concatenate([np.eye(n, dtype=dtype)[obs[:, i]] for i, n in enumerate(nvec)], axis=1)


@pytest.mark.parametrize("opset", [11, 12, 13, 17])
def test_a_multidiscrete_observation_is_one_hot_encoded_by_gathering_shifted_rows(opset):
    nvec = (2, 3, 4)
    prelude = Prelude(one_hot_nvec=nvec)
    spec = _spec(obs_dim=9)
    model = build_mlp(spec, opset=opset, input_name="observation", prelude=prelude)
    reduce = (("ReduceSum", ["obs_preprocessor/one_hot_rows", "obs_preprocessor/axes"], "obs_preprocessor/one_hot",
               {"keepdims": 0}) if opset >= 13 else
              ("ReduceSum", ["obs_preprocessor/one_hot_rows"], "obs_preprocessor/one_hot", {"axes": [1], "keepdims": 0}))
    assert _nodes(model, "obs_preprocessor/one_hot") == [
        ("Add", ["observation", "obs_preprocessor/offsets"], "obs_preprocessor/rows", {}),
        ("Gather", ["obs_preprocessor/one_hot_table", "obs_preprocessor/rows"], "obs_preprocessor/one_hot_rows", {"axis": 0}),
        reduce,
    ]
    inits = _inits(model)
    _same(inits["obs_preprocessor/offsets"], np.array([0, 2, 5], np.int64))
    _same(inits["obs_preprocessor/one_hot_table"], np.eye(9, dtype=np.float32))
    assert ("obs_preprocessor/axes" in inits) == (opset >= 13)
    if opset >= 13:
        _same(inits["obs_preprocessor/axes"], np.array([1], np.int64))
    assert _io(model.graph.input[0]) == ("observation", TensorProto.INT64, ["batch", 3])
    props = _props(model)
    assert json.loads(props["policyport.observation_preprocessor"]) == {"type": "one_hot", "nvec": [2, 3, 4]}
    assert json.loads(props["policyport.input_ranges"]) == {"observation": {"low": 0, "high": [2, 3, 4]}}
    assert "policyport.observation_filter" not in props

    obs = np.stack(np.meshgrid(range(2), range(3), range(4), indexing="ij"), -1).reshape(-1, 3).astype(np.int64)
    x, out = prelude.reference(obs, F32)
    _same(x, _one_hot_rows(obs, nvec))
    assert list(out) == ["obs_preprocessor/one_hot"] and out["obs_preprocessor/one_hot"] is x
    _agrees(model, spec, obs, exact=("obs_preprocessor/one_hot",), prelude_out=out)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_a_discrete_observation_is_one_hot_encoded_by_gathering_rows_of_the_identity(dtype):
    prelude = Prelude(one_hot=5)
    spec = _spec(dtype, obs_dim=5)
    model = build_mlp(spec, prelude=prelude)
    assert _nodes(model, "obs_preprocessor/one_hot") == [
        ("Gather", ["obs_preprocessor/one_hot_table", "obs"], "obs_preprocessor/one_hot", {"axis": 0})]
    _same(_inits(model)["obs_preprocessor/one_hot_table"], np.eye(5, dtype=dtype))
    assert _io(model.graph.input[0]) == ("obs", TensorProto.INT64, ["batch"])
    props = _props(model)
    assert json.loads(props["policyport.observation_preprocessor"]) == {"type": "one_hot", "n": 5}
    assert json.loads(props["policyport.input_ranges"]) == {"obs": {"low": 0, "high": 5}}
    obs = np.array([4, 0, 3, 1, 2, 2], np.int64)
    x, out = prelude.reference(obs, dtype)
    _same(x, np.eye(5, dtype=dtype)[obs])
    assert list(out) == ["obs_preprocessor/one_hot"]
    _agrees(model, spec, obs, exact=("obs_preprocessor/one_hot",), prelude_out=out)


@pytest.mark.parametrize("prelude, spec, message", [
    (Prelude(one_hot=4), _spec(obs_dim=5),
     r"the observation space Discrete\(4\) one-hot encodes to 4 features, but the first layer takes 5"),
    (Prelude(one_hot_nvec=(2, 2)), _spec(obs_dim=5),
     r"the observation space MultiDiscrete\[2, 2\] one-hot encodes to 4 features, but the first layer takes 5"),
])
def test_a_one_hot_width_that_is_not_the_first_layers_is_refused(prelude, spec, message):
    with pytest.raises(BadModelError, match=f"^{message}$"):
        build_mlp(spec, prelude=prelude)


@pytest.mark.parametrize("prelude, space", [(Prelude(one_hot=600), "Discrete(600)"),
                                             (Prelude(one_hot_nvec=(200, 400)), "MultiDiscrete[200, 400]")])
def test_a_one_hot_table_above_the_array_limit_is_refused_before_it_is_built(prelude, space):
    from policyport.errors import LimitExceededError
    from policyport.io.limits import using_limits

    with using_limits(array_bytes=600 * 600 * 4 - 1), pytest.raises(LimitExceededError, match=(
            rf"^the one-hot table of the observation space {re.escape(space)} \(float32, shape \(600, 600\)\) would "
            r"take 1\.37 MiB \(1,440,000 bytes\), above the limit of 1\.37 MiB for arrays built from sizes a file declares")):
        build_mlp(_spec(obs_dim=600), prelude=prelude)
    with using_limits(array_bytes=600 * 600 * 4):
        build_mlp(_spec(obs_dim=600), prelude=prelude)


def test_the_one_hot_reference_picks_rows_of_the_identity_without_building_it():
    from policyport.converter.build import _one_hot

    obs = np.array([[4, 0, -1], [2, 3, -5]], np.int64)
    _same(_one_hot(obs, 5, F64), np.eye(5, dtype=F64)[obs])  # negative indices count from the end, as numpy's
    for bad in (np.array([5]), np.array([-6])):
        with pytest.raises(IndexError):
            np.eye(5)[bad]
        with pytest.raises(IndexError):
            _one_hot(bad, 5, F32)
    assert _one_hot(np.zeros(0, np.int64), 3, F32).shape == (0, 3)


def test_prelude_truth_and_width():
    assert not Prelude() and Prelude().width is None
    assert Prelude(one_hot=3) and Prelude(one_hot=np.int64(3)).width == 3
    assert type(Prelude(one_hot=np.int64(3)).width) is int
    assert Prelude(one_hot_nvec=(2, 5)) and Prelude(one_hot_nvec=(2, 5)).width == 7
    assert type(Prelude(one_hot_nvec=(np.int64(2), 5)).width) is int


def test_the_one_hot_reference_takes_indices_of_any_number_type_as_sb3s_obs_long_does():
    for obs in (np.array([2.0, 0.0, 1.0]), np.array([2, 0, 1], np.int32), [2, 0, 1]):
        x, _ = Prelude(one_hot=3).reference(obs, F32)
        _same(x, np.eye(3, dtype=np.float32)[[2, 0, 1]])
    for obs in (np.array([[1.0, 2.0], [0.0, 0.0]]), np.array([[1, 2], [0, 0]], np.uint8)):
        x, _ = Prelude(one_hot_nvec=(2, 3)).reference(obs, F64)
        _same(x, np.array([[0, 1, 0, 0, 1], [1, 0, 1, 0, 0]], np.float64))
    assert Prelude(obs_filter=ObsFilter(np.zeros(2), np.ones(2), 1e-8)) and Prelude(obs_filter=ObsFilter(
        np.zeros(2), np.ones(2), 1e-8)).width is None
    assert Prelude().metadata() == {}
    assert Prelude(one_hot=3).metadata() == {  # the graph input is "obs" unless named
        "policyport.observation_preprocessor": '{"type": "one_hot", "n": 3}', "policyport.input_ranges": '{"obs": {"low": 0, "high": 3}}'}


# ------------------------------------------------------------------------- RLlib MeanStdFilter


MEAN, STD = np.array([0.1, -2.0, 3.3]), np.array([0.3, 1.7, 1e-7])
FILTERS = [  # (demean, destd, clip): the nodes, in RLlib's order
    (True, True, 2.5), (True, True, None), (True, True, 0.0), (False, True, 5.0), (True, False, 1.5), (False, False, 1.0),
]


@pytest.mark.parametrize("demean, destd, clip", FILTERS)
@pytest.mark.parametrize("dtype", [F32, F64])
def test_a_mean_std_filter_demeans_destds_and_clips_in_rllibs_order(demean, destd, clip, dtype):
    filt = ObsFilter(MEAN, STD, 1e-6, demean=demean, destd=destd, clip=clip, count=np.int64(12), form="rs")
    prelude = Prelude(obs_filter=filt)
    spec = _spec(dtype)
    model = build_mlp(spec, prelude=prelude)
    want_nodes, x, names = [], "obs", []
    if demean:
        want_nodes.append(("Sub", [x, "obs_filter/mean"], "obs_filter/demean", {}))
        x = "obs_filter/demean"
    if destd:
        want_nodes.append(("Div", [x, "obs_filter/std_plus_epsilon"], "obs_filter/destd", {}))
        x = "obs_filter/destd"
    if clip:
        want_nodes.append(("Clip", [x, "obs_filter/clip_min", "obs_filter/clip_max"], "obs_filter/clip", {}))
        x = "obs_filter/clip"
    names = [n[2] for n in want_nodes]
    nodes = _nodes(model)
    assert nodes[:len(want_nodes)] == want_nodes and nodes[len(want_nodes)][1][0] == x
    inits = _inits(model)
    assert ("obs_filter/mean" in inits) == demean and ("obs_filter/std_plus_epsilon" in inits) == destd
    assert ("obs_filter/clip_min" in inits) == ("obs_filter/clip_max" in inits) == bool(clip)
    if demean:
        _same(inits["obs_filter/mean"], MEAN.astype(dtype))
    if destd:
        _same(inits["obs_filter/std_plus_epsilon"], (STD + 1e-6).astype(dtype))  # summed in float64, rounded once
    if clip:
        _same(inits["obs_filter/clip_min"], np.array(-clip, dtype))
        _same(inits["obs_filter/clip_max"], np.array(clip, dtype))
    assert _io(model.graph.input[0]) == ("obs", helper.np_dtype_to_tensor_dtype(dtype), ["batch", 3])
    props = _props(model)
    doc = json.loads(props["policyport.observation_filter"])
    assert doc == {"type": "MeanStdFilter", "form": "rs", "count": 12, "demean": demean, "destd": destd,
                   "clip": None if clip is None else clip, "epsilon": 1e-6, "mean": [0.1, -2.0, 3.3],
                   "std": [0.3, 1.7, 1e-7]}
    assert "policyport.observation_preprocessor" not in props and "policyport.input_ranges" not in props

    obs = np.array([[0.1, -2.0, 3.3], [9.0, -9.0, 3.30001], [-1.0, 0.5, 3.0]], dtype)
    filtered, out = prelude.reference(obs, dtype)
    assert list(out) == names
    y = obs
    if demean:
        y = y - MEAN.astype(dtype)
    if destd:
        y = y / (STD + 1e-6).astype(dtype)
    if clip:
        y = np.clip(y, -clip, clip).astype(dtype)
        assert np.abs(y).max() == np.float32(clip)  # the bound is reached
    _same(filtered, y)
    _agrees(model, spec, obs, exact=tuple(names), prelude_out=out)


def test_a_filter_after_a_one_hot_reads_the_encoded_rows():
    filt = ObsFilter(np.array([0.25, 0.25, 0.5]), np.array([0.4, 0.4, 0.5]), 1e-8, clip=1.0)
    prelude = Prelude(one_hot=3, obs_filter=filt)
    spec = _spec()
    model = build_mlp(spec, prelude=prelude)
    assert [n[:3] for n in _nodes(model, "obs_filter/clip")] == [
        ("Gather", ["obs_preprocessor/one_hot_table", "obs"], "obs_preprocessor/one_hot"),
        ("Sub", ["obs_preprocessor/one_hot", "obs_filter/mean"], "obs_filter/demean"),
        ("Div", ["obs_filter/demean", "obs_filter/std_plus_epsilon"], "obs_filter/destd"),
        ("Clip", ["obs_filter/destd", "obs_filter/clip_min", "obs_filter/clip_max"], "obs_filter/clip")]
    props = _props(model)
    assert json.loads(props["policyport.observation_filter"])["clip"] == 1.0
    assert json.loads(props["policyport.observation_preprocessor"]) == {"type": "one_hot", "n": 3}
    obs = np.array([0, 1, 2, 2], np.int64)
    _, out = prelude.reference(obs, F32)
    assert list(out) == ["obs_preprocessor/one_hot", "obs_filter/demean", "obs_filter/destd", "obs_filter/clip"]
    _agrees(model, spec, obs, exact=tuple(out), prelude_out=out)


@pytest.mark.parametrize("mean, std", [(np.zeros(5), np.ones(3)), (np.zeros(3), np.ones(5)), (np.zeros(1), np.ones(1))])
def test_a_filter_as_wide_as_no_first_layer_is_refused_before_its_statistics_are_written(mean, std):
    filt = ObsFilter(mean, std, 1e-6)
    with pytest.raises(BadModelError, match=rf"^the observation filter holds {mean.size} means and {std.size} standard "
                                            r"deviations, but the first layer takes 3 features$"):
        build_mlp(_spec(obs_dim=3), prelude=Prelude(obs_filter=filt))


def test_a_filters_record_is_plain_json_types():
    filt = ObsFilter(np.array([[1.5], [2.0]], np.float32), np.array([0.5, 0.25], np.float32), np.float32(1e-8),
                     demean=np.bool_(False), destd=np.bool_(True), clip=np.float32(4), count=np.int64(7))
    doc = filt.to_dict()
    assert doc == {"type": "MeanStdFilter", "form": "running_stats", "count": 7, "demean": False, "destd": True,
                   "clip": 4.0, "epsilon": float(np.float32(1e-8)), "mean": [1.5, 2.0], "std": [0.5, 0.25]}
    assert [type(doc[k]) for k in ("count", "demean", "destd", "clip", "epsilon")] == [int, bool, bool, float, float]
    assert {type(v) for v in doc["mean"] + doc["std"]} == {float}
    assert json.loads(json.dumps(doc)) == doc
    mean, denom = filt.constants(np.float32)
    _same(mean, np.array([[1.5], [2.0]], np.float32))
    _same(denom, (np.array([0.5, 0.25], np.float32).astype(np.float64) + np.float64(np.float32(1e-8))).astype(np.float32))
    # std + epsilon summed in float64 and rounded once: float32 arithmetic would round this sum differently
    std = np.array([1.917357622005511e-06], np.float32)
    _same(ObsFilter(np.zeros(1), std, 1e-6).constants(np.float32)[1], (std.astype(np.float64) + 1e-6).astype(np.float32))
    assert (std.astype(np.float64) + 1e-6).astype(np.float32) != std + np.float32(1e-6)
    defaults = ObsFilter(np.zeros(1), np.ones(1), 1e-6)
    assert (defaults.demean, defaults.destd, defaults.clip, defaults.count, defaults.form) == (True, True, None, 0, "running_stats")


# ------------------------------------------------------------------------- without onnx


def test_building_without_onnx_names_the_extra_that_installs_it(monkeypatch):
    from policyport.converter.build import MlpBuilder, add_multi_argmax, add_obs_norm

    b = MlpBuilder(17, np.float32)
    monkeypatch.setitem(sys.modules, "onnx", None)
    for call in (lambda: add_obs_norm(b, "obs", ObsNorm(np.zeros(3), np.ones(3))),
                 lambda: add_multi_argmax(b, "logits", (2, 2)),
                 lambda: MlpBuilder(17, np.float32), lambda: build_mlp(_spec())):
        with pytest.raises(MissingDependencyError, match=r"^building an ONNX model needs the Python package 'onnx', "
                           r"which is not installed; install it with: pip install 'policyport\[onnx\]'$"):
            call()
    assert onnx  # the real module stays importable for the other tests


# ------------------------------------------------------------------------- the network and its heads


def _dense(name, n_in, n_out, *, bias=True, layout="out_in", activation=None, post=(), seed=0) -> Dense:
    rng = np.random.default_rng(seed)
    shape = (n_out, n_in) if layout == "out_in" else (n_in, n_out)
    return Dense(name, rng.normal(size=shape).astype(np.float32), f"{name}.weight",
                 rng.normal(size=n_out).astype(np.float32) if bias else None, f"{name}.bias" if bias else None, layout,
                 parse_activation(activation) if activation else None, list(post))


def _norm(kind, scope, n, roles, seed=5) -> Step:
    rng = np.random.default_rng(seed)
    arrays = {"weight": rng.uniform(0.5, 2, n), "bias": rng.normal(size=n), "running_mean": rng.normal(size=n),
              "running_var": rng.uniform(0.2, 3, n)}
    return Step(kind, scope, params={r: (f"{scope}.{r}", arrays[r].astype(np.float32)) for r in roles}, eps=1e-3)


def _tanh(scope) -> Step:
    return Step("activation", scope, parse_activation("tanh"))


# (spec, head, the tensors compared bit for bit: integer actions and slices)
NETWORKS = {
    "categorical, no bias": (lambda: MlpSpec([_dense("pi.0", 3, 5, bias=False, activation="leaky_relu:0.2")],
                                             _dense("pi.1", 5, 4, seed=1)), "categorical", ("action",)),
    "diag-gaussian": (lambda: MlpSpec([_dense("fc_1", 3, 5, layout="in_out", activation="elu")],
                                      _dense("fc_out", 5, 4, layout="in_out", seed=1)), "diag-gaussian", ()),
    "argmax, value branch": (lambda: MlpSpec(
        [_dense("policy.0", 3, 5, activation="tanh")], _dense("action_net", 5, 3, seed=1),
        value_hidden=[_dense("value.0", 3, 6, activation="relu", seed=2)], value_output=_dense("value_net", 6, 1, seed=3),
        action=ActionHead("argmax")), None, ("action",)),
    "clip, free log_std, shared trunk": (lambda: MlpSpec(
        [_dense("policy.0", 4, 5, activation="tanh")], _dense("action_net", 5, 2, seed=1),
        value_output=_dense("value_net", 5, 1, seed=3), trunk=[_dense("shared.0", 3, 4, activation="relu", seed=4)],
        free_log_std=np.array([-0.5, 0.25], np.float32), free_log_std_name="log_std",
        action=ActionHead("clip", low=np.array([1.5, -0.8], np.float32), high=np.array([2.5, -0.3], np.float32))),
        None, ()),
    "trunk and own value layers": (lambda: MlpSpec(
        [_dense("policy.0", 4, 5, activation="tanh")], _dense("action_net", 5, 2, seed=1),
        value_hidden=[_dense("value.0", 4, 3, activation="tanh", seed=2)], value_output=_dense("value_net", 3, 1, seed=3),
        trunk=[_dense("shared.0", 3, 4, activation="relu", seed=4)]), None, ()),
    "flattened observation, normalisation modules": (lambda: MlpSpec(
        [_dense("net.0", 6, 4, post=[_norm("layer_norm", "net.1", 4, ("weight", "bias")), _tanh("net.2")]),
         _dense("net.3", 4, 4, post=[_norm("batch_norm", "net.4", 4, ("weight", "bias", "running_mean", "running_var")),
                                     _tanh("net.5")]),
         _dense("net.6", 4, 4, post=[_norm("layer_norm", "net.7", 4, ("weight",)), _tanh("net.8")]),
         _dense("net.9", 4, 4, post=[_norm("batch_norm", "net.10", 4, ("running_mean", "running_var")), _tanh("net.11")])],
        _dense("net.12", 4, 3, post=[_norm("layer_norm", "net.13", 3, ("weight", "bias")), _tanh("net.14")]),
        obs_shape=(2, 3), flatten_scope="features_extractor.flatten"), None, ("features_extractor.flatten/flatten",)),
    "gelu": (lambda: MlpSpec([_dense("fc_1", 3, 5, layout="in_out", activation="gelu")],
                             _dense("fc_out", 5, 2, layout="in_out", seed=1)), None, ()),
}


@pytest.mark.parametrize("case", list(NETWORKS))
def test_the_reference_forward_names_and_computes_every_tensor_the_graph_has(case):
    make, head, exact = NETWORKS[case]
    spec = make()
    model = build_mlp(spec, head=head)
    shape = spec.input_shape
    obs = np.random.default_rng(9).normal(size=(64, *shape)).astype(np.float32) * 2
    got = _agrees(model, spec, obs, exact=exact, head=head)
    if head == "diag-gaussian":  # the halves of onnxruntime's own logits
        _same(got["action"], got["logits"][:, :2])
        _same(got["log_std"], got["logits"][:, 2:])
    if spec.free_log_std is not None:
        _same(got["logits"], np.concatenate([got["action_net/mean"], np.tile(spec.free_log_std, (64, 1))], axis=1))
        _same(got["action"], np.minimum(np.maximum(got["action_net/mean"], spec.action.low), spec.action.high))
        _same(got["log_std"], got["logits"][:, 2:])
        assert ((got["action"] == spec.action.low).any(0) & (got["action"] == spec.action.high).any(0)).all()
    graph_tensors = {n.output[0] for n in model.graph.node}
    assert set(reference_forward(spec, obs, head)) == graph_tensors & set(got) - {"obs"} - {
        n.output[0] for n in model.graph.node if n.output[0].startswith(("action/", "head/", "log_std/"))
        or n.output[0].endswith(("/mean_shape", "/free_log_std", "/obs_float64", "/centered", "/var_eps", "/std",
                                 "/scaled", "/clipped", "/unit", "/plus_one", "/sqrt2", "/erf", "/erf_plus_one",
                                 "/x_times", "/above_low"))}
    empty = reference_forward(spec, obs[:0], head)
    assert all(v.shape[0] == 0 for v in empty.values())
    assert {k: v.dtype for k, v in empty.items()} == {k: v.dtype for k, v in reference_forward(spec, obs, head).items()}


def test_the_normalisation_modules_are_laid_out_with_their_parameters_and_fills():
    spec = NETWORKS["flattened observation, normalisation modules"][0]()
    model = build_mlp(spec)
    norms = [row for row in _nodes(model) if row[0] in ("LayerNormalization", "BatchNormalization")]
    assert norms == [
        ("LayerNormalization", ["net.0/linear", "net.1.weight", "net.1.bias"], "net.1/layer_norm",
         {"axis": -1, "epsilon": pytest.approx(1e-3)}),
        ("BatchNormalization", ["net.3/linear", "net.4.weight", "net.4.bias", "net.4.running_mean", "net.4.running_var"],
         "net.4/batch_norm", {"epsilon": pytest.approx(1e-3)}),
        ("LayerNormalization", ["net.6/linear", "net.7.weight"], "net.7/layer_norm", {"axis": -1, "epsilon": pytest.approx(1e-3)}),
        ("BatchNormalization", ["net.9/linear", "net.10/unit_scale", "net.10/zero_bias", "net.10.running_mean",
                                "net.10.running_var"], "net.10/batch_norm", {"epsilon": pytest.approx(1e-3)}),
        ("LayerNormalization", ["net.12/linear", "net.13.weight", "net.13.bias"], "net.13/layer_norm",
         {"axis": -1, "epsilon": pytest.approx(1e-3)}),
    ]
    assert model.graph.node[-1].op_type == "Tanh" and model.graph.node[-1].output[0] == "logits"
    inits = _inits(model)
    _same(inits["net.10/unit_scale"], np.ones(4, np.float32))
    _same(inits["net.10/zero_bias"], np.zeros(4, np.float32))
    assert "net.10/unit_scale" not in json.loads(_props(model)["policyport.parameters"])


def test_the_numpy_normalisation_steps_are_torchs_definitions():
    from policyport.converter.sources.reference import _NumpyOps

    x = np.random.default_rng(4).normal(size=(5, 4)).astype(np.float32)
    for roles in (("weight", "bias"), ("weight",), ()):
        step = _norm("layer_norm", "ln", 4, roles)
        p = {r: a for r, (_, a) in step.params.items()}
        y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + np.float32(1e-3))
        want = y * p.get("weight", np.float32(1)) + p.get("bias", np.float32(0))
        np.testing.assert_allclose(_NumpyOps.step(step, x), want, rtol=1e-6, atol=1e-6)
        step = _norm("batch_norm", "bn", 4, ("running_mean", "running_var", *roles))
        p = {r: a for r, (_, a) in step.params.items()}
        y = (x - p["running_mean"]) / np.sqrt(p["running_var"] + np.float32(1e-3))
        want = y * p.get("weight", np.float32(1)) + p.get("bias", np.float32(0))
        np.testing.assert_allclose(_NumpyOps.step(step, x), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(_NumpyOps.flatten(np.arange(24).reshape(2, 3, 4)), np.arange(24).reshape(2, 12))
    np.testing.assert_array_equal(_NumpyOps.flatten(np.zeros((0, 3, 4))), np.zeros((0, 12)))


@pytest.mark.parametrize("case", ["categorical, no bias", "clip, free log_std, shared trunk",
                                  "flattened observation, normalisation modules"])
def test_torch_runs_the_same_forward_with_the_same_names(case):
    pytest.importorskip("torch")
    from policyport.converter.sources.reference import torch_forward

    make, head, exact = NETWORKS[case]
    spec = make()
    obs = np.random.default_rng(9).normal(size=(64, *spec.input_shape)).astype(np.float32) * 2
    want, got = reference_forward(spec, obs, head), torch_forward(spec, obs, head)
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    for name in exact:
        _same(got[name], want[name])


# ------------------------------------------------------------------------- activations, by opset


X = "fc_1/linear"
ACTIVATIONS = [  # (activation, opsets, the nodes after fc_1's Gemm up to the activation's output)
    ("tanh", (11, 17), [("Tanh", [X], "fc_1/tanh", {})]),
    ("relu", (11, 17), [("Relu", [X], "fc_1/relu", {})]),
    ("elu", (11, 17), [("Elu", [X], "fc_1/elu", {})]),
    ("selu", (11, 17), [("Selu", [X], "fc_1/selu", {})]),
    ("softplus", (11, 17), [("Softplus", [X], "fc_1/softplus", {})]),
    ("sigmoid", (11, 17), [("Sigmoid", [X], "fc_1/sigmoid", {})]),
    ("leaky_relu:0.2", (11, 17), [("LeakyRelu", [X], "fc_1/leaky_relu", {"alpha": pytest.approx(0.2)})]),
    ("silu", (11, 17), [("Sigmoid", [X], "fc_1/swish/sigmoid", {}), ("Mul", [X, "fc_1/swish/sigmoid"], "fc_1/swish", {})]),
    ("mish", (18, 20), [("Mish", [X], "fc_1/mish", {})]),
    ("mish", (11, 17), [("Softplus", [X], "fc_1/mish/softplus", {}), ("Tanh", ["fc_1/mish/softplus"], "fc_1/mish/tanh", {}),
                        ("Mul", [X, "fc_1/mish/tanh"], "fc_1/mish", {})]),
    ("hardswish", (14, 17), [("HardSwish", [X], "fc_1/hardswish", {})]),
    ("hardswish", (11, 13), [("HardSigmoid", [X], "fc_1/hardswish/hard_sigmoid",
                              {"alpha": pytest.approx(1 / 6), "beta": pytest.approx(0.5)}),
                             ("Mul", [X, "fc_1/hardswish/hard_sigmoid"], "fc_1/hardswish", {})]),
    ("gelu", (20, 21), [("Gelu", [X], "fc_1/gelu", {})]),
    ("gelu", (11, 19), [("Div", [X, "fc_1/gelu/sqrt2"], "fc_1/gelu/scaled", {}),
                        ("Erf", ["fc_1/gelu/scaled"], "fc_1/gelu/erf", {}),
                        ("Add", ["fc_1/gelu/erf", "fc_1/gelu/one"], "fc_1/gelu/erf_plus_one", {}),
                        ("Mul", [X, "fc_1/gelu/erf_plus_one"], "fc_1/gelu/x_times", {}),
                        ("Mul", ["fc_1/gelu/x_times", "fc_1/gelu/half"], "fc_1/gelu", {})]),
]


@pytest.mark.parametrize("activation, opset, nodes", [(a, o, n) for a, opsets, n in ACTIVATIONS for o in opsets])
def test_each_activation_has_its_onnx_form_at_each_opset(activation, opset, nodes):
    spec = MlpSpec([_dense("fc_1", 3, 5, layout="in_out", activation=activation)], _dense("fc_out", 5, 2, layout="in_out", seed=1))
    model = build_mlp(spec, opset=opset)
    assert _nodes(model, nodes[-1][2])[1:] == nodes
    assert model.opset_import[0].version == opset
    if "fc_1/gelu/sqrt2" in _inits(model):
        inits = _inits(model)
        _same(inits["fc_1/gelu/sqrt2"], np.array(np.sqrt(2), np.float32))
        _same(inits["fc_1/gelu/one"], np.array(1, np.float32))
        _same(inits["fc_1/gelu/half"], np.array(0.5, np.float32))
    obs = np.linspace(-4, 4, 60, dtype=np.float32).reshape(20, 3)
    _agrees(model, spec, obs, exact=())


@pytest.mark.parametrize("opset, ir_version", [(11, 7), (13, 7), (14, 8), (18, 8), (19, 9), (20, 9), (21, 10), (23, 10)])
def test_the_ir_version_is_the_one_of_the_opset_so_older_runtimes_load_the_model(opset, ir_version):
    model = build_mlp(_spec(), opset=opset)
    assert model.ir_version == ir_version and model.producer_name == "policyport"


def test_the_newest_opset_gets_the_newest_ir_version():
    model = build_mlp(_spec(), opset=onnx.defs.onnx_opset_version())
    assert model.ir_version == min(onnx.IR_VERSION, helper.make_model(helper.make_graph([], "g", [], [])).ir_version)


def test_the_metadata_records_the_parameters_head_source_and_what_the_caller_adds():
    spec = _spec(n_out=4, source={"kind": "npz", "file": "policy.npz"})
    spec.free_log_std, spec.free_log_std_name = None, None
    props = _props(build_mlp(spec, head="diag-gaussian", metadata={"policyport.activation": "tanh"}))
    assert props == {"policyport.parameters": json.dumps({"fc_1/kernel": "fc_1/kernel", "fc_1/bias": "fc_1/bias",
                                                          "fc_out/kernel": "fc_out/kernel", "fc_out/bias": "fc_out/bias"}),
                     "policyport.head": "diag-gaussian", "policyport.source": '{"kind": "npz", "file": "policy.npz"}',
                     "policyport.activation": "tanh"}
    assert _props(build_mlp(_spec()))["policyport.head"] == "none"


def test_a_parameter_name_taken_already_gets_a_numbered_initializer_name():
    from policyport.converter.build import MlpBuilder

    b = MlpBuilder(17, np.float32)
    names = [b.initializer(np.zeros(1, np.float32), "shared.weight", "shared.weight") for _ in range(3)]
    assert names == ["shared.weight", "shared.weight/parameter", "shared.weight/parameter_2"]
    assert b.parameters == {n: "shared.weight" for n in names}
    assert b.constant([3], "action/axes") == "action/axes" and b.parameters == {n: "shared.weight" for n in names}


def test_a_source_parameter_named_like_a_graph_output_gets_another_initializer_name():
    spec = _spec(n_out=2)
    spec.free_log_std, spec.free_log_std_name = np.array([0.5, -0.5], np.float32), "log_std"
    spec.output.weight_name = "action"  # an unprefixed name that is also a graph output's
    model = build_mlp(spec)
    params = json.loads(_props(model)["policyport.parameters"])
    assert params["log_std/parameter"] == "log_std" and params["action/parameter"] == "action"
    assert {"log_std/parameter", "action/parameter"} <= set(_inits(model)) and not {"log_std", "action"} & set(_inits(model))
    assert [o.name for o in model.graph.output] == ["logits"]
    _same(_inits(model)["log_std/parameter"], np.array([0.5, -0.5], np.float32))


def _refusal_cases():
    def spec_with(**changes):
        spec = _spec()
        for key, value in changes.items():
            setattr(spec, key, value)
        return spec

    wide = _dense("value.0", 4, 3, layout="in_out")
    return [
        (lambda: build_mlp(_spec(), head="beta"), OptionError,
         "unknown head 'beta'; choose one of diag-gaussian, diag-gaussian:halves, categorical (or none)"),
        (lambda: build_mlp(_spec(), opset=10), OptionError,
         f"opset 10 is out of range: policyport builds opset 11 to {onnx.defs.onnx_opset_version()}"),
        (lambda: build_mlp(_spec(), opset=onnx.defs.onnx_opset_version() + 1), OptionError,
         f"opset {onnx.defs.onnx_opset_version() + 1} is out of range: policyport builds opset 11 to "
         f"{onnx.defs.onnx_opset_version()}"),
        (lambda: build_mlp(spec_with(output=_dense("fc_out", 5, 2, layout="in_out"))), BadModelError,
         "policy layers do not chain: 'fc_1' outputs 4 features but 'fc_out' takes 5 (fc_1/kernel (3, 4), "
         "fc_out.weight (5, 2))"),
        (lambda: build_mlp(spec_with(value_output=_dense("value_net", 5, 1))), BadModelError,
         "value layers do not chain: 'fc_1' outputs 4 features but 'value_net' takes 5 (fc_1/kernel (3, 4), "
         "value_net.weight (1, 5))"),
        (lambda: build_mlp(spec_with(value_hidden=[wide], value_output=_dense("value_net", 3, 1))), BadModelError,
         "value branch layer 'value.0' takes 4 inputs, the observation has 3"),
        (lambda: build_mlp(spec_with(output=Dense("fc_out", np.zeros((4, 2), np.float32), "fc_out/kernel",
                                                   np.zeros(3, np.float32), "fc_out/bias"))), BadModelError,
         "fc_out/bias has shape (3,), expected (2,) for fc_out/kernel (4, 2)"),
        (lambda: build_mlp(spec_with(obs_shape=(2, 2))), BadModelError,
         "an observation of shape (2, 2) flattens to 4 features, but the first layer takes 3"),
        (lambda: build_mlp(_spec(n_out=3), head="diag-gaussian"), OptionError,
         "--head diag-gaussian splits logits into mean and log_std halves, but there are 3 logits (an odd number); "
         "use --head categorical (or none)"),
        (lambda: build_mlp(_spec(n_out=3), head="diag-gaussian:halves"), OptionError,  # the head as it was given
         "--head diag-gaussian:halves splits logits into mean and log_std halves, but there are 3 logits (an odd "
         "number); use --head categorical (or none)"),
        (lambda: build_mlp(spec_with(free_log_std=np.zeros(2, np.float32), free_log_std_name="log_std"), head="categorical"),
         OptionError, "--head categorical takes the argmax of the logits, but this is a Gaussian policy: its logits are "
         "the 2 means of 'fc_out' followed by the 2 entries of its free log_std 'log_std', and an argmax over means and "
         "log-standard-deviations picks no action; use --head diag-gaussian (or none)"),
        (lambda: build_mlp(spec_with(free_log_std=np.zeros(1, np.float32), free_log_std_name="p/log_std")), BadModelError,
         "p/log_std has 1 entries, but 'fc_out' outputs 2: a free log_std holds one entry per action dimension, as many "
         "as the means it follows in logits (a diag-gaussian policy with 2 means needs a log_std of 2); are the weights "
         "of two different policies?"),
        (lambda: build_mlp(spec_with(free_log_std=np.zeros((1, 2), np.float32), free_log_std_name="log_std")), BadModelError,
         "log_std has shape (1, 2); a free log_std is a vector, one entry per action dimension ('fc_out' outputs 2 means)"),
        (lambda: build_mlp(spec_with(hidden=[_dense("fc_1", 3, 4, layout="in_out",
                                                    post=[_norm("layer_norm", "net.1", 4, ("weight", "bias"))])],
                                     output=_dense("fc_out", 4, 2, layout="in_out")), opset=16), BadModelError,
         "LayerNorm module 'net.1' needs ONNX LayerNormalization, which opset 16 lacks (it exists from opset 17); "
         "convert with --opset 17 or newer"),
        (lambda: build_mlp(spec_with(hidden=[_dense("fc_1", 3, 4, layout="in_out", post=[Step("group_norm", "net.1")])],
                                     output=_dense("fc_out", 4, 2, layout="in_out"))), BadModelError,
         "unknown layer step 'group_norm' for 'net.1'"),
        (lambda: build_mlp(spec_with(action=ActionHead("beta"))), BadModelError, "unknown action head 'beta'"),
        (lambda: build_mlp(spec_with(hidden=[_dense("fc_1", 3, 4, activation="tanh"), _dense("fc_1", 4, 4, activation="tanh")],
                                     output=_dense("fc_out", 4, 2))), BadModelError,
         "tensor name 'fc_1/linear' would be produced twice; the source has duplicate layer names"),
        (lambda: build_mlp(_spec(obs_dim=4), prelude=Prelude(one_hot=4, one_hot_nvec=(2, 2))), BadModelError,
         "parameter name 'obs_preprocessor/one_hot_table' occurs twice"),
    ]


@pytest.mark.parametrize("build, error, message", _refusal_cases())
def test_what_cannot_be_built_is_refused_saying_why(build, error, message):
    with pytest.raises(error) as caught:
        build()
    assert type(caught.value) is error and str(caught.value) == message


# ------------------------------------------------------------------------- activation names


@pytest.mark.parametrize("text, name, alpha", [
    ("tanh", "tanh", None), (" ReLU ", "relu", None), ("SiLU", "swish", None), ("identity", "linear", None),
    ("none", "linear", None), ("LeakyReLU", "leaky_relu", 0.01), ("leaky_relu", "leaky_relu", 0.01),
    ("leaky_relu:0.2", "leaky_relu", 0.2), ("leakyrelu:-1e-3", "leaky_relu", -1e-3),
])
def test_activation_names_aliases_and_the_leaky_slope(text, name, alpha):
    from policyport.converter.activations import Activation

    act = parse_activation(text)
    assert act == Activation(name, alpha) and act.label == name


@pytest.mark.parametrize("text, message", [
    ("softsign", f"unknown activation 'softsign'; choose one of tanh, relu, elu, selu, swish, silu, softplus, "
                 "leaky_relu, gelu, mish, hardswish, sigmoid, linear"),
    ("tanh:2", "activation 'tanh' takes no parameter (got 'tanh:2')"),
    ("leaky_relu:steep", "leaky_relu slope must be a number, got 'steep'"),
    ("leaky_relu:inf", "leaky_relu slope must be finite, got 'inf'"),
    ("leaky_relu:nan", "leaky_relu slope must be finite, got 'nan'"),
])
def test_an_activation_that_cannot_be_parsed_is_refused(text, message):
    with pytest.raises(BadModelError) as caught:
        parse_activation(text)
    assert str(caught.value) == message


def test_a_recorded_activation_wins_and_a_given_one_fills_the_gap():
    from policyport.converter.activations import choose_activation

    assert choose_activation(None, "relu", "the zip") == ("relu", [])
    assert choose_activation(None, None, "the zip") == (None, [])
    assert choose_activation("SiLU", "swish", "the zip") == ("swish", [])  # the same activation, spelt otherwise
    assert choose_activation("tanh", None, "the zip's policy_kwargs") == ("tanh", [
        "the zip's policy_kwargs names no activation; using --activation tanh (the source check cannot tell whether "
        "that is the one the policy was trained with)"])
    with pytest.raises(OptionError) as caught:
        choose_activation("tanh", "relu", "the zip's policy_kwargs")
    assert str(caught.value) == ("--activation tanh contradicts the zip's policy_kwargs, which names relu; leave "
                                 "--activation out to use the recorded one")


@pytest.mark.parametrize("name", ["tanh", "relu", "elu", "selu", "swish", "softplus", "leaky_relu:0.3", "gelu", "mish",
                                  "hardswish", "sigmoid", "linear"])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_each_reference_activation_is_its_frameworks_formula_in_the_inputs_dtype(name, dtype):
    import math

    x = np.array([-30.0, -3.5, -1.0, -1e-3, 0.0, 1e-3, 0.5, 2.0, 3.5, 30.0], dtype)
    erf = np.vectorize(math.erf)
    softplus = np.log1p(np.exp(-np.abs(x.astype(np.float64)))) + np.maximum(x.astype(np.float64), 0)
    formulas = {  # torch.nn's definitions, in float64
        "tanh": np.tanh(x), "relu": np.maximum(x, 0), "elu": np.where(x > 0, x, np.exp(x.astype(np.float64)) - 1),
        "selu": 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * (np.exp(x.astype(np.float64)) - 1)),
        "swish": x / (1 + np.exp(-x.astype(np.float64))), "softplus": softplus,
        "leaky_relu:0.3": np.where(x >= 0, x, 0.3 * x), "gelu": 0.5 * x * (1 + erf(x / np.sqrt(2))),
        "mish": x * np.tanh(softplus), "hardswish": x * np.clip(x + 3.0, 0, 6) / 6,
        "sigmoid": 1 / (1 + np.exp(-x.astype(np.float64))), "linear": x,
    }
    got = parse_activation(name).reference(x)
    assert got.dtype == dtype and got.shape == x.shape
    np.testing.assert_allclose(got, formulas[name], rtol=2e-7 if dtype == F32 else 1e-13, atol=1e-30)
    assert parse_activation(name).reference(x[:0]).shape == (0,)  # an empty batch too


def test_a_postlude_reads_the_logits_and_value_and_adds_its_outputs():
    calls = []

    def postlude(b, logits, value, outputs):
        calls.append((logits, value, [o.name for o in outputs]))
        b.node("Sub", [logits, value], "advantage")
        outputs.append(helper.make_tensor_value_info("advantage", TensorProto.DOUBLE, ["batch", 2]))

    spec = MlpSpec([_dense("fc_1", 3, 4, layout="in_out", activation="tanh")], _dense("fc_out", 4, 2, layout="in_out", seed=1),
                   value_output=_dense("value_out", 4, 1, layout="in_out", seed=2))
    for layer in (*spec.hidden, spec.output, spec.value_output):
        layer.weight, layer.bias = layer.weight.astype(np.float64), layer.bias.astype(np.float64)
    model = build_mlp(spec, postlude=postlude, input_name="observations")
    assert calls == [("logits", "value", ["logits", "value"])]
    assert _io(model.graph.input[0]) == ("observations", TensorProto.DOUBLE, ["batch", 3])
    assert [_io(o) for o in model.graph.output] == [("logits", TensorProto.DOUBLE, ["batch", 2]),
                                                    ("value", TensorProto.DOUBLE, ["batch", 1]),
                                                    ("advantage", TensorProto.DOUBLE, ["batch", 2])]
    obs = np.random.default_rng(1).normal(size=(8, 3))
    got = _onnxruntime(model, {"observations": obs})
    _same(got["advantage"], got["logits"] - got["value"])
    build_mlp(MlpSpec(spec.hidden, spec.output), postlude=lambda b, logits, value, outputs: calls.append((logits, value)))
    assert calls[-1] == ("logits", None)  # no value branch


def test_a_clip_head_without_a_free_log_std_clips_the_logits():
    spec = _spec(n_out=2, action=ActionHead("clip", low=np.array([-0.5, -0.1], np.float32), high=np.array([0.5, 0.1], np.float32)))
    model = build_mlp(spec)
    assert _nodes(model)[-2:] == [("Max", ["logits", "action/low"], "action/above_low", {}),
                                  ("Min", ["action/above_low", "action/high"], "action", {})]
    assert [o.name for o in model.graph.output] == ["logits", "action"]
    obs = np.random.default_rng(5).normal(size=(64, 3)).astype(np.float32) * 3
    got = _agrees(model, spec, obs, exact=())
    _same(got["action"], np.clip(got["logits"], spec.action.low, spec.action.high))
    assert (got["action"] == spec.action.low).any() and (got["action"] == spec.action.high).any()


def test_a_state_dict_with_a_normalisation_lacking_affine_parameters_converts_and_matches_torch(tmp_path, monkeypatch):
    """A BatchNorm1d(affine=False): running statistics without weight and bias. (A LayerNorm(bias=False)'s
    weight alone is refused in a state_dict, which cannot tell it from an RMSNorm's or a PReLU's.)"""
    torch = pytest.importorskip("torch")
    import policyport as pp
    from policyport.converter import convert_source

    torch.manual_seed(3)
    module = torch.nn.BatchNorm1d(4, affine=False)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), module, torch.nn.Tanh(), torch.nn.Linear(4, 2)).eval()
    module.running_mean.uniform_(-1, 1), module.running_var.uniform_(0.5, 2)
    torch.save(net.state_dict(), tmp_path / "policy.pt")
    obs = np.random.default_rng(4).normal(size=(32, 3)).astype(np.float32)
    with torch.no_grad():
        expected = net(torch.from_numpy(obs)).numpy()
    monkeypatch.setitem(sys.modules, "torch", None)  # the numpy reference, as on a machine without torch
    c = convert_source(tmp_path / "policy.pt", activation="tanh")
    for backend in ("numpy", "onnxruntime"):
        np.testing.assert_allclose(pp.load(c.model, backend=backend).run({"obs": obs})["logits"], expected,
                                   rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c.reference(obs)["logits"], expected, rtol=1e-5, atol=1e-6)
    assert pp.verify(c.model, reference=c.reference).passed
    state = {k: v.numpy() for k, v in net.state_dict().items()}
    weights = pp.extract_weights(c.model)  # the source's arrays back, and no filler of the graph's
    assert sorted(weights) == sorted(state) and all(weights[k].tobytes() == state[k].tobytes() for k in state)
