"""Advice a session has already seen fail is not given again.

An export error's fix may send the user to another variant of the format ("compare
tflite:dynamic_range instead"). When the session already tried that variant and it failed,
the advice is dropped and the fix says so: "tflite:dynamic_range failed the same way in this
session" (the same problem, variant names aside), or "failed in this session too" with its
problem; where it failed for ops no TFLite kernel has, no other variant is advised either.
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

# "compare tflite:dynamic_range instead", "compare tflite:dynamic_range or tflite:float16 for
# this model (both convert and run)": the clauses formats/tflite/export.py writes.
_CLAUSE = re.compile(r"(?P<lead>,? or |; or |; )?compare (?P<names>tflite:\w+(?: or tflite:\w+)*) "
                     r"(?:instead|for this model)(?: \([^)]*\))?")
_VARIANT = re.compile(r"\b(float32|float16|dynamic_range|int8)\b")


def problem_of(exc: BaseException) -> str:
    """What went wrong, without the path, the fix and the log (``str(exc)``'s first line else)."""
    problem = getattr(exc, "problem", None)
    if isinstance(problem, str):
        return problem
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def same_way(one: BaseException, other: BaseException) -> bool:
    """Whether two export failures are the same problem, the variant names aside."""
    return _VARIANT.sub("*", problem_of(one)) == _VARIANT.sub("*", problem_of(other))


def without_failed_advice(exc: BaseException, format: str, failures: Mapping[str, BaseException]) -> BaseException:
    """``exc`` (an export error of ``format``) with its fix rewritten, in place, where it names
    a variant in ``failures`` (format -> the error it failed with in this session)."""
    fix = getattr(exc, "fix", None)
    match = _CLAUSE.search(fix) if isinstance(fix, str) else None
    if match is None:
        return exc
    assert isinstance(fix, str)
    names = match.group("names").split(" or ")
    failed = [n for n in names if n != format and n in failures]
    if not failed:
        return exc
    notes = []
    for name in failed:
        other = failures[name]
        if same_way(exc, other):
            notes.append(f"{name} failed the same way in this session")
        else:
            shown = problem_of(other)
            notes.append(f"{name} failed in this session too: {shown[:200]}{'...' if len(shown) > 200 else ''}")
    # A kernel no variant has (the converter's unsupported ops) fails the variants not tried too.
    missing = sorted({op for n in failed for op in getattr(failures[n], "unsupported_ops", ())})
    kept = [] if missing else [n for n in names if n not in failed]
    if missing:
        notes.append(f"no tflite variant has {', '.join(missing)}")
    before, after = fix[:match.start()], fix[match.end():]
    if kept:
        clause = f"{match.group('lead') or ''}compare {' or '.join(kept)} instead ({'; '.join(notes)})"
        new = before + clause + after
    else:
        rest = (before + after).strip(" ;,")
        new = f"{rest or 'compare this model through saved_model'} ({'; '.join(notes)})"
    _set_fix(exc, fix, new)
    return exc


def _set_fix(exc: Any, old: str, new: str) -> None:
    exc.fix = new
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (exc.args[0].replace(f"\n  fix: {old}", f"\n  fix: {new}", 1), *exc.args[1:])
