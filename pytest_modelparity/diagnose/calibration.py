"""Did a quantised candidate see inputs outside the range it was calibrated on?

An int8 TFLite model stores one quantisation range per tensor, measured on the calibration
rows: an input beyond that range is clipped, and the outputs drift for a reason nothing in
the comparison names. The range of each input is read from the file itself
(``formats.tflite.quant.input_ranges``: its scale and zero point), so a file exported by
anyone, calibrated on anything, is checked; the plugin also records the range of the rows
it calibrated on (``LoadedModel.calibration_ranges``) and how they were chosen
(``LoadedModel.calibration``: ``{"rows", "source", "default"}``).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

# Beyond the calibration range by more than this share of its span: clipped for real.
OUTSIDE_SHARE = 0.05

CALIBRATION_FIX = ("calibrate on rows like the data it will see: in a suite, return them from a "
                   "modelparity_dataset fixture (or pass --modelparity-data=PATH.npz, or set "
                   "modelparity_elements to the inputs' range); in the library, pass "
                   "export_model(..., quantization='int8', representative_data=[rows])")


def _file_ranges(candidate: Any) -> dict[str, tuple[float, float]]:
    if not hasattr(candidate, "input_tensor_index"):
        return {}
    from ..formats.tflite.quant import input_ranges

    return input_ranges(candidate)


def outside_calibration(candidate: Any, inputs: Any) -> tuple[str, str, str] | None:
    """(cause, message, evidence) naming each input whose values leave the calibration range."""
    if inputs is None:
        return None
    rows_ranges = getattr(candidate, "calibration_ranges", None)
    rows_ranges = rows_ranges if isinstance(rows_ranges, Mapping) else {}
    try:
        file_ranges = _file_ranges(candidate)
    except Exception:  # noqa: BLE001 - a file that cannot be read this way: the rows' ranges only
        file_ranges = {}
    ranges = {**rows_ranges, **file_ranges}
    if not ranges:
        return None
    named = inputs if isinstance(inputs, Mapping) else ({next(iter(ranges)): inputs} if len(ranges) == 1 else {})
    found = []
    for name, (low, high) in ranges.items():
        x = named.get(name)
        if x is None:
            continue
        arr = np.asarray(x)
        if arr.dtype.kind not in "fiu" or not arr.size:
            continue
        lo, hi = float(np.min(arr)), float(np.max(arr))
        margin = OUTSIDE_SHARE * max(high - low, 1e-12)
        if lo < low - margin or hi > high + margin:
            where = "the int8 file's input quantisation represents" if name in file_ranges else "calibration rows spanned"
            rows = rows_ranges.get(name)
            extra = (f" (its calibration rows spanned [{rows[0]:.4g}, {rows[1]:.4g}])"
                     if name in file_ranges and rows is not None else "")
            found.append(f"input {name!r} spans [{lo:.4g}, {hi:.4g}]; {where} [{low:.4g}, {high:.4g}]{extra}")
    if not found:
        return None
    info = getattr(candidate, "calibration", None)
    if isinstance(info, Mapping) and info and not info.get("default"):
        # calibrated on the data already (issue 47: advising so sent a user in a circle): the rows
        # judged are what is unlike it
        fix = (f"the file was calibrated on {info.get('rows', '?')} rows ({info.get('source', 'data')}), so these "
               "inputs are not like that data: judge it on rows like its data, or calibrate on rows that cover "
               "these inputs too")
    else:
        fix = CALIBRATION_FIX
    return ("inputs_outside_calibration",
            "the inputs leave the range the int8 model was calibrated on: values outside it are clipped at the "
            f"input's quantisation; {fix}",
            "; ".join(found))


# The inputs span less than this share of the range the file's input quantisation holds: they
# fall on a few of its 256 levels (a file calibrated on data x100 keeps 2-3 of them).
NARROW_SHARE = 0.1


def calibration_range_factor(candidate: Any, inputs: Any) -> tuple[str, str, str] | None:
    """(cause, message, evidence) when an int8 file's input range is many times wider than the
    inputs it is judged on: calibrated on rows scaled differently (x100, raw pixels for a [0, 1]
    model), so these inputs are rounded onto a few levels. Read from the file alone."""
    if inputs is None:
        return None
    try:
        ranges = _file_ranges(candidate)
    except Exception:  # noqa: BLE001 - not a file this reads
        return None
    named = inputs if isinstance(inputs, Mapping) else ({next(iter(ranges)): inputs} if len(ranges) == 1 else {})
    found = []
    for name, (low, high) in ranges.items():
        arr = np.asarray(named.get(name)) if named.get(name) is not None else None
        if arr is None or arr.dtype.kind != "f" or arr.size < 2 or high <= low:
            continue
        span = float(np.max(arr) - np.min(arr))
        if span <= 0 or span >= NARROW_SHARE * (high - low):
            continue
        factor = (high - low) / span
        levels = max(1, int(round(255 * span / (high - low))))
        found.append(f"input {name!r} spans [{float(np.min(arr)):.4g}, {float(np.max(arr)):.4g}]; the int8 file's "
                     f"input quantisation holds [{low:.4g}, {high:.4g}], {factor:.3g} times wider: these inputs "
                     f"fall on about {levels} of its 256 levels")
    if not found:
        return None
    return ("calibration_range_mismatch",
            "the int8 file was calibrated on inputs scaled unlike these (its input range is many times theirs, so "
            "they are rounded onto a few levels): calibrate on rows scaled as the model is fed (the same "
            "preprocessing as these inputs)", "; ".join(found))


def default_rows_hint(candidate: Any) -> tuple[str, str, str] | None:
    """(cause, message, evidence) when the candidate was calibrated on default rows, not data."""
    info = getattr(candidate, "calibration", None)
    if not isinstance(info, Mapping) or not info.get("default"):
        return None
    return ("calibration_default_rows",
            f"the int8 file was calibrated on default rows, not on data: {CALIBRATION_FIX}",
            f"{info.get('rows', '?')} calibration rows: {info.get('source', 'default rows')}")
