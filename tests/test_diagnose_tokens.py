"""Causes found for integer inputs (issue 27): token ids +-1, a vocabulary off by one, a
reversed sequence, padding on the other side, on a BERT-like encoder (ids + attention mask)."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from pytest_modelparity import ParityError, assert_outputs_close

pytestmark = [pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker

VOCAB, STEPS = 50, 12


def bert_like():
    """Token + position embeddings, one attention block masked by ``mask``, mean-pooled over
    the real tokens, 3 class scores: the shape of a BERT classifier, tiny."""
    import keras

    keras.utils.set_random_seed(0)
    ids = keras.Input((STEPS,), dtype="int32", name="ids")
    mask = keras.Input((STEPS,), dtype="int32", name="mask")
    x = keras.layers.Embedding(VOCAB, 16, name="tok")(ids)
    x = x + keras.layers.Embedding(STEPS, 16, name="pos")(keras.ops.arange(STEPS)[None, :])
    m = keras.ops.cast(mask, "float32")
    att = keras.layers.MultiHeadAttention(2, 8, name="mha")(x, x, attention_mask=keras.ops.cast(
        m[:, None, :] * m[:, :, None], "bool"))
    x = keras.layers.LayerNormalization(name="ln")(x + att)
    pooled = keras.ops.sum(x * m[..., None], axis=1) / keras.ops.maximum(keras.ops.sum(m, axis=1, keepdims=True), 1.0)
    out = keras.layers.Dense(3, name="logits")(pooled)
    return keras.Model({"ids": ids, "mask": mask}, out, name="bert_like")


def batch(rows: int = 6, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, VOCAB - 2, (rows, STEPS)).astype("int32")
    for i in range(rows):
        ids[i, rng.integers(STEPS // 3, STEPS - 1):] = 0  # right padding, different lengths
    return {"ids": ids, "mask": (ids != 0).astype("int32")}


def _left_padded(b: dict) -> dict:
    order = np.argsort(b["ids"] != 0, axis=1, kind="stable")
    return {k: np.take_along_axis(v, order, axis=1) for k, v in b.items()}


@pytest.fixture(scope="module")
def encoder():
    return bert_like()


@pytest.mark.parametrize("bug, cause, words", [
    (lambda b: {**b, "ids": b["ids"] + 1}, "token_id_shift", "token ids + 1"),
    (lambda b: {k: v[:, ::-1] for k, v in b.items()}, "sequence_reversed", "sequence reversed"),
    (_left_padded, "padding_side", "padding moved to the left"),
])
def test_token_input_bugs_get_a_cause(encoder, bug, cause, words):
    x = batch()

    def candidate(b):  # the serving code preprocesses the ids differently from the reference
        return encoder(bug(b))

    with pytest.raises(ParityError) as info:
        assert_outputs_close(candidate, encoder, inputs=x)
    hints = info.value.report.hints
    assert hints and hints[0].cause == cause, [str(h) for h in hints]
    assert words in hints[0].message and "input 'ids'" in hints[0].message, hints[0].message


def test_vocabulary_off_by_one_keeps_padding():
    """A single-input classifier whose padding id 0 is masked (mask_zero): ids + 1 on the real
    tokens only is a vocabulary off by one, told apart from a plain shift."""
    import keras

    keras.utils.set_random_seed(1)
    ids = keras.Input((STEPS,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(VOCAB, 8, mask_zero=True)(ids)
    model = keras.Model(ids, keras.layers.Dense(3)(keras.layers.GRU(8)(x)), name="gru_classifier")
    x = batch()["ids"]

    def candidate(b):
        return model(np.where(b == 0, 0, b + 1).astype("int32"))

    with pytest.raises(ParityError) as info:
        assert_outputs_close(candidate, model, inputs=x)
    hint = info.value.report.hints[0]
    assert hint.cause == "vocabulary_off_by_one" and "except padding 0" in hint.message, hint


def test_plugin_failure_names_the_token_shift(pytester, _heavy_modules_stay_loaded, request):
    """Through the fixtures: a test whose serving wrapper adds 1 to the ids reads the cause."""
    pytester.makeconftest(textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {str(request.path.parent)!r})
        import pytest
        from test_diagnose_tokens import bert_like, batch

        @pytest.fixture(scope="session")
        def modelparity_source():
            return bert_like()

        @pytest.fixture(scope="session")
        def modelparity_dataset():
            return batch(16)
    '''))
    pytester.makepyfile(test_ids=textwrap.dedent('''
        from pytest_modelparity import assert_outputs_close

        def test_serving(parity_reference, parity_batch):
            def serving(b):  # a tokenizer whose ids are one higher
                return parity_reference({**b, "ids": b["ids"] + 1})
            assert_outputs_close(serving, parity_reference, inputs=parity_batch)
    '''))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--modelparity-formats=keras")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "Likely cause:" in out and "with the input 'ids' token ids + 1 (the candidate reads id i as the " \
        "reference reads i + 1)" in out, out[-3000:]
