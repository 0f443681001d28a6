"""The models teams already have (issue 26), each built in the test with the property that
broke it, run through the plugin's fixtures in a pytester session as a user would.

- a SavedModel written by TF 2.x + Keras 2 (``tf_keras``) with its legacy optimizer: the
  object graph holds slot variables TF 2.21 cannot revive without tf_keras.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded", "installed_node_modules"),
              pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]

# Each pytester run keeps its own export cache (CACHE_ARG); the npm modules are the installed ones.
CACHE_ARG = "--modelparity-cache-dir=exports"

WRITE_KERAS2 = textwrap.dedent('''
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import numpy as np
    import tf_keras

    out = sys.argv[1]
    x = tf_keras.Input((8,), name="features")
    h = tf_keras.layers.Dense(6, activation="relu", name="h")(x)
    y = tf_keras.layers.Dense(3, name="score")(h)
    model = tf_keras.Model(x, y)
    model.compile(optimizer=tf_keras.optimizers.legacy.Adam(1e-3), loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(4, 8)).astype("float32"), rng.normal(size=(4, 3)).astype("float32"),
              epochs=1, verbose=0)
    model.save(out, save_format="tf", include_optimizer=True)
    rows = rng.normal(size=(3, 8)).astype("float32")
    np.save(out + "-rows.npy", rows)
    np.save(out + "-expected.npy", model.predict(rows, verbose=0))
''')


@pytest.fixture(scope="module")
def keras2_saved_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Keras-2-era SavedModel with optimizer slot variables, written by tf_keras in a child
    process (this process has Keras 3, and the loading side must not have tf_keras)."""
    if importlib.util.find_spec("tf_keras") is None:
        pytest.fail("tf_keras is not installed: run scripts/install.sh (it installs tf_keras==2.21.0 --no-deps)")
    out = tmp_path_factory.mktemp("keras2") / "trained_sm"
    subprocess.run([sys.executable, "-c", WRITE_KERAS2, str(out)], check=True, timeout=240)
    return out


def test_keras2_saved_model_with_optimizer_slots_loads_and_exports(pytester: pytest.Pytester,
                                                                    keras2_saved_model: Path) -> None:
    pytester.makeconftest(textwrap.dedent(f'''
        import sys
        # A user's machine without tf_keras (TF 2.21 + Keras 3): blocked before TensorFlow loads.
        assert "tensorflow" not in sys.modules, "TensorFlow was imported before the conftest"
        sys.modules["tf_keras"] = None
        import pytest

        SOURCE = {str(keras2_saved_model)!r}

        @pytest.fixture(scope="session")
        def modelparity_source():
            return SOURCE
    '''))
    pytester.makepyfile(test_trained=f'''
        import numpy as np
        import pytest
        from pytest_modelparity import assert_outputs_close

        def test_tf_own_loader_fails():
            import tensorflow as tf
            with pytest.raises(AttributeError, match="add_slot"):
                tf.saved_model.load({str(keras2_saved_model)!r})

        def test_reference_is_the_trained_model(parity_reference):
            rows = np.load({str(keras2_saved_model) + "-rows.npy"!r})
            expected = np.load({str(keras2_saved_model) + "-expected.npy"!r})
            np.testing.assert_allclose(parity_reference.predict(rows)["score"], expected, rtol=1e-6, atol=1e-6)
            assert "slot variables" in parity_reference.load_note
            assert sorted(parity_reference.weights()) == ["h/bias", "h/kernel", "score/bias", "score/kernel"]

        def test_forms(parity_candidate, parity_reference, parity_batch):
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
    ''')
    # the export worker, a fresh process, as a user's session has it: inline, tensorflowjs would be
    # imported here, where the conftest blocked tf_keras
    result = pytester.runpytest_subprocess(CACHE_ARG, "-v", "-p", "no:cacheprovider",
                                           "--modelparity-formats=saved_model,tflite,tfjs",
                                           "--modelparity-export-process=child",
                                           "--modelparity-report=r.json", timeout=400)
    # onnx converts through the same frozen signature as tflite; saved_model is the directory
    # compared with itself: skipped as no comparison (tests/test_not_compared.py)
    result.assert_outcomes(passed=4, skipped=1)
    result.stdout.fnmatch_lines(["*test_forms[[]tflite-cpu[]] PASSED*", "*test_forms[[]tfjs-cpu[]] PASSED*"])
    doc = json.loads((pytester.path / "r.json").read_text())
    routes = {a["format"]: a.get("route") or "" for a in doc["artifacts"]}
    assert "signature frozen" in routes["tfjs"], routes


OPEN_HW_CONFTEST = textwrap.dedent('''
    import numpy as np
    import pytest

    def build():
        import keras
        init = keras.initializers.GlorotUniform
        x = keras.Input((None, None, 3), name="image")   # any height and width
        h = keras.layers.Conv2D(6, 3, activation="relu", name="c1", kernel_initializer=init(seed=1))(x)
        h = keras.layers.Conv2D(6, 3, activation="relu", name="c2", kernel_initializer=init(seed=2))(h)
        y = keras.layers.Conv2D(2, 3, name="boxes", kernel_initializer=init(seed=3))(h)  # valid 3x3: no 1x1 input
        return keras.Model(x, y, name="fcn")

    @pytest.fixture(scope="session")
    def modelparity_source():
        return build

    @pytest.fixture(scope="session")
    def modelparity_dataset():
        return np.random.default_rng(5).uniform(0, 1, (3, 64, 64, 3)).astype("float32")
''')


def test_open_height_width_net_exports_to_every_converted_form(pytester: pytest.Pytester) -> None:
    """Exports were checked on zeros with the open H and W set to 1, which a net of valid 3x3
    convolutions cannot take, and each converter was blamed: now the check runs at the
    smallest size the export takes, and every form is compared on the suite's 64x64 rows."""
    pytester.makeconftest(OPEN_HW_CONFTEST)
    pytester.makepyfile(test_fcn='''
        import numpy as np
        from pytest_modelparity import assert_outputs_close

        def test_forms(parity_candidate, parity_reference, parity_batch):
            assert parity_batch["image"].shape[1:] == (64, 64, 3)
            out = parity_candidate.predict(parity_batch)["boxes"]
            assert out.shape[1:] == (58, 58, 2) and np.isfinite(out).all(), "NaN/inf at 64x64"
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
            # another size than the rows': the export keeps H and W open
            other = np.full((1, 20, 33, 3), 0.5, "float32")
            assert_outputs_close(parity_candidate, parity_reference, inputs=other)
    ''')
    result = pytester.runpytest(CACHE_ARG, "-v", "--modelparity-formats=tflite,onnx,tfjs")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*test_forms[[]tflite-cpu[]] PASSED*", "*test_forms[[]onnx-cpu[]] PASSED*",
                                 "*test_forms[[]tfjs-cpu[]] PASSED*"])


@pytest.mark.parametrize("format", ["tflite", "onnx"])
def test_an_open_length_audio_net_longer_than_64_samples_exports(tmp_path: Path, format: str) -> None:
    """A valid 100-tap filter over open-length audio runs on no clip of 64 samples or fewer:
    the export check goes on to longer clips instead of refusing the converter's good file."""
    import keras
    import numpy as np

    from pytest_modelparity import assert_outputs_close, export_model, load_model
    from pytest_modelparity.formats import missing_runtime

    if missing_runtime(format, export=True) is not None:
        pytest.skip(f"{format} runtime missing: bash scripts/install.sh installs it")
    x = keras.Input((None, 1), name="audio")
    h = keras.layers.Conv1D(4, 100, activation="relu", name="taps",
                            kernel_initializer=keras.initializers.GlorotUniform(seed=3))(x)
    y = keras.layers.Dense(3, name="score")(keras.layers.GlobalAveragePooling1D()(h))
    model = keras.Model(x, y, name="long_taps")
    path = export_model(model, format, tmp_path / ("m.tflite" if format == "tflite" else "m.onnx"))
    clip = np.random.default_rng(0).normal(0, 1, (2, 300, 1)).astype("float32")
    assert_outputs_close(load_model(path).predict({"audio": clip})["score"], model.predict(clip, verbose=0),
                         rtol=1e-4, atol=1e-5)


def test_an_export_that_fails_at_every_probe_size_says_so(tmp_path: Path) -> None:
    """The probe does not hide a real failure: a file that runs at no size is refused, and the
    message says which sizes were tried."""
    import numpy as np

    from pytest_modelparity.formats.common import probe_note, probe_sizes, run_probe
    from pytest_modelparity.formats.base import TensorSpec

    specs = [TensorSpec("image", (None, None, None, 3), "float32")]
    seen = []

    def never(batch):
        seen.append(batch["image"].shape)
        raise RuntimeError("no kernel")

    with pytest.raises(RuntimeError, match="no kernel") as info:
        run_probe(never, specs)
    assert seen == [(1, s, s, 3) for s in (1, 8, 16, 32, 64, 128, 256)]  # 256 x 256: the last image size
    assert "every size failed" in probe_note(info.value) and "256" in probe_note(info.value)
    assert probe_sizes([TensorSpec("audio", (None, None), "float32")])[-1] == 4096  # one open axis goes further
    # the smallest size that works is the one used, and a fixed shape is probed once
    assert run_probe(lambda b: b["image"].shape, specs[:0] + [TensorSpec("image", (None, None, None, 3), "float32")])[0] == 1
    sizes = []
    assert run_probe(lambda b: sizes.append(b["image"].shape[1]) or (b["image"].shape[1] >= 7 or 1 / 0), specs)[0] == 8
    assert sizes == [1, 8]
    assert run_probe(lambda b: b["x"].shape, [TensorSpec("x", (None, 5), "float32")]) == (1, (1, 5))
    assert np.zeros(1).size == 1


SUBCLASSED_CONFTEST = textwrap.dedent('''
    import numpy as np
    import pytest
    import keras

    class PNet(keras.Model):
        """A cascade stage as shipped: its build() creates the weights for a default shape."""

        def __init__(self, **kw):
            super().__init__(**kw)
            self.conv = keras.layers.Conv2D(4, 3, activation="relu",
                                            kernel_initializer=keras.initializers.GlorotUniform(seed=1))
            self.head = keras.layers.Conv2D(2, 1, kernel_initializer=keras.initializers.GlorotUniform(seed=2))

        def build(self, input_shape=(None, 12, 12, 3)):
            self.conv.build(input_shape)
            self.head.build((None, input_shape[1] - 2, input_shape[2] - 2, 4))

        def call(self, x):
            return self.head(self.conv(x))

    class Fixed(PNet):
        def build(self):  # no shape argument: the inputs cannot be known
            self.conv.build((None, 12, 12, 3))
            self.head.build((None, 10, 10, 4))

    def built(cls):
        def make():
            net = cls()
            net.build()   # build() as the authors call it, then called once
            net(np.zeros((1, 12, 12, 3), "float32"))
            return net
        return make

    @pytest.fixture(scope="session")
    def modelparity_source():
        return built(PNet)
''')


def test_subclassed_net_built_with_build_is_not_refused(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(SUBCLASSED_CONFTEST)
    pytester.makepyfile(test_pnet='''
        from pytest_modelparity import assert_outputs_close

        def test_forms(parity_candidate, parity_reference, parity_batch):
            assert parity_reference.inputs[0].shape == (None, 12, 12, 3)
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
    ''')
    result = pytester.runpytest(CACHE_ARG, "-v", "--modelparity-formats=saved_model,tflite")
    result.assert_outcomes(passed=2)


def test_subclassed_net_whose_build_takes_no_shape_is_told_truly(tmp_path: Path) -> None:
    """Built, yet no shape recorded: the message says so (not "never built or called"), and its
    fix, declaring the inputs, makes it load."""
    import numpy as np

    from pytest_modelparity import errors, load_model

    namespace: dict = {}
    exec(SUBCLASSED_CONFTEST, namespace)  # the same classes as the suite above
    net = namespace["built"](namespace["Fixed"])()
    with pytest.raises(errors.ModelLoadError, match="was built, but its build.. recorded no single input shape") as info:
        load_model(net)
    assert "never built" not in str(info.value) and "input_specs" in info.value.fix
    model = load_model(net, input_specs=[("x", (None, 12, 12, 3), "float32")])
    x = np.random.default_rng(0).uniform(size=(2, 12, 12, 3)).astype("float32")
    np.testing.assert_allclose(model.predict(x)[model.outputs[0].name], np.asarray(net(x)), rtol=1e-6)


TF1_CONTEST = textwrap.dedent('''
    import sys
    import pytest

    sys.path.insert(0, {tests!r})
    import tf1_batchnorm

    @pytest.fixture(scope="session")
    def modelparity_source(tmp_path_factory):
        checkpoint, frozen = tf1_batchnorm.build(tmp_path_factory.mktemp("tf1"))
        return str({which})
''')

PARITY_TEST = '''
    from pytest_modelparity import assert_outputs_close

    def test_export(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
'''


def test_tf1_checkpoint_in_the_default_matrix_becomes_tflite_onnx_and_tfjs(pytester: pytest.Pytester) -> None:
    """A TF1 checkpoint (conv + FusedBatchNormV3) in the default matrix: before, every export
    test skipped ("only a Keras model or a SavedModel directory can be converted") and the
    session ended green having compared nothing. Now it is frozen and converted."""
    pytester.makeconftest(TF1_CONTEST.format(tests=str(Path(__file__).parent), which="checkpoint"))
    pytester.makepyfile(PARITY_TEST)
    result = pytester.runpytest(CACHE_ARG, "-v", "-rs", "--modelparity-report=r.json")
    result.assert_outcomes(passed=3, skipped=4)  # keras, h5, saved_model, graphdef need a Keras model
    result.stdout.fnmatch_lines(["*test_export[[]tflite-cpu[]] PASSED*", "*test_export[[]tfjs-cpu[]] PASSED*",
                                 "*test_export[[]onnx-cpu[]] PASSED*"])
    assert "NOTHING WAS COMPARED" not in result.stdout.str()
    doc = json.loads((pytester.path / "r.json").read_text())
    assert {r["format"]: r["verdict"] for r in doc["rows"]} == {"tflite": "pass", "onnx": "pass", "tfjs": "pass"}
    routes = {a["format"]: a.get("route") or "" for a in doc["artifacts"]}
    assert "TF1 graph" in routes["tfjs"], routes


def test_a_default_matrix_that_compared_nothing_fails_saying_so() -> None:
    """Every matrix test skipped because the source can become none of the formats: the line
    that fails the session (``pytest_sessionfinish``) is written; one test that ran, or a skip
    for another reason (a missing runtime: the install hint), keeps the run as it was."""
    from pytest_modelparity.plugin.matrix import nothing_compared_line

    unreachable = ("Skipped: modelparity: format 'keras' cannot be made from this source (cannot convert "
                   "'model.ckpt': a model file cannot be converted to 'keras')")
    outcomes = {f"t.py::test_export[{f}-cpu]": ("cpu", "skipped", unreachable.replace("'keras'", repr(f)))
                for f in ("keras", "h5", "saved_model", "graphdef")}
    line = nothing_compared_line(outcomes)
    assert line is not None and "NOTHING WAS COMPARED: all 4 matrix test(s) skipped" in line
    assert "--modelparity-formats" in line
    ran = dict(outcomes, **{"t.py::test_export[tflite-cpu]": ("cpu", "passed", None)})
    assert nothing_compared_line(ran) is None
    missing = dict(outcomes, **{"t.py::test_export[onnx-cpu]": ("cpu", "skipped", "Skipped: onnxruntime is not installed")})
    assert nothing_compared_line(missing) is None
    assert nothing_compared_line({}) is None


def _become_table() -> dict[str, dict[str, str]]:
    """docs/formats.md "What each source can become": {source row: {format: yes/no}}."""
    text = (Path(__file__).parent.parent / "docs" / "formats.md").read_text()
    section = text.split("## What each source can become", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in rows[0]][1:]
    return {cells[0].strip(): dict(zip(header, (c.strip() for c in cells[1:]))) for cells in rows[1:]}


def test_what_each_source_can_become_is_what_export_model_does(tmp_path: Path) -> None:
    """Every cell of the docs table, against export_model on a real source of that row: a `yes`
    writes a file that loads back and agrees with the source (tfjs converted for the .pb row;
    its other rows run in the suites above), a `no` is refused at once as a conversion."""
    import keras
    import numpy as np

    import tf1_batchnorm
    from pytest_modelparity import ModelLoadError, assert_outputs_close, export_model, load_model

    table = _become_table()
    assert set(next(iter(table.values()))) == {"keras", "h5", "saved_model", "graphdef", "checkpoint", "tflite",
                                               "onnx", "tfjs"}
    x = keras.Input((8, 8, 3), name="image")
    keras_model = keras.Model(x, keras.layers.Dense(4, name="probs", kernel_initializer=keras.initializers.GlorotUniform(
        seed=3))(keras.layers.GlobalAveragePooling2D()(x)))
    checkpoint, frozen = tf1_batchnorm.build(tmp_path / "tf1")
    saved = export_model(keras_model, "saved_model", tmp_path / "sm")
    tflite_file = export_model(keras_model, "tflite", tmp_path / "m.tflite")
    sources = {"a Keras model": keras_model, "a SavedModel directory": saved, "a frozen GraphDef": frozen,
               "a TF1 checkpoint": checkpoint, "a `.tflite` file": tflite_file}
    rows = np.random.default_rng(2).uniform(0, 1, (3, 8, 8, 3)).astype("float32")
    checked = 0
    for row, cells in table.items():
        (source,) = [v for k, v in sources.items() if row.startswith(k)]
        for fmt, cell in cells.items():
            target = tmp_path / "out" / f"{checked}-{fmt}"
            checked += 1
            if cell == "no":
                with pytest.raises((ModelLoadError, ValueError)) as info:
                    export_model(source, fmt, target)
                assert isinstance(info.value, ValueError) or info.value.action == "convert", (row, fmt, info.value)
                continue
            assert cell == "yes", (row, fmt, cell)
            if fmt == "tfjs" and source is not frozen:
                continue
            written = export_model(source, fmt, target)
            reference = load_model(source) if not isinstance(source, keras.Model) else load_model(keras_model)
            assert_outputs_close(load_model(written), reference, inputs=rows)
    assert checked == 5 * 8


DEBUG_OPS_CONFTEST = textwrap.dedent('''
    import pytest

    def build():
        import keras
        import tensorflow as tf

        class Checked(keras.layers.Layer):
            """A trained model's own checks: an assert, a finiteness check and a print."""

            def call(self, x):
                tf.debugging.assert_all_finite(x, "features must be finite")
                tf.debugging.assert_greater_equal(tf.reduce_min(x), -100.0, message="features out of range")
                tf.print("batch", tf.shape(x)[0])
                return x * 2.0

        x = keras.Input((6,), name="features")
        h = keras.layers.Dense(8, activation="relu", name="h",
                               kernel_initializer=keras.initializers.GlorotUniform(seed=4))(Checked()(x))
        y = keras.layers.Dense(3, name="score", kernel_initializer=keras.initializers.GlorotUniform(seed=5))(h)
        return keras.Model(x, y, name="checked")

    @pytest.fixture(scope="session")
    def modelparity_source():
        return build
''')


def test_debug_ops_in_the_model_are_stripped_for_tfjs_and_the_route_says_so(pytester: pytest.Pytester) -> None:
    """tfjs has no Assert, CheckNumerics or PrintV2: the export failed with "replace the layers
    using those ops", impossible for a trained file. They are stripped (with their control
    edges and the If that guards an assert) and the route records it."""
    pytester.makeconftest(DEBUG_OPS_CONFTEST)
    pytester.makepyfile(PARITY_TEST)
    result = pytester.runpytest(CACHE_ARG, "-v", "--modelparity-formats=tfjs", "--modelparity-report=r.json")
    result.assert_outcomes(passed=1)
    doc = json.loads((pytester.path / "r.json").read_text())
    (artifact,) = [a for a in doc["artifacts"] if a["format"] == "tfjs"]
    assert "debug ops stripped (Assert/CheckNumerics/Print) x3" in artifact["route"], artifact
    assert [r["verdict"] for r in doc["rows"]] == ["pass"]


def test_strip_debug_ops_keeps_what_the_outputs_compute() -> None:
    """The rewrite itself on a graph: the asserted and printed value still flows to the output
    (CheckNumerics -> Identity), the Assert, PrintV2 and their inputs go, and a graph without
    debug ops is left as it was."""
    import numpy as np
    import tensorflow as tf

    from pytest_modelparity.formats.tfjs.rewrite import strip_debug_ops

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        checked = tf.debugging.check_numerics(x, "finite")
        ok = tf.debugging.Assert(tf.reduce_all(checked > -5.0), [checked], name="guard")
        printed = tf.print("x", checked, name="show")
        with tf.control_dependencies([ok, printed]):
            tf.identity(checked * 3.0, name="y")
    graph_def = graph.as_graph_def()
    assert strip_debug_ops(graph_def, ["y:0"]) == 3
    ops = {n.op for n in graph_def.node}
    assert not ops & {"Assert", "CheckNumerics", "PrintV2", "StringFormat"}, ops
    out = tf.Graph()
    with out.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=out) as sess:
            value = sess.run("y:0", {"x:0": np.array([[1.0, -2.0, 0.5]], "float32")})
    np.testing.assert_array_equal(value, [[3.0, -6.0, 1.5]])
    again = graph.as_graph_def()
    plain = tf.Graph()
    with plain.as_default():
        tf.identity(tf.compat.v1.placeholder(tf.float32, [None, 3], name="x") * 2.0, name="y")
    untouched = plain.as_graph_def()
    before = untouched.SerializeToString()
    assert strip_debug_ops(untouched, ["y:0"]) == 0 and untouched.SerializeToString() == before
    assert len(again.node) > len(graph_def.node)


CONV3D_CONFTEST = textwrap.dedent('''
    import pytest

    def build():
        import keras
        init = keras.initializers.GlorotUniform
        x = keras.Input((8, 8, 8, 2), name="volume")
        h = keras.layers.Conv3D(4, 3, padding="same", activation="relu", kernel_initializer=init(seed=1))(x)
        h = keras.layers.MaxPool3D(2, padding="same")(h)        # odd sizes below: SAME pads one side
        h = keras.layers.Conv3D(4, 2, activation="relu", kernel_initializer=init(seed=2))(h)
        h = keras.layers.MaxPool3D((2, 2, 3), strides=(1, 2, 1))(h)
        y = keras.layers.Dense(3, name="score", kernel_initializer=init(seed=3))(keras.layers.Flatten()(h))
        return keras.Model(x, y, name="volumes")

    @pytest.fixture(scope="session")
    def modelparity_source():
        return build
''')


def test_conv3d_maxpool3d_net_gets_a_float64_floor(pytester: pytest.Pytester) -> None:
    """TensorFlow has no float64 MaxPool3D kernel, so neither twin ran and the net was judged by
    the fixed rule ("no float64 floor"). The graph twin writes MaxPool3D as two MaxPool (exact)."""
    pytester.makeconftest(CONV3D_CONFTEST)
    pytester.makepyfile(PARITY_TEST)
    result = pytester.runpytest(CACHE_ARG, "-v", "--modelparity-formats=saved_model", "--modelparity-report=r.json")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert "no float64 floor" not in out and "judged without their noise floor" not in out
    assert out.count("from a float64 run of its graph twin") == 1, out
    doc = json.loads((pytester.path / "r.json").read_text())
    assert all(not r.get("noise_floor_missing") for r in doc["rows"]), doc["rows"]


def test_max_pool3d_rewrite_is_exact() -> None:
    """The two-MaxPool form equals MaxPool3D bitwise in float32 (VALID, SAME, uneven strides)."""
    import numpy as np
    import tensorflow as tf

    from pytest_modelparity.floor.graph_twin import float64_graph_def

    rng = np.random.default_rng(7)
    for ksize, strides, padding in [((2, 2, 2), (2, 2, 2), "SAME"), ((2, 2, 3), (1, 2, 1), "VALID"),
                                    ((3, 1, 2), (2, 1, 3), "SAME")]:
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, 5, 7, 6, 3], name="x")
            tf.nn.max_pool3d(x, ksize, strides, padding, name="pool")
        twin = float64_graph_def(graph.as_graph_def(), ["pool:0"])
        assert "MaxPool3D" not in {n.op for n in twin.node}
        value = rng.normal(size=(2, 5, 7, 6, 3))
        with tf.compat.v1.Session(graph=graph) as sess:
            want = sess.run("pool:0", {"x:0": value.astype("float32")})
        run = tf.Graph()
        with run.as_default():
            tf.graph_util.import_graph_def(twin, name="")
            with tf.compat.v1.Session(graph=run) as sess:
                got = sess.run("pool:0", {"x:0": value})
        assert got.dtype == np.float64 and got.shape == want.shape
        np.testing.assert_array_equal(got.astype("float32"), want)


CONVNEXT_BLOCK_CONFTEST = textwrap.dedent('''
    import pytest

    def build():
        import keras
        init = keras.initializers.GlorotUniform
        x = keras.Input((8, 8, 8), name="image")
        # ConvNeXt's block: a 7x7 conv with one group per channel, LayerNorm, pointwise MLP
        h = keras.layers.Conv2D(8, 7, padding="same", groups=8, kernel_initializer=init(seed=1), name="dwconv")(x)
        h = keras.layers.LayerNormalization(epsilon=1e-6, name="ln")(h)
        h = keras.layers.Dense(16, activation="gelu", kernel_initializer=init(seed=2), name="pw1")(h)
        h = keras.layers.Dense(8, kernel_initializer=init(seed=3), name="pw2")(h)
        h = keras.layers.Add()([x, h])
        y = keras.layers.Dense(3, name="score", kernel_initializer=init(seed=4))(keras.layers.GlobalAveragePooling2D()(h))
        return keras.Model(x, y, name="convnext_block")

    @pytest.fixture(scope="session")
    def modelparity_source():
        return build
''')


def test_convnext_grouped_conv_becomes_tfjs(pytester: pytest.Pytester) -> None:
    """Keras runs a grouped Conv2D in a jit_compile function: tfjs got "unsupported ops:
    StatefulPartitionedCall" (and, inlined, tfjs's conv2d has no groups). The export inlines
    it and writes the one-group-per-channel conv as the depthwise conv it is."""
    pytester.makeconftest(CONVNEXT_BLOCK_CONFTEST)
    pytester.makepyfile(PARITY_TEST)
    result = pytester.runpytest(CACHE_ARG, "-v", "--modelparity-formats=tfjs", "--modelparity-report=r.json")
    result.assert_outcomes(passed=1)
    doc = json.loads((pytester.path / "r.json").read_text())
    (artifact,) = doc["artifacts"]
    assert "XLA-only functions inlined" in artifact["route"] and "grouped conv as depthwise x1" in artifact["route"]


def test_a_saved_model_without_variables_says_so_and_the_fix_works(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """saved_model.pb copied without variables/: every form said "TensorSliceReader" (tfjs:
    "check the model's ops"). The message names the missing folder; copying the whole
    directory, its fix, makes the same suite pass."""
    import shutil

    import keras

    from pytest_modelparity import export_model

    x = keras.Input((6,), name="x")
    model = keras.Model(x, keras.layers.Dense(3, name="y", kernel_initializer=keras.initializers.GlorotUniform(seed=1))(x))
    whole = export_model(model, "saved_model", tmp_path / "whole")
    partial = tmp_path / "partial"
    partial.mkdir()
    shutil.copy(whole / "saved_model.pb", partial / "saved_model.pb")
    pytester.makeconftest(textwrap.dedent('''
        import os
        import pytest

        @pytest.fixture(scope="session")
        def modelparity_source():
            return os.environ["SOURCE"]
    '''))
    pytester.makepyfile(PARITY_TEST)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SOURCE", str(partial))
        broken = pytester.runpytest(CACHE_ARG, "--modelparity-formats=saved_model,tfjs")
        broken.assert_outcomes(errors=2)
        broken.stdout.fnmatch_lines(["*the directory has no variables/ folder*",
                                     "*fix: copy the whole SavedModel directory (saved_model.pb with variables/ beside it)*"])
        assert "TensorSliceReader" not in broken.stdout.str()
        env.setenv("SOURCE", str(whole))  # the fix
        fixed = pytester.runpytest(CACHE_ARG, "--modelparity-formats=saved_model,tfjs", "-rs")
        # tfjs converts and passes; saved_model is the source's own directory: not a comparison
        fixed.assert_outcomes(passed=1, skipped=1)
        fixed.stdout.fnmatch_lines(["*compared with itself*"])


def test_an_export_error_never_names_an_empty_converter_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two tfjs errors pointed to converter logs of 0 bytes: a log the converter wrote nothing
    to is not named (and not kept); one it wrote to is."""
    from pytest_modelparity.errors import ExportError
    from pytest_modelparity.formats.common import ConverterLog

    monkeypatch.setenv("MODELPARITY_LOG_DIR", str(tmp_path))
    empty = ConverterLog("tfjs")
    assert empty.keep() is None
    empty.discard()
    assert not empty.path.exists()
    error = ExportError(tmp_path / "m", "tfjs", "tfjs cannot run the converted model", "try the other backend",
                        log_path=empty.keep())
    assert "converter log" not in str(error)
    written = ConverterLog("tfjs")
    with written.capture():
        print("converter output")
    assert written.keep() == written.path and "converter output" in written.text()


def test_a_graph_twin_run_failure_names_the_node_and_the_cause() -> None:
    """A bare "InvalidArgumentError: Graph execution error:" named neither the node nor the
    cause; the twin's error now says both (a real TensorFlow failure in a twin's session)."""
    import numpy as np
    import tensorflow as tf

    from pytest_modelparity.floor import graph_twin
    from pytest_modelparity.formats.tensorflow.graph import FrozenGraph, GraphUnavailable

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, None], name="samples")
        tf.identity(tf.reshape(x, [-1, 4], name="frames") * 2.0, name="y")
    twin = graph_twin.build(FrozenGraph(graph.as_graph_def(), ["samples:0"], ["y:0"]), "float64")
    np.testing.assert_array_equal(twin.run([np.ones((1, 8), "float32")])[0], np.full((2, 4), 2.0))
    with pytest.raises(GraphUnavailable, match=r"at node 'frames' \(Reshape\): Input to reshape is a tensor with 3 "
                                               r"values") as info:
        twin.run([np.ones((1, 3), "float32")])
    assert "Graph execution error" not in str(info.value)


def test_an_error_without_a_message_is_not_written_twice() -> None:
    """A tflite export said "RuntimeError: RuntimeError" (LiteRT's message is its type name)."""
    from pytest_modelparity.formats.common import first_line

    assert first_line(RuntimeError("RuntimeError")) == ("RuntimeError (it carries no message; the converter log "
                                                         "may say more)")
    assert first_line(RuntimeError()) == first_line(RuntimeError("RuntimeError"))
    assert first_line(ValueError("bad shape\n  detail")) == "ValueError: bad shape"


STFT_CONFTEST = textwrap.dedent('''
    import pytest

    def build():
        import keras
        import tensorflow as tf

        class LogSpectrogram(keras.layers.Layer):
            """An audio front-end: log magnitude of a short-time Fourier transform."""

            def call(self, x):
                return tf.math.log(tf.abs(tf.signal.stft(x, 64, 32, 64)) + 1e-3)

        x = keras.Input((512,), name="audio")
        h = keras.layers.Flatten()(LogSpectrogram()(x))
        y = keras.layers.Dense(4, name="score", kernel_initializer=keras.initializers.GlorotUniform(seed=6))(h)
        return keras.Model(x, y, name="spectrogram")

    @pytest.fixture(scope="session")
    def modelparity_source():
        return build
''')


def test_stft_magnitude_becomes_onnx(pytester: pytest.Pytester) -> None:
    """tf2onnx's own ComplexAbs handler refused an STFT's magnitude at every opset ("expected
    the first dimension to be 2"), and the advice was a newer opset; the exporter's handler
    writes it as sqrt(re^2 + im^2). The spectrum has a float64 floor: the graph twin computes
    it in complex128 (ComplexAbs's complex64 -> float signature refused a float64 rewrite)."""
    pytester.makeconftest(STFT_CONFTEST)
    pytester.makepyfile(PARITY_TEST)
    result = pytester.runpytest(CACHE_ARG, "-v", "--modelparity-formats=onnx", "--modelparity-report=r.json")
    result.assert_outcomes(passed=1)
    [row] = json.loads((pytester.path / "r.json").read_text())["rows"]
    assert row["noise_floor_missing"] is None, row["noise_floor_missing"]
    assert "from a float64 run of its graph twin" in row["tolerance_source"], row["tolerance_source"]
