"""Which layers quantisation costs the most: a quantised TFLite file against its float32 sibling.

Why this and not the layer table of ``localize.py``: a Keras layer paired with a fused TFLite
op reports inflated errors (VGG16 ``predictions`` "2.55" while the output differed by 0.025),
and inside an int8 graph no Keras layer pairs at all. The float32 file and the quantised one
made from the same graph share their op names, so their tensors pair one to one. Both run
with every tensor preserved (LiteRT ``experimental_preserve_all_tensors``; TensorFlow's
``QuantizationDebugger`` does the same on one model but drives the deprecated
``tf.lite.Interpreter`` and needs the converter and its data, which a file does not carry).

A layer's *cost* is the relative RMS error it adds: the error of its output minus the
largest error among its inputs, so the layers downstream of a costly one are not blamed for
what they received.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

# Rows of the batch the two files are run on (intermediates of every op are kept in memory).
LAYER_ROWS = 8
SHOWN = 3
_PASS_THROUGH = {"QUANTIZE", "DEQUANTIZE", "RESHAPE", "SQUEEZE", "EXPAND_DIMS"}


@dataclass(frozen=True)
class LayerCost:
    tensor: str         # the op's output tensor name (shared by both files)
    op: str             # the op type in the quantised file
    error: float        # relative RMS error of the output vs the float32 sibling
    added: float        # error minus the largest error among its inputs

    @property
    def layer(self) -> str:
        """A readable layer name from the fused tensor name (``model/conv1_1/Relu;...`` -> ``conv1_1``)."""
        first = self.tensor.split(";", 1)[0]
        parts = [p for p in first.split("/") if p]
        if len(parts) <= 2:
            return first
        # A retraced Keras model names every scope with one suffix ("digits_1/conv1_1"): drop it.
        suffix = re.search(r"_\d+$", parts[0])
        if suffix and parts[1].endswith(suffix.group()):
            return parts[1][: -len(suffix.group())]
        return parts[1]


def _rel_rms(q: np.ndarray, f: np.ndarray) -> float:
    diff = float(np.sqrt(np.mean((q - f) ** 2)))
    denom = float(np.sqrt(np.mean(f ** 2)))
    return diff / denom if denom else (0.0 if diff == 0 else float("inf"))


def layer_costs(quantized: Any, sibling: Any, inputs: Any) -> list[LayerCost]:
    """Every op of ``quantized`` whose output pairs with a ``sibling`` tensor, costliest first."""
    from ..formats.tflite_quant import float_intermediates
    from ._util import batch_size, rows

    n = batch_size(inputs)
    few = rows(inputs, slice(0, LAYER_ROWS)) if n and n > LAYER_ROWS else inputs
    q_tensors, q_ops = float_intermediates(quantized, few)
    f_tensors, _ = float_intermediates(sibling, few)
    error: dict[str, float] = {}
    costs = []
    for op in q_ops:
        incoming = max((error.get(name, 0.0) for name in op.inputs), default=0.0)
        for name in op.outputs:
            q, f = q_tensors.get(name), f_tensors.get(name)
            if q is None or f is None or q.shape != f.shape or not q.size:
                error[name] = incoming  # a renamed or requantised tensor carries what it received
                continue
            err = _rel_rms(q, f)
            error[name] = err
            if op.op not in _PASS_THROUGH:
                costs.append(LayerCost(name, op.op, err, err - incoming))
    return sorted(costs, key=lambda c: c.added, reverse=True)


def cost_hint(quantized: Any, sibling: Any, inputs: Any, variant: str) -> tuple[str, str, str] | None:
    """(cause, message, evidence) naming the costliest layers and how to keep them in float."""
    costs = layer_costs(quantized, sibling, inputs)
    if not costs:
        return None
    top = [c for c in costs[:SHOWN] if c.added > 0] or costs[:1]
    names = ", ".join(f"`{c.layer}` ({c.op})" for c in top)
    fix = (f"keep them in float (tf.lite.experimental.QuantizationDebugOptions(denylisted_nodes=[...their tensor "
           f"names...]) and QuantizationDebugger(...).get_nondebug_quantized_model()), quantise their weights per "
           f"channel, or calibrate on representative rows (modelparity_dataset)")
    if variant == "float16":
        fix = "a float16 file that differs from its float32 sibling beyond float16 rounding holds other weights: re-export it"
    rows_text = "\n".join(f"      {c.layer:<28} {c.op:<18} error {c.error:.3g} of its RMS (adds {c.added:+.3g})  "
                          f"[{c.tensor.split(';', 1)[0]}]" for c in costs[:max(SHOWN, 6)])
    return ("quantization_cost", f"quantisation costs the most at {names}: {fix}",
            f"each op's output in the tflite:{variant} file vs the same tensor of its float32 sibling (relative "
            f"RMS over {LAYER_ROWS} rows at most), costliest first:\n{rows_text}")

