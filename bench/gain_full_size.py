"""Issue 50: an input /255 (and /256) in front of a full-size EfficientNetV2B0 (224 px, its own
Rescaling(1/255) inside, trained-like statistics), and what the diagnosis names. The exact-gain
fit (``diagnose/inputs._exact_gain``) was checked on a small net; here the real one.

Run:  .venv/bin/python bench/gain_full_size.py [--size 224]
Measured 2026-12-04 (2 shared cores): both read "divided by 255 or divided by 256 (the rows
cannot tell which ...)": the net's own /255 leaves it inputs of 0..1/255 after the slip, where its
outputs barely depend on the input, so 255 and 256 move them alike; neither is named wrongly.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=224)
    args = parser.parse_args()
    import keras
    from models import trained_like

    from pytest_modelparity import ParityError, assert_outputs_close

    keras.utils.set_random_seed(0)
    size = args.size
    ref = keras.applications.EfficientNetV2B0(weights=None, input_shape=(size, size, 3), include_preprocessing=True)
    raw = np.random.default_rng(3).uniform(0, 255, (8, size, size, 3)).astype("float32")
    trained_like(ref, raw[:4])
    for divisor in (255.0, 256.0):
        inp = keras.Input((size, size, 3))
        cand = keras.Model(inp, ref(keras.layers.Rescaling(1 / divisor)(inp)))
        start = time.time()
        try:
            assert_outputs_close(cand, ref, inputs=raw)
            print(f"/{divisor:g}: PASSED (a miss)")
        except ParityError as exc:
            causes = [ln.strip() for ln in str(exc).splitlines() if "candidate(x)" in ln or "divided" in ln]
            print(f"/{divisor:g} ({time.time() - start:.0f} s): " + (causes[0] if causes else "no input cause named"))


if __name__ == "__main__":
    main()
