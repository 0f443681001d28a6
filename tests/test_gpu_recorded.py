"""The GPU rules against real GPU noise recorded on an NVIDIA H200 (tests/data/README.md).

No GPU is needed: the outputs of 10 networks (CPU float32 reference vs GPU in four modes)
were recorded once; these tests judge them with the built-in rules the plugin uses, so a
change of constant that would fail real GPU noise, or let an error above 3e-3 of the
output's scale through, fails here in CI.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pytest_modelparity.verdict import tolerances as tol
from pytest_modelparity.verdict.compare import compare

DATA = Path(__file__).parent / "data"
NPZ = DATA / "gpu_drift_h200.npz"
FIGURES = DATA / "gpu_drift_h200.json"
NETS = ("mlp_784_1024_10", "regression_1e5", "resnet18", "resnet50", "mobilenet_v3_small",
        "efficientnet_b0", "efficientnet_b4", "convnext_tiny", "transformer_enc4", "bilstm2")
MODES = ("fp32", "tf32", "float16", "bfloat16")
# The float16 pairs of these random-weight nets overflowed to NaN on the GPU (recorded as is).
OVERFLOWED = (("mobilenet_v3_small", "float16"), ("efficientnet_b0", "float16"), ("efficientnet_b4", "float16"))
# Every GPU float32 bound and the float16 bound allow at most this share of the output's
# scale at its largest element (rtol + scale); a planted error above it must fail.
WIDEST_FLOAT32 = 3e-3


@pytest.fixture(scope="module")
def pairs() -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    with np.load(NPZ) as z:
        return {(net, mode): (z[f"{net}__{mode}__actual"], z[f"{net}__{mode}__expected"])
                for net in NETS for mode in MODES}


def rule(mode: str) -> tol.Tolerance:
    """The built-in rule the plugin applies to a GPU output recorded in ``mode``."""
    if mode == "fp32":
        return tol.default_tolerance("float32", device="gpu", tf32=False)
    if mode == "tf32":
        return tol.default_tolerance("float32", device="gpu", tf32=True)
    # Autocast: float32 outputs computed in float16/bfloat16 are judged by the compute dtype
    # (assertions take the less precise of output and compute dtype).
    return tol.default_tolerance(mode, device="gpu")


def norm_err(actual: np.ndarray, expected: np.ndarray) -> float:
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    return float(np.max(np.abs(a - e)) / np.max(np.abs(e)))


FINITE = [(n, m) for n in NETS for m in MODES if (n, m) not in OVERFLOWED]


def test_the_data_is_the_recording_the_docs_quote(pairs):
    """Every net and mode is there, and the figures match docs/tolerances.md's table."""
    assert len(pairs) == len(NETS) * len(MODES)
    fp32 = {n: norm_err(*pairs[(n, "fp32")]) for n in NETS}
    assert max(v for n, v in fp32.items() if n != "transformer_enc4") < 3e-6
    assert 1e-4 < fp32["transformer_enc4"] < 2e-4  # attention: the strict rule's reason
    tf32 = [norm_err(*pairs[(n, "tf32")]) for n in NETS]
    assert 1.5e-4 < min(tf32) and max(tf32) < 1.3e-3
    for net, mode in OVERFLOWED:
        assert np.isnan(pairs[(net, mode)][0]).any()
    rows = json.loads(FIGURES.read_text())["rows"]
    assert {r["model"] for r in rows if r.get("kind") == "noise"} >= set(NETS)


@pytest.mark.parametrize("net,mode", FINITE, ids=[f"{n}-{m}" for n, m in FINITE])
def test_recorded_gpu_noise_passes_the_rule_for_its_mode(pairs, net, mode):
    actual, expected = pairs[(net, mode)]
    report = compare(actual, expected, tolerance=rule(mode))
    assert report.passed, f"{net} {mode}: {norm_err(actual, expected):.3g} of scale\n{report}"


@pytest.mark.parametrize("net", NETS)
def test_strict_gpu_noise_passes_the_tf32_rule_too(pairs, net):
    """TF32 on is the looser rule: a GPU that happens to run full float32 passes it."""
    assert compare(*pairs[(net, "fp32")], tolerance=rule("tf32")).passed


def test_tf32_noise_is_why_the_gpu_needs_its_own_rule(pairs):
    """Judged by the CPU float32 fixed rule (4e-4 of scale: deep nets' correct CPU forms
    drift 1.8e-4) most TF32 pairs fail; by the TF32-off rule most do too."""
    cpu = tol.default_tolerance("float32")
    strict = rule("fp32")
    failing_cpu = [n for n in NETS if not compare(*pairs[(n, "tf32")], tolerance=cpu).passed]
    assert len(failing_cpu) >= 6, failing_cpu
    failing_strict = [n for n in NETS if not compare(*pairs[(n, "tf32")], tolerance=strict).passed]
    assert len(failing_strict) >= 7, failing_strict  # TF32 off must mean tighter, measurably


@pytest.mark.parametrize("net,mode", OVERFLOWED)
def test_an_overflowed_gpu_output_fails(pairs, net, mode):
    """NaN from a float16 overflow is a failure, never a silent pass."""
    report = compare(*pairs[(net, mode)], tolerance=rule(mode))
    assert not report.passed


# -- planted errors -------------------------------------------------------------------

def plant(actual: np.ndarray, expected: np.ndarray, size: float, where: str) -> np.ndarray:
    """``actual`` with an error of exactly ``size`` x max|expected| added at one element, in
    the direction of the noise already there (so the total error there is at least that)."""
    a = actual.astype(np.float64).copy()
    e = expected.astype(np.float64)
    flat = np.abs(e).ravel()
    index = int(np.argmax(flat)) if where == "largest" else int(np.argmin(flat))
    diff = (a - e).ravel()[index]
    sign = 1.0 if diff >= 0 else -1.0
    a.ravel()[index] += sign * size * float(np.max(flat))
    return a.astype(actual.dtype)


FLOAT32_AND_FP16 = [(n, m) for n, m in FINITE if m != "bfloat16"]


@pytest.mark.parametrize("size", [3.1e-3, 5e-3, 1e-2, 5e-2])
@pytest.mark.parametrize("net,mode", FLOAT32_AND_FP16, ids=[f"{n}-{m}" for n, m in FLOAT32_AND_FP16])
def test_errors_above_3e3_of_scale_fail_where_the_output_is_largest(pairs, net, mode, size):
    actual, expected = pairs[(net, mode)]
    rules = [rule(mode)] + ([rule("tf32")] if mode == "fp32" else [])
    for r in rules:
        assert r.rtol + r.scale <= WIDEST_FLOAT32  # the bound the planted sizes are set above
        report = compare(plant(actual, expected, size, "largest"), expected, tolerance=r)
        assert not report.passed, f"{net} {mode}: planted {size:g} of scale passed {r.describe()}"


@pytest.mark.parametrize("net,mode", FLOAT32_AND_FP16, ids=[f"{n}-{m}" for n, m in FLOAT32_AND_FP16])
def test_errors_above_2e3_fail_where_the_output_is_near_zero(pairs, net, mode):
    """Away from the peak the rtol part vanishes: the bound there is the scale term alone."""
    actual, expected = pairs[(net, mode)]
    report = compare(plant(actual, expected, 2.1e-3, "smallest"), expected, tolerance=rule(mode))
    assert not report.passed


@pytest.mark.parametrize("net", NETS)
def test_tf32_off_sees_errors_tf32_noise_would_hide(pairs, net):
    """Under TF32 off an error of 4e-4 of scale (ConvNeXt's input x255/256 is 6.3e-4,
    the Transformer's 4.3e-4) fails, while the TF32-on rule lets it through."""
    actual, expected = pairs[(net, "fp32")]
    planted = plant(actual, expected, 4e-4, "largest")
    assert not compare(planted, expected, tolerance=rule("fp32")).passed
    assert compare(planted, expected, tolerance=rule("tf32")).passed


@pytest.mark.parametrize("net", [n for n in NETS])
def test_bfloat16_planted_errors_above_its_bound_fail(pairs, net):
    """bfloat16 autocast noise reaches 1.5e-2 of scale; its rule (rtol + scale 3.2e-2) still
    fails an error of 4e-2 of scale planted on the same arrays."""
    actual, expected = pairs[(net, "bfloat16")]
    r = rule("bfloat16")
    assert r.rtol + r.scale < 4e-2
    assert not compare(plant(actual, expected, 4e-2, "largest"), expected, tolerance=r).passed


# -- which rule is in force -------------------------------------------------------------

def test_the_source_says_whether_tf32_was_on():
    assert "gpu (TF32 on)" in tol.default_tolerance("float32", device="gpu").source
    assert "gpu (TF32 off)" in tol.default_tolerance("float32", device="gpu", tf32=False).source
    with tol.gpu_tf32(False):
        strict = tol.resolve_tolerance("float32", device="gpu:1", layers=())
        assert "TF32 off" in strict.source and strict.scale == tol.GPU_FLOAT32_STRICT.scale
    assert tol.current_tf32() is True  # the block restores the default


def test_tf32_changes_only_gpu_float32():
    for tf32 in (True, False):
        assert tol.default_tolerance("float32", tf32=tf32) == tol.default_tolerance("float32")
        assert tol.default_tolerance("float16", device="gpu", tf32=tf32) == \
            tol.default_tolerance("float16", device="gpu")
