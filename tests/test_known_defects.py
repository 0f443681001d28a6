"""The converter defects catalogue: each entry caught and labelled known, or shown fixed.

Real converters and runtimes (TFLite MLIR + LiteRT, tf2onnx + onnxruntime, tensorflowjs +
Node.js). An entry that no longer reproduces must say so through the fixed path (the plugin
passes it and the bare converter agrees too), never by a silent pass.
"""

from __future__ import annotations

import pytest

from pytest_modelparity.checks.defect_status import status_here
from pytest_modelparity.checks.known_defects import CATALOGUE, label_failure
from pytest_modelparity.formats import missing_runtime


@pytest.mark.parametrize("entry", CATALOGUE, ids=[e.name for e in CATALOGUE])
def test_catalogue_entry_is_caught_or_shown_fixed(entry, tmp_path):
    missing = missing_runtime(entry.format, export=True)
    if missing is not None:
        pytest.skip(str(missing))
    status = status_here(entry, str(tmp_path))
    print(status)
    if status.plugin == entry.outcome:  # reproduces: caught, and labelled known (not "new")
        assert status.label == entry.name, status
        assert status.verdict == "caught"
    else:  # no longer reproduces through the plugin: only a clean pass is the fixed path
        assert status.plugin == "pass", status
        assert status.verdict in ("fixed", "avoided by the plugin's export route"), status
        assert status.label is None


def test_a_failure_outside_the_catalogue_is_new():
    from pytest_modelparity.checks.model_draw import DrawnModel, InputKind
    from pytest_modelparity.checks.model_steps import Dense, Math

    plain = DrawnModel(InputKind("vector", (8,)), (Dense(4), Math("abs")))
    assert label_failure(plain, "onnx") is None
    assert label_failure(CATALOGUE[0].model, "tflite") == CATALOGUE[0].name
    assert label_failure(CATALOGUE[0].model, "onnx") is None  # the signature is per converter


def test_the_diagnosis_names_the_op_tflite_ran_instead(tmp_path):
    from pytest_modelparity import ParityError, assert_outputs_close, export_model, load_model
    from pytest_modelparity.checks.known_defects import by_name

    drawn = by_name("tflite-l2-normalization-eps").model
    model = drawn.build()
    candidate = load_model(export_model(model, "tflite", tmp_path / "m.tflite"))
    try:
        ops = {op for _, op in candidate.op_types()}
        if "L2_NORMALIZATION" not in ops:
            pytest.skip(f"this TFLite converter no longer fuses the pattern (ops: {sorted(ops)}): the defect is fixed")
        with pytest.raises(ParityError) as caught:
            assert_outputs_close(candidate, model, inputs=drawn.batch()[0])
    finally:
        candidate.close()
    text = str(caught.value)
    assert "L2_NORMALIZATION" in text and "known: tflite-l2-normalization-eps" in text, text
