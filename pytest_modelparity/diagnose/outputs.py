"""Are two outputs of the same shape exchanged (a two-head model whose `mean` comes back as
`log_var`)? Checked on the arrays alone, before any weight or layer hint: a swap makes the
forms look different everywhere downstream while their weights and layers agree."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._util import fits, max_abs_diff


def output_swap(flat_a: dict[str, np.ndarray], flat_e: dict[str, np.ndarray], failed: list[str],
                tolerances: dict[str, Any] | None = None) -> tuple[str, str, str] | None:
    """(cause, message, evidence) when every failed output ``A`` is explained by another
    output ``B`` of the reference (actual[A] ≈ expected[B]), else None."""
    if len(flat_a) < 2 or not failed:
        return None
    mapping: dict[str, tuple[str, float, float]] = {}
    for path in failed:
        a = flat_a.get(path)
        e = flat_e.get(path)
        if a is None or e is None or np.asarray(a).dtype.kind not in "fiu":
            return None
        err = max_abs_diff(a, e)
        best: tuple[str, float] | None = None
        for other, e_other in flat_e.items():
            if other == path or np.shape(e_other) != np.shape(a):
                continue
            ok, resid = fits(a, e_other, err, (tolerances or {}).get(path))
            if ok and (best is None or resid < best[1]):
                best = (other, resid)
        if best is None:
            return None
        mapping[path] = (best[0], best[1], err)
    targets = [m[0] for m in mapping.values()]
    if len(set(targets)) != len(targets):
        return None  # two outputs explained by one: a coincidence (constant outputs), not a swap
    pairs = ", ".join(f"actual {_show(p)} ≈ expected {_show(t)}" for p, (t, _, _) in mapping.items())
    evid = "; ".join(f"max |actual{p} - expected{t}| = {r:.3g}, against {err:.3g} for expected{p}"
                     for p, (t, r, err) in mapping.items())
    return ("outputs_swapped",
            f"the candidate returns its outputs in another order ({pairs}): the outputs are bound to the wrong "
            "names or positions (an export's output order, a signature's keys); the weights are not the cause",
            evid)


def _show(path: str) -> str:
    return f"`{path}`" if path else "the output"
