"""Did a quantised candidate see inputs outside the range it was calibrated on?

An int8 TFLite model stores one quantisation range per tensor, measured on the calibration
rows: an input beyond that range is clipped, and the outputs drift for a reason nothing in
the comparison names. The plugin records the calibration rows' range per input on the
candidate (``LoadedModel.calibration_ranges``: ``{input name: (low, high)}``).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

# Beyond the calibration range by more than this share of its span: clipped for real.
OUTSIDE_SHARE = 0.05


def outside_calibration(candidate: Any, inputs: Any) -> tuple[str, str, str] | None:
    """(cause, message, evidence) naming each input whose values leave the calibration range."""
    ranges = getattr(candidate, "calibration_ranges", None)
    if not isinstance(ranges, Mapping) or not ranges or inputs is None:
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
            found.append(f"input {name!r} spans [{lo:.4g}, {hi:.4g}], calibration rows spanned [{low:.4g}, {high:.4g}]")
    if not found:
        return None
    return ("inputs_outside_calibration",
            "the inputs leave the range the int8 model was calibrated on: values outside it are clipped by "
            "the quantisation ranges; calibrate on rows drawn like the test's batches (same element range)",
            "; ".join(found))
