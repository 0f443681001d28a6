"""Quantised TFLite forms judged in two parts (issue 19): conversion vs quantisation cost.

For each net and variant (float16, dynamic_range, int8) prints:

- conv: the float32 sibling's error against the Keras reference (share of the output's scale)
  and the conversion verdict (float64 floor);
- cost: what quantisation costs against the sibling: relative RMS, max share of scale,
  top-1 agreement with the sibling; the quantisation verdict (the variant's budget);
- old: the verdict of the single fixed rule the plugin used before (quantised file vs
  reference, no sibling);
- the costliest layer the failure names (diagnose/quantization.py), when it fails;
- planted bugs, each judged with the sibling: a conv kernel x1.01 in the float16 file only
  (``f16 kernel``), the same kernel bug in both files (``conversion bug``, a dynamic_range
  file), and an int8 file calibrated on rows x0.25 (``int8 narrow``): caught or not, the
  part that failed, and the first hint's cause.

Nets: ``digits`` (a CNN trained on scikit-learn's bundled digits, real rows, real
calibration), and Keras Applications with random weights and trained-like statistics
(bench/noise_floor.py's ``trained_like``) fed uniform rows: a poor proxy for a trained model
when judging quantisation, but the right one for "does the failure say which part and
where" (notes/quantization.md).

Run:  .venv/bin/python bench/quantized.py [--nets digits,mobilenetv2] [--size 64] [--json out.json]
      (2 cores: digits ~30 s; each 64 px Keras Applications net 1-4 min, int8 export the slowest)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import numpy as np  # noqa: E402

from pytest_modelparity import ParityError, assert_outputs_close, export_model, load_model  # noqa: E402

VARIANTS = ("float16", "dynamic_range", "int8")
APPS = {"mobilenetv2": "MobileNetV2", "efficientnetv2b0": "EfficientNetV2B0", "xception": "Xception",
        "inceptionv3": "InceptionV3", "vgg16": "VGG16", "nasnetmobile": "NASNetMobile",
        "resnet50": "ResNet50", "densenet121": "DenseNet121"}


def build(name: str, size: int):
    """(model, rows to judge, calibration rows, name of a conv layer for the kernel bug)."""
    import keras

    if name == "digits":
        from digits import digits_cnn

        model, x_train, x_test = digits_cnn()
        return model, x_test[:128], x_train[:100], "conv1"
    from noise_floor import trained_like

    rng = np.random.default_rng(0)
    shape = (max(size, 75 if name in ("inceptionv3", "xception") else size),) * 2 + (3,)
    model = getattr(keras.applications, APPS[name])(weights=None, input_shape=shape, classes=10,
                                                    classifier_activation=None)
    raw255 = name.startswith("efficientnet")
    x = rng.uniform(0, 255 if raw255 else 1, (48,) + shape).astype(np.float32)
    trained_like(model, x[:16])
    conv = next(l.name for l in model.layers if type(l).__name__ == "Conv2D")
    return model, x[16:48], x[:16], conv


def with_kernel_bug(model, layer: str):
    import keras

    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    kernel, *rest = clone.get_layer(layer).get_weights()
    clone.get_layer(layer).set_weights([kernel * 1.01, *rest])
    return clone


def judge(candidate, reference, x) -> dict:
    """The two-part verdict's figures (and the first hints' causes when it fails)."""
    try:
        report = assert_outputs_close(candidate, reference, inputs=x)
        passed, hints, diagnosis_s = True, [], 0.0
    except ParityError as exc:
        report, passed = exc.report, False
        t0 = time.perf_counter()
        hints = list(report.hints)  # the diagnosis runs here (per-layer cost included)
        diagnosis_s = time.perf_counter() - t0
    info = report.meta.get("quantized") or {}
    parts = info.get("parts", {})
    named = next((h.message for h in hints if h.cause in ("first_divergent_layer", "float16_weights_differ",
                                                          "quantization_cost")), "")
    cost_hint = ", ".join(f"{layer} ({op})" for layer, op in re.findall(r"`([^`]+)` \((\w+)\)", named)) or None
    return {"passed": passed, "failed_parts": info.get("failed_parts"),
            "conversion": parts.get("conversion", {}).get("max_rel_of_scale"),
            "rms": parts.get("quantisation", {}).get("relative_rms"),
            "cost_max": parts.get("quantisation", {}).get("max_rel_of_scale"),
            "top1": parts.get("quantisation", {}).get("top1_agreement"),
            "causes": [h.cause for h in hints], "costliest": cost_hint, "diagnosis_s": round(diagnosis_s, 2)}


def old_rule(path: Path, reference, x) -> bool:
    try:
        assert_outputs_close(load_model(path), reference, inputs=x)
        return True
    except ParityError:
        return False


def one_net(name: str, size: int, folder: Path) -> dict:
    t0 = time.perf_counter()
    model, x, calib, conv = build(name, size)
    sibling = export_model(model, "tflite", folder / f"{name}_f32.tflite")
    rows = {}
    for variant in VARIANTS:
        extra = {"representative_data": [calib]} if variant == "int8" else {}
        path = export_model(model, "tflite", folder / f"{name}_{variant}.tflite", quantization=variant, **extra)
        rows[variant] = {**judge(load_model(path, float_sibling=sibling), model, x),
                         "old_passed": old_rule(path, model, x)}
    bug = with_kernel_bug(model, conv)
    bugs = {}
    f16 = export_model(bug, "tflite", folder / f"{name}_bug_f16.tflite", quantization="float16")
    bugs["f16 kernel"] = {**judge(load_model(f16, float_sibling=sibling), model, x), "old_passed": old_rule(f16, model, x)}
    bug32 = export_model(bug, "tflite", folder / f"{name}_bug_f32.tflite")
    bug_dr = export_model(bug, "tflite", folder / f"{name}_bug_dr.tflite", quantization="dynamic_range")
    bugs["conversion bug"] = {**judge(load_model(bug_dr, float_sibling=bug32), model, x),
                              "old_passed": old_rule(bug_dr, model, x)}
    narrow = export_model(model, "tflite", folder / f"{name}_narrow.tflite", quantization="int8",
                          representative_data=[calib * 0.25])
    bugs["int8 narrow"] = {**judge(load_model(narrow, float_sibling=sibling), model, x),
                           "old_passed": old_rule(narrow, model, x)}
    return {"net": name, "seconds": round(time.perf_counter() - t0, 1), "variants": rows, "bugs": bugs}


def _g(v) -> str:
    return "-" if v is None else f"{v:.2g}"


def markdown(results: list[dict]) -> str:
    lines = ["| net | variant | conversion (of scale) | cost: rel RMS | cost: max of scale | top-1 vs sibling | "
             "verdict | old rule | costliest layer named |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for variant, v in r["variants"].items():
            verdict = "pass" if v["passed"] else f"FAIL ({', '.join(v['failed_parts'] or [])})"
            top1 = "-" if v["top1"] is None else f"{v['top1']:.0%}"
            lines.append(f"| {r['net']} | {variant} | {_g(v['conversion'])} | {_g(v['rms'])} | {_g(v['cost_max'])} | "
                         f"{top1} | {verdict} | {'pass' if v['old_passed'] else 'FAIL'} | {v['costliest'] or '-'} |")
    lines += ["", "| net | planted bug | caught | part that failed | first causes | layers named | old rule |",
              "|---|---|---|---|---|---|---|"]
    for r in results:
        for bug, v in r["bugs"].items():
            lines.append(f"| {r['net']} | {bug} | {'no' if v['passed'] else 'yes'} | "
                         f"{', '.join(v['failed_parts'] or []) or '-'} | {', '.join(v['causes'][:3]) or '-'} | "
                         f"{v['costliest'] or '-'} | {'missed' if v['old_passed'] else 'caught'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default="digits,mobilenetv2")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.nets.split(","):
            results.append(one_net(name.strip(), args.size, Path(tmp)))
            print(f"{name}: {results[-1]['seconds']} s", file=sys.stderr)
    print(markdown(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
