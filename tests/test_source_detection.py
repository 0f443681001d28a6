"""A source path whose format is not detected, in a suite (issue 24): the error is said once, with
a fix a suite can follow, and that fix (``modelparity_load_options`` naming the format) works."""

from __future__ import annotations

import textwrap

import pytest

from models import mlp

# inline_exports (conftest.py): no export worker; the process is not what these tests are about
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]

SUITE = textwrap.dedent('''
    from pytest_modelparity import assert_outputs_close

    def test_parity(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
''')


def _conftest(source: str, load_options: str | None = None) -> str:
    text = f"import pytest\n\n@pytest.fixture(scope='session')\ndef modelparity_source():\n    return {source!r}\n"
    if load_options is not None:
        text += f"\n@pytest.fixture(scope='session')\ndef modelparity_load_options():\n    return {load_options}\n"
    return text


def test_an_undetected_source_is_said_once_with_a_fix_a_suite_can_follow(pytester: pytest.Pytester) -> None:
    (pytester.path / "not_a_model").mkdir()
    (pytester.path / "not_a_model" / "weights.bin").write_bytes(b"\0" * 16)
    pytester.makeconftest(_conftest("not_a_model"))
    pytester.makepyfile(test_parity=SUITE)
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=keras,saved_model,tflite,onnx")
    # the errors section (the short summary repeats each error's first line, in full under CI=true)
    out = result.stdout.str().split("short test summary info")[0]
    result.assert_outcomes(errors=4)
    assert out.count("the format could not be detected") == 1, out
    assert out.count("the source could not be resolved (the full error and its fix are on the first test") == 3, out
    assert "pass format=... explicitly" not in out   # a suite has no call to pass it to
    assert "def modelparity_load_options():" in out and "return {'format': 'saved_model'}" in out


def test_naming_the_format_in_load_options_loads_an_undetected_file(pytester: pytest.Pytester, tmp_path) -> None:
    from pytest_modelparity import export_model

    tflite = export_model(mlp(), "tflite", tmp_path / "model.tflite")
    blob = pytester.path / "model.bin"                  # a TFLite file without its suffix
    blob.write_bytes(tflite.read_bytes())
    pytester.makeconftest(_conftest("model.bin"))
    pytester.makepyfile(test_parity=SUITE)
    pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=tflite").assert_outcomes(errors=1)

    pytester.makeconftest(_conftest("model.bin", "{'format': 'tflite'}"))
    pytester.makepyfile(test_loads="def test_loads(parity_candidate, parity_batch):\n"
                                   "    assert parity_candidate.format == 'tflite'\n"
                                   "    parity_candidate.predict(parity_batch)\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=tflite", "-v", "-rs")
    # loaded as tflite, as candidate and reference; comparing the file with itself is skipped
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*test_parity.py*format 'tflite' on cpu compared with itself*"])
    assert blob.read_bytes() == tflite.read_bytes()     # loaded as is, never rewritten


def test_an_unknown_format_in_load_options_is_named(pytester: pytest.Pytester, tmp_path) -> None:
    pytester.makeconftest(_conftest("model.bin", "{'format': 'tflight'}"))
    (pytester.path / "model.bin").write_bytes(b"\0" * 16)
    pytester.makepyfile(test_parity=SUITE)
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=tflite")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*unknown format 'tflight' in modelparity_load_options*", "*fix: use one of: keras*"])
