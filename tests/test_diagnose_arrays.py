"""Diagnosis checks that need only numpy: output transforms and accumulation noise,
run through ``assert_outputs_close`` on arrays as a user would."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_modelparity import ParityError, assert_outputs_close
from pytest_modelparity.diagnose import transforms, noise


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _logits(seed=0, shape=(8, 5)):
    return np.random.default_rng(seed).normal(0, 3, shape).astype("float32")


def _causes(actual, expected, **kw):
    with pytest.raises(ParityError) as info:
        assert_outputs_close(actual, expected, **kw)
    return [h.cause for h in info.value.report.hints], str(info.value)


def test_double_softmax_named_in_failure_text():
    probs = _softmax(_logits())
    causes, text = _causes(_softmax(probs).astype("float32"), probs)
    assert causes == ["double_softmax"]
    assert "softmax(expected)" in text and "applied twice" in text


def test_candidate_returns_logits_where_reference_returns_probabilities():
    logits = _logits(1)
    causes, _ = _causes(logits, _softmax(logits).astype("float32"))
    assert causes == ["missing_softmax"]
    causes, _ = _causes(_softmax(logits).astype("float32"), logits)
    assert causes == ["extra_softmax"]


@pytest.mark.parametrize("factor,name", [(255.0, "255"), (1 / 256, "1/256"), (100.0, "100")])
def test_output_scaled_by_a_known_constant(factor, name):
    e = np.abs(_logits(2)) + 0.5
    causes, text = _causes((e * factor).astype("float32"), e)
    assert causes == ["output_scaled"]
    assert f"actual ≈ {name} × expected" in text


@pytest.mark.parametrize("fn,cause", [(np.log, "log_applied"), (np.exp, "exp_applied"),
                                      (lambda v: 1 / (1 + np.exp(-v)), "sigmoid_applied")])
def test_log_exp_sigmoid(fn, cause):
    e = np.random.default_rng(3).uniform(0.1, 2.0, (6, 4)).astype("float32")
    causes, _ = _causes(fn(e).astype("float32"), e)
    assert causes == [cause]


def test_class_and_row_permutations():
    e = _softmax(_logits(4))
    causes, text = _causes(e[:, [1, 0, 2, 3, 4]], e)
    assert causes == ["class_permutation"] and "perm = [1, 0, 2, 3, 4]" in text
    causes, _ = _causes(e[[2, 0, 1, 3, 4, 5, 6, 7]], e)
    assert causes == ["row_permutation"]


def test_unrelated_outputs_get_no_cause():
    causes, text = _causes(_logits(5), _logits(6))
    assert causes == []
    assert "Likely cause" not in text


def test_few_ulp_exact_comparison_is_explained_as_rounding_noise():
    batched = np.array([729027.5625] * 3, dtype="float32")
    single = batched - np.float32(0.0625 * 3)   # 3 ULP at this scale
    causes, text = _causes(single, batched, rtol=0, atol=0)
    assert causes == ["accumulation_noise"]
    assert "3 ULP" in text


def test_seed_004_without_a_model_is_not_called_noise():
    # 18 ULP is more than a few roundings: without a model there is no reduction length to
    # justify it (the model-level test in test_diagnose_zoo.py covers seed 004 itself).
    batched = np.array([729027.5625] * 3, dtype="float32")
    single = np.array([729026.4375] * 3, dtype="float32")
    causes, _ = _causes(single, batched, rtol=0, atol=0)
    assert causes == []


def test_noise_bound_scales_with_reduction_length():
    e = np.full(4, 729027.5625, dtype="float32")
    a = e + np.float32(0.0625 * 40)     # 40 ULP at this scale
    assert noise.accumulation_noise(a, e, None) is None
    hint = noise.accumulation_noise(a, e, 3136)
    assert hint is not None and "3136 terms" in hint[1]
    # A real bug (255/256 input scaling: 2e-3 of the output's scale) is never called noise.
    assert noise.accumulation_noise(e * (255 / 256), e, 10 ** 6) is None


def test_output_transform_never_raises_on_odd_arrays():
    assert transforms.output_transform(np.array([np.nan, 1.0]), np.array([1.0, np.inf])) is None
    assert transforms.output_transform(np.zeros((0, 3)), np.zeros((0, 3))) is None
    assert transforms.output_transform(np.ones(3, "int32"), np.zeros(3, "int32")) is None


def test_noise_hint_says_its_ulps_are_of_the_largest_value_not_per_element():
    # Seed 004's table line reads "Greatest ULP distance 12651" (an element near zero) while
    # the hint counts ULPs of the largest output: unqualified, "up to 9 ULP" contradicted it.
    e = np.array([344.743, 0.01], dtype="float32")
    a = e + np.float32(2.75e-4)
    hint = noise.accumulation_noise(a, e, 1024)
    assert hint is not None
    assert "ULP of the output's largest value" in hint[1]


def test_large_outputs_are_diagnosed_on_a_sample_and_confirmed_on_every_element():
    """A 1M-element output: the transform is found on a bounded sample of whole rows, and
    claimed only if it holds on every element (a corrupted row outside the sample vetoes it)."""
    from pytest_modelparity.diagnose._util import SAMPLE, sample_pair

    logits = _logits(5, shape=(100_000, 10))
    extra = _softmax(logits).astype("float32")
    sa, _ = sample_pair(extra, logits)
    assert sa.size <= SAMPLE + 10 and sa.shape[-1] == 10  # whole rows
    causes, text = _causes(extra, logits)
    assert causes == ["extra_softmax"] and "softmax(expected)" in text
    row = 1  # not among the evenly spaced sample rows
    assert not any((sa == extra[row]).all(axis=-1))
    broken = extra.copy()
    broken[row] += 0.05
    assert transforms.output_transform(broken, logits) is None


def test_the_heavy_checks_rerun_fewer_rows_where_each_row_is_large():
    """Reruns, input transforms and the layer table run on the first 8 rows, and on as few as 2
    where a row is large (a 224 px image: each rerun is compute, and the conversion part of a
    failing quantised MobileNetV2 took 7.7 s of diagnosis on 8 rows, 4.4-5.6 s on 2)."""
    from pytest_modelparity.diagnose import HEAVY_ELEMENTS, HEAVY_ROWS, _few_rows

    for side, want in ((64, HEAVY_ROWS), (224, 2), (128, HEAVY_ELEMENTS // (128 * 128 * 3))):
        x = {"image": np.zeros((32, side, side, 3), np.float32)}
        out = {"probs": np.zeros((32, 10), np.float32)}
        few, actual, flat_a, flat_e = _few_rows(x, out["probs"], dict(out), dict(out))
        assert few["image"].shape[0] == want and flat_a["probs"].shape[0] == want == flat_e["probs"].shape[0]
    small = {"image": np.zeros((2, 224, 224, 3), np.float32)}
    assert _few_rows(small, np.zeros((2, 10)), {"": np.zeros((2, 10))}, {"": np.zeros((2, 10))})[0] is small
