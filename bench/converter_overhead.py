"""Bench: ``export_model`` against the bare converter, per format, in one process.

For MobileNetV2 at 64 px (10 classes, trained-like batch-norm statistics), alternating in one
process ``--repeats`` times: the bare converter (``TFLiteConverter.from_concrete_functions``
handed the Keras model; ``tf2onnx.convert.from_function`` on a fresh ``tf.function``) and the
plugin's ``export_model`` (its serving trace, its conversion route, the file validated in
LiteRT / onnxruntime). Medians, and their ratio. What it checks: the plugin's conversion costs
what the converter costs (the TFLite converter once saved a tracked Keras model, 2x; ONNX was
frozen twice, 2x: docs/performance.md).

    .venv/bin/python bench/converter_overhead.py [--formats tflite,onnx] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--formats", default="tflite,onnx")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import keras
    import tensorflow as tf

    from families import _trained_like_batchnorm
    from pytest_modelparity import export_model

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(input_shape=(64, 64, 3), weights=None, classes=10)
    _trained_like_batchnorm(model)
    spec = tf.TensorSpec((None, 64, 64, 3), tf.float32)
    out = Path(tempfile.mkdtemp(prefix="converter-overhead-"))

    def bare(fmt: str) -> None:
        fn = tf.function(lambda x: model(x, training=False))
        if fmt == "tflite":
            tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function(spec)], model).convert()
        else:
            import tf2onnx

            tf2onnx.convert.from_function(fn, input_signature=[spec], opset=17)

    for fmt in args.formats.split(","):
        times: dict[str, list[float]] = {"bare": [], "plugin": []}
        for i in range(args.repeats):
            for kind in (("bare", "plugin") if i % 2 == 0 else ("plugin", "bare")):
                start = time.perf_counter()
                if kind == "bare":
                    bare(fmt)
                else:
                    export_model(model, fmt, out / f"{fmt}-{i}" / f"model.{fmt}")
                times[kind].append(time.perf_counter() - start)
        b, p = statistics.median(times["bare"]), statistics.median(times["plugin"])
        print(f"{fmt}: bare {b:.2f} s {[round(t, 2) for t in times['bare']]}, export_model {p:.2f} s "
              f"{[round(t, 2) for t in times['plugin']]}: {p / b:.2f}x")


if __name__ == "__main__":
    main()
