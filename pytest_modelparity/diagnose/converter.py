"""Does a failing candidate carry an op its converter is known to get wrong?

Why: a defect of the converter (not of the model, nor of this plugin) makes a correct model
differ after conversion, and the layer table can only say *where*. A format module records
the known-defective ops it finds in a loaded model as ``LoadedModel.converter_defects``:
``[(op, node names, problem, fix)]`` (tfjs: ``formats/tfjs/rewrite.KNOWN_DEFECTS``).
"""

from __future__ import annotations

from typing import Any


def converter_defect(candidate: Any) -> tuple[str, str, str] | None:
    """(cause, message, evidence) naming the known converter defects in ``candidate``'s graph."""
    defects = getattr(candidate, "converter_defects", None)
    if not defects:
        return None
    messages, evidence = [], []
    for op, nodes, problem, fix in defects:
        messages.append(f"{problem}; fix: {fix}")
        shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        evidence.append(f"{len(nodes)} {op} node(s) in the {getattr(candidate, 'format', '?')} graph: {shown}")
    return "converter_defect", "; ".join(messages), "; ".join(evidence)
