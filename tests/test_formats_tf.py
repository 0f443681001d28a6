"""The TensorFlow formats, for real: keras, h5, saved_model, graphdef (export + load) and
TF1 checkpoint/frozen graphs (load), against the in-memory Keras model."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="the TF formats need TensorFlow: pip install 'pytest-modelparity[tensorflow]'")

from pytest_modelparity import export_model, load_model  # noqa: E402
from pytest_modelparity.verdict.compare import compare  # noqa: E402
from pytest_modelparity.errors import BatchMismatchError, ModelLoadError  # noqa: E402
from pytest_modelparity.formats import detect_format  # noqa: E402
from pytest_modelparity.verdict.tolerances import default_tolerance  # noqa: E402

import tf1_graphs  # noqa: E402
from models import images, mlp, tiny_cnn  # noqa: E402

EXPORTS = {"keras": "m.keras", "h5": "m.h5", "saved_model": "sm", "graphdef": "frozen.pb"}


@pytest.fixture(scope="module")
def cnn():
    return tiny_cnn()


@pytest.fixture(scope="module")
def exported(cnn, tmp_path_factory):
    root = tmp_path_factory.mktemp("tf_exports")
    return {fmt: export_model(cnn, fmt, root / name) for fmt, name in EXPORTS.items()}


@pytest.fixture(scope="module")
def tf1_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tf1")
    paths = {}
    for dropout in (True, False):
        sub = root / ("dropout" if dropout else "clean")
        paths[dropout] = (tf1_graphs.save_checkpoint(sub, dropout=dropout), tf1_graphs.freeze(sub, dropout=dropout))
    return paths


def assert_matches(got, ref, fmt):
    report = compare(got, ref, tolerance=default_tolerance(np.float32, format=fmt))
    assert report.passed, str(report)


# -- round trips -----------------------------------------------------------------------

@pytest.mark.parametrize("batch", [1, 3, 17])
@pytest.mark.parametrize("fmt", list(EXPORTS))
def test_round_trip_matches_keras(cnn, exported, fmt, batch):
    x = images(batch, seed=batch)
    expected = {"probs": np.asarray(cnn(x, training=False))}
    loaded = load_model(exported[fmt])
    assert loaded.format == fmt
    got = loaded.predict(x)
    assert set(got) == {"probs"} and got["probs"].shape == (batch, 4)
    assert_matches(got, expected, fmt)


def test_in_memory_keras_is_bitwise_model_predict(cnn):
    x = images(5)
    got = load_model(cnn).predict(x)["probs"]
    np.testing.assert_array_equal(got, cnn.predict(x, verbose=0))


@pytest.mark.parametrize("fmt", list(EXPORTS))
def test_detect_and_specs(exported, fmt):
    assert detect_format(exported[fmt]) == fmt
    loaded = load_model(exported[fmt])
    assert [(s.name, s.shape, s.dtype.name) for s in loaded.inputs] == [("image", (None, 8, 8, 3), "float32")]
    assert [(s.name, s.shape) for s in loaded.outputs] == [("probs", (None, 4))]


def test_saved_model_file_path_and_detection(exported):
    assert detect_format(exported["saved_model"] / "saved_model.pb") == "saved_model"
    loaded = load_model(exported["saved_model"] / "saved_model.pb")
    assert loaded.source == str(exported["saved_model"])


@pytest.mark.parametrize("fmt", ["saved_model", "graphdef", "keras"])
def test_batch_forms_and_cast(exported, fmt):
    loaded = load_model(exported[fmt])
    x = images(2)
    ref = loaded.predict(x)["probs"]
    np.testing.assert_array_equal(loaded.predict({"image": x})["probs"], ref)
    np.testing.assert_array_equal(loaded.predict([x])["probs"], ref)
    # float64 is cast to the signature's float32 (a raw signature call rejects it).
    np.testing.assert_array_equal(loaded.predict(x.astype("float64"))["probs"], ref)
    with pytest.raises(BatchMismatchError, match=r"rank 3.*\n.*image: \(None, 8, 8, 3\) float32"):
        loaded.predict(x[0])


def test_multi_input_multi_output_keras_and_saved_model(tmp_path):
    import keras

    a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    h = keras.layers.Concatenate()([a, b])
    model = keras.Model([a, b], [keras.layers.Dense(2, name="head1")(h), keras.layers.Dense(5, name="head2")(h)])
    xa, xb = np.ones((3, 4), "float32"), np.arange(9, dtype="float32").reshape(3, 3)
    ref = load_model(model).predict({"a": xa, "b": xb})
    assert set(ref) == {"head1", "head2"} and ref["head2"].shape == (3, 5)
    for fmt, name in (("saved_model", "sm"), ("graphdef", "g.pb"), ("keras", "m.keras")):
        loaded = load_model(export_model(model, fmt, tmp_path / name))
        assert [s.name for s in loaded.inputs] == ["a", "b"], fmt
        got = loaded.predict([xa, xb])
        assert set(got) == {"head1", "head2"}, fmt
        assert_matches(got, ref, fmt)


# -- no retracing, no graph growth ------------------------------------------------------

@pytest.fixture
def trace_counter(monkeypatch):
    """Counts every tf.function trace (each goes through func_graph_from_py_func)."""
    from tensorflow.python.framework import func_graph

    calls = []
    real = func_graph.func_graph_from_py_func

    def counting(*args, **kwargs):
        calls.append(args[0] if args else kwargs.get("name"))
        return real(*args, **kwargs)

    monkeypatch.setattr(func_graph, "func_graph_from_py_func", counting)
    return calls


def test_trace_counter_sees_retracing(trace_counter):
    f = tf.function(lambda x: x * 2.0)  # no input_signature: one trace per new shape
    for n in range(1, 5):
        f(np.ones((n, 3), "float32"))
    assert len(trace_counter) >= 4


@pytest.mark.parametrize("fmt", ["saved_model", "keras", "graphdef"])
def test_twenty_batch_sizes_no_retrace(exported, trace_counter, fmt):
    loaded = load_model(exported[fmt])
    loaded.predict(images(1))
    before = len(trace_counter)
    ops_before = len(loaded.graph.get_operations()) if fmt == "graphdef" else None
    for n in range(1, 21):
        assert loaded.predict(images(n))["probs"].shape == (n, 4)
    assert len(trace_counter) == before, trace_counter[before:]
    if ops_before is not None:
        assert len(loaded.graph.get_operations()) == ops_before


# -- TF1 graphs: checkpoint and frozen .pb (seed 000) -----------------------------------

@pytest.mark.parametrize("form", ["checkpoint", "graphdef"])
def test_tf1_dropout_graph_is_nondeterministic(tf1_dir, form):
    prefix, pb = tf1_dir[True]
    loaded = load_model(prefix if form == "checkpoint" else pb)
    assert loaded.format == form
    assert [s.name for s in loaded.inputs] == ["x"] and [s.name for s in loaded.outputs] == ["predictions"]
    x = tf1_graphs.features(8)
    runs = [loaded.predict(x)["predictions"] for _ in range(3)]
    assert not all(np.array_equal(runs[0], r) for r in runs[1:])
    assert any(node.op == "RandomUniform" for node in loaded.graph_defs()[0].node)


@pytest.mark.parametrize("form", ["checkpoint", "graphdef"])
def test_tf1_clean_graph_is_deterministic_and_forms_agree(tf1_dir, form):
    prefix, pb = tf1_dir[False]
    loaded = load_model(prefix if form == "checkpoint" else pb, inputs=["x:0"], outputs=["predictions:0"])
    x = tf1_graphs.features(8)
    runs = [loaded.predict({"x:0": x})["predictions"] for _ in range(3)]
    assert all(np.array_equal(runs[0], r) for r in runs)
    other = load_model(pb if form == "checkpoint" else prefix)
    # each form is deterministic bit for bit (above); across forms, within float32 rounding: with
    # oneDNN on (TensorFlow's default on Intel CPUs with AVX512_VNNI/AMX) the checkpoint and the
    # frozen graph run otherwise fused kernels
    np.testing.assert_allclose(other.predict(x)["predictions"], runs[0], rtol=1e-6, atol=0)
    assert not any("Random" in node.op for node in loaded.graph_defs()[0].node)


def test_assert_deterministic_on_tf1_graphs(tf1_dir):
    assertions = pytest.importorskip("pytest_modelparity.checks.assertions",
                                     reason="assert_deterministic lands with assertions.py (issue: core)")
    x = tf1_graphs.features(8)
    for form in (0, 1):
        with pytest.raises(AssertionError):
            assertions.assert_deterministic(load_model(tf1_dir[True][form]), x)
        assertions.assert_deterministic(load_model(tf1_dir[False][form]), x)


def test_checkpoint_accepts_meta_prefix_index_and_directory(tf1_dir):
    prefix, _ = tf1_dir[False]
    ref = load_model(prefix).predict(tf1_graphs.features(2))["predictions"]
    for given in (str(prefix) + ".meta", str(prefix) + ".index", prefix.parent):
        assert detect_format(given) == "checkpoint", given
        np.testing.assert_array_equal(load_model(given).predict(tf1_graphs.features(2))["predictions"], ref)


def test_checkpoint_weights_are_the_restored_ones(tf1_dir):
    prefix, pb = tf1_dir[False]
    weights = load_model(prefix).weights()
    assert sorted(weights) == ["dense/bias", "dense/kernel", "logits/bias", "logits/kernel"]
    expected = tf.train.load_checkpoint(str(prefix)).get_tensor("dense/kernel")
    np.testing.assert_array_equal(weights["dense/kernel"], expected)
    consts = load_model(pb).weights()
    np.testing.assert_array_equal(consts["dense/kernel"], expected)


def test_ambiguous_outputs_list_candidates(tmp_path):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        tf.multiply(x, 2.0, name="double")
        tf.identity(x + 1.0, name="plus_one")
    path = tmp_path / "two_heads.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    with pytest.raises(ModelLoadError, match=r"2 candidate sink\(s\): double:0, plus_one:0") as info:
        load_model(path)
    assert "outputs=" in str(info.value) and "two_heads.pb" in str(info.value)
    loaded = load_model(path, outputs=["plus_one:0"])
    np.testing.assert_array_equal(loaded.predict(np.ones((1, 2), "float32"))["plus_one"], [[2.0, 2.0]])


def test_unknown_tensor_name_lists_placeholders(tf1_dir):
    _, pb = tf1_dir[False]
    with pytest.raises(ModelLoadError, match=r"(?s)no input tensor 'images:0'.*Placeholders here: x"):
        load_model(pb, inputs=["images:0"], outputs=["predictions:0"])


# -- saved_model signatures -------------------------------------------------------------

def test_saved_model_named_signature(tmp_path):
    class Two(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="v")])
        def double(self, v):
            return {"out": v * 2.0}

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="v")])
        def negate(self, v):
            return {"out": -v}

    module = Two()
    tf.saved_model.save(module, str(tmp_path / "two"), signatures={"double": module.double, "negate": module.negate})
    with pytest.raises(ModelLoadError, match="several others: double, negate"):
        load_model(tmp_path / "two")
    with pytest.raises(ModelLoadError, match="no signature 'half'"):
        load_model(tmp_path / "two", signature="half")
    loaded = load_model(tmp_path / "two", signature="negate")
    np.testing.assert_array_equal(loaded.predict(np.ones((2, 3)))["out"], -np.ones((2, 3), "float32"))


# -- diagnosis hooks --------------------------------------------------------------------

def test_weights_hooks_agree_with_keras(cnn, exported):
    keras_w = load_model(cnn).weights()
    assert sorted(keras_w) == sorted(v.path for v in cnn.weights)
    for fmt in ("keras", "h5", "saved_model"):
        w = load_model(exported[fmt]).weights()
        assert sorted(w) == sorted(keras_w), fmt
        for name, value in keras_w.items():
            np.testing.assert_array_equal(w[name], value, err_msg=f"{fmt} {name}")
    consts = load_model(exported["graphdef"]).weights()
    kernel = keras_w["conv/kernel"]
    assert any(v.shape == kernel.shape and np.array_equal(v, kernel) for v in consts.values())


@pytest.mark.parametrize("fmt", list(EXPORTS))
def test_graph_defs_have_no_random_ops_in_inference(exported, fmt):
    (graph_def,) = load_model(exported[fmt]).graph_defs()
    ops = {n.op for n in graph_def.node} | {n.op for f in graph_def.library.function for n in f.node_def}
    assert "Conv2D" in ops or "_FusedConv2D" in ops or any("Call" in op for op in ops)
    assert not {op for op in ops if "Random" in op}


def test_keras_intermediates(cnn):
    rows = load_model(cnn).intermediates(images(2))
    assert [r[0] for r in rows] == ["conv", "bn", "relu", "dropout", "flatten", "logits", "probs"]
    np.testing.assert_array_equal(rows[-1][2], np.asarray(cnn(images(2), training=False)))


# -- safety and hygiene -----------------------------------------------------------------

@pytest.fixture(scope="module")
def lambda_model():
    import keras

    x = keras.Input((3,), name="x")
    return keras.Model(x, keras.layers.Lambda(lambda t: t * 3.0, name="triple")(x))


@pytest.mark.parametrize("fmt,name", [("keras", "lam.keras"), ("h5", "lam.h5")])
def test_lambda_layer_needs_explicit_unsafe_opt_in(lambda_model, tmp_path, fmt, name):
    path = export_model(lambda_model, fmt, tmp_path / name)
    with pytest.raises(ModelLoadError, match="(?s)Lambda.*safe_mode=False") as info:
        load_model(path)
    assert name in str(info.value) and repr(fmt) in str(info.value)
    loaded = load_model(path, safe_mode=False)
    np.testing.assert_allclose(loaded.predict(np.ones((2, 3)))[loaded.outputs[0].name], 3.0)


def test_export_checks_suffix(tmp_path):
    model = mlp()
    with pytest.raises(ValueError, match=r"\.keras"):
        export_model(model, "keras", tmp_path / "m.h5")
    with pytest.raises(ValueError, match=r"\.h5"):
        export_model(model, "h5", tmp_path / "m.keras")
    with pytest.raises(ValueError, match="can be loaded but not exported"):
        export_model(model, "checkpoint", tmp_path / "ckpt")


def test_format_modules_import_without_tensorflow():
    code = textwrap.dedent("""
        import sys
        import pytest_modelparity.runtime.devices
        from pytest_modelparity.formats.tensorflow import keras, h5, saved_model, checkpoint, graphdef, graph
        from pytest_modelparity.formats import tflite, onnx, tfjs
        from pytest_modelparity.formats.tfjs import browser, rewrite, errors
        from pytest_modelparity.formats.tflite import quant
        from pytest_modelparity.floor import measure, twins, keras_twin, graph_twin
        from pytest_modelparity.runtime.devices import parse_device
        parse_device("gpu:1")
        assert "tensorflow" not in sys.modules, "TensorFlow was imported"
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_tensor_spec_takes_any_dtype_and_negative_numpy_dims():
    """Negative dims of any integer type mean 'unknown' (numpy ints stayed -1 before)."""
    import numpy as np

    from pytest_modelparity.formats.base import TensorSpec

    spec = TensorSpec("x", np.array([-1, 3]), "float32")
    assert spec.shape == (None, 3) and spec.dtype == np.dtype("float32")
    assert TensorSpec("x", (None, np.int64(4)), np.float16).shape == (None, 4)


def test_freeze_shortcut_and_the_public_freeze_give_the_same_graph(monkeypatch):
    """freeze_concrete takes convert_variables_to_constants_v2's private first step where
    TensorFlow has it (no wrap back into a function), the public function where it does not:
    the same inputs, outputs, op types and float64 twin outputs either way."""
    import collections

    from models import mlp
    from pytest_modelparity.floor import graph_twin
    from pytest_modelparity.formats.tensorflow import graph

    def no_shortcut(*_):  # as on a TensorFlow without the private step
        raise graph._NoShortcut()

    fn = load_model(mlp(seed=4)).traced_function()
    shortcut = graph.freeze_concrete(fn)
    monkeypatch.setattr(graph, "_frozen_graph_def", no_shortcut)
    public = graph.freeze_concrete(fn)
    assert (shortcut.inputs, shortcut.outputs) == (public.inputs, public.outputs)
    assert collections.Counter(n.op for n in shortcut.graph_def.node) == \
        collections.Counter(n.op for n in public.graph_def.node)
    x = np.random.default_rng(0).normal(size=(3, 16)).astype("float32")
    a, b = graph_twin.build(shortcut, "float64").run([x]), graph_twin.build(public, "float64").run([x])
    assert all(np.array_equal(p, q) for p, q in zip(a, b)) and a[0].dtype == np.float64
