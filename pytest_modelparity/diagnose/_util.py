"""Small helpers shared by the diagnosis checks: run any kind of model, flatten outputs,
judge whether one array "fits" another. No TensorFlow import at module level."""

from __future__ import annotations

import sys

import contextlib
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from ..verdict import tree

# A transform "fits" when its residual is below this share of the output's largest value
# (float noise measured on every format here stays <= 5e-6 of it; real bugs >= 2e-3)
# or within the output's own tolerance, and is at most FIT_GAIN of the original error.
FIT_REL = 1e-4
FIT_GAIN = 0.1


def is_keras_model(obj: Any) -> bool:
    """A Keras model, a user's subclass of ``keras.Model`` (defined in any module) included."""
    if type(obj).__module__.startswith("keras") and hasattr(obj, "layers") and callable(obj):
        return True
    model = getattr(sys.modules.get("keras"), "Model", None)  # never imports Keras
    return isinstance(model, type) and isinstance(obj, model)


def native_of(model: Any) -> Any:
    """The underlying runtime object of a LoadedModel (``.native``), or the object itself."""
    return getattr(model, "native", model) if _is_loaded_model(model) else model


def _is_loaded_model(obj: Any) -> bool:
    from ..formats.base import LoadedModel
    return isinstance(obj, LoadedModel)


def hook(model: Any, name: str, *args: Any) -> Any:
    """Call an optional LoadedModel diagnosis hook; None when absent or when it fails."""
    fn = getattr(model, name, None)
    if fn is None or not callable(fn):
        return None
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - a hook that cannot answer is the same as no hook
        return None


def to_numpy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: to_numpy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_numpy(v) for v in value)
    if hasattr(value, "numpy"):
        return np.asarray(value.numpy())
    return np.asarray(value)


def fit_inputs(model: Any, batch: Any) -> Any:
    """A ``{input name: array}`` batch arranged as a raw Keras model was built (one tensor or a
    list), so Keras does not warn "The structure of `inputs` doesn't match" at the user."""
    struct = getattr(model, "_inputs_struct", None)
    inputs = getattr(model, "inputs", None)
    if not isinstance(batch, Mapping) or struct is None or isinstance(struct, Mapping) or not inputs:
        return batch
    names = [getattr(t, "name", None) for t in inputs]
    if not all(n in batch for n in names) or len(names) != len(batch):
        return batch
    values = [batch[n] for n in names]
    return values if isinstance(struct, (list, tuple)) else values[0]


def run_model(model: Any, batch: Any, *, training: bool | None = None) -> Any:
    """Outputs of ``model`` on ``batch`` as numpy (LoadedModel, Keras model or callable)."""
    if _is_loaded_model(model):
        if training:
            raise TypeError("training mode is only available on Keras models")
        return model.predict(batch)
    if is_keras_model(model):
        # ``model(x)`` is what the assertions run; training=True only when asked for.
        batch = fit_inputs(model, batch)
        return to_numpy(model(batch, training=True) if training else model(batch))
    if training:
        raise TypeError("training mode is only available on Keras models")
    return to_numpy(model(batch))


def flatten(value: Any) -> dict[str, np.ndarray]:
    """``{path: array}`` with the same paths as verdict/compare.py: "", "['a']", "[1]", "['a'][0]"."""
    return tree.flatten(value)


def pick(flat: dict[str, np.ndarray], path: str) -> np.ndarray | None:
    """The array at ``path``, or the only array when there is just one."""
    if path in flat:
        return flat[path]
    if len(flat) == 1:
        return next(iter(flat.values()))
    return None


def first_input(batch: Any) -> np.ndarray | None:
    """The single input array of a batch (array, one-element list, one-entry dict)."""
    if isinstance(batch, Mapping):
        return np.asarray(next(iter(batch.values()))) if len(batch) == 1 else None
    if tree.is_branch(batch):
        return np.asarray(batch[0]) if len(batch) == 1 else None
    return np.asarray(batch)


def rows(batch: Any, sl: slice) -> Any:
    """A slice of the batch rows of every input."""
    return tree.map_inputs(lambda v: np.asarray(v)[sl], batch)


def batch_size(batch: Any) -> int | None:
    arr = first_input(batch)
    if arr is None:
        if isinstance(batch, Mapping):
            arr = np.asarray(next(iter(batch.values())))
        elif isinstance(batch, (list, tuple)) and batch:
            arr = np.asarray(batch[0])
        else:
            return None
    return int(arr.shape[0]) if arr.ndim else None


# Arrays above CHUNK elements are scanned in chunks (float64 per chunk, never a float64 copy
# of the whole output); array-level checks first try their hypotheses on a sample of at most
# SAMPLE elements and confirm on the full arrays only the one they would claim.
CHUNK = 1 << 18
SAMPLE = 1 << 16

_MEMO: dict[tuple, tuple[tuple, Any]] | None = None


@contextlib.contextmanager
def measuring() -> Iterator[None]:
    """Within one diagnosis, remember full-array measurements (``scale_of`` of the expected
    output is asked for by every check) instead of scanning 10M elements again each time."""
    global _MEMO
    outer = _MEMO
    _MEMO = {} if outer is None else outer
    try:
        yield
    finally:
        _MEMO = outer


def _memo(name: str, arrays: tuple, compute: Callable[[], Any]) -> Any:
    if _MEMO is None:
        return compute()
    key = (name, *(id(a) for a in arrays))
    hit = _MEMO.get(key)
    if hit is not None and all(x is y for x, y in zip(hit[0], arrays)):
        return hit[1]
    value = compute()
    _MEMO[key] = (arrays, value)  # keeps the arrays alive: their ids cannot be reused meanwhile
    return value


def _flat_chunks(*arrays: np.ndarray) -> Iterator[tuple[np.ndarray, ...]]:
    flats = [np.asarray(a).reshape(-1) for a in arrays]
    n = flats[0].size
    for start in range(0, n, CHUNK):
        yield tuple(f[start:start + CHUNK] for f in flats)


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """The largest finite |a - b| (float64), 0 when none is finite."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return _max_abs_small(a, b)
    return _max_abs_and_where(a, b)[0]


def _max_abs_and_where(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
    """(largest finite |a - b|, its flat index) in one chunked pass (remembered while measuring)."""

    def compute() -> tuple[float, int]:
        worst, where = 0.0, 0
        for i, (ca, cb) in enumerate(_flat_chunks(a, b)):
            d = np.abs(ca.astype(np.float64) - cb.astype(np.float64))
            if not d.size:
                continue
            j = int(np.argmax(d))  # the first NaN if there is one: then filter
            if not np.isfinite(d[j]):
                d[~np.isfinite(d)] = -1.0
                j = int(np.argmax(d))
            if d[j] > worst:
                worst, where = float(d[j]), i * CHUNK + j
        return worst, where

    return _memo("max_abs_diff", (a, b), compute)


def _finite_max(x: np.ndarray) -> float:
    """max of ``x`` over its finite values (0 when none), filtering only when needed."""
    if not x.size:
        return 0.0
    m = float(np.max(x))
    if np.isfinite(m):
        return max(m, 0.0)
    x = x[np.isfinite(x)]
    return max(float(x.max()), 0.0) if x.size else 0.0


def _max_abs_small(a: np.ndarray, b: np.ndarray) -> float:  # broadcasting shapes: the plain way
    d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    d = d[np.isfinite(d)]
    return float(d.max()) if d.size else 0.0


def scale_of(x: np.ndarray) -> float:
    """The largest finite |x| (0 when none is finite)."""
    x = np.asarray(x)

    def compute() -> float:
        worst = 0.0
        for (c,) in _flat_chunks(x):
            # |x| is exact in a float's own dtype; integers go through float64 (abs(int8 -128))
            worst = max(worst, _finite_max(np.abs(c if c.dtype.kind == "f" else c.astype(np.float64))))
        return worst

    return _memo("scale_of", (x,), compute)


def within(tolerance: Any, actual: np.ndarray, expected: np.ndarray) -> bool:
    """Does ``actual`` pass against ``expected`` under a tolerances.Tolerance (elementwise part)?"""
    if tolerance is None:
        return False
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return False
    if not a.size:
        return True
    scaled = getattr(tolerance, "scale", 0.0) * scale_of(e)
    bad = 0
    for ca, ce in _flat_chunks(a, e):
        ca, ce = ca.astype(np.float64), ce.astype(np.float64)
        bound = tolerance.atol + tolerance.rtol * np.abs(ce) + scaled
        ok = np.abs(ca - ce) <= bound
        ok |= (ca == ce)
        bad += int(np.count_nonzero(~ok))
    frac = float(getattr(tolerance, "max_mismatch_fraction", 0.0) or 0.0)
    return bool(bad / a.size <= frac)


def all_finite(x: np.ndarray) -> bool:
    x = np.asarray(x)
    return bool(_memo("all_finite", (x,), lambda: all(bool(np.all(np.isfinite(c))) for (c,) in _flat_chunks(x))))


def sample_pair(actual: np.ndarray, expected: np.ndarray, *, rows_axis: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """At most ``SAMPLE`` elements of both arrays, taken the same way, always including the
    element where they differ most (so the sample's error is the full error).

    With ``rows_axis`` (and a last axis of at most SAMPLE // 4) whole rows along the last axis
    are kept, evenly spaced, so per-row transforms (softmax over classes, class order) still
    see complete rows; otherwise an evenly strided 1-D sample. Small arrays come back whole.
    """
    a, e = np.asarray(actual), np.asarray(expected)
    if a.size <= SAMPLE or a.shape != e.shape:
        return a, e
    worst = _argmax_abs_diff(a, e)
    last = a.shape[-1] if a.ndim >= 2 else 1
    if rows_axis and a.ndim >= 2 and 1 < last <= SAMPLE // 4:
        a2, e2 = a.reshape(-1, last), e.reshape(-1, last)
        take = np.sort(np.append(np.linspace(0, a2.shape[0] - 1, SAMPLE // last).astype(np.int64),
                                 worst // last))
        return a2[take], e2[take]
    flat_a, flat_e = a.reshape(-1), e.reshape(-1)
    take = np.sort(np.append(np.linspace(0, flat_a.size - 1, SAMPLE).astype(np.int64), worst))
    return flat_a[take], flat_e[take]


def _argmax_abs_diff(a: np.ndarray, b: np.ndarray) -> int:
    """Flat index of the largest finite |a - b| (0 when none)."""
    return _max_abs_and_where(a, b)[1]


def fits(actual: np.ndarray, candidate: np.ndarray, original_error: float, tolerance: Any = None) -> tuple[bool, float]:
    """Is ``actual`` explained by ``candidate`` (a transform of the expected output)?

    Returns (fits, residual max abs). Fits when the residual is tiny relative to the output
    (or within ``tolerance``) AND removes most of the original error.
    """
    if np.shape(actual) != np.shape(candidate):
        return False, float("inf")
    cand = np.asarray(candidate)
    if not all_finite(cand):
        return False, float("inf")
    resid = max_abs_diff(actual, cand)
    gain = resid <= FIT_GAIN * original_error
    if not (gain and original_error > 0):  # the cheap half first: most hypotheses stop here
        return False, resid
    small = resid <= FIT_REL * max(scale_of(cand), scale_of(actual), 1e-30) or within(tolerance, actual, cand)
    return bool(small), resid


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"
