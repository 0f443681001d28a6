"""Bench: the second export of the same model through the cache vs the first.

For each format (saved_model, tflite, onnx): a warm-up export of another model (so the
first-export figure excludes one-time imports), then REPEATS rounds of a fresh cache root,
a first export (a miss: the converter runs) and a second export of a rebuilt, identical
model (a hit: only the content key is computed). Prints medians and the first/second ratio;
the cache is worth having when the ratio is >= 5.

    .venv/bin/python bench/export_cache.py [--repeats N] [--formats a,b]
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from models import tiny_cnn  # noqa: E402

from pytest_modelparity.exports.cache import ExportCache  # noqa: E402


def timed(fn):
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def bench(fmt: str, repeats: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as warm:
        ExportCache(Path(warm)).export(tiny_cnn(seed=99), fmt)
    firsts, seconds = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as root:
            t1, p1 = timed(lambda: ExportCache(Path(root)).export(tiny_cnn(), fmt))
            rebuilt = tiny_cnn()
            t2, p2 = timed(lambda: ExportCache(Path(root)).export(rebuilt, fmt))
            assert p1 == p2, (p1, p2)
            firsts.append(t1)
            seconds.append(t2)
    return statistics.median(firsts), statistics.median(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--formats", default="saved_model,tflite,onnx")
    args = parser.parse_args()
    print(f"{'format':<12} {'first (s)':>10} {'second (s)':>11} {'ratio':>8}")
    worst = float("inf")
    for fmt in args.formats.split(","):
        first, second = bench(fmt, args.repeats)
        ratio = first / second
        worst = min(worst, ratio)
        print(f"{fmt:<12} {first:>10.3f} {second:>11.4f} {ratio:>7.1f}x", flush=True)
    print(f"smallest ratio {worst:.1f}x ({'>=' if worst >= 5 else '<'} 5x)")
    return 0 if worst >= 5 else 1


if __name__ == "__main__":
    sys.exit(main())
