"""How numbers are spelled, in one place: in JSON (reports, rows) and in text (failure
messages, the summary table, the HTML page).

JSON has no inf/nan: every writer spells them as the strings "inf", "-inf" and "nan", and
numpy scalars and arrays become plain JSON values. numpy only (no TensorFlow).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal
from typing import Any

__all__ = ["json_number", "json_value", "short_float", "table_number", "ceil_float", "exact_float"]


def json_number(value: Any) -> float | str | None:
    """A JSON-safe number: floats stay floats, inf/nan become "inf"/"-inf"/"nan"; None (or
    anything that is not a number) is None."""
    if value is None:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    return f


def json_value(value: Any) -> Any:
    """Any value as JSON: mappings, lists/tuples, numpy scalars and arrays converted all the
    way down; numbers through ``json_number``; anything else as its ``str``."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return json_number(value)
    if isinstance(value, Mapping):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if hasattr(value, "tolist"):
        return json_value(value.tolist())
    if hasattr(value, "__float__"):
        return json_number(value)
    return str(value)


def short_float(x: float | None, digits: int = 4) -> str:
    """Short float text for failure messages: 0.01, 3.4e-04, inf, nan; "n/a" for None."""
    if x is None:
        return "n/a"
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e5:
        return f"{x:.{digits}g}"
    return f"{x:.{max(digits - 2, 1)}e}"


def ceil_float(x: float, digits: int = 4) -> str:
    """``x`` rounded *up* to ``digits`` significant digits: text whose value is never below
    ``x``, for a bound the reader will paste back ("Smallest passing tolerance": rounded to
    nearest, 0.0537066 would print as 0.0537 and fail)."""
    x = float(x)
    if x <= 0 or not math.isfinite(x):
        return exact_float(x)
    exact = Decimal(x)                       # the float's exact value
    step = Decimal(1).scaleb(exact.adjusted() - digits + 1)
    up = exact.quantize(step, rounding=ROUND_CEILING)
    # the nearest float to `up` is >= x, since x itself is a float <= up
    return f"{float(up):.{digits}g}"


def exact_float(x: float) -> str:
    """The shortest text that reads back as exactly ``x`` (1.3e-06, 0.0001, 0, 1)."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


def table_number(value: Any, spec: str = ".3g") -> str:
    """A number for the summary table and the HTML page (3 significant digits); "-" when not
    measured; a JSON row's "inf"/"nan" strings as they are."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return format(value, spec)
