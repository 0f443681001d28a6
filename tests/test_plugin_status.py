"""A run that says what it is doing (pytester): a terminal line per long step, where pytest shows
its progress and not under ``-q``; a fuzz run's tallies as it goes and its results in the JSON
report."""

from __future__ import annotations

import json
import re

import pytest

from models import CLOSE_SUITE, TINY_SOURCE_CONFTEST

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded")]


@pytest.mark.inline_exports  # conftest.py: the status lines, not the export process, are the subject
def test_an_export_is_said_as_it_happens_and_quiet_under_q(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile(test_close=CLOSE_SUITE)
    args = ("--modelparity-formats=tflite", "--modelparity-cache-dir=cache", "-p", "no:cacheprovider")

    quiet = pytester.runpytest(*args, "-q")
    quiet.assert_outcomes(passed=1)
    assert "modelparity: exporting" not in quiet.stdout.str()

    # the -q run filled the cache: this one finds the export there and says so
    plain = pytester.runpytest(*args)
    plain.assert_outcomes(passed=1)
    lines = plain.stdout.lines
    said = [i for i, ln in enumerate(lines) if ln.startswith("modelparity: exporting tflite ...")]
    assert len(said) == 1, lines
    assert re.fullmatch(r"modelparity: exporting tflite \.\.\. \d+\.\d s, from the export cache, nothing exported",
                        lines[said[0]]), lines[said[0]]
    # pytest's progress line before it, and the test file's line again after it with the test's dot
    assert lines[said[0] - 1].startswith("test_close.py") and re.match(r"test_close\.py \.\s+\[100%\]",
                                                                     lines[said[0] + 1]), lines

    fresh = pytester.runpytest(*args, "--modelparity-no-cache", "-v")
    fresh.assert_outcomes(passed=1)
    line = next(ln for ln in fresh.stdout.lines if ln.startswith("modelparity: exporting tflite"))
    assert re.fullmatch(r"modelparity: exporting tflite \.\.\. \d+\.\d s", line), line
    fresh.stdout.fnmatch_lines(["modelparity: exporting tflite ...*", "test_close.py::test_close[[]tflite-cpu[]] PASSED*"])
    # the twin is built once per model, and said (the -q and cached runs read the floor cache)
    twin = [ln for ln in fresh.stdout.lines if ln.startswith("modelparity: measuring the model's own")]
    assert len(twin) == 1 and re.fullmatch(r"modelparity: measuring the model's own float64 noise \(building its "
                                           r"twin\) \.\.\. \d+\.\d s, by the Keras twin", twin[0]), fresh.stdout.lines
    assert not [ln for ln in plain.stdout.lines if "measuring the model's own" in ln]


def test_a_fuzz_run_says_where_it_stands_and_writes_its_results_in_the_report(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_modelparity.plugin import fuzz

    monkeypatch.setattr(fuzz, "PROGRESS_EVERY_S", 0.0)  # a tally after every model (30 s in use)
    report = pytester.path / "report.json"
    result = pytester.runpytest("--modelparity-fuzz=2", "--modelparity-formats=tflite", "--hypothesis-seed=3",
                                f"--modelparity-report={report}", "--modelparity-cache-dir=cache",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    text = result.stdout.str()
    for n in (1, 2):
        assert re.search(rf"^modelparity fuzz, so far: {n} model\(s\) in \d+ s; tflite \d+ \w+.*; \d+ distinct failure\(s\), "
                         rf"0 new$", text, re.M), text
    # the end-of-run summary is another line ("modelparity fuzz: 2 model(s) in ..."), read by scripts
    assert re.search(r"^modelparity fuzz: 2 model\(s\) in \d+ s$", text, re.M), text
    section = json.loads(report.read_text())["fuzz"]
    assert section["models"] == 2 and section["stopped_by_budget"] is False
    assert set(section["outcomes"]) == {"tflite"} and sum(section["outcomes"]["tflite"].values()) == 2
    for failure in section["failures"]:  # shrunk and written, each with its reproducer folder
        assert failure["format"] == "tflite" and failure["known"] and not failure["new"]
        assert (pytester.path / failure["reproducer"] / "repro.py").is_file()
    assert sum(r["models"] for r in section["refusals"]) <= section["outcomes"]["tflite"]["refused"]
