"""Small Keras models for the twins' tests (issue 36): preprocessing layers whose state is not
all in their weights, and a two-head net whose heads have the same shape."""

from __future__ import annotations

import numpy as np

WORDS = np.array(["red apple", "green pear", "blue sky", "red sky", "green apple pie", "yellow sun"] * 3)


def _head(keras, x):
    x = keras.layers.Dense(8, activation="relu")(x)
    return keras.layers.Dense(3, name="head")(x)


def preprocessed(kind: str, seed: int = 0, rows: int = 8, kernel_factor: float = 1.0):
    """``(model, batch of ``rows``)``: a small Keras model whose first layer is the preprocessing
    ``kind``, adapted where the layer adapts; ``kernel_factor`` scales its head's kernel (a planted bug)."""
    model, batch = _preprocessed(kind, seed, rows)
    if kernel_factor != 1.0:
        head = model.get_layer("head")
        kernel, bias = head.get_weights()
        head.set_weights([kernel * np.float32(kernel_factor), bias])
    return model, batch


def _preprocessed(kind: str, seed: int, rows: int):
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
        return keras.Model([a, b], _head(keras, merged)), {"num": num[:rows], "raw": raw[:rows]}
    if kind == "discretization one_hot":
        raw = rng.uniform(0, 10, (64, 1)).astype("float32")
        disc = layers.Discretization(num_bins=5, output_mode="one_hot")
        disc.adapt(raw)
        a = keras.Input((1,), name="raw")
        return keras.Model(a, _head(keras, disc(a))), raw[:rows]
    if kind.startswith(("StringLookup", "IntegerLookup")):
        cls, mode = kind.split(" ")
        data = (np.array([w.split()[0] for w in WORDS]).reshape(-1, 1) if cls == "StringLookup"
                else rng.integers(0, 20, (18, 1)).astype("int64"))
        lookup = getattr(layers, cls)(output_mode=mode)
        lookup.adapt(data)
        a = keras.Input((1,), dtype="string" if cls == "StringLookup" else "int64", name="tokens")
        x = lookup(a)
        x = layers.Flatten()(layers.Embedding(30, 4)(x)) if mode == "int" else x
        return keras.Model(a, _head(keras, x)), data[:rows]
    if kind.startswith("TextVectorization"):
        mode = kind.split(" ")[1]
        vectorize = layers.TextVectorization(max_tokens=20, output_mode=mode,
                                             output_sequence_length=4 if mode == "int" else None)
        vectorize.adapt(WORDS)
        a = keras.Input((1,), dtype="string", name="text")
        x = vectorize(a)
        x = layers.GlobalAveragePooling1D()(layers.Embedding(20, 4)(x)) if mode == "int" else x
        return keras.Model(a, _head(keras, x)), WORDS[:rows].reshape(-1, 1)
    if kind == "Hashing":
        a = keras.Input((1,), dtype="int64", name="ids")
        x = layers.Flatten()(layers.Embedding(7, 4)(layers.Hashing(num_bins=7, salt=3)(a)))
        return keras.Model(a, _head(keras, x)), rng.integers(0, 20, (rows, 1)).astype("int64")
    if kind == "CategoryEncoding":
        a = keras.Input((2,), dtype="int64", name="ids")
        x = layers.CategoryEncoding(num_tokens=20, output_mode="count")(a)
        return keras.Model(a, _head(keras, x)), rng.integers(0, 20, (rows, 2)).astype("int64")
    raise ValueError(kind)


def two_heads(gap: float = 0.02, seed: int = 0):
    """A net with two heads of the same shape, ``mean`` and ``log_var``, returned as a list in
    that order (a SavedModel sorts them: ``log_var`` first); ``log_var``'s weights are ``mean``'s
    times ``1 + gap``, so the heads differ by ``gap`` of scale."""
    import keras

    keras.utils.set_random_seed(seed)
    x = keras.Input((6,), name="x")
    hidden = keras.layers.Dense(16, activation="tanh")(x)
    mean = keras.layers.Dense(3, name="mean")(hidden)
    log_var = keras.layers.Dense(3, name="log_var")
    model = keras.Model(x, [mean, log_var(hidden)])
    kernel, bias = model.get_layer("mean").get_weights()
    log_var.set_weights([kernel * np.float32(1 + gap), bias * np.float32(1 + gap)])
    return model
