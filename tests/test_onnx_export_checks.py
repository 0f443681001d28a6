"""ONNX export checks that see what onnxruntime only warned about, and a refusal that names its
cause and a route that works (real tf2onnx + onnxruntime)."""

from __future__ import annotations

import pytest

pytest.importorskip("tf2onnx")
pytest.importorskip("onnxruntime")


def test_a_file_whose_output_shape_is_not_the_models_is_refused_naming_both_shapes(tmp_path) -> None:
    from pytest_modelparity import ExportError, export_model
    from pytest_modelparity.fuzz.known_defects import by_name

    model = by_name("tf2onnx-pad-dilated-same-conv").model.build()  # ZeroPadding2D -> dilated SAME Conv2D
    with pytest.raises(ExportError) as caught:
        export_model(model, "onnx", tmp_path / "m.onnx")
    text = str(caught.value)
    assert "computes (N, 2, 2, 4), the file declares (N, 6, 6, 4)" in text, text
    assert "tflite or saved_model" in text
    assert not (tmp_path / "m.onnx").exists()  # no broken file is written


def test_a_pass_through_output_names_its_cause_and_a_route_that_works(tmp_path) -> None:
    import keras

    from pytest_modelparity import ExportError, export_model

    inp = keras.Input((4,), name="a")
    model = keras.Model(inp, [inp, keras.layers.Dense(2)(inp)])
    with pytest.raises(ExportError) as caught:
        export_model(model, "onnx", tmp_path / "m.onnx")
    text = str(caught.value)
    assert "returns its input 'a' unchanged" in text, text
    assert "opset" not in text  # not the generic advice: another opset does not help
    assert "saved_model or tflite" in text and "tf2onnx.convert --saved-model" in text
    path = export_model(model, "tflite", tmp_path / "m.tflite")  # and the route named does work
    assert path.exists()
