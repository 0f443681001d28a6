"""What a session costs (docs/performance.md): the export worker of a serial session with a
cold cache is started when collection ends, before any export, so its TensorFlow import
overlaps the pytest process's; a warm cache starts no worker at all. A ``.keras`` source is loaded
once for the reference and every export, and the TFLite converter is handed the variables, not
the Keras model. TensorFlow's and Keras' import is frozen out of the garbage collector's walks,
and models made after it are still collected."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from models import CLOSE_SUITE, EXPORT_WORKERS_MODULE, TINY_SOURCE_CONFTEST

SUITE = {
    "test_a_first.py": '''
        from export_workers import export_workers

        def test_before_any_export():
            print(f"export workers before any export: {len(export_workers())}")
    ''',
    "test_b_model.py": CLOSE_SUITE,
    "test_c_last.py": '''
        import gc

        def test_after_the_models():
            print(f"objects frozen by the plugin's TensorFlow import: {gc.get_freeze_count()}")
    ''',
}


def test_a_cold_session_starts_its_export_worker_at_collection_and_a_warm_one_none(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile(export_workers=EXPORT_WORKERS_MODULE,
                        **{name[:-3]: textwrap.dedent(body) for name, body in SUITE.items()})
    args = ("--modelparity-formats=tflite", "--modelparity-cache-dir=cache", "-p", "no:cacheprovider",
            "-p", "no:randomly", "-s")
    cold = pytester.runpytest_subprocess(*args, timeout=600)
    cold.assert_outcomes(passed=3)
    cold.stdout.fnmatch_lines(["*export workers before any export: 1*"])
    assert _frozen(cold) > 100_000  # TensorFlow's and Keras' own objects, out of the collector's walks
    warm = pytester.runpytest_subprocess(*args, timeout=600)
    warm.assert_outcomes(passed=3)
    warm.stdout.fnmatch_lines(["*export workers before any export: 0*"])


def _frozen(result: pytest.RunResult) -> int:
    line = next(x for x in result.stdout.lines if "objects frozen by the plugin's TensorFlow import:" in x)
    return int(line.rsplit(":", 1)[1].split()[0])


FREEZE_CHILD = '''
import gc, sys, weakref
if sys.argv[1] == "user-first":  # a conftest imported Keras and built a model before the plugin's load
    import keras
    early = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
from pytest_modelparity.runtime.tf_import import import_keras
keras = import_keras()
frozen = gc.get_freeze_count()
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
alive = weakref.ref(model)
del model
gc.collect()
print(frozen, alive() is None)
'''


@pytest.mark.parametrize("first", ["plugin-first", "user-first"])
def test_what_lives_at_the_first_tensorflow_import_is_frozen_and_later_models_are_collected(first: str) -> None:
    """gc.freeze once TensorFlow and Keras are imported (1.1 s of a 5 s session was the collector
    walking their ~300,000 objects again), whether the plugin or a conftest imported them first;
    a model made afterwards is still collected when dropped."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FREEZE_CHILD, first], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    frozen, later_model_collected = int(out[-2]), out[-1] == "True"
    assert frozen > 100_000
    assert later_model_collected


# A .keras file as the source; keras.saving.load_model counted in the pytest process.
COUNTED_LOADS_CONFTEST = '''
    import keras
    import numpy as np
    import pytest

    LOADS = []
    _load = keras.saving.load_model

    def counted(*args, **kwargs):
        LOADS.append(args[0] if args else kwargs.get("filepath"))
        return _load(*args, **kwargs)

    keras.saving.load_model = counted

    @pytest.fixture(scope="session")
    def modelparity_source(tmp_path_factory):
        x = keras.Input((6,), name="x")
        y = keras.layers.Dense(3, name="out", kernel_initializer=keras.initializers.GlorotUniform(seed=2))(x)
        path = tmp_path_factory.mktemp("src") / "tiny.keras"
        keras.Model(x, y, name="tiny").save(str(path))
        return str(path)

    def pytest_sessionfinish(session):
        print(f"\\nkeras file loads in the pytest process: {len(LOADS)}")

    def pytest_unconfigure(config):
        keras.saving.load_model = _load  # the session runs in the test's process: Keras left as found
'''


def test_a_keras_file_is_loaded_once_per_session_for_the_reference_and_every_export(pytester: pytest.Pytester) -> None:
    """The reference and each format's export share one load of the file (each export used to
    load it again: three extra loads, 3-4 s of a MobileNetV2 session)."""
    pytester.makeconftest(textwrap.dedent(COUNTED_LOADS_CONFTEST))
    pytester.makepyfile(test_b_model=textwrap.dedent(SUITE["test_b_model.py"]))
    # in this process (issue 49): the loads counted are this pytest process's either way, and the
    # exports still go to a real worker; a child session only imported TensorFlow once more
    result = pytester.runpytest("--modelparity-formats=saved_model,tflite,onnx",
                                "--modelparity-cache-dir=cache", "-p", "no:cacheprovider",
                                "-p", "no:randomly", "-s")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*keras file loads in the pytest process: 1"])


def _serving_and_function(model):
    from pytest_modelparity.formats.tensorflow.serving import serving_function

    serving = serving_function(model, "tflite")
    return serving, serving.function.get_concrete_function()


def test_the_tflite_converter_tracks_variables_and_tables_not_the_keras_model(tmp_path) -> None:
    """The converter saves what it is handed as a SavedModel first; a tracked Keras model made
    that save walk every layer (MobileNetV2: 8.7-9.2 s against 3.3-3.6 s). The variables and
    the layers' tables are enough, and the file still answers as the model does."""
    import keras

    from models import images, tiny_cnn
    from pytest_modelparity import export_model, load_model
    from pytest_modelparity.formats.tensorflow.serving import converter_holder

    model = tiny_cnn(seed=3)
    serving, concrete = _serving_and_function(model)
    holder = converter_holder(serving, concrete)
    assert getattr(holder, "model", None) is None and len(holder.variables_) == len(model.variables)
    x = images(5, seed=1)
    got = load_model(export_model(model, "tflite", tmp_path / "m.tflite")).predict(x)
    np.testing.assert_allclose(next(iter(got.values())), model(x).numpy(), atol=1e-5)

    lookup = keras.layers.StringLookup(vocabulary=["a", "b", "c"])
    words = keras.Input((2,), dtype="string")
    counted = keras.Model(words, keras.layers.Dense(2)(keras.ops.cast(lookup(words), "float32")))
    serving, concrete = _serving_and_function(counted)
    holder = converter_holder(serving, concrete)
    assert getattr(holder, "model", None) is None
    assert [r.resource_handle is lookup.lookup_table.resource_handle for r in holder.resources_] == [True]


def test_a_resource_the_holder_cannot_see_makes_it_track_the_model() -> None:
    """A custom layer keeping a table where the holder does not look (inside a dict): the
    function captures it, so the whole model is tracked, as before (complete, slower)."""
    import keras
    import tensorflow as tf

    class Hidden(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            init = tf.lookup.KeyValueTensorInitializer(tf.constant([0, 1], tf.int64), tf.constant([5, 6], tf.int64))
            self.box = {"table": tf.lookup.StaticHashTable(init, -1)}

        def call(self, x):
            return tf.cast(self.box["table"].lookup(tf.cast(x, tf.int64)), tf.float32)

    x = keras.Input((3,))
    model = keras.Model(x, Hidden()(x))
    from pytest_modelparity.formats.tensorflow.serving import converter_holder

    serving, concrete = _serving_and_function(model)
    assert converter_holder(serving, concrete).model is model
