"""What a Keras model's tfjs export costs with and without the saved_model entry of the same
model in the export cache (``ExportCache.conversion_inputs``): the default matrix exports
both, and without the entry the tfjs exporter writes the very same SavedModel again first.

Inline exports (this process), the converters imported and a first export of each done before
timing; each round exports tfjs into a fresh cache that holds the saved_model entry (copied
in) and into one that does not, alternately, so machine load hits both alike. Medians of
CPU seconds (this process) and wall seconds.

    .venv/bin/python bench/tfjs_reuse.py                      # MobileNetV2 (alpha 0.35) at 48 px, 3 rounds
    .venv/bin/python bench/tfjs_reuse.py --size 96 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _timed(fn):
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - cpu, time.perf_counter() - wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    import keras

    from pytest_modelparity.exports.cache import ExportCache
    from pytest_modelparity.formats import export_route

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(input_shape=(args.size, args.size, 3), alpha=0.35, weights=None,
                                           classes=10)
    root = Path(tempfile.mkdtemp(prefix="tfjs-reuse-"))
    try:
        seed = ExportCache(root / "seed")
        seed.export(model, "saved_model")
        ExportCache(root / "warm").export(model, "tfjs")  # converters imported, first trace done
        spent: dict[str, list[tuple[float, float]]] = {"saved_model entry in the cache": [], "no entry": []}
        for i in range(args.rounds):
            with_entry = root / f"with-{i}"
            shutil.copytree(root / "seed", with_entry, symlinks=True)
            path, cpu, wall = _timed(lambda: ExportCache(with_entry).export(model, "tfjs"))
            assert "from the saved_model export" in (export_route(path) or ""), export_route(path)
            spent["saved_model entry in the cache"].append((cpu, wall))
            path, cpu, wall = _timed(lambda: ExportCache(root / f"without-{i}").export(model, "tfjs"))
            assert "from the saved_model export" not in (export_route(path) or "")
            spent["no entry"].append((cpu, wall))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(c for c, _ in spent["no entry"])
    print(f"tfjs export of MobileNetV2 (alpha 0.35, {args.size} px), inline, medians of {args.rounds}:")
    for name, runs in spent.items():
        cpu, wall = statistics.median(c for c, _ in runs), statistics.median(w for _, w in runs)
        print(f"  {name:32s} {cpu:6.2f} CPU-s  {wall:6.2f} s wall  x{cpu / base:.2f} of the CPU without it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
