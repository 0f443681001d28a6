"""Is the actual output a simple transform of the expected one (seed 003: softmax applied
twice), or the candidate's output the reference's on a transformed input (/256 instead of
/255, BGR instead of RGB, NCHW instead of NHWC)?"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from ._util import fits, flatten, pick, run_model

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


def _permutation(a: Array, e: Array, axis: int) -> list[int] | None:
    """perm with a.take(i, axis) == e.take(perm[i], axis) (approximately), not the identity."""
    a2 = np.moveaxis(a, axis, 0).reshape(a.shape[axis], -1)
    e2 = np.moveaxis(e, axis, 0).reshape(e.shape[axis], -1)
    if a2.shape[0] < 2 or a2.shape[1] < 1:
        return None
    dist = np.max(np.abs(a2[:, None, :] - e2[None, :, :]), axis=-1)
    perm = [int(j) for j in np.argmin(dist, axis=1)]
    if sorted(perm) != list(range(len(perm))) or perm == list(range(len(perm))):
        return None
    return perm


def output_transform(actual: Array, expected: Array, tolerance: Any = None) -> tuple[str, str, str] | None:
    """(cause, message, evidence) for the transform of ``expected`` that best explains ``actual``."""
    if np.asarray(actual).dtype.kind != "f" or np.asarray(expected).dtype.kind != "f":
        return None
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    # A constant expected output fits too many transforms to be evidence of any.
    if a.shape != e.shape or a.size < 2 or not np.all(np.isfinite(e)) or np.ptp(e) == 0:
        return None
    err = float(np.max(np.abs(a - e)))
    if err == 0:
        return None
    probs_e = _is_prob_rows(e)
    # each try makes the target for actual, or (lhs, target) when it transforms actual too
    tries: list[tuple[str, str, Callable[[], Array | tuple[Array, Array]], str]] = []
    if a.ndim >= 1 and a.shape[-1] > 1:
        if probs_e:
            tries.append(("double_softmax", "actual ≈ softmax(expected): softmax is applied twice",
                          lambda: _softmax(e), "softmax(expected)"))
        else:
            tries.append(("extra_softmax", "actual ≈ softmax(expected): the candidate applies a softmax the "
                          "reference does not (it returns probabilities, the reference logits)",
                          lambda: _softmax(e), "softmax(expected)"))
        if probs_e:
            tries.append(("missing_softmax", "softmax(actual) ≈ expected: the candidate returns logits where the "
                          "reference returns probabilities (or the reference applies softmax twice)",
                          lambda: (_softmax(a), e), "softmax(actual) vs expected"))
    if np.all(e > 0):
        tries.append(("log_applied", "actual ≈ log(expected): the candidate returns log-probabilities",
                      lambda: np.log(e), "log(expected)"))
    tries.append(("exp_applied", "actual ≈ exp(expected): the candidate exponentiates the output",
                  lambda: np.exp(np.clip(e, -700, 700)), "exp(expected)"))
    tries.append(("sigmoid_applied", "actual ≈ sigmoid(expected): the candidate applies a sigmoid the reference does not",
                  lambda: _sigmoid(e), "sigmoid(expected)"))
    tries.append(("missing_sigmoid", "sigmoid(actual) ≈ expected: the candidate returns logits where the reference applies a sigmoid",
                  lambda: (_sigmoid(a), e), "sigmoid(actual) vs expected"))

    best: tuple[float, tuple[str, str, str]] | None = None
    for cause, message, make, label in tries:
        with np.errstate(all="ignore"):
            target = make()
        lhs, target = target if isinstance(target, tuple) else (a, target)
        ok, resid = fits(lhs, target, err, tolerance)
        if ok and (best is None or resid < best[0]):
            shown = label if " vs " in label else f"actual - {label}"
            best = (resid, (cause, message, f"max |{shown}| = {resid:.3g}, "
                                            f"against max |actual - expected| = {err:.3g}"))
    if best is not None:
        return best[1]
    # A constant factor: least squares fit a ≈ c·e.
    denom = float(np.sum(e * e))
    if denom > 0:
        c = float(np.sum(a * e) / denom)
        ok, resid = fits(a, c * e, err, tolerance)
        if ok and abs(c - 1) > 1e-5:
            name = _named_scale(c)
            label = name or f"{c:.6g}"
            return ("output_scaled", f"actual ≈ {label} × expected: the output is scaled by a constant"
                    + (" (pixel scaling applied to the output?)" if name else ""),
                    f"best factor {c:.6g}; max |actual - {c:.6g}·expected| = {resid:.3g}, against {err:.3g} unscaled")
    for axis, what in ((a.ndim - 1, "classes"), (0, "batch rows")):
        if a.ndim >= 2 or (a.ndim == 1 and what == "batch rows"):
            perm = _permutation(a, e, axis)
            if perm is not None:
                ok, resid = fits(a, np.take(e, perm, axis=axis), err, tolerance)
                if ok:
                    perm_shown = perm if len(perm) <= 12 else [*perm[:12], "…"]
                    return (f"{'class' if what == 'classes' else 'row'}_permutation",
                            f"actual ≈ expected with its {what} permuted: {what} are in a different order",
                            f"actual[{'..., ' if what == 'classes' else ''}i] ≈ expected[{'..., ' if what == 'classes' else ''}perm[i]] "
                            f"with perm = {perm_shown}; residual {resid:.3g}, against {err:.3g}")
    return None


# -- input transforms --------------------------------------------------------------------

def _input_transforms(x: Array) -> list[tuple[str, str, Callable[[Array], Array]]]:
    """(cause, description, T) candidates for candidate(x) ≈ reference(T(x))."""
    out: list[tuple[str, str, Callable[[Array], Array]]] = []
    if x.ndim == 4 and x.shape[-1] == 3:
        out.append(("input_channel_order", "channels reversed (RGB <-> BGR)", lambda v: v[..., ::-1]))
    elif x.ndim == 4 and x.shape[1] == 3:
        out.append(("input_channel_order", "channels reversed (RGB <-> BGR, NCHW)", lambda v: v[:, ::-1]))
    if x.dtype.kind == "f" or x.dtype.kind in "iu":
        for label, fn in (
            ("scaled by 255/256 (the candidate divides by 256 where the reference divides by 255)", lambda v: v * (255 / 256)),
            ("scaled by 256/255 (the candidate divides by 255 where the reference divides by 256)", lambda v: v * (256 / 255)),
            ("mapped to [-1, 1] (x*2 - 1) where the reference expects [0, 1]", lambda v: v * 2 - 1),
            ("mapped to [0, 1] ((x + 1)/2) where the reference expects [-1, 1]", lambda v: (v + 1) / 2),
            ("divided by 255 (the candidate scales pixels the reference takes raw)", lambda v: v / 255),
            ("multiplied by 255 (the reference scales pixels the candidate takes raw)", lambda v: v * 255),
            ("divided by 127.5 and shifted by -1 (raw pixels mapped to [-1, 1])", lambda v: v / 127.5 - 1),
        ):
            out.append(("input_scaling", label, fn))
    if x.ndim == 4:
        out.append(("input_layout", "transposed NHWC -> NCHW", lambda v: np.transpose(v, (0, 3, 1, 2))))
        out.append(("input_layout", "transposed NCHW -> NHWC", lambda v: np.transpose(v, (0, 2, 3, 1))))
    return out


def _named_inputs(batch: Any) -> list[tuple[Any, Array]]:
    """(key, array) of every input: dict key, list index, or None for a bare array."""
    if isinstance(batch, Mapping):
        return [(k, np.asarray(v)) for k, v in batch.items()]
    if isinstance(batch, (list, tuple)) and batch and hasattr(batch[0], "shape"):
        return [(i, np.asarray(v)) for i, v in enumerate(batch)]
    return [(None, np.asarray(batch))]


def _replace(batch: Any, key: Any, array: Array) -> Any:
    """``batch`` with the input at ``key`` replaced (same container, other inputs as given)."""
    if key is None:
        return array
    if isinstance(batch, Mapping):
        return {k: (array if k == key else v) for k, v in batch.items()}
    return [array if i == key else v for i, v in enumerate(batch)]


def _is_image(x: Array) -> bool:
    """Rank 4 with 1 or 3 channels, last (NHWC) or second (NCHW)."""
    return x.ndim == 4 and (x.shape[-1] in (1, 3) or x.shape[1] in (1, 3))


def _candidate_inputs(batch: Any) -> list[tuple[Any, Array]]:
    """The inputs to transform: the only one (rank >= 2), or each image-like input of many."""
    named = _named_inputs(batch)
    if len(named) == 1:
        return named if named[0][1].ndim >= 2 else []
    return [(k, x) for k, x in named if _is_image(x)]


def input_transform(reference: Any, inputs: Any, actual: Any, paths: list[str],
                    tolerances: dict[str, Any] | None = None) -> tuple[str, str, str] | None:
    """Test candidate(x) ≈ reference(T(x)) on the failing outputs; (cause, message, evidence).

    With several inputs, each image-like one (rank 4, 1 or 3 channels) is transformed in
    turn while the others are passed as they are.
    """
    targets = _candidate_inputs(inputs)
    if not targets:
        return None
    flat_actual = flatten(actual)
    base = flatten(run_model(reference, inputs))
    errors = {}
    for p in paths:
        a, e = pick(flat_actual, p), pick(base, p)
        if a is None or e is None or np.shape(a) != np.shape(e):
            return None
        errors[p] = float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(e, np.float64))))
    many = len(_named_inputs(inputs)) > 1
    best = None
    for key, x in targets:
        for cause, label, fn in _input_transforms(x):
            tx = np.ascontiguousarray(fn(x.astype(np.float64)).astype(x.dtype if x.dtype.kind == "f" else np.float32))
            try:
                got = flatten(run_model(reference, _replace(inputs, key, tx)))
            except Exception:  # noqa: BLE001 - a shape the reference refuses: not this transform
                continue
            worst = 0.0
            ok_all = True
            for p in paths:
                a, r = pick(flat_actual, p), pick(got, p)
                if a is None or r is None:
                    ok_all = False
                    break
                ok, resid = fits(a, r, errors[p], (tolerances or {}).get(p))
                ok_all &= ok
                worst = max(worst, resid)
            if ok_all and (best is None or worst < best[0]):
                which = f"input {key!r}" if many else "input"
                best = (worst, cause, label, which)
    if best is None:
        return None
    worst, cause, label, which = best
    err = max(errors.values())
    others = " (the other inputs unchanged)" if many else ""
    return (cause, f"candidate(x) ≈ reference(T(x)) with the {which} {label}{others}: the two forms preprocess "
            "the input differently",
            f"max |candidate(x) - reference(T(x))| = {worst:.3g}, against {err:.3g} for reference(x)")
