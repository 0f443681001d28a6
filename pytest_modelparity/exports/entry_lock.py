"""A lock per export-cache entry, shared by every process using the cache directory.

Why: without it, pytest-xdist workers (and parallel sessions) on a cold cache all convert the
same model at once and all but one throw their copy away (a quantised TFLite export of
InceptionV3 takes minutes). With it the first process exports, the others wait, then hit.

How: ``flock`` on ``<root>/<format>/.<key>.lock``. The kernel drops the lock when its holder
dies, however it dies, so a lock left by a killed run is never held (the stale-lock rule for
a dead holder costs nothing). The holder writes its host, pid and start time into the file,
so a waiter can say whom it waits for. A waiter gives up after ``timeout_s`` (a hung
exporter, or a filesystem where flock is not shared between hosts) and exports without the
lock: correctness never depended on it (entries are renamed into place atomically), only
the repeated work did. Without ``fcntl`` (Windows) there is no lock, as before.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

__all__ = ["Waited", "entry_lock"]

_POLL_S = 0.1


@dataclass
class Waited:
    """How the lock was had: seconds waited, and a note when it was not had at all."""

    seconds: float = 0.0
    note: str | None = None


def _holder(fh: object) -> str:
    try:
        os.lseek(fh.fileno(), 0, os.SEEK_SET)  # type: ignore[attr-defined]
        return os.read(fh.fileno(), 200).decode("utf-8", "replace").strip() or "an unknown process"  # type: ignore[attr-defined]
    except OSError:
        return "an unknown process"


def _same_file(fh: object, path: Path) -> bool:
    """Whether the locked descriptor is still the file at ``path`` (the holder before us
    removes the lock file as it leaves: a lock on that removed file protects nothing)."""
    try:
        return os.fstat(fh.fileno()).st_ino == os.stat(path).st_ino  # type: ignore[attr-defined]
    except OSError:
        return False


@contextlib.contextmanager
def entry_lock(path: Path, *, timeout_s: float | None) -> Iterator[Waited]:
    """Hold the lock at ``path`` while the block runs (see the module docstring). The lock
    file is removed when the block ends, so a cache holds no lock files between runs."""
    waited = Waited()
    try:
        import fcntl
    except ImportError:
        yield waited
        return
    start = time.monotonic()
    fh = None
    while fh is None:
        try:
            candidate = open(path, "a+b")
        except OSError as exc:
            waited.note = f"no export lock ({exc.strerror or exc}): other processes may export this entry too"
            break
        try:
            fcntl.flock(candidate.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                waited.note = (f"waited {timeout_s:g} s for {_holder(candidate)} to finish exporting this entry; "
                               "exported it here too")
                candidate.close()
                break
            candidate.close()
            time.sleep(_POLL_S)
            continue
        except OSError as exc:  # ENOLCK: a filesystem without flock
            waited.note = f"no export lock ({exc.strerror or exc}): other processes may export this entry too"
            candidate.close()
            break
        if _same_file(candidate, path):
            fh = candidate
        else:
            candidate.close()  # locked a file the last holder removed: take the new one
    waited.seconds = time.monotonic() - start
    if fh is None:
        yield waited
        return
    try:
        with contextlib.suppress(OSError):
            fh.truncate(0)
            fh.write(f"host {socket.gethostname()} pid {os.getpid()} since {time.strftime('%H:%M:%S')}\n".encode())
            fh.flush()
        yield waited
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still held: a waiter then sees the inode change and reopens
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        fh.close()
