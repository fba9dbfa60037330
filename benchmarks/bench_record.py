"""Streaming a dataset's activations to disk: throughput against the forward pass, and peak memory.

Run from anywhere (paths are resolved from this file)::

    python benchmarks/bench_record.py                  # 1,000,000 MetaDrive observations, ~5 min on 2 cores
    python benchmarks/bench_record.py --rows 100000    # a quicker look
    python benchmarks/bench_record.py --json out.json

The MetaDrive expert (``fixtures/real/metadrive_ppo_expert.npz`` converted with ``--head diag-gaussian``)
runs over ``--rows`` observations drawn uniformly from [0, 1)^275, written as one ``.npy`` file (streamed,
so this script never holds the dataset either). Every figure comes from its own process, so that each
has its own peak resident set (its ``VmHWM``, see :func:`run_measured`); the runs are interleaved and repeated
(``--repeat``), and the median is reported:

* ``forward, in memory``: ``Session.run`` on ``--batch-size``-row blocks already in memory (pure compute);
* ``forward, streamed``: the same blocks read from the ``.npy`` file as ``record`` reads them, run, dropped;
* ``record --format F``: ``policyport record MODEL -i obs.npy -o rec.F --batch-size B`` (``-o rec``, a
  folder, for ``npy``) with every tensor (1,040 float32 per row: 4,160 bytes written per observation
  against 1,100 read), the time the command reports for the recording itself (process start-up
  excluded);
* ``record ... --tensors fc_2/tanh``: one hidden layer and the graph outputs (264 floats per row).

The ratios compare records/s with the in-memory forward pass. Then the batch-1 latency of
``Session.run`` (which gained an ``overrides=`` parameter) against the same method as it was before,
interleaved in one process on the same session: that is the whole hot-path change.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
METADRIVE = ROOT / "fixtures" / "real" / "metadrive_ppo_expert.npz"

FORWARD = """
import sys, time, numpy as np, policyport as pp
from policyport.analysis.tables import open_table
model, data, batch, streamed = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
session = pp.load(model)
table = open_table(data)
if streamed:
    start = time.perf_counter()
    for block in table.iter_batches(batch):
        session.run(block[""])
else:
    block = next(table.iter_batches(batch))[""]
    blocks = table.rows // batch
    session.run(block)
    start = time.perf_counter()
    for _ in range(blocks):
        session.run(block)
    table.rows = blocks * batch
print(table.rows / (time.perf_counter() - start))
"""


def run_measured(args: list[str]) -> tuple[str, float, float]:
    """Run a command; its stdout, wall seconds and peak resident set in MB.

    The peak is the child's own ``VmHWM`` (``/proc/PID/status``: the high-water mark of its address
    space), read every 20 ms while it runs. ``ru_maxrss`` from ``wait4`` would not do: Linux carries
    the parent's high-water mark across fork and exec into the child's, so every child reported at
    least the benchmark's own peak (the dataset writer's blocks).
    """
    with tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=errors, cwd=ROOT)
        peak = [0]
        watching = threading.Event()

        def watch() -> None:
            status = Path(f"/proc/{proc.pid}/status")
            while not watching.wait(0.02):
                try:
                    line = next((x for x in status.read_text().splitlines() if x.startswith("VmHWM:")), None)
                except OSError:
                    return
                if line is None:  # exiting: its memory is gone
                    return
                peak[0] = max(peak[0], int(line.split()[1]))  # kB

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        out = proc.stdout.read().decode()
        proc.wait()
        watching.set()
        watcher.join()
        wall = time.perf_counter() - start
        if proc.returncode:
            errors.seek(0)
            raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{errors.read().decode()}")
    return out, wall, peak[0] / 1024


def write_dataset(path: Path, rows: int, width: int = 275, chunk: int = 65536) -> None:
    """``rows`` observations uniform in [0, 1), written block by block (header with the final shape first)."""
    rng = np.random.default_rng(275)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (rows, width)})
        for start in range(0, rows, chunk):
            rng.random((min(chunk, rows - start), width), dtype=np.float32).tofile(f)


#: Bytes each MetaDrive observation adds to a recording of every tensor (1,040 float32).
BYTES_PER_ROW = 4160


def disk_speed(folder: Path, size: int = 2 << 30, chunk: int = 16 << 20) -> float:
    """MB/s of a plain sequential write of ``size`` bytes into ``folder``, fsync included."""
    path = folder / "disk_probe.bin"
    data = np.random.default_rng(0).integers(0, 255, chunk, dtype=np.uint8).tobytes()
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for _ in range(size // chunk):
            os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
        path.unlink()
    return size / (time.perf_counter() - start) / 1e6


def batch1_latency(model, calls: int, windows: int) -> dict:
    """Median µs per ``Session.run`` at batch 1: the current method against the one before ``overrides=``."""
    import gc

    import policyport as pp
    from policyport.runtime import Session

    class Before(Session):  # Session.run exactly as it was before overrides were added
        def run(self, feeds):
            return self._run(self._check(feeds) if type(feeds) is dict else self._feeds(feeds))

    now = pp.load(model)
    before = Before(now.backend)
    feeds = {"obs": np.random.default_rng(1).random((1, 275), dtype=np.float32)}
    times: dict[str, list[float]] = {"run now": [], "run before": []}
    runners = {"run now": now.run, "run before": before.run}
    for fn in runners.values():
        for _ in range(2000):
            fn(feeds)
    gc.disable()
    try:
        for w in range(windows):
            order = list(runners) if w % 2 == 0 else list(reversed(runners))
            for name in order:
                fn = runners[name]
                start = time.perf_counter()
                for _ in range(calls):
                    fn(feeds)
                times[name].append((time.perf_counter() - start) / calls * 1e6)
    finally:
        gc.enable()
    return {name: {"median_us": statistics.median(v), "fastest_us": min(v)} for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--formats", default="npy,npz,parquet")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--subset", default="fc_2/tanh",
                        help="also record only these tensors (globs; graph outputs come too), in parquet; '' to skip")
    parser.add_argument("--dir", type=Path, help="where the dataset and recordings go (default: the system's temporary "
                        "folder); a RAM-backed /dev/shm separates the software's cost from the disk's")
    parser.add_argument("--json", type=Path, help="also write the result document there")
    parser.add_argument("--no-save", action="store_true", help="do not write the result into benchmarks/results/")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import onnx

    import report

    import policyport as pp

    work = Path(tempfile.mkdtemp(prefix="bench_record_", dir=args.dir))
    try:
        model, data = work / "metadrive.onnx", work / "obs.npy"
        onnx.save(pp.convert(str(METADRIVE), activation="tanh", head="diag-gaussian"), model)
        write_dataset(data, args.rows)
        py = sys.executable
        runs: dict[str, list[dict]] = {}
        for r in range(args.repeat):
            for streamed in (False, True):
                name = "forward, streamed" if streamed else "forward, in memory"
                out, wall, rss = run_measured([py, "-c", FORWARD, str(model), str(data), str(args.batch_size), str(int(streamed))])
                runs.setdefault(name, []).append({"rows_per_s": float(out), "rss_mb": rss})
            configs = [(f"record --format {fmt}", fmt, "*") for fmt in args.formats.split(",")]
            if args.subset:
                configs.append((f"record --format parquet --tensors '{args.subset}'", "parquet", args.subset))
            for name, fmt, tensors in configs:
                rec = work / ("rec" if fmt == "npy" else f"rec.{fmt}")  # npy: a folder
                out, wall, rss = run_measured([py, "-m", "policyport", "record", str(model), "-i", str(data), "-o", str(rec),
                                               "--batch-size", str(args.batch_size), "--tensors", tensors, "--json", "--quiet"])
                doc = json.loads(out)
                runs.setdefault(name, []).append(
                    {"rows_per_s": doc["rows_per_second"], "rss_mb": rss, "bytes": doc["bytes"], "wall_s": wall})
                shutil.rmtree(rec) if rec.is_dir() else rec.unlink()
            print(f"round {r + 1}/{args.repeat} done", file=sys.stderr)
        latency = batch1_latency(model, calls=20000, windows=9)
        disk = disk_speed(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    forward = statistics.median(x["rows_per_s"] for x in runs["forward, in memory"])
    print(f"# Recording {args.rows:,} MetaDrive observations, every tensor, batch {args.batch_size}")
    print(f"numpy {np.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} cores; files in {work.parent}; "
          f"median of {args.repeat} interleaved runs, each in its own process\n")
    print("| runner | rows/s | vs forward in memory | peak RSS MB | output |")
    print("|---|---:|---:|---:|---:|")
    summary = {}
    for name, values in runs.items():
        rate = statistics.median(v["rows_per_s"] for v in values)
        rss = max(v["rss_mb"] for v in values)
        size = values[0].get("bytes")
        summary[name] = {"rows_per_s": rate, "ratio": rate / forward, "peak_rss_mb": rss, "bytes": size, "runs": values}
        print(f"| {name} | {rate:,.0f} | {rate / forward:.2f} | {rss:,.0f} | {'' if size is None else f'{size / 1e9:.2f} GB'} |")
    print("\n| target | value | bound | |")
    print("|---|---:|---:|---|")
    for name in (n for n in summary if n.startswith("record") and "--tensors" not in n):
        s = summary[name]
        print(f"| {name}: throughput / forward in memory | {s['ratio']:.2f} | >= 0.5 | {'PASS' if s['ratio'] >= 0.5 else 'MISS'} |")
        print(f"| {name}: peak RSS | {s['peak_rss_mb']:,.0f} MB | < 1024 MB | {'PASS' if s['peak_rss_mb'] < 1024 else 'MISS'} |")
    now, before = latency["run now"], latency["run before"]
    ratio = now["median_us"] / before["median_us"]
    print(f"\nbatch-1 latency of Session.run: {now['median_us']:.2f} µs now, {before['median_us']:.2f} µs before "
          f"overrides= (median of windows; fastest {now['fastest_us']:.2f} vs {before['fastest_us']:.2f}): ratio {ratio:.3f}")
    print(f"\na plain sequential write of 2 GB into the same folder, flushed to the device: {disk:,.0f} MB/s")
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    doc = {"date": date, "source": report.source_state(), "rows": args.rows, "batch_size": args.batch_size,
           "repeat": args.repeat, "where": str(work.parent), "bytes_per_row": BYTES_PER_ROW,
           "disk_mb_per_s": disk, "runners": summary, "batch1_latency": latency}
    text = json.dumps(doc, indent=1)
    if args.json:
        args.json.write_text(text)
    if not args.no_save:
        saved = report.RESULTS / f"record-{date.replace(':', '').replace('-', '')}-{doc['source']['commit']}.json"
        saved.parent.mkdir(exist_ok=True)
        saved.write_text(text)
        print(f"wrote {saved.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
