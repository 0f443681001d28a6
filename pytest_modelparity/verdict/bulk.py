"""The error's distribution against the model's own float noise (issue 47): numpy only.

Why: the float64 floor's bound is set by the twin's worst element. On a net that amplifies
rounding in a few places (the log of a cancelling filter-bank sum) that element is large while
the bulk of the outputs agrees to 1e-6 of scale, so a systematic change (an input gain of
255/256, a 1% kernel change) hides under the max. A correct form's error is rounding: its
median, high quantile and mean signed error stay near the same points of the noise the twin
measured (``r32 - r64``). A real change moves the bulk, or moves every element one way.

So an output judged by the float64 floor also passes only when each statistic of its error
``|actual - expected|`` (share of the output's scale) is within ``MULTIPLES[statistic]`` x the
same statistic of the noise, each noise figure taken as at least ``MIN_NOISE_EPS[statistic]``
epsilons of scale (a twin can equal its model on most elements). ``max`` stays the scaled
rule's per-element bound (``Tolerance.scale``). The margins were set on ``bench/bulk_noise.py``
(docs/tolerances.md "The bulk of the error").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

# statistic -> what it is, in the failure text
STATISTICS = {
    "median": "the median error",
    "q90": "the 90th-percentile error",
    "mean_signed": "the mean signed error (over the 90% of elements under the 90th percentile)",
}
# Correct forms measured on bench/bulk_noise.py (docs/tolerances.md): see there for the figures.
MULTIPLES = {"median": 8.0, "q90": 8.0, "mean_signed": 8.0}
# The noise figure each statistic of the error is held against: a mean signed error against the
# noise's mean |error| (the noise's own signed mean cancels by chance: 1/22 of a correct form's on
# the log-magnitude net), the quantiles against the same quantile.
NOISE_OF = {"median": "median", "q90": "q90", "mean_signed": "mean_abs"}
# Each noise figure is taken as at least this many epsilons of the output's scale.
MIN_NOISE_EPS = {"median": 1.0, "q90": 2.0, "mean_signed": 1.0}
# Quantiles of outputs larger than this are read on an evenly strided sample of this size.
SAMPLE = 1 << 20
# The fewest elements a statistic is judged on: the 90th percentile of fewer than 50 elements is
# one of its few largest, where a few amplified elements of one form sit (a (2, 10) output with 3
# of them failed a correct form); under ``MIN_ELEMENTS`` the max alone judges.
MIN_ELEMENTS = 8
MIN_ELEMENTS_FOR = {"median": MIN_ELEMENTS, "q90": 50, "mean_signed": MIN_ELEMENTS}


@dataclass(frozen=True)
class BulkBound:
    """One statistic's bound (``bound``, share of scale) and the noise figure it came from."""

    statistic: str
    bound: float
    noise: float
    multiple: float

    def describe(self) -> str:
        """``median <= 9.5e-07 (8 x the noise's, 2.6e-08, taken as 1.2e-07: at least 1 eps)``: the
        bound and how it was set."""
        noise = "the noise's mean |error|" if NOISE_OF[self.statistic] == "mean_abs" else "the noise's"
        return f"{self.statistic} <= {self.bound:.2g} ({self.multiple:g} x {noise}, {self.noise:.1e}{self._raised()})"

    def _raised(self) -> str:
        """``, at least 1 eps`` when the noise figure was raised to its minimum."""
        if self.bound <= self.multiple * self.noise * (1 + 1e-9):
            return ""
        return f", taken as {self.bound / self.multiple:.1e}: at least {MIN_NOISE_EPS[self.statistic]:g} eps"

    def to_dict(self) -> dict[str, Any]:
        return {"statistic": self.statistic, "bound": self.bound, "noise": self.noise, "multiple": self.multiple}


def error_statistics(diff: Any, scale: float) -> dict[str, float]:
    """Of the finite elements of ``diff``, as shares of ``scale``: ``median``, ``q90`` and ``max``
    of |diff|; ``mean_signed`` = |mean(diff)| and ``mean_abs`` = mean |diff| over the 90% of
    elements at or under the 90th percentile (the bulk: a few amplified elements, which every
    float32 form has where the twin has them, do not decide it). 0.0 for nothing finite."""
    d = np.asarray(diff, dtype=np.float64).ravel()
    d = d[np.isfinite(d)]
    if d.size == 0 or not scale > 0:
        return {"median": 0.0, "q90": 0.0, "mean_signed": 0.0, "max": 0.0, "mean_abs": 0.0, "elements": float(d.size)}
    a = np.abs(d)
    top = float(a.max())
    sample = a[:: a.size // SAMPLE + 1] if a.size > SAMPLE else a
    median, q90 = (float(v) for v in np.quantile(sample, (0.5, 0.9)))
    bulk = a <= q90
    mean_signed, mean_abs = abs(float(np.mean(d[bulk]))), float(np.mean(a[bulk]))
    return {"median": median / scale, "q90": q90 / scale, "mean_signed": mean_signed / scale, "max": top / scale,
            "mean_abs": mean_abs / scale, "elements": float(d.size)}


def bounds_from_noise(noise: Mapping[str, float], eps: float) -> tuple[BulkBound, ...]:
    """The bulk bounds of an output whose float noise measured ``noise`` (``error_statistics``
    of ``r32 - r64``, shares of scale); ``eps`` is the output dtype's epsilon."""
    found = []
    for stat, multiple in MULTIPLES.items():
        if NOISE_OF[stat] not in noise:
            continue
        measured = float(noise[NOISE_OF[stat]])
        figure = max(measured, MIN_NOISE_EPS[stat] * eps)
        found.append(BulkBound(stat, multiple * figure, measured, multiple))
    return tuple(found)


@dataclass
class BulkVerdict:
    """Each statistic of one output's error against its bound: ``failed`` names the first that
    does not hold (None: all hold); ``rows`` is what the JSON row carries."""

    failed: str | None
    rows: list[dict[str, Any]]
    text: str | None


def judge(actual: np.ndarray, expected: np.ndarray, scale: float, bounds: tuple[BulkBound, ...], *,
          max_holds: bool = True) -> BulkVerdict | None:
    """Judge the distribution of ``actual - expected`` (shares of ``scale``) against ``bounds``;
    None when there is nothing to judge (no bound, too few elements, a zero scale). ``max_holds``:
    the per-element bound held everywhere (the text says so: only the bulk moved)."""
    if not bounds or not scale > 0 or np.size(expected) < MIN_ELEMENTS:
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.asarray(actual, np.float64).ravel() - np.asarray(expected, np.float64).ravel()
    got = error_statistics(diff, scale)
    rows, failed = [], []
    for b in bounds:
        if got["elements"] < MIN_ELEMENTS_FOR[b.statistic]:
            continue
        value = got[b.statistic]
        holds = value <= b.bound
        rows.append({**b.to_dict(), "value": value, "holds": holds,
                     "times_noise": value / b.noise if b.noise > 0 else None})
        if not holds:
            failed.append((b, value))
    if not failed:
        return BulkVerdict(None, rows, None)
    b, value = max(failed, key=lambda bv: bv[1] / bv[0].bound)
    return BulkVerdict(b.statistic, rows, failure_text(b, value, got, max_holds))


def failure_text(b: BulkBound, value: float, got: Mapping[str, float], max_holds: bool = True) -> str:
    """``the median error is 340x the median float noise (3.4e-4 of scale, allowed 8e-6): a
    systematic change, not rounding``."""
    what = STATISTICS[b.statistic]
    of_noise = "the mean |error| of the model's float noise" if NOISE_OF[b.statistic] == "mean_abs" else \
        f"the {STATISTICS[b.statistic].removeprefix('the ')} of the model's float noise"
    times = f"{value / b.noise:,.0f}x {of_noise}" if b.noise > 0 else "above the model's float noise, 0 there"
    why = ("every element moved one way" if b.statistic == "mean_signed"
           else "the bulk of the output moved")
    tail = f" (the max error, {got['max']:.2g} of scale, is within its bound)" if max_holds else ""
    return (f"{what} is {value:.2g} of scale, {times} ({b.noise:.2g}{b._raised()}; allowed {b.bound:.2g}, "
            f"{b.multiple:g}x): {why}, a systematic change, not rounding{tail}")
