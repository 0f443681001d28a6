"""Argument validators: one home for checking rtol/atol, batch sizes and batches.

Why a module of its own: the same mistake (``rtol=nan``, ``batch_size=0``) can be made in an
assertion call, a marker, an ini key or a Hypothesis strategy; each used to be checked
separately, with different messages and exception types, and ``nan`` slipped through one of
them. Every check here raises ``errors.InvalidArgumentError`` (a ``ValueError``) whose
message names the argument, the value, where it came from and what to pass instead.
The plugin turns it into ``pytest.UsageError`` for options. Numpy only, no TensorFlow.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np

from ..errors import InvalidArgumentError

__all__ = ["check_tolerance_choice", "check_tolerance_value", "check_batch_size", "check_batch_sizes", "check_nonempty_batch"]


def check_tolerance_value(what: str, value: Any, source: str = "argument") -> float | None:
    """``rtol``/``atol`` as a float: ``None`` stays ``None``; NaN, inf, negatives and
    non-numbers are refused (a NaN bound would make every comparison fail, an infinite one
    every comparison pass)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{what}={value!r} from {source} is a bool; pass a float such as 1e-5")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{what}={value!r} from {source} is not a number; pass a float such as 1e-5") from None
    if not math.isfinite(number) or number < 0:
        raise InvalidArgumentError(f"{what}={value!r} from {source} must be a finite number >= 0, e.g. 1e-5")
    return number


def check_tolerance_choice(tolerance: Any, rtol: Any, atol: Any, *, rule_type: type) -> None:
    """An assertion's ``tolerance=`` (``None``, a ``rule_type`` rule or ``"calibrated"``) and
    ``rtol``/``atol``, checked together and before any model runs: a rule or ``"calibrated"``
    excludes an explicit rtol/atol, and each bound must be valid."""
    check_tolerance_value("rtol", rtol)
    check_tolerance_value("atol", atol)
    explicit = rtol is not None or atol is not None
    if isinstance(tolerance, rule_type):
        if explicit:
            raise InvalidArgumentError("pass either tolerance=Tolerance(...) or rtol=/atol=, not both")
    elif isinstance(tolerance, str) and tolerance == "calibrated":
        if explicit:
            raise InvalidArgumentError("tolerance='calibrated' and rtol=/atol= exclude each other: pass one of them")
    elif tolerance is not None:
        raise InvalidArgumentError(f"tolerance={tolerance!r}: pass a Tolerance, None or the string 'calibrated'")


def check_batch_size(value: Any, what: str = "batch_size") -> int:
    """One batch size: an int >= 1 (``True`` is not a size)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"{what}={value!r} is not an int; pass an int >= 1, e.g. {what}=4")
    if value < 1:
        raise InvalidArgumentError(f"{what}={value!r}: {what} must be >= 1, e.g. {what}=4")
    return int(value)


def check_batch_sizes(values: Any, what: str = "batch_sizes") -> list[int]:
    """An int or a non-empty sequence of ints >= 1, as a list."""
    if isinstance(values, (int, np.integer)) and not isinstance(values, bool):
        values = (values,)
    if not isinstance(values, Iterable) or isinstance(values, (str, bytes)):
        raise InvalidArgumentError(f"{what}={values!r}: pass an int or a sequence of ints >= 1, e.g. {what}=(1, 7)")
    values = tuple(values)
    if not values:
        raise InvalidArgumentError(f"{what} is empty; pass at least one sub-batch size, e.g. {what}=(1,)")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise InvalidArgumentError(f"{what}={values!r}: every size must be an int >= 1, e.g. {what}=(1, 7)")
    return [int(v) for v in values]


def check_nonempty_batch(rows: int, where: str) -> int:
    """A batch must hold at least one row: a 0-row batch compares nothing and would pass."""
    if rows < 1:
        raise InvalidArgumentError(f"{where}: the inputs have 0 rows (axis 0 is empty), so there is nothing to "
                                   "compare; pass a batch with at least one row")
    return rows


def check_bind(bind: Any) -> None:
    """``bind=``: ``{"inputs": {reference name: other name}, "outputs": {...}}`` (either key)."""
    if bind is None:
        return
    ok = isinstance(bind, Mapping) and bind and set(bind) <= {"inputs", "outputs"} and all(
        isinstance(v, Mapping) and all(isinstance(a, str) and isinstance(b, str) for a, b in v.items())
        for v in bind.values())
    if not ok:
        raise InvalidArgumentError(
            f"bind={bind!r}; pass {{'outputs': {{'<expected output name>': '<actual output name>'}}}} (and/or "
            "'inputs'), names as strings, for the tensors the plugin cannot pair by itself")
