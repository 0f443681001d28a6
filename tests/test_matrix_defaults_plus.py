"""The defaults plus one variant (``default,tflite:int8`` / ``+tflite:int8``) or minus one
(``-tfjs``), on the command line, the ini key and the marker, without spelling out the defaults."""

from __future__ import annotations

import pytest

from pytest_modelparity.plugin.matrix import exportable
from pytest_modelparity.plugin.options import apply_format_words, parse_format_spec

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker


def _defaults() -> list[str]:
    return [f for f in parse_format_spec(None).formats if exportable(f)]


def _ids(result: pytest.RunResult) -> list[str]:
    return [line.split("[", 1)[1].rstrip("]") for line in result.stdout.lines if "::test_export[" in line]


@pytest.mark.parametrize("text", ["default,tflite:int8", "+tflite:int8", "Default, +TFLite:int8"])
def test_default_plus_a_variant_is_the_defaults_and_the_variant(text: str) -> None:
    spec = parse_format_spec(text)
    assert not spec.explicit and spec.added == ("tflite:int8",) and spec.removed == ()
    assert list(spec.formats) == [*parse_format_spec(None).formats, "tflite:int8"]


def test_minus_removes_and_a_plain_list_stays_exactly_that() -> None:
    spec = parse_format_spec("-tfjs,+onnx")
    assert "tfjs" not in spec.formats and spec.removed == ("tfjs",) and spec.added == ("onnx",)
    assert parse_format_spec("tflite,onnx").formats == ("tflite", "onnx")
    assert parse_format_spec("tflite,onnx").explicit
    # a relative marker works on whatever the run's matrix is
    assert apply_format_words(["+tflite:int8", "-onnx"], ["keras", "onnx"]).formats == ("keras", "tflite:int8")


@pytest.mark.parametrize("option", ["--modelparity-formats=default,tflite:int8", "--modelparity-formats=+tflite:int8"])
def test_command_line_collects_every_default_and_the_variant(pytester: pytest.Pytester, option: str) -> None:
    pytester.makepyfile("def test_export(modelparity_format, modelparity_device): pass")
    result = pytester.runpytest("--collect-only", "-q", option)
    assert _ids(result) == [f"{f}-cpu" for f in (*_defaults(), "tflite:int8")]


def test_ini_key_takes_the_same_words_and_minus_drops_one(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmodelparity_formats = default, tflite:int8, -saved_model\n")
    pytester.makepyfile("def test_export(modelparity_format, modelparity_device): pass")
    result = pytester.runpytest("--collect-only", "-q")
    assert _ids(result) == [f"{f}-cpu" for f in _defaults() if f != "saved_model"] + ["tflite:int8-cpu"]


def test_marker_adds_a_variant_to_the_runs_matrix(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.modelparity(formats=["+tflite:int8"])
        def test_export(modelparity_format, modelparity_device): pass
    """)
    result = pytester.runpytest("--collect-only", "-q", "--modelparity-formats=keras,tflite")
    assert _ids(result) == ["keras-cpu", "tflite-cpu", "tflite:int8-cpu"]
    result = pytester.runpytest("--collect-only", "-q")
    assert _ids(result) == [f"{f}-cpu" for f in (*_defaults(), "tflite:int8")]


@pytest.mark.parametrize("option, bad", [("--modelparity-formats=default,+tflte:int8", "'tflte:int8' (did you mean 'tflite:int8'?)"),
                                         ("--modelparity-formats=defualt,tflite", "'defualt' (did you mean 'default'?)")])
def test_unknown_words_still_say_did_you_mean(pytester: pytest.Pytester, option: str, bad: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--modelparity-formats: unknown format(s) {bad}; valid formats: *'+NAME'*"])


def test_a_marker_with_a_misspelt_addition_fails_naming_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.modelparity(formats="default,onxx")
        def test_export(modelparity_format): pass
    """)
    result = pytester.runpytest()
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*test_export*formats=...*unknown format(s) 'onxx' (did you mean 'onnx'?)*"])
