"""Rewrite the README's op table from the numpy backend's registry (``policyport ops --markdown``)."""

import re
from pathlib import Path

from policyport.runtime.numpy.registry import op_table_markdown

readme = Path(__file__).resolve().parents[1] / "README.md"
text = readme.read_text(encoding="utf-8")
new = re.sub(r"(<!-- ops:begin[^>]*-->\n).*?(<!-- ops:end -->)",
             lambda m: m.group(1) + op_table_markdown() + m.group(2), text, flags=re.S)
readme.write_text(new, encoding="utf-8")
