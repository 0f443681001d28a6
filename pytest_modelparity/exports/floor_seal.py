"""What makes a floor entry trustworthy: read safely, signed with the cache's own secret.

Why: a floor entry sets the tolerance every comparison of its model is judged by, so an entry
that lies (an error edited to 1e9) makes every check pass. A SHA-256 of the payload only
catches accidents: whoever edits the file recomputes it. Each entry is therefore signed with
an HMAC-SHA256 under a random 32-byte key kept in ``<cache>/floor/.hmac-key`` (created with
mode 0600, owned by the user, checked on every read) over the entry's key and its payload: an
edit by anyone who cannot read that key file, or an entry copied under another key, fails the
check and is measured again. (A process running as the cache's owner can read the key, as it
could edit this package: the signature guards against other writers and other tools, not
against the owner.)

Reading: an entry is opened with ``O_NOFOLLOW | O_NONBLOCK`` (a symlink is refused, a FIFO
opens at once instead of blocking forever) and checked with ``fstat`` on the open descriptor
(regular file, at most ``MAX_ENTRY_BYTES``) before a byte is read, as ``formats/_files.py``
reads model files. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path

__all__ = ["KEY_NAME", "MAX_ENTRY_BYTES", "UnsafeFile", "read_small_regular", "secret_key", "signature"]

KEY_NAME = ".hmac-key"
# An entry is a few hundred bytes per output; a model with thousands of outputs stays far below.
MAX_ENTRY_BYTES = 1 << 20
_KEY_BYTES = 32
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class UnsafeFile(Exception):
    """A file that is not a small regular file of ours; the message says what it is."""


def _kind(mode: int) -> str | None:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def read_small_regular(path: Path, limit: int = MAX_ENTRY_BYTES, *, private: bool = False) -> bytes:
    """The bytes of ``path`` if it is a regular file (not a link) of at most ``limit`` bytes
    (``private``: also owned by this user and unreadable by others). ``FileNotFoundError`` when
    absent, ``UnsafeFile`` for anything else; never blocks on a pipe, never reads past ``limit``."""
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafeFile(f"a symbolic link (to {os.readlink(path)}), not a regular file") from exc
        raise UnsafeFile(f"unreadable ({type(exc).__name__}: {exc.strerror or exc})") from exc
    with open(fd, "rb", closefd=True) as fh:
        info = os.fstat(fd)
        kind = _kind(info.st_mode)
        if kind is not None:
            raise UnsafeFile(f"{kind}, not a regular file")
        if info.st_size > limit:
            raise UnsafeFile(f"{info.st_size} bytes, more than the {limit} an entry may hold")
        owner = getattr(os, "geteuid", lambda: info.st_uid)()
        if private and (info.st_uid != owner or info.st_mode & 0o077):
            raise UnsafeFile(f"not private (owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}; "
                             f"must be this user's, mode 600)")
        os.set_blocking(fd, True)
        content = fh.read(limit + 1)
    if len(content) > limit:
        raise UnsafeFile(f"more than {limit} bytes (it grew while read)")
    return content


def secret_key(folder: Path) -> tuple[bytes, str | None]:
    """The cache's signing key, created when missing; with a note when the one found was not a
    private regular file of the right size and was replaced (every entry signed with it is then
    measured again). ``OSError`` when no key can be read or written."""
    path = folder / KEY_NAME
    try:
        found = read_small_regular(path, _KEY_BYTES, private=True)
        if len(found) == _KEY_BYTES:
            return found, None
        problem = f"{len(found)} bytes, not {_KEY_BYTES}"
    except FileNotFoundError:
        problem = None
    except UnsafeFile as exc:
        problem = str(exc)
    key = _write_key(folder, path, replace=problem is not None)
    note = (f"floor cache: its key file {path} was {problem}; replaced it, so every kept floor is measured again"
            if problem is not None else None)
    return key, note


def _write_key(folder: Path, path: Path, *, replace: bool) -> bytes:
    """A fresh key written to a private temporary, then linked (or, replacing, renamed) into
    place: two processes creating it at once agree on the first one linked."""
    folder.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(_KEY_BYTES)
    tmp = folder / f"{KEY_NAME}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with open(fd, "wb", closefd=True) as fh:
            os.fchmod(fh.fileno(), 0o600)
            fh.write(key)
        if replace:
            os.replace(tmp, path)
            return key
        try:
            os.link(tmp, path)
        except FileExistsError:  # another process created it first: use theirs
            return read_small_regular(path, _KEY_BYTES, private=True)
        return key
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def signature(secret: bytes, entry_key: str, payload: dict) -> str:
    """HMAC-SHA256 over the entry's key and its canonical payload (so a valid entry copied
    under another key fails too)."""
    message = entry_key.encode() + b"\n" + json.dumps(payload, sort_keys=True).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()
