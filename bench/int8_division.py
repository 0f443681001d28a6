"""What keeping an int8 file's DIV in float costs and what it gives.

An L2-normalised classifier head (``x / (||x|| + eps)`` after a ReLU Dense, the model of
``tests/test_export_failures_of_real_models.py``, here 64 features wide) converted to int8 in one process:

- the baseline: the TFLite converter alone (``TFLiteConverter.from_keras_model``, int8,
  the same calibration rows): its file fails in LiteRT on a row whose divisor rounds to its
  zero point (the all-zero row: ``div.cc ... (DIV)``);
- ``export_model(model, "tflite", quantization="int8")``: converted, found to have an int8
  DIV by a computed tensor, quantised again with DIV kept in float.

Prints the median export time of each (and the ratio), whether each file runs on the zero row,
and the max error vs Keras on test rows (relative to the outputs' scale).

    .venv/bin/python bench/int8_division.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def build(width: int):
    import keras

    init = keras.initializers.GlorotUniform
    x = keras.Input((width,), name="features")
    h = keras.layers.Dense(width, activation="relu", name="h", kernel_initializer=init(seed=1))(x)
    n = keras.layers.Lambda(lambda t: t / (keras.ops.sqrt(keras.ops.sum(t * t, axis=-1, keepdims=True)) + 1e-3),
                            name="l2norm")(h)
    y = keras.layers.Dense(10, name="score", kernel_initializer=keras.initializers.RandomNormal(stddev=2.0, seed=2))(n)
    return keras.Model(x, y)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf

    from pytest_modelparity import export_model, load_model
    from pytest_modelparity.formats.common import export_route

    model = build(args.width)
    rng = np.random.default_rng(0)
    calibration = rng.normal(size=(100, args.width)).astype("float32")
    test = rng.normal(size=(64, args.width)).astype("float32")
    zero = np.zeros((1, args.width), "float32")
    want = np.asarray(model(test))
    scale = float(np.abs(want).max())

    def plain() -> bytes:
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([r[None]] for r in calibration)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        return converter.convert()

    tmp = Path(tempfile.mkdtemp())
    times: dict[str, list[float]] = {"converter alone": [], "export_model (DIV in float)": []}
    paths: dict[str, Path] = {}
    for i in range(args.repeat):
        start = time.perf_counter()
        content = plain()
        times["converter alone"].append(time.perf_counter() - start)
        paths["converter alone"] = tmp / "plain.tflite"
        paths["converter alone"].write_bytes(content)
        start = time.perf_counter()
        paths["export_model (DIV in float)"] = export_model(model, "tflite", tmp / f"m{i}.tflite", quantization="int8",
                                                            representative_data=[calibration])
        times["export_model (DIV in float)"].append(time.perf_counter() - start)
    base = statistics.median(times["converter alone"])
    print(f"L2-normalised head, {args.width} features, int8, {args.repeat} exports each (TF {tf.__version__})")
    print("| conversion | median export s | ratio | runs on the zero row | max error / scale on 64 rows |")
    print("|---|---|---|---|---|")
    for name, values in times.items():
        loaded = load_model(paths[name])
        try:
            loaded.predict(zero)
            runs = "yes"
        except Exception as exc:  # noqa: BLE001 - the failure is the measurement
            runs = "no: " + ("the int8 DIV refuses a divisor at its zero point" if "(DIV)" in str(exc) else
                             str(exc).splitlines()[0][:80])
        (got,) = loaded.predict(test).values()
        error = float(np.abs(got - want).max()) / scale
        median = statistics.median(values)
        print(f"| {name} | {median:.3f} | {median / base:.2f}x | {runs} | {error:.3g} |")
    print(f"route: {export_route(paths['export_model (DIV in float)'])}")


if __name__ == "__main__":
    main()
