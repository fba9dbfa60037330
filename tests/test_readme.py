"""The README's generated parts stay true."""

from __future__ import annotations

import re
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


def test_readme_benchmark_figures_are_the_newest_result_files():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- bench:begin[^>]*-->\n(.*?)<!-- bench:end -->", text, re.S)
    assert block, "README lacks the bench:begin/bench:end markers"
    assert block.group(1) == report.readme_section(), "regenerate with: python scripts/update_readme_bench.py"
