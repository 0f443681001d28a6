"""The --modelparity-html page: self-contained (nothing fetched), table and histograms present."""

from __future__ import annotations

import html
import re
import textwrap

import pytest

from pytest_modelparity.reports.html import histogram_svg, render_html

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker

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


def _green_run(n: int = 59) -> list[dict]:
    """Rows like a green run of the default matrix: long tolerance texts, histograms."""
    formats = ["keras", "h5", "saved_model", "graphdef", "tflite", "tfjs", "onnx", "tflite:int8"]
    tolerance = ("rtol=0 atol=0 scale=7.63e-06 (8 x the model's own float32 error (1.1e-07 of scale, at least 8 eps, "
                 "from a float64 run of its Keras twin); measured on the session's reference (keras): tflite:float32 "
                 "has no TensorFlow graph)")
    return [{"nodeid": f"tests/test_parity.py::test_export[{formats[i % 8]}-cpu]", "format": formats[i % 8],
             "device": "cpu", "check": ["outputs_close", "deterministic", "batch_invariant"][i % 3],
             "title": f"{formats[i % 8]} vs keras", "output": "['probs']", "verdict": "pass",
             "max_abs": 10.0 ** -(6 + i % 3), "max_rel": 2e-6, "max_ulp": 12.0, "output_scale": 0.9,
             "rtol": 0.0, "atol": 0.0, "scale": 7.63e-6, "tolerance": tolerance, "notes": ["float32 compared"],
             "error_histogram": {"counts": [1, 3, 9], "log10_edges": [-8.0, -7.0, -6.0, -5.0]}}
            for i in range(n)]


def _visible(row_html: str) -> str:
    """What a row shows before anything is opened: its text outside <details> and tooltips."""
    shown = re.sub(r"<details>.*?</details>", "", row_html, flags=re.S)
    shown = re.sub(r"<summary>.*?</summary>", "", shown, flags=re.S)
    shown = re.sub(r"<title>.*?</title>", "", shown, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", shown))


def test_a_green_run_is_one_line_per_row_with_a_bar_against_the_bound() -> None:
    failing = _row(max_abs=3e-3, output_scale=1.0, rtol=0.0, atol=0.0, scale=7.63e-6)
    page = render_html({"rows": [*_green_run(), failing], "tests": [], "environment": {}})
    rows = re.findall(r"<tr class=\"(\w+)\">(.*?)</tr>", page, flags=re.S)
    assert len(rows) == 60 and rows[0][0] == "fail"
    for css, html_row in rows[1:]:
        assert css == "pass"
        # the long tolerance text, the histogram and the notes are folded away...
        assert "<details><summary>" in html_row and "float64 run of its Keras twin" not in _visible(html_row)
        assert "<svg" not in re.sub(r"<details>.*?</details>", "", html_row, flags=re.S).split("bound\">")[0]
        # ...so what is left fits one line of a 1280 px window (verdict, test, format, device,
        # check, output, max abs, error/bound ratio and its bar, the summary word)
        assert len(_visible(html_row)) <= 100, _visible(html_row)
        assert "white-space" not in html_row  # the CSS keeps them on one line, not the rows
    # every row with a bound has its error/bound bar; the passing ones sit left of the tick
    assert page.count('aria-label="error against bound"') == 60
    assert re.search(r">0\.15</span><svg", page) and re.search(r">3\.9e\+02</span><svg", page)
    # the failure is open: its hint under the test name, its tolerance and histogram shown
    css, fail_row = rows[0]
    assert "<details open>" in fail_row and "actual ≈ 255/256" in _visible(fail_row.replace(" open>", ">", 1))
    assert 'fill="#cf222e"' in fail_row
    assert "td.test,td.out{max-width:22em;overflow:hidden;text-overflow:ellipsis}" in page
    assert not EXTERNAL.search(page)


def test_the_bound_bar_clamps_and_skips_rows_without_a_bound() -> None:
    from pytest_modelparity.reports.html import bound_ratio, bound_svg

    assert bound_ratio({"max_abs": 1e-6, "output_scale": 2.0, "rtol": 1e-5, "atol": 1e-6, "scale": 0.0}) == pytest.approx((1e-6, 2.1e-5))
    assert bound_ratio({"max_abs": 1e-3, "output_scale": None, "rtol": None, "atol": None, "scale": None}) is None
    assert bound_svg({"max_abs": 0.0, "output_scale": 1.0, "scale": 1e-5}).count("<rect") == 2
    far = bound_svg({"max_abs": 1e6, "output_scale": 1.0, "scale": 1e-5})
    assert 'width="120.0" height="8" fill="#cf222e"' in far  # clamped at 100 x the bound, red


def laid_out(page: str, path, *, shot=None) -> tuple[int, int]:
    """``(scrollWidth, scrollHeight)`` of ``page`` laid out by headless Chromium in a 1280 x 800
    window (the Chromium the tfjs browser formats run: ``runtime/browser_process.chromium_executable``),
    written to ``path`` with a script that measures it; a PNG of the page to ``shot`` when given.
    Skips, saying how to install it, where there is no Chromium."""
    import subprocess

    from pytest_modelparity.errors import RuntimeMissing
    from pytest_modelparity.runtime.browser_process import CHROMIUM_HINT, chromium_executable

    try:
        chromium = chromium_executable()
    except RuntimeMissing:
        pytest.skip(f"no Chromium to lay the page out at 1280 px: {CHROMIUM_HINT}")
    measure = ('<script>window.onload=()=>{document.body.dataset.h=document.documentElement.scrollHeight;'
               'document.body.dataset.w=document.documentElement.scrollWidth}</script></body>')
    path.write_text(page.replace("</body>", measure), encoding="utf-8")
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,800",
             "--virtual-time-budget=2000"]
    dom = subprocess.run([*flags, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120).stdout
    if shot is not None:  # what a reader sees, kept beside the test's files
        subprocess.run([*flags, f"--screenshot={shot}", path.as_uri()], capture_output=True, timeout=120)
    width, height = (int(re.search(rf'data-{k}="(\d+)"', dom).group(1)) for k in ("w", "h"))
    return width, height


def laid_out_width(page: str, path) -> int:
    return laid_out(page, path)[0]


def test_in_chromium_a_green_59_row_report_fits_1280_px_wide_and_a_few_screens_tall(tmp_path) -> None:
    """Laid out by a real browser: no horizontal scroll at 1280 px, and about 27 px a row (it
    was ~21,700 px for these rows, each wrapping its tolerance text to 6-10 lines)."""
    width, height = laid_out(render_html({"rows": _green_run(), "tests": [], "environment": {}}), tmp_path / "r.html")
    assert width <= 1280 and height <= 59 * 32 + 400, (width, height)


# What the reports held (issue 50): a converter's error of 1,500 characters without a space
# to break at, skip reasons of 600, a failure's lines; and two models in one run.
_LONG_PATH = "/tmp/cache/tflite/.5f07d31e023d3446.tmp-hvm-p26231-pzvf1c3p/" + "a" * 1400 + "/model.tflite"


def _run_with_every_outcome() -> dict:
    text_model, tiny = "text_clf (text_classifier)", "tiny"
    tests = [
        {"nodeid": "text/test_text.py::test_export[tflite-cpu]", "outcome": "skipped", "model": text_model,
         "reason": "Skipped: modelparity: format 'tflite' does not apply to this model (the model has a lookup table "
                   "(text_clf_1/vec_1/None_Lookup/LookupTableFindV2/table_handle: TextVectorization) and a loop "
                   "(While: a Keras RNN) " + "x" * 400 + "); compare this model through keras or saved_model"},
        {"nodeid": "tiny/test_tiny.py::test_scaled[saved_model-cpu]", "outcome": "failed", "model": tiny,
         "reason": "ParityError: actual vs expected: 1 of 1 output differs\n['out']: FAILED  shape (4, 3), float32\n"
                   "  Mismatched elements: 6 / 12 (50.0%)\n" + "  Worst (index actual vs expected): " + "(0, 1) -1.2 vs -1.2; " * 40},
        {"nodeid": "text/test_text.py::test_export[keras-cpu]", "outcome": "passed", "model": text_model},
        {"nodeid": "text/test_named.py::test_named_h5[h5-cpu]", "outcome": "error", "when": "setup", "model": text_model,
         "reason": f"Failed: modelparity: cannot export the model to '{_LONG_PATH}' as format 'h5': Keras' legacy HDF5 "
                   "loader cannot load the file it wrote"},
        {"nodeid": "text/test_text.py::test_export[onnx-cpu]", "outcome": "skipped", "model": text_model,
         "reason": "Skipped: modelparity: format 'onnx' does not apply to this model"},
    ]
    rows = [_row(nodeid="tiny/test_tiny.py::test_scaled[saved_model-cpu]", model=tiny, title="actual vs expected " + "y" * 300,
                 hints=["actual ≈ 1.001 × expected: the output is scaled by a constant " + "z" * 300],
                 hint_evidence=["best factor 1.001; " + "w" * 600], problem=None, output_scale=1.0, scale=4e-4,
                 rtol=1.3e-6, atol=0.0),
            _row(nodeid="text/test_text.py::test_export[keras-cpu]", model=text_model, verdict="pass",
                 output="['sub-batches of 3']['probabilities_of_every_class']", max_abs=0.0)]
    not_compared = [{"format": "tflite", "model": text_model, "named_by": "the default matrix", "kind": "skipped",
                     "reason": "does not apply to this model (" + "v" * 600 + ")"},
                    {"format": "tfjs", "model": None, "named_by": "the default matrix", "kind": "not_in_matrix",
                     "reason": "not in the matrix: Node.js is not available"}]
    return {"rows": rows, "tests": tests, "not_compared": not_compared, "environment": {"packages": {"tensorflow": "2.21.0"}}}


def test_a_report_with_an_error_a_failure_and_skips_fits_1280_px_grouped_and_naming_each_model(tmp_path) -> None:
    """Issue 50: a report with any test that did not pass was 2,524-4,640 px wide (messages did not
    wrap), its errors and skips interleaved, and no row named its model. Laid out in Chromium at
    1280 px: no horizontal overflow; errors, failures, skips each a group, in that order; every row,
    test and NOT COMPARED line names its model. (tests/test_not_compared.py checks a real run's page.)"""
    page = render_html(_run_with_every_outcome())
    width, height = laid_out(page, tmp_path / "r.html", shot=tmp_path / "r.png")
    assert width <= 1280, width
    groups = [page.index(f'<h3 id="{o}">') for o in ("error", "failed", "skipped")]
    assert groups == sorted(groups), groups
    assert re.search(r'<h3 id="error">Errors \(1\)', page) and re.search(r'<h3 id="skipped">Skipped \(2\)', page)
    skipped = page[groups[2]:page.index("</ul>", groups[2])]
    assert "test_named_h5" not in skipped and skipped.count("<li>") == 2  # not interleaved
    # each test that did not pass, each row and the NOT COMPARED line of a model name it
    assert page.count('<span class="model">text_clf (text_classifier)</span>') == 3 + 1 + 1
    assert page.count('<span class="model">tiny</span>') == 1 + 1
    assert re.search(r"<b>NOT COMPARED</b>: <code>tflite</code> for <span class=\"model\">text_clf", page)
    assert re.search(r"<b>NOT COMPARED</b>: <code>tfjs</code> <span", page)  # a runtime missing: every model
    assert "white-space:pre-wrap;overflow-wrap:anywhere" in page  # the messages wrap
