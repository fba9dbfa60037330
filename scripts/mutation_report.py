"""Summarise the mutmut runs of scripts/mutation.sh: killed/total per module, and the survivors.

    .venv/bin/python scripts/mutation_report.py [GROUP...] [--survivors]

A mutant counts as killed when a test failed on it (or it timed out or crashed the interpreter);
"no tests" (no selected test reaches the function) and "survived" count against the score. Lines
marked ``# pragma: no mutate`` produce no mutants and are not counted. The score is over the mutants
checked: a run stopped early reports its unchecked ones beside it.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".mutation"

KILLED = {1, 3, 36, 24, -24, 152, 255, -11, -9, 37}
SURVIVED = {0, 5, 33}


def _exit_codes(meta: Path) -> dict[str, int | None]:
    """A .meta file's exit codes; a running mutmut rewrites these files, so a half-written one is
    read again a moment later."""
    for _ in range(20):
        try:
            return json.loads(meta.read_text())["exit_code_by_key"]
        except json.JSONDecodeError:
            time.sleep(0.1)
    return json.loads(meta.read_text())["exit_code_by_key"]


def read(group: str) -> dict[str, Counter]:
    """module path -> Counter of "killed", "survived", "unchecked", and the surviving mutant names."""
    found: dict[str, Counter] = defaultdict(Counter)
    survivors: dict[str, list[str]] = defaultdict(list)
    for meta in sorted((WORK / group / "mutants").rglob("*.py.meta")):
        module = str(meta.relative_to(WORK / group / "mutants"))[: -len(".meta")]
        for name, code in _exit_codes(meta).items():
            if code in KILLED:
                found[module]["killed"] += 1
            elif code in SURVIVED:
                found[module]["survived"] += 1
                survivors[module].append(name)
            elif code == 34:
                continue  # skipped
            else:
                found[module]["unchecked" if code is None else "suspicious"] += 1
    return found, survivors


def main(argv: list[str]) -> int:
    show = "--survivors" in argv
    groups = [a for a in argv if not a.startswith("--")] or sorted(p.name for p in WORK.iterdir() if p.is_dir())
    total = Counter()
    for group in groups:
        found, survivors = read(group)
        for module, counts in sorted(found.items()):
            n = sum(counts.values()) - counts["unchecked"]  # a run stopped early: the mutants it checked
            total += counts
            rest = ", ".join(f"{counts[k]} {k}" for k in ("survived", "unchecked", "suspicious") if counts[k])
            print(f"{group:12} {module:48} {counts['killed']:5}/{n:<5} {100 * counts['killed'] / max(n, 1):5.1f} %"
                  + (f"  ({rest})" if rest else ""))
            if show:
                for name in survivors[module]:
                    print(f"    survived: {name}")
    n = sum(total.values()) - total["unchecked"]
    print(f"{'all':12} {'':48} {total['killed']:5}/{n:<5} {100 * total['killed'] / max(n, 1):5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
