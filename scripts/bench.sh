#!/usr/bin/env bash
# Set up .venv with the benchmark extras (torch==2.13.0, a CPU build) and run the runtime benchmark.
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are cleared for this command only, so OpenBLAS picks the
# CPU's own kernels as it does on a user's machine (some hosts pin an older kernel machine-wide).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh bench
exec env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/bench_runtime.py "$@"
