"""Small helpers shared by the diagnosis checks: run any kind of model, flatten outputs,
judge whether one array "fits" another. No TensorFlow import at module level."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

# A transform "fits" when its residual is below this share of the output's largest value
# (float noise measured on every format here stays <= 5e-6 of it; real bugs >= 2e-3)
# or within the output's own tolerance, and is at most FIT_GAIN of the original error.
FIT_REL = 1e-4
FIT_GAIN = 0.1


def is_keras_model(obj: Any) -> bool:
    return type(obj).__module__.startswith("keras") and hasattr(obj, "layers") and callable(obj)


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


def flatten(value: Any, path: str = "") -> dict[str, np.ndarray]:
    """``{path: array}`` with the same paths as compare.py: "", "['a']", "[1]", "['a'][0]"."""
    if type(value).__name__ == "_PathTree":  # already flat (see diagnose._few_rows)
        return dict(value)
    if isinstance(value, Mapping):
        out: dict[str, np.ndarray] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{path}[{k!r}]"))
        return out
    if isinstance(value, (list, tuple)) and not _is_number_list(value):
        out = {}
        for i, v in enumerate(value):
            out.update(flatten(v, f"{path}[{i}]"))
        return out
    return {path: np.asarray(value)}


def _is_number_list(value: Any) -> bool:
    return len(value) > 0 and all(isinstance(v, (int, float, np.number)) for v in value)


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
    if isinstance(batch, (list, tuple)) and batch and hasattr(batch[0], "shape"):
        return np.asarray(batch[0]) if len(batch) == 1 else None
    return np.asarray(batch)


def rebatch(batch: Any, array: np.ndarray) -> Any:
    """``batch`` with its single input replaced by ``array`` (same container)."""
    if isinstance(batch, Mapping):
        return {next(iter(batch)): array}
    if isinstance(batch, (list, tuple)) and batch and hasattr(batch[0], "shape"):
        return [array]
    return array


def rows(batch: Any, sl: slice) -> Any:
    """A slice of the batch rows of every input."""
    if isinstance(batch, Mapping):
        return {k: np.asarray(v)[sl] for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and batch and hasattr(batch[0], "shape"):
        return [np.asarray(v)[sl] for v in batch]
    return np.asarray(batch)[sl]


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


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    d = d[np.isfinite(d)]
    return float(d.max()) if d.size else 0.0


def scale_of(x: np.ndarray) -> float:
    x = np.abs(np.asarray(x, np.float64))
    x = x[np.isfinite(x)]
    return float(x.max()) if x.size else 0.0


def within(tolerance: Any, actual: np.ndarray, expected: np.ndarray) -> bool:
    """Does ``actual`` pass against ``expected`` under a tolerances.Tolerance (elementwise part)?"""
    if tolerance is None:
        return False
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    if a.shape != e.shape:
        return False
    bound = tolerance.atol + tolerance.rtol * np.abs(e) + getattr(tolerance, "scale", 0.0) * scale_of(e)
    ok = np.abs(a - e) <= bound
    ok |= (a == e)
    frac = float(getattr(tolerance, "max_mismatch_fraction", 0.0) or 0.0)
    return bool(np.mean(~ok) <= frac) if a.size else True


def fits(actual: np.ndarray, candidate: np.ndarray, original_error: float, tolerance: Any = None) -> tuple[bool, float]:
    """Is ``actual`` explained by ``candidate`` (a transform of the expected output)?

    Returns (fits, residual max abs). Fits when the residual is tiny relative to the output
    (or within ``tolerance``) AND removes most of the original error.
    """
    if np.shape(actual) != np.shape(candidate):
        return False, float("inf")
    cand = np.asarray(candidate, np.float64)
    if not np.all(np.isfinite(cand)):
        return False, float("inf")
    resid = max_abs_diff(actual, cand)
    small = resid <= FIT_REL * max(scale_of(cand), scale_of(actual), 1e-30) or within(tolerance, actual, cand)
    gain = resid <= FIT_GAIN * original_error
    return bool(small and gain and original_error > 0), resid


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"
