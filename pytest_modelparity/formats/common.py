"""What every format module shares: install hints, quiet blocks, short error lines, output
naming, reading a model file, and the one "is this a Keras model" check.

Why one home: these were defined two or three times across the format modules (and formats
imported each other's private helpers to reach them). Nothing here imports TensorFlow at
module level; the Keras helpers import it lazily when called.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import ModelLoadError
from ..runtime.tf_import import TF_INSTALL, import_keras, import_tf  # noqa: F401 - TF_INSTALL: the formats read it here
from ._files import read_regular

# The packages themselves, not `pip install 'pytest-modelparity[x]'`: the plugin is not on PyPI,
# so that command fails unless pip is pointed at a checkout, git URL or wheel (README).
TFLITE_INSTALL = "pip install ai-edge-litert (the plugin's [tflite] extra)"
ONNX_INSTALL = "pip install tf2onnx onnx onnxruntime (the plugin's [onnx] extra)"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence the Python warnings Keras, TF and the converters emit while saving, loading
    or converting (legacy h5, numpy deprecations, converter notices)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first meaningful line of an exception, for a short error message."""
    text = str(exc).strip()
    if not text or text == type(exc).__name__:  # LiteRT raised RuntimeError("RuntimeError")
        return f"{type(exc).__name__} (it carries no message; the converter log may say more)"
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), text)
    line = f"{type(exc).__name__}: {line}"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def is_keras_model(obj: Any) -> bool:
    """Duck-typed Keras model check that imports nothing.

    Not ``hasattr(obj, "inputs")``: a subclassed Keras 3 model has none, and was then taken
    for a factory and called with no arguments. Not a path, a class or a plain function.
    """
    return (not isinstance(obj, (str, Path, type)) and hasattr(obj, "layers") and hasattr(obj, "weights")
            and callable(obj))


def name_outputs(result: Any, names: list[str], numpy: bool = True) -> dict[str, Any]:
    """A model call's result as ``{output name: value}`` in the model's output order."""
    conv: Callable[[Any], Any] = (lambda v: np.asarray(v)) if numpy else (lambda v: v)
    if isinstance(result, dict):
        # By name when the keys are the output names; else in model.outputs' order (sorted keys).
        values = [result[n] for n in names] if all(n in result for n in names) else import_keras().tree.flatten(result)
    elif isinstance(result, (list, tuple)):
        values = list(result)
    else:
        values = [result]
    return {n: conv(v) for n, v in zip(names, values)}


def unique(names: list[str]) -> list[str]:
    """``names`` with repeats suffixed ``_1``, ``_2``... so every tensor has its own key."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        if n in seen:
            seen[n] += 1
            n = f"{n}_{seen[n]}"
        else:
            seen[n] = 0
        out.append(n)
    return out


def read_model_bytes(source: Any, format: str, suffix: str,
                     magic_check: Callable[[Path, bytes], None]) -> tuple[Path, bytes]:
    """Read a user's model file read-only, with errors that name the file, format and fix."""
    path = Path(source)
    if not path.exists():
        raise ModelLoadError(path, format, "no such file", "check the path (and the working directory)")
    if path.is_dir():
        raise ModelLoadError(path, format, f"this is a directory, not a {suffix} file",
                             f"pass the {suffix} file inside it, or the format that matches the directory")
    content = read_regular(path, format)  # a FIFO or device is refused, the size checked first
    if not content:
        raise ModelLoadError(path, format, "the file is empty (0 bytes)",
                             f"re-export the model; an interrupted copy or export leaves empty {suffix} files")
    magic_check(path, content)
    return path, content


def write_atomically(path: Path, content: bytes) -> Path:
    """Write ``content`` to ``path`` through a temporary file and one rename: a reader never
    sees half a file, and a failed write leaves nothing behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


# -- converter logs ------------------------------------------------------------------------

def log_dir() -> Path:
    """Where converter logs of failed exports are kept (named in the ExportError)."""
    root = os.environ.get("MODELPARITY_LOG_DIR") or os.path.join(tempfile.gettempdir(), "pytest-modelparity-logs")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def output_to(fh: Any) -> Iterator[None]:
    """Send everything written to fds 1 and 2 (a converter's prints, TensorFlow's C++ logs) to
    the open file ``fh`` for the duration of the block, then restore the terminal."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved: list[tuple[int, int]] = []
    try:
        for fd in (1, 2):
            try:
                saved.append((fd, os.dup(fd)))
                os.dup2(fh.fileno(), fd)
            except OSError:  # no such descriptor (embedded interpreters): leave it alone
                pass
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)


class _Redirect:
    """``sys.stdout``/``sys.stderr`` during a capture. A logging handler created meanwhile keeps
    a reference to it; once the capture ends it writes to the original stream again instead of
    to a closed file."""

    def __init__(self, file: Any, original: Any) -> None:
        self.file = file
        self.original = original

    def write(self, text: str) -> int:
        target = self.file if self.file is not None else self.original
        return target.write(text)

    def flush(self) -> None:
        target = self.file if self.file is not None else self.original
        with contextlib.suppress(Exception):
            target.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file if self.file is not None else self.original, name)


class ConverterLog:
    """Everything a converter prints (C++ stderr/stdout, Python logging, print) captured in a
    file instead of the terminal: a failing conversion can print tens of kilobytes of MLIR
    call sites or ~30 ERROR lines. The file is kept only when the caller ``keep()``s it."""

    LOGGERS = ("tf2onnx", "tensorflow", "absl", "tensorflowjs")

    def __init__(self, format: str) -> None:
        fd, name = tempfile.mkstemp(prefix=f"{format}-export-", suffix=".log", dir=log_dir())
        os.close(fd)
        self.path = Path(name)
        self.kept = False

    def text(self) -> str:
        try:
            return self.path.read_text(errors="replace")
        except OSError:
            return ""

    def keep(self) -> Path | None:
        """Keep the log for the error to name, or None when the converter wrote nothing to it:
        an error must not send the user to a file of 0 bytes (the log is then deleted)."""
        try:
            empty = self.path.stat().st_size == 0
        except OSError:
            return None
        if empty:
            return None
        self.kept = True
        return self.path

    def note(self, line: str) -> None:
        with open(self.path, "a") as fh:
            fh.write(line.rstrip("\n") + "\n")

    @contextlib.contextmanager
    def capture(self) -> Iterator["ConverterLog"]:
        """Send fd 1 and 2, ``sys.stdout``/``sys.stderr`` and the converters' loggers to the file."""
        with open(self.path, "a", buffering=1) as fh, output_to(fh):
            handler = logging.StreamHandler(fh)
            handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
            loggers = [logging.getLogger(n) for n in self.LOGGERS]
            states = [(lg, lg.propagate, lg.level) for lg in loggers]
            for lg in loggers:
                lg.addHandler(handler)
                lg.propagate = False
                if lg.level == logging.NOTSET or lg.level > logging.INFO:
                    lg.setLevel(logging.INFO)
            out, err = _Redirect(fh, sys.stdout), _Redirect(fh, sys.stderr)
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), quiet():
                    yield self
            finally:
                for lg, propagate, level in states:
                    lg.removeHandler(handler)
                    lg.propagate = propagate
                    lg.setLevel(level)
                out.file = err.file = None

    def discard(self) -> None:
        if not self.kept:
            with contextlib.suppress(OSError):
                self.path.unlink()


# -- which route an export took --------------------------------------------------------------

_ROUTES: dict[str, str] = {}
_route_log = logging.getLogger("pytest_modelparity.export")


def finish_export(path: Path, content: bytes, format: str, route: str, log: ConverterLog,
                  validate: Callable[..., None]) -> None:
    """The end of a converting export: ``validate(content, path, log=, route=)`` raises
    before anything is written, then the file is written atomically and its route kept."""
    validate(content, path, log=log, route=route)
    write_atomically(path, content)
    record_route(path, format, route)


def record_route(path: Path, format: str, route: str, *, action: str = "export") -> None:
    """Remember (and log at INFO) how ``path`` was converted, e.g. ``static_batch 1``, or,
    with ``action="load"``, how it had to be read (e.g. an old MetaGraph's retried import)."""
    _ROUTES[str(Path(path).resolve())] = route
    _route_log.info("%s %s %s: route %s", format, action, path, route)


def export_route(path: str | Path) -> str | None:
    """The route the exporter took to write ``path`` in this process, if it recorded one."""
    return _ROUTES.get(str(Path(path).resolve()))


# -- the run that checks a fresh export ------------------------------------------------------

# Sizes an open non-batch dim is probed at, smallest first. A net of valid 3x3 convolutions
# takes no 1x1 image, and an audio front-end (an STFT of 64-sample frames, then a valid conv)
# no 64-sample clip: probing only at 1 blamed the converters for the probe's own failure. A
# size is tried only while the open dims of one input hold at most PROBE_MAX_OPEN_ELEMENTS
# (one open axis: up to 4096 samples; height and width: up to 256 x 256), so a file that runs
# at no size costs a few small runs, not a 4096 x 4096 image.
PROBE_SIZES = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
PROBE_MAX_OPEN_ELEMENTS = 4096 * 16


def probe_sizes(specs: Any) -> tuple[int, ...]:
    """The ``PROBE_SIZES`` the open dims of ``specs`` are tried at (``(1,)`` when none is open)."""
    open_dims = max((sum(d is None for d in tuple(s.shape)[1:]) for s in specs), default=0)
    if not open_dims:
        return (1,)
    return tuple(n for n in PROBE_SIZES if n ** open_dims <= PROBE_MAX_OPEN_ELEMENTS)


def has_open_dims(specs: Any) -> bool:
    """Whether some input has an open dim other than the batch (``TensorSpec``s)."""
    return any(d is None for s in specs for d in tuple(s.shape)[1:])


def probe_batch(specs: Any, size: int) -> dict[str, np.ndarray]:
    """Zeros of batch 1 for each ``TensorSpec``, its open non-batch dims at ``size``; an input
    whose declared shape cannot fit in memory is refused first, named with its bytes."""
    shapes = {s.name: tuple(1 if i == 0 and d is None else (size if d is None else d)
                            for i, d in enumerate(s.shape)) for s in specs}
    for s in specs:
        check_declared_input(s.name, shapes[s.name], np.dtype(s.dtype))
    return {s.name: np.zeros(shapes[s.name], dtype=s.dtype) for s in specs}


def check_declared_input(name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """``ModelLoadError`` (no path: the caller names the file) for an input whose one batch takes
    more memory than this process can have: numpy would raise a bare MemoryError, whose usual fix
    ("free memory") is untrue for a shape no machine feeds."""
    from ..runtime.resources import available_memory, human_bytes

    nbytes = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
    free = available_memory()
    if free is not None and nbytes > free:
        raise ModelLoadError(None, None, f"input {name!r} is declared with the shape {list(shape)} ({dtype.name}): "
                             f"one batch of it takes {_bytes(nbytes, human_bytes)}, more than the "
                             f"{human_bytes(free)} of memory this process can use",
                             "the file itself declares that shape: if a dimension was meant to be free, export "
                             "again with None there (the input_signature or keras.Input shape); otherwise the "
                             "model needs a machine with that much memory")


def _bytes(n: int, human: Callable[[float], str]) -> str:
    return f"{human(n)} ({n:,} bytes)"


def run_probe(run: Callable[[dict[str, np.ndarray]], Any], specs: Any) -> tuple[int, Any]:
    """Run a fresh export once on zeros: ``(size, result)`` of the first run that works, the open
    dims at the smallest of ``probe_sizes`` the model takes. Where every size fails, the
    failure at the largest is raised with ``probe_note`` saying what was tried."""
    sizes = probe_sizes(specs)
    for size in sizes:
        try:
            return size, run(probe_batch(specs, size))
        except Exception as exc:  # noqa: BLE001 - every runtime raises its own; the last one is told
            if size == sizes[-1]:
                if len(sizes) > 1:
                    exc.modelparity_probe = (f" (on zeros with the open dims at {', '.join(map(str, sizes[:-1]))} "  # type: ignore[attr-defined]
                                             f"and {sizes[-1]}: every size failed)")
                raise
    raise AssertionError("unreachable")


def probe_note(exc: BaseException) -> str:
    """What ``run_probe`` tried before ``exc``, or ``""``."""
    return str(getattr(exc, "modelparity_probe", ""))
