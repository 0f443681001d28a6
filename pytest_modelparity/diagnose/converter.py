"""Does a failing candidate carry an op its converter is known to get wrong?

Why: a defect of the converter (not of the model, nor of this plugin) makes a correct model
differ after conversion, and the layer table can only say *where*. Two sources: the format
module's record of known-defective ops in a loaded model (``LoadedModel.converter_defects``:
``[(op, node names, problem, fix)]``; tfjs: ``formats/tfjs/rewrite.KNOWN_DEFECTS``), and the op
the candidate runs *instead* of what the model wrote, read from its graph (``op_types()``):
the fused ops below were found by generated models (``fuzz/known_defects.py``).
"""

from __future__ import annotations

from typing import Any

# (format, op the converter substituted) -> (problem, fix)
SUBSTITUTED_OPS = {
    ("tflite", "L2_NORMALIZATION"): (
        "the TFLite converter fused x / sqrt(sum(x^2) + eps) (or x * rsqrt(...)) into L2_NORMALIZATION, whose "
        "kernel divides by max(norm, 1e-6) whatever eps the model used: rows of small norm come out wrong "
        "(known: tflite-l2-normalization-eps)",
        "an eps of 1e-3 or more is not fused (measured on TF 2.21); or compare such a model through "
        "saved_model or onnx"),
    ("tfjs", "LeakyRelu"): (
        "the tfjs graph runs LeakyRelu: tensorflowjs remaps maximum(a * x, x) to LeakyRelu(alpha=a), which is right "
        "only for a <= 1; if the model computes such a maximum with a > 1 (or maximum(x + x, x)), this is the "
        "cause (known: tfjs-maximum-as-leakyrelu)",
        "write the maximum so the remap does not match (e.g. keras.ops.where(x > 0, a * x, x) for a > 1)"),
}


def _substituted(candidate: Any) -> list[tuple[str, list[str], str, str]]:
    fmt = str(getattr(candidate, "format", "")).split(":")[0]
    op_types = getattr(candidate, "op_types", None)
    wanted = {op: text for (f, op), text in SUBSTITUTED_OPS.items() if f == fmt}
    if not wanted or op_types is None:
        return []
    found: dict[str, list[str]] = {}
    for name, op in op_types():
        if op in wanted:
            found.setdefault(op, []).append(name)
    return [(op, names, *wanted[op]) for op, names in found.items()]


def converter_defect(candidate: Any) -> tuple[str, str, str] | None:
    """(cause, message, evidence) naming the known converter defects in ``candidate``'s graph."""
    defects = list(getattr(candidate, "converter_defects", None) or []) + _substituted(candidate)
    if not defects:
        return None
    messages, evidence = [], []
    for op, nodes, problem, fix in defects:
        messages.append(f"{problem}; fix: {fix}")
        shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        evidence.append(f"{len(nodes)} {op} node(s) in the {getattr(candidate, 'format', '?')} graph: {shown}")
    return "converter_defect", "; ".join(messages), "; ".join(evidence)
