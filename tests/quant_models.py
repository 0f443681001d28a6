"""Two tiny Keras nets whose int8 files fail the int8 budget for opposite reasons (issue 50's
quantised advice, tests/test_quant_advice.py):

- ``outlier_mlp``: one unit of ``wide`` is 300x the others (and ``d3`` reads it /300), so the
  int8 range of ``wide``'s output is set by that unit and its other units round to a few
  levels. The error shows at ``d3``; keeping ``d3`` alone in float leaves its input int8 and
  gains ~1%, keeping ``wide`` with it removes ~99% (measured, bench/quant_advice.py).
- ``deep_tanh``: ten tanh layers with gain 2.5, where every layer's rounding grows through the
  rest: no few ops explain the cost.
"""

from __future__ import annotations

import numpy as np

WIDTH = 16


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, WIDTH)).astype("float32")


def outlier_mlp():
    import keras

    keras.utils.set_random_seed(3)
    x = keras.Input((WIDTH,), name="x")
    h = keras.layers.Dense(32, activation="relu", name="d1")(x)
    h = keras.layers.Dense(32, name="wide")(h)
    h = keras.layers.Dense(32, activation="relu", name="d3")(h)
    h = keras.layers.Dense(32, activation="relu", name="d4")(h)
    model = keras.Model(x, keras.layers.Dense(4, name="out")(h))
    kernel, bias = model.get_layer("wide").get_weights()
    kernel[:, 0] *= 300
    model.get_layer("wide").set_weights([kernel, bias])
    kernel, bias = model.get_layer("d3").get_weights()
    kernel[0, :] /= 300
    model.get_layer("d3").set_weights([kernel, bias])
    return model


def deep_tanh(depth: int = 10, gain: float = 2.5):
    import keras

    keras.utils.set_random_seed(5)
    x = keras.Input((WIDTH,), name="x")
    h = x
    for i in range(depth):
        h = keras.layers.Dense(WIDTH, activation="tanh", name=f"d{i}",
                               kernel_initializer=keras.initializers.RandomNormal(stddev=gain / 4))(h)
    return keras.Model(x, keras.layers.Dense(4, name="out")(h))
