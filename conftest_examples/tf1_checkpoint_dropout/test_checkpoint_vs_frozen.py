"""Seed 000: checkpoint vs frozen .pb with dropout left in. The failures are expected (xfail,
strict: if they start passing, the example no longer shows the bug), and the diagnosis must
name the random op. Run: pytest conftest_examples/tf1_checkpoint_dropout -rxX"""

import pytest

from pytest_modelparity import ParityError, assert_deterministic, assert_outputs_close

SEED_000 = ("seed 000: dropout (a RandomUniform op) was left in the inference graph, so every "
            "run samples a new mask: the checkpoint and the frozen .pb cannot agree")


@pytest.mark.xfail(raises=ParityError, strict=True, reason=SEED_000)
def test_frozen_graph_is_deterministic(buggy_models, images):
    _, frozen = buggy_models
    assert_deterministic(frozen, images)


@pytest.mark.xfail(raises=ParityError, strict=True, reason=SEED_000)
def test_frozen_graph_matches_checkpoint(buggy_models, images):
    checkpoint, frozen = buggy_models
    assert_outputs_close(frozen, checkpoint, inputs=images)


def test_the_failure_names_the_random_op(buggy_models, images):
    _, frozen = buggy_models
    with pytest.raises(ParityError) as failure:
        assert_deterministic(frozen, images)
    text = str(failure.value)
    assert "RandomUniform" in text, text
    assert "dropout" in text, text


def test_fixed_graph_is_deterministic_and_frozen_matches(fixed_models, images):
    checkpoint, frozen = fixed_models
    assert_deterministic(frozen, images)
    assert_deterministic(checkpoint, images)
    assert_outputs_close(frozen, checkpoint, inputs=images)
