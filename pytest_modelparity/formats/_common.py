"""What every format module shares: install hints, quiet blocks, short error lines, output
naming, reading a model file, and the one "is this a Keras model" check.

Why one home: these were defined two or three times across the format modules (and formats
imported each other's private helpers to reach them). Nothing here imports TensorFlow at
module level; the Keras helpers import it lazily when called.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import ModelLoadError

TF_INSTALL = "pip install 'pytest-modelparity[tensorflow]' (or any TensorFlow >= 2.16 build)"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence the Python warnings Keras, TF and the converters emit while saving, loading
    or converting (legacy h5, numpy deprecations, converter notices)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first meaningful line of an exception, for a short error message."""
    text = str(exc).strip() or type(exc).__name__
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


def _keras() -> Any:
    from ._tf import import_tf

    import_tf()
    import keras

    return keras


def pack_inputs(model: Any, xs: list[Any]) -> Any:
    """Arrange flat inputs the way the model was built (single tensor, list or dict)."""
    struct = getattr(model, "_inputs_struct", None)
    if isinstance(struct, dict):
        # model.inputs (the order of xs) is Keras' flattening of the dict, sorted by key, not
        # the dict's insertion order: pack with Keras' own inverse of that flattening.
        return _keras().tree.pack_sequence_as(struct, list(xs))
    if isinstance(struct, (list, tuple)):
        return list(xs)
    return xs[0] if len(xs) == 1 else list(xs)


def name_outputs(result: Any, names: list[str], numpy: bool = True) -> dict[str, Any]:
    """A model call's result as ``{output name: value}`` in the model's output order."""
    conv: Callable[[Any], Any] = (lambda v: np.asarray(v)) if numpy else (lambda v: v)
    if isinstance(result, dict):
        # By name when the keys are the output names; else in model.outputs' order (sorted keys).
        values = [result[n] for n in names] if all(n in result for n in names) else _keras().tree.flatten(result)
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
    try:
        with open(path, "rb") as fh:
            content = fh.read()
    except OSError as exc:
        raise ModelLoadError(path, format, f"cannot be read: {exc.strerror or exc}",
                             "check the file's permissions") from exc
    if not content:
        raise ModelLoadError(path, format, "the file is empty (0 bytes)",
                             f"re-export the model; an interrupted copy or export leaves empty {suffix} files")
    magic_check(path, content)
    return path, content


def write_atomically(path: Path, content: bytes) -> Path:
    """Write ``content`` to ``path`` through a temporary file and one rename: a reader never
    sees half a file, and a failed write leaves nothing behind."""
    import os
    import tempfile

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
