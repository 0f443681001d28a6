"""Is the candidate's output the reference's on a transformed input: a gain (/256 instead of
/255, int16 samples fed as floats), BGR instead of RGB, NCHW instead of NHWC, token or
categorical ids shifted? Each input is transformed alone, and the inputs that share a
vocabulary or a scale (every id input, every float input) together: one tokenizer feeds both
sides of an encoder-decoder, so a shift shows on both at once."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from ._util import batch_size, fits, flatten, pick, rows, run_model

Array = np.ndarray
Make = Callable[[], Any]
_Fn = Callable[[Array], Array]

# Per-channel statistics of the usual image normalisations (RGB order).
_IMAGENET_MEAN = np.array([0.485, 0.456, 0.406])
_IMAGENET_STD = np.array([0.229, 0.224, 0.225])


def _kind(x: Array) -> str:
    """What the input holds, for the wording: pixels, samples (a waveform) or features."""
    if _is_image(x):
        return "pixels"
    if x.dtype.kind == "f" and ((x.ndim == 2 and x.shape[1] >= 256) or (x.ndim == 3 and x.shape[-1] <= 2
                                                                          and x.shape[1] >= 256)):
        return "samples"
    return "features"


def _factor(label: str) -> float | None:
    """The factor of a pure gain named by ``label`` (``divided by 255``: 1/255), else None."""
    import re

    m = re.match(r"(scaled|multiplied|divided) by (\d+(?:\.\d+)?)(?:/(\d+))?(?: |$)", label)
    if m is None or "shifted" in label:
        return None
    value = float(m.group(2)) / (float(m.group(3)) if m.group(3) else 1.0)
    return 1.0 / value if m.group(1) == "divided" else value


def _gains(x: Array) -> list[tuple[str, _Fn]]:
    """The gain family (a constant factor or an affine map known from preprocessing code),
    worded for the input's kind; a factor that raises values is tried on inputs in about
    [-1, 1], one that lowers them on inputs with larger values."""
    kind = _kind(x)
    big = float(np.max(np.abs(x))) > 2.0 if x.size else False
    px = kind == "pixels"
    out: list[tuple[str, _Fn]] = [
        ("scaled by 255/256 (the candidate divides by 256 where the reference divides by 255)", lambda v: v * (255 / 256)),
        ("scaled by 256/255 (the candidate divides by 255 where the reference divides by 256)", lambda v: v * (256 / 255)),
    ]
    if not big:
        samples = kind == "samples"
        out += [
            ("multiplied by 32768 (int16 samples fed as floats where the reference expects [-1, 1])" if samples
             else "multiplied by 32768 (int16 values fed as floats where the reference expects [-1, 1])",
             lambda v: v * 32768.0),
            ("multiplied by 255 (the reference scales pixels the candidate takes raw)" if px
             else f"multiplied by 255 (the reference scales {kind} the candidate takes raw)", lambda v: v * 255.0),
            ("multiplied by 256", lambda v: v * 256.0),
            ("multiplied by 65535 (16-bit values fed where the reference expects [0, 1])", lambda v: v * 65535.0),
            ("mapped to [-1, 1] (x*2 - 1) where the reference expects [0, 1]", lambda v: v * 2 - 1),
            ("mapped to [0, 1] ((x + 1)/2) where the reference expects [-1, 1]", lambda v: (v + 1) / 2),
        ]
    else:
        out += [
            (f"divided by 255 (the candidate scales {kind} the reference takes raw)", lambda v: v / 255),
            ("divided by 256", lambda v: v / 256.0),
            ("divided by 32768 (the candidate scales int16 samples to [-1, 1], the reference takes them raw)",
             lambda v: v / 32768.0),
            ("divided by 65535 (the candidate scales 16-bit values the reference takes raw)", lambda v: v / 65535.0),
        ]
    # a pixel-range mismatch either way, whatever range the batch has: the candidate's own
    # rescaling where the reference has none, or none where the reference has one
    out += [("multiplied by 127.5 and shifted by 127.5 (the candidate takes [-1, 1] where the reference takes raw "
             f"0..255 {kind}: the reference's own rescaling is missing from the candidate)", lambda v: v * 127.5 + 127.5)]
    out += [("divided by 127.5 and shifted by -1 (raw pixels mapped to [-1, 1]: the candidate rescales them, the "
             "reference takes [-1, 1])" if px else f"divided by 127.5 and shifted by -1 (raw {kind} mapped to [-1, 1])",
             lambda v: v / 127.5 - 1)]
    # a latent or a feature scaled by 2 either way (a generator's normal latent reaches 3-4)
    out += [("multiplied by 2 (the candidate scales its latent or input by 2 where the reference does not)",
             lambda v: v * 2.0),
            ("divided by 2 (the candidate scales its latent or input by 0.5 where the reference does not)",
             lambda v: v / 2.0)]
    if px and x.ndim == 4 and x.shape[-1] == 3:
        out += [("normalised with the ImageNet mean/std ((x - mean)/std) the reference does not apply",
                 lambda v: (v - _IMAGENET_MEAN) / _IMAGENET_STD),
                ("with the ImageNet mean/std normalisation undone (x*std + mean): the reference normalises, "
                 "the candidate does not", lambda v: v * _IMAGENET_STD + _IMAGENET_MEAN)]
    return out


def _input_transforms(x: Array) -> list[tuple[str, str, _Fn]]:
    """(cause, description, T) candidates for candidate(x) ≈ reference(T(x))."""
    out: list[tuple[str, str, _Fn]] = []
    if x.ndim == 4 and x.shape[-1] == 3:
        out.append(("input_channel_order", "channels reversed (RGB <-> BGR)", lambda v: v[..., ::-1]))
    elif x.ndim == 4 and x.shape[1] == 3:
        out.append(("input_channel_order", "channels reversed (RGB <-> BGR, NCHW)", lambda v: v[:, ::-1]))
    if x.dtype.kind in "fiu":
        out += [("input_scaling", label, fn) for label, fn in _gains(x)]
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


def _replace_all(batch: Any, new: dict[Any, Array]) -> Any:
    """``batch`` with the inputs at ``new``'s keys replaced (same container, the others as given)."""
    if list(new) == [None]:
        return new[None]
    if isinstance(batch, Mapping):
        return {k: new.get(k, v) for k, v in batch.items()}
    return [new.get(i, v) for i, v in enumerate(batch)]


def _is_image(x: Array) -> bool:
    """Rank 4 with 1 or 3 channels, last (NHWC) or second (NCHW)."""
    return x.ndim == 4 and (x.shape[-1] in (1, 3) or x.shape[1] in (1, 3))


def _is_ids(x: Array) -> bool:
    """Integer ids (token sequences, or categorical ids of any rank: a user id of shape (B, 1))
    that are not a 0/1 mask."""
    return x.dtype.kind in "iu" and x.ndim >= 1 and x.size > 0 and int(x.max()) > 1


def _is_sequence(x: Array) -> bool:
    return x.ndim == 2 and x.shape[1] >= 2


def _candidate_inputs(batch: Any) -> list[tuple[Any, Array]]:
    """The inputs to transform: the only one (rank >= 2, or ids), or each image-like, id or
    float input of many."""
    named = _named_inputs(batch)
    if len(named) == 1:
        return named if named[0][1].ndim >= 2 or _is_ids(named[0][1]) else []
    return [(k, x) for k, x in named if _is_image(x) or _is_ids(x) or (x.dtype.kind == "f" and x.ndim >= 2)]


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


def _reordered(batch: Any, x: Array, order: Array) -> Make:
    return lambda: _reorder_steps(batch, x, order)


def _scaled(batch: Any, items: list[tuple[Any, Array]], fn: _Fn) -> Make:
    def make() -> Any:
        new = {}
        for key, x in items:
            dtype = x.dtype if x.dtype.kind == "f" else np.float32
            new[key] = np.ascontiguousarray(fn(x.astype(np.float64)).astype(dtype))
        return _replace_all(batch, new)
    return make


def _id_maps(x: Array, sizes: tuple[int, ...] = ()) -> list[tuple[str, str, _Fn]]:
    """(cause, description, T) of the id shifts: +-1, +-1 wrapping around a vocabulary of each
    of ``sizes`` (a weekday, an hour: 6 + 1 is 0), and +-1 except padding 0 where there is some."""
    what = "token ids" if _is_sequence(x) else "ids"
    out: list[tuple[str, str, _Fn]] = [
        ("token_id_shift", f"{what} + 1 (the candidate reads id i as the reference reads i + 1)", lambda v: v + 1),
        ("token_id_shift", f"{what} - 1 (the candidate reads id i as the reference reads i - 1)", lambda v: v - 1)]
    top = int(x.max()) if x.size else 0
    for n in sorted({n for n in sizes if n > top} | {top + 1}):
        if n <= 2:
            continue
        if top == n - 1:  # some id wraps: else the plain shift says the same
            out.append(("token_id_shift", f"{what} + 1 modulo {n} (the candidate reads id i as the reference reads "
                        f"(i + 1) mod {n}: a cyclic id such as a weekday or an hour shifted by one)",
                        _wrap(1, n)))
        if (x == 0).any() and top < n:
            out.append(("token_id_shift", f"{what} - 1 modulo {n} (the candidate reads id i as the reference reads "
                        f"(i - 1) mod {n}: a cyclic id such as a weekday or an hour shifted by one)",
                        _wrap(-1, n)))
    pad = x == 0
    if pad.any() and (~pad).any():
        out += [("vocabulary_off_by_one", f"{what} + 1 except padding 0 (a vocabulary off by one: an id "
                 "reserved or dropped at its start)", lambda v: np.where(v == 0, 0, v + 1)),
                ("vocabulary_off_by_one", f"{what} - 1 except padding 0 (a vocabulary off by one: an id "
                 "reserved or dropped at its start)", lambda v: np.where(v == 0, 0, v - 1))]
    return out


def _mapped(batch: Any, items: list[tuple[Any, Array]], fn: _Fn) -> Make:
    return lambda: _replace_all(batch, {k: fn(x).astype(x.dtype) for k, x in items})


def _wrap(step: int, n: int) -> _Fn:
    return lambda v: (v + step) % n


def _vocabulary_sizes(model: Any) -> tuple[int, ...]:
    """The id ranges a Keras reference declares (Embedding input_dim, CategoryEncoding tokens,
    Hashing bins): where a cyclic id wraps."""
    from ._util import is_keras_model, native_of

    native = native_of(model)
    if not is_keras_model(native):
        return ()
    sizes = set()
    for layer in native._flatten_layers():
        for attr in ("input_dim", "num_tokens", "num_bins"):
            n = getattr(layer, attr, None)
            if isinstance(n, int) and 2 < n <= 1 << 20:
                sizes.add(n)
    return tuple(sorted(sizes))[:4]


def _token_batches(batch: Any, key: Any, x: Array, sizes: tuple[int, ...] = ()) -> list[tuple[str, str, Make]]:
    """(cause, description, make batch) for candidate(x) ≈ reference(T(x)) on integer ids: a
    +-1 shift, a vocabulary off by one (padding id 0 kept); on a sequence also the steps
    reversed, padding moved to the other side (every input over the same steps, a mask too,
    moves with it)."""
    if not _is_ids(x):
        return []
    out = [(cause, label, _mapped(batch, [(key, x)], fn)) for cause, label, fn in _id_maps(x, sizes)]
    if not _is_sequence(x):
        return out
    pad = x == 0
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


# A try: (cause, description, which inputs it names, make the transformed batch, and for a
# pure gain the batch at any other factor: the fit of the exact factor needs it).
_Try = tuple[str, str, str, Make, "Callable[[float], Make] | None"]


def _regain(batch: Any, items: list[tuple[Any, Array]], label: str) -> Callable[[float], Make] | None:
    if _factor(label) is None:
        return None
    return lambda g: _scaled(batch, items, lambda v: v * g)


def _joint_tries(batch: Any, named: list[tuple[Any, Array]], sizes: tuple[int, ...] = ()) -> list[_Try]:
    """The same transform on every id input (one vocabulary) or every float input (one scale)."""
    out: list[_Try] = []
    ids = [(k, x) for k, x in named if _is_ids(x)]
    if len(ids) >= 2:
        keys = ", ".join(repr(k) for k, _ in ids)
        # wording and the off-by-one tries from the input with padding, if any
        lead = next((x for _, x in ids if (x == 0).any()), ids[0][1])
        for cause, label, fn in _id_maps(lead, sizes):
            out.append((cause, label, f"every id input ({keys}, shifted together: one vocabulary)",
                        _mapped(batch, ids, fn), None))
    floats = [(k, x) for k, x in named if x.dtype.kind == "f" and x.ndim >= 2]
    if len(floats) >= 2:
        keys = ", ".join(repr(k) for k, _ in floats)
        lead = max((x for _, x in floats), key=lambda x: float(np.max(np.abs(x))) if x.size else 0.0)
        for label, fn in _gains(lead):
            out.append(("input_scaling", label, f"every float input ({keys}, scaled together)", _scaled(batch, floats, fn),
                        _regain(batch, floats, label)))
    return out


def _all_tries(batch: Any, sizes: tuple[int, ...] = ()) -> list[_Try]:
    named = _named_inputs(batch)
    many = len(named) > 1
    out = _joint_tries(batch, named, sizes) if many else []
    for key, x in _candidate_inputs(batch):
        which = f"input {key!r}" if many else "input"
        others = " (the other inputs unchanged)" if many else ""
        found: list[tuple[str, str, Make, Callable[[float], Make] | None]]
        found = [(c, label, make, None) for c, label, make in _token_batches(batch, key, x, sizes)]
        if not found:
            found = [(c, label, _scaled(batch, [(key, x)], fn), _regain(batch, [(key, x)], label))
                     for c, label, fn in _input_transforms(x)]
        out += [(c, label + others, which, make, regain) for c, label, make, regain in found]
    return out


# Each transform is first tried on this many rows; only one that fits there runs on the whole
# batch (a slow reference left the layer table no time: "not run, to keep the failure fast").
SCREEN_ROWS = 2


def input_transform(reference: Any, inputs: Any, actual: Any, paths: list[str],
                    tolerances: dict[str, Any] | None = None) -> tuple[str, str, str] | None:
    """Test candidate(x) ≈ reference(T(x)) on the failing outputs; (cause, message, evidence)."""
    tries = _all_tries(inputs, _vocabulary_sizes(reference))
    if not tries:
        return None
    flat_actual = flatten(actual)
    base = flatten(run_model(reference, inputs))
    errors = {}
    for p in paths:
        a, e = pick(flat_actual, p), pick(base, p)
        if a is None or e is None or np.shape(a) != np.shape(e):
            return None
        errors[p] = float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(e, np.float64))))
    n = batch_size(inputs) or 0
    shapes = [np.shape(np.asarray(pick(flat_actual, p))) for p in paths]
    screen = n > SCREEN_ROWS and all(len(sh) >= 1 and sh[0] == n for sh in shapes)
    few = slice(0, SCREEN_ROWS)
    few_errors = {p: float(np.max(np.abs(np.asarray(pick(flat_actual, p), np.float64)[few]
                                         - np.asarray(pick(base, p), np.float64)[few]))) for p in paths} if screen else {}

    def judged(make: Make, screening: bool) -> tuple[bool, float]:
        batch = rows(make(), few) if screening else make()
        got = flatten(run_model(reference, batch))
        worst, ok_all = 0.0, True
        for p in paths:
            a, r = pick(flat_actual, p), pick(got, p)
            if a is None or r is None:
                return False, float("inf")
            a = np.asarray(a)[few] if screening else a
            ok, resid = fits(a, r, (few_errors if screening else errors)[p], (tolerances or {}).get(p))
            ok_all &= ok
            worst = max(worst, resid)
        return ok_all, worst

    best = None
    for cause, label, which, make, _regain_at in tries:
        try:
            if screen and not judged(make, True)[0]:
                continue
            ok_all, worst = judged(make, False)
        except Exception:  # noqa: BLE001 - a shape or id the reference refuses: not this transform
            continue
        if ok_all and (best is None or worst < best[0]):
            best = (worst, cause, label, which)
    if best is None:
        return None
    worst, cause, label, which = best
    err = max(errors.values())
    exact = _exact_gain(reference, tries, label, which, flat_actual, paths)
    if exact is not None:
        label, fitted = exact
    return (cause, f"candidate(x) ≈ reference(T(x)) with the {which} {label}: the two forms preprocess "
            "the input differently",
            f"max |candidate(x) - reference(T(x))| = {worst:.3g}, against {err:.3g} for reference(x)"
            + (f"; {fitted}" if exact is not None else ""))


# Two named gains this close (255 and 256, 255/256 and 1) are told apart by fitting the factor.
_NEAR = 0.02


def _exact_gain(reference: Any, tries: list[_Try], label: str, which: str, flat_actual: dict,
                paths: list[str]) -> tuple[str, str] | None:
    """(label, what the fit found) for the gain among the near ones (/255 and /256) that the
    rows choose, or a label that says they cannot tell. The mean squared residual of
    candidate(x) against reference(g·x) is a parabola in g near the true factor: fitted through
    the two named factors and their midpoint, its vertex is the factor; where the two residuals
    differ by less than their own float noise, the outputs do not move between them."""
    factor = _factor(label)
    if factor is None:
        return None
    near: list[tuple[float, str]] = []
    for t in tries:
        g = _factor(t[1])
        if t[2] == which and t[1] != label and g is not None and abs(np.log(g / factor)) < _NEAR:
            near.append((g, t[1]))
    regain = next((t[4] for t in tries if t[1] == label and t[2] == which), None)
    if not near or regain is None:
        return None
    other, other_label = min(near, key=lambda n: abs(np.log(n[0] / factor)))

    def mse(g: float) -> float:
        got = flatten(run_model(reference, regain(g)()))
        total = count = 0.0
        for p in paths:
            a, r = np.asarray(pick(flat_actual, p), np.float64), np.asarray(pick(got, p), np.float64)
            total += float(np.sum((a - r) ** 2))
            count += a.size
        return total / max(count, 1.0)

    mid = (factor + other) / 2
    y1, y2, y3 = mse(factor), mse(other), mse(mid)
    h = (other - factor) / 2
    curve = y1 - 2 * y3 + y2
    vertex = mid - h * (y2 - y1) / (2 * curve) if curve > 0 else float("nan")
    shown = _as_factor(vertex, label)
    if not curve > 0 or abs(y1 - y2) <= 0.1 * min(y1, y2):
        both = f"{_short(label)} or {_short(other_label)}"
        return (f"{both} (the rows cannot tell which: the outputs move less than their float noise between the "
                "two)", f"mean squared residual {y1:.3g} at the first, {y2:.3g} at the second")
    chosen = label if abs(vertex - factor) <= abs(vertex - other) else other_label
    return chosen, (f"the factor fitted to the rows is {shown} (mean squared residual {y1:.3g} at "
                    f"{_short(label)}, {y2:.3g} at {_short(other_label)})")


def _short(label: str) -> str:
    return label.split(" (")[0]


def _as_factor(g: float, label: str) -> str:
    """A fitted gain as the user's code would write it: ``1/254.98`` for a division."""
    if not np.isfinite(g) or g == 0:
        return "undetermined"
    return f"1/{1 / g:.5g}" if label.startswith("divided") else f"{g:.6g}"
