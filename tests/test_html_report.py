"""The --modelparity-html page: self-contained (nothing fetched), table and histograms present."""

from __future__ import annotations

import re
import textwrap

import pytest

from pytest_modelparity.reports.html import histogram_svg, render_html

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

EXTERNAL = re.compile(r"https?:|//[a-z0-9.-]+\.[a-z]{2,}/|<script|<link|<iframe|<img|@import|url\(|\bsrc=|\bhref=",
                      re.IGNORECASE)


def _row(**over):
    row = {"nodeid": "t.py::test_x[tflite-cpu]", "format": "tflite", "device": "cpu", "check": "outputs_close",
           "title": "tflite vs keras", "output": "['probs']", "verdict": "fail", "max_abs": 3e-3, "max_rel": 4e-3,
           "max_ulp": 64781.0, "tolerance": "rtol=1.3e-06, atol=1e-05 (built-in float32)", "hints": [
               "actual ≈ 255/256 × expected <script>alert(1)</script>"], "runs": 3,
           "error_histogram": {"counts": [1, 0, 5, 7], "log10_edges": [-6.0, -5.0, -4.0, -3.0, -2.0]}}
    row.update(over)
    return row


def test_histogram_svg_draws_one_bar_per_non_empty_bin() -> None:
    svg = histogram_svg({"counts": [1, 0, 5, 7], "log10_edges": [-6.0, -5.0, -4.0, -3.0, -2.0]})
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count("<rect") == 1 + 3  # background + three non-empty bins
    assert "1e-6" in svg and "1e-2" in svg
    assert "not measured" in histogram_svg(None)


def test_rendered_page_escapes_text_and_fetches_nothing() -> None:
    page = render_html({"rows": [_row(), _row(verdict="pass", error_histogram=None)],
                        "summary": {"rows": 2, "passed": 1, "failed": 1}, "tests": [], "environment": {}})
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert not EXTERNAL.search(page), EXTERNAL.search(page)
    assert page.count("<tr class=") == 2 and page.count("<svg") == 1
    assert "worst of 3 comparisons" in page


def test_html_of_a_real_run_is_self_contained(pytester: pytest.Pytester, _heavy_modules_stay_loaded: None) -> None:
    pytester.makepyfile(textwrap.dedent('''
        from pytest_modelparity import assert_outputs_close

        def test_scaled(parity_reference, parity_batch):
            expected = parity_reference.predict(parity_batch)
            actual = {k: v * 1.001 for k, v in expected.items()}
            assert_outputs_close(actual, expected)
    '''))
    result = pytester.runpytest("--modelparity-model=demo", "--modelparity-formats=saved_model",
                                "--modelparity-html=report/parity.html", "-k", "scaled or outputs_close")
    result.assert_outcomes(passed=1, failed=1)
    page = (pytester.path / "report" / "parity.html").read_text(encoding="utf-8")
    assert not EXTERNAL.search(page), EXTERNAL.search(page)
    assert page.startswith("<!DOCTYPE html>") and "<table>" in page
    # The page shows each test's name, with the file (or the zero-code suite) beneath it.
    assert "<b>test_scaled[cpu]</b>" in page and "<b>test_outputs_close[saved_model-cpu]</b>" in page
    assert page.count("<tr class=") == 2
    assert "<svg" in page  # the failing comparison carries its histogram


def test_failing_rows_come_first() -> None:
    from pytest_modelparity.reports.html import render_html

    rows = [{"nodeid": f"t.py::test_{i}", "verdict": v, "check": "outputs_close", "output": "x"}
            for i, v in enumerate(["pass", "pass", "fail", "pass"])]
    page = render_html({"rows": rows})
    assert page.index("test_2") < page.index("test_0") < page.index("test_1") < page.index("test_3")


def test_hint_evidence_is_shown_under_each_hint() -> None:
    from pytest_modelparity.reports.html import render_html

    row = {"nodeid": "t.py::test_x", "verdict": "fail", "check": "outputs_close", "output": "probs",
           "hints": ["first divergent layer: conv"], "hint_evidence": ["layer  max abs\nconv   0.9 <& >"]}
    page = render_html({"rows": [row]})
    assert "<details><summary>evidence</summary><pre>layer  max abs\nconv   0.9 &lt;&amp; &gt;</pre>" in page
