"""strategies.batches / seeded_batch: shapes, dtypes, ranges, argument errors, shrinking."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from pytest_modelparity import TensorSpec
from pytest_modelparity.checks.strategies import Batch, batches, seeded_batch, specs_of

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]

SPECS = [TensorSpec("image", (None, 4, 4, 3), "float32"), TensorSpec("ids", (None, None), "int32"),
         TensorSpec("mask", (None, 2), "bool")]


@settings(max_examples=30, database=None, deadline=None)
@given(batches(SPECS, elements={"image": (0, 255), "ids": (0, 99)}))
def test_batches_fit_the_specs_and_ranges(batch: Batch) -> None:
    assert list(batch) == ["image", "ids", "mask"]
    n = batch.size
    assert 1 <= n <= 16
    assert batch["image"].shape == (n, 4, 4, 3) and batch["image"].dtype == np.float32
    assert batch["ids"].shape[0] == n and 1 <= batch["ids"].shape[1] <= 8 and batch["ids"].dtype == np.int32
    assert batch["mask"].shape == (n, 2) and batch["mask"].dtype == np.bool_
    assert 0 <= batch["image"].min() and batch["image"].max() <= 255
    assert 0 <= batch["ids"].min() and batch["ids"].max() <= 99


@settings(max_examples=10, database=None, deadline=None)
@given(batches([TensorSpec("x", (None, 3), "float32")], batch_size=2, elements=st.just(0.5)))
def test_element_strategies_and_fixed_batch_size(batch: Batch) -> None:
    assert batch["x"].shape == (2, 3)
    assert (batch["x"] == 0.5).all()


def test_default_float_range_is_dense_in_minus_one_one() -> None:
    x = seeded_batch([TensorSpec("x", (None, 256), "float32")], batch_size=8)["x"]
    assert -1 <= x.min() < -0.9 and 0.9 < x.max() <= 1
    assert len(np.unique(x)) > 2000  # dense, not one fill value


def test_seeded_batch_is_reproducible_and_seed_sensitive() -> None:
    a, b, c = seeded_batch(SPECS, seed=3), seeded_batch(SPECS, seed=3), seeded_batch(SPECS, seed=4)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert not np.array_equal(a["image"], c["image"])


def test_specs_from_a_keras_model() -> None:
    import keras

    inp = keras.Input((5,), name="tokens", dtype="int32")
    model = keras.Model(inp, keras.layers.Embedding(10, 2)(inp))
    (spec,) = specs_of(model)
    assert spec == TensorSpec("tokens", (None, 5), "int32")


@pytest.mark.parametrize("kwargs, message", [
    ({"elements": {"nope": (0, 1)}}, "unknown input(s) ['nope']"),
    ({"elements": {"image": (5, 1)}}, "(low, high) pair with low <= high"),
    ({"elements": 3}, "elements must be None"),
])
def test_bad_arguments_say_what_to_pass(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        batches(SPECS, **kwargs)
    assert message in str(err.value)


@pytest.mark.parametrize("batch_size, message", [
    (0, "batch_size=0: batch_size must be >= 1"),
    ("4", "batch_size='4' is not an int"),
    (True, "batch_size=True is not an int"),
])
def test_bad_batch_size_is_the_same_error_as_in_the_assertions(batch_size: object, message: str) -> None:
    """One validator, one exception type for a batch size below 1, wherever it is given."""
    from pytest_modelparity.errors import InvalidArgumentError

    for call in (lambda: batches(SPECS, batch_size=batch_size), lambda: seeded_batch(SPECS, batch_size=batch_size)):
        with pytest.raises(InvalidArgumentError) as err:
            call()
        assert message in str(err.value)


def test_not_a_model_says_what_to_pass() -> None:
    with pytest.raises(InvalidArgument, match="pass e.g. parity_reference"):
        batches(42)


def test_repr_shows_the_batch_size() -> None:
    assert repr(seeded_batch(SPECS, batch_size=5)).startswith("Batch(size=5, image=array(")


def test_given_with_session_fixtures_shrinks_to_batch_size_five(pytester: pytest.Pytester,
                                                                _heavy_modules_stay_loaded: None) -> None:
    # A real Keras model whose outputs depend on the batch size from 5 rows up (the shape of
    # a batch-dependent bug); the reference fixture is session-scoped, so no health check fires.
    pytester.makeconftest('''
        import pytest

        @pytest.fixture(scope="session")
        def modelparity_source():
            import keras

            class BatchDependent(keras.layers.Layer):
                def call(self, x):
                    n = keras.ops.shape(x)[0]
                    return keras.ops.where(n >= 5, x * 1.01, x)

            x = keras.Input((3,), name="x")
            y = keras.layers.Dense(2, name="y", kernel_initializer=keras.initializers.GlorotUniform(seed=0))(x)
            return keras.Model(x, BatchDependent(name="quirk")(y))
    ''')
    pytester.makepyfile('''
        from hypothesis import given, strategies as st
        from pytest_modelparity import assert_batch_invariant, assert_outputs_close, strategies

        @given(data=st.data())
        def test_batch_invariant(parity_reference, data):
            batch = data.draw(strategies.batches(parity_reference))
            assert_batch_invariant(parity_reference, batch, batch_sizes=(1,))

        @given(data=st.data())
        def test_saved_model_matches(parity_candidate, parity_reference, data):
            batch = data.draw(strategies.batches(parity_reference, batch_size=st.integers(1, 4)))
            assert_outputs_close(parity_candidate, parity_reference, inputs=batch)
    ''')
    result = pytester.runpytest("--hypothesis-profile=modelparity", "--modelparity-formats=saved_model",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, passed=1)
    out = result.stdout.str()
    assert "HealthCheck" not in out and "FailedHealthCheck" not in out
    result.stdout.fnmatch_lines(["*Draw 1: Batch(size=5, x=array(*"])
    assert "Batch(size=6" not in out and "Batch(size=16" not in out
