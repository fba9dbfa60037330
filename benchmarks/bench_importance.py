"""Ablation importance: throughput against the forward pass, the batched ablations against one run per
ablation, and peak memory against the dataset's size.

Run from anywhere (paths are resolved from this file)::

    python benchmarks/bench_importance.py                  # 20,000 MetaDrive observations, ~3 min on 2 cores
    python benchmarks/bench_importance.py --rows 1000000   # the million (about 40 min on 2 cores)
    python benchmarks/bench_importance.py --json out.json

The MetaDrive expert (``fixtures/real/metadrive_ppo_expert.npz`` converted with ``--head diag-gaussian``)
over ``--rows`` observations uniform in [0, 1)^275, one ``.npy`` file, as ``bench_record.py`` writes it.
Each figure comes from its own process, with its own peak resident set (``VmHWM``, read while it runs):

* ``run (forward), streamed``: ``Session.run`` on the file's ``--batch``-row blocks, read as ``importance``
  reads them;
* ``importance``: ``policyport importance MODEL -i obs.npy --tensors 'fc_*/tanh' --output 'action[0]'``
  (zero ablation of 512 neurons: 512 ablated forwards per observation), the seconds the command reports;
  also on a quarter of the rows, to show that its memory does not grow with the dataset;
* ``one overridden run per ablation``: what the batching replaces, ``Session.run(block, overrides=
  {"fc_1/tanh": {j: 0.0}})`` once per neuron, on one block and 32 neurons of each layer, extrapolated.

Ratios: observations/s against the forward's; ablations/s (observations × ablated neurons) against one
overridden run per ablation.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_record import FORWARD, METADRIVE, run_measured, write_dataset  # noqa: E402

NEURONS = 512  # fc_1/tanh and fc_2/tanh

ONE_PER_ABLATION = """
import sys, time, numpy as np, policyport as pp
from policyport.analysis.tables import open_table
model, data, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
session = pp.load(model)
block = next(open_table(data).iter_batches(batch))[""]
session.run(block, overrides={"fc_1/tanh": {0: 0.0}})
done, start = 0, time.perf_counter()
for tensor in ("fc_1/tanh", "fc_2/tanh"):
    for j in range(32):
        session.run(block, overrides={tensor: {j: 0.0}})
        done += len(block)
print(done / (time.perf_counter() - start))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--dir", type=Path, help="where the dataset goes (default: the system's temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the result document there")
    args = parser.parse_args()
    import onnx

    sys.path.insert(0, str(ROOT))
    import policyport as pp

    work = Path(tempfile.mkdtemp(prefix="bench_importance_", dir=args.dir))
    py = sys.executable
    try:
        model, data, quarter = work / "metadrive.onnx", work / "obs.npy", work / "quarter.npy"
        onnx.save(pp.convert(str(METADRIVE), activation="tanh", head="diag-gaussian"), model)
        write_dataset(data, args.rows)
        write_dataset(quarter, max(args.rows // 4, 1))
        rows: dict[str, dict] = {}
        out, _, rss = run_measured([py, "-c", FORWARD, str(model), str(data), str(args.batch), "1"])
        rows["run (forward), streamed"] = {"observations_per_s": float(out), "peak_mb": rss}
        out, _, rss = run_measured([py, "-c", ONE_PER_ABLATION, str(model), str(data), str(args.batch)])
        rows["one overridden run per ablation"] = {"observations_per_s": float(out) / NEURONS,
                                                   "ablations_per_s": float(out), "peak_mb": rss}
        for name, path in (("importance", data), ("importance, a quarter of the rows", quarter)):
            out, _, rss = run_measured([py, "-m", "policyport", "importance", str(model), "-i", str(path), "--tensors",
                                        "fc_*/tanh", "--output", "action[0]", "--batch", str(args.batch), "--json"])
            doc = json.loads(out)
            rate = doc["rows"] / doc["seconds"]
            rows[name] = {"observations": doc["rows"], "observations_per_s": rate, "ablations_per_s": rate * NEURONS,
                          "peak_mb": rss}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    forward = rows["run (forward), streamed"]["observations_per_s"]
    naive = rows["one overridden run per ablation"]["ablations_per_s"]
    print(f"MetaDrive expert, {args.rows:,} observations, blocks of {args.batch:,}; importance ablates {NEURONS} "
          "neurons (fc_1/tanh, fc_2/tanh) for action[0]\n")
    print("| runner | observations/s | × forward | ablations/s | × one run per ablation | peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        ablations = r.get("ablations_per_s")
        print(f"| {name} | {r['observations_per_s']:,.0f} | {r['observations_per_s'] / forward:.4f} | "
              f"{'' if ablations is None else f'{ablations:,.0f}'} | "
              f"{'' if ablations is None else f'{ablations / naive:.1f}'} | {r['peak_mb']:,.0f} |")
    if args.json:
        args.json.write_text(json.dumps({"rows": args.rows, "batch": args.batch, "runners": rows}, indent=1))


if __name__ == "__main__":
    main()
