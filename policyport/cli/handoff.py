"""``policyport export-numpy``: one generated numpy module and its weights, checked before writing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..verification.compare import source_lines
from .core import app, emit_json, guard
from .options import (
    ForceOpt,
    HighOpt,
    JsonOpt,
    LowOpt,
    ModelArg,
    SeedOpt,
    check_range,
    drawing_advice,
    given_path,
)
from .render import counted, literal, out, say


@app.command("export-numpy")
def export_numpy(
    model: ModelArg,
    output: Annotated[Path, typer.Option("-o", "--output", parser=given_path, metavar="MODULE.py", help="The module to write (.py); its weights go beside it as .npz.")],
    samples: Annotated[int, typer.Option("--samples", min=1, metavar="N", help="Observations the module is checked on before it is written.")] = 64,
    low: LowOpt = 0.0,
    high: HighOpt = 1.0,
    seed: SeedOpt = 0,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Write the policy as one readable numpy module (forward with record and overrides) plus its weights,
    after checking it reproduces the numpy backend bit for bit."""

    def body():
        from ..handoff.export_numpy import export_numpy as run_export

        check_range(low, high)
        if not output.name.endswith(".py") or output.name == ".py":
            raise typer.BadParameter(f"{literal(output)}: the module's file name must end in .py after a name, e.g. "
                                     "policy.py (its weights go beside it as policy.npz)", param_hint="-o/--output")
        with drawing_advice("export-numpy", takes_inputs=False):
            done = run_export(model, output, samples=samples, low=low, high=high, seed=seed, force=force)
        if as_json:
            emit_json({"module": str(done.module), "weights": str(done.weights), "lines": done.lines,
                       "tensors": done.tensors, "samples": done.samples, "assumptions": done.assumptions})
            return
        say(f"wrote {done.module} and {done.weights}")
        if not output.stem.isidentifier():
            say(f"note: {output.stem!r} is not a Python identifier, so 'import {output.stem}' cannot load it; load it "
                "by path (importlib.util.spec_from_file_location) or rename both files")
        out.print(literal(f"{done.module}: {done.lines} lines, numpy only; forward() reproduces the numpy backend "
                          f"bit for bit on {counted(done.samples, 'observation')}, "
                          + ("the one tensor" if done.tensors == 1 else f"all {done.tensors} tensors")))
        for line in source_lines(None, done.assumptions or []):  # as verify prints them; the module's ASSUMPTIONS
            out.print(literal(line))

    guard(as_json, body)
