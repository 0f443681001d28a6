"""Temporary directories the package owns, named so a later run can tell they are stale.

Why: a run killed mid-export (SIGKILL, a CI timeout) leaves its temporaries behind: a
half-written ``<cache>/<format>/.<key>.tmp-*`` entry, a ``/tmp/modelparity-tfjs-*``
intermediate SavedModel. Every such directory is named ``<prefix>h<host>-p<pid>-<random>``;
``sweep`` removes those whose process is gone on this host (older than ``GRACE_S``, so a
directory being created right now is never touched), and, for directories of another host
(a shared cache on NFS) or without an owner in their name, those older than ``ORPHAN_S``.
Standard library only.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
from pathlib import Path

__all__ = ["CACHE_TEMP", "SYSTEM_TEMP", "owned_prefix", "sweep", "GRACE_S", "ORPHAN_S"]

GRACE_S = 60.0            # never remove anything younger: its owner may be starting
ORPHAN_S = 6 * 3600.0     # another host's (or an unnamed) temporary this old is abandoned
_OWNER = re.compile(r"h([A-Za-z0-9]*)-p(\d+)-")


# What this package names its temporaries (see owned_prefix).
CACHE_TEMP = re.compile(r"^\.[0-9a-f]{1,64}\.(?:tmp|bad)-")        # <cache>/<format>/.<key>.tmp-...
SYSTEM_TEMP = re.compile(r"^modelparity-(?:[a-z0-9_]+-)?(?=h[A-Za-z0-9]*-p\d+-)")  # $TMPDIR/modelparity-[<format>-]...


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:24]


def owned_prefix(prefix: str) -> str:
    """``prefix`` + this process' owner tag, for ``tempfile.mkdtemp(prefix=...)``."""
    return f"{prefix}h{_host()}-p{os.getpid()}-"


def _alive(pid: int) -> bool:
    if pid == os.getpid() or os.name == "nt":
        return True            # on Windows os.kill(pid, 0) would end the process: rely on age
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True            # exists, owned by someone else
    return True


def _stale(path: Path, name_tail: str, now: float) -> bool:
    try:
        age = now - path.lstat().st_mtime
    except OSError:
        return False
    if age < GRACE_S:
        return False
    owner = _OWNER.match(name_tail)
    if owner is not None and owner.group(1) == _host():
        return not _alive(int(owner.group(2)))
    return age > ORPHAN_S


def sweep(directory: Path, pattern: re.Pattern[str], *, unowned: bool = False) -> list[Path]:
    """Remove stale temporaries directly under ``directory`` whose name ``pattern`` matches
    (the owner tag follows the match); return what was removed. ``unowned=True`` also takes
    matching names without an owner tag once ``ORPHAN_S`` old (only where every name is
    ours, as in the cache). Never raises: a sweep must not fail a run."""
    removed: list[Path] = []
    now = time.time()
    try:
        children = list(Path(directory).iterdir())
    except OSError:
        return removed
    for child in children:
        found = pattern.match(child.name)
        if found is None or child.is_symlink() or not child.is_dir():
            continue
        tail = child.name[found.end():]
        if not unowned and _OWNER.match(tail) is None:
            continue
        if _stale(child, tail, now):
            shutil.rmtree(child, ignore_errors=True)
            if not child.exists():
                removed.append(child)
    return removed
