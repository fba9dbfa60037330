"""Readers' fuzzing: mutated real policy files of every source kind end in a deliberate exit code.

``FUZZ_FILES`` mutated files per source kind (default 200, as CI runs; ``FUZZ_FILES=2000 scripts/test.sh
tests/fuzz/test_reader_mutations.py`` is the nightly run) go through ``policyport convert`` and
``inspect --json`` in ``FUZZ_JOBS`` worker processes (default: one per CPU) that share the kinds (see
readers.py). Every command must end with 0-4 — never 70, "a bug in policyport" — with no exception
escaping it, and no worker may die. TorchScript files and SavedModels are code: without ``--trust``
every command refuses them (exit 2) before anything loads them, and that refusal is what is fuzzed. A
finding prints its case (kind and number; ``FUZZ_SEED`` changes every case), what was mutated, the
command's output, and the folder its files were written to (``FUZZ_FINDINGS``, default
``.fuzz-findings/`` in the repository);
``python -m fuzz.readers KIND --case N``, run from ``tests/``, runs the case again.
"""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from .file_mutations import mutate_file
from .readers import KINDS, ROOT, run_kinds

FUZZ_FILES = int(os.environ.get("FUZZ_FILES", "200"))
FUZZ_SEED = os.environ.get("FUZZ_SEED", "0")
FINDINGS = Path(os.environ.get("FUZZ_FINDINGS", ROOT / ".fuzz-findings"))
#: CPU seconds 200 cases of each kind took (Keras' conversions through TensorFlow and tf2onnx are the
#: slowest): the kinds are shared among FUZZ_JOBS worker processes by them, longest first to the least loaded.
COST = {"keras": 35, "torchscript": 3, "savedmodel": 4, "sb3": 8, "npz": 7, "rllib": 3, "state-dict": 3,
        "ml-agents": 9, "sample-factory": 9, "rsl-rl": 6, "cleanrl": 6, "skrl": 5, "brax": 5, "rl-games": 4,
        "tianshou": 3, "torchrl": 3}
ORDER = tuple(sorted(COST, key=COST.get, reverse=True))


def groups(jobs: int) -> list[list[str]]:
    """The kinds shared among ``jobs`` workers, each worker's about as long (longest first to the least loaded)."""
    loads: list[tuple[float, list[str]]] = [(0.0, []) for _ in range(max(1, min(jobs, len(ORDER))))]
    for kind in ORDER:
        load, kinds = min(loads, key=lambda entry: entry[0])
        loads.remove((load, kinds))
        loads.append((load + COST[kind], [*kinds, kind]))
    return [kinds for _, kinds in loads]


@pytest.fixture(scope="module")
def runs():
    """kind -> the future of its worker's run; the workers start at once, FUZZ_JOBS of them (default: one per CPU)."""
    jobs = int(os.environ.get("FUZZ_JOBS", str(os.cpu_count() or 1)))
    shares = groups(jobs)
    with ThreadPoolExecutor(max_workers=len(shares)) as pool:
        futures = {tuple(kinds): pool.submit(run_kinds, kinds, FUZZ_FILES, FINDINGS, base_seed=FUZZ_SEED)
                   for kinds in shares}
        yield {kind: future for kinds, future in futures.items() for kind in kinds}


def test_every_kind_is_fuzzed_once():
    assert sorted(ORDER) == sorted(KINDS)
    for jobs in (1, 2, 3, 16):
        assert sorted(k for kinds in groups(jobs) for k in kinds) == sorted(KINDS)
    assert sorted(groups(2)) == [["keras", "cleanrl", "brax", "rl-games", "rllib", "tianshou"],
                                 ["ml-agents", "sample-factory", "sb3", "npz", "rsl-rl", "skrl", "savedmodel",
                                  "torchscript", "state-dict", "torchrl"]]


def _shown(finding: dict) -> str:
    return (f"case {finding['case']}: {finding['recipe']}\n  {finding.get('command', 'the worker')}: "
            f"{finding['problem']}\n  files: {finding.get('files', '-')}\n  "
            + "\n  ".join(finding["output"].strip().splitlines()[-12:]))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ORDER)
def test_mutated_files_end_in_a_deliberate_exit_code(runs, kind):
    summary = runs[kind].result()[kind]
    report = (f"{kind}: {summary['cases']} mutated files in {summary['seconds']} s ({summary['cpu_seconds']} s of CPU), "
              f"exit codes {summary['exit_codes']}; "
              f"{len(summary['memory'])} ran out of memory, {len(summary['slow'])} ran too long")
    print(report)
    problems = summary["findings"] + summary["crashes"]
    assert not problems, report + f"; FUZZ_SEED {FUZZ_SEED}:\n" + "\n".join(_shown(f) for f in problems)
    assert summary["cases"] == FUZZ_FILES


@pytest.mark.slow
def test_a_worker_that_dies_is_a_finding_of_its_case_and_the_rest_still_run(tmp_path, monkeypatch):
    monkeypatch.setenv("FUZZ_ABORT_AT", "rllib:1")
    summary = run_kinds(["rllib", "npz"], 3, tmp_path)
    assert [c["case"] for c in summary["rllib"]["crashes"]] == [1] and summary["rllib"]["crashes"][0]["exit_code"] == -6
    assert summary["rllib"]["cases"] == 3 and summary["npz"]["cases"] == 3
    assert sum(summary["rllib"]["exit_codes"].get(f"convert {code}", 0) for code in range(5)) == 2
    kept = tmp_path / "rllib-1"
    assert (kept / "FINDING.txt").read_text().startswith(f"kind rllib, case 1 (FUZZ_SEED 0): the process died (exit -6)\n"
                                                          f"{summary['rllib']['crashes'][0]['recipe']}\n")
    assert len([p for p in kept.iterdir() if p.name != "FINDING.txt"]) == 1  # the case's seed, mutated


@pytest.mark.parametrize("kind", ORDER)
def test_a_case_is_its_seed_alone(kind, tmp_path):
    """The same case (kind, number) writes the same files: a finding reproduces from its number."""
    from .readers import Worker

    worker = Worker(kind, tmp_path / "w", FUZZ_SEED)
    worker._read_files = lambda seed: _pristine(worker, seed)  # no conversion of the seed: only the bytes
    written = []
    for attempt in range(2):
        folder = tmp_path / f"case{attempt}"
        folder.mkdir()
        case, target = worker.write(3, folder)
        written.append((case.recipe, sorted((p.relative_to(folder).as_posix(), p.read_bytes())
                                            for p in folder.rglob("*") if p.is_file())))
    assert written[0] == written[1]
    assert written[0][0].startswith(case.seed.name)


def _pristine(worker, seed):
    from .readers import build_seed

    if seed.name not in worker.pristine:
        folder = worker.base / "seeds" / str(len(worker.pristine))
        folder.mkdir(parents=True)
        build_seed(seed, folder)
        files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        worker.pristine[seed.name] = (folder, files)
    return worker.pristine[seed.name]


@pytest.mark.parametrize("name", ["sb3/ppo_pendulum.zip", "real/metadrive_ppo_expert.npz",
                                  "torch/gaussian.state_dict.pt", "rllib/ray/ppo_new_msgpack/algorithm_state.msgpack",
                                  "keras/mlp_norm.h5"])
def test_mutations_change_the_file_and_follow_their_seed(name):
    data = (ROOT / "fixtures" / name).read_bytes()
    runs = [[mutate_file(data, random.Random(f"{name}:{i}"), name) for i in range(20)] for _ in range(2)]
    assert runs[0] == runs[1]
    assert sum(new != data for new, _ in runs[0]) >= 18  # a mutation may land on a no-op (a value replaced by itself)
