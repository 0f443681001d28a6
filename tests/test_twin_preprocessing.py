"""A twin carries every Keras preprocessing layer's state, or it is no twin (no twin without proof).

The Keras-config twin rebuilds a model from ``get_config()`` and ``set_weights``; state that
lives elsewhere was lost: an adapted ``Discretization``'s bin boundaries were recomputed from
an empty summary (every row in bucket 0: the twin differed from the model by 6.6e-2 of scale,
and at 2.8e-2 it was taken as the model's own float32 error), an adapted lookup's vocabulary
(in its assets) never reached the twin. Tiny models built here, real Keras.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from models import skip_unless_exportable
from preprocessed import preprocessed
from pytest_modelparity import load_model
from pytest_modelparity.floor import measure as shadow

pytestmark = [pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker

pytest.importorskip("tensorflow", reason="the twins need TensorFlow: pip install 'pytest-modelparity[tensorflow]'")

KINDS = ["normalization+discretization", "discretization one_hot", "StringLookup int", "StringLookup tf_idf",
         "IntegerLookup multi_hot", "TextVectorization int", "TextVectorization tf_idf", "Hashing", "CategoryEncoding"]


@pytest.mark.parametrize("method", ["keras", "graph"])
@pytest.mark.parametrize("kind", KINDS)
def test_both_twins_carry_the_preprocessing_state(kind, method):
    model, batch = preprocessed(kind)
    ref = load_model(model)
    twin = shadow.twin_of(ref, shadow.FLOAT64, method)
    assert twin.model is not None, twin.reason
    out = twin.model(batch)["head"]
    assert out.dtype == np.float64
    # rounding only: a lost boundary, vocabulary or mean moves outputs by 1e-2 of scale or more
    # (the graph twin of a lookup read an unfed table handle: it could not run)
    assert shadow.relative_error(ref.predict(batch)["head"], out) < 1e-6


@pytest.mark.parametrize("kind", ["StringLookup int", "IntegerLookup multi_hot", "TextVectorization tf_idf"])
def test_the_graph_twin_of_a_saved_model_fills_its_lookup_tables(kind, tmp_path):
    """A SavedModel signature reads its tables inside the model's function (inlined when frozen):
    the table's dtypes are found where it is read, never guessed (a wrong one aborts TensorFlow)."""
    from pytest_modelparity import export_model

    model, batch = preprocessed(kind)
    saved = load_model(export_model(model, "saved_model", tmp_path / "sm"))
    twin = shadow.twin_of(saved, shadow.FLOAT64, "graph")
    assert twin.model is not None, twin.reason
    assert shadow.relative_error(saved.predict(batch)["head"], twin.model(batch)["head"]) < 1e-6


def test_the_float16_weights_twin_carries_it_too():
    model, batch = preprocessed("normalization+discretization")
    ref = load_model(model)
    twin = shadow.twin_of(ref, shadow.FLOAT16_WEIGHTS, "keras")
    assert twin.model is not None, twin.reason
    err = shadow.relative_error(ref.predict(batch)["head"], twin.model(batch)["head"])
    assert 0 < err < 5e-3                   # what float16 weights cost, not a lost bucket


# -- through the plugin's fixtures ---------------------------------------------------------------

FORMS = ("keras", "saved_model", "tflite", "onnx")
# seed 3: the twin that lost the bin boundaries differs from this model by 3.0e-2 of scale, under
# the 5% faithfulness limit, as in the issue: at the code before it, that figure set a 0.24 bound
# and the head kernel x1.01 passed in keras, saved_model and tflite (onnx had no Bucketize).

CONFTEST = textwrap.dedent('''
    import pytest
    from preprocessed import preprocessed

    @pytest.fixture(scope="session")
    def modelparity_source():
        return preprocessed("normalization+discretization", seed=3)[0]

    @pytest.fixture(scope="session")
    def modelparity_dataset():
        return preprocessed("normalization+discretization", seed=3, rows=32)[1]
''')

SUITE = textwrap.dedent('''
    import pytest
    from preprocessed import preprocessed
    from pytest_modelparity import assert_outputs_close, export_model, load_model

    def test_export(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)

    @pytest.mark.parametrize("form", FORMS)
    def test_head_kernel_times_1_01(form, parity_reference, parity_batch, tmp_path):
        bad = preprocessed("normalization+discretization", seed=3, kernel_factor=1.01)[0]
        path = tmp_path / ("bad.keras" if form == "keras" else f"bad.{form}")
        assert_outputs_close(load_model(export_model(bad, form, path)), parity_reference, inputs=parity_batch)
''').replace("FORMS", repr(FORMS))


@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
def test_every_form_of_a_preprocessed_model_is_judged_by_a_faithful_floor_and_a_planted_bug_fails(pytester):
    skip_unless_exportable(FORMS)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest(f"--modelparity-formats={','.join(FORMS)}", "--modelparity-report=r.json",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=len(FORMS), failed=len(FORMS))
    rows = json.loads((pytester.path / "r.json").read_text())["rows"]
    for row in rows:
        assert row["noise_floor_missing"] is None, row
        assert "x the model's own float32 error" in row["tolerance_source"], row
        assert row["scale"] <= 1e-4, row          # the twin lost no bucket: rounding, not 0.22-0.28
    assert {r["format"] for r in rows if r["verdict"] == "pass"} == set(FORMS)
    failed = [r for r in rows if r["verdict"] == "fail"]
    assert len(failed) == len(FORMS) and all(r["max_abs"] > 100 * r["scale"] * r["output_scale"] for r in failed)


def test_a_discretization_has_an_onnx_form_bucket_for_bucket(tmp_path):
    """ONNX has no Bucketize: the exporter writes it as a count of boundaries <= x (rows exactly
    on a boundary included, where an off-by-one would move them a bucket)."""
    from pytest_modelparity import export_model
    from pytest_modelparity.formats import missing_runtime

    if missing_runtime("onnx", export=True) is not None:
        pytest.skip("onnx runtimes missing: bash scripts/install.sh installs them")
    model, batch = preprocessed("normalization+discretization", rows=32)
    disc = next(layer for layer in model.layers if "discretization" in layer.name)
    edges = np.asarray(disc.bin_boundaries, np.float32).reshape(-1, 1)
    on_edges = {"num": np.zeros((len(edges), 2), np.float32), "raw": edges}
    ref, onnx = load_model(model), load_model(export_model(model, "onnx", tmp_path / "m.onnx"))
    for rows in (batch, on_edges):
        assert shadow.relative_error(onnx.predict(rows)["head"], ref.predict(rows)["head"]) < 1e-6
