"""Every feed goes through the model's own names (issue 25): a key a converter renamed still feeds,
a key that is no input is refused naming both sides, a cast that keeps values is noted once and one
that would change them is refused."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from models import mlp
from pytest_modelparity.errors import BatchMismatchError, InvalidArgumentError
from pytest_modelparity.formats.base import InputCastWarning

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def model():
    from pytest_modelparity import load_model

    keras_model = mlp(inputs=4, hidden=8, outputs=3)
    return load_model(keras_model)


def test_an_integer_batch_fed_to_a_float_input_is_noted_once(model) -> None:
    name = model.inputs[0].name
    x = np.arange(8, dtype=np.uint8).reshape(2, 4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = model.predict({name: x})
        model.predict({name: x})
    notes = [w for w in seen if issubclass(w.category, InputCastWarning)]
    assert len(notes) == 1 and "uint8 batch is fed as float32 (every value kept)" in str(notes[0].message)
    np.testing.assert_array_equal(next(iter(first.values())),
                                  next(iter(model.predict({name: x.astype(np.float32)}).values())))


def test_a_cast_that_would_change_values_is_refused(model) -> None:
    name = model.inputs[0].name
    with pytest.raises(BatchMismatchError, match="cannot be cast safely"):
        model.predict({name: np.full((2, 4), 0.5, np.float64).astype(np.complex64)})
    with pytest.raises(BatchMismatchError, match=r"values beyond 16777216 would be rounded"):
        model.predict({name: np.full((2, 4), 2 ** 24 + 1, np.int64)})


def test_a_key_that_is_no_input_names_both_sides(model) -> None:
    with pytest.raises(BatchMismatchError) as err:
        model.predict({"pixels": np.zeros((2, 4), np.float32)})
    text = str(err.value)
    assert "unexpected ['pixels']" in text and f"missing [{model.inputs[0].name!r}]" in text
    assert "model inputs:" in text and "given: pixels: (2, 4) float32" in text


def test_a_key_a_converter_renamed_still_feeds(tmp_path) -> None:
    """The report's ONNX file takes serving_default_input_2:0; a batch keyed input_2 feeds it."""
    from pytest_modelparity import export_model, load_model
    from pytest_modelparity.formats.base import by_converter_names

    tflite = load_model(export_model(mlp(inputs=4, hidden=8, outputs=3), "tflite", tmp_path / "m.tflite"))
    own = tflite.inputs[0].name
    assert by_converter_names({f"serving_default_{own}:0": 1}, [own]) == {own: 1}
    x = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
    np.testing.assert_array_equal(next(iter(tflite.predict({own: x}).values())),
                                  next(iter(tflite.predict({f"serving_default_{own}:0": x}).values())))


def test_a_dataset_array_named_after_no_input_is_refused(tmp_path) -> None:
    from pytest_modelparity.checks.dataset import as_dataset
    from pytest_modelparity.formats.base import TensorSpec

    specs = [TensorSpec("image", (None, 4), "float32")]
    np.savez(tmp_path / "rows.npz", pixels=np.zeros((6, 4), np.float32))
    with pytest.raises(InvalidArgumentError) as err:
        as_dataset(str(tmp_path / "rows.npz")).arrays(specs)
    text = str(err.value)  # the arrays, the inputs with their shapes, and the savez line that fixes it
    assert "arrays ['pixels']" in text and "'image': (None, 4) float32" in text and "image=rows['pixels']" in text, text
    np.savez(tmp_path / "ok.npz", np.ones((6, 4), np.float32))          # np.savez(path, rows): arr_0
    assert as_dataset(str(tmp_path / "ok.npz")).arrays(specs)["image"].shape == (6, 4)
    np.savez(tmp_path / "renamed.npz", serving_default_image=np.ones((6, 4), np.float32))
    assert as_dataset(str(tmp_path / "renamed.npz")).arrays(specs)["image"].shape == (6, 4)
