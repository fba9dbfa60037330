"""The README stays true: its generated parts, its commands followed in order from a fresh folder, its
Python blocks and its command table."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from policyport.runtime.numpy.registry import op_table_markdown

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_readme_op_table_is_the_registry():
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- ops:begin[^>]*-->\n(.*?)<!-- ops:end -->", text, re.S)
    assert block, "README lacks the ops:begin/ops:end markers"
    assert block.group(1) == op_table_markdown(), "regenerate with: policyport ops --markdown"


def _python_blocks(section: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, re.S)


def _demo_commands() -> list[list[str]]:
    """The policyport commands of scripts/demo.sh, with its variables filled in and loops unrolled."""
    import shlex

    script = (README.parent / "scripts" / "demo.sh").read_text(encoding="utf-8")
    src = re.search(r'^SRC=(\S+)', script, re.M).group(1)
    lines, commands = script.replace("\\\n", " ").splitlines(), []
    for line in lines:
        line = line.strip().replace("$SRC", src).replace('"$SRC"', src)
        if not line.startswith("policyport "):
            continue
        for backend in (["numpy", "onnxruntime"] if "$backend" in line else [None]):
            commands.append(shlex.split(line.replace("$backend", backend or ""))[1:])
    return commands


def test_the_python_api_example_runs_after_the_demo(tmp_path, monkeypatch):
    """The README's Python API block, run where scripts/demo.sh has left its outputs in out/."""
    import numpy as np
    from typer.testing import CliRunner

    from policyport.cli import app

    root = README.parent
    (tmp_path / "fixtures").symlink_to(root / "fixtures")
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    np.save("out/obs.npy", np.random.default_rng(0).uniform(0, 1, (16, 275)).astype(np.float32))
    commands = _demo_commands()
    assert len(commands) >= 9 and commands[0][0] == "convert"
    for args in commands:
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
    assert (tmp_path / "out" / "metadrive_bundle" / "policy.json").exists()
    blocks = _python_blocks("Python API")
    assert blocks and "pp.pack(" in blocks[0]
    namespace: dict = {}
    exec(compile(blocks[0], "README.md (Python API)", "exec"), namespace)
    assert namespace["report"].passed
    assert sorted(namespace["outputs"]) == ["action", "log_std", "logits"]
    assert namespace["steered"]["action"].shape == (8, 2)

    # The Hand-off section's blocks, on the target side: in out/, beside the demo's bundle and module.
    monkeypatch.chdir(tmp_path / "out")
    monkeypatch.syspath_prepend(str(tmp_path / "out"))
    monkeypatch.delitem(sys.modules, "metadrive_policy", raising=False)  # the demo's module, not another test's
    obs = np.load("obs.npy")
    expected = pp_run(tmp_path / "out" / "metadrive.onnx", obs)
    handoff = _python_blocks("Hand-off")
    assert len(handoff) == 3
    results = []
    for i, block in enumerate(handoff):
        namespace = {}
        exec(compile(block, f"README.md (Hand-off, block {i + 1})", "exec"), namespace)
        results.append(namespace)
    np.testing.assert_array_equal(results[0]["action"], expected["action"])     # run.py's own runtime
    np.testing.assert_array_equal(results[1]["action"], expected["action"])     # the installed package
    assert results[1]["report"].passed
    np.testing.assert_array_equal(results[2]["outputs"]["action"], expected["action"])  # the one module
    assert len(results[2]["record"]) == 7
    assert not np.array_equal(results[2]["steered"]["action"], expected["action"])


def pp_run(model, obs):
    import policyport as pp

    return pp.load(model, backend="numpy").run({"obs": obs})


def _console_steps() -> list[tuple[str, list[str], str]]:
    """Every ``$`` line of the README's console blocks, in order: (section, argv, the output shown)."""
    import shlex

    text, steps, section = README.read_text(encoding="utf-8"), [], ""
    for part in re.split(r"(\n## [^\n]+|```console\n.*?```)", text, flags=re.S):
        if part.startswith("\n## "):
            section = part.strip("\n# ")
        elif part.startswith("```console"):
            lines = part.split("\n")[1:-1]
            starts = [i for i, line in enumerate(lines) if line.startswith("$ ")] + [len(lines)]
            for a, b in zip(starts, starts[1:]):
                argv = shlex.split(lines[a][2:], comments=True)
                steps.append((section, argv, "\n".join(lines[a + 1:b])))
    return steps


_OUTPUT_FLAGS = ("-o", "--output", "--record", ">")
_INPUT_FLAGS = ("-i", "--input", "--source", "--overrides")


def test_every_file_a_readme_command_reads_was_made_by_an_earlier_one_and_none_is_written_twice():
    """Following the README from the top in one folder (the repository root) works: each console
    command reads only repository files or files an earlier command wrote, and no command writes a file
    an earlier one wrote (which would stop it with exit 3 'exists'). Commands shown failing write nothing."""
    made: dict[str, str] = {}
    for section, argv, shown in _console_steps():
        argv = argv[: argv.index("|")] if "|" in argv else argv
        if argv[0] not in ("policyport", "python") or "/tmp/target" in shown:
            continue
        reads = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in _INPUT_FLAGS]
        if argv[0] == "policyport" and argv[1] != "ops":
            reads.append(argv[2])                                       # MODEL, SRC or REC
        elif argv[0] == "python" and argv[1] != "-c":
            reads.append(argv[1])                                       # a script
        for name in reads:  # a file made earlier, or one inside a folder made earlier (a packed folder's run.py)
            made_before = any(str(p) in made for p in [Path(name), *Path(name).parents])
            assert (ROOT / name).exists() or made_before, f"{section}: {' '.join(argv)} reads {name}, made nowhere before"
        if shown.startswith("error:"):
            continue
        writes = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in _OUTPUT_FLAGS]
        writes += re.findall(r"np\.save\('([^']+)'", " ".join(argv))
        for name in writes:
            assert not (ROOT / name).exists(), f"{section}: {' '.join(argv)} writes {name}, a file of the repository"
            assert name not in made, f"{section}: {' '.join(argv)} writes {name}, which {made[name]} wrote already"
            made[name] = " ".join(argv)
    assert {"metadrive.onnx", "obs.npy", "bad.npy", "metadrive_bundle", "tied.onnx"} <= set(made)


def test_the_tour_runs_what_the_demo_runs():
    """scripts/demo.sh runs the tour's policyport commands (into out/, with --force)."""
    tour = {argv[1] for section, argv, _ in _console_steps() if section == "A tour of the CLI" and argv[0] == "policyport"}
    demo = {args[0] for args in _demo_commands()}
    assert tour == {"convert", "inspect", "extract", "run", "record", "stats", "verify", "pack"}
    assert tour <= demo


def test_readme_benchmark_figures_are_the_newest_result_files():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- bench:begin[^>]*-->\n(.*?)<!-- bench:end -->", text, re.S)
    assert block, "README lacks the bench:begin/bench:end markers"
    assert block.group(1) == report.readme_section(), "regenerate with: python scripts/update_readme_bench.py"


def test_the_readme_shows_the_report_lines_the_command_prints_today():
    """A verification report shown under a ``policyport`` command has today's wording: its first line
    names the observations and the dtype's tolerances, its verdict counts comparisons and, where a
    source was compared (convert, verify --source), first says what the source side was and what it
    assumes (as policyport/cli/verify.py and compare.verdict render them). A packed folder's run.py
    prints its own, shorter report."""
    shown = [(argv, out) for _, argv, out in _console_steps() if argv[0] == "policyport" and "max abs error" in out]
    assert len(shown) >= 10
    for argv, out in shown:
        against = " against .+?" if argv[1] == "convert" or "--source" in argv else ""
        for line in out.splitlines():
            if line.startswith("max abs error"):
                assert re.fullmatch(r"max abs error on [\d,]+ observations \((b?float\d+: atol \S+, rtol \S+(; )?)+\)", line), (argv, line)
            if line.startswith(("PASS", "FAIL")):
                assert re.match(rf"(PASS|FAIL){against}: \d+ comparisons within (b?float\d+: atol \S+, rtol \S+(; )?)+; worst ",
                                line), (argv, line)


def test_the_reference_table_lists_every_option_of_every_command():
    """Each command has one row in the README's command table, naming every option it takes."""
    from typer.main import get_command

    from policyport.cli import app

    text = README.read_text(encoding="utf-8").split("\n## Reference\n", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `policyport ([a-z0-9-]+) .*$", text, re.M)}
    group = get_command(app)
    assert set(rows) == set(group.commands)
    for name, command in group.commands.items():
        for param in command.params:
            if param.param_type_name != "option" or param.name == "help":
                continue
            def shown(option):
                return re.search(re.escape(option) + r"(?![\w-])", rows[name])

            assert any(shown(o) for o in param.opts), f"{name}: {param.opts[0]} missing from its README row"
            for option in param.secondary_opts:  # --no-rounding beside --rounding
                assert shown(option), f"{name}: {option} missing from its README row"


#: Options a command refuses to run without unless another option is given (Click cannot say so; the
#: command checks it, see test_cli_perf's usage errors): shown required in the table, with the exception.
NEEDED_UNLESS = {("run", "-o"): "--profile"}


def _bracket_depths(text: str) -> list[int]:
    depth, depths = 0, []
    for char in text:
        depth += char == "["
        depths.append(depth)
        depth -= char == "]"
    return depths


def test_the_reference_table_brackets_exactly_the_options_a_command_runs_without():
    """A synopsis shows a required option bare and an optional one in [brackets], as the command takes them."""
    from typer.main import get_command

    from policyport.cli import app

    text = README.read_text(encoding="utf-8").split("\n## Reference\n", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(2): (m.group(1), m.group(3)) for m in re.finditer(r"^\| `(policyport ([a-z0-9-]+) .*?)` \|(.*)$", text, re.M)}
    for name, command in get_command(app).commands.items():
        synopsis, does = rows[name]
        depths = _bracket_depths(synopsis)
        for param in command.params:
            if param.param_type_name != "option" or param.name == "help":
                continue
            at = [m.start() for o in param.opts for m in re.finditer(re.escape(o) + r"(?![\w-])", synopsis)]
            needed = param.required or (name, param.opts[0]) in NEEDED_UNLESS
            assert any(depths[i] == 0 for i in at) == needed, \
                f"{name}: {param.opts[0]} is {'required' if needed else 'optional'}; its README row shows it otherwise"
            if (name, param.opts[0]) in NEEDED_UNLESS:
                assert f"needs no `{param.opts[0]}`" in does and NEEDED_UNLESS[name, param.opts[0]] in does
