"""Format registry: detect a path's format, load it on a device, export a Keras model to it.

Each format has one module (``format_module``): ``tensorflow/<name>.py`` for the TensorFlow
forms, the family's package (``tflite/``, ``onnx/``, ``tfjs/``) for the others, exposing:

    NAME: str                         # the format name, e.g. "tflite"
    EXPORT_REQUIRES: tuple[(module, install hint), ...]  # extra runtimes needed to export
    def detect(path: Path) -> bool    # cheap look at the path, no heavy imports
    def load(source, *, device: str, **options) -> LoadedModel
    def export(model, path: Path, **options) -> Path    # absent for load-only formats
    def validate(path: Path) -> None  # optional: raise ExportError unless the artifact loads (and runs);
                                      # export_model calls it after export() unless EXPORT_VALIDATES
                                      # says export() already did (tflite, onnx validate inside)

The runtimes needed to load each format are listed here (``_LOAD_RUNTIMES``), not in the
format modules, so checking them never imports a format. Modules are imported only when
used, so importing this package never imports TensorFlow.
"""

from __future__ import annotations

import errno
import importlib
import importlib.util
import inspect
import os
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import ExportError, ModelLoadError, RuntimeMissing
from ..runtime.resources import resource_failure
from ..runtime.tfjs_runner import NODE_HINT
from ._files import check_not_special
from .common import ONNX_INSTALL, TF_INSTALL, TFLITE_INSTALL, export_route, is_keras_model, record_route
from .tensorflow.graph import ancestor_ops, import_tf
from .base import LoadedModel, TensorSpec

__all__ = ["ALL_FORMATS", "FORMATS", "LOAD_ONLY_FORMATS", "LoadedModel", "TensorSpec", "ancestor_ops", "available_formats",
           "DETECTION_FIX", "detect_format", "export_model", "export_path", "export_route", "format_module", "import_tf",
           "is_keras_model", "load_model", "missing_runtime", "record_route"]

# Order matters for detection: the first whose detect() accepts a path wins.
ALL_FORMATS: tuple[str, ...] = ("keras", "h5", "saved_model", "checkpoint", "graphdef", "tflite", "tfjs", "onnx")

_LOAD_RUNTIMES: dict[str, tuple[tuple[str, str], ...]] = {
    "keras": (("tensorflow", TF_INSTALL),),
    "h5": (("tensorflow", TF_INSTALL), ("h5py", "pip install h5py")),
    "saved_model": (("tensorflow", TF_INSTALL),),
    "checkpoint": (("tensorflow", TF_INSTALL),),
    "graphdef": (("tensorflow", TF_INSTALL),),
    "tflite": (("ai_edge_litert", TFLITE_INSTALL),),
    "tfjs": (("node:", NODE_HINT),),
    "onnx": (("onnxruntime", ONNX_INSTALL),),
}


def _has(requirement: str) -> bool:
    if requirement.startswith("node:"):
        # npm is needed only to install the runner's packages; the runner checks for it then.
        return shutil.which("node") is not None
    try:
        return importlib.util.find_spec(requirement) is not None
    except (ImportError, ValueError):
        return False


def missing_runtime(name: str, *, export: bool = False) -> RuntimeMissing | None:
    """The first runtime that ``name`` needs (to load, or also to export) and lacks, or None."""
    reqs = list(_LOAD_RUNTIMES.get(name, ()))
    if export:
        reqs += list(getattr(format_module(name), "EXPORT_REQUIRES", ()))
    for module, hint in reqs:
        if not _has(module):
            what = "Node.js" if module.startswith("node:") else f"{module} (needed by format {name!r})"
            return RuntimeMissing(what, hint)
    return None


def available_formats() -> tuple[str, ...]:
    """Formats whose loading runtime is installed (checked without importing it)."""
    return tuple(n for n in ALL_FORMATS if missing_runtime(n) is None)


FORMATS: tuple[str, ...] = available_formats()


# Load-only forms that are not exports of a model: never in the default matrix (ALL_FORMATS), but
# detected first and loaded like the others. ``recorded``: a run made elsewhere (formats/recorded/).
LOAD_ONLY_FORMATS: tuple[str, ...] = ("recorded",)


def _check_name(name: str) -> str:
    if name not in ALL_FORMATS and name not in LOAD_ONLY_FORMATS:
        raise ValueError(f"unknown format {name!r}; valid formats: {', '.join(ALL_FORMATS)}")
    return name


# Where each format's module lives: its runtime family's folder (the TensorFlow forms share one).
_MODULES: dict[str, str] = {
    "keras": "tensorflow.keras", "h5": "tensorflow.h5", "saved_model": "tensorflow.saved_model",
    "checkpoint": "tensorflow.checkpoint", "graphdef": "tensorflow.graphdef",
    "tflite": "tflite", "tfjs": "tfjs", "onnx": "onnx", "recorded": "recorded",
}


def format_module(name: str) -> ModuleType:
    """The module that detects, loads and exports format ``name`` (NAME, detect, load, export, ...)."""
    return importlib.import_module(f"{__name__}.{_MODULES[_check_name(name)]}")


# The fix of a path whose format is not detected (the plugin words it for a suite).
DETECTION_FIX = "pass format=... explicitly"

# What a missing path's suffix says it was meant to be, so the error can name the format.
_SUFFIX_FORMATS = {".keras": "keras", ".h5": "h5", ".hdf5": "h5", ".meta": "checkpoint", ".pb": "graphdef",
                   ".tflite": "tflite", ".json": "tfjs", ".onnx": "onnx"}


def detect_format(path: str | Path) -> str:
    """Name the format of ``path`` by looking at it (suffixes, marker files), or raise."""
    p = Path(path)
    implied = _SUFFIX_FORMATS.get(p.suffix.lower())
    if not p.exists() and not Path(str(p) + ".meta").exists() and not Path(str(p) + ".index").exists():
        if os.path.islink(p):
            raise _broken_link(p, implied)
        raise ModelLoadError(p, implied, "no such file or directory",
                             f"check the path (a relative path is taken from {Path.cwd()})")
    check_not_special(p, implied)  # before any detect() opens it: a FIFO would block there
    for name in (*LOAD_ONLY_FORMATS, *ALL_FORMATS):
        if format_module(name).detect(p):
            return name
    if p.is_dir() and implied is not None:
        # A directory named like a model file (model.keras/, model.json/): say so, or the
        # message below reads as if the file's content were not recognised.
        raise ModelLoadError(p, implied, f"this is a directory, but a {implied} model named {p.name!r} is a file",
                             f"pass the {implied} file itself (is it inside this directory?), or a SavedModel "
                             "directory (one holding saved_model.pb)")
    raise ModelLoadError(
        p, None,
        "the format could not be detected; looked for: a .keras file (keras), a .h5/.hdf5 file (h5), "
        "a directory with saved_model.pb (saved_model), a .meta graph or checkpoint prefix with "
        ".index (checkpoint), a .pb GraphDef (graphdef), a .tflite file (tflite), a model.json "
        "(tfjs), a .onnx file (onnx)",
        DETECTION_FIX,
    )


def _broken_link(p: Path, implied: str | None) -> ModelLoadError:
    """A symlink that leads nowhere: a loop, or a link to a missing target."""
    try:
        os.stat(p)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return ModelLoadError(p, implied, "a symbolic link loop (the link points, through links, back to itself)",
                                  f"point the link at the model file: ls -l {p}")
    return ModelLoadError(p, implied, f"a symbolic link to {os.readlink(p)!r}, which does not exist",
                          "fix or remove the link, or pass the model's real path")


def load_model(source: Any, format: str | None = None, *, device: str = "cpu", **options: Any) -> LoadedModel:
    """Load ``source`` (a path, or an in-memory Keras model) as a ``LoadedModel`` on ``device``."""
    if isinstance(source, LoadedModel):
        return source
    if format is None:
        format = "keras" if not isinstance(source, (str, Path)) else detect_format(source)
    _check_name(format)
    if isinstance(source, (str, Path)) and os.path.islink(source) and not os.path.exists(source):
        raise _broken_link(Path(source), format)  # the same words with format= as without
    if isinstance(source, (str, Path)):
        check_not_special(source, format)
    missing = missing_runtime(format)
    if missing is not None:
        raise missing
    _place_trust(format, source, options)
    if format == "tfjs" and isinstance(options.get("backend"), str):
        from .tfjs.browser import BROWSER_BACKENDS, load as load_in_browser

        if options["backend"] in BROWSER_BACKENDS:  # a page in headless Chromium
            return load_in_browser(source, device=device, **options)
    return format_module(format).load(source, device=device, **options)


# Formats whose graph is scanned before loading (formats/tensorflow/trust.py); keras and h5
# take the same word as safe_mode=False (their Lambda layers run Python code).
_SCANNED = ("saved_model", "graphdef", "checkpoint")


def _place_trust(format: str, source: Any, options: dict[str, Any]) -> None:
    """``trusted=`` (or the session's --modelparity-trust-models) where a loader takes it."""
    trusted = options.pop("trusted", None)
    if format in _SCANNED:
        options["trusted"] = trusted
    elif format in ("keras", "h5") and isinstance(source, (str, Path)) and "safe_mode" not in options:
        from .tensorflow.trust import is_trusted

        if is_trusted(trusted):
            options["safe_mode"] = False


# The suffix an export path gets when it has none of its format's own: the path returned then
# loads back with load_model(path) and no format=. None: a directory (saved_model, tfjs).
EXPORT_SUFFIXES: dict[str, tuple[str, ...]] = {
    "keras": (".keras",), "h5": (".h5", ".hdf5"), "graphdef": (".pb",), "tflite": (".tflite",), "onnx": (".onnx",),
}


def export_path(format: str, path: str | Path) -> Path:
    """``path`` with ``format``'s suffix appended when it lacks it (``m`` -> ``m.tflite``);
    an existing directory is left as is (the exporter writes its default file inside).
    Another format's suffix (``m.h5`` for keras) is a mistake: ValueError."""
    p = Path(path)
    suffixes = EXPORT_SUFFIXES.get(format)
    if not suffixes or p.is_dir() or p.suffix.lower() in suffixes:
        return p
    other = _SUFFIX_FORMATS.get(p.suffix.lower())
    if other is not None and other != format:
        raise ValueError(f"a {format} export path must end with {' or '.join(suffixes)} (or have no suffix), "
                         f"got {str(p)!r}, a {other} suffix")
    return p.with_name(p.name + suffixes[0])


def export_model(model: Any, format: str, path: str | Path, *, converter_options: dict[str, Any] | None = None,
                 input_specs: Any = None, **options: Any) -> Path:
    """Export a Keras model to ``format`` at ``path``; return the path written.

    The returned path always loads back with ``load_model(path)``: a file path without its
    format's suffix gets it appended (``model`` -> ``model.tflite``). ``converter_options``
    go to the converter itself (tflite, onnx, tfjs; see docs/formats.md). The artifact is
    validated before it is returned (for tflite and onnx: loaded and run once); a converter
    failure or an invalid artifact raises ``ExportError``, never a file that fails at load.

    A SavedModel directory (a path) converts only to the formats whose module sets
    ``CONVERTS_SAVED_MODEL`` (tflite, onnx, tfjs); the others need the Keras model itself.
    ``input_specs`` declares the inputs of a subclassed Keras model that was never built or
    called (``[(name, shape, dtype)]``, see ``keras_specs``); a built one needs none.
    ``inputs=``, ``outputs=`` and ``feeds=`` (a TF1 ``.pb`` or checkpoint path only) are its
    load options: the sub-graph they name, with its switches folded, is what is converted.
    """
    module = format_module(format)
    graph_options: dict[str, Any] = {k: options.pop(k) for k in ("inputs", "outputs", "feeds") if k in options}
    if graph_options:
        _check_graph_options(model, format, graph_options)
        if getattr(module, "CONVERTS_SAVED_MODEL", False):
            options["graph_options"] = graph_options
    if input_specs is not None and is_keras_model(model):
        from .tensorflow.keras_specs import declare_input_specs

        declare_input_specs(model, input_specs)
    if not hasattr(module, "export"):
        raise ValueError(f"format {format!r} can be loaded but not exported to")
    if isinstance(model, (str, Path)) and not getattr(module, "CONVERTS_SAVED_MODEL", False):
        takers = [n for n in ALL_FORMATS if getattr(format_module(n), "CONVERTS_SAVED_MODEL", False)]
        what = _path_source_words(Path(model))
        fix = (f"pass the Keras model (or a .keras/.h5 file loaded with load_model), or convert "
               f"{what if what != 'a model file' else 'a SavedModel directory'} to one of: {', '.join(takers)}")
        if what == "a TF1 checkpoint":
            fix = (f"compare the checkpoint's conversions instead: {', '.join(takers)} (a TF1 graph has no Keras model "
                   "to save as keras, h5 or saved_model)")
            if format == "graphdef":
                fix += ("; for a frozen .pb, freeze it (tf.compat.v1.graph_util.convert_variables_to_constants) "
                        "and load the .pb as another reference")
        raise ModelLoadError(model, None, f"{what} cannot be converted to {format!r}: that export needs the "
                             "Keras model itself", fix, action="convert")
    missing = missing_runtime(format, export=True)
    if missing is not None:
        raise missing
    trusted = options.pop("trusted", None)
    if isinstance(model, (str, Path)):  # a SavedModel, .pb or checkpoint: scanned before converting
        from .tensorflow.trust import refuse_untrusted_source

        refuse_untrusted_source(Path(model), trusted)
    if converter_options is not None:
        params = inspect.signature(module.export).parameters
        if "converter_options" in params:
            options["converter_options"] = dict(converter_options)
        elif any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) and format == "tfjs":
            options.update(converter_options)  # tfjs.export passes its extra keywords to the converter
        else:
            raise TypeError(f"format {format!r} takes no converter_options (only tflite, onnx and tfjs convert)")
    _check_size_limit(model, format, options, Path(path))
    target = export_path(format, path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # e.g. /proc/x/m.tflite: say so before converting anything
        failure = f"{type(exc).__name__}: {exc.strerror or exc}"
        raise ExportError(path, format, f"the directory {str(target.parent)!r} cannot be created ({failure})",
                          _write_fix(failure, target)) from exc
    try:
        if trusted is not None and isinstance(model, (str, Path)):
            from .tensorflow.trust import trusting

            with trusting(trusted):  # the converter loads the path again itself
                written = Path(module.export(model, target, **options))
        else:
            written = Path(module.export(model, target, **options))
        validate = getattr(module, "validate", None)
        if validate is not None and not getattr(module, "EXPORT_VALIDATES", False):
            validate(written)
    except Exception as exc:  # noqa: BLE001 - machine limits and write failures are rewrapped, the rest re-raised
        reported = _export_failure(exc, format, Path(path))
        if reported is exc:
            raise
        raise reported from exc
    return written


def _path_source_words(path: Path) -> str:
    """What a path source is, as a message names it: a TF1 checkpoint is no SavedModel directory
    (issue 50: the skip lines of a checkpoint said it was one)."""
    from .tensorflow import graph_source

    kind = graph_source.kind(path)
    if kind == "checkpoint":
        return "a TF1 checkpoint"
    if kind == "graphdef":
        return "a frozen GraphDef (.pb)"
    return "a SavedModel directory" if path.is_dir() else "a model file"


def _check_graph_options(model: Any, format: str, given: dict[str, Any]) -> None:
    """``inputs``/``outputs``/``feeds`` name tensors of a TF1 graph: any other model is told so
    (not a bare TypeError); a format made from no path says so further on."""
    from .tensorflow import graph_source

    names = ", ".join(f"{k}=" for k in given)
    if not isinstance(model, (str, Path)) or graph_source.kind(Path(model)) is None:
        what = "a Keras model" if not isinstance(model, (str, Path)) else f"{str(model)!r}"
        raise ValueError(f"{names} name tensors of a TF1 graph (a frozen .pb or a checkpoint) to convert; "
                         f"{what} is not one: leave them out (a Keras model or SavedModel has named inputs and outputs)")


# Formats written as one protobuf or FlatBuffer: neither can exceed 2 GiB.
_SIZE_LIMITS = {"onnx": "protobuf", "graphdef": "protobuf", "tflite": "FlatBuffer"}
_TWO_GIB = 2**31 - 1
# How much smaller a TFLite quantisation writes the weights (float32 = 1).
_TFLITE_SHRINK = {"float16": 2, "dynamic_range": 4, "int8": 4}


def weight_bytes(model: Any) -> int | None:
    """Bytes of a Keras model's weights, from their shapes and dtypes (nothing copied), or None."""
    import math

    import numpy as np

    try:
        return sum(math.prod(int(d) for d in w.shape) * np.dtype(str(getattr(w.dtype, "name", w.dtype))).itemsize
                   for w in model.weights)
    except (AttributeError, TypeError, ValueError):
        return None


def _check_size_limit(model: Any, format: str, options: dict[str, Any], path: Path) -> None:
    """A model whose weights cannot fit the format's 2 GiB container is refused before converting
    (the converters fail after minutes and many gigabytes, or write a file nothing loads)."""
    container = _SIZE_LIMITS.get(format)
    if container is None or isinstance(model, (str, Path)):
        return
    size = weight_bytes(model)
    if size is None:
        return
    written = size // _TFLITE_SHRINK.get(str(options.get("quantization")), 1) if format == "tflite" else size
    if written > _TWO_GIB:
        from ..runtime.resources import human_bytes

        fix = {"tflite": "quantise it (quantization='float16' halves it, 'int8' quarters it), or test it as "
                         "saved_model/keras",
               "onnx": "test it as saved_model/keras; tf2onnx's large-model mode (external data) is not "
                       "used by this plugin yet",
               "graphdef": "test it as saved_model (variables are stored outside the graph there)"}[format]
        raise ExportError(path, format, f"the model's weights take {human_bytes(written)} in this format, more "
                          f"than a {container} can hold (2 GiB); refused before converting", fix)


def _export_failure(exc: Exception, format: str, path: Path) -> Exception:
    """The error an export failure is reported as: a machine limit (file size, disk, memory,
    threads) named as such whatever the converter wrapped it in, a write failure with its fix,
    or ``exc`` itself."""
    limit = resource_failure(exc, str(path.parent if str(path.parent) not in ("", ".") else Path.cwd()))
    if limit is not None:
        return ExportError(path, format, limit[0], limit[1], log_path=getattr(exc, "log_path", None),
                           route=getattr(exc, "route", None))
    if isinstance(exc, ExportError):
        return exc
    failure = _write_failure(exc)
    if failure is None:
        return exc
    return ExportError(path, format, f"the export could not be written ({failure})", _write_fix(failure, path))


# TensorFlow raises its own types for a failed write (it must not be imported to test them).
_TF_WRITE_ERRORS = ("PermissionDeniedError", "ResourceExhaustedError")
_WRITE_WORDS = ("Permission denied", "Read-only file system", "No space left", "Not a directory",
                "Is a directory")


def _write_failure(exc: BaseException) -> str | None:
    """``"PermissionError: ..."`` when ``exc`` (or what it wraps) is a failure to write a file."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__
        text = str(current).strip().splitlines()[0][:300] if str(current).strip() else ""
        if isinstance(current, OSError) and not isinstance(current, (FileNotFoundError, ConnectionError, TimeoutError)):
            return f"{name}: {text}"
        if name in _TF_WRITE_ERRORS or (name.endswith("Error") and any(w in text for w in _WRITE_WORDS)
                                        and type(current).__module__.startswith("tensorflow")):
            return f"{name}: {text}"
        current = current.__cause__ or current.__context__
    return None


def _write_fix(failure: str, path: Path) -> str:
    where = path.parent if str(path.parent) not in ("", ".") else Path.cwd()
    if "No space" in failure or "ResourceExhausted" in failure:
        return f"free disk space on the filesystem of {where}, or export to another directory"
    if "Not a directory" in failure or "NotADirectory" in failure or "FileExists" in failure:
        return f"a part of {path} is a file, not a directory: export to a path whose parent directories are directories"
    if "Is a directory" in failure or "IsADirectory" in failure:
        return f"{path} is an existing directory: remove it or export to another path"
    return (f"export to a writable directory: {where} cannot be written (check its permissions, or that the "
            "filesystem is not mounted read-only); for the plugin's cache set --modelparity-cache-dir")

