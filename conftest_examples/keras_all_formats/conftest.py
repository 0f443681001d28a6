"""Example (a): one Keras model against every export format this machine can run.

Copy this conftest.py next to your tests and return your own model from
``modelparity_source``. Each test asking for ``parity_candidate`` then runs once per
format (``--modelparity-formats`` to choose) and device (``--modelparity-device``).
"""

import pytest


def build_classifier():
    """A small image classifier: conv -> batch-norm -> relu -> pool -> dense -> softmax."""
    import keras

    init = keras.initializers.GlorotUniform
    image = keras.Input((16, 16, 3), name="image")
    x = keras.layers.Conv2D(8, 3, padding="same", name="conv", kernel_initializer=init(seed=0))(image)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.ReLU(name="relu")(x)
    x = keras.layers.MaxPooling2D(name="pool")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(5, name="logits", kernel_initializer=init(seed=1))(x)
    probs = keras.layers.Softmax(name="probs")(x)
    return keras.Model(image, probs, name="classifier")


@pytest.fixture(scope="session")
def modelparity_source():
    # A factory: the plugin calls it once per session, then exports and loads the model
    # once per (format, device), however many tests use it.
    return build_classifier
