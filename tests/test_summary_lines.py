"""The end-of-run lines a new user reads first: what a shortened table left out (never "N more
rows not shown" above no row at all), and how to see TensorFlow's output (``-v -s``)."""

from __future__ import annotations

import textwrap

import pytest

from pytest_modelparity.reports.summary import hidden_rows_line

pytestmark = [pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker


def _rows(**verdicts: int) -> list[dict]:
    return [{"verdict": v} for v, n in verdicts.items() for _ in range(n)]


def test_a_green_run_says_no_row_failed_instead_of_more_rows_not_shown():
    rows = _rows(**{"pass": 48, "expected": 7})
    line = hidden_rows_line(rows, [])
    assert line.startswith("55 rows, none failed, so none shown (48 passed, 7 failed as the test expected); -v ")
    assert "more rows not shown" not in line


def test_a_shortened_table_counts_only_what_it_hid():
    rows = _rows(**{"fail": 42, "pass": 5})
    line = hidden_rows_line(rows, rows[:40])
    assert line.startswith("... 7 more rows not shown (5 passed, 2 more failed); -v shows every row")


def test_the_end_of_a_green_run_with_expected_failures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(textwrap.dedent('''
        import numpy as np
        import pytest
        from pytest_modelparity import ParityError, assert_outputs_close

        @pytest.mark.parametrize("i", range(40))
        def test_many(i):
            assert_outputs_close(np.full(3, i, "float32"), np.full(3, i, "float32"))

        @pytest.mark.parametrize("i", range(3))
        def test_caught(i):
            with pytest.raises(ParityError):
                assert_outputs_close(np.ones(3, "float32"), np.zeros(3, "float32"))
    '''))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=43)
    result.stdout.fnmatch_lines(["43 rows, none failed, so none shown (40 passed, 3 failed as the test expected); "
                                 "-v shows every row, --modelparity-report/--modelparity-html write them all"])
