"""The ``--modelparity-html`` page: one self-contained file, readable offline.

Inline CSS and inline SVG only: no script, no font, no image or stylesheet from anywhere
else (a report is often opened from a CI artifact on a machine without network access, and
a page that fetches nothing also leaks nothing). Built from the same document as the JSON.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any, Sequence

from ..verdict.formatting import table_number
from .summary import device_label, write_text_atomic

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:16px 16px;color:#1b1f24;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:24px 0 8px}
.meta{color:#57606a;margin-bottom:12px} .meta code{background:#f3f4f6;padding:1px 4px;border-radius:3px}
.counts span{display:inline-block;margin-right:14px;font-weight:600}
.pass{color:#1a7f37} .fail{color:#cf222e} .expected{color:#57606a} .inconclusive{color:#9a6700}
table{border-collapse:collapse;width:100%;margin-top:8px}
th,td{border-bottom:1px solid #d0d7de;padding:3px 5px;text-align:left;vertical-align:top;white-space:nowrap}
th{background:#f6f8fa;position:sticky;top:0}
td.num{text-align:right;font-variant-numeric:tabular-nums}
td.test,td.out{max-width:22em;overflow:hidden;text-overflow:ellipsis}
td.out{max-width:10em}
td.test,td.out{white-space:normal;overflow-wrap:anywhere}
tr.fail td{background:#fff5f5} tr.fail td.test{white-space:normal;overflow-wrap:anywhere}
td.bound svg{display:inline-block;vertical-align:middle;margin-left:6px}
td.bound span.r{display:inline-block;min-width:4.5em}
details>summary{cursor:pointer;color:#57606a;font-size:12px}
details>div{white-space:normal;max-width:28em;padding:2px 0 4px;overflow-wrap:anywhere}
.small{font-size:12px;color:#57606a} ul.hints{margin:2px 0 0 16px;padding:0;color:#9a6700;white-space:normal}
ul.hints pre{font-size:11px;color:#24292f;max-width:40em}
pre{white-space:pre-wrap;overflow-wrap:anywhere;margin:2px 0} code{overflow-wrap:anywhere}
.meta,li{overflow-wrap:anywhere} tr.fail td{white-space:normal} td.model{max-width:14em;white-space:normal}
h3{font-size:15px;margin:14px 0 4px} ul.tests,ul.unchecked{margin:4px 0;padding-left:20px} ul.tests li,ul.unchecked li{margin:3px 0}
.model{color:#8250df;font-weight:600}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def histogram_svg(hist: dict | None, *, width: int = 200, height: int = 64, failed: bool = False) -> str:
    """Bars of the |actual - expected| histogram over log10 bins, as inline SVG markup."""
    if not hist or not hist.get("counts"):
        return '<span class="small">no error (bitwise equal) or not measured</span>'
    counts = [int(c) for c in hist["counts"]]
    edges = [e if isinstance(e, (int, float)) else float("nan") for e in hist.get("log10_edges") or []]
    top = max(counts) or 1
    pad_b, pad_l = 16, 4
    bar_w = (width - pad_l * 2) / len(counts)
    color = "#cf222e" if failed else "#0969da"
    parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="error histogram">',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="#f6f8fa"/>']
    for i, c in enumerate(counts):
        if c <= 0:
            continue
        h = max(1.0, (height - pad_b - 4) * math.log1p(c) / math.log1p(top))
        x = pad_l + i * bar_w
        lo = edges[i] if i < len(edges) else float("nan")
        hi = edges[i + 1] if i + 1 < len(edges) else float("nan")
        parts.append(f'<rect x="{x:.1f}" y="{height - pad_b - h:.1f}" width="{max(bar_w - 1, 1):.1f}" '
                     f'height="{h:.1f}" fill="{color}"><title>{c} element(s) with |a-e| in '
                     f'[1e{lo:.1f}, 1e{hi:.1f})</title></rect>')
    if edges:
        first, last = edges[0], edges[-1]
        parts.append(f'<text x="{pad_l}" y="{height - 3}" font-size="10" fill="#57606a">1e{first:.0f}</text>')
        parts.append(f'<text x="{width - pad_l}" y="{height - 3}" font-size="10" fill="#57606a" '
                     f'text-anchor="end">1e{last:.0f}</text>')
        parts.append(f'<text x="{width / 2:.0f}" y="{height - 3}" font-size="10" fill="#57606a" '
                     'text-anchor="middle">|actual - expected| (log)</text>')
    parts.append("</svg>")
    return "".join(parts)


_VERDICT_CLASS = {"fail": "fail", "expected": "expected", "pass": "pass", "inconclusive": "inconclusive"}

# The error/bound bar's log10 span: 1e-4 of the bound (far inside) to 100x it (far outside).
_LOW, _HIGH = -4.0, 2.0


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def bound_ratio(row: dict) -> tuple[float, float] | None:
    """``(max |a - e|, the bound at the output's largest |expected|)``: atol + (rtol + scale)
    x max|e|, the most any element may differ. None where the row has no such bound (a
    decision over rows, a structure problem, an exact dtype)."""
    err, scale = _num(row.get("max_abs")), _num(row.get("output_scale"))
    rtol, atol, k = (_num(row.get(key)) or 0.0 for key in ("rtol", "atol", "scale"))
    if err is None or not math.isfinite(err):
        return None
    bound = atol + (rtol + k) * (scale or 0.0)
    return (err, bound) if bound > 0 and math.isfinite(bound) else None


def bound_svg(row: dict, *, width: int = 120, height: int = 12) -> str:
    """One bar per output: max error against its bound on a log scale (1e-4 .. 100 x the
    bound), with a tick at the bound: where a row sits is visible without reading numbers."""
    pair = bound_ratio(row)
    if pair is None:
        return '<span class="small">-</span>'
    err, bound = pair
    ratio = err / bound
    pos = (min(max(math.log10(ratio), _LOW), _HIGH) - _LOW) / (_HIGH - _LOW) if ratio > 0 else 0.0
    tick = -_LOW / (_HIGH - _LOW) * width
    over = ratio > 1 or str(row.get("verdict")) == "fail"
    color = "#cf222e" if over else "#2da44e"
    text = (f"max |actual - expected| {err:.3g} = {ratio:.3g} x the bound {bound:.3g} "
            "(atol + (rtol + scale) x max|expected|); bar: log scale, 1e-4 to 100 x the bound")
    return (f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="error against bound"><title>{_e(text)}</title>'
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#f6f8fa"/>'
            f'<rect x="0" y="2" width="{max(pos * width, 1.0):.1f}" height="{height - 4}" fill="{color}"/>'
            f'<line x1="{tick:.1f}" y1="0" x2="{tick:.1f}" y2="{height}" stroke="#24292f" stroke-width="1"/></svg>')


def _ratio_text(row: dict) -> str:
    pair = bound_ratio(row)
    return "-" if pair is None else f"{pair[0] / pair[1]:.2g}" if pair[0] else "0"


def _row_html(row: dict) -> str:
    """One line for a passing row (the tolerance, histogram and notes folded in a
    ``<details>``); a failing row opens them and shows its hints under the test's name."""
    verdict = str(row.get("verdict") or "pass")
    failed = verdict == "fail"
    where, _, test = row["nodeid"].rpartition("::")
    evidence = row.get("hint_evidence") or []
    hints = "".join(
        f"<li>{_e(h)}" + (f"<details><summary>evidence</summary><pre>{_e(evidence[i])}</pre></details>"
                          if i < len(evidence) and evidence[i] else "") + "</li>"
        for i, h in enumerate(row.get("hints") or []))
    problem = f'<div class="fail">{_e(row["problem"])}</div>' if row.get("problem") else ""
    # every note the comparison made (e.g. the top-1 agreement an int8 row failed on)
    notes = "".join(f'<div class="small note">{_e(n)}</div>' for n in row.get("notes") or [])
    because = (f'<div class="small">{_e(row["expected_because"])}</div>'
               if verdict == "expected" and row.get("expected_because") else "")
    calibration = f'<div class="small">{_e(row["calibration"])}</div>' if row.get("calibration") else ""
    runs = row.get("runs") or 1
    runs_txt = f'<div class="small">worst of {runs} comparisons</div>' if runs > 1 else ""
    heading = (f'<div class="small">{_e(where)}</div><div class="small">{_e(row.get("title"))}</div>'
               f'{f"<ul class=hints>{hints}</ul>" if hints else ""}' if failed else "")
    more = (f'<details{" open" if failed or problem else ""}><summary>tolerance, histogram</summary><div>'
            f'{problem}{because}<div class="small tol">{_e(row.get("tolerance") or "-")}</div>'
            f'<div class="small">max rel {table_number(row.get("max_rel"))}, max ULP '
            f'{table_number(row.get("max_ulp"), ".4g")}; {_e(row.get("title"))}</div>{runs_txt}{notes}{calibration}'
            f'{histogram_svg(row.get("error_histogram"), failed=failed)}</div></details>')
    cells = [
        f'<td class="{_VERDICT_CLASS.get(verdict, "pass")}"><b>{_e(verdict.upper())}</b></td>',
        f'<td class="test" title="{_e(row["nodeid"])}"><b>{_e(test)}</b>{heading}</td>',
        f'<td class="model">{_model_html(row.get("model")) or "-"}</td>',
        f"<td>{_e(row.get('format') or '-')}</td>",
        f"<td>{_e(device_label(row))}</td>",
        f"<td>{_e(row.get('check'))}</td>",
        f'<td class="out" title="{_e(row.get("output"))}"><code>{_e(row.get("output") or "-")}</code></td>',
        f'<td class="num">{table_number(row.get("max_abs"))}</td>',
        f'<td class="num bound"><span class="r">{_ratio_text(row)}</span>{bound_svg(row)}</td>',
        f"<td>{more}</td>",
    ]
    return f'<tr class="{_VERDICT_CLASS.get(verdict, "pass")}">{"".join(cells)}</tr>'


def _model_html(model: Any) -> str:
    return f'<span class="model">{_e(model)}</span>' if model else ""


# The groups of tests that did not pass, in the order a reader fixes them: what broke before a
# check ran, what a check failed, what was not checked.
_GROUPS = (("error", "Errors", "fail", "the test could not run its check (setup or teardown failed)"),
           ("failed", "Failures", "fail", "a check failed"),
           ("xpassed", "Unexpected passes", "fail", "marked xfail, passed"),
           ("skipped", "Skipped", "expected", "not checked, with the reason"))


def _not_passed_html(tests: Sequence[dict]) -> str:
    """The tests that errored, failed or were skipped, grouped so (not interleaved), each with
    its model and its reason, which wraps at the page's width."""
    sections = []
    for outcome, title, css, what in _GROUPS:
        items = [t for t in tests if t.get("outcome") == outcome]
        if not items:
            continue
        lis = []
        for t in items:
            reason = f'<pre class="small">{_e(t["reason"])}</pre>' if t.get("reason") else ""
            model = f" {_model_html(t.get('model'))}" if t.get("model") else ""
            lis.append(f'<li><b class="{css}">{_e(outcome.upper())}</b>{model} <code>{_e(t.get("nodeid"))}</code>'
                       f"{reason}</li>")
        sections.append(f'<h3 id="{outcome}">{title} ({len(items)}) <span class="small">{_e(what)}</span></h3>'
                        f'<ul class="tests {outcome}">{"".join(lis)}</ul>')
    if not sections:
        return ""
    return f'<h2>Tests that did not pass</h2>{"".join(sections)}'


def _not_compared_html(found: Sequence[dict]) -> str:
    """The formats a run meant to compare and did not (the terminal's NOT COMPARED lines), per
    model: one model's formats are together, and each line names its model."""
    if not found:
        return ""
    by_model: dict[str, list[dict]] = {}
    for n in found:
        by_model.setdefault(str(n.get("model") or ""), []).append(n)
    lis = []
    for model, items in by_model.items():
        for n in items:
            who = model and f" for {_model_html(model)}"
            lis.append(f'<li><b>NOT COMPARED</b>: <code>{_e(n.get("format"))}</code>{who} '
                       f'<span class="small">({_e(n.get("named_by"))})</span><pre class="small">{_e(n.get("reason"))}'
                       "</pre></li>")
    return (f'<h2>Not compared ({len(found)})</h2><p class="small">Formats this run was meant to compare and did '
            f'not, per model (docs/plugin.md, "What was not compared").</p><ul class="unchecked">{"".join(lis)}</ul>')


_HEADER = ("verdict", "test", "model", "format", "device", "check", "output", "max abs",
           '<span title="max |actual - expected| / (atol + (rtol + scale) x max|expected|): under 1 passes">error / bound</span>',
           "details")


def render_html(document: dict) -> str:
    rows: Sequence[dict] = document.get("rows", [])
    env = document.get("environment", {})
    packages = ", ".join(f"{k} {v}" for k, v in (env.get("packages") or {}).items() if v)
    tests = document.get("tests", [])
    outcomes: dict[str, int] = {}
    for t in tests:
        outcomes[t.get("outcome", "?")] = outcomes.get(t.get("outcome", "?"), 0) + 1
    outcome_txt = ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items()))
    verdicts: dict[str, int] = {}
    for r in rows:
        verdicts[str(r.get("verdict"))] = verdicts.get(str(r.get("verdict")), 0) + 1
    header = "".join(f"<th>{h}</th>" for h in _HEADER)
    # Failing comparisons first: they are what a reader opens the page for.
    ordered = sorted(rows, key=lambda r: {"fail": 0, "inconclusive": 1, "expected": 2}.get(str(r.get("verdict")), 3))
    body = "\n".join(_row_html(r) for r in ordered) or f'<tr><td colspan="{len(_HEADER)}">no comparisons were made</td></tr>'
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Model parity report</title><style>{_CSS}</style></head>
<body>
<h1>Model parity report</h1>
<div class="meta">{_e(document.get("created"))} &middot; Python {_e(env.get("python"))} &middot;
{_e(packages)}{" &middot; Node.js " + _e(env.get("node")) if env.get("node") else ""}</div>
<div class="counts"><span>tests: {_e(outcome_txt) or "none"}</span>
<span>{len(rows)} outputs compared:</span>
<span class="pass">{verdicts.get("pass", 0)} pass</span>
<span class="fail">{verdicts.get("fail", 0)} fail</span>
{f'<span class="expected">{verdicts["expected"]} failed as expected</span>' if verdicts.get("expected") else ""}
{f'<span class="inconclusive">{verdicts["inconclusive"]} inconclusive (too few rows to decide)</span>' if verdicts.get("inconclusive") else ""}</div>
{_not_passed_html(tests)}
{_not_compared_html(document.get("not_compared") or [])}
<h2>Comparisons</h2>
<table><thead><tr>{header}</tr></thead><tbody>
{body}
</tbody></table>
<p class="small">One row per output of each comparison made by a test (a <code>@given</code> test shows its
worst example); a passing row is one line, its tolerance and error histogram folded under "details".
Error / bound: the largest |actual - expected| over the bound at the output's largest |expected|, with a bar on a
log scale from 1e-4 to 100 times the bound (the tick is the bound). Tolerance: |actual - expected| &le; atol + rtol&middot;|expected| (+ scale&middot;max|expected| for
the scaled rule). Schema of the JSON twin: docs/report-schema.md.</p>
</body></html>
"""


def write_html(path: Path, document: dict) -> Path:
    """The HTML report, written atomically (nothing left behind when writing fails)."""
    return write_text_atomic(path, render_html(document))
