"""Exports in a child process: a converter's abort, segfault, OOM kill or hang costs one
``ExportError``, never the test session.

Why: TF's TFLite converter calls ``abort()`` when it runs out of memory, tf2onnx peaks at
tens of times a model's weights, a SavedModel write can segfault; in-process, each of those
took the whole pytest session (no report written). Here the converters run in one
persistent worker (``python -m pytest_modelparity.exports.worker``, TensorFlow imported
once), the Keras model handed over as a ``.keras`` file saved once per model. The parent
watches it: the worker's death (signal or exit code), its peak memory (``VmHWM``), the
export's time against ``timeout_s``, and the tail of the log the worker writes.

A model that cannot be handed over (it does not save to ``.keras``, or its custom classes do
not load in a fresh process) and options that do not pickle (a function) are exported in
this process, as before; ``inline_reasons`` says which and why. No TensorFlow is imported
here in the parent.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import os
import pickle
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ExportError, InvalidArgumentError, ModelLoadError, NotSerializable, RuntimeMissing
from ..runtime.resources import address_space_limit, human_bytes, resource_failure
from ..runtime.scratch import owned_prefix

__all__ = ["ExportProcess"]

_LEN = struct.Struct("<Q")
_PARENT_ENV = "MODELPARITY_EXPORT_PARENT"  # the pid whose death ends the worker (_die_with_parent)
_POLL_S = 0.25
_LOG_TAIL = 8


def _send(stream: Any, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LEN.pack(len(data)) + data)
    stream.flush()


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _status(pid: int, field: bytes) -> int | None:
    """A memory figure of ``/proc/<pid>/status`` in bytes, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(field + b":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _peak_rss(pid: int) -> int | None:
    """The process's peak resident memory so far (``VmHWM``)."""
    return _status(pid, b"VmHWM")


def _how_it_ended(code: int | None, export_memory: int | None = None) -> tuple[str, str]:
    """``(what happened, fix)`` for the worker's exit status (``export_memory``: the address space
    one export may add, --modelparity-export-memory)."""
    if code is None:
        return "stopped answering", "see the converter log"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        if -code == signal.SIGKILL:
            return (f"was killed by {name} (what the kernel's OOM killer sends when memory runs out)",
                    "give the export more memory (or run fewer xdist workers); docs/model-size.md lists what "
                    "each format needs")
        if -code == signal.SIGABRT:
            return (f"aborted ({name}: the converter's C++ code failed a check, often for lack of memory)",
                    "see the converter log; if it says out of memory, give the export more memory")
        limit = address_space_limit()  # inherited by the worker: a failed allocation there often crashes
        if export_memory is not None:
            return (f"crashed ({name}) with its address space limited to {human_bytes(export_memory)} more per "
                    f"export (--modelparity-export-memory), where a failed allocation in C++ code often ends as a crash",
                    "raise --modelparity-export-memory; docs/model-size.md lists what each format needs")
        if limit is not None:
            return (f"crashed ({name}) under an address-space limit of {human_bytes(limit)} (ulimit -v), where a "
                    f"failed allocation in C++ code often ends as a crash",
                    "raise the limit (`ulimit -v unlimited`, or a larger value: TensorFlow alone maps about 1.5 GB "
                    "of address space, a converter more); docs/model-size.md lists what each format needs")
        return f"crashed ({name})", "see the converter log; the same export in a fresh Python shows the crash"
    return f"exited with code {code}", "see the converter log"


@dataclass
class _Ahead:
    """An export sent before its test asked for it (``ExportProcess.ahead``)."""

    request: dict
    folder: Path  # where the worker writes it, until the export that takes it moves it
    posted: tuple[subprocess.Popen, int, float]


def _moved(value: Any, here: dict[str, str]) -> Any:
    """``value`` with the paths of an export sent ahead put where its export wanted them."""
    if isinstance(value, str):
        for old, new in here.items():
            value = value.replace(old, new)
    return value


def _without_path(request: dict) -> bytes:
    return pickle.dumps({k: v for k, v in request.items() if k != "path"})


class ExportProcess:
    """One persistent export worker; ``export`` has :func:`formats.export_model`'s signature.

    ``timeout_s``: the most one export (with its validation) may take; the worker is killed
    past it. ``log_path``: the file the worker's output (TensorFlow, converters) is appended to.
    ``memory_limit``: bytes of address space one export may add (``RLIMIT_AS`` in the worker,
    set around each export); None: no limit. ``recycle_rss``: a worker holding more resident
    memory than this after an export is replaced before the next one (None: never).
    """

    def __init__(self, *, timeout_s: float | None = 600.0, log_path: str | Path | None = None,
                 memory_limit: int | None = None, recycle_rss: int | None = 2 << 30) -> None:
        self.timeout_s = timeout_s
        self.recycle_rss = recycle_rss
        self.memory_limit = memory_limit
        self.log_path = Path(log_path) if log_path is not None else None
        self.inline_reasons: list[str] = []
        self.peak_rss: int | None = None  # the worker's peak resident memory after its last export
        self._proc: subprocess.Popen | None = None
        self._reply_fd: int | None = None
        self._tmp: Path | None = None  # the worker's $TMPDIR, removed when it ends
        self._dir = Path(tempfile.mkdtemp(prefix=owned_prefix("modelparity-handover-")))
        self._handed: dict[str, Path] = {}  # weights digest -> .keras file
        self._ahead: _Ahead | None = None  # the export sent ahead of its test (``ahead``), not yet taken
        self._aheads = 0

    # -- the worker ------------------------------------------------------------------------
    def _start(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._forget()  # a worker that died while idle: its pipe and temporary folder go with it
        read_fd, write_fd = os.pipe()
        log_target: Any = subprocess.DEVNULL
        if self.log_path is not None:
            try:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                log_target = open(self.log_path, "ab")
            except OSError:
                log_target = subprocess.DEVNULL
        try:
            env = dict(os.environ)
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            here = str(Path(__file__).resolve().parent.parent)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
            # Everything TensorFlow and the converters put in $TMPDIR (their tmp* folders,
            # autograph's __autograph_generated_file*.py, tensorflowjs' intermediate SavedModel)
            # lands in a folder of this worker's own, removed when the worker ends, killed or
            # not; an owner-tagged name, so a run killed itself is swept by the next one.
            # A converter log an ExportError names must outlive the worker and its temporary
            # folder: kept beside the session's own log (under the cache), else where the
            # parent keeps them (formats/common.log_dir), never under the TMPDIR set next.
            env.setdefault("MODELPARITY_LOG_DIR", str(self.log_path.parent / "converters") if self.log_path
                           else os.path.join(tempfile.gettempdir(), "pytest-modelparity-logs"))
            self._tmp = Path(tempfile.mkdtemp(prefix=owned_prefix("modelparity-tmp-")))
            env["TMPDIR"] = str(self._tmp)
            if threading.current_thread() is threading.main_thread():  # see _die_with_parent
                env[_PARENT_ENV] = str(os.getpid())
            else:
                env.pop(_PARENT_ENV, None)
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "pytest_modelparity.exports.worker", str(write_fd),
                 str(self.log_path) if log_target is not subprocess.DEVNULL else ""],
                stdin=subprocess.PIPE, stdout=log_target, stderr=subprocess.STDOUT, pass_fds=(write_fd,), env=env)
        finally:
            os.close(write_fd)
            if log_target is not subprocess.DEVNULL:
                log_target.close()
        self._reply_fd = read_fd
        return self._proc

    def prestart(self) -> None:
        """Start the worker now (it imports TensorFlow as it starts), so that its import runs
        while this process still loads the model and computes its cache key; idempotent."""
        self._start()

    def close(self, wait_s: float = 0.25) -> None:
        """Stop the worker (it exits when its stdin closes; killed after ``wait_s``: its
        temporaries are in a folder of ours anyway, and no export is under way) and remove the
        handed-over files.

        Why not wait longer: an idle worker's TensorFlow takes 1.5 s to exit, 15% of a small
        cold session (measured: bench/session_cost.py, digits), for nothing it would still
        write. And under pytest-xdist a worker whose session still runs 5 s after the
        controller asked it to end gets a SIGINT from execnet (a ``KeyboardInterrupt`` traceback
        per worker at the end of the run)."""
        self._stop_worker(wait_s)
        shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    # -- the handover ----------------------------------------------------------------------
    def _handover(self, model: Any) -> Path | None:
        """The model saved as ``.keras`` (once per weights and architecture), or None when it cannot be."""
        try:
            digest = hashlib.sha256(model.to_json().encode())
            for w in model.get_weights():
                digest.update(memoryview(w).cast("B") if w.flags.c_contiguous else w.tobytes())
            key = digest.hexdigest()[:24]
        except Exception as exc:  # noqa: BLE001 - a model that cannot be keyed is exported inline
            self.inline_reasons.append(f"{type(model).__name__} cannot be serialised ({type(exc).__name__}: {exc})")
            return None
        path = self._handed.get(key)
        if path is not None and path.exists():
            return path
        path = self._dir / f"{key}.keras"
        try:
            with warnings.catch_warnings():  # Keras' own deprecation noise belongs to no test
                warnings.simplefilter("ignore")
                model.save(str(path))
        except Exception as exc:  # noqa: BLE001
            self.inline_reasons.append(f"the model does not save as .keras ({type(exc).__name__}: {exc})")
            return None
        self._handed[key] = path
        return path

    # -- exporting -------------------------------------------------------------------------
    def export(self, model: Any, format: str, path: str | Path, **options: Any) -> Path:
        """Export ``model`` to ``format`` at ``path`` in the worker (or inline, see the module docstring)."""
        from ..formats import export_model, record_route
        from ..formats.tensorflow.keras_specs import input_tensor_names

        if isinstance(model, (str, Path)):
            handed: Path | str | None = str(model)  # a SavedModel directory: the worker reads it itself
        else:
            handed = self._handover(model)
        try:
            pickle.dumps(options)
        except Exception as exc:  # noqa: BLE001 - e.g. a custom op handler function
            self.inline_reasons.append(f"export options do not pickle ({type(exc).__name__}: {exc})")
            handed = None
        if handed is None:
            return Path(export_model(model, format, path, **options))
        request = {"model": str(handed), "keras_file": not isinstance(model, (str, Path)), "format": format,
                   "path": str(path), "options": options, "memory_limit": self.memory_limit,
                   "input_names": input_tensor_names(model)}
        reply = self._take_ahead(request, format, Path(path))
        if reply is None:
            reply = self._ask(request, format, Path(path))
        if "handover" in reply:  # the worker cannot rebuild the model (custom classes): inline it is
            self.inline_reasons.append(reply["handover"])
            return Path(export_model(model, format, path, **options))
        if "error" in reply:
            raise _rebuild(reply["error"], format, Path(path))
        written = Path(reply["ok"])
        if reply.get("route"):  # how the worker converted it, known here as if exported here
            record_route(written, format, reply["route"])
        return written

    def _ask(self, request: dict, format: str, path: Path) -> dict:
        return self._reply(self._post(request), format, path)

    def _post(self, request: dict) -> tuple[subprocess.Popen, int, float]:
        """Send ``request`` to the worker (started if need be): what ``_reply`` waits on."""
        proc = self._start()
        assert proc.stdin is not None
        log_start = self._log_size()
        start = time.monotonic()
        try:
            _send(proc.stdin, request)
        except (BrokenPipeError, OSError):
            pass  # it died before reading: reported by _reply with its exit status
        return proc, log_start, start

    def _reply(self, posted: tuple[subprocess.Popen, int, float], format: str, path: Path) -> dict:
        """The worker's reply to a posted request; its death or a timeout (counted from when
        the request was sent) is an ``ExportError`` for ``path``."""
        proc, log_start, start = posted
        assert self._reply_fd is not None
        peak = _peak_rss(proc.pid)
        poller = select.poll()  # not select(): it fails on descriptors above 1023
        poller.register(self._reply_fd, select.POLLIN)
        while True:
            ready = poller.poll(int(_POLL_S * 1000))
            peak = _peak_rss(proc.pid) or peak
            if ready:
                head = _read_exact(self._reply_fd, _LEN.size)
                body = None if head is None else _read_exact(self._reply_fd, _LEN.unpack(head)[0])
                if body is not None:
                    self.peak_rss = peak
                    reply: dict = pickle.loads(body)
                    self._recycle_if_grown(proc)
                    return reply
                break  # EOF: the worker is gone
            if proc.poll() is not None:
                break
            if self.timeout_s is not None and time.monotonic() - start > self.timeout_s:
                proc.kill()
                proc.wait()
                self._forget()
                raise ExportError(path, format, f"the export took longer than {self.timeout_s:g} s "
                                  f"(--modelparity-timeout), so its process was stopped (peak memory "
                                  f"{human_bytes(peak or 0)})",
                                  "raise --modelparity-timeout (ini modelparity_timeout) for large models, or "
                                  "export a smaller one", log_path=self.log_path)
        code = proc.wait()
        self._forget()
        what, fix = _how_it_ended(code, self.memory_limit)
        tail = self._log_tail(log_start)
        problem = (f"the converter's process {what} after {time.monotonic() - start:.1f} s, with a peak memory of "
                   f"{human_bytes(peak or 0)}; the test session goes on")
        if tail:
            problem += "; its last output:\n    " + "\n    ".join(tail)
        raise ExportError(path, format, problem, fix, log_path=self.log_path)

    # -- exporting ahead --------------------------------------------------------------------
    def ahead(self, model: Any, format: str, name: str, **options: Any) -> bool:
        """Send the export of ``model`` to ``format`` now, without waiting for it: the session
        asks for it next (its next test's format), and meanwhile this process loads, runs and
        compares the current one on the other core. The ``export`` with the same request takes
        the result (moved to its path, ``name`` being the artifact's file name there); its
        failure, crash or timeout is that export's, said as if it had been asked then. One at a
        time; False where it is not sent (a model exported inline, one already under way)."""
        from ..formats.tensorflow.keras_specs import input_tensor_names

        if self._ahead is not None or isinstance(model, (str, Path)) or self._proc is None:
            return False
        try:
            pickle.dumps(options)
        except Exception:  # noqa: BLE001 - said by the export itself, which runs it inline
            return False
        reasons = len(self.inline_reasons)
        handed = self._handover(model)
        del self.inline_reasons[reasons:]  # said by the export itself, if it comes
        if handed is None:
            return False
        self._aheads += 1
        folder = self._dir / f"ahead-{self._aheads}"
        folder.mkdir()
        request = {"model": str(handed), "keras_file": True, "format": format, "path": str(folder / name),
                   "options": options, "memory_limit": self.memory_limit, "input_names": input_tensor_names(model)}
        self._ahead = _Ahead(request, folder, self._post(request))
        return True

    def _take_ahead(self, request: dict, format: str, path: Path) -> dict | None:
        """The reply to the export sent ahead when it is ``request`` (its artifact moved to
        ``path``); else None, after the one under way has ended (the worker is free again)."""
        pending, self._ahead = self._ahead, None
        if pending is None:
            return None
        same = _without_path(pending.request) == _without_path(request) and \
            Path(pending.request["path"]).name == path.name
        if not same:
            with contextlib.suppress(ExportError):  # not this export's: its end is no one's failure
                self._reply(pending.posted, format, path)
            shutil.rmtree(pending.folder, ignore_errors=True)
            return None
        try:
            reply = self._reply(pending.posted, format, path)
            if isinstance(reply.get("error"), dict):  # said of the export's own path, as if asked now
                here = {str(pending.folder / path.name): str(path), str(pending.folder): str(path.parent)}
                reply["error"] = {k: _moved(v, here) for k, v in reply["error"].items()}
            if "ok" in reply:
                try:
                    written = Path(reply["ok"]).resolve().relative_to(pending.folder.resolve())
                    path.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(pending.folder / path.name), str(path))
                except (ValueError, OSError):  # written elsewhere, or not movable: asked again
                    return None
                reply["ok"] = str(path.parent / written)
            return reply
        finally:
            shutil.rmtree(pending.folder, ignore_errors=True)

    def _recycle_if_grown(self, proc: subprocess.Popen) -> None:
        """A worker that kept much memory after an export (tf2onnx's graphs, allocator caches) is
        replaced: the next export would add its own peak to what is left (a 100 MB model's second
        ONNX export peaked at 7.7 GB in one worker, 6.2 GB in a fresh one)."""
        rss = _status(proc.pid, b"VmRSS")
        if rss is not None and self.recycle_rss is not None and rss > self.recycle_rss:
            self._stop_worker()

    def _stop_worker(self, wait_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.stdin:
                    proc.stdin.close()
                proc.wait(timeout=wait_s)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        self._forget()

    def _forget(self) -> None:
        """The worker is gone (stopped, killed, dead): drop its pipe, its temporary folder and
        the export it was sent ahead (the export that wanted it asks a new worker)."""
        self._proc = None
        if self._ahead is not None:
            shutil.rmtree(self._ahead.folder, ignore_errors=True)
            self._ahead = None
        if self._reply_fd is not None:
            os.close(self._reply_fd)
            self._reply_fd = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size if self.log_path is not None else 0
        except OSError:
            return 0

    def _log_tail(self, offset: int) -> list[str]:
        if self.log_path is None:
            return []
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(offset)
                text = fh.read(1 << 20).decode("utf-8", "replace")
        except OSError:
            return []
        lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
        fatal = next((i for i, ln in enumerate(lines) if ln.startswith("Fatal Python error")), None)
        if fatal is not None:  # faulthandler's report: the error, then the innermost frames first
            frames = [ln.strip() for ln in lines[fatal + 1:] if ln.strip().startswith("File ")]
            return [lines[fatal][:300]] + [f[:300] for f in frames[:_LOG_TAIL - 1]]
        return [ln[:300] for ln in lines[-_LOG_TAIL:]]


# -- errors across the process boundary ----------------------------------------------------
def _describe(exc: BaseException) -> dict:
    """An exception as plain data (ExportError's keyword-only fields do not survive pickle)."""
    out: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    for attr in ("path", "format", "problem", "fix", "action", "unsupported_ops", "advice", "log_path", "route",
                 "what", "install", "not_applicable"):
        if hasattr(exc, attr):
            value = getattr(exc, attr)
            out[attr] = list(value) if isinstance(value, tuple) else value
    if isinstance(exc, NotSerializable):
        out["type"] = "NotSerializable"
    elif isinstance(exc, ExportError):
        out["type"] = "ExportError"
    elif isinstance(exc, ModelLoadError):
        out["type"] = "ModelLoadError"
    elif isinstance(exc, RuntimeMissing):
        out["type"] = "RuntimeMissing"
    return out


def _rebuild(info: dict, format: str, path: Path) -> Exception:
    kind = info.get("type")
    if kind in ("ExportError", "NotSerializable"):
        cls = NotSerializable if kind == "NotSerializable" else ExportError
        exc = cls(info.get("path"), info.get("format"), info.get("problem", ""), info.get("fix"),
                  log_path=info.get("log_path"), route=info.get("route"),
                  not_applicable=bool(info.get("not_applicable")))
        exc.unsupported_ops = tuple(info.get("unsupported_ops") or ())
        exc.advice = info.get("advice")
        return exc
    if kind == "ModelLoadError":
        return ModelLoadError(info.get("path"), info.get("format"), info.get("problem", ""), info.get("fix"),
                              action=info.get("action", "load"), not_applicable=bool(info.get("not_applicable")))
    if kind == "RuntimeMissing":
        return RuntimeMissing(info.get("what", "?"), info.get("install", "?"))
    if kind == "InvalidArgumentError":
        return InvalidArgumentError(info["message"])
    if kind in ("TypeError", "ValueError"):
        return {"TypeError": TypeError, "ValueError": ValueError}[kind](info["message"])
    first = info["message"].strip().splitlines()[0][:300] if info["message"].strip() else ""
    # A MemoryError (often with no message at all) or a library that could not be mapped under
    # an address-space limit: say it is memory, with the fix, not "the converter failed (MemoryError: )".
    builtin = getattr(builtins, str(kind), None)
    exc_type: type[Exception] = (builtin if isinstance(builtin, type) and issubclass(builtin, Exception)
                                 else RuntimeError)
    try:
        stand_in: BaseException = exc_type(info["message"])
    except Exception:  # noqa: BLE001 - a builtin whose constructor wants other arguments
        stand_in = RuntimeError(info["message"])
    limit = resource_failure(stand_in, str(path.parent))
    if limit is not None:
        extra = info.get("memory_limit")
        if isinstance(extra, int):  # the worker's own limit around this export
            return ExportError(path, format, f"the converter ran {limit[0]} in the export worker, whose "
                               f"address space was limited to {human_bytes(extra)} more for this export "
                               f"(--modelparity-export-memory)",
                               "raise --modelparity-export-memory; docs/model-size.md lists what each format needs")
        return ExportError(path, format, f"the converter ran {limit[0]} in the export worker", limit[1])
    if kind in ("ImportError", "ModuleNotFoundError"):  # installed (found) but it does not import: damaged
        return ExportError(path, format, f"a package this export needs is installed but does not import "
                           f"({kind}: {first})",
                           "reinstall it (pip install --force-reinstall <package>, in the environment that runs "
                           "pytest); `python -c 'import <package>'` shows the same error")
    return ExportError(path, format, f"the converter failed ({kind}: {first})", None)


# -- the worker side (python -m pytest_modelparity.exports.worker FD) ------------------------
def _serve(request: dict, models: dict[str, Any]) -> dict:
    from ..formats import export_model, export_route
    from ..formats.tensorflow.keras_specs import set_input_tensor_names

    model: Any = request["model"]
    if request["keras_file"]:
        if model not in models:
            try:
                import keras

                models[model] = keras.saving.load_model(model, compile=False, safe_mode=False)
            except Exception as exc:  # noqa: BLE001 - the parent then exports inline
                return {"handover": f"the model does not load back in a fresh process ({type(exc).__name__}: "
                                    f"{str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''})"}
        model = models[model]
        set_input_tensor_names(model, request.get("input_names") or [])
    limit = request.get("memory_limit")
    restore = _limit_memory(limit) if limit else None
    try:
        written = export_model(model, request["format"], request["path"], **request["options"])
        return {"ok": str(written), "route": export_route(written)}
    finally:
        if restore is not None:
            restore()


def _limit_memory(extra: int) -> Any:
    """Cap this process's address space at what it maps now plus ``extra``; return the undo."""
    import resource

    with open("/proc/self/status", "rb") as fh:
        size = next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith(b"VmSize:"))
    old = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (size + int(extra), old[1]))
    return lambda: resource.setrlimit(resource.RLIMIT_AS, old)


def _die_with_parent() -> None:
    """Linux: have the kernel kill this worker when the process that started it dies
    (``PR_SET_PDEATHSIG``). Without it a worker stuck before its first read of stdin never
    sees the EOF that ends it: under a 1.1 GB ``ulimit -v`` the pytest process aborted (a
    MemoryError it could not recover from) while its worker spun at 100% CPU inside a C
    extension's load during ``import keras``, orphaned, until killed. Only for a worker
    started from the parent's main thread (the signal follows the thread that forked it)."""
    parent = os.environ.pop(_PARENT_ENV, "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - no prctl: the EOF on stdin still ends an idle worker
        return
    if os.getppid() != int(parent):  # it died before the call: nothing will send the signal
        os._exit(0)


def _import_keras_without_sklearn() -> None:
    """TensorFlow and Keras, with scikit-learn kept out of Keras' import. Keras imports it (and
    SciPy's stats with it) only for its ``keras.wrappers`` estimators, which an export never
    uses: 1.4-1.8 of the 6-8 CPU-seconds each worker spent importing (issue 49). It is blocked
    only while Keras imports: anything imported later (a custom layer's module, a converter)
    that wants scikit-learn imports it as usual; only ``keras.wrappers`` says it is missing."""
    from ..runtime.tf_import import import_keras

    blocked = "sklearn" not in sys.modules
    if blocked:
        sys.modules["sklearn"] = None  # type: ignore[assignment]  # `import sklearn` now raises ImportError
    try:
        import_keras()
    finally:
        if blocked and "sklearn" in sys.modules and sys.modules["sklearn"] is None:
            del sys.modules["sklearn"]


def _main(reply_fd: int, log_path: str = "") -> None:
    _die_with_parent()
    from ..runtime.quiet import TolerantStream

    # stdout and stderr are the session log: a full disk under it drops lines, not the worker
    sys.stdout, sys.stderr = TolerantStream(sys.stdout), TolerantStream(sys.stderr)
    reply = os.fdopen(reply_fd, "wb")
    if log_path:
        # The converters point fds 1 and 2 at a temporary log of their own while converting: a
        # crash's "Fatal Python error" and traceback go to the session log through this handle.
        import faulthandler

        faulthandler.enable(file=open(log_path, "a"))  # noqa: SIM115 - kept open for the process's life
    try:  # TensorFlow and Keras now, while the parent still loads the model (ExportProcess.prestart)
        _import_keras_without_sklearn()
    except Exception:  # noqa: BLE001 - the first request reports it, as an export error
        pass
    stdin = sys.stdin.buffer.fileno()
    models: dict[str, Any] = {}
    while True:
        head = _read_exact(stdin, _LEN.size)
        if head is None:
            return  # the parent closed our stdin (or died): done
        body = _read_exact(stdin, _LEN.unpack(head)[0])
        if body is None:
            return
        request = pickle.loads(body)
        try:
            result = _serve(request, models)
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
            if isinstance(exc, KeyboardInterrupt):
                raise
            result = {"error": dict(_describe(exc), memory_limit=request.get("memory_limit"))}
        outcome = f"failed ({result['error'].get('type')})" if "error" in result else "done"
        print(f"== export to {request['format']} {outcome} (pid {os.getpid()})", flush=True)
        _send(reply, result)


if __name__ == "__main__":
    _main(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "")
