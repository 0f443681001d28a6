"""Bench: what the trust scan (formats/tensorflow/trust.py) adds to loading a SavedModel.

The scan parses ``saved_model.pb`` and walks every node of the graph and its library before
TensorFlow loads anything. This times it (median of 5) against ``load_model`` of the same
SavedModel, for Keras Applications exported with ``model.export`` (random weights).

    .venv/bin/python bench/trust_scan.py [--models MobileNetV2,ResNet50]
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _median(fn, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="MobileNetV2,ResNet50")
    args = parser.parse_args()
    import keras

    from pytest_modelparity import load_model
    from pytest_modelparity.formats.tensorflow.trust import scan_file

    print(f"{'model':<14} {'saved_model.pb':>14} {'nodes':>7} {'scan':>8} {'load_model':>11} {'share':>6}")
    for name in args.models.split(","):
        model = getattr(keras.applications, name)(weights=None)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            model.export(str(path), verbose=False)
            from tensorflow.core.protobuf import saved_model_pb2

            proto = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())
            nodes = sum(len(m.graph_def.node) + sum(len(f.node_def) for f in m.graph_def.library.function)
                        for m in proto.meta_graphs)
            assert scan_file(path, "saved_model") == []
            scan = _median(lambda: scan_file(path, "saved_model"))
            load = _median(lambda: load_model(path), runs=3)
            size = (path / "saved_model.pb").stat().st_size
            print(f"{name:<14} {size / 1e6:>12.1f}MB {nodes:>7} {scan * 1e3:>6.0f}ms {load * 1e3:>9.0f}ms "
                  f"{scan / load:>6.1%}")


if __name__ == "__main__":
    main()
