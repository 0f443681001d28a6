"""Session-level faults with the real damage: an export worker killed in the middle of an
export (TensorFlow's temporaries must not stay in $TMPDIR), ..."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from models import TINY_SOURCE_CONFTEST

KILLED_EXPORT_SUITE = {
    "test_a_exports.py": '''
        import os, signal, threading
        from pathlib import Path
        import pytest
        from pytest_modelparity import assert_outputs_close

        def _worker():
            for pid in os.listdir("/proc"):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError):
                    continue
                if ppid == os.getpid() and b"pytest_modelparity.exports.worker" in cmd:
                    return int(pid)
            raise AssertionError("no export worker")

        @pytest.mark.modelparity(formats=["tflite"])
        def test_exports_then_the_worker_is_stopped(parity_candidate, parity_batch, parity_reference):
            assert_outputs_close(parity_candidate.predict(parity_batch), parity_reference, inputs=parity_batch)
            pid = _worker()
            env = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\\0")
            tmp = Path(dict(kv.split("=", 1) for kv in env if "=" in kv)["TMPDIR"])
            assert tmp.name.startswith("modelparity-tmp-") and tmp.parent == Path(os.environ["TMPDIR"])
            assert list(tmp.glob("__autograph_generated_file*")), sorted(p.name for p in tmp.iterdir())
            os.kill(pid, signal.SIGSTOP)  # the next export waits on it: the kill lands during it
            threading.Timer(3.0, os.kill, (pid, signal.SIGKILL)).start()
    ''',
    "test_c_export_killed.py": '''
        import pytest

        @pytest.mark.modelparity(formats=["onnx"])
        def test_export_killed(parity_candidate):
            pass
    ''',
    "test_d_next_export.py": '''
        import pytest
        from pytest_modelparity import assert_outputs_close

        @pytest.mark.modelparity(formats=["saved_model"])
        def test_next_export_works(parity_candidate, parity_batch, parity_reference):
            assert_outputs_close(parity_candidate.predict(parity_batch), parity_reference, inputs=parity_batch)
    ''',
}


def test_an_export_killed_half_way_leaves_nothing_of_tensorflow_in_tmpdir(pytester: pytest.Pytester,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker runs with $TMPDIR in a folder of its own: TensorFlow's tmp* folders, autograph's
    generated files and tensorflowjs' intermediates of a worker killed mid-export go with it."""
    tmpdir = pytester.path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile(**{name[:-3]: textwrap.dedent(body) for name, body in KILLED_EXPORT_SUITE.items()})
    result = pytester.runpytest_subprocess("--modelparity-cache-dir=cache", "-p", "no:cacheprovider",
                                           "-p", "no:randomly", f"--basetemp={pytester.path / 'bt'}", timeout=600)
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*test_export_killed*", "*killed by SIGKILL*"])
    left = sorted(p.name for p in tmpdir.iterdir() if p.name != "pytest-modelparity-logs")
    assert left == [], left


XDIST_SUITE = {
    "test_model.py": '''
        import os, signal
        from pathlib import Path
        import pytest
        from pytest_modelparity import assert_outputs_close

        @pytest.mark.modelparity(formats=["tflite"])
        def test_model_then_its_export_worker_stalls(parity_candidate, parity_batch, parity_reference):
            assert_outputs_close(parity_candidate.predict(parity_batch), parity_reference, inputs=parity_batch)
            for pid in os.listdir("/proc"):  # the export worker of this xdist worker
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError):
                    continue
                if ppid == os.getpid() and b"pytest_modelparity.exports.worker" in cmd:
                    os.kill(int(pid), signal.SIGSTOP)  # slow to exit, as on a loaded machine
                    return
            raise AssertionError("no export worker")
    ''',
    "test_plain.py": '''
        def test_touches_no_model():
            assert 1 + 1 == 2
    ''',
}


def test_under_xdist_no_keyboard_interrupt_at_the_end_and_no_line_naming_a_log_folder_never_made(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """execnet SIGINTs an xdist worker still busy 5 s after it was told to end: an export worker
    slow to exit (here: stopped for real) must not hold the session's end that long. A suite
    that touches no model names no log folder."""
    pytest.importorskip("xdist")
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile(**{name[:-3]: textwrap.dedent(body) for name, body in XDIST_SUITE.items()})
    monkeypatch.setenv("EXECNET_DEBUG", "2")  # execnet's own trace on stderr says when it SIGINTs a worker
    result = pytester.runpytest_subprocess("-n", "2", "--modelparity-cache-dir=cache", "-p", "no:cacheprovider",
                                           "-p", "no:randomly", timeout=600)
    result.assert_outcomes(passed=2)
    out = result.stdout.str() + result.stderr.str()
    assert "gw0-worker" in out and "gw1-worker" in out  # execnet's trace is there
    assert "sending ourselves a SIGINT" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    assert "TensorFlow and converter output kept in" in out  # the model test wrote its log
    monkeypatch.delenv("EXECNET_DEBUG")
    result = pytester.runpytest_subprocess("-n", "2", "--modelparity-cache-dir=cache2", "-p", "no:cacheprovider",
                                           "-p", "no:randomly", "test_plain.py", timeout=600)
    result.assert_outcomes(passed=1)
    assert "kept in" not in result.stdout.str() and not (pytester.path / "cache2").exists(), result.stdout.str()
