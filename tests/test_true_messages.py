"""True messages where a machine limit or a damaged file used to get a raw traceback or a fix
that was not the cause: a .tflite declaring an input no memory holds, a thread that cannot
start under ``ulimit -v``, the reports under a 1 GB address limit, a full disk under the log,
and a converter log that must outlive the export process that wrote it."""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import environ_as_given  # bytecode as the run was given it: memory is the subject
from pytest_modelparity import ModelLoadError, load_model
from pytest_modelparity.formats import missing_runtime

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
HERE = str(Path(__file__).resolve().parent.parent)


@pytest.mark.skipif(missing_runtime("tflite") is not None or missing_runtime("tflite", export=True) is not None,
                    reason="needs TensorFlow and LiteRT")
def test_a_tflite_declaring_a_huge_input_names_it_and_its_bytes(tmp_path: Path) -> None:
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([1, 977, 983, 3], tf.float32)])
    def double(x):
        return x * 2.0

    data = tf.lite.TFLiteConverter.from_concrete_functions([double.get_concrete_function()], double).convert()
    small, huge = struct.pack("<4i", 1, 977, 983, 3), struct.pack("<4i", 1, 1 << 20, 1 << 20, 3)
    assert small in data
    path = tmp_path / "huge.tflite"
    path.write_bytes(data.replace(small, huge))  # the file now declares a 12 TiB input
    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    text = str(info.value)
    assert str(path) in text and "[1, 1048576, 1048576, 3]" in text and "12.0 TiB" in text, text
    assert "free memory" not in text and "Unable to allocate" not in text, text


def _under_limit(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))


def test_a_thread_that_cannot_start_under_ulimit_v_blames_the_address_limit() -> None:
    code = textwrap.dedent('''
        from pytest_modelparity.runtime.resources import resource_failure
        problem, fix = resource_failure(RuntimeError("can't start new thread"), "/tmp")
        print(problem); print(fix)
    ''')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**environ_as_given(), "PYTHONPATH": HERE}, preexec_fn=lambda: _under_limit(2 << 30))
    assert out.returncode == 0, out.stderr
    assert "address-space limit of 2.0 GiB" in out.stdout and "ulimit -v" in out.stdout, out.stdout
    assert "ulimit -u" not in out.stdout, out.stdout


REPORT_TEST = textwrap.dedent('''
    import numpy as np
    from pytest_modelparity import assert_outputs_close

    KEEP = []

    def test_close():
        for i in range(3):
            a = np.linspace(0, 1, 1000, dtype=np.float32)
            assert_outputs_close(a, a + 1e-7 * i)
        size = 1 << 30
        while size >= 4096:  # every byte of address space left, held to the end of the session
            try:
                KEEP.append(bytearray(size))
            except MemoryError:
                size //= 2
''')


def test_reports_are_written_under_a_1gb_address_limit(tmp_path: Path) -> None:
    """The session ended in a raw MemoryError from pytest_sessionfinish (``platform.platform()``
    starting ``uname -p``, an import of the HTML writer), and neither report was written."""
    (tmp_path / "test_arrays.py").write_text(REPORT_TEST)
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_arrays.py",
                          "--modelparity-report=r.json", "--modelparity-html=r.html",
                          f"--modelparity-cache-dir={tmp_path / 'cache'}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**environ_as_given(), "PYTHONPATH": HERE}, preexec_fn=lambda: _under_limit(1_000_000_000))
    text = out.stdout + out.stderr
    assert "Traceback" not in text and "INTERNALERROR" not in text, text[-3000:]
    assert "model parity summary" in text and "1 passed" in text, text[-3000:]
    assert (tmp_path / "r.json").is_file() and (tmp_path / "r.html").is_file(), text[-3000:]
    assert '"outputs_close"' in (tmp_path / "r.json").read_text()


def test_a_full_disk_under_the_log_is_one_line(tmp_path: Path) -> None:
    from pytest_modelparity.runtime.quiet import LogSink

    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full to stand for a full disk")
    log = tmp_path / "logs" / "main.log"
    log.parent.mkdir()
    log.symlink_to("/dev/full")  # every write: ENOSPC, as on a full disk
    sink = LogSink(log)
    with sink.capture("an export"):
        print("converter output")
    with sink.capture("a load"):
        print("more")
    line = sink.lost_line()
    assert line is not None and "No space left on device" in line and str(log) in line, line
    assert "--modelparity-cache-dir" in line


@pytest.mark.skipif(missing_runtime("tflite", export=True) is not None, reason="needs the TFLite converter")
def test_the_converter_log_an_export_error_names_outlives_the_export_process(tmp_path: Path) -> None:
    """The log lived in the worker's TMPDIR, removed with the worker; and a worker whose session
    log was on a full disk exited (code 1) at its first line of output."""
    from families import recurrent

    from pytest_modelparity import ExportError
    from pytest_modelparity.exports.worker import ExportProcess

    import models

    session_log = tmp_path / "logs" / "export.log"
    session_log.parent.mkdir()
    if os.path.exists("/dev/full"):  # the worker's own output goes to a full disk: it must carry on
        session_log.symlink_to("/dev/full")
    model, _ = recurrent("lstm")
    process = ExportProcess(timeout_s=300, log_path=session_log)
    try:
        assert process.export(models.mlp(seed=1), "keras", tmp_path / "ok" / "m").is_file()
        assert not process.inline_reasons and process.pid != os.getpid()
        with pytest.raises(ExportError) as info:  # the dynamic route fails on TensorList ops
            process.export(model, "tflite", tmp_path / "out" / "m", converter_options={"route": "dynamic"})
    finally:
        process.close()
    log = info.value.log_path
    assert log and f"converter log: {log}" in str(info.value), str(info.value)
    assert Path(log).is_file() and Path(log).parent == tmp_path / "logs" / "converters", log
    assert "TensorList" in Path(log).read_text()


def test_a_damaged_runtime_in_the_export_process_says_so() -> None:
    """An installed package that does not import (a damaged onnxruntime: its .so missing) failed
    the export as "the converter failed (ImportError: ...)", pointing at the converter."""
    from pytest_modelparity.exports import worker

    err = worker._rebuild({"type": "ImportError", "message": "libonnxruntime.so: cannot open shared object file"},
                          "onnx", Path("/tmp/x/model.onnx"))
    text = str(err)
    assert "installed but does not import" in text and "libonnxruntime.so" in text, text
    assert "--force-reinstall" in text and "converter failed" not in text, text
