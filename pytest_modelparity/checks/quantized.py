"""A quantised TFLite candidate judged in two parts: what conversion broke, what quantisation cost.

Why two parts: a quantised file differs from its reference for two reasons that call for
different fixes. On twelve Keras Applications nets every ``int8``/``dynamic_range`` failure
was what quantisation costs (a plain TFLiteConverter gave the same error), and one fixed
bound could not tell it from a conversion bug (notes/quantization.md). The float32 TFLite
file of the same source (its *sibling*: same graph, same op names) separates them:

- **conversion**: the sibling against the reference, by the float64 floor (the default rule
  ``assert_outputs_close`` uses for float32 forms);
- **quantisation cost**: the quantised file against its sibling, by a budget per variant
  (relative RMS, share of elements beyond a share of the output's scale, top-1 agreement
  over rows that are not near-ties). Defaults measured on trained models
  (docs/tolerances.md "Quantised forms"); ``--modelparity-quant-budget``, the marker's
  ``quant_budget=`` or the ini key loosen one variant's budget without touching conversion.
- ``tflite:float16`` adds a third line: the file against its sibling with weights rounded to
  float16 (``formats.tflite_quant.float16_twin``), by the float64 floor: float16 weights
  cost 0.2-0.9 of the output's scale on some deep nets, more than a kernel x1.01 moves it,
  but the twin rounds exactly what the file rounded, so only a real difference shows.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import math
from contextvars import ContextVar
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Iterator, Mapping

import numpy as np

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
    """What quantisation may cost an output, against the float32 sibling."""

    rms: float        # rms(quantised - float) / rms(float), per output
    scale: float      # an element is "beyond" when |quantised - float| > scale x max|float|
    beyond: float     # share of elements allowed beyond
    top1: float       # top-1 agreement over rows whose float top-1 is not a near-tie

    def describe(self) -> str:
        return (f"relative RMS <= {self.rms:.3g}, <= {self.beyond:.1%} of elements beyond {self.scale:.3g} "
                f"of scale, top-1 >= {self.top1:.0%}")


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


# -- the verdict ----------------------------------------------------------------------------

def two_part_report(*, quantized: Any, sibling: Any, reference: Any, variant: str,
                    conversion_tolerance: Callable[[Any, str], Tolerance], twin: Any = None,
                    equal_nan: bool = False, calibration: Mapping | None = None) -> ComparisonReport:
    """One report whose outputs are ``['conversion']...`` (sibling vs reference, by
    ``conversion_tolerance`` keyed by the reference's paths), ``['quantisation']...``
    (quantised vs sibling, by the variant's budget) and, for float16, ``['float16 weights']...``
    (the file vs its float16 twin, by ``conversion_tolerance``). ``calibration``: how an
    int8 file's calibration rows were chosen (``{"rows", "source", "default"}``), said in the
    report, a calibration on default rows always."""
    budget, source = current_budget(variant)
    cost_tol = Tolerance(0.0, 0.0, scale=budget.scale, min_top1=budget.top1, max_mismatch_fraction=budget.beyond,
                         source=f"tflite:{variant} quantisation budget vs the float32 sibling ({source})",
                         default=True)
    actual = {CONVERSION: sibling, COST: quantized}
    expected = {CONVERSION: reference, COST: sibling}
    if twin is not None:
        actual[FLOAT16_TWIN], expected[FLOAT16_TWIN] = quantized, twin

    flat_q = tree.flatten(quantized)

    def tolerance(dtype: Any, path: str) -> Tolerance:
        part, inner = _split_path(path)
        if part == COST:
            return _one_row_may_flip(cost_tol, flat_q.get(inner))
        tol = conversion_tolerance(dtype, inner)
        if part == FLOAT16_TWIN:
            return tol.with_source(f"float16 file vs its float32 sibling with weights rounded to float16; {tol.source}")
        return tol

    report = compare(actual, expected, tolerance=tolerance, equal_nan=equal_nan, full_stats=True)
    rms = _apply_rms(report, quantized, sibling, budget)
    parts: dict[str, dict[str, Any]] = {}
    for part in (CONVERSION, COST, FLOAT16_TWIN):
        outs = [o for o in report.outputs if _split_path(o.path)[0] == part]
        if outs:
            parts[part] = {"passed": all(o.passed for o in outs),
                           "max_rel_of_scale": max(((o.max_abs or 0.0) / o.scale if o.scale else 0.0) for o in outs)}
    cost = parts[COST]
    cost["relative_rms"] = max(rms.values(), default=0.0)
    tops = [o.top1_agreement for o in report.outputs if _split_path(o.path)[0] == COST and o.top1_agreement is not None]
    cost["top1_agreement"] = min(tops) if tops else None
    report.meta["quantized"] = {"variant": variant, "budget": {k: getattr(budget, k) for k in _KEYS},
                                "budget_source": source, "parts": parts,
                                "failed_parts": [p for p, v in parts.items() if not v["passed"]]}
    if calibration:
        report.meta["quantized"]["calibration"] = dict(calibration)
    report.meta["summary"] = summary_text(variant, parts, budget, calibration)
    return report


def _one_row_may_flip(tol: Tolerance, output: Any) -> Tolerance:
    """One row whose top-1 differs is not evidence on a small batch (on 4 rows it is 25%):
    the required agreement is at most (rows - 1) / rows, so a failure takes two rows."""
    shape: tuple[int, ...] = tuple(np.shape(output)) if output is not None else ()
    if tol.min_top1 is None or len(shape) < 1 or not shape[-1]:
        return tol
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    if rows < 2:
        return replace(tol, min_top1=None)
    return replace(tol, min_top1=min(tol.min_top1, (rows - 1) / rows))


def _split_path(path: str) -> tuple[str, str]:
    """``"['conversion']['logits']"`` -> ``("conversion", "['logits']")``."""
    for part in (CONVERSION, COST, FLOAT16_TWIN):
        head = f"[{part!r}]"
        if path.startswith(head):
            return part, path[len(head):]
    return "", path


def _apply_rms(report: ComparisonReport, quantized: Any, sibling: Any, budget: Budget) -> dict[str, float]:
    """Fail each quantisation output whose relative RMS exceeds the budget (noted on it)."""
    flat_q, flat_s = tree.flatten(quantized), tree.flatten(sibling)
    found = {}
    for o in report.outputs:
        part, inner = _split_path(o.path)
        if part != COST or inner not in flat_q or inner not in flat_s:
            continue
        q, s = np.asarray(flat_q[inner], np.float64), np.asarray(flat_s[inner], np.float64)
        if q.shape != s.shape or q.dtype.kind not in "fc" or not q.size:
            continue
        value = relative_rms(q, s)
        found[o.path] = value
        o.notes.append(f"relative RMS vs the float32 sibling {value:.3g} (budget {budget.rms:.3g})")
        if value > budget.rms:
            o.passed = False
    return found


def relative_rms(quantized: np.ndarray, reference: np.ndarray) -> float:
    """rms(quantized - reference) / rms(reference) over finite elements (0 for a zero reference)."""
    q, r = np.asarray(quantized, np.float64), np.asarray(reference, np.float64)
    finite = np.isfinite(q) & np.isfinite(r)
    if not finite.any():
        return 0.0
    denom = float(np.sqrt(np.mean(r[finite] ** 2)))
    err = float(np.sqrt(np.mean((q[finite] - r[finite]) ** 2)))
    return err / denom if denom else (0.0 if err == 0 else float("inf"))


def summary_text(variant: str, parts: dict, budget: Budget, calibration: Mapping | None = None) -> str:
    conv = parts[CONVERSION]
    cost = parts[COST]
    word = {True: "passed", False: "FAILED"}
    lines = [f"judged in two parts: conversion (float32 sibling vs reference) {word[conv['passed']]}, "
             f"{conv['max_rel_of_scale']:.2g} of scale"]
    top1 = f", top-1 {cost['top1_agreement']:.1%}" if cost.get("top1_agreement") is not None else ""
    lines.append(f"quantisation cost (tflite:{variant} vs float32 sibling) {word[cost['passed']]}: relative RMS "
                 f"{cost['relative_rms']:.2g}, max {cost['max_rel_of_scale']:.2g} of scale{top1}; "
                 f"budget {budget.describe()}")
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
                     f"{variant}:rms=<x> (or the marker's quant_budget=, ini modelparity_quant_budget)")
    if not conv["passed"]:
        lines.append("the float32 conversion itself differs from the reference: a conversion bug, not quantisation")
    return "\n  ".join(lines)


def float16_twin_of(sibling: Any) -> Any:
    """The float32 sibling with its weights rounded to float16, loaded (built once per sibling)."""
    twin = getattr(sibling, "float16_twin", None)
    if twin is None:
        from ..formats.tflite_quant import float16_twin_model

        twin = float16_twin_model(sibling)
        sibling.float16_twin = twin
    return twin
