"""Peak memory and time of each export format for large models: the plugin against the bare converter.

Each measurement runs in a fresh Python (peak RSS is per process and never goes down):

- ``bare``: builds the model and calls the converter directly (``model.export``,
  ``TFLiteConverter.from_keras_model``, ``tf2onnx.convert.from_keras``), nothing else;
  ``bare-large``: the same with tf2onnx's large-model mode (weights as external data, onnx only);
- ``inline``: ``export_model`` in that process (what ``--modelparity-export-process=inline`` does:
  conversion plus the plugin's validation of the artifact);
- ``child``: ``ExportProcess.export`` (the plugin's default): the model is saved as ``.keras``,
  the persistent worker loads it and converts; the worker's peak (``VmHWM``) is the figure
  compared, the parent's own peak is printed beside it. ``seconds`` includes starting the
  worker (importing TensorFlow, once per pytest process); a second export of the same model
  is timed as ``warm_seconds``, what every later export costs.

Models: a stack of Dense(2896) layers (33.5 MB of float32 weights each), sized to about 100 MB,
400 MB or 1 GB. Run one size at a time on a quiet machine:

    python bench/model_size.py --size-mb 100 --formats saved_model,tflite,onnx
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 2896


def build(size_mb: int):
    import keras

    layers = max(1, round(size_mb * 1e6 / (WIDTH * WIDTH * 4)))
    x = keras.Input((WIDTH,), name="x")
    y = x
    for i in range(layers):
        y = keras.layers.Dense(WIDTH, name=f"d{i}", kernel_initializer="glorot_uniform")(y)
    return keras.Model(x, y, name=f"mlp_{size_mb}mb")


def bare_export(model, fmt: str, out: Path, *, large_model: bool = False) -> None:
    import tensorflow as tf

    if fmt == "saved_model":
        model.export(str(out), verbose=False)
    elif fmt == "tflite":
        out.write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    elif fmt == "onnx":
        import tf2onnx

        spec = (tf.TensorSpec((None, WIDTH), tf.float32, name="x"),)
        # large_model: tf2onnx writes the weights as external data, in a .zip beside the graph.
        # tf2onnx 1.16 calls np.product there, which numpy 2 removed: aliased for this measurement.
        import numpy as np

        if large_model and not hasattr(np, "product"):
            np.product = np.prod  # type: ignore[attr-defined]
        tf2onnx.convert.from_keras(model, input_signature=spec, opset=17, large_model=large_model,
                                   output_path=str(out.with_suffix(".zip") if large_model else out))
    else:
        raise SystemExit(f"no bare route for {fmt}")


def one(mode: str, fmt: str, size_mb: int) -> dict:
    """Run in the child Python: build, export once, report peak memory and seconds."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    model = build(size_mb)
    weights = sum(w.nbytes for w in model.get_weights())
    tmp = Path(tempfile.mkdtemp(prefix="modelsize-"))
    start = time.perf_counter()
    child_peak = None
    if mode in ("bare", "bare-large"):
        bare_export(model, fmt, tmp / ("m.tflite" if fmt == "tflite" else "m.onnx" if fmt == "onnx" else "m"),
                    large_model=mode == "bare-large")
    elif mode == "inline":
        from pytest_modelparity import export_model

        export_model(model, fmt, tmp / "m")
    else:
        from pytest_modelparity.exports.worker import ExportProcess

        worker = ExportProcess(timeout_s=None, log_path=tmp / "export.log")
        try:
            worker.export(model, fmt, tmp / "m")
            seconds = time.perf_counter() - start
            again = time.perf_counter()  # the worker is warm now: what every later export costs
            worker.export(model, fmt, tmp / "m2")
            warm = time.perf_counter() - again
            child_peak = worker.peak_rss
        finally:
            worker.close()
    if mode != "child":
        seconds = time.perf_counter() - start
    own_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"mode": mode, "format": fmt, "size_mb": size_mb, "weights_mb": round(weights / 1e6, 1),
            "seconds": round(seconds, 2), "warm_seconds": round(warm, 2) if mode == "child" else None,
            "peak_mb": round((child_peak or own_peak) / 1e6),
            "parent_peak_mb": round(own_peak / 1e6)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--formats", default="saved_model,tflite,onnx")
    parser.add_argument("--modes", default="bare,inline,child")
    parser.add_argument("--one", nargs=3, metavar=("MODE", "FORMAT", "SIZE_MB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT" + json.dumps(one(args.one[0], args.one[1], int(args.one[2]))), flush=True)
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    rows = []
    for fmt in args.formats.split(","):
        for mode in args.modes.split(","):
            proc = subprocess.run([sys.executable, __file__, "--one", mode, fmt, str(args.size_mb)],
                                  capture_output=True, text=True, env=env)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
            if line is None:
                row = {"mode": mode, "format": fmt, "size_mb": args.size_mb,
                       "error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}
            else:
                row = json.loads(line[len("RESULT"):])
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| format | mode | weights | seconds (warm worker) | peak memory | vs bare |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row['format']} | {row['mode']} | | | {row['error']} | |")
            continue
        bare = next((r for r in rows if r["format"] == row["format"] and r["mode"] == "bare" and "peak_mb" in r), None)
        ratio = f"{row['peak_mb'] / bare['peak_mb']:.2f}x" if bare else ""
        warm = f" ({row['warm_seconds']} s)" if row.get("warm_seconds") is not None else ""
        print(f"| {row['format']} | {row['mode']} | {row['weights_mb']} MB | {row['seconds']} s{warm} | "
              f"{row['peak_mb']} MB | {ratio} |")


if __name__ == "__main__":
    main()
