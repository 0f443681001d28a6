"""bench/gpu_check.py on this machine: it lists the devices, says clearly that no GPU is
present, and its suite path (pytest with the GPU options, the JSON report, the error table)
works when pointed at the CPU (``--device cpu --run-anyway``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from models import TINY_SOURCE_CONFTEST
from pytest_modelparity.runtime import devices

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench" / "gpu_check.py"


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=timeout)


@pytest.fixture(scope="module")
def no_gpu() -> None:
    if devices.missing_gpu("gpu") is None:
        pytest.skip("this machine has a GPU: bench/gpu_check.py runs the suites on it instead")


def test_without_a_gpu_it_lists_the_devices_and_says_so(no_gpu) -> None:
    done = run()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "TensorFlow 2." in done.stdout and "onnxruntime" in done.stdout
    assert "NO GPU PRESENT: TensorFlow sees no GPU" in done.stdout
    assert "onnxruntime has no CUDAExecutionProvider" in done.stdout
    assert "== TF32" not in done.stdout  # nothing was run
    assert run("--require-gpu").returncode == 2


def test_the_suite_path_on_the_cpu_prints_each_forms_error(no_gpu, tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(TINY_SOURCE_CONFTEST)
    (tmp_path / "test_tiny.py").write_text(textwrap.dedent('''
        from pytest_modelparity import assert_outputs_close

        def test_close(parity_candidate, parity_reference, parity_batch):
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
    '''))
    done = run("--device", "cpu", "--run-anyway", "--tf32", "off", "--suites", str(tmp_path), "--",
               "--modelparity-formats=keras,saved_model", f"--rootdir={tmp_path}",
               f"--modelparity-cache-dir={tmp_path / 'cache'}")
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-2000:]
    assert "== TF32 off" in out and "--modelparity-reference-device=cpu" in out
    lines = [ln for ln in out.splitlines() if ln.startswith("test_close[")]
    assert sorted(ln.split()[0] for ln in lines) == ["test_close[keras-cpu-refcpu]",
                                                     "test_close[saved_model-cpu-refcpu]"]
    # err/scale, the share the rule allows, how much of it is used, the verdict, then the rule.
    assert all(re.search(r"\s\S+\s+\d(\.\d+)?e-\d+\s+\d+%\s+PASS\s+\S", ln) for ln in lines), lines
    assert "reference cpu, TF32 off" in out
