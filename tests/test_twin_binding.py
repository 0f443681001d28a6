"""The twin of a bound model (a session's candidate) speaks its binding: outputs keep their names.

A two-head net (``mean``, ``log_var``, same shape) returns its heads as a list, ``mean`` first;
its SavedModel sorts them, ``log_var`` first. The candidate is bound to the reference by name
(formats/binding.py), but its graph twin was labelled in the bound order over the inner form's
outputs: the heads swapped. Heads 2% apart: the twin measured 2e-2 of scale as the model's
float32 error (bound 0.16 of scale); far apart: refused as unfaithful, and batch invariance fell
to the fixed rule.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from models import skip_unless_exportable
from preprocessed import two_heads
from pytest_modelparity import export_model, load_model
from pytest_modelparity.floor import measure as shadow
from pytest_modelparity.formats.binding import BoundModel, bind_model

pytestmark = [pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker

pytest.importorskip("tensorflow", reason="the twins need TensorFlow: pip install 'pytest-modelparity[tensorflow]'")


@pytest.mark.parametrize("gap", [0.02, 1.0])
def test_the_graph_twin_of_a_bound_saved_model_labels_its_outputs_as_the_candidate_does(tmp_path, gap):
    model = two_heads(gap)
    reference = load_model(model)
    inner = load_model(export_model(model, "saved_model", tmp_path / "sm"))
    assert [s.name for s in inner.outputs] == ["log_var", "mean"]      # the order that swapped them
    bound = bind_model(inner, reference)
    assert isinstance(bound, BoundModel) and [s.name for s in bound.outputs] == ["mean", "log_var"]
    x = np.random.default_rng(1).normal(size=(8, 6)).astype("float32")
    want = bound.predict(x)
    twin = shadow.twin_of(bound, shadow.FLOAT64, "graph")
    assert twin.model is not None, twin.reason
    got = twin.model(x)
    assert list(got) == ["mean", "log_var"]
    for name in want:
        assert got[name].dtype == np.float64
        assert shadow.relative_error(want[name], got[name]) < 1e-6, name   # swapped: 2e-2 (gap 0.02)


CONFTEST = textwrap.dedent('''
    import pytest
    from preprocessed import two_heads

    @pytest.fixture(scope="session")
    def modelparity_source():
        return two_heads(0.02)
''')

SUITE = textwrap.dedent('''
    from pytest_modelparity import assert_batch_invariant, assert_outputs_close

    def test_export(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)

    def test_batch(parity_candidate, parity_batch):
        assert_batch_invariant(parity_candidate, parity_batch, batch_sizes=(1, 3))
''')

FORMS = ("saved_model", "graphdef", "tflite", "onnx", "tfjs")


@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
def test_every_form_of_a_two_head_net_keeps_its_names_and_batch_invariance_is_judged_by_the_floor(pytester):
    skip_unless_exportable(FORMS)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest(f"--modelparity-formats={','.join(FORMS)}", "--modelparity-report=r.json",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2 * len(FORMS))
    rows = json.loads((pytester.path / "r.json").read_text())["rows"]
    assert {(r["format"], r["check"]) for r in rows} == {(f, c) for f in FORMS
                                                         for c in ("outputs_close", "batch_invariant")}
    for row in rows:
        assert row["noise_floor_missing"] is None, row
        assert "x the model's own float32 error" in row["tolerance_source"], row
        # the floor of each output is its own rounding (~1e-7), not the other head's 2e-2
        assert row["scale"] <= 1e-5, row
    graph_judged = [r for r in rows if r["check"] == "batch_invariant" and r["format"] in ("saved_model", "graphdef")]
    assert graph_judged and all(r["twin"] == "graph" for r in graph_judged), graph_judged
