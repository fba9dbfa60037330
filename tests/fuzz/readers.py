"""Readers' fuzzer: mutated real policy files of every source kind through ``policyport convert`` and
``inspect``, in process, each ending in a deliberate exit code.

A case is (kind, number): its seed, the file of the seed it mutates and the mutations follow from
``random.Random(f"{FUZZ_SEED}:{kind}:{number}")`` alone, so a case is rebuilt from those two. Each case
copies its seed (a fixture file or folder, see :data:`KINDS`) into a fresh folder, mutates one of the
files the seed's conversion reads (:mod:`file_mutations`), then runs ``convert`` and ``inspect --json``
through the Typer app in this process (``--debug``, so a bug's traceback is kept). A finding is an
exit code outside 0-4 (70 is a bug in policyport), an exception that escapes the command, or
``inspect --json`` whose stdout is not one JSON document; each is written with its files to a folder
that reproduces it. Cases that end in "not enough memory" (the process is run under an address-space
limit) or run past :data:`CASE_SECONDS` are counted, not findings. A worker process that dies (native
code crashing) is a finding of the case it was running (:func:`run_kinds`).

Run by ``tests/fuzz/test_reader_mutations.py`` (the kinds shared among worker processes); by hand,
from ``tests/``::

    ../.venv/bin/python -m fuzz.readers sb3 rllib --cases 200    # the CI run of two kinds, summaries as JSON
    ../.venv/bin/python -m fuzz.readers sb3 --case 137           # one case again, each command's output shown
    ../.venv/bin/python -m fuzz.readers sb3 --case 137 --write DIR   # only write case 137's files
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .file_mutations import mutate_file

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
#: Seconds one case may take before it is counted as slow and abandoned.
CASE_SECONDS = 60
#: Exit codes a command may end with: 0 ok, 1 verification mismatch, 2 usage, 3 bad input, 4 missing extra.
DELIBERATE = frozenset({0, 1, 2, 3, 4})


@dataclass(frozen=True)
class Seed:
    """A real policy a case starts from.

    Attributes:
        name: how findings name it.
        copy: paths under ``fixtures/`` copied into the case folder (files or folders), by their base name.
        target: the path, relative to the case folder, given to the commands.
        args: options ``convert`` needs for this source (``--activation`` for bare weights ...).
        make: instead of ``copy``, a function writing the seed's files into the case folder.
        expect: the exit code of ``convert`` on the seed itself (3 for a policy policyport refuses, 2 for
            a format that is code, refused without ``--trust``).
    """

    name: str
    copy: tuple[str, ...] = ()
    target: str = ""
    args: tuple[str, ...] = ()
    make: Callable[[Path], None] | None = None
    expect: int = 0


def _torch_seed(save_legacy: bool):
    def make(folder: Path) -> None:
        import torch

        state = torch.load(FIXTURES / "torch" / "gaussian.state_dict.pt", weights_only=True)
        if save_legacy:
            torch.save(state, folder / "legacy.pt", _use_new_zipfile_serialization=False)
        else:
            from safetensors.torch import save_file

            save_file(dict(state), str(folder / "gaussian.safetensors"))
    return make


def _sb3_seeds() -> list[Seed]:
    seeds = [Seed(f"sb3/{p.name}", (f"sb3/{p.name}",), p.name, expect=3 if "cnn" in p.name else 0)
             for p in sorted((FIXTURES / "sb3").glob("*.zip"))]
    seeds.append(Seed("real/sb3_ppo_cartpole.zip", ("real/sb3_ppo_cartpole.zip",), "sb3_ppo_cartpole.zip"))
    seeds.append(Seed("sb3/ppo_pendulum_vecnorm.zip + --obs-norm", ("sb3/ppo_pendulum_vecnorm.zip", "sb3/ppo_pendulum_vecnorm"),
                      "ppo_pendulum_vecnorm.zip", ("--obs-norm", "ppo_pendulum_vecnorm/vecnormalize.pkl")))
    return seeds


def _rllib_seeds() -> list[Seed]:
    seeds = [Seed("rllib/legacy/checkpoint-120", ("rllib/legacy/checkpoint_000120/checkpoint-120",), "checkpoint-120")]
    seeds += [Seed(f"rllib/ray/{p.name}", (f"rllib/ray/{p.name}",), p.name)
              for p in sorted((FIXTURES / "rllib" / "ray").iterdir()) if p.is_dir()]
    return seeds


def _run_seeds(library: str, runs: dict[str, tuple[str, ...]], checkpoint: str) -> list[Seed]:
    """One seed per run folder ``fixtures/<library>/<run>`` (copied whole, so the configuration the
    run wrote beside its checkpoint is read, and mutated, too): run -> the options its conversion needs."""
    return [Seed(f"{library}/{run}", (f"{library}/{run}",), f"{Path(run).name}/{checkpoint.format(run=Path(run).name)}", args)
            for run, args in runs.items()]


#: The continuous Tianshou and TorchRL fixtures' action spaces (their make_fixtures.py's LOW and HIGH).
_TIANSHOU_BOUNDS = "-1,-2,0:1,0.5,3"
_TORCHRL_BOUNDS = "-1,-2,-0.5,0,-3,-1:1,2,0.5,1,1,3"

#: Library checkpoints: each run folder's layout (a configuration beside the checkpoint or none, each
#: network and distribution the reader tells apart) with the options the README's commands give it.
_LIBRARY_KINDS: dict[str, list[Seed]] = {
    "rsl-rl": _run_seeds("rsl_rl", {"gaussian": (), "beta": (), "heteroscedastic": (), "legacy/v1": ("--activation", "elu"),
                                    "legacy/v2_0": (), "legacy/v4_sds": ()}, "model_0.pt"),
    "rl-games": _run_seeds("rl_games", {"ant_elu": (), "humanoid_tanh": (), "discrete_relu": ("--activation", "relu")},
                           "nn/{run}.pth"),
    "skrl": [Seed("skrl/isaaclab_elu", ("skrl/isaaclab_elu",), "isaaclab_elu/checkpoints/agent_1000.pt"),
             Seed("skrl/separate_tanh", ("skrl/separate_tanh",), "separate_tanh/checkpoints/policy_500.pt",
                  ("--activation", "tanh"))],
    "ml-agents": [Seed(f"ml_agents/{run}", (f"ml_agents/{run}",), f"{run}/{behavior}/{behavior}-{steps}.pt")
                  for run, behavior, steps in (("walker_ppo", "Walker", 5000), ("crawler_sac", "Crawler", 3000),
                                               ("hybrid_ppo", "Hybrid", 1000), ("pushblock_discrete", "PushBlock", 2000))],
    "tianshou": [Seed("tianshou/ppo_obs_rms", ("tianshou/ppo_obs_rms",), "ppo_obs_rms/policy.pth",
                      ("--activation", "tanh", "--action-bound-method", "clip", f"--action-bounds={_TIANSHOU_BOUNDS}")),
                 Seed("tianshou/a2c_tanh", ("tianshou/a2c_tanh",), "a2c_tanh/policy_state_dict.pt",
                      ("--activation", "relu", "--action-bound-method", "tanh")),
                 Seed("tianshou/ppo_discrete", ("tianshou/ppo_discrete",), "ppo_discrete/policy_state_dict.pt",
                      ("--activation", "relu")),
                 # a whole pickled object is code: refused without --trust (exit 2) before anything loads it
                 Seed("tianshou/ppo_discrete/policy.pt", ("tianshou/ppo_discrete/policy.pt",), "policy.pt",
                      ("--activation", "relu"), expect=2)],
    "sample-factory": _run_seeds("sample_factory/train_dir", {
        "mlp_tanh": (), "gru_elu": ("--head", "diag-gaussian"), "discrete_relu": ("--activation", "relu", "--head", "categorical"),
        "lstm_elu": ("--head", "categorical"), "separate_gru_tanh": ("--head", "categorical")},
        "checkpoint_p0/checkpoint_000000050_409600.pth"),
    "torchrl": [Seed("torchrl/tanh_normal_checkpoint", ("torchrl/tanh_normal_checkpoint",), "tanh_normal_checkpoint",
                     ("--activation", "tanh", "--distribution", "tanh-normal", f"--action-bounds={_TORCHRL_BOUNDS}")),
                Seed("torchrl/normal_relu_obsnorm_checkpoint", ("torchrl/normal_relu_obsnorm_checkpoint",),
                     "normal_relu_obsnorm_checkpoint", ("--activation", "relu", "--distribution", "normal"))]
    + [Seed(f"torchrl/{name}", (f"torchrl/{name}",), name, args)
       for name, args in (("tanh_normal.pt", ("--activation", "tanh", "--distribution", "tanh-normal")),
                          ("normal_relu.pt", ("--activation", "relu", "--distribution", "normal")),
                          ("discrete_elu.pt", ("--activation", "elu")),
                          ("tanh_normal_ppo_loss.pt", ("--activation", "tanh", "--distribution", "tanh-normal")))],
    "cleanrl": [Seed(f"cleanrl/{p.name}", (f"cleanrl/{p.name}",), p.name)
                for p in sorted((FIXTURES / "cleanrl").glob("*.cleanrl_model"))],
    "brax": [Seed(f"brax/{p.name}", (f"brax/{p.name}",), p.name) for p in sorted((FIXTURES / "brax").glob("*.pkl"))]
    + [Seed("brax/ppo_checkpoint", ("brax/ppo_checkpoint",), "ppo_checkpoint")],
}


#: Source kind -> its seeds. ``convert`` of every seed ends with its ``expect`` before any mutation.
KINDS: dict[str, list[Seed]] = {
    "npz": [Seed("real/metadrive_ppo_expert.npz", ("real/metadrive_ppo_expert.npz",), "metadrive_ppo_expert.npz",
                 ("--activation", "tanh", "--head", "diag-gaussian"))],
    "sb3": _sb3_seeds(),
    "rllib": _rllib_seeds(),
    "state-dict": [Seed(f"torch/{name}.state_dict.pt", (f"torch/{name}.state_dict.pt",), f"{name}.state_dict.pt",
                        ("--activation", activation))
                   for name, activation in (("activations", ",".join(["tanh"] * 9)), ("float64", "tanh,tanh"),
                                            ("gaussian", "tanh"), ("norms", "tanh,tanh"))]
    + [Seed("torch/rllib_fcnet.state_dict.pt --from rllib-torch", ("torch/rllib_fcnet.state_dict.pt",),
            "rllib_fcnet.state_dict.pt", ("--from", "rllib-torch", "--activation", "tanh")),
       Seed("gaussian.safetensors", (), "gaussian.safetensors", ("--activation", "tanh"), _torch_seed(False)),
       Seed("legacy.pt (torch.save's legacy format)", (), "legacy.pt", ("--activation", "tanh"), _torch_seed(True))],
    # Formats that are code: refused without --trust (exit 2) before anything loads them, which is what
    # is fuzzed here; with --trust the file's code runs, and a crash in it is the file's, not a reader's.
    "torchscript": [Seed(f"torch/{p.name}", (f"torch/{p.name}",), p.name,
                         ("--input-shape", "2,3") if p.name.startswith("activations") else (), expect=2)
                    for p in sorted((FIXTURES / "torch").glob("*.torchscript.pt"))],
    "keras": [Seed(f"keras/{p.name}", (f"keras/{p.name}",), p.name)
              for p in sorted((FIXTURES / "keras").glob("*")) if p.suffix in (".keras", ".h5")
              and p.name != "gaussian_lambda.keras"],
    "savedmodel": [Seed("keras/savedmodel", ("keras/savedmodel",), "savedmodel", expect=2)],
    **_LIBRARY_KINDS,
}


def build_seed(seed: Seed, folder: Path) -> Path:
    """Write ``seed``'s files into the empty ``folder``; the path the commands are given."""
    for rel in seed.copy:
        src = FIXTURES / rel
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, folder / src.name)
    if seed.make is not None:
        seed.make(folder)
    return folder / seed.target


#: Kinds whose torch files policyport also reads without torch (its own reader of torch's zip
#: format, as on a numpy-only machine): their odd-numbered cases run with ``import torch`` failing.
WITHOUT_TORCH = frozenset({"state-dict", "sb3"})


@dataclass
class Case:
    kind: str
    number: int
    seed: Seed
    file: str = ""  # the mutated file, relative to the case folder
    mutations: list[str] = field(default_factory=list)

    @property
    def without_torch(self) -> bool:
        return self.kind in WITHOUT_TORCH and self.number % 2 == 1

    @property
    def recipe(self) -> str:
        reader = " (read without torch)" if self.without_torch else ""
        return f"{self.seed.name}{reader}: {self.file}: " + "; then ".join(self.mutations)


@contextlib.contextmanager
def without_torch():
    """``import torch`` (and of its submodules) fails while the block runs, as where torch is not installed."""
    saved = {name: module for name, module in sys.modules.items() if name == "torch" or name.startswith("torch.")}
    sys.modules["torch"] = None
    try:
        yield
    finally:
        del sys.modules["torch"]
        sys.modules.update(saved)


class Worker:
    """Builds and runs the cases of one kind; its seeds are read once (and which of their files
    their conversion opens is recorded once)."""

    def __init__(self, kind: str, base: Path, base_seed: str = "0"):
        base.mkdir(parents=True, exist_ok=True)
        self.kind, self.base, self.base_seed = kind, base, base_seed
        self.pristine: dict[str, tuple[Path, list[str]]] = {}  # seed name -> (folder, files it reads)
        self._opened: set[str] | None = None

    # ------------------------------------------------------------------------------- seeds and cases

    def _read_files(self, seed: Seed) -> tuple[Path, list[str]]:
        if seed.name not in self.pristine:
            folder = self.base / "seeds" / str(len(self.pristine))
            folder.mkdir(parents=True)
            target = build_seed(seed, folder)
            self._opened = set()
            try:
                code, output = run_command(convert_argv(seed, target, self.base / "seed.onnx"), timeout=None)
            finally:
                opened, self._opened = self._opened, None
            if code != seed.expect:
                raise RuntimeError(f"the seed {seed.name} itself does not convert (exit {code}):\n{output}")
            files = sorted({os.path.relpath(p, folder) for p in opened
                            if p.startswith(str(folder) + os.sep) and os.path.isfile(p)})
            if not files:  # read by native code alone (h5py, TensorFlow): any of its files
                files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
            self.pristine[seed.name] = (folder, files)
        return self.pristine[seed.name]

    def audit(self, event: str, args) -> None:
        if self._opened is not None and event == "open" and isinstance(args[0], (str, os.PathLike)):
            self._opened.add(os.path.realpath(args[0]))

    def write(self, number: int, folder: Path) -> tuple[Case, Path]:
        """Write case ``number``'s files into the empty ``folder``; the case and the path to give the commands."""
        rng = random.Random(f"{self.base_seed}:{self.kind}:{number}")
        case = Case(self.kind, number, rng.choice(KINDS[self.kind]))
        pristine, files = self._read_files(case.seed)
        for entry in pristine.iterdir():
            (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, folder / entry.name)
        case.file = rng.choice(files)
        path = folder / case.file
        data = path.read_bytes()
        for _ in range(rng.choice((1, 1, 1, 1, 2, 2, 3))):
            data, what = mutate_file(data, rng, case.file)
            case.mutations.append(what)
        path.write_bytes(data)
        return case, folder / case.seed.target

    # ------------------------------------------------------------------------------------ running

    def run(self, first: int, count: int, findings: Path | None = None, progress: Path | None = None,
            show: bool = False, report=None, summary: dict | None = None) -> dict:
        """Run cases ``first`` to ``first + count - 1``: :func:`new_summary` of them. Each finding's
        files are written under ``findings``; the kind and the running case's number to ``progress``
        before it runs; ``report()`` is called after each case (the summary so far is returned at
        once and filled in as cases run), into ``summary`` when given."""
        summary = new_summary(self.kind) if summary is None else summary
        start, cpu = time.perf_counter(), time.process_time()
        for number in range(first, first + count):
            if progress is not None:
                progress.write_text(f"{self.kind} {number}")
            folder, out = self.base / "case", self.base / "out"
            for place in (folder, out):
                shutil.rmtree(place, ignore_errors=True)
                place.mkdir()
            case, target = self.write(number, folder)
            if os.environ.get("FUZZ_ABORT_AT") == f"{self.kind}:{number}":  # the test of a worker dying
                os.abort()
            commands = {"convert": convert_argv(case.seed, target, out / "model.onnx"),
                        "inspect": ["--debug", "inspect", str(target), "--json"]}
            converted = None  # convert's exit code
            for command, argv in commands.items():
                if command == "inspect" and converted == 0 and not inspect_success(self.base_seed, self.kind, number):
                    continue
                began = time.perf_counter()
                try:
                    with without_torch() if case.without_torch else contextlib.nullcontext():
                        code, output = run_command(argv)
                except CaseTimeout:
                    summary["slow"].append({"case": number, "recipe": case.recipe, "command": command})
                    continue
                if command == "convert":
                    converted = code
                key = f"{command} {code}"
                summary["exit_codes"][key] = summary["exit_codes"].get(key, 0) + 1
                if show:
                    print(f"case {number} ({case.recipe}) {command}: exit {code} in {time.perf_counter() - began:.2f} s\n"
                          f"{output[-3000:]}")
                if "not enough memory" in output:
                    summary["memory"].append({"case": number, "recipe": case.recipe, "command": command})
                problem = _problem(command, code, output)
                if problem:
                    finding = {"case": number, "recipe": case.recipe, "command": command, "exit_code": code,
                               "problem": problem, "output": output[-4000:]}
                    if findings is not None:
                        finding["files"] = str(self.keep(case, folder, findings, command, code, output))
                    summary["findings"].append(finding)
            summary["cases"] += 1
            summary["seconds"] = round(time.perf_counter() - start, 1)
            summary["cpu_seconds"] = round(time.process_time() - cpu, 1)
            if report is not None:
                report()
        return summary

    def keep(self, case: Case, folder: Path, findings: Path, command: str, code: int, output: str) -> Path:
        kept = findings / f"{self.kind}-{case.number}"
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(folder, kept)
        (kept / "FINDING.txt").write_text(
            f"kind {self.kind}, case {case.number} (FUZZ_SEED {self.base_seed})\n{case.recipe}\n"
            f"policyport {command} ... ended with exit {code}\nreproduce: cd tests && ../.venv/bin/python -m fuzz.readers "
            f"{self.kind} --case {case.number}\n\n{output}")
        return kept


def inspect_success(base_seed: str, kind: str, number: int) -> bool:
    """Whether a case whose ``convert`` succeeded is also inspected (a quarter are): a file that converts
    and verifies is inspected as every other test inspects one, while a file that fails takes
    ``inspect``'s own paths (telling its kind from its contents, a placeholder activation)."""
    return random.Random(f"{base_seed}:{kind}:{number}:inspect").random() < 0.25


def new_summary(kind: str) -> dict:
    """What a run of cases found: how many ran, how many ended with each ``"command code"``, the
    findings (a command's bug, an escaped exception, a crash of the whole process), and the cases
    that ended in "not enough memory" or ran past :data:`CASE_SECONDS`."""
    return {"kind": kind, "cases": 0, "exit_codes": {}, "findings": [], "crashes": [], "slow": [], "memory": [],
            "seconds": 0.0, "cpu_seconds": 0.0}


def convert_argv(seed: Seed, target: Path, output: Path) -> list[str]:
    args = [a if not a.endswith(".pkl") else str(target.parent / a) for a in seed.args]
    return ["--debug", "convert", str(target), "-o", str(output), "--samples", "2", "--force", *args]


class CaseTimeout(BaseException):
    """A case ran past :data:`CASE_SECONDS` (a BaseException: no ``except Exception`` swallows it)."""


def _alarm(signum, frame):
    raise CaseTimeout()


def run_command(argv: list[str], timeout: int | None = CASE_SECONDS) -> tuple[int, str]:
    """``policyport *argv`` in this process: (exit code, stdout + stderr); an escaped exception is
    exit code -1 with its traceback. Past ``timeout`` seconds :class:`CaseTimeout` is raised (``None``:
    no limit, for a seed's first conversion, which imports the frameworks)."""
    import typer.testing
    from typer.testing import CliRunner

    from policyport.cli import app

    if not hasattr(typer.testing._get_command, "cache_info"):  # the Click group is built once, not per command
        typer.testing._get_command = functools.lru_cache(maxsize=None)(typer.testing._get_command)

    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout or 0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = CliRunner().invoke(app, argv, catch_exceptions=True)
    finally:
        signal.alarm(0)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        trace = "".join(traceback.format_exception(result.exception))
        return -1, f"{result.output}\nescaped: {trace}"
    return result.exit_code, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def _problem(command: str, code: int, output: str) -> str | None:
    if code == -1:
        return "an exception escaped the command"
    if code not in DELIBERATE:
        return f"exit {code}" + (" (a bug in policyport)" if code == 70 else "")
    if command == "inspect":
        stdout = output.split("stdout:\n", 1)[1].rsplit("\nstderr:\n", 1)[0]
        try:
            json.loads(stdout)
        except ValueError:
            return "inspect --json did not print one JSON document"
    return None


#: Address space each worker process may map: TensorFlow, torch and onnxruntime together map some 2.3
#: GiB; a reader that sizes an allocation from the file without a limit meets this one and ends in
#: "not enough memory" (counted) instead of taking the machine's memory.
ADDRESS_SPACE = 4 << 30


def run_kinds(kinds: list[str], cases: int, findings: Path, *, base_seed: str = "0",
              address_space: int = ADDRESS_SPACE, timeout: float = 3600) -> dict[str, dict]:
    """Run ``cases`` cases of each of ``kinds``, in that order, in one worker process (``python -m
    fuzz.readers``), which imports each framework once: kind -> :func:`new_summary`. A worker that dies
    (a crash in native code) is a finding of its running case, whose files are written under
    ``findings``; the next worker goes on from the case after it. ``timeout`` bounds each worker, in seconds."""
    import subprocess

    totals = {kind: new_summary(kind) for kind in kinds}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                      os.environ.get("PYTHONPATH")])),
           "FUZZ_SEED": base_seed, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("POLICYPORT_DEBUG", None)
    todo, first = list(kinds), 0
    with tempfile.TemporaryDirectory(prefix="policyport-fuzz-") as tmp:
        progress, out, err = Path(tmp) / "progress", Path(tmp) / "summary.json", Path(tmp) / "stderr"
        while todo:
            with open(err, "wb") as stderr:
                proc = subprocess.run([sys.executable, "-X", "faulthandler", "-m", "fuzz.readers", *todo, "--first",
                                       str(first), "--cases", str(cases), "--findings", str(findings), "--progress",
                                       str(progress), "--summary", str(out), "--address-space", str(address_space)],
                                      env=env, stdout=subprocess.DEVNULL, stderr=stderr, timeout=timeout)
            if out.exists():
                for kind, part in json.loads(out.read_text()).items():
                    _merge(totals[kind], part)
                out.unlink()
            if proc.returncode == 0:
                break
            kind, number = progress.read_text().split() if progress.exists() else (todo[0], str(first))
            number = int(number)
            trace = err.read_text(errors="replace")[-6000:]
            kept = findings / f"{kind}-{number}"
            shutil.rmtree(kept, ignore_errors=True)
            made = subprocess.run([sys.executable, "-m", "fuzz.readers", kind, "--case", str(number), "--write", str(kept)],
                                  env=env, capture_output=True, text=True)
            (kept / "FINDING.txt").write_text(f"kind {kind}, case {number} (FUZZ_SEED {base_seed}): the process died "
                                              f"(exit {proc.returncode})\n{made.stdout}\n{trace}")
            totals[kind]["crashes"].append({"case": number, "recipe": made.stdout.split("\n", 1)[0],
                                            "exit_code": proc.returncode, "output": trace, "files": str(kept),
                                            "problem": f"the process died (exit {proc.returncode})"})
            totals[kind]["cases"] += 1
            todo, first = todo[todo.index(kind):], number + 1
            if first >= cases:
                todo, first = todo[1:], 0
            progress.unlink(missing_ok=True)
    return totals


def _merge(total: dict, part: dict) -> None:
    for key in ("cases", "seconds", "cpu_seconds"):
        total[key] = round(total[key] + part[key], 1)
    for key in ("findings", "crashes", "slow", "memory"):
        total[key] += part[key]
    for key, n in part["exit_codes"].items():
        total["exit_codes"][key] = total["exit_codes"].get(key, 0) + n


_current: list = []  # the worker whose seed conversion the audit hook records


def _audit(event: str, args) -> None:
    if _current:
        _current[0].audit(event, args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.readers", description=__doc__.split("\n\n")[0])
    parser.add_argument("kinds", nargs="+", choices=sorted(KINDS), metavar="KIND",
                        help=f"source kinds, run in this order: {', '.join(KINDS)}")
    parser.add_argument("--cases", type=int, default=200, help="cases 0 to CASES - 1 of each kind")
    parser.add_argument("--first", type=int, default=0, help="start the first kind at this case (a worker going on)")
    parser.add_argument("--case", type=int, help="run this one case of the first kind, showing each command's output")
    parser.add_argument("--findings", type=Path, help="write each finding's files here")
    parser.add_argument("--progress", type=Path, help="write the running kind and case's number here before it runs")
    parser.add_argument("--summary", type=Path, help="write the summaries (JSON, by kind) here, else to stdout")
    parser.add_argument("--write", type=Path, help="with --case: only write its files, into this new folder")
    parser.add_argument("--address-space", type=int, help="limit this process's address space to this many bytes")
    args = parser.parse_args(argv)
    if args.case is not None:
        args.kinds, args.first, args.cases = args.kinds[:1], args.case, args.case + 1
    if args.findings:
        args.findings.mkdir(parents=True, exist_ok=True)
    base_seed = os.environ.get("FUZZ_SEED", "0")
    if args.address_space:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (args.address_space, args.address_space))
    sys.addaudithook(_audit)
    summaries: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="policyport-fuzz-") as tmp:
        for i, kind in enumerate(args.kinds):
            worker = Worker(kind, Path(tmp) / kind, base_seed)
            _current[:] = [worker]
            if args.write:
                args.write.mkdir(parents=True)
                case, target = worker.write(args.first, args.write)
                print(f"{case.recipe}\nconvert: {' '.join(convert_argv(case.seed, target, args.write / 'model.onnx')[1:])}")
                return 0
            first = args.first if i == 0 else 0
            show = args.case is not None
            summaries[kind] = new_summary(kind)
            worker.run(first, args.cases - first, args.findings, args.progress, show=show, summary=summaries[kind],
                       report=lambda: args.summary and args.summary.write_text(json.dumps(summaries)))
    if not args.summary and args.case is None:
        print(json.dumps(summaries, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
