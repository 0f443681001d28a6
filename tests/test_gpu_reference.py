"""--modelparity-reference-device: the reference on one device, the candidates on another.

The question GPU users have ("does the GPU serving path match the CPU tests?") is
``--modelparity-device=gpu --modelparity-reference-device=cpu``. Without a GPU the same
split is proved with real placement on two devices: ``cpu`` with ``cpu`` (ids and reports
name both), and a second logical CPU (``cpu:1``) in a subprocess, since logical devices must
be configured before TensorFlow starts.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from models import TINY_SOURCE_CONFTEST
from pytest_modelparity import assert_outputs_close
from pytest_modelparity.formats.base import LoadedModel, TensorSpec

# inline_exports (conftest.py): no export worker; the process is not what these tests are about
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]

CONFTEST = TINY_SOURCE_CONFTEST

SUITE = textwrap.dedent('''
    from pytest_modelparity import assert_outputs_close

    def test_export(parity_candidate, parity_reference, parity_batch, modelparity_device,
                    modelparity_reference_device):
        assert parity_candidate.device == modelparity_device
        assert parity_reference.device == modelparity_reference_device
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)

    def test_reference_only(parity_reference, modelparity_reference_device):
        assert parity_reference.device == modelparity_reference_device
''')


def test_reference_on_cpu_candidates_on_cpu_name_both_devices(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_parity=SUITE)
    result = pytester.runpytest("-v", "--modelparity-device=cpu", "--modelparity-reference-device=cpu",
                                "--modelparity-formats=keras,saved_model", "--modelparity-report=r.json",
                                "--modelparity-html=r.html")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*test_export[[]keras-cpu-refcpu[]] PASSED*",
                                 "*test_export[[]saved_model-cpu-refcpu[]] PASSED*",
                                 "*test_reference_only[[]cpu-refcpu[]] PASSED*"])
    doc = json.loads((pytester.path / "r.json").read_text())
    assert doc["options"]["reference_device"] == "cpu"
    rows = [r for r in doc["rows"] if r["check"] == "outputs_close"]
    assert len(rows) == 2
    assert all(r["device"] == "cpu" and r["reference_device"] == "cpu" for r in rows)
    assert all(isinstance(r["output_scale"], float) and r["output_scale"] > 0 for r in rows)
    assert "test_export[keras-cpu-refcpu]" in (pytester.path / "r.html").read_text()


def test_without_the_option_ids_are_unchanged_and_rows_say_same_device(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_parity=SUITE)
    result = pytester.runpytest("-v", "--modelparity-formats=keras", "--modelparity-report=r.json")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_export[[]keras-cpu[]] PASSED*", "*test_reference_only[[]cpu[]] PASSED*"])
    doc = json.loads((pytester.path / "r.json").read_text())
    assert doc["options"]["reference_device"] is None
    assert all(r["reference_device"] == "cpu" for r in doc["rows"])


def test_zero_code_suite_runs_the_reference_on_its_device(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-v", "--modelparity-model=demo", "--modelparity-formats=saved_model",
                                "--modelparity-reference-device=cpu", "-k", "outputs_close",
                                "--modelparity-report=r.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_outputs_close[[]saved_model-cpu-refcpu[]] PASSED*"])
    rows = json.loads((pytester.path / "r.json").read_text())["rows"]
    assert rows and all(r["reference_device"] == "cpu" for r in rows)


@pytest.mark.parametrize("bad", ["tpu", "all", "cpu,gpu"])
def test_bad_reference_device_is_a_usage_error(pytester: pytest.Pytester, bad) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(f"--modelparity-reference-device={bad}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--modelparity-reference-device: *valid: cpu, gpu, gpu:N, or same*"])


def test_reference_on_another_device_really_runs_there(pytester: pytest.Pytester) -> None:
    """Two logical CPUs: candidates on cpu, the reference on cpu:1, and the ops placed so."""
    pytester.makeconftest(CONFTEST + textwrap.dedent('''
        def pytest_configure(config):
            import tensorflow as tf
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
    '''))
    pytester.makepyfile(test_parity=SUITE)
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider", "--modelparity-device=cpu",
                                           "--modelparity-reference-device=cpu:1", "--modelparity-formats=keras",
                                           "--modelparity-report=r.json")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_export[[]keras-cpu-refcpu:1[]] PASSED*"])
    rows = json.loads((pytester.path / "r.json").read_text())["rows"]
    assert {(r["device"], r["reference_device"]) for r in rows} == {("cpu", "cpu:1")}


class ArrayModel(LoadedModel):
    """A real ``LoadedModel`` whose arithmetic is numpy: only its device label matters here."""

    format = "onnx"

    def __init__(self, device: str, noise: float) -> None:
        super().__init__(device=device, inputs=[TensorSpec("x", (None, 8), np.dtype("float32"))],
                         outputs=[TensorSpec("y", (None, 8), np.dtype("float32"))])
        self.noise = noise

    def _predict(self, feeds):
        x = feeds["x"].astype(np.float32)
        return {"y": (x * 3 + 1) * np.float32(1 + self.noise)}


def test_cpu_reference_gpu_candidate_is_judged_by_the_gpu_rule():
    """TF32-sized noise (5e-4) on the GPU side passes; 1% fails; the rule says TF32."""
    x = {"x": np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)}
    report = assert_outputs_close(ArrayModel("gpu", 5e-4), ArrayModel("cpu", 0.0), inputs=x)
    assert "gpu (TF32 on)" in report.outputs[0].tolerance.source
    with pytest.raises(AssertionError):
        assert_outputs_close(ArrayModel("gpu", 1e-2), ArrayModel("cpu", 0.0), inputs=x)
    with pytest.raises(AssertionError):  # the same noise, both on the CPU: the CPU rule fails it
        assert_outputs_close(ArrayModel("cpu", 5e-4), ArrayModel("cpu", 0.0), inputs=x)
