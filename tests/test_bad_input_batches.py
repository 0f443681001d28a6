"""A batch that does not fit the model fails in every format, through the one input-fitting
path (``LoadedModel.prepare_batch``): a wrong input name is never taken for the only input,
and a fixed batch dim is checked like every other dim."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow", reason="exporting needs TensorFlow: pip install 'pytest-modelparity[tensorflow]'")

from pytest_modelparity import BatchMismatchError, ParityError, assert_outputs_close, export_model, load_model  # noqa: E402
from pytest_modelparity.formats import missing_runtime  # noqa: E402

from models import mlp  # noqa: E402

pytestmark = [pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker

FORMATS = (("keras", "m.keras"), ("saved_model", "sm"), ("graphdef", "g.pb"), ("tflite", "m.tflite"),
           ("onnx", "m.onnx"), ("tfjs", "tfjs"))


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    root = tmp_path_factory.mktemp("forms")
    model = mlp(inputs=4, hidden=8, outputs=3)
    out = {}
    for fmt, name in FORMATS:
        if missing_runtime(fmt, export=True) is not None:
            continue
        out[fmt] = load_model(export_model(model, fmt, root / name))
    yield model, out
    for m in out.values():
        m.close()


def test_a_wrong_input_name_fails_in_every_format(loaded) -> None:
    model, forms = loaded
    x = np.ones((2, 4), "float32")
    assert set(forms) >= {"keras", "saved_model", "graphdef"}
    for fmt, form in forms.items():
        assert form.predict({"x": x}), fmt        # the right name still works
        with pytest.raises(BatchMismatchError) as err:
            form.predict({"wrong_name": x})
        text = str(err.value)
        assert "unexpected ['wrong_name']" in text and "missing ['x']" in text, (fmt, text)
        assert "key the batch by the model's input names ['x']" in text, text
    # ...and through the assertion, against the raw Keras model.
    with pytest.raises(BatchMismatchError, match="wrong_name"):
        assert_outputs_close(forms["keras"], model, inputs={"wrong_name": x})


def test_a_raw_keras_model_fed_a_wrong_name_fails_too(loaded) -> None:
    model, _ = loaded
    with pytest.raises((BatchMismatchError, ValueError), match="wrong_name"):
        assert_outputs_close(model, model, inputs={"wrong_name": np.ones((2, 4), "float32")})


def fixed_batch_model():
    import keras

    inp = keras.Input((3,), batch_size=4, name="x")
    return keras.Model(inp, keras.layers.Dense(2, name="y")(inp))


def test_a_fixed_batch_is_checked_like_any_other_dim(tmp_path: Path) -> None:
    model = fixed_batch_model()
    for form in (load_model(model), load_model(export_model(model, "keras", tmp_path / "m.keras"))):
        assert form.inputs[0].shape == (4, 3)
        form.predict(np.ones((4, 3), "float32"))
        with pytest.raises(BatchMismatchError, match="a batch of 1 rows, but the model was built for a fixed batch of 4"):
            form.predict(np.ones((1, 3), "float32"))


def test_a_raw_keras_model_with_a_fixed_batch_refuses_another_batch() -> None:
    """Keras itself runs a batch of 1 through a model built for 4; the assertion does not."""
    model = fixed_batch_model()
    with pytest.raises(BatchMismatchError, match="fixed batch of 4"):
        assert_outputs_close(model, model, inputs=np.ones((1, 3), "float32"))
    assert_outputs_close(model, model, inputs=np.ones((4, 3), "float32"))
    with pytest.raises(ParityError):
        assert_outputs_close(model, lambda b: np.asarray(model(b)) + 1, inputs=np.ones((4, 3), "float32"))


def test_batches_drawn_for_a_fixed_batch_model_have_its_batch(tmp_path: Path) -> None:
    """The plugin's parity_batch and Hypothesis batches fit such a model, so its suite runs."""
    from hypothesis import given, settings

    from pytest_modelparity.checks.strategies import batches, fixed_batch, seeded_batch

    model = fixed_batch_model()
    reference = load_model(model)
    assert fixed_batch(reference.inputs) == 4
    assert seeded_batch(reference, batch_size=8)["x"].shape == (4, 3)
    candidate = load_model(export_model(model, "saved_model", tmp_path / "sm"))
    assert candidate.inputs[0].shape == (4, 3)
    assert_outputs_close(candidate, reference, inputs=seeded_batch(reference, batch_size=8))

    @settings(max_examples=3, database=None, deadline=None)
    @given(batches(reference))
    def drawn(batch):
        assert batch["x"].shape[0] == 4

    drawn()


@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_zero_code_mode_on_a_fixed_batch_model(pytester: pytest.Pytester) -> None:
    """Outputs and determinism are checked on batches of the model's size; batch invariance,
    which needs other sizes, is skipped saying why and how to make it checkable."""
    pytester.makepyfile(fixedmodel='''
        def build():
            import keras
            inp = keras.Input((3,), batch_size=4, name="x")
            return keras.Model(inp, keras.layers.Dense(2, name="y")(inp))
    ''')
    pytester.syspathinsert()
    result = pytester.runpytest("--modelparity-model=fixedmodel:build", "--modelparity-formats=saved_model",
                                "-p", "no:cacheprovider", "-rs", "--modelparity-no-cache")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*built for a fixed batch of 4*build it with batch_size=None to check it*"])
