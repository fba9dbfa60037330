"""Side-by-side latency and throughput of policyport's runtimes and the usual alternatives.

Run from anywhere (paths are resolved from this file)::

    python benchmarks/bench_runtime.py            # full run, ~1-2 minutes on 2 cores
    python benchmarks/bench_runtime.py --quick    # smoke run, ~20 s
    python benchmarks/bench_runtime.py --json results.json  # also write the result there

Every full run writes its result, one JSON document (machine, commit, every window's figure, the
targets, the CLI cold start), to ``benchmarks/results/runtime-<UTC time>-<commit>.json`` (``--no-save``
skips it); ``scripts/update_readme_bench.py`` puts the newest into the README.

For each model and batch size every runner is first checked against a hand-written numpy forward
pass (max abs error on ``logits`` <= 1e-4, else the script aborts), then timed. Timing interleaves
the runners: each round times every runner once for one window of about ``--window`` seconds
(rotating the order between rounds), each window preceded by a short sleep (so that the spinning
worker threads of the previous runner's BLAS / OpenMP / onnxruntime pool go idle) and a few untimed
calls. A window during which other processes kept the CPU busy is retried, within a time budget.
The figure reported is the median over the windows of the mean per-call time inside a window.
The targets are judged on both models. Nothing is downloaded; torch is optional.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
METADRIVE = ROOT / "fixtures" / "real" / "metadrive_ppo_expert.npz"
BATCHES = (1, 64, 4096)
TOLERANCE = 1e-4

try:  # optional: the torch eager runner
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


@dataclass
class Layer:
    """One dense layer as the user holds it: ``act(x @ kernel + bias)`` with ``kernel`` [in, out]."""

    kernel: np.ndarray
    bias: np.ndarray
    activation: str | None  # "tanh", "relu" or None (the output layer)


@dataclass
class Case:
    """A model under test: its ONNX export, its layers and a hand-written forward pass."""

    name: str
    onnx_model: object
    layers: list[Layer]
    forward: Callable[[np.ndarray], np.ndarray]  # the hand-written numpy forward: obs -> logits
    make_obs: Callable[[int], np.ndarray]  # batch -> float32 observations


def metadrive_case(pp) -> Case:
    """The MetaDrive PPO expert: 275 -> 256 tanh -> 256 tanh -> 4, diag-gaussian head."""
    w = np.load(METADRIVE)
    p = "default_policy/"
    W1, b1 = w[p + "fc_1/kernel"], w[p + "fc_1/bias"]
    W2, b2 = w[p + "fc_2/kernel"], w[p + "fc_2/bias"]
    W3, b3 = w[p + "fc_out/kernel"], w[p + "fc_out/bias"]

    def forward(x):  # written the obvious way a user would
        h = np.tanh(x @ W1 + b1)
        h = np.tanh(h @ W2 + b2)
        return h @ W3 + b3

    rng = np.random.default_rng(275)
    return Case(
        name="metadrive-expert (275-256-256-4 tanh)",
        onnx_model=pp.convert(str(METADRIVE), activation="tanh", head="diag-gaussian"),
        layers=[Layer(W1, b1, "tanh"), Layer(W2, b2, "tanh"), Layer(W3, b3, None)],
        forward=forward,
        make_obs=lambda batch: rng.random((batch, 275), dtype=np.float32),  # MetaDrive obs lie in [0, 1]
    )


def relu_case(pp) -> Case:
    """A seeded 3-hidden-layer ReLU MLP in RLlib's layout: 64 -> 256 -> 256 -> 256 -> 8."""
    rng = np.random.default_rng(0)
    sizes = [64, 256, 256, 256, 8]
    names = ["fc_1", "fc_2", "fc_3", "fc_out"]
    weights = {}
    for name, fan_in, fan_out in zip(names, sizes, sizes[1:]):
        weights[f"{name}/kernel"] = (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2 / fan_in)).astype(np.float32)
        weights[f"{name}/bias"] = (rng.standard_normal(fan_out) * 0.1).astype(np.float32)
    W1, b1, W2, b2, W3, b3, W4, b4 = (weights[f"{n}/{p}"] for n in names for p in ("kernel", "bias"))

    def forward(x):  # written the obvious way a user would
        h = np.maximum(x @ W1 + b1, 0)
        h = np.maximum(h @ W2 + b2, 0)
        h = np.maximum(h @ W3 + b3, 0)
        return h @ W4 + b4

    obs_rng = np.random.default_rng(64)
    return Case(
        name="relu-mlp (64-256-256-256-8 relu)",
        onnx_model=pp.convert(weights, activation="relu"),
        layers=[Layer(W1, b1, "relu"), Layer(W2, b2, "relu"), Layer(W3, b3, "relu"), Layer(W4, b4, None)],
        forward=forward,
        make_obs=lambda batch: obs_rng.standard_normal((batch, 64), dtype=np.float32),
    )


# --------------------------------------------------------------------------------------------
# Runners: a name plus a factory (case, obs) -> zero-arg callable
# --------------------------------------------------------------------------------------------


@dataclass
class RunnerSpec:
    """How to build one runner for a (model, batch).

    ``setup(case)`` runs once per model (load sessions, copy weights) and returns a state object;
    ``bind(state, obs)`` returns the zero-arg callable that is checked and timed.
    """

    name: str
    setup: Callable[[Case], object]
    bind: Callable[[object, np.ndarray], Callable[[], object]]
    slow: bool = False  # fewer rounds and a per-call time limit
    checked: bool = True  # its logits are compared with the hand-written forward (False: a diagnostic)


def _ort_session(case: Case, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(case.onnx_model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _torch_module(case: Case):
    acts = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}
    modules = []
    for layer in case.layers:
        linear = torch.nn.Linear(*layer.kernel.shape)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(layer.kernel.T)))
            linear.bias.copy_(torch.from_numpy(layer.bias))
        modules.append(linear)
        if layer.activation:
            modules.append(acts[layer.activation]())
    return torch.nn.Sequential(*modules).eval()


def _torch_bind(net, x):
    def call():
        with torch.inference_mode():
            return net(torch.from_numpy(x)).numpy()

    return call


_SESSIONS: dict[tuple[str, str], object] = {}


def _pp_load(backend: str, threads: int = 0):
    """Setup loading ``case`` on a policyport backend; runners of one backend share the session."""

    def setup(case: Case):
        import policyport as pp

        key = (case.name, backend, threads)
        if key not in _SESSIONS:
            _SESSIONS[key] = pp.load(case.onnx_model, backend=backend, threads=threads)
        return _SESSIONS[key]

    return setup


class ProductsAlone:
    """Diagnostic lower bound: the forward's matrix products alone (no bias, no activation), run as the
    numpy backend runs a batch: in its row blocks (:func:`policyport.runtime.numpy.rows.blocks`), shared
    by one thread per usable core, each block's BLAS call on its thread alone, each product written
    into a buffer kept from call to call; a batch under ``SPLIT_ROWS`` rows in one call. No ONNX
    runtime on numpy can take less time than this on the same BLAS: the exact bias adds and
    activations come on top of it."""

    def __init__(self, case: Case):
        from concurrent.futures import ThreadPoolExecutor

        from policyport.runtime.blas import one_thread
        from policyport.runtime.numpy.rows import usable_cores

        self.kernels = [layer.kernel for layer in case.layers]
        self.limit = one_thread()
        self.threads = usable_cores() if self.limit is not None else 1
        self.pool = ThreadPoolExecutor(max(1, self.threads - 1))
        self.local = threading.local()

    def _chain(self, x: np.ndarray) -> np.ndarray:
        buffers = getattr(self.local, "buffers", None)
        if buffers is None:
            buffers = self.local.buffers = {}
        h = x
        for i, k in enumerate(self.kernels):
            buf = buffers.get((i, len(h)))
            if buf is None:
                buf = buffers[(i, len(h))] = np.empty((len(h), k.shape[1]), k.dtype)
            h = np.dot(h, k, buf)
        return h

    def __call__(self, x: np.ndarray) -> np.ndarray:
        from policyport.runtime.numpy.rows import SPLIT_ROWS, blocks

        if len(x) < SPLIT_ROWS:
            return self._chain(x)
        out = np.empty((len(x), self.kernels[-1].shape[1]), self.kernels[-1].dtype)
        bounds, claim = blocks(len(x)), itertools.count()

        def work():
            while (i := next(claim)) < len(bounds):
                lo, hi = bounds[i]
                out[lo:hi] = self._chain(x[lo:hi])

        with self.limit:
            helpers = [self.pool.submit(work) for _ in range(min(self.threads, len(bounds)) - 1)]
            work()
            for h in helpers:
                h.result()
        return out


def _reference_evaluator(case: Case):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(case.onnx_model)


def runner_specs() -> tuple[list[RunnerSpec], list[str]]:
    """Every runner, and notes about runners that cannot run here."""
    notes = []
    specs = [
        RunnerSpec("policyport numpy: run", _pp_load("numpy"), lambda s, x: lambda: s.run({"obs": x})),
        RunnerSpec("policyport numpy: record *", _pp_load("numpy"),
                   lambda s, x: lambda: s.record({"obs": x}, tensors="*")),
        # diagnostic: the compiled plan alone, without the Session's feed check and output dict
        RunnerSpec("policyport numpy: plan.run only", _pp_load("numpy"), lambda s, x: lambda: s.backend.plan.run({"obs": x})),
        RunnerSpec("policyport numpy: run, 1 thread", _pp_load("numpy", threads=1), lambda s, x: lambda: s.run({"obs": x})),
        RunnerSpec("hand-written numpy", lambda c: c.forward, lambda f, x: lambda: f(x)),
        # diagnostic: the lower bound of any numpy runtime on this BLAS (see ProductsAlone)
        RunnerSpec("matrix products alone (floor)", ProductsAlone, lambda p, x: lambda: p(x), checked=False),
        RunnerSpec("onnxruntime 1 thread", lambda c: _ort_session(c, 1), lambda s, x: lambda: s.run(None, {"obs": x})),
        RunnerSpec("onnxruntime default threads", lambda c: _ort_session(c, 0),
                   lambda s, x: lambda: s.run(None, {"obs": x})),
        RunnerSpec("policyport onnxruntime: run (default threads)", _pp_load("onnxruntime"),
                   lambda s, x: lambda: s.run({"obs": x})),
    ]
    if torch is not None:
        specs.append(RunnerSpec("torch eager", _torch_module, _torch_bind))
    else:
        notes.append("torch is not importable: the torch eager runner is skipped (pip install torch==2.13.0)")
    specs.append(RunnerSpec("onnx ReferenceEvaluator", _reference_evaluator,
                            lambda r, x: lambda: r.run(None, {"obs": x}), slow=True))
    return specs, notes


def as_logits(result) -> np.ndarray:
    """The ``logits`` of whatever a runner returns (dict, list of outputs in graph order, array, tuple)."""
    if isinstance(result, dict):
        return np.asarray(result["logits"])
    if isinstance(result, (list, tuple)):
        return np.asarray(result[0])  # logits is the first graph output of both models
    return np.asarray(result)


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


@dataclass
class Settings:
    window: float  # seconds per timed window
    settle: float  # seconds slept before each window, so the previous runner's spinning threads idle out
    rounds: int  # clean windows wanted per runner (their median is reported)
    slow_rounds: int  # the same for slow runners
    slow_call_limit: float  # a slow runner whose one call exceeds this is skipped at that batch
    budget: float  # extra rounds (replacing contended windows) stop once a batch took this factor x nominal


#: A window during which other processes kept more than this many cores busy is "contended": on a
#: 2-core machine one busy neighbour turns a 2-thread BLAS call into a spin-wait storm (100x slower).
CONTENDED = 0.1


@dataclass
class Measurement:
    model: str
    runner: str
    batch: int
    samples_us: list[float] = field(default_factory=list)  # mean µs per call of each timed window
    loads: list[float | None] = field(default_factory=list)  # cores used by other processes per window
    calls_per_window: int = 0
    note: str = ""

    @property
    def clean(self) -> list[float]:
        return [us for us, load in zip(self.samples_us, self.loads) if load is None or load <= CONTENDED]

    def enough_clean(self, wanted: int) -> bool:
        return len(self.clean) >= wanted

    @property
    def contended(self) -> bool:
        """Fewer than 3 clean windows: the figure is the median of all windows, busy ones included."""
        return bool(self.samples_us) and len(self.clean) < min(3, len(self.samples_us))

    @property
    def used(self) -> list[float]:
        return self.samples_us if self.contended else self.clean

    @property
    def median_us(self) -> float | None:
        return statistics.median(self.used) if self.samples_us else None

    @property
    def spread(self) -> float | None:
        """(slowest - fastest window used) / median: how much the windows disagreed."""
        used = self.used
        return (max(used) - min(used)) / self.median_us if len(used) >= 2 else None

    @property
    def throughput(self) -> float | None:
        return None if self.median_us is None else self.batch / (self.median_us * 1e-6)


def _time_calls(fn: Callable[[], object], n: int) -> float:
    """Mean ns per call over ``n`` back-to-back calls, with the garbage collector off."""
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for _ in range(n):
            fn()
        return (time.perf_counter_ns() - start) / n
    finally:
        if gc_was_on:
            gc.enable()


def _calls_for(fn: Callable[[], object], window: float) -> int:
    """How many calls of ``fn`` fill about ``window`` seconds (calibrated on growing trial runs)."""
    n = 1
    while True:
        per_call = _time_calls(fn, n)
        if per_call * n >= 0.02e9 or n >= 1 << 20:
            return max(1, int(window * 1e9 / per_call))
        n *= 4


class CpuMonitor:
    """CPU time used by *other* processes over an interval, from /proc/stat minus our own CPU time.

    On a shared machine a busy neighbour distorts multi-threaded runners badly (a BLAS call whose
    worker thread is descheduled can take 100x longer), so windows timed while the machine was busy
    are retried, and the load is reported next to the results.
    """

    def __init__(self):
        self._start = self._sample()

    @staticmethod
    def _sample():
        try:
            fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
            ticks = [int(v) for v in fields]
            busy = (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait
        except (OSError, ValueError, IndexError):
            return None
        return time.perf_counter(), busy, time.process_time()

    def other_cores(self) -> float | None:
        """Average number of cores busy with other processes since construction (None if unknown).

        /proc/stat counts in clock ticks (10 ms), so over an interval shorter than ~0.3 s a result
        below ``2 ticks / interval`` is indistinguishable from 0 and is reported as 0.
        """
        end = self._sample()
        if self._start is None or end is None or end[0] <= self._start[0]:
            return None
        wall = end[0] - self._start[0]
        other = ((end[1] - self._start[1]) - (end[2] - self._start[2])) / wall
        return other if other > 2 / os.sysconf("SC_CLK_TCK") / wall else 0.0


def measure(case: Case, batch: int, runners: list[tuple[RunnerSpec, Callable]],
            settings: Settings) -> list[Measurement]:
    """Time ``runners`` (already checked) interleaved, round by round.

    Each round times every runner that still lacks clean windows once, in a rotated order. Rounds
    go on until every runner has its clean windows or the batch has used ``settings.budget`` times
    its nominal time.
    """
    results = {spec.name: Measurement(case.name, spec.name, batch) for spec, _ in runners}
    active = []
    for spec, fn in runners:
        first = _time_calls(fn, 1) * 1e-9  # warm-up call
        if spec.slow and first > settings.slow_call_limit:
            results[spec.name].note = f"skipped: one call takes {first:.2f} s (> {settings.slow_call_limit} s)"
            continue
        _time_calls(fn, 3)
        window = settings.window * (0.5 if spec.slow else 1)
        wanted = settings.slow_rounds if spec.slow else settings.rounds
        active.append((spec, fn, _calls_for(fn, window), wanted, window))
    nominal = sum(wanted * (window * 1.1 + settings.settle) for *_, wanted, window in active)
    start = time.perf_counter()
    for r in range(100):
        todo = [a for a in active if not results[a[0].name].enough_clean(a[3])]
        if not todo or (r >= settings.rounds and time.perf_counter() - start > settings.budget * nominal):
            break
        shift = r % len(todo)
        for spec, fn, n, _, _ in todo[shift:] + todo[:shift]:
            m = results[spec.name]
            monitor = CpuMonitor()  # from before the settle: a longer interval, a finer load figure
            time.sleep(settings.settle)  # BLAS / OpenMP / onnxruntime workers of other runners stop spinning
            _time_calls(fn, max(1, n // 10))  # warm caches and clocks again
            m.samples_us.append(_time_calls(fn, n) / 1e3)
            m.loads.append(monitor.other_cores())
            m.calls_per_window = n
    return [results[spec.name] for spec, _ in runners]


def check(case: Case, batch: int, spec: RunnerSpec, fn: Callable, expected: np.ndarray) -> None:
    got = as_logits(fn())
    if got.shape != expected.shape:
        sys.exit(f"ABORT: {spec.name} on {case.name}, batch {batch}: "
                 f"logits shape {got.shape}, expected {expected.shape}")
    err = float(np.max(np.abs(got.astype(np.float64) - expected)))
    if not err <= TOLERANCE:
        sys.exit(f"ABORT: {spec.name} on {case.name}, batch {batch}: max abs error {err:.3g} > {TOLERANCE}")


def bench_case(case: Case, specs: list[RunnerSpec], settings: Settings, batches, log) -> list[Measurement]:
    states = {spec.name: spec.setup(case) for spec in specs}
    out = []
    for batch in batches:
        x = case.make_obs(batch)
        expected = case.forward(x).astype(np.float64)
        runners = []
        for spec in specs:
            fn = spec.bind(states[spec.name], x)
            if spec.checked:
                check(case, batch, spec, fn, expected)
            runners.append((spec, fn))
        t0 = time.perf_counter()
        timed = measure(case, batch, runners, settings)
        out += timed
        windows = sum(len(m.samples_us) for m in timed)
        busy = sum(len(m.samples_us) - len(m.clean) for m in timed)
        log(f"  {case.name}: batch {batch} timed in {time.perf_counter() - t0:.1f} s "
            f"({windows} windows, {busy} taken while other processes were busy)")
    return out


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


@dataclass
class Target:
    label: str
    numerator: tuple[str, int]  # (runner, batch)
    denominator: tuple[str, int]
    kind: str  # "latency" (ratio of per-call times) or "throughput" (ratio of samples/s)
    op: str  # "<=" or ">=" ("" for a diagnostic without a bound)
    bound: float | None


TARGETS = [
    Target("batch-4096 throughput: numpy run / onnxruntime default threads",
           ("policyport numpy: run", 4096), ("onnxruntime default threads", 4096), "throughput", ">=", 1.0),
    # what the first target could reach at most: the BLAS products alone, without the exact bias adds
    # and activations that every numpy runtime adds to them
    Target("batch-4096 throughput, floor: matrix products alone / onnxruntime default threads",
           ("matrix products alone (floor)", 4096), ("onnxruntime default threads", 4096), "throughput", "", None),
    Target("batch-1 latency: numpy run / onnxruntime 1 thread",
           ("policyport numpy: run", 1), ("onnxruntime 1 thread", 1), "latency", "<=", 0.8),
    Target("batch-1 latency: numpy run / hand-written numpy",
           ("policyport numpy: run", 1), ("hand-written numpy", 1), "latency", "<=", 1.0),
    Target("batch-1 latency: numpy record * / numpy run",
           ("policyport numpy: record *", 1), ("policyport numpy: run", 1), "latency", "<=", 1.25),
    Target("batch-4096 latency: numpy record * / numpy run",
           ("policyport numpy: record *", 4096), ("policyport numpy: run", 4096), "latency", "<=", 1.25),
]
#: The CLI cold start: ``policyport run --backend numpy`` on one observation against the floor.
COLD_START_BOUND = 1.5


def evaluate_targets(results: list[Measurement], model: str) -> list[dict]:
    by_key = {(m.runner, m.batch): m for m in results if m.model == model}
    rows = []
    for t in TARGETS:
        num, den = by_key.get(t.numerator), by_key.get(t.denominator)
        row = {"target": t.label, "model": model.split(" ")[0], "ratio": None, "best_ratio": None,
               "bound": "-" if t.bound is None else f"{t.op} {t.bound}", "status": "n/a"}
        if num and den and num.median_us is not None and den.median_us is not None:
            # a latency ratio is num/den; a throughput ratio (same batch) is den/num in time
            def ratio(a, b):
                return a / b if t.kind == "latency" else b / a

            row["ratio"] = ratio(num.median_us, den.median_us)
            row["best_ratio"] = ratio(min(num.used), min(den.used))
            if t.bound is None:
                row["status"] = "diagnostic"
            else:
                ok = row["ratio"] <= t.bound if t.op == "<=" else row["ratio"] >= t.bound
                row["status"] = "PASS" if ok else "MISS"
        rows.append(row)
    return rows


def _openblas_runtime() -> str:
    """Kernel and thread count of the OpenBLAS that numpy loaded, asked through its own C API."""
    import ctypes

    try:
        paths = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                 if "openblas" in line.lower() and line.split()[-1].startswith("/")}
    except OSError:
        return ""
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas_", "64_"), ("openblas_", "64_"), ("openblas_", "")):
            core = getattr(lib, f"{prefix}get_corename{suffix}", None)
            threads = getattr(lib, f"{prefix}get_num_threads{suffix}", None)
            if core is not None and threads is not None:
                core.restype = ctypes.c_char_p
                return f"kernel {core().decode()}, {threads()} threads"
    return ""


def _blas() -> tuple[list[dict], str]:
    """Every BLAS threadpoolctl finds (library, version, kernel, threads), and one line for people."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        pools = []
    else:
        pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    if pools:
        return pools, "; ".join(f"{p.get('internal_api')} {p.get('version')}, {p.get('architecture')} kernel, "
                                f"{p.get('num_threads')} threads" for p in pools)
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info = f"{blas.get('name')} {blas.get('version')} (numpy.show_config; threadpoolctl not installed)"
    except Exception as e:  # the config layout is not a stable API
        info = f"unknown ({e.__class__.__name__})"
    runtime = _openblas_runtime()
    return [], f"{info}, {runtime}" if runtime else info


def _simd() -> dict:
    """numpy's SIMD dispatch: the baseline it was built for, and the dispatch targets this CPU has or lacks."""
    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:  # numpy < 2
        from numpy.core import _multiarray_umath as umath
    features = umath.__cpu_features__
    targets = list(dict.fromkeys([*umath.__cpu_dispatch__, "AVX2", "AVX512F"]))
    return {"baseline": list(umath.__cpu_baseline__), "found": [t for t in targets if features.get(t)],
            "not_found": [t for t in targets if not features.get(t)]}


def environment() -> dict:
    cpu = platform.processor() or "unknown"
    flags = ""
    try:
        info = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
        cpu, flags = info.get("model name", cpu), info.get("flags", "")
    except OSError:
        pass
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    for mod in ("policyport", "onnx", "onnxruntime", "threadpoolctl"):
        try:
            versions[mod] = __import__(mod).__version__
        except ImportError:
            versions[mod] = "not installed"
    versions["torch"] = torch.__version__ if torch is not None else "not installed"
    pools, blas_short = _blas()
    env = {
        "cpu_model": cpu,
        "cpu_flags": [f for f in ("avx2", "avx512f", "amx_tile") if f in flags.split()],
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "platform": platform.platform(),
        "versions": versions,
        "simd": _simd(),
        "blas": pools,
        "blas_short": blas_short,
        "torch_threads": torch.get_num_threads() if torch is not None else None,
    }
    env["threads_env"] = {k: v for k, v in sorted(os.environ.items())
                          if k.startswith(("OPENBLAS_", "OMP_", "MKL_", "GOTO", "KMP_")) and v}
    return env


# --------------------------------------------------------------------------------------------
# CLI cold start
# --------------------------------------------------------------------------------------------

#: How ``-X importtime`` self times are grouped: top-level module -> group (the rest is "other").
IMPORT_GROUPS = {
    "numpy": "numpy", "onnx": "onnx (+ protobuf, ml_dtypes)", "google": "onnx (+ protobuf, ml_dtypes)",
    "ml_dtypes": "onnx (+ protobuf, ml_dtypes)", "typer": "typer (+ click, pydantic, ...)",
    "click": "typer (+ click, pydantic, ...)", "pydantic": "typer (+ click, pydantic, ...)",
    "pydantic_core": "typer (+ click, pydantic, ...)", "annotated_types": "typer (+ click, pydantic, ...)",
    "annotated_doc": "typer (+ click, pydantic, ...)", "typing_inspection": "typer (+ click, pydantic, ...)",
    "typing_extensions": "typer (+ click, pydantic, ...)", "shellingham": "typer (+ click, pydantic, ...)",
    "rich": "rich (+ markdown-it, pygments)", "markdown_it": "rich (+ markdown-it, pygments)",
    "mdurl": "rich (+ markdown-it, pygments)", "pygments": "rich (+ markdown-it, pygments)",
    "policyport": "policyport", "threadpoolctl": "threadpoolctl", "onnxruntime": "onnxruntime",
}


def import_breakdown(stderr: str) -> dict[str, float]:
    """``-X importtime`` output -> milliseconds of self time per group, largest first.

    A standard-library module counts for the package that imported it (``email`` pulled in by
    pydantic counts for typer's group); one imported at the top level counts for "Python's start-up
    and the standard library".
    """
    import re

    entries = []  # (depth, top-level module, self µs), in the order printed: children before parents
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|( *)(\S+)", line)
        if m:
            entries.append((len(m[2]) // 2, m[3].split(".")[0], int(m[1])))
    stdlib = set(sys.stdlib_module_names) | {"encodings", "site", "_distutils_hack", "__editable___policyport_0_1_0_finder"}

    def own_group(top: str) -> str | None:
        if top in IMPORT_GROUPS:
            return IMPORT_GROUPS[top]
        return None if top in stdlib or top.startswith("_") else "other packages"

    # Rebuild the tree: an entry's children are the entries of the next depth printed just before it.
    pending: list[tuple[int, str, int, list]] = []
    for depth, top, us in entries:
        children = []
        while pending and pending[-1][0] > depth:
            children.insert(0, pending.pop())
        pending.append((depth, top, us, children))
    groups: dict[str, float] = {}

    def add(node, inherited: str) -> None:
        _, top, us, children = node
        group = own_group(top) or inherited
        groups[group] = groups.get(group, 0.0) + us / 1000
        for child in children:
            add(child, group)

    for root in pending:
        add(root, "Python's start-up and the standard library")
    return dict(sorted(groups.items(), key=lambda kv: -kv[1]))


def cold_start(model, rounds: int, log) -> dict:
    """Wall time of ``policyport run --backend numpy`` on one observation against ``python -c "import
    onnx, numpy"`` (and a bare interpreter), each in its own process, interleaved; and where the
    run's imports go."""
    import subprocess
    import tempfile

    import onnx

    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench_cold_") as tmp:
        path, obs, out = Path(tmp) / "model.onnx", Path(tmp) / "obs.npy", Path(tmp) / "out.npz"
        onnx.save(model, path)
        np.save(obs, np.random.default_rng(1).random((1, 275), dtype=np.float32))
        run = [py, "-m", "policyport", "run", str(path), "-i", str(obs), "-o", str(out), "--force", "--backend", "numpy"]
        commands = {"policyport run --backend numpy": run, "python -c 'import onnx, numpy'": [py, "-c", "import onnx, numpy"],
                    "python -c pass": [py, "-c", "pass"]}
        times: dict[str, list[float]] = {name: [] for name in commands}
        for r in range(rounds + 1):
            for name, cmd in (list(commands.items()) if r % 2 else list(commands.items())[::-1]):
                start = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True, cwd=tmp)
                if r:  # the first round warms the file cache
                    times[name].append(time.perf_counter() - start)
        traced = subprocess.run([py, "-X", "importtime", *run[1:]], check=True, capture_output=True, text=True, cwd=tmp)
    summary = {name: {"median_s": statistics.median(t), "fastest_s": min(t)} for name, t in times.items()}
    run_name, floor_name = "policyport run --backend numpy", "python -c 'import onnx, numpy'"
    ratio = summary[run_name]["median_s"] / summary[floor_name]["median_s"]
    best = summary[run_name]["fastest_s"] / summary[floor_name]["fastest_s"]
    log(f"  cold start: {summary[run_name]['median_s']:.3f} s against {summary[floor_name]['median_s']:.3f} s ({ratio:.2f}x)")
    return {"command": "policyport run MODEL -i OBS.npy -o OUT.npz --backend numpy", "rounds": rounds,
            "commands": summary, "imports_ms": import_breakdown(traced.stderr),
            "target": {"target": "CLI cold start: policyport run (numpy, 1 observation) / python -c 'import onnx, numpy'",
                       "model": "metadrive-expert", "ratio": ratio, "best_ratio": best,
                       "bound": f"<= {COLD_START_BOUND}", "status": "PASS" if ratio <= COLD_START_BOUND else "MISS"}}


# --------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import report

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short timing windows, for a smoke run (not saved)")
    ap.add_argument("--json", metavar="PATH", help="also write the result document to PATH")
    ap.add_argument("--no-save", action="store_true", help="do not write the result into benchmarks/results/")
    ap.add_argument("--window", type=float, help="seconds per timed window (default 0.3, --quick 0.05)")
    ap.add_argument("--rounds", type=int, help="timed windows per runner (default 5, --quick 3)")
    args = ap.parse_args(argv)

    settings = Settings(
        window=args.window or (0.05 if args.quick else 0.3),
        settle=0.02 if args.quick else 0.1,
        rounds=args.rounds or (3 if args.quick else 5),
        slow_rounds=min(3, args.rounds or (3 if args.quick else 5)),
        slow_call_limit=0.25 if args.quick else 1.0,
        budget=1.6,
    )
    import policyport as pp

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    specs, notes = runner_specs()
    env = environment()
    source = report.source_state()
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    log(f"{report.machine_line(env)}")
    t_start, monitor = time.perf_counter(), CpuMonitor()
    cases = [metadrive_case(pp), relu_case(pp)]
    results: list[Measurement] = []
    for case in cases:
        results += bench_case(case, specs, settings, BATCHES, log)
    cold = cold_start(cases[0].onnx_model, 3 if args.quick else 9, log)
    elapsed = time.perf_counter() - t_start
    env["other_processes_cores"] = monitor.other_cores()
    targets = [row for case in cases for row in evaluate_targets(results, case.name)] + [cold["target"]]
    doc = {
        "date": date,
        "source": source,
        "quick": args.quick,
        "environment": env,
        "settings": asdict(settings),
        "notes": notes,
        "models": [case.name for case in cases],
        "batches": list(BATCHES),
        "results": [{**asdict(m), "median_us": m.median_us, "throughput": m.throughput, "spread": m.spread,
                     "contended": m.contended} for m in results],
        "targets": targets,
        "cold_start": cold,
        "elapsed_s": elapsed,
    }
    method = (f"Median of {settings.rounds} interleaved windows of ~{settings.window} s per runner "
              f"({settings.slow_rounds} for onnx ReferenceEvaluator), a window retried while other processes "
              f"used > {CONTENDED} cores; every runner's logits checked against the hand-written forward "
              f"(max abs error <= {TOLERANCE}). µs/call is the wall time of one call; samples/s = batch / that "
              "time. `plan.run only` is a diagnostic: the compiled plan without the Session's feed check.")
    print("\n".join([f"# policyport runtime benchmark{' (--quick)' if args.quick else ''}", "", method, ""]
                    + [f"- note: {n}" for n in notes] + [""] + [report.runtime_markdown(doc), f"Total time: {elapsed:.0f} s"]))
    text = json.dumps(doc, indent=1)
    if args.json:
        Path(args.json).write_text(text)
        log(f"wrote {args.json}")
    if not args.quick and not args.no_save:
        saved = report.RESULTS / f"runtime-{date.replace(':', '').replace('-', '')}-{source['commit']}.json"
        saved.parent.mkdir(exist_ok=True)
        saved.write_text(text)
        log(f"wrote {saved.relative_to(ROOT)}; scripts/update_readme_bench.py puts it into the README")
    return 0


if __name__ == "__main__":
    sys.exit(main())
