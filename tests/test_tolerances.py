"""Built-in tolerance table, format/device loosening, and the resolution order
(argument > marker > ini > built-in) through the ContextVar the plugin sets."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_modelparity.verdict import tolerances as t
from pytest_modelparity.verdict.compare import compare
from pytest_modelparity.verdict.tolerances import Tolerance, default_tolerance, resolve_tolerance


@pytest.mark.parametrize("dtype, rtol, scale", [
    ("float16", 1e-3, 2e-3),
    ("bfloat16", 1.6e-2, 1.6e-2),
    ("float32", 1.3e-6, 4e-4),
    ("float64", 1e-7, 1e-7),
])
def test_float_defaults_are_torch_per_element_plus_a_scale_term(dtype, rtol, scale):
    tol = default_tolerance(dtype)
    # no absolute term: an atol is a floor independent of the output, vacuous on tiny outputs
    assert (tol.rtol, tol.atol, tol.scale) == (rtol, 0.0, scale)
    assert tol.rule == "scaled" and tol.default and not tol.is_vacuous(1e-10)
    assert f"built-in {dtype}" in tol.source


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", bool, "bool"])
def test_integers_and_bools_are_exact(dtype):
    tol = default_tolerance(dtype)
    assert (tol.rtol, tol.atol, tol.scale) == (0.0, 0.0, 0.0)
    assert "exact" in tol.source


def test_scale_constants_grow_with_epsilon():
    scales = [default_tolerance(d).scale for d in ("float64", "float32", "float16", "bfloat16")]
    assert scales == sorted(scales)


def test_dtype_spellings():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 comes with TensorFlow: pip install ml_dtypes")
    assert default_tolerance(np.dtype(ml_dtypes.bfloat16)).scale == 1.6e-2
    assert default_tolerance(np.float32) == default_tolerance("float32")
    with pytest.raises(TypeError, match="not a dtype"):
        default_tolerance("no-such-dtype")


def test_gpu_loosens_float32_only():
    cpu, gpu = default_tolerance("float32"), default_tolerance("float32", device="gpu")
    assert gpu.scale > cpu.scale and gpu.rtol > cpu.rtol
    assert "TF32" in gpu.source
    assert default_tolerance("float64", device="gpu") == default_tolerance("float64")
    assert default_tolerance("int32", device="gpu").atol == 0.0


@pytest.mark.parametrize("fmt", ["tflite", "tflite:float32", "onnx", "tfjs", "saved_model", None])
def test_float32_formats_use_the_dtype_row(fmt):
    tol = default_tolerance("float32", format=fmt)
    assert (tol.rtol, tol.atol, tol.scale, tol.min_top1) == (1.3e-6, 0.0, 4e-4, None)


def test_quantised_tflite_is_looser_and_checks_top1():
    f16 = default_tolerance("float32", format="tflite:float16")
    dyn = default_tolerance("float32", format="tflite:dynamic_range")
    i8 = default_tolerance("float32", format="tflite:int8")
    assert default_tolerance("float32").scale < f16.scale < dyn.scale <= i8.scale
    assert f16.min_top1 is None
    assert i8.min_top1 == dyn.min_top1 == 0.9
    assert i8.max_mismatch_fraction == 0.02
    assert "tflite:int8" in i8.source
    unknown = default_tolerance("float32", format="tflite:int4")
    assert unknown.scale == i8.scale and "unknown variant" in unknown.source


def test_describe_names_rule_and_source():
    text = default_tolerance("float32", format="tflite:int8").describe()
    assert "x max|expected|" in text and "top-1 agreement >= 90%" in text and "2.0% of elements" in text


# --- resolution order ---------------------------------------------------------------

def test_nothing_given_is_the_built_in_default():
    assert resolve_tolerance("float32", layers=()) == default_tolerance("float32")


def test_explicit_arguments_are_plain_per_element():
    tol = resolve_tolerance("float32", rtol=1e-3, atol=1e-4, layers=[("marker", 1.0, 1.0)])
    assert (tol.rtol, tol.atol, tol.scale, tol.source) == (1e-3, 1e-4, 0.0, "argument")
    assert tol.rule == "elementwise"


def test_marker_beats_ini_and_each_half_comes_from_the_highest_layer():
    layers = [("marker", None, 1e-4), ("ini", 1e-2, 1e-3)]
    tol = resolve_tolerance("float32", layers=layers)
    assert (tol.rtol, tol.atol) == (1e-2, 1e-4)
    assert tol.source == "rtol from ini, atol from marker"
    tol = resolve_tolerance("float32", rtol=5e-3, layers=layers)
    assert (tol.rtol, tol.atol, tol.source) == (5e-3, 1e-4, "rtol from argument, atol from marker")


def test_one_value_alone_takes_the_other_from_the_built_in_table():
    tol = resolve_tolerance("float16", atol=0.5, layers=())
    assert (tol.rtol, tol.atol, tol.scale) == (1e-3, 0.5, 0.0)
    assert tol.source == "rtol from built-in float16, atol from argument"


def test_layers_come_from_the_context_and_are_restored():
    assert t.current_layers() == ()
    with t.tolerance_layers([("ini", 1e-2, None)]):
        assert resolve_tolerance("float32").rtol == 1e-2
        with t.tolerance_layers([("marker", 1e-1, None), ("ini", 1e-2, None)]):
            assert resolve_tolerance("float32").source.startswith("rtol from marker")
        assert resolve_tolerance("float32").source == "rtol from ini, atol from built-in float32"
    assert t.current_layers() == ()
    assert resolve_tolerance("float32") == default_tolerance("float32")


@pytest.mark.parametrize("bad, match", [
    ([("marker", "abc", None)], "not a number"),
    ([("ini", -1.0, None)], ">= 0"),
    ([("ini", float("nan"), None)], ">= 0"),
    ([("marker", 1.0)], "source_name, rtol"),
])
def test_bad_layers_are_refused_with_the_source_named(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        with t.tolerance_layers(bad):
            pass


def test_bad_argument_names_the_fix():
    with pytest.raises(ValueError, match="rtol='x' from argument"):
        resolve_tolerance("float32", rtol="x")


# --- the rule itself, judged by compare (numpy only) --------------------------------

def test_seed_004_numbers_pass_the_default_and_fail_torch_defaults():
    batched = np.full(3, 729027.5625, np.float32)
    single = np.full(3, 729026.4375, np.float32)
    assert compare(single, batched).passed
    assert not compare(single, batched, tolerance=Tolerance(1.3e-6, 1e-5, source="torch")).passed


def test_the_scale_term_covers_cancelled_elements_near_zero():
    expected = np.array([351.0, -0.002], np.float32)
    actual = np.array([351.0, 0.001], np.float32)     # 3e-3 off on a near-zero element
    assert compare(actual, expected).passed           # 1e-5 * 351 = 3.5e-3 allowed
    assert not compare(actual, expected, tolerance=Tolerance(1.3e-6, 1e-5)).passed
    wrong = np.array([351.0 * 255 / 256, -0.002], np.float32)
    assert not compare(wrong, expected).passed


def test_less_precise_dtype_is_the_looser_one():
    assert t.less_precise("float16", "float32") == np.dtype("float16")
    assert t.less_precise("int32", "float64") == np.dtype("float64")
    assert t.eps_of("int8") == 0.0
