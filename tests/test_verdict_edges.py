"""Arithmetic edges of the failure text (issue 27): the advice is a value the plugin accepts."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pytest_modelparity import ParityError, assert_outputs_close
from pytest_modelparity.verdict.compare import compare
from pytest_modelparity.verdict.tolerances import Tolerance
from pytest_modelparity.verdict.validators import check_tolerance_value


def test_advice_near_the_largest_float_is_finite_and_accepted():
    """~1.797e308 vs 0 (a draw of tests/test_compare_properties.py) advised atol=inf (the
    bound rounded up past the largest float), which rtol=/atol= refuse: the advice is now the
    exact finite bound, and it passes as printed."""
    big = np.array([1.7976751579309672e308, 1.0])
    zero = np.array([0.0, 1.0])
    with pytest.raises(ParityError) as info:
        assert_outputs_close(big, zero, rtol=0.0, atol=1e-5)
    text = str(info.value)
    assert "atol=inf" not in text
    advised = re.search(r"Smallest passing tolerance: atol=(\S+) \(with rtol=", text).group(1)
    atol = check_tolerance_value("atol", float(advised))  # the plugin accepts it
    assert compare(big, zero, tolerance=Tolerance(0.0, atol, allow_vacuous=True, source="argument")).passed


def test_no_finite_tolerance_is_said_so():
    """A difference that overflows (largest float vs its negative) has no finite bound."""
    a = np.array([1.7976931348623157e308])
    report = compare(a, -a, tolerance=Tolerance(0.0, 1e-5, source="argument"))
    text = str(report)
    assert "atol=inf" not in text and "rtol=inf" not in text
    assert "Smallest passing tolerance: none (NaN or infinity mismatches, or a difference beyond the largest " \
           "float: no finite rtol/atol passes)" in text


def test_readme_rows_on_numpy_differences_hold():
    """The README's comparison table, as measured: rtol=1e39 in float32, complex NaN
    components, masked arrays, signed zeros."""
    import warnings

    tol = lambda r, a: Tolerance(r, a, source="argument")  # noqa: E731
    one, zero = np.array([1.0], np.float32), np.array([0.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's overflow in the cast of rtol=1e39
        assert not np.isclose(one, zero, rtol=1e39, atol=1).any()  # numpy: False
    assert compare(one, zero, tolerance=tol(1e39, 1.0)).passed            # here: the arithmetic's verdict
    assert not compare(one, zero, tolerance=tol(1e39, 0.0)).passed
    a, e = np.array([complex(np.nan, 1)]), np.array([complex(1, np.nan)])
    np.testing.assert_allclose(a, e)                                      # numpy: equal
    assert not compare(a, e, tolerance=tol(1e-7, 0.0)).passed
    assert compare(a, e, tolerance=tol(1e-7, 0.0), equal_nan=True).passed
    masked = np.ma.array([1.0, 2.0], mask=[0, 1])
    np.testing.assert_allclose(masked, np.ma.array([1.0, 5.0], mask=[0, 1]))  # numpy skips the masked one
    assert not compare(masked, np.array([1.0, 5.0]), tolerance=tol(1e-7, 0.0)).passed
    assert compare(np.array([0.0]), np.array([-0.0]), tolerance=tol(0.0, 0.0)).passed
