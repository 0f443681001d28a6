"""``--modelparity-device=gpu`` on a machine without one: every GPU test skips, the run is
green, and the end of it must say plainly that nothing ran on a GPU (and must not claim that
the CPU-only formats' "cpu tests still run" when the CPU is not in the matrix)."""

from __future__ import annotations

import pytest

from models import TINY_SOURCE_CONFTEST
from pytest_modelparity.runtime import devices
from pytest_modelparity.plugin.matrix import left_out_line, nothing_on_gpu_line

# inline_exports (conftest.py): no export worker; the process is not what these tests are about
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]

PARITY_TEST = """
    from pytest_modelparity import assert_outputs_close

    def test_export(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
"""


def _run_without_a_gpu(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    if devices.missing_gpu("gpu") is None:
        pytest.skip("this machine has a GPU: the GPU tests would run here")
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile(PARITY_TEST)
    return pytester.runpytest(*args)


def test_a_gpu_run_without_a_gpu_ends_saying_nothing_ran_on_a_gpu(pytester: pytest.Pytester) -> None:
    result = _run_without_a_gpu(pytester, "--modelparity-device=gpu", "--modelparity-formats=keras,saved_model,tflite")
    result.assert_outcomes(skipped=2)
    assert result.ret == 0
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["modelparity: NOTHING RAN ON A GPU: all 2 gpu test(s) were skipped (*TensorFlow sees "
                                 "no GPU*); no parity test ran at all"])
    assert "their cpu tests still run" not in out
    result.stdout.fnmatch_lines(["modelparity: left out of the matrix: tflite on gpu (they run on the CPU only; the CPU "
                                 "is not in this run's matrix, so they ran nowhere*"])


def test_with_the_cpu_in_the_matrix_the_line_counts_what_ran_there(pytester: pytest.Pytester) -> None:
    result = _run_without_a_gpu(pytester, "--modelparity-device=cpu,gpu", "--modelparity-formats=keras")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["modelparity: NOTHING RAN ON A GPU: all 1 gpu test(s) were skipped*; "
                                 "1 test(s) ran on the CPU"])


def test_the_lines_themselves():
    assert nothing_on_gpu_line({"t[keras-cpu]": ("cpu", "passed", None)}) is None
    assert nothing_on_gpu_line({"t[keras-gpu]": ("gpu", "passed", None),
                                "u[keras-gpu]": ("gpu", "skipped", "no GPU")}) is None  # one ran there
    line = nothing_on_gpu_line({"t[onnx-gpu:1]": ("gpu:1", "skipped", "Skipped: no GPU")})
    assert line == "modelparity: NOTHING RAN ON A GPU: all 1 gpu test(s) were skipped (no GPU); no parity test ran at all"
    assert "their cpu tests still run" in left_out_line([["tfjs", "gpu"]])
    assert "ran nowhere" in left_out_line([["tfjs", "gpu"]], cpu_in_matrix=False)
