"""Bench: how a keras.mixed_precision model can reach TFLite (figures in docs/formats.md).

A small CNN (Conv2D, MaxPool, BatchNorm, GAP, float32 Dense head) under ``mixed_float16``,
``mixed_bfloat16`` and ``float16`` policies, converted from its serving function:

- as it is, with the converter options that might accept half-precision ops
  (``supported_types=[tf.float16]`` with and without ``Optimize.DEFAULT``,
  ``_experimental_reduce_type_precision``);
- as a float32 copy built from the config (policies rewritten) with the same weights;
- as ``export_model`` does (``mixed_precision.float32_plan``): the same layers traced under
  the float32 policy (``mixed_*``), or the config copy (``float16``: float16 weights).

Each converted file is run in LiteRT; the figure is max |a - e| / max |e| against the mixed
model itself (its float16 rounding) and against the float32 copy.

    .venv/bin/python bench/mixed_precision_tflite.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402


def build(policy: str):
    import keras

    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        x = keras.Input((16, 16, 3), name="image")
        h = keras.layers.MaxPooling2D()(keras.layers.Conv2D(8, 3, activation="relu")(x))
        h = keras.layers.GlobalAveragePooling2D()(keras.layers.BatchNormalization()(h))
        return keras.Model(x, keras.layers.Dense(4, activation="softmax", dtype="float32", name="probs")(h))
    finally:
        keras.mixed_precision.set_global_policy("float32")


def float32_copy(model):
    """The model rebuilt from its config with every policy float32, the same weights."""
    import keras

    def rewrite(node):
        if isinstance(node, dict):
            if node.get("class_name") == "DTypePolicy":
                node["config"]["name"] = "float32"
            for value in node.values():
                rewrite(value)
        elif isinstance(node, list):
            for value in node:
                rewrite(value)

    config = model.get_config()
    rewrite(config)
    copy = keras.Model.from_config(config)
    copy.set_weights(model.get_weights())
    return copy


def convert(model, **options) -> bytes:
    import tensorflow as tf

    from pytest_modelparity.formats.tensorflow.serving import serving_function

    serving = serving_function(model)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([serving.function.get_concrete_function()],
                                                                serving.holder)
    for key, value in options.items():
        if key == "supported_types":
            converter.target_spec.supported_types = value
        else:
            setattr(converter, key, value)
    return converter.convert()


def run(content: bytes, batch: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=content)
    index = interp.get_input_details()[0]["index"]
    interp.resize_tensor_input(index, batch.shape)
    interp.allocate_tensors()
    interp.set_tensor(index, batch)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def rel(a: np.ndarray, e: np.ndarray) -> float:
    return float(np.max(np.abs(a - e)) / np.max(np.abs(e)))


def main() -> None:
    import tensorflow as tf

    from pytest_modelparity.formats.tensorflow.mixed_precision import float32_plan

    batch = np.random.default_rng(0).uniform(0, 1, (4, 16, 16, 3)).astype("float32")
    for policy in ("mixed_float16", "mixed_bfloat16", "float16"):
        model = build(policy)
        ref = np.asarray(model(batch, training=False))
        copy = float32_copy(model)
        ref32 = np.asarray(copy(batch, training=False))
        print(f"== {policy}: float32 copy vs the model {rel(ref32, ref):.2e}")
        attempts = [
            ("as is", model, {}),
            ("supported_types=[float16] + Optimize.DEFAULT", model,
             {"optimizations": [tf.lite.Optimize.DEFAULT], "supported_types": [tf.float16]}),
            ("supported_types=[float16]", model, {"supported_types": [tf.float16]}),
            ("_experimental_reduce_type_precision", model, {"_experimental_reduce_type_precision": True}),
            ("float32 copy from the config", copy, {}),
            ("export_model's plan", None, {}),
        ]
        for label, subject, options in attempts:
            start = time.perf_counter()
            try:
                if subject is None:
                    plan = float32_plan(model)
                    with plan.scope:
                        content = convert(plan.subject)
                    label = f"{label}: {(plan.route or 'as is').split(' (')[0]}"
                else:
                    content = convert(subject, **options)
                out = run(content, batch)
                print(f"  {label:48s} converts ({time.perf_counter() - start:.1f} s): vs model {rel(out, ref):.2e}, "
                      f"vs float32 copy {rel(out, ref32):.2e}")
            except Exception as exc:  # noqa: BLE001 - the converter's refusal is the result
                text = str(exc)
                ops = sorted({line.split("'tf.")[1].split("'")[0] for line in text.splitlines() if "'tf." in line})
                print(f"  {label:48s} fails: {type(exc).__name__} ({', '.join(ops) or text.splitlines()[0][:80]})")


if __name__ == "__main__":
    main()
