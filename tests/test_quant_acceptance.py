"""The quantised decision as an acceptance test (checks/acceptance.py, issue 47): exact bounds,
and the property the old rule lacked: a file clearly outside its budget never passes, one
clearly inside it never fails, whatever the number of rows, including over sequential looks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pytest_modelparity.checks import acceptance as acc


def _cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))


@settings(max_examples=80, deadline=None, database=None)
@given(n=st.integers(1, 300), data=st.data(), alpha=st.sampled_from([1e-4, 1e-3, 0.05]))
def test_bounds_are_clopper_pearson(n, data, alpha):
    """The upper bound is where P(X <= k) falls to alpha, the lower where P(X >= k) rises to it
    (summed exactly with math.comb); the observed rate lies between them."""
    k = data.draw(st.integers(0, n))
    lo, hi = acc.lower_bound(k, n, alpha), acc.upper_bound(k, n, alpha)
    assert 0.0 <= lo <= k / n <= hi <= 1.0
    if k < n:
        assert _cdf(k, n, hi) == pytest.approx(alpha, rel=1e-6, abs=1e-12)
        assert acc.binom_cdf(k, n, hi * 0.999) > alpha  # a bound a hair lower would not cover
    if k > 0:
        assert 1 - _cdf(k - 1, n, lo) == pytest.approx(alpha, rel=1e-6, abs=1e-12)


def test_known_values_and_the_issue_47_example():
    """No misses: the upper bound is 1 - alpha^(1/n). The issue's "5 of 47 differ" passed a
    95% budget under the old rule; here it is undecided (more rows are drawn)."""
    for n in (1, 16, 180, 1000):
        assert acc.upper_bound(0, n, 1e-4) == pytest.approx(1 - 1e-4 ** (1 / n), rel=1e-9)
    d = acc.decide(5, 47, 0.05)
    assert d.verdict == acc.UNDECIDED and d.lower < 0.05 < d.upper
    assert acc.decide(0, 180, 0.05).verdict == acc.PASS  # 180 clean rows prove < 5% at 99.99%
    assert acc.decide(0, 170, 0.05).verdict == acc.UNDECIDED
    assert acc.decide(0, 0, 0.05).verdict == acc.UNDECIDED


@settings(max_examples=60, deadline=None, database=None)
@given(n=st.integers(1, 2000), budget=st.floats(0.005, 0.5))
def test_thresholds_agree_with_decide(n, budget):
    """``thresholds`` says the most misses that pass and the fewest that fail; decide agrees."""
    pass_at_most, fail_from = acc.thresholds(n, budget)
    assert -1 <= pass_at_most < fail_from <= n + 1
    if pass_at_most >= 0:
        assert acc.decide(pass_at_most, n, budget).verdict == acc.PASS
    if pass_at_most + 1 <= n:
        assert acc.decide(pass_at_most + 1, n, budget).verdict != acc.PASS
    if fail_from <= n:
        assert acc.decide(fail_from, n, budget).verdict == acc.FAIL
    if fail_from - 1 >= 0:
        assert acc.decide(fail_from - 1, n, budget).verdict != acc.FAIL


def test_wilson_stands_in_only_where_it_agrees_with_the_exact_bounds():
    """Past EXACT_TRIALS the Wilson interval is used; at 200,000 trials it is within 2% of the
    exact one where misses are many, and at none it is the looser (it passes later, not sooner)."""
    n = acc.EXACT_TRIALS
    assert acc.wilson(0, n, 1e-4)[1] >= acc.upper_bound(0, n, 1e-4)
    for k in (1000, 4000):
        w_lo, w_hi = acc.wilson(k, n, 1e-4)
        assert w_hi == pytest.approx(acc.upper_bound(k, n, 1e-4), rel=0.02)
        if k >= 10:
            assert w_lo == pytest.approx(acc.lower_bound(k, n, 1e-4), rel=0.1)
    assert acc.z_of(0.025) == pytest.approx(1.959964, abs=1e-5)


def _sequential(rng: np.random.Generator, rate: float, budget: float, first: int, cap: int) -> tuple[str, int]:
    """The looks checks/quant_rows.py makes: the given rows, then more up to the cap."""
    have, misses, looks = first, int(rng.binomial(first, rate)), 1
    while True:
        pass_at_most, fail_from = acc.thresholds(have, budget)  # decide's answer, cached per n
        verdict = acc.PASS if misses <= pass_at_most else acc.FAIL if misses >= fail_from else acc.UNDECIDED
        if verdict != acc.UNDECIDED or have >= cap:
            return verdict, have
        more = acc.next_rows(have, cap, looks) - have
        misses += int(rng.binomial(more, rate))
        have, looks = have + more, looks + 1


@pytest.mark.parametrize("first", [2, 16, 64])
def test_sequential_never_passes_clearly_outside_nor_fails_clearly_inside(first):
    """Simulated with numpy's binomial (2,000 decisions per rate, cap 1024 rows, budget 95%
    agreement): 50%, 85% and 94% agreement never PASS, 96% and 99% never FAIL, a file exactly
    at the budget passes at most ALPHA of the time (1 in 1,000: 2,000 draws show 0-5); at 99%
    nearly all PASS within the cap, at 85% nearly all FAIL."""
    rng = np.random.default_rng(first)
    out = {}
    for agreement in (0.50, 0.85, 0.94, 0.95, 0.96, 0.99):
        verdicts = [_sequential(rng, 1 - agreement, 0.05, first, 1024)[0] for _ in range(2000)]
        out[agreement] = {v: verdicts.count(v) / len(verdicts) for v in (acc.PASS, acc.FAIL, acc.UNDECIDED)}
    for agreement in (0.50, 0.85, 0.94):
        assert out[agreement][acc.PASS] == 0, out
    assert out[0.95][acc.PASS] <= 5 / 2000, out
    for agreement in (0.96, 0.99):
        assert out[agreement][acc.FAIL] == 0, out
    assert out[0.99][acc.PASS] > 0.99 and out[0.85][acc.FAIL] > 0.99 and out[0.50][acc.FAIL] == 1.0, out


def test_looks_reach_the_cap_within_max_looks():
    for first, cap in ((1, 1024), (2, 10 ** 6), (500, 600), (64, 64)):
        have, looks = first, 1
        while have < cap:
            have, looks = acc.next_rows(have, cap, looks), looks + 1
        assert have == cap and looks <= acc.MAX_LOOKS


@settings(max_examples=40, deadline=None, database=None)
@given(n=st.integers(10, 3000), over=st.floats(1.5, 6.0), budget=st.floats(0.01, 0.1), seed=st.integers(0, 2 ** 32 - 1))
def test_a_rate_clearly_over_budget_never_passes_one_look(n, over, budget, seed):
    """A true miss rate 1.5-6x the budget: 500 binomial draws at n, none PASSES."""
    rate = min(0.99, over * budget)
    draws = np.random.default_rng(seed).binomial(n, rate, size=500)
    pass_at_most, _ = acc.thresholds(n, budget)
    assert not np.any(draws <= pass_at_most)
