"""Measure what each default tolerance must absorb, and what it must catch.

Prints, for the figures in docs/tolerances.md:

1. formats: TFLite float32 / float16 / dynamic-range / int8 against the Keras model, on
   tests/models.py's tiny_cnn (softmax output) and mlp (logits), several weight seeds:
   max |a - e| / max |e| per output ("of scale"), top-1 agreement, share of elements beyond
   the float32 scaled default.
2. the scale-aware rule (issue 7): Dense 784->1024->10 batch-vs-per-row drift, input scaled
   by 255/256, one weight changed by 1% (largest fc1 weight, random fc1/fc2 weights), as
   fractions of scale, and the verdict of the built-in default on each.
3. calibrated mode (--calibrated): false-alarm and miss rates over the cases above.

Run:  .venv/bin/python bench/measure_tolerances.py [--seeds 5] [--calibrated]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import numpy as np  # noqa: E402


def of_scale(actual, expected) -> float:
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    return float(np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-30))


def top1(actual, expected) -> float:
    return float(np.mean(np.argmax(actual, -1) == np.argmax(expected, -1)))


def tflite_bytes(model, variant: str, rep: np.ndarray) -> bytes:
    import tensorflow as tf

    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    if variant == "float16":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.target_spec.supported_types = [tf.float16]
    elif variant == "dynamic_range":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
    elif variant == "int8":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]

        def data():
            for i in range(min(len(rep), 100)):
                yield [rep[i:i + 1]]

        conv.representative_dataset = data
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    # The converter prints "Saved artifact at" lines on stdout: keep the table readable.
    saved, devnull = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    try:
        return conv.convert()
    finally:
        os.dup2(saved, 1)
        os.close(devnull)
        os.close(saved)


def run_tflite(content: bytes, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=content)
    inp = interp.get_input_details()[0]
    interp.resize_tensor_input(inp["index"], list(x.shape))
    interp.allocate_tensors()
    interp.set_tensor(inp["index"], x.astype(inp["dtype"]))
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def measure_formats(seeds: int) -> None:
    import models
    from pytest_modelparity.verdict.tolerances import default_tolerance

    f32 = default_tolerance("float32")
    print("\n== 1. TFLite variants vs Keras (max error of scale, top-1 agreement, elements beyond the float32 default)")
    print("(beyond X: share of elements with |a - e| > X * max|e|)")
    print(f"{'model':8} {'variant':14} {'seed':>4} {'err/scale':>10} {'top1':>6} {'beyond f32':>10}"
          f" {'>1e-3':>6} {'>1e-2':>6} {'>3e-2':>6} {'>1e-1':>6}")
    worst: dict[str, list[float]] = {}
    for name in ("tiny_cnn", "mlp"):
        for seed in range(seeds):
            if name == "tiny_cnn":
                model = models.tiny_cnn(seed)
                x = models.images(256, seed=100 + seed)
            else:
                model = models.mlp(seed)
                x = np.random.default_rng(100 + seed).normal(0, 1, (256, 16)).astype("float32")
            ref = np.asarray(model(x, training=False))
            for variant in ("float32", "float16", "dynamic_range", "int8"):
                out = run_tflite(tflite_bytes(model, variant, x), x)
                err = of_scale(out, ref)
                agree = top1(out, ref)
                allowed = f32.allowed(np.abs(ref), float(np.abs(ref).max()))
                beyond = float(np.mean(np.abs(out - ref) > allowed))
                worst.setdefault(variant, []).extend([err, agree])
                rel = np.abs(out - ref) / float(np.abs(ref).max())
                shares = " ".join(f"{float(np.mean(rel > t)):6.1%}" for t in (1e-3, 1e-2, 3e-2, 1e-1))
                print(f"{name:8} {variant:14} {seed:>4} {err:10.2e} {agree:6.1%} {beyond:10.1%} {shares}")
    print("\nsummary per variant: max err/scale, min top-1")
    for variant, vals in worst.items():
        errs, agrees = vals[0::2], vals[1::2]
        print(f"  {variant:14} max err/scale {max(errs):.2e}  min top-1 {min(agrees):.1%}")


def dense_cases(seed: int):
    """(name, is_bug, actual, expected, reference_model, inputs) for issue 7's cases."""
    import keras
    import models

    model = models.dense_784(seed)
    rng = np.random.default_rng(1000 + seed)
    x = rng.uniform(0, 255, (64, 784)).astype("float32")
    batched = np.asarray(model(x))
    rows = np.concatenate([np.asarray(model(x[i:i + 1])) for i in range(len(x))])
    lite = run_tflite(tflite_bytes(model, "float32", x), x)
    cases = [("batch vs per-row", False, rows, batched, model, x),
             ("TFLite float32", False, lite, batched, model, x),
             ("input x255/256", True, np.asarray(model(x * (255 / 256))), batched, model, x)]
    w1, b1, w2, b2 = model.get_weights()

    def changed(layer: int, index) -> np.ndarray:
        ws = [w1.copy(), b1, w2.copy(), b2]
        ws[layer][index] *= 1.01
        copy = keras.models.clone_model(model)
        copy.set_weights(ws)
        return np.asarray(copy(x))

    cases.append(("fc1 largest weight +1%", True, changed(0, np.unravel_index(np.abs(w1).argmax(), w1.shape)), batched, model, x))
    cases.append(("fc2 largest weight +1%", True, changed(2, np.unravel_index(np.abs(w2).argmax(), w2.shape)), batched, model, x))
    cases.append(("fc1 random weight +1%", True, changed(0, (rng.integers(784), rng.integers(1024))), batched, model, x))
    cases.append(("fc2 random weight +1%", True, changed(2, (rng.integers(1024), rng.integers(10))), batched, model, x))
    return cases


def measure_default_rule(seeds: int) -> None:
    from pytest_modelparity.verdict.tolerances import default_tolerance

    tol = default_tolerance("float32")
    torch_rtol, torch_atol = 1.3e-6, 1e-5
    print(f"\n== 2. Dense 784->1024->10, inputs in [0, 255], batch 64; default {tol.describe()}")
    print(f"{'case':26} {'seed':>4} {'err/scale':>10} {'torch fails':>11} {'default':>8}")
    rates = {"alarm": 0, "clean": 0, "miss": 0, "bugs": 0, "no effect": 0, "torch alarm": 0}
    for seed in range(seeds):
        for name, is_bug, actual, expected, _model, _x in dense_cases(seed):
            err = of_scale(actual, expected)
            diff = np.abs(actual.astype(np.float64) - expected)
            torch_fail = float(np.mean(diff > torch_atol + torch_rtol * np.abs(expected)))
            passed = bool(np.all(diff <= tol.allowed(np.abs(expected), float(np.abs(expected).max()))))
            verdict = "pass" if passed else "FAIL"
            if err == 0.0:
                flag = "   (no effect on these inputs: the changed unit is inactive)"
                rates["no effect"] += 1
            else:
                flag = "" if passed != is_bug else "   <- wrong verdict"
                if is_bug:
                    rates["bugs"] += 1
                    rates["miss"] += int(passed)
                else:
                    rates["clean"] += 1
                    rates["alarm"] += int(not passed)
                    rates["torch alarm"] += int(torch_fail > 0)
            print(f"{name:26} {seed:>4} {err:10.2e} {torch_fail:11.1%} {verdict:>8}{flag}")
    print(f"default rule: false alarms {rates['alarm']}/{rates['clean']} (torch.testing defaults: "
          f"{rates['torch alarm']}/{rates['clean']}), misses {rates['miss']}/{rates['bugs']} "
          f"(+{rates['no effect']} changes with no effect on the inputs, not counted)")
    a, e = np.float32(729027.5625), np.float32(729026.4375)
    print(f"seed 004: {a} vs {e}: rel {abs(a - e) / e:.2e}, "
          f"{abs(int(np.float32(a).view(np.int32)) - int(np.float32(e).view(np.int32)))} ULP, "
          f"default {'pass' if abs(a - e) <= tol.allowed(abs(e), abs(e)) else 'FAIL'}")


def measure_calibrated(seeds: int) -> None:
    from pytest_modelparity import ParityError, assert_outputs_close

    print("\n== 3. tolerance='calibrated' on the Dense cases (reference = the Keras model)")
    alarms = misses = clean = bugs = 0
    by_case: dict[str, list[int]] = {}
    for seed in range(seeds):
        for name, is_bug, actual, _expected, model, x in dense_cases(seed):
            try:
                report = assert_outputs_close(actual, model, inputs=x, tolerance="calibrated")
                failed = False
            except ParityError as exc:
                report, failed = exc.report, True
            cal = report.meta.get("calibration", {})
            print(f"{name:26} {seed:>4} {'FAIL' if failed else 'pass':>5}  {cal.get('summary', '')}")
            if is_bug and np.array_equal(actual, _expected):
                continue  # the change has no effect on these inputs: nothing to detect
            counts = by_case.setdefault(name, [0, 0])
            counts[0] += 1
            counts[1] += int(failed)
            if is_bug:
                bugs += 1
                misses += int(not failed)
            else:
                clean += 1
                alarms += int(failed)
    print(f"calibrated: false alarms {alarms}/{clean}, misses {misses}/{bugs} (changes with no effect on the inputs not counted)")
    for name, (n, failed) in by_case.items():
        print(f"  {name:26} failed {failed}/{n}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--skip-formats", action="store_true")
    parser.add_argument("--calibrated", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    import tensorflow as tf

    print(f"TensorFlow {tf.__version__}, oneDNN opts {os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'default')}")
    if not args.skip_formats:
        measure_formats(args.seeds)
    measure_default_rule(args.seeds)
    if args.calibrated:
        measure_calibrated(args.seeds)
    print(f"\n({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
