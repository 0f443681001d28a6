"""What a warm tfjs predict costs on top of tfjs's own compute, and what a process per call costs.

    .venv/bin/python bench/tfjs_overhead.py [--runs 60] [--batch 8]

For a small CNN exported to a tfjs graph model, per backend (cpu, wasm):
  compute    tfjs's own time measured inside Node (tensor creation, execute, read back)
  round trip model.predict() timed in Python (batch checks, encode, pipe, Node, decode)
  overhead   round trip - compute, per call (target: < 10 ms)
and, as the baseline measured in the same process, a fresh Node process per call
(start, require tfjs, load, predict, stop). Medians over ``--runs`` warm calls.

``--resnet``: the ResNet50-size cost (keras.applications.ResNet50(weights=None), 64x64x3, batch
4): the cpu backend (what every tfjs run used before backend "auto"), wasm, and "auto" (what
runs now), each as the median of ``--resnet-runs`` warm predicts, with the ratio to the cpu
backend measured in the same process and Keras' own predict as the reference; and the size of
the runner's node_modules.
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


def _du_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6


def resnet(runs: int) -> None:
    import keras

    from pytest_modelparity import export_model, load_model
    from pytest_modelparity.runtime.tfjs_runner import modules_dir

    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3))
    x = np.random.default_rng(0).uniform(-1, 1, (4, 64, 64, 3)).astype("float32")
    med = statistics.median
    keras_ms = []
    model.predict(x, verbose=0)
    for _ in range(runs):
        t0 = time.perf_counter()
        model.predict(x, verbose=0)
        keras_ms.append((time.perf_counter() - t0) * 1000)
    with tempfile.TemporaryDirectory() as tmp:
        path = export_model(model, "tfjs", Path(tmp) / "resnet50")
        print(f"\nResNet50(weights=None) 64x64x3, batch 4, median of {runs} warm predicts "
              f"(Keras predict: {med(keras_ms):.1f} ms)")
        print(f"{'backend':8} {'ran on':8} {'compute ms':>11} {'round trip ms':>14} {'vs cpu':>7} {'vs keras':>9}")
        base = None
        for backend in ("cpu", "wasm", "auto"):
            with load_model(path, "tfjs", backend=backend) as js:
                js.predict(x)  # warm up (wasm compiles, kernels allocate)
                compute, rtt = [], []
                for _ in range(runs):
                    t0 = time.perf_counter()
                    js.predict(x)
                    rtt.append((time.perf_counter() - t0) * 1000)
                    compute.append(js.last_compute_ms)
                base = base or med(rtt)
                print(f"{backend:8} {js.backend:8} {med(compute):11.1f} {med(rtt):14.1f} {med(rtt) / base:7.3f} "
                      f"{med(rtt) / med(keras_ms):9.1f}")
    print(f"runner node_modules: {_du_mb(modules_dir()):.0f} MB ({modules_dir()})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--cold-runs", type=int, default=5)
    parser.add_argument("--resnet", action="store_true", help="also time ResNet50 64x64 per backend")
    parser.add_argument("--resnet-runs", type=int, default=5)
    args = parser.parse_args()
    if args.resnet:
        resnet(args.resnet_runs)

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
