"""A Normalization folded into the convolution after it (issue 50), read back from the candidate.

Neither real converter folds a Keras Normalization into the next Conv2D or DepthwiseConv2D
(TF 2.21's TFLite converter keeps its `truediv`, tf2onnx its `truediv`: checked), so the fold
is a port's: a model with no Normalization whose convolution holds K / std per input channel
and b - sum K mean/std, exported for real to TFLite and ONNX. With the reference's statistics
it passes; with the mean off by half a standard deviation on one channel the failure names
that mean, read back from what the candidate's convolution computes; with one output channel
of the kernel changed instead, no statistics are claimed.
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_modelparity import ParityError, assert_outputs_close, export_model, load_model

pytest.importorskip("tensorflow", reason="exports need TensorFlow: pip install -e '.[all]'")

MEAN = [1.0, -2.0, 0.5]
VAR = np.array([4.0, 1.0, 9.0])


def _conv(depthwise: bool):
    import keras

    if depthwise:
        return keras.layers.DepthwiseConv2D(3, depth_multiplier=2, activation="relu", name="conv")
    return keras.layers.Conv2D(6, 3, activation="relu", name="conv")


def _reference(depthwise: bool):
    import keras

    keras.utils.set_random_seed(0)
    x = keras.Input((10, 10, 3), name="image")
    h = keras.layers.Normalization(mean=MEAN, variance=VAR, name="norm")(x)
    h = keras.layers.GlobalAveragePooling2D(name="gap")(_conv(depthwise)(h))
    model = keras.Model(x, keras.layers.Dense(2, name="out")(h))
    kernel, bias = model.get_layer("conv").get_weights()
    model.get_layer("conv").set_weights([kernel, np.random.default_rng(1).normal(0, 0.3, bias.shape).astype("float32")])
    return model


def _folded(reference, mean, depthwise: bool, channel_scale: float = 1.0):
    """``reference`` without its Normalization, folded into `conv` with ``mean``; output channel 0
    of the kernel times ``channel_scale``."""
    import keras

    std = np.sqrt(VAR)
    kernel, bias = reference.get_layer("conv").get_weights()
    x = keras.Input((10, 10, 3), name="image")
    h = keras.layers.GlobalAveragePooling2D(name="gap")(_conv(depthwise)(x))
    port = keras.Model(x, keras.layers.Dense(2, name="out")(h))
    shift = (np.asarray(mean) / std)[None, None, :, None] * kernel
    new_bias = bias - (shift.sum(axis=(0, 1)).reshape(-1) if depthwise else shift.sum(axis=(0, 1, 2)))
    new_kernel = kernel / std[None, None, :, None]
    new_kernel[..., 0] *= channel_scale
    port.get_layer("conv").set_weights([new_kernel.astype("float32"), new_bias.astype("float32")])
    port.get_layer("out").set_weights(reference.get_layer("out").get_weights())
    return port


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    return np.random.default_rng(3).normal(size=(8, 10, 10, 3)).astype("float32") * 2


@pytest.mark.parametrize("depthwise", [False, True], ids=["conv2d", "depthwise"])
@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_a_normalization_folded_into_a_convolution_has_its_mean_shift_read_back(fmt, depthwise, rows, tmp_path):
    reference = _reference(depthwise)
    assert_outputs_close(load_model(export_model(_folded(reference, MEAN, depthwise), fmt, tmp_path / "ok")),
                         reference, inputs=rows)
    shifted = load_model(export_model(_folded(reference, [2.0, -2.0, 0.5], depthwise), fmt, tmp_path / "bug"))
    with pytest.raises(ParityError) as info:
        assert_outputs_close(shifted, reference, inputs=rows)
    hints = info.value.report.hints
    assert hints[0].cause == "preprocessing_state", [str(h) for h in hints]
    assert "Normalization `norm` (folded into `conv` in the candidate) runs in the candidate with mean 2 where the " \
           "reference has 1 (0.5 of a standard deviation) on feature 0" in hints[0].message, str(hints[0])
    assert "1 of 3 features differ" in hints[0].evidence, str(hints[0])


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_a_changed_kernel_channel_in_a_folded_convolution_claims_no_statistics(fmt, rows, tmp_path):
    reference = _reference(False)
    port = load_model(export_model(_folded(reference, MEAN, False, channel_scale=1.01), fmt, tmp_path / "k"))
    with pytest.raises(ParityError) as info:
        assert_outputs_close(port, reference, inputs=rows)
    causes = [h.cause for h in info.value.report.hints]
    assert "preprocessing_state" not in causes, [str(h) for h in info.value.report.hints]
