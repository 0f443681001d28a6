"""Nothing compared is not green: a format the run was meant to check and did not ends the run
with a line that names it and why, the JSON report lists it, and --modelparity-strict fails
the session on it. A candidate that is the source's own file loaded again (a frozen ``.pb`` as
``graphdef``) is not a comparison: its comparison test skips saying so, and a run whose only
"passes" were such is NOTHING WAS COMPARED."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from models import TINY_SOURCE_CONFTEST
from tf1_graphs import NAMED_OUTPUT_OPTIONS, TWO_SINKS_CONFTEST

# inline_exports (conftest.py): no export worker; the process is not what these tests are about
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]

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
    result.stdout.fnmatch_lines(["modelparity: NOT COMPARED: graphdef for model * (the default matrix): compared with itself*"])
    for fmt in CONVERSIONS:
        result.stdout.fnmatch_lines([f"modelparity: NOT COMPARED: {fmt} for model * (the default matrix): cannot be made from "
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
    result.stdout.fnmatch_lines(["modelparity: NOT COMPARED: graphdef for model * (the default matrix): compared with itself*",
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
    result.stdout.fnmatch_lines(["modelparity: NOT COMPARED: tfjs for model * (--modelparity-formats): Node.js is not available; "
                                 "install it with: *"])
    assert "NOT COMPARED: keras" not in result.stdout.str()
    assert result.ret == pytest.ExitCode.OK  # the skip of a missing runtime stays a skip without strict
    (entry,) = json.loads((pytester.path / "r.json").read_text())["not_compared"]
    assert entry["format"] == "tfjs" and entry["named_by"] == "--modelparity-formats" and "Node.js" in entry["reason"]

    strict = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=tfjs,keras", "--modelparity-strict")
    strict.assert_outcomes(passed=1, errors=1)
    assert strict.ret == pytest.ExitCode.TESTS_FAILED
    strict.stdout.fnmatch_lines(["modelparity: NOT COMPARED: tfjs for model * (--modelparity-formats): Node.js is not available*",
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
    result.stdout.fnmatch_lines(["modelparity: NOT COMPARED: tfjs for model * (the marker's formats=): Node.js is not available*"])


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
    result.stdout.fnmatch_lines(["modelparity: NOT COMPARED: graphdef for model * (the default matrix): compared with itself*; "
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
    result.stdout.fnmatch_lines(["modelparity: NOT COMPARED: tfjs for model * (--modelparity-formats): Node.js is not available*"])
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


# Issue 50: a newcomer's text classifier (TextVectorization, masked Embedding, GRU) was red on the
# default matrix for formats it cannot become, each advising the other. Beside it in the same run
# a second model, whose check fails, and a test that names a format the classifier cannot have.
TEXT_CLASSIFIER = textwrap.dedent('''
    import numpy as np
    import pytest

    def text_classifier():
        import keras
        keras.utils.set_random_seed(0)
        vec = keras.layers.TextVectorization(max_tokens=20, output_sequence_length=6, name="vec")
        vec.adapt(np.array(["the cat sat", "a dog ran far", "the dog sat on the mat"]))
        text = keras.Input((1,), dtype="string", name="text")
        x = keras.layers.Embedding(20, 4, mask_zero=True, name="emb")(vec(text))
        x = keras.layers.GRU(4, name="gru")(x)
        return keras.Model(text, keras.layers.Dense(2, name="probs")(x), name="text_clf")

    @pytest.fixture(scope="session")
    def modelparity_source():
        return text_classifier
''')
EXPORT_TEST = textwrap.dedent('''
    import pytest
    from pytest_modelparity import assert_outputs_close

    def test_export(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)

    @pytest.mark.modelparity(formats=["h5"])
    def test_named_h5(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
''')
SCALED_TEST = textwrap.dedent('''
    import pytest
    from pytest_modelparity import assert_outputs_close

    @pytest.mark.modelparity(formats=["saved_model"])
    def test_scaled(parity_reference, parity_batch):
        expected = parity_reference.predict(parity_batch)
        assert_outputs_close({k: v * 1.001 for k, v in expected.items()}, expected)
''')


def test_a_text_classifier_on_the_default_matrix_is_compared_or_not_compared_never_red(
        pytester: pytest.Pytester, installed_node_modules: None) -> None:
    """The issue's acceptance, one child session: the text classifier errs on no format of the default
    matrix; each format is compared (keras, saved_model) or NOT COMPARED for the model's reason, with
    advice that names a format this run compared for that model; the format a test named (h5) is an
    error. The same run's HTML report is checked in tests/test_html_report.py's way: every row and NOT
    COMPARED line names its model, and it lays out within 1280 px in Chromium."""
    from pytest_modelparity import FORMATS

    pytester.mkpydir("text").joinpath("conftest.py").write_text(TEXT_CLASSIFIER)
    pytester.path.joinpath("text", "test_text.py").write_text(EXPORT_TEST.split("@pytest.mark")[0])
    pytester.path.joinpath("text", "test_named.py").write_text(
        EXPORT_TEST.split("def test_export")[0] + "@pytest.mark" + EXPORT_TEST.split("@pytest.mark")[1])
    pytester.mkpydir("tiny").joinpath("conftest.py").write_text(TINY_SOURCE_CONFTEST)
    pytester.path.joinpath("tiny", "test_tiny.py").write_text(SCALED_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", "--modelparity-export-process=inline",
                                "--modelparity-html=r.html", "--modelparity-report=r.json")
    out = result.stdout.str()
    unreachable = [f for f in ("h5", "graphdef", "tflite", "tfjs", "onnx") if f in FORMATS]
    result.assert_outcomes(passed=2, failed=1, errors=1, skipped=len(unreachable))
    # no test of the default matrix errs; the one that named h5 does, with the format's reason
    doc = json.loads((pytester.path / "r.json").read_text())
    outcomes = {t["nodeid"]: t["outcome"] for t in doc["tests"]}
    assert {o for n, o in outcomes.items() if n.startswith("text/test_text.py")} == {"passed", "skipped"}, outcomes
    assert outcomes["text/test_named.py::test_named_h5[h5-cpu]"] == "error"
    result.stdout.fnmatch_lines(["*ERROR at setup of test_named_h5[[]h5-cpu[]]*"])
    assert "the legacy HDF5 format cannot carry it" in out
    unchecked = {n["format"]: n for n in doc["not_compared"]}
    # h5 is the named test's error, said in full there (an error is not repeated as NOT COMPARED)
    assert sorted(unchecked) == sorted(f for f in unreachable if f != "h5"), unchecked
    for fmt, n in unchecked.items():
        # the model's reason, and advice naming only what worked for it here: never circular
        assert n["model"] == "text_clf (text_classifier)" and n["kind"] == "skipped", n
        assert "does not apply to this model" in n["reason"], n
        assert "compare this model through keras or saved_model (exported and compared for this model in this " \
               "session)" in n["reason"], n
        assert not re.search(r"through [^(]*\b(tflite|onnx|tfjs|graphdef)\b", n["reason"]), n
        result.stdout.fnmatch_lines([f"modelparity: NOT COMPARED: {fmt} for model 'text_clf (text_classifier)' "
                                     "(the*): does not apply to this model*"])
    if "tflite" in unchecked:  # the table and the loop named; no converter option advised (it ends in Flex)
        assert "lookup table" in unchecked["tflite"]["reason"] and "converter_options" not in unchecked["tflite"]["reason"]
    models = {t["nodeid"].split("/")[0]: t.get("model") for t in doc["tests"]}
    assert models == {"text": "text_clf (text_classifier)", "tiny": "tiny"}, models
    assert {r["model"] for r in doc["rows"]} == {"text_clf (text_classifier)", "tiny"}

    from test_html_report import laid_out_width

    page = (pytester.path / "r.html").read_text(encoding="utf-8")
    assert page.index('id="error"') < page.index('id="failed"') < page.index('id="skipped"')  # grouped
    # its rows (2), its error (1), its skips, its NOT COMPARED lines
    assert page.count('<span class="model">text_clf (text_classifier)</span>') == 2 + 1 + len(unreachable) * 2 - 1
    width = laid_out_width(page, pytester.path / "layout.html")
    assert width <= 1280, width
