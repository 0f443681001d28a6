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
