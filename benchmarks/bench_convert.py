"""Conversion time per exporter: how long ``pp.convert`` takes for each torch source, side by side.

Run from anywhere (paths are resolved from this file)::

    python benchmarks/bench_convert.py            # ~1-2 minutes on 2 cores (the dynamo exporter is slow)
    python benchmarks/bench_convert.py --repeats 1

Rows: the synthetic modules of ``fixtures/torch`` as live modules through both ``torch.onnx``
exporters (``torchscript`` and ``dynamo``), the same modules as TorchScript files, and the
weight-only sources (a state_dict, SB3 zips) that ``build.py`` lays out without any exporter. Each
conversion includes policyport's renaming pass, the parameter matching and ``onnx.checker``; the
pre-write verification the CLI adds is not included. One warm-up conversion per exporter runs first
(the dynamo exporter imports onnxscript and compiles on first use); the figure is the median of
``--repeats`` runs, in seconds. Requires torch (``pip install 'policyport[torch]'``).
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCH_DIR = ROOT / "fixtures" / "torch"
SB3_DIR = ROOT / "fixtures" / "sb3"


def _modules():
    spec = importlib.util.spec_from_file_location("fixture_modules", TORCH_DIR / "modules.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MODULES


def _median_seconds(convert, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        convert()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="conversions per cell (median reported)")
    args = parser.parse_args()

    import onnx
    import torch

    import policyport as pp

    torch.set_num_threads(1)
    rows: list[tuple[str, dict[str, float]]] = []
    columns = ["torchscript", "dynamo", "TorchScript file", "weights (build.py)"]
    modules = _modules()
    for exporter in ("torchscript", "dynamo"):  # warm-up: imports and first compilation
        make, shape = modules["float64"]
        pp.convert(make().eval(), exporter=exporter, input_shape=shape)
    for name, (make, shape) in modules.items():
        module = make()
        module.load_state_dict(torch.load(TORCH_DIR / f"{name}.state_dict.pt", weights_only=True))
        module.eval()
        cells = {exporter: _median_seconds(lambda e=exporter: pp.convert(module, exporter=e, input_shape=shape), args.repeats)
                 for exporter in ("torchscript", "dynamo")}
        script = TORCH_DIR / f"{name}.torchscript.pt"
        cells["TorchScript file"] = _median_seconds(lambda: pp.convert(script, input_shape=shape, trust=True), args.repeats)
        rows.append((f"{name} (module)", cells))
    state = TORCH_DIR / "norms.state_dict.pt"
    rows.append(("norms.state_dict.pt", {"weights (build.py)": _median_seconds(
        lambda: pp.convert(state, activation="tanh,relu"), args.repeats)}))
    for zip_path in (ROOT / "fixtures" / "real" / "sb3_ppo_cartpole.zip", *sorted(SB3_DIR.glob("*.zip"))):
        rows.append((zip_path.name, {"weights (build.py)": _median_seconds(lambda p=zip_path: pp.convert(p), args.repeats)}))

    print(f"policyport {pp.__version__}, torch {torch.__version__}, onnx {onnx.__version__}, "
          f"Python {platform.python_version()}, {platform.machine()}; 1 torch thread; median of {args.repeats} runs\n")
    print("| source | " + " | ".join(f"{c} s" for c in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for name, cells in rows:
        print(f"| {name} | " + " | ".join(f"{cells[c]:.3f}" if c in cells else "" for c in columns) + " |")


if __name__ == "__main__":
    main()
