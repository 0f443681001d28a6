"""``--modelparity-input-range`` (ini ``modelparity_input_range``): the values batches are drawn
from, for zero-code mode (which has no conftest to hold a ``modelparity_elements`` fixture),
``parity_batch`` and ``tflite:int8`` calibration. A token model with a 5-word vocabulary fails
on the default integer range [0, 10] and passes when told the ids are in [0, 4]."""

from __future__ import annotations

import pytest

from pytest_modelparity.plugin.options import parse_input_range

# inline_exports (conftest.py): no export worker; the process is not what these tests are about
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]


def test_parsing():
    assert parse_input_range("0,255") == (0.0, 255.0)
    assert parse_input_range(" image=0,255; mask=0,1 ") == {"image": (0.0, 255.0), "mask": (0.0, 1.0)}
    assert parse_input_range(None) is None and parse_input_range("") is None
    for bad in ("255", "a,b", "5,1", "0,inf", "image=0", "=0,1"):
        with pytest.raises(pytest.UsageError, match="--modelparity-input-range"):
            parse_input_range(bad)


@pytest.fixture
def token_model(pytester: pytest.Pytester):
    import keras

    keras.utils.set_random_seed(3)
    ids = keras.Input((3,), dtype="int32", name="ids")
    h = keras.layers.Flatten()(keras.layers.Embedding(5, 2)(ids))
    path = pytester.path / "tokens.keras"
    keras.Model(ids, keras.layers.Dense(2, name="out")(h)).save(path)
    return path


def test_zero_code_mode_draws_from_the_range(pytester: pytest.Pytester, token_model) -> None:
    args = ["-p", "no:cacheprovider", f"--modelparity-model={token_model}", "--modelparity-formats=saved_model",
            "-k", "outputs_close or deterministic"]
    default = pytester.runpytest(*args)
    assert default.ret != 0  # ids up to 10 for a 5-word vocabulary: the model itself fails
    assert "indices" in default.stdout.str().lower() or "out of range" in default.stdout.str().lower(), \
        default.stdout.str()[-3000:]
    ranged = pytester.runpytest(*args, "--modelparity-input-range=0,4")
    ranged.assert_outcomes(passed=2)


def test_the_ini_key_feeds_parity_batch(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmodelparity_input_range = x=0,255\n")
    pytester.makeconftest("""
        import pytest

        @pytest.fixture(scope="session")
        def modelparity_source():
            import keras
            x = keras.Input((6,), name="x")
            return keras.Model(x, keras.layers.Dense(3, name="out")(x))
    """)
    pytester.makepyfile("""
        def test_range(parity_batch, modelparity_elements):
            assert modelparity_elements == {"x": (0.0, 255.0)}
            assert parity_batch["x"].min() >= 0 and parity_batch["x"].max() > 1
    """)
    pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=keras").assert_outcomes(passed=1)
