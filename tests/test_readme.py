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


def test_readme_benchmark_figures_are_the_newest_result_files():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- bench:begin[^>]*-->\n(.*?)<!-- bench:end -->", text, re.S)
    assert block, "README lacks the bench:begin/bench:end markers"
    assert block.group(1) == report.readme_section(), "regenerate with: python scripts/update_readme_bench.py"
