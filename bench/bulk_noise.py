"""The error's distribution, not only its worst element (issue 47): what correct float forms and
planted bugs look like at the median, the 90th percentile, the mean signed error and the max,
each against the same point of the model's own float32 noise (ref32 - ref64, its float64 twin).

For each net (bench/noise_floor.py's builders and the log-magnitude audio net) and each float form,
per output, the candidate's error |cand - ref32| at each statistic as a multiple of the noise's
same statistic (``ratio``); then planted bugs (the most influential kernel, and an early and a
middle one, x1.01 and x1.001; the float input x255/256 and x1023/1024) built into the Keras
model and exported like the correct form. It prints per (net, form) the worst ratio of the
correct form and of each bug at each statistic, so the margins of ``verdict/bulk.py`` can be set
between them: the correct forms' worst ratio is the false-alarm side, each bug's the power side.

``TF_ENABLE_ONEDNN_OPTS=0`` gives TensorFlow other kernels: run it twice and compare
(``--onednn both`` runs a child with it off).

Run:  .venv/bin/python bench/bulk_noise.py [--nets logmag,mobilenetv3small,...] [--forms ...]
      [--onednn on|off|both] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

FORMS = ("saved_model", "tflite", "tflite-noxnn", "onnx", "tfjs")
NETS = ("logmag", "mobilenetv3small", "encoder_gelu", "bilstm", "two_heads", "efficientnetb0")
STATS = ("median", "q90", "mean_signed", "max")
MULTIPLE = 8.0  # verdict/bulk.py's and the float64 floor's multiple
# the noise figure each statistic of the error is held against: a mean signed error against the
# noise's mean |error| (its own signed mean cancels by chance and says nothing of what noise allows)
NOISE_OF = {"median": "median", "q90": "q90", "mean_signed": "mean_abs", "max": "max"}


def build(name: str, rng):
    import audio
    from noise_floor import image_net, text_net

    if name == "logmag":
        return audio.log_magnitude(4096, kernel=512, hop=64)
    if name in ("encoder_gelu", "bilstm"):
        return text_net(name, rng)
    if name == "two_heads":  # power.py's, without its Lambda (the Keras twin refuses to rebuild one)
        import keras

        keras.utils.set_random_seed(0)
        x = keras.Input((32,), name="x")
        h = keras.layers.Dense(64, activation="relu", name="trunk")(x)
        mean = keras.layers.Dense(8, name="mean")(h)
        log_var = keras.layers.Dense(8, name="log_var")(h)
        return keras.Model(x, {"mean": mean, "log_var": log_var}), rng.normal(size=(8, 32)).astype(np.float32)
    return image_net(name, 64, rng)


def leaves(out, names) -> dict[str, np.ndarray]:
    if isinstance(out, dict):
        return {k: np.asarray(v, np.float64) for k, v in out.items()}
    if isinstance(out, (list, tuple)):
        return {n: np.asarray(v, np.float64) for n, v in zip(names, out)}
    return {names[0]: np.asarray(out, np.float64)}


def stats(d: np.ndarray, scale: float) -> dict[str, float]:
    from pytest_modelparity.verdict.bulk import error_statistics

    return error_statistics(d, scale)


def ratios(cand: dict, ref32: dict, noise: dict) -> dict[str, dict[str, float]]:
    out = {}
    for k in ref32:
        c = stats(cand[k].reshape(ref32[k].shape) - ref32[k], noise[k]["scale"])
        out[k] = {s: c[s] / max(noise[k][NOISE_OF[s]], 1e-300) for s in STATS}
        out[k].update({f"cand_{s}": c[s] for s in STATS})
    return out


def planted(model, bug: str, x):
    import keras

    from pytest_modelparity.checks import power

    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    if bug.startswith("gain"):
        factor = {"gain255": 255 / 256, "gain1023": 1023 / 1024}[bug]
        inp = keras.Input(model.inputs[0].shape[1:], name=model.inputs[0].name)
        out = clone(keras.layers.Rescaling(factor)(inp))
        if isinstance(out, dict):
            named = {k: keras.layers.Identity(name=k)(v) for k, v in out.items()}
        elif isinstance(out, (list, tuple)):
            named = [keras.layers.Identity(name=n)(v) for n, v in zip(model.output_names, out)]
        else:
            named = keras.layers.Identity(name=model.output_names[0])(out)
        return keras.Model(inp, named)
    factor = 1.01 if bug.endswith("1.01") else 1.001
    kernels = [w for layer in clone.layers for w in getattr(layer, "weights", [])
               if w.path.endswith("kernel") and len(w.shape) >= 2]
    if bug.startswith("late"):
        run = lambda m, batch: m(batch, training=False)  # noqa: E731
        kernel, _ = power.most_influential_kernel(clone, clone, x, run(clone, x), run)
    elif bug.startswith("early"):
        kernel = kernels[min(1, len(kernels) - 1)]
    else:
        kernel = kernels[len(kernels) // 2]
    kernel.assign(kernel.numpy() * factor)
    return clone


BUGS = ("late_x1.01", "late_x1.001", "mid_x1.01", "mid_x1.001", "early_x1.01", "early_x1.001",
        "gain255", "gain1023")


def run_form(model, form: str, x, tmp: Path):
    """The form's outputs under the Keras model's output names (the plugin's own binding).
    ``tflite-noxnn``: the TFLite file on LiteRT's built-in kernels, without the XNNPACK delegate."""
    import contextlib
    from unittest import mock

    import importlib

    from pytest_modelparity import export_model, load_model

    tflite_load = importlib.import_module("pytest_modelparity.formats.tflite.load")  # the module, not its load()
    plain = tflite_load.new_interpreter
    no_xnnpack = form == "tflite-noxnn"
    form = "tflite" if no_xnnpack else form
    path = export_model(model, form, tmp / f"{form}-{id(model)}-{int(no_xnnpack)}")
    with (mock.patch.object(tflite_load, "new_interpreter", lambda content, **kw: plain(content, **{**kw, "no_delegates": True}))
          if no_xnnpack else contextlib.nullcontext()):
        return _run_loaded(load_model(path), model, x)


def _run_loaded(cand, model, x):
    from pytest_modelparity import load_model
    from pytest_modelparity.formats.binding import bind_model

    try:
        bound = bind_model(cand, load_model(model), probe=x)
        out = bound.predict(x)
        return {k: np.asarray(v, np.float64) for k, v in out.items()}
    finally:
        cand.close()


def measure(nets: list[str], forms: list[str]) -> list[dict]:
    from pytest_modelparity.floor.keras_twin import float64_twin

    rng = np.random.default_rng(0)
    rows = []
    for name in nets:
        model, x = build(name, rng)
        names = list(model.output_names)
        ref32 = leaves(model(x, training=False), names)
        twin = float64_twin(model)
        x64 = x.astype(np.float64) if x.dtype.kind == "f" else x
        ref64 = leaves(twin(x64, training=False), names)
        noise = {}
        for k in ref32:
            scale = float(np.max(np.abs(ref64[k]))) or 1.0
            noise[k] = {**stats(ref32[k] - ref64[k], scale), "scale": scale}
        bugs = {b: planted(model, b, x) for b in BUGS}
        with tempfile.TemporaryDirectory() as t:
            tmp = Path(t)
            for form in forms:
                t0 = time.time()
                try:
                    cand = run_form(model, form, x, tmp)
                except Exception as exc:  # noqa: BLE001
                    print(f"{name} {form}: not exported ({type(exc).__name__}: {str(exc)[:100]})", flush=True)
                    continue
                row = {"net": name, "form": form, "noise": noise, "correct": ratios(_by_name(cand, ref32), ref32, noise),
                       "bugs": {}}
                for bug, bad in bugs.items():
                    try:
                        got = run_form(bad, form, x, tmp)
                    except Exception as exc:  # noqa: BLE001
                        row["bugs"][bug] = {"error": str(exc)[:100]}
                        continue
                    moved = leaves(bad(x, training=False), names)  # the outputs the bug reaches at all
                    per = ratios(_by_name(got, ref32), ref32, noise)
                    row["bugs"][bug] = {k: v for k, v in per.items() if not np.array_equal(moved[k], ref32[k])}
                rows.append(row)
                print(summary_line(row), f"({time.time() - t0:.0f} s)", flush=True)
    return rows


def _by_name(cand: dict, ref32: dict) -> dict:
    if set(cand) >= set(ref32):
        return cand
    if len(cand) == len(ref32) == 1:
        return {next(iter(ref32)): next(iter(cand.values()))}
    # a converter's output names: pair by shape and order as a last resort (the bench's own nets)
    return dict(zip(ref32, cand.values()))


def summary_line(row: dict) -> str:
    worst = {s: max(v[s] for v in row["correct"].values()) for s in STATS}
    parts = [f"{row['net']} {row['form']}: correct " + " ".join(f"{s}={worst[s]:.2g}x" for s in STATS)]
    for bug, per in row["bugs"].items():
        if "error" in per:
            continue
        if not per:
            continue
        best = {s: min(v[s] for v in per.values()) for s in STATS}  # the reached output least moved
        caught = sum(any(v[s] > MULTIPLE for s in STATS) for v in per.values())
        parts.append(f"  {bug}: least-moved reached output " + " ".join(f"{s}={best[s]:.2g}x" for s in STATS)
                     + f"; {caught} of {len(per)} reached outputs beyond {MULTIPLE:g}x at some statistic")
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--onednn", default="on", choices=("on", "off", "both"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.onednn == "both":
        env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0"}
        argv, skip = [], False
        for a in sys.argv[1:]:  # drop "--onednn both" / "--onednn=both"
            if skip or a.startswith("--onednn"):
                skip = a == "--onednn"
                continue
            argv.append(a)
        argv = [a.replace(".json", "-onednn-off.json") if a.endswith(".json") else a for a in argv]
        child = [sys.executable, __file__, *argv, "--onednn", "off"]
        print("== oneDNN on", flush=True)
        rows = measure(args.nets.split(","), args.forms.split(","))
        print("== oneDNN off (child)", flush=True)
        subprocess.run(child, env=env, check=False)
    else:
        if args.onednn == "off":
            assert os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0", "run with TF_ENABLE_ONEDNN_OPTS=0"
        rows = measure(args.nets.split(","), args.forms.split(","))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=float))


if __name__ == "__main__":
    main()
