"""Markdown from a benchmark result file, and where the result files are.

``bench_runtime.py`` and ``bench_record.py`` each write one JSON document per run into
``benchmarks/results/`` (machine, commit, every figure); this module turns the newest of them into
the README's benchmark section (``scripts/update_readme_bench.py``; a test checks the README
matches the newest files). It needs the standard library only, so that the README can be
regenerated and checked anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
#: A cell whose windows spread by more than this fraction of the median is marked ``*``.
NOISY = 0.2


def source_state(root: Path = RESULTS.parent.parent) -> dict:
    """The checkout's short commit and whether policyport/ or benchmarks/ have uncommitted changes
    (read-only git calls)."""
    import subprocess

    def git(*args):
        return subprocess.run(["git", "--no-optional-locks", "-C", str(root), *args], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--", "policyport", "benchmarks").splitlines()
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": None}
    return {"commit": commit, "dirty": bool(changed)}


def newest(kind: str, folder: Path = RESULTS) -> tuple[Path, dict] | None:
    """The newest result file of ``kind`` (``"runtime"`` or ``"record"``) and its document.

    Files are named ``<kind>-<UTC time>-<commit>.json``, so the newest sorts last.
    """
    files = sorted(folder.glob(f"{kind}-*.json"))
    return (files[-1], json.loads(files[-1].read_text(encoding="utf-8"))) if files else None


def fmt_us(m: dict) -> str:
    us = m.get("median_us")
    if us is None:
        return "-"
    text = f"{us:,.1f}" if us < 1000 else f"{us:,.0f}"
    spread = m.get("spread")
    return text + ("!" if m.get("contended") else "") + ("*" if spread is not None and spread > NOISY else "")


def fmt_rate(rate: float | None) -> str:
    if rate is None:
        return "-"
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if rate >= scale:
            return f"{rate / scale:.2f}{unit}"
    return f"{rate:.0f}"


def runner_table(results: list[dict], model: str, batches: list[int]) -> str:
    """µs per call and samples/s of every runner at every batch size, for one model."""
    rows = [m for m in results if m["model"] == model]
    runners = list(dict.fromkeys(m["runner"] for m in rows))
    cell = {(m["runner"], m["batch"]): m for m in rows}
    head = ["runner"] + [f"b={b} µs/call" for b in batches] + [f"b={b} samples/s" for b in batches]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (2 * len(batches))) + "|"]
    for r in runners:
        ms = [cell.get((r, b)) for b in batches]
        lat = [fmt_us(m) if m else "-" for m in ms]
        thr = [fmt_rate(m.get("throughput")) if m else "-" for m in ms]
        lines.append("| " + " | ".join([r] + lat + thr) + " |")
    notes = [f"- {m['runner']}, batch {m['batch']}: {m['note']}" for m in rows if m.get("note")]
    if any(m.get("contended") for m in rows):
        notes.append("- `!`: fewer than 3 of its windows ran while the machine was otherwise idle; the figure "
                     "includes windows taken while other processes were busy")
    if any((m.get("spread") or 0) > NOISY for m in rows):
        notes.append(f"- `*`: the windows used spread by more than {NOISY:.0%} of their median (noisy)")
    return "\n".join(lines + ([""] + notes if notes else []))


def target_table(rows: list[dict]) -> str:
    lines = ["| target | model | medians | fastest windows | bound | |", "|---|---|---:|---:|---:|---|"]
    for r in rows:
        ratio, best = ("-" if v is None else f"{v:.2f}" for v in (r["ratio"], r["best_ratio"]))
        lines.append(f"| {r['target']} | {r['model']} | {ratio} | {best} | {r['bound']} | {r['status']} |")
    return "\n".join(lines)


def machine_line(env: dict) -> str:
    """One sentence describing the machine and the libraries a run measured."""
    v = env["versions"]
    simd = env.get("simd", {})
    found, missing = simd.get("found", []), simd.get("not_found", [])
    vector = ", ".join(f"{name} {'yes' if name in found else 'no'}" for name in ("AVX2", "AVX512F"))
    simd_text = (f"numpy SIMD: baseline {' '.join(simd.get('baseline', [])) or '?'}, dispatch targets found "
                 f"{' '.join(t for t in found if t not in ('AVX2', 'AVX512F')) or 'none'}"
                 + (f", not found {' '.join(t for t in missing if t not in ('AVX2', 'AVX512F'))}" if missing else "")
                 + f" ({vector})")
    return (f"{env['cpu_model']}, {env['usable_cores']} usable cores of {env['cores']}; {simd_text}; "
            f"BLAS {env['blas_short']}; Python {v['python']}, numpy {v['numpy']}, onnx {v['onnx']}, "
            f"onnxruntime {v['onnxruntime']}, torch {v['torch']}; threadpoolctl {v.get('threadpoolctl', 'not installed')}")


def cold_start_lines(cold: dict | None) -> list[str]:
    if not cold:
        return []
    lines = [f"CLI cold start (`{cold['command']}` on one observation, {cold['rounds']} interleaved runs "
             "of each, each its own process):", "",
             "| command | median s | fastest s |", "|---|---:|---:|"]
    for name, t in cold["commands"].items():
        lines.append(f"| `{name}` | {t['median_s']:.3f} | {t['fastest_s']:.3f} |")
    lines += ["", "Where `policyport run`'s imports go (`python -X importtime`, self time added up per package, one run):", "",
              "| package | ms |", "|---|---:|"]
    lines += [f"| {group} | {ms:.0f} |" for group, ms in cold["imports_ms"].items()]
    return lines + [""]


def runtime_markdown(doc: dict, name: str | None = None) -> str:
    """The benchmark section for a ``bench_runtime.py`` result document."""
    env = doc["environment"]
    source = doc.get("source", {})
    out = [f"Latest run: {name or 'this run'} (commit {source.get('commit', '?')}"
           + (", with uncommitted changes" if source.get("dirty") else "") + f", {doc.get('date', '?')}).", "",
           f"Machine: {machine_line(env)}.", ""]
    load = env.get("other_processes_cores")
    if load is not None:
        out += [f"Other processes kept {load:.2f} of {env['usable_cores']} cores busy on average during the run; "
                "windows taken while they were busy were retried.", ""]
    for model in doc["models"]:
        out += [f"{model}:", "", runner_table(doc["results"], model, doc["batches"]), ""]
    out += ["Targets (PASS/MISS judges the ratio of medians; the ratio of the fastest windows is the noise check):", "",
            target_table(doc["targets"]), ""]
    out += cold_start_lines(doc.get("cold_start"))
    return "\n".join(out)


def record_markdown(doc: dict, name: str | None = None) -> str:
    """The recording-throughput section for a ``bench_record.py`` result document."""
    source = doc.get("source", {})
    lines = [f"Recording a dataset ({name or 'this run'}, commit {source.get('commit', '?')}, {doc.get('date', '?')}): "
             f"{doc['rows']:,} MetaDrive observations, batch {doc['batch_size']}, every tensor, files in "
             f"`{doc.get('where', '?')}`; median of {doc.get('repeat', '?')} interleaved runs, each its own process.", "",
             "| runner | rows/s | vs forward in memory | peak RSS MB | output |", "|---|---:|---:|---:|---:|"]
    for runner, s in doc["runners"].items():
        size = "" if s.get("bytes") is None else f"{s['bytes'] / 1e9:.2f} GB"
        lines.append(f"| {runner} | {s['rows_per_s']:,.0f} | {s['ratio']:.2f} | {s['peak_rss_mb']:,.0f} | {size} |")
    forward = doc["runners"].get("forward, in memory", {}).get("rows_per_s")
    if doc.get("disk_mb_per_s"):
        cap = doc["disk_mb_per_s"] * 1e6 / doc["bytes_per_row"]
        lines += ["", f"The folder's file system took a plain sequential write at {doc['disk_mb_per_s']:,.0f} MB/s "
                  f"in this run: at {doc['bytes_per_row']:,} bytes per row that allows at most {cap:,.0f} rows/s "
                  "for any format" + (f", {cap / forward:.2f} of the forward pass." if forward else ".")]
    judged = [(name, s["ratio"]) for name, s in doc["runners"].items() if name.startswith("record") and "--tensors" not in name]
    if judged:
        lines += ["", "Target, recording every tensor streams at >= 0.5 of the forward pass: " + "; ".join(
            f"`{name}` {ratio:.2f} ({'PASS' if ratio >= 0.5 else 'MISS'})" for name, ratio in judged) + "."]
    return "\n".join(lines) + "\n"


def readme_section(folder: Path = RESULTS) -> str:
    """The README's generated benchmark block: the newest runtime result, then the newest recording
    result of each folder recordings were measured in (a disk, ``/dev/shm``)."""
    parts = []
    runtime = newest("runtime", folder)
    if runtime:
        parts.append(runtime_markdown(runtime[1], f"`benchmarks/results/{runtime[0].name}`"))
    by_place: dict[str, tuple[Path, dict]] = {}  # the newest recording result per folder measured in
    for path in sorted(folder.glob("record-*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        by_place[doc.get("where", "")] = (path, doc)
    for path, doc in sorted(by_place.values(), key=lambda pd: pd[0].name):
        parts.append(record_markdown(doc, f"`benchmarks/results/{path.name}`"))
    return "\n".join(parts) if parts else "No result file yet: run `scripts/bench.sh`.\n"
