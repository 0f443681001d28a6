"""Tolerances: the rule an output is judged by, its dtype/device/format defaults, and
where a tolerance came from (argument > marker > ini > built-in).

CONTRACT (other modules rely on these names; the owner of this module may add, not rename):

- ``Tolerance`` (frozen dataclass). An element passes when
      |actual - expected| <= atol + rtol * |expected| + scale * max|expected over the output|
  ``scale == 0`` is the plain per-element rule (what an explicit rtol=/atol= means);
  ``scale > 0`` is the scale-aware rule. ``min_top1`` (fraction in [0, 1]) additionally
  requires that share of rows to agree on argmax over the last axis; ``max_mismatch_fraction``
  lets that share of elements be out of bounds (quantised formats). ``source`` says where it
  came from, e.g. "argument", "marker", "ini", "built-in float32", "calibrated".
- ``default_tolerance(dtype, *, device="cpu", format=None, tf32=None) -> Tolerance``
  (``tf32`` picks the GPU float32 row; None reads ``gpu_tf32``, the session's setting)
- ``resolve_tolerance(dtype, *, rtol=None, atol=None, device="cpu", format=None,
      layers=None) -> Tolerance`` with ``layers`` an ordered sequence of
      ``(source_name, rtol_or_None, atol_or_None)`` from highest to lowest priority
      (marker, ini); explicit rtol/atol win over all layers. ``layers=None`` (the default)
      reads the layers the plugin set with ``tolerance_layers``.
- ``tolerance_layers(layers)``: context manager the plugin wraps a test in, so the marker and
  ini values reach every assertion without the assertions knowing pytest.

Why the built-in rule is scale-aware (docs/tolerances.md has the measurements): a model
output is a sum of many products; its rounding error is proportional to the magnitude of
what was summed, not to the (possibly cancelled, near-zero) element itself. So the built-in
defaults add ``scale * max|expected|`` of the output to torch.testing's per-element
rtol/atol. The scale constants are a small multiple of the dtype's epsilon, set above the
float noise measured here (batch drift, TFLite/ONNX/TFJS float32) and below real bugs (input
scaled by 255/256, one weight changed by 1%).
"""

from __future__ import annotations

import contextlib
import math
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

import numpy as np

from .bulk import BulkBound, bounds_from_noise
from .validators import check_tolerance_value


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    scale: float = 0.0
    min_top1: float | None = None
    max_mismatch_fraction: float = 0.0
    source: str = "built-in"
    # True for the rules the package chose (built-in table, float64 shadow), False for a
    # tolerance the user set: diagnosis may call a failure "noise" only under the latter.
    default: bool = False
    # An output whose allowed difference reaches its own largest magnitude cannot fail
    # (an all-zero candidate would pass): compare reports it as vacuous unless this is set.
    allow_vacuous: bool = False
    # Set when a model reference was judged by a fixed rule because no float64 twin could
    # measure its own error: why, and what the fixed rule likely costs (``without_floor``).
    floor_note: str | None = None
    # Set when the sharper floor judged (``shadow_tolerance``): the scale the float64 floor
    # alone gives. Diagnosis runs forms on other kernels (a TFLite file's intermediates run
    # without XNNPACK), which may round apart by that much: its layer table reads this.
    float64_scale: float | None = None
    # The bulk of the error (issue 47, ``verdict/bulk.py``): the median, 90th-percentile and mean
    # signed error of the output, each within a multiple of the same statistic of the model's own
    # float noise; set by ``shadow_tolerance`` where the float64 floor judges a float32 form.
    bulk: tuple[BulkBound, ...] = ()

    @property
    def rule(self) -> str:
        """``"elementwise"`` for the plain rule, ``"scaled"`` when ``scale > 0``."""
        return "scaled" if self.scale > 0 else "elementwise"

    def with_source(self, source: str) -> "Tolerance":
        return replace(self, source=source)

    def describe(self) -> str:
        text = f"rtol={self.rtol:.3g}, atol={self.atol:.3g}"
        if self.scale > 0:
            text += f", scale={self.scale:.3g} x max|expected|"
        if self.max_mismatch_fraction:
            text += f", up to {self.max_mismatch_fraction:.1%} of elements out"
        if self.min_top1 is not None:
            text += f", top-1 agreement >= {self.min_top1:.0%}"
        text = f"{text} ({self.source})"
        if self.bulk:  # the bulk bounds carry their own source: the same run's noise statistics
            text += "; the bulk of the error, as shares of scale: " + ", ".join(b.describe() for b in self.bulk)
        return text

    def allowed(self, expected_abs: Any, output_scale: float) -> Any:
        """The allowed |actual - expected| for elements of magnitude ``expected_abs``."""
        return self.atol + self.rtol * expected_abs + self.scale * output_scale

    def is_vacuous(self, output_scale: float) -> bool:
        """Would an all-zero output pass against one whose largest magnitude is ``output_scale``?

        Every element e passes as 0 when |e| <= atol + rtol|e| + scale * output_scale, and the
        largest |e| is the hardest: so when (1 - rtol - scale) * output_scale <= atol. An
        output that is exactly zero (``output_scale == 0``) is compared exactly, never vacuous.
        """
        if not output_scale > 0 or not math.isfinite(output_scale):
            return False
        return (1.0 - self.rtol - self.scale) * output_scale <= self.atol


# --------------------------------------------------------------------------------------
# The built-in table
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Row:
    rtol: float          # per element, torch.testing's value
    atol: float          # per element, torch.testing's value
    scale: float         # x max|expected| of the output: ours
    why: str


# Per-element rtol is torch.testing's value; ``scale`` (x max|expected| of the output) is ours.
# No absolute term: an atol is a floor independent of the output's magnitude, and on outputs
# smaller than it (random-weight feature maps are ~1e-10) the check could not fail. The scale
# term already covers elements near zero; an output that is exactly zero is compared exactly.
# eps: float16 9.8e-4, bfloat16 7.8e-3, float32 1.2e-7, float64 2.2e-16.
DTYPE_DEFAULTS: dict[str, _Row] = {
    "float16": _Row(1e-3, 0.0, 2e-3,
                    "~2 eps; float16 Dense 784->1024->10 drifts 3.6e-4 of scale batch vs per-row "
                    "and 5.3e-4 vs float64 (float32 accumulation), so <= 0.6 eps"),
    "bfloat16": _Row(1.6e-2, 0.0, 1.6e-2,
                     "~2 eps; bfloat16 Dense 784 model drifts 5.1e-3 of scale vs float64 (0.66 eps)"),
    # The fixed rule, used only where the reference cannot be shadowed in float64 (arrays,
    # SavedModel/GraphDef/checkpoint references): correct float32 forms of Keras Applications
    # with trained-like statistics drift up to 1.8e-4 of scale (ResNet50 GraphDef/TFJS,
    # 128x128), so 4e-4; input x255/256 gives 3.9e-3, 10x above it.
    "float32": _Row(1.3e-6, 0.0, 4e-4,
                    "correct forms of ResNet50/DenseNet121/EfficientNetB0/MobileNetV3Small drift "
                    "<= 1.8e-4 of scale (notes/noise-floor.md); input x255/256 gives 3.9e-3"),
    "float64": _Row(1e-7, 0.0, 1e-7,
                    "torch's 1e-7, applied to the output's scale as well: float64 results are "
                    "usually checked against references that passed through float32"),
}

# The float64 shadow (a Keras reference rebuilt in float64, floor/measure.py): the default bound of
# an output is SHADOW_MULTIPLE x max|ref32 - ref64| / max|ref64| of that output on the batch
# under test. Correct float32 forms measured within 1.8x of it (ResNet50, DenseNet121,
# EfficientNetB0, MobileNetV3Small, ConvNeXtTiny, a Transformer encoder, a BiLSTM x SavedModel,
# GraphDef, TFLite, ONNX, TFJS); bench/measure_tolerances.py re-measures it.
SHADOW_MULTIPLE = 8.0
# The measured error is taken as at least this many epsilons of the output dtype: a small
# model can be bitwise equal to its float64 twin on a few rows, and a converter that fuses or
# reorders ops moves it by a few ULP.
SHADOW_MIN_FLOOR_EPS = 8.0
# tflite:float16: SHADOW_F16_MULTIPLE x what rounding the weights to float16 costs the
# reference (float32 twin with float16-rounded weights). TFLite rounds the weights after
# folding batch norm into convolutions, the twin before: the same size, not the same values.
# Measured (bench/noise_floor.py, 64x64): the TFLite file's error was 0.7x-4.5x the twin's
# (EfficientNetB0, with a batch norm after every convolution, 4.5x), so 8x like float32.
SHADOW_F16_MULTIPLE = 8.0
# The sharper floor (issue 27): what a reordered float32 twin differs by judges in place of
# the float64 error only where it is at most REORDERED_AT_MOST of it: there the float64 error
# would be rounding every float32 form shares. A log-magnitude net measured 1/600 until the
# twin rounded one-channel products otherwise (its CPU forms were 1.1x the float64 error apart
# on one CPU, to the last digit on another); now it measures 1.8x-2.6x, and every net measured
# is within 0.2x..5x: the float64 floor judges them all. Never below
# REORDERED_MIN_SHARE of the float64 error (bench/noise_floor.py, docs/tolerances.md).
REORDERED_AT_MOST = 1.0 / 16
REORDERED_MIN_SHARE = 1.0 / 1024
# No twin without proof (issue 36): a float64 floor whose bound (SHADOW_MULTIPLE x it) would be
# looser than the fixed rule is taken only when a second estimate agrees. Two float64 twins (the
# Keras twin, the graph twin) measure the same figure, within 1.0x when both are faithful (the
# Normalization + Discretization net: 1.8e-7 and 1.8e-7), so TWINS_AGREE_WITHIN; a twin that lost
# a layer's state measured 2.8e-2 .. 6.6e-2 where the graph twin measured 9.2e-8. The reordered
# float32 twin measures what two float32 orders differ by, 0.2x..5x the float64 error on the nets
# measured: it supports the float64 figure when at least 1/REORDERED_SUPPORTS of it, the share
# under which the sharper floor judges instead (REORDERED_AT_MOST), so an unproven figure's CPU
# float32 forms are always judged by the reordered spread.
TWINS_AGREE_WITHIN = 2.0
REORDERED_SUPPORTS = 1.0 / REORDERED_AT_MOST  # 16


def needs_proof(dtype: Any, measured: float) -> bool:
    """Whether a float64 floor of ``measured`` (share of scale) would give an output of ``dtype``
    a bound looser than the fixed rule of that dtype: then a second estimate must agree. (The
    ``SHADOW_MIN_FLOOR_EPS`` minimum is no twin's figure: a second twin could not change it.)"""
    row = DTYPE_DEFAULTS.get(_dtype(dtype).name, DTYPE_DEFAULTS["float32"])
    return SHADOW_MULTIPLE * float(measured) > row.scale


# The forms the sharper floor judges (the candidate's format; None: a model or function
# called as it is): their CPU kernels sum products in float32, as the reordered twin does.
# tfjs's CPU backend sums in a JavaScript double (a log-magnitude net's tfjs form sat at its
# float64 error, 1.4e-3 of scale, 800x its tflite form's), so tfjs, the browser backends and
# the quantised variants keep the float64 floor, as does every GPU run.
REORDERED_FORMATS = frozenset({None, "keras", "h5", "saved_model", "graphdef", "checkpoint", "tf.function",
                               "tflite", "tflite:float32", "onnx"})


# The forms whose float32 arithmetic the bulk bounds hold (issue 47): every CPU float32 form
# (tfjs's CPU and WASM backends included: bench/bulk_noise.py); not the browser backends (GPU
# textures, float16 ones among them), nor the quantised variants, which have their own budgets.
BULK_FORMATS = REORDERED_FORMATS | {"tfjs", "tfjs:cpu", "tfjs:wasm"}


def bulk_applies(format: str | None) -> bool:
    """Do the bulk bounds judge a candidate of ``format`` (``onnx:opset17`` is onnx)?"""
    fmt = (format or "").lower() or None
    return fmt in BULK_FORMATS or (fmt or "").startswith("onnx:")


def reorder_applies(format: str | None) -> bool:
    """Does the sharper floor judge a candidate of ``format`` (``onnx:opset17`` is onnx)?"""
    fmt = (format or "").lower() or None
    return fmt in REORDERED_FORMATS or (fmt or "").startswith("onnx:")

# GPU float32, measured on an NVIDIA H200 through cuDNN/cuBLAS (tests/data/gpu_drift_h200.*,
# docs/tolerances.md "GPU"): 10 networks, CPU float32 as the reference.
# TF32 on is TensorFlow's default on Ampere and later: matmul/conv inputs rounded to a 10-bit
# mantissa (eps 9.8e-4). Noise 1.9e-4..1.0e-3 of scale (batch-size drift 8e-5..1.0e-3), so
# ~2 TF32 eps keeps 2-3x headroom; input x255/256 (3.7e-3..5.1e-3 on CNNs) still fails.
GPU_FLOAT32 = _Row(1e-3, 0.0, 2e-3,
                   "TF32 on: GPU noise measured 1.9e-4..1.0e-3 of scale over 10 nets (H200), "
                   "batch-size drift 8e-5..1.0e-3; input x255/256 gives 3.7e-3..5.1e-3 on CNNs")
# TF32 off (--modelparity-tf32=off): full float32 matmul/conv. Noise 2.4e-7..2.2e-6 of scale,
# but a Transformer encoder's attention reaches 1.4e-4 (1.6e-4 on the recorded rows): the
# scale is ~2x that, so attention nets pass and bugs of 4e-4 of scale and up fail.
GPU_FLOAT32_STRICT = _Row(1.3e-6, 0.0, 3e-4,
                          "TF32 off: GPU noise measured 2.4e-7..2.2e-6 of scale over 10 nets (H200), "
                          "Transformer attention 1.4e-4..1.6e-4: ~2x that")

# Format variants whose arithmetic is coarser than the output dtype says. Measured by
# bench/measure_tolerances.py on tests/models.py's tiny_cnn and mlp (see docs/tolerances.md).
# (scale, min_top1, max_mismatch_fraction)
FORMAT_DEFAULTS: dict[str, tuple[float, float | None, float, str]] = {
    "tflite:float16": (3e-3, None, 0.0,
                       "float16 weights, float32 compute: max error 1.2e-4..4.5e-4 of scale over 10 "
                       "models (notes/formats.md: 9.5e-4 abs on a softmax CNN); top-1 100%"),
    "tflite:dynamic_range": (3e-2, 0.9, 0.02,
                             "int8 weights: max error <= 2.8e-3 of scale on tiny_cnn, 0% of elements "
                             "beyond 1e-2 of scale, top-1 >= 98.4% (notes: 0.043 abs, top-1 94%)"),
    "tflite:int8": (3e-2, 0.9, 0.02,
                    "int8 weights and activations: max error 1.3e-2..3.9e-1 of scale, but <= 0.5% of "
                    "elements beyond 3e-2 of scale; top-1 >= 97.7% (notes: top-1 91%)"),
}
# Formats that compute in the output dtype: the dtype row applies unchanged.
EXACT_FORMAT_ALIASES = {"tflite", "tflite:float32", "onnx", "tfjs", "saved_model", "graphdef",
                        "checkpoint", "keras", "h5"}


def _dtype(dtype: Any) -> np.dtype:
    if isinstance(dtype, np.dtype):
        return dtype
    try:
        return np.dtype(dtype)
    except TypeError:
        pass
    name = getattr(dtype, "name", dtype)  # tf.DType, keras dtype objects
    if str(name) == "bfloat16":
        return _bfloat16()
    try:
        return np.dtype(str(name))
    except TypeError:
        raise TypeError(f"{dtype!r} is not a dtype; pass a numpy dtype or name such as 'float32'") from None


def _bfloat16() -> np.dtype:
    try:
        import ml_dtypes  # noqa: F401 - installed with TensorFlow
        return np.dtype(ml_dtypes.bfloat16)
    except ImportError as exc:  # pragma: no cover - only without TensorFlow
        raise TypeError("bfloat16 needs the ml_dtypes package (installed with TensorFlow)") from exc


def dtype_key(dtype: Any) -> str:
    """``"float32"``, ``"bfloat16"``, ``"int8"``… the key of the built-in table."""
    dt = _dtype(dtype)
    return dt.name


def _is_exact_kind(dt: np.dtype) -> bool:
    return dt.kind in "iubSUO" or dt.kind == "M" or dt.kind == "m"


def _float_row(key: str, dt: np.dtype) -> _Row:
    if key in DTYPE_DEFAULTS:
        return DTYPE_DEFAULTS[key]
    if dt.kind == "c":  # complex: judge by the component float
        comp = {8: "float32", 16: "float64"}.get(dt.itemsize, "float64")
        return DTYPE_DEFAULTS[comp]
    # Unusual floats (float80/128, float8 variants from ml_dtypes): scale with epsilon.
    try:
        eps = float(np.finfo(dt).eps)
    except (TypeError, ValueError):
        return DTYPE_DEFAULTS["float32"]
    return _Row(max(eps * 8, 1e-7), 0.0, max(eps * 2, 1e-7) if eps > 1e-4 else eps * 84,
                f"derived from eps {eps:.2g}")


def default_tolerance(dtype: Any, *, device: str = "cpu", format: str | None = None,
                      tf32: bool | None = None) -> Tolerance:
    """The built-in tolerance for an output of ``dtype`` from ``format`` run on ``device``.

    Integers, bools, strings: exact. Floats: torch.testing's per-element rtol/atol plus a
    scale-aware term (see module docstring). ``device="gpu"`` loosens float32 to the measured
    GPU noise: with TF32 (``tf32=True``, TensorFlow's default) or without (``tf32=False``,
    ``--modelparity-tf32=off``); ``None`` reads the session's setting (``gpu_tf32``).
    ``format`` such as ``"tflite:int8"`` loosens further and adds a top-1 agreement check.
    """
    dt = _dtype(dtype)
    key = dt.name
    if _is_exact_kind(dt):
        return Tolerance(0.0, 0.0, source=f"built-in {key} (exact)")
    row = _float_row(key, dt)
    where = [f"built-in {key}"]
    dev = (device or "cpu").lower()
    if dev.startswith("gpu") or dev.startswith("cuda"):
        if key == "float32" or (dt.kind == "c" and dt.itemsize == 8):
            on = current_tf32() if tf32 is None else bool(tf32)
            row = GPU_FLOAT32 if on else GPU_FLOAT32_STRICT
            where.append("gpu (TF32 on)" if on else "gpu (TF32 off)")
    tol = Tolerance(row.rtol, row.atol, scale=row.scale, source="")
    fmt = (format or "").lower() or None
    if fmt is not None and fmt in FORMAT_DEFAULTS:
        scale, top1, frac, _why = FORMAT_DEFAULTS[fmt]
        tol = replace(tol, scale=max(tol.scale, scale), min_top1=top1, max_mismatch_fraction=frac)
        where.append(fmt)
    elif fmt is not None and fmt not in EXACT_FORMAT_ALIASES and fmt.startswith("tflite:"):
        # An unknown TFLite variant: be as loose as the loosest quantised one we measured.
        scale, top1, frac, _why = FORMAT_DEFAULTS["tflite:int8"]
        tol = replace(tol, scale=max(tol.scale, scale), min_top1=top1, max_mismatch_fraction=frac)
        where.append(f"{fmt} (unknown variant: int8 bounds)")
    return replace(tol, source=", ".join(where) + " (scaled rule)", default=True)


def shadow_tolerance(dtype: Any, measured: float, *, device: str = "cpu", format: str | None = None,
                     float16_weights: float | None = None, compute: str | None = None,
                     twin: str = "twin", reordered: float | None = None,
                     unproven: str | None = None, bulk_noise: Any = None) -> Tolerance:
    """The default for an output whose Keras reference ran beside its float64 twin.

    ``measured`` is max |ref32 - ref64| / max |ref64| of the output on the batch under test
    (``float16_weights`` the same for the twin with float16-rounded weights). The bound is
    ``SHADOW_MULTIPLE`` x that error (at least ``SHADOW_MIN_FLOOR_EPS`` eps) as a share of the
    output's largest magnitude. ``tflite:float16`` is judged by ``SHADOW_F16_MULTIPLE`` x
    what float16 weights cost; the other quantised variants keep their fixed rule (never
    tighter than the shadow); on a GPU the bound is never tighter than the GPU rule.
    ``compute`` names a mixed-precision model's compute dtype in the report, ``twin`` the
    twin that measured (``"Keras twin"``, ``"graph twin"``).

    ``reordered`` (the sharper floor, issue 27): max |ref32 - r32| / max |r32| against the
    reordered float32 twin (``graph_twin.reordered_graph_def``: product sums split in two,
    transcendental outputs moved an ULP), what another correct float32 implementation
    differs by. When it is at most ``REORDERED_AT_MOST`` of the float64 error and the
    candidate's ``format`` is one of ``REORDERED_FORMATS`` on the CPU, it judges in place of
    the float64 error (taken as at least ``REORDERED_MIN_SHARE`` of it), and the source says
    both figures.

    ``unproven`` (why no second estimate agrees with the float64 figure, ``needs_proof``): where
    the float64 floor would judge with a bound looser than the fixed rule, the fixed rule judges
    instead and its source says why.

    ``bulk_noise`` (``verdict.bulk.error_statistics`` of ref32 - ref64: median, q90, mean |.|)
    adds the bulk bounds (``Tolerance.bulk``) where the float64 floor judges a float32 form on the
    CPU (``bulk_applies``): its error's median, 90th percentile and mean signed value must each
    stay within a multiple of the noise's.
    """
    dt = _dtype(dtype)
    eps = eps_of(dt) or eps_of(np.float32)
    own = "float32" if compute in (None, "float32") else f"{compute} (mixed precision)"
    fmt = (format or "").lower() or None
    sharper = reordered is not None and compute in (None, "float32") and reordered <= REORDERED_AT_MOST * measured
    judged_by = sharper and reorder_applies(fmt) and not _on_gpu(device)
    if judged_by and reordered is not None:
        judged = max(float(reordered), REORDERED_MIN_SHARE * float(measured))
        floor = max(judged, SHADOW_MIN_FLOOR_EPS * eps)
        raised = ("" if judged >= floor else f", at least {SHADOW_MIN_FLOOR_EPS:g} eps") + (
            "" if reordered >= judged else f", at least 1/{1 / REORDERED_MIN_SHARE:g} of the float64 one")
        source = (f"{SHADOW_MULTIPLE:g} x the model's own float32 error as two float32 orders differ "
                  f"({reordered:.1e} of scale{raised}, from a reordered float32 run of its graph twin; "
                  f"{measured:.1e} from a float64 run of its {twin})")
    else:
        floor = max(float(measured), SHADOW_MIN_FLOOR_EPS * eps)
        raised = "" if measured >= floor else f", at least {SHADOW_MIN_FLOOR_EPS:g} eps"
        source = (f"{SHADOW_MULTIPLE:g} x the model's own {own} error ({measured:.1e} of scale"
                  f"{raised}, from a float64 run of its {twin})")
        if sharper:  # the sharper floor was measured, but not for this candidate's arithmetic
            where = "a GPU run" if _on_gpu(device) else (fmt or "this form")
            source += (f"; not its reordered float32 run's {reordered:.1e}, which judges only CPU forms "
                       f"summing in float32, not {where}")
    bulk = bounds_from_noise(bulk_noise, eps) if bulk_noise and compute in (None, "float32") and \
        bulk_applies(fmt) and not _on_gpu(device) else ()
    tol = Tolerance(0.0, 0.0, scale=SHADOW_MULTIPLE * floor, default=True, source=source, bulk=bulk,
                    float64_scale=SHADOW_MULTIPLE * max(float(measured), SHADOW_MIN_FLOOR_EPS * eps) if judged_by else None)
    if unproven is not None and not judged_by:
        fixed = default_tolerance(dt, device=device, format=format)
        if fixed.scale < tol.scale:
            # (worded without "run of its": the row's ``twin`` names a twin that judged, and none did)
            return replace(fixed, source=f"{fixed.source}: not {SHADOW_MULTIPLE:g} x the {measured:.1e} of scale its "
                                         f"{twin} measured in float64, which no second estimate confirms "
                                         f"({unproven})")
    if fmt == "tflite:float16" and float16_weights is not None:
        f16 = SHADOW_F16_MULTIPLE * max(float(float16_weights), floor)
        tol = replace(tol, scale=max(tol.scale, f16), bulk=(),
                      source=f"{SHADOW_F16_MULTIPLE:g} x what float16 weights cost the model "
                             f"({float16_weights:.1e} of scale, from a float16-weights run of its {twin})")
    elif fmt is not None and fmt.startswith("tflite:") and fmt not in EXACT_FORMAT_ALIASES:
        fixed = default_tolerance(dt, device=device, format=fmt)
        if fixed.scale >= tol.scale:
            return fixed
        tol = replace(fixed, scale=tol.scale, bulk=(), source=f"{tol.source}; {fmt}'s own rule is tighter")
    if _on_gpu(device):
        gpu = default_tolerance(dt, device=device)
        if gpu.scale > tol.scale:
            tol = replace(tol, scale=gpu.scale, rtol=gpu.rtol, bulk=(),
                          source=f"{gpu.source}: larger than {tol.source}")
    return tol


# The float32 error of the nets measured here (docs/tolerances.md): a Transformer encoder's
# 1.7e-7 .. ResNet50's 1.0e-4 of scale at 128x128. What a fixed rule costs is said against it.
MEASURED_FLOAT32_ERRORS = (1.7e-7, 1.0e-4)


def without_floor(tol: Tolerance, dtype: Any, reason: str) -> Tolerance:
    """``tol`` (a built-in fixed rule) marked as judging a model reference whose own float
    error could not be measured: the source says so, ``floor_note`` says why and what the
    fixed rule likely costs against the nets measured."""
    note = f"no float64 twin ({reason})"
    low, high = MEASURED_FLOAT32_ERRORS
    if _dtype(dtype).name == "float32" and tol.scale > 0:
        note += (f"; the fixed rule allows {tol.scale:.1e} of scale, {tol.scale / high:.0f}x to "
                 f"{tol.scale / low:,.0f}x the float32 error of the nets measured (a bug smaller than "
                 "that passes)")
    return replace(tol, source=f"{tol.source}, no float64 floor", floor_note=note)


def _on_gpu(device: str | None) -> bool:
    return (device or "cpu").lower().startswith(("gpu", "cuda"))


# --------------------------------------------------------------------------------------
# GPU precision in force: TF32 on (TensorFlow's default) or off (--modelparity-tf32=off)
# --------------------------------------------------------------------------------------

_TF32: ContextVar[bool] = ContextVar("modelparity_gpu_tf32", default=True)


@contextlib.contextmanager
def gpu_tf32(enabled: bool) -> Iterator[None]:
    """Judge GPU float32 outputs by the TF32-on or the TF32-off rule while the block runs.

    The plugin wraps each test in it with ``--modelparity-tf32``; turning TF32 off in
    TensorFlow itself is ``devices.set_tf32`` (this module knows nothing of TensorFlow).
    """
    token = _TF32.set(bool(enabled))
    try:
        yield
    finally:
        _TF32.reset(token)


def current_tf32() -> bool:
    """Whether GPU float32 is judged as TF32 (the default) in the current context."""
    return _TF32.get()


# --------------------------------------------------------------------------------------
# Resolution: argument > marker > ini > built-in
# --------------------------------------------------------------------------------------

Layer = tuple  # (source_name, rtol | None, atol | None)

_LAYERS: ContextVar[tuple[Layer, ...]] = ContextVar("modelparity_tolerance_layers", default=())


@contextlib.contextmanager
def tolerance_layers(layers: Sequence[Layer]) -> Iterator[None]:
    """Make ``layers`` (highest priority first, e.g. marker then ini) the ones every
    assertion resolves against while the ``with`` block runs. Nested blocks replace."""
    checked = tuple(_check_layer(layer) for layer in layers)
    token = _LAYERS.set(checked)
    try:
        yield
    finally:
        _LAYERS.reset(token)


def current_layers() -> tuple[Layer, ...]:
    """The layers set by the innermost active ``tolerance_layers`` block (or ``()``)."""
    return _LAYERS.get()


def _check_layer(layer: Any) -> Layer:
    try:
        name, rtol, atol = layer
    except (TypeError, ValueError):
        raise TypeError(f"a tolerance layer is (source_name, rtol or None, atol or None), got {layer!r}") from None
    return (str(name), _check_value("rtol", rtol, name), _check_value("atol", atol, name))


def _check_value(what: str, value: Any, source: str) -> float | None:
    # One validator for every rtol/atol, wherever it was given (validators.py).
    return check_tolerance_value(what, value, source)


def resolve_tolerance(dtype: Any, *, rtol: float | None = None, atol: float | None = None,
                      device: str = "cpu", format: str | None = None,
                      layers: Sequence[Layer] | None = None) -> Tolerance:
    """The tolerance an assertion uses, and where each half of it came from.

    No rtol/atol anywhere: the built-in scale-aware default. Otherwise the plain
    per-element rule (``scale=0``): each of rtol/atol is taken from the highest layer that
    gives it (argument, then ``layers``), and a missing one from the built-in table.
    The values apply to floating and complex outputs: ``compare`` judges integer and bool
    outputs exactly whatever this returns for their dtype (an id off by one is another
    answer, not rounding) and its report names the values it did not apply.
    """
    if layers is None:
        layers = current_layers()
    chain: list[Layer] = [("argument", _check_value("rtol", rtol, "argument"),
                           _check_value("atol", atol, "argument"))]
    chain.extend(_check_layer(layer) for layer in layers)
    found_rtol = next(((name, r) for name, r, _ in chain if r is not None), None)
    found_atol = next(((name, a) for name, _, a in chain if a is not None), None)
    builtin = default_tolerance(dtype, device=device, format=format)
    if found_rtol is None and found_atol is None:
        return builtin
    fallback = f"built-in {dtype_key(dtype)}"
    r_src, r_val = found_rtol if found_rtol else (fallback, builtin.rtol)
    a_src, a_val = found_atol if found_atol else (fallback, builtin.atol)
    if r_src == a_src:
        source = r_src
    else:
        source = f"rtol from {r_src}, atol from {a_src}"
    return Tolerance(float(r_val), float(a_val), source=source)


def exact_tolerance(source: str = "exact") -> Tolerance:
    """Bitwise equality (rtol=0, atol=0)."""
    return Tolerance(0.0, 0.0, source=source)


def eps_of(dtype: Any) -> float:
    """Machine epsilon of a float dtype (0.0 for exact kinds)."""
    dt = _dtype(dtype)
    if _is_exact_kind(dt):
        return 0.0
    try:
        return float(np.finfo(dt).eps)
    except (TypeError, ValueError):
        return float(np.finfo(np.float32).eps)


def less_precise(a: Any, b: Any) -> np.dtype:
    """Of two dtypes, the one whose defaults are looser (float16 vs float32 -> float16)."""
    da, db = _dtype(a), _dtype(b)
    if _is_exact_kind(da):
        return db
    if _is_exact_kind(db):
        return da
    return da if eps_of(da) >= eps_of(db) else db
