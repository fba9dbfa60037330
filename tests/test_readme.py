"""The README's generated parts stay true."""

from __future__ import annotations

import re
from pathlib import Path

from policyport.runtime.numpy.registry import op_table_markdown

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_op_table_is_the_registry():
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- ops:begin[^>]*-->\n(.*?)<!-- ops:end -->", text, re.S)
    assert block, "README lacks the ops:begin/ops:end markers"
    assert block.group(1) == op_table_markdown(), "regenerate with: policyport ops --markdown"
