"""Every exporter that renames tensors keeps the Keras input and output names and order."""

from __future__ import annotations

import numpy as np
import pytest

from models import two_in_two_out
from pytest_modelparity import assert_outputs_close, export_model, load_model
from pytest_modelparity.formats import missing_runtime

pytest.importorskip("tensorflow", reason="the exporters need TensorFlow: pip install 'pytest-modelparity[tensorflow]'")


@pytest.mark.parametrize("fmt, target", [("tflite", "multi.tflite"), ("onnx", "multi.onnx")])
def test_several_inputs_and_outputs_keep_keras_names_and_order(fmt, target, tmp_path):
    missing = missing_runtime(fmt, export=True)
    if missing is not None:
        pytest.skip(str(missing))
    model = two_in_two_out()
    loaded = load_model(export_model(model, fmt, tmp_path / target), fmt)
    assert [s.name for s in loaded.inputs] == ["zeta", "alpha"]
    assert [s.name for s in loaded.outputs] == ["score", "aux"]
    x = {"zeta": np.linspace(0, 1, 12, dtype="float32").reshape(3, 4), "alpha": np.full((3, 3), 0.5, "float32")}
    out = loaded.predict(x)
    assert {k: v.shape for k, v in out.items()} == {"score": (3, 2), "aux": (3, 5)}
    assert_outputs_close(loaded, load_model(model), inputs=x)
    np.testing.assert_array_equal(loaded.predict([x["zeta"], x["alpha"]])["aux"], out["aux"])
