"""The failure text: pinned for a known pair, bounded for many outputs, hints rendered."""

from __future__ import annotations

import numpy as np

from pytest_modelparity.verdict.compare import compare
from pytest_modelparity.diagnose import Hint
from pytest_modelparity.verdict.failure_text import format_report
from pytest_modelparity.verdict.tolerances import Tolerance

MARKER = Tolerance(rtol=1.3e-6, atol=1e-5, source="marker")


def known_pair():
    e = np.linspace(-3, 3, 640, dtype=np.float32).reshape(64, 10)
    a = e.copy()
    a[3, 4] += 0.01
    a[5, 5] *= 1.001
    a[7, 0] += 0.003
    return a, e


PINNED = """\
tflite vs keras: 1 of 2 outputs differs
['logits']: FAILED  shape (64, 10), float32
  Mismatched elements: 3 / 640 (0.5%)
  Greatest absolute difference: 0.01 at index (3, 4) (allowed 1.35e-05)
  Greatest relative difference: 0.00373 at index (3, 4) (allowed 5.03e-06)
  Greatest ULP distance 41943; mean absolute difference 2.42e-05
  Smallest passing tolerance: atol=0.009997 (with rtol=1.3e-06) or rtol=0.003727 (with atol=1e-05)
  Tolerance: elementwise rule, rtol=1.3e-06, atol=1e-05 (marker)
  Worst (index actual vs expected): (3, 4) -2.67075109 vs -2.68075109; (7, 0) -2.33972287 vs -2.34272289; (5, 5) -2.4860518 vs -2.48356819
Passed:
  ['probs']: ok, (64, 10) float32, max abs diff 0, elementwise (marker)"""


def test_failure_text_of_a_known_pair_is_pinned():
    a, e = known_pair()
    r = compare({"logits": a, "probs": e}, {"logits": e, "probs": e}, tolerance=MARKER)
    r.title = "tflite vs keras"
    assert str(r) == PINNED
    assert format_report(r) == PINNED


def test_text_names_counts_index_and_tolerance_source():
    a, e = known_pair()
    text = str(compare(a, e, tolerance=Tolerance(1e-4, 1e-4, source="ini")))
    assert "Mismatched elements: 3 / 640" in text
    assert "at index (3, 4)" in text
    assert "(ini)" in text and "elementwise rule" in text


def test_scaled_rule_text_says_so():
    a, e = known_pair()
    tol = Tolerance(0.0, 0.0, scale=1e-5, source="built-in float32 (scaled rule)")
    text = str(compare(a, e, tolerance=tol))
    assert "Tolerance: scaled rule" in text and "x max|expected|" in text
    assert "max |expected| 3" in text


def test_many_outputs_stay_under_the_line_limit():
    a, e = known_pair()
    actual = {f"out{i}": (a if i % 3 == 0 else e) for i in range(60)}
    expected = {f"out{i}": e for i in range(60)}
    text = str(compare(actual, expected, tolerance=MARKER))
    lines = text.splitlines()
    assert len(lines) <= 40
    assert lines[0] == "outputs: 20 of 60 outputs differ"
    assert "['out0']: FAILED  shape (64, 10), float32" in lines        # first one in full
    assert any(l.startswith("... and ") and "more failing outputs" in l for l in lines)
    assert any(l.startswith("Passed: 40 outputs") for l in lines)


def test_structure_and_shape_problems_are_shown():
    r = compare({"a": np.ones(3), "b": np.ones(2)}, {"a": np.ones(4), "c": np.ones(2)})
    text = str(r)
    assert "['a']: FAILED" in text and "shape differs: actual (3,), expected (4,)" in text
    assert "missing output: expected has key 'c'" in text
    assert "unexpected output: actual has key 'b'" in text


def test_hints_render_as_likely_cause_with_evidence():
    a, e = known_pair()
    r = compare(a, e, tolerance=MARKER)
    r.hints = [Hint("double_softmax", "actual ≈ softmax(expected): softmax applied twice",
                    "max |actual - softmax(expected)| = 2.1e-08")]
    lines = str(r).splitlines()
    i = lines.index("Likely cause:")
    assert lines[i + 1] == "  - actual ≈ softmax(expected): softmax applied twice"
    assert lines[i + 2] == "    evidence: max |actual - softmax(expected)| = 2.1e-08"


def test_hints_survive_the_line_limit():
    a, e = known_pair()
    r = compare({f"o{i}": a for i in range(40)}, {f"o{i}": e for i in range(40)},
                tolerance=MARKER)
    r.hints = [Hint("x", "weights differ in 2 of 4 variables", "dense/kernel max diff 0.5")]
    lines = str(r).splitlines()
    assert len(lines) <= 40 and lines[-2:] == [
        "  - weights differ in 2 of 4 variables", "    evidence: dense/kernel max diff 0.5"]


def test_nan_mismatch_says_no_tolerance_passes():
    a, e = known_pair()
    a[0, 0] = np.nan
    text = str(compare(a, e, tolerance=MARKER))
    assert "Smallest passing tolerance: none (NaN or infinity mismatches" in text
    assert "(0, 0) nan vs -3" in text
    assert "equal_nan=True" in text


def test_passing_report_is_short():
    e = np.ones((4, 4), np.float32)
    text = str(compare(e, e.copy(), tolerance=MARKER))
    assert text.splitlines()[0] == "outputs: all 1 output agree"
    assert len(text.splitlines()) == 2


def test_no_allowed_inf_or_absurd_relative_bound_where_expected_is_zero():
    e = np.array([0.0, 1e-30, 1.0], dtype=np.float32)
    a = np.array([0.5, 0.5, 1.0], dtype=np.float32)
    text = str(compare(a, e, tolerance=Tolerance(1e-5, 1e-5, source="argument")))
    assert "allowed inf" not in text and "e+2" not in text, text
    assert "only the absolute bound applies" in text


def test_smallest_passing_tolerance_only_where_elements_are_out_of_tolerance():
    """A failure judged by top-1 agreement alone (every element within bounds, as an int8
    row can be) offers no "Smallest passing tolerance: atol=0"."""
    a, e = known_pair()
    report = compare(a, e, tolerance=MARKER)
    assert "Smallest passing tolerance" in str(report)
    out = report.outputs[0]
    out.mismatched, out.top1_agreement = 0, 0.5  # the shape of a top-1-only failure
    assert "Smallest passing tolerance" not in str(report) and "Top-1 agreement: 50.0%" in str(report)
