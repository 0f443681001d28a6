"""A twin carries every Keras preprocessing layer's state, or it is no twin (no twin without proof).

The Keras-config twin rebuilds a model from ``get_config()`` and ``set_weights``; state that
lives elsewhere was lost: an adapted ``Discretization``'s bin boundaries were recomputed from
an empty summary (every row in bucket 0: the twin differed from the model by 6.6e-2 of scale,
and at 2.8e-2 it was taken as the model's own float32 error), an adapted lookup's vocabulary
(in its assets) never reached the twin. Tiny models built here, real Keras.
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_modelparity import load_model
from pytest_modelparity.floor import measure as shadow

pytest.importorskip("tensorflow", reason="the twins need TensorFlow: pip install 'pytest-modelparity[tensorflow]'")

WORDS = np.array(["red apple", "green pear", "blue sky", "red sky", "green apple pie", "yellow sun"] * 3)


def _head(keras, x):
    x = keras.layers.Dense(8, activation="relu")(x)
    return keras.layers.Dense(3, name="head")(x)


def preprocessed(kind: str, seed: int = 0):
    """``(model, batch)``: a small Keras model whose first layer is the preprocessing ``kind``,
    adapted where the layer adapts."""
    import keras

    layers, rng = keras.layers, np.random.default_rng(seed)
    keras.utils.set_random_seed(seed)
    if kind == "normalization+discretization":
        num = rng.normal(3, 2, (64, 2)).astype("float32")
        raw = rng.uniform(0, 10, (64, 1)).astype("float32")
        norm, disc = layers.Normalization(), layers.Discretization(num_bins=6)
        norm.adapt(num)
        disc.adapt(raw)
        a, b = keras.Input((2,), name="num"), keras.Input((1,), name="raw")
        merged = layers.Concatenate()([norm(a), layers.Flatten()(layers.Embedding(6, 4)(disc(b)))])
        return keras.Model([a, b], _head(keras, merged)), {"num": num[:8], "raw": raw[:8]}
    if kind == "discretization one_hot":
        raw = rng.uniform(0, 10, (64, 1)).astype("float32")
        disc = layers.Discretization(num_bins=5, output_mode="one_hot")
        disc.adapt(raw)
        a = keras.Input((1,), name="raw")
        return keras.Model(a, _head(keras, disc(a))), raw[:8]
    if kind.startswith(("StringLookup", "IntegerLookup")):
        cls, mode = kind.split(" ")
        data = (np.array([w.split()[0] for w in WORDS]).reshape(-1, 1) if cls == "StringLookup"
                else rng.integers(0, 20, (18, 1)).astype("int64"))
        lookup = getattr(layers, cls)(output_mode=mode)
        lookup.adapt(data)
        a = keras.Input((1,), dtype="string" if cls == "StringLookup" else "int64", name="tokens")
        x = lookup(a)
        x = layers.Flatten()(layers.Embedding(30, 4)(x)) if mode == "int" else x
        return keras.Model(a, _head(keras, x)), data[:8]
    if kind.startswith("TextVectorization"):
        mode = kind.split(" ")[1]
        vectorize = layers.TextVectorization(max_tokens=20, output_mode=mode,
                                             output_sequence_length=4 if mode == "int" else None)
        vectorize.adapt(WORDS)
        a = keras.Input((1,), dtype="string", name="text")
        x = vectorize(a)
        x = layers.GlobalAveragePooling1D()(layers.Embedding(20, 4)(x)) if mode == "int" else x
        return keras.Model(a, _head(keras, x)), WORDS[:8].reshape(-1, 1)
    if kind == "Hashing":
        a = keras.Input((1,), dtype="int64", name="ids")
        x = layers.Flatten()(layers.Embedding(7, 4)(layers.Hashing(num_bins=7, salt=3)(a)))
        return keras.Model(a, _head(keras, x)), rng.integers(0, 20, (8, 1)).astype("int64")
    if kind == "CategoryEncoding":
        a = keras.Input((2,), dtype="int64", name="ids")
        x = layers.CategoryEncoding(num_tokens=20, output_mode="count")(a)
        return keras.Model(a, _head(keras, x)), rng.integers(0, 20, (8, 2)).astype("int64")
    raise ValueError(kind)


KINDS = ["normalization+discretization", "discretization one_hot", "StringLookup int", "StringLookup tf_idf",
         "IntegerLookup multi_hot", "TextVectorization int", "TextVectorization tf_idf", "Hashing", "CategoryEncoding"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_keras_twin_carries_the_preprocessing_state(kind):
    model, batch = preprocessed(kind)
    ref = load_model(model)
    twin = shadow.twin_of(ref, shadow.FLOAT64, "keras")
    assert twin.model is not None, twin.reason
    out = twin.model(batch)["head"]
    assert out.dtype == np.float64
    # rounding only: a lost boundary, vocabulary or mean moves outputs by 1e-2 of scale or more
    assert shadow.relative_error(ref.predict(batch)["head"], out) < 1e-6


def test_the_float16_weights_twin_carries_it_too():
    model, batch = preprocessed("normalization+discretization")
    ref = load_model(model)
    twin = shadow.twin_of(ref, shadow.FLOAT16_WEIGHTS, "keras")
    assert twin.model is not None, twin.reason
    err = shadow.relative_error(ref.predict(batch)["head"], twin.model(batch)["head"])
    assert 0 < err < 5e-3                   # what float16 weights cost, not a lost bucket
