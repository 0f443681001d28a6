"""Bench: what the int8 advice's ops gain when kept in float (issue 50, diagnose/quantization.py).

For each net: the int8 file's output error against its float32 sibling (relative RMS, the
worst output, on 32 held-out rows), then that error after re-quantising with, in float,
(a) the costliest op alone (by the error it adds: what the advice named before), (b) the
three costliest (the advice before feeders), (c) ``kept_names``: the three costliest and the
ops whose outputs they read (the advice now, and what ``try_keeping`` measures at a failure).
The last column is the advice's verdict: ``keep`` (the error falls to <= HELPS of itself) or
``spread`` (no keep-in-float advice; dynamic range, float16, QAT or a looser budget instead).

Nets: ``outlier`` and ``deep_tanh`` (tests/quant_models.py), ``tf1`` (tests/tf1_training.py's
checkpoint, loaded with its feeds), ``digits`` (tests/digits.py, trained on scikit-learn's
digits, calibrated on its training rows) and, given ``--musicnn DIR`` (a folder of the musicnn
wheel's checkpoints, e.g. MTT_musicnn), that trained TF1 audio tagger (its conversions take
20 s each).

    .venv/bin/python bench/quant_advice.py [--nets outlier,deep_tanh,tf1,digits] [--musicnn DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def _net(name: str, where: Path, musicnn: str | None):
    """(source, load options, calibration batches, held-out batch)."""
    if name in ("outlier", "deep_tanh"):
        import quant_models

        model = quant_models.outlier_mlp() if name == "outlier" else quant_models.deep_tanh()
        return model, {}, [quant_models.rows(8, s) for s in range(8)], quant_models.rows(32, 99)
    if name == "tf1":
        import tf1_training

        tf1_training.save_shipped(where / "ckpt")
        return (where / "ckpt", {"feeds": {"is_training": False}},
                [tf1_training.batch(8, seed=s) for s in range(8)], tf1_training.batch(32, seed=99))
    if name == "digits":
        from digits import digits_cnn

        model, x_train, x_test = digits_cnn()
        return model, {}, [x_train[:200]], x_test[:32]
    if name == "musicnn":
        from pytest_modelparity import load_model

        opts = {"feeds": {"model/Placeholder_2": False}, "outputs": ["model/Sigmoid:0"]}
        with load_model(Path(musicnn), **opts) as ref:
            shape = [d or 1 for d in ref.inputs[0].shape]

        def batch(n, seed):  # log-compressed mel-like magnitudes, as the tagger's input
            r = np.random.default_rng(seed)
            return np.log10(1 + 10000 * r.gamma(0.5, 0.02, size=(n, *shape[1:]))).astype("float32")
        return Path(musicnn), opts, [batch(8, s) for s in range(8)], batch(16, 99)
    raise SystemExit(f"unknown net {name!r}")


def run(name: str, musicnn: str | None) -> str:
    from pytest_modelparity import export_model, load_model
    from pytest_modelparity.diagnose import quantization as qz

    where = Path(tempfile.mkdtemp(prefix=f"quant_advice_{name}_"))
    source, opts, calibration, held_out = _net(name, where, musicnn)

    def int8(tag: str, nodes: list[str] | None = None) -> Path:
        extra = {"converter_options": {"float_nodes": nodes}} if nodes else {}
        return export_model(source, "tflite", where / f"{tag}.tflite", quantization="int8",
                            representative_data=calibration, **opts, **extra)

    sibling = export_model(source, "tflite", where / "f32.tflite", **opts)
    quantized = int8("int8")
    with load_model(sibling) as f:
        reference = qz._flat_outputs(f, held_out)

        def error(path: Path) -> float:
            with load_model(path) as m:
                return qz._output_error(qz._flat_outputs(m, held_out), reference)

        with load_model(quantized) as q:
            costs = qz.layer_costs(q, f, held_out[:qz.LAYER_ROWS])
        base = error(quantized)
        top = qz._top_costs(costs)
        sets = {"top op": [top[0].tensor], "top 3": [c.tensor for c in top], "advice": qz.kept_names(costs)}
        cells, took = [], []
        for tag, nodes in sets.items():
            start = time.perf_counter()
            after = error(int8(tag.replace(" ", "_"), nodes))
            took.append(time.perf_counter() - start)
            cells.append(f"{after:.3g} ({len(nodes)})")
    verdict = "keep" if after <= qz.HELPS * base else "spread"
    return (f"| {name} | {base:.3g} | " + " | ".join(cells) + f" | {verdict} | {np.median(took):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default="outlier,deep_tanh,tf1,digits")
    parser.add_argument("--musicnn", help="a musicnn checkpoint folder (adds the net 'musicnn')")
    args = parser.parse_args()
    nets = args.nets.split(",") + (["musicnn"] if args.musicnn else [])
    print("| net | int8 error | top op in float (ops) | top 3 | advice: top 3 + feeders | verdict | "
          "s per re-quantisation |")
    print("|---|---|---|---|---|---|---|")
    for name in nets:
        print(run(name, args.musicnn), flush=True)


if __name__ == "__main__":
    main()
