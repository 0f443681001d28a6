"""Bench: what the sharper floor's reordered twin cost on nets where it cannot judge, and what
telling that from the Keras layers (``floor/twins.rounding_not_amplified``) saves.

For each net (Keras Applications at 64 px, weights=None, trained-like statistics), in one
process: ``assert_outputs_close(ref, ref, inputs=x)`` on a fresh load of the model, once with
the skip as shipped and once with it turned off (the twin built and run, as before), in
alternating order; medians over ``--repeats``. Both times include the float64 Keras twin,
which every comparison of a Keras reference builds.

    .venv/bin/python bench/reordered_skip.py [--nets resnet50,densenet121] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from models import trained_like  # noqa: E402

from pytest_modelparity import assert_outputs_close, load_model  # noqa: E402
from pytest_modelparity.floor import measure as floor  # noqa: E402


def build(name: str):
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    app = {"resnet50": keras.applications.ResNet50, "densenet121": keras.applications.DenseNet121}[name]
    model = app(input_shape=(64, 64, 3), weights=None, classes=10)
    x = np.random.default_rng(0).uniform(-1, 1, (4, 64, 64, 3)).astype("float32")
    return trained_like(model, x), x


def timed(model, x, skip: bool) -> tuple[float, str]:
    shipped = floor.sharper_floor_pointless
    if not skip:
        floor.sharper_floor_pointless = lambda model: None  # type: ignore[assignment]
    try:
        ref = load_model(model)  # a fresh LoadedModel: its twins are built anew
        start = time.perf_counter()
        report = assert_outputs_close(ref, ref, inputs=x)
        return time.perf_counter() - start, str(report.meta["shadow"].get(floor.FLOAT32_REORDERED, ""))[:90]
    finally:
        floor.sharper_floor_pointless = shipped


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nets", default="resnet50,densenet121")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    for name in args.nets.split(","):
        model, x = build(name)
        times: dict[bool, list[float]] = {True: [], False: []}
        said: dict[bool, str] = {}
        for i in range(args.repeats):
            for skip in ((True, False) if i % 2 == 0 else (False, True)):
                seconds, said[skip] = timed(model, x, skip)
                times[skip].append(seconds)
        with_skip, without = statistics.median(times[True]), statistics.median(times[False])
        print(f"{name}: comparison with the skip {with_skip:.2f} s, without it {without:.2f} s "
              f"(saved {without - with_skip:.2f} s, {args.repeats} run(s) each, medians)")
        print(f"    skip: {said[True]}\n    built: {said[False]}")


if __name__ == "__main__":
    main()
