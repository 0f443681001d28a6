"""Real rows for a suite: what ``modelparity_dataset`` (or ``--modelparity-data``) returns, as
arrays fitted to a model's inputs.

Why: what quantisation costs a trained model depends on the data it sees; judged on random
uniform rows it says little (a model trained on [0, 1] pixels, calibrated on them, can be
fed [-1, 1] noise by ``parity_batch``). One loader serves the three users of real rows: the
calibration of a ``tflite:int8`` candidate, ``parity_batch``, and
``strategies.dataset_batches`` (Hypothesis draws real rows, optionally perturbed).

Accepted: an array (one input); a tuple of arrays (one per input, in input order; a pair
``(x, y)`` for a one-input model takes ``x``); a dict by input name; a path to an ``.npz``
(keys = input names, or one array) or ``.npy``; a ``tf.data.Dataset`` or any other iterable
of batches (a list counts as batches), each batch one of the above. Nothing here imports
TensorFlow: a ``tf.data.Dataset`` is read through its own ``as_numpy_iterator``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import DatasetMismatch, InvalidArgumentError

# Rows read at most (a long dataset is cut here: calibration and batches need few).
MAX_ROWS = 2048
# Calibration takes the first rows, up to this many and at most half the data; the test
# batch takes the rows after them, so the rows judged were not the rows calibrated on.
CALIBRATION_ROWS = 100
BATCH_ROWS = 64


class Dataset:
    """The user's rows, read once; ``arrays(specs)`` fits them to a model's inputs."""

    def __init__(self, raw: Any, label: str) -> None:
        self.label = label
        self._parts = _read_parts(raw, label)
        if not self._parts:
            raise InvalidArgumentError(f"modelparity_dataset {label}: no rows; return at least one batch")
        self._fitted: dict[tuple, dict[str, np.ndarray]] = {}
        self._digest: str | None = None

    def arrays(self, specs: list[Any]) -> dict[str, np.ndarray]:
        """{input name: all rows (at most MAX_ROWS)} cast to each input's dtype."""
        key = tuple((s.name, tuple(s.shape), str(s.dtype)) for s in specs)
        if key not in self._fitted:
            pieces = [_fit(part, specs, self.label) for part in self._parts]
            joined = {s.name: np.concatenate([p[s.name] for p in pieces])[:MAX_ROWS] for s in specs}
            self._fitted[key] = joined
        return self._fitted[key]

    def rows(self, specs: list[Any]) -> int:
        return len(next(iter(self.arrays(specs).values())))

    def calibration(self, specs: list[Any]) -> dict[str, np.ndarray]:
        """The calibration rows: the first ``min(CALIBRATION_ROWS, rows // 2)`` (at least 1)."""
        n = max(1, min(CALIBRATION_ROWS, self.rows(specs) // 2))
        return {k: v[:n] for k, v in self.arrays(specs).items()}

    def batch(self, specs: list[Any], size: int = BATCH_ROWS) -> dict[str, np.ndarray]:
        """Up to ``size`` rows after the calibration rows (all rows of a dataset too small to split)."""
        total = self.rows(specs)
        start = max(1, min(CALIBRATION_ROWS, total // 2)) if total > 1 else 0
        start = start if total - start >= 1 else 0
        return {k: v[start:start + size] for k, v in self.arrays(specs).items()}

    def digest(self) -> str:
        """A key of the rows (the session keys its exports and candidates by it), computed once."""
        if self._digest is None:
            import hashlib

            h = hashlib.blake2b(digest_size=12)
            for part in self._parts:
                for name, arr in sorted(_named(part).items()):
                    h.update(f"{name}{arr.shape}{arr.dtype}".encode())
                    h.update(np.ascontiguousarray(arr).tobytes())
            self._digest = h.hexdigest()
        return self._digest


def _named(part: Any) -> dict[str, np.ndarray]:
    if isinstance(part, Mapping):
        return {str(k): np.asarray(v) for k, v in part.items()}
    if isinstance(part, tuple):
        return {str(i): np.asarray(v) for i, v in enumerate(part)}
    return {"": np.asarray(part)}


def _read_parts(raw: Any, label: str) -> list[Any]:
    if isinstance(raw, (str, Path)):
        path = Path(raw).expanduser()
        if not path.is_file():
            raise InvalidArgumentError(f"modelparity dataset {str(path)!r}: no such file; pass an .npz (arrays by "
                                       "input name) or .npy file")
        try:
            loaded = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InvalidArgumentError(f"modelparity dataset {str(path)!r}: numpy cannot read it ({exc}); write it "
                                       "with np.savez(path, **{input name: array})") from exc
        if isinstance(loaded, np.ndarray):
            return [loaded]
        with loaded:
            return [{k: loaded[k] for k in loaded.files}]
    if isinstance(raw, (np.ndarray, Mapping, tuple)):
        return [raw]
    iterator = getattr(raw, "as_numpy_iterator", None)  # tf.data.Dataset, without importing TF
    items = iterator() if callable(iterator) else raw
    try:
        parts, rows = [], 0
        for item in items:
            parts.append(item)
            rows += len(next(iter(_named(item).values())))
            if rows >= MAX_ROWS:
                break
    except TypeError:
        raise InvalidArgumentError(
            f"modelparity_dataset {label}: a {type(raw).__name__} is not rows; return an array, a tuple of arrays, a "
            "dict by input name, an .npz path, a tf.data.Dataset or an iterable of batches") from None
    return parts


def _fit(part: Any, specs: list[Any], label: str) -> dict[str, np.ndarray]:
    """One batch of the dataset as {input name: array} of each input's dtype and rank."""
    names = [s.name for s in specs]
    if isinstance(part, Mapping):
        from ..formats.base import by_converter_names

        keyed = by_converter_names({str(k): v for k, v in part.items()}, names)
        positional = [f"arr_{i}" for i in range(len(names))]  # np.savez(path, a, b): input order
        if sorted(keyed) == sorted(names):
            arrays = [keyed[n] for n in names]
        elif sorted(keyed) == positional:
            arrays = [keyed[n] for n in positional]
        elif len(names) == 1 and set(keyed) == {"x", "y"}:
            arrays = [keyed["x"]]  # features and labels
        else:
            # a key that is no input is a mistake to hear of (rows of another model, a typo),
            # never an array fed to whichever input happens to be there
            raise DatasetMismatch(names_mismatch(label, {str(k): np.asarray(v) for k, v in part.items()}, specs))
    elif isinstance(part, (tuple, list)):
        if len(part) == len(names):
            arrays = list(part)
        elif len(names) == 1 and len(part) == 2:
            arrays = [part[0]]  # (x, y): features and labels
        else:
            raise InvalidArgumentError(f"modelparity_dataset {label}: a batch holds {len(part)} arrays; the model "
                                       f"has {len(names)} input(s) {names}")
    else:
        if len(names) != 1:
            raise InvalidArgumentError(f"modelparity_dataset {label}: one array given; the model has inputs {names}: "
                                       "return a dict by input name")
        arrays = [part]
    fitted = {}
    for spec, value in zip(specs, arrays):
        arr = np.asarray(value)
        if len(spec.shape) and arr.ndim == len(spec.shape) - 1:
            arr = arr[None]  # one row (an unbatched tf.data element)
        if len(spec.shape) and arr.ndim != len(spec.shape):
            raise DatasetMismatch(f"modelparity_dataset {label}: input {spec.name!r} has shape {arr.shape}; the "
                                       f"model takes {tuple(spec.shape)} (None: any size)")
        fitted[spec.name] = arr.astype(spec.dtype, copy=False)
    return fitted


def _fits(arr: np.ndarray, spec: Any) -> bool:
    """Whether ``arr`` could be rows of ``spec`` (same rank, or one row; known dims equal)."""
    dims = tuple(spec.shape)[1:] if len(spec.shape) else ()
    shape = arr.shape[1:] if arr.ndim == len(spec.shape) else arr.shape if arr.ndim == len(dims) else None
    return shape is not None and all(d is None or d == s for d, s in zip(dims, shape))


def names_mismatch(label: str, arrays: Mapping[str, np.ndarray], specs: list[Any]) -> str:
    """The one-screen text for rows whose array names match no input: what the file holds,
    what the model takes, and the line that fixes it (pairing by shape where one fits)."""
    def shown(shape: tuple) -> str:
        return "(" + ", ".join("None" if d is None else str(d) for d in shape) + (",)" if len(shape) == 1 else ")")

    held = [f"    {name!r}: {shown(arr.shape)} {arr.dtype}" for name, arr in sorted(arrays.items())]
    wanted = [f"    {s.name!r}: {shown(tuple(s.shape))} {np.dtype(s.dtype)}" for s in specs]
    pairs = []
    for spec in specs:
        fitting = [n for n, a in sorted(arrays.items()) if _fits(a, spec)]
        pairs.append(f"{spec.name}=rows[{fitting[0]!r}]" if len(fitting) == 1 else f"{spec.name}=<rows of {spec.name!r}>")
    fix = (f"rows = np.load({label}); np.savez({label}, {', '.join(pairs)})" if label[:1] in "'\""
           else f"return {{{', '.join(repr(p.split('=')[0]) + ': ...' for p in pairs)}}} from modelparity_dataset")
    return "\n".join([
        f"modelparity_dataset {label}: arrays {sorted(arrays)} match none of the model's inputs "
        f"{[s.name for s in specs]}: name each array after its input",
        f"  the rows hold {len(arrays)} array(s):", *held,
        f"  the model takes {len(specs)} input(s):", *wanted,
        "  fix, e.g.:",
        f"    {fix}",
        "  (arr_0, arr_1... in input order are read too; one input also takes x and y, features first)"])


_CACHE: dict[int, tuple[Any, Dataset]] = {}


def as_dataset(raw: Any, label: str | None = None) -> Dataset | None:
    """``raw`` as a ``Dataset`` (read once per object), None for None."""
    if raw is None:
        return None
    if isinstance(raw, Dataset):
        return raw
    hit = _CACHE.get(id(raw))
    if hit is not None and hit[0] is raw:
        return hit[1]
    dataset = Dataset(raw, label or (repr(str(raw)) if isinstance(raw, (str, Path)) else type(raw).__name__))
    _CACHE[id(raw)] = (raw, dataset)
    return dataset
