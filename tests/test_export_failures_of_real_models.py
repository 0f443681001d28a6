"""Export failures of models teams already have (issue 26, its second round), each built in the
test with the property that broke it, run through the plugin's fixtures in a pytester session:

- an int8 division by a computed tensor (an L2 normalisation): LiteRT's int8 DIV refuses a
  divisor at its zero point (``div.cc:262 data[i] != zero_point ... (DIV)``); the export keeps
  DIV in float and says so in its route, and a user's own file is told the cause and a fix
  that is shown to work;
- an STFT front-end whose spectrogram gets a channel axis (``[..., tf.newaxis]``): TFLite has
  no new-axis StridedSlice for dynamic dims; with a fixed length it converts with a static
  batch, with an open one the message names the node, the variant and the fixes;
- an RNN's int8 advice ("compare tflite:dynamic_range") in a session where dynamic_range
  already failed: not given again;
- a seq2seq GRU (encoder state -> decoder initial_state, return_sequences=True) to tfjs: a bare
  JavaScript TypeError before; now it converts and runs, and a model.json converted elsewhere
  is told the node and layer;
- a Hashing layer on int64 ids (issue 50): tflite, onnx and tfjs have no mapping for its ops
  (AsString, StringToHashBucketFast), each error advised another of the three; they are reasons of
  the model (NOT COMPARED on the default matrix), and the advice names what worked.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest


pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded", "installed_node_modules"),
              pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]

CACHE_ARG = "--modelparity-cache-dir=exports"


PARITY_TEST = '''
    from pytest_modelparity import assert_outputs_close

    def test_export(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
'''

L2NORM_CONFTEST = textwrap.dedent('''
    import numpy as np
    import pytest

    def build():
        import keras
        init = keras.initializers.GlorotUniform
        x = keras.Input((8,), name="features")
        h = keras.layers.Dense(8, activation="relu", name="h", kernel_initializer=init(seed=1))(x)
        # x / (||x|| + eps): the divisor is 0 + eps where every ReLU is off (the export check's zeros)
        n = keras.layers.Lambda(lambda t: t / (keras.ops.sqrt(keras.ops.sum(t * t, axis=-1, keepdims=True)) + 1e-3),
                                name="l2norm")(h)
        y = keras.layers.Dense(3, name="score", kernel_initializer=keras.initializers.RandomNormal(stddev=2.0, seed=2))(n)
        return keras.Model(x, y, name="l2norm")

    @pytest.fixture(scope="session")
    def modelparity_source():
        return build

    @pytest.fixture(scope="session")
    def modelparity_dataset():
        return np.random.default_rng(5).normal(size=(1200, 8)).astype("float32")
''')

USER_FILE_TEST = '''
    import numpy as np
    import pytest
    import tensorflow as tf
    from conftest import build
    from pytest_modelparity import ModelLoadError, load_model

    def convert(model, rows, keep_div_in_float):
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([r[None]] for r in rows)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if not keep_div_in_float:
            return converter.convert()
        # the fix the error prints, as written there
        debugger = tf.lite.experimental.QuantizationDebugger(
            converter=converter, debug_dataset=lambda: ([r[None]] for r in rows[:4]),
            debug_options=tf.lite.experimental.QuantizationDebugOptions(denylisted_ops=["DIV"]))
        return debugger.get_nondebug_quantized_model()

    def test_a_users_int8_file_is_told_the_cause_and_the_fix_works(tmp_path):
        model = build()
        rows = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
        zeros = np.zeros((2, 8), "float32")
        plain = tmp_path / "plain.tflite"
        plain.write_bytes(convert(model, rows, keep_div_in_float=False))
        with pytest.raises(ModelLoadError) as info:
            load_model(plain).predict(zeros)
        text = str(info.value)
        assert "(DIV) divides by an int8 tensor: its quantised divisor's range holds zero" in text, text
        assert "denylisted_ops=['DIV']" in info.value.fix and "Flex" not in text
        fixed = tmp_path / "fixed.tflite"
        fixed.write_bytes(convert(model, rows, keep_div_in_float=True))
        loaded = load_model(fixed)
        (at_zero,) = loaded.predict(zeros).values()  # runs (int8 rounds this row's divisor to 0 before the DIV)
        (out,) = loaded.predict(rows[:6]).values()
        assert np.isfinite(at_zero).all()
        np.testing.assert_allclose(out, np.asarray(model(rows[:6])), atol=0.15)
'''


def test_int8_division_by_a_computed_tensor_is_kept_in_float(pytester: pytest.Pytester) -> None:
    """The export check's zeros made LiteRT's int8 DIV fail ("Node number 6 (DIV)"), with a fix
    about Flex ops: the export keeps DIV in float, says so in the route, and the int8 file is
    judged (a verdict, not an export error)."""
    pytester.makeconftest(L2NORM_CONFTEST)
    pytester.makepyfile(test_forms=PARITY_TEST, test_user_file=USER_FILE_TEST)
    result = pytester.runpytest(CACHE_ARG, "-v", "--modelparity-formats=tflite:int8", "--modelparity-report=r.json")
    result.assert_outcomes(passed=2)
    doc = json.loads((pytester.path / "r.json").read_text())
    (artifact,) = [a for a in doc["artifacts"] if a["format"] == "tflite:int8"]
    assert "DIV kept in float (its int8 divisor's range holds zero" in artifact["route"], artifact
    # judged, not an export error: the conversion part passes; the quantisation part of this file
    # sits at ~2.5% of elements beyond 0.1 of scale against a 2% budget, which its 1,024 rows can
    # neither prove within nor beyond at 99.99% (issue 47): inconclusive, never a pass on the
    # benefit of the doubt (it passed before)
    verdicts = {r["output"]: r["verdict"] for r in doc["rows"]}
    assert {v for o, v in verdicts.items() if "conversion" in o} == {"pass"}, doc["rows"]
    assert set(verdicts.values()) <= {"pass", "inconclusive"}, doc["rows"]


def test_int8_division_with_integer_io_says_to_use_float_io_and_that_works(tmp_path) -> None:
    """Integer inputs/outputs leave no place for a float DIV at the output: refused naming the
    DIV and the cause; the fix (float I/O) exports a file that runs on the rows that failed."""
    import numpy as np

    from pytest_modelparity import ExportError, export_model, load_model

    namespace: dict = {}
    exec(L2NORM_CONFTEST, namespace)
    model = namespace["build"]()
    rows = [np.random.default_rng(0).normal(size=(32, 8)).astype("float32")]
    with pytest.raises(ExportError, match=r"\(DIV\) divides by an int8 tensor: its quantised divisor's range") as info:
        export_model(model, "tflite", tmp_path / "io8.tflite", quantization="int8", representative_data=rows,
                     io_dtype="int8")
    assert "io_dtype='float32'" in info.value.fix
    fixed = export_model(model, "tflite", tmp_path / "io32.tflite", quantization="int8", representative_data=rows)
    loaded = load_model(fixed)
    assert np.isfinite(loaded.predict(np.zeros((2, 8), "float32"))["score"]).all()  # the rows that failed run
    np.testing.assert_allclose(loaded.predict(rows[0][:6])["score"], np.asarray(model(rows[0][:6])), atol=0.15)


STFT_CONFTEST = textwrap.dedent('''
    import os
    import pytest

    def build():
        import keras
        import tensorflow as tf

        class Spectrogram(keras.layers.Layer):
            """An audio front-end: STFT magnitude with a channel axis for the convolutions."""

            def call(self, x):
                magnitude = tf.abs(tf.signal.stft(x, 64, 32, 64))
                if os.environ.get("ADD_AXIS") == "expand_dims":
                    return tf.expand_dims(magnitude, -1)
                return magnitude[..., tf.newaxis]

        length = None if os.environ["LENGTH"] == "open" else int(os.environ["LENGTH"])
        x = keras.Input((length,), name="audio")
        h = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv",
                                kernel_initializer=keras.initializers.GlorotUniform(seed=1))(Spectrogram()(x))
        h = keras.layers.GlobalAveragePooling2D()(h)
        y = keras.layers.Dense(3, name="score", kernel_initializer=keras.initializers.GlorotUniform(seed=2))(h)
        return keras.Model(x, y, name="spectrogram")

    @pytest.fixture(scope="session")
    def modelparity_source():
        return build

    @pytest.fixture(scope="session")
    def modelparity_dataset():
        import numpy as np
        return np.random.default_rng(3).normal(size=(3, 512)).astype("float32")
''')


def test_stft_new_axis_slice_with_a_fixed_length_converts_with_a_static_batch(pytester: pytest.Pytester) -> None:
    """A new-axis StridedSlice converts only with every dim fixed: a fixed-length STFT
    front-end is retried with a static batch (the route says why) and passes."""
    pytester.makeconftest(STFT_CONFTEST)
    pytester.makepyfile(PARITY_TEST)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LENGTH", "512")
        fixed = pytester.runpytest(CACHE_ARG, "-v", "--modelparity-formats=tflite", "--modelparity-report=r.json")
    fixed.assert_outcomes(passed=1)
    doc = json.loads((pytester.path / "r.json").read_text())
    (artifact,) = doc["artifacts"]
    assert artifact["route"].startswith("static_batch 1 (a new-axis StridedSlice converts only with every dim fixed)")


def test_stft_new_axis_slice_on_an_open_length_names_the_node_and_its_fixes_work(tmp_path, monkeypatch) -> None:
    """"StridedSlice has no TFLite builtin kernel" was false: it has one; the new_axis variant
    on dynamic dims is what fails. The message names the node and the variant; both fixes it
    gives convert and agree with the model: a fixed length (the suite above) and tf.expand_dims."""
    import numpy as np

    from pytest_modelparity import ExportError, assert_outputs_close, export_model, load_model

    namespace: dict = {}
    exec(STFT_CONFTEST, namespace)
    monkeypatch.setenv("LENGTH", "open")
    with pytest.raises(ExportError) as info:
        export_model(namespace["build"](), "tflite", tmp_path / "open.tflite")
    text = str(info.value)
    assert re.search(r"StridedSlice 'spectrogram[_\d]*/spectrogram[_\d]*/strided_slice' is the new_axis variant "
                     r"\(new_axis_mask=8", text), text
    assert "no TFLite builtin kernel" not in text and "route static_batch" in text
    assert info.value.fix.startswith("give that input a fixed length") and "tf.expand_dims" in info.value.fix
    monkeypatch.setenv("ADD_AXIS", "expand_dims")  # the second fix: the open length converts
    model = namespace["build"]()
    written = export_model(model, "tflite", tmp_path / "expand.tflite")
    rows = np.random.default_rng(3).normal(size=(2, 700)).astype("float32")
    assert_outputs_close(load_model(written), load_model(model), inputs=rows)


RNN_ERFINV_CONFTEST = textwrap.dedent('''
    import pytest

    def build():
        import keras
        import tensorflow as tf

        x = keras.Input((6, 3), name="series")
        h = keras.layers.GRU(4, name="gru", kernel_initializer=keras.initializers.GlorotUniform(seed=1),
                             recurrent_initializer=keras.initializers.Orthogonal(seed=2))(x)
        h = keras.layers.Lambda(lambda t: tf.math.erfinv(0.5 * tf.tanh(t)), name="erfinv")(h)  # no TFLite builtin
        y = keras.layers.Dense(2, name="score", kernel_initializer=keras.initializers.GlorotUniform(seed=3))(h)
        return keras.Model(x, y, name="gru_erfinv")

    @pytest.fixture(scope="session")
    def modelparity_source():
        return build
''')


def test_int8_advice_does_not_send_to_a_variant_that_failed_in_the_session(pytester: pytest.Pytester) -> None:
    """An RNN's int8 export is refused with "compare tflite:dynamic_range or tflite:float16";
    when this session's tflite:dynamic_range export already failed (an op no TFLite kernel has),
    neither is advised: the fix says it failed, with its problem, and that saved_model (which
    passes later in the same session) was not tried yet: advice names only what worked (issue 50)."""
    pytester.makeconftest(RNN_ERFINV_CONFTEST)
    pytester.makepyfile(PARITY_TEST)
    result = pytester.runpytest(CACHE_ARG, "-v", "--modelparity-formats=tflite:dynamic_range,tflite:int8,saved_model")
    result.assert_outcomes(errors=2, passed=1)
    result.stdout.fnmatch_lines(["*test_export[[]saved_model-cpu[]] PASSED*"])  # the fix given
    out = result.stdout.str()
    int8 = out[out.index("int8 calibration of a graph with loops"):]
    fix = int8[int8.index("fix: "):].splitlines()[0]
    # saved_model runs after this test: not advised as working (issue 50), named as not tried yet
    assert fix.startswith("fix: no format has been exported and compared for this model in this session so far "
                          "(saved_model not tried here; tflite:dynamic_range failed in this session too: the TFLite "
                          "converter failed (dynamic_range, route static_batch)"), fix
    assert fix.endswith("; no tflite variant has Erfinv)"), fix
    assert "tflite:float16" not in fix and "both convert and run" not in fix


def test_advice_of_a_variant_that_failed_the_same_way_is_dropped() -> None:
    """The wording of each case on the exporter's own errors: the same problem (variant names
    aside) says "failed the same way"; advice naming no failed variant is left as it was."""
    from pytest_modelparity.errors import ExportError
    from pytest_modelparity.plugin.advice import without_failed_advice

    def error(variant: str, fix: str) -> ExportError:
        return ExportError(f"/x/{variant}/model.tflite", "tflite", f"the TFLite converter failed ({variant}, route "
                           "dynamic): ValueError: bad dims 3 vs 4", fix)

    dynamic = error("dynamic_range", "compare this model through saved_model or onnx")
    int8 = error("int8", "check the representative data matches the model's inputs (fed by input name), or compare "
                         "tflite:dynamic_range instead")
    untouched = str(int8)
    assert str(without_failed_advice(int8, "tflite:int8", {"tflite:float16": dynamic})) == untouched
    without_failed_advice(int8, "tflite:int8", {"tflite:dynamic_range": dynamic, "tflite:int8": int8})
    assert int8.fix == ("check the representative data matches the model's inputs (fed by input name) "
                        "(tflite:dynamic_range failed the same way in this session)")
    assert str(int8).endswith(f"fix: {int8.fix}") and "compare tflite:dynamic_range" not in str(int8)
    loops = ExportError("/x/int8/model.tflite", "tflite", "int8 calibration of a graph with loops (While) crashes",
                        "compare tflite:dynamic_range or tflite:float16 for this model (both convert and run)")
    without_failed_advice(loops, "tflite:int8", {"tflite:dynamic_range": dynamic})
    assert loops.fix == ("compare tflite:float16 instead (tflite:dynamic_range failed in this session too: the TFLite "
                         "converter failed (dynamic_range, route dynamic): ValueError: bad dims 3 vs 4)")


SEQ2SEQ_CONFTEST = textwrap.dedent('''
    import numpy as np
    import pytest

    def build():
        import keras
        init = keras.initializers.GlorotUniform
        source = keras.Input((6,), dtype="int32", name="source")
        target_in = keras.Input((6,), dtype="int32", name="target_in")  # teacher-forced decoder input
        e = keras.layers.Embedding(12, 8, name="src_emb", embeddings_initializer=init(seed=1))(source)
        _, state = keras.layers.GRU(16, return_state=True, name="encoder", kernel_initializer=init(seed=2))(e)
        d = keras.layers.Embedding(12, 8, name="tgt_emb", embeddings_initializer=init(seed=3))(target_in)
        seq = keras.layers.GRU(16, return_sequences=True, name="decoder",
                               kernel_initializer=init(seed=4))(d, initial_state=state)
        y = keras.layers.Dense(12, name="logits", kernel_initializer=keras.initializers.RandomNormal(stddev=1.5, seed=5))(seq)
        return keras.Model([source, target_in], y, name="seq2seq")

    @pytest.fixture(scope="session")
    def modelparity_source():
        return build

    @pytest.fixture(scope="session")
    def modelparity_dataset():
        rng = np.random.default_rng(4)
        return {"source": rng.integers(1, 12, (4, 6)).astype("int32"),
                "target_in": rng.integers(1, 12, (4, 6)).astype("int32")}
''')


def test_seq2seq_gru_becomes_tfjs(pytester: pytest.Pytester) -> None:
    """A GRU encoder-decoder (the decoder's initial_state the encoder's final state, teacher
    forced, return_sequences=True) to tfjs failed with a bare JavaScript TypeError. The export
    orders each loop body's output Identity after its tensor-list write, and the route says so."""
    pytester.makeconftest(SEQ2SEQ_CONFTEST)
    pytester.makepyfile(PARITY_TEST)
    result = pytester.runpytest(CACHE_ARG, "-v", "--modelparity-formats=tfjs", "--modelparity-report=r.json")
    result.assert_outcomes(passed=1)
    doc = json.loads((pytester.path / "r.json").read_text())
    (artifact,) = doc["artifacts"]
    assert "RNN step output ordered after its list write x" in artifact["route"], artifact
    assert [r["verdict"] for r in doc["rows"]] == ["pass"]


def _convert_elsewhere(model, out):
    """model.json as the tensorflowjs converter writes it on its own (no rewrites)."""
    from pytest_modelparity import export_model
    from pytest_modelparity.formats.tfjs.export import import_converter

    saved = export_model(model, "saved_model", out.parent / f"{out.name}-sm")
    import_converter().convert_tf_saved_model(str(saved), str(out), control_flow_v2=True)
    return out / "model.json"


def test_a_model_json_converted_elsewhere_names_the_node_and_layer(tmp_path) -> None:
    """The same seq2seq converted by the tensorflowjs converter alone: the run's bare JavaScript
    error is told with the node and the Keras layer it came from (found by running tfjs up to
    single nodes) and the fix, export_model's conversion, which the suite above shows to pass."""
    import numpy as np

    from pytest_modelparity import ModelLoadError, load_model

    namespace: dict = {}
    exec(SEQ2SEQ_CONFTEST, namespace)
    rng = np.random.default_rng(4)
    rows = {"source": rng.integers(1, 12, (3, 6)).astype("int32"), "target_in": rng.integers(1, 12, (3, 6)).astype("int32")}
    model_json = _convert_elsewhere(namespace["build"](), tmp_path / "plain")
    with pytest.raises(ModelLoadError) as info:
        load_model(model_json).predict(rows)
    text = str(info.value)
    assert re.search(r"failed at node '[^']*decoder_1/TensorArrayV2Stack/TensorListStack' \(TensorListStack, in "
                     r"layer 'decoder'\): it read a tensor tfjs had already disposed \(Cannot read properties", text), text
    assert "return_sequences=True" in text and "export_model(model, 'tfjs', dir)" in info.value.fix
    assert "TypeError" not in info.value.problem.split("(Cannot read")[0]


def test_int8_representative_data_given_as_one_array_is_one_batch(tmp_path) -> None:
    """representative_data=rows (an array, not [rows]) was iterated row by row: the converter
    calibrated on nothing and wrote a float32 file for quantization="int8", silently. An array
    of the input's rank (or a dict of them) is one batch of rows."""
    import numpy as np

    from pytest_modelparity import export_model, load_model

    namespace: dict = {}
    exec(L2NORM_CONFTEST, namespace)
    rows = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    for given in (rows, {"features": rows}):
        written = export_model(namespace["build"](), "tflite", tmp_path / f"{type(given).__name__}.tflite",
                               quantization="int8", representative_data=given)
        assert load_model(written).format_variant == "tflite:int8", given


def test_a_hashing_layer_on_int64_ids_is_a_reason_of_the_model_and_its_advice_is_not_circular(tmp_path) -> None:
    """Each of tflite, onnx and tfjs refuses the model for ops it has no mapping for: the plugin's
    ``model_reason`` says so (the default matrix then skips it as not applicable), and the fix, given
    the formats this session compared (keras, saved_model), names those and none of the three."""
    import keras

    from pytest_modelparity import FORMATS, errors, export_model
    from pytest_modelparity.plugin.advice import name_working_formats
    from pytest_modelparity.plugin.causes import model_reason

    keras.utils.set_random_seed(0)
    ids = keras.Input((3,), dtype="int64", name="ids")
    h = keras.layers.Flatten()(keras.layers.Embedding(16, 4)(keras.layers.Hashing(num_bins=16, name="hash")(ids)))
    model = keras.Model(ids, keras.layers.Dense(2, name="probs")(h), name="hashed_ids")
    refused = [f for f in ("tflite", "onnx", "tfjs") if f in FORMATS]
    for fmt in refused:
        with pytest.raises(errors.ExportError) as info:
            export_model(model, fmt, tmp_path / fmt)
        exc = info.value
        assert exc.unsupported_ops and set(exc.unsupported_ops) <= {"AsString", "StringToHashBucketFast"}, exc
        assert model_reason(exc) is not None and "unsupported ops" in model_reason(exc), exc
        fix = name_working_formats(exc.fix or "test this model in the other formats", fmt, ["keras", "saved_model"])
        assert "keras or saved_model (exported and compared for this model in this session)" in fix, fix
        assert re.findall(r"\bthrough ([\w, ]+?)(?: \(|$|;|,)", fix) == ["keras or saved_model"], fix
    assert refused, "no tflite, onnx or tfjs runtime installed: bash scripts/install.sh"
