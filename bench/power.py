"""The default verdict's power on real architectures (issue 36): for each net and each float
exported form, whether the correct form passes (a failure is a false alarm) and which of the
planted bugs of ``--modelparity-power`` (``checks/power.py``: the most influential kernel x1.01,
every float input x255/256, two same-shape outputs swapped) the bound that passed it would
have caught.

Nets: Keras Applications with trained-like statistics and the text nets of
``bench/noise_floor.py`` (same builders), plus a two-head regression net (``mean``/``log_var``,
2% apart) for the swap.

``--quantized``: the quantised TFLite variants (float16, dynamic_range, int8) of two CNNs
trained on scikit-learn's digits (``tests/digits.py``: logits, and a softmax + box regression
pair). Their verdict is in two parts (conversion by the floor, quantisation cost by budgets), so
``--modelparity-power``'s planting in the reference does not apply; here each bug is planted in
the model the files are exported from (the quantised file and its float32 sibling, as a user's
pipeline would make both), and judged against the clean reference on all 1,797 digits rows (a
float16 budget needs 5,627 elements to decide: 563 rows of 10 logits).

Run:  .venv/bin/python bench/power.py [--size 64] [--nets mobilenetv3small,...] [--forms ...]
      .venv/bin/python bench/power.py --quantized
      (64x64 on 2 cores: ~4 min for the float defaults, ~5 min for --quantized)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from noise_floor import image_net, text_net  # noqa: E402

from pytest_modelparity import ParityError, assert_outputs_close, export_model, load_model  # noqa: E402
from pytest_modelparity.checks import power  # noqa: E402

FORMS = ("saved_model", "graphdef", "tflite", "onnx", "tfjs")
NETS = ("mobilenetv3small", "efficientnetb0", "encoder_gelu", "bilstm", "two_heads")
BUGS = (power.KERNEL, power.INPUT_GAIN, power.SWAP)


def two_heads(rng):
    import keras

    keras.utils.set_random_seed(0)
    x = keras.Input((32,), name="x")
    h = keras.layers.Dense(64, activation="relu", name="trunk")(x)
    mean = keras.layers.Dense(8, name="mean")(h)
    log_var = keras.layers.Lambda(lambda t: t * 1.02 + 0.01, name="log_var")(mean)
    return keras.Model(x, {"mean": mean, "log_var": log_var}), rng.normal(size=(8, 32)).astype(np.float32)


def build(name: str, size: int, rng):
    if name in ("encoder_gelu", "bilstm"):
        return text_net(name, rng)
    if name == "two_heads":
        return two_heads(rng)
    return image_net(name, size, rng)


def judge(candidate, reference, x) -> tuple[str, dict[str, str]]:
    """('pass' | 'FALSE ALARM', {bug: 'caught' | 'missed' | 'n/a'}) over every output."""
    try:
        with power.planting():
            report = assert_outputs_close(candidate, reference, inputs=x)
    except ParityError:
        return "FALSE ALARM", {}
    found = {b["bug"]: set(b["outputs"].values()) - {"not reached"} for b in report.meta.get("power", [])}
    return "pass", {bug: ("n/a" if bug not in found or not found[bug] else
                          "missed" if "missed" in found[bug] else "caught") for bug in BUGS}


def planted_model(model, bug: str, x):
    """A copy of ``model`` with ``bug`` built in: its most influential kernel x1.01, or its float
    input x255/256 (a Rescaling in front)."""
    import keras

    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    if bug == power.INPUT_GAIN:  # the outputs keep their names, so they pair as the clean model's do
        inp = keras.Input(model.inputs[0].shape[1:], name=model.inputs[0].name)
        out = clone(keras.layers.Rescaling(power.INPUT_FACTOR)(inp))
        named = ({k: keras.layers.Identity(name=k)(v) for k, v in out.items()} if isinstance(out, dict)
                 else keras.layers.Identity(name=model.layers[-1].name)(out))
        return keras.Model(inp, named)
    run = lambda m, batch: m(batch, training=False)  # noqa: E731
    kernel, _ = power.most_influential_kernel(clone, clone, x, run(clone, x), run)  # as --modelparity-power picks it
    kernel.assign(kernel.numpy() * power.KERNEL_FACTOR)
    return clone


def quantized_rows() -> list[tuple[str, str, str, dict[str, str]]]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from digits import digits_cnn, digits_two_heads

    rows = []
    for build in (digits_cnn, digits_two_heads):
        model, x_train, x_test = build()
        rows_all = np.concatenate([x_train, x_test])
        reference = load_model(model)
        with tempfile.TemporaryDirectory() as tmp:
            def candidate(source, variant: str, tag: str):
                base = Path(tmp) / f"{tag}"
                sibling = export_model(source, "tflite", base.with_name(f"{tag}-f32.tflite"))
                q = export_model(source, "tflite", base.with_name(f"{tag}-{variant}.tflite"), quantization=variant,
                                 representative_data=x_train[:200])
                return load_model(q, float_sibling=sibling)

            planted = {bug: planted_model(model, bug, x_test[:32]) for bug in (power.KERNEL, power.INPUT_GAIN)}
            for variant in ("float16", "dynamic_range", "int8"):
                verdict = "pass"
                try:
                    report = assert_outputs_close(candidate(model, variant, "good"), reference, inputs=rows_all)
                    if getattr(report, "inconclusive", None):
                        verdict = "inconclusive"
                except ParityError:
                    verdict = "FALSE ALARM"
                caught = {power.SWAP: "n/a"}
                for bug, bad in planted.items():
                    try:
                        assert_outputs_close(candidate(bad, variant, bug.split()[0]), reference, inputs=rows_all)
                        caught[bug] = "missed"
                    except ParityError:
                        caught[bug] = "caught"
                rows.append((model.name, f"tflite:{variant}", verdict, caught))
                print(model.name, variant, verdict, caught, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--quantized", action="store_true", help="the quantised TFLite variants of trained nets")
    args = parser.parse_args()
    if args.quantized:
        started = time.time()
        report(quantized_rows(), started)
        return
    rng = np.random.default_rng(0)
    rows, started = [], time.time()
    for name in args.nets.split(","):
        model, x = build(name, args.size, rng)
        reference = load_model(model)
        with tempfile.TemporaryDirectory() as tmp:
            for form in args.forms.split(","):
                try:
                    path = export_model(model, form, Path(tmp) / form)
                    candidate = load_model(path)
                except Exception as exc:  # noqa: BLE001 - a converter's refusal is a row, not a crash
                    rows.append((name, form, f"not exported ({type(exc).__name__})", {}))
                    continue
                verdict, caught = judge(candidate, reference, x)
                rows.append((name, form, verdict, caught))
                print(name, form, verdict, caught, flush=True)
    report(rows, started)


def report(rows: list, started: float) -> None:
    print(f"\n{len(rows)} forms, {time.time() - started:.0f} s\n")
    print("| net | form | correct form | " + " | ".join(BUGS) + " |")
    print("|---|---|---|" + "---|" * len(BUGS))
    for name, form, verdict, caught in rows:
        print(f"| {name} | {form} | {verdict} | " + " | ".join(caught.get(b, "-") for b in BUGS) + " |")
    judged = [c for *_, c in rows if c]
    for bug in BUGS:
        applicable = [c[bug] for c in judged if c.get(bug) in ("caught", "missed")]
        print(f"{bug}: caught on {sum(v == 'caught' for v in applicable)} of {len(applicable)} forms")
    verdicts = [v for _, _, v, _ in rows if not v.startswith("not exported")]
    print(f"false alarms: {verdicts.count('FALSE ALARM')} of {len(verdicts)} correct forms"
          f" (inconclusive: {verdicts.count('inconclusive')})")


if __name__ == "__main__":
    main()
