"""The failure text of a comparison, built line by line.

Modelled on torch.testing (counts, greatest absolute and relative difference with the index
and the allowed value beside it) and Polygraphy (per-output tolerance, "minimum required
tolerance", the error's spread), plus what they lack: ULP distance, which rule and which
tolerance source judged, the worst elements, and a "Likely cause" section from
``report.hints``. One block per failing output, one line per passing output, and the whole
text kept to about ``max_lines`` lines however many outputs a model has.
"""

from __future__ import annotations

import math
from typing import Any

from .formatting import ceil_float, exact_float, short_float

__all__ = ["format_report", "format_output_block", "format_output_line"]


def _v(x: Any) -> str:
    """An element's value with enough digits to tell two float32 values apart."""
    if isinstance(x, float):
        return short_float(x) if x == 0 or not math.isfinite(x) else f"{x:.9g}"
    return str(x)


def _idx(index: tuple | None) -> str:
    if index is None:
        return "n/a"
    if len(index) == 1:
        return f"({index[0]},)"
    return "(" + ", ".join(str(i) for i in index) + ")"


def _name(path: str) -> str:
    return path or "output"


def _shape(shape: Any) -> str:
    return "n/a" if shape is None else str(tuple(shape))


def _tolerance_text(oc: Any) -> str:
    tol = oc.tolerance
    if tol is None:
        return "exact equality"
    if tol.rtol == 0 and tol.atol == 0 and tol.scale == 0 and tol.min_top1 is None:
        return f"exact ({tol.source})"
    return f"{tol.rule} rule, {tol.describe()}"


def format_output_line(oc: Any) -> str:
    """One line for an output: enough to see it was checked and how close it came."""
    if oc.passed:
        parts = [f"{_name(oc.path)}: ok"]
        if oc.expected_shape is not None:
            parts.append(f"{_shape(oc.expected_shape)} {oc.expected_dtype}")
        if oc.max_abs is not None:
            parts.append(f"max abs diff {short_float(oc.max_abs)}")
        if oc.mismatched:
            parts.append(f"{oc.mismatched} / {oc.size} out (allowed)")
        if oc.top1_agreement is not None:
            parts.append(f"top-1 {oc.top1_agreement:.1%}")
        if oc.tolerance is not None:
            parts.append(f"{oc.tolerance.rule if oc.tolerance.scale or oc.tolerance.rtol or oc.tolerance.atol else 'exact'}"
                         f" ({oc.tolerance.source})")
        return "  " + ", ".join(parts)
    if oc.problem:
        return f"  {_name(oc.path)}: FAILED, {oc.problem}"
    text = (f"  {_name(oc.path)}: FAILED, {oc.mismatched} / {oc.size} mismatched "
            f"({_pct(oc.mismatched, oc.size)})")
    if oc.bulk_failure and not oc.mismatched:
        text += ", the bulk of the error beyond the float noise"
    if oc.max_abs is not None:
        text += f", max abs diff {short_float(oc.max_abs)} at {_idx(oc.max_abs_index)}"
    return text


def _pct(k: int, n: int) -> str:
    if not n:
        return "0%"
    p = 100.0 * k / n
    if 0 < p < 0.1:
        return f"{p:.2g}%"
    return f"{p:.1f}%"


def format_output_block(oc: Any, *, worst: int = 3) -> list[str]:
    """The lines for one failing output."""
    head = f"{_name(oc.path)}: FAILED"
    if oc.problem:
        lines = [head, f"  {oc.problem}"]
        if oc.actual_shape is not None or oc.expected_shape is not None:
            lines.append(f"  actual {_shape(oc.actual_shape)} {oc.actual_dtype or ''}".rstrip()
                         + f", expected {_shape(oc.expected_shape)} {oc.expected_dtype or ''}".rstrip())
        lines += [f"  note: {n}" for n in oc.notes]
        return lines
    dt = oc.expected_dtype if oc.actual_dtype == oc.expected_dtype else \
        f"{oc.actual_dtype} vs {oc.expected_dtype}"
    lines = [f"{head}  shape {_shape(oc.expected_shape)}, {dt}"]
    lines.append(f"  Mismatched elements: {oc.mismatched} / {oc.size} ({_pct(oc.mismatched, oc.size)})")
    if oc.max_abs is not None:
        allowed = f" (allowed {short_float(oc.max_abs_allowed)})" if oc.max_abs_allowed is not None else ""
        lines.append(f"  Greatest absolute difference: {short_float(oc.max_abs)} at index "
                     f"{_idx(oc.max_abs_index)}{allowed}")
    if oc.max_rel is not None:
        allowed = _rel_allowed(oc.max_rel_allowed)
        lines.append(f"  Greatest relative difference: {short_float(oc.max_rel)} at index "
                     f"{_idx(oc.max_rel_index)}{allowed}")
    extra = []
    if oc.max_ulp is not None:
        extra.append(f"greatest ULP distance {short_float(oc.max_ulp, 6)}")
    if oc.mean_abs is not None:
        extra.append(f"mean absolute difference {short_float(oc.mean_abs)}")
    if oc.scale is not None and oc.tolerance is not None and oc.tolerance.scale:
        extra.append(f"max |expected| {short_float(oc.scale)}")
    if extra:
        lines.append("  " + extra[0][0].upper() + "; ".join(extra)[1:])
    tol = oc.tolerance
    # Only where elements are out of tolerance: a failure judged by top-1 agreement alone
    # (every element within bounds) has no "smallest passing" atol/rtol to offer.
    if tol is not None and oc.mismatched and (oc.min_atol is not None or oc.min_rtol is not None):
        if (oc.min_atol is not None and math.isinf(oc.min_atol)) and \
                (oc.min_rtol is None or math.isinf(oc.min_rtol)):
            lines.append("  Smallest passing tolerance: none (NaN or infinity mismatches, or a difference beyond "
                         "the largest float: no finite rtol/atol passes)")
        else:
            opts = []
            atol, rtol = _advised(oc.min_atol), _advised(oc.min_rtol)
            if atol is not None:
                opts.append(f"atol={atol} (with rtol={exact_float(tol.rtol)}"
                            f"{_vacuous_mark(oc, tol.rtol, float(atol))})")
            if rtol is not None:
                opts.append(f"rtol={rtol} (with atol={exact_float(tol.atol)}"
                            f"{_vacuous_mark(oc, float(rtol), tol.atol)})")
            if opts:
                lines.append("  Smallest passing tolerance: " + " or ".join(opts))
            else:
                lines.append("  Smallest passing tolerance: none finite (the difference is beyond the largest "
                             "float; the plugin accepts only finite rtol/atol)")
    if oc.top1_agreement is not None:
        lines.append(f"  Top-1 agreement: {oc.top1_agreement:.1%}")
    if oc.bulk_failure:
        lines.append(f"  Bulk of the error: {oc.bulk_failure}")
    lines.append(f"  Tolerance: {_tolerance_text(oc)}")
    if oc.tolerance is not None and oc.tolerance.floor_note:
        lines.append(f"  Noise floor: {oc.tolerance.floor_note}")
    if oc.worst and worst > 0:
        cells = [f"{_idx(i)} {_v(a)} vs {_v(e)}" for i, a, e in oc.worst[:worst]]
        lines.append("  Worst (index actual vs expected): " + "; ".join(cells))
    lines += [f"  note: {n}" for n in oc.notes]
    return lines


def _advised(value: float | None) -> str | None:
    """A bound the plugin accepts (finite, >= ``value``) as text, or None when there is none:
    rounding 1.797e308 up gives inf, which rtol=/atol= refuse; the exact value itself reads back."""
    if value is None or not math.isfinite(value):
        return None
    text = ceil_float(value)
    return text if math.isfinite(float(text)) else exact_float(value)


def _vacuous_mark(oc: Any, rtol: float, atol: float) -> str:
    """A suggested bound as large as the output itself passes only with allow_vacuous=True
    (``Tolerance.is_vacuous``): say so beside it."""
    scale = oc.scale
    if scale is None or not (0 < scale < math.inf) or (1.0 - rtol) * scale > atol:
        return ""
    return "; vacuous: needs allow_vacuous=True"


# A relative bound above this is no bound: |expected| is so small there that the absolute
# part (atol, scale) decides, and "allowed 5.50e+25" would only confuse.
MAX_SHOWN_REL_ALLOWED = 1e3


def _rel_allowed(value: float | None) -> str:
    if value is None:
        return ""
    if not math.isfinite(value) or value > MAX_SHOWN_REL_ALLOWED:
        return " (expected is ~0 there: only the absolute bound applies)"
    return f" (allowed {short_float(value)})"


def _hint_lines(hints: list) -> list[str]:
    if not hints:
        return []
    lines = ["Likely cause:"]
    for h in hints:
        message = getattr(h, "message", None) or str(h)
        lines.append(f"  - {message}")
        evidence = getattr(h, "evidence", None)
        if evidence:
            lines.append(f"    evidence: {evidence}")
    return lines


def format_report(report: Any, *, max_lines: int = 40) -> str:
    """The text of a ``ComparisonReport``: header, failing blocks, passing lines, hints."""
    outputs = list(report.outputs)
    failed = [o for o in outputs if not o.passed]
    passed = [o for o in outputs if o.passed]
    n = len(outputs)
    if not outputs:
        header = f"{report.title}: nothing to compare (no outputs)"
    elif failed:
        verb = "differs" if len(failed) == 1 else "differ"
        header = f"{report.title}: {len(failed)} of {n} output{'s' if n != 1 else ''} {verb}"
    else:
        header = f"{report.title}: all {n} output{'s' if n != 1 else ''} agree"
    meta = getattr(report, "meta", None) or {}
    if meta.get("summary"):
        header += f" ({meta['summary']})"
    if meta.get("alignment"):  # the assertion paired structures that differ: never silently
        header += f"\n  structures aligned: {meta['alignment']}"
    hints = _hint_lines(getattr(report, "hints", []) or [])
    budget = max(max_lines - 1 - len(hints), 6)

    body: list[str] = []
    # failing outputs: full blocks while they fit, leaving room for one line per rest
    full_blocks = [format_output_block(o) for o in failed]
    for i, block in enumerate(full_blocks):
        rest_failed = len(failed) - i - 1
        reserve = min(rest_failed, 3) + (1 if passed else 0)
        if len(body) + len(block) + reserve <= budget or i == 0:
            if len(body) + len(block) + reserve > budget:       # first block alone too long
                block = format_output_block(failed[i], worst=1)[: max(budget - reserve, 3)]
            body += block
            continue
        # no room for more full blocks: one line each, then a count
        room = budget - len(body) - (1 if passed else 0)
        remaining = failed[i:]
        if len(remaining) <= room:
            body += [format_output_line(o).strip() for o in remaining]
        else:
            shown = max(room - 1, 0)
            body += [format_output_line(o).strip() for o in remaining[:shown]]
            left = remaining[shown:]
            body.append(f"... and {len(left)} more failing outputs: "
                        + ", ".join(_name(o.path) for o in left[:8])
                        + (", ..." if len(left) > 8 else ""))
        break
    if passed:
        room = budget - len(body)
        if len(passed) <= room - (1 if failed else 0):
            if failed:
                body.append("Passed:")
            body += [format_output_line(o) for o in passed]
        else:
            worst = max((o.max_abs for o in passed if o.max_abs is not None), default=None)
            names = ", ".join(_name(o.path) for o in passed[:6]) + (", ..." if len(passed) > 6 else "")
            body.append(f"Passed: {len(passed)} outputs ({names})"
                        + (f", greatest abs diff {short_float(worst)}" if worst is not None else ""))
    return "\n".join([header, *body, *hints])
