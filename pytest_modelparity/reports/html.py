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
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1b1f24;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px}
.meta{color:#57606a;margin-bottom:16px} .meta code{background:#f3f4f6;padding:1px 4px;border-radius:3px}
.counts span{display:inline-block;margin-right:14px;font-weight:600}
.pass{color:#1a7f37} .fail{color:#cf222e} .expected{color:#57606a} .inconclusive{color:#9a6700}
table{border-collapse:collapse;width:100%;margin-top:8px}
th,td{border-bottom:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:middle}
th{background:#f6f8fa;position:sticky;top:0;white-space:nowrap}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap} td code{white-space:nowrap}
td.test{min-width:16em;max-width:30em;overflow-wrap:anywhere} td.tol{max-width:18em}
tr.fail td{background:#fff5f5} td.hist svg{display:block}
.small{font-size:12px;color:#57606a} ul.hints{margin:2px 0 0 16px;padding:0;color:#9a6700}
ul.hints pre{font-size:11px;color:#24292f;white-space:pre;overflow-x:auto;max-width:28em;margin:2px 0}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def histogram_svg(hist: dict | None, *, width: int = 220, height: int = 64, failed: bool = False) -> str:
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


def _row_html(row: dict) -> str:
    verdict = str(row.get("verdict") or "pass")
    failed = verdict == "fail"
    where, _, test = row["nodeid"].rpartition("::")
    evidence = row.get("hint_evidence") or []
    hints = "".join(
        f"<li>{_e(h)}" + (f"<details><summary>evidence</summary><pre>{_e(evidence[i])}</pre></details>"
                          if i < len(evidence) and evidence[i] else "") + "</li>"
        for i, h in enumerate(row.get("hints") or []))
    problem = f'<div class="small fail">{_e(row["problem"])}</div>' if row.get("problem") else ""
    # every note the comparison made (e.g. the top-1 agreement an int8 row failed on)
    notes = "".join(f'<div class="small note">{_e(n)}</div>' for n in row.get("notes") or [])
    because = (f'<div class="small">{_e(row["expected_because"])}</div>'
               if verdict == "expected" and row.get("expected_because") else "")
    calibration = f'<div class="small">{_e(row["calibration"])}</div>' if row.get("calibration") else ""
    runs = row.get("runs") or 1
    runs_txt = f'<div class="small">worst of {runs} comparisons</div>' if runs > 1 else ""
    cells = [
        f'<td class="test"><div><b>{_e(test)}</b></div><div class="small">{_e(where)}</div>'
        f'<div class="small">{_e(row.get("title"))}</div>{runs_txt}'
        f'{f"<ul class=hints>{hints}</ul>" if hints else ""}</td>',
        f"<td>{_e(row.get('format') or '-')}</td>",
        f"<td>{_e(device_label(row))}</td>",
        f"<td>{_e(row.get('check'))}</td>",
        f"<td><code>{_e(row.get('output') or '-')}</code>{problem}{notes}{calibration}</td>",
        f'<td class="{_VERDICT_CLASS.get(verdict, "pass")}"><b>{_e(verdict.upper())}</b>{because}</td>',
        f'<td class="num">{table_number(row.get("max_abs"))}</td>',
        f'<td class="num">{table_number(row.get("max_rel"))}</td>',
        f'<td class="num">{table_number(row.get("max_ulp"), ".4g")}</td>',
        f'<td class="small tol">{_e(row.get("tolerance") or "-")}</td>',
        f'<td class="hist">{histogram_svg(row.get("error_histogram"), failed=failed)}</td>',
    ]
    return f'<tr class="{_VERDICT_CLASS.get(verdict, "pass")}">{"".join(cells)}</tr>'


def _not_passed_html(tests: Sequence[dict]) -> str:
    """The tests that failed, errored or were skipped, each with its reason."""
    items = [t for t in tests if t.get("outcome") in ("failed", "error", "skipped", "xpassed")]
    if not items:
        return ""
    lis = []
    for t in items:
        css = "fail" if t["outcome"] in ("failed", "error") else "expected"
        reason = f'<pre class="small">{_e(t["reason"])}</pre>' if t.get("reason") else ""
        lis.append(f'<li><b class="{css}">{_e(t["outcome"].upper())}</b> <code>{_e(t.get("nodeid"))}</code>{reason}</li>')
    return f'<h2>Tests that did not pass</h2><ul class="tests">{"".join(lis)}</ul>'


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
    header = "".join(f"<th>{h}</th>" for h in ("test", "format", "device", "check", "output", "verdict",
                                                "max abs", "max rel", "max ULP", "tolerance", "error histogram"))
    # Failing comparisons first: they are what a reader opens the page for.
    ordered = sorted(rows, key=lambda r: {"fail": 0, "inconclusive": 1, "expected": 2}.get(str(r.get("verdict")), 3))
    body = "\n".join(_row_html(r) for r in ordered) or '<tr><td colspan="11">no comparisons were made</td></tr>'
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
<h2>Comparisons</h2>
<table><thead><tr>{header}</tr></thead><tbody>
{body}
</tbody></table>
<p class="small">One row per output of each comparison made by a test (a <code>@given</code> test shows its
worst example). Tolerance: |actual - expected| &le; atol + rtol&middot;|expected| (+ scale&middot;max|expected| for
the scaled rule). Schema of the JSON twin: docs/report-schema.md.</p>
</body></html>
"""


def write_html(path: Path, document: dict) -> Path:
    """The HTML report, written atomically (nothing left behind when writing fails)."""
    return write_text_atomic(path, render_html(document))
