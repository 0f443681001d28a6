"""One spelling of numbers: JSON (comparison dicts and summary rows agree) and text."""

from __future__ import annotations

import json
import math

import numpy as np

from pytest_modelparity.verdict.compare import compare
from pytest_modelparity.verdict.formatting import json_number, json_value, short_float, table_number
from pytest_modelparity.reports.summary import rows_from_report
from pytest_modelparity.verdict.tolerances import Tolerance


def test_json_numbers_spell_non_finite_values_as_strings() -> None:
    assert [json_number(x) for x in (math.inf, -math.inf, math.nan, np.float32(2.5), None, "x")] == \
        ["inf", "-inf", "nan", 2.5, None, None]


def test_json_values_convert_numpy_all_the_way_down() -> None:
    value = {"a": np.bool_(True), 1: (np.int64(2), np.array([np.nan, 1.0])), "c": object}
    assert json_value(value) == {"a": True, "1": [2, ["nan", 1.0]], "c": str(object)}


def test_text_numbers() -> None:
    assert [short_float(x) for x in (None, 0.0, 0.01234567, 3.4e-4, math.inf)] == \
        ["n/a", "0", "0.01235", "3.40e-04", "inf"]
    assert [table_number(x) for x in (None, "inf", 0.012345)] == ["-", "inf", "0.0123"]


def test_summary_rows_are_the_comparison_dicts_fields() -> None:
    e = np.linspace(-1, 1, 50, dtype=np.float32)
    a = e.copy()
    a[3] = np.inf
    report = compare({"y": a}, {"y": e}, tolerance=Tolerance(1e-5, 1e-6, source="t"), full_stats=True)
    (out,) = report.outputs
    d = out.to_dict()
    (row,) = rows_from_report(report, nodeid="t::x", format="keras", device="cpu", kind="outputs_close", seq=0)
    for key in ("max_abs", "max_abs_index", "max_rel", "max_ulp", "mean_abs", "min_atol", "min_rtol", "size",
                "mismatched", "problem", "notes", "error_histogram"):
        assert row[key] == d[key], key
    assert (row["output"], row["verdict"], row["shape"], row["dtype"]) == ("['y']", "fail", [50], "float32")
    assert (row["rtol"], row["atol"], row["tolerance"]) == (1e-5, 1e-6, d["tolerance"]["text"])
    assert row["min_atol"] == "inf"                       # the infinite element: no atol passes
    json.dumps(row, allow_nan=False)
