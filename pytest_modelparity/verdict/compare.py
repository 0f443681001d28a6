"""The comparison engine: are two model results the same, and if not, by how much and where.

numpy only (never TensorFlow). ``compare(actual, expected)`` walks nested dicts/lists/tuples
of arrays in parallel and checks, in this order, structure, shape, dtype and values, giving
one ``OutputComparison`` per output inside a ``ComparisonReport``.

Value rule (``tolerances.Tolerance``): an element passes when
``|a - e| <= atol + rtol * |e| + scale * max|e over that output|``; NaN equals NaN only with
``equal_nan``; an infinity equals only the same infinity; integers and bools compare exactly
whatever the tolerance (in exact integer arithmetic), and so do strings, objects, dates and
durations (NaT like NaN); a record dtype is compared field by field, each field an output;
shapes must match (no broadcasting). This is ``numpy.isclose`` (same formula, same NaN/inf
rules) plus the ``scale`` term, with these deliberate differences: float16/bfloat16 are
judged in float32 arithmetic (numpy.isclose computes in float16, where ``a - e`` can
overflow), a float32 output compared against float64 values is judged in float64 with the
float32 tolerance, and so is any output under an rtol too large for float32 (inf x 0 would
be NaN there). A rule whose bound reaches an output's own magnitude is a failure
("vacuous") unless allowed. README, "How this compares with numpy and torch.testing".

Why blockwise: model outputs can be tens of millions of elements. The engine streams both
arrays in cache-sized chunks through preallocated buffers. A first pass decides the verdict
with the cheapest test that can prove "all close" (the greatest difference of a chunk
against the smallest bound any element of it can have); only chunks that fail that test are
checked element by element. The full statistics (relative error, ULPs, the smallest passing
tolerance, worst elements) cost a second pass, taken only on failure or when
``full_stats=True``; the error histogram (for summaries and the HTML report) only with
``full_stats=True``, since counting bins costs more than all the other statistics together.
On a failing output that second pass is short: apart from the sum and maximum of |a - e|,
every statistic is a maximum (or a top 5) that only a few elements can still reach once
the first chunk has set a level, so each chunk costs one candidate mask and the exact
arithmetic runs on the candidates only, in batches (``StatsAcc``; tests check it against
the full computation, ties included).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from . import bulk as bulk_rule
from .arrays import as_numpy
from .results import ComparisonReport, OutputComparison
from .scanning import Blocking, Scanner, Verdict
from .statistics import WORST_COUNT, histogram, passing_bound, py_scalar
from .structure import walk_pair
from .tolerances import Tolerance, default_tolerance
from .validators import check_tolerance_value

# Blocking, ComparisonReport, OutputComparison and passing_bound live in their own modules
# (scanning, results, statistics); they are named here too, where callers have always found them.
__all__ = ["compare", "elementwise_close", "passing_bound", "Blocking", "ComparisonReport",
           "OutputComparison", "ToleranceSpec"]

ToleranceSpec = Union[Tolerance, Callable[[np.dtype, str], Tolerance], None]

# an rtol this large is inf in float32, and inf x 0 is NaN, a bound nothing is compared
# against: such a rule is judged in float64, where rtol x 0 stays 0
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_ULP_FORMATS = {         # dtype name -> (explicit mantissa bits, min normal exponent)
    "float16": (10, -14),
    "bfloat16": (7, -126),
    "float32": (23, -126),
    "float64": (52, -1022),
}


@dataclass(frozen=True)
class _Settings:
    """What every output of one ``compare`` call is judged with."""

    tol: ToleranceSpec
    equal_nan: bool
    full_stats: bool
    blocking: Blocking


# --------------------------------------------------------------------------- structure


def compare(actual: Any, expected: Any, *, tolerance: ToleranceSpec = None,
            equal_nan: bool = False, full_stats: bool = False,
            blocking: Blocking = Blocking()) -> ComparisonReport:
    """Compare ``actual`` with ``expected`` (arrays, scalars, or nested dicts/lists/tuples).

    ``tolerance``: one ``Tolerance`` for every output, or a callable
    ``(dtype, path) -> Tolerance`` (``dtype`` is the dtype the output is judged in: the less
    precise of the two when both are floating), or None for ``default_tolerance(dtype)``.
    ``full_stats``: compute every statistic for passing outputs too (summaries, HTML).
    ``blocking``: how arrays are streamed (results never depend on it; tests vary it).
    """
    if tolerance is not None and not isinstance(tolerance, Tolerance) and not callable(tolerance):
        raise TypeError(
            f"tolerance must be a Tolerance, a callable (dtype, path) -> Tolerance, or None; "
            f"got {type(tolerance).__name__}. Build one with "
            f"pytest_modelparity.Tolerance(rtol=..., atol=...).")
    outputs: list[OutputComparison] = []
    how = _Settings(tolerance, equal_nan, full_stats, blocking)
    walk_pair(actual, expected, "", outputs, lambda a, e, path: _compare_leaf(a, e, path, how))
    return ComparisonReport(outputs)


# --------------------------------------------------------------------------- one output


def _float_format(dt: np.dtype) -> tuple[int, int] | None:
    """(mantissa bits, min exponent) for floating dtypes we can judge, else None."""
    if dt.kind == "f" or dt.name in _ULP_FORMATS:
        if dt.name in _ULP_FORMATS:
            return _ULP_FORMATS[dt.name]
        info = np.finfo(dt)                  # longdouble and friends
        return int(info.nmant), int(info.minexp)
    return None


def _is_python_scalar(x: Any) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, np.generic)


def _as_array(x: Any, other: Any) -> np.ndarray:
    """numpy array of ``x``; a plain Python scalar takes the other side's dtype if it fits."""
    if _is_python_scalar(x):
        odt = getattr(other, "dtype", None)
        if odt is not None:
            odt = np.dtype(odt)
            fits = (isinstance(x, bool) and odt.kind == "b") or (
                not isinstance(x, bool) and (odt.kind == "f" or _float_format(odt) is not None
                                             or (isinstance(x, int) and odt.kind in "iu")))
            if fits:
                try:
                    return np.asarray(x, dtype=odt)
                except (OverflowError, ValueError):
                    pass
    return np.asarray(as_numpy(x))


def _resolve(tol: ToleranceSpec, dt: np.dtype, path: str) -> Tolerance:
    if tol is None:
        return default_tolerance(dt)
    result = tol if isinstance(tol, Tolerance) else tol(dt, path)
    if not isinstance(result, Tolerance):
        raise TypeError(f"the tolerance callable returned {type(result).__name__} for output "
                        f"{path or '(array)'!r}; it must return a Tolerance")
    for what in ("rtol", "atol", "scale"):   # an infinite or NaN bound cannot fail
        check_tolerance_value(what, getattr(result, what), f"Tolerance({result.source})")
    return result


def _work_dtype(a: np.ndarray, e: np.ndarray, tol: Tolerance) -> np.dtype:
    """float64 when either side is float64 (or wider), or when a bound is too large for
    float32 (an rtol: inf x 0 = NaN there; an atol: it rounds to inf, and inf - 0 <= inf
    would let an infinity pass); else float32 (float16 and bfloat16 widened)."""
    wide = np.float64 in (a.dtype.type, e.dtype.type) or a.dtype.itemsize > 8 or \
        e.dtype.itemsize > 8 or max(float(tol.rtol), float(tol.atol), float(tol.scale)) >= _FLOAT32_MAX
    return np.dtype(np.float64) if wide else np.dtype(np.float32)


def _compare_leaf(a_in: Any, e_in: Any, path: str, how: _Settings) -> OutputComparison:
    # foreign arrays (torch, TensorFlow) first, so a Python scalar meets a numpy dtype
    a_in, e_in = (x if _is_python_scalar(x) else as_numpy(x) for x in (a_in, e_in))
    a = _as_array(a_in, e_in)
    e = _as_array(e_in, a_in if not isinstance(a_in, np.ndarray) else a)
    oc = OutputComparison(path=path, passed=False, actual_shape=tuple(a.shape),
                          expected_shape=tuple(e.shape), actual_dtype=str(a.dtype),
                          expected_dtype=str(e.dtype))
    if a.shape != e.shape:
        oc.problem = f"shape differs: actual {a.shape}, expected {e.shape}"
        return oc
    fa, fe = _float_format(a.dtype), _float_format(e.dtype)
    ka, ke = a.dtype.kind, e.dtype.kind
    oc.size = int(e.size)
    if fa is not None and fe is not None:
        # judge in the less precise float dtype's tolerance, compute in the wider one
        less = a.dtype if fa[0] <= fe[0] else e.dtype
        if a.dtype != e.dtype:
            oc.notes.append(f"{a.dtype} compared against {e.dtype} values "
                            f"(tolerance of {less})")
        oc.tolerance = _resolve(how.tol, less, path)
        _compare_floats(a, e, oc, oc.tolerance, how, _float_format(less))
        return oc
    if ka in "iu" and ke in "iu" or ka == ke == "b":
        if a.dtype != e.dtype:
            oc.notes.append(f"{a.dtype} compared against {e.dtype} values (exactly)")
        oc.tolerance = _exact_for_integers(e.dtype, _resolve(how.tol, e.dtype, path))
        _compare_exact_numbers(a, e, oc, how.full_stats)
        return oc
    if ka == "c" and ke in "cf" or ke == "c" and ka in "cf":
        oc.tolerance = _resolve(how.tol, e.dtype, path)
        _compare_complex(a, e, oc, oc.tolerance, how.equal_nan)
        return oc
    if ka == ke and ka in "USOMmV" and (ka != "V" or a.dtype == e.dtype):
        if a.dtype != e.dtype:
            oc.notes.append(f"{a.dtype} compared against {e.dtype} values (exactly)")
        oc.tolerance = None
        _compare_exact_values(a, e, oc, how.equal_nan)
        return oc
    if a.dtype == e.dtype:
        oc.problem = f"values of dtype {a.dtype} cannot be compared (no rule for this kind)"
    else:
        oc.problem = (f"dtype differs: actual {a.dtype}, expected {e.dtype} "
                      f"(values are not compared across these kinds{_cast_hint(a, e)})")
    return oc


def _cast_hint(a: np.ndarray, e: np.ndarray) -> str:
    if {a.dtype.kind, e.dtype.kind} <= set("iubf") and "f" in (a.dtype.kind, e.dtype.kind):
        floating = a.dtype if a.dtype.kind == "f" else e.dtype
        return (f"; integer outputs compare exactly, floating ones within a tolerance: cast one "
                f"side, e.g. .astype(np.{floating.name}), to compare them as floats")
    return ""


def _exact_for_integers(dtype: np.dtype, resolved: Tolerance) -> Tolerance:
    """Integers and bools compare exactly whatever rtol/atol was given (a class id or a
    token id off by one is another answer, not rounding); the report says so when one was."""
    source = f"{dtype} values compare exactly"
    if resolved.rtol or resolved.atol or resolved.scale:
        source += (f"; rtol={resolved.rtol:g}, atol={resolved.atol:g} ({resolved.source}) "
                   "applies to floating outputs only")
    return Tolerance(0.0, 0.0, source=source)


def _unravel(flat: int | np.integer, shape: tuple) -> tuple:
    if not shape:
        return ()
    return tuple(int(i) for i in np.unravel_index(int(flat), shape))


# --------------------------------------------------------------------------- exact kinds


def _exact_int_diff(af: np.ndarray, ef: np.ndarray) -> np.ndarray:
    """|a - e| of two flat integer arrays, exactly: uint64 (a difference of int64 or uint64
    values may need all 64 bits, which float64 would round: 2**53 vs 2**53 + 1 is 1, not 0),
    Python ints for the rare int64-against-uint64 pair, whose difference may need 65."""
    if af.dtype.kind == "b":
        return (af != ef).astype(np.uint64)
    signed = "i" in (af.dtype.kind, ef.dtype.kind)
    if signed and np.uint64 in (af.dtype.type, ef.dtype.type):
        return np.array([abs(int(x) - int(y)) for x, y in zip(af.tolist(), ef.tolist())],
                        dtype=object)
    wide = np.int64 if signed else np.uint64
    x, y = af.astype(wide), ef.astype(wide)
    ge = x >= y
    # modulo 2**64 the difference is exact, and 0 <= |a - e| < 2**64
    x, y = x.view(np.uint64), y.view(np.uint64)
    return np.where(ge, x - y, y - x)


def _compare_exact_numbers(a: np.ndarray, e: np.ndarray, oc: OutputComparison,
                           full_stats: bool) -> None:
    """Integers and bools: equal or not. The differences are exact integers (``_exact_int_diff``),
    in float64 only for the relative and mean statistics; no "smallest passing tolerance"
    (no tolerance applies)."""
    af, ef = a.reshape(-1), e.reshape(-1)
    neq = af != ef
    oc.mismatched = int(np.count_nonzero(neq))
    oc.passed = oc.mismatched == 0
    if not oc.size:
        return
    exact = _exact_int_diff(af, ef)
    i = int(np.argmax(exact))
    oc.max_abs, oc.max_abs_index = float(exact[i]), _unravel(i, a.shape)
    oc.scale = float(np.max(np.abs(ef.astype(np.float64))))
    if oc.passed and not full_stats:
        return
    d = exact.astype(np.float64)
    oc.mean_abs = float(d.mean())
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = d / np.abs(ef.astype(np.float64))
    rel[d == 0] = 0.0
    j = int(np.argmax(rel))
    oc.max_rel, oc.max_rel_index = float(rel[j]), _unravel(j, a.shape)
    order = np.argsort(-d, kind="stable")[:WORST_COUNT]
    oc.worst = [(_unravel(k, a.shape), py_scalar(af[k]), py_scalar(ef[k])) for k in order if neq[k]]
    oc.error_histogram = histogram(d[d > 0])


def _compare_exact_values(a: np.ndarray, e: np.ndarray, oc: OutputComparison,
                          equal_nan: bool) -> None:
    """Strings, objects, dates and durations, raw bytes: equal or not (NaT, like NaN,
    equals NaT only with ``equal_nan``)."""
    if a.dtype.kind == "V":                  # unstructured void: compare the bytes
        width = a.dtype.itemsize
        neq = (np.ascontiguousarray(a).view(np.uint8).reshape(-1, width)
               != np.ascontiguousarray(e).view(np.uint8).reshape(-1, width)).any(axis=1)
    else:
        neq = np.asarray(a != e, dtype=bool).reshape(-1)
        if equal_nan and a.dtype.kind in "Mm":
            neq &= ~(np.isnat(a) & np.isnat(e)).reshape(-1)
    oc.mismatched = int(np.count_nonzero(neq))
    if oc.mismatched:
        flat = np.flatnonzero(neq)[:WORST_COUNT]
        oc.worst = [(_unravel(i, a.shape), a.reshape(-1)[i], e.reshape(-1)[i]) for i in flat]
    oc.passed = oc.mismatched == 0
    if a.dtype.kind in "Mm" and oc.mismatched and bool(np.isnat(a).any() or np.isnat(e).any()):
        oc.notes.append("NaT equals NaT only with equal_nan=True")


def _compare_complex(a: np.ndarray, e: np.ndarray, oc: OutputComparison, tol: Tolerance,
                     equal_nan: bool) -> None:
    """Complex outputs (rare in models): numpy.isclose semantics, simple statistics."""
    af, ef = a.reshape(-1).astype(np.complex128), e.reshape(-1).astype(np.complex128)
    fin = np.isfinite(ef)
    scale = float(np.max(np.abs(ef[fin]))) if fin.any() else 0.0
    ok = np.isclose(af, ef, rtol=tol.rtol, atol=tol.atol + tol.scale * scale, equal_nan=equal_nan)
    oc.scale = scale
    oc.mismatched = int(ok.size - np.count_nonzero(ok))
    oc.passed = oc.mismatched <= tol.max_mismatch_fraction * oc.size
    if oc.passed and not tol.allow_vacuous and tol.is_vacuous(scale):
        oc.vacuous, oc.passed, oc.problem = True, False, _vacuous_problem(tol, scale)
    if oc.size:
        with np.errstate(invalid="ignore"):
            d = np.abs(af - ef)
        d = np.where(np.isfinite(d), d, 0.0)
        i = int(np.argmax(d))
        oc.max_abs, oc.max_abs_index = float(d[i]), _unravel(i, a.shape)
        oc.mean_abs = float(d.mean())
    oc.notes.append("complex values: |a - e| is the modulus of the difference")


# --------------------------------------------------------------------------- floats


def elementwise_close(actual: Any, expected: Any, tolerance: Tolerance, *,
                      equal_nan: bool = False, blocking: Blocking = Blocking()) -> np.ndarray:
    """Per-element verdict of the value rule (same chunks and kernel as ``compare``).

    For floating arrays of one shape; the rule is ``numpy.isclose``'s with the ``scale``
    term added (and float16/bfloat16 judged in float32). ``compare`` only counts the
    elements out; this says *which* are, for callers who want the mask (the tests check
    ``compare``'s counts against it).
    """
    a, e = np.asarray(as_numpy(actual)), np.asarray(as_numpy(expected))
    if a.shape != e.shape:
        raise ValueError(f"shapes differ: actual {a.shape}, expected {e.shape}")
    for what in ("rtol", "atol", "scale"):
        check_tolerance_value(what, getattr(tolerance, what), f"Tolerance({tolerance.source})")
    if _float_format(a.dtype) is None or _float_format(e.dtype) is None:
        return np.asarray(a == e, dtype=bool).reshape(a.shape)
    af, ef = np.ravel(a), np.ravel(e)
    work = _work_dtype(a, e, tolerance)
    native = all(x.dtype.kind == "f" and x.dtype.itemsize <= 8 for x in (af, ef))
    scan = Scanner(af, ef, work, native, blocking)
    scale = 0.0
    for _, _, ec, _ in scan.chunks():
        scale = max(scale, scan._finite_absmax(ec))
    out = np.empty(af.size, bool)
    const = float(tolerance.atol) + float(tolerance.scale) * scale
    for start, ac, ec, m in scan.chunks():
        d = scan._absdiff(ac, ec, m)
        b = scan._bound(ec, m, float(tolerance.rtol), const)
        out[start:start + m] = scan._ok(ac, ec, d, b, equal_nan)
    return out.reshape(a.shape)


def _compare_floats(a: np.ndarray, e: np.ndarray, oc: OutputComparison, tol: Tolerance,
                    how: _Settings, fmt: tuple[int, int] | None) -> None:
    equal_nan, full_stats = how.equal_nan, how.full_stats
    work = _work_dtype(a, e, tol)
    if a.dtype.itemsize > 8 or e.dtype.itemsize > 8:
        oc.notes.append("extended precision judged in float64")
    af, ef = np.ravel(a), np.ravel(e)
    native = all(x.dtype.kind == "f" and x.dtype.itemsize <= 8 for x in (af, ef))
    scan = Scanner(af, ef, work, native, how.blocking)
    n = oc.size

    # pass 1: verdict, cheapest test first -------------------------------------------
    allowed = tol.max_mismatch_fraction * n
    # a failing output needs the statistics pass anyway: stop counting once it surely fails
    v = scan.verdict(tol, equal_nan, stop_after=None if full_stats else allowed)
    oc.scale = v.scale
    oc.max_abs = v.max_abs
    oc.max_abs_index = None if v.max_abs_index is None else _unravel(v.max_abs_index, a.shape)
    oc.mismatched = v.mismatched
    passed = v.mismatched <= allowed
    if tol.min_top1 is not None and a.ndim >= 1 and n:
        passed = _judge_top1(a, e, oc, tol) and passed
    bulk_ok = _judge_bulk(a, e, oc, tol, v.scale, max_holds=passed)
    passed = passed and bulk_ok
    if passed and v.scale is not None and not tol.allow_vacuous and tol.is_vacuous(v.scale):
        oc.vacuous = True
        oc.problem = _vacuous_problem(tol, v.scale)
        passed = False
    oc.passed = passed
    if n == 0 or (passed and not full_stats):
        _note_nonfinite(oc, v.nonfinite_mismatched, equal_nan)
        return

    # pass 2: full statistics ------------------------------------------------------
    # (with tol.scale > 0 the verdict pass always reads to the end: its scale is final)
    s = scan.statistics(tol, equal_nan, v.scale if tol.scale else None, fmt,
                        want_histogram=full_stats,
                        expect_failures=v.mismatched > 0)
    oc.scale = s.scale
    if not v.complete:                    # the statistics pass counted the whole output
        oc.mismatched, oc.scale, oc.max_abs = s.mismatched, s.scale, s.max_abs
        oc.max_abs_index = None if s.max_abs_index is None else _unravel(s.max_abs_index,
                                                                           a.shape)
        v = Verdict(s.mismatched, s.nonfinite_mismatched, s.scale, s.max_abs, s.max_abs_index)
        # the verdict's count was an upper bound (a scale that grew late); this one is exact
        oc.passed = s.mismatched <= allowed and not oc.vacuous and bulk_ok and (
            oc.top1_agreement is None or tol.min_top1 is None or oc.top1_agreement >= tol.min_top1)
    _note_nonfinite(oc, v.nonfinite_mismatched, equal_nan)
    oc.mean_abs = s.mean_abs
    oc.max_rel = s.max_rel
    oc.max_rel_index = None if s.max_rel_index is None else _unravel(s.max_rel_index, a.shape)
    oc.max_ulp = s.max_ulp
    oc.min_atol = s.min_atol
    oc.min_rtol = s.min_rtol
    oc.worst = [(_unravel(i, a.shape), float(x), float(y)) for i, x, y in s.worst]
    oc.error_histogram = s.histogram
    const = tol.atol + tol.scale * s.scale
    if v.max_abs_index is not None:
        oc.max_abs_allowed = const + tol.rtol * abs(float(ef[v.max_abs_index]))
    if s.max_rel_index is not None:
        ev = abs(float(ef[s.max_rel_index]))
        oc.max_rel_allowed = tol.rtol + const / ev if ev else math.inf


def _judge_bulk(a: np.ndarray, e: np.ndarray, oc: OutputComparison, tol: Tolerance, scale: float | None, *,
                max_holds: bool) -> bool:
    """The bulk bounds of ``tol`` (``verdict/bulk.py``): each statistic of the error against the
    same statistic of the model's float noise; True when they hold or there are none."""
    if not tol.bulk or scale is None:
        return True
    found = bulk_rule.judge(a, e, scale, tol.bulk, max_holds=max_holds)
    if found is None:
        return True
    oc.bulk = found.rows
    oc.bulk_failure = found.text
    return found.failed is None


def _vacuous_problem(tol: Tolerance, scale: float) -> str:
    return (f"vacuous comparison: the allowed difference ({tol.describe()}) is at least the "
            f"output's largest magnitude {scale:.3g}, so even an all-zero output would pass "
            "and this check cannot fail; use a tolerance below the output's scale (the "
            "default rule scales with it), or pass allow_vacuous=True to accept it")


def _note_nonfinite(oc: OutputComparison, count: int, equal_nan: bool) -> None:
    if count:
        oc.notes.append(f"{count} mismatched element(s) involve NaN or infinity"
                        + ("" if equal_nan else " (NaN equals NaN only with equal_nan=True)"))


def _judge_top1(a: np.ndarray, e: np.ndarray, oc: OutputComparison, tol: Tolerance) -> bool:
    """Top-1 agreement over the rows whose reference argmax is evidence; notes what it left out."""
    agreement, judged, ties = _top1(a, e, tol)
    oc.top1_agreement, oc.top1_rows, oc.top1_near_ties = agreement, judged, ties
    excluded = (f" ({ties} near-tie row(s) left out: their reference top-1 margin is within twice "
                f"the allowed difference, so their argmax is noise)") if ties else ""
    if judged == 0 and ties:
        oc.top1_agreement = None
        oc.notes.append(f"top-1 agreement not judged: all {ties} rows are near-ties (reference top-1 "
                        "margin within twice the allowed difference)")
        return True
    assert tol.min_top1 is not None
    if agreement < tol.min_top1:
        oc.notes.append(f"top-1 agreement {agreement:.1%} over {judged} row(s) is below the required "
                        f"{tol.min_top1:.0%}{excluded}")
        return False
    if ties:
        oc.notes.append(f"top-1 agreement {agreement:.1%} over {judged} row(s){excluded}")
    return True


def _top1(a: np.ndarray, e: np.ndarray, tol: Tolerance | None = None) -> tuple[float, int, int]:
    """(agreement, rows judged, near-tie rows left out) of the argmax over the last axis.

    A row whose reference top-1 beats its runner-up by no more than twice the allowed
    difference (each may move by the bound) is a near-tie: its argmax is not evidence.
    """
    if a.shape[-1] == 0:
        return 1.0, 0, 0
    a2 = a.reshape(-1, a.shape[-1])
    e2 = e.reshape(-1, e.shape[-1]).astype(np.float64)
    if a2.shape[0] == 0:
        return 1.0, 0, 0
    agree = np.argmax(a2, axis=-1) == np.argmax(e2, axis=-1)
    judged = np.ones(agree.shape, bool)
    if tol is not None and e2.shape[1] >= 2:
        finite = e2[np.isfinite(e2)]
        scale = float(np.max(np.abs(finite))) if finite.size else 0.0
        top2 = np.partition(e2, -2, axis=-1)[:, -2:]
        margin = top2[:, 1] - top2[:, 0]
        with np.errstate(invalid="ignore"):
            judged = ~(margin <= 2.0 * tol.allowed(np.abs(top2[:, 1]), scale))
    count = int(judged.sum())
    if count == 0:
        return 1.0, 0, int(agree.size)
    return float(np.mean(agree[judged])), count, int(agree.size) - count


