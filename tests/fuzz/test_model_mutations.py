"""Model-mutation fuzzing: every loader and command gives a PolicyportError or the right answer.

Seed models (tests/fuzz/corpus/, written by make_corpus.py, plus the real MetaDrive expert) are
mutated the ways broken exporters and hostile files break models (see mutations.py), then put
through everything policyport does with a model: read it, inspect it, extract its weights, expose
its tensors, load and run it on both backends, verify it, and the CLI's ``inspect --json``. Each
step must either succeed or raise a :class:`policyport.PolicyportError`; when both backends run,
their outputs must agree under the comparison rule.

The bounded run in the suite uses a fixed seed (``derandomize=True``) and ``FUZZ_EXAMPLES`` examples
(default 200; ``FUZZ_EXAMPLES=5000 scripts/test.sh tests/fuzz`` for a longer hunt). A failure prints
its minimal recipe; it goes into ``REGRESSIONS`` below, where it stays as an ordinary test.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import policyport as pp
from policyport.graph.onnx_files import load_onnx

from .mutations import MUTATIONS, mutate

CORPUS = Path(__file__).with_name("corpus")
FIXTURES = Path(__file__).parents[2] / "fixtures"
#: Seed models: the corpus, and the fixtures shaped like published policies (recurrent, conv, random
#: ops, fp16, optional initializer inputs), by path relative to the repository's fixtures/.
SEED_PATHS = {p.name: p for p in sorted(CORPUS.glob("*.onnx"))}
SEED_PATHS.update({f"{p.parent.name}/{p.name}": p for p in sorted(FIXTURES.glob("synthetic/*.onnx"))})
SEED_PATHS.update({f"{p.parent.name}/{p.name}": p for p in sorted(FIXTURES.glob("verification/*.onnx"))
                   if p.stat().st_size < 100_000})
SEEDS = sorted(SEED_PATHS)
FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))

#: Minimal recipes that once failed, and what each step must now do: (seed model, [(mutation, seed),
#: ...], {step: "ok" or the PolicyportError subclass}). Found: a KeyError in inspect, an abort inside
#: onnx's shape inference (a negative dim), omitted required inputs, attributes of the wrong type, an
#: opset newer than any known, raw_data shorter than its dims, non-UTF-8 strings, unknown element types,
#: nodes listed out of order.
OK = "ok"
REGRESSIONS: list[tuple[str, list[tuple[str, int]], dict[str, str]]] = [
    ('rllib_mlp.onnx', [('initializer_dims_mismatch', 0)],
     {'load_onnx': 'BadModelError'}),
    ('rllib_mlp.onnx', [('odd_dims', 970299236)],
     {'load_onnx': OK, 'inspect': OK, 'extract': OK, 'expose': OK, 'load_numpy': OK, 'load_onnxruntime': OK, 'sample': OK, 'run_numpy': OK, 'run_onnxruntime': OK, 'record': OK, 'verify': OK}),
    ('rllib_mlp.onnx', [('dangle_node_input', 564527380)],
     {'load_onnx': OK, 'inspect': OK, 'extract': OK, 'expose': OK, 'load_numpy': 'BadModelError', 'load_onnxruntime': 'BadModelError', 'verify': 'BadModelError'}),
    ('two_inputs.onnx', [('odd_dims', 395721769), ('corrupt_attribute', 957525952)],
     {'load_onnx': OK, 'inspect': 'BadModelError', 'extract': OK, 'expose': OK, 'load_numpy': 'BadModelError', 'load_onnxruntime': 'BadModelError', 'verify': 'BadModelError'}),
    ('verification/attention.onnx', [('odd_opset', 210057725)],
     {'load_onnx': OK, 'inspect': OK, 'extract': OK, 'expose': OK, 'load_numpy': 'UnsupportedOpError', 'load_onnxruntime': 'BadModelError', 'verify': 'UnsupportedOpError'}),
    ('rllib_mlp.onnx', [('rename_initializer', 1476720930)],
     {'load_onnx': OK, 'inspect': 'BadModelError', 'extract': OK, 'expose': OK, 'load_numpy': 'BadModelError', 'load_onnxruntime': 'BadModelError', 'verify': 'BadModelError'}),
    ('rllib_mlp.onnx', [('corrupt_attribute', 1726249255)],
     {'load_onnx': OK, 'inspect': 'BadModelError', 'extract': OK, 'expose': OK, 'load_numpy': 'BadModelError', 'load_onnxruntime': 'BadModelError', 'verify': 'BadModelError'}),
    ('two_inputs.onnx', [('truncate_raw_data', 1143881027)],
     {'load_onnx': 'BadModelError'}),
    ('rllib_mlp.onnx', [('odd_element_type', 53179176)],
     {'load_onnx': 'BadModelError'}),
    ('synthetic/mlagents_hybrid.onnx', [('initializer_as_input', 634044734)],
     {'load_onnx': OK, 'inspect': OK, 'extract': OK, 'expose': OK, 'load_numpy': OK, 'load_onnxruntime': OK, 'sample': OK, 'run_numpy': OK, 'run_onnxruntime': OK, 'record': OK, 'verify': OK}),
    ('rllib_mlp.onnx', [('reorder_nodes', 815398389)],
     {'load_onnx': OK, 'inspect': OK, 'extract': OK, 'expose': OK, 'load_numpy': OK, 'load_onnxruntime': OK, 'sample': OK, 'run_numpy': OK, 'run_onnxruntime': OK, 'record': OK, 'verify': OK}),
]


def _seed_model(name: str) -> onnx.ModelProto:
    return onnx.load(SEED_PATHS[name])


class Outcome:
    """What each step did: "ok", or the PolicyportError's class name."""

    def __init__(self):
        self.steps: dict[str, str] = {}

    def step(self, name, fn, *args, **kwargs):
        try:
            value = fn(*args, **kwargs)
        except pp.PolicyportError as e:
            self.steps[name] = type(e).__name__
            return None
        except Exception as e:  # noqa: BLE001 - the finding
            raise AssertionError(f"step {name!r} raised {type(e).__name__}: {e}") from e
        self.steps[name] = "ok"
        return value


def exercise(model: onnx.ModelProto) -> Outcome:
    """Put ``model`` through every command's library path; raise AssertionError on a finding."""
    from typer.testing import CliRunner

    from policyport.cli import app
    from policyport.graph.passes import extract_weights
    from policyport.runtime.expose import expose
    from policyport.verification.summary import summarize
    from policyport.verification.verify import sample_inputs

    outcome = Outcome()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = Path(tmp) / "m.onnx"
        try:
            path.write_bytes(model.SerializeToString())
        except Exception:  # noqa: BLE001 - protobuf cannot even serialize it: nothing to hand over
            return outcome
        proto = outcome.step("load_onnx", load_onnx, path)
        if proto is None:
            return outcome
        outcome.step("inspect", summarize, proto)
        outcome.step("extract", extract_weights, proto)
        outcome.step("expose", expose, proto, "*")
        sessions = {b: outcome.step(f"load_{b}", pp.load, proto, backend=b) for b in ("numpy", "onnxruntime")}
        if sessions["numpy"] is not None:
            feeds = outcome.step("sample", sample_inputs, sessions["numpy"].inputs, 3)
            if feeds is not None:
                for b, s in sessions.items():
                    if s is not None:
                        outcome.step(f"run_{b}", s.run, feeds)
                outcome.step("record", sessions["numpy"].record, feeds, "*")
                if outcome.steps.get("run_numpy") == OK:
                    _check_row_blocks(sessions["numpy"])
        report = outcome.step("verify", pp.verify, proto, samples=3)
        if report is not None:  # both backends ran: they agree (random tensors skipped, dtype tolerances)
            assert report.passed, f"numpy and onnxruntime disagree: {report.first_divergence}"
        result = CliRunner().invoke(app, ["inspect", str(path), "--json"])
        assert result.exit_code in (0, 3, 4), f"inspect exited {result.exit_code}: {result.output[-2000:]}"
        json.loads(result.stdout)
    return outcome


def _check_row_blocks(session) -> None:
    """A graph the numpy backend runs in row blocks gives on ``SPLIT_ROWS + 1`` rows what its
    straight-line code gives on the whole batch: the same error class, or the same values (floats
    within 1e-5 + 1e-4 relative: the BLAS may block a product otherwise)."""
    from policyport.runtime.numpy.rows import SPLIT_ROWS
    from policyport.verification.verify import sample_inputs

    plan = session.backend.plan
    if plan.row_split is None:
        return
    try:
        feeds = sample_inputs(session.inputs, SPLIT_ROWS + 1, seed=1)
    except pp.PolicyportError:
        return
    ends = []
    for name, fn in (("blocks", plan.run), ("whole", plan._compile("run", split=False))):
        try:
            ends.append(fn(feeds))
        except pp.PolicyportError as e:
            ends.append(type(e).__name__)
        except Exception as e:  # noqa: BLE001 - the finding
            raise AssertionError(f"the {name} run raised {type(e).__name__}: {e}") from e
    blocks, whole = ends
    if isinstance(blocks, str) or isinstance(whole, str):
        assert blocks == whole, f"row blocks ended in {blocks if isinstance(blocks, str) else 'values'}, the whole batch in " \
                                f"{whole if isinstance(whole, str) else 'values'}"
        return
    assert list(blocks) == list(whole)
    for name, a in blocks.items():
        b = np.asarray(whole[name])
        assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, a.shape, b.dtype, b.shape)
        if a.dtype.kind in "fc":
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True, err_msg=name)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)


recipes = st.lists(st.tuples(st.sampled_from(sorted(MUTATIONS)), st.integers(0, 2**31 - 1)), min_size=1, max_size=3)


@settings(max_examples=FUZZ_EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(seed=st.sampled_from(SEEDS), recipe=recipes)
def test_a_mutated_model_gives_a_policyport_error_or_the_right_answer(seed, recipe):
    exercise(mutate(_seed_model(seed), recipe))


@pytest.mark.parametrize("seed", SEEDS)
def test_the_seed_models_themselves_pass_every_step(seed):
    outcome = exercise(_seed_model(seed))
    assert set(outcome.steps.values()) == {"ok"}, outcome.steps


@pytest.mark.parametrize("seed,recipe,expected", REGRESSIONS)
def test_regressions(seed, recipe, expected):
    assert exercise(mutate(_seed_model(seed), recipe)).steps == expected


def test_the_seed_corpus_is_what_the_script_writes(tmp_path):
    """The committed corpus is reproducible from make_corpus.py (deterministic models)."""
    assert [s for s in SEEDS if "/" not in s] == ["rllib_mlp.onnx", "torch_style.onnx", "two_inputs.onnx"]
    assert len(SEEDS) >= 10
    for name in SEEDS:
        onnx.checker.check_model(_seed_model(name), full_check=True)
    np.testing.assert_equal(len(MUTATIONS), 16)
