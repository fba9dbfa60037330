"""ML-Agents checkpoints. ``mlagents`` 1.1.0 does not install on Python 3.11, so the fixtures and the oracle are
``fixtures/ml_agents/reproduction.py``: a faithful reproduction of ML-Agents' modules in torch (its class and
attribute names, its order of operations), which loads each fixture's ``Policy`` with ``load_state_dict``
(strict: the keys must be ML-Agents' own) and runs ML-Agents' forward. The converter shares no code with it."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import policyport as pp
from policyport.converter import convert_source, detect_kind
from policyport.converter.readers.checkpoints import read_checkpoint
from policyport.converter.sources import ml_agents
from library_checkpoints import code_running_payload, convert_verify_pack, invoke

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
MLA = ROOT / "fixtures" / "ml_agents"
# under a name of its own: rl_games' test imports its own make_fixtures
_spec = importlib.util.spec_from_file_location("ml_agents_make_fixtures", MLA / "make_fixtures.py")
make_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_fixtures)

RUNS = tuple(make_fixtures.RUNS)


def checkpoint(run: str) -> Path:
    behavior, step, _, _ = make_fixtures.RUNS[run]
    return MLA / run / behavior / f"{behavior}-{step}.pt"


def observations(run: str, n: int = 1000) -> np.ndarray:
    """Raw observations around the normalisers' statistics and well past them (so the clip at 5 bites)."""
    size = make_fixtures.RUNS[run][3]["obs"]
    rng = np.random.default_rng(2026)
    obs = make_fixtures.observations(rng, n, size)
    obs[: n // 2] += (rng.standard_normal((n // 2, size)) * 3).astype(np.float32)
    return obs


def ml_agents_forward(run: str, obs: np.ndarray) -> dict[str, np.ndarray]:
    """ML-Agents' SimpleActor, as reproduced, with the checkpoint's Policy loaded strictly."""
    _, _, trainer_type, settings = make_fixtures.RUNS[run]
    actor = make_fixtures.actor(trainer_type, settings)
    saved = torch.load(checkpoint(run), weights_only=False)
    actor.load_state_dict(saved["Policy"], strict=True)
    actor.eval()
    with torch.no_grad():
        out = actor([torch.from_numpy(obs)])
    return {k: v.numpy() for k, v in out.items()}


def test_a_checkpoint_is_told_from_its_keys(tmp_path):
    for run in RUNS:
        assert detect_kind(checkpoint(run)) == "ml-agents"
    shutil.copy(checkpoint("walker_ppo"), tmp_path / "checkpoint.pt")
    assert detect_kind(tmp_path / "checkpoint.pt") == "ml-agents"
    assert detect_kind(ROOT / "fixtures" / "rl_games" / "ant_elu" / "nn" / "ant_elu.pth") == "rl-games"
    assert detect_kind(ROOT / "fixtures" / "torch" / "gaussian.state_dict.pt") == "state-dict"


def test_the_reproduction_holds_ml_agents_keys():
    """The reproduction's state_dict is ML-Agents' layout: the typo, the constants, the normaliser twice."""
    keys = list(torch.load(checkpoint("walker_ppo"), weights_only=False)["Policy"])
    assert keys[:6] == ["version_number", "is_continuous_int_deprecated", "continuous_act_size_vector",
                        "discrete_act_size_vector", "act_size_vector_deprecated", "memory_size_vector"]
    for prefix in ("network_body.observation_encoder.processors.0", "network_body.processors.0"):
        assert [k for k in keys if k.startswith(prefix)] == [f"{prefix}.normalizer.{r}" for r in
                                                             ("normalization_steps", "running_mean", "running_variance")]
    assert "network_body._body_endoder.seq_layers.2.weight" in keys
    assert keys[-3:] == ["action_model._continuous_distribution.log_sigma", "action_model._continuous_distribution.mu.weight",
                         "action_model._continuous_distribution.mu.bias"]


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("run", RUNS)
def test_the_action_is_ml_agents_own(run, backend):
    obs = observations(run)
    want = ml_agents_forward(run, obs)
    np.seterr(all="raise")
    try:
        out = pp.load(pp.convert(checkpoint(run)), backend).run({"obs": obs})
    finally:
        np.seterr(all="warn")
    if "deterministic_discrete_actions" in want:
        chosen = out["action" if run == "pushblock_discrete" else "discrete_action"]
        assert chosen.dtype == np.int64 and chosen.shape == want["deterministic_discrete_actions"].shape
        assert (chosen == want["deterministic_discrete_actions"]).all()
        assert np.abs(out["logits"] - want["logits"]).max() <= 1e-5
        assert all(len(set(column)) > 1 for column in chosen.T.tolist())
    if "deterministic_continuous_actions" not in want:
        return
    action = want["deterministic_continuous_actions"]
    assert out["action"].shape == action.shape
    assert np.abs(out["action"] - action).max() <= 1e-5
    assert np.abs(out["mean"] - want["mean"]).max() <= 1e-5
    assert np.abs(out["std"] - want["std"]).max() <= 1e-5
    assert np.abs(out["log_std"] - np.log(want["std"])).max() <= 1e-5
    if run == "walker_ppo":  # clamp(mean, -3, 3) / 3: the clamp and the division both matter here
        assert np.abs(want["mean"]).max() > 3 and np.abs(out["action"] - want["mean"]).max() > 0.5
    elif run == "crawler_sac":  # SAC's tanh_squash: the deterministic action is the mean, neither clamped nor squashed
        assert (action == want["mean"]).all() and np.abs(np.tanh(action) - action).max() > 0.1


def _mean_under(layout, obs, eps_on_var=0.0, eps_on_std=0.0, clip=None):
    """walker_ppo's mean under a normaliser of some library's formula, in float64."""
    roles = layout.normalizers[0]
    mean, var = roles["running_mean"][1], roles["running_variance"][1] / float(roles["normalization_steps"][1])
    x = (obs - mean) / (np.sqrt(var + eps_on_var) + eps_on_std)
    if clip is not None:
        x = np.clip(x, -clip, clip)
    for _, w, _, b in layout.layers:
        x = x @ w.T.astype(np.float64) + b
        x = x / (1 + np.exp(-x))
    _, w, _, b = layout.mu
    return x @ w.T.astype(np.float64) + b


def test_the_normaliser_is_ml_agents_and_no_other_librarys(monkeypatch):
    """ML-Agents divides the variance sum by the count, adds no epsilon and clips at 5; each other library's
    formula, or the variance sum taken for the variance, moves the mean."""
    layout = ml_agents.read_layout(read_checkpoint(checkpoint("walker_ppo"), "ML-Agents"), "walker_ppo")
    roles = layout.normalizers[0]
    assert roles["normalization_steps"][1].dtype == np.int64 and int(roles["normalization_steps"][1]) == 12801
    obs = observations("walker_ppo")
    want = ml_agents_forward("walker_ppo", obs)["mean"]
    assert np.abs(ml_agents.normalize(layout, obs)).max() == 5.0
    assert np.abs(_mean_under(layout, obs, clip=5) - want).max() <= 1e-5
    others = {"rl_games": dict(eps_on_var=1e-5, clip=5), "rsl_rl": dict(eps_on_std=1e-2),
              "gymnasium": dict(eps_on_var=1e-8, clip=10), "no clip": dict()}
    for name, formula in others.items():
        assert np.abs(_mean_under(layout, obs, **formula) - want).max() > 1e-3, name
    converted = pp.load(pp.convert(checkpoint("walker_ppo"))).run({"obs": obs})["mean"]
    assert np.abs(converted - want).max() <= 1e-5
    with monkeypatch.context() as patched:  # the converter itself with another clip gives another mean
        patched.setattr(ml_agents, "NORMALIZER_CLIP", 10.0)
        out = pp.load(pp.convert(checkpoint("walker_ppo"))).run({"obs": obs})
        assert np.abs(out["mean"] - want).max() > 1e-3


def test_extract_gives_every_array_back_bit_for_bit():
    for run in RUNS:
        policy = {k: v.numpy() for k, v in torch.load(checkpoint(run), weights_only=False)["Policy"].items()}
        weights = pp.extract_weights(pp.convert(checkpoint(run)))
        assert list(weights) == list(policy), run
        for name, array in policy.items():
            assert weights[name].dtype == array.dtype and weights[name].shape == array.shape, name
            assert weights[name].tobytes() == array.tobytes(), name


def test_the_head_comes_from_the_run_configuration_or_the_layout(tmp_path):
    read = convert_source(checkpoint("walker_ppo"))
    assert [a.topic for a in read.assumptions] == ["activation", "head"]
    assert "swish at network_body._body_endoder.seq_layers.1 and network_body._body_endoder.seq_layers.3" \
        == read.assumptions[0].assumes
    assert "configuration.yaml (trainer_type ppo)" in read.assumptions[1].because
    assert "tanh_squash off" in read.assumptions[1].assumes
    sac = convert_source(checkpoint("crawler_sac"))
    assert "trainer_type sac" in sac.assumptions[1].because and "tanh_squash on" in sac.assumptions[1].assumes
    alone = tmp_path / "Crawler"
    alone.mkdir()
    shutil.copy(checkpoint("crawler_sac"), alone / "checkpoint.pt")
    told = convert_source(alone / "checkpoint.pt")
    assert "told from the layout" in told.assumptions[1].because and "tanh_squash on" in told.assumptions[1].assumes
    hybrid = convert_source(checkpoint("hybrid_ppo"))
    assert [a.topic for a in hybrid.assumptions] == ["activation", "head", "action masks"]
    assert [o.name for o in hybrid.model.graph.output] == ["action", "mean", "std", "log_std", "discrete_action", "logits"]
    discrete = convert_source(checkpoint("pushblock_discrete"))
    assert [a.topic for a in discrete.assumptions] == ["activation", "action masks"]
    assert any("no configuration.yaml" in note for note in discrete.notes)


def test_a_configuration_that_contradicts_the_checkpoint_is_refused(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(MLA / "walker_ppo", run)
    text = (run / "configuration.yaml").read_text()
    (run / "configuration.yaml").write_text(text.replace("num_layers: 2", "num_layers: 3", 1))
    refused = invoke("convert", run / "Walker" / "Walker-5000.pt", "-o", tmp_path / "a.onnx")
    assert refused.exit_code == 3 and "num_layers: 3" in refused.output and "not this run's" in refused.output
    (run / "configuration.yaml").write_text(text.replace("trainer_type: ppo", "trainer_type: sac"))
    refused = invoke("convert", run / "Walker" / "Walker-5000.pt", "-o", tmp_path / "a.onnx")
    assert refused.exit_code == 3 and "log_sigma parameter" in refused.output
    assert not (tmp_path / "a.onnx").exists()


@pytest.mark.parametrize("edit, said", [("hidden_units: 32", "hidden_units: '3l'"), ("normalize: true", "normalize: 'yes'")])
def test_a_configuration_value_of_another_type_is_refused_naming_it(tmp_path, edit, said):
    run = tmp_path / "run"
    shutil.copytree(MLA / "walker_ppo", run)
    text = (run / "configuration.yaml").read_text()
    assert edit in text
    (run / "configuration.yaml").write_text(text.replace(edit, said, 1))
    refused = invoke("convert", run / "Walker" / "Walker-5000.pt", "-o", tmp_path / "a.onnx")
    key = said.split(":")[0]
    assert refused.exit_code == 3, refused.output
    assert f"behaviors.Walker.network_settings.{key} is {said.split(': ')[1]}" in " ".join(refused.output.split())


def test_what_it_does_not_read_is_refused_clearly(tmp_path):
    saved = torch.load(checkpoint("walker_ppo"), weights_only=False)
    lstm = dict(saved, Policy={**saved["Policy"], "network_body.lstm.lstm.weight_ih_l0": torch.zeros(8, 32)})
    torch.save(lstm, tmp_path / "lstm.pt")
    visual = dict(saved, Policy={**saved["Policy"], "network_body.processors.1.conv_layers.0.weight": torch.zeros(1)})
    torch.save(visual, tmp_path / "visual.pt")
    for name, words in (("lstm", "LSTM"), ("visual", "vector observations only")):
        result = invoke("convert", tmp_path / f"{name}.pt", "-o", tmp_path / "a.onnx")
        assert result.exit_code == 3 and words in result.output, result.output
    (tmp_path / "damaged.pt").write_bytes(checkpoint("walker_ppo").read_bytes()[:2000])
    damaged = invoke("convert", tmp_path / "damaged.pt", "--from", "ml-agents", "-o", tmp_path / "a.onnx")
    assert damaged.exit_code == 3
    option = invoke("convert", checkpoint("walker_ppo"), "--activation", "relu", "-o", tmp_path / "a.onnx")
    assert option.exit_code == 2 and "--activation" in option.output


def test_a_pickled_payload_that_would_run_code_converts_without_running_it(tmp_path):
    marker = tmp_path / "ran"

    saved = torch.load(checkpoint("walker_ppo"), weights_only=False)
    saved["Optimizer:extra"] = code_running_payload(marker)
    (tmp_path / "Walker").mkdir()
    torch.save(saved, tmp_path / "Walker" / "Walker-9.pt")
    assert detect_kind(tmp_path / "Walker" / "Walker-9.pt") == "ml-agents"
    obs = observations("walker_ppo")
    out = pp.load(pp.convert(tmp_path / "Walker" / "Walker-9.pt")).run({"obs": obs})
    assert not marker.exists()
    want = ml_agents_forward("walker_ppo", obs)["deterministic_continuous_actions"]
    assert np.abs(out["action"] - want).max() <= 1e-5


@pytest.mark.parametrize("run, topics", [("walker_ppo", ["activation", "head"]),
                                         ("pushblock_discrete", ["activation", "action masks"]),
                                         ("hybrid_ppo", ["activation", "head", "action masks"])])
def test_convert_verify_pack_and_the_packed_run_on_the_cli(run, topics, tmp_path):
    assert convert_verify_pack(tmp_path, checkpoint(run)) == topics


def test_several_vector_observations_are_normalised_each_by_its_own_normalizer(tmp_path):
    """Two vector observations (5 and 7 wide): ``obs`` is their concatenation, each slice normalised with its own
    statistics and count, as ML-Agents' ObservationEncoder concatenates its processors' outputs."""
    torch.manual_seed(3)
    rng = np.random.default_rng(3)
    actor = make_fixtures.mla.SimpleActor([5, 7], normalize=True, hidden_units=16, num_layers=2, continuous_size=2)
    for i, (size, batches) in enumerate(((5, 3), (7, 5))):
        for _ in range(batches):  # the two normalisers with other statistics and other counts
            batch = make_fixtures.observations(rng, 100, size) * (i + 1)
            actor.network_body.observation_encoder.processors[i].normalizer.update(torch.from_numpy(batch))
    (tmp_path / "Two").mkdir()
    torch.save({"Policy": actor.state_dict(), "global_step": make_fixtures.mla.GlobalSteps().state_dict()},
               tmp_path / "Two" / "Two-1.pt")
    obs = np.concatenate([make_fixtures.observations(rng, 500, 5), make_fixtures.observations(rng, 500, 7) * 3], axis=1)
    with torch.no_grad():
        want = actor([torch.from_numpy(obs[:, :5]), torch.from_numpy(obs[:, 5:])])
    converted = convert_source(tmp_path / "Two" / "Two-1.pt")
    for backend in ("numpy", "onnxruntime"):
        out = pp.load(converted.model, backend).run({"obs": obs})
        assert np.abs(out["action"] - want["deterministic_continuous_actions"].numpy()).max() <= 1e-5
    steps = json.loads(dict((p.key, p.value) for p in converted.model.metadata_props)["policyport.observation_filter"])
    assert steps["normalization_steps"] == [301, 501]


@pytest.mark.parametrize("run", ["pushblock_discrete", "hybrid_ppo"])
def test_action_masks_are_an_optional_input_as_in_ml_agents_export(run):
    """Fed, the masks keep each branch off the actions they forbid, as ML-Agents' masked logits do; left out,
    every action is allowed."""
    obs = observations(run)
    _, _, trainer_type, settings = make_fixtures.RUNS[run]
    rng = np.random.default_rng(8)
    masks = (rng.uniform(size=(1000, sum(settings["discrete_branches"]))) < 0.6).astype(np.float32)
    start = 0
    for size in settings["discrete_branches"]:  # at least one action allowed in every branch, as the environment must
        masks[np.arange(1000), start + rng.integers(size, size=1000)] = 1.0
        start += size
    actor = make_fixtures.actor(trainer_type, settings)
    actor.load_state_dict(torch.load(checkpoint(run), weights_only=False)["Policy"], strict=True)
    with torch.no_grad():
        want = actor([torch.from_numpy(obs)], masks=torch.from_numpy(masks))["deterministic_discrete_actions"].numpy()
        free = actor([torch.from_numpy(obs)])["deterministic_discrete_actions"].numpy()
    assert (want != free).any()
    converted = convert_source(checkpoint(run))
    name = "action" if run == "pushblock_discrete" else "discrete_action"
    for backend in ("numpy", "onnxruntime"):
        session = pp.load(converted.model, backend)
        assert [v.name for v in session.optional_inputs] == ["action_masks"]
        assert (session.run({"obs": obs, "action_masks": masks})[name] == want).all()
        assert (session.run({"obs": obs})[name] == free).all()
    assert (converted.reference({"obs": obs, "action_masks": masks})[name] == want).all()
    start = 0
    for i, size in enumerate(settings["discrete_branches"]):  # no forbidden action is ever chosen
        assert masks[np.arange(1000), start + want[:, i]].all()
        start += size
