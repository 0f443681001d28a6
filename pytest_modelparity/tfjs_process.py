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
A process that died anyway makes the next call raise ``NodeProcessDied`` with the exit status
and the tail of its stderr; loading the model again starts a new one.
"""

from __future__ import annotations

import collections
import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Mapping

import numpy as np

__all__ = ["NodeProcess", "NodeProcessDied", "RunnerError", "encode_tensors", "decode_tensors"]

_DTYPE_CODES = {np.dtype("float32"): 0, np.dtype("int32"): 1, np.dtype("bool"): 2}
_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}
_U32 = struct.Struct("<I")
_STDERR_LINES = 40


class RunnerError(RuntimeError):
    """The Node.js runner reported an error (it is still alive and usable)."""


class NodeProcessDied(RuntimeError):
    """The Node.js process serving a tfjs model is gone; load the model again for a new one."""


def encode_tensors(tensors: Mapping[str, np.ndarray]) -> bytes:
    """``u16 count`` then per tensor: name, dtype code, rank, u32 dims, raw little-endian data."""
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


def _pdeathsig_hook() -> Any:
    """A preexec_fn setting PR_SET_PDEATHSIG, or None when prctl is unavailable.

    libc and prctl are resolved here, in the parent: the child between fork and exec must not
    import anything (another thread may hold the import lock at fork time).
    """
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    kill = int(signal.SIGKILL)

    def hook() -> None:  # runs in the child between fork and exec
        prctl(1, kill, 0, 0, 0)  # PR_SET_PDEATHSIG = 1

    return hook


def _terminate(proc: subprocess.Popen) -> None:
    """Stop ``proc``: close stdin (the runner exits on EOF), then terminate, then kill."""
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
                 node_modules: Path, description: str, timeout_s: float | None = 600.0) -> None:
        self.description = description
        self.timeout_s = timeout_s
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self.last_compute_ms: float | None = None
        self._lock = threading.Lock()
        self._dead: str | None = None
        env = dict(os.environ, MODELPARITY_TFJS_MODULES=str(node_modules))
        on_linux_main = sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(
            [node, str(runner_js), str(model_json), backend],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
            preexec_fn=_pdeathsig_hook() if on_linux_main else None, bufsize=0)
        self.pid = self.proc.pid
        self._finalizer = weakref.finalize(self, _terminate, self.proc)
        self._stderr_thread = threading.Thread(target=self._drain_stderr, name=f"tfjs-stderr-{self.pid}",
                                               daemon=True)
        self._stderr_thread.start()
        kind, payload = self._read_frame()
        if kind == "E":
            self.close()
            raise RunnerError(payload.tobytes().decode("utf-8", "replace"))
        if kind != "H":
            self.close()
            raise NodeProcessDied(f"{self.description}: unexpected first message {kind!r} from the runner")
        self.meta: dict[str, Any] = json.loads(payload.tobytes().decode("utf-8"))

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
                      f"  fix: load the model again (load_model(...)) to start a new process")
        self._finalizer()
        return NodeProcessDied(self._dead)

    def _write_all(self, data: bytes) -> None:
        stream = self.proc.stdin  # unbuffered: a write may take only part of a large frame
        assert stream is not None
        view = memoryview(data)
        while view:
            written = stream.write(view)
            view = view[written or 0:]

    def _read_exact(self, n: int, deadline: float | None) -> bytes:
        stream = self.proc.stdout  # unbuffered, so select() sees exactly what is unread
        assert stream is not None
        chunks = []
        while n:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([stream], [], [], remaining)[0]:
                    raise TimeoutError
            chunk = stream.read(n)
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _read_frame(self) -> tuple[str, memoryview]:
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        try:
            (length,) = _U32.unpack(self._read_exact(4, deadline))
            payload = memoryview(self._read_exact(length, deadline))
        except TimeoutError:
            self.proc.kill()
            raise self._died(f"after not answering within {self.timeout_s:g} s (timeout_s), so Python killed it") from None
        except (EOFError, OSError, ValueError):
            raise self._died("while Python waited for its answer") from None
        return chr(payload[0]), payload[1:]

    # -- API ---------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._dead is None and self.proc.poll() is None

    def predict(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Send the inputs, wait for the outputs; ``last_compute_ms`` is tfjs's own time in Node."""
        body = encode_tensors(feeds)
        with self._lock:
            if self._dead is not None:
                raise NodeProcessDied(self._dead)
            if self.proc.poll() is not None:
                raise self._died("before this call")
            frame = _U32.pack(len(body) + 1) + b"P" + body
            try:
                self._write_all(frame)
            except (BrokenPipeError, OSError, ValueError):
                raise self._died("while Python sent it a batch") from None
            kind, payload = self._read_frame()
        if kind == "E":
            raise RunnerError(f"{self.description}: {payload.tobytes().decode('utf-8', 'replace')}")
        if kind != "R":
            raise RunnerError(f"{self.description}: unexpected message {kind!r} from the runner")
        (self.last_compute_ms,) = struct.unpack_from("<d", payload, 0)
        return decode_tensors(payload, 8)

    def close(self) -> None:
        """Stop the process (idempotent)."""
        if self._dead is None:
            self._dead = f"{self.description}: the model was closed; load it again to predict"
        self._finalizer()
