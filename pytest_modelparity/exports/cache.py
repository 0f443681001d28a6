"""Export cache: reuse an exported artifact when the same model is exported again.

Exporting to TFLite, ONNX or a SavedModel costs about a second; a suite that exports the
same model in many tests (or in many pytest-xdist workers) should pay it once.

Key: SHA-256 of the model's architecture config, its weight bytes, the format, the export
options and the versions of Python, TensorFlow, Keras and the converters. Anything that can
change the artifact is in the key, so a hit is always safe to reuse. A model given as files
(a SavedModel folder, a frozen ``.pb``, a TF1 checkpoint) is keyed by the bytes of its files
(not their path or times) and its load options, which reach the conversion as options.

Atomicity: each export is written into a fresh temporary directory inside the cache root
and renamed to ``<root>/<format>/<key>`` in one ``os.rename``. A directory rename onto an
existing non-empty directory fails, so when two processes race, the loser discards its copy
and uses the winner's: a reader never sees a half-written artifact.

Bypass with ``ExportCache(enabled=False)`` (a fresh temp directory per export); empty it
with ``clear()``. Root: ``$MODELPARITY_CACHE_DIR``, else ``$XDG_CACHE_HOME/pytest-modelparity``,
else ``~/.cache/pytest-modelparity``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .entry_lock import entry_lock
from ..errors import ExportError
from ..runtime.quiet import make_ignored_dir
from ..runtime.scratch import CACHE_TEMP, SYSTEM_TEMP, foreign, not_private, owned_prefix, sweep

__all__ = ["ARTIFACT_NAMES", "ExportCache", "FLOOR_DIR", "UncacheableOption", "converter_versions", "default_cache_dir"]

# What the artifact inside a cache entry is called, per format.
ARTIFACT_NAMES = {
    "keras": "model.keras", "h5": "model.h5", "saved_model": "saved_model", "graphdef": "model.pb",
    "tflite": "model.tflite", "tfjs": "tfjs", "onnx": "model.onnx",
}
# Distributions whose version can change what an export writes.
_VERSIONED = ("tensorflow", "tensorflow-cpu", "tf-keras", "keras", "ai-edge-litert", "tf2onnx", "onnx",
              "tensorflowjs", "pytest-modelparity")
_META = "meta.json"
# The measured noise floors kept beside the exports (floor_cache.FloorCache), cleared with them.
FLOOR_DIR = "floor"
# Which tensor of the export is which of the source's (formats/binding.py), kept the first time a
# session paired them by shape or by values: later sessions read it as the "export record". Not
# part of the verified manifest (it is written after the entry), and only ever a hint: the
# binding checks every recorded pair against the tensors' shapes and dtypes.
_PAIRING = "pairing.json"


def default_cache_dir() -> Path:
    if os.environ.get("MODELPARITY_CACHE_DIR"):
        return Path(os.environ["MODELPARITY_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pytest-modelparity"


@functools.lru_cache(maxsize=1)
def converter_versions() -> dict[str, str]:
    """Installed versions of everything that shapes an exported artifact."""
    versions = {"python": "%d.%d" % sys.version_info[:2]}
    for dist in _VERSIONED:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions


class UncacheableOption(TypeError):
    """An export option whose content cannot be hashed (e.g. a generator of batches)."""


def _feed(h: Any, obj: Any) -> None:
    """Hash ``obj`` by content: arrays by dtype, shape and bytes; containers recursively."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        h.update(repr((type(obj).__name__, obj)).encode())
    elif isinstance(obj, bytes):
        h.update(b"bytes:" + obj)
    elif isinstance(obj, np.ndarray) or (hasattr(obj, "shape") and hasattr(obj, "dtype") and hasattr(obj, "__array__")):
        arr = np.ascontiguousarray(np.asarray(obj))
        h.update(f"array:{arr.dtype.str}:{arr.shape}:".encode())
        h.update(arr.tobytes())
    elif isinstance(obj, dict):
        h.update(b"dict:%d:" % len(obj))
        for k in sorted(obj, key=repr):
            _feed(h, k)
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        h.update(f"{type(obj).__name__}:{len(obj)}:".encode())
        for item in obj:
            _feed(h, item)
    elif isinstance(obj, os.PathLike):
        h.update(f"path:{os.fspath(obj)}".encode())
    else:
        raise UncacheableOption(
            f"cannot hash an option of type {type(obj).__name__}; pass arrays, lists, dicts or scalars "
            f"(e.g. a list of batches instead of a generator) to make the export cacheable")


def _architecture(model: Any) -> str:
    if getattr(model, "layers", None) is not None and not isinstance(model, (str, os.PathLike)):
        from ..formats.tensorflow.keras_specs import is_subclassed

        if is_subclassed(model):
            return _subclassed_architecture(model)
    for attr in ("to_json", "get_config"):
        fn = getattr(model, attr, None)
        if callable(fn):
            try:
                value = fn()
            except (NotImplementedError, TypeError, ValueError):
                continue
            return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=repr)
    raise TypeError(f"cannot key an export of {type(model).__name__}: it has neither to_json() nor "
                    "get_config(); pass a Keras model, or use ExportCache(enabled=False)")


def _subclassed_architecture(model: Any) -> str:
    """A subclassed model's config says only its class name: its ``call`` is Python code. Key
    it by the source of every class it is made of (built-in Keras layers by their config) and
    by its input specs; a class whose source cannot be read (defined in a REPL) is not cached."""
    import inspect

    from ..formats.tensorflow.keras_specs import input_specs

    parts = []
    for layer in [model, *model._flatten_layers(include_self=False)]:
        cls = type(layer)
        if cls.__module__.startswith("keras."):
            try:
                parts.append(f"{cls.__qualname__}:{json.dumps(layer.get_config(), sort_keys=True, default=repr)}")
            except (NotImplementedError, TypeError, ValueError):
                parts.append(f"{cls.__module__}.{cls.__qualname__}")
            continue
        try:
            parts.append(f"{cls.__module__}.{cls.__qualname__}:{inspect.getsource(cls)}")
        except (OSError, TypeError) as exc:
            raise UncacheableOption(f"cannot key an export of the subclassed {cls.__qualname__}: its source code "
                                    f"cannot be read ({exc})") from exc
    parts.append(repr([(s.name, s.shape, s.dtype.str) for s in input_specs(model, action="export")]))
    return "\n".join(parts)


def _weights(model: Any) -> list[np.ndarray]:
    get = getattr(model, "get_weights", None)
    if callable(get):
        return [np.asarray(w) for w in get()]
    return [np.asarray(v) for v in getattr(model, "weights", [])]


def _source_files(path: Path) -> list[tuple[str, int, str]]:
    """``(name, size, sha256)`` of every file a model on disk is made of, by name relative to
    it: a file; a folder's files, recursively (a symlink by its target's text, never followed);
    a TF1 checkpoint prefix's files (``model.ckpt.index``, ``.data-*``, ``.meta``) and the
    folder's ``checkpoint`` file. Anything else there (a FIFO, a device) makes it uncacheable."""
    def entry(p: Path, name: str) -> tuple[str, int, str]:
        if p.is_symlink():
            return (name, -1, "symlink:" + os.readlink(p))
        if not p.is_file():
            raise UncacheableOption(f"{p} is not a regular file: the export is not cached")
        return (name, p.stat().st_size, _sha256(p))

    if path.is_dir() and not path.is_symlink():
        found = []
        for folder, dirs, files in os.walk(path):  # followlinks=False: a linked folder by its target's text
            dirs.sort()
            here = Path(folder)
            for name in sorted(files) + [d for d in dirs if (here / d).is_symlink()]:
                found.append(entry(here / name, (here / name).relative_to(path).as_posix()))
        return found
    if path.exists() or path.is_symlink():
        return [entry(path, path.name)]
    parent = path.parent  # a checkpoint prefix: the files named after it
    named = sorted(p for p in parent.glob(f"{path.name}.*")) if parent.is_dir() else []
    extra = [parent / "checkpoint"] if (parent / "checkpoint").is_file() else []
    if not named:
        raise UncacheableOption(f"{path} names no file: the export is not cached")
    return [entry(p, p.name) for p in named + extra]


def _foreign_problem(entry: Path) -> str | None:
    """Which file of ``entry`` (itself included) another uid wrote, or None."""
    return foreign([entry, *sorted(entry.rglob("*"))])


def _present(entry: Path) -> bool:
    """An entry folder with its meta.json (written last, so the export finished)."""
    return entry.is_dir() and (entry / _META).exists()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _manifest(directory: Path) -> dict[str, list]:
    """``{relative path: [size, sha256]}`` of every file an export wrote (meta.json aside)."""
    return {p.relative_to(directory).as_posix(): [p.stat().st_size, _sha256(p)]
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name not in (_META, _PAIRING)}


class ExportCache:
    """Content-keyed, process-safe store of exported models (see the module docstring)."""

    def __init__(self, root: str | os.PathLike | None = None, *, enabled: bool = True,
                 exporter: Callable[..., Any] | None = None, lock_timeout_s: float | None = 900.0) -> None:
        from ..formats import export_model

        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.enabled = enabled
        # export_model, or one with its signature that runs it elsewhere (a child process)
        self.exporter: Callable[..., Any] = exporter or export_model
        self.lock_timeout_s = lock_timeout_s
        self.hits = 0
        self.misses = 0
        self.notes: list[str] = []          # damaged entries dropped and re-exported
        self._verified: set[Path] = set()
        self._swept = False
        self._scratch: list[Path] = []

    def __repr__(self) -> str:
        return f"ExportCache({str(self.root)!r}, enabled={self.enabled}, hits={self.hits}, misses={self.misses})"

    # -- keys --------------------------------------------------------------------------
    def key(self, model: Any, format: str, options: dict[str, Any] | None = None) -> str:
        """SHA-256 (hex) of architecture, weights, format, options and converter versions."""
        from ..formats.tensorflow.keras_specs import input_tensor_names

        h = hashlib.sha256()
        _feed(h, ("pytest-modelparity export", 3))  # 3: input names keyed
        _feed(h, format)
        if format.split(":")[0] == "tfjs":  # its model.json carries the output record (issue 36): older entries lack it
            _feed(h, ("tfjs output record", 1))
            # older entries run Einsum (slow on cpu, absent on wasm) and select a bool band on wasm wrong
            _feed(h, ("tfjs Einsum as matmul, bool band as LogicalAnd, Softsign written out", 1))
        if isinstance(model, (str, os.PathLike)):  # a SavedModel folder, a frozen .pb, a TF1 checkpoint
            _feed(h, ("model files", 1))
            _feed(h, _source_files(Path(model)))  # by content: not its path, not its times
        else:
            h.update(_architecture(model).encode())
            _feed(h, input_tensor_names(model))  # unnamed inputs are numbered per process
            _feed(h, _weights(model))
        _feed(h, dict(options or {}))  # a file source's load options (inputs, outputs, feeds, trusted) too
        _feed(h, dict(converter_versions()))
        return h.hexdigest()

    def holds(self, model: Any, format: str, **options: Any) -> bool:
        """Whether an entry for this export is there (unverified: ``export`` checks it)."""
        if not self.enabled:
            return False
        try:
            key = self.key(model, format, options)
        except UncacheableOption:
            return False
        return _present(self.entry_dir(format, key))

    def entry_dir(self, format: str, key: str) -> Path:
        return self.root / format / key

    def artifact_path(self, format: str, key: str) -> Path:
        return self.entry_dir(format, key) / ARTIFACT_NAMES.get(format, "model")

    def conversion_inputs(self, model: Any, format: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """Exporter keywords that let a conversion start from an entry this cache holds: a Keras
        model's tfjs export converts the intact saved_model entry of the same model (written by
        the same exporter it would call), read only, instead of writing that SavedModel again.
        The default matrix exports both; MobileNetV2's SavedModel is 14 s of its 27 s tfjs export.
        Not part of any key: the artifact is the same either way. Empty where there is none."""
        if not self.enabled or format.split(":")[0] != "tfjs" or isinstance(model, (str, os.PathLike)) or \
                set(options or {}) - {"converter_options", "quantization"}:  # these leave the SavedModel as it is
            return {}
        try:
            key = self.key(model, "saved_model", {})
        except UncacheableOption:
            return {}
        entry = self.entry_dir("saved_model", key)
        if not _present(entry) or _foreign_problem(entry) is not None or self._verify(entry) is not None:
            return {}
        return {"saved_model_of_model": str(self.artifact_path("saved_model", key))}

    # -- export ------------------------------------------------------------------------
    def export(self, model: Any, format: str, **options: Any) -> Path:
        """Path of ``model`` exported to ``format`` with ``options``: reused when cached."""

        self.sweep()
        if not self.enabled:
            return self._export_fresh(model, format, options)
        try:
            key = self.key(model, format, options)
        except UncacheableOption:
            return self._export_fresh(model, format, options)
        final = self.entry_dir(format, key)
        artifact = self.artifact_path(format, key)
        self._check_private(format)
        if self._foreign(final, format):
            return self._export_fresh(model, format, options)
        hit = self._hit(final, artifact, format)
        if hit is not None:
            return hit
        try:
            make_ignored_dir(self.root)  # a new cache dir ignores itself for git (.gitignore: *)
            (self.root / format).mkdir(mode=0o700, exist_ok=True)  # private, as the root
        except OSError as exc:
            raise self._unwritable(format, exc) from exc
        # One exporter per entry across processes (xdist workers, parallel sessions): the others
        # wait here, then find the entry and hit.
        with entry_lock(self.root / format / f".{key}.lock", timeout_s=self.lock_timeout_s) as waited:
            if waited.note:
                self.notes.append(f"export cache: {waited.note}")
            if self._foreign(final, format):
                return self._export_fresh(model, format, options)
            hit = self._hit(final, artifact, format)
            if hit is not None:
                return hit
            return self._export_entry(model, format, options, key, final, artifact)

    def _check_private(self, format: str) -> None:
        """A cache folder another user owns or may write is refused: they could plant an entry."""
        for folder in (self.root, self.root / format):
            problem = not_private(folder)
            if problem is not None:
                raise ExportError(folder, format, f"the export cache folder {folder} is not yours alone: {problem}, "
                                  "so another user could put a model there that this run would hand out",
                                  "use a private folder you own (chmod go-w, or a new one), e.g. "
                                  "--modelparity-cache-dir=~/.cache/pytest-modelparity (or MODELPARITY_CACHE_DIR), "
                                  "or --modelparity-no-cache")

    def _foreign(self, final: Path, format: str) -> bool:
        """Whether an entry holds a file another uid wrote: never used (exported afresh into a
        temporary directory, with a note), never removed (it is not ours)."""
        if not _present(final):
            return False
        problem = _foreign_problem(final)
        if problem is None:
            return False
        self.notes.append(f"export cache: the {format} entry {final} is not yours ({problem}); not used, "
                          "exported afresh into a temporary directory")
        return True

    def _hit(self, final: Path, artifact: Path, format: str) -> Path | None:
        """The artifact of a complete, intact entry (counted as a hit); a damaged one is dropped."""
        if not _present(final):
            return None
        problem = self._verify(final)
        if problem is None:
            self.hits += 1
            return self._recorded(final, artifact, format)
        self._drop(final)
        self.notes.append(f"export cache: the {format} entry {final} was damaged ({problem}); "
                          "dropped it and exported again")
        return None

    @staticmethod
    def _unwritable(format: str, exc: OSError) -> ExportError:
        return ExportError(exc.filename or format, format, f"the export cache cannot be written "
                           f"({type(exc).__name__}: {exc})", "make the cache directory writable, point "
                           "--modelparity-cache-dir (or MODELPARITY_CACHE_DIR) at a writable directory, or pass "
                           "--modelparity-no-cache")

    def _export_entry(self, model: Any, format: str, options: dict[str, Any], key: str, final: Path,
                      artifact: Path) -> Path:
        from ..formats import export_route

        self.misses += 1
        try:
            tmp = Path(tempfile.mkdtemp(dir=self.root / format, prefix=owned_prefix(f".{key[:16]}.tmp-")))
        except OSError as exc:
            raise self._unwritable(format, exc) from exc
        try:
            # export_model validates the artifact (tflite, onnx: loaded and run once) and raises
            # ExportError otherwise: nothing below runs, the temporary folder is removed, and
            # no broken file is ever renamed into the cache.
            written = Path(self.exporter(model, format, tmp / artifact.name, **options,
                                         **self.conversion_inputs(model, format, options)))
            try:
                # Some formats return a file inside the folder they wrote (tfjs: tfjs/model.json).
                relative = written.resolve().relative_to(tmp.resolve())
            except ValueError:
                raise RuntimeError(f"export of format {format!r} wrote {written}, outside {tmp}") from None
            meta = {"format": format, "key": key, "artifact": relative.as_posix(), "options": {k: repr(v)[:200] for k, v in options.items()},
                    "versions": converter_versions(), "pid": os.getpid(), "files": _manifest(tmp),
                    "route": export_route(written)}
            (tmp / _META).write_text(json.dumps(meta, indent=1, sort_keys=True))
            try:
                os.rename(tmp, final)
            except OSError:
                # Another process renamed its copy first: theirs is complete, use it.
                if not (final / _META).exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return self._recorded(final, artifact, format)

    # -- verification (on read) -----------------------------------------------------------
    def _verify(self, entry: Path) -> str | None:
        """What is wrong with a cached entry, or None: every file recorded at write time
        must still have its size and SHA-256 (a truncated or edited artifact must never be
        handed out). Checked once per entry and process."""
        if entry in self._verified:
            return None
        try:
            recorded = json.loads((entry / _META).read_text()).get("files")
        except (OSError, ValueError, AttributeError) as exc:
            return f"meta.json unreadable: {type(exc).__name__}"
        if not isinstance(recorded, dict) or not recorded:
            return "no size/hash record (written by an older version)"
        for relative, (size, digest) in sorted(recorded.items()):
            path = entry / relative
            try:
                actual = path.stat().st_size
            except OSError:
                return f"{relative} is missing"
            if actual != size:
                return f"{relative} is {actual} bytes, {size} when written"
            if _sha256(path) != digest:
                return f"{relative} changed since it was written (SHA-256 differs)"
        self._verified.add(entry)
        return None

    @staticmethod
    def _drop(entry: Path) -> None:
        """Remove a damaged entry: renamed aside first, so no other process picks it up half-deleted."""
        aside = entry.with_name(owned_prefix(f".{entry.name[:16]}.bad-") + str(time.monotonic_ns()))
        try:
            os.rename(entry, aside)
        except OSError:
            return  # another process dropped (or replaced) it first
        shutil.rmtree(aside, ignore_errors=True)

    def sweep(self) -> list[Path]:
        """Remove what killed runs left (half-written entries here, intermediate exports in
        the system temp directory): once per cache object, on its first export."""
        if self._swept:
            return []
        self._swept = True
        removed = sweep(Path(tempfile.gettempdir()), SYSTEM_TEMP)
        for format in ARTIFACT_NAMES:
            removed += sweep(self.root / format, CACHE_TEMP, unowned=True)
        return removed

    # -- the export record of which tensor is which ------------------------------------------
    def _entry_of(self, artifact: Path) -> Path | None:
        """The cache entry (``root/<format>/<key>``) holding ``artifact``, or None."""
        try:
            parts = Path(artifact).resolve().relative_to(self.root.resolve()).parts
        except ValueError:
            return None
        return self.root.joinpath(*parts[:2]) if len(parts) >= 3 else None

    def pairing(self, artifact: Path) -> dict | None:
        """``{"inputs": {source name: file name}, "outputs": {...}}`` kept for this export, or None."""
        entry = self._entry_of(artifact)
        try:
            found = json.loads((entry / _PAIRING).read_text()) if entry is not None else None
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def keep_pairing(self, artifact: Path, pairing: dict) -> None:
        """Record ``pairing`` beside the export (atomically; a failure to write only loses the hint)."""
        entry = self._entry_of(artifact)
        if entry is None or not entry.is_dir():
            return
        tmp = entry / owned_prefix(f".{_PAIRING}.tmp-{os.getpid()}-")
        try:
            tmp.write_text(json.dumps(pairing, indent=1, sort_keys=True))
            os.replace(tmp, entry / _PAIRING)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def take_notes(self) -> list[str]:
        """What the cache repaired since the last call (each said once, then forgotten)."""
        notes, self.notes = self.notes, []
        return notes

    def _recorded(self, entry: Path, default: Path, format: str) -> Path:
        """The artifact of a cache entry, with the route its meta.json keeps recorded for its
        final path (the exporter recorded the temporary one): ``export_route`` then says how
        it was made, whether this run exported it or reused it."""
        from ..formats import record_route

        path = self._artifact_in(entry, default)
        try:
            route = json.loads((entry / _META).read_text()).get("route")
        except (OSError, ValueError):
            route = None
        if isinstance(route, str):
            record_route(path, format, route)
        return path

    @staticmethod
    def _artifact_in(entry: Path, default: Path) -> Path:
        """The path the exporter returned, recorded in the entry's meta.json."""
        try:
            relative = json.loads((entry / _META).read_text())["artifact"]
        except (OSError, ValueError, KeyError):
            return default
        return entry / relative

    def _export_fresh(self, model: Any, format: str, options: dict[str, Any]) -> Path:
        self.sweep()
        tmp = Path(tempfile.mkdtemp(prefix=owned_prefix(f"modelparity-{format}-")))
        if not self._scratch:
            atexit.register(self._remove_scratch)
        self._scratch.append(tmp)
        return Path(self.exporter(model, format, tmp / ARTIFACT_NAMES.get(format, "model"), **options))

    def _remove_scratch(self) -> None:
        for path in self._scratch:
            shutil.rmtree(path, ignore_errors=True)
        self._scratch.clear()

    # -- maintenance -------------------------------------------------------------------
    def entries(self) -> list[Path]:
        """Completed cache entries (one directory per format and key)."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob("*/*") if p.is_dir() and (p / _META).exists())

    def clear(self) -> int:
        """Remove every entry (and leftovers of interrupted exports, and the measured floors kept
        beside them: exports/floor_cache.py); return how many export entries."""
        count = len(self.entries())
        if self.root.is_dir():
            for child in self.root.iterdir():
                # Only our own per-format folders: never delete what else lives under root.
                if child.is_dir() and (child.name in ARTIFACT_NAMES or child.name == FLOOR_DIR):
                    shutil.rmtree(child, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.root.rmdir()
        return count
