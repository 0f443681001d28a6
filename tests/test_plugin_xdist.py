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


EXPORT_SUITE = textwrap.dedent('''
    import pytest

    @pytest.mark.parametrize("i", range(4))
    def test_runs(parity_candidate, parity_batch, i):
        assert parity_candidate.predict(parity_batch)
''')


def test_two_workers_on_a_cold_cache_export_each_format_once(pytester: pytest.Pytester) -> None:
    """The per-entry export lock: the worker that comes second waits for the first one's export
    and reuses it (cache_hit), where both used to convert and one threw its copy away. The lock
    is the two xdist workers' (real processes); each converts in its own process (inline), as
    an export worker of its own would only import TensorFlow twice more (issue 49)."""
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile(test_exports=EXPORT_SUITE)
    result = pytester.runpytest_subprocess(
        "--modelparity-formats=keras,saved_model,tflite", "--modelparity-cache-dir=cold-cache", "-n", "2",
        "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning", "--modelparity-export-process=inline",
        "--modelparity-report=xdist.json")
    result.assert_outcomes(passed=12)
    doc = json.loads((pytester.path / "xdist.json").read_text())
    by_format: dict[str, list[bool]] = {}
    for artifact in doc["artifacts"]:
        by_format.setdefault(artifact["format"], []).append(artifact["cache_hit"])
    assert sorted(by_format) == ["keras", "saved_model", "tflite"]
    for fmt, hits in by_format.items():
        assert hits.count(False) == 1, f"{fmt} was exported {hits.count(False)} times: {doc['artifacts']}"
    assert any(len(hits) == 2 for hits in by_format.values()), "no format was needed by both workers"
    entries = [p for p in (pytester.path / "cold-cache").glob("*/*") if (p / "meta.json").is_file()]
    assert len(entries) == 3 and not list((pytester.path / "cold-cache").glob("*/.*.lock"))  # no lock left


def test_two_popen_gateways_with_their_own_caches_give_the_serial_verdicts_in_one_report(
        pytester: pytest.Pytester) -> None:
    """Over ``--tx popen//env:...`` gateways whose caches and homes differ (nothing on a shared
    disk): the serial run's verdicts, every row in the controller's one JSON and HTML report,
    each worker exporting into its own cache. (``-n 2`` starts the same two popen workers on the
    one disk: the cold-cache test below runs it; one xdist run here carries every check, issue 49.)"""
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    # exports inline, and the serial run in this process (issue 49): what is compared is the
    # verdicts and rows of a serial and an xdist run, not the export worker or a fresh Python;
    # the two xdist workers stay real processes
    serial = pytester.runpytest("--modelparity-formats=keras,saved_model", "-p", "no:cacheprovider",
                                "-W", "ignore::DeprecationWarning", "--modelparity-export-process=inline",
                                "--modelparity-cache-dir=serial-cache", "--modelparity-report=serial.json")
    serial.assert_outcomes(passed=4, failed=4)
    args = []
    for i in (1, 2):
        (pytester.path / f"home{i}").mkdir()
        args += ["--tx", f"popen//env:MODELPARITY_CACHE_DIR={pytester.path / f'cache{i}'}"
                         f"//env:HOME={pytester.path / f'home{i}'}"]
    result = pytester.runpytest_subprocess(
        "--modelparity-formats=keras,saved_model", "--dist", "load", *args, "-p", "no:cacheprovider",
        "-W", "ignore::DeprecationWarning", "--modelparity-export-process=inline",
        "--modelparity-report=xdist.json", "--modelparity-html=xdist.html")
    result.assert_outcomes(passed=4, failed=4)
    doc = json.loads((pytester.path / "xdist.json").read_text())
    one = json.loads((pytester.path / "serial.json").read_text())
    assert doc["workers"] == 2 and len(doc["rows"]) == len(one["rows"]) == 8
    assert _verdicts(doc) == _verdicts(one)
    result.stdout.fnmatch_lines(["*= model parity summary =*", "*test_close[[]saved_model-cpu-1.01[]]*FAIL*"])
    html = (pytester.path / "xdist.html").read_text()
    for test in {r["nodeid"] for r in doc["rows"]}:
        assert test.split("::")[-1] in html
    for i in (1, 2):  # each gateway's worker exported what its tests needed into its own cache
        entries = [p for p in (pytester.path / f"cache{i}").glob("*/*") if (p / "meta.json").is_file()]
        assert entries, f"cache{i} holds no export"
    assert not (pytester.path / ".modelparity-cache").exists() or not [
        p for p in (pytester.path / ".modelparity-cache").glob("*/*") if (p / "meta.json").is_file()]
