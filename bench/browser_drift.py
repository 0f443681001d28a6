"""How far each tfjs backend drifts from Keras, in Node.js and in headless Chromium.

    .venv/bin/python bench/browser_drift.py [--runs 5] [--nets digits,tiny_cnn,mobilenetv2]

Three nets with trained statistics (tests/digits.py's digits CNN, trained; tests/models.py's
tiny_cnn and MobileNetV2 alpha 0.35 at 64 px with trained-like batch-norm statistics), each
exported once to a tfjs graph model and run on every backend in one process: Node.js cpu and
wasm (the baseline), and Chromium's WebGL with float32 textures and with float16 textures
forced. Per backend: the largest |tfjs - Keras| as a share of the output's largest magnitude
("of scale"), relative RMS, top-1 agreement with Keras, and the median warm predict (Python
round trip) over ``--runs`` calls. For float16 textures also its drift from float32 textures
(the cost checks/float16_textures.py judges) against the floor it predicts from the model's own
float32 error (measured by the float64 twin) x eps16/eps32.
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import numpy as np  # noqa: E402


def nets(names):
    from digits import digits_cnn
    from models import images, keras_app, tiny_cnn, trained_like

    for name in names:
        if name == "digits":
            model, _, x_test = digits_cnn()
            yield name, model, x_test[:32]
        elif name == "tiny_cnn":
            x = images(16)
            yield name, trained_like(tiny_cnn(), x), x
        elif name == "mobilenetv2":
            model, x = keras_app("mobilenetv2", 64)
            yield name, model, x


def one_output(out):
    return np.asarray(next(iter(out.values())) if isinstance(out, dict) else out, np.float64)


def stats(actual, expected):
    scale = float(np.max(np.abs(expected))) or 1.0
    err = np.abs(actual - expected)
    top1 = float(np.mean(np.argmax(actual, -1) == np.argmax(expected, -1)))
    rms = float(np.sqrt(np.mean(err ** 2)) / (np.sqrt(np.mean(expected ** 2)) or 1.0))
    return float(err.max()) / scale, rms, top1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nets", default="digits,tiny_cnn,mobilenetv2")
    args = parser.parse_args()
    from pytest_modelparity import export_model, load_model
    from pytest_modelparity.checks import float16_textures
    from pytest_modelparity.floor import measure as floor
    from pytest_modelparity.verdict import tree

    print("| net | backend | max error (of scale) | relative RMS | top-1 vs Keras | predict (median) | vs wasm |")
    print("|---|---|---|---|---|---|---|")
    notes = []
    for name, model, x in nets(args.nets.split(",")):
        ref = np.asarray(model(x, training=False), np.float64)
        measured = floor.measure_floor(model, floor.FLOAT64, x, {"": ref.astype(np.float32)},
                                       lambda o: list(tree.leaves(o)))
        f32 = next(iter((measured.errors or {}).values()), None)
        path = export_model(model, "tfjs", Path(tempfile.mkdtemp()) / "web")
        results, times = {}, {}
        for backend in ("cpu", "wasm", "webgl", "webgl-f16"):
            with load_model(path, "tfjs", backend=backend) as js:
                out = one_output(js.predict(x))  # the first call compiles shaders: not timed
                ms = []
                for _ in range(args.runs):
                    start = time.perf_counter()
                    js.predict(x)
                    ms.append((time.perf_counter() - start) * 1e3)
            results[backend], times[backend] = out, statistics.median(ms)
        for backend, out in results.items():
            err, rms, top1 = stats(out, ref)
            print(f"| {name} ({x.shape[0]} rows) | {backend} | {err:.2g} | {rms:.2g} | {top1:.0%} | "
                  f"{times[backend]:.1f} ms | {times[backend] / times['wasm']:.1f}x |")
        cost, cost_rms, agree = stats(results["webgl-f16"], results["webgl"])
        predicted = float16_textures.float16_floor(f32) if f32 is not None else None
        notes.append(f"{name}: float16 vs float32 textures {cost:.2g} of scale (relative RMS {cost_rms:.2g}, "
                     f"top-1 {agree:.0%}); float32 error by the float64 twin "
                     f"{'n/a' if f32 is None else f'{f32:.2g}'} -> float16 floor "
                     f"{'n/a' if predicted is None else f'{predicted:.2g}'}, bound "
                     f"{'n/a' if predicted is None else f'{float16_textures.FLOAT16_MULTIPLE * predicted:.2g}'}")
    print()
    for line in notes:
        print(line)


if __name__ == "__main__":
    main()
