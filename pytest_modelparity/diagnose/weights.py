"""Compare the weights of two forms (seed 002: variables re-initialised after loading).

Match tensors by name, then the rest by shape in order; count those that differ, show the
worst, and say when the candidate's weights look freshly initialised while the reference's
do not (zero biases, unit scales, kernels spread like glorot_uniform/glorot_normal)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._util import hook, is_keras_model, native_of


# Converters fold batch-norm into kernels and transpose them: their constants differ from the
# reference's without any bug, so these forms are left to layer-by-layer localisation.
_TRANSFORMED_FORMATS = {"tflite", "tfjs", "onnx"}


def weights_of(model: Any) -> dict[str, np.ndarray] | None:
    """A model's weights by name when its form exposes them (None otherwise).

    TFLite is left out on purpose: the converter folds batch-norm into convolutions, so its
    constants differ from the reference's without any bug.
    """
    if getattr(model, "format", None) in _TRANSFORMED_FORMATS:
        return None
    got = hook(model, "weights")
    variables = getattr(native_of(model), "variables", None)
    if got and variables and not isinstance(variables, dict) and len(got) < len(list(variables)):
        got = None  # names collided (a SavedModel's `model/kernel` for every kernel): read them all below
    if got:
        return {str(k): np.asarray(v) for k, v in got.items()}
    native = native_of(model)
    if is_keras_model(native):
        return {v.path: np.asarray(v.numpy()) for v in native.weights}
    try:
        import tensorflow as tf
    except ImportError:
        return None
    if isinstance(native, tuple) and len(native) == 2 and isinstance(native[0], tf.Graph):
        graph, sess = native
        with graph.as_default():
            variables = tf.compat.v1.global_variables()
            if variables:
                return {v.op.name: np.asarray(a) for v, a in zip(variables, sess.run(variables))}
        return _graph_constants(graph.as_graph_def())
    if hasattr(native, "node") and hasattr(native, "library"):
        return _graph_constants(native)
    variables = getattr(native, "variables", None)
    if variables:
        try:
            return _unique(variables)
        except Exception:  # noqa: BLE001
            return None
    return None


def _unique(variables: Any) -> dict[str, np.ndarray]:
    """{name: value}, a name repeated suffixed ``#2``, ``#3``: a loaded SavedModel's variables
    can all be called ``model/kernel:0`` (the layer scope lost), and a dict would keep one."""
    out: dict[str, np.ndarray] = {}
    for v in variables:
        name = _var_name(v)
        key, k = name, 1
        while key in out:
            k += 1
            key = f"{name}#{k}"
        out[key] = np.asarray(v.numpy())
    return out


def _var_name(v: Any) -> str:
    return getattr(v, "path", None) or v.name


def _graph_constants(graph_def: Any) -> dict[str, np.ndarray]:
    from tensorflow.python.framework import tensor_util

    out = {}
    for node in graph_def.node:
        if node.op == "Const" and "value" in node.attr:
            arr = tensor_util.MakeNdarray(node.attr["value"].tensor)
            if arr.dtype.kind == "f" and arr.size >= 2:
                out[node.name] = arr
    return out


def _norm(name: str) -> str:
    """'model/dense_1/kernel:0' -> 'dense_1/kernel' (last two path parts, no ':0')."""
    name = re.sub(r":\d+$", "", name)
    parts = [p for p in re.split(r"[/.]", name) if p]
    return "/".join(parts[-2:])


@dataclass(frozen=True)
class WeightDiff:
    name: str
    candidate_name: str
    shape: tuple
    max_abs: float
    max_rel: float       # max abs over max |reference|
    fresh: str | None    # why the candidate looks freshly initialised, if it does


def match_weights(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> list[tuple[str, str]]:
    """Pairs (reference name, candidate name): by exact name, normalised name, then shape in order."""
    pairs: list[tuple[str, str]] = []
    left = dict(candidate)
    rest: list[str] = []
    norm_index: dict[str, list[str]] = {}
    for name in candidate:
        norm_index.setdefault(_norm(name), []).append(name)
    for rname, rval in reference.items():
        cname = rname if rname in left and left[rname].shape == rval.shape else None
        if cname is None:
            for c in norm_index.get(_norm(rname), []):
                if c in left and left[c].shape == rval.shape:
                    cname = c
                    break
        if cname is None:
            rest.append(rname)
            continue
        pairs.append((rname, cname))
        del left[cname]
    # Then by the path without numeric suffixes and the model's own name (a second instance of
    # a subclassed model: `det_2/block_2/conv2d_7/bias` is `det/block/conv2d_1/bias`), in order.
    skeletons: dict[str, list[str]] = {}
    for cname in left:
        skeletons.setdefault(_skeleton(cname), []).append(cname)
    unmatched = []
    for rname in rest:
        shape = reference[rname].shape
        cname = next((c for c in skeletons.get(_skeleton(rname), []) if c in left and left[c].shape == shape), None)
        if cname is None:
            unmatched.append(rname)
            continue
        pairs.append((rname, cname))
        del left[cname]
    # Last, by shape: the closest tensor of that shape (a zero bias never pairs with unit
    # variances only because they came next in order).
    for rname in unmatched:
        r = np.asarray(reference[rname])
        same = [c for c in left if left[c].shape == r.shape]
        if not same:
            continue
        cname = min(same, key=lambda c: _distance(r, left[c]))
        pairs.append((rname, cname))
        del left[cname]
    return pairs


def _skeleton(name: str) -> str:
    parts = [re.sub(r"_\d+$", "", p) for p in re.split(r"[/.]", re.sub(r":\d+$", "", name)) if p]
    return "/".join(parts[1:] if len(parts) > 2 else parts)


def _distance(r: np.ndarray, c: np.ndarray) -> float:
    if r.dtype.kind not in "fiu" or c.dtype.kind not in "fiu" or not r.size:
        return 0.0
    return float(np.max(np.abs(np.asarray(r, np.float64) - np.asarray(c, np.float64))))


def fresh_init_reason(name: str, value: np.ndarray) -> str | None:
    """Why ``value`` looks like an initializer's output, or None."""
    v = np.asarray(value, np.float64)
    if v.size == 0:
        return None
    lname = name.lower()
    if v.ndim == 1:
        if np.all(v == 0) and not any(k in lname for k in ("gamma", "variance")):
            return "all zero"
        if np.all(v == 1) and any(k in lname for k in ("gamma", "variance", "scale")):
            return "all one"
        return None
    if v.size < 16:
        return None
    receptive = int(np.prod(v.shape[:-2])) if v.ndim > 2 else 1
    fan_in, fan_out = v.shape[-2] * receptive, v.shape[-1] * receptive
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    std = float(v.std())
    if np.abs(v).max() <= limit * 1.0001 and abs(std - limit / math.sqrt(3)) <= 0.15 * limit / math.sqrt(3):
        return f"uniform in +-{limit:.3g} with std {std:.3g}, like glorot_uniform"
    gstd = math.sqrt(2.0 / (fan_in + fan_out))
    if np.abs(v).max() <= 2 * gstd * 1.0001 and abs(std - 0.88 * gstd) <= 0.15 * gstd:
        return f"truncated normal with std {std:.3g}, like glorot_normal"
    return None


def compare_weights(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray]) -> tuple[list[WeightDiff], int]:
    """(differing tensors, worst first; number of matched tensors)."""
    diffs = []
    pairs = match_weights(reference, candidate)
    for rname, cname in pairs:
        r = np.asarray(reference[rname], np.float64)
        c = np.asarray(candidate[cname], np.float64)
        if r.dtype.kind not in "fc" and c.dtype.kind not in "fc":
            continue
        max_abs = float(np.max(np.abs(r - c))) if r.size else 0.0
        scale = float(np.max(np.abs(r))) if r.size else 0.0
        if max_abs <= 1e-6 * scale + 1e-12:
            continue
        fresh = fresh_init_reason(cname, c)
        if fresh is not None and fresh_init_reason(rname, r) is not None:
            fresh = None  # the reference looks the same way: no evidence
        diffs.append(WeightDiff(rname, cname, tuple(r.shape), max_abs, max_abs / scale if scale else math.inf, fresh))
    diffs.sort(key=lambda d: d.max_rel, reverse=True)
    return diffs, len(pairs)


def weight_hint_parts(reference_model: Any, candidate_model: Any,
                      ignore: set[str] | frozenset[str] = frozenset()) -> tuple[str, str, str] | None:
    """(cause, message, evidence) when both forms expose weights and some differ (a weight of a
    layer named in ``ignore``, already reported elsewhere, does not count)."""
    ref = weights_of(reference_model)
    cand = weights_of(candidate_model)
    if not ref or not cand:
        return None
    diffs, matched = compare_weights(ref, cand)
    diffs = [d for d in diffs if not any(part in ignore for part in re.split(r"[/.]", d.name))]
    if not diffs or matched == 0:
        return None
    worst = "; ".join(f"`{d.name}` {d.shape} max |diff| {d.max_abs:.3g} ({d.max_rel:.1%} of its largest value)"
                      for d in diffs[:3])
    # Constant tensors (zero biases, unit scales) are the plainest evidence: show them first.
    fresh = sorted((d for d in diffs if d.fresh), key=lambda d: not (d.fresh or "").startswith("all "))
    evidence = f"{len(diffs)} of {matched} matched weight tensors differ; worst: {worst}"
    if fresh:
        evidence += "; " + "; ".join(f"candidate `{d.candidate_name}` is {d.fresh}" for d in fresh[:4])
        message = (f"the candidate's weights differ from the reference's and {len(fresh)} of them look freshly "
                   "initialised: variables were probably re-initialised after loading (or never restored)")
        return "weights_reinitialised", message, evidence
    return "weights_differ", "the two forms hold different weights", evidence
