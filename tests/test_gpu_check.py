"""bench/gpu_check.py on this machine: it lists the devices, says clearly that no GPU is
present, and its suite path (pytest with the GPU options, the JSON report, the error table)
works when pointed at the CPU (``--device cpu --run-anyway``)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import textwrap
from pathlib import Path

import pytest

from models import TINY_SOURCE_CONFTEST
from pytest_modelparity.runtime import devices

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench" / "gpu_check.py"


def run(*args: str) -> tuple[int, str]:
    """The script's main() in this process (its device listing imports TensorFlow, which this
    worker has already: a child would import it again, issue 49); its pytest stays a child."""
    spec = importlib.util.spec_from_file_location("gpu_check_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = module.main(list(args))
    return code, out.getvalue()


@pytest.fixture(scope="module")
def no_gpu() -> None:
    if devices.missing_gpu("gpu") is None:
        pytest.skip("this machine has a GPU: bench/gpu_check.py runs the suites on it instead")


def test_without_a_gpu_it_lists_the_devices_and_says_so(no_gpu, monkeypatch) -> None:
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")  # the script sets it when unset
    code, out = run()
    assert code == 0, out[-2000:]
    assert "TensorFlow 2." in out and "onnxruntime" in out
    assert "NO GPU PRESENT: TensorFlow sees no GPU" in out
    assert "onnxruntime has no CUDAExecutionProvider" in out
    assert "== TF32" not in out  # nothing was run
    assert run("--require-gpu")[0] == 2


def test_the_suite_path_on_the_cpu_prints_each_forms_error(no_gpu, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    (tmp_path / "conftest.py").write_text(TINY_SOURCE_CONFTEST)
    (tmp_path / "test_tiny.py").write_text(textwrap.dedent('''
        from pytest_modelparity import assert_outputs_close

        def test_close(parity_candidate, parity_reference, parity_batch):
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
    '''))
    # The export process is not this test's subject: inline, the child pytest imports TensorFlow once.
    code, out = run("--device", "cpu", "--run-anyway", "--tf32", "off", "--suites", str(tmp_path), "--",
                    "--modelparity-formats=keras,saved_model", f"--rootdir={tmp_path}",
                    f"--modelparity-cache-dir={tmp_path / 'cache'}", "--modelparity-export-process=inline")
    assert code == 0, out[-3000:]
    assert "== TF32 off" in out and "--modelparity-reference-device=cpu" in out
    lines = [ln for ln in out.splitlines() if ln.startswith("test_close[")]
    assert sorted(ln.split()[0] for ln in lines) == ["test_close[keras-cpu-refcpu]",
                                                     "test_close[saved_model-cpu-refcpu]"]
    # err/scale, the share the rule allows, how much of it is used, the verdict, then the rule.
    assert all(re.search(r"\s\S+\s+\d(\.\d+)?e-\d+\s+\d+%\s+PASS\s+\S", ln) for ln in lines), lines
    assert "reference cpu, TF32 off" in out
