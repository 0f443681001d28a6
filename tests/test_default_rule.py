"""Issue 7's acceptance tests with the real Keras Dense 784->1024->10 model: float noise
passes by default, real bugs (input x255/256, one weight +1%) fail, exact mode still shows
the bitwise differences; calibrated mode tells noise from bugs the same way."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_modelparity import (ParityError, assert_batch_invariant, assert_outputs_close)

pytest.importorskip("keras", reason="needs Keras/TensorFlow: pip install -e '.[tensorflow]'")

import models  # noqa: E402  (tests/models.py)


@pytest.fixture(scope="module")
def dense():
    model = models.dense_784(0)
    x = np.random.default_rng(1000).uniform(0, 255, (64, 784)).astype("float32")
    batched = np.asarray(model(x))
    per_row = np.concatenate([np.asarray(model(x[i:i + 1])) for i in range(len(x))])
    return model, x, batched, per_row


def with_weight_changed(model, layer: str):
    """A copy of ``model`` whose largest-magnitude weight in ``layer`` is 1% larger."""
    import keras

    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    kernel, bias = copy.get_layer(layer).get_weights()
    index = np.unravel_index(np.abs(kernel).argmax(), kernel.shape)
    kernel[index] *= 1.01
    copy.get_layer(layer).set_weights([kernel, bias])
    return copy


def test_the_drift_is_real_float_noise(dense):
    """Guard: the case is what issue 7 describes (else the tests below prove nothing)."""
    _model, _x, batched, per_row = dense
    diff = np.abs(per_row - batched)
    assert diff.max() > 0                                   # batch and per-row differ...
    torch_fails = np.mean(diff > 1e-5 + 1.3e-6 * np.abs(batched))
    assert torch_fails > 0.05                               # ...enough to fail torch's defaults
    assert diff.max() / np.abs(batched).max() < 5e-6        # ...and it is float noise


def test_batch_invariant_passes_by_default(dense):
    model, x, _batched, _per_row = dense
    report = assert_batch_invariant(model, x, batch_sizes=(1, 7))
    assert report.passed
    assert all(o.tolerance.rule == "scaled" for o in report.outputs)


def test_outputs_close_batch_vs_per_row_passes_by_default(dense):
    model, x, _batched, per_row = dense
    report = assert_outputs_close(per_row, model, inputs=x)
    assert report.passed
    # a Keras reference: the bound is a multiple of the model's own float32 error
    assert report.outputs[0].tolerance.source.startswith("8 x the model's own float32 error")


def test_input_scaled_by_255_over_256_fails_by_default(dense):
    model, x, _batched, _per_row = dense
    with pytest.raises(ParityError) as info:
        assert_outputs_close(lambda b: model(b * (255 / 256)), model, inputs=x)
    out = info.value.report.outputs[0]
    assert out.mismatched / out.size > 0.5
    assert "scaled rule" in str(info.value)


@pytest.mark.parametrize("layer", ["fc1", "fc2"])
def test_one_weight_changed_by_one_percent_fails_by_default(dense, layer):
    model, x, _batched, _per_row = dense
    changed = with_weight_changed(model, layer)
    with pytest.raises(ParityError):
        assert_outputs_close(changed, model, inputs=x)


def test_exact_mode_reports_the_bitwise_differences(dense):
    model, x, _batched, _per_row = dense
    with pytest.raises(ParityError) as info:
        assert_batch_invariant(model, x, rtol=0, atol=0)
    out = info.value.report.outputs[0]
    assert out.tolerance.rtol == out.tolerance.atol == 0 and out.tolerance.scale == 0
    assert out.mismatched > out.size // 2 and out.max_ulp > 1
    assert "ULP" in str(info.value)


def test_calibrated_passes_noise_and_prints_the_floor(dense):
    model, x, _batched, per_row = dense
    report = assert_outputs_close(per_row, model, inputs=x, tolerance="calibrated")
    cal = report.meta["calibration"]
    assert cal["ratio"][""] < 2
    assert "x the reference's own float noise (floor" in cal["summary"]
    assert report.outputs[0].tolerance.source.startswith("calibrated")


def test_calibrated_fails_bugs(dense):
    model, x, _batched, _per_row = dense
    with pytest.raises(ParityError, match=r"max error [\d,]+x the reference's own float noise"):
        assert_outputs_close(lambda b: model(b * (255 / 256)), model, inputs=x, tolerance="calibrated")
    with pytest.raises(ParityError) as info:
        assert_outputs_close(with_weight_changed(model, "fc2"), model, inputs=x, tolerance="calibrated")
    assert info.value.report.meta["calibration"]["ratio"][""] > 8


def test_calibrated_batch_invariance(dense):
    model, x, _batched, _per_row = dense
    assert assert_batch_invariant(model, x, tolerance="calibrated").passed


# --- format-aware defaults through a real LiteRT LoadedModel ---------------------------

@pytest.fixture(scope="module")
def cnn_tflite(tmp_path_factory):
    pytest.importorskip("ai_edge_litert", reason="needs LiteRT: pip install -e '.[tflite]'")
    from pytest_modelparity import export_model, load_model

    model = models.tiny_cnn(0)
    x = models.images(64, seed=5)
    out = tmp_path_factory.mktemp("tflite")
    loaded = {}
    for variant in ("float32", "int8"):
        path = export_model(model, "tflite", out / f"cnn_{variant}.tflite", quantization=variant,
                            representative_data=[x])
        loaded[variant] = load_model(path, "tflite")
    return model, x, loaded


def test_int8_tflite_passes_its_measured_default_and_fails_the_float32_one(cnn_tflite):
    model, x, loaded = cnn_tflite
    int8 = loaded["int8"]
    assert getattr(int8, "format_variant", None) == "tflite:int8"
    report = assert_outputs_close(int8, lambda b: {"probs": model(b, training=False)}, inputs=x)
    tol = report.outputs[0].tolerance
    # no float sibling: the int8 budget against the reference; "probs" is a softmax: class scores
    assert "tflite:int8 quantisation budget for class scores vs the reference" in tol.source and tol.min_top1 == 0.95
    assert report.outputs[0].top1_agreement >= 0.9
    float32_default = dict(zip(("rtol", "atol", "scale"), (1.3e-6, 1e-5, 1e-5)))
    with pytest.raises(ParityError):
        assert_outputs_close(int8, lambda b: {"probs": model(b, training=False)}, inputs=x, **{
            k: v for k, v in float32_default.items() if k != "scale"})


def test_float32_tflite_passes_default_and_fails_a_preprocessing_bug(cnn_tflite):
    model, x, loaded = cnn_tflite
    lite = loaded["float32"]
    reference = lambda b: {"probs": model(b, training=False)}  # noqa: E731
    assert assert_outputs_close(lite, reference, inputs=x).passed
    with pytest.raises(ParityError):
        assert_outputs_close(lambda b: lite(b[..., ::-1]), reference, inputs=x)   # BGR vs RGB
