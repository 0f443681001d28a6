"""Is the actual output a simple transform of the expected one (seed 003: softmax applied
twice), or the candidate's output the reference's on a transformed input (/256 instead of
/255, BGR instead of RGB, NCHW instead of NHWC)?"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from ._util import all_finite, fits, flatten, max_abs_diff, pick, run_model, sample_pair

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


def _is_tokens(x: Array) -> bool:
    """Integer ids over a sequence (rank 2, at least 2 steps) that are not a 0/1 mask."""
    return x.dtype.kind in "iu" and x.ndim == 2 and x.shape[1] >= 2 and x.size > 0 and int(x.max()) > 1


def _candidate_inputs(batch: Any) -> list[tuple[Any, Array]]:
    """The inputs to transform: the only one (rank >= 2), or each image-like or token-id input of many."""
    named = _named_inputs(batch)
    if len(named) == 1:
        return named if named[0][1].ndim >= 2 else []
    return [(k, x) for k, x in named if _is_image(x) or _is_tokens(x)]


def _reorder_steps(batch: Any, x: Array, order: Array) -> Any:
    """``batch`` with every input shaped like ``x`` over (rows, steps) (the ids, their mask)
    reordered along the steps by ``order`` (rows x steps indices)."""
    def move(v: Array) -> Array:
        if v.ndim >= 2 and v.shape[:2] == x.shape[:2]:
            idx = order.reshape(order.shape + (1,) * (v.ndim - 2))
            return np.take_along_axis(v, np.broadcast_to(idx, v.shape), axis=1)
        return v
    named = _named_inputs(batch)
    if len(named) == 1 and named[0][0] is None:
        return move(named[0][1])
    if isinstance(batch, Mapping):
        return {k: move(np.asarray(v)) for k, v in batch.items()}
    return [move(np.asarray(v)) for v in batch]


def _reordered(batch: Any, x: Array, order: Array) -> Callable[[], Any]:
    return lambda: _reorder_steps(batch, x, order)


def _transformed(batch: Any, key: Any, x: Array, fn: Callable[[Array], Array]) -> Callable[[], Any]:
    dtype = x.dtype if x.dtype.kind == "f" else np.float32
    return lambda: _replace(batch, key, np.ascontiguousarray(fn(x.astype(np.float64)).astype(dtype)))


def _token_batches(batch: Any, key: Any, x: Array) -> list[tuple[str, str, Callable[[], Any]]]:
    """(cause, description, make batch) for candidate(x) ≈ reference(T(x)) on integer token
    ids: a +-1 shift, a vocabulary off by one (padding id 0 kept), the sequence reversed,
    padding moved to the other side (every input over the same steps, a mask too, moves with it)."""
    if not _is_tokens(x):
        return []
    def value(v: Array) -> Callable[[], Any]:
        return lambda: _replace(batch, key, v.astype(x.dtype))

    out = [("token_id_shift", "token ids + 1 (the candidate reads id i as the reference reads i + 1)", value(x + 1)),
           ("token_id_shift", "token ids - 1 (the candidate reads id i as the reference reads i - 1)", value(x - 1))]
    pad = x == 0
    if pad.any() and (~pad).any():
        out += [("vocabulary_off_by_one", "token ids + 1 except padding 0 (a vocabulary off by one: an id "
                 "reserved or dropped at its start)", value(np.where(pad, 0, x + 1))),
                ("vocabulary_off_by_one", "token ids - 1 except padding 0 (a vocabulary off by one: an id "
                 "reserved or dropped at its start)", value(np.where(pad, 0, x - 1)))]
    steps = np.broadcast_to(np.arange(x.shape[1]), x.shape)
    out.append(("sequence_reversed", "sequence reversed (the steps in the other order)",
                _reordered(batch, x, np.ascontiguousarray(steps[:, ::-1]))))
    if pad.any() and (~pad).any():
        left = np.argsort(~pad, axis=1, kind="stable")   # padding first: padded on the left
        right = np.argsort(pad, axis=1, kind="stable")   # tokens first: padded on the right
        for order, side in ((left, "left"), (right, "right")):
            if not np.array_equal(np.take_along_axis(x, order, axis=1), x):
                out.append(("padding_side", f"padding moved to the {side} (the two forms pad sequences on "
                            "different sides)", _reordered(batch, x, order)))
    return out


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
    def tries(key: Any, x: Array) -> list[tuple[str, str, Callable[[], Any]]]:
        found = _token_batches(inputs, key, x)
        for cause, label, fn in ([] if found else _input_transforms(x)):
            found.append((cause, label, _transformed(inputs, key, x, fn)))
        return found

    for key, x in targets:
        for cause, label, make in tries(key, x):
            try:
                got = flatten(run_model(reference, make()))
            except Exception:  # noqa: BLE001 - a shape or id the reference refuses: not this transform
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
