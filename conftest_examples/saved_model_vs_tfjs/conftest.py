"""Example (c), seed 003: a SavedModel and its TensorFlow.js conversion.

``modelparity_source`` returns the SavedModel directory, so ``parity_reference`` is the
SavedModel and ``parity_candidate`` is its TFJS graph model, converted once per session
(into a temporary directory: file sources are not cached) and run by real @tensorflow/tfjs
in a Node.js process. Needs Node.js >= 18 and npm; without them the tests skip and say how
to install them (``--modelparity-strict`` makes that a failure).
"""

import pytest


def build_classifier():
    import keras

    init = keras.initializers.GlorotUniform
    image = keras.Input((12, 12, 3), name="image")
    x = keras.layers.Conv2D(6, 3, activation="relu", name="conv", kernel_initializer=init(seed=3))(image)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    x = keras.layers.Dense(4, name="logits", kernel_initializer=init(seed=4))(x)
    return keras.Model(image, keras.layers.Softmax(name="probs")(x), name="flowers")


@pytest.fixture(scope="session")
def modelparity_source(tmp_path_factory):
    path = tmp_path_factory.mktemp("exported") / "saved_model"
    build_classifier().export(str(path), verbose=False)
    return path
