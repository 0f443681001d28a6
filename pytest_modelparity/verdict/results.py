"""What a comparison found: one ``OutputComparison`` per output inside a ``ComparisonReport``,
and their one JSON form (``to_dict``), which the summary, the JSON report and HTML all read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .formatting import json_number, json_value
from .tolerances import Tolerance

__all__ = ["ComparisonReport", "OutputComparison"]


@dataclass
class OutputComparison:
    """The verdict and statistics for one output (one leaf of the structure)."""

    path: str
    passed: bool
    actual_shape: tuple | None = None
    expected_shape: tuple | None = None
    actual_dtype: str | None = None
    expected_dtype: str | None = None
    problem: str | None = None
    notes: list[str] = field(default_factory=list)
    tolerance: Tolerance | None = None
    size: int = 0
    mismatched: int = 0
    max_abs: float | None = None
    max_abs_index: tuple | None = None
    max_rel: float | None = None
    max_rel_index: tuple | None = None
    max_abs_allowed: float | None = None   # the bound at max_abs_index (beside it in the text)
    max_rel_allowed: float | None = None   # the bound at max_rel_index, as a relative value
    mean_abs: float | None = None
    max_ulp: float | None = None
    min_atol: float | None = None
    min_rtol: float | None = None
    scale: float | None = None
    worst: list[tuple[tuple, float, float]] = field(default_factory=list)
    top1_agreement: float | None = None
    top1_rows: int | None = None           # rows judged for top-1 (the reference's argmax is clear)
    top1_near_ties: int = 0                # rows left out: reference top-1 margin within the bound
    vacuous: bool = False                  # the bound reached the output's own magnitude
    error_histogram: tuple[list[int], list[float]] | None = None
    # A decision over rows (a quantised budget): what it counted and the threshold applied
    # ({"unit", "trials", "observed", "allowed", "needed", ...}), and why it could not
    # decide (too few rows to fail a file outside the budget): not a pass, not a failure.
    decision: dict | None = None
    inconclusive: str | None = None
    # The bulk of the error (``verdict/bulk.py``): each statistic, its bound and the noise figure
    # it came from; and, when one does not hold, what failed in words.
    bulk: list[dict] | None = None
    bulk_failure: str | None = None

    @property
    def mismatched_fraction(self) -> float:
        return self.mismatched / self.size if self.size else 0.0

    def to_dict(self) -> dict:
        """JSON-serialisable form; non-finite floats become the strings "inf"/"-inf"/"nan"."""
        tol = self.tolerance
        return {
            "path": self.path,
            "passed": self.passed,
            "actual_shape": _listify(self.actual_shape),
            "expected_shape": _listify(self.expected_shape),
            "actual_dtype": self.actual_dtype,
            "expected_dtype": self.expected_dtype,
            "problem": self.problem,
            "notes": list(self.notes),
            "tolerance": None if tol is None else {
                "rule": tol.rule, "rtol": json_number(tol.rtol), "atol": json_number(tol.atol),
                "scale": json_number(tol.scale), "min_top1": json_number(tol.min_top1),
                "max_mismatch_fraction": json_number(tol.max_mismatch_fraction),
                "source": tol.source, "text": tol.describe(), "floor_note": tol.floor_note,
                "bulk": [b.to_dict() for b in tol.bulk],
            },
            "size": self.size,
            "mismatched": self.mismatched,
            "mismatched_fraction": self.mismatched_fraction,
            "max_abs": json_number(self.max_abs), "max_abs_index": _listify(self.max_abs_index),
            "max_rel": json_number(self.max_rel), "max_rel_index": _listify(self.max_rel_index),
            "max_abs_allowed": json_number(self.max_abs_allowed),
            "max_rel_allowed": json_number(self.max_rel_allowed),
            "mean_abs": json_number(self.mean_abs),
            "max_ulp": json_number(self.max_ulp),
            "min_atol": json_number(self.min_atol),
            "min_rtol": json_number(self.min_rtol),
            "scale": json_number(self.scale),
            "worst": [{"index": list(i), "actual": json_number(a), "expected": json_number(e)}
                      for i, a, e in self.worst],
            "top1_agreement": json_number(self.top1_agreement),
            "top1_rows": self.top1_rows,
            "top1_near_ties": self.top1_near_ties,
            "vacuous": self.vacuous,
            "decision": None if self.decision is None else json_value(self.decision),
            "bulk": None if self.bulk is None else json_value({"statistics": self.bulk, "failure": self.bulk_failure}),
            "inconclusive": self.inconclusive,
            "error_histogram": None if self.error_histogram is None else {
                "counts": list(self.error_histogram[0]),
                "log10_edges": [json_number(x) for x in self.error_histogram[1]],
            },
        }


@dataclass
class ComparisonReport:
    """All outputs of one comparison; ``str()`` is the failure text (failure_text.format_report)."""

    outputs: list[OutputComparison]
    title: str = "outputs"
    hints: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def failed(self) -> list[OutputComparison]:
        return [o for o in self.outputs if not o.passed]

    @property
    def inconclusive(self) -> list[OutputComparison]:
        """Outputs whose decision had too few rows to fail a file outside its budget: the
        report is not a pass (``passed`` only says nothing failed); see ``decision``."""
        return [o for o in self.outputs if o.inconclusive]

    def to_dict(self) -> dict:
        return {
            "title": self.title,
            "passed": self.passed,
            "inconclusive": [o.path for o in self.inconclusive],
            "outputs": [o.to_dict() for o in self.outputs],
            "hints": [_hint_dict(h) for h in self.hints],
            "meta": json_value(self.meta),
        }

    def __str__(self) -> str:
        from .failure_text import format_report

        return format_report(self)


def _listify(t: tuple | None) -> list | None:
    return None if t is None else [int(v) for v in t]


def _hint_dict(h: Any) -> dict:
    keys = ("cause", "message", "evidence")
    return {k: str(getattr(h, k)) for k in keys if hasattr(h, k)} or {"message": str(h)}
