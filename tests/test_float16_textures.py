"""The float16-textures verdict (checks/float16_textures.py) on arrays: no browser needed.

The browser tests (tests/test_tfjs_browser.py) run it on real float16 textures; these check
that each part fails for its own cause, and (Hypothesis) that the floor the verdict derives
from a model's float32 error covers what rounding every activation to float16 really costs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pytest_modelparity.checks import float16_textures as f16
from pytest_modelparity.verdict.tolerances import Tolerance


def _conversion(dtype, path):
    return Tolerance(0.0, 0.0, scale=1e-5, source="test conversion bound", default=True)


def _scores(rows=32, classes=10, seed=0):
    return np.random.default_rng(seed).normal(0, 2, (rows, classes)).astype(np.float32)


def _report(textures, sibling, reference, errors=None):
    return f16.two_part_report(textures={"logits": textures}, sibling={"logits": sibling},
                               reference={"logits": reference}, conversion_tolerance=_conversion,
                               float32_errors=errors, missing="no twin in this test")


def test_float16_rounding_of_a_faithful_sibling_passes_both_parts():
    ref = _scores()
    sib = ref + np.float32(1e-7)
    report = _report(sib.astype(np.float16).astype(np.float32), sib, ref, {"['logits']": 2e-7})
    info = report.meta["quantized"]
    assert report.passed and info["failed_parts"] == [] and info["variant"] == "webgl-f16"
    assert 0 < info["parts"][f16.COST]["max_rel_of_scale"] < f16.EPS16
    assert "judged in two parts" in report.meta["summary"]


def test_a_cost_beyond_the_float16_floor_fails_only_that_part():
    ref = _scores()
    report = _report(ref * np.float32(1.02), ref, ref, {"['logits']": 2e-7})  # 2% of scale: no rounding does that
    assert not report.passed and report.meta["quantized"]["failed_parts"] == [f16.COST]
    assert "float16 activations alone cost this model more" in report.meta["summary"]


def test_a_conversion_bug_is_named_as_such_not_blamed_on_float16():
    ref = _scores()
    exp = np.exp(ref - ref.max(-1, keepdims=True))
    probs = exp / exp.sum(-1, keepdims=True)
    twice = np.exp(probs) / np.exp(probs).sum(-1, keepdims=True)  # seed 003 on float32 textures
    report = f16.two_part_report(textures={"p": twice.astype(np.float16).astype(np.float32)}, sibling={"p": twice},
                                 reference={"p": probs}, conversion_tolerance=_conversion,
                                 float32_errors={"['p']": 1e-7})
    assert report.meta["quantized"]["failed_parts"] == [f16.CONVERSION]
    assert "on float32 textures already" in report.meta["summary"]


def test_decisions_must_agree_and_one_row_may_flip():
    tol = f16.cost_tolerance(1e-7, (4, 10))
    assert tol.min_top1 == pytest.approx(0.75)  # on 4 rows one flip is not evidence
    assert f16.cost_tolerance(1e-7, (200, 10)).min_top1 == f16.TOP1
    assert f16.cost_tolerance(1e-7, (1, 10)).min_top1 is None


def test_without_a_twin_the_fixed_bound_says_why():
    tol = f16.cost_tolerance(None, (8, 10), "the tfjs form has no graph")
    assert tol.scale == f16.FALLBACK_SCALE and "no float64 twin measured the model: the tfjs form has no graph" in tol.source


def _mlp(seed, depth, width):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (16, width))
    layers = [(rng.normal(0, 1 / np.sqrt(width), (width, width)), rng.normal(0, 0.1, width)) for _ in range(depth)]
    head = rng.normal(0, 1 / np.sqrt(width), (width, 10))

    def run(dtype, store=None):
        h = x.astype(dtype)
        for w, b in layers:
            h = np.maximum(h @ w.astype(dtype) + b.astype(dtype), 0)
            if store is not None:  # what float16 textures do: every op's output stored in float16
                h = h.astype(store).astype(dtype)
        out = h @ head.astype(dtype)
        return out.astype(store).astype(dtype) if store is not None else out

    return run


@settings(max_examples=25, deadline=None, database=None)
@given(seed=st.integers(0, 2**31 - 1), depth=st.integers(1, 6), width=st.sampled_from([8, 32, 96]))
def test_the_floor_covers_float16_activations_of_relu_nets(seed, depth, width):
    run = _mlp(seed, depth, width)
    ref64, ref32, tex16 = run(np.float64), run(np.float32), run(np.float32, np.float16)
    scale = np.abs(ref64).max()
    float32_error = float(np.abs(ref32 - ref64).max() / scale)
    cost = float(np.abs(tex16 - ref32).max() / np.abs(ref32).max())
    assert cost <= f16.FLOAT16_MULTIPLE * f16.float16_floor(float32_error)
