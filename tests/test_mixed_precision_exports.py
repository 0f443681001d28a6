"""Mixed-precision Keras models and the exporters (issue 18, item 5).

TFLite has no float16 kernels for Conv2D/MaxPool/Relu and no converter option makes it take
them: a ``mixed_*`` model is converted as a float32-policy trace of the same weights, the
route says so, and a model whose weights are float16 too gets an error naming its policy.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from pytest_modelparity import assert_outputs_close, export_model, load_model
from pytest_modelparity.errors import ExportError
from pytest_modelparity.formats import export_route

pytestmark = [pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker

MIXED_CNN = textwrap.dedent('''
    def mixed_cnn(policy="mixed_float16"):
        """conv -> relu -> maxpool -> dense under ``policy``, a float32 softmax head."""
        import keras

        keras.mixed_precision.set_global_policy(policy)
        try:
            keras.utils.set_random_seed(0)
            x = keras.Input((12, 12, 3), name="image")
            h = keras.layers.Conv2D(6, 3, activation="relu")(x)
            h = keras.layers.MaxPooling2D()(h)
            h = keras.layers.GlobalAveragePooling2D()(h)
            y = keras.layers.Dense(4, activation="softmax", dtype="float32", name="probs")(h)
            return keras.Model(x, y, name="mixed_cnn")
        finally:
            keras.mixed_precision.set_global_policy("float32")
''')
exec(MIXED_CNN)  # the same builder in-process and in the pytester conftest below


def _batch():
    return np.random.default_rng(0).uniform(0, 1, (4, 12, 12, 3)).astype("float32")


@pytest.mark.parametrize("quantization", [None, "float16", "dynamic_range"])
def test_mixed_float16_model_exports_to_tflite_as_a_float32_policy_trace(tmp_path, quantization):
    model = mixed_cnn()  # noqa: F821 - defined by exec above
    batch = _batch()
    before = np.asarray(model(batch, training=False))
    path = export_model(model, "tflite", tmp_path / "m.tflite", quantization=quantization)
    assert "mixed_float16 model traced with a float32 policy" in export_route(path)
    candidate = load_model(path)
    # the trace computed in float32: it differs from the float16 reference by the reference's
    # own rounding, which the mixed-precision tolerance allows
    assert not np.array_equal(candidate.predict(batch)["probs"], before)
    assert_outputs_close(candidate, load_model(model), inputs=batch)
    # the user's model is left as it was: float16 layers, the same outputs bit for bit
    assert {layer.dtype_policy.name for layer in model.layers[1:-1]} == {"mixed_float16"}
    assert np.array_equal(np.asarray(model(batch, training=False)), before)


def test_mixed_model_int8_export_calibrates_the_float32_trace(tmp_path):
    model = mixed_cnn("mixed_bfloat16")  # noqa: F821
    batch = _batch()
    path = export_model(model, "tflite", tmp_path / "m.tflite", quantization="int8", representative_data=[batch])
    assert "mixed_bfloat16 model traced with a float32 policy" in export_route(path)
    assert load_model(path).format_variant == "tflite:int8"


def test_float16_weights_functional_model_is_rebuilt_in_float32(tmp_path):
    """A ``float16`` policy stores float16 weights, which a float32 policy cannot read: the
    functional model is rebuilt from its config in float32, its weights upcast exactly."""
    model = mixed_cnn("float16")  # noqa: F821
    path = export_model(model, "tflite", tmp_path / "m.tflite")
    assert "float16 model rebuilt from its config with a float32 policy" in export_route(path)
    assert_outputs_close(load_model(path), load_model(model), inputs=_batch())


def _float16_subclassed():
    import keras

    class Half(keras.Model):
        def __init__(self):
            super().__init__(dtype="float16")
            self.conv = keras.layers.Conv2D(4, 3, activation="relu", dtype="float16")
            self.pool = keras.layers.GlobalAveragePooling2D(dtype="float16")

        def call(self, x):
            return self.pool(self.conv(x))

    keras.utils.set_random_seed(0)
    model = Half()
    model(np.zeros((1, 12, 12, 3), "float16"))
    return model


@pytest.mark.parametrize("quantization", [None, "dynamic_range", "int8"])
def test_float16_weights_without_a_config_error_names_the_policy(tmp_path, quantization):
    model = _float16_subclassed()  # float16 weights, no config to rebuild it from
    with pytest.raises(ExportError) as info:
        export_model(model, "tflite", tmp_path / "m.tflite", quantization=quantization,
                     representative_data=[_batch().astype("float16")] if quantization == "int8" else None)
    text = str(info.value)
    assert "Keras dtype policy 'float16'" in text
    assert "Conv2D" in info.value.unsupported_ops
    assert "mixed_float16" in info.value.fix and "onnx" in info.value.fix
    assert "dynamic_range" not in info.value.fix  # it fails the same way: never the advice
    assert not (tmp_path / "m.tflite").exists()


@pytest.mark.parametrize("policy", ["mixed_float16", "float16"])
def test_onnx_runs_half_precision_graphs_as_they_are(tmp_path, policy):
    model = mixed_cnn(policy)  # noqa: F821
    path = export_model(model, "onnx", tmp_path / "m.onnx")
    assert_outputs_close(load_model(path), load_model(model), inputs=_batch())


@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
def test_plugin_reports_the_route_of_a_mixed_precision_tflite_export(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(MIXED_CNN + textwrap.dedent('''
        import pytest

        @pytest.fixture(scope="session")
        def modelparity_source():
            return mixed_cnn()
    '''))
    pytester.makepyfile(test_parity='''
        from pytest_modelparity import assert_outputs_close

        def test_parity(parity_candidate, parity_reference, parity_batch):
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
    ''')
    result = pytester.runpytest("--modelparity-formats=tflite,tflite:float16,tfjs", "--modelparity-report=r.json",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["modelparity: tflite of 'mixed_cnn' was exported as a mixed_float16 model "
                                 "traced with a float32 policy*",
                                 "modelparity: tflite:float16 of 'mixed_cnn' was exported as a mixed_float16*"])
    assert "tfjs of 'mixed_cnn' was exported" not in result.stdout.str()  # tfjs runs the float16 graph
    artifacts = {a["format"]: a for a in json.loads((pytester.path / "r.json").read_text())["artifacts"]}
    assert "traced with a float32 policy" in artifacts["tflite"]["route"]
    assert "float32 policy" not in artifacts["tfjs"].get("route", "")


def test_subclassed_mixed_model_is_fed_float32_and_exports_to_tflite(tmp_path):
    """Both items at once: a subclassed model under mixed_float16 takes float32 inputs (its
    variable dtype; Keras' input_dtype would say float16) and converts as a float32 trace."""
    import keras

    class Head(keras.Model):
        def __init__(self):
            super().__init__()
            self.conv = keras.layers.Conv2D(4, 3, activation="relu")
            self.pool = keras.layers.GlobalAveragePooling2D()
            self.dense = keras.layers.Dense(3, dtype="float32")

        def call(self, x):
            return self.dense(self.pool(self.conv(x)))

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        model = Head()
        model(np.zeros((1, 12, 12, 3), "float32"))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    ref = load_model(model)
    assert ref.compute_dtype == "float16" and ref.inputs[0].dtype == np.float32
    path = export_model(model, "tflite", tmp_path / "m.tflite")
    assert "traced with a float32 policy" in export_route(path)
    assert_outputs_close(load_model(path), ref, inputs=_batch())
