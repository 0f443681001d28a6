"""Every planted bug, per format: caught (the comparison FAILS), named (the first "Likely cause"
is the planted one) and misleading (a later hint points elsewhere: weights that agree, a layer
downstream of the cause, an output scale) -- issue 38's zoo plus the earlier one (tests/zoo).

Bugs (the models are the small ones of tests/test_diagnose_causes.py and tests/zoo):
ids +1 on both inputs of an encoder-decoder; ids +1 on a recommender's (B, 1) user_id and
item_id; two same-shape outputs swapped (keras, saved_model, tflite, onnx); a waveform fed
int16 samples as floats (x32768); a Normalization mean off by half a standard deviation; a
port's BatchNormalization epsilon and a channels-first flatten (keras; the flatten also as
tflite and saved_model, where the layer table must name the candidate's transpose); a fused first convolution
x1.01 (tflite, onnx, saved_model: named = the layer table at ~1%, or the kernel itself).

Issue 50's plants: a Dense on patches (Tensordot) kernel x1.01 on saved_model, onnx, tflite; a
detector's stride-16 conv on onnx (heads of one size on other grids); a Normalization mean
folded into an exported form's constants, and folded into the next Dense's, Conv2D's or DepthwiseConv2D's weights; a pixel range either way; an input /255 and /256;
a generator's latent x0.5; a weekday id shifted with wrap-around; an int8 file calibrated on the
data x100; a trained audio model's late conv kernel (`conv2d_5`, basic-pitch 0.4.0's shipped
SavedModel, a graph reference loaded by the v1 loader) x1.01 in a copy of the SavedModel's
variables and of its shipped TFLite and ONNX files. Named = the first hint is the planted cause
and holds the words that say which (the layer, the factor).

The basic-pitch wheel is downloaded with pip (`pip download basic-pitch==0.4.0 --no-deps`, 2 MB,
said on stderr) into BASIC_PITCH_CACHE (default: <tmp>/modelparity-bench-basic-pitch) when it is
not there yet; without network its rows read n/a.

Run:  .venv/bin/python bench/diagnosis.py [--no-zoo | --only-50] [--match TEXT]
      (2 cores: 39 s with the earlier zoo; a case that cannot run here, e.g. tfjs without Node.js, reads n/a)
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(1, str(ROOT))  # the zoo imports `tests.tf1_graphs`, `tests.models`
sys.path.insert(2, str(ROOT / "bench"))  # fuzz.plant_in_file

from pytest_modelparity import (ParityError, assert_batch_invariant, assert_deterministic,  # noqa: E402
                                assert_outputs_close, export_model, load_model)

# Hints that point away from the cause when another one was planted.
MISLEADING = {"weights_differ", "weights_reinitialised", "first_divergent_layer", "output_scaled",
              "input_scaling", "token_id_shift", "outputs_swapped", "preprocessing_state",
              "configuration_differs", "layer_only_in_one_form"}


def _issue38_cases(tmp: Path) -> list[tuple[str, str, str, object]]:
    """(bug, format, expected cause, run) with run() raising ParityError on a caught bug."""
    import test_diagnose_causes as t

    out: list[tuple[str, str, str, object]] = []
    ref, bug = t._two_heads(False), t._two_heads(True)
    for layer in ref.layers:
        bug.get_layer(layer.name).set_weights(layer.get_weights())
    x = np.random.default_rng(0).normal(size=(6, 8)).astype("float32")
    for fmt in ("keras", "saved_model", "tflite", "onnx"):
        def swap(fmt: str = fmt) -> None:
            cand = bug if fmt == "keras" else load_model(export_model(bug, fmt, tmp / f"swap_{fmt}"))
            assert_outputs_close(cand, ref, inputs=x)
        out.append(("outputs swapped", fmt, "outputs_swapped", swap))

    seq = t._encoder_decoder()
    rng = np.random.default_rng(1)
    sx = {"source": rng.integers(1, 38, (4, 10)).astype("int32"), "target": rng.integers(1, 38, (4, 6)).astype("int32")}
    out.append(("encoder-decoder ids +1 on both inputs", "keras", "token_id_shift",
                lambda: assert_outputs_close(lambda b: seq({k: v + 1 for k, v in b.items()}), seq, inputs=sx)))
    rec = t._recommender()
    rx = {"user_id": rng.integers(1, 28, (8, 1)).astype("int32"), "item_id": rng.integers(1, 48, (8, 1)).astype("int32")}
    for key in ("user_id", "item_id"):
        out.append((f"recommender {key} (B, 1) +1", "keras", "token_id_shift",
                    lambda key=key: assert_outputs_close(lambda b: rec({**b, key: b[key] + 1}), rec, inputs=rx)))
    wav = t._waveform_net()
    tt = np.arange(1024) / 16000.0
    wx = np.stack([0.3 * np.sin(2 * np.pi * f * tt) for f in (220, 440, 880)]).astype("float32") * 1e-3
    out.append(("waveform fed int16 samples (x32768)", "keras", "input_scaling",
                lambda: assert_outputs_close(lambda b: wav(b * 32768.0), wav, inputs=wx)))
    nref, nbug = t._normalized([1.0, -2.0, 0.5, 3.0]), t._normalized([2.0, -2.0, 0.5, 3.0])
    nbug.set_weights(nref.get_weights())
    nx = np.random.default_rng(3).normal(size=(8, 4)).astype("float32") * 2
    out.append(("Normalization mean +0.5 std", "keras", "preprocessing_state",
                lambda: assert_outputs_close(nbug, nref, inputs=nx)))

    tag = t._tagger()
    bn = tag.get_layer("bn1")
    trng = np.random.default_rng(9)
    bn.set_weights([w + trng.uniform(0.5, 1.5, w.shape) if i == 0 else
                    (trng.uniform(1e-4, 1e-2, w.shape) if i == 3 else w) for i, w in enumerate(bn.get_weights())])
    tx = trng.normal(size=(4, 16, 16, 1)).astype("float32")
    for label, slip, cause in (("port: BatchNormalization epsilon 1e-5", dict(epsilon=1e-5), "configuration_differs"),
                               ("port: channels-first flatten", dict(channels_first_flatten=True),
                                "layer_only_in_one_form")):
        port = t._tagger(**slip)
        port.set_weights(tag.get_weights())
        out.append((label, "keras", cause, lambda port=port: assert_outputs_close(port, tag, inputs=tx)))
        if "flatten" in label:  # no Keras config on a file: the layer table names the transpose
            for fmt in ("tflite", "saved_model"):
                out.append((label, fmt, "first_divergent_layer", lambda port=port, fmt=fmt: assert_outputs_close(
                    load_model(export_model(port, fmt, tmp / f"port_{fmt}")), tag, inputs=tx)))

    det, dbug = t._detector(), t._detector()
    dbug.set_weights(det.get_weights())
    dbug.stem.kernel.assign(det.stem.kernel * 1.01)
    dx = np.random.default_rng(11).uniform(0, 1, (4, 16, 16, 3)).astype("float32")
    for fmt in ("tflite", "onnx", "saved_model"):
        expected = "weights_differ" if fmt == "saved_model" else "first_divergent_layer"
        out.append(("fused first conv x1.01", fmt, expected, lambda fmt=fmt: assert_outputs_close(
            load_model(export_model(dbug, fmt, tmp / f"det_{fmt}")), det, inputs=dx)))
    return out


def _issue50_cases(tmp: Path) -> list[tuple]:
    """(bug, format, expected cause, run, words the first hint must hold to count as named)."""
    import keras
    import test_diagnose_named as n
    import test_diagnose_slip as sl
    from digits import digits_cnn
    from models import trained_like

    out: list[tuple] = []
    ref, bug = sl._planted(sl._encoder, "ffn0a")
    px = np.random.default_rng(0).normal(size=(8, 6, 8)).astype("float32")
    for fmt in ("saved_model", "onnx", "tflite"):
        cause = "weights_differ" if fmt == "saved_model" else "first_divergent_layer"
        out.append(("Dense on patches, kernel x1.01", fmt, cause, lambda fmt=fmt: assert_outputs_close(
            load_model(export_model(bug, fmt, tmp / f"patches_{fmt}")), ref, inputs=px), "ffn0a"))

    dx = np.random.default_rng(0).uniform(-1, 1, size=(8, 32, 32, 3)).astype("float32")
    dref, dbug = sl._planted(lambda: sl._biased(trained_like(sl._detector(), dx)), "c16")
    out.append(("detector, stride-16 conv x1.01 (heads cross strides)", "onnx", "first_divergent_layer",
                lambda: assert_outputs_close(load_model(export_model(dbug, "onnx", tmp / "det16.onnx")), dref,
                                             inputs=dx), "layer `c16`"))

    nref = n._tabular([1.0, -2.0, 0.5, 3.0])
    nbug = n._tabular([2.0, -2.0, 0.5, 3.0])
    nbug.set_weights(nref.get_weights())
    nx = np.random.default_rng(3).normal(size=(8, 4)).astype("float32") * 2
    for fmt in ("saved_model", "tflite", "onnx"):
        out.append(("Normalization mean +0.5 std, folded into constants", fmt, "preprocessing_state",
                    lambda fmt=fmt: assert_outputs_close(load_model(export_model(nbug, fmt, tmp / f"norm_{fmt}")),
                                                         nref, inputs=nx), "mean 2 where the reference has 1"))
    folded = n._folded(nref, [2.0, -2.0, 0.5, 3.0])
    for fmt in ("tflite", "onnx"):
        out.append(("Normalization mean +0.5 std, folded into the next Dense", fmt, "preprocessing_state",
                    lambda fmt=fmt: assert_outputs_close(load_model(export_model(folded, fmt, tmp / f"fold_{fmt}")),
                                                         nref, inputs=nx), "(folded into `hidden` in the candidate)"))

    import test_diagnose_folded_conv as fc

    cx = np.random.default_rng(3).normal(size=(8, 10, 10, 3)).astype("float32") * 2
    for depthwise, kind in ((False, "Conv2D"), (True, "DepthwiseConv2D")):
        cref = fc._reference(depthwise)
        cfold = fc._folded(cref, [2.0, -2.0, 0.5], depthwise)
        for fmt in ("tflite", "onnx"):
            out.append((f"Normalization mean +0.5 std, folded into the next {kind}", fmt, "preprocessing_state",
                        lambda fmt=fmt, cref=cref, cfold=cfold, kind=kind: assert_outputs_close(
                            load_model(export_model(cfold, fmt, tmp / f"cfold_{kind}_{fmt}")), cref, inputs=cx),
                        "(folded into `conv` in the candidate) runs in the candidate with mean 2"))

    body = n._body()
    trained_like(body, np.random.default_rng(2).uniform(-1, 1, (16, 16, 16, 3)).astype("float32"))
    unit = np.random.default_rng(4).uniform(-1, 1, (8, 16, 16, 3)).astype("float32")
    raw = np.random.default_rng(3).uniform(0, 255, (8, 16, 16, 3)).astype("float32")
    rescale = keras.layers.Rescaling(1 / 127.5, offset=-1.0)
    takes_raw = n._before(body, rescale)
    out.append(("pixel range: reference takes 0..255, candidate [-1, 1]", "keras", "input_scaling",
                lambda: assert_outputs_close(body, takes_raw, inputs=unit), "multiplied by 127.5 and shifted by 127.5"))
    out.append(("pixel range: candidate rescales 0..255 it is not given", "keras", "input_scaling",
                lambda: assert_outputs_close(n._before(body, rescale), body, inputs=unit),
                "divided by 127.5 and shifted by -1"))
    by255 = n._before(body, keras.layers.Rescaling(1 / 255.0))
    for divisor in (255.0, 256.0):
        cand = n._before(by255, keras.layers.Rescaling(1 / divisor))
        out.append((f"input /{divisor:g} where the reference takes raw pixels", "keras", "input_scaling",
                    lambda cand=cand: assert_outputs_close(cand, by255, inputs=raw), f"divided by {divisor:g}"))

    gen = n._generator()
    grng = np.random.default_rng(5)
    for layer in gen.layers:
        w = layer.get_weights()
        if len(w) == 2:
            layer.set_weights([w[0], grng.normal(0, 0.2, w[1].shape).astype("float32")])
    z = keras.Input((16,))
    half = keras.Model(z, gen(keras.layers.Rescaling(0.5)(z)))
    latent = grng.normal(size=(8, 16)).astype("float32")
    out.append(("generator latent x0.5", "keras", "input_scaling",
                lambda: assert_outputs_close(half, gen, inputs=latent), "divided by 2"))

    keras.utils.set_random_seed(7)
    day = keras.Input((1,), dtype="int32")
    wref = keras.Model(day, keras.layers.Dense(3)(keras.layers.Flatten()(keras.layers.Embedding(7, 4)(day))))
    shifted = keras.Input((1,), dtype="int32")
    wbug = keras.Model(shifted, wref(keras.ops.mod(shifted + 1, 7)))
    days = np.array([[0], [1], [2], [3], [4], [5], [6], [6]], "int32")
    out.append(("weekday id +1 with wrap-around", "keras", "token_id_shift",
                lambda: assert_outputs_close(wbug, wref, inputs=days), "+ 1 modulo 7"))

    model, x_train, x_test = digits_cnn()

    def x100() -> None:
        q = load_model(export_model(model, "tflite", tmp / "x100.tflite", quantization="int8",
                                    representative_data=[x_train[:100] * 100.0]))
        assert_outputs_close(q, model, inputs=x_test[:32])
    out.append(("int8 calibrated on data x100 (digits CNN)", "tflite:int8", "calibration_range_mismatch", x100,
                "times wider"))
    return out + _basic_pitch_cases(tmp)


BASIC_PITCH = "basic-pitch==0.4.0"
PITCH_KERNEL = "layer_with_weights-8/kernel/.ATTRIBUTES/VARIABLE_VALUE"  # conv2d_5, the onset head's last conv


def basic_pitch_models() -> Path:
    """basic-pitch's ``saved_models/icassp_2022`` folder, its wheel downloaded with pip (and said
    so) when the cache does not hold it."""
    import subprocess
    import zipfile

    cache = Path(os.environ.get("BASIC_PITCH_CACHE", Path(tempfile.gettempdir()) / "modelparity-bench-basic-pitch"))
    models = cache / "basic_pitch" / "saved_models" / "icassp_2022"
    if not (models / "nmp" / "saved_model.pb").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"downloading the {BASIC_PITCH} wheel with pip into {cache} (its trained model's files)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", BASIC_PITCH, "--no-deps", "-q", "-d", str(cache)],
                       check=True, timeout=300)
        wheel = next(cache.glob("basic_pitch-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            z.extractall(cache, [n for n in z.namelist() if n.startswith("basic_pitch/saved_models/icassp_2022/")])
    return models


def _planted_saved_model(source: Path, dest: Path, key: str, factor: float) -> Path:
    """A copy of the SavedModel ``source`` whose variable ``key`` (checkpoint key) is x ``factor``:
    every tensor of its variables read and written again (SaveV2, so the index's checksums hold)."""
    import shutil

    import tensorflow as tf

    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(source, dest)
    reader = tf.train.load_checkpoint(str(source / "variables" / "variables"))
    names = sorted(reader.get_variable_to_shape_map())
    values = [reader.get_tensor(n) for n in names]
    values = [(v * np.asarray(factor, v.dtype)).astype(v.dtype) if n == key else v for n, v in zip(names, values)]
    for f in (dest / "variables").iterdir():
        f.unlink()
    tf.raw_ops.SaveV2(prefix=str(dest / "variables" / "variables"), tensor_names=names,
                      shape_and_slices=[""] * len(names), tensors=values)
    return dest


def _basic_pitch_cases(tmp: Path) -> list[tuple]:
    """basic-pitch's late conv kernel x1.01 in a copy of each shipped form, against its SavedModel."""
    import shutil

    label = "trained audio (basic-pitch) conv2d_5 x1.01"
    formats = ("saved_model", "tflite", "onnx")
    try:
        models = basic_pitch_models()
    except Exception as exc:  # noqa: BLE001 - no network: the rows say why
        def unavailable(exc: Exception = exc) -> None:
            raise RuntimeError(f"basic-pitch not available: {exc}")
        return [(label, fmt, "weights_differ", unavailable, "conv2d_5/kernel") for fmt in formats]
    import tensorflow as tf
    from fuzz import plant_in_file  # bench/fuzz.py: finds a kernel's bytes in a converted file

    reference_dir = models / "nmp"
    n = 43844  # the model's fixed input length (2 s at 22,050 Hz)
    t = np.arange(n) / 22050.0
    noise = np.random.default_rng(0)
    audio = np.stack([0.3 * np.sin(2 * np.pi * f * t) + 0.01 * noise.normal(size=n)
                      for f in (220.0, 330.0, 440.0)]).astype("float32")[..., None]
    kernel = tf.train.load_checkpoint(str(reference_dir / "variables" / "variables")).get_tensor(PITCH_KERNEL)

    def run(fmt: str) -> None:
        if fmt == "saved_model":
            candidate = _planted_saved_model(reference_dir, tmp / "pitch_planted_sm", PITCH_KERNEL, 1.01)
        else:
            folder = tmp / f"pitch_{fmt}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            shutil.copy(models / f"nmp.{fmt}", folder / f"nmp.{fmt}")
            copy = plant_in_file(folder, fmt, kernel, 1.01)
            if copy is None:
                raise RuntimeError(f"conv2d_5's kernel is not in the shipped {fmt} file once")
            candidate = copy / f"nmp.{fmt}"
        assert_outputs_close(load_model(candidate), load_model(reference_dir), inputs=audio)

    return [(label, fmt, "weights_differ", lambda fmt=fmt: run(fmt), "conv2d_5/kernel") for fmt in formats]


def _zoo_cases(tmp: Path) -> list[tuple[str, str, str, object]]:
    import zoo

    out: list[tuple[str, str, str, object]] = []
    for build in zoo.CAUSES:
        def run(build=build) -> None:
            case = build(tmp)
            kw = dict(case.kwargs, **({"rtol": 0.0, "atol": 0.0} if case.passes_by_default else {}))
            if case.check == "outputs_close":
                assert_outputs_close(case.candidate, case.reference, inputs=case.inputs, **kw)
            elif case.check == "deterministic":
                assert_deterministic(case.candidate, case.inputs, **kw)
            else:
                assert_batch_invariant(case.candidate, case.inputs, **kw)
        fmt = "tfjs" if "tfjs" in build.__name__ else "-"
        out.append((f"zoo: {build.__name__}", fmt, _zoo_cause(build), run))
    return out


def _zoo_cause(build: object) -> str:
    import inspect
    import re

    found = re.search(r'cause="([a-z_]+)"', inspect.getsource(build))  # type: ignore[arg-type]
    return found.group(1) if found else "?"


def _corroborates(hint: object, first: object) -> bool:
    """A layer table that points at the layer whose weights the first hint says differ agrees
    with it (not misleading)."""
    import re

    if getattr(hint, "cause", "") != "first_divergent_layer" or not getattr(first, "cause", "").startswith("weights"):
        return False
    layer = re.search(r"layer `([^`]+)`", getattr(hint, "message", ""))
    if not layer:
        return False
    parts = {re.sub(r"_\d+$", "", p) for p in layer.group(1).split("/")[1:] or layer.group(1).split("/")}
    weights = {re.sub(r"_\d+$", "", p) for name in re.findall(r"`([^`]+)`", getattr(first, "evidence", ""))
               for p in re.split(r"[/.]", name)}
    return bool(parts & weights)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-zoo", action="store_true", help="only issue 38's and issue 50's planted bugs")
    ap.add_argument("--only-50", action="store_true", help="only issue 50's planted bugs")
    ap.add_argument("--match", default="", help="only the bugs whose label holds this text (e.g. basic-pitch)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cases = [] if args.only_50 else [c + ("",) for c in _issue38_cases(tmp)]
        cases += _issue50_cases(tmp)
        cases += [] if args.no_zoo or args.only_50 else [c + ("",) for c in _zoo_cases(tmp)]
        cases = [c for c in cases if args.match in c[0]]
        for bug, fmt, cause, run, words in cases:
            t0 = time.perf_counter()
            try:
                run()  # type: ignore[operator]
                hints, got, caught = [], [], False
            except ParityError as exc:
                hints = exc.report.hints
                got, caught = [h.cause for h in hints], True
            except Exception as exc:  # noqa: BLE001 - a case that cannot run here (no Node.js)
                rows.append((bug, fmt, cause, "n/a", "-", "-", f"{type(exc).__name__}: {str(exc)[:90]}", time.perf_counter() - t0))
                continue
            named = bool(got) and got[0] == cause and (not words or words in hints[0].message + hints[0].evidence)
            misleading = [h.cause for h in hints[1:] if h.cause in MISLEADING and h.cause != cause
                          and not _corroborates(h, hints[0])]
            rows.append((bug, fmt, cause, "yes" if caught else "NO", "yes" if named else "NO",
                         ", ".join(misleading) or "0", ", ".join(got) or "-", time.perf_counter() - t0))
    w = max([42] + [len(r[0]) for r in rows])
    print(f"{'bug':<{w}} {'format':<12} {'caught':<6} {'named':<6} misleading  hints  (s)")
    for bug, fmt, cause, caught, named, mis, got, s in rows:
        print(f"{bug:<{w}} {fmt:<12} {caught:<6} {named:<6} {mis:<10} {got}  {s:.1f}")
    ran = [r for r in rows if r[3] != "n/a"]
    print(f"\n{len(ran)} bugs run: caught {sum(r[3] == 'yes' for r in ran)}, named {sum(r[4] == 'yes' for r in ran)}, "
          f"misleading hints {sum(r[5] != '0' for r in ran)}")


if __name__ == "__main__":
    main()
