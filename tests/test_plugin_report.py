"""The JSON report (against docs/report-schema.md), the terminal summary and the zero-code suite."""

from __future__ import annotations

import json
import textwrap
from numbers import Real

import pytest

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded")]

CONFTEST = textwrap.dedent('''
    import pytest

    @pytest.fixture(scope="session")
    def modelparity_source():
        import keras
        x = keras.Input((6,), name="x")
        y = keras.layers.Dense(3, name="out", kernel_initializer=keras.initializers.GlorotUniform(seed=2))(x)
        return keras.Model(x, y, name="tiny")
''')

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
       "problem": (str, type(None)), "notes": list, "hints": list, "tolerance": (str, type(None)), "calibration": (str, type(None)),
       "tolerance_source": (str, type(None)), "tolerance_rule": (str, type(None)), "rtol": NUM, "atol": NUM,
       "scale": NUM, "error_histogram": (dict, type(None))}
TOP = {"schema": str, "schema_version": int, "created": str, "command": str, "environment": dict,
       "options": dict, "workers": int, "summary": dict, "tests": list, "artifacts": list, "rows": list}


def check_document(doc: dict) -> None:
    for key, kind in TOP.items():
        assert isinstance(doc.get(key), kind), (key, doc.get(key))
    assert doc["schema"] == "pytest-modelparity/report" and doc["schema_version"] == 1
    env = doc["environment"]
    assert set(env["packages"]) >= {"tensorflow", "keras", "numpy", "ai-edge-litert", "onnxruntime", "tf2onnx",
                                    "tensorflowjs", "pytest-modelparity"}
    assert set(doc["summary"]) == {"comparisons", "rows", "passed", "failed", "tests"}
    assert doc["summary"]["rows"] == len(doc["rows"])
    assert doc["summary"]["passed"] + doc["summary"]["failed"] == len(doc["rows"])
    for test in doc["tests"]:
        assert test["outcome"] in {"passed", "failed", "error", "skipped", "xfailed", "xpassed"}
    for art in doc["artifacts"]:
        assert {"source", "format", "path", "seconds"} <= set(art)
    for row in doc["rows"]:
        for key, kind in ROW.items():
            assert isinstance(row.get(key), kind), (key, row.get(key))
        assert row["verdict"] in ("pass", "fail") and row["check"] in ("outputs_close", "deterministic",
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


def test_zero_code_mode_names_a_bad_source(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--modelparity-model=no_such_module:build", "--modelparity-formats=keras",
                                "-k", "outputs_close")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cannot import 'no_such_module:build'*"])


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
    result.stdout.fnmatch_lines(["*45 more rows not shown (45 of 46 passed)*-v shows every row*"])
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
    result.stdout.fnmatch_lines(["*41 more rows not shown (41 of 41 passed)*"])
