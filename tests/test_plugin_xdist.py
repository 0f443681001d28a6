"""pytest-xdist: the same verdicts as a serial run, and the JSON holds every worker's rows."""

from __future__ import annotations

import json
import textwrap

import pytest

from models import TINY_SOURCE_CONFTEST

pytest.importorskip("xdist", reason="pytest-xdist is not installed: pip install pytest-xdist")

SUITE = textwrap.dedent('''
    import pytest
    from pytest_modelparity import assert_outputs_close, assert_deterministic

    @pytest.mark.parametrize("scale", [1.0, 1.0001, 1.01])
    def test_close(parity_candidate, parity_reference, parity_batch, scale):
        out = {k: v * scale for k, v in parity_candidate.predict(parity_batch).items()}
        assert_outputs_close(out, parity_reference, inputs=parity_batch)  # Keras reference: shadow rule

    def test_deterministic(parity_candidate, parity_batch):
        assert_deterministic(parity_candidate, parity_batch, runs=2)
''')


def _verdicts(doc: dict) -> tuple[dict, set]:
    tests = {t["nodeid"]: t["outcome"] for t in doc["tests"]}
    rows = {(r["nodeid"], r["check"], r["output"], r["verdict"]) for r in doc["rows"]}
    return tests, rows


def test_two_workers_give_the_serial_verdicts_and_all_rows(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    args = ("--modelparity-formats=keras,saved_model", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning")
    serial = pytester.runpytest_subprocess(*args, "--modelparity-report=serial.json")
    serial.assert_outcomes(passed=4, failed=4)
    parallel = pytester.runpytest_subprocess(*args, "-n", "2", "--modelparity-report=xdist.json")
    parallel.assert_outcomes(passed=4, failed=4)
    one = json.loads((pytester.path / "serial.json").read_text())
    two = json.loads((pytester.path / "xdist.json").read_text())
    assert two["workers"] == 2
    assert _verdicts(two) == _verdicts(one)
    assert len(two["rows"]) == len(one["rows"]) == 8
    parallel.stdout.fnmatch_lines(["*= model parity summary =*", "*test_close[[]saved_model-cpu-1.01[]]*FAIL*"])
