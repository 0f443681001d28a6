"""Run by tests/test_bulk_verdict.py, in a child process (the environment, oneDNN on or off, is
the child's), or ``main`` in the test's own process for the setting its TensorFlow runs with:
the log-magnitude audio net (tests/audio.py) and its forms judged by the default verdict
against the Keras reference; correct forms, a 1% change of the late convolution's kernel, and
an input gain of 255/256, each exported to every float form given.

Prints one JSON line: ``{"form": {"correct" | "late_x1.01" | "gain255": {output: verdict}}}``,
where a verdict is "pass", "fail (max)" (the per-element bound failed) or "fail (<statistic>)"
(only the bulk of the error did), or "error: ..." when the form could not be made.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def gain(model, factor: float):
    """``model`` behind an input Rescaling(``factor``), its outputs keeping their names."""
    import keras

    inp = keras.Input(model.inputs[0].shape[1:], name=model.inputs[0].name)
    out = model(keras.layers.Rescaling(factor)(inp))
    return keras.Model(inp, [keras.layers.Identity(name=n)(o) for n, o in zip(model.output_names, out)])


def main(forms: list[str]) -> dict:
    import audio

    from pytest_modelparity import ParityError, assert_outputs_close, export_model, load_model

    model, _ = audio.log_magnitude(1024, kernel=512)
    x = audio.waveform(4, 1024, seed=1)
    reference = load_model(model)
    variants = {"correct": model, "late_x1.01": audio.perturb_late_kernel(model, 1.01),
                "gain255": gain(model, 255 / 256)}
    found: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for form in forms:
            for name, variant in variants.items():
                try:
                    candidate = load_model(export_model(variant, form, Path(tmp) / f"{name}-{form.replace(':', '-')}"))
                except Exception as exc:  # noqa: BLE001 - said in the row, asserted by the test
                    found.setdefault(form, {})[name] = f"error: {type(exc).__name__}: {exc}"[:300]
                    continue
                try:
                    report = assert_outputs_close(candidate, reference, inputs=x)
                except ParityError as exc:
                    report = exc.report
                finally:
                    candidate.close()
                found.setdefault(form, {})[name] = {
                    o.path: "pass" if o.passed else
                    ("fail (max)" if o.mismatched else f"fail ({_failed_statistic(o)})")
                    for o in report.outputs}
    return found


def _failed_statistic(o) -> str:
    failed = [row["statistic"] for row in (o.bulk or []) if not row["holds"]]
    return ",".join(failed) or "other"


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    warnings.filterwarnings("ignore")
    print(json.dumps(main(sys.argv[1].split(","))))
