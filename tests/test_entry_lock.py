"""The per-entry export lock against a real holder in another process (and a holder that is
killed: the kernel releases its lock)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from pytest_modelparity.exports.entry_lock import entry_lock
from pytest_modelparity.runtime.quiet import LogSink

HOLDER = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    from pytest_modelparity.exports.entry_lock import entry_lock
    with entry_lock(Path(sys.argv[1]), timeout_s=None):
        Path(sys.argv[2]).write_text("held")
        time.sleep(float(sys.argv[3]))
''')


def _hold(lock: Path, ready: Path, seconds: float) -> subprocess.Popen:
    root = str(Path(__file__).parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(ready), str(seconds)], env=env)
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready.exists()
    return proc


def test_a_waiter_waits_for_the_holder_and_no_lock_file_is_left(tmp_path: Path) -> None:
    lock = tmp_path / ".key.lock"
    holder = _hold(lock, tmp_path / "ready", 1.0)
    with entry_lock(lock, timeout_s=30) as waited:
        # in only once the holder let go (it still needs a moment to exit after that)
        assert waited.seconds > 0.3 and waited.note is None
    assert holder.wait(timeout=30) == 0
    assert not lock.exists()


def test_a_waiter_gives_up_after_its_timeout_naming_the_holder(tmp_path: Path) -> None:
    lock = tmp_path / ".key.lock"
    holder = _hold(lock, tmp_path / "ready", 30.0)
    try:
        start = time.monotonic()
        with entry_lock(lock, timeout_s=0.3) as waited:
            assert time.monotonic() - start < 5
        assert waited.note is not None and f"pid {holder.pid}" in waited.note and "exported it here too" in waited.note
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holder_never_blocks_the_next_exporter(tmp_path: Path) -> None:
    lock = tmp_path / ".key.lock"
    holder = _hold(lock, tmp_path / "ready", 30.0)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert lock.exists()  # left behind by the kill, but its lock died with the process
    with entry_lock(lock, timeout_s=5) as waited:
        assert waited.note is None and waited.seconds < 2
    assert not lock.exists()


def test_two_sessions_sharing_a_log_append_and_never_truncate(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "main.log"
    for what in ("first session", "second session"):
        sink = LogSink(log)
        with sink.capture(what):
            print(f"output of the {what}")
    text = log.read_text()
    assert "output of the first session" in text and "output of the second session" in text
    assert text.count("==== session pid") == 2
