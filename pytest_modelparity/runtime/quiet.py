"""Keep TensorFlow's and the converters' own logs out of a test run, in a file the report names.

TensorFlow's C++ side (oneDNN, absl, XLA), the TFLite converter and tf2onnx write straight
to file descriptors 1 and 2: pytest shows that text under every failing test that happened
to import or convert something, and a reader takes it for the failure. The plugin raises
``TF_CPP_MIN_LOG_LEVEL`` before TensorFlow is imported and runs each build, export and load
with both descriptors (and ``sys.stdout``/``sys.stderr``) pointed at a log file. ``-v``
shows them as before. No TensorFlow import here.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = ["TF_LOG_LEVEL_ENV", "quiet_tensorflow", "LogSink", "TolerantStream", "make_ignored_dir"]

TF_LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
# 2: TensorFlow's C++ INFO and WARNING lines off, errors kept.
QUIET_LEVEL = "2"
GITIGNORE = "# created by pytest-modelparity: exported models and logs, never commit them\n*\n"


def quiet_tensorflow(show: bool) -> bool:
    """Set ``TF_CPP_MIN_LOG_LEVEL`` (unless the user did, or ``show``); True when set here."""
    if show or TF_LOG_LEVEL_ENV in os.environ:
        return False
    os.environ[TF_LOG_LEVEL_ENV] = QUIET_LEVEL
    return True


def make_ignored_dir(path: Path) -> Path:
    """Create ``path`` (and parents), private to this user (mode 0700: a cache another user
    could write would hand out their files, runtime/scratch.not_private); when this call
    creates it, put a ``.gitignore`` holding ``*`` inside, as pytest does for
    ``.pytest_cache``, so it never shows in ``git status``."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
        with contextlib.suppress(OSError):
            with open(path / ".gitignore", "x", encoding="utf-8") as fh:
                fh.write(GITIGNORE)
    return path


class LogSink:
    """Where TensorFlow and converter output goes while the plugin builds, exports and loads."""

    def __init__(self, path: Path | None, *, root: Path | None = None, show: bool = False) -> None:
        self.path = None if path is None else Path(path)
        self.root = root  # the folder to create ignored for git (the cache dir)
        self.show = show
        self.written = False
        self.lost: str | None = None  # why the log could not be written (a full disk), said once at the end
        self._lock = threading.RLock()
        self._depth = 0
        # while a block is captured: the log's fd, and fds 1, 2 and sys.stdout/stderr as they were
        # before it (``let_through``)
        self._log_fd: int | None = None
        self._before: tuple[int, int, Any, Any] | None = None

    @contextlib.contextmanager
    def capture(self, what: str) -> Iterator[None]:
        """Send fds 1 and 2 and ``sys.stdout``/``sys.stderr`` to the log while the block runs."""
        if self.show or self.path is None:
            yield
            return
        with self._lock:
            if self._depth:  # nested (an export inside a candidate build): already redirected
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            try:
                if self.root is not None:
                    make_ignored_dir(self.root)
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # Appended, never truncated: concurrent sessions (and xdist workers of two runs)
                # share these files. Each session's first block says whose lines follow.
                log = open(self.path, "ab", buffering=0)
            except OSError:  # an unwritable cache dir: leave the output where it goes anyway
                yield
                return
            try:
                if not self.written:
                    log.write(f"\n==== session pid {os.getpid()} started {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
                log.write(f"== {what} (pid {os.getpid()})\n".encode())
            except OSError as exc:  # a full disk: the output goes where it goes anyway, said at the end
                self._lose(exc)
                log.close()
                yield
                return
            self.written = True
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            saved = [os.dup(1), os.dup(2)]
            text = io.TextIOWrapper(log, encoding="utf-8", errors="replace", write_through=True)
            tolerant = TolerantStream(text, self._lose)
            self._depth = 1
            self._log_fd, self._before = log.fileno(), (saved[0], saved[1], sys.stdout, sys.stderr)
            try:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                with contextlib.redirect_stdout(tolerant), contextlib.redirect_stderr(tolerant):
                    yield
            finally:
                self._depth = 0
                self._log_fd, self._before = None, None
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(Exception):
                        stream.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for fd in saved:
                    os.close(fd)
                with contextlib.suppress(Exception):
                    text.detach()
                log.close()

    @contextlib.contextmanager
    def let_through(self) -> Iterator[None]:
        """Inside a captured block, fds 1 and 2 and ``sys.stdout``/``sys.stderr`` as they were
        before it, for a line meant for the terminal (a status line, plugin/status.py); then back
        to the log. Outside a captured block, nothing changes."""
        before, log_fd = self._before, self._log_fd
        if before is None or log_fd is None:
            yield
            return
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        out, err = sys.stdout, sys.stderr
        os.dup2(before[0], 1)
        os.dup2(before[1], 2)
        sys.stdout, sys.stderr = before[2], before[3]
        try:
            yield
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            sys.stdout, sys.stderr = out, err

    def _lose(self, exc: OSError) -> None:
        if self.lost is None:
            self.lost = f"{type(exc).__name__}: {exc.strerror or exc}"

    def lost_line(self) -> str | None:
        """The one end-of-run line for a log that could not be written, or None."""
        if self.lost is None:
            return None
        return (f"modelparity: TensorFlow and converter output could not be written to {self.path} ({self.lost}); "
                "it went to the terminal or was dropped; the tests were not affected. Free disk space there, or point "
                "--modelparity-cache-dir elsewhere")


class TolerantStream:
    """A text stream whose failed writes (a full disk under a log) are dropped and reported to
    ``on_error``, never an OSError in the middle of an export or a load."""

    def __init__(self, text: Any, on_error: Callable[[OSError], None] | None = None) -> None:
        self._text = text
        self._on_error = on_error

    def write(self, data: str) -> int:
        try:
            return self._text.write(data)
        except OSError as exc:
            if self._on_error is not None:
                self._on_error(exc)
            return len(data)

    def flush(self) -> None:
        try:
            self._text.flush()
        except OSError as exc:
            if self._on_error is not None:
                self._on_error(exc)

    def __getattr__(self, name: str) -> object:
        return getattr(self._text, name)
