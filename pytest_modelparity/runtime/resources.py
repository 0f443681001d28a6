"""Machine limits: how much memory is free, and what a failure caused by a limit means.

Why one module: a full disk, a file-size limit, memory or thread exhaustion surface as a dozen
different exception types (``OSError`` errno EFBIG/ENOSPC, ``MemoryError``, TensorFlow's
``ResourceExhaustedError``/``OutOfRangeError``, ``RuntimeError: can't start new thread``), and
each converter used to wrap them in its own, wrong, fix ("check permissions", "export a
functional model"). :func:`resource_failure` names the limit whatever wrapped it;
:func:`check_allocation` refuses an array before numpy tries to allocate it. No TensorFlow here.
"""

from __future__ import annotations

import os

import errno
import re
from typing import Any, Iterator

from ..errors import InvalidArgumentError

__all__ = ["address_space_limit", "available_memory", "check_allocation", "human_bytes", "memory_hint",
           "resource_failure"]


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (``MemAvailable``), lowered by
    ``RLIMIT_AS`` when one is set; None when neither is known (not Linux)."""
    found: list[int] = []
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            found.append(max(0, int(soft) - _mapped()))  # what is left of the address-space limit
    except (ImportError, OSError, ValueError):
        pass
    return min(found) if found else None


def _mapped() -> int:
    """This process's address space in use (``VmSize``), 0 when unknown."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def address_space_limit() -> int | None:
    """This process's ``RLIMIT_AS`` soft limit in bytes (what ``ulimit -v`` set), None when unlimited."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


class AddressSpaceReserve:
    """Address space held back under an address-space limit (``ulimit -v``), given back when a
    test has used up the rest, so pytest can still report it and tear it down. Without it, a test
    that left 8-32 MB of a 900 MB limit failed its session in 2 runs of 24-32: an allocation
    inside pluggy or the runtest loop, after the failure's report, raised MemoryError outside any
    hook (an uncaught traceback, or INTERNALERROR), before the fixture holding the memory was
    torn down. An anonymous map that is never touched: it takes address space, not memory. 16 MB:
    with 64 MB held, the 1.1 GB-limit session of tests/test_session_faults.py did not end in 180 s
    (it ends in 7 s with 16 MB or none; why is not yet understood)."""

    SIZE = 16 << 20

    def __init__(self) -> None:
        self._map: Any = None

    def hold(self) -> bool:
        """Take the reserve (again) when under a limit and there is room; True when held."""
        if self._map is None and address_space_limit() is not None:
            import mmap

            try:
                self._map = mmap.mmap(-1, self.SIZE)
            except (OSError, ValueError, MemoryError):  # no room now: the next hold tries again
                self._map = None
        return self._map is not None

    def release(self) -> bool:
        """Give the reserve back; True when there was one."""
        if self._map is None:
            return False
        self._map.close()
        self._map = None
        return True

    def release_if_short(self) -> bool:
        """Give it back when less than its size of address space is left (True when given)."""
        limit = address_space_limit()
        if self._map is None or limit is None:
            return False
        try:
            mapped = _mapped()
        except MemoryError:
            mapped = 0
        if not mapped:
            return self.release()  # cannot tell: the safe side
        return self.release() if limit - mapped < self.SIZE else False


def one_blas_thread_under_a_limit() -> bool:
    """Under an address-space limit (``ulimit -v``), cap OpenBLAS at one thread unless the user
    chose a number (``OPENBLAS_NUM_THREADS``); True when set here. Called before TensorFlow is
    imported: Keras imports scikit-learn, whose SciPy loads its own OpenBLAS, and OpenBLAS sizes a
    buffer per thread as it loads. Under a 1.1 GB ``ulimit -v`` that load spun at 100% CPU and the
    session never ended (measured on 2 cores; more cores, more buffers); with one thread the same
    session ended in 5 s with the out-of-memory report. TensorFlow's own kernels do not use OpenBLAS."""
    if address_space_limit() is None or "OPENBLAS_NUM_THREADS" in os.environ:
        return False
    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # the export worker inherits it
    return True


def memory_hint(exc: BaseException) -> str | None:
    """One paragraph for a test that failed for lack of memory (a ``MemoryError``, a library that
    could not be mapped), naming the address-space limit when one is set; None otherwise."""
    hit = _limit_hit(exc)
    if hit is None or hit[0] != "memory":
        return None
    limit = address_space_limit()
    where = (f"this process runs under an address-space limit of {human_bytes(limit)} (`ulimit -v`, "
             f"RLIMIT_AS), and " if limit is not None else "")
    return (f"out of memory: {where}{_describe(hit[1])}\n"
            "fix: raise the limit (`ulimit -v unlimited`, or a larger value; TensorFlow alone maps about 1.5 GB "
            "of address space, a converter more) or free memory; docs/model-size.md lists what each format needs")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover - the loop returns


def check_allocation(nbytes: int, what: str, *, limit: int | None = None, share: float = 0.5) -> None:
    """Refuse an allocation of ``nbytes`` before making it: over ``limit`` (a runtime's own),
    or over ``share`` of the memory available now. ``InvalidArgumentError`` names the size."""
    if limit is not None and nbytes > limit:
        raise InvalidArgumentError(f"{what} would take {human_bytes(nbytes)}, more than the "
                                   f"{human_bytes(limit)} this runtime takes; use a smaller batch or shape")
    free = available_memory()
    if free is not None and nbytes > share * free:
        raise InvalidArgumentError(f"{what} would take {human_bytes(nbytes)}, more than {share:.0%} of the "
                                   f"{human_bytes(free)} of memory available now; use a smaller batch or shape")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


# (words in the message, kind) for errors that carry no errno (TensorFlow's, the converters').
_WORDS = (("File too large", "file_too_large"), ("No space left", "disk_full"),
          ("can't start new thread", "threads"), ("Resource temporarily unavailable", "threads"),
          ("pthread_create", "threads"), ("std::bad_alloc", "memory"), ("Unable to allocate", "memory"),
          ("out of memory", "memory"), ("OOM when allocating", "memory"),
          # the dynamic loader could not map a library: an address-space limit (ulimit -v) hit
          ("failed to map segment", "memory"), ("cannot allocate memory", "memory"),
          # CPython's C code that failed an allocation without saying so (seen under RLIMIT_AS)
          ("error return without exception set", "memory"),
          # CPython could not allocate a lock (RuntimeError: can't allocate read lock / lock)
          ("can't allocate read lock", "memory"), ("can't allocate lock", "memory"),
          ("returned NULL without setting an exception", "memory"),
          # protobuf could not allocate its arena (a DecodeError while parsing a graph under RLIMIT_AS)
          ("Arena alloc failed", "memory"))
_ERRNOS = {errno.EFBIG: "file_too_large", errno.ENOSPC: "disk_full", errno.EDQUOT: "disk_full",
           errno.ENOMEM: "memory", errno.EAGAIN: "threads"}


def _limit_hit(exc: BaseException) -> tuple[str, BaseException] | None:
    """The kind of limit and the deepest exception in ``exc``'s chain that says so (wrappers
    repeat their cause's words), or None."""
    found: tuple[str, BaseException] | None = None
    for current in _chain(exc):
        if isinstance(current, MemoryError):
            found = "memory", current
        elif isinstance(current, OSError) and current.errno in _ERRNOS:
            found = _ERRNOS[current.errno], current
        elif not isinstance(current, AssertionError):  # an assertion's words are the test's own
            text = str(current)
            found = next(((kind, current) for words, kind in _WORDS if words in text), found)
    return found


def resource_kind(exc: BaseException) -> str | None:
    """``file_too_large``, ``disk_full``, ``memory`` or ``threads`` when ``exc`` (or what it
    wraps) is a machine limit, else None."""
    hit = _limit_hit(exc)
    return None if hit is None else hit[0]


def _describe(exc: BaseException) -> str:
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", str(exc)).strip()  # TensorFlow's op prefix
    text = text.splitlines()[0][:200] if text else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def resource_failure(exc: BaseException, where: str) -> tuple[str, str] | None:
    """``(problem, fix)`` when ``exc`` is a machine limit; ``where`` is the directory written."""
    hit = _limit_hit(exc)
    if hit is None:
        return None
    kind, detail = hit[0], _describe(hit[1])
    free = available_memory()
    if kind == "file_too_large":
        return (f"a file grew past the file-size limit ({detail})",
                "raise the limit (`ulimit -f unlimited` in the shell that runs pytest) or export a smaller model")
    if kind == "disk_full":
        return (f"the disk is full ({detail})", f"free disk space on the filesystem of {where}, or export to "
                "another directory (--modelparity-cache-dir)")
    if kind == "memory":
        have = f"; {human_bytes(free)} available now" if free is not None else ""
        limit = address_space_limit()
        if limit is not None:
            have += f", under an address-space limit of {human_bytes(limit)} (ulimit -v)"
        return (f"out of memory ({detail}{have})",
                "free memory or raise the memory limit (`ulimit -v`, the container's limit); exports of large "
                "models need several times their weights' size (docs/model-size.md)")
    return _thread_failure(detail)


def _thread_failure(detail: str) -> tuple[str, str]:
    """Which limit stopped a thread: each thread's stack takes address space, so under
    ``ulimit -v`` that is the cause far more often than the process count (``ulimit -u``)."""
    fewer = "OMP_NUM_THREADS=1 and TF_NUM_INTEROP_THREADS=1 lower the threads TensorFlow starts"
    limit = address_space_limit()
    if limit is not None:
        return (f"no new thread could be started ({detail}) under an address-space limit of "
                f"{human_bytes(limit)} (ulimit -v): every thread's stack takes address space",
                f"raise the address-space limit (`ulimit -v unlimited`, or a larger value; TensorFlow alone maps "
                f"about 1.5 GB); {fewer}")
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    except (ImportError, OSError, ValueError, AttributeError):
        soft = -1
    if soft not in (-1, getattr(resource, "RLIM_INFINITY", -1)):
        return (f"no new thread could be started ({detail}) under a process/thread limit of {soft} (ulimit -u)",
                f"raise it (`ulimit -u`), or run fewer pytest-xdist workers; {fewer}")
    return (f"no new thread could be started ({detail}); neither `ulimit -u` nor `ulimit -v` is set, so the "
            "system's own thread limit was reached (the container's pids limit, kernel.threads-max) or memory "
            "ran short",
            f"raise the container's pids limit or run fewer pytest-xdist workers; {fewer}")
