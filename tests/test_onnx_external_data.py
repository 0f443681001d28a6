"""ONNX external data is read from the model's folder only (issue 39): run from a folder holding
a decoy ``ok.bin``, the model loaded the decoy's weights; a location outside the folder
(absolute, ``..``, a link leading out) is refused naming the file, the format and the fix."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="writing external data needs onnx: pip install 'pytest-modelparity[onnx]'")
pytest.importorskip("onnxruntime", reason="pip install 'pytest-modelparity[onnx]'")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from pytest_modelparity import ModelLoadError  # noqa: E402
from pytest_modelparity.formats import load_model  # noqa: E402

WEIGHTS = np.array([2.0, 3.0, 5.0, 7.0], np.float32)
DECOY = np.full(4, 1000.0, np.float32)
X = np.ones((1, 4), np.float32)


def _model() -> onnx.ModelProto:
    w = numpy_helper.from_array(WEIGHTS, "w")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "scale",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _save(folder: Path, location: str = "ok.bin") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "scale.onnx"
    onnx.save_model(_model(), path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ok.bin", size_threshold=0)
    if location != "ok.bin":  # point the tensor elsewhere, as a hostile file would
        proto = onnx.load_model(path, load_external_data=False)
        for entry in proto.graph.initializer[0].external_data:
            if entry.key == "location":
                entry.value = location
        path.write_bytes(proto.SerializeToString())
    return path


def _predict(model) -> np.ndarray:
    return next(iter(model.predict({model.inputs[0].name: X}).values()))


def test_external_data_is_read_from_the_models_folder_not_the_current_one(tmp_path, monkeypatch) -> None:
    path = _save(tmp_path / "model")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    DECOY.tofile(elsewhere / "ok.bin")  # the decoy the model picked up before
    monkeypatch.chdir(elsewhere)
    model = load_model(path, format="onnx")
    np.testing.assert_array_equal(_predict(model), X * WEIGHTS)
    np.testing.assert_array_equal(model.weights()["w"], WEIGHTS)  # the diagnosis hook reads the same file
    layers = model.intermediates(X)
    assert layers is not None
    np.testing.assert_array_equal(layers[-1][2], X * WEIGHTS)  # so does the every-tensor debug session


def test_a_relative_path_to_the_model_works_from_its_parent(tmp_path, monkeypatch) -> None:
    _save(tmp_path / "model")
    DECOY.tofile(tmp_path / "ok.bin")
    monkeypatch.chdir(tmp_path)
    np.testing.assert_array_equal(_predict(load_model("model/scale.onnx", format="onnx")), X * WEIGHTS)


@pytest.mark.parametrize("where, says", [
    ("absolute", "is an absolute path"),
    ("parent", "climbs out of the model's folder with '..'"),
    ("link", "leads outside it through a link"),
])
def test_a_location_outside_the_models_folder_is_refused(tmp_path, where, says) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    DECOY.tofile(outside / "ok.bin")
    if where == "link":
        path = _save(tmp_path / "model", "shard.bin")
        os.symlink(outside / "ok.bin", tmp_path / "model" / "shard.bin")
    else:
        path = _save(tmp_path / "model", str(outside / "ok.bin") if where == "absolute" else "../outside/ok.bin")
    with pytest.raises(ModelLoadError) as caught:
        load_model(path, format="onnx")
    text = str(caught.value)
    assert str(path) in text and "onnx" in text and says in text and "'w'" in text
    assert "external data is read only from the model's own folder" in text
    assert "location='weights.bin'" in text  # the fix: how to save it so it loads


def test_a_missing_or_special_external_file_is_a_clear_error(tmp_path) -> None:
    path = _save(tmp_path / "model")
    (tmp_path / "model" / "ok.bin").unlink()
    with pytest.raises(ModelLoadError, match="(?s)cannot be read.*copy the external data file"):
        load_model(path, format="onnx")
    os.mkfifo(tmp_path / "model" / "ok.bin")  # would block onnxruntime's read forever
    with pytest.raises(ModelLoadError, match="is a FIFO \\(named pipe\\), not a regular file"):
        load_model(path, format="onnx")


def test_the_users_session_options_still_apply(tmp_path, monkeypatch) -> None:
    import onnxruntime as ort

    path = _save(tmp_path / "model")
    DECOY.tofile(tmp_path / "ok.bin")
    monkeypatch.chdir(tmp_path)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the path that read the decoy
    np.testing.assert_array_equal(_predict(load_model(path, format="onnx", session_options=options)), X * WEIGHTS)
