"""Is the actual output a simple transform of the expected one (seed 003: softmax applied
twice)? (The candidate on a transformed input: see inputs.py.)"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ._util import all_finite, fits, max_abs_diff, sample_pair

Array = np.ndarray


def _softmax(x: Array) -> Array:
    z = x - np.max(x, axis=-1, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=-1, keepdims=True)


def _sigmoid(x: Array) -> Array:
    return 1.0 / (1.0 + np.exp(-x))


def _is_prob_rows(x: Array) -> bool:
    return x.ndim >= 1 and x.shape[-1] > 1 and bool(np.all(x >= -1e-6)) and bool(
        np.allclose(x.sum(axis=-1), 1.0, atol=1e-4))


_KNOWN_SCALES = {255.0: "255", 1 / 255: "1/255", 256.0: "256", 1 / 256: "1/256", 100.0: "100", 1 / 100: "1/100",
                 255 / 256: "255/256", 256 / 255: "256/255", 2.0: "2", 0.5: "1/2", 127.5: "127.5", 1 / 127.5: "1/127.5"}


def _named_scale(c: float) -> str | None:
    for value, name in _KNOWN_SCALES.items():
        if abs(c - value) <= 1e-4 * value:
            return name
    return None


# The distance matrix of a permutation search holds rows² x columns floats: past this many
# the search runs on a subset of the columns (the permutation found is confirmed on all).
_PERM_CELLS = 1 << 24


def _permutation(a: Array, e: Array, axis: int) -> list[int] | None:
    """perm with a.take(i, axis) == e.take(perm[i], axis) (approximately), not the identity."""
    a2 = np.moveaxis(a, axis, 0).reshape(a.shape[axis], -1)
    e2 = np.moveaxis(e, axis, 0).reshape(e.shape[axis], -1)
    if a2.shape[0] < 2 or a2.shape[1] < 1:
        return None
    cols = max(1, _PERM_CELLS // (a2.shape[0] * a2.shape[0]))
    if a2.shape[0] * a2.shape[0] > _PERM_CELLS:
        return None  # too many rows to pair up
    if a2.shape[1] > cols:
        keep = np.linspace(0, a2.shape[1] - 1, cols).astype(np.int64)
        a2, e2 = a2[:, keep], e2[:, keep]
    dist = np.max(np.abs(a2[:, None, :] - e2[None, :, :]), axis=-1)
    perm = [int(j) for j in np.argmin(dist, axis=1)]
    if sorted(perm) != list(range(len(perm))) or perm == list(range(len(perm))):
        return None
    return perm


# A try: (cause, message, make(a, e) -> target for a, or (lhs, target), label).
_Try = tuple[str, str, Callable[[Array, Array], Any], str]


def _tries(a: Array, e: Array) -> list[_Try]:
    probs_e = _is_prob_rows(e)
    tries: list[_Try] = []
    if a.ndim >= 1 and a.shape[-1] > 1:
        if probs_e:
            tries.append(("double_softmax", "actual ≈ softmax(expected): softmax is applied twice",
                          lambda a, e: _softmax(e), "softmax(expected)"))
        else:
            tries.append(("extra_softmax", "actual ≈ softmax(expected): the candidate applies a softmax the "
                          "reference does not (it returns probabilities, the reference logits)",
                          lambda a, e: _softmax(e), "softmax(expected)"))
        if probs_e:
            tries.append(("missing_softmax", "softmax(actual) ≈ expected: the candidate returns logits where the "
                          "reference returns probabilities (or the reference applies softmax twice)",
                          lambda a, e: (_softmax(a), e), "softmax(actual) vs expected"))
    if np.all(e > 0):
        tries.append(("log_applied", "actual ≈ log(expected): the candidate returns log-probabilities",
                      lambda a, e: np.log(e), "log(expected)"))
    tries.append(("exp_applied", "actual ≈ exp(expected): the candidate exponentiates the output",
                  lambda a, e: np.exp(np.clip(e, -700, 700)), "exp(expected)"))
    tries.append(("sigmoid_applied", "actual ≈ sigmoid(expected): the candidate applies a sigmoid the reference does not",
                  lambda a, e: _sigmoid(e), "sigmoid(expected)"))
    tries.append(("missing_sigmoid", "sigmoid(actual) ≈ expected: the candidate returns logits where the reference applies a sigmoid",
                  lambda a, e: (_sigmoid(a), e), "sigmoid(actual) vs expected"))
    return tries


def _fit_try(t: _Try, a: Array, e: Array, err: float, tolerance: Any) -> tuple[bool, float]:
    with np.errstate(all="ignore"):
        target = t[2](a, e)
    lhs, target = target if isinstance(target, tuple) else (a, target)
    return fits(lhs, target, err, tolerance)


def _try_evidence(t: _Try, resid: float, err: float) -> tuple[str, str, str]:
    cause, message, _, label = t
    shown = label if " vs " in label else f"actual - {label}"
    return cause, message, f"max |{shown}| = {resid:.3g}, against max |actual - expected| = {err:.3g}"


def _least_squares_factor(a: Array, e: Array) -> float | None:
    denom = float(np.sum(e * e))
    return float(np.sum(a * e) / denom) if denom > 0 else None


def output_transform(actual: Array, expected: Array, tolerance: Any = None) -> tuple[str, str, str] | None:
    """(cause, message, evidence) for the transform of ``expected`` that best explains ``actual``.

    Every hypothesis is tried on a bounded sample of both arrays (``sample_pair``: whole rows,
    and the element of the largest error); only the one that fits there is computed on the
    full arrays, and it is claimed only if it fits there too (its evidence is measured there).
    """
    if np.asarray(actual).dtype.kind != "f" or np.asarray(expected).dtype.kind != "f":
        return None
    full_a, full_e = np.asarray(actual), np.asarray(expected)
    if full_a.shape != full_e.shape or full_a.size < 2 or not all_finite(full_e):
        return None
    sa, se = sample_pair(full_a, full_e)
    a, e = sa.astype(np.float64), se.astype(np.float64)
    sampled = sa is not full_a
    # A constant expected output fits too many transforms to be evidence of any.
    if np.ptp(e) == 0 and (not sampled or np.ptp(full_e) == 0):
        return None
    err = max_abs_diff(full_a, full_e)
    if err == 0:
        return None
    full64 = (lambda: (full_a.astype(np.float64), full_e.astype(np.float64))) if sampled else (lambda: (a, e))

    best: tuple[float, _Try] | None = None
    for t in _tries(a, e):
        ok, resid = _fit_try(t, a, e, err, tolerance)
        if ok and (best is None or resid < best[0]):
            best = (resid, t)
    if best is not None:
        resid, t = best
        if sampled:  # confirm the claim on every element
            fa, fe = full64()
            same = next((x for x in _tries(fa, fe) if x[0] == t[0]), None)  # its premise holds on all?
            if same is None:
                return None
            ok, resid = _fit_try(same, fa, fe, err, tolerance)
            if not ok:
                return None
            t = same
        return _try_evidence(t, resid, err)
    # A constant factor: least squares fit a ≈ c·e.
    c = _least_squares_factor(a, e)
    if c is not None:
        ok, resid = fits(a, c * e, err, tolerance)
        if ok and abs(c - 1) > 1e-5 and sampled:
            fa, fe = full64()
            c = _least_squares_factor(fa, fe) or c
            ok, resid = fits(fa, c * fe, err, tolerance)
        if ok and abs(c - 1) > 1e-5:
            name = _named_scale(c)
            label = name or f"{c:.6g}"
            return ("output_scaled", f"actual ≈ {label} × expected: the output is scaled by a constant"
                    + (" (pixel scaling applied to the output?)" if name else ""),
                    f"best factor {c:.6g}; max |actual - {c:.6g}·expected| = {resid:.3g}, against {err:.3g} unscaled")
    for axis, what in ((a.ndim - 1, "classes"), (0, "batch rows")):
        if what == "batch rows" and sampled:
            a_ax, e_ax = full_a, full_e  # rows of the full output (the sample has other rows)
        else:
            a_ax, e_ax = a, e
        if a_ax.ndim >= 2 or (a_ax.ndim == 1 and what == "batch rows"):
            ax = a_ax.ndim - 1 if what == "classes" else 0
            perm = _permutation(a_ax, e_ax, ax)
            if perm is not None:
                ok, resid = fits(a_ax, np.take(e_ax, perm, axis=ax), err, tolerance)
                if ok and sampled and a_ax is a:
                    fa, fe = full64()
                    ok, resid = fits(fa, np.take(fe, perm, axis=fa.ndim - 1), err, tolerance)
                if ok:
                    perm_shown = perm if len(perm) <= 12 else [*perm[:12], "…"]
                    return (f"{'class' if what == 'classes' else 'row'}_permutation",
                            f"actual ≈ expected with its {what} permuted: {what} are in a different order",
                            f"actual[{'..., ' if what == 'classes' else ''}i] ≈ expected[{'..., ' if what == 'classes' else ''}perm[i]] "
                            f"with perm = {perm_shown}; residual {resid:.3g}, against {err:.3g}")
    return None
