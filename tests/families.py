"""The model families people ship, small: built by the family tests and bench/model_families.py.

Each builder returns ``(model, batch)``: a seeded Keras model and a batch it takes. The
recurrent and encoder models are tiny (vocab 50, 16 tokens, 8 units; d=16, 2 heads) so a
test converts them in seconds; MobileNetV3Small and ConvNeXtTiny (64x64, weights=None) are
for the bench only.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from models import mlp, tiny_cnn

VOCAB, TOKENS, UNITS = 50, 16, 8


def _keras() -> Any:
    import keras

    return keras


def tokens(batch: int = 4, seed: int = 0) -> np.ndarray:
    """int32 token ids with trailing padding (0) of different lengths: the mask matters."""
    rng = np.random.default_rng(seed)
    x = rng.integers(1, VOCAB, (batch, TOKENS)).astype("int32")
    for i in range(batch):
        x[i, rng.integers(TOKENS // 3, TOKENS):] = 0
    return x


def recurrent(kind: str = "lstm"):
    """Embedding(mask_zero=True) + LSTM / GRU / Bidirectional(LSTM) + Dense: a text classifier."""
    keras = _keras()
    keras.utils.set_random_seed(0)
    layer = {"lstm": lambda: keras.layers.LSTM(UNITS), "gru": lambda: keras.layers.GRU(UNITS),
             "bilstm": lambda: keras.layers.Bidirectional(keras.layers.LSTM(UNITS))}[kind]()
    t = keras.Input((TOKENS,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(VOCAB, UNITS, mask_zero=True)(t)
    model = keras.Model(t, keras.layers.Dense(3, name="probs")(layer(x)), name=f"tiny_{kind}")
    return model, tokens()


def gelu_encoder():
    """One transformer encoder block (d=16, 2 heads) whose feed-forward uses exact GELU (Erfc)."""
    keras = _keras()
    keras.utils.set_random_seed(0)
    t = keras.Input((8, 16), name="x")
    a = keras.layers.MultiHeadAttention(2, 8)(t, t)
    x = keras.layers.LayerNormalization()(t + a)
    f = keras.layers.Dense(32, activation=keras.activations.gelu)(x)
    x = keras.layers.LayerNormalization()(x + keras.layers.Dense(16)(f))
    x = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(t, keras.layers.Dense(3, name="probs")(x), name="gelu_encoder")
    return model, np.random.default_rng(0).normal(size=(4, 8, 16)).astype("float32")


def gpt_decoder(causal: bool = True):
    """A GPT-style decoder: token and position embeddings, 2 blocks of MultiHeadAttention with
    a causal mask (Keras builds it with ``tf.linalg.band_part``), per-token logits."""
    keras = _keras()
    keras.utils.set_random_seed(0)
    t = keras.Input((TOKENS,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(VOCAB, 16)(t)
    x = x + keras.layers.Embedding(TOKENS, 16)(keras.ops.arange(TOKENS)[None, :])
    for i in range(2):
        a = keras.layers.MultiHeadAttention(2, 8, name=f"mha{i}")(x, x, use_causal_mask=causal)
        x = keras.layers.LayerNormalization()(x + a)
        x = keras.layers.LayerNormalization()(x + keras.layers.Dense(16)(keras.layers.Dense(32, activation="relu")(x)))
    model = keras.Model(t, keras.layers.Dense(VOCAB, name="logits")(x), name="gpt_decoder")
    return model, np.random.default_rng(0).integers(0, VOCAB, (4, TOKENS)).astype("int32")


def two_input():
    """A dict-input model (image + meta vector): converters reorder its inputs."""
    keras = _keras()
    keras.utils.set_random_seed(0)
    img, meta = keras.Input((8, 8, 1), name="image"), keras.Input((3,), name="meta")
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3, activation="relu")(img))
    x = keras.layers.Concatenate()([x, keras.layers.Dense(4)(meta)])
    model = keras.Model({"image": img, "meta": meta}, keras.layers.Dense(2, name="out")(x), name="two_input")
    rng = np.random.default_rng(0)
    return model, {"image": rng.uniform(size=(4, 8, 8, 1)).astype("float32"),
                   "meta": rng.uniform(size=(4, 3)).astype("float32")}


def _trained_like_batchnorm(model: Any, seed: int = 0) -> Any:
    """Give every BatchNormalization non-default statistics, as training would: the converters
    then fold and fuse differently than for an untouched model (TFJS fuses hard-swish)."""
    keras = _keras()
    rng = np.random.default_rng(seed)
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.BatchNormalization):
            gamma, beta, mean, var = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, gamma.shape).astype("float32"),
                               rng.normal(0, 0.1, beta.shape).astype("float32"),
                               rng.normal(0, 0.1, mean.shape).astype("float32"),
                               rng.uniform(0.5, 1.5, var.shape).astype("float32")])
    return model


def mobilenet_v3_small():
    keras = _keras()
    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV3Small(input_shape=(64, 64, 3), weights=None, classes=10)
    return _trained_like_batchnorm(model), np.random.default_rng(0).uniform(0, 255, (2, 64, 64, 3)).astype("float32")


def convnext_tiny():
    keras = _keras()
    keras.utils.set_random_seed(0)
    model = keras.applications.ConvNeXtTiny(input_shape=(64, 64, 3), weights=None, classes=10)
    return model, np.random.default_rng(0).uniform(0, 255, (2, 64, 64, 3)).astype("float32")


def string_input():
    """StringLookup over a string input: the formats that cannot carry strings must say so."""
    keras = _keras()
    keras.utils.set_random_seed(0)
    t = keras.Input((4,), dtype="string", name="words")
    ids = keras.layers.StringLookup(vocabulary=["a", "b", "c", "d"])(t)
    x = keras.layers.Flatten()(keras.layers.Embedding(6, 4)(ids))
    model = keras.Model(t, keras.layers.Dense(2, name="out")(x), name="string_input")
    return model, np.array([["a", "b", "c", "zz"], ["d", "d", "a", "b"]], dtype=object)


def subclassed_cnn():
    """A subclassed keras.Model (Python ``call``, no keras.Input), built by one call: traced."""
    keras = _keras()

    class SubclassedCNN(keras.Model):
        def __init__(self):
            super().__init__()
            self.conv = keras.layers.Conv2D(8, 3, activation="relu")
            self.pool = keras.layers.GlobalAveragePooling2D()
            self.head = keras.layers.Dense(4)

        def call(self, image):
            return keras.ops.softmax(self.head(self.pool(self.conv(image))))

    keras.utils.set_random_seed(0)
    model = SubclassedCNN()
    batch = np.random.default_rng(0).uniform(0, 1, (4, 16, 16, 3)).astype("float32")
    model(batch[:1])
    return model, batch


def mixed_float16_cnn():
    """A CNN under keras.mixed_precision 'mixed_float16' (float16 compute, float32 head)."""
    keras = _keras()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        x = keras.Input((16, 16, 3), name="image")
        h = keras.layers.MaxPooling2D()(keras.layers.Conv2D(8, 3, activation="relu")(x))
        h = keras.layers.GlobalAveragePooling2D()(keras.layers.BatchNormalization()(h))
        y = keras.layers.Dense(4, activation="softmax", dtype="float32", name="probs")(h)
        model = keras.Model(x, y, name="mixed_float16_cnn")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model, np.random.default_rng(0).uniform(0, 1, (4, 16, 16, 3)).astype("float32")


FAMILIES: dict[str, Callable[[], tuple[Any, Any]]] = {
    "tiny CNN": lambda: (tiny_cnn(), np.random.default_rng(0).uniform(0, 1, (4, 8, 8, 3)).astype("float32")),
    "MLP": lambda: (mlp(), np.random.default_rng(0).normal(size=(4, 16)).astype("float32")),
    "two-input (dict)": two_input,
    "LSTM (masked)": lambda: recurrent("lstm"),
    "GRU (masked)": lambda: recurrent("gru"),
    "BiLSTM (masked)": lambda: recurrent("bilstm"),
    "Transformer encoder, exact GELU": gelu_encoder,
    "MobileNetV3Small, trained-like BN, 64x64": mobilenet_v3_small,
    "ConvNeXtTiny, 64x64": convnext_tiny,
    "string input (StringLookup)": string_input,
    "subclassed CNN (built by a call)": subclassed_cnn,
    "mixed_float16 CNN": mixed_float16_cnn,
    "GPT decoder, causal mask": gpt_decoder,
}
SMALL = ("LSTM (masked)", "GRU (masked)", "BiLSTM (masked)", "Transformer encoder, exact GELU")
