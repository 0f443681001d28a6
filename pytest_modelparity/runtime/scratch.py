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

__all__ = ["CACHE_TEMP", "SYSTEM_TEMP", "owned_prefix", "sweep", "GRACE_S", "ORPHAN_S", "not_private", "foreign"]

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


def not_private(path: Path) -> str | None:
    """Why a cache folder is not this user's alone, or None: owned by another uid, or writable
    by its group or by others (who could then plant an entry the next run hands out). A path
    that does not exist yet is None: the package creates its folders private (mode 0700)."""
    if not hasattr(os, "getuid"):
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    if st.st_uid != os.getuid():
        return f"it is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    if st.st_mode & 0o022:
        who = " and ".join(w for bit, w in ((0o020, "its group"), (0o002, "others")) if st.st_mode & bit)
        return f"it is writable by {who} (mode {st.st_mode & 0o7777:04o})"
    return None


def foreign(paths: "list[Path]") -> str | None:
    """The first of ``paths`` that another uid owns, in words, or None (missing paths are None)."""
    if not hasattr(os, "getuid"):
        return None
    for path in paths:
        try:
            uid = os.lstat(path).st_uid
        except OSError:
            continue
        if uid != os.getuid():
            return f"{path.name} was written by uid {uid}, not by you (uid {os.getuid()})"
    return None
