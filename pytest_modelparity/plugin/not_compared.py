"""What a run was meant to compare and did not: one end-of-run line per format.

Why a module of its own: a green run must not read as "compared". Three ways a format ends a
run without a comparison while pytest's own counts look fine: its tests skipped (a runtime
missing, a form this source cannot become), it never entered the default matrix (its runtime
is missing, so no test was even made), or its candidate was the source's own file loaded a
second time (a frozen ``.pb`` as ``graphdef``: max abs 0 by construction). Each such format
gets one line naming it, who asked for it and why it was not compared; the JSON report
carries the same list, and ``--modelparity-strict`` fails the session on it. A test's format,
device, who named the format and whether its candidate was the source itself travel on its
report (``pytest_runtest_makereport``), so pytest-xdist's controller sees them too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

import pytest

from .causes import CHECKED
from .matrix import SELF_COMPARED, UNREACHABLE, exportable, item_matrix, marker_names, matrix_entries

__all__ = ["NotCompared", "self_comparison_reason", "named_by", "not_compared", "not_compared_lines",
           "as_json", "item_itself", "item_model", "self_comparison_skip"]

DEFAULT_MATRIX = "the default matrix"
REASON_CHARS = 280


@dataclass(frozen=True)
class NotCompared:
    """One format the run was meant to compare and did not."""

    format: str
    named_by: str       # "--modelparity-formats", "the marker's formats=", or DEFAULT_MATRIX
    kind: str           # "compared_with_itself", "skipped", "failed_under_strict" or "not_in_matrix"
    reason: str         # short: the skip reason, the missing runtime and its install hint...
    model: str | None = None  # the model it was not compared for (None: every model, a runtime missing)

    def line(self) -> str:
        model = f" for model {self.model!r}" if self.model else ""
        return f"modelparity: NOT COMPARED: {self.format}{model} ({self.named_by}): {self.reason}"


def self_comparison_reason(format: str, device: str, path: str) -> str:
    """The skip of a comparison whose candidate is the reference's own file on its own device."""
    return (f"modelparity: format {format!r} on {device} {SELF_COMPARED}: the candidate is the source's own file "
            f"({path}) loaded a second time, so comparing it with the reference can only pass (max abs 0) and is "
            "not a comparison; compare the formats this source converts to (docs/formats.md, \"What each source "
            "can become\"), or the same file across devices with --modelparity-reference-device")


def named_by(item: pytest.Item, options: Any) -> str | None:
    """Who chose this test's format: the option (or ini), the test's marker, or nobody (None:
    the default matrix)."""
    fmt = item_matrix(item)[0]
    if options.formats_explicit or (fmt is not None and options.format_named(fmt)):
        return "--modelparity-formats"
    if marker_names(item.get_closest_marker("modelparity"), str(fmt)):
        return "the marker's formats="
    return None


def _short(reason: str | None, format: str) -> str:
    """A skip reason without its prefixes (``Skipped: modelparity: format 'x' on cpu:``), cut short."""
    text = (reason or "skipped, no reason given").strip()
    for prefix in ("Skipped: ", "Failed: ", "modelparity: "):
        text = text.removeprefix(prefix)
    for prefix in (f"format {format!r} on ", f"format {format!r} "):
        if text.startswith(prefix):
            text = text[len(prefix):]
            if prefix.endswith("on ") and ": " in text:  # "cpu: Node.js is ..." -> "Node.js is ..."
                text = text.split(": ", 1)[1]
            break
    # the path is in the test's own skip reason (-rs); here the why: "cannot be made from this
    # source (cannot convert 'x.pb' as format 'graphdef': cannot tell ...)" -> "(cannot tell ...)"
    text = re.sub(r"cannot convert '[^']*'(?: as format '[^']*')?: ", "", text)
    text = text.removesuffix("; name the formats to test with --modelparity-formats to make this a failure")
    text = text.removesuffix(f" {STRICT_SKIP}")
    text = " ".join(text.split())
    if len(text) <= REASON_CHARS:
        return text
    # Cut the problem, never the advice: which formats did work for this model (advice.py).
    advice = _WORKED_CLAUSE.search(text)
    if advice is None or advice.start() < REASON_CHARS // 2:
        return text[:REASON_CHARS] + "..."
    clause = advice.group(0)
    return text[:max(REASON_CHARS - len(clause) - 6, REASON_CHARS // 2)] + "...; " + clause


def not_compared(matrix_outcomes: dict[str, dict], options: Any) -> list[NotCompared]:
    """The formats this run was meant to compare and did not, in the order their tests ran,
    then the default-matrix formats whose runtime is missing (they never became a test).

    ``matrix_outcomes``: node id -> {format, device, outcome, reason, named_by, itself}. A
    format counts as compared when one of its tests ran (passed, failed...) on a candidate
    that is not the source's own file."""
    from .advice import name_working_formats, with_working_clause

    by_format: dict[tuple[str | None, str], list[dict]] = {}
    for entry in matrix_entries(matrix_outcomes):
        by_format.setdefault((entry.get("model"), entry["format"]), []).append(entry)
    worked: dict[str | None, list[str]] = {}
    for (model, fmt), entries in by_format.items():
        if any(e["outcome"] in CHECKED and not e.get("itself") for e in entries):  # not an error at setup
            worked.setdefault(model, []).append(fmt)
    found = []
    for (model, fmt), entries in by_format.items():
        if any(_ran(e) and not e.get("itself") for e in entries):
            continue
        named = next((e["named_by"] for e in entries if e.get("named_by")), None) or DEFAULT_MATRIX
        itself = next((e["itself"] for e in entries if e.get("itself")), None)
        if itself is not None:
            alone = sum(e.get("itself") is not None and _ran(e) for e in entries)
            ran = f"; {alone} test(s) of that file alone ran" if alone else ""
            found.append(NotCompared(fmt, named, "compared_with_itself",
                                     f"{SELF_COMPARED}: the candidate is the source's own file ({itself}) loaded "
                                     f"again, so no comparison with the reference was made{ran}", model))
        else:
            skipped = [e for e in entries if e["outcome"] == "skipped"]
            kind = "skipped" if skipped else "failed_under_strict"
            # the formats its advice names: those that worked for this model in the whole run
            tried = [f for m, f in by_format if m == model]
            # "(the default matrix)" says who chose it: the skip's "Naming the formats ... makes this a failure" goes
            reason = str((skipped or entries)[0].get("reason") or "").split(". Naming the formats (")[0]
            # a format this model cannot become says which formats it did become in this run
            rewrite = with_working_clause if any(u in reason for u in UNREACHABLE) else name_working_formats
            reason = rewrite(reason, fmt, worked.get(model, []), tried)
            found.append(NotCompared(fmt, named, kind, _short(reason or None, fmt), model))
    if any(not e.get("named_by") for e in matrix_entries(matrix_outcomes)) and not options.formats_explicit:
        found.extend(_missing_from_default(options, {fmt for _, fmt in by_format}))
    return found


# The clause advice.name_working_formats writes: kept whole when a reason is cut short.
_WORKED_CLAUSE = re.compile(r"compare this model through [^()]* \(exported and compared for this model in this session\)"
                            r"|no format has been exported and compared for this model in this session so far"
                            r"(?: \([^()]*\))?")

# What session.unavailable appends to the skip it turns into a failure under --modelparity-strict.
STRICT_SKIP = "[--modelparity-strict turns this skip into a failure]"


def _ran(entry: dict) -> bool:
    """A test that did not skip, and did not fail in place of a skip (a missing runtime under
    --modelparity-strict). Other failures (a failed export) are shown in full by pytest and fail
    the run: they are not repeated here."""
    return entry["outcome"] != "skipped" and STRICT_SKIP not in (entry.get("reason") or "")


def _missing_from_default(options: Any, seen: Iterable[str]) -> list[NotCompared]:
    """Formats the default matrix would hold but for a missing runtime: named here, with the
    install hint, since no test of theirs ever skipped to say so."""
    from ..formats import ALL_FORMATS, missing_runtime

    found = []
    for fmt in ALL_FORMATS:
        if fmt in options.formats or fmt in seen or fmt in options.formats_removed:
            continue
        try:
            if not exportable(fmt):  # checkpoint: load-only, never in the default matrix
                continue
            missing = missing_runtime(fmt)
        except Exception:  # noqa: BLE001 - a format module that fails to import: its tests say how
            continue
        if missing is not None:
            found.append(NotCompared(fmt, DEFAULT_MATRIX, "not_in_matrix",
                                     f"not in the matrix: {_short(str(missing), fmt)}"))
    return found


def not_compared_lines(found: list[NotCompared], strict: bool) -> list[str]:
    """One line per format, then under ``--modelparity-strict`` the line that says the session fails."""
    lines = [n.line() for n in found]
    if found and strict:
        lines.append(f"modelparity: --modelparity-strict: {len(found)} format(s) not compared fail this session; "
                     "name the formats this source can become (--modelparity-formats) or install what is missing")
    return lines


def as_json(found: list[NotCompared]) -> list[dict]:
    """The report's ``not_compared`` list (docs/report-schema.md)."""
    return [{"format": n.format, "model": n.model, "named_by": n.named_by, "kind": n.kind, "reason": n.reason}
            for n in found]


def item_model(item: pytest.Item, state: Any) -> str | None:
    """The name of the model a test ran on (``Source.model_name``): its ``modelparity_source``,
    or the zero-code suite's ``--modelparity-model``; None for a test of no model, or one whose
    source never resolved."""
    funcargs = getattr(item, "funcargs", None) or {}
    if "modelparity_source" in funcargs:
        return state.model_of(funcargs["modelparity_source"])
    if getattr(item, "modelparity_matrix", None) is not None and state.options.model:
        return state.model_of(state.options.model)
    return None


def item_itself(item: pytest.Item, state: Any) -> str | None:
    """The source's path when this test's candidate is the source's own file (session.itself):
    a fixture test that asked for ``parity_candidate``, or a zero-code check."""
    fmt, device = item_matrix(item)
    if not isinstance(fmt, str) or not isinstance(device, str):
        return None
    funcargs = getattr(item, "funcargs", None) or {}
    if "parity_candidate" in funcargs:
        source = funcargs.get("modelparity_source")
    elif getattr(item, "modelparity_matrix", None) is not None:  # the zero-code suite's items
        source = state.options.model
    else:
        return None
    return state.candidate_itself(source, fmt, device)


def self_comparison_skip(item: pytest.Item, state: Any) -> str | None:
    """The skip reason of a test that compares the candidate with the reference (it takes
    ``parity_reference`` itself) when the candidate is the reference's own file: its pass would
    compare nothing. A test of the candidate alone (``assert_deterministic(parity_candidate,
    parity_batch)``) still runs: the file's own behaviour is worth checking."""
    info = getattr(item, "_fixtureinfo", None)
    asked: Iterable[str] = getattr(info, "argnames", None) or getattr(item, "fixturenames", None) or ()
    if "parity_reference" not in asked:
        return None
    itself = item_itself(item, state)
    if itself is None:
        return None
    fmt, device = item_matrix(item)
    return self_comparison_reason(str(fmt), str(device), itself)
