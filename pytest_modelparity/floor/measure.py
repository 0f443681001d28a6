"""The reference's shadow: the same model computed in float64 (or with float16 weights).

Why: the default tolerance of a comparison against a Keras reference is a multiple of the
model's own float32 rounding error on the batch under test, max |ref32 - ref64| per output
(``tolerances.shadow_tolerance``). Every correct float32 form of ResNet50, DenseNet121,
EfficientNetB0 and MobileNetV3Small stayed within 2x of it, while that error itself spans
600x between networks (notes/noise-floor.md). ``tflite:float16`` is judged by what rounding
the weights to float16 costs the reference, measured the same way.

The float64 error overstates what correct float32 forms differ by where an ill-conditioned
step (the log of a cancelling filter-bank sum) amplifies rounding that every float32 form
does alike: a log-magnitude audio net's float64 error was 500x its forms' spread. The
``float32 reordered`` twin measures that spread (``measure_floor(model, FLOAT32_REORDERED,
...)``, after the float64 floor: ``SHARPENS``), and ``tolerances.shadow_tolerance`` judges a
CPU float32 form by it where it is at most 1/16 of the float64 error; without it (no graph, a
sum it cannot reorder, nothing to reorder) the float64 floor judges as before.

Twins come in two builds behind one interface (``floor/twins.py``): a Keras model rebuilt
from its config, or the reference's frozen TensorFlow graph rewritten to float64 (SavedModel,
GraphDef, TF1 checkpoint, subclassed Keras models). The first faithful one measures, and a
figure whose bound would be looser than the fixed rule counts only when a second estimate
agrees (``prove``, issue 36: a twin within 5% of its model can still not be its model).

The twin is built once per model (a weak reference keys it) and its outputs are kept per
batch (a digest of the input bytes keys them), so every format in a matrix shares one
float64 run. Nothing here imports TensorFlow at import time; building a twin does.
"""

from __future__ import annotations

import hashlib
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

FLOAT64 = "float64"
FLOAT16_WEIGHTS = "float16 weights"
# The sharper floor (issue 27): the graph twin kept in float32 with its product sums split in
# two and its transcendental outputs moved an ULP, i.e. what another correct float32
# implementation could compute; what it differs by judges where it is far below the float64 error.
FLOAT32_REORDERED = "float32 reordered"
KINDS = (FLOAT64, FLOAT16_WEIGHTS, FLOAT32_REORDERED)
# Beside the kinds in a floor's figures: the float64 figure of that output is unproven (``prove``).
UNPROVEN = "unproven"
# Beside them too: a statistic of the float64 noise's distribution (``BULK + "median"``), which
# the bulk verdict (``verdict/bulk.py``) holds the same statistic of the candidate's error against.
BULK = "float64 bulk "
_OUTPUTS_KEPT = 16   # batches whose shadow outputs are kept per twin
# A float64 twin further than this (share of the output's scale) from its float32 model is
# not a faithful copy: float32 rounding measured <= 1.8e-4 on the deepest nets tried, mixed
# float16 ~1e-3. The comparison then falls back to the fixed rule and says why.
MAX_FAITHFUL = 0.05


@dataclass
class Twin:
    """A runnable shadow of a reference, or why there is none (``model`` None, ``reason``).

    ``model`` is a runner: it takes the batch the reference takes (fitted to the reference's
    own inputs, then fed to the twin by position, so input names never have to agree) and
    returns ``{output name: array}`` in the reference's output order. ``method`` says how it
    was built: ``"keras"`` (a Keras model rebuilt from its config) or ``"graph"`` (the
    reference's frozen TensorFlow graph rewritten). ``accumulates``: the model sums products
    (convolutions, matmuls), so a float64 twin equal to it bitwise stayed partly float32.
    """

    kind: str
    model: Any = None
    reason: str | None = None
    method: str | None = None
    accumulates: bool = False
    seconds_to_build: float = 0.0
    applies: bool = True  # False: this build does not apply to such a reference (not worth saying)


@dataclass
class Floor:
    """What the twins of a reference measured on one batch: ``errors`` by output path (None
    when no twin could run), the twin that measured them, and why the others were not used.
    ``unproven``: the outputs whose float64 figure would give a bound looser than the fixed rule
    and that no second estimate confirms (``reason`` says why); the fixed rule judges them."""

    errors: dict[str, float] | None
    method: str | None
    reason: str | None
    seconds: float
    unproven: tuple[str, ...] = ()
    # the noise's distribution per output path (``verdict.bulk.error_statistics`` of ref - twin:
    # median, q90, mean |.|, mean signed, shares of scale), measured by the float64 twin that judged
    bulk: dict[str, dict[str, float]] = field(default_factory=dict)


METHODS = ("keras", "graph")  # tried in this order: the first faithful twin measures
SHARPENS = {FLOAT64: FLOAT32_REORDERED}  # measured only once the first one was
_METHOD_NAMES = {"keras": "Keras twin", "graph": "graph twin"}
_TWINS: "weakref.WeakKeyDictionary[Any, dict[tuple[str, str], Twin]]" = weakref.WeakKeyDictionary()
_OUTPUTS: "OrderedDict[tuple, Any]" = OrderedDict()


def method_name(method: str | None) -> str:
    """``"Keras twin"`` / ``"graph twin"``: how the report names a twin."""
    return _METHOD_NAMES.get(method or "", "twin")


def twin_of(model: Any, kind: str = FLOAT64, method: str = "keras") -> Twin:
    """The ``kind`` twin of ``model`` built by ``method`` (built once per model; a failure
    is remembered with its reason)."""
    if kind not in KINDS:
        raise ValueError(f"shadow kind {kind!r}; expected one of {KINDS}")
    if method not in METHODS:
        raise ValueError(f"twin method {method!r}; expected one of {METHODS}")
    try:
        per_model = _TWINS.setdefault(model, {})
    except TypeError:  # not weak-referenceable: built for this call only
        per_model = {}
    key = (kind, method)
    if key not in per_model:
        per_model[key] = _build(model, kind, method)
    return per_model[key]


def twins_built(model: Any, kind: str) -> bool:
    """Has a ``kind`` twin of ``model`` been built (or found impossible) already?"""
    try:
        return any(k == kind for k, _ in _TWINS.get(model, {}))
    except TypeError:  # not weak-referenceable
        return False


def _build(model: Any, kind: str, method: str) -> Twin:
    import time

    from .twins import NotApplicable, TwinUnavailable, build_runner

    start = time.perf_counter()
    try:
        runner, accumulates = build_runner(model, kind, method)
    except TwinUnavailable as exc:
        return Twin(kind, reason=str(exc), method=method, applies=not isinstance(exc, NotApplicable))
    except Exception as exc:  # noqa: BLE001 - a twin that cannot be built never fails the comparison
        return Twin(kind, reason=f"{type(exc).__name__}: {_first(exc)}", method=method)
    return Twin(kind, model=runner, method=method, accumulates=accumulates,
                seconds_to_build=time.perf_counter() - start)


def warm_twins(model: Any, inputs: Any) -> None:
    """Build the twins ``model``'s first comparison would build and run each once on ``inputs``
    (a row), so that comparison costs what the later ones do (a ``@given`` test's first example
    paid the build against Hypothesis' deadline: issue 49). A twin that cannot build is
    remembered with its reason, as on first use."""
    for kind in (FLOAT64, SHARPENS[FLOAT64]):
        if kind != FLOAT64 and sharper_floor_pointless(model):
            continue
        for method in METHODS:
            twin = twin_of(model, kind, method)
            if twin.model is not None:
                try:
                    outputs_of(twin, inputs)
                except Exception:  # noqa: BLE001 - said where the comparison measures it
                    pass
                break


def sharper_floor_pointless(model: Any) -> str | None:
    """Why the sharper floor (``SHARPENS``) is not measured for ``model``, where that can be
    told before building it (``floor.twins.rounding_not_amplified``); None: measure it."""
    from .twins import rounding_not_amplified

    try:
        return rounding_not_amplified(model)
    except Exception:  # noqa: BLE001 - cannot tell: measured, as before
        return None


def measure_floor(model: Any, kind: str, inputs: Any, reference: Mapping[str, np.ndarray],
                  leaves: Callable[[Any], Any]) -> Floor:
    """max |ref - twin| / max |twin| per output of ``reference`` (the model's outputs on
    ``inputs``, by path), measured by the first faithful twin of ``kind``.

    A twin is not faithful when it differs from the model by more than rounding can explain
    (``MAX_FAITHFUL``), or when, as a float64 twin of a model that sums products, it equals
    the model bitwise on every output (part of it stayed float32). ``leaves`` flattens
    outputs to ``(path, array)`` pairs; twin outputs whose paths differ from the reference's
    are matched by position.

    No twin without proof: a float64 figure whose bound would be looser than the fixed rule is
    taken only when a second estimate agrees (``prove``): the next twin that builds, else the
    reordered float32 twin.
    """
    import time

    start = time.perf_counter()
    why: list[str] = []
    estimates: list[tuple[str, dict[str, float]]] = []
    bulks: dict[str, dict[str, dict[str, float]]] = {}  # method -> path -> noise statistics
    for method in METHODS:
        twin = twin_of(model, kind, method)
        label = method_name(method)
        if twin.model is None:
            if twin.applies:
                why.append(f"{label}: {twin.reason}")
            continue
        try:
            out = dict(leaves(outputs_of(twin, inputs)))
        except Exception as exc:  # noqa: BLE001 - a twin that cannot run: try the next
            why.append(f"{label}: running it failed ({type(exc).__name__}: {_first(exc)})")
            continue
        found = {p: e for p, e in _errors(reference, out).items() if e is not None}
        problem = _unfaithful(twin, kind, found, reference)
        if problem is None and not found:
            problem = "no floating output to measure"
        if problem:
            why.append(f"{label}: {problem}")
            continue
        estimates.append((method, found))
        if kind == FLOAT64:
            bulks[method] = _noise_statistics(reference, out)
        if kind != FLOAT64 or not _needing_proof(found, reference):
            break  # a bound within the fixed rule needs no second estimate
        if len(estimates) == 2:
            break
    if estimates and kind != FLOAT64:  # float16 weights, the reordered spread: what they measure is meant
        return Floor(estimates[0][1], estimates[0][0], "; ".join(why) or None, time.perf_counter() - start)
    if estimates:
        second = None
        if len(estimates) == 1 and _needing_proof(estimates[0][1], reference):
            second = _reordered_estimate(model, inputs, reference, leaves)
        floor = prove(estimates, reference, second)
        floor.reason = "; ".join(r for r in (*why, floor.reason) if r) or None
        floor.seconds = time.perf_counter() - start
        floor.bulk = bulks.get(floor.method or "", {}) if floor.errors is not None else {}
        return floor
    reasons = {w.split(": ", 1)[-1] for w in why}
    reason = next(iter(reasons)) if len(reasons) == 1 else "; ".join(why)  # said once when all agree
    return Floor(None, None, reason or "no twin", time.perf_counter() - start)


def _needing_proof(errors: Mapping[str, float], reference: Mapping[str, np.ndarray]) -> list[str]:
    """The outputs whose float64 figure would give a bound looser than the fixed rule."""
    from ..verdict.tolerances import needs_proof

    return [p for p, e in errors.items() if needs_proof(_dtype_of(reference, p), e)]


def _dtype_of(reference: Mapping[str, np.ndarray], path: str) -> Any:
    arr = np.asarray(reference[path]) if path in reference else None
    return arr.dtype if arr is not None and arr.dtype.kind == "f" else np.float32


def _reordered_estimate(model: Any, inputs: Any, reference: Mapping[str, np.ndarray],
                        leaves: Callable[[Any], Any]) -> tuple[dict[str, float] | None, str | None]:
    """The reordered float32 twin's figures (the second estimate where one float64 twin measured),
    or None with why it could not measure."""
    found = measure_floor(model, FLOAT32_REORDERED, inputs, reference, leaves)
    return found.errors, found.reason


def prove(estimates: list[tuple[str, dict[str, float]]], reference: Mapping[str, np.ndarray],
          reordered: tuple[dict[str, float] | None, str | None] | None = None) -> Floor:
    """The floor the faithful float64 ``estimates`` (``[(method, {path: error})]``, one or two, in
    the order tried) prove: no twin without proof (issue 36).

    A figure whose bound would be within the fixed rule is taken as it is. A looser one is taken
    when a second estimate agrees: the other float64 twin within ``TWINS_AGREE_WITHIN``, else the
    ``reordered`` float32 twin's figure (``(errors, why none)``) at least 1/``REORDERED_SUPPORTS``
    of it. Two float64 twins that disagree: the smaller judges where its own bound needs no proof
    (the larger twin is not the model), else neither does (``errors`` None). One twin that no
    estimate confirms keeps its figures, with the outputs it cannot prove in ``unproven``."""
    from ..verdict.tolerances import REORDERED_SUPPORTS, TWINS_AGREE_WITHIN

    method, first = estimates[0]
    need = _needing_proof(first, reference)
    label = method_name(method)
    if not need or (len(estimates) == 1 and reordered is None):
        return Floor(first, method, None, 0.0)
    if len(estimates) == 2:
        other_method, other = estimates[1]
        other_label = method_name(other_method)
        disagree = [p for p in need if other.get(p) is None or not (
            first[p] / TWINS_AGREE_WITHIN <= other[p] <= first[p] * TWINS_AGREE_WITHIN)]
        if not disagree:
            return Floor(first, method, f"confirmed by the {other_label}, which measured "
                                        f"{_figures(other, need)} of scale", 0.0)
        if not _needing_proof(other, reference):
            return Floor(other, other_method, f"{label}: rejected, it measured {_figures(first, disagree)} of scale "
                                              f"where the {other_label} measured {_figures(other, disagree)}, more "
                                              "than rounding can explain (a layer whose state it lost?)", 0.0)
        return Floor(None, None, f"the {label} measured {_figures(first, disagree)} of scale and the {other_label} "
                                 f"{_figures(other, disagree)}: they disagree, so neither is proof of the model's own "
                                 "float32 error, and either bound would be looser than the fixed rule", 0.0)
    errors, why_none = reordered if reordered is not None else (None, None)
    if errors is None:
        return Floor(first, method, f"no second estimate confirms {_figures(first, need)} of scale: the reordered "
                                    f"float32 twin could not measure ({why_none})", 0.0, unproven=tuple(need))
    unproven = [p for p in need if errors.get(p) is None or errors[p] < first[p] / REORDERED_SUPPORTS]
    if not unproven:
        return Floor(first, method, f"confirmed by the reordered float32 twin, which measured "
                                    f"{_figures(errors, need)} of scale", 0.0)
    return Floor(first, method, f"the reordered float32 twin measured {_figures(errors, unproven)} of scale, under "
                                f"1/{REORDERED_SUPPORTS:g} of the {_figures(first, unproven)} the {label} measured, "
                                "so nothing confirms that figure", 0.0, unproven=tuple(unproven))


def _figures(errors: Mapping[str, float], paths: list[str]) -> str:
    values = [errors[p] for p in paths if errors.get(p) is not None]
    if not values:
        return "nothing"
    low, high = min(values), max(values)
    return f"{high:.1e}" if low == high else f"{low:.1e} to {high:.1e}"


def _paired(reference: Mapping[str, np.ndarray], twin: Mapping[str, np.ndarray]) -> list[tuple[str, Any]]:
    """(reference path, the twin's array) by path, or by position where a raw model's list/tensor
    output meets the runner's names; [] when they cannot be paired."""
    if set(twin) >= set(reference):
        return [(p, twin[p]) for p in reference]
    if len(twin) == len(reference):
        return list(zip(reference, twin.values()))
    return []


def _errors(reference: Mapping[str, np.ndarray], twin: Mapping[str, np.ndarray]) -> dict[str, float | None]:
    return {p: relative_error(reference[p], arr) for p, arr in _paired(reference, twin)}


def _noise_statistics(reference: Mapping[str, np.ndarray], twin: Mapping[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Per float output: the distribution of ref - twin (``verdict.bulk.error_statistics``, shares
    of max |twin|), paired as ``_errors`` pairs them."""
    from ..verdict.bulk import error_statistics

    found = {}
    for path, shadow in _paired(reference, twin):
        ref, sh = np.asarray(reference[path]), np.asarray(shadow)
        if ref.shape != sh.shape or ref.dtype.kind != "f" or sh.dtype.kind not in "fc":
            continue
        r, t = ref.astype(np.float64), sh.astype(np.float64)
        finite = np.isfinite(r) & np.isfinite(t)
        if not finite.any():
            continue
        scale = float(np.max(np.abs(t[finite])))
        if scale > 0:
            found[path] = {k: v for k, v in error_statistics(r[finite] - t[finite], scale).items() if k != "max"}
    return found


def _unfaithful(twin: Twin, kind: str, errors: Mapping[str, float],
                reference: Mapping[str, np.ndarray]) -> str | None:
    worst = max(errors.values(), default=0.0)
    if kind != FLOAT64:  # float16 weights are meant to differ: what they cost is the measure
        return None
    if worst > MAX_FAITHFUL:
        return (f"it differs from the model by {worst:.2g} of scale, more than rounding can explain "
                "(a layer whose state is not in its weights?)")
    elements = sum(int(np.size(reference[p])) for p in errors)
    if twin.accumulates and errors and worst == 0.0 and elements >= 8:
        return ("it equals the float32 model bitwise on every output although the model sums products: "
                "part of it stayed float32, so it is not faithful")
    return None


def outputs_of(twin: Twin, inputs: Any) -> Any:
    """``twin.model(inputs)``, once per distinct batch (shared by every format)."""
    key = (id(twin.model), batch_digest(inputs))
    if key in _OUTPUTS:
        _OUTPUTS.move_to_end(key)
        return _OUTPUTS[key]
    value = twin.model(inputs)
    _OUTPUTS[key] = value
    while len(_OUTPUTS) > _OUTPUTS_KEPT:
        _OUTPUTS.popitem(last=False)
    return value


def batch_digest(inputs: Any) -> str:
    """A digest of a batch's structure, dtypes, shapes and bytes."""
    h = hashlib.blake2b(digest_size=16)

    def add(node: Any, path: str) -> None:
        if isinstance(node, Mapping):
            for k in sorted(node, key=str):
                add(node[k], f"{path}[{k!r}]")
        elif isinstance(node, (list, tuple)) and node and all(hasattr(v, "shape") for v in node):
            for i, v in enumerate(node):
                add(v, f"{path}[{i}]")
        else:
            arr = np.ascontiguousarray(np.asarray(node))
            h.update(f"{path}|{arr.dtype.str}|{arr.shape}|".encode())
            if arr.dtype.kind == "O":
                h.update(repr(arr.tolist()).encode())
            else:
                h.update(arr.tobytes())

    add(inputs, "")
    return h.hexdigest()


def relative_error(ref: np.ndarray, shadow: np.ndarray) -> float | None:
    """max |ref - shadow| / max |shadow| over finite elements (None: not a float pair)."""
    ref, shadow = np.asarray(ref), np.asarray(shadow)
    if ref.shape != shadow.shape or ref.dtype.kind not in "fc" or shadow.dtype.kind not in "fc":
        return None
    r, s = ref.astype(np.float64), shadow.astype(np.float64)
    finite = np.isfinite(r) & np.isfinite(s)
    if not finite.any():
        return None
    scale = float(np.max(np.abs(s[finite])))
    if scale == 0.0:
        return 0.0
    return float(np.max(np.abs(r[finite] - s[finite]))) / scale


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def from_session(model: Any, inputs: Any, paths: list[str], meta: dict[str, Any], *, run: Callable[[Any, Any], Any],
                 paths_of: Callable[[Any], list[str]], name: Callable[[Any], str],
                 measure: Callable[[Any, Any, list[str], dict], dict | None]) -> dict | None:
    """The floor of a candidate with no TensorFlow graph (ONNX, TFLite, TFJS) from a session
    that has a reference (the plugin's fixtures attach ``floor_reference``): the reference's
    own float32 error on the same rows (``measure``), when its outputs have the candidate's
    ``paths`` (by name, in any order); what it measured goes into ``meta`` (``floor_from`` names the reference)."""
    get = getattr(model, "floor_reference", None)
    if not callable(get):
        return None
    try:
        ref = get()
        ref_out = run(ref, inputs)
    except Exception:  # noqa: BLE001 - the floor is extra evidence; without it the fixed rule stands
        return None
    ref_paths = paths_of(ref_out)
    # the same outputs, matched by name: a bound candidate answers in its own form's order (a
    # TFLite file's), and floors paired by position would swap two heads of one shape (issue 36)
    if ref is model or sorted(ref_paths) != sorted(paths):
        return None
    found: dict[str, Any] = {}
    floors = measure(ref, ref_out, ref_paths, found)
    if floors is None:
        return None
    meta.pop("noise_floor_missing", None)
    meta.update(found)
    meta["floor_from"] = f"the session's reference ({name(ref)})"
    return floors


def sourced(tol_fn: Callable[..., Any], note: str) -> Callable[[Any, str], Any]:
    """``tol_fn`` whose floor-measured tolerances add ``note`` to their source."""
    def for_output(dtype: Any, path: str) -> Any:
        tol = tol_fn(dtype, path)
        return tol.with_source(f"{tol.source}; {note}") if "float64 run" in tol.source else tol
    return for_output
