"""Model families the tfjs converter or the JS backends used to trip on, through real Node.js.

- conv + batch norm (trained statistics) + hard-swish: the converter fuses it into
  ``_FusedConv2D`` with ``_FusedHardSwish``, which tfjs's cpu and wasm backends lack;
- Embedding(mask_zero=True) + LSTM: lowered While loops tfjs's executor cannot run;
- exact GELU (``Erfc``), which the converter refuses.

Each exports, validates and matches Keras; the unrewritten forms fail with a typed error
naming the op, the backend and the fix. Tiny models, real TensorFlow, tfjs and Node.
"""

from __future__ import annotations

import base64
import importlib.util
import json

import numpy as np
import pytest

from pytest_modelparity import errors

keras = pytest.importorskip("keras")

if importlib.util.find_spec("tensorflowjs") is None:
    pytest.skip("the tensorflowjs converter is not installed: pip install 'pytest-modelparity[tfjs]'",
                allow_module_level=True)


def _export(model, path, **options):
    from pytest_modelparity import export_model

    try:
        return export_model(model, "tfjs", path, **options)
    except errors.RuntimeMissing as exc:
        pytest.skip(f"tfjs runtime missing: {exc}")


def _load(path, **options):
    from pytest_modelparity import load_model

    try:
        return load_model(path, "tfjs", **options)
    except errors.RuntimeMissing as exc:
        pytest.skip(f"tfjs runtime missing: {exc}")


def _fused_ops(model_json):
    spec = json.loads(model_json.read_text())
    return [base64.b64decode(s).decode() for n in spec["modelTopology"]["node"]
            for s in ((n.get("attr") or {}).get("fused_ops") or {}).get("list", {}).get("s", [])]


def _ops(model_json):
    return {n["op"] for n in json.loads(model_json.read_text())["modelTopology"]["node"]}


def _parity(js, model, batch):
    from pytest_modelparity import assert_outputs_close, load_model

    return assert_outputs_close(js, load_model(model), inputs=batch)


@pytest.fixture(scope="module")
def hard_swish_cnn():
    """Conv -> BatchNorm -> hard-swish, with trained-like statistics (momentum 0: one training
    pass sets the moving statistics to the batch's), as MobileNetV3 after training."""
    keras.utils.set_random_seed(4)
    inp = keras.Input((12, 12, 3), name="image")
    h = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inp)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Activation("hard_silu")(h)
    out = keras.layers.Dense(4, name="logits")(keras.layers.GlobalAveragePooling2D()(h))
    model = keras.Model(inp, out)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.0
    x = np.random.default_rng(0).normal(2.0, 3.0, (16, 12, 12, 3)).astype("float32")
    model(x, training=True)
    return model


def test_fused_hard_swish_is_split_into_ops_tfjs_has_and_matches_keras(hard_swish_cnn, tmp_path):
    from pytest_modelparity.checks.strategies import seeded_batch

    path = _export(hard_swish_cnn, tmp_path / "web")
    assert "_FusedHardSwish" not in _fused_ops(path) and "Relu6" in _ops(path)
    with _load(path) as js:  # backend "auto"
        report = _parity(js, hard_swish_cnn, seeded_batch(js, batch_size=3, seed=1, elements=(-4.0, 8.0)))
        assert js.format_variant == f"tfjs:{js.backend}" == report.meta["format"]
    from pytest_modelparity.reports.summary import rows_from_report

    (row,) = rows_from_report(report, nodeid="t::t", format="tfjs", device="cpu", kind="outputs_close", seq=0)
    assert row["format"] == "tfjs" and row["format_variant"] == js.format_variant  # the JSON says which ran


def test_unsplit_fused_hard_swish_fails_with_a_typed_error_naming_op_backend_and_fix(hard_swish_cnn, tmp_path):
    """The converter's raw output (no rewrite) as a user would bring it: cpu and wasm both lack
    the activation; the error says which op, which backend, and how to get a runnable file."""
    from pytest_modelparity import export_model
    from pytest_modelparity.formats.tfjs.export import import_converter

    saved = export_model(hard_swish_cnn, "saved_model", tmp_path / "sm")
    import_converter().convert_tf_saved_model(str(saved), str(tmp_path / "raw"))
    raw = tmp_path / "raw" / "model.json"
    if "_FusedHardSwish" not in _fused_ops(raw):
        pytest.skip("this TensorFlow build does not fuse hard-swish (no oneDNN remapper): nothing to split")
    x = np.zeros((1, 12, 12, 3), np.float32)
    with _load(raw, backend="cpu") as js, pytest.raises(errors.ModelLoadError) as info:
        js.predict(x)
    text = str(info.value)
    assert info.value.action == "run" and "cpu backend" in text and "_fusedhardswish" in text.lower()
    assert "export_model(model, 'tfjs'" in info.value.fix
    with _load(raw) as js, pytest.raises(errors.ModelLoadError, match="wasm backend failed first"):
        js.predict(x)  # "auto": wasm fails, cpu fails, one typed error says both


def test_residual_add_fused_as_a_bias_is_unfused_so_wasm_runs_it(tmp_path):
    """ResNet's conv -> BN -> add(conv shortcut -> BN) -> relu (as in ResNet50(weights=None)):
    the converter fuses the shortcut's conv output as the "bias" of a _FusedConv2D, which wasm refuses ("only supports rank-1 bias but
    got rank 4"); the export unfuses it and wasm matches Keras."""
    from pytest_modelparity.checks.strategies import seeded_batch

    keras.utils.set_random_seed(7)
    inp = keras.Input((8, 8, 3), name="image")
    conv_bn = lambda filters, size, t: keras.layers.BatchNormalization()(  # noqa: E731
        keras.layers.Conv2D(filters, size, padding="same")(t))
    x = keras.layers.Activation("relu")(conv_bn(4, 3, inp))
    h = keras.layers.Activation("relu")(keras.layers.Add()([conv_bn(6, 1, x), conv_bn(6, 1, x)]))
    model = keras.Model(inp, keras.layers.Dense(2, name="logits")(keras.layers.GlobalAveragePooling2D()(h)))
    path = _export(model, tmp_path / "web")
    names = [n["name"] for n in json.loads(path.read_text())["modelTopology"]["node"]]
    assert any("/unfused/" in n for n in names), "the residual add was not fused as a bias: nothing to check"
    with _load(path, backend="wasm") as js:
        _parity(js, model, seeded_batch(js, batch_size=2, seed=5))


def lstm_text_model():
    keras.utils.set_random_seed(5)
    inp = keras.Input((10,), dtype="int32", name="tokens")
    h = keras.layers.Embedding(20, 6, mask_zero=True)(inp)
    h = keras.layers.LSTM(5)(h)
    return keras.Model(inp, keras.layers.Dense(3, name="logits")(h))


def test_masked_lstm_runs_as_a_tf2_while_loop_and_matches_keras(tmp_path):
    from pytest_modelparity.checks.strategies import seeded_batch

    model = lstm_text_model()
    path = _export(model, tmp_path / "web")
    assert "StatelessWhile" in _ops(path) or "While" in _ops(path)
    batch = seeded_batch(model, batch_size=4, seed=2)
    batch["tokens"][:, 6:] = 0  # padding, masked out
    with _load(path) as js:
        _parity(js, model, batch)
        assert js.process.execution == "executeAsync"


def test_lowered_lstm_loop_fails_at_export_with_a_typed_error_and_leaves_nothing(tmp_path):
    """control_flow_v2=False lowers the loop to Enter/Merge/Switch, which tfjs cannot run: the
    export's validation says so (op kind, backend, fix) instead of returning a broken file."""
    target = tmp_path / "web"
    with pytest.raises(errors.ExportError) as info:
        _export(lstm_text_model(), target, control_flow_v2=False)
    text = str(info.value)
    assert info.value.action == "export" and info.value.format == "tfjs"
    assert "control flow" in text and "cpu backend" in text and "control_flow_v2=True" in info.value.fix
    assert not target.exists()


def test_exact_gelu_encoder_converts_with_erf_and_matches_keras(tmp_path):
    from pytest_modelparity.checks.strategies import seeded_batch

    keras.utils.set_random_seed(6)
    inp = keras.Input((4, 8), name="x")
    a = keras.layers.MultiHeadAttention(2, 4)(inp, inp)
    h = keras.layers.LayerNormalization()(inp + a)
    f = keras.layers.Dense(16, activation=lambda t: keras.activations.gelu(t, approximate=False))(h)
    model = keras.Model(inp, keras.layers.LayerNormalization()(h + keras.layers.Dense(8)(f)))
    path = _export(model, tmp_path / "web")
    ops = _ops(path)
    assert "Erfc" not in ops and "Erf" in ops
    with _load(path) as js:
        _parity(js, model, seeded_batch(js, batch_size=3, seed=3, elements=(-3.0, 3.0)))


def test_softsign_is_written_out_and_matches_keras(tmp_path):
    """tfjs 4.22 has no Softsign ("Unsupported Ops ... Softsign": 8 of 697 drawn models of a fuzz
    run); the export writes it as x / (1 + |x|), on both backends."""
    from pytest_modelparity.formats import export_route

    keras.utils.set_random_seed(7)
    inp = keras.Input((6,), name="x")
    model = keras.Model(inp, keras.layers.Dense(4, activation="softsign")(keras.layers.Dense(8)(inp)))
    path = _export(model, tmp_path / "web")
    ops = _ops(path)
    assert "Softsign" not in ops and "RealDiv" in ops
    assert "softsign->x/(1+|x|) x1" in (export_route(path) or "")
    x = np.random.default_rng(0).normal(size=(5, 6)).astype("float32") * 3
    for backend in ("cpu", "wasm"):
        with _load(path, backend=backend) as js:
            _parity(js, model, x)


def test_runner_errors_are_classified_by_op_and_backend():
    from pytest_modelparity.formats.tfjs.errors import classify_runner_error

    problem, fix = classify_runner_error(
        "tfjs model 'm' (wasm backend): predict failed: Kernel 'Einsum' not registered for backend 'wasm'", "wasm")
    assert "'Einsum'" in problem and "wasm backend" in problem and "backend='cpu'" in fix
    problem, fix = classify_runner_error("predict failed: Cannot compute the outputs [Identity] from the "
                                         "provided inputs [tokens:0].", "cpu")
    assert "control flow" in problem and "control_flow_v2=True" in fix
