"""What docs/plugin.md now says a new user could not find: format names are read
spelling-insensitively (``SavedModel``, ``savedmodel``, ``TFLite``) in the option and the marker,
and a missing ``--modelparity-reference-device`` skips tests that only use ``parity_batch`` too,
saying why (the batch is drawn from the reference's inputs)."""

from __future__ import annotations

import pytest

from models import TINY_SOURCE_CONFTEST
from pytest_modelparity.runtime import devices

# inline_exports (conftest.py): no export worker; the process is not what these tests are about
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]


def test_format_aliases_in_the_option_and_the_marker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest

        def test_any(modelparity_format, modelparity_device):
            pass

        @pytest.mark.modelparity(formats=["savedmodel", "Saved-Model", "TFLite:INT8"])
        def test_marked(modelparity_format, modelparity_device):
            pass
    """)
    result = pytester.runpytest("--collect-only", "-q", "--modelparity-formats=SavedModel,TFLite,tflite:int8,GraphDef")
    out = result.stdout.str()
    for item in ("test_any[saved_model-cpu]", "test_any[tflite-cpu]", "test_any[graphdef-cpu]",
                 "test_any[tflite:int8-cpu]", "test_marked[saved_model-cpu]", "test_marked[tflite:int8-cpu]"):
        assert item in out, out
    assert "test_marked[tflite-cpu]" not in out and "test_marked[graphdef-cpu]" not in out


def test_a_missing_reference_device_skips_parity_batch_users_saying_why(pytester: pytest.Pytester) -> None:
    if devices.missing_gpu("gpu") is None:
        pytest.skip("this machine has a GPU: the reference would run there")
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile("""
        from pytest_modelparity import assert_deterministic

        def test_deterministic(parity_candidate, parity_batch):   # never names parity_reference
            assert_deterministic(parity_candidate, parity_batch)
    """)
    result = pytester.runpytest("-rs", "--modelparity-formats=keras", "--modelparity-reference-device=gpu")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*modelparity: reference on gpu (parity_reference, and parity_batch, which is "
                                 "drawn from the reference's inputs)*TensorFlow sees no GPU*"])
