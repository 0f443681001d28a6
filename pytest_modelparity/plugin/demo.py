"""The built-in demo model behind ``--modelparity-model=demo``.

Small enough to export to every format in seconds, yet with the layers that make formats
drift in practice (a convolution, a dense reduction, a softmax), and its weights come from
seeded initialisers so every run and every pytest-xdist worker builds the same model
without touching the global random state of the user's session.
"""

from __future__ import annotations

from typing import Any

INPUT_SHAPE = (8, 8, 3)
CLASSES = 4


def build_demo_model(seed: int = 0) -> Any:
    """conv 3x3 -> relu -> global average pool -> dense -> softmax, named inputs/outputs."""
    import keras

    init = keras.initializers.GlorotUniform
    inputs = keras.Input(shape=INPUT_SHAPE, name="image")
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv",
                            kernel_initializer=init(seed=seed),
                            bias_initializer=keras.initializers.RandomUniform(-0.1, 0.1, seed=seed + 1))(inputs)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    x = keras.layers.Dense(CLASSES, name="logits", kernel_initializer=init(seed=seed + 2))(x)
    outputs = keras.layers.Softmax(name="probs")(x)
    return keras.Model(inputs, outputs, name="modelparity_demo")
