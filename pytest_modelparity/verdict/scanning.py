"""Streaming two flat arrays through cache-sized blocks: ``Blocking`` (how), ``Scanner`` (the
buffers, the per-chunk kernels and the verdict pass) and its ``Verdict``. The statistics pass
over the same chunks is ``statistics.StatsPass``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .statistics import Stats, StatsPass
from .tolerances import Tolerance

__all__ = ["CHUNK", "Blocking", "Scanner", "Verdict"]

CHUNK = 1 << 16          # elements per block: 256 KiB of float32, fits L2 with its buffers
_FEW_SHARE = 16          # verdict: judge only the elements above atol when at most 1/16


@dataclass(frozen=True)
class Blocking:
    """How the engine streams arrays. Verdicts and statistics never depend on it: the tests
    shrink it so tiny arrays cross every chunk boundary and every path of the short
    statistics pass, and switch that pass off to check it against the full one."""

    chunk: int = CHUNK             # elements per block
    short_stats: bool = True       # failing outputs: statistics over candidate elements only
    subset_max_share: int = 8      # a chunk with more than 1/8 candidates is computed in full
    cheap_max_share: int = 32      # the slope-free mask is dropped once it picks more than 1/32
    subset_batch: int = 1 << 15    # candidates gathered before their statistics are computed


@dataclass
class Verdict:
    mismatched: int
    nonfinite_mismatched: int
    scale: float | None                   # None when the rule did not need it (scale == 0)
    max_abs: float | None
    max_abs_index: int | None
    complete: bool = True                 # False: stopped early; the statistics pass counts


class Scanner:
    """Streams two flat arrays in chunks through preallocated work buffers."""

    def __init__(self, a: np.ndarray, e: np.ndarray, work: np.dtype, native: bool,
                 blocking: Blocking) -> None:
        self.a, self.e, self.work, self.native = a, e, work, native
        self.blocking = blocking
        self.chunk = chunk = blocking.chunk
        self.n = e.size
        size = min(chunk, max(self.n, 1))
        self.d = np.empty(size, work)      # |a - e|
        self.b = np.empty(size, work)      # bound, or scratch
        self.t = np.empty(size, work)      # scratch
        self.mask = np.empty(size, bool)   # scratch

    def chunks(self):
        for start in range(0, self.n, self.chunk):
            stop = min(start + self.chunk, self.n)
            ac, ec = self.a[start:stop], self.e[start:stop]
            if not self.native:            # bfloat16 and friends: widen first
                ac, ec = ac.astype(self.work), ec.astype(self.work)
            yield start, ac, ec, stop - start

    def _absdiff(self, ac: np.ndarray, ec: np.ndarray, m: int) -> np.ndarray:
        d = self.d[:m]
        with np.errstate(invalid="ignore", over="ignore"):
            np.subtract(ac, ec, out=d, dtype=self.work)
        np.abs(d, out=d)
        return d

    def _bound(self, ec: np.ndarray, m: int, rtol: float, const: float) -> np.ndarray:
        b = self.b[:m]
        np.abs(ec, out=b, dtype=self.work)
        with np.errstate(over="ignore", invalid="ignore"):
            np.multiply(b, rtol, out=b)
            np.add(b, const, out=b)
        return b

    @staticmethod
    def _finite_absmax(ec: np.ndarray) -> float:
        hi, lo = float(ec.max()), float(ec.min())
        if math.isfinite(hi) and math.isfinite(lo):
            return max(hi, -lo)
        fin = ec[np.isfinite(ec)]
        return float(np.max(np.abs(fin))) if fin.size else 0.0

    def _ok(self, ac, ec, d, b, equal_nan: bool) -> np.ndarray:
        """numpy.isclose's rule on one chunk, given |a-e| and the bound."""
        with np.errstate(invalid="ignore"):
            ok = np.less_equal(d, b)
            ok &= np.isfinite(ec)
            ok |= ac == ec
            if equal_nan:
                ok |= np.isnan(ac) & np.isnan(ec)
        return ok

    def _count_bad(self, ac, ec, d, dmax: float, m: int, rtol: float, const: float,
                   equal_nan: bool) -> tuple[int, int]:
        """(mismatched, of which NaN/inf) in one chunk."""
        if math.isfinite(dmax):
            # all pairs finite: numpy.isclose's rule reduces to d <= bound. The bound is at
            # least fl(const), so only elements with d > const can be out: when those are
            # few, judge just them (same float operations, so the same verdicts)
            mask = self.mask[:m]
            np.greater(d, const, out=mask)
            few = int(np.count_nonzero(mask))
            if few <= m // _FEW_SHARE:
                if not few:
                    return 0, 0
                idx = mask.nonzero()[0]
                with np.errstate(over="ignore", invalid="ignore"):
                    bound = np.abs(ec[idx], dtype=self.work)
                    np.multiply(bound, rtol, out=bound)
                    np.add(bound, const, out=bound)
                return int(np.count_nonzero(np.greater(d[idx], bound))), 0
            b = self._bound(ec, m, rtol, const)
            return int(np.count_nonzero(np.greater(d, b))), 0
        b = self._bound(ec, m, rtol, const)
        bad = ~self._ok(ac, ec, d, b, equal_nan)
        return int(np.count_nonzero(bad)), int(np.count_nonzero(bad & ~np.isfinite(d)))

    def _argmax_finite(self, start: int) -> int:
        """Flat index of the greatest finite |a - e| in the chunk starting at ``start``."""
        stop = min(start + self.chunk, self.n)
        ac, ec = self.a[start:stop], self.e[start:stop]
        if not self.native:
            ac, ec = ac.astype(self.work), ec.astype(self.work)
        d = self._absdiff(ac, ec, stop - start)
        d[~np.isfinite(d)] = -1.0
        return start + int(np.argmax(d))

    def verdict(self, tol: Tolerance, equal_nan: bool, stop_after: float | None = None
                ) -> Verdict:
        """Count mismatches; with ``stop_after``, stop once more than that many are out and
        the bound does not depend on the output's scale (the statistics pass recounts)."""
        rtol, atol, sc = float(tol.rtol), float(tol.atol), float(tol.scale)
        # max|e| sets the bound when sc > 0; with an absolute term it also tells whether the
        # rule is vacuous (Tolerance.is_vacuous), so measure it then too
        want_scale = bool(sc) or ((atol > 0 or rtol >= 1) and not tol.allow_vacuous)
        scale = 0.0
        best, best_at = -1.0, None            # greatest finite |a - e| and its chunk
        suspects: list[int] = []              # chunk starts that need a look with the final scale
        suspect_bad = 0                       # their mismatches under the running scale (>= final)
        mismatched = nonfinite = 0
        with np.errstate(all="ignore"):   # NaN/inf are judged explicitly below
            for start, ac, ec, m in self.chunks():
                if want_scale:
                    scale = max(scale, self._finite_absmax(ec))
                    if stop_after is not None and suspect_bad > stop_after:
                        continue                  # probably failing: only the scale is needed
                d = self.d[:m]
                np.subtract(ac, ec, out=d, dtype=self.work)
                np.abs(d, out=d)
                dmax = float(d.max())
                if math.isfinite(dmax):
                    if dmax > best:
                        best, best_at = dmax, start
                    if dmax <= atol + sc * scale:
                        continue                  # every element of the chunk is within its bound
                else:
                    fin = np.isfinite(d)
                    if fin.any():
                        fmax = float(d[fin].max())
                        if fmax > best:
                            best, best_at = fmax, start
                bad, bad_nf = self._count_bad(ac, ec, d, dmax, m, rtol, atol + sc * scale, equal_nan)
                if not bad:
                    continue
                if sc == 0.0:                     # bound does not depend on the scale: count now
                    mismatched += bad
                    nonfinite += bad_nf
                    if stop_after is not None and mismatched > stop_after:
                        return Verdict(mismatched, nonfinite, scale, None, None, complete=False)
                else:
                    suspects.append(start)
                    suspect_bad += bad
        if stop_after is not None and suspect_bad > stop_after:
            # probably failing, and the statistics pass counts with the final scale anyway:
            # re-reading the suspects here would only repeat that count
            return Verdict(suspect_bad, nonfinite, scale, None, None, complete=False)
        # the scale may have grown after a suspect chunk was seen: judge those with the final one
        for start in suspects:
            stop = min(start + self.chunk, self.n)
            ac, ec = self.a[start:stop], self.e[start:stop]
            if not self.native:
                ac, ec = ac.astype(self.work), ec.astype(self.work)
            m = stop - start
            d = self._absdiff(ac, ec, m)
            bad, bad_nf = self._count_bad(ac, ec, d, float(d.max()), m, rtol, atol + sc * scale,
                                          equal_nan)
            mismatched += bad
            nonfinite += bad_nf
        max_abs_index = None if best_at is None else self._argmax_finite(best_at)
        return Verdict(mismatched, nonfinite, scale if want_scale else None,
                        None if best_at is None else best, max_abs_index)

    def statistics(self, tol: Tolerance, equal_nan: bool, scale: float | None,
                   fmt: tuple[int, int] | None,
                   want_histogram: bool, expect_failures: bool = False) -> Stats:
        """Every statistic in one pass (``StatsPass``). ``scale=None`` (only for
        ``tol.scale == 0``, where the bound does not need it): measure max|e| on the way."""
        return StatsPass(self, tol, equal_nan, scale, fmt, want_histogram,
                          expect_failures).run()
