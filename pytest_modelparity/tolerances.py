"""Tolerances: the rule an output is judged by, its dtype/device/format defaults, and
where a tolerance came from (argument > marker > ini > built-in).

CONTRACT (other modules rely on these names; the owner of this module may add, not rename):

- ``Tolerance`` (frozen dataclass). An element passes when
      |actual - expected| <= atol + rtol * |expected| + scale * max|expected over the output|
  ``scale == 0`` is the plain per-element rule (what an explicit rtol=/atol= means);
  ``scale > 0`` is the scale-aware rule. ``min_top1`` (fraction in [0, 1]) additionally
  requires that share of rows to agree on argmax over the last axis; ``max_mismatch_fraction``
  lets that share of elements be out of bounds (quantised formats). ``source`` says where it
  came from, e.g. "argument", "marker", "ini", "built-in float32", "calibrated".
- ``default_tolerance(dtype, *, device="cpu", format=None) -> Tolerance``
- ``resolve_tolerance(dtype, *, rtol=None, atol=None, device="cpu", format=None,
      layers=()) -> Tolerance`` with ``layers`` an ordered sequence of
      ``(source_name, rtol_or_None, atol_or_None)`` from highest to lowest priority
      (marker, ini); explicit rtol/atol win over all layers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    scale: float = 0.0
    min_top1: float | None = None
    max_mismatch_fraction: float = 0.0
    source: str = "built-in"

    @property
    def rule(self) -> str:
        """``"elementwise"`` for the plain rule, ``"scaled"`` when ``scale > 0``."""
        return "scaled" if self.scale > 0 else "elementwise"

    def with_source(self, source: str) -> "Tolerance":
        return replace(self, source=source)

    def describe(self) -> str:
        text = f"rtol={self.rtol:.3g}, atol={self.atol:.3g}"
        if self.scale > 0:
            text += f", scale={self.scale:.3g} x max|expected|"
        if self.max_mismatch_fraction:
            text += f", up to {self.max_mismatch_fraction:.1%} of elements out"
        if self.min_top1 is not None:
            text += f", top-1 agreement >= {self.min_top1:.0%}"
        return f"{text} ({self.source})"


def default_tolerance(dtype: Any, *, device: str = "cpu", format: str | None = None) -> Tolerance:
    """Placeholder until the tolerances work lands: plain torch.testing-like defaults."""
    dt = np.dtype(dtype) if not isinstance(dtype, np.dtype) else dtype
    if dt.kind in "iub":
        return Tolerance(0.0, 0.0, source=f"built-in {dt.name}")
    table = {2: (1e-3, 1e-5), 4: (1.3e-6, 1e-5), 8: (1e-7, 1e-7)}
    rtol, atol = table.get(dt.itemsize, (1.3e-6, 1e-5))
    return Tolerance(rtol, atol, source=f"built-in {dt.name}")
