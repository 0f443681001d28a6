"""A weight changed in a converted file (TFLite, ONNX), named against a graph reference.

A converter stores most kernels as they are, only laid out its own way (TFLite's OHWI,
ONNX's OIHW, a dense kernel transposed), so each reference kernel is looked for among the
candidate's constants in every layout: found bit for bit, it agrees. A kernel found nowhere
exactly but close to a constant of its layout's shape is a suspect; converters also fold
batch-norm and constant multiplies into kernels, so a suspect is never named on likeness
alone: the reference is run once with the candidate's constant in the kernel's place
(``LoadedModel.predict_with_weights``), and the kernel is named only when that run
reproduces the candidate's failing outputs (a folded kernel, run again through the
batch-norm the reference still applies, does not).

No TensorFlow here: the reference's weights and its substituted run are the model's hooks,
the candidate's constants its ``weights()`` hook. Why it exists: a late convolution's kernel
x1.01 in a trained audio model's TFLite/ONNX file, against its SavedModel (a graph
reference, loaded by the v1 loader), had no hint (its layer table, which pairs a converted
graph's tensors by name, paired `conv2d_3` with `conv2d_5`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ._util import fits, flatten, hook, max_abs_diff, pick, within

# A kernel this small is not looked for (a bias, a scale: too easily equal by chance).
MIN_SIZE = 16
# A constant is a suspect when max |constant - kernel| is at most this share of the kernel's
# largest value (a 1% change is 0.01; an unrelated tensor of the same shape is ~1 or more).
NEAR = 0.25
# At most this many suspects are confirmed by a run of the reference (closest first; a kernel
# folded with near-identity batch-norm statistics is a suspect too, ahead of a 1% change).
MAX_CONFIRM = 5


Layout = tuple[str, np.ndarray, Callable[[np.ndarray], np.ndarray]]


def layouts(kernel: np.ndarray) -> Iterator[Layout]:
    """(name, the kernel in a converter's layout, the inverse back to the reference's layout)."""
    k = np.asarray(kernel)
    yield "as is", k, lambda a: a
    if k.ndim == 2:
        yield "transposed", k.T, lambda a: a.T                                    # TFLite FullyConnected
    if k.ndim == 3:                                                               # Conv1D (W, I, O)
        yield "OIW", k.transpose(2, 1, 0), lambda a: a.transpose(2, 1, 0)
        yield "O1WI", k.transpose(2, 0, 1)[:, None], lambda a: a[:, 0].transpose(1, 2, 0)
    if k.ndim == 4:                                                               # Conv2D (H, W, I, O)
        h, w, i, o = k.shape
        yield "OHWI", k.transpose(3, 0, 1, 2), lambda a: a.transpose(1, 2, 3, 0)
        yield "OIHW", k.transpose(3, 2, 0, 1), lambda a: a.transpose(2, 3, 1, 0)
        yield "IOHW", k.transpose(2, 3, 0, 1), lambda a: a.transpose(2, 3, 0, 1)  # conv-transpose, ONNX depthwise
        yield "depthwise (I*M, 1, H, W)", k.transpose(2, 3, 0, 1).reshape(i * o, 1, h, w), \
            lambda a: a.reshape(i, o, h, w).transpose(2, 3, 0, 1)
        yield "depthwise (1, H, W, I*M)", k.reshape(1, h, w, i * o), lambda a: a.reshape(h, w, i, o)


def _floats(weights: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    return {str(k): np.asarray(v) for k, v in (weights or {}).items()
            if np.asarray(v).dtype == np.float32 and np.asarray(v).size >= MIN_SIZE}


def suspects(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> tuple[list[tuple], int, int]:
    """([(distance, reference name, candidate name, layout name, candidate value in the reference's
    layout)] for each reference kernel found nowhere exactly but near a candidate constant,
    closest first; how many kernels were found bit for bit; how many were looked for)."""
    ref, cand = _floats(reference), _floats(candidate)
    exact = {(v.shape, v.tobytes()) for v in cand.values()}
    by_shape: dict[tuple, list[str]] = {}
    for name, value in cand.items():
        by_shape.setdefault(value.shape, []).append(name)
    found = []
    n_exact = n_kernels = 0
    for rname, r in ref.items():
        if r.ndim < 2:
            continue
        n_kernels += 1
        forms = list(layouts(r))
        if any((np.ascontiguousarray(a).shape, np.ascontiguousarray(a).tobytes()) in exact for _n, a, _inv in forms):
            n_exact += 1
            continue
        scale = float(np.max(np.abs(r))) or 1.0
        best = None
        for lname, a, inverse in forms:
            for cname in by_shape.get(a.shape, []):
                d = float(np.max(np.abs(cand[cname].astype(np.float64) - a))) / scale
                if d <= NEAR and (best is None or d < best[0]):
                    best = (d, rname, cname, lname, inverse(cand[cname]))
        if best is not None:
            found.append(best)
    found.sort(key=lambda s: s[0])
    return found, n_exact, n_kernels


def describe_change(reference: np.ndarray, changed: np.ndarray) -> str:
    """``x1.01 (every element, ...)`` when the change is one factor, else its largest difference."""
    r, c = np.asarray(reference, np.float64).ravel(), np.asarray(changed, np.float64).ravel()
    scale = float(np.max(np.abs(r))) or 1.0
    denom = float(r @ r)
    if denom > 0:
        g = float(r @ c) / denom
        resid = float(np.max(np.abs(c - g * r)))
        if resid <= 1e-6 * max(float(np.max(np.abs(c))), 1e-30):
            return f"x{g:.6g} (every element; residual {resid / scale:.2g} of its largest value)"
    d = float(np.max(np.abs(c - r)))
    return f"max |diff| {d:.3g} ({d / scale:.1%} of its largest value)"


def converted_weight_change(reference: Any, candidate: Any, inputs: Any,
                            failing: Sequence[tuple[str, np.ndarray, np.ndarray, Any]],
                            allows: Callable[[], bool] = lambda: True) -> tuple[str, str, str] | None:
    """(cause, message, evidence) naming the reference kernel whose substitution by the
    candidate's constant reproduces the candidate's failing outputs; None otherwise.

    ``failing``: (output path, candidate's output, reference's output, tolerance) on ``inputs``;
    ``allows()`` is asked before each run of the reference (the failure's time budget)."""
    from .weights import weights_of

    if getattr(candidate, "format", None) not in ("tflite", "onnx") or not failing:
        return None
    if not callable(getattr(reference, "predict_with_weights", None)):
        return None
    ref_w = weights_of(reference)
    cand_w = hook(candidate, "weights")
    if not ref_w or not cand_w:
        return None
    tried = 0
    found, n_exact, n_kernels = suspects(ref_w, cand_w)
    for dist, rname, cname, lname, value in found:
        if tried >= MAX_CONFIRM or not allows():
            return None
        tried += 1
        out = hook(reference, "predict_with_weights", inputs, {rname: value})
        if out is None:
            continue
        flat = flatten(out)
        evid = []
        for path, a, e, tol in failing:
            got = pick(flat, path)
            if got is None:
                break
            err = max_abs_diff(a, e)
            ok, resid = fits(a, got, err, tol)
            # or within the comparison's own bound, which the forms' float noise fills (a
            # log-magnitude front-end's correct TFLite form drifts 2e-4 of a 5.7e-4 bound)
            if not (ok or (resid <= 0.5 * err and within(tol, a, got))):
                break
            evid.append(f"{path or 'output'}: max |candidate - reference with it| {resid:.3g} against {err:.3g}")
        else:
            change = describe_change(ref_w[rname], value)
            return ("weights_differ",
                    f"the two forms hold different weights: the candidate's `{cname}` is the reference's "
                    f"`{rname}` {change.split(' (')[0]}",
                    f"`{rname}` {tuple(np.shape(ref_w[rname]))} is in the candidate ({lname}) as `{cname}`, "
                    f"{change}; {n_exact} of the reference's {n_kernels} kernels are in it bit for bit; the reference run "
                    f"with the candidate's `{cname}` in its place reproduces the candidate's outputs ("
                    + "; ".join(evid) + ")")
    return None
