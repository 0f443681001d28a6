"""The default verdict's power on real architectures (issue 36): for each net and each float
exported form, whether the correct form passes (a failure is a false alarm) and which of the
planted bugs of ``--modelparity-power`` (``checks/power.py``: the most influential kernel x1.01,
every float input x255/256, two same-shape outputs swapped) the bound that passed it would
have caught.

Nets: Keras Applications with trained-like statistics and the text nets of
``bench/noise_floor.py`` (same builders), plus a two-head regression net (``mean``/``log_var``,
2% apart) for the swap. Quantised forms are not measured here: their verdict is in two parts
(conversion, quantisation cost) and the planted bugs go through the conversion part only.

Run:  .venv/bin/python bench/power.py [--size 64] [--nets mobilenetv3small,...] [--forms ...]
      (64x64 on 2 cores: ~5-10 min for the defaults)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--forms", default=",".join(FORMS))
    args = parser.parse_args()
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
    print(f"\n{len(rows)} forms, {time.time() - started:.0f} s\n")
    print("| net | form | correct form | " + " | ".join(BUGS) + " |")
    print("|---|---|---|" + "---|" * len(BUGS))
    for name, form, verdict, caught in rows:
        print(f"| {name} | {form} | {verdict} | " + " | ".join(caught.get(b, "-") for b in BUGS) + " |")
    judged = [c for *_, c in rows if c]
    for bug in BUGS:
        applicable = [c[bug] for c in judged if c.get(bug) in ("caught", "missed")]
        print(f"{bug}: caught on {sum(v == 'caught' for v in applicable)} of {len(applicable)} forms")
    print(f"false alarms: {sum(v == 'FALSE ALARM' for _, _, v, _ in rows)} of {len(judged) + sum(v == 'FALSE ALARM' for _, _, v, _ in rows)}")


if __name__ == "__main__":
    main()
