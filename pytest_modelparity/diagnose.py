"""Why two results differ (placeholder until the diagnosis work lands).

CONTRACT (assertions.py calls these; each returns a list of ``Hint``, empty when no check
applies; none may raise):

    diagnose_comparison(report, *, actual, expected, actual_model=None, expected_model=None,
                        inputs=None) -> list[Hint]
    diagnose_nondeterminism(report, *, model, inputs, runs) -> list[Hint]
    diagnose_batch_variance(report, *, model, inputs, batched, split) -> list[Hint]
    localize_divergence(reference, candidate, inputs) -> list[LayerDiff]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Hint:
    cause: str      # short machine-readable name, e.g. "random_ops", "double_softmax"
    message: str    # one line for the "Likely cause" section
    evidence: str   # what was measured that supports it


def diagnose_comparison(report: Any, **context: Any) -> list[Hint]:
    return []


def diagnose_nondeterminism(report: Any, **context: Any) -> list[Hint]:
    return []


def diagnose_batch_variance(report: Any, **context: Any) -> list[Hint]:
    return []


def localize_divergence(reference: Any, candidate: Any, inputs: Any) -> list[Any]:
    raise NotImplementedError("localize_divergence lands with the diagnosis work")
