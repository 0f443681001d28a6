"""TFLite: a real Keras CNN exported by the real converter, run by the real LiteRT interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from models import images, mlp, tiny_cnn
from pytest_modelparity import DeviceUnavailable, ParityError, assert_outputs_close, export_model, load_model
from pytest_modelparity.formats import tflite

pytest.importorskip("ai_edge_litert", reason="install LiteRT: pip install 'pytest-modelparity[tflite]'")
pytest.importorskip("tensorflow", reason="the exporter needs TensorFlow: pip install 'pytest-modelparity[tensorflow]'")


@pytest.fixture(scope="module")
def cnn():
    return tiny_cnn()


@pytest.fixture(scope="module")
def cnn_tflite(cnn, tmp_path_factory) -> Path:
    return export_model(cnn, "tflite", tmp_path_factory.mktemp("tflite") / "cnn.tflite")


def keras_out(model, x) -> np.ndarray:
    return np.asarray(model(x, training=False))


@pytest.mark.parametrize("batch", [1, 3, 17])
def test_float32_export_matches_keras(cnn, cnn_tflite, batch):
    model = load_model(cnn_tflite, "tflite")
    x = images(batch, seed=batch)
    out = model.predict(x)
    assert list(out) == ["probs"]
    assert out["probs"].shape == (batch, 4)
    np.testing.assert_allclose(out["probs"], keras_out(cnn, x), rtol=0, atol=1e-5)
    report = assert_outputs_close(model, load_model(cnn), inputs=x)  # the format's default tolerance
    assert report.passed


def test_default_tolerance_still_catches_a_preprocessing_bug(cnn, cnn_tflite):
    x = images(17)
    scaled = load_model(cnn_tflite, "tflite").predict(x * (255 / 256))  # /256 instead of /255
    with pytest.raises(ParityError):
        assert_outputs_close(scaled, load_model(cnn).predict(x))


def test_specs_named_after_the_keras_model(cnn_tflite):
    model = load_model(cnn_tflite, "tflite")
    assert model.format == "tflite" and model.device == "cpu"
    assert [(s.name, s.shape, s.dtype.name) for s in model.inputs] == [("image", (None, 8, 8, 3), "float32")]
    assert [(s.name, s.shape, s.dtype.name) for s in model.outputs] == [("probs", (None, 4), "float32")]
    assert model.format_variant == "tflite:float32"
    assert type(model.native).__module__.startswith("ai_edge_litert")


def test_dict_list_and_array_batches_agree(cnn_tflite):
    model = load_model(cnn_tflite, "tflite")
    x = images(2)
    a = model.predict(x)["probs"]
    np.testing.assert_array_equal(model.predict({"image": x})["probs"], a)
    np.testing.assert_array_equal(model.predict([x])["probs"], a)
    np.testing.assert_array_equal(model.predict(x.astype("float64"))["probs"], a)


def test_resized_once_per_batch_shape_and_reused(cnn_tflite):
    model = load_model(cnn_tflite, "tflite")
    sizes = [2, 5, 7]
    batches = {b: images(b, seed=b) for b in sizes}
    first = {b: model.predict(batches[b])["probs"] for b in sizes}
    for call in range(17):  # 20 calls in all, over 3 shapes
        b = sizes[call % 3]
        np.testing.assert_array_equal(model.predict(batches[b])["probs"], first[b])
    assert model.resize_count == 3


def test_interpreter_cache_is_bounded_and_stays_correct(cnn, cnn_tflite):
    model = load_model(cnn_tflite, "tflite", max_interpreters=2)
    for b in [2, 3, 4, 2, 3, 4]:
        x = images(b, seed=b)
        np.testing.assert_allclose(model.predict(x)["probs"], keras_out(cnn, x), atol=1e-5)
    assert len(model._pool) == 2
    assert model.resize_count == 6  # each shape was evicted before it came back


@pytest.mark.parametrize("quantization, max_drift", [("float16", 1e-2), ("dynamic_range", 0.1), ("int8", 0.1)])
def test_quantised_variants_load_run_and_say_what_they_are(cnn, tmp_path, quantization, max_drift):
    path = export_model(cnn, "tflite", tmp_path / f"{quantization}.tflite", quantization=quantization)
    model = load_model(path, "tflite")
    assert model.format_variant == f"tflite:{quantization}"
    assert model.inputs[0].dtype == np.float32  # float I/O kept: comparable with the Keras model
    x = images(17, seed=3)
    out = model.predict(x)["probs"]
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=2e-2)  # still a softmax
    drift = float(np.max(np.abs(out - keras_out(cnn, x))))
    assert 0 < drift < max_drift
    assert_outputs_close(model, load_model(cnn), inputs=x)  # judged by the variant's default
    stored = {"float16": "float16", "dynamic_range": "int8", "int8": "int8"}[quantization]
    assert any(w.shape == (4, 256) and w.dtype == stored for w in model.weights().values())  # Dense, as stored
    ops = {op for _, op in model.op_types()}
    if quantization == "int8":
        assert {"QUANTIZE", "DEQUANTIZE"} <= ops
    if quantization == "float16":
        assert "DEQUANTIZE" in ops


def test_int8_calibrates_on_the_users_data(tmp_path):
    model = mlp()
    data = [np.random.default_rng(i).normal(0, 50, (8, 16)).astype("float32") for i in range(4)]
    generated = load_model(export_model(model, "tflite", tmp_path / "gen.tflite", quantization="int8"), "tflite")
    calibrated = load_model(export_model(model, "tflite", tmp_path / "cal.tflite", quantization="int8",
                                         representative_data=data), "tflite")
    x = np.random.default_rng(9).normal(0, 50, (32, 16)).astype("float32")
    ref = keras_out(model, x)
    err_generated = np.max(np.abs(generated.predict(x)["out"] - ref))
    err_calibrated = np.max(np.abs(calibrated.predict(x)["out"] - ref))
    # Inputs of scale 50 saturate a [0, 1) calibration; the user's data fixes that.
    assert err_calibrated < err_generated / 3


def test_unknown_quantisation_is_refused(cnn, tmp_path):
    with pytest.raises(ValueError, match="float16, dynamic_range, int8"):
        export_model(cnn, "tflite", tmp_path / "m.tflite", quantization="int4")
    assert not (tmp_path / "m.tflite").exists()


def test_export_is_quiet_on_stdout(cnn, tmp_path, capfd):
    export_model(cnn, "tflite", tmp_path / "quiet.tflite")
    assert "Saved artifact" not in capfd.readouterr().out


def test_gpu_is_refused_with_the_reason(cnn_tflite):
    with pytest.raises(DeviceUnavailable, match="CPU only"):
        load_model(cnn_tflite, "tflite", device="gpu")
    with pytest.raises(DeviceUnavailable, match="CPU only"):
        load_model(cnn_tflite, "tflite", device="gpu:1")
    assert load_model(cnn_tflite, "tflite", device="cpu:0").device == "cpu"
    with pytest.raises(ValueError, match="unknown device"):
        load_model(cnn_tflite, "tflite", device="tpu")


def test_op_types_and_intermediates(cnn, cnn_tflite):
    model = load_model(cnn_tflite, "tflite")
    ops = [op for _, op in model.op_types()]
    assert ops[0] == "CONV_2D" and ops[-1] == "SOFTMAX" and "FULLY_CONNECTED" in ops
    assert "DELEGATE" not in ops
    x = images(3)
    steps = model.intermediates(x)
    assert [op for _, op, _ in steps] == ops  # one output per op here, in execution order
    # Intermediates come from LiteRT's reference kernels (XNNPACK fuses them away): the final
    # values agree with the delegated run up to float noise, not bit for bit.
    np.testing.assert_allclose(steps[-1][2], model.predict(x)["probs"], rtol=0, atol=1e-6)
    conv_out = steps[0][2]
    assert conv_out.shape == (3, 8, 8, 4) and np.all(conv_out >= 0)  # conv+bn+relu fused


def test_preserve_all_tensors_keeps_predictions(cnn_tflite):
    plain = load_model(cnn_tflite, "tflite").predict(images(4))["probs"]
    kept = load_model(cnn_tflite, "tflite", preserve_all_tensors=True).predict(images(4))["probs"]
    np.testing.assert_array_equal(plain, kept)


def test_weights_expose_the_dense_kernel(cnn, cnn_tflite):
    weights = load_model(cnn_tflite, "tflite").weights()
    kernel = cnn.get_layer("logits").get_weights()[0]  # (256, 4); TFLite stores it transposed
    assert any(w.shape == kernel.T.shape and np.array_equal(w, kernel.T) for w in weights.values())


def test_unknown_option_is_named(cnn_tflite):
    with pytest.raises(TypeError, match="preserve_tensors"):
        load_model(cnn_tflite, "tflite", preserve_tensors=True)


def test_detect_by_suffix(tmp_path, cnn_tflite):
    assert tflite.detect(cnn_tflite)
    assert not tflite.detect(tmp_path / "model.onnx")
    (tmp_path / "dir.tflite").mkdir()
    assert not tflite.detect(tmp_path / "dir.tflite")


def test_loading_does_not_import_tensorflow(cnn_tflite):
    code = (
        "import sys, numpy as np\n"
        "from pytest_modelparity import load_model\n"
        f"m = load_model({str(cnn_tflite)!r}, 'tflite')\n"
        "out = m.predict(np.zeros((2, 8, 8, 3), 'float32'))['probs']\n"
        "assert out.shape == (2, 4)\n"
        "print('tensorflow' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize("io_dtype", ["int8", "uint8"])
def test_integer_io_model_is_shown_as_float_by_default(cnn, tmp_path, io_dtype):
    path = export_model(cnn, "tflite", tmp_path / f"io_{io_dtype}.tflite", quantization="int8", io_dtype=io_dtype)
    x = images(5, seed=4)
    model = load_model(path, "tflite")
    assert model.format_variant == "tflite:int8"
    assert model.inputs[0].dtype == np.float32 and model.outputs[0].dtype == np.float32
    assert_outputs_close(model, load_model(cnn), inputs=x)
    raw = load_model(path, "tflite", dequantize_io=False)
    assert raw.inputs[0].dtype == np.dtype(io_dtype) and raw.outputs[0].dtype == np.dtype(io_dtype)
    scale, zero = raw.native.get_input_details()[0]["quantization"]
    q = np.clip(np.round(x / scale) + zero, *(lambda i: (i.min, i.max))(np.iinfo(io_dtype))).astype(io_dtype)
    out_scale, out_zero = raw.native.get_output_details()[0]["quantization"]
    dequantised = (raw.predict(q)["probs"].astype("float32") - out_zero) * np.float32(out_scale)
    np.testing.assert_array_equal(dequantised, model.predict(x)["probs"])
    with pytest.raises(Exception, match="cannot be cast safely"):
        raw.predict(x)  # raw integer inputs refuse floats instead of truncating them


def test_integer_io_needs_int8_quantisation(cnn, tmp_path):
    with pytest.raises(ValueError, match="io_dtype"):
        export_model(cnn, "tflite", tmp_path / "bad.tflite", io_dtype="int8")
