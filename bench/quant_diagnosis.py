"""Bench: what a failing quantised test's diagnosis costs (issue 28: it took 48 s once).

A quantised TFLite file with a planted fault, judged against its Keras reference with its
float32 sibling (``load_model(path, float_sibling=...)``), fails its quantisation part; its
hints (diagnose/quantization.py's per-layer cost among them) are computed when first read.
This times that read, medians over ``--repeats`` (a fresh candidate each time: the diagnosis
is memoised per candidate): the whole assertion, the diagnosis of a failed comparison
(``diagnose.diagnose_comparison``: the conversion part's layer table), that of a failed
quantisation part (``diagnose.diagnose_quantization``: calibration checks and the per-layer
cost) and, inside it, the preserved-tensor runs (``tflite_quant.float_intermediates``).

The planted fault (``--fault``): ``narrow``, an int8 file calibrated on rows x0.25 (every
activation range too narrow: the quantisation part fails); ``conversion``, a conv kernel x1.01
in both the int8 file and its sibling (the conversion part fails too, and its diagnosis sets
the sibling's layers against the reference's).
Nets: ``digits`` (tests/digits.py, a CNN trained on scikit-learn's digits, 8x8x1: real rows)
and ``mobilenetv2`` (keras.applications at 64x64x3, 10 classes, trained-like statistics: the
``bench/quantized.py`` build), judged on 32 rows.

    .venv/bin/python bench/quant_diagnosis.py [--nets digits,mobilenetv2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from quantized import build, with_kernel_bug  # noqa: E402

from pytest_modelparity import ParityError, assert_outputs_close, export_model, load_model  # noqa: E402
from pytest_modelparity.formats.tflite import quant as tflite_quant  # noqa: E402

SPENT: dict[str, float] = {}


def _timed(module, name: str, label: str) -> None:
    original = getattr(module, name)

    def call(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            SPENT[label] = SPENT.get(label, 0.0) + time.perf_counter() - start
    setattr(module, name, call)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nets", default="digits,mobilenetv2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--fault", choices=("narrow", "conversion"), default="narrow")
    args = parser.parse_args()
    from pytest_modelparity import diagnose

    _timed(diagnose, "diagnose_quantization", "diagnose_quantization")
    _timed(diagnose, "diagnose_comparison", "diagnose_comparison")
    _timed(tflite_quant, "float_intermediates", "float_intermediates")
    with tempfile.TemporaryDirectory(prefix="quant-diagnosis-") as tmp:
        folder = Path(tmp)
        for net in args.nets.split(","):
            model, x, calib, conv = build(net, args.size)
            x = x[:args.rows]
            if args.fault == "narrow":
                sibling = export_model(model, "tflite", folder / f"{net}_f32.tflite")
                narrow = export_model(model, "tflite", folder / f"{net}_narrow.tflite", quantization="int8",
                                      representative_data=[calib * 0.25])
            else:  # a conv kernel x1.01 in both files: the conversion part fails too (its layer table)
                bug = with_kernel_bug(model, conv)
                sibling = export_model(bug, "tflite", folder / f"{net}_bug_f32.tflite")
                narrow = export_model(bug, "tflite", folder / f"{net}_bug_int8.tflite", quantization="int8",
                                      representative_data=[calib])
            runs: list[dict] = []
            for _ in range(args.repeats):
                SPENT.clear()
                candidate = load_model(narrow, float_sibling=sibling)
                start = time.perf_counter()
                try:
                    assert_outputs_close(candidate, model, inputs=x)
                    raise SystemExit(f"{net}: the planted fault passed; nothing to diagnose")
                except ParityError as exc:
                    hints = list(exc.report.hints)  # computed here if the report left them pending
                took = time.perf_counter() - start
                runs.append({"assertion": took, **SPENT, "causes": [h.cause for h in hints]})
            names = ("assertion", "diagnose_comparison", "diagnose_quantization", "float_intermediates")
            med = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in names}
            print(f"== {net} at {args.size} px, fault {args.fault} ({args.repeats} runs, {len(x)} rows judged; medians, s): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in med.items()) + f"; causes {runs[-1]['causes']}", flush=True)


if __name__ == "__main__":
    main()
