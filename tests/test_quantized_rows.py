"""Quantised decisions drawn to a verdict (checks/quant_rows.py, checks/acceptance.py): a small
batch no longer passes a file outside its budget; where the rows do not settle it the verdict
is inconclusive, never a pass; the threshold stated is the one applied."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from pytest_modelparity.checks import acceptance, quantized
from pytest_modelparity.verdict.tolerances import Tolerance

from digits import digits_conftest  # noqa: E402
from test_plugin_report import check_document  # noqa: E402

pytestmark = [pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker


def _report(quant, sibling, strict=False):
    conversion = lambda dtype, path: Tolerance(0.0, 0.0, scale=1e-6)  # noqa: E731
    loose = {"int8": {"scale": 0.2}}
    with quantized.budget_layers([("test", loose)]), quantized.class_scores(True, source="test"), \
            quantized.inconclusive_fails(strict):
        return quantized.two_part_report(quantized=quant, sibling=sibling, reference=sibling, variant="int8",
                                         conversion_tolerance=conversion,
                                         rows_note={"given": len(sibling), "drawn": 0, "missing": "no rows to draw"})


def test_too_few_rows_are_inconclusive_not_a_pass_and_misses_still_fail():
    """4 agreeing rows prove nothing (at 99.99% no count of 4 passes a 95% budget): inconclusive.
    8 rows of which 7 differ prove the file beyond it: a failure, drawn rows or not."""
    sibling = np.tile(np.array([[4.0, 0.0, 0.0]], np.float32), (4, 1))
    same = _report(sibling.copy(), sibling)
    out = same.outputs[-1]
    assert same.passed and same.inconclusive == [out]  # nothing failed, and nothing was decided
    d = out.decision
    assert {k: d[k] for k in ("trials", "observed", "pass_at_most", "verdict", "unit", "budget_rate")} == {
        "trials": 4, "observed": 0, "pass_at_most": -1, "verdict": "inconclusive", "unit": "rows",
        "budget_rate": pytest.approx(0.05)}
    assert d["lower"] == 0.0 and d["upper"] == pytest.approx(1 - 1e-4 ** (1 / 4)) and d["confidence"] == 0.9999
    assert "INCONCLUSIVE: 4 rows judged, 0 miss(es) (0.0%), 99.99% interval of the miss rate [0.0%, 90.0%]" \
        in out.inconclusive and "straddles the budget 5.0%; no rows to draw" in out.inconclusive
    assert "quantisation cost (tflite:int8 vs float32 sibling) INCONCLUSIVE" in same.meta["summary"]
    assert same.meta["quantized"]["inconclusive"] == [out.path]
    strict = _report(sibling.copy(), sibling, strict=True)
    assert not strict.passed and "a failure under --modelparity-strict" in str(strict)
    eight = np.tile(np.array([[4.0, 0.0, 0.0]], np.float32), (8, 1))
    flipped = eight.copy()
    flipped[:7] = [0.0, 4.0, 0.0]  # 7 of 8 differ: the lower bound (20%) is beyond 5%
    failed = _report(flipped, eight)
    assert not failed.passed and not failed.inconclusive
    assert failed.outputs[-1].decision["verdict"] == "fail" and failed.outputs[-1].decision["lower"] > 0.05


def test_drawn_rows_do_not_outvote_the_given_rows():
    """8 given rows, 7 of them flipped (they FAIL alone), then 504 drawn rows that agree: over
    512 rows 7 misses PASS (the upper bound is under 5%), but the given rows' failure stands."""
    sibling = np.tile(np.array([[4.0, 0.0, 0.0]], np.float32), (512, 1))
    quant = sibling.copy()
    quant[:7] = [0.0, 4.0, 0.0]
    conversion = lambda dtype, path: Tolerance(0.0, 0.0, scale=1e-6)  # noqa: E731
    for given, passed in ((8, False), (512, True)):
        note = {"given": given, "drawn": 512 - given, "source": "test rows"}
        with quantized.budget_layers([("test", {"int8": {"scale": 0.2}})]), \
                quantized.class_scores(True, source="test"):
            report = quantized.two_part_report(quantized=quant, sibling=sibling, reference=sibling, variant="int8",
                                               conversion_tolerance=conversion, rows_note=note)
        out = report.outputs[-1]
        assert out.decision["trials"] == 512 and out.decision["observed"] == 7 and out.decision["upper"] < 0.05
        assert report.passed is passed and not report.inconclusive, str(report)
        if not passed:
            alone = out.decision["given_alone"]
            assert (alone["trials"], alone["observed"], alone["verdict"]) == (8, 7, "fail") and alone["lower"] > 0.05
            assert "FAILS on the given rows alone: 7 of 8 rows differ" in str(report)


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
    (2 examples each). The check draws rows (the dataset's rows after calibration) until the
    acceptance test decides; the file calibrated on the wrong range FAILS every example (before
    issue 27: 2 rows could not fail), the good one PASSES every example (not inconclusive: its
    agreement is proved), and each stated threshold is the one its verdict applied."""
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
        assert d["unit"] == "rows" and d["rows_given"] == v["size"] and d["rows_max_rows"] == 1024
        assert d["rows_drawn"] > 0 and "modelparity_dataset" in d["rows_source"]
        # the rule stated is the one applied: decided on evidence, by the thresholds it names
        assert (d["pass_at_most"], d["fail_from"]) == acceptance.thresholds(d["trials"], 0.05, acceptance.LOOK_ALPHA)
        assert f"on {d['trials']} row(s) " in v["rule"]
        if v["verdict"] == "fail":
            assert d["lower"] > 0.05 and d["observed"] >= d["fail_from"]
        else:
            assert d["upper"] <= 0.05 and d["observed"] <= d["pass_at_most"]
    for row in _rows(pytester):  # and the JSON report says the same
        d = row["decision"]
        assert f"on {d['trials']} row(s) " in row["tolerance_source"]
        assert (row["verdict"] in ("fail", "expected")) == (d["lower"] > d["budget_rate"]) != (row["verdict"] == "pass")


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
    assert "the reference is arrays, so it cannot be run on more rows: pass inputs= with more rows" in out
    assert "InconclusiveVerdict" in out  # pytest's warnings summary too
    rows = _rows(pytester)
    assert [r["verdict"] for r in rows] == ["inconclusive"]
    doc = json.loads((pytester.path / "r.json").read_text())
    check_document(doc)  # the documented schema (docs/report-schema.md), verdict "inconclusive" included
    assert doc["summary"]["rows_inconclusive"] == 1
    strict = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--modelparity-strict")
    strict.assert_outcomes(failed=1)
    assert "a failure under --modelparity-strict" in strict.stdout.str()


SHORT_DATASET = textwrap.dedent('''
    @pytest.fixture(scope="session")
    def modelparity_dataset():
        model, x_train, x_test = _trained()
        return x_train[:160]  # 80 calibration rows, 80 to judge: short of what a decision needs

    @pytest.fixture(scope="session")
    def modelparity_elements():
        return (-1.0, 1.0)  # declared, but [0, 1] pixels are the data: uniform rows here are noise
''')

DECIDE = textwrap.dedent('''
    import json
    import pytest
    from pytest_modelparity import assert_outputs_close

    @pytest.mark.modelparity(formats=["tflite:int8"], class_scores=True)
    def test_int8(parity_candidate, parity_reference, parity_batch):
        report = assert_outputs_close(parity_candidate, parity_reference, inputs={k: v[:4] for k, v in parity_batch.items()})
        cost = next(o for o in report.outputs if o.path.startswith("['quantisation']"))
        with open("decision.json", "w") as f:
            json.dump({"decision": cost.decision, "inconclusive": cost.inconclusive}, f)
''')


def test_a_short_dataset_is_extended_by_its_own_rows_perturbed_never_uniform_rows(
        pytester, _heavy_modules_stay_loaded, request):
    """Issue 47: a correct int8 file whose dataset ran short was judged on uniform rows from
    modelparity_elements. Here 80 judged rows are all the dataset has after calibration, and a
    range of [-1, 1] is declared: the decision is made on the dataset's rows, then the same rows
    perturbed by 2% of their span (all within [0, 1]), and the good file PASSES. With
    --modelparity-quant-max-rows=24 the same file is undecided at the cap: inconclusive, saying
    so and naming the option; the ini key is read and checked as the option is."""
    pytester.makeconftest(digits_conftest(str(request.path.parent)) + SHORT_DATASET)
    pytester.makepyfile(test_decide=DECIDE)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    d = json.loads((pytester.path / "decision.json").read_text())["decision"]
    assert d["verdict"] == "pass" and d["upper"] <= 0.05 and d["rows_given"] == 4 and d["rows_max_rows"] == 1024
    assert "80 row(s) of modelparity_dataset" in d["rows_source"] and "perturbed by 2%" in d["rows_source"]
    assert "seeded" not in d["rows_source"] and d["rows_given"] + d["rows_drawn"] > 84
    capped = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--modelparity-quant-max-rows=24")
    capped.assert_outcomes(passed=1)
    saved = json.loads((pytester.path / "decision.json").read_text())
    assert saved["decision"]["verdict"] == "inconclusive" and saved["decision"]["rows_max_rows"] == 24
    assert saved["decision"]["rows_given"] + saved["decision"]["rows_drawn"] == 24
    assert "undecided at the cap of 24 rows" in saved["inconclusive"]
    assert "--modelparity-quant-max-rows" in saved["inconclusive"]
    bad = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-o", "modelparity_quant_max_rows=lots")
    assert "--modelparity-quant-max-rows=lots: pass a positive whole number" in bad.stderr.str()


def test_judging_rows_take_the_dataset_then_its_rows_perturbed_the_same_for_any_n():
    """JudgingRows with a 10-row dataset in [0, 0.5] and a declared [-1, 1] range: the 5 rows
    after calibration, then perturbed dataset rows within the data's span (none drawn from the
    declared range), the first rows the same whatever n; without a dataset, seeded rows."""
    from pytest_modelparity.checks.quant_rows import PERTURB, JudgingRows
    from pytest_modelparity.formats.base import TensorSpec

    data = np.linspace(0.0, 0.5, 40, dtype=np.float32).reshape(10, 4)
    specs = [TensorSpec("x", (None, 4), np.float32)]
    rows = JudgingRows(lambda: specs, data, elements=(-1.0, 1.0))
    block, said = rows(30)
    x = block["x"]
    assert x.shape == (30, 4) and np.array_equal(x[:5], data[5:])
    assert "5 row(s) of modelparity_dataset" in said and "25 of its rows perturbed by 2%" in said
    assert x.min() >= 0.0 and x.max() <= 0.5  # clipped to the data's span, never [-1, 1]
    nearest = np.abs(x[5:, None, :] - data[None]).max(-1).min(-1)
    assert np.all(nearest <= PERTURB * 0.5 + 1e-6) and np.all(nearest > 0)  # near a dataset row, not one of them
    assert len({r.tobytes() for r in x}) == 30  # every row new
    assert np.array_equal(rows(12)[0]["x"], x[:12])
    seeded, said = JudgingRows(lambda: specs, None, elements=(-1.0, 1.0))(8)
    assert "seeded row(s) drawn from modelparity_elements" in said and seeded["x"].min() < 0
    ints = JudgingRows(lambda: [TensorSpec("ids", (None, 3), np.int32)], np.arange(12, dtype=np.int32).reshape(4, 3))
    block, said = ints(10)
    assert len(block["ids"]) == 2 and "cannot be perturbed" in said
