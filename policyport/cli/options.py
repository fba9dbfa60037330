"""Options several commands share, spelled and documented once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

AtolOpt = Annotated[Optional[float], typer.Option("--atol", min=0.0, metavar="A", help="Absolute tolerance for floating tensors  [default: by dtype: float32 1e-5, float16 1e-3, bfloat16 1e-2, float64 1e-9]")]
RtolOpt = Annotated[Optional[float], typer.Option("--rtol", min=0.0, metavar="R", help="Relative tolerance, times |reference|  [default: by dtype, as --atol]")]
RoundingOpt = Annotated[bool, typer.Option("--rounding/--no-rounding", help="Also pass a floating tensor that fails the tolerance when a float64 run shows the difference is float32 rounding (see 'Verification' in the README).")]
LowOpt = Annotated[float, typer.Option("--low", metavar="L", help="Lower end of the range observations are drawn from.")]
HighOpt = Annotated[float, typer.Option("--high", metavar="H", help="Upper end of the range observations are drawn from.")]
SeedOpt = Annotated[int, typer.Option("--seed", min=0, metavar="S", help="Seed of the drawn observations.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite existing output files.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout and nothing else.")]
ModelArg = Annotated[Path, typer.Argument(metavar="MODEL", help="An .onnx model or a folder written by 'policyport pack'.")]


def check_range(low: float, high: float) -> None:
    """Refuse a sampling range that is empty or not finite (a usage error, exit 2)."""
    import math

    if not (math.isfinite(low) and math.isfinite(high)):
        raise typer.BadParameter(f"--low {low} and --high {high} must be finite numbers", param_hint="--low/--high")
    if not low < high:
        raise typer.BadParameter(f"--low {low} must be below --high {high}", param_hint="--low/--high")
