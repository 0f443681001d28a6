"""Nothing compared is not green: a format the run was meant to check and did not ends the run
with a line that names it and why, the JSON report lists it, and --modelparity-strict fails
the session on it. A candidate that is the source's own file loaded again (a frozen ``.pb`` as
``graphdef``) is not a comparison: its comparison test skips saying so, and a run whose only
"passes" were such is NOTHING WAS COMPARED."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from models import TINY_SOURCE_CONFTEST
from tf1_graphs import NAMED_OUTPUT_OPTIONS, TWO_SINKS_CONFTEST

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded")]

# A frozen graph with two sinks, its output named in modelparity_load_options: the load options
# reach tflite, onnx and tfjs (compared), keras/h5/saved_model cannot be made from a .pb, and the
# .pb as its own graphdef candidate is the file compared with itself.
TWO_SINKS_SOURCE = TWO_SINKS_CONFTEST + NAMED_OUTPUT_OPTIONS

COMPARE_AND_DETERMINISM = textwrap.dedent('''
    from pytest_modelparity import assert_deterministic, assert_outputs_close

    def test_export(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)

    def test_deterministic(parity_candidate, parity_batch):
        assert_deterministic(parity_candidate, parity_batch, runs=2)
''')

CONVERSIONS = ("keras", "h5", "saved_model")  # what a .pb cannot become
COMPARED = ("tflite", "onnx", "tfjs")


@pytest.fixture
def frozen_suite(pytester: pytest.Pytester, installed_node_modules: None) -> pytest.Pytester:
    pytester.makeconftest(TWO_SINKS_SOURCE)
    pytester.makepyfile(test_graph=COMPARE_AND_DETERMINISM)
    return pytester


def test_a_frozen_graph_compared_with_itself_is_named_beside_its_conversions(frozen_suite: pytest.Pytester) -> None:
    result = frozen_suite.runpytest("-p", "no:cacheprovider", "-rs", "--modelparity-report=r.json",
                                    "--modelparity-export-process=inline")
    out = result.stdout.str()
    # the .pb's comparison with itself skips; its conversions compare and pass; the file's own
    # determinism check runs with theirs
    result.assert_outcomes(passed=7, skipped=7)
    result.stdout.fnmatch_lines(["SKIPPED*test_graph.py:*format 'graphdef' on cpu compared with itself: the candidate "
                                 "is the source's own file (*frozen.pb) loaded a second time*"])
    assert result.ret == pytest.ExitCode.OK, out
    result.stdout.fnmatch_lines(["modelparity: NOT COMPARED: graphdef (the default matrix): compared with itself*"])
    for fmt in CONVERSIONS:
        result.stdout.fnmatch_lines([f"modelparity: NOT COMPARED: {fmt} (the default matrix): cannot be made from "
                                     "this source (*"])
    assert "NOTHING WAS COMPARED" not in out and "load options do not reach" not in out
    doc = json.loads((frozen_suite.path / "r.json").read_text())
    listed = {n["format"]: n for n in doc["not_compared"]}
    assert set(listed) == {"graphdef", *CONVERSIONS}
    assert listed["graphdef"]["kind"] == "compared_with_itself"
    assert listed["keras"]["kind"] == "skipped"
    assert all(n["named_by"] == "the default matrix" for n in listed.values())
    compared = {r["format"] for r in doc["rows"] if r["check"] == "outputs_close"}
    assert compared == set(COMPARED), doc["rows"]


def test_strict_fails_the_frozen_graph_run_with_the_lines(frozen_suite: pytest.Pytester) -> None:
    result = frozen_suite.runpytest("-p", "no:cacheprovider", "--modelparity-strict", "-k", "export",
                                    "--modelparity-export-process=inline")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["modelparity: NOT COMPARED: graphdef (the default matrix): compared with itself*",
                                 "modelparity: --modelparity-strict: 4 format(s) not compared fail this session*"])


def test_a_named_format_whose_runtime_is_missing_ends_the_run_saying_so(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-path"  # a machine without Node.js: no tfjs runtime
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile("def test_export(parity_candidate): pass")
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=tfjs,keras",
                                "--modelparity-report=r.json")
    result.assert_outcomes(passed=1, skipped=1)  # what the issue saw: green, the reason only under -rs
    result.stdout.fnmatch_lines(["modelparity: NOT COMPARED: tfjs (--modelparity-formats): Node.js is not available; "
                                 "install it with: *"])
    assert "NOT COMPARED: keras" not in result.stdout.str()
    assert result.ret == pytest.ExitCode.OK  # the skip of a missing runtime stays a skip without strict
    (entry,) = json.loads((pytester.path / "r.json").read_text())["not_compared"]
    assert entry["format"] == "tfjs" and entry["named_by"] == "--modelparity-formats" and "Node.js" in entry["reason"]

    strict = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=tfjs,keras", "--modelparity-strict")
    strict.assert_outcomes(passed=1, errors=1)
    assert strict.ret == pytest.ExitCode.TESTS_FAILED
    strict.stdout.fnmatch_lines(["modelparity: NOT COMPARED: tfjs (--modelparity-formats): Node.js is not available*",
                                 "modelparity: --modelparity-strict: 1 format(s) not compared fail this session*"])


def test_the_marker_names_formats_too(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                      tmp_path: Path) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile(textwrap.dedent('''
        import pytest

        @pytest.mark.modelparity(formats=["tfjs", "keras"])
        def test_export(parity_candidate):
            pass
    '''))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["modelparity: NOT COMPARED: tfjs (the marker's formats=): Node.js is not available*"])


def test_a_run_where_every_named_format_ran_prints_no_such_line(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile(COMPARE_AND_DETERMINISM)
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=keras,saved_model",
                                "--modelparity-strict", "--modelparity-report=r.json")
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.OK
    out = result.stdout.str()
    assert "NOT COMPARED" not in out and "NOTHING WAS COMPARED" not in out
    assert json.loads((pytester.path / "r.json").read_text())["not_compared"] == []


def test_the_same_file_on_another_device_is_a_comparison() -> None:
    """A candidate is the source itself only on the reference's device: the same file on a GPU
    against a CPU reference (--modelparity-reference-device=cpu) is a real comparison."""
    from pytest_modelparity.plugin.matrix import nothing_compared_line, only_itself_compared
    from pytest_modelparity.plugin.not_compared import not_compared

    class Options:
        formats_explicit = True
        formats = ("graphdef", "tflite")

    unreachable = "Skipped: modelparity: format 'tflite' cannot be made from this source (cannot convert 'f.pb': x)"
    itself = {"t[graphdef-cpu]": {"format": "graphdef", "device": "cpu", "outcome": "passed", "reason": None,
                                  "named_by": "--modelparity-formats", "itself": "/m/f.pb"},
              "t[tflite-cpu]": {"format": "tflite", "device": "cpu", "outcome": "skipped", "reason": unreachable,
                                "named_by": "--modelparity-formats", "itself": None}}
    assert only_itself_compared(itself) and nothing_compared_line({}, itself) is not None
    assert [n.format for n in not_compared(itself, Options())] == ["graphdef", "tflite"]
    across = dict(itself, **{"t[graphdef-gpu]": {"format": "graphdef", "device": "gpu", "outcome": "passed",
                                                 "reason": None, "named_by": "--modelparity-formats", "itself": None}})
    assert not only_itself_compared(across) and nothing_compared_line({}, across) is None
    assert [n.format for n in not_compared(across, Options())] == ["tflite"]
    missing = dict(itself, **{"t[onnx-cpu]": {"format": "onnx", "device": "cpu", "outcome": "skipped",
                                              "reason": "Skipped: onnxruntime is not available", "named_by": None,
                                              "itself": None}})
    assert not only_itself_compared(missing)  # a missing runtime: its own line, the run kept as it was


def test_zero_code_skips_only_the_comparison_of_the_file_with_itself(pytester: pytest.Pytester) -> None:
    """--modelparity-model=frozen.pb: its graphdef form is the file itself, so test_outputs_close
    skips while the checks of the file alone (determinism, batch invariance) run; with nothing
    else selected the run compared nothing."""
    import tf1_graphs

    tf1_graphs.freeze(pytester.path, dropout=False)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", "--modelparity-model=frozen.pb", "-k", "graphdef")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["modelparity: NOT COMPARED: graphdef (the default matrix): compared with itself*; "
                                 "2 test(s) of that file alone ran",
                                 "modelparity: NOTHING WAS COMPARED*"])
    result.stdout.fnmatch_lines(["SKIPPED*format 'graphdef' on cpu compared with itself*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_under_xdist_the_controller_names_what_the_workers_did_not_compare(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("xdist", reason="pip install pytest-xdist")
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile("def test_export(parity_candidate): pass")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--modelparity-formats=tfjs,keras",
                                           "--modelparity-report=r.json", timeout=300)
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["modelparity: NOT COMPARED: tfjs (--modelparity-formats): Node.js is not available*"])
    assert [n["format"] for n in json.loads((pytester.path / "r.json").read_text())["not_compared"]] == ["tfjs"]


def test_a_default_matrix_format_whose_runtime_is_missing_is_named_though_it_had_no_test(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-path"  # without Node.js the default matrix holds no tfjs test at all
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile("def test_export(parity_candidate): pass")
    result = pytester.runpytest("-p", "no:cacheprovider", "-k", "keras", "--modelparity-report=r.json")
    result.assert_outcomes(passed=1)
    assert "tfjs" not in " ".join(t for t in result.stdout.lines if "::" in t)
    result.stdout.fnmatch_lines(["modelparity: NOT COMPARED: tfjs (the default matrix): not in the matrix: Node.js is "
                                 "not available; install it with: *"])
    assert result.ret == pytest.ExitCode.OK
    (entry,) = json.loads((pytester.path / "r.json").read_text())["not_compared"]
    assert entry["kind"] == "not_in_matrix" and entry["format"] == "tfjs"
    strict = pytester.runpytest("-p", "no:cacheprovider", "-k", "keras", "--modelparity-strict")
    assert strict.ret == pytest.ExitCode.TESTS_FAILED
    strict.stdout.fnmatch_lines(["modelparity: --modelparity-strict: 1 format(s) not compared fail this session*"])
