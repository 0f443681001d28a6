"""Is a difference just float accumulation noise (seed 004: 729027.5625 vs 729026.4375)?

Two kinds of evidence: the difference, in ULPs of the output's largest value, is within a
few ULPs times the longest reduction the model performs; or it is within the gap that batch
size alone produces on the reference."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._util import batch_size, flatten, max_abs_diff, pick, rows, run_model, scale_of

ULPS_PER_TERM = 2      # reordering a sum of n float terms moves it by up to ~n ULP of its scale
PLAIN_ROUNDING_ULPS = 8  # without a known reduction length: a few roundings only
MAX_NOISE_REL = 1e-4   # never call anything above this share of the output's scale noise
BATCH_GAP_FACTOR = 10  # other forms' float noise measured here was within ~5x the batch drift


def _float_dtype(*arrays: np.ndarray) -> np.dtype | None:
    kinds = [np.asarray(a).dtype for a in arrays if np.asarray(a).dtype.kind == "f"]
    if not kinds:
        return None
    return min(kinds, key=lambda d: d.itemsize)


def reduction_length(weights: dict[str, np.ndarray] | None) -> int | None:
    """Longest reduction the model implies: the largest fan-in of its kernels."""
    if not weights:
        return None
    fans = [int(np.prod(w.shape[:-1])) for w in weights.values() if np.ndim(w) >= 2]
    return max(fans) if fans else None


def ulps_at_scale(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float, np.dtype] | None:
    """(max |diff| in ULPs of max |expected|, max |diff|, dtype) for float outputs."""
    dt = _float_dtype(actual, expected)
    if dt is None or np.shape(actual) != np.shape(expected):
        return None
    scale = scale_of(expected)
    if scale == 0:
        return None
    ulp = float(np.spacing(dt.type(scale)))
    diff = max_abs_diff(actual, expected)
    return diff / ulp, diff, dt


def accumulation_noise(actual: np.ndarray, expected: np.ndarray, n_terms: int | None) -> tuple[str, str, str] | None:
    """(cause, message, evidence) when the difference is the size of reordering noise."""
    got = ulps_at_scale(actual, expected)
    if got is None:
        return None
    ulps, diff, dt = got
    if diff == 0:
        return None
    scale = scale_of(expected)
    if diff > MAX_NOISE_REL * scale:
        return None
    if n_terms:
        bound = ULPS_PER_TERM * n_terms
        if ulps <= bound:
            return ("accumulation_noise",
                    f"differences up to {ulps:.0f} ULP of the output's largest value, the size {dt.name} reductions "
                    f"of {n_terms} terms reorder (batch size, kernel blocking, fused ops); not a conversion error",
                    f"max |diff| {diff:.3g} = {ulps:.1f} ULP of the largest output {scale:.6g}; reordering "
                    f"a {n_terms}-term {dt.name} sum can move it by ~{bound} ULP")
        return None
    if ulps <= PLAIN_ROUNDING_ULPS:
        return ("accumulation_noise",
                f"differences up to {ulps:.0f} ULP of the output's scale: float rounding noise, not a conversion error",
                f"max |diff| {diff:.3g} = {ulps:.1f} ULP of the largest output {scale:.6g} ({dt.name})")
    return None


def batch_gap(reference: Any, inputs: Any, max_rows: int = 16) -> dict[str, tuple[float, float]] | None:
    """{path: (max |batched - one at a time|, scale)} of the reference on ``inputs``."""
    n = batch_size(inputs)
    if not n or n < 2:
        return None
    n = min(n, max_rows)
    batch = rows(inputs, slice(0, n))
    whole = flatten(run_model(reference, batch))
    singles = [flatten(run_model(reference, rows(batch, slice(i, i + 1)))) for i in range(n)]
    out = {}
    for path, arr in whole.items():
        parts = [s[path] for s in singles if path in s]
        if len(parts) < len(singles):
            return None
        out[path] = (max_abs_diff(arr, np.concatenate(parts, axis=0)), scale_of(arr))
    return out


def within_batch_gap(actual: np.ndarray, expected: np.ndarray, gap: float) -> tuple[str, str, str] | None:
    diff = max_abs_diff(actual, expected)
    scale = scale_of(expected)
    if diff == 0 or gap <= 0 or diff > BATCH_GAP_FACTOR * gap or diff > MAX_NOISE_REL * scale:
        return None
    return ("accumulation_noise",
            "the difference is the size of the reference's own batch-size drift: float accumulation order, "
            "not a conversion error",
            f"max |diff| {diff:.3g}; the reference alone moves by {gap:.3g} between a batch and one row at a time")


def noise_hint(path: str, actual: np.ndarray, expected: np.ndarray, *, n_terms: int | None,
               reference: Any = None, inputs: Any = None) -> tuple[str, str, str] | None:
    hint = accumulation_noise(actual, expected, n_terms)
    if hint is not None or reference is None or inputs is None:
        return hint
    diff = max_abs_diff(actual, expected)
    if diff == 0 or diff > MAX_NOISE_REL * scale_of(expected):
        return None
    gaps = batch_gap(reference, inputs)
    if not gaps:
        return None
    flat = {p: g for p, (g, _) in gaps.items()}
    gap = pick({p: np.asarray(g) for p, g in flat.items()}, path)
    return None if gap is None else within_batch_gap(actual, expected, float(gap))
