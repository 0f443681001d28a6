"""Planted causes named first, with no hint that points the wrong way (issue 38): ids shifted
on every input at once, categorical ids of shape (B, 1), two outputs exchanged, an int16
waveform fed as floats, a Normalization layer's statistics, a port's configuration slips."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_modelparity import ParityError, assert_outputs_close, export_model, load_model

MISLEADING = {"weights_differ", "weights_reinitialised", "first_divergent_layer", "output_scaled"}


def _hints(info) -> list:
    return info.value.report.hints


def _named_first(info, cause: str) -> object:
    hints = _hints(info)
    assert hints and hints[0].cause == cause, [str(h) for h in hints]
    assert not [h for h in hints[1:] if h.cause in MISLEADING], [str(h) for h in hints]
    return hints[0]


# -- two outputs exchanged -----------------------------------------------------------------

def _two_heads(swapped: bool):
    import keras

    keras.utils.set_random_seed(3)
    x = keras.Input((8,), name="x")
    h = keras.layers.Dense(16, activation="relu", name="body")(x)
    mean = keras.layers.Dense(4, name="mean_head")(h)
    log_var = keras.layers.Dense(4, name="log_var_head")(h)
    outs = {"mean": log_var, "log_var": mean} if swapped else {"mean": mean, "log_var": log_var}
    return keras.Model(x, outs, name="vae_head")


@pytest.fixture(scope="module")
def heads():
    ref = _two_heads(False)
    bug = _two_heads(True)
    for layer in ref.layers:  # by name: the layer order follows the outputs' order
        bug.get_layer(layer.name).set_weights(layer.get_weights())
    return ref, bug, np.random.default_rng(0).normal(size=(6, 8)).astype("float32")


@pytest.mark.parametrize("fmt", ["keras", "saved_model", "tflite", "onnx"])
def test_swapped_outputs_are_named_before_any_weight_or_layer_hint(heads, fmt, tmp_path):
    ref, bug, x = heads
    cand = bug if fmt == "keras" else load_model(export_model(bug, fmt, tmp_path / "bug"))
    with pytest.raises(ParityError) as info:
        assert_outputs_close(cand, ref, inputs=x)
    hint = _named_first(info, "outputs_swapped")
    assert "mean" in hint.message and "log_var" in hint.message, hint.message


# -- ids shifted on every input, categorical ids ---------------------------------------------

def _encoder_decoder():
    import keras

    keras.utils.set_random_seed(4)
    src = keras.Input((10,), dtype="int32", name="source")
    tgt = keras.Input((6,), dtype="int32", name="target")
    emb = keras.layers.Embedding(40, 8, name="shared_embedding")  # one tokenizer, one table
    enc = keras.layers.GlobalAveragePooling1D(name="encoder")(emb(src))  # cheap: a context vector
    dec = keras.layers.Conv1D(8, 2, padding="causal", name="decoder")(emb(tgt)) + enc[:, None, :]
    return keras.Model({"source": src, "target": tgt}, keras.layers.Dense(40, name="logits")(dec), name="seq2seq")


def test_ids_shifted_on_both_inputs_of_an_encoder_decoder():
    model = _encoder_decoder()
    rng = np.random.default_rng(1)
    x = {"source": rng.integers(1, 38, (4, 10)).astype("int32"), "target": rng.integers(1, 38, (4, 6)).astype("int32")}

    def candidate(b):  # a tokenizer whose ids are one higher, on both sides
        return model({k: v + 1 for k, v in b.items()})

    with pytest.raises(ParityError) as info:
        assert_outputs_close(candidate, model, inputs=x)
    hint = _named_first(info, "token_id_shift")
    assert "every id input ('source', 'target'" in hint.message and "token ids + 1" in hint.message, hint.message


def _recommender():
    import keras

    keras.utils.set_random_seed(5)
    user = keras.Input((1,), dtype="int32", name="user_id")
    item = keras.Input((1,), dtype="int32", name="item_id")
    u = keras.layers.Flatten()(keras.layers.Embedding(30, 8, name="users")(user))
    i = keras.layers.Flatten()(keras.layers.Embedding(50, 8, name="items")(item))
    h = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([u, i]))
    return keras.Model({"user_id": user, "item_id": item}, keras.layers.Dense(1, name="score")(h), name="recommender")


@pytest.mark.parametrize("shifted", ["user_id", "item_id"])
def test_categorical_ids_of_shape_b_1_shifted(shifted):
    model = _recommender()
    rng = np.random.default_rng(2)
    x = {"user_id": rng.integers(1, 28, (8, 1)).astype("int32"), "item_id": rng.integers(1, 48, (8, 1)).astype("int32")}

    def candidate(b):
        return model({**b, shifted: b[shifted] + 1})

    with pytest.raises(ParityError) as info:
        assert_outputs_close(candidate, model, inputs=x)
    hint = _named_first(info, "token_id_shift")
    assert f"input '{shifted}' ids + 1" in hint.message, hint.message


# -- a waveform fed int16 samples as floats ------------------------------------------------

def _waveform_net():
    import keras

    keras.utils.set_random_seed(6)
    wav = keras.Input((1024,), name="waveform")
    x = keras.layers.Reshape((1024, 1))(wav)
    x = keras.layers.Conv1D(8, 16, strides=8, activation="tanh", name="frontend")(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(wav, keras.layers.Dense(5, name="classes")(x), name="audio")


def test_waveform_fed_int16_samples_as_floats():
    model = _waveform_net()
    t = np.arange(1024) / 16000.0
    x = np.stack([0.3 * np.sin(2 * np.pi * f * t) for f in (220, 440, 880)]).astype("float32") * 1e-3

    def candidate(b):  # int16 PCM passed on without dividing by 32768
        return model(b * 32768.0)

    with pytest.raises(ParityError) as info:
        assert_outputs_close(candidate, model, inputs=x)
    hint = _named_first(info, "input_scaling")
    assert "multiplied by 32768 (int16 samples fed as floats" in hint.message, hint.message
    assert "pixels" not in hint.message


# -- a Normalization layer's statistics ------------------------------------------------------

def _normalized(mean):
    from models import normalized_tabular

    return normalized_tabular(mean)


def test_normalization_mean_shifted_by_half_a_standard_deviation():
    ref = _normalized([1.0, -2.0, 0.5, 3.0])
    bug = _normalized([2.0, -2.0, 0.5, 3.0])  # mean off by half of std 2 on the first feature
    bug.set_weights(ref.get_weights())
    x = np.random.default_rng(3).normal(size=(8, 4)).astype("float32") * 2
    with pytest.raises(ParityError) as info:
        assert_outputs_close(bug, ref, inputs=x)
    hint = _named_first(info, "preprocessing_state")
    assert "Normalization `norm` mean differs by up to 1" in hint.message, hint.message
    assert "0.5 of a standard deviation" in hint.evidence, hint.evidence


# -- a port's configuration slips ------------------------------------------------------------

def _tagger(epsilon: float = 1e-3, channels_first_flatten: bool = False):
    """A small music-tagger-like CNN on a (16, 16, 1) spectrogram."""
    import keras

    keras.utils.set_random_seed(8)
    x = keras.Input((16, 16, 1), name="spectrogram")
    h = keras.layers.Conv2D(4, 3, padding="same", name="conv1")(x)
    h = keras.layers.BatchNormalization(epsilon=epsilon, name="bn1")(h)
    h = keras.layers.ReLU(name="relu1")(h)
    h = keras.layers.MaxPooling2D(4, name="pool1")(h)
    if channels_first_flatten:
        h = keras.layers.Permute((3, 1, 2), name="to_channels_first")(h)
    h = keras.layers.Flatten(name="flatten")(h)
    return keras.Model(x, keras.layers.Dense(3, name="dense")(h), name="tagger")


@pytest.fixture(scope="module")
def tagger():
    model = _tagger()
    rng = np.random.default_rng(9)
    bn = model.get_layer("bn1")  # trained-looking statistics: a small variance makes epsilon count
    bn.set_weights([w + rng.uniform(0.5, 1.5, w.shape) if i == 0 else
                    (rng.uniform(1e-4, 1e-2, w.shape) if i == 3 else w) for i, w in enumerate(bn.get_weights())])
    return model, rng.normal(size=(4, 16, 16, 1)).astype("float32")


@pytest.mark.parametrize("slip, cause, words", [
    (dict(epsilon=1e-5), "configuration_differs", "BatchNormalization `bn1` epsilon 0.001 in the reference, 1e-05"),
    (dict(channels_first_flatten=True), "layer_only_in_one_form", "Permute `to_channels_first` only in the candidate"),
])
def test_port_slips_are_named_not_blamed_on_weights(tagger, slip, cause, words):
    model, x = tagger
    port = _tagger(**slip)
    port.set_weights(model.get_weights())  # weights copied, as a port does
    with pytest.raises(ParityError) as info:
        assert_outputs_close(port, model, inputs=x)
    hint = _named_first(info, cause)
    assert words in hint.message and "the weights agree" in hint.evidence, str(hint)


# -- a fused first convolution x1.01 ---------------------------------------------------------

def _detector():
    """A subclassed detector: a first convolution with its bias (no activation), a block."""
    import keras

    class Detector(keras.Model):
        def __init__(self):
            super().__init__()
            self.stem = keras.layers.Conv2D(8, 3, padding="same")
            self.body = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")
            self.head = keras.layers.Conv2D(4, 1)

        def call(self, x):
            return self.head(self.body(self.stem(x)))

    keras.utils.set_random_seed(10)
    model = Detector()
    model(np.zeros((1, 16, 16, 3), "float32"))
    rng = np.random.default_rng(10)
    model.set_weights([w + rng.normal(0, 0.3, w.shape) if w.ndim == 1 else w for w in model.get_weights()])
    return model


@pytest.mark.parametrize("fmt", ["tflite", "onnx", "saved_model"])
def test_fused_first_convolution_reported_with_its_one_percent(fmt, tmp_path):
    model = _detector()
    bug = _detector()
    bug.set_weights(model.get_weights())
    bug.stem.kernel.assign(model.stem.kernel * 1.01)
    x = np.random.default_rng(11).uniform(0, 1, (4, 16, 16, 3)).astype("float32")
    with pytest.raises(ParityError) as info:
        assert_outputs_close(load_model(export_model(bug, fmt, tmp_path / "bug")), model, inputs=x)
    hints = _hints(info)
    if fmt == "saved_model":  # its variables are read: the kernel itself is named
        assert hints[0].cause == "weights_differ" and "kernel` (3, 3, 3, 8)" in hints[0].evidence \
            and "(1.0% of its largest value)" in hints[0].evidence, [str(h) for h in hints]
    layer = next(h for h in hints if h.cause == "first_divergent_layer")
    rel = float(layer.evidence.split("(rel ")[1].split(")")[0])
    assert 0.005 < rel < 0.02, layer.evidence  # the 1% itself, not the conv before its bias (rel 0.3)
    assert "it is the first layer" in layer.evidence, layer.evidence


# -- "its input" read from the graph ---------------------------------------------------------

def _gated():
    """A WaveNet-style gate: `filt` and `gate` both read the residual stream `res`."""
    import keras

    keras.utils.set_random_seed(12)
    x = keras.Input((32, 2), name="audio")
    res = keras.layers.Conv1D(8, 1, name="res")(x)
    filt = keras.layers.Conv1D(8, 2, padding="causal", activation="tanh", name="filt")(res)
    gate = keras.layers.Conv1D(8, 2, padding="causal", activation="sigmoid", name="gate")(res)
    h = keras.layers.Multiply(name="gated")([filt, gate])
    h = keras.layers.Add(name="skip")([h, res])
    return keras.Model(x, keras.layers.Dense(3, name="out")(keras.layers.GlobalAveragePooling1D(name="gap")(h)))


def test_first_divergent_layer_names_its_input_from_the_graph(tmp_path):
    model = _gated()
    bug = _gated()
    bug.set_weights(model.get_weights())
    kernel, bias = model.get_layer("gate").get_weights()
    bug.get_layer("gate").set_weights([kernel * 1.05, bias])
    x = np.random.default_rng(13).normal(size=(4, 32, 2)).astype("float32")
    with pytest.raises(ParityError) as info:
        assert_outputs_close(load_model(export_model(bug, "tflite", tmp_path / "bug")), model, inputs=x)
    layer = next(h for h in _hints(info) if h.cause == "first_divergent_layer")
    # `gate` is fused into the Mul in the TFLite file: named, and `filt` (its sibling) is not "its input"
    assert "`gated`" in layer.message and "or in `gate` fused into it" in layer.message, str(layer)
    assert "its inputs: `filt` agrees" in layer.evidence and "`gate` is fused into it" in layer.evidence, str(layer)


# -- quantised advice that runs ----------------------------------------------------------------

def test_quantised_advice_fits_the_variant():
    from pytest_modelparity.diagnose.quantization import LayerCost, advice

    fused = "m_1/relu1_1/Relu;m_1/conv1_1/BiasAdd;m_1/conv1_1/convolution"
    costs = [LayerCost(fused, "CONV_2D", 0.3, 0.2), LayerCost("m_1/dense_1/MatMul", "FULLY_CONNECTED", 0.1, 0.05)]
    assert "QuantizationDebugger(converter" not in advice("dynamic_range", costs)
    assert "does not run on a dynamic-range converter" in advice("dynamic_range", costs)
    int8 = advice("int8", costs)
    assert f'"float_nodes": [\'{fused}\', \'m_1/dense_1/MatMul\']' in int8, int8  # paste-able, in full
    assert 'export_model(model, "tflite", "model_int8.tflite", quantization="int8"' in int8, int8
    # a TF1 checkpoint's file: the call names the checkpoint and its load options (the plugin freezes it)
    route = "static_batch 1; TF1 checkpoint frozen, wrapped (feeds={'is_training': False})"
    tf1 = advice("int8", costs, route)
    assert "export_model(CHECKPOINT, " in tf1 and "}, feeds={'is_training': False})" in tf1, tf1


def _looked_up(vocabulary):
    import keras

    keras.utils.set_random_seed(14)
    x = keras.Input((1,), dtype="int64", name="category")
    h = keras.layers.IntegerLookup(vocabulary=vocabulary, name="lookup")(x)
    h = keras.layers.Flatten()(keras.layers.Embedding(8, 4, name="emb")(h))
    return keras.Model(x, keras.layers.Dense(2, name="out")(h), name="categories")


def test_lookup_vocabulary_reordered_is_named():
    ref = _looked_up([5, 7, 9, 11])
    bug = _looked_up([7, 5, 9, 11])
    bug.set_weights(ref.get_weights())
    x = np.array([[5], [7], [9], [11], [5], [7]], "int64")
    with pytest.raises(ParityError) as info:
        assert_outputs_close(bug, ref, inputs=x)
    hint = _named_first(info, "preprocessing_state")
    assert "IntegerLookup `lookup` its vocabulary holds the same 5 entries in another order" in hint.message, hint


def test_an_exported_port_with_an_extra_permutation_names_it(tagger, tmp_path):
    """No Keras config to read on a TFLite file: the layer table names the transpose only the
    candidate runs, at the flatten (not `dense` "while its input agrees")."""
    model, x = tagger
    port = _tagger(channels_first_flatten=True)
    port.set_weights(model.get_weights())
    with pytest.raises(ParityError) as info:
        assert_outputs_close(load_model(export_model(port, "tflite", tmp_path / "port")), model, inputs=x)
    hint = _hints(info)[0]
    assert hint.cause == "first_divergent_layer" and "layer `flatten`" in hint.message, str(hint)
    assert "a transpose only the candidate runs (`" in hint.message and "to_channels_first" in hint.message, str(hint)
