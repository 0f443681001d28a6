"""Reading a user's model file: regular files only, and never more bytes than fit.

Why: ``open()`` on a FIFO blocks until a writer appears (forever, in a test run), and a
symlink to ``/dev/zero`` reads until memory runs out. The file is opened with ``O_NONBLOCK``
(a FIFO then opens at once) and checked with ``fstat`` on the open descriptor (no race
between the check and the read); its size is checked against the memory available before a
byte is read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import ModelLoadError
from ..runtime.resources import available_memory, human_bytes

__all__ = ["check_not_special", "read_regular", "special_kind"]

# A model file is read whole; keep room for what the runtime builds from it.
_MEMORY_SHARE = 0.8


def special_kind(mode: int) -> str | None:
    """What a file that is neither regular nor a directory is ("a FIFO (named pipe)", ...), else None."""
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return None


def _special_error(path: Path, format: str | None, kind: str) -> ModelLoadError:
    target = os.path.realpath(path)
    via = f" (the link leads to {target})" if target != os.path.abspath(path) else ""
    return ModelLoadError(path, format, f"this is {kind}{via}, not a regular file; model files are read only "
                          "when they are regular files (reading a pipe or a device could block or never end)",
                          "pass the model file itself (copy what the pipe or device would produce into a file)")


def check_not_special(path: str | Path, format: str | None) -> None:
    """Raise ``ModelLoadError`` at once when ``path`` (links followed) is a FIFO, device or socket."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # missing or unreadable: the caller's own check says so
    kind = special_kind(mode)
    if kind is not None:
        raise _special_error(Path(path), format, kind)


def read_regular(path: Path, format: str) -> bytes:
    """The bytes of regular file ``path``; ``ModelLoadError`` for anything else, or for a file
    larger than the memory available."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ModelLoadError(path, format, f"cannot be read: {exc.strerror or exc}",
                             "check the file's permissions") from exc
    with open(fd, "rb", closefd=True) as fh:
        info = os.fstat(fd)
        kind = special_kind(info.st_mode)
        if kind is not None:
            raise _special_error(path, format, kind)
        if stat.S_ISDIR(info.st_mode):
            raise ModelLoadError(path, format, "this is a directory, not a model file",
                                 "pass the model file inside it, or the format that matches the directory")
        size = info.st_size
        free = available_memory()
        if free is not None and size > _MEMORY_SHARE * free:
            raise ModelLoadError(path, format, f"the file is {human_bytes(size)}, and only {human_bytes(free)} of "
                                 "memory is available to read it into", "free memory, or load it on a larger machine")
        os.set_blocking(fd, True)
        try:
            content = fh.read(size + 1)  # one byte more: a file that grows while read is seen
        except OSError as exc:
            raise ModelLoadError(path, format, f"cannot be read: {exc.strerror or exc}",
                                 "check the file's permissions") from exc
    if len(content) > size:
        raise ModelLoadError(path, format, f"the file grew while it was read (from {size} bytes)",
                             "wait until whatever writes it has finished, then load it")
    return content
