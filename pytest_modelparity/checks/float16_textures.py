"""A ``tfjs:webgl-f16`` candidate judged in two parts: what conversion broke, what float16 textures cost.

Why two parts: with float16 textures tfjs's WebGL backend stores every op's output (every
activation) as float16 (eps 9.8e-4), so the page differs from the reference by far more than a
float32 form may; one loosened bound would let a real conversion bug through with it. The same
``model.json`` on float32 textures (the candidate's *sibling*, ``tfjs:webgl``: same page, same
kernels, same browser) separates the two:

- **conversion**: the sibling against the reference, by the default rule (the float64 floor);
- **float16 textures**: the candidate against its sibling, by a floor for float16 activations
  that knows the model: the model's own float32 error on this batch (measured by its float64
  twin, as a share of the output's scale) x eps16/eps32 (8192), at least one float16 eps.
  Rounding every op's output to a unit roundoff ``u`` moves the output by about the same
  multiple of ``u`` whatever ``u`` is (first order), so a model whose float32 error is large (a
  deep or ill-conditioned net) is allowed a larger float16 cost, a shallow one a smaller one.
  Allowed: ``FLOAT16_MULTIPLE`` x that floor, and for class scores the decision (top-1) must
  agree on ``TOP1`` of the rows (one row may flip on a small batch). Without a twin: a fixed
  ``FALLBACK_SCALE`` of scale, said in the report.

Measured by ``bench/browser_drift.py`` (docs/tfjs.md "In a browser"). Reported like a quantised
variant (``report.meta["quantized"]``, the JSON row's ``quantized``). Nothing here imports
TensorFlow; the assertion calls :func:`two_part_report` (``checks/assertions.py``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping

import numpy as np

from ..verdict import tree
from ..verdict.compare import ComparisonReport, compare
from ..verdict.tolerances import Tolerance
from .quantized import relative_rms

FORMAT = "tfjs:webgl-f16"
SIBLING_FORMAT = "tfjs:webgl"
CONVERSION = "conversion"
COST = "float16 textures"
EPS16 = float(np.finfo(np.float16).eps)
EPS_RATIO = EPS16 / float(np.finfo(np.float32).eps)  # 8192
FLOAT16_MULTIPLE = 2.0
FALLBACK_SCALE = 5e-2
TOP1 = 0.97


def sibling_of(model: Any) -> Any:
    """The ``tfjs:webgl`` (float32 textures) sibling attached to a ``tfjs:webgl-f16`` candidate, else None."""
    if str(getattr(model, "format_variant", "") or "") != FORMAT:
        return None
    return getattr(model, "float_sibling", None)


def float16_floor(float32_error: float) -> float:
    """What float16 activations should cost an output (share of its scale), from its float32 error."""
    return max(float(float32_error) * EPS_RATIO, EPS16)


def cost_tolerance(float32_error: float | None, shape: tuple[int, ...], missing: str | None = None) -> Tolerance:
    """The bound of the float16-textures part for one output of ``shape``."""
    if float32_error is None:
        tol = Tolerance(0.0, 0.0, scale=FALLBACK_SCALE, min_top1=TOP1, default=True,
                        source=f"fixed float16-textures bound {FALLBACK_SCALE:g} of scale vs float32 textures "
                               f"(no float64 twin measured the model{': ' + missing if missing else ''})")
    else:
        floor = float16_floor(float32_error)
        tol = Tolerance(0.0, 0.0, scale=FLOAT16_MULTIPLE * floor, min_top1=TOP1, default=True,
                        source=f"{FLOAT16_MULTIPLE:g} x the float16-activation floor {floor:.2g} of scale vs float32 "
                               f"textures (the model's own float32 error {float32_error:.2g}, measured by its float64 "
                               f"twin, x eps16/eps32 = {EPS_RATIO:g})")
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    if len(shape) < 1 or not shape[-1] or rows < 2:
        return replace(tol, min_top1=None)
    return replace(tol, min_top1=min(TOP1, (rows - 1) / rows))  # one row may flip


def _split(path: str) -> tuple[str, str]:
    for part in (CONVERSION, COST):
        head = f"[{part!r}]"
        if path.startswith(head):
            return part, path[len(head):]
    return "", path


def two_part_report(*, textures: Any, sibling: Any, reference: Any,
                    conversion_tolerance: Callable[[Any, str], Tolerance],
                    float32_errors: Mapping[str, float] | None, missing: str | None = None,
                    equal_nan: bool = False) -> ComparisonReport:
    """One report whose outputs are ``['conversion']...`` (float32 textures vs the reference, by
    ``conversion_tolerance``) and ``['float16 textures']...`` (float16 vs float32 textures, by
    :func:`cost_tolerance`). ``float32_errors``: the reference's own float32 error per output
    path (the float64 twin's measure), or None when no twin measured it (``missing`` says why)."""
    flat = tree.flatten(textures)

    def tolerance(dtype: Any, path: str) -> Tolerance:
        part, inner = _split(path)
        if part == COST:
            err = (float32_errors or {}).get(inner)
            return cost_tolerance(err, tuple(np.shape(flat.get(inner, ()))), missing)
        return conversion_tolerance(dtype, inner)

    report = compare({CONVERSION: sibling, COST: textures}, {CONVERSION: reference, COST: sibling},
                     tolerance=tolerance, equal_nan=equal_nan, full_stats=True)
    flat_s = tree.flatten(sibling)
    parts: dict[str, dict[str, Any]] = {}
    for part in (CONVERSION, COST):
        outs = [o for o in report.outputs if _split(o.path)[0] == part]
        if outs:
            parts[part] = {"passed": all(o.passed for o in outs),
                           "max_rel_of_scale": max(((o.max_abs or 0.0) / o.scale if o.scale else 0.0) for o in outs)}
    cost = parts.get(COST, {})
    rms = []
    for o in report.outputs:
        part, inner = _split(o.path)
        if part == COST and inner in flat and inner in flat_s and np.asarray(flat[inner]).dtype.kind == "f":
            rms.append(relative_rms(flat[inner], flat_s[inner]))
            o.notes.append(f"relative RMS vs float32 textures {rms[-1]:.3g}")
    cost["relative_rms"] = max(rms, default=0.0)
    tops = [o.top1_agreement for o in report.outputs if _split(o.path)[0] == COST and o.top1_agreement is not None]
    cost["top1_agreement"] = min(tops) if tops else None
    report.meta["quantized"] = {"variant": "webgl-f16", "format": FORMAT, "sibling": SIBLING_FORMAT, "parts": parts,
                                "failed_parts": [p for p, v in parts.items() if not v["passed"]],
                                "float32_errors": dict(float32_errors or {})}
    report.meta["summary"] = summary_text(parts)
    return report


def summary_text(parts: dict[str, dict[str, Any]]) -> str:
    word = {True: "passed", False: "FAILED"}
    conv, cost = parts.get(CONVERSION, {}), parts.get(COST, {})
    top1 = f", top-1 {cost['top1_agreement']:.1%}" if cost.get("top1_agreement") is not None else ""
    lines = [f"judged in two parts: conversion ({SIBLING_FORMAT}, float32 textures, vs reference) "
             f"{word[conv.get('passed', True)]}, {conv.get('max_rel_of_scale', 0.0):.2g} of scale",
             f"float16 textures ({FORMAT} vs {SIBLING_FORMAT}) {word[cost.get('passed', True)]}: max "
             f"{cost.get('max_rel_of_scale', 0.0):.2g} of scale, relative RMS {cost.get('relative_rms', 0.0):.2g}{top1}"]
    if not conv.get("passed", True):
        lines.append("the model differs from the reference on float32 textures already: a conversion (or model) "
                     "bug, not float16 storage")
    elif not cost.get("passed", True):
        lines.append("float16 activations alone cost this model more than its float16 floor: it is not safe on "
                     "devices without float32 render targets; keep activations in range (normalise inputs, avoid "
                     "large intermediate sums) or give the test an explicit tolerance")
    return "\n  ".join(lines)
