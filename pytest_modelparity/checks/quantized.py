"""A quantised TFLite candidate judged in two parts: what conversion broke, what quantisation cost.

Why two parts: a quantised file differs from its reference for two reasons that call for
different fixes. On twelve Keras Applications nets every ``int8``/``dynamic_range`` failure
was what quantisation costs (a plain TFLiteConverter gave the same error), and one fixed
bound could not tell it from a conversion bug (notes/quantization.md). The float32 TFLite
file of the same source (its *sibling*: same graph, same op names) separates them:

- **conversion**: the sibling against the reference, by the float64 floor (the default rule
  ``assert_outputs_close`` uses for float32 forms);
- **quantisation cost**: the quantised file against its sibling, by a budget per variant and
  output kind (``judge_cost``): class scores (a softmax, or declared ``class_scores=``) by
  top-k agreement over rows that are not near-ties, regression outputs by the share of
  elements beyond a share of the output's scale, each as an acceptance test
  (``checks/acceptance.py``): it PASSES only when the upper bound of its miss rate is within
  the budget, FAILS when the lower bound is beyond it, and otherwise more rows are drawn
  (``checks/quant_rows.py``) up to a cap, then it is inconclusive (``settle``); before issue 47
  it passed unless the rows proved a violation (85% top-1 passed a 95% budget on 47 rows).
  Relative RMS is reported, it does not decide. Defaults measured on trained models
  (docs/tolerances.md "Quantised forms"); ``--modelparity-quant-budget``, the marker's
  ``quant_budget=`` or the ini key loosen one variant's budget without touching conversion.
- ``tflite:float16`` adds a third line: the file against its sibling with weights rounded to
  float16 (``formats.tflite.quant.float16_twin``), by the float64 floor: float16 weights
  cost 0.2-0.9 of the output's scale on some deep nets, more than a kernel x1.01 moves it,
  but the twin rounds exactly what the file rounded, so only a real difference shows.

An ``int8``/``dynamic_range`` file without a sibling is judged by the same budget against the
reference (``alone_report``). Nothing here imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import math
import re
from contextvars import ContextVar
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from . import acceptance
from ..verdict import tree
from ..verdict.compare import ComparisonReport, compare
from ..errors import InvalidArgumentError
from ..verdict.tolerances import Tolerance

VARIANTS = ("float16", "dynamic_range", "int8")
CONVERSION = "conversion"
COST = "quantisation"
FLOAT16_TWIN = "float16 weights"


@dataclass(frozen=True)
class Budget:
    """What quantisation may cost an output, against the float32 sibling (or the reference).

    Class scores (a softmax over the last axis, or declared ``class_scores=``) are judged by
    ``top1`` alone: the share of rows, not near-ties, whose decision agrees; regression outputs
    by ``beyond``: the share of elements more than ``scale`` x max|float| away. Each share is
    judged as an acceptance test (``checks/acceptance.py``): proved within, proved beyond, or
more rows. ``rms`` (relative
    RMS) is reported against its value in every verdict; it explains, it does not decide."""

    rms: float        # rms(quantised - float) / rms(float): reported beside the verdict
    scale: float      # an element is "beyond" when |quantised - float| > scale x max|float|
    beyond: float     # share of a regression output's elements allowed beyond
    top1: float       # class scores: top-1 agreement over rows whose float top-1 is not a near-tie

    def describe(self) -> str:
        return (f"class scores: top-1 >= {self.top1:.0%}; regression: <= {self.beyond:.1%} of elements beyond "
                f"{self.scale:.3g} of scale")


# Measured on models trained on real data (bench/quantized.py, docs/tolerances.md): the
# digits CNN (93-95% accurate) costs dynamic_range 3.6e-3 relative RMS, int8 6.6e-3..8.6e-3
# (calibrated on training rows), top-1 >= 99.7%, <= 0.2% of elements beyond 1e-2 of scale.
# Those budgets are ~5x their cost, so a calibration on the wrong range (int8 relative RMS
# 0.5 and up) fails while trained models pass. float16 is different: a float16 file whose
# weights are not its sibling's is caught exactly by the float16-weights part, so its budget
# only asks whether float16 is acceptable at all, and is set above what correct float16
# files cost the deepest nets measured (MobileNetV2 with trained-like statistics, 64 px:
# relative RMS 2.8e-2..3.5e-2, max 3.6e-2 of scale, top-1 100%; the digits CNN: 1.8e-4).
DEFAULT_BUDGETS: dict[str, Budget] = {
    "float16": Budget(rms=5e-2, scale=5e-2, beyond=0.01, top1=0.97),
    "dynamic_range": Budget(rms=2e-2, scale=5e-2, beyond=0.01, top1=0.97),
    "int8": Budget(rms=5e-2, scale=1e-1, beyond=0.02, top1=0.95),
}
_KEYS = tuple(f.name for f in fields(Budget))

# (source name, {variant: {key: value}}), highest priority first (marker, then option/ini).
_LAYERS: ContextVar[tuple[tuple[str, dict], ...]] = ContextVar("modelparity_quant_budget", default=())


# -- budgets -----------------------------------------------------------------------------

def parse_budget(text: Any, source: str = "--modelparity-quant-budget") -> dict[str, dict[str, float]]:
    """``"int8:rms=0.08,top1=0.9; dynamic_range:scale=0.1"`` (or a dict of that shape) as
    ``{variant: {key: value}}``; a wrong variant, key or value is an ``InvalidArgumentError``."""
    if isinstance(text, Mapping):
        items = [(str(v), dict(kv)) for v, kv in text.items()]
    else:
        items = []
        for part in str(text).split(";"):
            if not part.strip():
                continue
            variant, sep, rest = part.strip().removeprefix("tflite:").partition(":")
            if not sep:
                raise InvalidArgumentError(f"{source}: {part.strip()!r} has no variant; write e.g. "
                                           "'int8:rms=0.08,top1=0.9' (variants: " + ", ".join(VARIANTS) + ")")
            pairs = {}
            for kv in rest.split(","):
                key, eq, value = kv.strip().partition("=")
                if not eq:
                    raise InvalidArgumentError(f"{source}: {kv.strip()!r} is not key=value; keys: {', '.join(_KEYS)}")
                pairs[key.strip()] = value.strip()
            items.append((variant.strip().removeprefix("tflite:"), pairs))
    result: dict[str, dict[str, float]] = {}
    for variant, pairs in items:
        variant = variant.removeprefix("tflite:")
        if variant not in VARIANTS:
            raise InvalidArgumentError(f"{source}: unknown variant {variant!r}; use one of {', '.join(VARIANTS)}")
        checked = {}
        for key, value in pairs.items():
            if key not in _KEYS:
                raise InvalidArgumentError(f"{source}: unknown budget key {key!r} for {variant}; use {', '.join(_KEYS)}")
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"{source}: {variant} {key}={value!r} is not a number") from None
            if not math.isfinite(number) or number < 0 or (key in ("beyond", "top1") and number > 1):
                raise InvalidArgumentError(f"{source}: {variant} {key}={value!r}; pass a finite number >= 0"
                                           + (" and <= 1" if key in ("beyond", "top1") else ""))
            checked[key] = number
        result.setdefault(variant, {}).update(checked)
    return result


@contextlib.contextmanager
def budget_layers(layers: list[tuple[str, Any]]) -> Iterator[None]:
    """Make ``layers`` [(source, budget text or dict)] (highest priority first) the budgets
    every comparison in the block uses; the plugin wraps each test in it."""
    parsed = tuple((name, parse_budget(value, name)) for name, value in layers if value)
    token = _LAYERS.set(parsed)
    try:
        yield
    finally:
        _LAYERS.reset(token)


def current_budget(variant: str) -> tuple[Budget, str]:
    """The budget of ``variant`` in force, and where each loosened key came from."""
    budget = DEFAULT_BUDGETS[variant]
    sources = []
    for name, table in reversed(_LAYERS.get()):
        given = table.get(variant)
        if given:
            budget = replace(budget, **given)
            sources.append(f"{name} ({', '.join(f'{k}={v:g}' for k, v in given.items())})")
    return budget, ("built-in budget, measured on trained models" if not sources
                    else "built-in budget loosened by " + "; ".join(sources))


# -- who is judged in two parts -----------------------------------------------------------

def variant_of(model: Any) -> str | None:
    """``int8``/``dynamic_range``/``float16`` for a quantised TFLite model, else None."""
    fmt = str(getattr(model, "format_variant", "") or "")
    base, _, variant = fmt.partition(":")
    return variant if base == "tflite" and variant in VARIANTS else None


def sibling_of(model: Any) -> Any:
    """The float32 TFLite sibling attached to a quantised candidate (``load_model(...,
    float_sibling=PATH)``, or the plugin's fixtures), else None."""
    return getattr(model, "float_sibling", None) if variant_of(model) else None


# -- what kind of output: class scores or not ---------------------------------------------

CLASS_SCORES = "class scores"
REGRESSION = "regression"
# A miss rate of (1 - top1) or a beyond share of ``beyond`` is an acceptance test
# (checks/acceptance.py): PASS when the interval's upper bound is within it, FAIL when its
# lower bound is beyond it, else more rows are drawn, then inconclusive at the cap of rows.
ALPHA = acceptance.ALPHA
# Relative RMS explains, it does not decide: over 2 rows its numerator and denominator are a
# few elements (the digits CNN's int8 file read 0.051 on 2 rows, 0.0066..0.0086 on 64), and on
# a trained two-head net's small regression head it read 0.033 over 397 rows with no element
# beyond 5% of scale (bench/quantized.py --budgets): a rule on it fails good files.

# (declared class-score outputs: True for all, a tuple of names, or None; top-k; who said so)
_CLASSES: ContextVar[tuple[Any, int, str]] = ContextVar("modelparity_class_scores", default=(None, 1, ""))


def check_class_scores(outputs: Any, top_k: Any = 1, source: str = "class_scores") -> tuple[Any, int]:
    """``True`` (every output), an output name or a list of names, and ``top_k`` (an int >= 1):
    checked, as ``(True | tuple of names | None, k)``; anything else is an InvalidArgumentError."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InvalidArgumentError(f"{source}: top_k={top_k!r}; pass an int >= 1 (1 is top-1 agreement)")
    if outputs is None or outputs is False:
        return None, top_k
    if outputs is True:
        return True, top_k
    names = (outputs,) if isinstance(outputs, str) else outputs
    try:
        names = tuple(names)
    except TypeError:
        names = (outputs,)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise InvalidArgumentError(f"{source}: class_scores={outputs!r}; pass True (every output), an output "
                                   "name or a list of output names")
    return names, top_k


@contextlib.contextmanager
def class_scores(outputs: Any = True, top_k: int = 1, source: str = "marker") -> Iterator[None]:
    """Declare which outputs are class scores (``True``: all; a name or names) for the quantised
    verdicts in the block: judged by top-``top_k`` agreement; the plugin wraps a test whose
    marker says ``class_scores=`` in it. A softmax over the last axis needs no declaration."""
    declared, k = check_class_scores(outputs, top_k, source)
    token = _CLASSES.set((declared, k, source))
    try:
        yield
    finally:
        _CLASSES.reset(token)


def _leaf_name(inner: str) -> str:
    keys = re.findall(r"\['((?:[^'\\]|\\.)*)'\]|\[(\d+)\]", inner)
    return (keys[-1][0] or keys[-1][1]) if keys else inner


def output_kind(inner: str, values: Any) -> tuple[str, str, int]:
    """(``CLASS_SCORES`` or ``REGRESSION``, why, k) for the output at ``inner`` whose float
    values are ``values``: declared (``class_scores``), or rows of a softmax over the last axis
    (>= 0, summing to 1); anything else (logits, sigmoids, boxes) is judged as regression."""
    declared, k, source = _CLASSES.get()
    if declared is True or (declared and (inner in declared or _leaf_name(inner) in declared)):
        return CLASS_SCORES, f"declared class scores ({source} class_scores=)", k
    if looks_like_softmax(values):
        return CLASS_SCORES, "a softmax over the last axis", 1
    return REGRESSION, "not a softmax over the last axis", 1


def looks_like_softmax(values: Any) -> bool:
    """Rows over the last axis (at least 2 classes) that are >= 0 and sum to 1 (to 1e-3)."""
    if values is None:
        return False
    f = np.asarray(values)
    if f.dtype.kind != "f" or f.ndim < 2 or f.shape[-1] < 2 or not f.size or not np.isfinite(f).all():
        return False
    f = f.astype(np.float64)
    return bool(f.min() >= -1e-6 and f.max() <= 1 + 1e-6 and np.all(np.abs(f.sum(-1) - 1.0) <= 1e-3))


def _decisions(q: np.ndarray, f: np.ndarray, k: int, share: float) -> tuple[int, int, int]:
    """(rows whose float top-1 is among the quantised top-k, rows judged, near-ties left out).
    A row whose float top-1 beats its (k+1)-th class by at most twice what the budget lets an
    element move (``share`` x max|f|) is a near-tie: its decision is not evidence."""
    classes = f.shape[-1]
    f2 = f.reshape(-1, classes).astype(np.float64)
    q2 = q.reshape(-1, classes).astype(np.float64)
    top = np.argmax(f2, axis=-1)
    if k >= classes:
        return len(top), len(top), 0
    qk = np.argsort(-q2, axis=-1, kind="stable")[:, :k]
    agree = (qk == top[:, None]).any(axis=-1)
    desc = -np.sort(-f2, axis=-1)
    finite = f2[np.isfinite(f2)]
    scale = float(np.max(np.abs(finite))) if finite.size else 0.0
    with np.errstate(invalid="ignore"):
        judged = ~(desc[:, 0] - desc[:, k] <= 2.0 * share * scale)
    return int(agree[judged].sum()), int(judged.sum()), int((~judged).sum())


def judged_share(f: np.ndarray, k: int, share: float) -> float:
    """The share of rows of float class scores ``f`` that are not near-ties (``_decisions``)."""
    _, judged, ties = _decisions(f, f, k, share)
    return judged / (judged + ties) if judged + ties else 1.0


def _rows(shape: tuple[int, ...]) -> int:
    return int(shape[0]) if len(shape) else 1


def tally(inner: str, q: Any, f: Any, budget: "Budget", equal_nan: bool = False) -> dict[str, Any] | None:
    """What one output's decision counts: ``{"kind", "why", "k", "unit", "trials", "observed",
    "rate"}`` (``rate``: the budget's miss rate), plus ``agree``/``near_ties`` for class scores;
    None for an output that cannot be judged (shapes differ, not floating, empty). Used by the
    verdict (``judge_cost``) and by the looks that decide whether to draw more rows
    (``checks/quant_rows.py``), so both count the same misses."""
    q, f = np.asarray(q), np.asarray(f)
    if q.shape != f.shape or q.dtype.kind not in "fc" or f.dtype.kind not in "fc" or not q.size:
        return None
    kind, why, k = output_kind(inner, f)
    if kind == CLASS_SCORES:
        agree, judged, ties = _decisions(q, f, k, budget.scale)
        return {"kind": kind, "why": why, "k": k, "unit": "rows", "trials": judged, "observed": judged - agree,
                "rate": 1.0 - budget.top1, "agree": agree, "near_ties": ties}
    qf, ff = q.astype(np.float64), f.astype(np.float64)
    finite = np.isfinite(ff)
    bound = budget.scale * (float(np.max(np.abs(ff[finite]))) if finite.any() else 0.0)
    beyond = int(np.sum(~np.isclose(qf, ff, rtol=0.0, atol=bound, equal_nan=equal_nan)))
    return {"kind": kind, "why": why, "k": k, "unit": "elements", "trials": int(q.size), "observed": beyond,
            "rate": budget.beyond}


def decide_outputs(flat_q: Mapping, flat_f: Mapping, budget: "Budget", equal_nan: bool = False) -> dict[str, str]:
    """``{inner path: acceptance verdict}`` of every output judged on these rows (one look)."""
    out = {}
    for inner, f in flat_f.items():
        q = flat_q.get(inner)
        t = None if q is None else tally(inner, q, f, budget, equal_nan)
        if t is not None:
            out[inner] = acceptance.decide(t["observed"], t["trials"], t["rate"]).verdict
    return out


def _interval(d: acceptance.Decision) -> str:
    return (f"{1 - d.alpha:.2%} interval of the miss rate [{d.lower:.1%}, {d.upper:.1%}] "
            f"(observed {d.rate or 0.0:.1%})")


def _rule_text(d: acceptance.Decision, unit: str) -> str:
    """The thresholds this decision applied on its trials, in words."""
    pass_at_most, fail_from = acceptance.thresholds(d.trials, d.budget, d.alpha)
    passes = f"passes with at most {pass_at_most} misses" if pass_at_most >= 0 else "no count passes"
    fails = f"fails from {fail_from}" if fail_from <= d.trials else "no count fails"
    return f"on {d.trials} {unit} {passes}, {fails}"


def judge_cost(outputs: list[tuple[Any, str]], flat_q: Mapping, flat_f: Mapping, budget: "Budget", variant: str,
               against: str, source: str, rows_note: Mapping | None = None) -> dict[str, dict[str, Any]]:
    """Judge each ``(OutputComparison, inner path)`` of the quantised file against its float
    values (``against``: the float32 sibling or the reference) by the budget for its kind, as
    an acceptance test (``checks/acceptance.py``): PASS when the upper bound of its miss rate is
    within the budget, FAIL when the lower bound is beyond it, else inconclusive (``settle``:
    the rows drawn, ``rows_note``, ``checks/quant_rows.py``, did not settle it). Sets each
    comparison's verdict, its tolerance (the rule applied) and notes, and returns what was
    judged per output (``meta["quantized"]["parts"]["quantisation"]["outputs"]``)."""
    found: dict[str, dict[str, Any]] = {}
    for o, inner in outputs:
        q, f = flat_q.get(inner), flat_f.get(inner)
        t = None if q is None or f is None else tally(inner, q, f, budget)
        if t is None:
            continue
        q, f = np.asarray(q), np.asarray(f)
        kind, why, k = t["kind"], t["why"], t["k"]
        rows = _rows(f.shape)
        rms = relative_rms(q, f)
        d = acceptance.decide(t["observed"], t["trials"], t["rate"])
        info: dict[str, Any] = {"kind": kind, "why": why, "rows": rows, "relative_rms": rms,
                                "beyond": int(t["observed"]) if kind == REGRESSION else int(o.mismatched),
                                "elements": int(o.size), "interval": [d.lower, d.upper],
                                "confidence": 1.0 - d.alpha}
        o.notes.append(f"judged as {kind} ({why})")
        o.passed = d.verdict != acceptance.FAIL
        verdict_word = {acceptance.PASS: "passes", acceptance.FAIL: "FAILS"}.get(d.verdict, "undecided")
        if kind == CLASS_SCORES:
            agree, judged, ties = t["agree"], t["trials"], t["near_ties"]
            word = "top-1" if k == 1 else f"top-{k}"
            info.update(top_k=k, agreement=(agree / judged) if judged else None, judged_rows=judged,
                        near_ties=ties, misses=t["observed"])
            o.top1_agreement = (agree / judged) if judged else None
            o.top1_rows, o.top1_near_ties = judged, ties
            rule = (f"{word} agreement >= {budget.top1:.0%} over rows that are not near-ties, proved: the "
                    f"{1 - d.alpha:.2%} upper bound of the miss rate within {t['rate']:.1%} "
                    f"({_rule_text(d, 'row(s)')})")
            o.tolerance = Tolerance(0.0, 0.0, scale=budget.scale, min_top1=budget.top1, default=True,
                                    source=f"tflite:{variant} quantisation budget for class scores vs {against}: "
                                           f"{rule}; elements and relative RMS explain, they do not decide; {source}")
            o.notes.append(f"{word} agreement {agree} of {judged} row(s)"
                           + (f" ({ties} near-tie row(s) left out)" if ties else "")
                           + f", {_interval(d)}; {verdict_word}: {rule}")
            o.notes.append(f"relative RMS vs {against} {rms:.3g}, {o.mismatched} element(s) beyond "
                           f"{budget.scale:.3g} of scale (they explain, they do not decide)")
        else:
            rule = (f"<= {budget.beyond:.1%} of elements beyond {budget.scale:.3g} of scale, proved: the "
                    f"{1 - d.alpha:.2%} upper bound of the share within it ({_rule_text(d, 'element(s)')})")
            o.tolerance = Tolerance(0.0, 0.0, scale=budget.scale, max_mismatch_fraction=budget.beyond, default=True,
                                    source=f"tflite:{variant} quantisation budget for regression outputs vs "
                                           f"{against}: {rule}; relative RMS explains; {source}")
            o.notes.append(f"{t['observed']} of {t['trials']} element(s) beyond {budget.scale:.3g} of scale, "
                           f"{_interval(d)}; {verdict_word}: {rule}; relative RMS vs {against} {rms:.3g} "
                           "(explains, does not decide)")
        settle(o, info, d, unit=t["unit"], rows_note=rows_note)
        given = int((rows_note or {}).get("given") or 0)
        if (rows_note or {}).get("drawn") and 0 < given < rows:
            _given_alone(o, info, inner, q[:given], f[:given], budget)
        o.passed = o.passed and not o.vacuous  # a budget whose scale reaches the output's own cannot fail
        info["passed"] = o.passed
        info["verdict"] = "inconclusive" if o.inconclusive and o.passed else ("pass" if o.passed else "fail")
        if o.decision is not None:
            o.decision["verdict"] = info["verdict"]
        found[inner] = info
    return found


def _given_alone(o: Any, info: dict[str, Any], inner: str, q: np.ndarray, f: np.ndarray, budget: "Budget") -> None:
    """Judge the rows the test gave alone as well, by the same rule: rows drawn from the
    session's data must not outvote them (16 rows of 0-255 pixels fed to an int8 file
    calibrated on [-1, 1] passed once 262 in-range rows were added). Their failure stands."""
    t = tally(inner, q, f, budget)
    if t is None:
        return
    d = acceptance.decide(t["observed"], t["trials"], t["rate"])
    alone = {"unit": t["unit"], "trials": t["trials"], "observed": t["observed"], "lower": d.lower,
             "upper": d.upper, "verdict": d.verdict}
    info["given_alone"] = alone
    if o.decision is not None:
        o.decision["given_alone"] = alone
    if d.verdict == acceptance.FAIL:
        o.passed, o.inconclusive = False, None
        o.notes.append(f"FAILS on the given rows alone: {t['observed']} of {t['trials']} {t['unit']} differ, "
                       f"{_interval(d)} beyond {t['rate']:.1%} (rows drawn to decide do not outvote the rows "
                       "the test gave)")


# Whether an inconclusive decision fails the test (--modelparity-strict; the plugin sets it).
_STRICT: ContextVar[bool] = ContextVar("modelparity_inconclusive_fails", default=False)


@contextlib.contextmanager
def inconclusive_fails(strict: bool) -> Iterator[None]:
    """Within the block an inconclusive decision is a failure (``--modelparity-strict``)."""
    token = _STRICT.set(bool(strict))
    try:
        yield
    finally:
        _STRICT.reset(token)


def settle(o: Any, info: dict[str, Any], d: acceptance.Decision, *, unit: str, rows_note: Mapping | None) -> None:
    """Record the decision ``d`` on ``o`` and ``info``: rows used, observed rate, interval,
    budget, the thresholds it applied. An undecided one is inconclusive (the rows drawn up to
    the cap did not settle it), a failure under ``inconclusive_fails``."""
    note = dict(rows_note or {})
    pass_at_most, fail_from = acceptance.thresholds(d.trials, d.budget, d.alpha)
    decision = {"unit": unit, "trials": d.trials, "observed": d.observed, "rate": d.rate, "lower": d.lower,
                "upper": d.upper, "confidence": 1.0 - d.alpha, "budget_rate": d.budget,
                "pass_at_most": pass_at_most, "fail_from": fail_from, "alpha": acceptance.ALPHA,
                "looks_at_most": acceptance.MAX_LOOKS, "rows_judged": info["rows"],
                **{f"rows_{k}": v for k, v in note.items() if k in ("given", "drawn", "source", "max_rows")}}
    o.decision = decision
    info["decision"] = decision
    if d.verdict != acceptance.UNDECIDED:
        return
    why = note.get("missing") or "no more rows were drawn"
    o.inconclusive = (f"INCONCLUSIVE: {d.trials} {unit} judged, {d.observed} miss(es) ({d.rate or 0.0:.1%}), "
                      f"{_interval(d)} straddles the budget {d.budget:.1%}; {why}")
    o.notes.append(o.inconclusive + (" (a failure under --modelparity-strict)" if _STRICT.get() else ""))
    if _STRICT.get():
        o.passed = False


# -- the verdict ----------------------------------------------------------------------------

def _cost_tolerance(budget: "Budget", variant: str, against: str, source: str) -> Tolerance:
    """What ``compare`` measures the quantisation part by (elements beyond the budget's share
    of scale, counted, never failed on): ``judge_cost`` gives the verdict afterwards."""
    return Tolerance(0.0, 0.0, scale=budget.scale, max_mismatch_fraction=1.0, default=True,
                     source=f"tflite:{variant} quantisation budget vs {against} ({source})")


def two_part_report(*, quantized: Any, sibling: Any, reference: Any, variant: str,
                    conversion_tolerance: Callable[[Any, str], Tolerance], twin: Any = None,
                    equal_nan: bool = False, calibration: Mapping | None = None,
                    rows_note: Mapping | None = None) -> ComparisonReport:
    """One report whose outputs are ``['conversion']...`` (sibling vs reference, by
    ``conversion_tolerance`` keyed by the reference's paths), ``['quantisation']...``
    (quantised vs sibling, by the variant's budget for the output's kind: ``judge_cost``) and,
    for float16, ``['float16 weights']...`` (the file vs its float16 twin, by
    ``conversion_tolerance``). ``calibration``: how an int8 file's calibration rows were chosen
    (``{"rows", "source", "default"}``), said in the report, a calibration on default rows always."""
    budget, source = current_budget(variant)
    against = "the float32 sibling"
    cost_tol = _cost_tolerance(budget, variant, against, source)
    actual = {CONVERSION: sibling, COST: quantized}
    expected = {CONVERSION: reference, COST: sibling}
    if twin is not None:
        actual[FLOAT16_TWIN], expected[FLOAT16_TWIN] = quantized, twin

    def tolerance(dtype: Any, path: str) -> Tolerance:
        part, inner = _split_path(path)
        if part == COST:
            return cost_tol
        tol = conversion_tolerance(dtype, inner)
        if part == FLOAT16_TWIN:
            return tol.with_source(f"float16 file vs its float32 sibling with weights rounded to float16; {tol.source}")
        return tol

    report = compare(actual, expected, tolerance=tolerance, equal_nan=equal_nan, full_stats=True)
    judged = judge_cost([(o, _split_path(o.path)[1]) for o in report.outputs if _split_path(o.path)[0] == COST],
                        tree.flatten(quantized), tree.flatten(sibling), budget, variant, against, source, rows_note)
    parts: dict[str, dict[str, Any]] = {}
    for part in (CONVERSION, COST, FLOAT16_TWIN):
        outs = [o for o in report.outputs if _split_path(o.path)[0] == part]
        if outs:
            parts[part] = _part(outs)
    _finish_cost(parts[COST], judged, rows_note)
    _meta(report, variant, budget, source, parts, calibration, against, rows_note)
    report.meta["summary"] = summary_text(variant, parts, budget, calibration)
    return report


def alone_report(*, quantized: Any, reference: Any, variant: str, equal_nan: bool = False,
                 calibration: Mapping | None = None, rows_note: Mapping | None = None) -> ComparisonReport:
    """A quantised file with no float32 sibling, judged against the reference by the same
    budget as its quantisation part would be (conversion and quantisation together: the
    conversion of a correct file costs ~1e-6 of scale, far under any budget)."""
    budget, source = current_budget(variant)
    against = "the reference (no float32 sibling)"
    report = compare(quantized, reference, tolerance=_cost_tolerance(budget, variant, against, source),
                     equal_nan=equal_nan, full_stats=True)
    judged = judge_cost([(o, o.path) for o in report.outputs], tree.flatten(quantized), tree.flatten(reference),
                        budget, variant, against, source, rows_note)
    parts = {COST: _part(report.outputs)}
    _finish_cost(parts[COST], judged, rows_note)
    _meta(report, variant, budget, source, parts, calibration, against, rows_note)
    report.meta["summary"] = summary_text(variant, parts, budget, calibration, sibling=False)
    return report


def judged_alone(model: Any) -> bool:
    """An ``int8``/``dynamic_range`` file without a float32 sibling: judged by its budget
    against the reference. ``float16`` alone keeps the float64-floor rule (tighter: 8x what
    float16 weights cost the model)."""
    return variant_of(model) in ("int8", "dynamic_range") and getattr(model, "float_sibling", None) is None


def _part(outs: list) -> dict[str, Any]:
    return {"passed": all(o.passed for o in outs), "inconclusive": any(o.inconclusive for o in outs),
            "max_rel_of_scale": max(((o.max_abs or 0.0) / o.scale if o.scale else 0.0) for o in outs)}


def _finish_cost(cost: dict[str, Any], judged: dict[str, dict[str, Any]], rows_note: Mapping | None = None) -> None:
    if rows_note:
        cost["rows"] = dict(rows_note)
    cost["relative_rms"] = max((v["relative_rms"] for v in judged.values()), default=0.0)
    tops = [v["agreement"] for v in judged.values() if v.get("agreement") is not None]
    cost["top1_agreement"] = min(tops) if tops else None
    cost["outputs"] = judged


def _meta(report: ComparisonReport, variant: str, budget: "Budget", source: str, parts: dict,
          calibration: Mapping | None, against: str, rows_note: Mapping | None = None) -> None:
    report.meta["quantized"] = {"variant": variant, "budget": {k: getattr(budget, k) for k in _KEYS},
                                "budget_source": source, "against": against, "parts": parts,
                                "failed_parts": [p for p, v in parts.items() if not v["passed"]],
                                "inconclusive": [o.path for o in report.outputs if o.inconclusive],
                                "rows": dict(rows_note or {})}
    if calibration:
        report.meta["quantized"]["calibration"] = dict(calibration)


def _split_path(path: str) -> tuple[str, str]:
    """``"['conversion']['logits']"`` -> ``("conversion", "['logits']")``."""
    for part in (CONVERSION, COST, FLOAT16_TWIN):
        head = f"[{part!r}]"
        if path.startswith(head):
            return part, path[len(head):]
    return "", path


def relative_rms(quantized: np.ndarray, reference: np.ndarray) -> float:
    """rms(quantized - reference) / rms(reference) over finite elements (0 for a zero reference)."""
    q, r = np.asarray(quantized, np.float64), np.asarray(reference, np.float64)
    finite = np.isfinite(q) & np.isfinite(r)
    if not finite.any():
        return 0.0
    denom = float(np.sqrt(np.mean(r[finite] ** 2)))
    err = float(np.sqrt(np.mean((q[finite] - r[finite]) ** 2)))
    return err / denom if denom else (0.0 if err == 0 else float("inf"))


def _output_line(inner: str, info: dict[str, Any], budget: "Budget") -> str:
    name = inner or "output"
    d = info["decision"]
    verdict = {"pass": "passes", "fail": "FAILS"}.get(info.get("verdict", ""), "INCONCLUSIVE")
    interval = (f"{d['confidence']:.2%} interval [{d['lower']:.1%}, {d['upper']:.1%}] against budget "
                f"<= {d['budget_rate']:.1%}")
    rms = f"relative RMS {info['relative_rms']:.2g} explains"
    if info["kind"] == CLASS_SCORES:
        word = "top-1" if info["top_k"] == 1 else f"top-{info['top_k']}"
        agreement = "not judged (all near-ties)" if info["agreement"] is None else f"{info['agreement']:.1%}"
        ties = f", {info['near_ties']} near-tie(s) left out" if info["near_ties"] else ""
        return (f"{name} as class scores ({info['why']}): {word} {agreement} over {info['judged_rows']} row(s){ties}; "
                f"{d['observed']} differ ({(d['rate'] or 0.0):.1%}), {interval} ({word} >= {budget.top1:.0%}): "
                f"{verdict}; {rms}{_short(info)}")
    return (f"{name} as regression ({info['why']}): {d['observed']} of {d['trials']} element(s) beyond "
            f"{budget.scale:.3g} of scale ({(d['rate'] or 0.0):.2%}), {interval}: {verdict}; {rms}{_short(info)}")


def _short(info: dict[str, Any]) -> str:
    """What a summary line adds for a decision the rows did not settle."""
    if info.get("verdict") != "inconclusive":
        return ""
    d = info["decision"]
    return f" (undecided on {d['trials']} {d['unit']}: passes with at most {d['pass_at_most']}, fails from {d['fail_from']})"


def summary_text(variant: str, parts: dict, budget: Budget, calibration: Mapping | None = None,
                 sibling: bool = True) -> str:
    cost = parts[COST]
    word = {True: "passed", False: "FAILED"}
    head_word = "INCONCLUSIVE" if cost["passed"] and cost.get("inconclusive") else word[cost["passed"]]
    lines = []
    if sibling:
        conv = parts[CONVERSION]
        lines.append(f"judged in two parts: conversion (float32 sibling vs reference) {word[conv['passed']]}, "
                     f"{conv['max_rel_of_scale']:.2g} of scale")
        head = f"quantisation cost (tflite:{variant} vs float32 sibling)"
    else:
        lines.append(f"judged by the tflite:{variant} budget against the reference: no float32 sibling, so "
                     "conversion and quantisation are judged together (load_model(..., float_sibling=PATH) "
                     "separates them)")
        head = f"quantisation cost (tflite:{variant} vs reference)"
    lines.append(f"{head} {head_word}, max {cost['max_rel_of_scale']:.2g} of scale")
    rows = cost.get("rows") or {}
    if rows:
        lines.append(f"  judged on {rows.get('given', 0) + rows.get('drawn', 0)} row(s): {rows.get('given', 0)} given"
                     + (f", {rows['drawn']} drawn ({rows.get('source')})" if rows.get("drawn") else "")
                     + (f"; {rows['missing']}" if rows.get("missing") else ""))
    lines += [f"  {_output_line(inner, info, budget)}" for inner, info in cost.get("outputs", {}).items()]
    if FLOAT16_TWIN in parts:
        twin = parts[FLOAT16_TWIN]
        lines.append(f"float16 weights (file vs its sibling with weights rounded to float16) {word[twin['passed']]}, "
                     f"{twin['max_rel_of_scale']:.2g} of scale")
    if calibration and calibration.get("default"):
        lines.append(f"calibrated on default rows, not data: {calibration.get('rows')} {calibration.get('source')}; "
                     "a modelparity_dataset (or --modelparity-data) calibrates and judges on real rows")
    if not cost["passed"]:
        lines.append(f"quantisation alone costs more than the {variant} budget: see the costliest layers below; "
                     f"if this cost is acceptable, loosen only it with --modelparity-quant-budget="
                     f"{variant}:top1=<x> (class scores) or {variant}:beyond=<x>,scale=<x> (regression), or the "
                     "marker's quant_budget=, ini modelparity_quant_budget")
    if sibling and not parts[CONVERSION]["passed"]:
        lines.append("the float32 conversion itself differs from the reference: a conversion bug, not quantisation")
    return "\n  ".join(lines)


def float16_twin_of(sibling: Any) -> Any:
    """The float32 sibling with its weights rounded to float16, loaded (built once per sibling)."""
    twin = getattr(sibling, "float16_twin", None)
    if twin is None:
        from ..formats.tflite.quant import float16_twin_model

        twin = float16_twin_model(sibling)
        sibling.float16_twin = twin
    return twin
