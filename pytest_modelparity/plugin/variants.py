"""What a format variant adds to an export: ``quantization=<variant>`` and, for int8, the
calibration rows and how they were chosen (split from session.py, which keeps what it caches)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# A tflite:int8 candidate calibrates on rows drawn like parity_batch (another seed), so its
# quantisation ranges fit the inputs the tests feed it (the exporter's own default, uniform
# [0, 1), would clip every negative input).
INT8_CALIBRATION_ROWS = 100
INT8_CALIBRATION_SEED = 1


def variant_options(model: Any, variant: str | None, elements: Any = None, dataset: Any = None,
                     specs: Any = None) -> tuple[dict[str, Any], dict | None]:
    """Export options of a format variant: ``quantization=<variant>``, and for int8 the
    calibration rows (arrays, so the export cache keys them by content), with how they were
    chosen: the ``modelparity_dataset``'s first rows, else rows drawn like ``parity_batch``
    (``modelparity_elements``) and said to be default rows. A path source (a SavedModel
    directory) calibrates the same way, on its loaded form's inputs (``specs()``)."""
    if variant is None:
        return {}, None
    options: dict[str, Any] = {"quantization": variant}
    if variant != "int8":
        return options, None
    from ..checks.dataset import as_dataset
    from ..formats.tensorflow.keras_specs import input_specs
    from ..checks.strategies import seeded_batch, specs_of

    if isinstance(model, (str, Path)):
        shaped = specs() if specs is not None else model
    else:
        shaped = input_specs(model, action="export")
    data = as_dataset(dataset)
    # By input name: the converter's input order is not the model's (tflite._representative).
    if data is not None:
        rows = data.calibration(specs_of(shaped))
        info = {"rows": len(next(iter(rows.values()))), "source": f"the first rows of modelparity_dataset {data.label}",
                "default": False}
    else:
        rows = dict(seeded_batch(shaped, batch_size=INT8_CALIBRATION_ROWS, seed=INT8_CALIBRATION_SEED,
                                 elements=elements))
        where = "modelparity_elements" if elements is not None else "each input dtype's default range"
        info = {"rows": INT8_CALIBRATION_ROWS, "default": True,
                "source": f"seeded random rows drawn from {where}, like parity_batch (no modelparity_dataset)"}
    options["representative_data"] = [rows]
    return options, info


# Variants of a tflite candidate judged against their float32 sibling (checks/quantized.py).
QUANTIZED_VARIANTS = ("float16", "dynamic_range", "int8")


def dataset_key(dataset: Any) -> str | None:
    from ..checks.dataset import as_dataset

    data = as_dataset(dataset)
    return data.digest() if data is not None else None
