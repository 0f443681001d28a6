"""How long does a Keras-2-era SavedModel with optimizer slot variables take to load?

Writes one with ``tf_keras`` (a small CNN compiled with the legacy Adam, fitted one step,
saved with ``include_optimizer=True``) in a child process, then, in a child process where
``tf_keras`` is not importable (a user's TF 2.21 + Keras 3 machine), times:

- ``load_model(dir)``: the plugin's route for it (slot records seen in ``saved_model.pb``,
  the signature through the v1 loader, frozen, wrapped as a function);
- the baseline: TF's own ``tf.saved_model.load`` on a copy whose object graph has the slot
  records removed (the only way TF 2.x revives it without tf_keras), and ``load_model`` of
  that copy (the plugin's ordinary TF2 route);
- ``tf.saved_model.load(dir)`` failing on ``add_slot`` (what any loader pays before a fallback).

Prints medians (each load in a fresh ``tf.Graph`` scope of the same process) and ratios.

    .venv/bin/python bench/old_saved_model.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

WRITE = textwrap.dedent('''
    import sys
    import numpy as np
    import tf_keras as k
    x = k.Input((32, 32, 3), name="image")
    h = x
    for i, width in enumerate((16, 32, 64)):
        h = k.layers.Conv2D(width, 3, padding="same", activation="relu", name=f"c{i}")(h)
        h = k.layers.BatchNormalization(name=f"bn{i}")(h)
        h = k.layers.MaxPooling2D(name=f"p{i}")(h)
    y = k.layers.Dense(10, name="score")(k.layers.GlobalAveragePooling2D()(h))
    model = k.Model(x, y)
    model.compile(optimizer=k.optimizers.legacy.Adam(1e-3), loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(8, 32, 32, 3)).astype("float32"), rng.normal(size=(8, 10)).astype("float32"),
              epochs=1, verbose=0)
    model.save(sys.argv[1], save_format="tf", include_optimizer=True)
''')

MEASURE = textwrap.dedent('''
    import shutil, statistics, sys, time
    sys.modules["tf_keras"] = None
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2
    from pytest_modelparity import load_model

    src, repeat = sys.argv[1], int(sys.argv[2])
    stripped = src + "-no-slots"
    shutil.copytree(src, stripped)
    message = saved_model_pb2.SavedModel()
    message.ParseFromString(open(src + "/saved_model.pb", "rb").read())
    slots = 0
    for graph in message.meta_graphs:
        for node in graph.object_graph_def.nodes:
            slots += len(node.slot_variables)
            del node.slot_variables[:]
    open(stripped + "/saved_model.pb", "wb").write(message.SerializeToString())

    def median(fn):
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def failing():
        try:
            tf.saved_model.load(src)
        except AttributeError as exc:
            assert "add_slot" in str(exc)
        else:
            raise AssertionError("TF 2.x loaded it: is tf_keras importable?")

    rows = [("tf.saved_model.load, slot records removed (baseline)", median(lambda: tf.saved_model.load(stripped))),
            ("load_model, slot records removed (TF2 route)", median(lambda: load_model(stripped))),
            ("load_model, as written (v1 loader, frozen)", median(lambda: load_model(src))),
            ("tf.saved_model.load, as written (fails: add_slot)", median(failing))]
    base = rows[0][1]
    print(f"{slots} slot records; median of {repeat} loads")
    print("| load | median (s) | vs baseline |")
    print("|---|---|---|")
    for name, value in rows:
        print(f"| {name} | {value:.2f} | {value / base:.2f}x |")
''')


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        saved = str(Path(tmp) / "keras2_sm")
        subprocess.run([sys.executable, "-c", WRITE, saved], check=True)
        subprocess.run([sys.executable, "-c", MEASURE, saved, str(args.repeat)], check=True)


if __name__ == "__main__":
    main()
