"""The JSON report (against docs/report-schema.md), the terminal summary and the zero-code suite."""

from __future__ import annotations

import json
import textwrap
from numbers import Real

import pytest

from models import TINY_SOURCE_CONFTEST

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]

CONFTEST = TINY_SOURCE_CONFTEST

SUITE = textwrap.dedent('''
    import pytest
    from pytest_modelparity import assert_outputs_close, assert_deterministic

    def test_close(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)

    def test_deterministic(parity_candidate, parity_batch):
        assert_deterministic(parity_candidate, parity_batch, runs=2)

    @pytest.mark.modelparity(formats=["saved_model"])
    def test_scaled_input_fails(parity_candidate, parity_reference, parity_batch):
        scaled = {k: v * (255 / 256) for k, v in parity_batch.items()}
        assert_outputs_close(parity_candidate.predict(scaled), parity_reference.predict(parity_batch))

    def test_no_comparison():
        pass
''')


# -- a validator written from docs/report-schema.md --------------------------------------

NUM = (Real, type(None))
NUMBER_OR_TEXT = (Real, str, type(None))
ROW = {"nodeid": str, "format": (str, type(None)), "device": (str, type(None)), "check": str, "title": str,
       "seq": int, "runs": int, "output": str, "verdict": str, "max_abs": NUMBER_OR_TEXT, "max_rel": NUMBER_OR_TEXT,
       "max_ulp": NUMBER_OR_TEXT, "mean_abs": NUMBER_OR_TEXT, "max_abs_index": (list, type(None)),
       "min_atol": NUMBER_OR_TEXT, "min_rtol": NUMBER_OR_TEXT, "size": (int, type(None)),
       "mismatched": (int, type(None)), "shape": (list, type(None)), "dtype": (str, type(None)),
       "problem": (str, type(None)), "notes": list, "hints": list, "reported": bool, "tolerance": (str, type(None)), "calibration": (str, type(None)),
       "tolerance_source": (str, type(None)), "tolerance_rule": (str, type(None)), "rtol": NUM, "atol": NUM,
       "scale": NUM, "error_histogram": (dict, type(None)), "quantized": (dict, type(None)), "paired_with": (dict, type(None)),
       "decision": (dict, type(None)), "inconclusive": (str, type(None)), "bulk": (dict, type(None)),
       "power": (dict, type(None)), "power_plants": (dict, type(None))}
TOP = {"schema": str, "schema_version": int, "created": str, "command": str, "environment": dict,
       "options": dict, "workers": int, "summary": dict, "tests": list, "artifacts": list, "rows": list,
       "not_compared": list}


def check_document(doc: dict) -> None:
    for key, kind in TOP.items():
        assert isinstance(doc.get(key), kind), (key, doc.get(key))
    assert doc["schema"] == "pytest-modelparity/report" and doc["schema_version"] == 3
    env = doc["environment"]
    assert set(env["packages"]) >= {"tensorflow", "keras", "numpy", "ai-edge-litert", "onnxruntime", "tf2onnx",
                                    "tensorflowjs", "pytest-modelparity"}
    assert set(doc["summary"]) == {"tests", "passed", "failed", "error", "skipped", "xfailed", "xpassed",
                                   "comparisons", "rows", "rows_passed", "rows_failed", "rows_expected",
                                   "rows_inconclusive"}
    summary = doc["summary"]
    assert summary["rows"] == len(doc["rows"])
    assert summary["rows_passed"] + summary["rows_failed"] + summary["rows_expected"] + summary["rows_inconclusive"] \
        == len(doc["rows"])
    assert summary["tests"] == len(doc["tests"]) == sum(summary[k] for k in ("passed", "failed", "error", "skipped",
                                                                             "xfailed", "xpassed"))
    for test in doc["tests"]:
        assert test["outcome"] in {"passed", "failed", "error", "skipped", "xfailed", "xpassed"}
    for art in doc["artifacts"]:
        assert {"source", "format", "path", "seconds"} <= set(art)
    for row in doc["rows"]:
        for key, kind in ROW.items():
            assert isinstance(row.get(key), kind), (key, row.get(key))
        assert row["verdict"] in ("pass", "fail", "expected", "inconclusive") and row["check"] in ("outputs_close", "deterministic",
                                                                      "batch_invariant")
        for key in ("max_abs", "max_rel", "max_ulp"):
            assert not isinstance(row[key], str) or row[key] in ("inf", "-inf", "nan")
        hist = row["error_histogram"]
        if hist is not None:
            assert len(hist["log10_edges"]) == len(hist["counts"]) + 1


def test_json_report_follows_the_documented_schema(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(SUITE)
    result = pytester.runpytest("--modelparity-formats=keras,saved_model", "--modelparity-report=out/parity.json")
    result.assert_outcomes(passed=5, failed=1)
    text = (pytester.path / "out" / "parity.json").read_text()
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    check_document(doc)
    assert doc["environment"]["packages"]["tensorflow"] is not None
    assert doc["options"]["formats"] == ["keras", "saved_model"]
    by_test = {t["nodeid"].split("::")[-1]: t["outcome"] for t in doc["tests"]}
    assert by_test["test_scaled_input_fails[saved_model-cpu]"] == "failed"
    assert by_test["test_no_comparison"] == "passed"
    rows = {(r["nodeid"].split("::")[-1], r["output"]): r for r in doc["rows"]}
    fail = rows[("test_scaled_input_fails[saved_model-cpu]", "['out']")]
    assert fail["verdict"] == "fail" and fail["format"] == "saved_model" and fail["device"] == "cpu"
    assert fail["max_abs"] > 0 and fail["max_rel"] > 0 and fail["mismatched"] > 0
    assert rows[("test_close[keras-cpu]", "['out']")]["verdict"] == "pass"
    assert {r["check"] for r in doc["rows"]} == {"outputs_close", "deterministic"}
    # the terminal summary: one line per (test, format, device, output)
    result.stdout.fnmatch_lines([
        "*= model parity summary =*",
        "test*format*device*check*output*verdict*max abs*max rel*max ULP*tolerance*",
        "test_close[[]keras-cpu[]]*keras*cpu*outputs_close*['out']*PASS*",
        "test_scaled_input_fails[[]saved_model-cpu[]]*saved_model*cpu*outputs_close*['out']*FAIL*",
        "*JSON report written to*parity.json",
    ])


def test_rows_carry_full_statistics_and_the_error_histogram(pytester: pytest.Pytester) -> None:
    """The summary and the HTML need max rel / ULP and the histogram for every row, so the
    assertions compute full statistics while the plugin listens (recording.listening())."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(SUITE)
    pytester.runpytest("--modelparity-formats=tflite", "--modelparity-report=r.json", "-k", "close or scaled")
    doc = json.loads((pytester.path / "r.json").read_text())
    rows = [r for r in doc["rows"] if r["check"] == "outputs_close"]
    assert rows and all(r["max_rel"] is not None and r["max_ulp"] is not None for r in rows), rows
    assert all(r["error_histogram"] is not None for r in rows if r["max_abs"]), rows


def test_zero_code_mode_runs_the_built_in_suite_on_the_demo_model(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-v", "--modelparity-model=demo", "--modelparity-formats=keras,saved_model",
                                "--modelparity-report=r.json")
    result.assert_outcomes(passed=6)
    for check in ("outputs_close", "deterministic", "batch_invariant"):
        for fmt in ("keras", "saved_model"):
            result.stdout.fnmatch_lines([f"modelparity::test_{check}[[]{fmt}-cpu[]] PASSED*"])
    doc = json.loads((pytester.path / "r.json").read_text())
    check_document(doc)
    close = [r for r in doc["rows"] if r["check"] == "outputs_close"]
    assert close and all(r["runs"] > 1 for r in close)  # Hypothesis examples, merged per output
    assert {a["source"] for a in doc["artifacts"]} == {"demo"}


def test_zero_code_mode_takes_module_factory_and_reports_failures(pytester: pytest.Pytester) -> None:
    pytester.syspathinsert()
    pytester.makepyfile(mymodels='''
        import keras

        class Noise(keras.layers.Layer):
            """Random noise left active at inference (the seed 000 bug in Keras 3 form)."""
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.seed = keras.random.SeedGenerator(0)

            def call(self, x):
                return x + keras.random.uniform(keras.ops.shape(x), seed=self.seed)

        def build():
            x = keras.Input((4,), name="features")
            return keras.Model(x, Noise(name="noise")(keras.layers.Dense(8, name="h")(x)), name="leaky")
    ''')
    result = pytester.runpytest("--modelparity-model=mymodels:build", "--modelparity-formats=saved_model",
                                "-k", "deterministic")
    result.assert_outcomes(failed=1, deselected=2)
    result.stdout.fnmatch_lines(["*modelparity::test_deterministic[[]saved_model-cpu[]]*"])


def test_zero_code_mode_names_a_bad_source_once_as_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--modelparity-model=no_such_module:build", "--modelparity-formats=keras")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*module 'no_such_module' cannot be imported (working directory *",
                                 "*python -m pytest* puts the current directory on it*PYTHONPATH*"])


def test_zero_code_mode_with_a_missing_path_or_a_typo_is_one_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--modelparity-model=dmeo")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--modelparity-model=dmeo: '{pytester.path / 'dmeo'}' does not exist "
                                 f"(relative paths start from the directory pytest was started in: {pytester.path})"
                                 " (did you mean 'demo'?)*"])
    (pytester.path / "models").mkdir()
    (pytester.path / "models" / "classifier.keras").write_bytes(b"")
    result = pytester.runpytest("--modelparity-model=models/clasifier.keras")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*does not exist*(did you mean 'models/classifier.keras'?)*"])
    assert "FAILED" not in result.stdout.str()


def test_long_summary_keeps_the_failures_and_counts_the_rest(pytester: pytest.Pytester) -> None:
    """Past 40 rows the table shows only failing rows unless -v; nothing is lost silently."""
    pytester.makepyfile(textwrap.dedent('''
        import numpy as np
        import pytest
        from pytest_modelparity import assert_outputs_close

        @pytest.mark.parametrize("i", range(45))
        def test_many(i):
            assert_outputs_close(np.full(3, i, "float32"), np.full(3, i, "float32"))

        def test_bad():
            assert_outputs_close(np.ones(3, "float32"), np.zeros(3, "float32"))
    '''))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=45, failed=1)
    out = result.stdout.str()
    assert "test_bad" in out.split("model parity summary")[1]
    assert "test_many[3]" not in out.split("model parity summary")[1]
    result.stdout.fnmatch_lines(["... 45 more rows not shown (45 passed); -v shows every row*"])
    verbose = pytester.runpytest("-p", "no:cacheprovider", "-v").stdout.str()
    assert "test_many[3]" in verbose.split("model parity summary")[1]
    assert "more rows not shown" not in verbose


def test_long_summary_of_passes_only_prints_no_empty_table(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(textwrap.dedent('''
        import numpy as np
        import pytest
        from pytest_modelparity import assert_outputs_close

        @pytest.mark.parametrize("i", range(41))
        def test_many(i):
            assert_outputs_close(np.full(3, i, "float32"), np.full(3, i, "float32"))
    '''))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=41)
    summary = result.stdout.str().split("model parity summary")[1]
    assert "max abs" not in summary  # no header without rows under it
    result.stdout.fnmatch_lines(["41 rows, none failed, so none shown (41 passed); -v shows every row*"])
    assert "more rows not shown" not in summary  # "more" than what? No row was shown


EXPECTED_SUITE = textwrap.dedent('''
    import numpy as np
    import pytest
    from pytest_modelparity import ParityError, assert_outputs_close

    def test_caught():
        with pytest.raises(ParityError):
            assert_outputs_close(np.ones(3, "float32"), np.zeros(3, "float32"))

    @pytest.mark.xfail(reason="known int8 drift")
    def test_known_bad():
        assert_outputs_close(np.full(3, 2.0, "float32"), np.zeros(3, "float32"))

    def test_bad():
        assert_outputs_close(np.full(3, 5.0, "float32"), np.zeros(3, "float32"))

    @pytest.fixture
    def broken():
        raise RuntimeError("fixture exploded")

    def test_error(broken):
        pass

    def test_skipped():
        pytest.skip("no GPU here")

    def test_ok():
        assert_outputs_close(np.ones(3, "float32"), np.ones(3, "float32"))
''')


def test_expected_failures_are_not_fail_rows_and_tests_are_counted_apart_from_rows(
        pytester: pytest.Pytester) -> None:
    """A failure caught by pytest.raises or inside an xfail test is 'expected' in the terminal
    table, the JSON and the HTML; the JSON counts failing tests (not rows) with their reasons."""
    pytester.makepyfile(EXPECTED_SUITE)
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-report=r.json", "--modelparity-html=r.html")
    result.assert_outcomes(passed=2, failed=1, errors=1, skipped=1, xfailed=1)
    # the summary table only: with CI set, pytest's short summary prints whole messages
    table = result.stdout.str().split("model parity summary")[1].split("short test summary info")[0]
    fails = [ln for ln in table.splitlines() if " FAIL" in ln]
    assert len(fails) == 1 and "test_bad" in fails[0], table
    assert "test_caught" in table and "EXPECTED" in table
    doc = json.loads((pytester.path / "r.json").read_text())
    check_document(doc)
    summary = doc["summary"]
    assert (summary["failed"], summary["error"], summary["skipped"], summary["xfailed"], summary["passed"]) == \
        (1, 1, 1, 1, 2)
    assert (summary["rows_failed"], summary["rows_expected"], summary["rows_passed"]) == (1, 2, 1)
    verdicts = {r["nodeid"].split("::")[-1]: r for r in doc["rows"]}
    assert verdicts["test_caught"]["verdict"] == "expected"
    assert "pytest.raises" in verdicts["test_caught"]["expected_because"]
    assert verdicts["test_known_bad"]["verdict"] == "expected"
    assert "known int8 drift" in verdicts["test_known_bad"]["expected_because"]
    tests = {t["nodeid"].split("::")[-1]: t for t in doc["tests"]}
    assert "3 / 3 mismatched" in tests["test_bad"]["reason"] or "differs" in tests["test_bad"]["reason"]
    assert "fixture exploded" in tests["test_error"]["reason"] and tests["test_error"]["when"] == "setup"
    assert "no GPU here" in tests["test_skipped"]["reason"]
    assert "known int8 drift" in tests["test_known_bad"]["reason"]
    page = (pytester.path / "r.html").read_text()
    assert page.count("<b>FAIL</b>") == 1 and page.count("<b>EXPECTED</b>") == 2
    assert "fixture exploded" in page and "Tests that did not pass" in page


GIVEN_SUITE = textwrap.dedent('''
    import numpy as np
    from hypothesis import given, settings, strategies as st
    from hypothesis.extra.numpy import arrays
    from pytest_modelparity import assert_outputs_close

    def reference(x):
        return x

    def candidate(x):
        return x * 1.5 + 1.0

    @settings(max_examples=30, database=None, deadline=None)
    @given(arrays("float32", (4, 3), elements=st.floats(-10, 10, width=32)))
    def test_given_fails(batch):
        assert_outputs_close(candidate, reference, inputs=batch)
''')


def test_a_failing_given_test_is_diagnosed_once(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hypothesis fails, shrinks and replays many examples: the "Likely cause" diagnosis runs
    once, for the failure reported, and the report still carries it."""
    from pytest_modelparity import diagnose

    calls = []
    real = diagnose.diagnose_comparison

    def counting(report, **kwargs):
        calls.append(report)
        return real(report, **kwargs)

    monkeypatch.setattr(diagnose, "diagnose_comparison", counting)
    pytester.makepyfile(GIVEN_SUITE)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--modelparity-report=r.json")
    result.assert_outcomes(failed=1)
    assert len(calls) == 1, f"{len(calls)} diagnoses for one failing test"
    doc = json.loads((pytester.path / "r.json").read_text())
    (row,) = doc["rows"]
    assert row["verdict"] == "fail" and row["reported"] and row["runs"] > 1
