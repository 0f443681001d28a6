"""Seed 003: the SavedModel said 0.96 and the browser said 0.46 because the JS code applied
softmax to probabilities. The conversion itself agrees; the double softmax is caught and
named. Run: pytest conftest_examples/saved_model_vs_tfjs -rxX"""

import numpy as np
import pytest

from pytest_modelparity import ParityError, assert_outputs_close

pytestmark = pytest.mark.modelparity(formats=["tfjs"])

SEED_003 = "seed 003: the JS code called tf.softmax on the model's probabilities (softmax applied twice)"


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def js_postprocessing_with_the_bug(outputs):
    """What the user's TypeScript did: ``tf.softmax(model.predict(x))`` on probabilities."""
    return {name: softmax(value) for name, value in outputs.items()}


def test_tfjs_conversion_matches_saved_model(parity_candidate, parity_reference, parity_batch):
    assert parity_candidate.format == "tfjs" and parity_reference.format == "saved_model"
    assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)


@pytest.mark.xfail(raises=ParityError, strict=True, reason=SEED_003)
def test_js_postprocessing_matches_saved_model(parity_candidate, parity_reference, parity_batch):
    actual = js_postprocessing_with_the_bug(parity_candidate.predict(parity_batch))
    assert_outputs_close(actual, parity_reference.predict(parity_batch))


def test_the_failure_says_softmax_was_applied_twice(parity_candidate, parity_reference, parity_batch):
    actual = js_postprocessing_with_the_bug(parity_candidate.predict(parity_batch))
    with pytest.raises(ParityError) as failure:
        assert_outputs_close(actual, parity_reference.predict(parity_batch))
    assert "softmax" in str(failure.value), str(failure.value)
