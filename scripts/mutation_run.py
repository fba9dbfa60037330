"""Run mutmut over one group of modules at a time, each in its own copy of the tree (see mutation.sh).

A group names the modules to mutate and the tests that exercise them; mutmut runs, for each mutant,
only those of the group's tests that reach the mutated function. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

from mutation_report import KILLED  # scripts/ is this script's folder, first on sys.path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".mutation"

#: group -> (modules to mutate, the tests that pin their behaviour). mutmut runs, per mutant, the
#: ones of these that reach the mutated function; fewer, faster files keep a group within the hour.
#: Tests that run the package in another interpreter (a numpy-only venv, run.py of a copied folder)
#: cannot import mutmut's rewritten modules and are left out.
GROUPS: dict[str, tuple[list[str], list[str]]] = {
    "compare": (["policyport/verification/compare.py"], ["tests/test_compare.py", "tests/test_tolerances.py"]),
    "verification": (["policyport/verification/verify.py"],
                     ["tests/test_verify_rules.py", "tests/test_verify_source.py", "tests/test_rounding.py",
                      "tests/test_verify.py", "tests/test_inputs.py", "tests/test_stochastic.py",
                      "tests/test_tolerances.py", "tests/test_verify_blocks.py"]),
    "passes": (["policyport/graph/passes.py"],
               ["tests/test_passes_rules.py", "tests/test_passes.py", "tests/test_tensor_names.py",
                "tests/test_onnx_tensors.py", "tests/test_foreign_models.py", "tests/test_stochastic.py"]),
    "cli": (["policyport/cli/*"],
            ["tests/test_cli_render.py", "tests/test_cli.py", "tests/test_cli_edge.py", "tests/test_cli_usage.py",
             "tests/test_cli_misuse.py", "tests/test_cli_analysis.py", "tests/test_cli_perf.py",
             "tests/test_cli_plain_table.py", "tests/test_hints.py"]),
    # test_fuzz_differential.py and test_published_policies.py reach no line or branch of the runtime
    # that these files do not; the fuzzer alone takes seconds per mutant that reaches an op.
    "runtime": (["policyport/runtime/*"],
                ["tests/runtime/test_entry.py", "tests/test_readme.py", "tests/runtime/test_ops.py",
                 "tests/runtime/test_onnx_conformance.py", "tests/runtime/test_plan.py",
                 "tests/runtime/test_session.py", "tests/runtime/test_strict_ops.py", "tests/runtime/test_recurrent.py",
                 "tests/runtime/test_conv_pool.py", "tests/runtime/test_sampling.py", "tests/test_inputs.py",
                 "tests/test_pack.py", "tests/runtime/test_overrides.py", "tests/runtime/test_rows.py",
                 "tests/runtime/test_profile.py", "tests/runtime/test_edges.py", "tests/test_tensor_names.py"]),
    "converter": (["policyport/converter/__init__.py", "policyport/converter/activations.py",
                   "policyport/converter/build.py", "policyport/converter/readers/msgpack_decode.py",
                   "policyport/converter/sources/reference.py", "policyport/converter/sources/rllib.py",
                   "policyport/converter/sources/rllib_weights.py", "policyport/converter/sources/sb3.py",
                   "policyport/converter/sources/state_dict.py", "policyport/converter/readers/torch_files.py",
                   "policyport/converter/readers/unpickle.py"],
                  ["tests/converter/test_rllib_weights.py", "tests/converter/test_layer_order.py", "tests/converter/test_build.py",
                   "tests/converter/test_msgpack_decode.py", "tests/converter/test_unpickle.py",
                   "tests/converter/test_rllib.py", "tests/converter/test_state_dict.py", "tests/converter/test_sb3.py",
                   "tests/converter/test_options.py", "tests/converter/test_hostile_torch.py", "tests/converter/test_torch_files.py",
                   "tests/converter/test_discrete_observations.py", "tests/converter/test_refusals.py",
                   "tests/test_layers.py", "tests/test_spine.py"]),
    # The exporters of live torch modules and Keras/TensorFlow models: their tests run the frameworks.
    "converter-frameworks": (["policyport/converter/sources/torch_module.py", "policyport/converter/sources/keras.py"],
                             ["tests/converter/test_torch_module.py", "tests/converter/test_keras.py",
                              "tests/converter/test_keras_passes.py", "tests/converter/test_keras_trace.py",
                              "tests/converter/test_torch_export.py",
                              "tests/test_cli_torch.py"]),
}

#: Tests that read the package's source text rather than run it (under mutmut they would read its
#: rewritten modules), or run it where mutmut cannot be imported: left out of every group.
STATIC = ["tests/test_cli_usage.py::test_every_install_hint_names_an_extra_that_installs_the_module",
          # runs the package in an interpreter started with -S -I, where mutmut cannot be imported
          "tests/test_pack.py::test_the_packed_expert_runs_where_only_numpy_can_be_imported",
          # child interpreters that import the package (its imports, or an interruption while it runs)
          "tests/test_cli_perf.py::test_run_on_the_numpy_backend_imports_only_what_it_needs",
          "tests/test_cli_analysis.py::test_sigterm_during_record_leaves_no_partial_output",
          "tests/test_cli_misuse.py::test_ctrl_c_and_sigterm_exit_with_their_codes_and_write_nothing"]

#: Files the tests read besides the package and tests/.
ALSO_COPY = ["fixtures", "README.md", "SECURITY.md", "scripts", "benchmarks", "docs"]


def prepare(group: str) -> Path:
    """A fresh copy of the tracked tree (and untracked test files) under .mutation/GROUP with its setup.cfg."""
    modules, tests = GROUPS[group]
    folder = WORK / group
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if name.startswith(".mutation/") or not (ROOT / name).is_file():
            continue
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    # mutmut's trampolines make a module several times larger: let packed folders hold such copies.
    folder_py = folder / "policyport" / "graph" / "folder.py"
    folder_py.write_text(folder_py.read_text().replace("MAX_CODE_BYTES = 1 << 20", "MAX_CODE_BYTES = 1 << 26"))
    # ...and each call goes through two more frames (trampoline, wrapper): tests that recurse deliberately
    # (MessagePack nested 200 deep) need room for three times the frames.
    conftest = folder / "tests" / "conftest.py"
    conftest.write_text(conftest.read_text() + "\n\nimport sys as _sys\n\n_sys.setrecursionlimit(10_000)\n")
    existing = [t for t in tests if (folder / t).exists()]
    lines = ["[mutmut]", "source_paths = policyport", "only_mutate ="]
    lines += [f"    {m}" for m in modules]
    lines += ["pytest_add_cli_args_test_selection ="] + [f"    {t}" for t in existing]
    lines += ["pytest_add_cli_args =", "    -p", "    no:cacheprovider"]
    lines += [f"    --deselect\n    {t}" for t in STATIC]
    lines += ["also_copy ="]
    lines += [f"    {c}" for c in ALSO_COPY]
    (folder / "setup.cfg").write_text("\n".join(lines) + "\n")
    return folder


def _metas(folder: Path) -> dict[Path, dict]:
    """mutmut's results in ``folder``: module .meta file (relative) -> its JSON."""
    root = folder / "mutants"
    return {meta.relative_to(root): json.loads(meta.read_text()) for meta in root.rglob("*.py.meta")}


def mutant_names(folder: Path) -> list[str]:
    """Every mutant mutmut generated in ``folder`` (the keys of its ``.meta`` files), sorted."""
    return sorted(name for data in _metas(folder).values() for name in data["exit_code_by_key"])


def _function(mutant: str) -> str:
    """The mangled function name of a mutant (``pkg.mod.x_fn__mutmut_3`` -> ``x_fn``)."""
    return mutant.rsplit(".", 1)[1].rsplit("__mutmut_", 1)[0]


def carry_over(previous: dict[Path, dict], folder: Path) -> list[str]:
    """Copy into ``folder``'s fresh results every kill of ``previous`` whose function is unchanged (same
    source hash); returns the mutants left to check. This assumes tests were only added or sharpened
    since, so a mutant a test killed stays killed; everything else (survivors, unchecked, changed
    functions) runs again."""
    left = []
    for relative, data in _metas(folder).items():
        old = previous.get(relative, {"exit_code_by_key": {}, "hash_by_function_name": {}})
        codes = data["exit_code_by_key"]
        for name in codes:
            same = old["hash_by_function_name"].get(_function(name)) == data["hash_by_function_name"].get(_function(name))
            if same and old["exit_code_by_key"].get(name) in KILLED:
                codes[name] = old["exit_code_by_key"][name]
            else:
                left.append(name)
        (folder / "mutants" / relative).write_text(json.dumps(data, indent=4))
    return sorted(left)


#: mutmut's exit codes for a mutant that ran past its time limit (mutmut/stats.py).
TIMEOUTS = {36, 24, -24, 152, 255}
#: The most seconds a timed-out mutant's tests may take when checked again in an interpreter of their own.
RECHECK_SECONDS = 900


def recheck_timeouts(group: str, folder: Path, env: dict) -> None:
    """Check every mutant that timed out again, in a fresh interpreter, and record what its tests say.

    mutmut runs a mutant's tests in a child forked from a process that has run them before. A library
    whose threads were started in that parent (TensorFlow) can hang in the child, so that the
    mutant "times out" whatever it changed, and mutmut counts it as killed. Here each such mutant's
    tests (the group's, stopping at the first failure) run in a new process with mutmut's
    ``MUTANT_UNDER_TEST`` switch: exit 0 is recorded as survived, 1 as killed, and a mutant that
    still runs past :data:`RECHECK_SECONDS` stays a timeout.
    """
    tests = [t for t in GROUPS[group][1] if (folder / "mutants" / t).exists()]
    deselected = [arg for t in STATIC for arg in ("--deselect", t)]  # as prepare() selects them for mutmut
    outcome = {"killed": 0, "survived": 0, "timeout": 0}
    for meta, data in _metas(folder).items():
        codes = data["exit_code_by_key"]
        timed_out = [name for name, code in codes.items() if code in TIMEOUTS]
        for name in timed_out:
            command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *deselected, *tests]
            try:
                done = subprocess.run(command, cwd=folder / "mutants", env={**env, "MUTANT_UNDER_TEST": name},
                                      capture_output=True, timeout=RECHECK_SECONDS)
            except subprocess.TimeoutExpired:
                outcome["timeout"] += 1
                continue
            codes[name] = 0 if done.returncode == 0 else 1
            outcome["survived" if done.returncode == 0 else "killed"] += 1
            print(f"   {name}: {'survived' if done.returncode == 0 else 'killed'} in a fresh interpreter", flush=True)
        if timed_out:
            (folder / "mutants" / meta).write_text(json.dumps(data))
    if sum(outcome.values()):
        print(f"== {group}: timeouts checked again in a fresh interpreter: {outcome['killed']} killed, "
              f"{outcome['survived']} survived, {outcome['timeout']} still past {RECHECK_SECONDS} s", flush=True)


def run_group(group: str, mutmut: Path, children: str, sample: int | None, seed: int, resume: bool,
              env: dict) -> int:
    """mutmut over one group (in environment ``env``), then its timeouts checked again; with ``sample``,
    over that many of its mutants drawn uniformly at random (``seed`` fixes the draw), the rest left
    unchecked: the score then estimates the whole group's. With ``resume``, the kills of the previous
    run in functions unchanged since are kept and every other mutant is checked against the tests as
    they are now."""
    previous = _metas(WORK / group) if resume and (WORK / group / "mutants").is_dir() else None
    if resume and not previous:
        print(f"no previous run of {group} to resume", file=sys.stderr)
        return 2
    folder = prepare(group)
    print(f"== {group}: mutmut run in {folder.relative_to(ROOT)}", flush=True)
    command = [str(mutmut), "run", "--max-children", children]
    if sample is not None or previous:
        # A filter that matches no mutant: mutmut generates every mutant and maps tests to functions,
        # then stops, which lists the names to draw from.
        primed = subprocess.run([*command, "no-such-mutant"], cwd=folder, env=env, capture_output=True, text=True)
        if "nothing matches" not in primed.stdout + primed.stderr:  # it failed before the filter: say why
            print(primed.stdout[-4000:], primed.stderr[-4000:], sep="\n", file=sys.stderr)
            print(f"mutmut could not generate the mutants of {group} or map its tests (exit {primed.returncode})",
                  file=sys.stderr)
            return primed.returncode or 1
        names = mutant_names(folder)
        if not names:
            print(f"mutmut generated no mutants for {group}", file=sys.stderr)
            return 1
        if previous:
            drawn = carry_over(previous, folder)
            print(f"== {group}: {len(names) - len(drawn)} kills of unchanged functions kept; "
                  f"{len(drawn)} mutants to check", flush=True)
            if not drawn:
                return 0
        else:
            drawn = random.Random(seed).sample(names, min(sample, len(names)))
            print(f"== {group}: {len(drawn)} of {len(names)} mutants drawn (seed {seed})", flush=True)
        command += drawn
    code = subprocess.run(command, cwd=folder, env=env).returncode
    if code == 0:
        recheck_timeouts(group, folder, env)
    return code


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="mutmut over groups of modules (see scripts/mutation.sh)")
    parser.add_argument("groups", nargs="*", metavar="GROUP", help="groups to run (default: all)")
    parser.add_argument("--list", action="store_true", help="print the groups, their modules and tests")
    parser.add_argument("--sample", type=int, metavar="N",
                        help="check N mutants of each group drawn at random instead of all of them")
    parser.add_argument("--seed", type=int, default=0, help="the seed of --sample's draw (default 0)")
    parser.add_argument("--recheck", action="store_true",
                        help="only check the last run's timed-out mutants again, each in a fresh interpreter "
                             "(done after every run; for a run stopped before it)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the previous run's kills in functions unchanged since; check the rest "
                             "(its survivors, what it left unchecked, changed functions) against the current tests")
    args = parser.parse_args(argv)
    if args.list:
        for name, (modules, tests) in GROUPS.items():
            print(f"{name}: mutates {' '.join(modules)}; tests {' '.join(tests)}")
        return 0
    groups = args.groups or list(GROUPS)
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        print(f"unknown group(s) {', '.join(unknown)}; choose from {', '.join(GROUPS)}", file=sys.stderr)
        return 2
    if args.recheck and (args.sample is not None or args.resume):
        print("--recheck checks the last run again; it takes neither --sample nor --resume", file=sys.stderr)
        return 2
    if args.sample is not None and args.resume:
        print("--sample and --resume do not go together", file=sys.stderr)
        return 2
    if args.sample is not None and args.sample < 1:
        print(f"--sample must be at least 1, not {args.sample}", file=sys.stderr)
        return 2
    mutmut = Path(sys.executable).with_name("mutmut")
    # MUTATION_CHILDREN=1 leaves a shared machine's other core free (default 2, the figures' setting).
    children = os.environ.get("MUTATION_CHILDREN", "2")
    if not children.isdigit() or int(children) < 1:
        print(f"MUTATION_CHILDREN must be a positive whole number, not {children!r}", file=sys.stderr)
        return 2
    # mutmut forks a child per mutant from a process that has run the tests: a child that uses torch
    # deadlocks in the OpenMP thread pool its parent started (and times out after minutes) unless
    # that pool has one thread.
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for group in groups:
        if args.recheck:
            if not (WORK / group / "mutants").is_dir():
                print(f"no run of {group} to check again", file=sys.stderr)
                return 2
            recheck_timeouts(group, WORK / group, env)
            continue
        code = run_group(group, mutmut, children, args.sample, args.seed, args.resume, env)
        if code:
            print(f"mutmut run failed for {group} (exit {code})", file=sys.stderr)
            return code
    subprocess.run([sys.executable, str(ROOT / "scripts" / "mutation_report.py"), *groups], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
