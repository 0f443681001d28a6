"""Every export of the classifier agrees with the Keras model, is deterministic, and does not
depend on the batch size. Run: pytest conftest_examples/keras_all_formats -v"""

from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_modelparity import assert_batch_invariant, assert_deterministic, assert_outputs_close, strategies


def test_outputs_match_keras(parity_candidate, parity_reference, parity_batch):
    assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)


def test_deterministic(parity_candidate, parity_batch):
    assert_deterministic(parity_candidate, parity_batch)


def test_batch_invariant(parity_candidate, parity_batch):
    assert_batch_invariant(parity_candidate, parity_batch, batch_sizes=(1, 3))


@settings(parent=settings.get_profile("modelparity"), max_examples=8)
@given(data=st.data())
def test_random_images_match_keras(parity_candidate, parity_reference, data):
    # Pixels in [0, 1]; Hypothesis shrinks a failure to the smallest batch and prints it.
    batch = data.draw(strategies.batches(parity_reference, batch_size=st.integers(1, 8),
                                         elements={"image": (0.0, 1.0)}))
    assert_outputs_close(parity_candidate, parity_reference, inputs=batch)
