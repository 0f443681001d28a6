"""A list of inputs is in the expected model's input order, whatever order a converted form
lists its own inputs in.

Found by the converter fuzzer (docs/fuzzing.md): a tfjs form's model.json listed two same-shape
inputs in another order than the Keras model on some exports, the list was fed in the form's
order, and a correct form FAILED (the difference was the output with its inputs swapped). A
TFLite signature lists its inputs sorted by name, so a Keras model whose inputs are not in
name order shows the same case on every run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pytest_modelparity import assert_outputs_close, export_model, load_model


@pytest.fixture(scope="module")
def two_inputs_out_of_name_order(tmp_path_factory: pytest.TempPathFactory):
    import keras

    b = keras.Input((4,), name="b_in")
    a = keras.Input((4,), name="a_in")
    y = keras.layers.Dense(3)(keras.layers.Concatenate()([b, a * 3.0]))
    model = keras.Model([b, a], y)
    path = export_model(model, "saved_model", tmp_path_factory.mktemp("pos") / "m")
    return model, Path(path)


def test_a_list_feeds_each_form_in_the_expected_models_order(two_inputs_out_of_name_order) -> None:
    model, path = two_inputs_out_of_name_order
    form = load_model(path)
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(5, 4)).astype(np.float32) for _ in range(2)]
    report = assert_outputs_close(form, model, inputs=xs)
    assert report.passed
    # the case is real here: the form lists a_in first, and fed the list in its own order it
    # answers something else (what the check used to compare)
    assert "a_in" in form.inputs[0].name and "b_in" in form.inputs[1].name, form.inputs
    raw = np.asarray(next(iter(form.predict(dict(zip([s.name for s in form.inputs], xs))).values())))
    assert np.max(np.abs(raw - np.asarray(model(xs)))) > 0.1
