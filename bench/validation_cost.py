"""Bench: what validating a fresh export costs, beside the conversion it follows.

``export_model`` validates what it writes (tflite: a LiteRT interpreter built and run once on
zeros; onnx: ``onnx.checker``, an onnxruntime session, one run on zeros; saved_model: none
besides the write). This times, in one process, each export of the three nets of
``bench/session_cost.py`` and the ``validate_content`` call inside it (the module's own
function, wrapped), medians over ``--repeats``. The split of the onnx validation (checker,
session, run) is timed the same way on the written file.

    .venv/bin/python bench/validation_cost.py [--nets digits,mobilenet_v2,mobilenet_v3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from session_cost import NETS, build  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import keras
    import numpy as np

    from pytest_modelparity.formats import export_model
    from pytest_modelparity.formats import onnx as onnx_fmt
    from pytest_modelparity.formats import tflite as tflite_fmt

    spent: dict[str, float] = {}

    def timed(module, name):
        original = getattr(module, name)

        def call(*a, **k):
            start = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                spent[module.__name__] = spent.get(module.__name__, 0.0) + time.perf_counter() - start
        setattr(module, name, call)

    timed(tflite_fmt, "validate_content")
    timed(onnx_fmt, "validate_content")
    with tempfile.TemporaryDirectory(prefix="validation-cost-") as tmp:
        root = Path(tmp)
        for net in args.nets.split(","):
            path = root / f"{net}.keras"
            build(net, path)
            model = keras.saving.load_model(str(path), compile=False)
            rows: dict[str, list[tuple[float, float]]] = {}
            onnx_parts: dict[str, list[float]] = {"checker": [], "session": [], "run": []}
            for i in range(args.repeats):
                for fmt, module in (("saved_model", None), ("tflite", tflite_fmt), ("onnx", onnx_fmt)):
                    spent.clear()
                    start = time.perf_counter()
                    written = export_model(model, fmt, root / f"{net}-{i}" / fmt)
                    total = time.perf_counter() - start
                    rows.setdefault(fmt, []).append((total, spent.get(module.__name__, 0.0) if module else 0.0))
                    if fmt == "onnx":
                        import onnx
                        import onnxruntime as ort

                        content = Path(written).read_bytes()
                        t = time.perf_counter()
                        onnx.checker.check_model(onnx.load_model_from_string(content))
                        onnx_parts["checker"].append(time.perf_counter() - t)
                        t = time.perf_counter()
                        sess = ort.InferenceSession(content, providers=["CPUExecutionProvider"])
                        onnx_parts["session"].append(time.perf_counter() - t)
                        feeds = {a.name: np.zeros([1 if not isinstance(d, int) else d for d in a.shape], np.float32)
                                 for a in sess.get_inputs()}
                        t = time.perf_counter()
                        sess.run(None, feeds)
                        onnx_parts["run"].append(time.perf_counter() - t)
            print(f"== {net} ({args.repeats} run(s); medians)")
            for fmt, got in rows.items():
                total = statistics.median(t for t, _ in got)
                val = statistics.median(v for _, v in got)
                print(f"  {fmt:12s} export {total:6.2f} s, of which validation {val:5.2f} s ({val / total:4.0%})")
            print("  onnx validation split: " + ", ".join(f"{k} {statistics.median(v):.3f} s"
                                                          for k, v in onnx_parts.items()))


if __name__ == "__main__":
    main()
