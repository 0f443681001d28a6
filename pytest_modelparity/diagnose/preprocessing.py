"""Compare the state of two Keras forms' preprocessing layers, as weights are compared:
Normalization mean/variance, Discretization boundaries, lookup vocabularies. A Normalization
built with ``mean=`` holds its statistics as constants, not weights, so a port whose mean is
off by half a standard deviation agrees weight for weight and still differs."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._util import is_keras_model, native_of

# state: {layer name: (layer type, {field: value})}
State = dict[str, tuple[str, dict[str, Any]]]


def all_layers(model: Any) -> list[Any]:
    flat = getattr(model, "_flatten_layers", None)
    if callable(flat):
        try:
            return list(flat(include_self=False, recursive=True))
        except TypeError:
            pass
    return list(getattr(model, "layers", []))


def _array(v: Any) -> np.ndarray | None:
    try:
        return np.asarray(v.numpy() if hasattr(v, "numpy") else v, np.float64)
    except Exception:  # noqa: BLE001 - an unbuilt layer's symbolic value: nothing to compare
        return None


def preprocessing_state(model: Any) -> State:
    """The preprocessing state of a Keras model (empty for other forms)."""
    native = native_of(model)
    if not is_keras_model(native):
        return {}
    out: State = {}
    for layer in all_layers(native):
        kind = type(layer).__name__
        fields: dict[str, Any] = {}
        if kind == "Normalization":
            for f in ("mean", "variance"):
                v = _array(getattr(layer, f, None))
                if v is not None and v.size:
                    fields[f] = v.reshape(-1)
        elif kind == "Discretization":
            b = getattr(layer, "bin_boundaries", None)
            if b is not None:
                fields["bin_boundaries"] = np.asarray(b, np.float64).reshape(-1)
        elif hasattr(layer, "get_vocabulary") and kind.endswith("Lookup"):
            try:
                fields["vocabulary"] = [str(t) for t in layer.get_vocabulary()]
            except Exception:  # noqa: BLE001
                continue
        if fields:
            out[layer.name] = (kind, fields)
    return out


def _pairs(ref: State, cand: State) -> list[tuple[str, str]]:
    """(reference layer, candidate layer): by name, then by type in order."""
    pairs, left = [], dict(cand)
    rest = []
    for name, (kind, _) in ref.items():
        if name in left and left[name][0] == kind:
            pairs.append((name, name))
            del left[name]
        else:
            rest.append(name)
    for name in rest:
        other = next((c for c, (k, _) in left.items() if k == ref[name][0]), None)
        if other is not None:
            pairs.append((name, other))
            del left[other]
    return pairs


def _vocab_diff(r: list[str], c: list[str]) -> str | None:
    if r == c:
        return None
    if c[1:] == r or r[1:] == c or c[:-1] == r[1:] or c[1:] == r[:-1]:
        return (f"its vocabulary is off by one ({len(r)} vs {len(c)} entries; reference starts {r[:3]}, candidate "
                f"{c[:3]}): an OOV or mask entry added or dropped")
    if sorted(r) == sorted(c):
        moved = sum(a != b for a, b in zip(r, c))
        return f"its vocabulary holds the same {len(r)} entries in another order ({moved} at another index)"
    missing = len(set(r) - set(c))
    return f"its vocabulary differs ({len(r)} vs {len(c)} entries, {missing} of the reference's missing)"


def _field_diff(kind: str, field: str, r: np.ndarray, c: np.ndarray, fields: dict[str, Any]) -> str | None:
    if r.shape != c.shape:
        return f"{field} has {c.size} values where the reference has {r.size}"
    d = np.abs(r - c)
    if not d.size or float(d.max()) <= 1e-6 * max(float(np.abs(r).max()), 1e-12):
        return None
    i = int(np.argmax(d))
    text = f"{field} differs by up to {d[i]:.3g} (reference {r[i]:.4g}, candidate {c[i]:.4g})"
    var = fields.get("variance")
    if kind == "Normalization" and field == "mean" and isinstance(var, np.ndarray) and var.shape == r.shape:
        std = float(np.sqrt(max(var[i], 1e-12)))
        text += f", {d[i] / std:.2g} of a standard deviation"
    elif kind == "Normalization" and field == "variance":
        text += f", a ratio of {c[i] / r[i]:.3g}" if r[i] else ""
    return text


def preprocessing_hint(reference: Any, candidate: Any) -> tuple[str, str, str] | None:
    """(cause, message, evidence) when both forms are Keras and a preprocessing layer's state differs."""
    ref, cand = preprocessing_state(reference), preprocessing_state(candidate)
    if not ref or not cand:
        return None
    found = []
    for rname, cname in _pairs(ref, cand):
        kind, rf = ref[rname]
        _, cf = cand[cname]
        for field, rv in rf.items():
            cv = cf.get(field)
            if cv is None:
                continue
            why = _vocab_diff(rv, cv) if field == "vocabulary" else _field_diff(kind, field, rv, cv, rf)
            if why is not None:
                found.append((rname, kind, why))
    if not found:
        return None
    name, kind, why = found[0]
    return ("preprocessing_state", f"the preprocessing state differs: {kind} `{name}` {why.split(' (')[0]}",
            "; ".join(f"{k} `{n}`: {w}" for n, k, w in found[:4]))


def preprocessing_layers(model: Any) -> set[str]:
    return set(preprocessing_state(model))


def _stats_of(layer: Any, feats: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A Normalization layer's mean and standard deviation, one per last-axis feature."""
    mean, var = _array(getattr(layer, "mean", None)), _array(getattr(layer, "variance", None))
    if mean is None or var is None:
        return None
    r_mean = np.broadcast_to(mean.reshape(-1)[-feats:] if mean.size >= feats else mean.reshape(-1), (feats,))
    r_var = np.broadcast_to(var.reshape(-1)[-feats:] if var.size >= feats else var.reshape(-1), (feats,))
    return r_mean, np.sqrt(np.maximum(r_var, 1e-12))


def _said(layer_name: str, c_mean: np.ndarray, c_std: np.ndarray, r_mean: np.ndarray, r_std: np.ndarray,
          where: str, fit: str) -> tuple[str, str, str] | None:
    feats = len(r_mean)
    shift = np.abs(c_mean - r_mean) / r_std
    ratio = c_std / r_std
    off = [f for f in range(feats) if shift[f] > 1e-3 or abs(ratio[f] - 1) > 1e-3]
    if not off:
        return None
    f = max(off, key=lambda i: shift[i] + abs(ratio[i] - 1))
    what = (f"mean {c_mean[f]:.4g} where the reference has {r_mean[f]:.4g} ({shift[f]:.2g} of a standard deviation)"
            if shift[f] > 1e-3 else f"standard deviation {c_std[f]:.4g} where the reference has {r_std[f]:.4g}")
    return ("preprocessing_state",
            f"the preprocessing state differs: Normalization `{layer_name}`{where} runs in the candidate with {what} "
            f"on feature {f}, read back from what the candidate computes",
            f"{fit} gives mean {np.round(c_mean, 4).tolist()[:8]}, std {np.round(c_std, 4).tolist()[:8]}; the "
            f"reference's mean {np.round(r_mean, 4).tolist()[:8]}, std {np.round(r_std, 4).tolist()[:8]}; "
            f"{len(off)} of {feats} features differ")


def fused_normalization_read_back(reference: Any, norm_name: str, dense_name: str, batch: Any,
                                  candidate_out: np.ndarray) -> tuple[str, str, str] | None:
    """A Normalization the candidate folded into the Dense after it (no tensor of its own): the
    candidate's Dense computes act(W^T (x - m) / s + b) with the reference's W and b, so a line
    fitted per unit to (the Normalization's input, the candidate's pre-activation, where a ReLU
    passes it) gives W^T diag(1/s) and b - W^T (m/s), from which s and m are solved. Said only
    when every fit is exact and the statistics differ."""
    native = native_of(reference)
    if not is_keras_model(native):
        return None
    by_name = {lay.name: lay for lay in all_layers(native)}
    norm, dense = by_name.get(norm_name), by_name.get(dense_name)
    if norm is None or dense is None or type(norm).__name__ != "Normalization":
        return None
    if type(dense).__name__ in CONVOLUTIONS:
        return _conv_read_back(native, norm, dense, batch, candidate_out)
    if type(dense).__name__ != "Dense":
        return None
    act = getattr(getattr(dense, "activation", None), "__name__", "")
    if act not in ("linear", "relu") or len(dense.get_weights()) != 2:
        return None
    import keras

    from ._util import fit_inputs

    kernel, bias = (np.asarray(w, np.float64) for w in dense.get_weights())
    struct = getattr(native, "_inputs_struct", None)
    probe = keras.Model(native.inputs if struct is None else struct, norm.input)
    x = np.asarray(probe(fit_inputs(native, batch), training=False), np.float64)
    y = np.asarray(candidate_out, np.float64)
    if x.ndim != 2 or y.ndim != 2 or y.shape != (x.shape[0], kernel.shape[1]) or x.shape[1] != kernel.shape[0]:
        return None
    feats = x.shape[1]
    stats = _stats_of(norm, feats)
    if stats is None:
        return None
    slopes, offsets, used = [], [], []
    for j in range(kernel.shape[1]):
        live = y[:, j] > 0 if act == "relu" else np.ones(len(y), bool)
        if live.sum() < feats + 2:
            continue  # too few rows where this unit's pre-activation shows
        design = np.hstack([x[live], np.ones((int(live.sum()), 1))])
        coef, *_ = np.linalg.lstsq(design, y[live, j], rcond=None)
        if np.max(np.abs(design @ coef - y[live, j])) > 1e-4 * max(np.max(np.abs(y[live, j])), 1e-12):
            return None  # not affine in the input there: not (only) the statistics
        slopes.append(coef[:feats])
        offsets.append(coef[feats])
        used.append(j)
    if len(used) < feats:
        return None
    a, w = np.array(slopes), kernel[:, used]  # a[j, f] = w[f, j] / s'[f]
    denom = np.sum(w.T * a, axis=0)
    if np.any(np.abs(denom) <= 1e-12):
        return None
    c_std = np.sum(w.T ** 2, axis=0) / denom
    u, *_ = np.linalg.lstsq(w.T, bias[used] - np.array(offsets), rcond=None)  # u = m' / s'
    c_mean = u * c_std
    return _said(norm_name, c_mean, c_std, *stats, where=f" (folded into `{dense_name}` in the candidate)",
                 fit=f"a plane fitted per unit of `{dense_name}` to (the Normalization's input, the candidate's "
                     f"output) on {len(used)} units")


CONVOLUTIONS = ("Conv2D", "DepthwiseConv2D")


def _conv_read_back(native: Any, norm: Any, conv: Any, batch: Any, candidate_out: np.ndarray
                    ) -> tuple[str, str, str] | None:
    """A Normalization folded into the convolution after it: the candidate computes
    act(conv(x, K diag(1/s)) + b - sum K (m/s)), so with z_c = conv(x's channel c alone, K) and
    S_c = conv(ones on channel c, K) (which counts only the taps inside the image, so padding is
    the candidate's own) its pre-activation is b + sum_c a_c z_c - sum_c u_c S_c, linear in
    a_c = 1/s_c and u_c = m_c/s_c: one least-squares fit over every position and output channel
    where a ReLU passes it gives s and m. Said only when the fit is exact and the statistics differ."""
    import keras

    from ._util import fit_inputs

    act = getattr(getattr(conv, "activation", None), "__name__", "")
    weights = conv.get_weights()
    if act not in ("linear", "relu") or not 1 <= len(weights) <= 2 or getattr(conv, "data_format", "") != "channels_last":
        return None
    kernel = np.asarray(weights[0], np.float32)
    bias = np.asarray(weights[1], np.float64) if len(weights) == 2 else 0.0
    struct = getattr(native, "_inputs_struct", None)
    probe = keras.Model(native.inputs if struct is None else struct, norm.input)
    x = np.asarray(probe(fit_inputs(native, batch), training=False), np.float32)
    y = np.asarray(candidate_out, np.float64)
    if x.ndim != 4 or y.ndim != 4 or x.shape[0] != y.shape[0]:
        return None
    feats = x.shape[-1]
    stats = _stats_of(norm, feats)
    if stats is None:
        return None
    depthwise = type(conv).__name__ == "DepthwiseConv2D"
    options = dict(strides=conv.strides, padding=conv.padding, data_format="channels_last",
                   dilation_rate=conv.dilation_rate)

    def run(image: np.ndarray) -> np.ndarray:
        op = keras.ops.depthwise_conv if depthwise else keras.ops.conv
        return np.asarray(keras.ops.convert_to_numpy(op(image, kernel, **options)), np.float64)

    z, ones = [], []
    for c in range(feats):
        only = np.zeros_like(x)
        only[..., c] = x[..., c]
        z.append(run(only))
        unit = np.zeros_like(x[:1])
        unit[..., c] = 1.0
        ones.append(np.broadcast_to(run(unit), y.shape))
    if z[0].shape != y.shape:
        return None
    live = (y > 0) if act == "relu" else np.ones(y.shape, bool)
    if live.sum() < 4 * feats:
        return None
    target = (y - bias)[live]
    design = np.stack([zc[live] for zc in z] + [-sc[live] for sc in ones], axis=1)
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    if np.max(np.abs(design @ coef - target)) > 1e-4 * max(float(np.max(np.abs(y[live]))), 1e-12):
        return None  # not this affine map of the input: not (only) the statistics
    a, u = coef[:feats], coef[feats:]
    if np.any(np.abs(a) <= 1e-12):
        return None
    c_std, c_mean = 1.0 / a, u / a
    kind = "depthwise convolution" if depthwise else "convolution"
    return _said(norm.name, c_mean, c_std, *stats, where=f" (folded into `{conv.name}` in the candidate)",
                 fit=f"the {kind} `{conv.name}` refitted to (the Normalization's input, the candidate's output) at "
                     f"{int(live.sum())} positions x channels, its kernel per input channel scaled by 1/std and its "
                     f"bias shifted by the kernel times mean/std")


def normalization_read_back(reference: Any, layer_name: str, batch: Any, candidate_out: np.ndarray
                            ) -> tuple[str, str, str] | None:
    """(cause, message, evidence) for a Normalization the candidate runs with other statistics,
    read back from what it computes: its output is (x - mean) / std per feature, so a line fitted
    to each feature's (input, candidate output) gives the candidate's mean and standard
    deviation, whatever its form holds them as (constants folded into a RealDiv, a TFLite MUL,
    an ONNX initializer). Said only when the fit is exact and its statistics differ."""
    native = native_of(reference)
    if not is_keras_model(native):
        return None
    layer = next((lay for lay in all_layers(native) if lay.name == layer_name), None)
    if layer is None or type(layer).__name__ != "Normalization":
        return None
    import keras

    from ._util import fit_inputs

    struct = getattr(native, "_inputs_struct", None)  # fed in the model's own structure: no Keras warning
    probe = keras.Model(native.inputs if struct is None else struct, layer.input)
    x = np.asarray(probe(fit_inputs(native, batch), training=False), np.float64)
    y = np.asarray(candidate_out, np.float64)
    if x.shape != y.shape or x.ndim < 2:
        return None
    feats = x.shape[-1]
    stats = _stats_of(layer, feats)
    if stats is None:
        return None
    xs, ys = x.reshape(-1, feats), y.reshape(-1, feats)
    c_mean, c_std = np.empty(feats), np.empty(feats)
    for f in range(feats):
        a, b = xs[:, f], ys[:, f]
        if np.ptp(a) <= 0:
            return None
        slope, intercept = np.polyfit(a, b, 1)
        if not slope or np.max(np.abs(slope * a + intercept - b)) > 1e-4 * max(np.max(np.abs(b)), 1e-12):
            return None  # not an affine map of this input: not (only) the statistics
        c_std[f], c_mean[f] = 1.0 / slope, -intercept / slope
    return _said(layer_name, c_mean, c_std, *stats, where="", fit="a line fitted per feature to (input, candidate output)")
