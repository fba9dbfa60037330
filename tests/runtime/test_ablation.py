"""Array-carrying interventions (direction, mean-, resample- and zero-ablation, patching) against a
forward of the MetaDrive expert computed here in numpy from the file's weights."""

from __future__ import annotations

import numpy as np
import pytest

import policyport as pp
from policyport.runtime.overrides import Edit, ablate, add_direction, parse_overrides, patch
from expert import expert_forward as forward

BACKENDS = list(pp.BACKENDS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_direction_adds_alpha_times_it_on_the_chosen_neurons(metadrive_model, metadrive_weights, metadrive_obs, backend):
    obs = metadrive_obs[:40]
    direction = np.random.default_rng(5).normal(size=256).astype(np.float32)

    def shifted(a):
        a = a.copy()
        a[:, 8:40] += 1.5 * direction[8:40]
        return a

    got = pp.load(metadrive_model, backend=backend).record(obs, overrides=[add_direction("fc_1/tanh", direction, 1.5, "8:40")])
    a1, _, logits = forward(metadrive_weights, obs, h1=shifted)
    np.testing.assert_allclose(got["fc_1/tanh"], a1, atol=2e-6)
    np.testing.assert_allclose(got["logits"], logits, atol=2e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_zero_direction_or_alpha_zero_changes_nothing(metadrive_model, metadrive_obs, backend):
    session = pp.load(metadrive_model, backend=backend)
    plain = session.record(metadrive_obs[:30])
    for edit in (add_direction("fc_2/tanh", np.zeros(256, np.float32), 4.0),
                 add_direction("fc_2/tanh", np.ones(256, np.float32), 0.0)):
        steered = session.record(metadrive_obs[:30], overrides=[edit])
        for name in plain:
            np.testing.assert_array_equal(steered[name], plain[name], err_msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mean_and_zero_ablation(metadrive_model, metadrive_weights, metadrive_obs, backend):
    obs = metadrive_obs[:64]
    a1, a2, _ = forward(metadrive_weights, metadrive_obs)
    mean = a2.mean(axis=0)
    session = pp.load(metadrive_model, backend=backend)

    def meaned(a):
        a = a.copy()
        a[:, [3, 17, 200]] = mean[[3, 17, 200]]
        return a

    got = session.run(obs, overrides=[ablate("fc_2/tanh", [3, 17, 200], "mean", mean=mean)])
    np.testing.assert_allclose(got["logits"], forward(metadrive_weights, obs, h2=meaned)[2], atol=2e-5)

    def zeroed(a):
        a = a.copy()
        a[:, 100:] = 0
        return a

    got = session.run(obs, overrides=[ablate("fc_1/tanh", "100:256")])
    np.testing.assert_allclose(got["logits"], forward(metadrive_weights, obs, h1=zeroed)[2], atol=2e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_resample_ablation_draws_rows_by_its_seed(metadrive_model, metadrive_weights, metadrive_obs, backend):
    obs = metadrive_obs[:20]
    samples = forward(metadrive_weights, metadrive_obs[500:700])[0].astype(np.float32)
    drawn = np.random.default_rng(7).integers(0, len(samples), size=len(obs))

    def resampled(a):
        a = a.copy()
        a[:, :128] = samples[drawn][:, :128]
        return a

    session = pp.load(metadrive_model, backend=backend)
    edit = ablate("fc_1/tanh", "0:128", "resample", samples=samples, seed=7)
    first, again = (session.run(obs, overrides=[edit])["logits"] for _ in range(2))
    np.testing.assert_allclose(first, forward(metadrive_weights, obs, h1=resampled)[2], atol=2e-5)
    np.testing.assert_array_equal(first, again)  # the draws are made afresh from the seed in every run


@pytest.mark.parametrize("backend", BACKENDS)
def test_patching_a_whole_layer_from_a_into_b_restores_all_of_a_downstream(metadrive_model, metadrive_obs, backend):
    session = pp.load(metadrive_model, backend=backend)
    a, b = metadrive_obs[:10], metadrive_obs[10:20]
    clean = session.record(a)
    for tensor in ("fc_1/tanh", "fc_2/linear", "fc_2/tanh"):
        patched = session.record(b, overrides=[patch(tensor, clean[tensor])])
        after = session.tensor_names[session.tensor_names.index(tensor):]
        for name in after:
            np.testing.assert_allclose(patched[name], clean[name], atol=1e-6, err_msg=f"{tensor} -> {name}")
    one_row = session.run(b, overrides=[patch("fc_2/tanh", clean["fc_2/tanh"][4])])["logits"]
    np.testing.assert_allclose(one_row, np.repeat(clean["logits"][4:5], 10, axis=0), atol=1e-6)


def test_the_mapping_form_takes_arrays_and_edits_read_as_text(metadrive_obs):
    v = np.ones(4)
    edits = parse_overrides({"h": {"*": {"add": v, "alpha": 2, "source": "d.npy"}, "0:2": {"ablate": "zero"},
                                   "3": {"ablate": "mean", "mean": v}, "1": {"patch": v, "source": "a.npy"},
                                   "2": {"ablate": "resample", "samples": np.ones((3, 4)), "seed": 4, "source": "r.npz"}}})
    assert [e.spec for e in edits] == ["h[*]+=2*d.npy", "h[0:2]=0", "h[3]=mean", "h[1]=patch(a.npy)",
                                       "h[2]=resample(r.npz,seed=4)"]
    assert edits[1] == Edit("h", (0, 2), True, "set", (0.0,))


@pytest.mark.parametrize("call, message", [
    (lambda: ablate("h", "*", "median"), "unknown ablation 'median'; choose one of zero, mean, resample"),
    (lambda: ablate("h", "*", "mean"), "mean-ablation takes the mean array, which is missing"),
    (lambda: ablate("h", "*", "zero", mean=np.ones(3)), "zero-ablation takes no array, not mean"),
    (lambda: ablate("h", "*", "resample", samples=np.ones(3)), "the samples must be an array of numbers with at least 2 axes"),
    (lambda: ablate("h", "*", "resample", samples=np.ones((2, 3)), seed=-1), "the seed must be a whole number >= 0"),
    (lambda: add_direction("h", [1.0, np.nan]), "the direction holds NaN or infinity"),
    (lambda: add_direction("h", np.ones(3), alpha=float("inf")), "alpha must be a finite number"),
    (lambda: parse_overrides({"h": {"*": {"add": [1.0], "scale": 2}}}), r"add takes \['add', 'alpha', 'source'\], not \['scale'\]"),
])
def test_malformed_interventions_say_what_is_wrong(call, message):
    with pytest.raises(pp.InputMismatchError, match=message):
        call()


@pytest.mark.parametrize("backend", BACKENDS)
def test_arrays_that_do_not_fit_the_tensor_are_refused_with_their_shapes(metadrive_model, metadrive_obs, backend):
    session = pp.load(metadrive_model, backend=backend)
    with pytest.raises(pp.InputMismatchError, match=r"the array has shape \(255,\); the tensor 'fc_1/tanh' has rows of shape \(256,\)"):
        session.run(metadrive_obs[:3], overrides=[add_direction("fc_1/tanh", np.ones(255))])
    with pytest.raises(pp.InputMismatchError, match=r"neither one row of the tensor 'fc_1/tanh' \(\(256,\)\) nor its 3 rows"):
        session.run(metadrive_obs[:3], overrides=[patch("fc_1/tanh", np.ones((5, 256)))])
