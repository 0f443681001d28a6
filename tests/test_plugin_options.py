"""Options, ini keys and usage errors of the plugin (pytester, in process unless noted)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from pytest_modelparity.formats import ALL_FORMATS

# inline_exports (conftest.py): no export worker; the process is not what these tests are about
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]


def test_help_shows_the_group_without_importing_tensorflow(pytester: pytest.Pytester) -> None:
    code = textwrap.dedent("""
        import contextlib, io, sys, pytest
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            pytest.main(["--help"])
        heavy = [m for m in ("tensorflow", "keras", "onnxruntime", "ai_edge_litert") if m in sys.modules]
        print("HEAVY", heavy)
        print(out.getvalue())
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=pytester.path,
                            timeout=120)
    assert "HEAVY []" in result.stdout, result.stdout[:500] + result.stderr[-2000:]
    assert "model parity (pytest-modelparity)" in result.stdout
    for option in ("--modelparity-device", "--modelparity-formats", "--modelparity-report", "--modelparity-html",
                   "--modelparity-cache-dir", "--modelparity-no-cache", "--modelparity-strict",
                   "--modelparity-model", "--modelparity-tf32", "--modelparity-reference-device"):
        assert option in result.stdout
    for ini in ("modelparity_device", "modelparity_formats", "modelparity_report", "modelparity_html",
                "modelparity_cache_dir", "modelparity_no_cache", "modelparity_strict", "modelparity_model",
                "modelparity_rtol", "modelparity_atol", "modelparity_tf32", "modelparity_reference_device"):
        assert ini in result.stdout


def test_unknown_format_is_a_usage_error_listing_the_valid_ones(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--modelparity-formats=saved_model,tensorrt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*unknown format(s) 'tensorrt'; valid formats: {', '.join(ALL_FORMATS)}*"])


def test_unknown_device_is_a_usage_error_listing_the_valid_ones(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--modelparity-device=tpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown device 'tpu'; valid: cpu, gpu, all*"])


def test_format_and_device_names_are_case_insensitive(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_export(modelparity_format, modelparity_device): pass")
    result = pytester.runpytest("--collect-only", "-q", "--modelparity-formats=TFLite,Saved-Model",
                                "--modelparity-device=CPU")
    result.stdout.fnmatch_lines(["*test_export[[]tflite-cpu[]]", "*test_export[[]saved_model-cpu[]]"])


def test_a_near_miss_format_or_device_says_did_you_mean(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--modelparity-formats=tflight")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown format(s) 'tflight' (did you mean 'tflite'?); valid formats:*"])
    result = pytester.runpytest("--modelparity-device=cpux")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown device 'cpux' (did you mean 'cpu'?); valid: cpu, gpu, all*"])


@pytest.mark.parametrize("key, raw, problem", [
    ("modelparity_rtol", "tight", "is not a number"),
    ("modelparity_rtol", "nan", "must be a finite number >= 0"),   # used to fail every test instead
    ("modelparity_atol", "inf", "must be a finite number >= 0"),
    ("modelparity_atol", "-1", "must be a finite number >= 0"),
])
def test_bad_ini_tolerance_is_a_usage_error(pytester: pytest.Pytester, key: str, raw: str, problem: str) -> None:
    pytester.makeini(f"[pytest]\n{key} = {raw}\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{key}='{raw}' from the ini file {problem}*"])
    assert "passed" not in result.stdout.str()


def test_ini_selects_the_matrix_and_the_command_line_wins(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmodelparity_formats = saved_model, tflite\nmodelparity_device = cpu\n")
    pytester.makepyfile("def test_export(modelparity_format, modelparity_device): pass")
    result = pytester.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines(["*test_export[[]saved_model-cpu[]]", "*test_export[[]tflite-cpu[]]"])
    result = pytester.runpytest("--collect-only", "-q", "--modelparity-formats=onnx")
    result.stdout.fnmatch_lines(["*test_export[[]onnx-cpu[]]", "1 test collected*"])


def test_marker_with_an_unknown_format_names_the_test_and_the_valid_ones(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest
        @pytest.mark.modelparity(formats=["tflight"])
        def test_export(modelparity_format): pass
    """)
    result = pytester.runpytest()
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*test_export*formats=...*unknown format(s) 'tflight' (did you mean 'tflite'?); valid formats: keras, *"])


def test_marker_is_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.modelparity(formats=None, devices=None, rtol=None, atol=None, quant_budget=None, "
                                 "class_scores=None, top_k=1)*"])


def test_device_all_expands_to_the_devices_tensorflow_sees(pytester: pytest.Pytester) -> None:
    import tensorflow as tf  # imported by the test process already: in-process runs keep it

    pytester.makepyfile("def test_ref(modelparity_device): pass")
    result = pytester.runpytest("--collect-only", "-q", "--modelparity-device=all")
    gpus = tf.config.list_physical_devices("GPU")
    expected = ["*test_ref[[]cpu[]]"] + ["*test_ref[[]gpu*" for _ in gpus[:1]]
    result.stdout.fnmatch_lines(expected + [f"{1 + len(gpus)} test* collected*"])


def test_a_report_path_that_is_a_directory_is_a_usage_error_at_start_up(pytester: pytest.Pytester) -> None:
    """It used to be an INTERNALERROR after every test had passed, leaving a .tmp file behind."""
    pytester.makepyfile("def test_x(): pass")
    target = pytester.mkdir("out")
    for option in ("--modelparity-report", "--modelparity-html"):
        result = pytester.runpytest(f"{option}={target}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"*{option}={target} is a directory; pass a file path such as*"])
        assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
        assert list(target.iterdir()) == [] and not list(pytester.path.glob(".*.tmp"))


def test_a_report_under_a_file_is_a_usage_error_at_start_up(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    (pytester.path / "afile").write_text("x")
    result = pytester.runpytest("--modelparity-report=afile/sub/r.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*afile is not a directory, so the report cannot be written there*"])


def test_a_report_in_a_missing_directory_is_created(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--modelparity-report=new/dir/r.json", "--modelparity-html=new/r.html")
    assert result.ret == 0
    assert (pytester.path / "new/dir/r.json").is_file() and (pytester.path / "new/r.html").is_file()
    assert not list(pytester.path.rglob("*.tmp"))


def test_a_failed_report_write_leaves_no_temp_file(tmp_path) -> None:
    from pytest_modelparity.reports.html import write_html
    from pytest_modelparity.reports.summary import write_json

    (tmp_path / "r.json").mkdir()          # the rename into place fails after the temp file was written
    (tmp_path / "r.json" / "keep").write_text("x")
    with pytest.raises(OSError):
        write_json(tmp_path / "r.json", {"x": 1})
    (tmp_path / "r.html").mkdir()
    (tmp_path / "r.html" / "keep").write_text("x")
    with pytest.raises(OSError):
        write_html(tmp_path / "r.html", {"rows": [], "tests": [], "artifacts": []})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "r.json"]


def test_a_cache_dir_that_is_a_file_is_one_usage_error_at_start_up(pytester: pytest.Pytester, monkeypatch) -> None:
    pytester.makepyfile("def test_x(): pass")
    (pytester.path / "cachefile").write_text("x")
    result = pytester.runpytest("--modelparity-cache-dir=cachefile")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--modelparity-cache-dir=*cachefile is a file; pass a directory*"])
    monkeypatch.setenv("MODELPARITY_CACHE_DIR", str(pytester.path / "cachefile" / "sub"))
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*MODELPARITY_CACHE_DIR=*sub is inside *cachefile, which is not a directory*"])
    # --modelparity-no-cache never uses it: no reason to refuse the run.
    assert pytester.runpytest("--modelparity-no-cache").ret == 0


def test_a_report_write_that_fails_at_the_end_is_one_error_line_not_a_traceback(pytester: pytest.Pytester) -> None:
    """The path was fine at start-up; the test then puts a directory where the report goes
    (as a full disk or a vanished mount would fail the write)."""
    pytester.makepyfile("""
        import os
        def test_x():
            os.makedirs("r.json/blocked")
    """)
    result = pytester.runpytest("--modelparity-report=r.json")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR, out
    result.stdout.fnmatch_lines(["*modelparity: ERROR --modelparity-report: could not write *r.json (*Error*"])
    assert "Traceback" not in out and "INTERNALERROR" not in out
    assert not list(pytester.path.rglob("*.tmp"))
