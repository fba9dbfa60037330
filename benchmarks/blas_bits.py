"""Which row counts change a matrix product's bits on this machine's BLAS, and whether its threads do.

The numpy backend runs a batch of 1,024 rows or more as row blocks (at most 512 rows, sizes from the
row count alone) and holds the BLAS to one thread per block, so that the thread count never changes
a result. What can still change bits is the *row count* of a BLAS call: a BLAS chooses its kernel by
the shape of the call. This script shows where, for the layer shapes of the benchmark models::

    python benchmarks/blas_bits.py

For each (K, N) it compares ``A @ W`` for 4,096 rows with the same rows computed in blocks of each
size (one thread), and the whole product on one BLAS thread with the same on the BLAS's default
threads. Nothing here is timed.
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

SHAPES = [(275, 256), (256, 256), (64, 256), (256, 4), (256, 8), (1000, 3000)]
BLOCKS = [1, 2, 3, 7, 16, 64, 128, 256, 333, 512, 1024, 2048]


def main() -> None:
    rng = np.random.default_rng(0)
    blas = [f"{p['internal_api']} {p['version']} ({p['architecture']}, {p['num_threads']} threads)"
            for p in threadpool_info() if p["user_api"] == "blas"]
    print(f"numpy {np.__version__}; BLAS: {'; '.join(blas)}")
    print("| K x N | row counts whose blocks differ from one call of 4,096 rows (max abs difference) | 1 vs default BLAS threads |")
    print("|---|---|---|")
    for k, n in SHAPES:
        w = rng.standard_normal((k, n)).astype(np.float32)
        a = rng.standard_normal((4096, k)).astype(np.float32)
        with threadpool_limits(1):
            whole = a @ w
            differ = []
            for rows in BLOCKS:
                blocks = np.concatenate([a[i:i + rows] @ w for i in range(0, len(a), rows)])
                if blocks.tobytes() != whole.tobytes():
                    differ.append(f"{rows} ({np.abs(blocks - whole).max():.1e})")
        threaded = a @ w
        same = "same bits" if threaded.tobytes() == whole.tobytes() else f"differ ({np.abs(threaded - whole).max():.1e})"
        print(f"| {k} x {n} | {', '.join(differ) or 'none'} | {same} |")


if __name__ == "__main__":
    main()
