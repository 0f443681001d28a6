"""Property tests: the engine's per-element verdict is numpy.isclose's, and it never crashes.

Deliberate differences from ``numpy.isclose`` (documented in compare.py), which the
reference below reproduces explicitly rather than hiding:
- float16 is judged in float32 arithmetic (numpy.isclose computes in float16, where
  ``a - e`` can overflow to inf), so the reference is ``isclose`` on float32 copies;
- mixed float32/float64 pairs are judged in float64 (as numpy does too);
- integers and bools compare exactly whatever the tolerance;
- an rtol too large for float32 (1e39 is inf there, and inf x 0 = NaN) is judged in
  float64, so the reference computes in float64 then too.
"""

from __future__ import annotations

import json
import math
import re

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


from pytest_modelparity.verdict.compare import Blocking, compare, elementwise_close
from pytest_modelparity.verdict.tolerances import Tolerance

FLOATS = [np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)]
EXACT = [np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.uint16),
         np.dtype(np.bool_)]

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6)
tolerances = st.builds(
    lambda r, a: Tolerance(rtol=r, atol=a, source="hypothesis"),
    st.sampled_from([0.0, 1e-7, 1.3e-6, 1e-3, 0.1, 0.5, 1e39]),
    st.sampled_from([0.0, 1e-45, 1e-8, 1e-5, 1e-2, 1.0, 1e39]),
)


def _special_floats(dtype: np.dtype):
    """Ordinary values, NaN, both infinities, zeros of both signs and subnormals."""
    info = np.finfo(dtype)
    tiny = float(info.smallest_subnormal)
    return st.one_of(
        hnp.from_dtype(dtype, allow_nan=True, allow_infinity=True, allow_subnormal=True),
        st.sampled_from([0.0, -0.0, math.nan, math.inf, -math.inf, tiny, -tiny,
                         2 * tiny, float(info.tiny), 1.0, 1.0 + float(info.eps)]),
    )


@st.composite
def float_pairs(draw):
    dtype = draw(st.sampled_from(FLOATS))
    shape = draw(shapes)
    e = draw(hnp.arrays(dtype, shape, elements=_special_floats(dtype)))
    # actual: either unrelated values or expected plus small noise (so both verdicts occur)
    if draw(st.booleans()):
        a = draw(hnp.arrays(dtype, shape, elements=_special_floats(dtype)))
    else:
        noise = draw(hnp.arrays(np.float64, shape, elements=st.sampled_from(
            [0.0, 1e-9, -1e-7, 1e-6, 1e-4, -1e-2, 0.3])))
        with np.errstate(all="ignore"):
            a = (e.astype(np.float64) * (1 + noise) + noise).astype(dtype)
    return a, e


@pytest.fixture
def small_chunks() -> Blocking:
    """Chunks of 7 elements so every chunk boundary path runs on tiny arrays."""
    return Blocking(chunk=7)


def _reference(a: np.ndarray, e: np.ndarray, tol: Tolerance, equal_nan: bool) -> np.ndarray:
    if max(tol.rtol, tol.atol) >= float(np.finfo(np.float32).max):   # see module docstring (atol too: it rounds to inf)
        a, e = a.astype(np.float64), e.astype(np.float64)
    if a.dtype == np.float16:                     # judged in float32, see module docstring
        a, e = a.astype(np.float32), e.astype(np.float32)
    with np.errstate(all="ignore"):
        return np.isclose(a, e, rtol=tol.rtol, atol=tol.atol, equal_nan=equal_nan)


def _check_same_verdict(a, e, tol, equal_nan, blocking=Blocking()):
    ref = np.asarray(_reference(a, e, tol, equal_nan), dtype=bool).reshape(a.shape)
    mask = elementwise_close(a, e, tol, equal_nan=equal_nan, blocking=blocking)
    np.testing.assert_array_equal(mask, ref)
    # the engine against numpy.isclose: a vacuous rule is judged like any other here
    tol = replace(tol, allow_vacuous=True)
    report = compare(a, e, tolerance=tol, equal_nan=equal_nan, blocking=blocking)
    (oc,) = report.outputs
    assert oc.problem is None
    assert oc.size == a.size
    assert oc.mismatched == int(np.count_nonzero(~ref))
    assert oc.passed == bool(ref.all())
    # the statistics pass (failing outputs, full_stats) counts the same elements
    (full,) = compare(a, e, tolerance=tol, equal_nan=equal_nan, full_stats=True,
                      blocking=blocking).outputs
    assert (full.mismatched, full.passed, full.max_abs_index) == \
        (oc.mismatched, oc.passed, oc.max_abs_index)
    assert full.max_abs == oc.max_abs or (full.max_abs is None) == (oc.max_abs is None)
    json.dumps(report.to_dict(), allow_nan=False)
    str(report)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=float_pairs(), tol=tolerances, equal_nan=st.booleans())
def test_float_verdict_matches_numpy_isclose(pair, tol, equal_nan):
    a, e = pair
    _check_same_verdict(a, e, tol, equal_nan)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(pair=float_pairs(), tol=tolerances, equal_nan=st.booleans())
def test_float_verdict_matches_numpy_isclose_across_chunks(small_chunks, pair, tol, equal_nan):
    a, e = pair
    _check_same_verdict(a, e, tol, equal_nan, small_chunks)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(EXACT), shape=shapes, tol=tolerances)
def test_integers_and_bools_compare_exactly(data, dtype, shape, tol):
    a = data.draw(hnp.arrays(dtype, shape))
    e = data.draw(hnp.arrays(dtype, shape))
    (oc,) = compare(a, e, tolerance=tol).outputs
    assert oc.mismatched == int(np.count_nonzero(a != e))
    assert oc.passed == bool(np.array_equal(a, e))
    assert oc.tolerance is not None and oc.tolerance.atol == 0 and oc.tolerance.rtol == 0
    # the greatest difference in exact integer arithmetic (float64 loses it past 2**53)
    exact = [abs(int(x) - int(y)) for x, y in zip(a.ravel().tolist(), e.ravel().tolist())]
    if exact:
        assert oc.max_abs == float(max(exact))
        assert oc.max_abs_index == np.unravel_index(exact.index(max(exact)), a.shape)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(pair=float_pairs(), scale=st.sampled_from([1e-7, 1e-5, 1e-3, 0.5]),
       tol=tolerances, equal_nan=st.booleans())
def test_scaled_rule_matches_isclose_with_atol_grown_by_scale(small_chunks, pair, scale, tol,
                                                              equal_nan):
    """scale > 0 is isclose with atol + scale * max|finite expected| (judged on the final
    maximum even when it only appears in a later chunk)."""
    a, e = pair
    tol = Tolerance(tol.rtol, tol.atol, scale=scale, source="hypothesis")
    wide = e.astype(np.float64)
    fin = wide[np.isfinite(wide)]
    top = float(np.max(np.abs(fin))) if fin.size else 0.0
    plain = Tolerance(tol.rtol, tol.atol + scale * top, source="reference")
    ref = np.asarray(_reference(a, e, plain, equal_nan), dtype=bool).reshape(a.shape)
    (oc,) = compare(a, e, tolerance=tol, equal_nan=equal_nan, blocking=small_chunks).outputs
    np.testing.assert_array_equal(
        elementwise_close(a, e, tol, equal_nan=equal_nan, blocking=small_chunks), ref)
    assert oc.mismatched == int(np.count_nonzero(~ref))
    assert oc.scale == pytest.approx(top)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(pair=float_pairs(), tol=tolerances)
def test_smallest_passing_tolerances_really_pass(small_chunks, pair, tol):
    """min_atol / min_rtol are the edge: a hair above passes, clearly below fails."""
    a, e = pair
    (oc,) = compare(a, e, tolerance=tol, full_stats=True, blocking=small_chunks).outputs
    if a.size == 0:
        return
    assert oc.min_atol is not None and oc.min_rtol is not None
    if math.isfinite(oc.min_atol):
        # a hair above, but never past the largest float (a tolerance must be finite)
        hair = min(oc.min_atol * (1 + 1e-5) + 1e-300, float(np.finfo(np.float64).max))
        up = Tolerance(tol.rtol, hair, source="t", allow_vacuous=True)
        assert compare(a, e, tolerance=up, blocking=small_chunks).passed
        if oc.min_atol > 1e-30 and tol.rtol == 0 and a.dtype != np.float16:
            down = Tolerance(tol.rtol, oc.min_atol * 0.5, source="t")
            assert not compare(a, e, tolerance=down, blocking=small_chunks).passed
    else:
        # a NaN/inf mismatch: no finite atol (of the dtype judged in) makes it pass
        huge = 1e300 if a.dtype == np.float64 else float(np.finfo(np.float32).max) / 2
        assert not compare(a, e, tolerance=Tolerance(tol.rtol, huge, source="t"),
                           blocking=small_chunks).passed
    if math.isfinite(oc.min_rtol) and oc.min_rtol < 1:
        up = Tolerance(oc.min_rtol * (1 + 1e-5) + 1e-12, tol.atol, source="t", allow_vacuous=True)
        assert compare(a, e, tolerance=up, blocking=small_chunks).passed


@pytest.fixture
def short_path_everywhere() -> Blocking:
    """Chunks of 16 where up to half the elements may be candidates, so the statistics'
    short path (verdict.statistics.StatsAcc) runs on tiny arrays."""
    return Blocking(chunk=16, subset_max_share=2, cheap_max_share=4, subset_batch=24)


@st.composite
def failing_pairs(draw):
    """Mostly-close pairs with some clear, some borderline mismatches; values drawn from
    small sets so equal errors (ties) are common."""
    dtype = draw(st.sampled_from(FLOATS))
    n = draw(st.integers(40, 300))
    e = draw(hnp.arrays(dtype, n, elements=st.sampled_from(
        [0.0, -0.0, 1e-40 if dtype != np.float16 else 1e-7, 1e-3, -0.5, 1.0, 3.0, -7.25, 100.0,
         2.0 ** 10])))
    noise = draw(hnp.arrays(np.float64, n, elements=st.sampled_from(
        [0.0, 0.0, 0.0, 1e-9, -1e-7, 1e-6, 1e-4, -1e-2, 0.3])))
    shift = draw(hnp.arrays(np.float64, n, elements=st.sampled_from(
        [0.0, 0.0, 0.0, 0.0, 1e-5, 1.0])))
    with np.errstate(all="ignore"):
        a = (e.astype(np.float64) * (1 + noise) + shift).astype(dtype)
    return a, e


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(pair=failing_pairs(), tol=tolerances, scale=st.sampled_from([0.0, 0.0, 1e-5, 1e-3]))
def test_short_path_statistics_are_the_full_ones(short_path_everywhere, pair, tol, scale):
    """Every statistic of the short path (candidates only) equals the full computation:
    values, indices (ties to the lowest index), worst elements."""
    a, e = pair
    tol = Tolerance(tol.rtol, tol.atol, scale=scale, source="hypothesis")
    fast = compare(a, e, tolerance=tol, blocking=short_path_everywhere).outputs[0].to_dict()
    full_path = replace(short_path_everywhere, short_stats=False)
    full = compare(a, e, tolerance=tol, blocking=full_path).outputs[0].to_dict()
    assert fast == full


_ADVICE = re.compile(r"(atol|rtol)=(\S+) \(with (atol|rtol)=([^;)]+)")


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(pair=float_pairs(), tol=tolerances, scale=st.sampled_from([0.0, 1e-5, 0.01]))
def test_smallest_passing_tolerance_passes_as_printed(small_chunks, pair, tol, scale):
    """"Smallest passing tolerance: atol=X (with rtol=Y)" typed back as the arguments
    rtol=Y, atol=X passes (rounded up, never to nearest; scale rules included, since an
    explicit value is the plain rule)."""
    a, e = pair
    tol = replace(tol, scale=scale)
    report = compare(a, e, tolerance=tol, blocking=small_chunks)
    for name, value, other, other_value in _ADVICE.findall(str(report)):
        args = {name: float(value), other: float(other_value)}
        assert compare(a, e, tolerance=Tolerance(source="argument", allow_vacuous=True, **args),
                       blocking=small_chunks).passed, (name, value, other, other_value)
