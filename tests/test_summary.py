"""Rows and environment of the JSON report (summary.py), without a pytest run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pytest_modelparity import compare
from pytest_modelparity.reports.summary import environment, rows_from_report


def test_a_row_with_a_structure_problem_keeps_every_tolerance_key():
    report = compare(np.zeros(3), np.zeros(4))
    (row,) = rows_from_report(report, nodeid="t.py::test", format=None, device=None, kind="outputs_close", seq=0)
    assert row["problem"] and row["verdict"] == "fail"
    assert {k: row[k] for k in ("rtol", "atol", "scale")} == {"rtol": None, "atol": None, "scale": None}


def test_environment_reports_the_installed_tfjs_version():
    from pytest_modelparity.runtime.tfjs_runner import modules_dir

    pkg = modules_dir() / "node_modules" / "@tensorflow" / "tfjs-core" / "package.json"
    if not pkg.is_file():
        pytest.skip("the TFJS runner's npm packages are not installed: python -m pytest_modelparity.tfjs_runner install")
    assert environment()["tfjs_npm"] == json.loads(pkg.read_text())["version"]
