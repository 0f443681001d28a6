"""A long-lived ``node runner.js`` process and the binary protocol spoken with it.

Why a process per loaded model and not per call: starting Node and ``require``-ing tfjs costs
300-500 ms, a warm predict over a pipe costs well under a millisecond more than tfjs's compute.

Protocol (documented in ``tfjs_runner/runner.js`` too): frames ``[u32 LE length][payload]``,
``payload[0]`` the message type; tensors are raw little-endian bytes after a small binary
header (name, dtype code, rank, dims) - no JSON for tensors and no temporary files per call.

Lifetime: the process must never outlive Python. Three independent guards:
  1. Python's end of stdin closes when Python exits (even on SIGKILL): the runner exits on EOF;
  2. ``weakref.finalize`` (also run at interpreter exit) terminates it when the model is
     garbage-collected or Python exits normally;
  3. on Linux, ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` makes the kernel kill it when the thread
     that started it exits (only set when started from the main thread, since a worker
     thread's exit would otherwise kill a process still in use).
A process that died during a call makes that call raise ``NodeProcessDied`` with the exit
status and the tail of its stderr; the tfjs model (``formats/tfjs/load.py``) starts a new one on its
next call. One that died while idle (nothing asked of it: killed between tests) fails nothing:
``reap_if_died_idle`` tells the model, which starts a new process before the call. A death that
reached Python before any byte of the answer (``NodeProcessDied.unanswered``: killed between
calls while the kill was still in flight on a loaded machine, out of memory) is not the call's:
the model retries a load or predict once on a new process, and fails only when that dies too.

Start-up is a handshake with its own short limit (``handshake_timeout_s``, 30 s): runner.js
sends an ``S`` frame before it requires tfjs, so a ``node`` on PATH that never answers (a hung
wrapper, not Node.js at all) is named within seconds, apart from a model that loads slowly
(``timeout_s`` bounds the load after the handshake, and each predict).

Besides ``predict``, ``fetch`` asks for named graph nodes (``model.execute(inputs, nodes)``):
the intermediate tensors the layer table of the diagnosis compares.

One exchange at a time: ``predict`` holds a lock from the first byte written to the last byte
read, so threads sharing a model are served in turn. ``timeout_s`` bounds the whole exchange,
writing included (stdin is non-blocking: a large batch to a stopped process cannot hang). A call
interrupted half-way (KeyboardInterrupt, a signal handler's exception) would leave a partial
frame in one pipe or an unread answer in the other, so the process is killed and the model says
so on its next call rather than answering the next batch with the previous batch's outputs.
"""

from __future__ import annotations

import collections
import json
import math
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

__all__ = ["HANDSHAKE_TIMEOUT_S", "NodeHandshakeFailed", "NodeProcess", "NodeProcessDied", "RunnerError",
           "encode_tensors", "decode_tensors", "retry_unanswered"]

T = TypeVar("T")

_DTYPE_CODES = {np.dtype("float32"): 0, np.dtype("int32"): 1, np.dtype("bool"): 2}
_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}
_U32 = struct.Struct("<I")
_MAX_FRAME = 2**32 - 1
_WRITE_CHUNK = 1 << 20
_READ_CHUNK = 1 << 22
_STDERR_LINES = 40
# Node prints its first frame before requiring tfjs: tens of milliseconds, seconds on a loaded machine.
HANDSHAKE_TIMEOUT_S = 30.0


class RunnerError(RuntimeError):
    """The Node.js runner reported an error (it is still alive and usable)."""


class NodeProcessDied(RuntimeError):
    """The Node.js process serving a tfjs model is gone (``timed_out``: Python killed it after
    its time limit); the tfjs model starts a new one on its next call.

    ``unanswered``: it died (not killed by Python) before sending any byte of the answer to the
    request in flight, or before the request: nothing of the call reached Python, so a request
    that changes nothing (a load, a predict) may be sent again to a new process. A death after
    part of the answer, a timeout or a process that was already dead is never ``unanswered``."""

    timed_out = False
    unanswered = False


class NodeHandshakeFailed(NodeProcessDied):
    """``node`` started but never answered runner.js's first frame: the runtime itself is broken
    (a hung wrapper on PATH, not Node.js), so no backend or retry can help."""


def encode_tensors(tensors: Mapping[str, np.ndarray]) -> bytes:
    """``u16 count`` then per tensor: name, dtype code, rank, u32 dims, raw little-endian data."""
    if len(tensors) > 0xFFFF:
        raise ValueError(f"{len(tensors)} tensors in one batch; the tfjs runner takes at most 65535")
    parts = [struct.pack("<H", len(tensors))]
    for name, value in tensors.items():
        arr = np.asarray(value)
        native = arr.dtype.newbyteorder("=")
        if native not in _DTYPE_CODES:
            raise TypeError(f"tfjs input {name!r} has dtype {arr.dtype.name}; tfjs takes float32, int32 or bool")
        arr = arr.astype(native.newbyteorder("<"), order="C", copy=False)  # keeps rank 0
        raw_name = name.encode("utf-8")
        parts.append(struct.pack(f"<H{len(raw_name)}sBB{arr.ndim}I", len(raw_name), raw_name,
                                 _DTYPE_CODES[native], arr.ndim, *arr.shape))
        parts.append(arr.tobytes())
    return b"".join(parts)


def decode_tensors(buf: memoryview | bytes, offset: int = 0) -> dict[str, np.ndarray]:
    """Inverse of :func:`encode_tensors`; the arrays own their memory."""
    buf = memoryview(buf)
    (count,) = struct.unpack_from("<H", buf, offset)
    offset += 2
    out: dict[str, np.ndarray] = {}
    for _ in range(count):
        (name_len,) = struct.unpack_from("<H", buf, offset)
        offset += 2
        name = bytes(buf[offset:offset + name_len]).decode("utf-8")
        offset += name_len
        code, rank = struct.unpack_from("<BB", buf, offset)
        offset += 2
        shape = struct.unpack_from(f"<{rank}I", buf, offset)
        offset += 4 * rank
        dtype = _CODE_DTYPES[code]
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        arr = np.frombuffer(buf[offset:offset + nbytes], dtype=dtype.newbyteorder("<")).reshape(shape)
        out[name] = arr.astype(dtype, copy=True)
        offset += nbytes
    return out


def _pdeathsig_hook(sig: int = int(signal.SIGKILL)) -> Any:
    """A preexec_fn setting PR_SET_PDEATHSIG (``sig``), or None when prctl is unavailable.

    libc and prctl are resolved here, in the parent: the child between fork and exec must not
    import anything (another thread may hold the import lock at fork time).
    """
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:  # runs in the child between fork and exec
        prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG = 1

    return hook


def _grow_pipes(*streams: Any) -> None:
    """Ask Linux for 1 MiB pipe buffers (default 64 KiB): fewer wake-ups per MB-sized batch."""
    try:
        import fcntl
    except ImportError:
        return
    for stream in streams:
        try:
            fcntl.fcntl(stream.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        except OSError:  # not Linux, or above /proc/sys/fs/pipe-max-size: the default works too
            pass


def _kill_group(pgid: int) -> None:
    """SIGKILL what is left of a process group (a browser's children, a hung fake browser)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _terminate(proc: subprocess.Popen, group: bool = False) -> None:
    """Stop ``proc``: close stdin (the runner exits on EOF), then terminate, then kill; with
    ``group`` (it leads its own process group) whatever is left of that group goes too."""
    try:
        _terminate_one(proc)
    finally:
        if group:
            _kill_group(proc.pid)


def _terminate_one(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        if proc.stdin and not proc.stdin.closed:
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=1.0)
        return
    except subprocess.TimeoutExpired:
        pass
    proc.terminate()
    try:
        proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class NodeProcess:
    """One ``node runner.js <model.json> <backend>`` process; ``predict`` is a round trip."""

    def __init__(self, model_json: str | Path, *, backend: str, node: str, runner_js: Path,
                 node_modules: Path, description: str, timeout_s: float | None = 600.0,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S, env: Mapping[str, str] | None = None,
                 own_group: bool = False) -> None:
        self.description = description
        self.timeout_s = timeout_s
        self.node = node
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self.last_compute_ms: float | None = None
        self.execution: str | None = None  # "execute" or "executeAsync" (control flow), once known
        self._lock = threading.Lock()
        self._dead: str | None = None
        self._reported = False
        self._answer_bytes = 0  # bytes of the current answer read so far (a death before any may be retried)
        self._closing = False  # close() was called: a death after it is Python's doing, never retried
        # Called in a call once the process was found alive, before the request's first byte is
        # written (tests: a kill still in flight as a call starts, which a fast model's answer
        # cannot outrun); None in use.
        self.before_request: Any = None
        full_env = dict(os.environ, MODELPARITY_TFJS_MODULES=str(node_modules), **(env or {}))
        on_linux_main = sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread()
        # own_group: the process leads a new process group (and session), so that everything it
        # starts (a browser and the browser's children) can be killed at once (``_kill``); its
        # death signal is then SIGTERM, which it handles by cleaning up after itself.
        self._group = own_group and os.name == "posix"
        death = _pdeathsig_hook(int(signal.SIGTERM) if self._group else int(signal.SIGKILL))
        self.proc = subprocess.Popen(
            [node, str(runner_js), str(model_json), backend],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env,
            preexec_fn=death if on_linux_main else None, bufsize=0, start_new_session=self._group)
        self.pid = self.proc.pid
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both are PIPEs
        os.set_blocking(self.proc.stdin.fileno(), False)  # non-blocking: writes honour timeout_s
        _grow_pipes(self.proc.stdin, self.proc.stdout)
        self._finalizer = weakref.finalize(self, _terminate, self.proc, self._group)
        self._stderr_thread = threading.Thread(target=self._drain_stderr, name=f"tfjs-stderr-{self.pid}",
                                               daemon=True)
        self._stderr_thread.start()
        try:
            self._handshake(min(handshake_timeout_s, timeout_s) if timeout_s else handshake_timeout_s)
            self._answer_bytes = 0  # the load's answer starts here
            try:
                kind, payload = self._read_frame(self._deadline())
            except NodeProcessDied as exc:
                exc.unanswered = not exc.timed_out and self._answer_bytes == 0
                raise
        except BaseException:  # KeyboardInterrupt, a signal handler's exception: nothing may stay behind
            if self.proc.poll() is None:
                self._kill()
            self._finalizer()
            raise
        if kind == "E":
            self.close()
            raise RunnerError(payload.tobytes().decode("utf-8", "replace"))
        if kind != "H":
            self.close()
            raise NodeProcessDied(f"{self.description}: unexpected first message {kind!r} from the runner")
        self.meta: dict[str, Any] = json.loads(payload.tobytes().decode("utf-8"))

    def _handshake(self, limit: float) -> None:
        """Wait (at most ``limit`` s) for runner.js's ``S`` frame: proof that Node runs it."""
        try:
            kind, body = self._read_frame(time.monotonic() + limit, timeout_what=f"{limit:g} s")
        except NodeProcessDied as exc:
            if not exc.timed_out and (self.proc.returncode or 0) < 0:
                exc.unanswered = True  # killed by a signal (the OOM killer) as it started: no broken node
                raise
            what = str(exc).split("\n  fix:")[0]
            raise NodeHandshakeFailed(
                f"{what}\n  Node.js ({self.node!r}) did not complete runner.js's start-up handshake within "
                f"{limit:g} s (handshake_timeout_s): it is hung, or not Node.js (a wrapper script on PATH?)\n"
                f"  fix: check that `{self.node} --version` answers at once, or put a working Node.js >= 18 "
                f"first on PATH") from None
        if kind == "E":
            self.close()
            raise RunnerError(body.tobytes().decode("utf-8", "replace"))
        if kind != "S":
            self.close()
            raise NodeHandshakeFailed(f"{self.description}: Node.js ({self.node!r}) answered {kind!r} instead of "
                                      "runner.js's handshake; is this runner.js from the same pytest-modelparity?")

    # -- I/O ---------------------------------------------------------------------------
    def _drain_stderr(self) -> None:
        stream = self.proc.stderr
        assert stream is not None
        for line in iter(stream.readline, b""):
            self.stderr_tail.append(line.decode("utf-8", "replace").rstrip())

    def _died(self, while_doing: str) -> NodeProcessDied:
        try:
            code = self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            code = None
        self._stderr_thread.join(timeout=1.0)
        if code is None:
            status = "stopped answering"
        elif code < 0:
            try:
                status = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                status = f"was killed by signal {-code}"
        else:
            status = f"exited with code {code}"
        tail = "\n".join(f"    {line}" for line in self.stderr_tail) or "    (nothing)"
        self._dead = (f"{self.description}: the Node.js process (pid {self.pid}) {status} {while_doing}.\n"
                      f"  stderr tail:\n{tail}\n"
                      f"  fix: nothing to do for the next call: it starts a new Node.js process and loads the "
                      f"model again; if that dies too, the stderr tail above says why")
        self._finalizer()
        return NodeProcessDied(self._dead)

    def _deadline(self) -> float | None:
        return None if self.timeout_s is None else time.monotonic() + self.timeout_s

    @staticmethod
    def _wait_ready(fd: int, events: int, deadline: float | None) -> None:
        """Block until ``fd`` is ready (or closed at the other end); TimeoutError past ``deadline``."""
        poller = select.poll()  # not select(): it fails on descriptors above 1023
        poller.register(fd, events)
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError
            if poller.poll(None if remaining is None else max(1, math.ceil(remaining * 1000))):
                return

    def _write_all(self, data: bytes, deadline: float | None) -> None:
        stream = self.proc.stdin  # non-blocking: waits happen in poll, under the deadline
        assert stream is not None
        fd = stream.fileno()
        view = memoryview(data)
        while view:
            self._wait_ready(fd, select.POLLOUT, deadline)
            try:
                written = os.write(fd, view[:_WRITE_CHUNK])
            except BlockingIOError:
                continue
            view = view[written:]

    def _read_exact(self, n: int, deadline: float | None) -> bytearray:
        """Read ``n`` bytes. The buffer grows as bytes arrive: a corrupt length (garbage on
        stdout) must not allocate gigabytes up front; it runs into the deadline instead."""
        stream = self.proc.stdout  # unbuffered, so poll() sees exactly what is unread
        assert stream is not None
        fd = stream.fileno()
        buf = bytearray()
        while len(buf) < n:
            self._wait_ready(fd, select.POLLIN, deadline)
            chunk = stream.read(min(n - len(buf), _READ_CHUNK))
            if not chunk:
                raise EOFError
            self._answer_bytes += len(chunk)
            buf += chunk
        return buf

    def _read_frame(self, deadline: float | None, *, timeout_what: str | None = None) -> tuple[str, memoryview]:
        try:
            (length,) = _U32.unpack(self._read_exact(4, deadline))
            if length == 0:
                raise ValueError("empty frame")
            payload = memoryview(self._read_exact(length, deadline))
        except TimeoutError:
            raise self._timed_out(timeout_what) from None
        except (EOFError, OSError, ValueError):
            raise self._died("while Python waited for its answer") from None
        return chr(payload[0]), payload[1:]

    def _kill(self) -> None:
        """SIGKILL the process (and its whole group, when it leads one)."""
        self.proc.kill()
        if self._group:
            _kill_group(self.pid)

    def _timed_out(self, limit: str | None = None) -> NodeProcessDied:
        self._kill()
        limit = limit or (f"{self.timeout_s:g} s (timeout_s; the plugin's --modelparity-timeout)")
        exc = self._died(f"after not answering within {limit}, so Python killed it")
        exc.timed_out = True
        return exc

    # -- API ---------------------------------------------------------------------------
    @property
    def reported_dead(self) -> bool:
        """True once a call has failed with ``NodeProcessDied``: only then may a new process
        replace this one (an interrupted call kills it without telling; the next call does)."""
        return self._reported

    @property
    def alive(self) -> bool:
        return self._dead is None and self.proc.poll() is None

    @property
    def death(self) -> str | None:
        """What ended the process (its exit status, what Python was doing, its stderr tail), or None."""
        return self._dead

    def reap_if_died_idle(self) -> str | None:
        """What happened, when the process exited while nothing was asked of it (killed between
        tests, out of memory while idle), else None. Such a death fails no call: the model
        starts a new process before the next one. A death during a call still fails that call."""
        if self._dead is not None or (self.proc.poll() is None and not _exiting(self.pid)) \
                or not self._lock.acquire(blocking=False):
            return None
        try:
            if self._dead is not None:
                return None
            self._died("while idle between calls")
            self._reported = True
            return self._dead
        finally:
            self._lock.release()

    def exchange(self, message: bytes) -> tuple[str, memoryview]:
        """Send one frame (``message`` = type byte + body), return the answer's type and body."""
        with self._lock:
            return self._exchange(message)

    def _exchange(self, message: bytes) -> tuple[str, memoryview]:
        already_dead = self._dead is not None
        self._answer_bytes = 0
        try:
            return self._exchange_once(message)
        except NodeProcessDied as exc:
            self._reported = True  # a caller has been told: the model may start a new process now
            exc.unanswered = not (already_dead or exc.timed_out or self._closing) and self._answer_bytes == 0
            raise

    def _exchange_once(self, message: bytes) -> tuple[str, memoryview]:
        if len(message) > _MAX_FRAME:
            raise ValueError(f"{self.description}: this batch is {len(message)} bytes, more than one frame of the "
                             f"runner's protocol carries (4 GiB); split it into smaller batches")
        if self._dead is not None:
            raise NodeProcessDied(self._dead)
        if self.proc.poll() is not None:
            raise self._died("before this call")
        deadline = self._deadline()  # one deadline for the whole exchange, writing included
        if self.before_request is not None:
            self.before_request()
        try:
            try:
                self._write_all(_U32.pack(len(message)) + message, deadline)
            except TimeoutError:
                raise self._timed_out() from None
            except (BrokenPipeError, OSError, ValueError):
                raise self._died("while Python sent it a batch") from None
            return self._read_frame(deadline)
        except NodeProcessDied:
            raise
        except BaseException as exc:  # interrupted mid-exchange: the pipes are out of step now
            self._kill()
            self._died(f"because a call was interrupted ({type(exc).__name__}) half-way through an exchange, "
                       f"which leaves the protocol out of step, so Python killed it")
            raise

    def predict(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Send the inputs, wait for the outputs; ``last_compute_ms`` is tfjs's own time in Node.

        Threads sharing this process are served one at a time (a lock spans the exchange).
        """
        return self._run(b"P" + encode_tensors(feeds))

    def fetch(self, feeds: Mapping[str, np.ndarray], nodes: Sequence[str], *,
              max_bytes: int = 256 << 20) -> dict[str, np.ndarray]:
        """Run on ``feeds`` and return the named graph nodes' outputs (``model.execute(inputs,
        nodes)``), by node name, in the order asked.

        Why a budget: intermediates of a real model can be far larger than its outputs; tensors
        past ``max_bytes`` (in the order asked), and those of a dtype the protocol lacks, are
        left out of the answer rather than failing it.
        """
        if not nodes:
            raise ValueError("fetch() needs at least one node name")
        if len(nodes) > 0xFFFF:
            raise ValueError(f"{len(nodes)} nodes in one fetch; the tfjs runner takes at most 65535")
        head = [struct.pack("<IH", min(int(max_bytes), 0xFFFFFFFF), len(nodes))]
        for name in nodes:
            raw = name.encode("utf-8")
            head.append(struct.pack(f"<H{len(raw)}s", len(raw), raw))
        return self._run(b"I" + b"".join(head) + encode_tensors(feeds))

    def _run(self, message: bytes) -> dict[str, np.ndarray]:
        with self._lock:
            kind, payload = self._exchange(message)
            if kind == "R":
                ms, mode = struct.unpack_from("<dB", payload, 0)
                self.last_compute_ms, self.execution = ms, ("execute", "executeAsync")[mode]
        if kind == "E":
            raise RunnerError(f"{self.description}: {payload.tobytes().decode('utf-8', 'replace')}")
        if kind != "R":
            raise RunnerError(f"{self.description}: unexpected message {kind!r} from the runner")
        return decode_tensors(payload, 9)

    def close(self) -> None:
        """Stop the process (idempotent).

        If another thread is in the middle of an exchange, its pipes are not closed under it (a
        closed descriptor number can be reused by another file before it writes again): node is
        killed instead, that call fails with ``NodeProcessDied`` and cleans up.
        """
        self._closing = True
        if self._dead is None:
            self._dead = f"{self.description}: the model was closed; load it again to predict"
        if self._lock.acquire(blocking=False):
            try:
                self._finalizer()
            finally:
                self._lock.release()
        elif self.proc.poll() is None:
            self._kill()


def _cause(exc: BaseException) -> str:
    """A death's text without the model's name and its fix line, indented under a heading."""
    text = str(exc).split("\n  fix: ")[0]
    start = text.find("the Node.js process (pid ")
    return (text[start:] if start > 0 else text).replace("\n", "\n  ")


def retry_unanswered(call: Callable[[], T], description: str) -> T:
    """``call()``, made once more when it failed with a death that reached Python before any byte
    of the answer (``NodeProcessDied.unanswered``): such a death is not the call's (a kill still
    in flight from between calls, the OOM killer picking Node), and the request changes nothing,
    so a new process may answer it. ``call`` must get a fresh process when the last one was
    reported dead. A second such death fails, naming both; any other failure is raised as it is."""
    try:
        return call()
    except NodeProcessDied as exc:
        if not exc.unanswered:
            raise
        first = exc
    try:
        return call()
    except NodeProcessDied as exc:
        if not exc.unanswered:
            raise
        raise NodeProcessDied(
            f"{description}: the Node.js process died before answering, then its replacement died too on the same "
            f"request (a death before any byte of the answer is retried once on a new process)\n"
            f"  first death: {_cause(first)}\n  second death: {_cause(exc)}\n"
            f"  fix: a death on every try is not chance: the stderr tails above say why (out of memory: give "
            f"Node.js more memory or send smaller batches; a crash in tfjs: try the other backend); the next call "
            f"starts a new Node.js process again") from None  # both are in its text


def _exiting(pid: int) -> bool:
    """True while a killed process's thread group is still going down: its leader shows as a
    zombie in /proc before waitpid can report it (node has many threads), so a call made then
    would fail as if the death happened during it. Linux only; elsewhere False."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False
