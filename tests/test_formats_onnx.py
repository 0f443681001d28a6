"""ONNX: a real Keras CNN exported by real tf2onnx, run by the real onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models import images, mlp, tiny_cnn
from pytest_modelparity import DeviceUnavailable, assert_outputs_close, export_model, load_model
from pytest_modelparity.formats import onnx as onnx_format

ort = pytest.importorskip("onnxruntime", reason="install onnxruntime: pip install 'pytest-modelparity[onnx]'")
pytest.importorskip("tf2onnx", reason="the exporter needs tf2onnx: pip install 'pytest-modelparity[onnx]'")
HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.fixture(scope="module")
def cnn():
    return tiny_cnn()


@pytest.fixture(scope="module")
def cnn_onnx(cnn, tmp_path_factory) -> Path:
    return export_model(cnn, "onnx", tmp_path_factory.mktemp("onnx") / "cnn.onnx")


@pytest.mark.parametrize("batch", [1, 3, 17])
def test_export_matches_keras(cnn, cnn_onnx, batch):
    model = load_model(cnn_onnx, "onnx")
    x = images(batch, seed=batch)
    out = model.predict(x)
    assert list(out) == ["probs"]
    np.testing.assert_allclose(out["probs"], np.asarray(cnn(x, training=False)), rtol=0, atol=1e-5)
    assert assert_outputs_close(model, load_model(cnn), inputs=x).passed  # the format's default tolerance


def test_specs_have_a_free_batch_dim_and_keras_names(cnn_onnx):
    model = load_model(cnn_onnx, "onnx")
    assert [(s.name, s.shape, s.dtype.name) for s in model.inputs] == [("image", (None, 8, 8, 3), "float32")]
    assert [(s.name, s.shape, s.dtype.name) for s in model.outputs] == [("probs", (None, 4), "float32")]
    assert model.format_variant == "onnx:opset17"
    assert model.providers == ["CPUExecutionProvider"]
    assert isinstance(model.native, ort.InferenceSession)


def test_opset_option(tmp_path):
    path = export_model(mlp(), "onnx", tmp_path / "m13.onnx", opset=13)
    assert load_model(path, "onnx").opset == 13


def test_dict_and_float64_batches(cnn_onnx):
    model = load_model(cnn_onnx, "onnx")
    x = images(2)
    a = model.predict(x)["probs"]
    np.testing.assert_array_equal(model.predict({"image": x.astype("float64")})["probs"], a)


def test_weights_are_the_initializers(cnn, cnn_onnx):
    weights = load_model(cnn_onnx, "onnx").weights()
    kernel = cnn.get_layer("logits").get_weights()[0]
    assert any(w.shape == kernel.shape and np.array_equal(w, kernel) for w in weights.values())


def test_op_types(cnn_onnx):
    ops = [op for _, op in load_model(cnn_onnx, "onnx").op_types()]
    assert {"Conv", "Relu", "MatMul", "Softmax"} <= set(ops)
    assert ops[-1] == "Softmax"


@pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA: the no-GPU error cannot happen")
def test_gpu_without_cuda_provider_is_a_clear_error(cnn_onnx):
    with pytest.raises(DeviceUnavailable, match="no CUDAExecutionProvider.*onnxruntime-gpu"):
        load_model(cnn_onnx, "onnx", device="gpu")


def test_bad_device_names(cnn_onnx):
    with pytest.raises(ValueError, match="unknown device"):
        load_model(cnn_onnx, "onnx", device="tpu")
    with pytest.raises(ValueError, match="unknown device"):
        load_model(cnn_onnx, "onnx", device="gpu:x")


def test_gpu_index_selects_the_cuda_device(monkeypatch):
    # Provider selection only (no session): what load() would ask onnxruntime for.
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert onnx_format.providers_for("gpu:1") == (
        "gpu:1", [("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"])
    assert onnx_format.providers_for("GPU")[1][0] == ("CUDAExecutionProvider", {"device_id": 0})
    assert onnx_format.providers_for("CPU") == ("cpu", ["CPUExecutionProvider"])


@pytest.mark.skipif(HAS_CUDA, reason="needs an onnxruntime whose CUDA provider cannot start")
@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
def test_silent_cpu_fallback_is_refused(cnn_onnx, monkeypatch):
    # The provider list claims CUDA, but the real onnxruntime here cannot start it and
    # would quietly run on CPU: a GPU test must not pass on the CPU.
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(DeviceUnavailable, match="could not start its CUDA provider"):
        load_model(cnn_onnx, "onnx", device="gpu")


@pytest.mark.skipif(not HAS_CUDA, reason="needs onnxruntime-gpu and an NVIDIA GPU (pip install onnxruntime-gpu)")
def test_runs_on_cuda_and_matches_cpu(cnn_onnx):
    x = images(17)
    gpu = load_model(cnn_onnx, "onnx", device="gpu")
    assert gpu.providers[0] == "CUDAExecutionProvider" and gpu.device == "gpu"
    cpu = load_model(cnn_onnx, "onnx", device="cpu")
    np.testing.assert_allclose(gpu.predict(x)["probs"], cpu.predict(x)["probs"], rtol=0, atol=1e-4)


def test_detect_by_suffix(tmp_path, cnn_onnx):
    assert onnx_format.detect(cnn_onnx)
    assert not onnx_format.detect(tmp_path / "model.tflite")


def test_intermediates_in_graph_order(cnn, cnn_onnx):
    model = load_model(cnn_onnx, "onnx")
    before = cnn_onnx.read_bytes()
    x = images(3)
    steps = model.intermediates(x)
    assert [op for _, op, _ in steps] == [op for _, op in model.op_types()]
    name, op, value = steps[-1]
    assert op == "Softmax" and name == "probs"
    np.testing.assert_array_equal(value, model.predict(x)["probs"])
    relu = next(v for _, op, v in steps if op == "Relu")
    assert relu.shape[0] == 3 and np.all(relu >= 0)
    assert cnn_onnx.read_bytes() == before


def test_sequential_model_exports_and_matches(tmp_path):
    """tf2onnx's from_keras fails on a Keras 3 Sequential model ('keras_tensor_3'): the
    exporter traces the model itself, so Sequential models convert like functional ones."""
    import keras

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.layers.Input((10,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dropout(0.3), keras.layers.Dense(3, activation="softmax")])
    loaded = load_model(export_model(model, "onnx", tmp_path / "seq.onnx"))
    x = np.random.default_rng(0).normal(size=(5, 10)).astype("float32")
    assert_outputs_close(loaded, model, inputs=x)


def test_saved_model_directory_converts_to_onnx_and_tflite(tmp_path):
    """A user's SavedModel (no Keras model at hand) converts to both; names and values kept."""
    model = mlp(seed=4)
    saved = tmp_path / "sm"
    model.export(str(saved), verbose=False)
    before = sorted(p.read_bytes() for p in saved.rglob("*") if p.is_file())
    x = np.random.default_rng(1).normal(size=(6, 16)).astype("float32")
    reference = load_model(saved)
    for fmt, name in (("onnx", "m.onnx"), ("tflite", "m.tflite")):
        candidate = load_model(export_model(saved, fmt, tmp_path / name))
        assert [s.name for s in candidate.inputs] == [s.name for s in reference.inputs]
        assert [s.name for s in candidate.outputs] == [s.name for s in reference.outputs]
        assert_outputs_close(candidate, reference, inputs=x)
    assert sorted(p.read_bytes() for p in saved.rglob("*") if p.is_file()) == before


def test_export_errors_say_export_and_name_the_format(tmp_path):
    from pytest_modelparity import ModelLoadError

    not_a_model = tmp_path / "notes.txt"
    not_a_model.write_text("hello")
    with pytest.raises(ModelLoadError, match=r"cannot convert '.*notes.txt': it is not a SavedModel directory.*"
                                             r"only a Keras model, a SavedModel directory or a TF1 graph"):
        export_model(not_a_model, "onnx", tmp_path / "x.onnx")
    assert not_a_model.read_text() == "hello"


def test_a_saved_model_cannot_become_a_keras_form(tmp_path):
    """keras/h5/graphdef exports need the Keras model: a path gets a clear 'cannot convert'."""
    from pytest_modelparity import ModelLoadError

    saved = tmp_path / "sm"
    mlp(seed=1).export(str(saved), verbose=False)
    for fmt in ("keras", "h5", "graphdef", "saved_model"):
        with pytest.raises(ModelLoadError, match=rf"cannot convert '.*sm': a SavedModel directory cannot be converted to '{fmt}'"
                                                 r"(.|\n)*fix: .*tflite, tfjs, onnx"):
            export_model(saved, fmt, tmp_path / f"out-{fmt}")
