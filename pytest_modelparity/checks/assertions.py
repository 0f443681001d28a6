"""The three assertions: outputs close, deterministic, batch invariant.

Each takes arrays (or nested dicts/lists of them) or models — any callable taking a batch:
a Keras model, a ``tf.function``, a ``LoadedModel``, a plain function — runs what must be
run, compares with ``compare.compare`` under the tolerance resolved by ``tolerances``,
hands the report to ``recording.emit`` (pass or fail) and on failure asks ``diagnose`` why
and raises ``ParityError``. Nothing here imports TensorFlow or pytest.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from .. import diagnose
from . import float16_textures, observers, power, quant_rows, quantized
from ..floor import measure as floor
from ..runtime import progress
from .batches import (batch_length as _batch_length, check_rows as _check_rows, concat as _concat, leaves as _leaves,
                      max_abs_tree as _max_abs_tree, reverse as _reverse, reverse_tree as _reverse_tree,
                      slice_rows as _slice, slice_tree as _slice_tree, to_numpy as _to_numpy,
                      to_numpy_pair as _to_numpy_pair)
from .alignment import align_structures, bound_to_expected, is_loaded_model, recorded_inputs
from ..exports import floor_cache
from ..reports import recording
from ..verdict import validators
from ..verdict import tolerances as tol_mod
from ..verdict.compare import ComparisonReport, compare
from ..errors import BatchMismatchError, InvalidArgumentError, NotApplicable, ParityError
from ..verdict.tolerances import Tolerance

__all__ = ["assert_outputs_close", "assert_deterministic", "assert_batch_invariant"]

# Calibrated mode: the candidate may be this many times the reference's own float noise...
CALIBRATED_MULTIPLE = 8.0
# ...and the noise floor is taken as at least this many epsilons of the output dtype, so a
# reference that happens to be bitwise batch-invariant (TFLite, onnxruntime) does not make
# every other implementation's rounding a failure.
CALIBRATED_MIN_FLOOR_EPS = 8.0
# tolerance="calibrated": rows of the batch run one at a time to measure the reference's
# drift (one call each). Not the int8 calibration rows of plugin/variants.INT8_CALIBRATION_ROWS.
CALIBRATED_SINGLE_ROWS = 64


# --------------------------------------------------------------------------------------
# Public assertions
# --------------------------------------------------------------------------------------

def assert_outputs_close(actual: Any, expected: Any, *, inputs: Any = None, rtol: float | None = None,
                         atol: float | None = None, equal_nan: bool = False, msg: str | None = None,
                         tolerance: Tolerance | str | None = None, allow_vacuous: bool = False,
                         bind: Mapping[str, Mapping[str, str]] | None = None) -> ComparisonReport:
    """Assert ``actual`` matches ``expected`` (arrays, nested outputs, or models run on ``inputs``).

    Tolerance: explicit ``rtol``/``atol`` (plain per-element rule) > marker > ini > the
    default. The default against a Keras reference is a multiple of the model's own float32
    error on ``inputs``, measured by running its float64 twin (``floor/measure.py``); otherwise the
    built-in scale-aware rule for the output dtype, device and format. ``tolerance=`` a
    ``Tolerance`` uses it as given; ``tolerance="calibrated"`` measures the reference
    (``expected``, which must then be a model) against its own batch-order drift and allows
    the candidate ``CALIBRATED_MULTIPLE`` times that noise. A comparison whose allowed
    difference reaches an output's own magnitude cannot fail and is reported as vacuous
    (a failure) unless ``allow_vacuous=True``.

    Two models are paired tensor by tensor (``formats/binding.py``): ``inputs`` keyed by
    ``expected``'s input names, or a list in its input order, feeds both; outputs are matched by
    name, converter naming, the export record, shape and dtype, then values, never by bare
    position. ``bind={"outputs": {expected name: actual name}}`` (and/or ``"inputs"``) names a
    pairing no rule can settle.
    """
    __tracebackhide__ = True
    validators.check_tolerance_choice(tolerance, rtol, atol, rule_type=Tolerance)
    actual_model = actual if _is_model(actual) else None
    expected_model = expected if _is_model(expected) else None
    if (actual_model is not None or expected_model is not None) and inputs is None:
        which = "actual" if actual_model is not None else "expected"
        raise TypeError(f"assert_outputs_close: {which} is a model ({_name(actual_model or expected_model)}); "
                        "pass inputs=<a batch> so it can be run")
    if inputs is not None:
        _check_rows(inputs, "assert_outputs_close")
    validators.check_bind(bind)
    actual_model = bound_to_expected(actual_model, expected_model, inputs, bind)
    inputs = recorded_inputs(actual_model, expected_model, inputs)
    if actual_model is None and expected_model is None:
        act, exp = _to_numpy_pair(actual, expected)
    else:
        act = _run(actual_model, inputs) if actual_model is not None else _to_numpy(actual)
        exp = _run(expected_model, inputs) if expected_model is not None else _to_numpy(expected)
    rows_note = None
    if actual_model is not None and inputs is not None and _uses_default(tolerance, rtol, atol) \
            and not getattr(actual_model, "replays_recording", False) \
            and (quantized.sibling_of(actual_model) is not None or quantized.judged_alone(actual_model)):
        # a decision over rows draws rows until it is proved either way (checks/quant_rows.py)
        inputs, act, exp, rows_note = quant_rows.widen(actual_model, expected_model, inputs, act, exp, _run, bind)
    exp_raw, act_raw = exp, act
    act, exp, alignment, pairs = align_structures(act, exp, from_models=actual_model is not None or expected_model is not None,
                                                   models=(actual_model, expected_model), bind=bind)
    device, fmt = _context(actual_model, expected_model)
    meta: dict[str, Any] = {"check": "outputs_close", "device": device, "format": fmt}
    binding = getattr(actual_model, "binding_dict", None) if actual_model is not None else None
    if binding is not None and actual_model is not None:
        meta["binding"] = binding()
        alignment = "; ".join(x for x in (actual_model.describe_binding(), alignment) if x) or None
    elif pairs:
        meta["binding"] = {"inputs": [], "outputs": pairs}
    elif is_loaded_model(actual_model) and is_loaded_model(expected_model):  # every tensor by its own name
        meta["binding"] = {kind: [{"reference": s.name, "other": s.name, "basis": "same name", "how": ""}
                                  for s in getattr(expected_model, kind)] for kind in ("inputs", "outputs")}
    if alignment:
        meta["alignment"] = alignment
    if observers.listening() and (actual_model is not None or expected_model is not None):
        # what each model answered, heard before the verdict (recorded whether it passes or not);
        # the reference's floor, when measured below, is heard by a second call
        observers.ran((actual_model, expected_model), inputs, (act_raw, exp_raw))
    if actual_model is not None and inputs is not None and _uses_default(tolerance, rtol, atol) \
            and quantized.sibling_of(actual_model) is not None:
        return _quantized_two_part(actual_model, expected_model, inputs, act, exp_raw, device, meta, msg,
                                   equal_nan, allow_vacuous, rows_note)
    if actual_model is not None and inputs is not None and _uses_default(tolerance, rtol, atol) \
            and float16_textures.sibling_of(actual_model) is not None:
        return _textures_two_part(actual_model, expected_model, inputs, act, exp_raw, device, meta, msg,
                                  equal_nan, allow_vacuous)
    if actual_model is not None and inputs is not None and _uses_default(tolerance, rtol, atol) \
            and quantized.judged_alone(actual_model):
        return _quantized_alone(actual_model, expected_model, inputs, act, exp, meta, msg, equal_nan, rows_note)
    calibration = None
    if isinstance(tolerance, str):
        _check_calibrated(tolerance, rtol, atol)
        if expected_model is None:
            raise TypeError("tolerance='calibrated' measures the reference's own float noise, so expected must "
                            "be a model (a callable taking a batch) and inputs must be given; got arrays")
        calibration = _calibrate_split(expected_model, inputs, exp)
        tol_fn = calibration.tolerance_for
        meta["calibration"] = calibration.meta
    else:
        floors = None
        if _uses_default(tolerance, rtol, atol) and inputs is not None:
            floors = _shadow_floors(expected_model if expected_model is not None else actual_model,
                                    inputs, exp_raw, _leaf_paths(exp), fmt, meta, sharper=_known_kernels(actual_model))
        tol_fn = _tolerance_fn(act, tolerance, rtol=rtol, atol=atol, device=device, fmt=fmt,
                               compute=_compute_dtype(actual_model, expected_model), floors=floors,
                               allow_vacuous=allow_vacuous, **_floor_of(meta))
        if floors and observers.listening():
            observers.ran((None, expected_model), inputs, (None, exp_raw), floor=floors)
    report = compare(act, exp, tolerance=tol_fn, equal_nan=equal_nan, full_stats=calibration is not None or recording.listening())
    report.title = f"{_name(actual_model) if actual_model is not None else 'actual'} vs " \
                   f"{_name(expected_model) if expected_model is not None else 'expected'}"
    report.meta.update(meta)
    if calibration is not None:
        calibration.summarise(report)
    elif power.requested() and report.passed and expected_model is not None and inputs is not None:
        def run_aligned(model: Any, batch: Any) -> Any:
            return align_structures(act_raw, _run(model, batch), from_models=True,
                                    models=(actual_model, expected_model), bind=bind)[1]

        report.meta["power"] = [bug.to_dict() for bug in power.measure_power(
            expected_model, inputs, act, exp, tol_fn, equal_nan=equal_nan, run=run_aligned)]

    def why() -> list:
        return diagnose.diagnose_comparison(report, actual=act, expected=exp, actual_model=actual_model,
                                            expected_model=expected_model, inputs=inputs)

    return _finish("outputs_close", report, msg, why, lambda: _memo_key(
        diagnose.diagnose_comparison, act, exp, actual_model, expected_model, inputs))


def _quantized_two_part(cand: Any, ref_model: Any, inputs: Any, act: Any, exp_raw: Any, device: str,
                        meta: dict[str, Any], msg: str | None, equal_nan: bool, allow_vacuous: bool,
                        rows_note: dict | None = None) -> ComparisonReport:
    """A quantised TFLite candidate with its float32 sibling (``checks/quantized.py``): conversion
    judged by this module's default (float64 floor) path, quantisation cost by the budget."""
    __tracebackhide__ = True
    sibling = quantized.sibling_of(cand)
    variant = quantized.variant_of(cand)
    assert variant is not None
    sib, exp, _, _ = align_structures(_run(sibling, inputs), exp_raw, from_models=True, models=(sibling, ref_model))
    floors = _shadow_floors(ref_model, inputs, exp_raw, _leaf_paths(exp), "tflite:float32", meta)
    conv_tol = _tolerance_fn(sib, None, rtol=None, atol=None, device=device, fmt="tflite:float32",
                             compute=_compute_dtype(ref_model), floors=floors, allow_vacuous=allow_vacuous,
                             **_floor_of(meta))
    twin = quantized.float16_twin_of(sibling) if variant == "float16" else None
    report = quantized.two_part_report(quantized=act, sibling=sib, reference=exp, variant=variant,
                                       conversion_tolerance=conv_tol, equal_nan=equal_nan,
                                       calibration=getattr(cand, "calibration", None), rows_note=rows_note,
                                       twin=None if twin is None else
                                       align_structures(_run(twin, inputs), exp_raw, from_models=True,
                                                         models=(twin, ref_model))[0])
    report.title = f"{_name(cand)} vs {_name(ref_model) if ref_model is not None else 'expected'}"
    report.meta.update({k: v for k, v in meta.items() if k != "summary"})

    def why() -> list:
        conversion = compare(sib, exp, tolerance=conv_tol, equal_nan=equal_nan)
        hints = diagnose.diagnose_comparison(conversion, actual=sib, expected=exp, actual_model=sibling,
                                             expected_model=ref_model, inputs=inputs)
        quant = diagnose.diagnose_quantization(report, candidate=cand, sibling=sibling, inputs=inputs,
                                               variant=variant, twin=twin)
        return hints + quant if "conversion" in report.meta["quantized"]["failed_parts"] else quant + hints

    quant_rows.warn_inconclusive(report)
    return _finish("outputs_close", report, msg, why)


def _textures_two_part(cand: Any, ref_model: Any, inputs: Any, act: Any, exp_raw: Any, device: str,
                       meta: dict[str, Any], msg: str | None, equal_nan: bool, allow_vacuous: bool) -> ComparisonReport:
    """A tfjs:webgl-f16 candidate with its float32-textures sibling (``checks/float16_textures.py``)."""
    __tracebackhide__ = True
    sibling = float16_textures.sibling_of(cand)
    sib, exp, _, _ = align_structures(_run(sibling, inputs), exp_raw, from_models=True, models=(sibling, ref_model))
    act, _, _, _ = align_structures(act, exp_raw, from_models=True, models=(cand, ref_model))
    floors = _shadow_floors(ref_model, inputs, exp_raw, _leaf_paths(exp), "tfjs", meta)
    conv_tol = _tolerance_fn(sib, None, rtol=None, atol=None, device=device, fmt="tfjs", compute=_compute_dtype(ref_model),
                             floors=floors, allow_vacuous=allow_vacuous, **_floor_of(meta))
    errors = {p: v[floor.FLOAT64] for p, v in (floors or {}).items() if floor.FLOAT64 in v}
    report = float16_textures.two_part_report(textures=act, sibling=sib, reference=exp, conversion_tolerance=conv_tol,
                                              float32_errors=errors or None, missing=meta.get("noise_floor_missing"),
                                              equal_nan=equal_nan)
    report.title = f"{_name(cand)} vs {_name(ref_model) if ref_model is not None else 'expected'}"
    report.meta.update({k: v for k, v in meta.items() if k != "summary"})

    def why() -> list:
        conversion = compare(sib, exp, tolerance=conv_tol, equal_nan=equal_nan)
        return diagnose.diagnose_comparison(conversion, actual=sib, expected=exp, actual_model=sibling,
                                            expected_model=ref_model, inputs=inputs)

    return _finish("outputs_close", report, msg, why)


def _quantized_alone(cand: Any, ref_model: Any, inputs: Any, act: Any, exp: Any, meta: dict[str, Any],
                     msg: str | None, equal_nan: bool, rows_note: dict | None = None) -> ComparisonReport:
    """An int8/dynamic-range TFLite candidate without a float32 sibling: the variant's budget
    against the reference (``quantized.alone_report``), not the fixed ``tflite:*`` rule."""
    __tracebackhide__ = True
    variant = quantized.variant_of(cand)
    assert variant is not None
    report = quantized.alone_report(quantized=act, reference=exp, variant=variant, equal_nan=equal_nan,
                                    calibration=getattr(cand, "calibration", None), rows_note=rows_note)
    report.title = f"{_name(cand)} vs {_name(ref_model) if ref_model is not None else 'expected'}"
    report.meta.update({k: v for k, v in meta.items() if k != "summary"})

    def why() -> list:
        return diagnose.diagnose_comparison(report, actual=act, expected=exp, actual_model=cand,
                                            expected_model=ref_model, inputs=inputs)

    quant_rows.warn_inconclusive(report)
    return _finish("outputs_close", report, msg, why)


def assert_deterministic(model: Callable, inputs: Any, *, runs: int = 3, rtol: float = 0.0,
                         atol: float = 0.0) -> ComparisonReport:
    """Assert ``model`` gives the same outputs on ``inputs`` every time (exact by default).

    The report says which run differed from the first and by how much
    (``report.meta["runs"]``).
    """
    __tracebackhide__ = True
    _require_model(model, "assert_deterministic")
    _require_running(model, "assert_deterministic")
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise InvalidArgumentError(f"assert_deterministic: runs={runs!r}; pass an int >= 2 (the first run is the reference)")
    rtol = validators.check_tolerance_value("rtol", rtol) or 0.0
    atol = validators.check_tolerance_value("atol", atol) or 0.0
    _check_rows(inputs, "assert_deterministic")
    outputs = [_run(model, inputs) for _ in range(runs)]
    first = outputs[0]
    if rtol == 0 and atol == 0:
        tolerance = tol_mod.exact_tolerance("assert_deterministic default")
    else:
        tolerance = tol_mod.resolve_tolerance("float32", rtol=rtol, atol=atol, layers=())
    if runs == 2:
        actual, expected = outputs[1], first
    else:
        actual = {f"run {i + 1}": out for i, out in enumerate(outputs[1:], start=1)}
        expected = {f"run {i + 1}": first for i in range(1, runs)}
    report = compare(actual, expected, tolerance=tolerance, full_stats=recording.listening())
    report.title = f"{_name(model)}: {runs} runs on the same inputs, each vs run 1"
    per_run = []
    for i, out in enumerate(outputs[1:], start=2):
        diff = _max_abs_tree(out, first)
        per_run.append({"run": i, "identical": diff == 0.0, "max_abs": diff})
    differing = [r["run"] for r in per_run if not r["identical"]]
    report.meta.update({"check": "deterministic", "runs": runs, "per_run": per_run,
                        "differing_runs": differing,
                        "first_differing_run": differing[0] if differing else None})
    device, fmt = _context(model, None)
    report.meta.update({"device": device, "format": fmt})

    def why() -> list:
        return diagnose.diagnose_nondeterminism(report, model=model, inputs=inputs, runs=outputs)

    return _finish("deterministic", report, None, why, lambda: _memo_key(
        diagnose.diagnose_nondeterminism, model, inputs, outputs))


def _require_running(model: Any, check: str) -> None:
    """Refuse, as not applicable, a recorded run (``replays_recording``): it answers only the
    batches it recorded, with the arrays it recorded, so it cannot run the sub-batches batch
    invariance cuts (a 50-line ``BatchMismatchError`` was every such test's end), and its runs
    on the same inputs are the same arrays read again (determinism that cannot fail)."""
    if not getattr(model, "replays_recording", False):
        return
    what = ("runs the batch cut into sub-batches, and a recording answers only the whole batches it recorded"
            if check == "assert_batch_invariant" else
            "reruns the model on the same inputs, and a recording answers them with the same recorded arrays "
            "every time, so it cannot fail")
    raise NotApplicable(
        f"{check} does not apply to {_name(model)}: it {what}. A recorded run is judged by assert_outputs_close "
        f"against the reference on its recorded inputs; check {check.removeprefix('assert_')} on a form that runs "
        "(the reference, or the live export of the recorded format)")


def _require_batching(model: Any, sizes: Sequence[int]) -> None:
    """Refuse, as not applicable, a model that runs every batch in fixed chunks the sub-batches
    cannot regroup: a TFLite file converted at a fixed batch (``fixed_batch``; an LSTM's export
    is traced at batch 1) computes the whole batch and its sub-batches by the same chunks, so the
    comparison could not fail. A pass would claim an invariance nobody measured."""
    fixed = getattr(model, "fixed_batch", None)
    if not isinstance(fixed, int) or not (fixed == 1 or all(size % fixed == 0 for size in sizes)):
        return
    raise NotApplicable(
        f"assert_batch_invariant does not apply to {_name(model)}: the file has a fixed batch of {fixed} "
        f"(its inputs' first dimension), so every batch runs {fixed} row(s) at a time and the whole batch and "
        f"its sub-batches of {', '.join(map(str, sizes))} are the same computation; it cannot fail. Check batch "
        "invariance on the reference (e.g. the Keras model), or export with a dynamic batch "
        "(converter_options={'route': 'dynamic'} where the graph allows)")


def assert_batch_invariant(model: Callable, inputs: Any, *, batch_sizes: Sequence[int] = (1,),
                           rtol: float | None = None, atol: float | None = None,
                           tolerance: Tolerance | str | None = None,
                           allow_vacuous: bool = False) -> ComparisonReport:
    """Assert the rows of ``inputs`` give the same outputs at once and in sub-batches.

    For each size in ``batch_sizes`` the batch is cut into consecutive sub-batches of that
    size (the last may be smaller; dict inputs are cut together along axis 0), the outputs
    concatenated and compared with the whole-batch outputs. Default tolerance: for a
    Keras model a multiple of its own float32 error (its float64 twin, as in
    ``assert_outputs_close``), else the dtype-aware built-in (float drift between batch
    sizes is expected, seed 004);
    ``rtol=0, atol=0`` demands bitwise equality and reports the ULP distance.
    ``tolerance="calibrated"`` allows ``CALIBRATED_MULTIPLE`` times the drift the model shows
    when the same batch is evaluated in reversed row order.
    """
    __tracebackhide__ = True
    validators.check_tolerance_choice(tolerance, rtol, atol, rule_type=Tolerance)
    _require_model(model, "assert_batch_invariant")
    _require_running(model, "assert_batch_invariant")
    n = validators.check_nonempty_batch(_batch_length(inputs), "assert_batch_invariant")
    sizes = validators.check_batch_sizes(batch_sizes)
    _require_batching(model, sizes)
    batched = _run(model, inputs)
    splits = {}
    for size in sizes:
        parts = [_run(model, _slice(inputs, start, min(start + size, n))) for start in range(0, n, size)]
        splits[size] = _concat(parts, where=f"outputs of {_name(model)}")
    device, fmt = _context(model, None)
    meta: dict[str, Any] = {"check": "batch_invariant", "batch": n, "batch_sizes": list(sizes),
                            "device": device, "format": fmt}
    if len(sizes) == 1:
        actual, expected = splits[sizes[0]], batched
    else:
        actual = {f"sub-batches of {s}": splits[s] for s in sizes}
        expected = {f"sub-batches of {s}": batched for s in sizes}
    calibration = None
    tol_fn: Callable[[Any, str], Any]
    if isinstance(tolerance, str):
        _check_calibrated(tolerance, rtol, atol)
        calibration = _calibrate_reversed(model, inputs, batched, wrap=None if len(sizes) == 1 else
                                          [f"sub-batches of {s}" for s in sizes])
        tol_fn = calibration.tolerance_for
        meta["calibration"] = calibration.meta
    else:
        floors = None
        if _uses_default(tolerance, rtol, atol):
            floors = _shadow_floors(model, inputs, batched, _leaf_paths(batched), None, meta) or floor.from_session(
                model, inputs, _leaf_paths(batched), meta, run=_run, paths_of=_leaf_paths, name=_name,
                measure=lambda ref, out, paths, into: _shadow_floors(ref, inputs, out, paths, None, into))
            if floors is not None and len(sizes) > 1:
                floors = {f"[{f'sub-batches of {s}'!r}]{p}": v for s in sizes for p, v in floors.items()}
        tol_fn = _tolerance_fn(actual, tolerance, rtol=rtol, atol=atol, device=device, fmt=fmt,
                               compute=_compute_dtype(model), floors=floors, allow_vacuous=allow_vacuous,
                               **_floor_of(meta))
        if "floor_from" in meta:
            tol_fn = floor.sourced(tol_fn, f"measured on {meta['floor_from']}: {_name(model)} has no TensorFlow graph")
    report = compare(actual, expected, tolerance=tol_fn, full_stats=calibration is not None or recording.listening())
    sizes_text = ", ".join(str(s) for s in sizes)
    report.title = f"{_name(model)}: batch of {n} at once vs sub-batches of {sizes_text}"
    report.meta.update(meta)
    if calibration is not None:
        calibration.summarise(report)

    def why() -> list:
        return diagnose.diagnose_batch_variance(report, model=model, inputs=inputs, batched=batched, split=splits)

    return _finish("batch_invariant", report, None, why, lambda: _memo_key(
        diagnose.diagnose_batch_variance, model, inputs, batched, splits))


# --------------------------------------------------------------------------------------
# Finishing: emit, diagnose, raise
# --------------------------------------------------------------------------------------

def _finish(kind: str, report: ComparisonReport, msg: str | None, why: Callable[[], list],
            key: Callable[[], tuple] | None = None) -> ComparisonReport:
    """Emit the report; on failure raise ``ParityError`` whose hints and text are computed
    only when first read (pytest rendering the failure, a ``match=``, the summary of the
    test's final failure): a ``@given`` test that fails on many examples, or a failure a
    test expects and catches, costs no diagnosis per example (``LazyHints``)."""
    __tracebackhide__ = True
    if not report.passed:
        report.hints = LazyHints(report, why, key)  # type: ignore[assignment]
    recording.emit(kind, report)
    if report.passed:
        return report

    def text() -> str:
        rendered = str(report)
        summary = report.meta.get("calibration", {}).get("summary")
        if summary and summary not in rendered:
            rendered += f"\n{summary}"
        return f"{msg}\n{rendered}" if msg else rendered

    raise ParityError(text, report)


# Hints of the last few diagnosed failures, by what was compared: Hypothesis renders the
# shrunk example's failure and then its final replay's, two reports of the same comparison.
_MEMO: dict[tuple, list] = {}
_MEMO_SIZE = 8


class LazyHints(Sequence):
    """``report.hints`` of a failure: the diagnosis runs on first read, once.

    ``pending`` says whether it has run (the summary reads it to leave the hints of
    unread failures out instead of diagnosing every failing Hypothesis example); ``discard``
    drops what the diagnosis would need (arrays, models) once nobody can read it.
    """

    def __init__(self, report: ComparisonReport, why: Callable[[], list] | None,
                 key: Callable[[], tuple] | None = None) -> None:
        self._report = report
        self._why = why
        self._key = key
        self._hints: list | None = None

    @property
    def pending(self) -> bool:
        return self._hints is None and self._why is not None

    def discard(self) -> None:
        if self._hints is None:
            self._why = self._key = None

    def _resolve(self) -> list:
        if self._hints is not None:
            return self._hints
        why, self._why = self._why, None
        if why is None:
            self._hints = []
            return self._hints
        try:
            memo_key = self._key() if self._key is not None else None
        except Exception:  # noqa: BLE001 - no memo then, the diagnosis still runs
            memo_key = None
        if memo_key is not None and memo_key in _MEMO:
            self._hints = list(_MEMO[memo_key])
            return self._hints
        try:
            self._hints = list(why() or [])
        except Exception as exc:  # noqa: BLE001 - a diagnosis crash must never hide the failure
            self._hints = []
            self._report.meta["diagnosis_error"] = f"{type(exc).__name__}: {exc}"
        if memo_key is not None:
            _MEMO[memo_key] = list(self._hints)
            while len(_MEMO) > _MEMO_SIZE:
                _MEMO.pop(next(iter(_MEMO)))
        self._key = None
        return self._hints

    def __getitem__(self, index: Any) -> Any:
        return self._resolve()[index]

    def __len__(self) -> int:
        return len(self._resolve())

    def __iter__(self) -> Iterator[Any]:
        return iter(self._resolve())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyHints):
            other = other._resolve()
        return self._resolve() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._hints) if self._hints is not None else "LazyHints(<not diagnosed yet>)"


def _digest(tree: Any) -> tuple:
    """A cheap identity of arrays (shapes, dtypes, a strided sample's bytes) for ``_MEMO``."""
    h = hashlib.blake2b(digest_size=16)
    for path, arr in _leaves(tree):
        h.update(f"{path}{arr.shape}{arr.dtype}".encode())
        flat = arr.reshape(-1)
        step = max(1, flat.size // 65536)
        h.update(np.ascontiguousarray(flat[::step]).tobytes())
    return (h.hexdigest(),)


def _memo_key(fn: Any, *parts: Any) -> tuple:
    return (fn, *[id(p) if _is_model(p) else _digest(p) if p is not None else None for p in parts])


# --------------------------------------------------------------------------------------
# Tolerances per output
# --------------------------------------------------------------------------------------

def _tolerance_fn(actual: Any, tolerance: Tolerance | None, *, rtol, atol, device, fmt, compute=None,
                  floors: dict[str, dict[str, float]] | None = None, allow_vacuous: bool = False,
                  floor_missing: str | None = None, twin: str | None = None, unproven: str | None = None):
    """A ``(expected_dtype, path) -> Tolerance`` using the less precise of the two dtypes
    (and of ``compute``, the dtype a mixed-precision model computes its float outputs in).

    ``floors`` ({path: {shadow kind: measured error}}) make the default of those outputs the
    shadow rule (``tolerances.shadow_tolerance``); explicit values always win over it.
    ``floor_missing`` (why no twin measured a model reference) is said in the source of a
    float output judged by the fixed rule instead, with what that rule likely costs."""
    if isinstance(tolerance, Tolerance):
        if rtol is not None or atol is not None:
            validators.check_tolerance_choice(tolerance, rtol, atol, rule_type=Tolerance)
        return replace(tolerance, allow_vacuous=True) if allow_vacuous else tolerance
    if tolerance is not None:
        validators.check_tolerance_choice(tolerance, rtol, atol, rule_type=Tolerance)
    actual_dtypes = {path: arr.dtype for path, arr in _leaves(actual)}
    # Resolve the layers now: the ContextVar is read in the caller's context.
    layers = tol_mod.current_layers()

    def for_output(expected_dtype: Any, path: str) -> Tolerance:
        dtype = expected_dtype
        if path in actual_dtypes:
            try:
                dtype = tol_mod.less_precise(actual_dtypes[path], expected_dtype)
            except TypeError:
                dtype = expected_dtype
        measured = (floors or {}).get(path)
        if measured is not None and floor.FLOAT64 in measured and np.dtype(dtype).kind == "f":
            # the float64 run measured the mixed-precision model's error itself: judge by it
            tol = tol_mod.shadow_tolerance(dtype, measured[floor.FLOAT64], device=device, format=fmt,
                                           float16_weights=measured.get(floor.FLOAT16_WEIGHTS),
                                           compute=compute, twin=floor.method_name(twin),
                                           reordered=measured.get(floor.FLOAT32_REORDERED),
                                           unproven=unproven if floor.UNPROVEN in measured else None,
                                           bulk_noise={k[len(floor.BULK):]: v for k, v in measured.items()
                                                       if k.startswith(floor.BULK)} or None)
        else:
            if compute is not None and np.dtype(dtype).kind == "f":
                dtype = tol_mod.less_precise(dtype, compute)
            tol = tol_mod.resolve_tolerance(dtype, rtol=rtol, atol=atol, device=device, format=fmt, layers=layers)
            if floor_missing is not None and tol.default and np.dtype(dtype).kind in "fc":
                tol = tol_mod.without_floor(tol, dtype, floor_missing)
        return replace(tol, allow_vacuous=True) if allow_vacuous else tol

    return for_output


def _floor_of(meta: dict[str, Any]) -> dict[str, Any]:
    """What ``_shadow_floors`` left in ``meta`` that ``_tolerance_fn`` words: why no twin
    measured (``floor_missing``) and which one did (``twin``)."""
    return {"floor_missing": meta.get("noise_floor_missing"), "twin": meta.get("shadow", {}).get("twin"),
            "unproven": meta.get("shadow", {}).get("unproven")}


def _uses_default(tolerance: Any, rtol: float | None, atol: float | None) -> bool:
    """No tolerance from the argument, the marker or ini: the package chooses it."""
    if tolerance is not None or rtol is not None or atol is not None:
        return False
    return not any(r is not None or a is not None for _, r, a in tol_mod.current_layers())


def _leaf_paths(tree: Any) -> list[str]:
    return [path for path, _ in _leaves(tree)]


def _known_kernels(candidate: Any) -> bool:
    """A loaded form or a Keras model, whose kernels the format says: only such a candidate
    may be judged by the sharper floor (arrays or a function could come from anything)."""
    from ..formats import is_keras_model

    return is_loaded_model(candidate) or is_keras_model(candidate)


def _shadow_floors(model: Any, inputs: Any, reference: Any, paths: list[str], fmt: str | None,
                   meta: dict[str, Any], sharper: bool = True) -> dict[str, dict[str, float]] | None:
    """{path: {kind: max|ref - twin| / max|twin|}} of the reference's outputs on ``inputs``,
    or None when no twin could measure them; ``meta["shadow"]`` says which twin measured
    or why none did (``meta["noise_floor_missing"]``, which the tolerance source repeats).

    ``paths`` are the reference's paths as compared (after structure alignment): when the
    alignment renamed them one to one, the floors follow by position."""
    if model is None:
        return None
    kinds = [floor.FLOAT64] + ([floor.FLOAT16_WEIGHTS] if (fmt or "").lower() == "tflite:float16" else [])
    found: dict[str, dict[str, float]] = {}
    info: dict[str, Any] = {}
    seconds = 0.0
    ref_leaves = dict(_leaves(reference))
    for kind in [*kinds, *([floor.SHARPENS[floor.FLOAT64]] if sharper else [])]:
        if kind not in kinds and not info.get(floor.FLOAT64, "").startswith("measured"):
            continue  # the sharper floor only beside a float64 one
        pointless = floor.sharper_floor_pointless(model) if kind not in kinds else None
        if pointless:  # told from the layers: it would not judge, so it is not built
            info[kind] = f"unavailable: {pointless}"
            continue
        measured = floor_cache.measured(  # a warm session reads the floor an earlier one measured
            model, lambda: (kind, floor.batch_digest(inputs), floor.batch_digest(ref_leaves)),  # noqa: B023
            lambda: _measuring(model, kind, inputs, ref_leaves), floor.Floor)  # noqa: B023
        seconds += measured.seconds
        if measured.errors is None:
            info[kind] = f"unavailable: {measured.reason}"
            continue
        info[kind] = f"measured by the {floor.method_name(measured.method)}" + (
            f" ({measured.reason})" if measured.reason else "")
        info.setdefault("twin", measured.method)
        for path, err in measured.errors.items():
            found.setdefault(path, {})[kind] = err
        if kind == floor.FLOAT64:  # the noise's distribution, which the bulk verdict reads
            for path, stats in measured.bulk.items():
                found.setdefault(path, {}).update({floor.BULK + stat: v for stat, v in stats.items()})
        if measured.unproven:  # no second estimate confirms them: the fixed rule judges (issue 36)
            info["unproven"] = measured.reason
            for path in measured.unproven:
                found.setdefault(path, {})[floor.UNPROVEN] = 1.0
    info["seconds"] = round(seconds, 4)
    meta["shadow"] = info
    if floor.FLOAT64 not in {k for v in found.values() for k in v}:
        meta["noise_floor_missing"] = str(info.get(floor.FLOAT64, "unavailable: no twin"))[len("unavailable: "):]
    if not found:
        return None
    raw_paths = list(ref_leaves)
    if raw_paths != paths and len(raw_paths) == len(paths):
        found = {new: found[old] for old, new in zip(raw_paths, paths) if old in found}
    meta["noise_floor"] = found
    return found


def _measuring(model: Any, kind: str, inputs: Any, ref_leaves: dict) -> Any:
    """``floor.measure_floor``, said as a status line the first time a twin is built for a model
    (a first run's silent seconds: issue 49); a twin already built measures without a word."""
    if floor.twins_built(model, kind):
        return floor.measure_floor(model, kind, inputs, ref_leaves, _leaves)
    with progress.step(f"measuring the model's own {kind} noise (building its twin)") as step:
        found = floor.measure_floor(model, kind, inputs, ref_leaves, _leaves)
        step.note = f"by the {floor.method_name(found.method)}" if found.errors is not None else "no twin"
        return found


class _Calibration:
    """Noise floor of the reference per output path, as a fraction of the output's scale."""

    def __init__(self, floors: dict[str, float], measured: dict[str, float], method: str,
                 dtypes: dict[str, np.dtype]) -> None:
        self.floors = floors
        self.method = method
        self.dtypes = dtypes
        self.meta: dict[str, Any] = {
            "method": method, "multiple_allowed": CALIBRATED_MULTIPLE,
            "min_floor_eps": CALIBRATED_MIN_FLOOR_EPS,
            "measured_drift": dict(measured), "floor": dict(floors),
        }

    def tolerance_for(self, expected_dtype: Any, path: str) -> Tolerance:
        dtype = np.dtype(expected_dtype) if not isinstance(expected_dtype, np.dtype) else expected_dtype
        if dtype.kind not in "fc" and not tol_mod.eps_of(dtype):
            return tol_mod.exact_tolerance("calibrated (exact for non-float outputs)")
        floor = self.floors.get(path)
        if floor is None:  # an output the calibration did not see: fall back to the built-in
            return tol_mod.default_tolerance(dtype).with_source("built-in (no calibration for this output)")
        eps = tol_mod.eps_of(dtype)
        return Tolerance(0.0, eps, scale=CALIBRATED_MULTIPLE * floor,
                         source=f"calibrated: {CALIBRATED_MULTIPLE:g}x the reference's float noise "
                                f"(floor {floor:.2g} of scale, {self.method})")

    def summarise(self, report: ComparisonReport) -> None:
        ratios = {}
        for out in report.outputs:
            floor = self.floors.get(out.path)
            if floor is None or out.max_abs is None or not out.scale:
                continue
            ratios[out.path] = (out.max_abs / out.scale) / floor if floor else float("inf")
        self.meta["ratio"] = ratios
        if not ratios:
            self.meta["summary"] = "calibrated: no floating output to calibrate"
            return
        worst = max(ratios, key=lambda p: ratios[p])
        where = f" in output {worst}" if worst else ""
        floor = self.floors[worst]
        clamp = ""
        measured = self.meta["measured_drift"].get(worst)
        if measured is not None and measured < floor:
            clamp = f"; measured drift {measured:.2g}, raised to {CALIBRATED_MIN_FLOOR_EPS:g} eps"
        self.meta["worst_output"] = worst
        self.meta["summary"] = (f"max error {_times(ratios[worst])} the reference's own float noise{where} "
                                f"(floor {floor:.2g} of scale{clamp}; allowed {CALIBRATED_MULTIPLE:g}x; "
                                f"noise measured by {self.method})")


def _times(ratio: float) -> str:
    if ratio >= 100 and ratio != float("inf"):
        return f"{ratio:,.0f}x"
    return f"{ratio:.2g}x"


def _floors(drifts: list[tuple[Any, Any]], reference: Any) -> tuple[dict[str, float], dict[str, float], dict]:
    """Per path: max over ``drifts`` of max|a - b| / max|b|, and the floor with its minimum."""
    measured: dict[str, float] = {}
    dtypes: dict[str, np.dtype] = {}
    for other, base in drifts:
        base_leaves = dict(_leaves(base))
        for path, arr in _leaves(other):
            ref = base_leaves.get(path)
            if ref is None or ref.dtype.kind not in "fc" or arr.shape != ref.shape:
                continue
            drift = (floor.relative_error(arr, ref) or 0.0) if ref.size else 0.0
            measured[path] = max(measured.get(path, 0.0), drift)
            dtypes[path] = tol_mod.less_precise(arr.dtype, ref.dtype)
    floors = {p: max(v, CALIBRATED_MIN_FLOOR_EPS * tol_mod.eps_of(dtypes[p])) for p, v in measured.items()}
    return floors, measured, dtypes


def _calibrate_split(model: Any, inputs: Any, whole: Any) -> _Calibration:
    """Reference noise: its drift between the whole batch and single rows (first rows only),
    and between the batch and the same rows in reversed order."""
    n = _batch_length(inputs)
    rows = min(n, CALIBRATED_SINGLE_ROWS)
    head = _slice(inputs, 0, rows)
    head_whole = _slice_tree(whole, 0, rows)
    per_row = _concat([_run(model, _slice(head, i, i + 1)) for i in range(rows)], where=f"outputs of {_name(model)}")
    drifts = [(per_row, head_whole)]
    if n > 1:
        drifts.append((_reverse_tree(_run(model, _reverse(inputs, n))), whole))
    floors, measured, dtypes = _floors(drifts, whole)
    method = f"batch of {n} vs {rows} single rows and vs reversed row order"
    return _Calibration(floors, measured, method, dtypes)


def _calibrate_reversed(model: Any, inputs: Any, batched: Any, wrap: list[str] | None) -> _Calibration:
    n = _batch_length(inputs)
    reversed_out = _reverse_tree(_run(model, _reverse(inputs, n)))
    floors, measured, dtypes = _floors([(reversed_out, batched)], batched)
    if wrap:
        floors = {f"[{k!r}]{p}": v for k in wrap for p, v in floors.items()}
        measured = {f"[{k!r}]{p}": v for k in wrap for p, v in measured.items()}
        dtypes = {f"[{k!r}]{p}": v for k in wrap for p, v in dtypes.items()}
    return _Calibration(floors, measured, f"batch of {n} vs the same rows in reversed order", dtypes)


# --------------------------------------------------------------------------------------
# Models, inputs and nested outputs
# --------------------------------------------------------------------------------------

def _is_model(obj: Any) -> bool:
    return callable(obj) and not isinstance(obj, (np.ndarray, Mapping, list, tuple, np.generic))


def _require_model(model: Any, where: str) -> None:
    if not _is_model(model):
        raise TypeError(f"{where}: model must be a callable taking a batch (a Keras model, tf.function, "
                        f"LoadedModel or function), got {type(model).__name__}")


def _name(model: Any) -> str:
    if model is None:
        return "?"
    fmt = getattr(model, "format_variant", None) or getattr(model, "format", None)
    if isinstance(fmt, str) and is_loaded_model(model):
        return f"recorded {fmt}" if getattr(model, "replays_recording", False) else fmt
    name = getattr(model, "name", None) or getattr(model, "__name__", None)
    if name and hasattr(model, "layers") and hasattr(model, "weights"):
        return f"keras model {str(name)!r}"  # "functional_2" alone does not say what it is
    return str(name) if name else type(model).__name__


def _compute_dtype(*models: Any) -> str | None:
    """The least precise compute dtype declared by the models (``LoadedModel.compute_dtype``)."""
    found = [str(d) for m in models if m is not None and (d := getattr(m, "compute_dtype", None))]
    if not found:
        return None
    least = found[0]
    for d in found[1:]:
        least = str(tol_mod.less_precise(least, d))
    return least


def _context(actual_model: Any, expected_model: Any) -> tuple[str, str | None]:
    """Device and format that decide the default tolerance: the candidate's (``actual``)
    format first, then the reference's; ``gpu`` if either side ran on a GPU."""
    device, fmt = "cpu", None
    for model in (actual_model, expected_model):
        if model is None or not is_loaded_model(model):
            continue
        dev = str(getattr(model, "device", "cpu") or "cpu")
        if dev.lower().startswith(("gpu", "cuda")):
            device = "gpu"
        if fmt is None:
            fmt = getattr(model, "format_variant", None) or getattr(model, "format", None)
    return device, fmt


def _check_calibrated(tolerance: str, rtol: float | None, atol: float | None) -> None:
    """The one string ``tolerance=`` accepts, and it excludes an explicit rtol/atol."""
    validators.check_tolerance_choice(tolerance, rtol, atol, rule_type=Tolerance)


def _run(model: Any, batch: Any) -> Any:
    _check_fixed_batch(model, batch)
    return _to_numpy(model(diagnose.fit_inputs(model, batch)))


def _check_fixed_batch(model: Any, batch: Any) -> None:
    """A raw Keras model built for a fixed batch runs other batch sizes without a word (a
    ``LoadedModel`` checks this in ``prepare_batch``): refuse them here as well."""
    if is_loaded_model(model):
        return
    try:
        inputs = getattr(model, "inputs", None)
    except Exception:  # noqa: BLE001 - an unbuilt subclassed model has no inputs yet
        return
    if not isinstance(inputs, (list, tuple)) or not inputs:
        return
    try:
        rows = _batch_length(batch)
    except (ValueError, TypeError):
        return
    for tensor in inputs:
        shape = getattr(tensor, "shape", None)
        want = shape[0] if shape is not None and len(shape) else None
        if want is not None and int(want) != rows:
            raise BatchMismatchError(
                f"{_name(model)}: input {getattr(tensor, 'name', '?')!r} was built for a fixed batch of {int(want)} "
                f"(axis 0), but the batch has {rows} rows; feed batches of {int(want)}, or build the model with "
                "batch_size=None")
