"""Checks and formats that cannot apply to a model skip, saying why and what to do, instead of
passing (a comparison that cannot fail) or erroring (a format that cannot carry the model):

- an LSTM's TFLite export is traced at a fixed batch of 1 and runs every batch one row at a
  time: ``assert_batch_invariant`` on it compares that computation with itself;
- a string-input model with a lookup table cannot be carried by graphdef (no tables), onnx
  (no tables) or tfjs (no strings): in the default matrix those formats skip, and the tfjs
  advice names formats that do carry it;
- a recorded run answers only the batches it recorded, with the same arrays: batch invariance
  and determinism on it skip, saying so.

Tiny models, real TensorFlow, LiteRT, tf2onnx, tensorflowjs and Node.js.
"""

from __future__ import annotations

import textwrap
import unittest

import numpy as np
import pytest

from families import recurrent, string_input
from pytest_modelparity import errors

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]


@pytest.fixture(scope="module")
def lstm_tflite(tmp_path_factory):
    from pytest_modelparity import export_model, load_model

    model, tokens = recurrent("lstm")
    loaded = load_model(export_model(model, "tflite", tmp_path_factory.mktemp("lstm") / "m.tflite"))
    assert loaded.fixed_batch == 1  # the route the LSTM takes: traced at batch 1
    yield model, loaded, tokens
    loaded.close()


def test_batch_invariance_of_a_batch_1_tflite_file_is_not_applicable(lstm_tflite):
    from pytest_modelparity import NotApplicable, assert_batch_invariant

    model, loaded, tokens = lstm_tflite
    with pytest.raises(NotApplicable) as info:
        assert_batch_invariant(loaded, tokens, batch_sizes=(1, 2))
    assert isinstance(info.value, unittest.SkipTest)  # pytest and unittest report a skip
    text = str(info.value)
    assert "fixed batch of 1" in text and "cannot fail" in text and "reference" in text
    assert_batch_invariant(model, tokens, batch_sizes=(1, 2))  # the Keras model still is checked


def test_a_fixed_batch_that_the_sub_batches_regroup_is_still_checked(tmp_path):
    """At a fixed batch of 4, sub-batches of 1 run padded to 4: a different computation, checked."""
    from pytest_modelparity import assert_batch_invariant, export_model, load_model

    model, tokens = recurrent("lstm")
    path = export_model(model, "tflite", tmp_path / "m.tflite", converter_options={"static_batch": 4})
    with load_model(path) as loaded:
        assert loaded.fixed_batch == 4
        assert_batch_invariant(loaded, tokens, batch_sizes=(1,))


def test_the_plugin_skips_it_with_the_reason(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        import pytest
        from families import recurrent

        @pytest.fixture(scope="session")
        def modelparity_source():
            return recurrent("lstm")[0]
    """)
    pytester.makepyfile("""
        from pytest_modelparity import assert_batch_invariant

        def test_batch_invariant(parity_candidate, parity_batch):
            assert_batch_invariant(parity_candidate, parity_batch, batch_sizes=(1, 3))
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", "--modelparity-formats=keras,tflite")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*test_the_plugin_skips_it_with_the_reason.py:*assert_batch_invariant does not apply*"
                                 "fixed batch of 1*"])


README_SUITE = """
    from pytest_modelparity import assert_outputs_close, assert_deterministic, assert_batch_invariant

    def test_export(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)

    def test_deterministic(parity_candidate, parity_batch):
        assert_deterministic(parity_candidate, parity_batch)

    def test_batch_invariant(parity_candidate, parity_batch):
        assert_batch_invariant(parity_candidate, parity_batch, batch_sizes=(1, 3))
"""


def test_checks_a_recording_cannot_take_skip_with_the_reason(pytester: pytest.Pytester) -> None:
    """Issue 50: with a recording in the matrix, README's own test_batch_invariant always failed with a
    50-line traceback (a recording answers only the batches it recorded). Batch invariance and
    determinism (the same recorded arrays read again) skip, saying why; the comparison runs."""
    from models import RECORDED_CONFTEST

    from pytest_modelparity import load_model, record_outputs
    from pytest_modelparity.checks.strategies import seeded_batch
    from pytest_modelparity.plugin.session import BATCH_SEED, BATCH_SIZE

    scope: dict = {}
    exec(textwrap.dedent(RECORDED_CONFTEST), scope)  # the conftest's own model, to record it on parity_batch
    model = scope["build"]()
    record_outputs(model, seeded_batch(load_model(model), batch_size=BATCH_SIZE, seed=BATCH_SEED),
                   pytester.path / "rec")
    pytester.makeconftest(RECORDED_CONFTEST)
    pytester.makepyfile(test_readme=README_SUITE)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", "--modelparity-formats=recorded:rec")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines([
        "SKIPPED*test_readme.py:*assert_deterministic does not apply to recorded*: it reruns the model on the same "
        "inputs, and a recording answers them with the same recorded arrays every time, so it cannot fail*",
        "SKIPPED*test_readme.py:*assert_batch_invariant does not apply to recorded*: it runs the batch cut into "
        "sub-batches, and a recording answers only the whole batches it recorded*the live export of the recorded "
        "format)"])
    assert "BatchMismatchError" not in result.stdout.str()


STRING_CONFTEST = """
    import pytest
    from families import string_input

    @pytest.fixture(scope="session")
    def modelparity_source():
        return string_input()[0]

    @pytest.fixture(scope="module")
    def words():
        return {"words": string_input()[1]}
"""

STRING_TEST = """
    from pytest_modelparity import assert_outputs_close

    def test_export(parity_candidate, parity_reference, words):
        assert_outputs_close(parity_candidate, parity_reference, inputs=words)
"""


def test_a_string_model_skips_the_formats_that_cannot_carry_it_in_the_default_matrix(
        pytester: pytest.Pytester) -> None:
    from pytest_modelparity import FORMATS

    pytester.makeconftest(STRING_CONFTEST)
    pytester.makepyfile(STRING_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    out = result.stdout.str()
    assert result.ret == 0, out[-4000:]
    assert "error" not in out.splitlines()[-1], out[-2000:]
    for fmt in ("graphdef", "onnx", "tfjs"):
        if fmt in FORMATS:
            result.stdout.fnmatch_lines([f"SKIPPED*format {fmt!r} does not apply to this model*"])
    if "tfjs" in FORMATS:
        # the advice names the formats this run exported and compared for the model (issue 50)
        result.stdout.fnmatch_lines(["SKIPPED*format 'tfjs'*string tensor*compare this model through keras or h5 or "
                                     "saved_model or tflite (exported and compared for this model in this session)*"])
    assert result.parseoutcomes()["passed"] >= 2  # keras and saved_model carry it and pass
    assert "format 'keras' does not apply" not in out and "format 'saved_model' does not apply" not in out


def test_named_it_is_a_failure_with_the_fix(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(STRING_CONFTEST)
    pytester.makepyfile(STRING_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=graphdef")
    result.assert_outcomes(errors=1)
    # nothing else ran: the advice names no format as working, and the ones it would try as untried
    result.stdout.fnmatch_lines(["*lookup tables*", "*fix: no format has been exported and compared for this model in "
                                 "this session so far (keras and saved_model not tried here)*"])


def test_the_tfjs_advice_names_only_formats_that_carry_the_model():
    from pytest_modelparity.formats.tfjs.load import STRING_INPUT_FIX

    assert "graphdef only when the model has no lookup table" in STRING_INPUT_FIX
    assert "keras and saved_model" in STRING_INPUT_FIX


def test_the_exceptions_say_not_applicable(tmp_path):
    from pytest_modelparity import export_model

    model, _ = string_input()
    with pytest.raises(errors.ExportError) as info:
        export_model(model, "graphdef", tmp_path / "m.pb")
    assert info.value.not_applicable
    with pytest.raises(errors.ModelLoadError) as info:
        export_model(model, "tfjs", tmp_path / "web")
    assert info.value.not_applicable
    assert not errors.ModelLoadError("m", "onnx", "truncated").not_applicable
