"""Why two results differ, and where they start to differ.

CONTRACT (checks/assertions.py calls these; each returns a list of ``Hint``, empty when no check
applies; none may raise):

    diagnose_comparison(report, *, actual, expected, actual_model=None, expected_model=None,
                        inputs=None) -> list[Hint]
    diagnose_nondeterminism(report, *, model, inputs, runs) -> list[Hint]
    diagnose_batch_variance(report, *, model, inputs, batched, split) -> list[Hint]
    localize_divergence(reference, candidate, inputs) -> list[LayerDiff]

Every hint carries the measurement behind it; a check that does not apply, or fails, stays
silent. Cheap checks (noise, output transforms) run on arrays; the heavy ones (re-runs,
input transforms, layer-by-layer localisation) only when both models and inputs are given.
Nothing here imports TensorFlow at import time.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..verdict import tree
from ._util import (batch_size, fit_inputs, fits, measuring, flatten, is_keras_model, max_abs_diff, native_of, pick,
                    rows, run_model)
from .calibration import calibration_range_factor, default_rows_hint, outside_calibration
from .converter import converter_defect
from .localize import DIVERGE_REL, MAX_ROWS as LOCALIZE_ROWS, LayerDiff, first_divergence, format_rows, localize_divergence
from .quantization import cost_hint, float16_weights_hint
from .outputs import output_swap
from .config import configuration_hint
from .converted_weights import converted_weight_change
from .preprocessing import (CONVOLUTIONS, fused_normalization_read_back, normalization_read_back, preprocessing_hint,
                            preprocessing_layers)
from .noise import accumulation_noise, noise_hint, reduction_length
from .random_ops import RandomOp, describe_ops, find_random_ops
from .inputs import input_transform
from .transforms import output_transform
from .weights import weight_hint_parts, weights_of

__all__ = ["Hint", "LayerDiff", "RandomOp", "diagnose_batch_variance", "diagnose_comparison",
           "diagnose_nondeterminism", "diagnose_quantization", "find_random_ops", "fit_inputs", "format_rows", "localize_divergence"]


@dataclass(frozen=True)
class Hint:
    cause: str      # short machine-readable name, e.g. "random_ops", "double_softmax"
    message: str    # one line for the "Likely cause" section
    evidence: str   # what was measured that supports it

    def __str__(self) -> str:
        return f"{self.message} [{self.cause}]\n    evidence: {self.evidence}"


def _safe(hints: list[Hint], check: Callable[[], Any]) -> Any:
    """Run one check; a check that fails is dropped, never raised into the assertion."""
    try:
        return check()
    except Exception:  # noqa: BLE001 - diagnosis must never mask the real failure
        return None


def _failed(report: Any) -> list[Any]:
    outs = getattr(report, "outputs", None) or []
    return [o for o in outs if not getattr(o, "passed", True) and not getattr(o, "problem", None)]


def _shape_problems(report: Any) -> bool:
    shapes = [(getattr(o, "actual_shape", None), getattr(o, "expected_shape", None))
              for o in getattr(report, "outputs", None) or []]
    return any(a is not None and e is not None and a != e for a, e in shapes)


def _hint(parts: tuple[str, str, str], prefix: str = "") -> Hint:
    cause, message, evidence = parts
    return Hint(cause, f"{prefix}{message}", evidence)


def _n_terms(*models: Any) -> int | None:
    for m in models:
        if m is None:
            continue
        n = _safe([], lambda: reduction_length(weights_of(m)))  # called at once: no late binding
        if n:
            return n
    return None


def _label(path: str, many: bool) -> str:
    return f"output {path}: " if many and path else ""


# -- assert_outputs_close ----------------------------------------------------------------

def diagnose_comparison(report: Any, *, actual: Any = None, expected: Any = None, actual_model: Any = None,
                        expected_model: Any = None, inputs: Any = None, **_: Any) -> list[Hint]:
    """Hints for a failed actual-vs-expected comparison (actual = candidate, expected = reference)."""
    try:
        with measuring():  # each full-array measurement once per diagnosis
            return _diagnose_comparison(report, actual, expected, actual_model, expected_model, inputs)
    except Exception:  # noqa: BLE001
        return []


def _diagnose_comparison(report: Any, actual: Any, expected: Any, cand_model: Any, ref_model: Any,
                         inputs: Any) -> list[Hint]:
    failed = _failed(report)
    if not failed and cand_model is not None and _shape_problems(report):
        # No values to compare where a shape differs, but an op the candidate's runtime is known
        # to run wrong says why (tfjs's negative Cumsum axis returns a batch of 0 rows).
        d = _safe([], lambda: converter_defect(cand_model))
        return [_hint(d)] if d is not None else []
    if not failed or actual is None or expected is None:
        return []
    flat_a, flat_e = flatten(actual), flatten(expected)
    pairs: list[tuple[Any, np.ndarray, np.ndarray]] = []
    for o in failed:
        picked_a, picked_e = pick(flat_a, o.path), pick(flat_e, o.path)
        if picked_a is not None and picked_e is not None and np.shape(picked_a) == np.shape(picked_e):
            pairs.append((o, picked_a, picked_e))
    many = len(report.outputs) > 1
    hints: list[Hint] = []
    both = cand_model is not None and ref_model is not None and inputs is not None
    # A recorded run (formats/recorded/) answers only its recorded inputs: the checks that run
    # the reference alone still run; those that rerun the candidate are skipped, and said so.
    replay = both and bool(getattr(cand_model, "replays_recording", False))
    both, ref_runs = both and not replay, both

    # 0. A quantised candidate fed inputs outside its calibration range (clipped there), or
    # calibrated on inputs scaled unlike these: that explains the drift, so no layer is blamed.
    calibration = False
    if cand_model is not None and inputs is not None:
        for check in (outside_calibration, calibration_range_factor):
            c = _safe(hints, lambda: check(cand_model, inputs))
            if c is not None:
                hints.append(_hint(c))
                calibration = True
    # 0b. A candidate whose graph holds an op its converter is known to run wrong.
    if cand_model is not None:
        d = _safe(hints, lambda: converter_defect(cand_model))
        if d is not None:
            hints.append(_hint(d))

    # 0c. Outputs exchanged: named before any weight or layer hint, which a swap would mislead
    # (the weights agree; the layer table finds the last layer "different").
    swap = _safe(hints, lambda: output_swap(flat_a, flat_e, [o.path for o, _, _ in pairs],
                                            {o.path: o.tolerance for o, _, _ in pairs}))
    if swap is not None and len(pairs) == len(failed):
        return [_hint(swap)] + hints

    # 1. Accumulation noise: when every failure is noise-sized, that is the whole story. Only
    # under a tolerance the user set: a default (built-in or float64-shadow) bound already
    # allows the model's float noise, so a failure beyond it is not noise, and a FAILED
    # verdict above a "not a conversion error" hint would contradict itself.
    n_terms = _n_terms(ref_model, cand_model)
    noise = []
    for o, a, e in pairs:
        if getattr(o.tolerance, "default", False):
            continue
        h = _safe(hints, lambda: noise_hint(o.path, a, e, n_terms=n_terms, reference=ref_model, inputs=inputs))
        if h is not None:
            noise.append(_hint(h, _label(o.path, many)))
    if pairs and len(noise) == len(pairs):
        return hints + noise

    # The heavy checks re-run the models: a few rows are enough to see a cause.
    full_inputs = inputs  # batch statistics (training mode) need the batch the outputs came from
    if ref_runs:
        inputs, actual, flat_a, flat_e = _few_rows(inputs, actual, flat_a, flat_e)

    budget = Budget()
    # 2. Nondeterminism of either form (random ops, training mode).
    nondeterministic = False
    if both and budget.allows("reruns for nondeterminism"):
        with budget.timing_runs(4):  # two runs of each form
            found = _safe(hints, lambda: _nondeterminism_hints(cand_model, ref_model, inputs))
        if found:
            hints += found
            nondeterministic = True

    # 3. Preprocessing state (Normalization statistics, boundaries, vocabularies), then weights;
    # a differing preprocessing state explains the output, so the later checks stay silent.
    preprocessing = False
    if cand_model is not None and ref_model is not None:
        p = _safe(hints, lambda: preprocessing_hint(ref_model, cand_model))
        if p is not None:
            hints.append(_hint(p))
            preprocessing = True
        skip = _safe(hints, lambda: preprocessing_layers(ref_model)) or set() if preprocessing else set()
        w = _safe(hints, lambda: weight_hint_parts(ref_model, cand_model, ignore=skip))
        if w is not None:
            hints.append(_hint(w))
    # 3b. A converted file (TFLite, ONNX) against a graph reference: a kernel found in the file
    # changed, confirmed by a run of the reference with it (its constants are laid out and folded
    # otherwise, so the comparison by name above cannot see it; the layer table pairs a converted
    # graph's tensors by name, and on a trained audio model paired one head's conv with another's).
    converted = None
    if both and w is None and not preprocessing and not nondeterministic:
        failing: list[tuple[str, np.ndarray, np.ndarray, Any]] = []
        for o, _, _ in pairs:
            few_a, few_e = pick(flat_a, o.path), pick(flat_e, o.path)
            if few_a is None or few_e is None:
                failing = []  # every failing output is reproduced, or nothing is claimed
                break
            failing.append((o.path, few_a, few_e, o.tolerance))
        converted = _safe(hints, lambda: converted_weight_change(
            ref_model, cand_model, inputs, failing, lambda: budget.allows("converted weights", runs=1)))
        if converted is not None:
            hints.append(_hint(converted))
    weights_agree = w is None and all(_safe(hints, lambda: weights_of(m)) for m in (ref_model, cand_model)) \
        if cand_model is not None and ref_model is not None else False
    # the checks below would only blur the cause (a converted weight is confirmed by a rerun)
    explained = nondeterministic or preprocessing or calibration or converted is not None

    # 4. Input transforms (both models), then output transforms (arrays only).
    input_found = False
    if ref_runs and not explained and budget.allows("input transforms", runs=12):
        tols = {o.path: o.tolerance for o, _, _ in pairs}
        h = _safe(hints, lambda: input_transform(ref_model, inputs, actual, [o.path for o, _, _ in pairs], tols))
        if h is not None:
            hints.append(_hint(h))
            input_found = True
    output_found = False
    if not input_found and not preprocessing and not calibration:
        for o, a, e in pairs:
            h = _safe(hints, lambda: output_transform(a, e, o.tolerance))
            if h is not None:
                hints.append(_hint(h, _label(o.path, many)))
                output_found = True

    # 5. Training mode of a deterministic candidate against a Keras reference.
    training = False
    if ref_runs and not explained and not input_found and not output_found \
            and budget.allows("training-mode rerun", runs=1):
        h = _safe(hints, lambda: _training_mode_match(ref_model, full_inputs, pairs))
        if h is not None:
            hints.append(h)
            training = True

    # 5b. Weights agree and nothing above explains it: the configuration (an epsilon, a layer
    # only one form has) is compared instead of blaming a layer for what its config does.
    if weights_agree and not explained and not input_found and not output_found and not training:
        c = _safe(hints, lambda: configuration_hint(ref_model, cand_model))
        if c is not None:
            cause, message, evidence = c
            hints.append(Hint(cause, message, "the weights agree tensor for tensor; " + evidence))
            explained = True

    # 6. Where the forms start to differ (when nothing above explains the whole output). A
    # layer "diverges" above the noise the failing outputs were allowed (their default bound,
    # a multiple of the model's own float error): ResNet50's correct ONNX form drifts 1.2e-4.
    if both and not explained and not input_found and not output_found and not training \
            and budget.allows("layer table (first divergent layer)", runs=LOCALIZE_RUNS):
        # A TFLite file's layer table runs without XNNPACK, whose kernels round a log-magnitude
        # net's filter bank apart by its float64 error: there the float64 floor's bound, where
        # the sharper one judged (else re_lu after the log is blamed for a late kernel's 1%).
        plain = str(getattr(cand_model, "format", "") or "").startswith("tflite")
        rel = max([DIVERGE_REL] + [(getattr(o.tolerance, "float64_scale", None) if plain else None) or o.tolerance.scale
                                   for o, _, _ in pairs if getattr(o.tolerance, "default", False)])
        h = _safe(hints, lambda: _localize_hint(ref_model, cand_model, inputs, rel))
        if h is not None and weights_agree and h.cause == "first_divergent_layer":
            # then the cause is what the layer does, not what it holds
            h = Hint(h.cause, h.message + "; the weights agree, so look at its configuration (an epsilon, a layout, "
                     "a layer missing or added)", h.evidence)
        if h is not None:
            hints.append(h)
    skipped = budget.skipped_hint()
    if skipped is not None:
        hints.append(skipped)
    if replay:
        hints.append(Hint("recorded_candidate", "not run: the checks that rerun the candidate (nondeterminism "
                          "reruns, the layer table of where the forms first differ), since it is a recorded run",
                          f"{getattr(cand_model, 'describe', lambda: 'a recording')()} answers only the inputs it "
                          "recorded; record it again with the cause fixed, or compare the form itself"))
    return [h for h in hints if h is not None] + [h for h in noise if h is not None]


HEAVY_ROWS = 8
# ...and fewer where each row is large: at most this many input elements (2 rows at least), so
# a 224 px image net reruns on 2 rows, not 8 (each of its reruns is compute, 0.3 s a call for
# MobileNetV2: the conversion part of a failing quantised test took 8.9 s); 64 px keeps 8.
HEAVY_ELEMENTS = 1 << 18
# Seconds the model-running checks (reruns, input transforms, the layer table) may take
# together for one failure; a check predicted to overrun is skipped and the report says so.
MODEL_CHECKS_BUDGET_S = 20.0
# The layer table costs about this many model runs (both forms, intermediates exposed).
LOCALIZE_RUNS = 6


class Budget:
    """Time left for the model-running checks of one diagnosis.

    A check runs when the time spent so far plus its predicted cost (its number of model
    runs times the measured time of one run, once the reruns have measured it) fits in
    ``MODEL_CHECKS_BUDGET_S``; otherwise it is skipped and named in a ``diagnosis_budget`` hint.
    """

    def __init__(self, seconds: float | None = None) -> None:
        self.seconds = MODEL_CHECKS_BUDGET_S if seconds is None else seconds
        self.start = time.perf_counter()
        self.per_run: float | None = None
        self.skipped: list[str] = []

    def spent(self) -> float:
        return time.perf_counter() - self.start

    def allows(self, check: str, runs: int = 0) -> bool:
        predicted = runs * (self.per_run or 0.0)
        if self.spent() + predicted <= self.seconds:
            return True
        self.skipped.append(check)
        return False

    @contextlib.contextmanager
    def timing_runs(self, runs: int) -> Iterator[None]:
        """Measure a block of ``runs`` model runs: one run's time predicts the later checks."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.per_run = (time.perf_counter() - t0) / max(runs, 1)

    def skipped_hint(self) -> Hint | None:
        if not self.skipped:
            return None
        per = f"; one model run took {self.per_run:.2g} s" if self.per_run else ""
        return Hint("diagnosis_budget", f"not run, to keep the failure fast: {', '.join(self.skipped)}",
                    f"the model-running checks may take {self.seconds:g} s per failure; {self.spent():.1f} s "
                    f"spent{per}")


def _few_rows(inputs: Any, actual: Any, flat_a: dict, flat_e: dict) -> tuple:
    """The first HEAVY_ROWS rows of the inputs and outputs (fewer for large rows:
    ``HEAVY_ELEMENTS``), when every output is batch-major."""
    n = batch_size(inputs)
    per_row = sum(int(np.size(v)) for v in flatten(inputs).values()) // n if n else 0
    keep = max(2, min(HEAVY_ROWS, HEAVY_ELEMENTS // per_row)) if per_row else HEAVY_ROWS
    if not n or n <= keep:
        return inputs, actual, flat_a, flat_e
    if not all(np.ndim(v) >= 1 and np.shape(v)[0] == n for v in (*flat_a.values(), *flat_e.values())):
        return inputs, actual, flat_a, flat_e
    cut = slice(0, keep)
    small_a = {p: v[cut] for p, v in flat_a.items()}
    return rows(inputs, cut), _unflatten_like(actual, small_a), small_a, {p: v[cut] for p, v in flat_e.items()}


def _unflatten_like(outputs: Any, flat: dict[str, np.ndarray]) -> Any:
    """``flat`` (paths of ``flatten(outputs)``) as a ``tree.FlatTree``; a bare array stays bare."""
    return flat[""] if list(flat) == [""] else tree.FlatTree(flat)


def _rerun_gap(model: Any, inputs: Any) -> float:
    """Max difference between two runs of ``model`` on the same batch (same batch size, so
    batch-size drift cannot pose as nondeterminism)."""
    first = flatten(run_model(model, inputs))
    again = flatten(run_model(model, inputs))
    gap = 0.0
    for path, arr in first.items():
        other = pick(again, path)
        if other is not None and np.shape(other) == np.shape(arr):
            gap = max(gap, max_abs_diff(arr, other))
    return gap


def _nondeterminism_hints(cand: Any, ref: Any, inputs: Any) -> list[Hint]:
    hints = []
    gaps = {}
    for role, model in (("candidate", cand), ("reference", ref)):
        gaps[role] = _rerun_gap(model, inputs)
    for role, model in (("candidate", cand), ("reference", ref)):
        gap = gaps[role]
        if gap == 0:
            continue
        ops, bn = _safe([], partial(find_random_ops, model)) or ([], [])
        evidence = f"two runs of the {role} on the same inputs differ by up to {gap:.3g}"
        if ops:
            hints.append(Hint("random_ops", f"the {role} is nondeterministic; its graph draws random numbers at "
                              f"{describe_ops(ops)}", evidence + f"; {len(ops)} random op(s) in its graph"))
        other = "reference" if role == "candidate" else "candidate"
        if gaps[other] == 0:
            drop = [o for o in ops if "dropout" in o.name.lower()]
            where = f" (dropout ops: {describe_ops(drop)})" if drop else ""
            hints.append(Hint("training_mode", f"dropout/batch-norm may run in training mode in the {role} form{where}",
                              evidence + f", while the {other} repeats bitwise"))
        elif not ops:
            hints.append(Hint("nondeterministic", f"the {role} is nondeterministic", evidence))
    return hints


def _training_mode_match(ref: Any, inputs: Any, pairs: list) -> Hint | None:
    """actual ≈ reference(x, training=True) on a Keras reference (batch-norm batch statistics)."""
    native = native_of(ref)
    if not is_keras_model(native):
        return None
    saved = [v.numpy() for v in native.variables]
    try:
        train = flatten(run_model(native, inputs, training=True))
    finally:
        for v, s in zip(native.variables, saved):
            v.assign(s)
    evid = []
    for o, a, e in pairs:
        t = pick(train, o.path)
        if t is None:
            return None
        err = max_abs_diff(a, e)
        ok, resid = fits(a, t, err, o.tolerance)
        if not ok:
            return None
        evid.append(f"max |actual - reference(training=True)| = {resid:.3g}, against {err:.3g} for training=False")
    return Hint("training_mode", "the candidate runs in training mode (batch-norm uses batch statistics, "
                "dropout on): export the model with training=False", "; ".join(evid))


def _localize_hint(ref: Any, cand: Any, inputs: Any, rel: float = DIVERGE_REL) -> Hint | None:
    diffs = localize_divergence(ref, cand, inputs, rel=rel)
    got = first_divergence(diffs)
    if got is None:
        return None
    row, before = got
    if row.op == "Normalization" and row.value is not None:  # its statistics, read back from the candidate
        read = _safe([], lambda: normalization_read_back(ref, row.layer, rows(inputs, slice(0, LOCALIZE_ROWS)),
                                                        row.value))
        if read is not None:
            cause, message, evidence = read
            return Hint(cause, message, evidence + "\n" + format_rows(diffs))
    if row.op in ("Dense", *CONVOLUTIONS) and row.value is not None:  # a Normalization folded into it: read back
        folded = [r.layer for r in diffs if r.layer in row.inputs and r.op == "Normalization" and r.max_abs is None]
        for norm in folded:
            read = _safe([], lambda: fused_normalization_read_back(ref, norm, row.layer,
                                                                   rows(inputs, slice(0, LOCALIZE_ROWS)), row.value))
            if read is not None:
                cause, message, evidence = read
                return Hint(cause, message, evidence + "\n" + format_rows(diffs))
    fused: list[str] = []
    if row.inputs:  # each input the reference's graph names, as the table found it
        by_layer = {d.layer: d for d in diffs}
        said = []
        for name in row.inputs:
            d = by_layer.get(name)
            if d is not None and d.max_abs is not None and not d.diverged:
                said.append(f"`{name}` agrees (max abs {d.max_abs:.3g})")
            elif d is not None and d.note.startswith("fused into"):
                said.append(f"`{name}` is fused into it in the candidate")
                fused.append(name)
            else:
                said.append(f"`{name}` could not be compared")
        inputs_note = ("its input " if len(said) == 1 else "its inputs: ") + ", ".join(said)
    elif before is not None:
        inputs_note = f"its input `{before.layer}` agrees (max abs {before.max_abs:.3g})"
    else:
        inputs_note = "it is the first layer"
    cand = f" (candidate {row.candidate_op} `{row.candidate}`)" if row.candidate else ""
    with_fused = (f", or in {', '.join(f'`{n}`' for n in fused)} fused into it in the candidate" if fused else "")
    if row.permuted:  # named before the layer: the permutation is the cause, the layer only shows it
        with_fused += (f", right after a transpose only the candidate runs (`{row.permuted}`): an extra axis "
                       "permutation (a channels-first/channels-last slip)")
    return Hint("first_divergent_layer",
                f"the forms start to differ at layer `{row.layer}` ({row.op}){with_fused}{cand}",
                f"max abs {row.max_abs:.3g} (rel {row.max_rel:.3g}) there while {inputs_note}\n" + format_rows(diffs))


# -- a quantised candidate judged against its float32 sibling ---------------------------

def diagnose_quantization(report: Any, *, candidate: Any, sibling: Any, inputs: Any, variant: str,
                          twin: Any = None) -> list[Hint]:
    """Hints for a failed quantisation part (``quantized.two_part_report``): inputs outside
    the file's calibration range, a calibration on default rows, a float16 file whose weights
    are not its sibling's (against ``twin``), the costliest layers."""
    failed = (getattr(report, "meta", {}).get("quantized") or {}).get("failed_parts") or []
    if not any(part != "conversion" for part in failed):
        return []
    hints: list[Hint] = []
    checks = [lambda: outside_calibration(candidate, inputs), lambda: calibration_range_factor(candidate, inputs),
              lambda: default_rows_hint(candidate)]
    if twin is not None and "float16 weights" in failed:
        checks.append(lambda: float16_weights_hint(candidate, twin, inputs))
    if "quantisation" in failed:
        checks.append(lambda: cost_hint(candidate, sibling, inputs, variant))
    for check in checks:
        found = _safe(hints, check)
        if found is not None:
            hints.append(_hint(found))
    return hints


# -- assert_deterministic ----------------------------------------------------------------

def diagnose_nondeterminism(report: Any, *, model: Any = None, inputs: Any = None,
                            runs: int | Sequence[Any] = 3, **_: Any) -> list[Hint]:
    """Hints for outputs that differ between runs of one model (``runs``: how many, or the
    outputs of each run, as assert_deterministic passes them)."""
    try:
        with measuring():  # each full-array measurement once per diagnosis
            return _diagnose_nondeterminism(report, model, inputs, runs)
    except Exception:  # noqa: BLE001
        return []


def _diagnose_nondeterminism(report: Any, model: Any, inputs: Any, runs: int | Sequence[Any]) -> list[Hint]:
    if model is None:
        return []
    if not isinstance(runs, int):  # assertions pass the list of outputs, one per run
        runs = len(runs)
    failed = _failed(report)
    worst = max((o.max_abs or 0.0 for o in failed), default=0.0)
    measured = f"outputs differ by up to {worst:.3g} across {runs} runs" if worst else f"outputs differ across {runs} runs"
    hints: list[Hint] = []
    ops, bn = _safe(hints, lambda: find_random_ops(model)) or ([], [])
    if ops:
        hints.append(Hint("random_ops", f"{runs} runs differ; the graph draws random numbers at {describe_ops(ops)}",
                          f"{measured}; {len(ops)} random op(s) in the graph: " + describe_ops(ops, limit=10)))
        drop = [o for o in ops if "dropout" in o.name.lower()]
        if drop:
            hints.append(Hint("training_mode", "dropout runs in training mode in this form: export/freeze the "
                              "inference graph (training=False, keep_prob=1 removed)",
                              f"random op(s) inside dropout: {describe_ops(drop)}"))
    elif getattr(model, "device", "cpu") == "gpu":
        hints.append(Hint("gpu_nondeterminism", "no random op in the graph: GPU kernels that accumulate with atomics "
                          "reorder sums run to run; call tf.config.experimental.enable_op_determinism()",
                          f"{measured} on device 'gpu' with no random op in the graph"))
    return hints


# -- assert_batch_invariant --------------------------------------------------------------

def diagnose_batch_variance(report: Any, *, model: Any = None, inputs: Any = None, batched: Any = None,
                            split: Any = None, **_: Any) -> list[Hint]:
    """Hints for outputs that change with the batch size."""
    try:
        with measuring():  # each full-array measurement once per diagnosis
            return _diagnose_batch_variance(report, model, inputs, batched, split)
    except Exception:  # noqa: BLE001
        return []


def _diagnose_batch_variance(report: Any, model: Any, inputs: Any, batched: Any, split: Any) -> list[Hint]:
    failed = _failed(report)
    if not failed or batched is None or split is None:
        return []
    if isinstance(split, dict) and split and all(isinstance(k, int) for k in split):
        # assertions pass {sub-batch size: concatenated outputs}; rebuild the compared trees
        if len(split) == 1:
            split = next(iter(split.values()))
        else:
            batched = {f"sub-batches of {k}": batched for k in split}
            split = {f"sub-batches of {k}": v for k, v in split.items()}
    flat_b, flat_s = flatten(batched), flatten(split)
    many = len(report.outputs) > 1
    n_terms = _n_terms(model)
    hints: list[Hint] = []
    large = False
    for o in failed:
        b, s = pick(flat_b, o.path), pick(flat_s, o.path)
        if b is None or s is None or np.shape(b) != np.shape(s):
            continue
        h = None
        if not getattr(o.tolerance, "default", False):  # see _diagnose_comparison step 1
            h = _safe(hints, lambda: accumulation_noise(s, b, n_terms))
        if h is not None:
            hints.append(_hint(h, _label(o.path, many)))
        else:
            large = True
    if large and model is not None and inputs is not None:
        gap = _safe(hints, lambda: _rerun_gap(model, inputs))
        ops, bn = _safe(hints, lambda: find_random_ops(model)) or ([], [])
        if gap and ops:
            hints.append(Hint("random_ops", f"the model is nondeterministic; its graph draws random numbers at "
                              f"{describe_ops(ops)}", f"two runs of the same batch differ by up to {gap:.3g}"))
        elif gap == 0 and bn:
            named = all(o.op.startswith("FusedBatchNorm") or re.search(r"moments|norm|bn", o.name, re.I) for o in bn)
            what = ("batch-norm runs in training mode" if named
                    else "the graph reduces over the batch axis (batch-norm in training mode?)")
            hints.append(Hint("training_mode", f"{what}: each row's output depends on the other rows through the "
                              "batch statistics; export/freeze the model with training=False",
                              f"the same batch repeats bitwise, yet rows change with the batch; "
                              f"batch statistics at {describe_ops(bn)}"))
    return hints
