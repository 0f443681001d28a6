"""A quantised decision as an acceptance test: pass on evidence, fail on evidence, else undecided.

Why: the rule before (issue 47) passed unless the rows proved a violation. A MobileViT-like
int8 file at 85% top-1 agreement passed a 95% budget on 47 rows ("at most 8 may differ"), a
dynamic-range file at 94.9% passed 97%. Here the observed miss rate (rows that differ, or
elements beyond) is bounded on both sides by an exact binomial interval (Clopper-Pearson),
and the decision is

- ``PASS`` when the upper bound is within the budget's miss rate,
- ``FAIL`` when the lower bound is beyond it,
- ``UNDECIDED`` otherwise: the caller draws more rows (``checks/quant_rows.py``) and looks
  again, up to a cap of rows; undecided at the cap is reported ``inconclusive``.

Each look uses one-sided bounds at ``LOOK_ALPHA`` (99.99% confidence); a decision takes at
most ``MAX_LOOKS`` looks, so over the whole decision a file whose true rate is at or beyond the
budget passes with probability at most ``ALPHA`` = ``MAX_LOOKS`` x ``LOOK_ALPHA`` (Bonferroni),
and one within it fails at most as often. A file exactly at the budget passes at most that
rarely: it ends inconclusive at the cap, or fails.

Pure numpy and ``math``: the binomial CDF is summed in log space, each bound found by
bisection on it (the Beta quantile without scipy). Past ``EXACT_TRIALS`` trials (a regression
output's elements over many rows) the Wilson score interval at the same confidence is used.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"
# The error of a whole decision, each way, and how it is split over its looks.
ALPHA = 1e-3
MAX_LOOKS = 10
LOOK_ALPHA = ALPHA / MAX_LOOKS
# Above this many trials the Wilson interval stands in for Clopper-Pearson (sums of k terms).
EXACT_TRIALS = 200_000


@dataclass(frozen=True)
class Decision:
    """One look: ``observed`` misses of ``trials``, the interval ``[lower, upper]`` of the miss
    rate at one-sided confidence ``1 - alpha`` each way, against ``budget`` (a miss rate)."""

    verdict: str
    observed: int
    trials: int
    lower: float
    upper: float
    budget: float
    alpha: float

    @property
    def rate(self) -> float | None:
        return self.observed / self.trials if self.trials else None

    def as_dict(self) -> dict[str, float | int | str | None]:
        return {"verdict": self.verdict, "observed": self.observed, "trials": self.trials, "rate": self.rate,
                "lower": self.lower, "upper": self.upper, "budget_rate": self.budget, "alpha": self.alpha,
                "confidence": 1.0 - self.alpha}


def _log_pmf_head(k: int, n: int, p: float) -> np.ndarray:
    """log P(X = j), j = 0..k, X ~ Binomial(n, p), 0 < p < 1."""
    j = np.arange(1, k + 1, dtype=np.float64)
    log0 = n * math.log1p(-p)
    steps = np.log(n - j + 1) - np.log(j) + (math.log(p) - math.log1p(-p))
    return np.concatenate([[log0], log0 + np.cumsum(steps)])


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k), X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    return float(min(1.0, math.exp(np.logaddexp.reduce(_log_pmf_head(k, n, p)))))


def _bisect(f, lo: float, hi: float) -> float:
    """The p in [lo, hi] where the decreasing ``f(p) - target`` crosses zero, to the last bit of
    p: a bracket of 1e-12 left a bound near p = 1 (or 0) off by 1.4e-6 of alpha, where the CDF
    moves by n per unit of p."""
    for _ in range(1100):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if f(mid) > 0:
            lo = mid
        else:
            hi = mid
    return hi


def upper_bound(k: int, n: int, alpha: float) -> float:
    """The one-sided ``1 - alpha`` upper bound of a rate from ``k`` misses of ``n``: the p with
    P(X <= k; n, p) = alpha (Clopper-Pearson); 1 when nothing was tried or all missed."""
    if n <= 0 or k >= n:
        return 1.0
    if n > EXACT_TRIALS:
        return wilson(k, n, alpha)[1]
    # returned as the top of the last bracket: a bound a little loose, never tight
    return _bisect(lambda p: binom_cdf(k, n, p) - alpha, 0.0, 1.0)


def lower_bound(k: int, n: int, alpha: float) -> float:
    """The one-sided ``1 - alpha`` lower bound: the p with P(X >= k; n, p) = alpha; 0 for k = 0."""
    if n <= 0 or k <= 0:
        return 0.0
    if n > EXACT_TRIALS:
        return wilson(k, n, alpha)[0]
    # P(X >= k) = 1 - P(X <= k - 1) grows with p; find where it reaches alpha, from below
    lo, hi = 0.0, 1.0
    for _ in range(1100):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if 1.0 - binom_cdf(k - 1, n, mid) < alpha:
            lo = mid
        else:
            hi = mid
    return lo


def z_of(alpha: float) -> float:
    """The standard normal quantile with upper tail ``alpha`` (bisection on erfc)."""
    lo, hi = 0.0, 40.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if 0.5 * math.erfc(mid / math.sqrt(2.0)) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def wilson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """The Wilson score interval, one-sided ``1 - alpha`` each way."""
    if n <= 0:
        return 0.0, 1.0
    z = z_of(alpha)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def decide(observed: int, trials: int, budget: float, alpha: float = LOOK_ALPHA) -> Decision:
    """``PASS`` when the upper bound of the miss rate is within ``budget``, ``FAIL`` when the
    lower bound is beyond it, else ``UNDECIDED``; no trials decide nothing."""
    observed, trials = int(observed), int(trials)
    if trials <= 0:
        return Decision(UNDECIDED, 0, 0, 0.0, 1.0, budget, alpha)
    lower, upper = lower_bound(observed, trials, alpha), upper_bound(observed, trials, alpha)
    verdict = PASS if upper <= budget else FAIL if lower > budget else UNDECIDED
    return Decision(verdict, observed, trials, lower, upper, budget, alpha)


@functools.lru_cache(maxsize=4096)
def thresholds(trials: int, budget: float, alpha: float = LOOK_ALPHA) -> tuple[int, int]:
    """``(pass_at_most, fail_from)`` on ``trials``: the most misses that still PASS (-1: none
    can) and the fewest that FAIL (``trials + 1``: none can); between them is undecided."""
    if trials <= 0:
        return -1, 1

    def first(pred, lo: int, hi: int) -> int:  # the smallest k in lo..hi where the monotone pred holds
        while lo < hi:
            mid = (lo + hi) // 2
            if pred(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    # Both thresholds lie near budget x trials: search there (each bound costs O(k)), widening
    # to the whole range only when the window does not hold the answer.
    centre = budget * trials
    reach = int(math.ceil(12.0 * math.sqrt(trials * budget * (1.0 - budget)) + 40))
    lo, hi = max(0, int(centre) - reach), min(trials + 1, int(math.ceil(centre)) + reach)

    def too_many(k: int) -> bool:
        return k > trials or upper_bound(k, trials, alpha) > budget

    def fails(k: int) -> bool:
        return k > trials or lower_bound(k, trials, alpha) > budget

    a = first(too_many, 0, hi) if too_many(hi) else first(too_many, hi, trials + 1)
    b = first(fails, lo, hi) if fails(hi) and (lo == 0 or not fails(lo)) else first(fails, 0, trials + 1)
    return a - 1, b


def next_rows(have: int, cap: int, looks_done: int, first: int = 64) -> int:
    """The rows of the next look: at least ``first``, twice ``have``, and fast enough that the
    cap is reached within ``MAX_LOOKS`` looks (the last look is at the cap)."""
    left = MAX_LOOKS - looks_done
    if left <= 1 or have >= cap:
        return cap
    grow = math.ceil(have * (cap / max(have, 1)) ** (1.0 / left)) if have > 0 else first
    return int(min(cap, max(first, 2 * have, grow)))
