"""The format x device matrix on a machine with a GPU: CPU-only formats (TFLite, TFJS) are
left out on a GPU with one summary line, never an error, with or without
--modelparity-strict; strict still fails a GPU that is asked for and missing, once.

The GPU is stubbed at the environment boundary (``devices.available_devices`` and
``devices.missing_gpu``, what TensorFlow and onnxruntime report); the tests below never load
a model on it, so no runtime is faked.
"""

from __future__ import annotations

import pytest

from pytest_modelparity.runtime import devices

# inline_exports (conftest.py): no export worker; the process is not what these tests are about
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]

MATRIX_TESTS = """
    def test_export(modelparity_format, modelparity_device):
        assert modelparity_device == "cpu" or modelparity_format.partition(":")[0] not in ("tflite", "tfjs")

    def test_ref(modelparity_device):
        pass
"""
FORMATS = "--modelparity-formats=keras,tflite,tflite:int8,tfjs,onnx"
LEFT_OUT = "modelparity: left out of the matrix: tflite, tflite:int8, tfjs on gpu (they run on the CPU only*"


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as TensorFlow would see it with one GPU."""
    monkeypatch.setattr(devices, "available_devices", lambda: ("cpu", "gpu"))
    monkeypatch.setattr(devices, "missing_gpu", lambda device="gpu": None)


@pytest.mark.parametrize("strict", [False, True], ids=["lenient", "strict"])
def test_cpu_only_formats_are_left_out_on_a_gpu(pytester: pytest.Pytester, one_gpu, strict) -> None:
    pytester.makepyfile(MATRIX_TESTS)
    args = ["-v", "--modelparity-device=all", FORMATS] + (["--modelparity-strict"] if strict else [])
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=9)
    assert result.ret == 0
    out = result.stdout.str()
    for fmt in ("keras", "onnx"):
        assert f"test_export[{fmt}-cpu] PASSED" in out and f"test_export[{fmt}-gpu] PASSED" in out
    for fmt in ("tflite", "tflite:int8", "tfjs"):
        assert f"test_export[{fmt}-cpu] PASSED" in out and f"[{fmt}-gpu]" not in out
    assert "test_ref[gpu] PASSED" in out
    result.stdout.fnmatch_lines([LEFT_OUT])
    assert out.count("left out of the matrix") == 1


def test_a_test_whose_whole_matrix_is_cpu_only_formats_on_a_gpu_skips_saying_why(
        pytester: pytest.Pytester, one_gpu) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.modelparity(formats=["tflite", "tfjs"], devices=["gpu"])
        def test_mobile(modelparity_format, modelparity_device):
            raise AssertionError("never runs")
    """)
    result = pytester.runpytest("-rs", "--modelparity-device=gpu", "--modelparity-strict")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*tflite, tfjs run on the CPU only; none of this test's formats runs on gpu*"])


def test_zero_code_suite_leaves_them_out_too(pytester: pytest.Pytester, one_gpu) -> None:
    result = pytester.runpytest("--collect-only", "-q", "--modelparity-model=demo", "--modelparity-device=all",
                                "--modelparity-formats=keras,tflite", "--modelparity-strict")
    out = result.stdout.str()
    assert "test_outputs_close[keras-gpu]" in out and "test_outputs_close[tflite-cpu]" in out
    assert "tflite-gpu" not in out
    result.stdout.fnmatch_lines(["modelparity: left out of the matrix: tflite on gpu (they run on the CPU only*"])


def test_runs_on():
    assert devices.runs_on("onnx", "gpu:1") and devices.runs_on("tflite", "cpu")
    assert not devices.runs_on("tflite:int8", "gpu") and not devices.runs_on("tfjs", "gpu:0")


# -- a GPU asked for and missing (this machine) ------------------------------------------

def _no_gpu_here() -> None:
    if devices.missing_gpu("gpu") is None:
        pytest.skip("this machine has a GPU; the missing-GPU failure cannot be provoked here")


@pytest.mark.parametrize("device", ["gpu", "all", "cpu,gpu:1"])
def test_strict_fails_a_missing_gpu_once_with_one_message(pytester: pytest.Pytester, device) -> None:
    _no_gpu_here()
    pytester.makepyfile(MATRIX_TESTS)
    result = pytester.runpytest(f"--modelparity-device={device}", "--modelparity-strict", FORMATS)
    # Refused before collection, like an option this machine cannot honour: one line, no test run.
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stdout.str() + result.stderr.str()
    assert text.count("is not on this machine") == 1, text
    assert "--modelparity-strict" in text and "TensorFlow sees no GPU" in text
    assert "passed" not in text and "failed" not in text


def test_without_strict_a_missing_gpu_is_not_an_error(pytester: pytest.Pytester) -> None:
    """Without strict ``all`` is the devices TensorFlow sees (the CPU here); ``gpu`` asked
    explicitly stays in the matrix and its model-loading tests skip with the reason."""
    _no_gpu_here()
    pytester.makepyfile(MATRIX_TESTS)
    result = pytester.runpytest("--modelparity-device=all", FORMATS, "-q")
    result.assert_outcomes(passed=6)
    assert "left out of the matrix" not in result.stdout.str()
