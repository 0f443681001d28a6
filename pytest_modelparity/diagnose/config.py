"""When two Keras forms hold the same weights and still differ, the cause is configuration: a
port's BatchNormalization epsilon (1e-5 where TF1 used 1e-3), a layer only one form has (a
channels-first ``Permute`` before ``Flatten``, an input batch norm left out). Compare the
layers' configurations and the layer lists instead of blaming the weights or a layer."""

from __future__ import annotations

from typing import Any

from ._util import is_keras_model, native_of
from .preprocessing import all_layers

# Configuration keys that name or place a layer, or describe initialisation/training only.
_IGNORED = {"name", "trainable", "dtype", "build_config", "seed", "kernel_initializer", "bias_initializer",
            "gamma_initializer", "beta_initializer", "moving_mean_initializer", "moving_variance_initializer",
            "embeddings_initializer", "recurrent_initializer", "kernel_regularizer", "bias_regularizer",
            "activity_regularizer", "kernel_constraint", "bias_constraint", "gamma_regularizer",
            "beta_regularizer", "gamma_constraint", "beta_constraint", "momentum", "rate", "noise_shape",
            "batch_input_shape", "batch_shape", "sparse", "ragged", "input_shape", "optional"}


def _config(layer: Any) -> dict[str, Any]:
    try:
        cfg = layer.get_config()
    except Exception:  # noqa: BLE001 - a custom layer without get_config: nothing to compare
        return {}
    return {k: v for k, v in cfg.items() if k not in _IGNORED}


def _structure(model: Any) -> list[tuple[str, str, Any]] | None:
    native = native_of(model)
    if not is_keras_model(native):
        return None
    return [(layer.name, type(layer).__name__, layer) for layer in all_layers(native)
            if type(layer).__name__ != "InputLayer"]


def _align(ref: list[tuple[str, str, Any]], cand: list[tuple[str, str, Any]]) -> tuple[list, list, list]:
    """(pairs, only in reference, only in candidate): by name, else by type in order (an
    ordered alignment of the type sequences, so one extra layer does not shift every pair)."""
    import difflib

    cand_names = {n for n, _, _ in cand}
    if sum(n in cand_names for n, _, _ in ref) >= max(1, len(ref) // 2):
        by_name = {n: (n, t, l) for n, t, l in cand}
        pairs = [(r, by_name[r[0]]) for r in ref if r[0] in by_name and by_name[r[0]][1] == r[1]]
        paired_c = {c[0] for _, c in pairs}
        paired_r = {r[0] for r, _ in pairs}
        return pairs, [r for r in ref if r[0] not in paired_r], [c for c in cand if c[0] not in paired_c]
    sm = difflib.SequenceMatcher(a=[t for _, t, _ in ref], b=[t for _, t, _ in cand], autojunk=False)
    pairs, only_r, only_c = [], [], []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            pairs += list(zip(ref[i1:i2], cand[j1:j2]))
        else:
            only_r += ref[i1:i2]
            only_c += cand[j1:j2]
    return pairs, only_r, only_c


def configuration_hint(reference: Any, candidate: Any) -> tuple[str, str, str] | None:
    """(cause, message, evidence) for two Keras forms whose layers are configured differently,
    or where a layer is present in one form only; None when they agree or one is not Keras."""
    ref, cand = _structure(reference), _structure(candidate)
    if not ref or not cand:
        return None
    pairs, only_r, only_c = _align(ref, cand)
    changed: list[str] = []
    for (rname, rtype, rl), (_, _, cl) in pairs:
        rc, cc = _config(rl), _config(cl)
        keys = [k for k in rc if k in cc and rc[k] != cc[k]]
        if keys:
            changed.append(f"{rtype} `{rname}` " + ", ".join(f"{k} {rc[k]!r} in the reference, {cc[k]!r} in the "
                                                            "candidate" for k in keys[:3]))
    extra = [f"{t} `{n}` only in the candidate" for n, t, _ in only_c]
    missing = [f"{t} `{n}` only in the reference" for n, t, _ in only_r]
    if not (changed or extra or missing):
        return None
    if extra or missing:
        lead = (extra + missing)[0]
        message = f"a layer is present in one form only: {lead}"
        cause = "layer_only_in_one_form"
        if any(t in ("Permute", "Transpose") for _, t, _ in only_c + only_r):
            message += " (an extra axis permutation: a channels-first/channels-last layout slip)"
    else:
        lead = changed[0]
        message = f"the two forms configure a layer differently: {lead}"
        cause = "configuration_differs"
    evidence = "; ".join((changed + extra + missing)[:6])
    return cause, message, evidence
