"""The models people ship through the converters: recurrent text classifiers (masked LSTM,
GRU, BiLSTM) and a transformer encoder with exact GELU, through real TFLite and tf2onnx,
run by real LiteRT and onnxruntime, judged with the default tolerance.

Also: converter failures become one ExportError (ops, advice, log file) and never leave a
file behind or in the export cache; converter options reach the converter; the path
export_model returns loads back without format=; int8 of a dict-input model calibrates.
bench/model_families.py runs the big families and writes docs/model-families.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from families import SMALL, FAMILIES, gelu_encoder, recurrent, tokens, two_input
from pytest_modelparity import ExportError, ModelLoadError, assert_outputs_close, export_model, load_model
from pytest_modelparity.exports.cache import ExportCache
from pytest_modelparity.formats import export_route

pytest.importorskip("ai_edge_litert", reason="install LiteRT: pip install 'pytest-modelparity[tflite]'")
pytest.importorskip("tf2onnx", reason="the ONNX exporter needs tf2onnx: pip install 'pytest-modelparity[onnx]'")
pytest.importorskip("onnxruntime", reason="install onnxruntime: pip install 'pytest-modelparity[onnx]'")

# The route each exporter takes for each small family (docs/formats.md explains them).
ROUTES = {
    ("tflite", "recurrent"): r"^static_batch 1 \(the graph has .*While",
    ("onnx", "recurrent"): r"^frozen-keep-control-flow \(the graph has .*While",
    ("tflite", "encoder"): r"^dynamic$",
    ("onnx", "encoder"): r"^frozen$",
}


@pytest.fixture(scope="module")
def built():
    """Each small family built once per module (Keras model, batch)."""
    return {name: FAMILIES[name]() for name in SMALL}


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
@pytest.mark.parametrize("family", SMALL)
def test_family_passes_default_tolerance(built, family, fmt, tmp_path):
    model, batch = built[family]
    path = export_model(model, fmt, tmp_path / "model")
    assert path.name == f"model.{fmt}"
    kind = "encoder" if "encoder" in family else "recurrent"
    assert re.search(ROUTES[(fmt, kind)], export_route(path) or ""), export_route(path)
    with load_model(path) as candidate:  # no format=: the suffix says it
        assert candidate.format == fmt
        # 4 rows, and 1 and 3: a static-batch tflite file runs any batch size in chunks.
        for rows in (4, 1, 3):
            sub = {k: v[:rows] for k, v in batch.items()} if isinstance(batch, dict) else batch[:rows]
            assert assert_outputs_close(candidate, model, inputs=sub).passed


def test_static_batch_file_runs_other_batch_sizes_in_chunks(tmp_path):
    model, _ = recurrent("gru")
    path = export_model(model, "tflite", tmp_path / "gru.tflite", converter_options={"static_batch": 2})
    assert export_route(path).startswith("static_batch 2")
    x = tokens(5, seed=3)  # 5 rows: two chunks of 2 and a padded chunk of 1
    with load_model(path) as candidate:
        assert candidate.fixed_batch == 2
        got = candidate.predict(x)["probs"]
    assert got.shape == (5, 3)
    np.testing.assert_allclose(got, np.asarray(model(x)), rtol=0, atol=1e-5)


def test_tflite_converter_failure_is_one_export_error_with_log_and_nothing_cached(tmp_path, capfd):
    """Forcing the dynamic route on an LSTM reproduces the converter's TensorList failure."""
    model, _ = recurrent("lstm")
    cache = ExportCache(tmp_path / "cache")
    with pytest.raises(ExportError) as info:
        cache.export(model, "tflite", converter_options={"route": "dynamic"})
    err = info.value
    text = str(err)
    assert isinstance(err, ModelLoadError) and err.format == "tflite" and err.action == "export"
    assert "TensorListReserve" in err.unsupported_ops
    assert "fix:" in text and "re-export" not in text
    assert err.log_path and Path(err.log_path).is_file() and "TensorList" in Path(err.log_path).read_text()
    assert f"converter log: {err.log_path}" in text
    assert len(text.splitlines()) <= 4 and len(text) < 1500  # one short message, not 20 KB of MLIR
    captured = capfd.readouterr()
    assert "TensorListReserve" not in captured.out + captured.err  # the flood went to the log
    assert cache.entries() == [] and not list((tmp_path / "cache").rglob("*.tflite"))


def test_onnx_file_onnxruntime_refuses_is_never_written_or_cached(tmp_path):
    """Without the built-in Erfc handler tf2onnx writes a file onnxruntime refuses: it must
    become an ExportError naming Erfc, with no file left at the path and nothing cached."""
    model, _ = gelu_encoder()
    target = tmp_path / "enc.onnx"
    with pytest.raises(ExportError) as info:
        export_model(model, "onnx", target, converter_options={"custom_op_handlers": {"Erfc": None}})
    assert info.value.unsupported_ops == ("Erfc",)
    assert "opset" in info.value.fix
    assert not target.exists() and not list(tmp_path.iterdir())
    cache = ExportCache(tmp_path / "cache")
    with pytest.raises(ExportError):
        cache.export(model, "onnx", converter_options={"custom_op_handlers": {"Erfc": None}})
    assert cache.entries() == [] and not list((tmp_path / "cache").rglob("*.onnx"))


def test_converter_options_reach_the_converters(tmp_path):
    model, batch = built_mlp()
    path = export_model(model, "onnx", tmp_path / "m", converter_options={"opset": 13})
    with load_model(path) as candidate:
        assert candidate.format_variant == "onnx:opset13"
    with pytest.raises(TypeError, match="unknown converter_options key"):
        export_model(model, "tflite", tmp_path / "t", converter_options={"no_such_option": 1})
    with pytest.raises(ValueError, match="supported_ops"):
        export_model(model, "tflite", tmp_path / "t", converter_options={"supported_ops": ["BUILTINS_PLEASE"]})
    with pytest.raises(TypeError, match="takes no converter_options"):
        export_model(model, "keras", tmp_path / "k", converter_options={"opset": 13})
    cache = ExportCache(tmp_path / "cache")
    assert cache.key(model, "onnx", {"converter_options": {"opset": 13}}) != cache.key(
        model, "onnx", {"converter_options": {"opset": 17}})


def built_mlp():
    return FAMILIES["MLP"]()


@pytest.mark.parametrize("fmt", ["keras", "h5", "graphdef", "tflite", "onnx"])
def test_suffixless_export_path_gets_the_suffix_and_loads_back(tmp_path, fmt):
    model, batch = built_mlp()
    path = export_model(model, fmt, tmp_path / "model")
    assert path == tmp_path / f"model.{ {'keras': 'keras', 'h5': 'h5', 'graphdef': 'pb'}.get(fmt, fmt) }"
    with load_model(path) as candidate:
        assert candidate.format == fmt
        assert assert_outputs_close(candidate, model, inputs=batch).passed


def test_int8_of_a_dict_input_model_calibrates_by_name(tmp_path):
    model, batch = two_input()
    path = export_model(model, "tflite", tmp_path / "two", quantization="int8", representative_data=[batch])
    with load_model(path) as candidate:
        assert candidate.format_variant == "tflite:int8"
        got = candidate.predict(batch)["out"]
    want = np.asarray(model(batch))
    assert np.max(np.abs(got - want)) < 0.05 * np.max(np.abs(want)) + 0.05


def test_h5_that_keras_cannot_load_back_is_an_export_error(tmp_path):
    """Keras 3 writes a masked Embedding's mask as a NotEqual op layer its legacy HDF5 loader
    does not know: the file would fail only at load, so export refuses it."""
    model, _ = recurrent("lstm")
    with pytest.raises(ExportError, match="HDF5") as info:
        export_model(model, "h5", tmp_path / "lstm.h5")
    assert ".keras" in info.value.fix
    assert not (tmp_path / "lstm.h5").exists()


def test_grouped_convolution_exports_a_valid_onnx_file(tmp_path):
    """Keras runs a grouped Conv2D (ConvNeXt's depthwise convolutions) in a function XLA must
    compile and that is never inlined; tf2onnx left it as a StatefulPartitionedCall node."""
    import keras

    keras.utils.set_random_seed(0)
    x = keras.Input((8, 8, 4), name="img")
    y = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3, groups=4, padding="same")(x))
    model = keras.Model(x, keras.layers.Dense(2, name="out")(y))
    path = export_model(model, "onnx", tmp_path / "grouped")
    assert export_route(path).startswith("frozen-inlined (XLA-only functions: ")
    batch = np.random.default_rng(0).uniform(size=(3, 8, 8, 4)).astype("float32")
    with load_model(path) as candidate:
        assert [s.name for s in candidate.inputs] == ["img"] and [s.name for s in candidate.outputs] == ["out"]
        assert "StatefulPartitionedCall" not in {op for _, op in candidate.op_types()}
        assert assert_outputs_close(candidate, model, inputs=batch).passed


def test_int8_of_a_recurrent_model_is_refused_before_the_calibrator_crashes(tmp_path):
    """TF 2.21's calibrator segfaults on a graph with While loops: that would take pytest down
    with it, so the exporter refuses and names the variants that work."""
    model, batch = recurrent("lstm")
    with pytest.raises(ExportError, match="segmentation fault") as info:
        export_model(model, "tflite", tmp_path / "lstm", quantization="int8", representative_data=[batch])
    assert "While" in info.value.unsupported_ops and "dynamic_range" in info.value.fix
    assert not list(tmp_path.iterdir())


def test_a_lookup_table_model_to_onnx_is_one_export_error(tmp_path):
    from families import string_input

    model, _ = string_input()
    with pytest.raises(ExportError, match="lookup table") as info:
        export_model(model, "onnx", tmp_path / "words")
    assert "saved_model" in info.value.fix and not list(tmp_path.iterdir())
