"""--modelparity-tf32: TensorFlow's TF32 switch for the session, the GPU rule it selects, and
what the reports say (pytester, a tiny Dense model; no GPU needed: the switch and the rule
are real on a CPU too, only their effect on arithmetic needs a GPU)."""

from __future__ import annotations

import json
import textwrap

import pytest

from pytest_modelparity.runtime.devices import onnx_providers, set_tf32, tf32_enabled

from models import TINY_SOURCE_CONFTEST

# inline_exports (conftest.py): no export worker; the process is not what these tests are about
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]

CONFTEST = TINY_SOURCE_CONFTEST

# Inside the run: TensorFlow's switch, and the rule a GPU float32 output would be judged by.
PROBE = textwrap.dedent('''
    import tensorflow as tf
    from pytest_modelparity import assert_outputs_close
    from pytest_modelparity.verdict import tolerances

    def test_probe(parity_candidate, parity_reference, parity_batch, record_property):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
        gpu = tolerances.default_tolerance("float32", device="gpu")
        print("TF32_ENABLED", tf.config.experimental.tensor_float_32_execution_enabled())
        print("GPU_RULE", gpu.scale, gpu.source)
''')


@pytest.mark.parametrize("how", ["--modelparity-tf32=off", "ini"])
def test_tf32_off_turns_tensorflow_tf32_off_and_selects_the_strict_rule(pytester: pytest.Pytester, how) -> None:
    import tensorflow as tf

    from pytest_modelparity.verdict.tolerances import GPU_FLOAT32_STRICT

    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_probe=PROBE)
    args = ["-s", "--modelparity-formats=keras", "--modelparity-report=r.json"]
    if how == "ini":
        pytester.makeini("[pytest]\nmodelparity_tf32 = off\n")
    else:
        args.append(how)
    assert tf.config.experimental.tensor_float_32_execution_enabled()
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["modelparity: TF32 off (--modelparity-tf32=off)*",
                                 "*TF32_ENABLED False", f"GPU_RULE {GPU_FLOAT32_STRICT.scale} *gpu (TF32 off)*"])
    doc = json.loads((pytester.path / "r.json").read_text())
    assert doc["options"]["tf32"] == "off"
    # TensorFlow's switch is process-wide: the session gives it back when it ends.
    assert tf.config.experimental.tensor_float_32_execution_enabled() and tf32_enabled()


def test_tf32_on_is_the_default_and_leaves_tensorflow_alone(pytester: pytest.Pytester) -> None:
    from pytest_modelparity.verdict.tolerances import GPU_FLOAT32

    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_probe=PROBE)
    result = pytester.runpytest("-s", "--modelparity-formats=keras", "--modelparity-report=r.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*TF32_ENABLED True", f"GPU_RULE {GPU_FLOAT32.scale} *gpu (TF32 on)*"])
    assert "TF32 off" not in result.stdout.str()
    assert json.loads((pytester.path / "r.json").read_text())["options"]["tf32"] == "on"


def test_bad_tf32_value_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--modelparity-tf32=maybe")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--modelparity-tf32: 'maybe' is not on or off; valid: on, off*"])


def test_tf32_off_does_not_import_tensorflow_at_start(pytester: pytest.Pytester) -> None:
    """The switch is applied when the plugin loads a model, never at pytest start."""
    pytester.makepyfile("""
        import sys
        def test_no_model():
            assert "tensorflow" not in sys.modules
    """)
    result = pytester.runpytest_subprocess("--modelparity-tf32=off", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_onnx_cuda_provider_gets_use_tf32_off():
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert onnx_providers("gpu", available=cuda, tf32=False)[0] == \
        ("CUDAExecutionProvider", {"device_id": 0, "use_tf32": "0"})
    assert onnx_providers("gpu", available=cuda, tf32=True)[0] == ("CUDAExecutionProvider", {"device_id": 0})
    previous = set_tf32(False)
    try:  # without tf32=: the session's choice
        assert onnx_providers("gpu:1", available=cuda)[0][1] == {"device_id": 1, "use_tf32": "0"}
        assert onnx_providers("cpu", available=cuda) == ["CPUExecutionProvider"]
    finally:
        set_tf32(previous)
    assert tf32_enabled()
