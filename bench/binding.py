"""Bench: how each tensor pairing was made (formats/binding.py), counted per basis, over the model
families (tests/families.py), small Keras Applications, the multi-input/output models of the
tests, and files converted outside the plugin (tf2onnx's own command on a SavedModel).

For each model and format: ``export_model``, ``load_model``, then ``bind_model(candidate,
reference, probe=batch)`` as the plugin's session does, and ``assert_outputs_close`` with the
default tolerance on the bound candidate (the pairing must also give a passing verdict: a wrong
pair fails). Prints one table (model x format: the bases used, or the typed error that stopped the
export) and the counts per basis; a pairing "by position" has no basis to be counted under and
cannot occur (the bench asserts every pair has one of formats.binding.BASES).

    .venv/bin/python bench/binding.py [--formats keras,h5,saved_model,graphdef,tflite,onnx,tfjs]
        [--models "LSTM (masked);two_in_two_out"] [--json results.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from families import FAMILIES  # noqa: E402

from pytest_modelparity import ExportError, ModelLoadError, ParityError, RuntimeMissing  # noqa: E402
from pytest_modelparity import assert_outputs_close  # noqa: E402
from pytest_modelparity.formats import export_model, load_model  # noqa: E402
from pytest_modelparity.formats.binding import BASES, BindingError, BoundModel, bind_model  # noqa: E402

FORMATS = ("keras", "h5", "saved_model", "graphdef", "tflite", "onnx", "tfjs")


def _extra_models() -> dict:
    import numpy as np

    from models import keras_app, two_in_two_out

    def tio():
        m = two_in_two_out()
        rng = np.random.default_rng(0)
        return m, {"zeta": rng.normal(size=(4, 4)).astype("float32"), "alpha": rng.normal(size=(4, 3)).astype("float32")}

    return {"two_in_two_out": tio,
            "MobileNetV2 32px (input_shape=)": lambda: keras_app("mobilenetv2", 32)}


def pairs_of(candidate, reference) -> list[tuple[str, str]]:
    if not isinstance(candidate, BoundModel):
        return [("input", "same name") for _ in reference.inputs] + [("output", "same name") for _ in reference.outputs]
    return [("input", p.basis) for p in candidate.input_binding.pairs] + \
        [("output", p.basis) for p in candidate.output_binding.pairs]


def one(model, batch, fmt: str, folder: Path) -> dict:
    try:
        reference = load_model(model)
        path = export_model(model, fmt, folder / "model")
        candidate = bind_model(load_model(path), reference, probe=batch)
        got = pairs_of(candidate, reference)
        assert all(b in BASES for _, b in got), got
        try:
            assert_outputs_close(candidate, reference, inputs=batch)
            verdict = "pass"
        except ParityError:
            verdict = "fails tolerance"
        return {"format": fmt, "pairs": got, "verdict": verdict}
    except BindingError as exc:
        return {"format": fmt, "pairs": [], "verdict": "BindingError", "detail": str(exc).splitlines()[0][:160]}
    except (ExportError, ModelLoadError, RuntimeMissing) as exc:
        return {"format": fmt, "pairs": [], "verdict": f"no file ({type(exc).__name__})",
                "detail": str(exc).splitlines()[0][:160]}


def foreign_onnx(folder: Path) -> dict:
    """A SavedModel with three dict outputs of two shapes, converted by tf2onnx's own command
    (graph names kept: Identity_k:0 outputs, serving_default_input_2:0 input)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_binding_foreign import BUILD

    sm, onnx = folder / "sm", folder / "sm.onnx"
    subprocess.run([sys.executable, "-c", BUILD, str(sm)], check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--saved-model", str(sm), "--output", str(onnx),
                    "--opset", "17", "--use-graph-names", "--rename-inputs", "serving_default_input_2:0"],
                   check=True, capture_output=True)
    import numpy as np

    reference, candidate = load_model(sm), load_model(onnx)
    x = np.random.default_rng(0).normal(size=(3, 6, 5)).astype("float32")
    bound = bind_model(candidate, reference, probe=x)
    assert_outputs_close(bound, reference, inputs=x)
    return {"format": "onnx (tf2onnx CLI, outside the plugin)", "pairs": pairs_of(bound, reference), "verdict": "pass"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--models", default=None, help="';'-separated names (default: all)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    builders = {**FAMILIES, **_extra_models()}
    names = args.models.split(";") if args.models else list(builders)
    results: dict[str, list[dict]] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            model, batch = builders[name]()
            results[name] = []
            for fmt in formats:
                folder = Path(tmp) / f"{len(results)}-{fmt}"
                folder.mkdir()
                results[name].append(one(model, batch, fmt, folder))
            print(f"{name}: " + ", ".join(f"{r['format']} {r['verdict']}" for r in results[name]), flush=True)
        foreign_dir = Path(tmp) / "foreign"
        foreign_dir.mkdir()
        results["SavedModel, 3 dict outputs"] = [foreign_onnx(foreign_dir)]
    counts: collections.Counter = collections.Counter()
    for rows in results.values():
        for r in rows:
            counts.update(f"{kind} / {basis}" for kind, basis in r["pairs"])
    print("\n| model | " + " | ".join(formats) + " |\n|---|" + "---|" * len(formats))
    for name, rows in results.items():
        by_format = {r["format"]: r for r in rows}
        cells = []
        for fmt in formats if name != "SavedModel, 3 dict outputs" else [rows[0]["format"]]:
            r = by_format.get(fmt)
            if r is None:
                cells.append("-")
                continue
            bases = collections.Counter(b for _, b in r["pairs"] if b != "same name")
            text = ", ".join(f"{b} x{n}" for b, n in sorted(bases.items())) or "same name"
            cells.append(text if r["verdict"] == "pass" else f"{r['verdict']}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\npairings per basis (inputs and outputs):")
    for key, n in sorted(counts.items()):
        print(f"  {key}: {n}")
    print(f"  by bare position: 0 (no such basis)   [{time.perf_counter() - start:.0f} s]")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
