"""Reading and writing a recording's tensors: ``.npz`` (names kept, dtypes as they are) and
JSON (``{name: {"dtype", "shape", "data"}}``, what a web or Android app can write).

Why its own module: a recording may come from anywhere (a phone, a user's browser, a colleague's
commit), so nothing in it is trusted. Every file is a plain name inside the recording's folder
(no path, no ``..``, no symbolic link), read only as a regular file; every array's shape and
dtype are checked from its header before a byte of data is allocated; pickles are refused.
Files are written atomically (a temporary file renamed into place), never half-written.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ...errors import ModelLoadError
from .._files import read_regular

__all__ = ["FORMAT", "MAX_ELEMENTS", "atomic_write", "member", "read_tensors", "tensors_json", "write_npz"]

FORMAT = "recorded"
# No recorded array may hold more elements than this (2**28 float32 = 1 GiB): a manifest or an
# .npz header claiming more is refused before anything is allocated.
MAX_ELEMENTS = 1 << 28
# A JSON dump is parsed whole; larger ones must be .npz.
MAX_JSON_BYTES = 256 << 20
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+=-]{0,200}$")
_DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
           "float16", "float32", "float64", "bfloat16", "complex64", "complex128")


def _refuse(path: Path, problem: str, fix: str) -> ModelLoadError:
    return ModelLoadError(path, FORMAT, problem, fix)


def member(folder: Path, name: Any, what: str) -> Path:
    """``folder/name`` where ``name`` is a plain file name of the recording (no separator, no
    ``..``, no link): a manifest cannot make the loader read outside its folder."""
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        raise _refuse(folder, f"the manifest names {what} {name!r}, which is not a plain file name inside the "
                      "recording's folder (paths, '..' and absolute names are refused)",
                      "keep every file of a recording beside its manifest and name it there without a path")
    path = folder / name
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise _refuse(path, f"{what} {name!r} named by the manifest is missing", "write it beside the manifest "
                      "(an app's dump: see docs/recorded.md), or remove its batch from the manifest") from None
    if stat.S_ISLNK(info.st_mode):
        raise _refuse(path, f"{what} {name!r} is a symbolic link (to {os.readlink(path)!r}); a recording's files "
                      "are read only as the regular files beside its manifest", "copy the file itself into the folder")
    return path


def check_shape(path: Path, name: str, shape: Any) -> tuple[int, ...]:
    """``shape`` as a tuple of non-negative ints within ``MAX_ELEMENTS``, or a clear refusal."""
    if not isinstance(shape, (list, tuple)) or len(shape) > 32 or \
            not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d for d in shape):
        raise _refuse(path, f"tensor {name!r} has shape {shape!r}; a shape is a list of at most 32 "
                      "non-negative integers", "write the array's real shape")
    if math.prod(shape) > MAX_ELEMENTS:
        raise _refuse(path, f"tensor {name!r} claims shape {tuple(shape)} ({math.prod(shape):,} elements), more "
                      f"than a recording may hold ({MAX_ELEMENTS:,}); refused before allocating it",
                      "record fewer rows per batch (a few rows are enough to compare)")
    return tuple(shape)


def _dtype(path: Path, name: str, dtype: Any) -> np.dtype:
    if str(dtype) not in _DTYPES:
        raise _refuse(path, f"tensor {name!r} has dtype {dtype!r}; a recording holds numeric arrays only "
                      f"({', '.join(_DTYPES)})", "write the array as one of those dtypes")
    if str(dtype) == "bfloat16":
        import ml_dtypes  # installed with TensorFlow and JAX; only a bfloat16 recording needs it

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(str(dtype))


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    """The named arrays of an ``.npz`` or ``.json`` file of a recording, checked."""
    if path.suffix.lower() == ".json":
        return _read_json(path)
    if path.suffix.lower() != ".npz":
        raise _refuse(path, "a recording's arrays are .npz or .json files", "save them with numpy.savez or as JSON")
    content = read_regular(path, FORMAT)
    import io

    out: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    raise _refuse(path, f"member {info.filename!r} is not a .npy array", "save with numpy.savez")
                name = info.filename[:-4]
                with zf.open(info) as fh:
                    version = np.lib.format.read_magic(fh)
                    header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                              else np.lib.format.read_array_header_2_0)(fh)
                    shape, fortran, dtype = header
                    if dtype.hasobject:
                        raise _refuse(path, f"array {name!r} holds Python objects (a pickle); refused",
                                      "save numeric arrays only")
                    if dtype.name not in _DTYPES or dtype.names is not None:  # strings, dates, records
                        raise _refuse(path, f"array {name!r} has dtype {dtype.str!r} ({dtype.name}); a recording "
                                      f"holds numeric arrays only ({', '.join(_DTYPES)})",
                                      "save it as one of those dtypes")
                    check_shape(path, name, list(shape))
                    want = math.prod(shape) * dtype.itemsize
                    _check_memory(path, name, want)  # a few compressed bytes may claim gigabytes
                    data = fh.read(want + 1)
                    if len(data) != want:
                        raise _refuse(path, f"array {name!r} holds {len(data)} bytes where its header says {want}",
                                      "save it again with numpy.savez")
                    arr = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
                out[name] = np.ascontiguousarray(arr)
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise _refuse(path, f"not a readable .npz file ({exc})", "save it with numpy.savez") from exc
    return out


def _check_memory(path: Path, name: str, nbytes: int) -> None:
    from ...errors import InvalidArgumentError
    from ...runtime.resources import check_allocation

    try:
        check_allocation(nbytes, f"array {name!r}")
    except InvalidArgumentError as exc:
        raise _refuse(path, f"{exc}; refused before allocating it", "record fewer rows per batch") from None


def _read_json(path: Path) -> dict[str, np.ndarray]:
    data = _json_file(path)
    tensors = data.get("outputs", data) if isinstance(data, dict) else None
    if not isinstance(tensors, dict):
        raise _refuse(path, "a JSON tensor file is an object {name: {\"dtype\", \"shape\", \"data\"}}",
                      "see docs/recorded.md")
    return tensors_from_json(path, tensors)


def json_file(path: Path) -> Any:
    """A small JSON file of a recording, parsed (size checked before reading)."""
    return _json_file(path)


def _json_file(path: Path) -> Any:
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        raise _refuse(path, f"cannot be read: {exc.strerror or exc}", "check the file") from exc
    if size > MAX_JSON_BYTES:
        raise _refuse(path, f"the JSON file is {size:,} bytes, more than {MAX_JSON_BYTES:,}",
                      "write large arrays as .npz")
    try:
        return json.loads(read_regular(path, FORMAT).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _refuse(path, f"not valid JSON ({exc})", "write it with JSON.stringify / json.dump") from exc
    except RecursionError:
        raise _refuse(path, "its JSON is nested deeper than Python's parser goes (no recording nests more than "
                      "a few levels)", "write it with JSON.stringify / json.dump") from None


def tensors_from_json(path: Path, tensors: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``{name: {"dtype", "shape", "data": flat list}}`` as arrays, each checked."""
    out: dict[str, np.ndarray] = {}
    for name, entry in tensors.items():
        if not isinstance(entry, dict) or "data" not in entry or "shape" not in entry:
            raise _refuse(path, f"tensor {name!r} must be {{\"dtype\": ..., \"shape\": [...], \"data\": [flat "
                          "values]}", "see docs/recorded.md for the JSON form")
        shape = check_shape(path, str(name), entry["shape"])
        dtype = _dtype(path, str(name), entry.get("dtype", "float32"))
        flat = entry["data"]
        if not isinstance(flat, list) or len(flat) != math.prod(shape):
            got = len(flat) if isinstance(flat, list) else type(flat).__name__
            raise _refuse(path, f"tensor {name!r}: shape {list(shape)} needs {math.prod(shape)} values, the data "
                          f"holds {got}", "write the values flat, in row-major (C) order")
        try:
            arr = np.asarray([math.nan if v is None else v for v in flat], dtype=np.float64 if dtype.kind == "f"
                             else dtype).astype(dtype).reshape(shape)
        except (TypeError, ValueError, OverflowError) as exc:
            raise _refuse(path, f"tensor {name!r}: its data are not {dtype.name} numbers ({exc})",
                          "write numbers only (NaN as null)") from exc
        out[str(name)] = arr
    return out


def tensors_json(tensors: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The JSON form of named arrays (floats written exactly: float32 values round-trip)."""
    out = {}
    for name, arr in tensors.items():
        a = np.asarray(arr)
        data = [None if isinstance(v, float) and math.isnan(v) else v for v in a.reshape(-1).tolist()]
        out[name] = {"dtype": a.dtype.name, "shape": list(a.shape), "data": data}
    return out


def atomic_write(path: Path, content: bytes) -> None:
    """Write ``path`` whole or not at all (a temporary file in its folder, then renamed)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_npz(path: Path, tensors: Mapping[str, np.ndarray]) -> None:
    """Named arrays as an ``.npz`` (compressed: a recording is meant to be committed)."""
    import io

    buf = io.BytesIO()
    arrays: dict[str, Any] = {name: np.asarray(arr) for name, arr in tensors.items()}
    np.savez_compressed(buf, **arrays)
    atomic_write(path, buf.getvalue())
