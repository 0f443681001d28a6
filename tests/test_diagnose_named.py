"""Causes named with their exact factor or their wrap-around (issue 50): an input /255 is not
"divided by 256" (the factor is fitted to the rows), a pixel-range mismatch either way, a
generator's latent scaled x0.5, a weekday id shifted with wrap-around."""

from __future__ import annotations

import numpy as np
import pytest

from models import trained_like
from pytest_modelparity import ParityError, assert_outputs_close

MISLEADING = {"weights_differ", "weights_reinitialised", "first_divergent_layer", "output_scaled"}


def _first(info, cause: str):
    hints = info.value.report.hints
    assert hints and hints[0].cause == cause, [str(h) for h in hints]
    assert not [h for h in hints[1:] if h.cause in MISLEADING], [str(h) for h in hints]
    return hints[0]


def _body(seed: int = 4):
    """A small CNN on 16x16 RGB with trained-like statistics."""
    import keras

    keras.utils.set_random_seed(seed)
    x = keras.Input((16, 16, 3), name="image")
    h = keras.layers.Conv2D(8, 3, padding="same", name="conv")(x)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.ReLU(name="relu")(h)
    h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
    return keras.Model(x, keras.layers.Dense(5, name="logits")(h), name="body")


def _before(body, layer):
    """``body`` with ``layer`` applied to its input first (the candidate's own preprocessing)."""
    import keras

    x = keras.Input(body.input_shape[1:], name="image")
    return keras.Model(x, body(layer(x)), name=f"{layer.name}_then_body")


@pytest.fixture(scope="module")
def body():
    rng = np.random.default_rng(2)
    model = _body()
    trained_like(model, rng.uniform(-1, 1, (16, 16, 16, 3)).astype("float32"))
    return model


@pytest.mark.parametrize("divisor", [255.0, 256.0])
def test_an_input_division_is_named_by_its_exact_divisor(body, divisor):
    import keras

    raw = np.random.default_rng(3).uniform(0, 255, (8, 16, 16, 3)).astype("float32")
    reference = _before(body, keras.layers.Rescaling(1 / 255.0, name="ref_scale"))  # takes raw pixels
    candidate = _before(reference, keras.layers.Rescaling(1 / divisor, name="extra_scale"))
    with pytest.raises(ParityError) as info:
        assert_outputs_close(candidate, reference, inputs=raw)
    hint = _first(info, "input_scaling")
    assert f"divided by {divisor:g}" in hint.message, str(hint)
    other = 511 - divisor
    assert f"divided by {other:g}" not in hint.message, str(hint)
    assert f"the factor fitted to the rows is 1/{divisor:.0f}" in hint.evidence \
        or f"the factor fitted to the rows is 1/{divisor - 1:.0f}.9" in hint.evidence, str(hint)


@pytest.mark.parametrize("which", ["reference rescales", "candidate rescales"])
def test_a_pixel_range_mismatch_is_named_either_way(body, which):
    import keras

    rescale = keras.layers.Rescaling(1 / 127.5, offset=-1.0, name="to_unit")
    if which == "reference rescales":  # the reference takes 0..255, the candidate lost its rescaling
        reference, candidate = _before(body, rescale), body
        x = np.random.default_rng(4).uniform(-1, 1, (8, 16, 16, 3)).astype("float32")
        words = "multiplied by 127.5 and shifted by 127.5"
    else:  # the reference takes [-1, 1], the candidate rescales raw pixels it is not given
        reference, candidate = body, _before(body, rescale)
        x = np.random.default_rng(4).uniform(-1, 1, (8, 16, 16, 3)).astype("float32")
        words = "divided by 127.5 and shifted by -1"
    with pytest.raises(ParityError) as info:
        assert_outputs_close(candidate, reference, inputs=x)
    assert words in _first(info, "input_scaling").message


def _generator():
    import keras

    keras.utils.set_random_seed(6)
    z = keras.Input((16,), name="latent")
    h = keras.layers.Dense(32, activation="relu", name="project")(z)
    h = keras.layers.Dense(48, activation="tanh", name="pixels")(h)
    return keras.Model(z, keras.layers.Reshape((4, 4, 3), name="image")(h), name="generator")


def test_a_latent_scaled_by_half_is_named():
    import keras

    reference = _generator()
    rng = np.random.default_rng(5)
    for layer in reference.layers:  # biases as training leaves them
        w = layer.get_weights()
        if len(w) == 2:
            layer.set_weights([w[0], rng.normal(0, 0.2, w[1].shape).astype("float32")])
    z = keras.Input((16,), name="latent")
    candidate = keras.Model(z, reference(keras.layers.Rescaling(0.5, name="half")(z)))
    latent = rng.normal(size=(8, 16)).astype("float32")  # a normal latent reaches 2-3
    with pytest.raises(ParityError) as info:
        assert_outputs_close(candidate, reference, inputs=latent)
    assert "divided by 2" in _first(info, "input_scaling").message


def test_a_weekday_shifted_with_wrap_around_is_named():
    import keras

    keras.utils.set_random_seed(7)
    day = keras.Input((1,), dtype="int32", name="weekday")
    h = keras.layers.Flatten()(keras.layers.Embedding(7, 4, name="day_embedding")(day))
    reference = keras.Model(day, keras.layers.Dense(3, name="out")(h), name="by_weekday")
    shifted = keras.Input((1,), dtype="int32", name="weekday")
    candidate = keras.Model(shifted, reference(keras.ops.mod(shifted + 1, 7)))
    days = np.array([[0], [1], [2], [3], [4], [5], [6], [6]], "int32")
    with pytest.raises(ParityError) as info:
        assert_outputs_close(candidate, reference, inputs=days)
    assert "+ 1 modulo 7" in _first(info, "token_id_shift").message


def _tabular(mean):
    from models import normalized_tabular

    return normalized_tabular(mean)


@pytest.mark.parametrize("fmt", ["saved_model", "tflite"])
def test_a_normalization_mean_shift_is_read_back_from_an_exported_form(fmt, tmp_path):
    """The statistics are constants in the file (no weight differs): what the candidate computes
    at the Normalization gives them back, so the shift is named, not "look at its configuration"."""
    from pytest_modelparity import export_model, load_model

    reference = _tabular([1.0, -2.0, 0.5, 3.0])
    shifted = _tabular([2.0, -2.0, 0.5, 3.0])  # half a standard deviation (2) on feature 0
    shifted.set_weights(reference.get_weights())
    x = np.random.default_rng(3).normal(size=(8, 4)).astype("float32") * 2
    with pytest.raises(ParityError) as info:
        assert_outputs_close(load_model(export_model(shifted, fmt, tmp_path / "port")), reference, inputs=x)
    hint = _first(info, "preprocessing_state")
    assert "Normalization `norm` runs in the candidate with mean 2 where the reference has 1" in hint.message, hint
    assert "0.5 of a standard deviation" in hint.message and "look at its configuration" not in hint.message


def _folded(reference, mean):
    """``reference`` (tests/models.normalized_tabular) with its Normalization folded into the Dense
    after it, as a port that fuses it would hold it: W / s, b - W^T (mean / s); ``mean`` may be
    another than the reference's."""
    import keras

    std = np.sqrt([4.0, 1.0, 9.0, 0.25])
    kernel, bias = reference.get_layer("hidden").get_weights()
    x = keras.Input((4,), name="features")
    h = keras.layers.Dense(8, activation="relu", name="hidden")(x)
    folded = keras.Model(x, keras.layers.Dense(2, name="out")(h), name="tabular_folded")
    folded.get_layer("hidden").set_weights([kernel / std[:, None], bias - (np.asarray(mean) / std) @ kernel])
    folded.get_layer("out").set_weights(reference.get_layer("out").get_weights())
    return folded


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_a_normalization_folded_into_the_next_dense_has_its_shift_read_back(fmt, tmp_path):
    """The candidate has no Normalization tensor (folded into `hidden`'s weights): its statistics
    are solved from a plane fitted per unit of `hidden`, so the shift is named, not "its input
    `norm` could not be compared". The fold itself, with the reference's mean, passes."""
    from models import skip_unless_exportable
    from pytest_modelparity import export_model, load_model

    skip_unless_exportable([fmt])
    reference = _tabular([1.0, -2.0, 0.5, 3.0])
    x = np.random.default_rng(3).normal(size=(8, 4)).astype("float32") * 2
    assert_outputs_close(load_model(export_model(_folded(reference, [1.0, -2.0, 0.5, 3.0]), fmt, tmp_path / "ok")),
                         reference, inputs=x)
    shifted = load_model(export_model(_folded(reference, [2.0, -2.0, 0.5, 3.0]), fmt, tmp_path / "port"))
    with pytest.raises(ParityError) as info:
        assert_outputs_close(shifted, reference, inputs=x)
    hint = _first(info, "preprocessing_state")
    assert "Normalization `norm` (folded into `hidden` in the candidate) runs in the candidate with mean 2 where " \
           "the reference has 1 (0.5 of a standard deviation) on feature 0" in hint.message, hint
    assert "1 of 4 features differ" in hint.evidence, hint
