"""The float64 shadow reference (issue 10): the default bound knows the model.

Real TensorFlow and Keras, tiny models built here; one random-weight Keras Applications net
(MobileNetV2 features at 32x32) for the vacuous-comparison acceptance case.
"""

from __future__ import annotations

import numpy as np
import pytest

from models import dense_784, images, mlp, tiny_cnn
from pytest_modelparity import ParityError, assert_batch_invariant, assert_outputs_close, load_model
from pytest_modelparity.floor import measure as shadow
from pytest_modelparity.verdict.tolerances import SHADOW_MULTIPLE, shadow_tolerance

pytest.importorskip("tensorflow", reason="the shadow needs TensorFlow: pip install 'pytest-modelparity[tensorflow]'")


def _off(model, x, factor):
    return {k: v * factor for k, v in model.predict(x).items()}


def test_twin_is_float64_cached_and_close():
    model = tiny_cnn(seed=3)
    ref = load_model(model)
    twin = shadow.twin_of(ref)
    assert twin.model is not None and twin.reason is None and twin.method == "keras"
    assert shadow.twin_of(ref) is twin                      # once per model
    x = images(4, seed=1)
    out64 = twin.model(x)["probs"]
    assert out64.dtype == np.float64
    err = shadow.relative_error(ref.predict(x)["probs"], out64)
    assert 0.0 <= err < 1e-5                                 # rounding, not a different model
    calls = []
    counted = shadow.Twin(twin.kind, model=lambda b: calls.append(1) or twin.model(b))
    first = shadow.outputs_of(counted, x)
    again = shadow.outputs_of(counted, x.copy())             # same bytes: one float64 run
    assert calls == [1] and again is first
    shadow.outputs_of(counted, x + 1)
    assert calls == [1, 1]


def test_default_bound_is_a_multiple_of_the_models_own_error():
    model = dense_784()
    ref = load_model(model)
    x = np.random.default_rng(0).uniform(0, 255, (8, 784)).astype("float32")
    report = assert_outputs_close(ref, ref, inputs=x)
    tol = report.outputs[0].tolerance
    assert tol.source.startswith(f"{SHADOW_MULTIPLE:g} x the model's own float32 error") and tol.default
    measured = report.meta["noise_floor"]["['fc2']"]["float64"]
    assert tol.scale == pytest.approx(SHADOW_MULTIPLE * max(measured, 8 * np.finfo(np.float32).eps))
    # (a run on a warm cache adds that the floor was read from the floor cache: exports/floor_cache.py)
    assert report.meta["shadow"]["float64"].startswith("measured by the Keras twin")
    # 1e-4 of scale: inside the fixed rule (4e-4, arrays against arrays), a clear failure
    # against this model, whose own float32 error is ~1e-7
    off = _off(ref, x, 1 + 1e-4)
    assert_outputs_close(off, ref.predict(x))
    with pytest.raises(ParityError, match="the model's own float32 error"):
        assert_outputs_close(off, ref, inputs=x)


def test_a_failure_under_the_default_is_never_called_noise():
    # ~100 ULP of scale on a 784-term reduction: the old hint said "float rounding noise, not
    # a conversion error" under FAILED; beyond 8x the model's own error it is not noise.
    model = dense_784()
    ref = load_model(model)
    x = np.random.default_rng(1).uniform(0, 255, (8, 784)).astype("float32")
    off = _off(ref, x, 1 + 1.2e-5)
    with pytest.raises(ParityError) as err:
        assert_outputs_close(off, ref, inputs=x)
    assert "accumulation_noise" not in [h.cause for h in err.value.report.hints]
    assert "not a conversion error" not in str(err.value)
    # asked for exact equality, the same difference is explained as noise
    with pytest.raises(ParityError) as err:
        assert_outputs_close(_off(ref, x, 1 + 2e-7), ref.predict(x), rtol=0, atol=0)
    assert "accumulation_noise" in [h.cause for h in err.value.report.hints]


def test_batch_invariance_of_a_keras_model_uses_the_shadow():
    model = dense_784()
    x = np.random.default_rng(2).uniform(0, 255, (6, 784)).astype("float32")
    report = assert_batch_invariant(model, x, batch_sizes=(1, 4))
    assert all("from a float64 run" in o.tolerance.source for o in report.outputs)


def test_a_model_keras_cannot_rebuild_gets_the_graph_twin():
    import keras

    class Doubler(keras.layers.Layer):   # not registered: from_config cannot rebuild it
        def call(self, x):
            return x * 2.0

    x_in = keras.Input((4,), name="x")
    model = keras.Model(x_in, keras.layers.Dense(3)(Doubler()(x_in)))
    ref = load_model(model)
    x = np.random.default_rng(0).normal(size=(4, 4)).astype("float32")
    report = assert_outputs_close(ref, ref, inputs=x)
    assert report.meta["shadow"]["twin"] == "graph"
    assert "Keras twin: the model could not be rebuilt" in report.meta["shadow"]["float64"]
    assert "from a float64 run of its graph twin" in report.outputs[0].tolerance.source


def test_a_reference_without_a_twin_falls_back_and_says_why_and_what_it_costs():
    model = mlp(seed=0)
    ref = load_model(model)
    x = np.random.default_rng(0).normal(size=(4, 16)).astype("float32")
    plain = lambda b: ref.predict(b)  # noqa: E731 - a Python function: no TensorFlow graph to twin
    report = assert_outputs_close(ref, plain, inputs=x)
    tol = report.outputs[0].tolerance
    assert tol.source == "built-in float32 (scaled rule), no float64 floor"
    assert tol.floor_note.startswith("no float64 twin (function is not a TensorFlow model")
    assert "the fixed rule allows 4.0e-04 of scale, 4x to 2,353x the float32 error" in tol.floor_note
    assert report.outputs[0].to_dict()["tolerance"]["floor_note"] == tol.floor_note
    with pytest.raises(ParityError) as err:                 # and the failure text says it too
        assert_outputs_close(_off(ref, x, 1.01), plain, inputs=x)
    assert "  Noise floor: no float64 twin (" in str(err.value)
    # arrays against arrays: no model, no twin to miss, nothing to say
    arrays = assert_outputs_close(ref.predict(x), ref.predict(x))
    assert arrays.outputs[0].tolerance.floor_note is None


def test_mixed_precision_error_is_measured_and_named():
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x_in = keras.Input((16,), name="x")
        h = keras.layers.Dense(32, activation="relu")(x_in)
        out = keras.layers.Dense(4, dtype="float32", name="y")(h)
        model = keras.Model(x_in, out)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    ref = load_model(model)
    x = np.random.default_rng(0).normal(size=(8, 16)).astype("float32")
    report = assert_outputs_close(ref, ref, inputs=x)
    tol = report.outputs[0].tolerance
    assert "float16 (mixed precision) error" in tol.source
    assert report.meta["noise_floor"]["['y']"]["float64"] > 1e-5   # float16 arithmetic, measured


def test_tflite_float16_is_judged_by_what_float16_weights_cost(tmp_path):
    from pytest_modelparity import export_model

    pytest.importorskip("ai_edge_litert", reason="pip install 'pytest-modelparity[tflite]'")
    model = tiny_cnn(seed=1)
    ref = load_model(model)
    cand = load_model(export_model(model, "tflite", tmp_path / "m.tflite", quantization="float16"))
    assert cand.format_variant == "tflite:float16"
    x = images(8, seed=2)
    report = assert_outputs_close(cand, ref, inputs=x)
    tol = report.outputs[0].tolerance
    assert "what float16 weights cost the model" in tol.source
    assert report.meta["noise_floor"]["['probs']"]["float16 weights"] > 0
    # the bound follows what float16 weights cost: an error 20x that fails
    cost = report.meta["noise_floor"]["['probs']"]["float16 weights"]
    off = {"probs": ref.predict(x)["probs"] * (1 + 20 * max(cost, 1e-4))}
    with pytest.raises(ParityError, match="float16 weights"):
        assert_outputs_close(off, ref.predict(x), tolerance=tol)


def test_random_weight_features_are_not_vacuous_and_the_256_bug_fails():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(weights=None, include_top=False, input_shape=(32, 32, 3))
    ref = load_model(model)
    x = np.random.default_rng(0).uniform(0, 1, (2, 32, 32, 3)).astype("float32")
    scale = float(np.abs(next(iter(ref.predict(x).values()))).max())
    assert scale < 1e-3                                    # collapsed, as random-weight nets do
    assert_outputs_close(ref, ref, inputs=x)                # the same model passes
    bug = lambda b: ref.predict({k: v * (255 / 256) for k, v in b.items()} if isinstance(b, dict)  # noqa: E731
                                else np.asarray(b) * (255 / 256))
    with pytest.raises(ParityError):
        assert_outputs_close(bug, ref, inputs=x)
    # the first version's atol=1e-5 made this check unable to fail: now it says so
    with pytest.raises(ParityError, match="vacuous comparison"):
        assert_outputs_close(bug, ref, inputs=x, rtol=1.3e-6, atol=1e-5)
    assert_outputs_close(bug, ref, inputs=x, rtol=1.3e-6, atol=1e-5, allow_vacuous=True)


def test_shadow_tolerance_rules():
    tol = shadow_tolerance("float32", 1e-4)
    assert tol.scale == pytest.approx(SHADOW_MULTIPLE * 1e-4) and (tol.rtol, tol.atol) == (0.0, 0.0)
    tiny = shadow_tolerance("float32", 0.0)
    assert tiny.scale == pytest.approx(SHADOW_MULTIPLE * 8 * np.finfo(np.float32).eps)
    assert "at least 8 eps" in tiny.source
    # quantised variants keep their fixed rule and top-1 check, never tighter than the shadow
    i8 = shadow_tolerance("float32", 1e-4, format="tflite:int8")
    assert i8.min_top1 == 0.9 and i8.scale >= tol.scale
    # on a GPU, never tighter than the GPU rule
    from pytest_modelparity import default_tolerance

    gpu = shadow_tolerance("float32", 1e-6, device="gpu")
    assert gpu.scale == default_tolerance("float32", device="gpu").scale
    assert shadow_tolerance("float32", 1e-2, device="gpu").scale == pytest.approx(SHADOW_MULTIPLE * 1e-2)


def test_explicit_tolerance_skips_the_shadow():
    model = mlp(seed=0)
    ref = load_model(model)
    x = np.random.default_rng(0).normal(size=(4, 16)).astype("float32")
    report = assert_outputs_close(ref, ref, inputs=x, rtol=1e-3, atol=1e-6)
    assert "shadow" not in report.meta and report.outputs[0].tolerance.source == "argument"


@pytest.mark.parametrize("kind", ["depthwise", "grouped"])
def test_depthwise_convolutions_run_fast_in_float64_and_compute_the_same(kind):
    """TF's CPU depthwise convolution has no fast float64 kernel (7x7: ~30x float32; it made
    ConvNeXtTiny's twin cost 25x a reference call): the twin computes it as shifted
    products, which must equal the float64 convolution for every stride and padding."""
    import keras

    rng = np.random.default_rng(0)
    for k, stride, padding, size in [(3, 1, "same", 9), (7, 1, "same", 10), (5, 2, "same", 9),
                                     (3, 2, "valid", 10), (7, 2, "valid", 9)]:
        x_in = keras.Input((size, size, 4), dtype="float64")
        layer = (keras.layers.DepthwiseConv2D(k, strides=stride, padding=padding, dtype="float64")
                 if kind == "depthwise" else
                 keras.layers.Conv2D(4, k, strides=stride, padding=padding, groups=4, dtype="float64"))
        model = keras.Model(x_in, layer(x_in))
        from pytest_modelparity.floor.keras_twin import float64_twin

        twin = float64_twin(model)
        assert any(type(lyr).__name__.startswith("ModelparityFloat64") for lyr in twin.layers)
        x = rng.normal(size=(2, size, size, 4))
        want, got = np.asarray(model(x)), np.asarray(twin(x))
        assert got.shape == want.shape and got.dtype == np.float64
        assert np.abs(got - want).max() <= 1e-13 * np.abs(want).max()
