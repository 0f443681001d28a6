"""``modelparity_load_options``: a frozen TF1 graph whose outputs cannot be found automatically.

The graph has two sinks (the softmax and a mean of the logits, neither an Identity), so
``load_model`` refuses to guess; the suite passes once the fixture names the tensors.
"""

from __future__ import annotations

import textwrap

import pytest

from tf1_graphs import NAMED_OUTPUT_OPTIONS, TWO_SINKS_CONFTEST

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]

TEST = textwrap.dedent('''
    from pytest_modelparity import assert_outputs_close

    def test_export(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
''')



def test_ambiguous_graph_fails_clearly_without_load_options(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TWO_SINKS_CONFTEST)
    pytester.makepyfile(test_graph=TEST)
    result = pytester.runpytest("--modelparity-formats=graphdef", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert "cannot tell the output tensor: the graph has 2 candidate sink(s)" in out
    assert "mean_logit:0" in out and "predictions:0" in out
    assert "def modelparity_load_options" in out  # the fix, as a suite writes it


def test_load_options_name_the_tensors_for_reference_and_candidate(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TWO_SINKS_CONFTEST + NAMED_OUTPUT_OPTIONS)
    pytester.makepyfile(test_graph=TEST + textwrap.dedent('''
        def _loaded_with_the_options(model):
            assert model.format == "graphdef"
            assert len(model.outputs) == 1 and model.outputs[0].shape[-1] == 3, model.outputs
            assert len(model.inputs) == 1

        def test_options_reach_the_candidate(parity_candidate, modelparity_format):
            assert modelparity_format == "graphdef"
            _loaded_with_the_options(parity_candidate)

        def test_options_reach_the_reference(parity_reference):
            _loaded_with_the_options(parity_reference)
    '''))
    result = pytester.runpytest("-v", "--modelparity-formats=graphdef", "-p", "no:cacheprovider")
    # the .pb as its own graphdef candidate is the file compared with itself: that comparison is
    # skipped and the run compared nothing (not_compared.py); the options reach both all the same
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*test_export[[]graphdef-cpu[]] SKIPPED*",
                                 "*test_options_reach_the_candidate[[]graphdef-cpu[]] PASSED*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["modelparity: NOTHING WAS COMPARED*"])


def test_an_option_the_loader_lacks_is_named(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TWO_SINKS_CONFTEST + textwrap.dedent('''
        @pytest.fixture(scope="session")
        def modelparity_load_options():
            return {"outputs": ["predictions:0"], "output_names": ["predictions"]}
    '''))
    pytester.makepyfile(test_graph=TEST)
    result = pytester.runpytest("--modelparity-formats=graphdef", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*modelparity_load_options*output_names*does not take*"])


def test_a_format_the_graph_cannot_reach_fails_once_without_a_misleading_fix(pytester: pytest.Pytester) -> None:
    # A .pb source asked for as h5 or keras: the setup error is printed once (no chained
    # "During handling of the above exception" repeat of the same text), and it does not
    # tell a user who already has the fixture to write modelparity_load_options.
    pytester.makeconftest(TWO_SINKS_CONFTEST + NAMED_OUTPUT_OPTIONS)
    pytester.makepyfile(test_graph=TEST)
    result = pytester.runpytest("--modelparity-formats=h5,keras", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)
    out = result.stdout.str()
    assert "cannot convert" in out
    assert "During handling of the above exception" not in out
    assert "def modelparity_load_options" not in out


@pytest.mark.usefixtures("installed_node_modules")
def test_default_formats_take_the_load_options_and_pass(pytester: pytest.Pytester) -> None:
    """With the default matrix and the outputs named in modelparity_load_options, every
    conversion a frozen .pb can become (tflite, onnx, tfjs) reads the same sub-graph and
    passes; the ones it cannot (keras, h5, saved_model) skip, and the .pb as its own graphdef
    candidate is the file compared with itself (tests/test_not_compared.py)."""
    pytester.makeconftest(TWO_SINKS_CONFTEST + NAMED_OUTPUT_OPTIONS)
    pytester.makepyfile(test_graph=TEST)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", "-v",
                                "--modelparity-export-process=inline")  # cheaper here than starting the worker
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 3 and "error" not in outcomes and "errors" not in outcomes, outcomes
    for fmt in ("tflite", "onnx", "tfjs"):
        result.stdout.fnmatch_lines([f"*test_export[[]{fmt}-cpu[]] PASSED*"])
    result.stdout.fnmatch_lines(["*format 'keras' cannot be made from this source*"])
    assert "load options do not reach" not in result.stdout.str()
    assert "NOTHING WAS COMPARED" not in result.stdout.str()

