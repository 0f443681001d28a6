"""Subclassed Keras models as sources (issue 18, item 4).

A subclassed ``keras.Model`` has no symbolic inputs: its input specs come from the shapes it
was built or called with, or from ``modelparity_input_specs``; every form is made by tracing
it. ``.keras``/``.h5`` exist only when the class serialises; otherwise those formats are
"cannot be made from this source" (a skip in the default matrix).
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from pytest_modelparity import assert_outputs_close, export_model, load_model
from pytest_modelparity.errors import ModelLoadError, NotSerializable

pytestmark = [pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker

SUBCLASSED_SOURCE = textwrap.dedent('''
    import numpy as np
    import pytest

    def build(call_first=True):
        import keras

        class Classifier(keras.Model):
            def __init__(self):
                super().__init__()
                self.conv = keras.layers.Conv2D(4, 3, activation="relu")
                self.pool = keras.layers.GlobalAveragePooling2D()
                self.head = keras.layers.Dense(3)

            def call(self, image):
                return self.head(self.pool(self.conv(image)))

        keras.utils.set_random_seed(0)
        model = Classifier()
        if call_first:
            model(np.zeros((1, 8, 8, 3), "float32"))  # built: its input shape is known
        return model
''')

PARITY_TEST = '''
    from pytest_modelparity import assert_outputs_close

    def test_parity(parity_candidate, parity_reference, parity_batch):
        assert [s.name for s in parity_candidate.inputs] == ["image"]
        assert [s.name for s in parity_candidate.outputs] == ["output_0"]
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
'''


@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
def test_subclassed_model_is_a_plugin_source(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(SUBCLASSED_SOURCE + textwrap.dedent('''
        @pytest.fixture(scope="session")
        def modelparity_source():
            return build()
    '''))
    pytester.makepyfile(test_parity=PARITY_TEST)
    result = pytester.runpytest("-rs", "-v", "-p", "no:cacheprovider")
    for fmt in ("saved_model", "graphdef", "tflite", "onnx", "tfjs"):
        result.stdout.fnmatch_lines([f"*test_parity*{fmt}*PASSED*"])
    result.assert_outcomes(passed=5, skipped=2)  # keras, h5: the class has no config to rebuild it
    # traced like every form, it gets its own float64 floor from the graph twin
    result.stdout.fnmatch_lines(["*test_parity[[]tflite-cpu[]]*PASS*from a float64 run of its graph twin*"])
    result.stdout.fnmatch_lines(["*format 'keras' cannot be made from this source*the subclassed model "
                                 "Classifier does not serialise to keras*"])
    result.stdout.fnmatch_lines(["*format 'h5' cannot be made from this source*"])


@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
def test_unbuilt_subclassed_model_takes_its_specs_from_the_fixture(pytester: pytest.Pytester) -> None:
    source = SUBCLASSED_SOURCE + textwrap.dedent('''
        @pytest.fixture(scope="session")
        def modelparity_source():
            return build(call_first=False)
    ''')
    pytester.makeconftest(source)
    pytester.makepyfile(test_parity=PARITY_TEST)
    failed = pytester.runpytest("--modelparity-formats=tflite", "-p", "no:cacheprovider")
    failed.assert_outcomes(errors=1)
    failed.stdout.fnmatch_lines(["*the subclassed Keras model Classifier has no symbolic inputs and was never "
                                 "built or called*", "*fix:*modelparity_input_specs*"])
    pytester.makeconftest(source + textwrap.dedent('''
        @pytest.fixture(scope="session")
        def modelparity_input_specs():
            return [("image", (None, 8, 8, 3), "float32")]
    '''))
    passed = pytester.runpytest("--modelparity-formats=tflite,onnx", "-p", "no:cacheprovider")
    passed.assert_outcomes(passed=2)


def _two_headed():
    """A subclassed model whose ``call`` takes a dict and returns a dict."""
    import keras

    class TwoHeaded(keras.Model):
        def __init__(self):
            super().__init__()
            self.cls = keras.layers.Dense(2)
            self.reg = keras.layers.Dense(1)

        def call(self, inputs):
            joined = keras.ops.concatenate([inputs["image"], inputs["meta"] * 10.0], axis=-1)
            return {"reg": self.reg(joined), "cls": self.cls(joined)}

    keras.utils.set_random_seed(0)
    return TwoHeaded()


def test_dict_subclassed_model_exports_by_input_and_output_name(tmp_path):
    model = _two_headed()
    model({"image": np.zeros((1, 3), "float32"), "meta": np.zeros((1, 2), "float32")})
    ref = load_model(model)
    assert [s.name for s in ref.inputs] == ["image", "meta"]
    assert [s.name for s in ref.outputs] == ["cls", "reg"]
    batch = {"meta": np.full((3, 2), 0.5, "float32"), "image": np.arange(9, dtype="float32").reshape(3, 3)}
    for fmt, name in (("tflite", "m.tflite"), ("onnx", "m.onnx"), ("saved_model", "sm")):
        candidate = load_model(export_model(model, fmt, tmp_path / name), fmt)
        assert sorted(s.name for s in candidate.inputs) == ["image", "meta"]
        assert sorted(s.name for s in candidate.outputs) == ["cls", "reg"]
        assert_outputs_close(candidate, ref, inputs=batch)
    # swapped inputs would differ: the check above is not vacuous
    swapped = ref.predict({"meta": batch["image"][:, :2], "image": np.concatenate([batch["meta"], batch["meta"][:, :1]], 1)})
    assert not np.allclose(swapped["cls"], ref.predict(batch)["cls"])


def test_declared_specs_name_the_inputs_of_every_export(tmp_path):
    model = _two_headed()
    with pytest.raises(ModelLoadError, match="modelparity_input_specs"):
        load_model(model)
    specs = {"image": ((None, 3), "float32"), "meta": ((None, 2), "float32")}
    path = export_model(model, "tflite", tmp_path / "m.tflite", input_specs=specs)
    assert sorted(s.name for s in load_model(path).inputs) == ["image", "meta"]
    assert [s.shape for s in load_model(model).inputs] == [(None, 3), (None, 2)]


def test_registered_subclass_serialises_and_an_unregistered_one_says_why(tmp_path):
    import keras

    @keras.saving.register_keras_serializable(package="modelparity_tests")
    class Scaled(keras.Model):
        def __init__(self, units=2, **kwargs):
            super().__init__(**kwargs)
            self.units = units
            self.dense = keras.layers.Dense(units)

        def call(self, x):
            return self.dense(x) * 2.0

        def get_config(self):
            return {**super().get_config(), "units": self.units}

    keras.utils.set_random_seed(0)
    model = Scaled()
    model(np.zeros((1, 4), "float32"))
    loaded = load_model(export_model(model, "keras", tmp_path / "m.keras"))
    assert_outputs_close(loaded, load_model(model), inputs=np.ones((2, 4), "float32"))

    class Plain(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    plain = Plain()
    plain(np.zeros((1, 4), "float32"))
    with pytest.raises(NotSerializable, match="does not serialise to keras") as info:
        export_model(plain, "keras", tmp_path / "p.keras")
    assert "register_keras_serializable" in str(info.value)
    assert not (tmp_path / "p.keras").exists()  # no file that would fail only when read


def test_export_cache_keys_a_subclassed_model_by_its_code(tmp_path):
    """Two subclasses with the same layers and weights but different ``call`` code must not
    share a cached export (their configs are both just a class name)."""
    import keras

    from pytest_modelparity.exports.cache import ExportCache

    class Linear(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    class Rectified(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return keras.ops.relu(self.dense(x))

    models = []
    for cls in (Linear, Rectified, Linear):
        keras.backend.clear_session()  # layer names restart, as in a new session
        keras.utils.set_random_seed(0)
        m = cls()
        m(np.zeros((1, 3), "float32"))
        models.append(m)
    cache = ExportCache(tmp_path)
    keys = [cache.key(m, "tflite") for m in models]
    assert keys[0] != keys[1]
    assert keys[0] == keys[2]  # the same class and weights, in a new session, reuse the export


@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
def test_a_one_percent_kernel_change_of_a_subclassed_net_gets_a_cause(pytester: pytest.Pytester) -> None:
    """A subclassed net has no symbolic layer outputs: its ops are traced to find where the forms
    start to differ. A 1% change of one of its convolution's filters, exported, got no cause at
    all (the trace fed {name: array} to a call that takes one tensor); now the convolution is named."""
    pytester.makeconftest(SUBCLASSED_SOURCE + textwrap.dedent('''
        @pytest.fixture(scope="session")
        def modelparity_source():
            return build()
    '''))
    pytester.makepyfile(test_kernel='''
        import pytest
        from conftest import build
        from pytest_modelparity import assert_outputs_close, export_model, load_model

        @pytest.mark.parametrize("form", ["tflite", "onnx"])
        def test_kernel_changed(form, parity_reference, parity_batch, tmp_path):
            bad = build()
            kernel = bad.conv.kernel.numpy()
            kernel[..., 0] *= 1.01  # one filter: not a plain scale of the output (which is said as such)
            bad.conv.kernel.assign(kernel)
            candidate = load_model(export_model(bad, form, tmp_path / f"bad.{form}"))
            assert_outputs_close(candidate, parity_reference, inputs=parity_batch)
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=saved_model")
    result.assert_outcomes(failed=2)
    out = result.stdout.str().split("short test summary info")[0]  # CI=true repeats each failure there
    assert out.count("Likely cause:") == 2, out
    import re

    blamed = re.findall(r"the forms start to differ at layer `classifier_\d+/(\w+)/", out)
    assert len(blamed) == 2 and all(b.startswith("conv2d") for b in blamed), blamed  # tflite, onnx
