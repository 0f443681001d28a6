"""A small CNN trained on the UCI handwritten digits (8x8, 1,797 images, no download): the copy
scikit-learn bundles, kept in tests/data/digits.csv.gz (tests/data/README.md), so the suite does
not install scikit-learn, whose import Keras makes in every TensorFlow process (1.3 CPU-s each).

Why a trained model: what quantisation costs depends on the weights and the data; random
weights on random rows say little about it (notes/quantization.md). Training takes a few
seconds on two CPU cores. Inputs are pixels scaled to [0, 1]; outputs are 10 logits.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

DIGITS_CSV = Path(__file__).parent / "data" / "digits.csv.gz"  # scikit-learn's copy, byte for byte


def digits_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): images (n, 8, 8, 1) in [0, 1], labels 0..9."""
    table = np.loadtxt(DIGITS_CSV, delimiter=",")  # 64 pixels in 0..16, then the label, per row
    x = (table[:, :-1].reshape(-1, 8, 8) / 16.0).astype("float32")[..., None]
    y = table[:, -1].astype("int64")
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    cut = 1400
    return x[:cut], y[:cut], x[cut:], y[cut:]


# Trained weights by (builder, arguments), for this process: in-process pytester sessions import
# their conftest again each time, and each trained the same model again (3-4 CPU-seconds a
# session, issue 49). A hit builds the same layers afresh (a new model, nothing shared with an
# earlier session's) and sets the weights that training gave.
_TRAINED: dict[tuple, list[np.ndarray]] = {}


def _fit_once(key: tuple, model, fit) -> None:
    if key in _TRAINED:
        model.set_weights(_TRAINED[key])
    else:
        fit()
        _TRAINED[key] = [w.copy() for w in model.get_weights()]


def digits_cnn(seed: int = 0, *, epochs: int = 4, name: str = "digits_cnn"):
    """conv-bn-relu x2 -> dense logits, trained ``epochs`` epochs; returns (model, x_train, x_test)."""
    import keras

    x_train, y_train, x_test, y_test = digits_data(seed)
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 1), name="image")
    h = keras.layers.Conv2D(16, 3, padding="same", name="conv1")(inputs)
    h = keras.layers.BatchNormalization(name="bn1")(h)
    h = keras.layers.ReLU(name="relu1")(h)
    h = keras.layers.Conv2D(32, 3, strides=2, padding="same", name="conv2")(h)
    h = keras.layers.BatchNormalization(name="bn2")(h)
    h = keras.layers.ReLU(name="relu2")(h)
    h = keras.layers.Flatten(name="flatten")(h)
    outputs = keras.layers.Dense(10, name="logits")(h)
    model = keras.Model(inputs, outputs, name=name)
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    _fit_once(("digits_cnn", seed, epochs, name), model,
              lambda: model.fit(x_train, y_train, epochs=epochs, batch_size=32, verbose=0))
    return model, x_train, x_test


def accuracy(logits: np.ndarray, x_test_labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(logits, -1) == x_test_labels))


def digits_two_heads(seed: int = 0, *, epochs: int = 4):
    """A trained CNN with two kinds of output: ``probs`` (a softmax over the 10 digits: class
    scores) and ``boxes`` (the mean ink of the image's four quadrants: a 4-value regression, where
    top-1 means nothing). Returns (model, x_train, x_test)."""
    import keras

    x_train, y_train, x_test, _ = digits_data(seed)
    quads = lambda x: np.stack([x[:, :4, :4].mean((1, 2, 3)), x[:, :4, 4:].mean((1, 2, 3)),  # noqa: E731
                                x[:, 4:, :4].mean((1, 2, 3)), x[:, 4:, 4:].mean((1, 2, 3))], -1)
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 1), name="image")
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1")(inputs)
    h = keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu", name="conv2")(h)
    h = keras.layers.Flatten(name="flatten")(h)
    probs = keras.layers.Dense(10, activation="softmax", name="probs")(h)
    boxes = keras.layers.Dense(4, name="boxes")(h)
    model = keras.Model(inputs, {"probs": probs, "boxes": boxes}, name="digits_two_heads")
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss={"probs": "sparse_categorical_crossentropy", "boxes": "mse"})
    _fit_once(("digits_two_heads", seed, epochs), model, lambda: model.fit(
        x_train, {"probs": y_train, "boxes": quads(x_train)}, epochs=epochs, batch_size=32, verbose=0))
    return model, x_train, x_test


def digits_conftest(tests_dir: str, builder: str = "digits_cnn") -> str:
    """A pytester conftest whose source is the trained digits model ``builder`` (a function of
    this module returning ``(model, x_train, x_test)``), trained once per session, and whose
    dataset is 100 calibration rows, the held-out rows, then the other training rows (a list of
    arrays is batches; a quantised verdict draws the rows its budget needs from them)."""
    return textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {tests_dir!r})
        import pytest
        from digits import {builder}

        _MODEL = {{}}

        def _trained():
            if not _MODEL:
                _MODEL["m"] = {builder}()
            return _MODEL["m"]

        @pytest.fixture(scope="session")
        def modelparity_source():
            return _trained()[0]

        @pytest.fixture(scope="session")
        def modelparity_dataset():
            model, x_train, x_test = _trained()
            return [x_train[:100], x_test, x_train[100:]]  # the rest: rows enough to judge every budget
    ''')
