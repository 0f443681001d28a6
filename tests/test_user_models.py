"""Models real users hand the plugin, beyond plain functional stacks (found in a user study).

Each test is a bug seen by running the plugin on such a model: dict inputs fed in the wrong
order, dict models refused by the TFLite/ONNX tracer, an adapted Normalization whose
constants became ONNX inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_modelparity import assert_batch_invariant, assert_outputs_close, export_model, load_model
from pytest_modelparity.checks.strategies import seeded_batch


def dict_in_dict_out():
    """Dict inputs whose insertion order differs from Keras' sorted flattening, dict outputs."""
    import keras

    keras.utils.set_random_seed(0)
    image, ids = keras.Input((3,), name="image"), keras.Input((2,), name="ids")
    h = keras.layers.Concatenate()([image, ids * 10.0])  # order matters: swapped inputs differ
    return keras.Model({"image": image, "ids": ids},
                       {"cls": keras.layers.Dense(2, name="cls")(h), "reg": keras.layers.Dense(1, name="reg")(h)})


def adapted_normalization():
    import keras

    keras.utils.set_random_seed(0)
    x = keras.Input((4,), name="x")
    norm = keras.layers.Normalization()
    norm.adapt(np.random.default_rng(0).uniform(0, 5, (16, 4)).astype("float32"))
    return keras.Model(x, keras.layers.Dense(2, name="y")(norm(x)))


def test_dict_inputs_are_fed_by_name_to_the_keras_reference():
    model = dict_in_dict_out()
    ref = load_model(model)
    batch = seeded_batch(ref, batch_size=3, seed=0)
    expected = model({"image": batch["image"], "ids": batch["ids"]}, training=False)
    got = ref.predict(batch)
    assert sorted(got) == ["cls", "reg"]
    for name in ("cls", "reg"):
        np.testing.assert_allclose(got[name], np.asarray(expected[name]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("format, name", [("tflite", "m.tflite"), ("onnx", "m.onnx")])
def test_dict_model_exports_and_matches(tmp_path, format, name):
    model = dict_in_dict_out()
    candidate = load_model(export_model(model, format, tmp_path / name), format)
    assert sorted(s.name for s in candidate.inputs) == ["ids", "image"]
    assert sorted(s.name for s in candidate.outputs) == ["cls", "reg"]
    ref = load_model(model)
    assert_outputs_close(candidate, ref, inputs=seeded_batch(ref, batch_size=3, seed=1))


@pytest.mark.parametrize("format, name", [("tflite", "m.tflite"), ("onnx", "m.onnx")])
def test_adapted_normalization_exports_with_its_constants(tmp_path, format, name):
    model = adapted_normalization()
    candidate = load_model(export_model(model, format, tmp_path / name), format)
    assert [s.name for s in candidate.inputs] == ["x"]  # not the mean and variance too
    ref = load_model(model)
    assert_outputs_close(candidate, ref, inputs=seeded_batch(ref, batch_size=3, seed=2))


SUBCLASSED_CONFTEST = '''
import numpy as np
import pytest

pytestmark = [pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker

def build():
    import keras

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            return self.dense(x)

    model = Sub()
    model(np.zeros((1, 5), "float32"))  # built, yet still no symbolic inputs in Keras 3
    return model

@pytest.fixture(scope="session")
def modelparity_source():
    return build()      # the model itself, not a factory
'''


@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
def test_subclassed_model_source_is_not_called_as_a_factory(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(SUBCLASSED_CONFTEST)
    pytester.makepyfile(test_parity='''
        def test_reference(parity_reference):
            assert [s.name for s in parity_reference.inputs] == ["x"]  # call's argument name
            assert parity_reference.predict([[1, 2, 3, 4, 5]])["output_0"].shape == (1, 3)
    ''')
    result = pytester.runpytest("--modelparity-formats=keras")
    result.assert_outcomes(passed=1)
    assert "missing a required argument" not in result.stdout.str()


def mixed_float16_model():
    """keras.mixed_precision 'mixed_float16': float16 layers, a float32 output (the usual recipe)."""
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        x = keras.Input((None, 4), name="seq")  # variable-length sequences too
        h = keras.layers.GlobalAveragePooling1D()(keras.layers.Dense(16, activation="relu")(x))
        return keras.Model(x, keras.layers.Dense(3, activation="softmax", dtype="float32", name="probs")(h))
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_mixed_precision_is_judged_by_the_float16_tolerance(tmp_path):
    model = mixed_float16_model()
    ref = load_model(model)
    assert ref.compute_dtype == "float16" and ref.outputs[0].dtype == np.float32
    assert load_model(adapted_normalization()).compute_dtype is None
    # ONNX runs the float16 graph in its own order: float16 noise on a float32 output, which
    # the float32 default failed (33% of elements, 5e-5 on a 0.45 output).
    onnx = load_model(export_model(model, "onnx", tmp_path / "m.onnx"), "onnx")
    batch = seeded_batch(ref, batch_size=8, seed=0)
    report = assert_outputs_close(onnx, ref, inputs=batch)
    assert "float16" in report.outputs[0].tolerance.source
    report = assert_batch_invariant(ref, batch, batch_sizes=(3,))
    assert "float16" in report.outputs[0].tolerance.source
    # float16-aware, not blind: outputs 1% off (a real bug's size) still fail.
    off = {"probs": onnx.predict(batch)["probs"] * 1.01}
    with pytest.raises(AssertionError, match="float16"):
        assert_outputs_close(off, ref, inputs=batch)
