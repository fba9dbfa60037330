"""The comparison rule: one tensor of a candidate against the same tensor of a reference.

**Tolerance.** A floating-point element passes when ``|candidate - reference| <= atol + rtol *
|reference|`` (numpy.isclose's rule: rtol scales the *reference*); NaN matches NaN only at the same
position, an infinity only the same infinity. Unless the caller gives ``atol``/``rtol``, both come
from the element type compared (:data:`TOLERANCES`), the coarser of the two when they differ:

================  ========  ========  ==========================================================
dtype             atol      rtol      why
================  ========  ========  ==========================================================
float16           1e-3      1e-3      one rounding step of float16 is ``2**-10 ~ 9.8e-4`` relative
bfloat16          1e-2      1e-2      one rounding step of bfloat16 is ``2**-7 ~ 7.8e-3`` relative
float32           1e-5      1e-5      about 100 rounding steps (``2**-23 ~ 1.2e-7``)
float64           1e-9      1e-9      float64's own rounding (``2**-52``) with room for long sums
complex64/128     as float32 / float64, on the modulus of the difference
float8, float4…   their own rounding step (``ml_dtypes.finfo(dtype).eps``) for both
================  ========  ========  ==========================================================

Integer and bool tensors compare exactly (as integers: int64 values beyond 2**53 too); string
tensors compare by equality, never through a float conversion.

**float32 rounding** (:func:`rounding_check`). Two correct float32 programs of one graph differ
wherever their operations are ordered differently, by up to a few rounding steps of the *largest*
value a tensor's computation goes through — far more than 1e-5 on a small element that came out of
a cancellation of large ones (a dot product of 1,000-sized terms that ends near 0, scores of an
attention block near 1,200). With a float64 run of the same graph as an oracle ``r``, an element
that fails the tolerance still passes *by rounding* when::

    |a - b| <= ROUNDING_FACTOR * max(min(E_a, E_b), eps * max|r|)

where ``E_a = max|a - r|`` and ``E_b = max|b - r|`` over the tensor (finite elements) are how far
each side is from float64, and ``eps`` is the compared dtype's rounding step. In words: the two
sides may disagree by up to ``ROUNDING_FACTOR`` times the error of the *more accurate* one (or a few
rounding steps of the tensor's largest value, when one side is exact). Why it tells rounding from a
real difference:

* rounding: both sides are about as far from float64 (an attention block with scores near 1,500:
  numpy 2.9e-4, onnxruntime 4.0e-4, disagreeing by 3.7e-4); their disagreement is at most
  ``E_a + E_b``, about twice the smaller error when the errors are of one size. Measured between
  numpy and onnxruntime on a SAC actor and an attention block, 1 to 3,000 observations, three
  seeds each: ``|a - b| / max(min(E_a, E_b), floor)`` stayed below 1.6 wherever the tolerance
  failed, and below 5.1 on single observations, where one side happened to be 5 times closer.
  ``ROUNDING_FACTOR = 8`` leaves room for that;
* a real mismatch (a changed weight, a wrong op) moves one side away from float64 while the other
  stays close: ``|a - b|`` is then about that side's whole error, ``min(E_a, E_b)`` is the other
  side's rounding, and the element fails as soon as the difference exceeds 8 times ordinary
  rounding (a weight changed by 1e-3 moves a tensor by 1e-3 times its inputs: thousands of times
  float32 rounding);
* the verdict does not flip with the sample count: the disagreement and both errors are maxima
  over the same elements and grow together with more samples, while the tolerance's ``atol`` does
  not grow — which is why a tolerance alone passes 64 samples and fails 1,000.

The rule applies only to floating tensors and only where the oracle is finite; NaN and infinity
patterns must still match. Needs numpy only, so a packed folder can verify itself on a numpy-only
machine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..graph.model import ML_DTYPE_NAMES

#: Tolerances of the element types numpy has: dtype name -> (atol, rtol). See the module table.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 1e-2),
    "float32": (1e-5, 1e-5),
    "float64": (1e-9, 1e-9),
    "complex64": (1e-5, 1e-5),
    "complex128": (1e-9, 1e-9),
}
#: The float32 tolerances, the defaults this package had before tolerances followed the dtype.
DEFAULT_ATOL, DEFAULT_RTOL = TOLERANCES["float32"]

#: How many times the more accurate side's float64 error two sides may differ by (module docstring).
ROUNDING_FACTOR = 8.0

#: A failure whose worst error is within this many times the tolerance (the dtype's default, when that
#: is larger) may be a question of tolerance; beyond it the values disagree for another reason than
#: rounding, and loosening the tolerances would hide a real difference (:func:`within_reach`).
TOLERANCE_REACH = 100.0

#: Floating kinds ordered from coarse to fine, to pick the coarser of two dtypes' tolerances.
_PRECISION = ["float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "float8_e4m3fn", "float8_e4m3fnuz",
              "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "bfloat16", "float16", "float32",
              "complex64", "float64", "complex128"]


def is_floating(dtype: np.dtype) -> bool:
    """Whether tensors of ``dtype`` compare with tolerances (floats, complex, ml_dtypes floats)."""
    dtype = np.dtype(dtype)
    return dtype.kind in ("f", "c") or (dtype.name in ML_DTYPE_NAMES and dtype.name in _PRECISION)


def tolerance(dtype: np.dtype) -> tuple[float, float]:
    """The default ``(atol, rtol)`` for comparing tensors of ``dtype``; ``(0, 0)`` for exact kinds.

    Args:
        dtype: the compared element type.

    Returns:
        absolute and relative tolerance (see the module's table).
    """
    dtype = np.dtype(dtype)
    if not is_floating(dtype):
        return 0.0, 0.0
    if dtype.name in TOLERANCES:
        return TOLERANCES[dtype.name]
    eps = float(_finfo(dtype).eps)
    return eps, eps


def rounding_step(dtype: np.dtype) -> float:
    """The relative spacing of ``dtype``'s values near 1 (its machine epsilon): 2**-23 for float32
    (and complex64, whose parts are float32)."""
    return float(_finfo(np.dtype(dtype)).eps)


def _finfo(dtype: np.dtype):
    if dtype.name in ML_DTYPE_NAMES:
        import ml_dtypes  # present whenever an array of its types exists

        return ml_dtypes.finfo(dtype)
    return np.finfo(dtype)


def coarser(a: np.dtype, b: np.dtype) -> np.dtype:
    """Of two floating dtypes, the one with fewer significant bits (its tolerance applies)."""
    rank = {name: i for i, name in enumerate(_PRECISION)}
    unranked = len(rank)  # pragma: no mutate (any rank past the list's end: only floating dtypes are compared)
    return a if rank.get(np.dtype(a).name, unranked) <= rank.get(np.dtype(b).name, unranked) else b  # pragma: no mutate (< for <= differs only on a tie, where a and b are one dtype)


@dataclass(frozen=True)
class Comparison:
    """One tensor, one candidate against one reference.

    ``max_abs`` is the largest absolute difference; ``max_rel`` the largest ``|diff| / |reference|``
    over elements whose reference is non-zero and finite (0 when there are none); both ``inf`` on a shape,
    dtype or NaN-pattern mismatch, which ``detail`` then describes. ``atol``/``rtol`` are the
    tolerances that applied (0 for an exact comparison). ``rule`` says how it was decided:
    ``"tolerance"``, ``"exact"`` (integers, bools, strings) or ``"rounding"`` (failed the tolerance
    but within float32 rounding of a float64 run; see the module docstring), and for the latter
    ``candidate_vs_float64`` / ``reference_vs_float64`` are ``E_a`` and ``E_b`` and
    ``rounding_bound`` the bound the differences stayed within.
    """

    tensor: str
    candidate: str
    reference: str
    shape: tuple[int, ...]
    dtype: str
    max_abs: float
    max_rel: float
    passed: bool
    detail: str = ""
    atol: float = 0.0
    rtol: float = 0.0
    rule: str = "tolerance"
    candidate_vs_float64: float | None = None
    reference_vs_float64: float | None = None
    rounding_bound: float | None = None


@dataclass(frozen=True)
class Skipped:
    """A tensor that was not compared, and why (e.g. it depends on a random node)."""

    tensor: str
    reason: str


@dataclass
class Report:
    """The outcome of :func:`policyport.verify`. ``passed`` is true when every comparison passed.

    ``atol``/``rtol`` are the tolerances the caller gave, or ``None`` where they follow the dtype
    (each :class:`Comparison` holds the one it used). ``skipped`` lists tensors left out of the
    verdict (random ones); ``notes`` what a reader should know about the observations (fewer than
    asked, no batch axis); ``oracle`` names the float64 run used for the rounding rule, if any.
    ``source_oracle`` says what the source side was (``{"name", "framework", "checks"}``: the
    framework running the source's own code, or policyport's reconstruction of it), ``None``
    without a source; ``assumptions`` lists what the model, and the source side, rest on that their
    files do not record (``{"topic", "assumes", "because", "settle", "checked"}``, and against a
    source ``"side"`` and ``"differs"``):

    * ``side``: ``"both"`` (the source side assumes the same: one file however its path is
      spelled), ``"model"`` or ``"source"`` (that side alone);
    * ``checked``: a model's assumption the source side settled from the source itself (the
      framework's own code) rather than assuming it too; tested on the observations compared only;
    * ``differs``: the other side assumes otherwise on the same topic; ``disagreements`` lists those
      topics (``{"topic", "model", "source"}``, what each side assumes), where the two sides compute
      different things by design.

    ``non_finite`` names the compared tensors that are NaN or infinite in every element on both
    sides of a comparison: NaN matches NaN, so their comparisons pass and prove nothing.
    """

    backends: list[str]
    reference: str | None
    samples: int
    atol: float | None
    rtol: float | None
    comparisons: list[Comparison] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    oracle: str | None = None
    source_oracle: dict | None = None
    assumptions: list[dict] = field(default_factory=list)
    disagreements: list[dict] = field(default_factory=list)
    non_finite: list[str] = field(default_factory=list)

    @property
    def shared_assumptions(self) -> list[dict]:
        """The model's assumptions that the source side makes too (all of them against the
        reconstruction a conversion checks itself with): a PASS holds only given these."""
        return [a for a in self.assumptions if a.get("side", "both") == "both" and not a.get("checked")]

    @property
    def given_assumptions(self) -> list[dict]:
        """Every assumption a verdict holds only given: of either side or both, neither checked by
        the source side's own code nor one on which the sides differ."""
        return [a for a in self.assumptions if not a.get("checked") and not a.get("differs")]

    @property
    def tested_assumptions(self) -> list[dict]:
        """The model's assumptions the source side's own code computed (``checked``): tested on the
        observations compared only, untested wherever they do not exercise them."""
        return [a for a in self.assumptions if a.get("checked")]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)

    @property
    def first_divergence(self) -> Comparison | None:
        """The first failing comparison in node order, or ``None``."""
        return next((c for c in self.comparisons if not c.passed), None)

    @property
    def first_beyond_reach(self) -> Comparison | None:
        """The first failing comparison in node order that looser tolerances should not pass (not
        :func:`within_reach`), or ``None`` when every failure is within reach."""
        return next((c for c in self.comparisons if not c.passed and not within_reach(c)), None)

    def worst(self, reference: str | None = None) -> float:
        """The largest ``max_abs`` over comparisons (against ``reference`` only, if given)."""
        values = [c.max_abs for c in self.comparisons if reference in (None, c.reference)]
        return max(values, default=0.0)

    def tolerances(self) -> dict[str, tuple[float, float]]:
        """dtype -> (atol, rtol) of the tolerance comparisons, in first-seen order."""
        found: dict[str, tuple[float, float]] = {}
        for c in self.comparisons:
            if c.rule != "exact":
                found.setdefault(c.dtype, (c.atol, c.rtol))
        return found

    def to_dict(self) -> dict:
        """JSON-ready form: settings, ``passed``, ``first_divergence``, every comparison, the
        skipped tensors with their reasons, and the notes."""
        first = self.first_divergence
        return {
            "passed": self.passed,
            "backends": self.backends,
            "source": self.reference,
            "samples": self.samples,
            "atol": self.atol,
            "rtol": self.rtol,
            "tolerances": {k: {"atol": a, "rtol": r} for k, (a, r) in self.tolerances().items()},
            "oracle": self.oracle,
            "source_oracle": self.source_oracle,
            "assumptions": [dict(a) for a in self.assumptions],
            "disagreements": [dict(d) for d in self.disagreements],
            "non_finite": list(self.non_finite),
            "first_divergence": None if first is None else _json(asdict(first)),
            "comparisons": [_json(asdict(c)) for c in self.comparisons],
            "skipped": [asdict(s) for s in self.skipped],
            "notes": list(self.notes),
        }


def _json(d: dict) -> dict:
    d["shape"] = list(d["shape"])
    for k in ("max_abs", "max_rel"):
        if not np.isfinite(d[k]):
            d[k] = str(d[k])
    return d


def within_reach(c: Comparison) -> bool:
    """Whether a comparison's worst error is within :data:`TOLERANCE_REACH` times its tolerance, so
    that looser tolerances are a fair answer to its failing.

    The absolute error is measured against ``atol``, the relative one against ``rtol``, each the
    larger of the tolerance that applied and the dtype's default (:data:`TOLERANCES`): differences of
    1e-6 between float32 programs are within reach of a tolerance of 0, a max abs error of 4.87 on
    values near 1 is not within reach of 1e-5. Exact comparisons (integers, strings) and shape,
    dtype or NaN-pattern mismatches never are.

    Args:
        c: the comparison (usually a failed one).

    Returns:
        ``max_abs <= TOLERANCE_REACH * atol or max_rel <= TOLERANCE_REACH * rtol``.
    """
    if c.rule == "exact" or not np.isfinite(c.max_abs):
        return False
    default_atol, default_rtol = TOLERANCES.get(c.dtype, (c.atol, c.rtol))
    return (c.max_abs <= TOLERANCE_REACH * max(c.atol, default_atol)
            or c.max_rel <= TOLERANCE_REACH * max(c.rtol, default_rtol))


def tolerance_advice(report: Report, loosen: str) -> str:
    """The end of a failed verdict whose first divergence is numerical: ``"; if float32 differences of
    this size are acceptable, " + loosen`` when every failure is :func:`within_reach` of looser
    tolerances; otherwise that the values disagree beyond rounding, naming the first tensor that does.

    Args:
        report: a failed report.
        loosen: how the caller gives looser tolerances (``"loosen them with --atol/--rtol"``).

    Returns:
        The text, starting with ``"; "``.
    """
    far, first = report.first_beyond_reach, report.first_divergence
    if far is None:
        return f"; if {first.dtype} differences of this size are acceptable, {loosen}"
    beyond = f"more than {TOLERANCE_REACH:g} times the {far.dtype} tolerance"
    look = f"the values disagree beyond rounding — look at the node that computes {far.tensor!r}, not at the tolerances"
    if far is first:
        return f"; that is {beyond}: {look}"
    what = (f"differs: {far.detail}" if far.detail else
            f"differs by {far.max_abs:.3g} ({far.dtype} compares exactly)" if far.rule == "exact" else
            f"is off by up to {far.max_abs:.3g} (max rel {far.max_rel:.3g}), {beyond}")
    return f"; but {far.tensor!r} ({far.candidate} vs {far.reference}) {what}: {look}"


def tolerance_text(report: Report) -> str:
    """``atol 1e-05, rtol 1e-05`` as given, or the tolerances by dtype the comparisons used
    (``float32: atol 1e-05, rtol 1e-05; float16: ...``), or ``exact``."""
    if report.atol is not None and report.rtol is not None:
        return f"atol {report.atol:g}, rtol {report.rtol:g}"
    used = report.tolerances()
    if not used:
        return "exact"
    return "; ".join(f"{dtype}: atol {a:g}, rtol {r:g}" for dtype, (a, r) in used.items())


def source_lines(oracle: dict | None, assumptions: list[dict]) -> list[str]:
    """What the source side of a verification was (a report's ``source_oracle``), and each assumption
    the verdict rests on (with why, and the option that states otherwise), by who makes it: tested by
    the source side's own code (on the compared observations only), assumed by both sides, by the
    model or the source side alone, or assumed differently by the two; or the model's assumptions
    when no source was compared. Assumptions without ``side`` (a packed folder's record) are the
    model's, shared with the source side when there is one. ``policyport verify``, ``pack`` and
    ``inspect`` print these lines, and so does a packed folder's ``run.py --verify``."""
    if not oracle:
        return (["the model assumes (not in its source file):"] + [f"  {assumption_text(a)}" for a in assumptions]
                if assumptions else [])
    checked = [a for a in assumptions if a.get("checked")]
    rest = [a for a in assumptions if not a.get("checked")]
    differ = [a for a in rest if a.get("differs")]
    groups = [
        ("the model and the source side both assume (not in the source file):",
         [a for a in rest if a.get("side", "both") == "both" and not a.get("differs")]),
        ("the model assumes (the source side makes no assumption on it):",
         [a for a in rest if a.get("side") == "model" and not a.get("differs")]),
        ("the source side assumes (not in its file; the model does not):",
         [a for a in rest if a.get("side") == "source" and not a.get("differs")]),
    ]
    lines = [f"source side: {oracle['name']}" + (", which tested, on these observations only:" if checked else "")]
    lines += [f"  {assumption_text(a)}" for a in checked]
    for heading, group in groups:
        if group:
            lines += [heading, *(f"  {assumption_text(a)}" for a in group)]
    if differ:
        lines.append("the model and the source side assume differently (they compute different things there):")
        lines += [f"  {'the model' if a.get('side') == 'model' else 'the source side'}: {assumption_text(a)}"
                  for a in differ]
    return lines


def assumption_text(a: dict) -> str:
    """An assumption as a report records it: ``activation tanh at 1 and 3: given by ...; --activation
    names another``."""
    return f"{a['topic']} {a['assumes']}: {a['because']}" + (f"; {a['settle']}" if a.get("settle") else "")


def verdict(report: Report, loosen: str = "loosen them with --atol/--rtol") -> str:
    """The one-line PASS/FAIL summary of a report, as ``policyport verify`` and a packed folder's
    ``run.py --verify`` print it; a failure names the first diverging tensor, its dtype and, where
    looser tolerances would pass, ``loosen`` (see :func:`tolerance_advice`)."""
    rounding = sum(c.rule == "rounding" and c.passed for c in report.comparisons)
    extra = (f", {rounding} by rounding against a float64 run" if rounding else "") + \
        (f"; {len(report.skipped)} random tensor(s) skipped" if report.skipped else "")
    if report.non_finite:
        count = len(report.non_finite)
        extra += (f"; {count} tensor{'s' if count > 1 else ''} NaN or infinite everywhere on both sides "
                  f"prove{'s' if count == 1 else ''} nothing")
    against = _against(report)
    if report.passed:
        worst = max(report.comparisons, key=lambda c: c.max_abs, default=None)
        where = f"; worst {worst.max_abs:.3g} on {worst.tensor} ({worst.candidate} vs {worst.reference})" if worst else ""
        return f"PASS{against}: {len(report.comparisons)} comparisons within {tolerance_text(report)}{extra}{where}"
    f = report.first_divergence
    bad = sum(not c.passed for c in report.comparisons)
    text = (f"FAIL{against}: {bad} of {len(report.comparisons)} comparisons fail{extra}; first diverging tensor "
            f"{f.tensor!r} ({f.dtype}, {f.candidate} vs {f.reference}): ")
    if f.detail:
        return text + f.detail
    text += f"max abs {f.max_abs:.3g}, max rel {f.max_rel:.3g}"
    if f.rule == "exact":
        return text + f" ({f.dtype} compares exactly)"
    text += f" > atol {f.atol:g} + rtol {f.rtol:g} * |{f.reference}|"
    if f.rule == "rounding":
        text += (f", and not {f.dtype} rounding: against a float64 run {f.candidate} is {f.candidate_vs_float64:.2g} "
                 f"off, {f.reference} {f.reference_vs_float64:.2g}")
    return text + tolerance_advice(report, loosen)


def _against(report: Report) -> str:
    """What the source side of a verdict was, and every assumption of either side, so that none
    drops out of a PASS: ``" against a reconstruction that assumes activation tanh at 1 and 3"``,
    ``" against SB3's own ... , given observation normalisation none; tested on these observations
    only: action bounds none: ..."``, and what each side assumes on a topic where they differ; ``""``
    without a source."""
    oracle = report.source_oracle
    if not oracle:
        return ""
    given = report.given_assumptions
    if oracle.get("framework"):
        text = f" against {oracle['name']}" + (f", given {_short(given)}" if given else "")
    else:
        rebuilt = [a for a in given if a.get("side", "both") != "model"]
        alone = [a for a in given if a.get("side") == "model"]
        text = (f" against a reconstruction that assumes {_short(rebuilt)}" if rebuilt else
                " against a reconstruction of the source that assumes nothing the file does not record")
        text += f", given {_short(alone)}" if alone else ""
    tested = report.tested_assumptions
    if tested:
        text += f"; tested on these observations only: {_short(tested)}"
    for d in report.disagreements:
        text += (f"; the model and the source side assume differently on {d['topic']} (the model: "
                 f"{'; '.join(d['model'])}; the source side: {'; '.join(d['source'])})")
    return text


def _short(assumptions: list[dict]) -> str:
    return "; ".join(f"{a['topic']} {a['assumes']}" for a in assumptions)


def compare(tensor: str, candidate: str, a: np.ndarray, reference: str, b: np.ndarray,
            atol: float | None = None, rtol: float | None = None, oracle: np.ndarray | None = None) -> Comparison:
    """Compare array ``a`` (from ``candidate``) with ``b`` (from ``reference``); see the module rule.

    Args:
        tensor, candidate, reference: names for the report.
        a, b: the two arrays; their shapes must match, their kinds too (floating, integer/bool,
            string); floating ones of different widths compare with the coarser one's tolerance.
        atol: absolute tolerance for floating tensors; ``None`` (default): by dtype (:data:`TOLERANCES`).
        rtol: relative tolerance, scaled by ``|b|``; ``None`` (default): by dtype.
        oracle: the same tensor from a float64 run of the graph, enabling the rounding rule for a
            floating tensor that fails the tolerance (ignored otherwise).

    Returns:
        The :class:`Comparison`; the same as :class:`ComparisonFold` gives for ``a`` and ``b`` in one block.
    """
    fold = ComparisonFold(tensor, candidate, reference, atol, rtol)
    fold.add(a, b)
    if oracle is not None and fold.wants_rounding:
        fold.add_rounding(a, b, oracle)
    return fold.result()


class ComparisonFold:
    """One tensor of a candidate against a reference, compared a block of rows at a time.

    Every figure of a :class:`Comparison` is a maximum, a count or an "all" over the elements, so
    it folds over blocks: :meth:`add` each block's pair of arrays (rows ``0..k``, then ``k..m`` ...,
    or the whole tensor once), then :meth:`result` is the comparison of the whole tensors, exactly
    as :func:`compare` gives it. For the rounding rule, whose bound is a maximum over the whole
    tensor, the blocks of a tensor that failed the tolerance (:attr:`wants_rounding`) are given
    again with the float64 run's values (:meth:`add_rounding`): ``E_a``, ``E_b`` and ``max |r|``
    fold into the bound, and the largest difference among the elements that fail the tolerance is
    what the bound must cover.

    Args:
        tensor, candidate, reference, atol, rtol: as for :func:`compare`.
    """

    def __init__(self, tensor: str, candidate: str, reference: str, atol: float | None = None,
                 rtol: float | None = None):
        self.tensor, self.candidate, self.reference = tensor, candidate, reference
        self._given = (atol, rtol)
        self.atol = self.rtol = 0.0
        self.dtype = ""  # the compared dtype's name (the coarser float, int64 for ml_dtypes ints)
        self._float_dtype: np.dtype | None = None
        self._candidate_dtype = ""  # what a mismatch reports
        self.kind = ""
        self.shape: tuple[int, ...] | None = None  # the candidate's, rows summed over the blocks
        self._other_shape: tuple[int, ...] | None = None
        self._dtypes: tuple[str, str] | None = None  # (candidate, reference) when their kinds differ
        self._nan_only = [0, 0]
        self.max_abs = self.max_rel = 0.0
        self.within = True
        self._differ = self._size = 0
        self._rounding: list[float] | None = None  # E_a, E_b, max |r|, the largest failing difference
        self._no_rounding = False
        self._floats = self._finite = False  # floating elements seen; a finite one among them, on either side

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        """Fold in one block: ``a`` and ``b`` are the same rows of the candidate's and the reference's tensor."""
        a, b = np.asarray(a), np.asarray(b)
        first = self.shape is None
        self.shape = _stack(self.shape, a.shape)
        self._other_shape = _stack(self._other_shape, b.shape)
        if first:
            self._candidate_dtype = a.dtype.name
            self.kind = _kind(a.dtype) if _kind(a.dtype) == _kind(b.dtype) else ""
            if not self.kind:
                self._dtypes = (a.dtype.name, b.dtype.name)
        if self.shape != self._other_shape or not self.kind:
            return
        if self.kind == "float":
            self._add_float(a, b)
        else:
            self._add_exactly(a, b)

    def _add_float(self, a: np.ndarray, b: np.ndarray) -> None:
        dtype = self._float_dtype = coarser(a.dtype, b.dtype)
        default_atol, default_rtol = tolerance(dtype)
        self.dtype = dtype.name
        self.atol = default_atol if self._given[0] is None else float(self._given[0])
        self.rtol = default_rtol if self._given[1] is None else float(self._given[1])
        if a.size == 0:
            return
        af, bf = _wide(a), _wide(b)
        self._floats = True
        self._finite = self._finite or bool(np.isfinite(af).any() or np.isfinite(bf).any())
        nan_a, nan_b = np.isnan(af), np.isnan(bf)
        if (nan_a != nan_b).any():
            self._nan_only[0] += int((nan_a & ~nan_b).sum())
            self._nan_only[1] += int((nan_b & ~nan_a).sum())
            return
        diff, within, max_rel = self._differences(af, bf, ~nan_a)
        self.max_abs = max(self.max_abs, float(diff.max()))
        self.max_rel = max(self.max_rel, max_rel)
        self.within = self.within and bool(within.all())

    def _differences(self, af: np.ndarray, bf: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """``|a - b|`` (0 where both are NaN or the same infinity), which elements are within the
        tolerance, and the largest relative difference; ``af``/``bf`` float64, ``ok`` where not NaN."""
        same_inf = np.isinf(af) & (af == bf)
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is masked out just below
            diff = np.where(ok & ~same_inf, np.abs(af - bf), 0.0)
        scale = np.abs(np.where(ok, bf, 0.0))  # pragma: no mutate (where NaN, the difference is 0 whatever the scale)
        nonzero = (scale > 0) & ~np.isinf(scale)  # no error is relative to an infinite reference
        with np.errstate(over="ignore"):
            max_rel = float((diff[nonzero] / scale[nonzero]).max()) if nonzero.any() else 0.0
            finite_scale = np.where(np.isinf(scale), 0.0, scale)  # pragma: no mutate (where infinite, the difference is 0 or inf)
            within = diff <= self.atol + self.rtol * finite_scale
        return diff, within, max_rel

    def _add_exactly(self, a: np.ndarray, b: np.ndarray) -> None:
        """Integers and bools element by element as integers; strings by equality."""
        if self.kind == "string":
            self.dtype = max(self.dtype, a.dtype.name, key=lambda name: (len(name), name))  # the widest
            differ = np.fromiter((x != y for x, y in zip(a.ravel().tolist(), b.ravel().tolist())), dtype=bool, count=a.size)
            self._size += a.size
            self._differ += int(differ.sum())
            self.max_abs = self.max_rel = max(self.max_abs, float(differ.any()))
            return
        if a.dtype.name in ML_DTYPE_NAMES:  # int4/uint4 ...: exact in int64
            a, b = (x.astype(np.int64) for x in (a, b))
        self.dtype = a.dtype.name
        self._size += a.size
        differ = a != b
        if not differ.any():
            return
        x, y = a[differ].astype(object), b[differ].astype(object)  # Python ints: no overflow, no rounding
        gaps = [abs(int(p) - int(q)) for p, q in zip(x.tolist(), y.tolist())]
        rels = [g / abs(int(q)) for g, q in zip(gaps, y.tolist()) if int(q)]
        self._differ += int(differ.sum())
        self.max_abs = max(self.max_abs, float(max(gaps)))
        self.max_rel = max(self.max_rel, float(max(rels, default=0.0)))

    @property
    def nowhere_finite(self) -> bool:
        """Whether the tensor is floating, holds elements, and every element is NaN or infinite on
        both sides: NaN matches NaN, so such a comparison passes and proves nothing."""
        return self.kind == "float" and self._floats and not self._finite

    @property
    def wants_rounding(self) -> bool:
        """Whether the tensor is floating, compared element by element, and failed the tolerance:
        the rounding rule may still pass it, given the float64 run's values (:meth:`add_rounding`)."""
        return (self.kind == "float" and self.shape == self._other_shape and not any(self._nan_only)
                and not self.within)

    def add_rounding(self, a: np.ndarray, b: np.ndarray, oracle: np.ndarray) -> None:
        """Fold in one block for the rounding rule: the block's arrays as given to :meth:`add`, and the
        float64 run's values of the same rows. An ``oracle`` of another shape than ``a`` turns the
        rule off for the tensor."""
        a, b = np.asarray(a), np.asarray(b)
        if np.shape(oracle) != a.shape:
            self._no_rounding = True
            return
        if a.size == 0:
            return
        oracle = _wide(np.asarray(oracle))  # complex: the whole value, never its real part alone
        af, bf = _wide(a), _wide(b)
        parts = _rounding_parts(af, bf, oracle)
        if parts is None:
            return
        diff, within, _ = self._differences(af, bf, ~np.isnan(af))
        failing = float(diff[~within].max()) if not within.all() else 0.0
        if self._rounding is None:
            self._rounding = [*parts, failing]
        else:
            self._rounding = [max(old, new) for old, new in zip(self._rounding, (*parts, failing))]

    def result(self) -> Comparison:
        """The :class:`Comparison` of everything folded in."""
        shape = self.shape or ()
        args = (self.tensor, self.candidate, self.reference, shape, self.dtype)
        mismatch = (self.tensor, self.candidate, self.reference, shape, self._candidate_dtype, np.inf, np.inf, False)
        if self.shape != self._other_shape:
            return Comparison(*mismatch, f"shape {self.shape} vs {self._other_shape}")
        if self._dtypes is not None:
            return Comparison(*mismatch, f"dtype {self._dtypes[0]} vs {self._dtypes[1]}")
        if self.kind == "string":
            detail = f"{self._differ} of {self._size} strings differ" if self._differ else ""
            return Comparison(*args, self.max_abs, self.max_rel, not self._differ, detail, rule="exact")
        if self.kind == "integer":
            detail = f"{self._differ} of {self._size} elements differ" if self._differ else ""
            return Comparison(*args, self.max_abs, self.max_rel, not self._differ, detail, rule="exact")
        if any(self._nan_only):
            return Comparison(*mismatch, f"NaN in {self._nan_only[0]} places of {self.candidate} "
                              f"only, {self._nan_only[1]} of {self.reference} only")
        if self.within or self._rounding is None or self._no_rounding:
            return Comparison(*args, self.max_abs, self.max_rel, self.within, atol=self.atol, rtol=self.rtol)
        e_a, e_b, largest, failing = self._rounding
        bound = ROUNDING_FACTOR * max(min(e_a, e_b), rounding_step(self._float_dtype) * largest)
        return Comparison(*args, self.max_abs, self.max_rel, failing <= bound, atol=self.atol, rtol=self.rtol,
                          rule="rounding", candidate_vs_float64=e_a, reference_vs_float64=e_b, rounding_bound=bound)


def _stack(shape: tuple[int, ...] | None, block: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of a tensor given in blocks of rows: the blocks' row counts add up along axis 0."""
    block = tuple(block)
    if shape is None:
        return block
    if len(shape) != len(block) or not block:
        return shape if shape == block else shape + (-1,)  # blocks that do not stack: a shape mismatch
    return (shape[0] + block[0], *block[1:]) if shape[1:] == block[1:] else shape + (-1,)


def rounding_check(a: np.ndarray, b: np.ndarray, oracle: np.ndarray, dtype: np.dtype
                   ) -> tuple[float, float, float] | None:
    """The float32-rounding bound of one tensor (see the module docstring).

    Args:
        a, b: the two sides, as float64 arrays of one shape.
        oracle: the float64 run's values, same shape.
        dtype: the compared element type (its rounding step sets the floor).

    Returns:
        ``(bound, E_a, E_b)``: differences up to ``bound`` are rounding; ``E_a``/``E_b`` are the
        largest distances of ``a``/``b`` from the oracle over the elements where all three are
        finite. ``None`` where no element is finite in all three.
    """
    parts = _rounding_parts(a, b, oracle)
    if parts is None:
        return None
    e_a, e_b, largest = parts
    return ROUNDING_FACTOR * max(min(e_a, e_b), rounding_step(dtype) * largest), e_a, e_b


def _rounding_parts(a: np.ndarray, b: np.ndarray, oracle: np.ndarray) -> tuple[float, float, float] | None:
    """``(E_a, E_b, max |r|)`` over the elements finite in all three, or ``None`` where there are none."""
    finite = np.isfinite(a) & np.isfinite(b) & np.isfinite(oracle)
    if not finite.any():
        return None
    r = oracle[finite]
    return float(np.abs(a[finite] - r).max()), float(np.abs(b[finite] - r).max()), float(np.abs(r).max())


def _kind(dtype: np.dtype) -> str:
    if is_floating(dtype):
        return "float"
    if dtype.kind in ("O", "S", "U"):
        return "string"
    return "integer"  # pragma: no mutate (a label, told only from "float" and "string")


def _wide(x: np.ndarray) -> np.ndarray:
    """``x`` as float64 (complex: complex128), exactly."""
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)  # pragma: no mutate (widening every kind to complex128 would give the same figures)
