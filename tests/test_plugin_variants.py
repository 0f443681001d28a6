"""Quantised TFLite variants (``tflite:float16``, ``tflite:dynamic_range``, ``tflite:int8``)
in the format matrix: ids, export with ``quantization=``, default tolerances, usage errors."""

from __future__ import annotations

import json
import textwrap

import pytest

from pytest_modelparity.formats import available_formats
from pytest_modelparity.formats import tflite
from pytest_modelparity.plugin.options import FORMAT_VARIANTS, VALID_FORMATS

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]

CONFTEST = textwrap.dedent('''
    import pytest

    def build():
        import keras
        x = keras.Input((8,), name="x")
        h = keras.layers.Dense(256, activation="relu", name="h",
                               kernel_initializer=keras.initializers.GlorotUniform(seed=1))(x)
        y = keras.layers.Dense(4, name="out", kernel_initializer=keras.initializers.GlorotUniform(seed=2))(h)
        # 8x256 and 256x4 weights: the converter leaves tensors under 1024 elements float
        return keras.Model(x, y, name="tiny")

    @pytest.fixture(scope="session")
    def modelparity_source():
        return build
''')

TEST = textwrap.dedent('''
    from pytest_modelparity import assert_outputs_close

    def test_export(parity_candidate, parity_reference, parity_batch, modelparity_format):
        assert parity_candidate.format == "tflite"
        assert parity_candidate.format_variant == (
            "tflite:float32" if modelparity_format == "tflite" else modelparity_format)
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
''')


def test_variants_mirror_the_exporter_and_stay_out_of_the_default_set() -> None:
    assert FORMAT_VARIANTS["tflite"] == tuple(q for q in tflite.QUANTIZATIONS if q != "float32")
    assert {"tflite:float16", "tflite:dynamic_range", "tflite:int8"} <= set(VALID_FORMATS)
    assert not any(":" in f for f in available_formats())


def test_variants_parametrize_export_quantised_and_pass_at_their_default(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_q=TEST)
    result = pytester.runpytest("-v", "-p", "no:cacheprovider", "--modelparity-no-cache",
                                "--modelparity-formats=tflite,tflite:float16,tflite:dynamic_range,tflite:int8",
                                "--modelparity-report=r.json")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*test_export[[]tflite-cpu[]] PASSED*",
                                 "*test_export[[]tflite:float16-cpu[]] PASSED*",
                                 "*test_export[[]tflite:dynamic_range-cpu[]] PASSED*",
                                 "*test_export[[]tflite:int8-cpu[]] PASSED*"])
    doc = json.loads((pytester.path / "r.json").read_text())
    assert sorted(a["format"] for a in doc["artifacts"]) == [
        "tflite", "tflite:dynamic_range", "tflite:float16", "tflite:int8"]
    rows = {(r["format"], (r["quantized"] or {}).get("part")): r for r in doc["rows"]}
    # A quantised variant is judged in two parts (quantized.py): its float32 sibling by the
    # float32 rule, and what quantisation costs by its own variant's budget, int8 the loosest.
    assert set(rows) == {("tflite", None), *((f"tflite:{v}", part) for v in ("float16", "dynamic_range", "int8")
                                              for part in ("conversion", "quantisation")),
                         ("tflite:float16", "float16 weights")}
    assert all(r["verdict"] == "pass" for r in rows.values())
    int8, f16, f32 = rows["tflite:int8", "quantisation"], rows["tflite:float16", "quantisation"], rows["tflite", None]
    assert "tflite:int8" in int8["tolerance_source"] and "tflite" not in f32["tolerance_source"], (int8, f32)
    assert int8["scale"] > f16["scale"] > f32["scale"], (int8, f32)
    assert rows["tflite:int8", "conversion"]["scale"] == f32["scale"]


def test_marker_selects_a_variant_and_ini_accepts_one(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nmodelparity_formats = keras,tflite:int8\n")
    pytester.makepyfile(test_m=textwrap.dedent('''
        import pytest
        from pytest_modelparity import assert_outputs_close

        @pytest.mark.modelparity(formats=["tflite:int8"])
        def test_int8(parity_candidate, parity_reference, parity_batch, modelparity_format):
            assert modelparity_format == "tflite:int8"
            assert parity_candidate.format_variant == "tflite:int8"
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)

        def test_all(modelparity_format, modelparity_device):
            pass
    '''))
    result = pytester.runpytest("-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    for line in ("*test_int8[[]tflite:int8-cpu[]] PASSED*", "*test_all[[]keras-cpu[]] PASSED*",
                 "*test_all[[]tflite:int8-cpu[]] PASSED*"):
        result.stdout.fnmatch_lines([line])


def test_unknown_variant_is_a_usage_error_listing_the_valid_names(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest("--modelparity-formats=tflite:int4")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown format(s) 'tflite:int4'*valid formats:*tflite:float16, "
                                 "tflite:dynamic_range, tflite:int8*"])


def test_unknown_variant_in_the_marker_fails_naming_the_valid_ones(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_m=textwrap.dedent('''
        import pytest

        @pytest.mark.modelparity(formats=["onnx:int8"])
        def test_bad(parity_candidate):
            pass
    '''))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*formats=...) names unknown format(s) 'onnx:int8'*tflite:dynamic_range, tflite:int8*"])
    assert result.ret != 0


def test_an_int8_candidate_fed_inputs_outside_its_calibration_range_says_so(pytester: pytest.Pytester) -> None:
    """Calibrated on parity_batch-like rows ([-1, 1]); a test feeding 0-255 pixels fails, and
    the failure names the input and both ranges instead of leaving the drift unexplained."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_q=textwrap.dedent('''
        import numpy as np
        from pytest_modelparity import assert_outputs_close

        def test_pixels(parity_candidate, parity_reference):
            x = np.random.default_rng(0).uniform(0, 255, (16, 8)).astype("float32")
            assert_outputs_close(parity_candidate, parity_reference, inputs={"x": x})
    '''))
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-no-cache", "--modelparity-formats=tflite:int8")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*leave the range the int8 model was calibrated on*",
                                 "*input 'x' spans [[]*, 254*]; the int8 file's input quantisation represents [[]-0.99*, 1.0*] "
                                 "(its calibration rows spanned [[]-0.99*, 0.99*])*"])


def test_int8_calibration_draws_from_the_batches_element_range(pytester: pytest.Pytester) -> None:
    """modelparity_elements is the one source of input ranges: parity_batch draws 0-255 from it
    and the int8 candidate is calibrated on rows from the same range, so it passes there."""
    pytester.makeconftest(CONFTEST + textwrap.dedent('''
        @pytest.fixture(scope="session")
        def modelparity_elements():
            return (0, 255)
    '''))
    pytester.makepyfile(test_q=textwrap.dedent('''
        from pytest_modelparity import assert_outputs_close

        def test_pixels(parity_candidate, parity_reference, parity_batch):
            assert float(parity_batch["x"].max()) > 10  # drawn from the fixture's range
            assert parity_candidate.calibration_ranges["x"][1] > 200
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
    '''))
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-no-cache", "--modelparity-formats=tflite:int8")
    result.assert_outcomes(passed=1)
