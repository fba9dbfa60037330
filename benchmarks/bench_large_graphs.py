"""Time and peak memory of loading and running very long graphs on the numpy backend.

A chain of N Relu nodes is the smallest graph that stresses the compiled plan: its size is all nodes.
Each length is measured in a fresh process (so peak RSS is that length's alone): reading the .onnx,
building the graph view, compiling the plan, and one run at batch 1.

    .venv/bin/python benchmarks/bench_large_graphs.py 100000 300000

The node limit (``POLICYPORT_MAX_NODES``, default 200,000) is raised for the run. Prints one line per
length: wall and CPU seconds of each phase and the peak RSS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
import numpy as np
import policyport as pp
from policyport.graph.onnx_files import load_onnx
from policyport.graph.model import from_onnx

path = sys.argv[1]
marks = [(time.perf_counter(), time.process_time())]
def mark():
    marks.append((time.perf_counter(), time.process_time()))
model = load_onnx(path); mark()
graph = from_onnx(model); mark()
session = pp.load(graph, backend="numpy"); mark()
session.run({"obs": np.ones((1, 4), np.float32)}); mark()
phases = ["read", "graph", "plan", "run"]
print(json.dumps({
    "wall": {p: marks[i + 1][0] - marks[i][0] for i, p in enumerate(phases)},
    "cpu": {p: marks[i + 1][1] - marks[i][1] for i, p in enumerate(phases)},
    # VmHWM: this process's own peak; ru_maxrss would carry the parent's high-water mark across exec
    "peak_rss_mib": int(next(x for x in open("/proc/self/status") if x.startswith("VmHWM:")).split()[1]) / 1024,
}))
"""


def relu_chain(path: Path, length: int) -> None:
    from onnx import TensorProto, helper

    names = ["obs", *(f"t{i}" for i in range(1, length)), "y"]
    nodes = [helper.make_node("Relu", [names[i]], [names[i + 1]], name=f"n{i}") for i in range(length)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())


def measure(length: int, folder: Path) -> dict:
    path = folder / f"relu_{length}.onnx"
    relu_chain(path, length)
    env = {**os.environ, "POLICYPORT_MAX_NODES": str(length)}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, env=env)
    if proc.returncode:
        return {"error": (proc.stderr.strip().splitlines() or ["killed"])[-1], "returncode": proc.returncode,
                "size_mb": path.stat().st_size / 1e6}
    return {**json.loads(proc.stdout), "size_mb": path.stat().st_size / 1e6}


def main(lengths: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for n in lengths:
            r = measure(n, Path(tmp))
            if "error" in r:
                print(f"{n:>8,} nodes ({r['size_mb']:.1f} MB): failed (exit {r['returncode']}): {r['error']}")
                continue
            total_wall, total_cpu = sum(r["wall"].values()), sum(r["cpu"].values())
            phases = ", ".join(f"{p} {r['wall'][p]:.1f}" for p in r["wall"])
            print(f"{n:>8,} nodes ({r['size_mb']:.1f} MB): {total_wall:.1f} s wall ({phases}), "
                  f"{total_cpu:.1f} s CPU, peak RSS {r['peak_rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [100_000, 300_000])
