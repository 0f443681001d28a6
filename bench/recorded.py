"""Bench: comparing recorded runs (formats/recorded/) against re-running the forms.

MobileNetV2 (alpha 0.35, 96x96, random weights) in 8 forms: keras, h5, saved_model, graphdef,
tflite, tflite:float16, onnx, tfjs. Once: export them (not timed) and record each form's outputs
on a batch of 4 with ``record_outputs``. Then, each in a fresh Python process (imports, loads and
Node.js start-up included, as a CI job pays them), timed ``--repeats`` times:

- ``live``: load each exported form, run it, ``assert_outputs_close(form, reference, inputs=batch)``;
- ``recorded``: load each recording, ``assert_outputs_close(recorded, reference,
  inputs=recorded.inputs_batch)``.

Both judge by the same default (the Keras reference and its float64 twin run in both). Prints
the medians and the recording's size on disk.

    .venv/bin/python bench/recorded.py [--repeats 3] [--dir /tmp/recorded-bench] [--reuse]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent.parent
FORMS = ("keras", "h5", "saved_model", "graphdef", "tflite", "tflite:float16", "onnx", "tfjs")


def _model():
    import keras

    keras.utils.set_random_seed(0)
    return keras.applications.MobileNetV2(input_shape=(96, 96, 3), alpha=0.35, weights=None, classes=10)


def _batch():
    import numpy as np

    return np.random.default_rng(0).uniform(-1, 1, size=(4, 96, 96, 3)).astype("float32")


def prepare(root: Path) -> None:
    from pytest_modelparity import export_model, load_model, record_outputs

    model = _model()
    model.save(root / "reference.keras")
    batch = _batch()
    paths = {}
    for form in FORMS:
        base, _, variant = form.partition(":")
        opts = {"quantization": variant} if variant else {}
        target = root / "forms" / form.replace(":", "_")
        paths[form] = str(export_model(model, base, target, **opts))
        with load_model(paths[form]) as loaded:
            record_outputs(loaded, batch, root / "recorded" / form.replace(":", "_"), overwrite=True)
    (root / "forms.json").write_text(json.dumps(paths))


def run(root: Path, mode: str) -> None:
    from pytest_modelparity import assert_outputs_close, load_model

    reference = load_model(root / "reference.keras")
    paths = json.loads((root / "forms.json").read_text())
    for form in FORMS:
        if mode == "live":
            candidate = load_model(paths[form])
            assert_outputs_close(candidate, reference, inputs=_batch())
        else:
            recorded = load_model(root / "recorded" / form.replace(":", "_"))
            assert_outputs_close(recorded, reference, inputs=recorded.inputs_batch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/modelparity-recorded-bench")
    parser.add_argument("--phase", choices=("prepare", "live", "recorded"))
    parser.add_argument("--reuse", action="store_true", help="keep the exports and recordings already in --dir")
    args = parser.parse_args()
    root = Path(args.dir)
    if args.phase == "prepare":
        root.mkdir(parents=True, exist_ok=True)
        return prepare(root)
    if args.phase:
        return run(root, args.phase)
    if not (args.reuse and (root / "forms.json").exists()):
        subprocess.run([sys.executable, __file__, "--phase", "prepare", "--dir", str(root)], check=True)
    times: dict[str, list[float]] = {"live": [], "recorded": []}
    for _ in range(args.repeats):
        for mode in times:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--phase", mode, "--dir", str(root)], check=True)
            times[mode].append(time.perf_counter() - t0)
    size = sum(p.stat().st_size for p in (root / "recorded").rglob("*") if p.is_file())
    live, rec = statistics.median(times["live"]), statistics.median(times["recorded"])
    print(f"8 forms of MobileNetV2 (alpha 0.35, 96x96), batch of 4, {args.repeats} runs each, fresh process:")
    print(f"  re-run the forms:       median {live:.1f} s  ({', '.join(f'{t:.1f}' for t in times['live'])})")
    print(f"  compare the recordings: median {rec:.1f} s  ({', '.join(f'{t:.1f}' for t in times['recorded'])})"
          f"  = {rec / live:.2f}x")
    print(f"  recordings on disk: {size / 1024:.0f} KiB for 8 forms")


if __name__ == "__main__":
    main()
