"""The statistics of a failing (or fully reported) output, over a ``Scanner``'s chunks: relative
error, ULPs, the smallest passing tolerance, the worst elements, the error histogram.
``StatsPass`` runs the pass; ``StatsAcc`` keeps the running state, fed whole chunks or only
the candidate elements that can still reach a maximum (the short path)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Protocol

import numpy as np

from .tolerances import Tolerance

__all__ = ["WORST_COUNT", "Stats", "StatsAcc", "StatsPass", "histogram", "passing_bound", "py_scalar"]

WORST_COUNT = 5          # worst elements kept per failing output
_EXPONENT_BITS: dict[int, tuple[np.signedinteger[Any], int]] = {       # work itemsize -> (mask of the exponent bits, unused)
    4: (np.int32(0x7F800000), 23),
    8: (np.int64(0x7FF0000000000000), 52),
}
_ABOVE_MASK = 1.0 + 2.0 ** -16   # the slope-free mask is below c_low (1+u)**3: this is above
_MARGIN = 2.0 ** -20     # relative slack of the candidate mask, far above rounding (2**-24)


@dataclass
class Stats:
    mean_abs: float | None
    max_rel: float | None
    max_rel_index: int | None
    max_ulp: float | None
    min_atol: float | None
    min_rtol: float | None
    worst: list
    histogram: tuple[list[int], list[float]] | None
    mismatched: int = 0
    nonfinite_mismatched: int = 0
    scale: float = 0.0
    max_abs: float | None = None
    max_abs_index: int | None = None


def passing_bound(x: float, work: Any) -> float:
    """The smallest atol/rtol ``x`` measured in ``work`` arithmetic, raised just past that
    arithmetic's rounding (the bound is rounded to ``work`` and summed there), so that
    passing it back makes the comparison pass; 0 when nothing needs to be allowed."""
    if not x > 0:
        return 0.0
    info = np.finfo(work)
    return x * (1.0 + 8.0 * float(info.eps)) + 4.0 * float(info.smallest_subnormal)


def py_scalar(x: Any) -> Any:
    """A numpy scalar as the Python value it holds (worst-element lists are JSON-bound)."""
    return x.item() if isinstance(x, np.generic) else x


class ChunkSource(Protocol):
    """What a statistics pass reads of the ``scanning.Scanner`` that streams its chunks: a
    protocol, so this module imports nothing of ``scanning`` (which starts the pass)."""

    a: np.ndarray
    e: np.ndarray
    d: np.ndarray
    b: np.ndarray
    t: np.ndarray
    work: np.dtype
    blocking: Any  # scanning.Blocking: subset_batch, short_stats

    def chunks(self) -> Iterator[tuple[int, np.ndarray, np.ndarray, int]]: ...
    def _bound(self, ec: np.ndarray, m: int, rtol: float, const: float) -> np.ndarray: ...
    def _finite_absmax(self, ec: np.ndarray) -> float: ...
    def _ok(self, ac: np.ndarray, ec: np.ndarray, d: np.ndarray, b: np.ndarray, equal_nan: bool) -> np.ndarray: ...
    def _argmax_finite(self, start: int) -> int: ...


class StatsPass:
    """One statistics pass over a ``Scanner``'s chunks: its running state, one method per
    kind of chunk, and the summary.

    With ``expect_failures`` (the verdict saw mismatches) most chunks take a short path:
    every statistic except max|a - e| and the mean is a maximum (or a top-5) that only a few
    elements can reach once the first chunks set a level, so one mask
    ``d > min(k|e| + c, kr|e|)`` (margins proven in ``StatsAcc``) picks a superset of those
    elements and of the mismatches; their exact values are computed in batches. Chunks with
    non-finite values or too many candidates take the full path."""

    def __init__(self, scan: ChunkSource, tol: Tolerance, equal_nan: bool, scale: float | None,
                 fmt: tuple[int, int] | None, want_histogram: bool,
                 expect_failures: bool) -> None:
        self.scan, self.tol, self.equal_nan = scan, tol, equal_nan
        self.want_histogram = want_histogram
        self.rtol, self.sc = float(tol.rtol), float(tol.scale)
        self.measure_scale = scale is None
        if scale is None:
            assert self.sc == 0.0
            scale = 0.0
        self.scale = scale
        self.const = const = float(tol.atol) + self.sc * scale
        nmant, minexp = fmt if fmt is not None else (52, -1022)
        size, work, blocking = scan.d.size, scan.work, scan.blocking
        self.acc = StatsAcc(work, self.rtol, const, float(tol.atol), nmant, minexp, size,
                             blocking.subset_batch)
        self.best = -1.0                         # greatest finite |a - e|...
        self.best_at: int | None = None          # ...and its chunk
        self.total, self.finite_count = 0.0, 0
        self.hist = np.zeros(2100, np.int64)     # binary exponents of |a-e|, offset by 1100
        self.ones = np.ones(size, work)
        self.fast = (blocking.short_stats and expect_failures
                     and not want_histogram and self.acc.ulp_floor > 0
                     and nmant <= np.finfo(work).nmant
                     and self.rtol >= 0 and math.isfinite(const) and const >= 0)
        # buffers of the candidate mask (empty when the short path is off)
        fast_size = size if self.fast else 0
        self.xb, self.mk = np.empty(fast_size, work), np.empty(fast_size, bool)
        self.thb = np.empty(fast_size, work)
        self.theta_at: float | None = None
        self.cheap = True                        # candidate mask without the rtol slope, while small

    def run(self) -> Stats:
        scan = self.scan
        with np.errstate(all="ignore"):          # every case below is handled explicitly
            for start, ac, ec, m in scan.chunks():
                d = scan.d[:m]
                np.subtract(ac, ec, out=d, dtype=scan.work)
                np.abs(d, out=d)
                part = float(np.dot(d, self.ones[:m]))   # BLAS dot: a fast sum of |a - e|
                levels = self.acc.levels() if self.fast else None
                # a finite sum means finite pairs; then, with the slope-free mask, every
                # element above the best |a - e| so far is a candidate: no max pass needed
                skip_max = (math.isfinite(part) and self.cheap and levels is not None
                            and self.best > levels[1] * _ABOVE_MASK)
                dmax = part if skip_max else float(d.max())
                if math.isfinite(dmax):
                    self._finite_chunk(start, ec, d, m, part, dmax, levels, skip_max)
                else:
                    self._nonfinite_chunk(start, ac, ec, d, m)
        self.acc.flush()
        return self._summary()

    def _take_best(self, dmax: float, start: int) -> None:
        if dmax > self.best:
            self.best, self.best_at = dmax, start

    def _finite_chunk(self, start: int, ec: np.ndarray, d: np.ndarray, m: int, part: float,
                      dmax: float, levels: tuple[float, float, float] | None,
                      skip_max: bool) -> None:
        """A chunk of finite pairs: the short path when few candidates, else in full."""
        if not math.isfinite(part):
            part = float(np.sum(d, dtype=np.float64))
        self.total += part
        self.finite_count += m
        if not skip_max:
            self._take_best(dmax, start)
        if levels is not None:
            if self._short_chunk(start, ec, d, m, levels, skip_max):
                return
            # too many candidates: this chunk is cheaper done in full
        elif self.measure_scale:
            self.scale = max(self.scale, self.scan._finite_absmax(ec))
        self.acc.full_chunk(start, ec, d, None, self.scan.b[:m], self.scan.t[:m])
        self._keep_for_summary(d, m)

    def _short_chunk(self, start: int, ec: np.ndarray, d: np.ndarray, m: int,
                     levels: tuple[float, float, float], skip_max: bool) -> bool:
        """Feed the chunk's candidates to the accumulator; False (nothing fed) when they are
        too many and the chunk is cheaper done in full. ``|e|`` is left in ``scan.b``."""
        ae = self.scan.b[:m]
        np.abs(ec, out=ae, dtype=self.scan.work)
        if self.measure_scale:
            self.scale = max(self.scale, float(ae.max()))
        idx = self._candidates(d, ae, m, levels)
        if idx.size <= m // self.scan.blocking.subset_max_share:
            ds = d[idx]
            if skip_max:
                if not self.cheap:               # the mask just used had the slope
                    self._take_best(float(d.max()), start)
                else:
                    self._take_best(float(ds.max()) if idx.size else -1.0, start)
            self.acc.add_subset(idx + start, ds, ae[idx])
            return True
        if skip_max:
            self._take_best(float(d.max()), start)
        return False

    def _candidates(self, d: np.ndarray, ae: np.ndarray, m: int,
                    levels: tuple[float, float, float]) -> np.ndarray:
        """Flat chunk indices of the elements that can still change a statistic
        (``StatsAcc`` proves the mask). Tries the cheaper slope-free mask first, and stops
        trying it for good once it picks too many."""
        k, c_low, kr = levels
        x, mask = self.xb[:m], self.mk[:m]
        if self.cheap:                           # drop the rtol slope: 2 passes fewer
            if kr == math.inf or kr == 0:
                np.greater(d, c_low if kr else 0.0, out=mask)
            else:
                theta = c_low / kr
                if theta != self.theta_at:       # np.minimum with a scalar is slow
                    self.thb.fill(theta)
                    self.theta_at = theta
                np.minimum(ae, self.thb[:m], out=x)
                np.multiply(x, kr, out=x)
                np.greater(d, x, out=mask)
            idx = mask.nonzero()[0]
            if idx.size <= m // self.scan.blocking.cheap_max_share:
                return idx
            self.cheap = False                   # the slope matters here
        np.multiply(ae, k, out=x)
        np.add(x, c_low, out=x)
        if kr != math.inf:
            y = self.scan.t[:m]
            np.multiply(ae, kr, out=y)
            np.minimum(x, y, out=x)
        np.greater(d, x, out=mask)
        return mask.nonzero()[0]

    def _nonfinite_chunk(self, start: int, ac: np.ndarray, ec: np.ndarray, d: np.ndarray,
                         m: int) -> None:
        """A chunk with NaN or infinity: judged element by element, statistics over its
        finite pairs."""
        scan, acc = self.scan, self.acc
        if self.measure_scale:
            self.scale = max(self.scale, scan._finite_absmax(ec))
        fin = np.isfinite(d)
        b = scan._bound(ec, m, self.rtol, self.const)
        ok = scan._ok(ac, ec, d, b, self.equal_nan)
        acc.mismatched += int(m - np.count_nonzero(ok))
        bad_nf = np.flatnonzero(~ok & ~fin)
        acc.nonfinite += int(bad_nf.size)
        if bad_nf.size:
            acc.impossible = True
            acc.nonfinite_worst.extend(int(start + i) for i in bad_nf[:WORST_COUNT])
        d[~fin] = 0.0                            # statistics below are over finite pairs
        nfin = int(np.count_nonzero(fin))
        self.finite_count += nfin
        self._take_best(float(d.max()) if nfin else -1.0, start)
        with np.errstate(over="ignore", invalid="ignore"):
            self.total += float(np.sum(d, dtype=np.float64))
        acc.full_chunk(start, ec, d, fin, scan.b[:m], scan.t[:m], counted=True)
        self._keep_for_summary(d, m)

    def _keep_for_summary(self, d: np.ndarray, m: int) -> None:
        """What only a fully computed chunk gives: its error histogram."""
        if self.want_histogram:
            _histogram_add(self.hist, d)

    # ---------------------------------------------------------------- summary
    def _summary(self) -> Stats:
        acc, scan, finite_count = self.acc, self.scan, self.finite_count
        mean_abs = (self.total / finite_count if math.isfinite(self.total)
                    else float(np.finfo(np.float64).max)) if finite_count else None
        max_rel: float | None = acc.max_rel if finite_count else None
        min_atol, min_rtol = self._smallest_tolerance()
        worst_rows = [(i, py_scalar(scan.a[i]), py_scalar(scan.e[i])) for i in self._worst_picks()]
        found = self.best_at is not None
        return Stats(mean_abs, max_rel if max_rel is None or max_rel >= 0 else None,
                      acc.max_rel_index, acc.max_ulp if finite_count else None, min_atol,
                      min_rtol, worst_rows, _histogram_of(self.hist), acc.mismatched,
                      acc.nonfinite, self.scale, self.best if found else None,
                      scan._argmax_finite(self.best_at) if self.best_at is not None else None)

    def _smallest_tolerance(self) -> tuple[float, float]:
        """(min_atol, min_rtol): the smallest ``atol=`` (with the rule's rtol) and ``rtol=``
        (with its atol) that pass when given as arguments, i.e. under the plain per-element
        rule (no scale term, no share of elements allowed out: what an explicit value
        means), rounded up past the arithmetic's rounding (``passing_bound``); inf when a
        non-finite mismatch makes every tolerance fail."""
        acc = self.acc
        if acc.impossible:
            return math.inf, math.inf
        work = self.scan.work
        min_atol = passing_bound(acc.need_atol, work) if math.isfinite(acc.need_atol) else 0.0
        min_rtol = passing_bound(acc.need_rtol, work) if acc.need_rtol != -math.inf else 0.0
        return min_atol, min_rtol

    def _worst_picks(self) -> list[int]:
        """Flat indices of the worst elements: non-finite mismatches first, then the largest
        excesses (mismatches only, when the output fails)."""
        acc = self.acc
        worst = acc.worst
        if any(x > self.const for x, _ in worst) or acc.nonfinite_worst:
            worst = [(x, i) for x, i in worst if x > self.const]   # failing: mismatches only
        picks = acc.nonfinite_worst[:WORST_COUNT] + [i for _, i in worst]
        return list(dict.fromkeys(picks))[:WORST_COUNT]


def _histogram_add(hist: np.ndarray, d: np.ndarray) -> None:
    """log2|a-e| over nonzero finite differences (non-finite ones are zeroed before)."""
    nz = d[d > 0]
    if nz.size:
        _, ex = np.frexp(nz)
        hist += np.bincount(ex.astype(np.int64) + 1100, minlength=hist.size)[:hist.size]


def _histogram_of(hist: np.ndarray) -> tuple[list[int], list[float]] | None:
    """(counts, log10 edges) of the occupied bins of ``_histogram_add``'s counts."""
    if not hist.any():
        return None
    nzb = np.flatnonzero(hist)
    lo, hi = int(nzb[0]), int(nzb[-1]) + 1
    counts = [int(c) for c in hist[lo:hi]]
    # frexp exponent x means |d| in [2**(x-1), 2**x)
    edges = [round((k - 1100 - 1) * math.log10(2), 4) for k in range(lo, hi + 1)]
    return counts, edges


class StatsAcc:
    """Running statistics, fed whole chunks (``full_chunk``) or gathered candidate elements
    (``add_subset``); the same float arithmetic either way, so the results are identical.

    Ties are broken by the lowest flat index (numpy's argmax), whatever the feeding order.

    Why the candidate mask ``d > min(fl(k|e|) + c_low, fl(kr|e|))`` (``levels``) keeps every
    element that can still change a result (u = unit roundoff <= 2**-24, margin 2**-20):
    - a mismatch has d > fl(fl(rtol|e|) + c) >= the first term, since k <= rtol, c_low <= c;
    - an excess fl(d - fl(rtol|e|)) above the current level A (smallest atol so far, or the
      5th-worst excess) means d > fl(rtol|e|) + A/(1+u) > the first term, c_low <= A(1-margin);
    - a relative difference fl(d/|e|) above R means d > |e| R/(1+u) > fl(kr|e|), kr <= R(1-m);
      the rtol ratio fl((d - atol)/|e|) is at most fl(d/|e|); and a ULP distance
      d / max(2**E(e) 2**-nmant, floor) is below 2**(nmant+1) d/|e|, so one above the current
      maximum U needs d/|e| > U 2**-(nmant+1)/(1+u): R = min(max_rel, need_rtol, U 2**-(nmant+2)).
    The cheaper mask ``d > fl(min(|e|, c_low/kr) kr)`` is below both terms too (it is at most
    c_low (1+u)**3 and at most fl(kr|e|)); it only picks more elements where rtol|e| matters.
    """

    def __init__(self, work: np.dtype, rtol: float, const: float, atol: float, nmant: int,
                 minexp: int, chunk: int, batch: int) -> None:
        self.work, self.rtol, self.const, self.nmant = work, rtol, const, nmant
        self.atol = atol                      # need_rtol is for an explicit rtol=: atol only
        self.mismatched = self.nonfinite = 0
        self.max_rel = -1.0
        self.max_rel_index: int | None = None
        self.max_ulp = 0.0
        self.need_atol = -math.inf            # max over elements of d - rtol|e|
        self.need_rtol = -math.inf            # max over elements of (d - atol) / |e|
        self.impossible = False               # a non-finite mismatch: no tolerance passes
        self.worst: list[tuple[float, int]] = []   # (excess, flat index), best first
        self.nonfinite_worst: list[int] = []
        self.pow2_mask, _ = _EXPONENT_BITS[work.itemsize]
        self.ulp_floor = 2.0 ** (minexp - nmant)
        self.u = np.empty(chunk, work)
        self.pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.pending_size = 0
        self.batch = batch                    # candidates gathered before flush() computes them
        self._levels: tuple[float, float, float] | None = None
        self._levels_stale = True             # the levels move only when results do

    # ---------------------------------------------------------------- candidate levels
    def levels(self) -> tuple[float, float, float] | None:
        """(k, c_low, kr) for the candidate mask, or None while the levels are unknown."""
        if self._levels_stale:
            self._levels, self._levels_stale = self._compute_levels(), False
        return self._levels

    def _compute_levels(self) -> tuple[float, float, float] | None:
        if len(self.worst) < WORST_COUNT:
            return None
        level_a = min(self.need_atol, self.worst[-1][0])
        if not (level_a > 0 and math.isfinite(level_a)):
            return None
        r = min(self.max_rel, self.need_rtol, self.max_ulp * 2.0 ** -(self.nmant + 2))
        if not r >= 0:                        # also NaN
            return None
        shrink = 1.0 - _MARGIN
        kr = r * shrink if math.isfinite(r) else math.inf
        return self.rtol * shrink, min(self.const, level_a) * shrink, kr

    # ---------------------------------------------------------------- feeding
    def add_subset(self, idx: np.ndarray, d: np.ndarray, ae: np.ndarray) -> None:
        if idx.size:
            self.pending.append((idx, d, ae))
            self.pending_size += idx.size
            if self.pending_size >= self.batch:
                self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        if len(self.pending) == 1:
            idx, d, ae = self.pending[0]
        else:
            idx, d, ae = (np.concatenate(p) for p in zip(*self.pending))
        self.pending, self.pending_size = [], 0
        self._levels_stale = True
        t = np.empty_like(d)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # mismatches, as verdict() counts them: d > rtol|e| + const
            p = np.multiply(ae, self.rtol)
            self.mismatched += int(np.count_nonzero(np.greater(d, np.add(p, self.const))))
            self._take_ratios(d, ae, t, idx)
            np.subtract(d, p, out=t)
        self._take_excess(t, idx)

    def full_chunk(self, start: int, ec: np.ndarray, d: np.ndarray, fin: np.ndarray | None,
                   ae: np.ndarray, t: np.ndarray, counted: bool = False) -> None:
        """Every statistic of one chunk (``fin``: its finite pairs, None when all are);
        leaves the excess d - rtol|e| in ``t``. ``counted``: mismatches already counted."""
        m = d.size
        self._levels_stale = True
        np.abs(ec, out=ae, dtype=self.work)
        if fin is not None:
            ae[~fin] = 1.0                   # keep non-finite pairs out of rel/ulp/rtol
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            self._take_ratios(d, ae, t, start)
            np.multiply(ae, self.rtol, out=t)
            if not counted:                  # count as verdict() does: d > rtol|e| + const
                uu = self.u[:m]
                np.add(t, self.const, out=uu)
                self.mismatched += int(np.count_nonzero(np.greater(d, uu)))
            np.subtract(d, t, out=t)
            if fin is not None:
                t[~fin] = -math.inf
        self._take_excess(t, start)

    # ---------------------------------------------------------------- reductions
    def _take_ratios(self, d: np.ndarray, ae: np.ndarray, t: np.ndarray,
                     where: int | np.ndarray) -> None:
        """The statistics that divide by |e| (``t`` is scratch; call under np.errstate)."""
        # relative difference; 0/0 (exact zero both sides) is NaN and skipped
        np.divide(d, ae, out=t)
        self._take_rel(t, where)
        np.subtract(d, self.atol, out=t)
        np.divide(t, ae, out=t)
        self._take_rtol(t)
        self._take_ulp(d, ae, t)

    def _take_rel(self, t: np.ndarray, where: int | np.ndarray) -> None:
        if not t.size:
            return
        r = float(t.max())
        if math.isnan(r):
            r = float(np.fmax.reduce(t))
        if math.isnan(r) or r < self.max_rel:
            return
        first = int(np.argmax(t == r))
        i = where + first if isinstance(where, int) else int(where[first])
        if r > self.max_rel or self.max_rel_index is None or i < self.max_rel_index:
            self.max_rel, self.max_rel_index = r, i

    def _take_rtol(self, t: np.ndarray) -> None:
        if t.size:
            r = float(t.max())
            if math.isnan(r):
                r = float(np.fmax.reduce(t))
            if r > self.need_rtol:           # NaN compares False
                self.need_rtol = r

    def _take_ulp(self, d: np.ndarray, ae: np.ndarray, t: np.ndarray) -> None:
        """ULP distance in the less precise format: d / ulp(e), where ulp(e) is 2**exponent(e)
        (the exponent bits of |e| read as a float) * 2**-nmant, at least the format's floor."""
        if not t.size:
            return
        tv = t.view(self.pow2_mask.dtype)
        np.bitwise_and(ae.view(self.pow2_mask.dtype), self.pow2_mask, out=tv)
        np.multiply(t, 2.0 ** -self.nmant, out=t)
        np.maximum(t, self.ulp_floor, out=t)
        np.divide(d, t, out=t)
        self.max_ulp = max(self.max_ulp, float(t.max()))

    def _take_excess(self, t: np.ndarray, where: int | np.ndarray) -> None:
        """``t``: excess d - rtol|e| (smallest atol: its max; worst elements: its top 5)."""
        if not t.size:
            return
        cmax = float(t.max())
        self.need_atol = max(self.need_atol, cmax)
        full = len(self.worst) >= WORST_COUNT
        if full and not cmax >= self.worst[-1][0]:
            return
        if full:
            thr = self.worst[-1][0]
        elif t.size > WORST_COUNT:           # the 5th largest value: ties at it all count
            # when 5 or more are out (excess > const), the 5th largest is among them: a
            # partition of those few instead of the whole chunk
            hot = t[t > self.const]
            pool = hot if hot.size >= WORST_COUNT else t
            thr = float(np.partition(pool, pool.size - WORST_COUNT)[pool.size - WORST_COUNT])
        else:
            thr = -math.inf
        cand = np.flatnonzero(t >= thr)
        if cand.size > WORST_COUNT:
            # top WORST_COUNT by value, ties to the lowest index (stable sort)
            cand = cand[np.argsort(-t[cand], kind="stable")[:WORST_COUNT]]
        for i in cand:
            gi = where + int(i) if isinstance(where, int) else int(where[i])
            self.worst.append((float(t[i]), gi))
        self.worst = sorted(set(self.worst), key=lambda w: (-w[0], w[1]))[:WORST_COUNT]


def histogram(d: np.ndarray) -> tuple[list[int], list[float]] | None:
    if not d.size:
        return None
    _, ex = np.frexp(d.astype(np.float64))
    lo, hi = int(ex.min()), int(ex.max())
    counts = np.bincount(ex - lo, minlength=hi - lo + 1)
    return ([int(c) for c in counts],
            [round((k - 1) * math.log10(2), 4) for k in range(lo, hi + 2)])
