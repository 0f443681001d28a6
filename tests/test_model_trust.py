"""Untrusted TensorFlow graphs: a model whose graph writes files, runs Python or whose TF1
``main_op`` writes at load is refused before TensorFlow reads it, naming the ops; trust is the
user's word (``trusted=True``, ``--modelparity-trust-models``); a vocabulary asset and the
loader's own restore still load; a truncated ``saved_model.pb`` is named truncated.

The models are built in a child process: the ``tf.py_function`` body must not be in this
process's registry, as it is not in a user's (it is never saved with the model).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pytest_modelparity import ModelLoadError, export_model, load_model
from pytest_modelparity.formats import missing_runtime

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.skipif(missing_runtime("saved_model") is not None, reason="needs TensorFlow"),
              pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]

BUILD = textwrap.dedent('''
    import os, sys
    import tensorflow as tf

    out = sys.argv[1]

    class Writes(tf.Module):
        def __init__(self, target):
            super().__init__()
            self.v = tf.Variable(2.0)
            self.target = target

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
        def serve(self, x):
            tf.io.write_file(self.target, tf.strings.as_string(x[0, 0]))
            return {"y": x * self.v}

    w = Writes(os.path.join(out, "written.txt"))
    tf.saved_model.save(w, os.path.join(out, "writes"), signatures=w.serve)

    class PyFunc(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
        def serve(self, x):
            return {"y": tf.py_function(lambda t: t * 2.0, [x], tf.float32)}

    p = PyFunc()
    tf.saved_model.save(p, os.path.join(out, "pyfunc"), signatures=p.serve)

    class Vocab(tf.Module):
        def __init__(self, path):
            super().__init__()
            init = tf.lookup.TextFileInitializer(path, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
                                                 tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER)
            self.table = tf.lookup.StaticHashTable(init, -1)

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
        def serve(self, x):
            return {"y": x + tf.cast(self.table.lookup(tf.constant("b")), tf.float32)}

    vocab = os.path.join(out, "vocab.txt")
    open(vocab, "w").write("a\\nb\\nc\\n")
    v = Vocab(vocab)
    tf.saved_model.save(v, os.path.join(out, "vocab"), signatures=v.serve)

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        var = tf.compat.v1.get_variable("v", initializer=2.0)
        y = tf.identity(x * var, name="y")
        main_op = tf.group(tf.compat.v1.global_variables_initializer(),
                           tf.io.write_file(os.path.join(out, "main_op.txt"), "written at load"))
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(os.path.join(out, "tf1_main_op"))
            sig = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={"serving_default": sig},
                                                 main_op=main_op)
            builder.save()

    frozen = tf.Graph()
    with frozen.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        with tf.control_dependencies([tf.io.write_file(os.path.join(out, "frozen.txt"), "x")]):
            tf.identity(x * 2.0, name="y")
    open(os.path.join(out, "writes.pb"), "wb").write(frozen.as_graph_def().SerializeToString())

    py = tf.Graph()
    with py.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        tf.identity(tf.compat.v1.py_func(lambda t: t * 2.0, [x], tf.float32), name="y")
    open(os.path.join(out, "pyfunc.pb"), "wb").write(py.as_graph_def().SerializeToString())

    named = tf.Graph()  # the same op under a name of its own: no "PyFunc" in the node's name
    with named.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        tf.identity(tf.compat.v1.py_func(lambda t: t * 2.0, [x], tf.float32, name="double"), name="y")
    open(os.path.join(out, "pyfunc_named.pb"), "wb").write(named.as_graph_def().SerializeToString())
''')


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trust")
    subprocess.run([sys.executable, "-c", BUILD, str(out)], check=True, capture_output=True, timeout=300)
    return out


def _refused(path: Path, *needles: str, **options: object) -> str:
    with pytest.raises(ModelLoadError) as info:
        load_model(path, **options)
    text = str(info.value)
    for needle in needles:
        assert needle in text, text
    assert "trusted=True" in text and "--modelparity-trust-models" in text, text
    return text


def test_a_serving_function_that_writes_is_refused_and_nothing_is_written(models: Path) -> None:
    _refused(models / "writes", "WriteFile", "__inference_serve", "files")
    assert not (models / "written.txt").exists()
    with pytest.raises(ModelLoadError, match="WriteFile"):  # nor converted: the converters run the graph too
        export_model(str(models / "writes"), "tflite", models / "out.tflite")
    with pytest.raises(ModelLoadError, match="WriteFile"):
        export_model(str(models / "writes.pb"), "tflite", models / "out.tflite")
    assert not (models / "out.tflite").exists() and not (models / "written.txt").exists()


def test_a_trusted_writing_model_runs(models: Path) -> None:
    target = models / "written.txt"
    target.unlink(missing_ok=True)
    model = load_model(models / "writes", trusted=True)
    np.testing.assert_allclose(model.predict(np.ones((1, 2), np.float32))["y"], [[2.0, 2.0]])
    assert target.read_text() == "1.000000"  # trust ran the graph as written
    target.unlink()


def test_a_tf1_main_op_that_writes_is_refused_at_load(models: Path) -> None:
    _refused(models / "tf1_main_op", "WriteFile", "saved_model_main_op at load")
    assert not (models / "main_op.txt").exists()


def test_a_py_function_is_refused_and_trusted_fails_in_plain_words(models: Path) -> None:
    _refused(models / "pyfunc", "EagerPyFunc", "Python code")
    model = load_model(models / "pyfunc", trusted=True)
    with pytest.raises(ModelLoadError) as info:
        model.predict(np.ones((1, 2), np.float32))
    text = str(info.value)
    assert "tf.py_function" in text and "not saved with the model" in text and "EagerPyFunc" in text, text
    assert "Traceback" not in text and "registry" not in text, text


def test_a_trusted_frozen_graph_with_a_py_func_fails_in_plain_words(models: Path) -> None:
    _refused(models / "pyfunc.pb", "PyFunc", "Python code", inputs=["x:0"], outputs=["y:0"])
    model = load_model(models / "pyfunc.pb", inputs=["x:0"], outputs=["y:0"], trusted=True)
    with pytest.raises(ModelLoadError) as info:
        model.predict(np.ones((1, 2), np.float32))
    assert "not saved with the model" in str(info.value) and "'graphdef'" in str(info.value), str(info.value)


def test_a_trusted_py_func_under_another_name_fails_in_plain_words(models: Path) -> None:
    """Issue 48: a PyFunc node named `double` ended in TensorFlow's raw InvalidArgumentError."""
    model = load_model(models / "pyfunc_named.pb", inputs=["x:0"], outputs=["y:0"], trusted=True)
    with pytest.raises(ModelLoadError) as info:
        model.predict(np.ones((1, 2), np.float32))
    text = str(info.value)
    assert "not saved with the model" in text and "double" in text and "Traceback" not in text, text


def test_a_frozen_graph_that_writes_is_refused(models: Path) -> None:
    _refused(models / "writes.pb", "WriteFile", "'graphdef'", inputs=["x:0"], outputs=["y:0"])
    assert not (models / "frozen.txt").exists()


def test_a_vocabulary_asset_loads_untrusted(models: Path) -> None:
    assert (models / "vocab" / "assets" / "vocab.txt").is_file()
    model = load_model(models / "vocab")
    np.testing.assert_allclose(model.predict(np.zeros((1, 2), np.float32))["y"], [[1.0, 1.0]])


def test_a_truncated_saved_model_is_named_truncated_for_every_route(models: Path, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(models / "vocab", broken)
    proto = broken / "saved_model.pb"
    proto.write_bytes(proto.read_bytes()[: proto.stat().st_size // 2])
    with pytest.raises(ModelLoadError) as info:
        load_model(broken)
    assert "truncated or corrupt" in str(info.value) and "saved_model.pb cannot be read" in str(info.value)
    assert "export the model again" in str(info.value)
    for fmt in ("tflite", "onnx", "tfjs"):
        if missing_runtime(fmt, export=True) is not None:
            continue
        with pytest.raises(ModelLoadError) as info:
            export_model(str(broken), fmt, tmp_path / f"out-{fmt}")
        text = str(info.value)
        assert "truncated or corrupt" in text and "writable directory" not in text and "model's ops" not in text, text


@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
def test_the_command_line_option_trusts_the_session(models: Path, pytester: pytest.Pytester) -> None:
    args = (f"--modelparity-model={models / 'tf1_main_op'}", "--modelparity-formats=saved_model",
            "-p", "no:cacheprovider", "-k", "deterministic")
    refused = pytester.runpytest(*args)
    out = refused.stdout.str()
    assert refused.ret != pytest.ExitCode.OK and "WriteFile" in out and "--modelparity-trust-models" in out, out
    assert not (models / "main_op.txt").exists()
    trusted = pytester.runpytest(*args, "--modelparity-trust-models")
    assert (models / "main_op.txt").read_text() == "written at load", trusted.stdout.str()
    assert "WriteFile" not in trusted.stdout.str()
    (models / "main_op.txt").unlink()


def test_one_word_trusts_a_keras_lambda_too(tmp_path: Path) -> None:
    import keras

    inp = keras.Input((2,))
    model = keras.Model(inp, keras.layers.Lambda(lambda t: t * 3.0)(inp))
    path = tmp_path / "lambda.keras"
    model.save(path)
    with pytest.raises(ModelLoadError, match="(?s)Lambda.*--modelparity-trust-models"):
        load_model(path)
    loaded = load_model(path, trusted=True)
    np.testing.assert_allclose(loaded.predict(np.ones((1, 2), np.float32))[loaded.outputs[0].name], [[3.0, 3.0]])


def test_a_keras_file_holding_a_tfsmlayer_is_refused_as_what_it_is(tmp_path: Path) -> None:
    """Issue 48: a TFSMLayer (it loads a SavedModel by path) was refused as "a Lambda layer"."""
    import keras

    plain = keras.Model(x := keras.Input((4,)), keras.layers.Dense(2)(x))
    plain.export(str(tmp_path / "inner"), verbose=False)
    inp = keras.Input((4,))
    outer = keras.Model(inp, keras.layers.TFSMLayer(str(tmp_path / "inner"), call_endpoint="serve")(inp))
    outer.save(tmp_path / "outer.keras")
    with pytest.raises(ModelLoadError, match="(?s)holds a TFSMLayer, which loads an external SavedModel"
                                             ".*--modelparity-trust-models") as info:
        load_model(tmp_path / "outer.keras")
    assert "Lambda" not in str(info.value)


def test_the_word_given_to_export_model_reaches_the_loads_its_converter_makes(models: Path, tmp_path: Path) -> None:
    """export_model(path, ..., trusted=True) scans once, then the converter loads the path again
    itself: that load takes the caller's word too (it refused the model before)."""
    try:
        export_model(str(models / "writes"), "tflite", tmp_path / "t.tflite", trusted=True)
    except Exception as exc:  # noqa: BLE001 - the converter may refuse WriteFile; trust must not
        assert "Refused before TensorFlow" not in str(exc), exc
