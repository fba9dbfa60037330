"""Rewrite the README's benchmark figures from the newest result files in benchmarks/results/.

``benchmarks/bench_runtime.py`` (``scripts/bench.sh``) and ``benchmarks/bench_record.py`` write one
JSON document per run there; the block between the README's ``bench:begin`` and ``bench:end``
markers is generated from the newest of each (``benchmarks/report.py``), and a test keeps it so.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import readme_section  # noqa: E402

readme = ROOT / "README.md"
text = readme.read_text(encoding="utf-8")
new, count = re.subn(r"(<!-- bench:begin[^>]*-->\n).*?(<!-- bench:end -->)",
                     lambda m: m.group(1) + readme_section() + m.group(2), text, flags=re.S)
if count != 1:
    sys.exit("README.md lacks the <!-- bench:begin --> / <!-- bench:end --> markers")
readme.write_text(new, encoding="utf-8")
