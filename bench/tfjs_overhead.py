"""What a warm tfjs predict costs on top of tfjs's own compute, and what a process per call costs.

    .venv/bin/python bench/tfjs_overhead.py [--runs 60] [--batch 8]

For a small CNN exported to a tfjs graph model, per backend (cpu, wasm):
  compute    tfjs's own time measured inside Node (tensor creation, execute, read back)
  round trip model.predict() timed in Python (batch checks, encode, pipe, Node, decode)
  overhead   round trip - compute, per call (target: < 10 ms)
and, as the baseline measured in the same process, a fresh Node process per call
(start, require tfjs, load, predict, stop). Medians over ``--runs`` warm calls.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


def small_cnn():
    import keras

    keras.utils.set_random_seed(0)
    x_in = keras.Input(shape=(32, 32, 3), name="image")
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x_in)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    out = keras.layers.Dense(10, activation="softmax")(x)
    return keras.Model(x_in, out, name="small_cnn")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--cold-runs", type=int, default=5)
    args = parser.parse_args()

    from pytest_modelparity import export_model, load_model

    x = np.random.default_rng(0).uniform(0, 1, (args.batch, 32, 32, 3)).astype("float32")
    with tempfile.TemporaryDirectory() as tmp:
        path = export_model(small_cnn(), "tfjs", Path(tmp) / "cnn")
        print(f"small CNN 32x32x3 -> conv16 -> pool -> conv32 -> gap -> dense10, batch {args.batch}, "
              f"{args.runs} warm calls, medians")
        print(f"{'backend':8} {'compute ms':>11} {'round trip ms':>14} {'overhead ms':>12} {'ratio rt/compute':>17}")
        results = {}
        for backend in ("cpu", "wasm"):
            with load_model(path, "tfjs", backend=backend) as model:
                for _ in range(5):  # warm up: kernels, wasm compilation, allocator
                    model.predict(x)
                compute, rtt, over = [], [], []
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    model.predict(x)
                    dt = (time.perf_counter() - t0) * 1000
                    c = model.last_compute_ms
                    compute.append(c)
                    rtt.append(dt)
                    over.append(dt - c)
                med = statistics.median
                results[backend] = (med(compute), med(rtt), med(over))
                print(f"{backend:8} {med(compute):11.2f} {med(rtt):14.2f} {med(over):12.2f} "
                      f"{med(rtt) / med(compute):17.2f}")

        cold = []
        for _ in range(args.cold_runs):
            t0 = time.perf_counter()
            with load_model(path, "tfjs", backend="cpu") as model:
                model.predict(x)
            cold.append((time.perf_counter() - t0) * 1000)
        cold_med = statistics.median(cold)
        warm_rt = results["cpu"][1]
        print(f"baseline: a new node process per call (cpu backend): {cold_med:.1f} ms median over "
              f"{args.cold_runs}; warm round trip is {cold_med / warm_rt:.0f}x faster")
        worst = max(r[2] for r in results.values())
        verdict = "OK" if worst < 10 else "OVER TARGET"
        print(f"overhead target < 10 ms over tfjs's compute: worst median {worst:.2f} ms -> {verdict}")
        return 0 if worst < 10 else 1


if __name__ == "__main__":
    sys.exit(main())
