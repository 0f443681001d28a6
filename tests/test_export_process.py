"""Exports in a child process: real crashes (SIGKILL of the real worker, TFLite's converter
aborting under a real RLIMIT_AS), a real hang past the time limit, and a model the worker
cannot rebuild, each cost one export and never the session."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pytest_modelparity import errors, load_model
from pytest_modelparity.exports.worker import ExportProcess

import models
from models import TINY_SOURCE_CONFTEST


@pytest.fixture(scope="module")
def _one_worker(tmp_path_factory: pytest.TempPathFactory):
    """One worker for the tests that leave it as they found it: each new one imported TensorFlow
    again (about 8 CPU-seconds, issue 49)."""
    process = ExportProcess(timeout_s=300, log_path=tmp_path_factory.mktemp("logs") / "export.log")
    yield process
    process.close()


@pytest.fixture
def worker(_one_worker: ExportProcess):
    """The module's worker, with no inline reasons of an earlier test."""
    _one_worker.inline_reasons.clear()
    yield _one_worker
    assert (_one_worker.timeout_s, _one_worker.memory_limit) == (300, None), "the test changed the shared worker"


@pytest.fixture
def own_worker(tmp_path: Path):
    """A worker of the test's own, for a test that kills it or changes its limits."""
    process = ExportProcess(timeout_s=300, log_path=tmp_path / "logs" / "export.log")
    yield process
    process.close()


def _tflite_matches(path: Path, model) -> None:
    x = np.random.default_rng(0).normal(size=(3, 16)).astype("float32")
    np.testing.assert_allclose(load_model(path, "tflite").predict(x)["out"], np.asarray(model(x)), atol=1e-5)


def test_an_export_in_the_worker_gives_the_same_artifact_as_inline(worker, tmp_path: Path) -> None:
    model = models.mlp(seed=1)
    path = worker.export(model, "tflite", tmp_path / "a" / "m")
    assert path == tmp_path / "a" / "m.tflite" and worker.pid is not None and worker.pid != os.getpid()
    _tflite_matches(path, model)
    assert worker.peak_rss and worker.peak_rss > 50 << 20 and not worker.inline_reasons


def test_an_unnamed_input_keeps_its_name_through_the_worker(worker, tmp_path: Path) -> None:
    """An unnamed Keras input is ``keras_tensor_<n>`` until saved, and loads back in the worker
    as ``input_layer``: the export must still name it as the source does (a keras.applications
    model's batches are keyed by that name), not as the reloaded copy would."""
    import keras

    x = keras.Input((16,))
    model = keras.Model(x, keras.layers.Dense(3, name="out")(x))
    path = worker.export(model, "tflite", tmp_path / "unnamed" / "m")
    assert not worker.inline_reasons
    assert [s.name for s in load_model(path, "tflite").inputs] == [model.inputs[0].name]


def test_a_killed_worker_fails_one_export_then_a_new_one_serves(own_worker, tmp_path: Path) -> None:
    """SIGKILL is what the kernel's OOM killer sends: the export in flight fails, naming it."""
    model = models.tiny_cnn(seed=2)
    own_worker.export(model, "keras", tmp_path / "warm" / "m")  # TensorFlow imported in the worker
    pid = own_worker.pid
    assert pid is not None
    threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
    with pytest.raises(errors.ExportError) as info:
        own_worker.export(model, "tfjs", tmp_path / "killed")  # the slowest converter: still running at 0.5 s
    text = str(info.value)
    assert "was killed by SIGKILL" in text and "peak memory of" in text and "MiB" in text, text
    assert "the test session goes on" in text and "converter log:" in text
    path = own_worker.export(model, "tflite", tmp_path / "after" / "m")
    assert own_worker.pid != pid and path.exists()


def test_tflite_aborting_under_a_memory_limit_is_one_export_error(own_worker, tmp_path: Path) -> None:
    """A real RLIMIT_AS in the worker: TF's TFLite converter aborts (in-process this was
    'Fatal Python error: Aborted', the whole session gone)."""
    model = models.mlp(seed=1)
    own_worker.export(model, "keras", tmp_path / "warm" / "m")
    own_worker.memory_limit = 50 << 20
    with pytest.raises(errors.ExportError) as info:
        own_worker.export(model, "tflite", tmp_path / "small" / "m")
    text = str(info.value)
    assert "SIGABRT" in text or "out of memory" in text, text
    if "SIGABRT" in text:  # faulthandler's report, from the session log: where it aborted
        assert "Fatal Python error: Aborted" in text and "tensorflow/lite/python" in text, text
    own_worker.memory_limit = None
    _tflite_matches(own_worker.export(model, "tflite", tmp_path / "big" / "m"), model)


def test_an_export_past_the_time_limit_is_stopped(own_worker, tmp_path: Path) -> None:
    model = models.tiny_cnn(seed=2)
    own_worker.export(model, "keras", tmp_path / "warm" / "m")
    own_worker.timeout_s = 0.3
    start = time.monotonic()
    with pytest.raises(errors.ExportError, match=r"took longer than 0.3 s \(--modelparity-timeout\)"):
        own_worker.export(model, "tfjs", tmp_path / "slow")
    assert time.monotonic() - start < 10


def test_a_model_the_worker_cannot_rebuild_is_exported_inline(worker, tmp_path: Path) -> None:
    """A custom layer defined here does not load in a fresh Python: exported in this process, said so."""
    import keras

    class Doubler(keras.layers.Layer):  # not registered, not importable by the worker
        def call(self, x):
            return x * 2.0

    x = keras.Input((4,), name="x")
    model = keras.Model(x, Doubler(name="out")(keras.layers.Dense(3, name="d")(x)))
    path = worker.export(model, "tflite", tmp_path / "custom" / "m")
    assert path.exists() and worker.inline_reasons, worker.inline_reasons
    assert "does not load back in a fresh process" in worker.inline_reasons[0] or "save" in worker.inline_reasons[0]


def test_the_plugin_session_goes_on_after_a_converter_abort(pytester: pytest.Pytester) -> None:
    """Through the fixtures: the TFLite export aborts under --modelparity-export-memory, that test
    fails with one ExportError, the keras test passes and the report is written."""
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile(test_abort='''
        def test_runs(parity_candidate, parity_batch):
            assert parity_candidate.predict(parity_batch)
    ''')
    # in this process (issue 49): the abort is the export worker's, a real child either way
    result = pytester.runpytest(
        "--modelparity-formats=keras,tflite", "--modelparity-export-memory=50M", "--modelparity-cache-dir=cache",
        "-p", "no:cacheprovider", "--modelparity-report=out.json")
    result.assert_outcomes(passed=1, errors=1)  # the candidate fixture fails: an error at setup
    result.stdout.fnmatch_lines(["*ERROR at setup of test_runs[[]tflite-cpu[]]*",
                                 "*cannot export the model*tflite*process aborted (SIGABRT*the test session goes on*",
                                 "*Fatal Python error: Aborted", "*converter log:*main.log", "*1 passed*1 error*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # pytest itself ended normally (in-process: killed by SIGABRT)
    doc = json.loads((pytester.path / "out.json").read_text())
    assert len(doc["tests"]) == 2 and "passed" in {t["outcome"] for t in doc["tests"]}


def test_a_worker_holding_too_much_memory_after_an_export_is_replaced(tmp_path: Path) -> None:
    """Measured: a 100 MB model's second ONNX export in one worker peaked at 7.7 GB, 6.2 GB in a
    fresh one; a worker left above ``recycle_rss`` is replaced before the next export."""
    model = models.mlp(seed=1)
    process = ExportProcess(timeout_s=300, recycle_rss=1)  # every worker is "too big"
    try:
        process.export(model, "keras", tmp_path / "a" / "m")
        assert process.pid is None  # stopped after answering
        _tflite_matches(process.export(model, "tflite", tmp_path / "b" / "m"), model)
    finally:
        process.close()
    kept = ExportProcess(timeout_s=300)  # the default, 2 GiB: a tiny model's worker is kept
    try:
        kept.export(model, "keras", tmp_path / "c" / "m")
        first = kept.pid
        kept.export(model, "tflite", tmp_path / "d" / "m")
        assert first is not None and kept.pid == first
    finally:
        kept.close()


_ORPHAN = """
import sys, threading
from pytest_modelparity.exports.worker import ExportProcess

process = ExportProcess(timeout_s=60)
if sys.argv[1] == "thread":  # started from another thread: the kernel signal would follow that thread
    starter = threading.Thread(target=process.prestart)
    starter.start()
    starter.join()
else:
    process.prestart()
print(process.pid, flush=True)
import os
os._exit(1)  # the pytest process dying (an abort, an OOM kill) while its worker still imports
"""


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_a_worker_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """Under a 1.1 GB `ulimit -v` the pytest process aborted while its worker, orphaned, spun in
    `import keras` at 100% CPU until killed: the worker now dies with its parent (Linux), even
    before its first read of stdin. Started from another thread it does not (the signal would
    follow the thread): it still ends by itself at the EOF once its imports are done."""
    import subprocess
    import sys

    for how in ("main", "thread"):
        out = subprocess.run([sys.executable, "-c", _ORPHAN, how], capture_output=True, text=True, timeout=120,
                             cwd=tmp_path)
        pid = int(out.stdout.split()[0])
        deadline = time.monotonic() + (1.0 if how == "main" else 0.0)
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if how == "main":
            assert not _alive(pid), "the worker outlived the process that started it"
            continue
        assert _alive(pid), "a worker started from another thread must not be killed with that thread"
        deadline = time.monotonic() + 90  # its imports done, it reads the EOF and ends
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            pytest.fail("an orphaned idle worker did not end at the EOF of its stdin")
