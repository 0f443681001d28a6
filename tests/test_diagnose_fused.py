"""Causes for a 1% kernel change (issue 27): a subclassed net's TFLite form gets one (its ops
are traced, their layer scopes pair with the file's tensors), and a fused TFLite op
(CONV_2D + BN + ReLU) is set against the Keras layer whose output it holds, not the conv."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_modelparity import ParityError, assert_outputs_close, export_model, load_model


@pytest.fixture(scope="module")
def digits():
    from digits import digits_cnn

    return digits_cnn()


def _first(info) -> object:
    hint = next(h for h in info.value.report.hints if h.cause == "first_divergent_layer")
    return hint


def test_subclassed_net_kernel_change_in_its_tflite_form_gets_a_cause(tmp_path):
    from families import subclassed_cnn

    model, x = subclassed_cnn()
    bug, _ = subclassed_cnn()
    bug.set_weights([w * 1.01 if i == 0 else w for i, w in enumerate(model.get_weights())])  # conv kernel x1.01
    path = export_model(bug, "tflite", tmp_path / "bug.tflite")
    with pytest.raises(ParityError) as info:
        assert_outputs_close(load_model(path), model, inputs=x)
    hint = _first(info)
    assert "conv2d" in hint.message and "Relu" in hint.message, hint.message
    rel = float(hint.evidence.split("(rel ")[1].split(")")[0])
    assert 0.005 < rel < 0.03, hint.evidence  # the 1% change itself, not a fused tensor vs a pre-ReLU one


def test_fused_conv_bn_relu_pairs_with_the_relu_layer(tmp_path, digits):
    import keras

    model, _, x_test = digits
    bug = keras.models.clone_model(model)
    bug.set_weights(model.get_weights())
    kernel, bias = bug.get_layer("conv1").get_weights()
    bug.get_layer("conv1").set_weights([kernel * 1.01, bias])
    path = export_model(bug, "tflite", tmp_path / "bug.tflite")
    with pytest.raises(ParityError) as info:
        assert_outputs_close(load_model(path), model, inputs=x_test[:16])
    hint = _first(info)
    assert "layer `relu1` (ReLU)" in hint.message, hint.message
    rel = float(hint.evidence.split("(rel ")[1].split(")")[0])
    assert rel < 0.05, hint.evidence  # it read "rel 13.2" against conv1's output before BN
    table = str(info.value)
    assert "conv1                    Conv2D                      -          -  fused into `relu1` in the candidate" \
        in table, table


def test_quantisation_cost_never_blames_a_weightless_softmax(tmp_path, digits):
    """An int8 file whose SOFTMAX output adds the second-largest relative error (it amplifies
    the logits' error): the blame goes to the FULLY_CONNECTED that feeds it, never the SOFTMAX."""
    import warnings

    import keras

    from pytest_modelparity.diagnose.quantization import cost_hint, layer_costs

    model, x_train, x_test = digits
    probs = keras.Model(model.inputs, keras.layers.Softmax(name="probs")(model.outputs[0]))
    sibling = load_model(export_model(probs, "tflite", tmp_path / "f32.tflite"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = load_model(export_model(probs, "tflite", tmp_path / "int8.tflite", quantization="int8",
                                    representative_data=[x_train[:200]]))
    costs = layer_costs(q, sibling, x_test[:8])
    assert costs and all(c.op != "SOFTMAX" for c in costs), costs
    logits = next(c for c in costs if c.layer == "logits")
    assert logits.amplified_by == "SOFTMAX" and logits.added > 0
    cause, message, evidence = cost_hint(q, sibling, x_test[:8], "int8")
    assert "SOFTMAX" not in message and "with what the SOFTMAX after it amplifies" in evidence, (message, evidence)


def test_the_per_layer_quantisation_cost_runs_on_fewer_rows_where_a_row_keeps_many_elements(tmp_path, digits,
                                                                                             monkeypatch):
    """The runs that keep every tensor cost what they keep (issue 28: 48 s once): at most
    ``LAYER_ROWS`` rows, fewer where one row keeps more than ``LAYER_ELEMENTS / LAYER_ROWS``
    elements, one at least; the evidence says how many rows it measured."""
    import warnings

    from pytest_modelparity.diagnose import quantization
    from pytest_modelparity.formats.tflite.quant import float_intermediates

    model, x_train, x_test = digits
    sibling = load_model(export_model(model, "tflite", tmp_path / "f32.tflite"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = load_model(export_model(model, "tflite", tmp_path / "int8.tflite", quantization="int8",
                                    representative_data=[x_train[:100] * 0.25]))
    per_row = sum(v.size for v in float_intermediates(q, x_test[:1])[0].values())
    for budget, rows in ((10**9, quantization.LAYER_ROWS), (3 * per_row + 1, 3), (per_row // 2, 1)):
        monkeypatch.setattr(quantization, "LAYER_ELEMENTS", budget)
        found = quantization.cost_hint(q, sibling, x_test[:64], "int8")
        assert found is not None
        cause, message, evidence = found
        assert cause == "quantization_cost" and "`" in message
        assert f"over the batch's first {rows} row{'s' if rows > 1 else ''}:" in evidence, evidence


def test_an_int8_file_calibrated_on_data_x100_is_named_by_its_input_range(tmp_path, digits):
    """Issue 50: calibrated on the data x100, every judged input lies inside the file's range
    (nothing is clipped), but on a few of its 256 levels: the cause names the factor."""
    import warnings

    from pytest_modelparity import ParityError, assert_outputs_close

    model, x_train, x_test = digits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = load_model(export_model(model, "tflite", tmp_path / "x100.tflite", quantization="int8",
                                    representative_data=[x_train[:100] * 100.0]))
    with pytest.raises(ParityError) as info:
        assert_outputs_close(q, model, inputs=x_test[:32])
    hints = info.value.report.hints
    first = hints[0]
    assert first.cause == "calibration_range_mismatch", [str(h) for h in hints]
    assert "times wider" in first.evidence and "of its 256 levels" in first.evidence, first.evidence
    assert "inputs_outside_calibration" not in [h.cause for h in hints]
    assert not {"first_divergent_layer", "output_scaled"} & {h.cause for h in hints}, [str(h) for h in hints]
    # a file calibrated on the data itself is never told so
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        good = load_model(export_model(model, "tflite", tmp_path / "ok.tflite", quantization="int8",
                                       representative_data=[x_train[:100]]))
    from pytest_modelparity.diagnose.calibration import calibration_range_factor

    assert calibration_range_factor(good, x_test[:32]) is None
