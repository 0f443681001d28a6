"""Quantised decisions made on rows enough to fail (checks/quant_rows.py): a small batch no
longer passes a file outside its budget; where no more rows can be had the verdict is
inconclusive, never a pass; the threshold stated is the one applied."""

from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pytest_modelparity.checks import quantized
from pytest_modelparity.verdict.tolerances import Tolerance

pytest.importorskip("sklearn", reason="scikit-learn (a test dependency: pip install -e .[test]) trains the digits model")

from digits import digits_conftest  # noqa: E402
from test_plugin_report import check_document  # noqa: E402


def test_rows_needed_make_a_file_at_the_budget_pass_and_one_at_half_of_it_fail():
    """The table of the built-in budgets is what the search finds, and at that size a file at
    the budget fails with probability <= ALPHA while one at half the agreement (twice the
    share beyond) fails with probability >= POWER; on 2 rows nothing could fail."""
    for top1 in (0.95, 0.97):
        rate, bad = 1 - top1, quantized.outside_top1(top1)
        n = quantized.trials_needed(rate, bad)
        assert n == quantized._trials_needed(rate, bad, quantized.ALPHA, quantized.POWER)
        assert quantized.fail_probability(n, rate, bad) >= quantized.POWER
        assert quantized.fail_probability(n - 1, rate, bad) < quantized.POWER
        assert quantized.fail_probability(n, rate, rate) <= quantized.ALPHA
        assert quantized.fail_probability(2, rate, bad) < 0.3  # 2 rows: a file at half the budget passes
    assert quantized.fail_probability(2, 0.05, 0.525) == 0.0  # at int8's 95% even 2 misses of 2 pass
    assert quantized.trials_needed(0.02, 0.04) == quantized._trials_needed(0.02, 0.04, quantized.ALPHA,
                                                                           quantized.POWER) == 2777
    assert quantized.fail_probability(64, 0.02, 0.04) < 0.5  # 64 logits: twice the share passes as often as not


def _report(quant, sibling, strict=False):
    conversion = lambda dtype, path: Tolerance(0.0, 0.0, scale=1e-6)  # noqa: E731
    loose = {"int8": {"scale": 0.2}}
    with quantized.budget_layers([("test", loose)]), quantized.class_scores(True, source="test"), \
            quantized.inconclusive_fails(strict):
        return quantized.two_part_report(quantized=quant, sibling=sibling, reference=sibling, variant="int8",
                                         conversion_tolerance=conversion,
                                         rows_note={"given": len(sibling), "drawn": 0, "missing": "no rows to draw"})


def test_too_few_rows_are_inconclusive_not_a_pass_and_misses_still_fail():
    sibling = np.tile(np.array([[4.0, 0.0, 0.0]], np.float32), (4, 1))
    same = _report(sibling.copy(), sibling)
    out = same.outputs[-1]
    assert same.passed and same.inconclusive == [out]  # nothing failed, and nothing was decided
    assert out.decision == {**out.decision, "trials": 4, "observed": 0, "allowed": 2, "needed": 28,
                            "verdict": "inconclusive", "unit": "rows"}
    assert "INCONCLUSIVE: 4 rows judged, 28 needed to fail a file at top-1 agreement 47.5%" in out.inconclusive
    assert "quantisation cost (tflite:int8 vs float32 sibling) INCONCLUSIVE" in same.meta["summary"]
    assert same.meta["quantized"]["inconclusive"] == [out.path]
    strict = _report(sibling.copy(), sibling, strict=True)
    assert not strict.passed and "a failure under --modelparity-strict" in str(strict)
    flipped = sibling.copy()
    flipped[:3] = [0.0, 4.0, 0.0]  # 3 of 4 differ: evidence enough on 4 rows
    failed = _report(flipped, sibling)
    assert not failed.passed and not failed.inconclusive
    assert failed.outputs[-1].decision["verdict"] == "fail"


def test_drawn_rows_do_not_outvote_the_given_rows():
    """8 given rows, 6 of them flipped (fails alone: at most 3 of 8), then 56 drawn rows that
    agree: over 64 rows 6 misses would pass (at most 8), but the given rows' failure stands."""
    sibling = np.tile(np.array([[4.0, 0.0, 0.0]], np.float32), (64, 1))
    quant = sibling.copy()
    quant[:6] = [0.0, 4.0, 0.0]
    conversion = lambda dtype, path: Tolerance(0.0, 0.0, scale=1e-6)  # noqa: E731
    for given, passed in ((8, False), (64, True)):
        note = {"given": given, "drawn": 64 - given, "source": "test rows"}
        with quantized.budget_layers([("test", {"int8": {"scale": 0.2}})]), \
                quantized.class_scores(True, source="test"):
            report = quantized.two_part_report(quantized=quant, sibling=sibling, reference=sibling, variant="int8",
                                               conversion_tolerance=conversion, rows_note=note)
        out = report.outputs[-1]
        assert out.decision["trials"] == 64 and out.decision["observed"] == 6 and out.decision["allowed"] >= 6
        assert report.passed is passed and not report.inconclusive, str(report)
        if not passed:
            assert out.decision["given_alone"] == {"unit": "rows", "trials": 8, "observed": 6, "allowed": 3}
            assert "FAILS on the given rows alone: 6 of 8 rows differ, at most 3 may" in str(report)


@settings(max_examples=60, deadline=None, database=None)
@given(n=st.integers(1, 400), rate=st.floats(0.005, 0.3), bad=st.floats(0.0, 1.0))
def test_fail_probability_is_the_binomial_tail_beyond_the_allowed_misses(n, rate, bad):
    """P(X > allowed_misses(n, rate)) at a true rate ``bad``, summed exactly; at the budget's own
    rate it is at most ALPHA (a file at the budget fails that rarely, whatever n)."""
    k = quantized.allowed_misses(n, rate)
    exact = sum(math.comb(n, i) * bad ** i * (1 - bad) ** (n - i) for i in range(k + 1, n + 1))
    assert quantized.fail_probability(n, rate, bad) == pytest.approx(exact, abs=1e-9)
    assert quantized.fail_probability(n, rate, rate) <= quantized.ALPHA * (1 + 1e-9)


GOOD_OR_BAD = textwrap.dedent('''
    import json
    import pytest
    from hypothesis import given, seed, settings, strategies as st
    from pytest_modelparity import ParityError, assert_outputs_close

    @pytest.mark.modelparity(formats=["tflite:int8"], class_scores=True)
    @pytest.mark.parametrize("size", [2, 4])
    @pytest.mark.parametrize("which", range(10))
    def test_small_batch(parity_candidate, parity_reference, parity_batch, size, which):
        """Each example's verdict is written down (a failure caught: no shrinking, no diagnosis)."""
        @seed(which)
        @settings(max_examples=2, deadline=None, database=None)
        @given(start=st.integers(0, 60))
        def check(start):
            batch = {k: v[start:start + size] for k, v in parity_batch.items()}
            try:
                report = assert_outputs_close(parity_candidate, parity_reference, inputs=batch)
                verdict = "inconclusive" if report.inconclusive else "pass"
            except ParityError as exc:
                report, verdict = exc.report, "fail"
            cost = next(o for o in report.outputs if o.path.startswith("['quantisation']"))
            with open("verdicts.jsonl", "a") as f:
                f.write(json.dumps({"verdict": verdict, "size": size, "seed": which, "decision": cost.decision,
                                    "rule": cost.tolerance.source}) + "\\n")

        check()

    @pytest.mark.modelparity(formats=["tflite:int8"], class_scores=True)
    def test_two_rows_plainly(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs={k: v[:2] for k, v in parity_batch.items()})
''')

# The same rows, but the int8 file calibrated on pixels x 0.4 (a wrong input range): its top-1
# agrees with its float32 sibling on 46% of the held-out rows.
WRONG_RANGE = textwrap.dedent('''
    @pytest.fixture(scope="session")
    def modelparity_dataset():
        model, x_train, x_test = _trained()
        return [x_train[:100] * 0.4, x_test, x_train[100:]]
''')


def _rows(pytester):
    return [r for r in json.loads((pytester.path / "r.json").read_text())["rows"]
            if r["output"].startswith("['quantisation']")]


@pytest.mark.parametrize("calibration", ["good", "wrong range"])
def test_int8_at_half_the_agreement_fails_on_2_and_4_rows_and_the_good_file_passes_over_10_seeds(
        pytester, _heavy_modules_stay_loaded, request, calibration):
    """Through parity_candidate / parity_batch: 2- and 4-row batches under 10 Hypothesis seeds
    (2 examples each). The check draws the rows the budget needs (the dataset's rows after
    calibration); the file calibrated on the wrong range FAILS every example (before: 2 rows
    could not fail), the good one PASSES every example (not inconclusive), and each stated
    threshold is the one its verdict applied."""
    bad = calibration != "good"
    pytester.makeconftest(digits_conftest(str(request.path.parent)) + (WRONG_RANGE if bad else ""))
    pytester.makepyfile(test_small=GOOD_OR_BAD)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--modelparity-report=r.json")
    result.assert_outcomes(passed=20 if bad else 21, failed=1 if bad else 0)
    verdicts = [json.loads(line) for line in (pytester.path / "verdicts.jsonl").read_text().splitlines()]
    assert {(v["seed"], v["size"]) for v in verdicts} == {(s, n) for s in range(10) for n in (2, 4)}
    assert {v["verdict"] for v in verdicts} == ({"fail"} if bad else {"pass"}), verdicts
    if bad:
        assert "top-1 agreement" in result.stdout.str() and "FAILS" in result.stdout.str()
    for v in verdicts:
        d = v["decision"]
        assert d["unit"] == "rows" and d["trials"] >= d["needed"] == 28 and d["rows_given"] == v["size"]
        assert d["rows_drawn"] > 0 and "modelparity_dataset" in d["rows_source"]
        applied = f"(on {d['trials']} row(s) at most {d['allowed']} may differ"
        assert applied in v["rule"]  # the threshold stated ...
        assert (v["verdict"] == "fail") == (d["observed"] > d["allowed"])  # ... is the one that decided
        assert d["allowed"] == quantized.allowed_misses(d["trials"], 1 - 0.95)
    for row in _rows(pytester):  # and the JSON report says the same
        d = row["decision"]
        assert f"(on {d['trials']} row(s) at most {d['allowed']} may differ" in row["tolerance_source"]
        assert (row["verdict"] in ("fail", "expected")) == (d["observed"] > d["allowed"]) != (row["verdict"] == "pass")


ARRAYS_REFERENCE = textwrap.dedent('''
    import pytest
    from pytest_modelparity import assert_outputs_close

    @pytest.mark.modelparity(formats=["tflite:int8"], class_scores=True)
    def test_two_rows_against_arrays(parity_candidate, parity_reference, parity_batch):
        two = {k: v[:2] for k, v in parity_batch.items()}
        report = assert_outputs_close(parity_candidate, parity_reference(two), inputs=two)
        assert report.inconclusive
''')


def test_two_rows_against_arrays_are_inconclusive_with_a_summary_line_and_fail_under_strict(
        pytester, _heavy_modules_stay_loaded, request):
    pytester.makeconftest(digits_conftest(str(request.path.parent)))
    pytester.makepyfile(test_arrays=ARRAYS_REFERENCE)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--modelparity-report=r.json",
                                          "--modelparity-html=r.html")
    result.assert_outcomes(passed=1)
    html = (pytester.path / "r.html").read_text()
    assert '<td class="inconclusive"><b>INCONCLUSIVE</b>' in html and "1 inconclusive (too few rows" in html
    out = result.stdout.str()
    assert "1 quantised verdict(s) in 1 test(s) INCONCLUSIVE, not passed" in out, out
    assert "the reference is arrays, so it cannot be run on more rows: pass inputs= with at least" in out
    assert "InconclusiveVerdict" in out  # pytest's warnings summary too
    rows = _rows(pytester)
    assert [r["verdict"] for r in rows] == ["inconclusive"]
    doc = json.loads((pytester.path / "r.json").read_text())
    check_document(doc)  # the documented schema (docs/report-schema.md), verdict "inconclusive" included
    assert doc["summary"]["rows_inconclusive"] == 1
    strict = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--modelparity-strict")
    strict.assert_outcomes(failed=1)
    assert "a failure under --modelparity-strict" in strict.stdout.str()
