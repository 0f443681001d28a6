"""Issue 50: the int8 advice names the ops to keep in float by what keeping them gains,
measured by re-quantising once (diagnose/quantization.py ``try_keeping``), and gives no such
advice where it gains little. Real conversions of tiny nets (tests/quant_models.py), each
under a second."""

from __future__ import annotations

import json
import re
import textwrap

import numpy as np
import pytest

from pytest_modelparity import export_model, load_model
from pytest_modelparity.diagnose import quantization

import quant_models

pytestmark = [pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py

FIGURES = re.compile(r"relative RMS error went from ([\d.e+-]+) to ([\d.e+-]+)")
CALIBRATION = [quant_models.rows(8, seed) for seed in range(8)]


def _files(model, where):
    quantized = export_model(model, "tflite", where / "q.tflite", quantization="int8", representative_data=CALIBRATION)
    return quantized, export_model(model, "tflite", where / "f.tflite")


def _requantizer(model, where, calls):
    """What the session attaches: the same int8 export with the named nodes in float."""
    def requantize(names):
        calls.append(list(names))
        return load_model(export_model(model, "tflite", where / f"kept{len(calls)}.tflite", quantization="int8",
                                       representative_data=CALIBRATION, converter_options={"float_nodes": names}))
    return requantize


def _hint(model, where, *, attach=True):
    quantized, sibling = _files(model, where)
    calls: list = []
    with load_model(quantized) as q, load_model(sibling) as f:
        if attach:
            q.requantize = _requantizer(model, where, calls)
        costs = quantization.layer_costs(q, f, quant_models.rows(32, 99))
        found = quantization.cost_hint(q, f, quant_models.rows(32, 99), "int8")
    assert found is not None
    return found, costs, calls


def test_an_outlier_tensor_is_kept_in_float_with_the_op_that_reads_it(tmp_path):
    """The error shows at `d3`, but it is the int8 rounding of `wide`'s output: the advice
    keeps the op that writes it too, and says what that gained."""
    (cause, message, evidence), costs, calls = _hint(quant_models.outlier_mlp(), tmp_path)
    assert cause == "quantization_cost"
    assert costs[0].layer == "d3" and any("wide" in name for name in costs[0].fed_by), costs[0]
    assert len(calls) == 1 and any("wide" in n for n in calls[0]) and any("d3" in n for n in calls[0]), calls
    before, after = map(float, FIGURES.search(message).groups())
    assert after <= quantization.HELPS * before, message
    assert "keep them" in message and "in float (measured:" in message and "barely helps" not in message, message
    assert f'"float_nodes": {calls[0]!r}' in message  # the call that was measured is the one advised
    assert "measured: re-quantised with these" in evidence


def test_keeping_the_costliest_op_alone_gains_little_where_its_input_is_the_cost(tmp_path):
    """Why the feeders: the costliest op kept alone (what the advice named before) barely helps."""
    model = quant_models.outlier_mlp()
    quantized, sibling = _files(model, tmp_path)
    with load_model(quantized) as q, load_model(sibling) as f:
        costs = quantization.layer_costs(q, f, quant_models.rows(32, 99))
        q.requantize = _requantizer(model, tmp_path, [])
        alone = quantization.try_keeping(q, f, quant_models.rows(32, 99), [costs[0].tensor])
    assert alone.after is not None and not alone.helps, alone


def test_a_cost_spread_over_the_graph_gets_no_keep_in_float_advice(tmp_path):
    (cause, message, evidence), costs, calls = _hint(quant_models.deep_tanh(), tmp_path)
    before, after = map(float, FIGURES.search(message).groups())
    assert after > quantization.HELPS * before, message
    assert "keeping them in float barely helps (measured:" in message, message
    assert "tflite:dynamic_range" in message and "--modelparity-quant-budget" in message
    assert not message.split("barely helps")[1].startswith(")") and "keep them in float" not in message


def test_a_file_the_session_did_not_export_says_the_gain_was_not_measured(tmp_path):
    (cause, message, evidence), _, calls = _hint(quant_models.outlier_mlp(), tmp_path, attach=False)
    assert not calls and "in float (not measured):" in message, message
    assert "was not measured: the file was not exported by this session" in evidence, evidence


def test_a_failing_requantisation_gives_the_advice_unmeasured_with_the_reason(tmp_path):
    quantized, sibling = _files(quant_models.outlier_mlp(), tmp_path)

    def broken(names):
        raise RuntimeError("QuantizationDebugger: no node named so")

    with load_model(quantized) as q, load_model(sibling) as f:
        q.requantize = broken
        cause, message, evidence = quantization.cost_hint(q, f, quant_models.rows(32, 99), "int8")
    assert "(not measured)" in message
    assert "the re-quantisation failed (RuntimeError: QuantizationDebugger: no node named so)" in evidence


def test_a_slow_int8_export_is_not_redone_by_the_diagnosis(tmp_path):
    quantized, sibling = _files(quant_models.outlier_mlp(), tmp_path)
    calls: list = []
    with load_model(quantized) as q, load_model(sibling) as f:
        q.requantize = _requantizer(quant_models.outlier_mlp(), tmp_path, calls)
        q.requantize_seconds = quantization.REQUANTIZE_BUDGET_S + 1
        _, message, evidence = quantization.cost_hint(q, f, quant_models.rows(32, 99), "int8")
    assert not calls and "its int8 export took 61 s" in evidence, evidence


SUITE = textwrap.dedent('''
    import pytest
    from pytest_modelparity import ParityError, assert_outputs_close

    def test_int8(parity_candidate, parity_reference, parity_batch):
        with pytest.raises(ParityError) as info:
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
        hint = next(h for h in info.value.report.hints if h.cause == "quantization_cost")
        print("ADVICE", hint.message)
        print("EVIDENCE", hint.evidence.splitlines()[-1])
''')


def test_the_session_measures_its_advice_on_its_own_int8_export(pytester, request):
    """Through the fixtures: the int8 candidate is re-exported by the session (same source and
    calibration rows, the named nodes in float), and the re-export is in the run's artifacts."""
    tests = str(request.path.parent)
    pytester.makeconftest(textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {tests!r})
        import numpy as np
        import pytest
        import quant_models

        @pytest.fixture(scope="session")
        def modelparity_source():
            return quant_models.outlier_mlp()

        @pytest.fixture(scope="session")
        def modelparity_dataset():
            return {{"x": np.concatenate([quant_models.rows(64, s) for s in range(2)])}}
    '''))
    pytester.makepyfile(test_q=SUITE)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-s", "--modelparity-formats=tflite:int8",
                                          "--modelparity-report=r.json")
    result.assert_outcomes(passed=1)
    text = result.stdout.str()
    advice = next(line.split("ADVICE ", 1)[1] for line in text.splitlines() if "ADVICE " in line)
    before, after = map(float, FIGURES.search(advice).groups())
    assert after <= quantization.HELPS * before and "in float (measured:" in advice, advice
    assert "wide" in advice and "d3" in advice, advice
    kept = re.search(r"with these (\d+) op\(s\) in float", advice).group(1)
    assert f"exporting tflite:int8 with {kept} node(s) kept in float" in text  # the status line says why
    routes = [a.get("route", "") for a in json.loads((pytester.path / "r.json").read_text())["artifacts"]]
    assert any(f"kept in float: {kept} node(s)" in r for r in routes), routes


def test_float_nodes_that_match_no_tensor_are_refused(tmp_path):
    """QuantizationDebugger ignores a name it does not find and writes the int8 file as without
    it; the export says so instead, naming what to pass."""
    with pytest.raises(ValueError, match=r"float_nodes: 1 of 1 name\(s\) match no tensor of the int8 file.*\['d3'\]"
                                         r".*full tensor names the quantisation hint prints"):
        export_model(quant_models.outlier_mlp(), "tflite", tmp_path / "short.tflite", quantization="int8",
                     representative_data=CALIBRATION, converter_options={"float_nodes": ["d3"]})


def test_a_requantised_file_that_cannot_run_on_the_batch_keeps_the_hint_unmeasured(tmp_path):
    """The re-export exists but does not run on the failing batch (here another net, 8 inputs
    wide): the cost hint is still given, its advice said to be unmeasured, with the error."""
    from models import mlp

    quantized, sibling = _files(quant_models.outlier_mlp(), tmp_path)
    other = export_model(mlp(seed=2, inputs=8), "tflite", tmp_path / "other.tflite")
    with load_model(quantized) as q, load_model(sibling) as f:
        q.requantize = lambda names: load_model(other)
        cause, message, evidence = quantization.cost_hint(q, f, quant_models.rows(32, 99), "int8")
    assert cause == "quantization_cost" and "(not measured)" in message, message
    assert "running the re-quantised file failed (" in evidence, evidence
