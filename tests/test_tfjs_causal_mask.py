"""A GPT-style decoder with a causal mask on TFJS: tensorflowjs 4.22 runs ``MatrixBandPart`` with
``num_upper`` read from ``num_lower``'s input, so Keras' causal mask (``band_part(ones, -1, 0)``)
becomes all ones and the logits differ by about their own scale. ``export_model`` writes the band
out in ops tfjs maps right (``formats/tfjs/rewrite.rewrite_band_part``); a model.json converted
elsewhere fails with the defect and its fix named. Real TensorFlow, converter and Node.js.
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from families import gpt_decoder
from pytest_modelparity import errors

pytestmark = [pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker

tf = pytest.importorskip("tensorflow")


@pytest.mark.parametrize("lower, upper, shape", [(-1, 0, (2, 3, 5, 4)), (0, -1, (2, 3, 5, 4)), (1, 2, (2, 3, 5, 4)),
                                                 (2, 0, (2, 3, 5, 4)), (-1, -1, (2, 3, 5, 4)), (0, 0, (2, 3, 5, 4)),
                                                 (-1, 0, (6, 6)), (1, 0, (4, 7))])
def test_band_part_rewrite_matches_tensorflow_band_part(lower, upper, shape):
    """The rewritten graph gives tf.linalg.band_part's answer for every band and rank, with a
    dynamic first dimension."""
    from pytest_modelparity.formats.tfjs.rewrite import rewrite_band_part

    fn = tf.function(lambda x: tf.linalg.band_part(x, lower, upper))
    graph_def = fn.get_concrete_function(tf.TensorSpec([None, *shape[1:]])).graph.as_graph_def()
    assert rewrite_band_part(graph_def) == 1
    assert "MatrixBandPart" not in {n.op for n in graph_def.node}
    placeholder = next(n.name for n in graph_def.node if n.op == "Placeholder")
    output = next(n.name for n in graph_def.node if n.op == "Identity")
    x = np.arange(np.prod(shape), dtype="float32").reshape(shape) + 1
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session() as session:
            got = session.run(f"{output}:0", {f"{placeholder}:0": x})
    np.testing.assert_array_equal(got, tf.linalg.band_part(x, lower, upper).numpy())


def test_a_bool_band_is_written_as_a_logical_and() -> None:
    """Keras' causal mask is a bool band_part; tfjs-backend-wasm 4.22 computes ``where`` between
    bool tensors wrong, so a bool band is ``LogicalAnd(in_band, a)``, checked here in TensorFlow."""
    from pytest_modelparity.formats.tfjs.rewrite import rewrite_band_part

    fn = tf.function(lambda x: tf.linalg.band_part(x, -1, 0))
    graph_def = fn.get_concrete_function(tf.TensorSpec([None, 5, 5], tf.bool)).graph.as_graph_def()
    assert rewrite_band_part(graph_def) == 1
    ops = {n.op for n in graph_def.node}
    assert "MatrixBandPart" not in ops and "SelectV2" not in ops and "LogicalAnd" in ops
    placeholder = next(n.name for n in graph_def.node if n.op == "Placeholder")
    output = next(n.name for n in graph_def.node if n.op == "Identity")
    x = np.random.default_rng(0).uniform(size=(2, 5, 5)) > 0.3
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session() as session:
            got = session.run(f"{output}:0", {f"{placeholder}:0": x})
    np.testing.assert_array_equal(got, tf.linalg.band_part(x, -1, 0).numpy())


needs_tfjs = pytest.mark.skipif(importlib.util.find_spec("tensorflowjs") is None,
                                reason="the tensorflowjs converter is not installed: "
                                       "pip install --no-deps tensorflowjs==4.22.0 tensorflow_hub==0.16.1")


def _or_skip(call, *args, **kwargs):
    try:
        return call(*args, **kwargs)
    except errors.RuntimeMissing as exc:
        pytest.skip(f"tfjs runtime missing (python -m pytest_modelparity.tfjs_runner install): {exc}")


@pytest.fixture(scope="module")
def decoder():
    return gpt_decoder()


@needs_tfjs
def test_gpt_decoder_with_causal_mask_matches_keras_on_tfjs(decoder, tmp_path):
    from pytest_modelparity import assert_outputs_close, export_model, load_model
    from pytest_modelparity.formats import export_route

    model, tokens = decoder
    path = _or_skip(export_model, model, "tfjs", tmp_path / "web")
    ops = {n["op"] for n in json.loads(path.read_text())["modelTopology"]["node"]}
    assert "MatrixBandPart" not in ops and "SelectV2" in ops
    assert "MatrixBandPart written out x2" in (export_route(path) or "")
    with _or_skip(load_model, path) as js:
        assert js.converter_defects == []
        assert_outputs_close(js, model, inputs=tokens)


@needs_tfjs
def test_direct_tensorflowjs_conversion_fails_naming_the_band_part_defect_and_fix(decoder, tmp_path):
    """The converter alone (no rewrite): the mask is lost, the logits differ by their own scale,
    and the failure names tensorflowjs 4.22's MatrixBandPart defect and how to avoid it."""
    from pytest_modelparity import ParityError, assert_outputs_close, export_model, load_model
    from pytest_modelparity.formats.tfjs.export import import_converter

    model, tokens = decoder
    saved = export_model(model, "saved_model", tmp_path / "sm")
    import_converter().convert_tf_saved_model(str(saved), str(tmp_path / "raw"))
    with _or_skip(load_model, tmp_path / "raw" / "model.json") as js:
        assert [d[0] for d in js.converter_defects] == ["MatrixBandPart"]
        with pytest.raises(ParityError) as info:
            assert_outputs_close(js, model, inputs=tokens)
    text = str(info.value)
    assert "tensorflowjs 4.22 runs MatrixBandPart" in text and "mha0_1/MatrixBandPart" in text
    assert "converter_defect" in [h.cause for h in info.value.report.hints]
    assert "export_model(model, 'tfjs', dir)" in text and "mha0" in text


@needs_tfjs
@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
def test_the_plugin_checks_the_decoder_on_tfjs(pytester: pytest.Pytester) -> None:
    """As a user's suite would: the decoder as modelparity_source, tfjs in the matrix, green."""
    pytester.makeconftest("""
        import pytest
        from families import gpt_decoder

        @pytest.fixture(scope="session")
        def modelparity_source():
            return gpt_decoder()[0]
    """)
    pytester.makepyfile("""
        from pytest_modelparity import assert_outputs_close

        def test_export(parity_candidate, parity_reference, parity_batch):
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", "--modelparity-formats=tfjs")
    if result.parseoutcomes().get("skipped"):
        pytest.skip(f"tfjs runtime missing here: {result.stdout.str()[-400:]}")
    result.assert_outcomes(passed=1)
