"""A transpose is a slip only when the forms differ by it, and heads pair only on their own
grid (issue 50): a 1% kernel change in a Dense on a rank-3 tensor (Keras runs it as a
Tensordot, with its own transposes, in every form) is never called a channels-first slip, and a
detector's stride-16 head change is found at the stride-16 layer, not at a stride-8 head that
happens to hold as many values."""

from __future__ import annotations

import numpy as np
import pytest

from models import trained_like
from pytest_modelparity import ParityError, assert_outputs_close, export_model, load_model
from pytest_modelparity.diagnose.localize import _agrees_permuted, _pairable

SLIP = "transpose only the candidate"


def _planted(build, layer: str, factor: float = 1.01):
    """(reference, the same net with ``layer``'s kernel times ``factor``)."""
    ref = build()
    bug = build()
    bug.set_weights(ref.get_weights())
    weights = bug.get_layer(layer).get_weights()
    bug.get_layer(layer).set_weights([weights[0] * factor] + weights[1:])
    return ref, bug


def _biased(model, seed: int = 1):
    """Biases as training leaves them (a ReLU net with zero biases is homogeneous: a kernel
    change there is an output scale, which hides the layer)."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        weights = layer.get_weights()
        if len(weights) == 2:
            layer.set_weights([weights[0], rng.normal(0, 0.1, weights[1].shape).astype("float32")])
    return model


def _encoder():
    import keras

    keras.utils.set_random_seed(3)
    x = keras.Input((6, 8), name="patches")
    h = keras.layers.Dense(16, activation="relu", name="ffn0a")(x)
    h = keras.layers.Dense(8, name="ffn0b")(h)
    h = keras.layers.LayerNormalization(name="ln")(h + x)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    return keras.Model(x, keras.layers.Dense(3, name="out")(h), name="encoder")


@pytest.fixture(scope="module")
def encoder_pair():
    ref, bug = _planted(_encoder, "ffn0a")
    return ref, bug, np.random.default_rng(0).normal(size=(8, 6, 8)).astype("float32")


@pytest.mark.parametrize("fmt", ["saved_model", "tflite", "onnx"])
def test_a_kernel_change_in_a_dense_on_patches_is_no_layout_slip(encoder_pair, fmt, tmp_path):
    ref, bug, x = encoder_pair
    with pytest.raises(ParityError) as info:
        assert_outputs_close(load_model(export_model(bug, fmt, tmp_path / "bug")), ref, inputs=x)
    hints = info.value.report.hints
    assert hints, str(info.value)
    assert not [h for h in hints if SLIP in h.message or "channels-first" in h.message], [str(h) for h in hints]
    named = [h for h in hints if "ffn0a" in h.message]  # the weights (SavedModel) or the layer table
    assert named, [str(h) for h in hints]


def _detector():
    import keras

    keras.utils.set_random_seed(5)
    x = keras.Input((32, 32, 3), name="image")
    h = keras.layers.Conv2D(8, 3, 2, padding="same", activation="relu", name="stem")(x)
    h = keras.layers.Conv2D(8, 3, 2, padding="same", activation="relu", name="c4")(h)
    s8 = keras.layers.Conv2D(8, 3, 2, padding="same", activation="relu", name="c8")(h)
    s16 = keras.layers.Conv2D(8, 3, 2, padding="same", activation="relu", name="c16")(s8)
    outs = {}
    for stride, features in (("s8", s8), ("s16", s16)):
        # heatmap_s8 (4, 4, 1) holds as many values as box_s16 (2, 2, 4): another grid
        outs[f"heatmap_{stride}"] = keras.layers.Conv2D(1, 1, name=f"heatmap_{stride}")(features)
        outs[f"box_{stride}"] = keras.layers.Conv2D(4, 1, name=f"box_{stride}")(features)
    return keras.Model(x, outs, name="detector")


def test_a_stride_16_change_is_found_at_stride_16_not_on_a_stride_8_head(tmp_path):
    x = np.random.default_rng(0).uniform(-1, 1, size=(8, 32, 32, 3)).astype("float32")

    def build():
        return _biased(trained_like(_detector(), x))

    ref, bug = _planted(build, "c16")
    with pytest.raises(ParityError) as info:
        assert_outputs_close(load_model(export_model(bug, "onnx", tmp_path / "bug.onnx")), ref, inputs=x)
    hints = info.value.report.hints
    layer = [h for h in hints if h.cause == "first_divergent_layer"]
    assert layer and "layer `c16`" in layer[0].message, [str(h) for h in hints]
    assert not [h for h in hints if "s8" in h.message], [str(h) for h in hints]


def test_undoing_a_permutation_is_what_makes_a_slip():
    rng = np.random.default_rng(0)
    nhwc = rng.normal(size=(2, 4, 5, 3))
    flat = nhwc.reshape(2, -1)
    channels_first = np.transpose(nhwc, (0, 3, 1, 2))
    # the port flattens channels-first: the same values in another order
    assert _agrees_permuted(flat, channels_first.reshape(2, -1), (2, 3, 4, 5), 1e-6)
    # a 1% change is no reordering, in any order
    assert not _agrees_permuted(flat, (channels_first * 1.01).reshape(2, -1), (2, 3, 4, 5), 1e-4)
    # the identity is never a permutation the candidate added
    assert not _agrees_permuted(flat, flat, (2, 4, 5, 3), 1e-6)


def test_tensors_pair_only_on_their_own_grid():
    assert _pairable((8, 4, 4, 1), (8, 16))            # a flatten
    assert _pairable((8, 4, 8, 8), (8, 8, 8, 4))       # the converter's channels-first layout
    assert _pairable((48, 16), (8, 6, 16))             # TFLite's FullyConnected on (B*T, D)
    assert not _pairable((8, 4, 4, 1), (8, 2, 2, 4))   # stride 8 against stride 16
