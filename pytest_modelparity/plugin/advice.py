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


# -- advice that names formats: only those that worked for this model ------------------

# The format names a fix may send the user to (ALL_FORMATS, spelled here: no import of formats/).
_FORMAT = r"(?:keras|h5|saved_model|checkpoint|graphdef|tflite|onnx|tfjs)(?::\w+)?"
_LIST = rf"{_FORMAT}(?:(?:, | or | and |, or ){_FORMAT})*"
_PAREN = r"(?: \((?:[^()]|\([^()]*\))*\))?"
# "compare this model through saved_model or tflite (both carry lookup tables)", "compare it through
# saved_model, onnx or tfjs", "test this model as keras or saved_model (they keep the tables; ...)",
# "test the string model in formats keras and saved_model (...)", "test this model in the other
# formats", and this module's own wording (so a fix rewritten early is rewritten again at the end).
_ADVICE = re.compile(
    rf"(?:compare (?:this model|it) through|test (?:this|the string) model (?:as|in formats|in)) (?P<list>{_LIST})"
    rf"(?P<paren>{_PAREN})"
    r"|test this model in the other formats"
    r"|no format has been exported and compared for this model in this session(?: so far)?"
    r"(?: \((?P<said>(?:[^()]|\([^()]*\))*)\))?")
# What without_failed_advice wrote in a clause's parentheses: kept, it says what failed here.
_FAILED_NOTE = re.compile(r"failed the same way in this session|failed in this session too|no tflite variant has")
WORKED_NOTE = "exported and compared for this model in this session"


def name_working_formats(text: str, format: str, worked: list[str], tried: list[str] | None = None) -> str:
    """``text`` (a fix) with every clause that sends the user to other formats naming only
    ``worked``: the formats exported and compared for this model in this session (``format``
    itself left out), or saying that none has been. Why: the tflite fix said "use onnx" while
    onnx's said "use tflite" for the same model (issue 50): advice is a format that worked here,
    never one this session has not seen work."""
    others = [f for f in dict.fromkeys(worked) if f != format]
    seen = set(tried or ()) | set(worked) | {format}
    done = False

    def one(match: re.Match) -> str:
        nonlocal done
        if done:  # one such clause says it; a second would repeat it
            return ""
        done = True
        paren = (match.group("paren") or "").strip()[1:-1]
        if match.group("said") is not None:  # this function's own words: the failures they kept
            paren = re.sub(r"^[\w:, ]*? not tried here(?:; |$)", "", match.group("said"))
        paren = paren.removeprefix(WORKED_NOTE).removeprefix("; ")
        notes = [paren] if _FAILED_NOTE.search(paren) else []  # what failed here, said by without_failed_advice
        if others:
            return f"compare this model through {' or '.join(others)} ({'; '.join([WORKED_NOTE, *notes])})"
        # none worked: the formats the clause named that this session never tried, said as such
        # (a format tried here that failed is never advised)
        said = match.group("said")
        if said is not None:  # this function's own words, from an earlier rewrite: kept as they were
            return match.group(0)
        untried = [f for f in dict.fromkeys(re.findall(_FORMAT, match.group("list") or "")) if f not in seen]
        notes = ([f"{' and '.join(untried)} not tried here"] if untried else []) + notes
        return ("no format has been exported and compared for this model in this session so far"
                + (f" ({'; '.join(notes)})" if notes else ""))

    new = _ADVICE.sub(one, text)
    return re.sub(r"(?:; |, or |, | or )(?=$|[;,.)])", "", new) if new != text else text


def with_working_formats(exc: BaseException, format: str, worked: list[str],
                         tried: list[str] | None = None) -> BaseException:
    """``exc`` with its fix rewritten in place by ``name_working_formats`` (the message too)."""
    fix = getattr(exc, "fix", None)
    if not isinstance(fix, str):
        return exc
    new = name_working_formats(fix, format, worked, tried)
    if new != fix:
        _set_fix(exc, fix, new)
    return exc


def with_working_clause(text: str, format: str, worked: list[str], tried: list[str] | None = None) -> str:
    """``name_working_formats(text, ...)``, with the clause added where ``text`` names no other
    format at all (Keras' HDF5 refusal says "save this model as .keras"): a NOT COMPARED line
    says which formats did work for the model."""
    if _ADVICE.search(text):
        return name_working_formats(text, format, worked, tried)
    return name_working_formats(f"{text.rstrip('. ')}; test this model in the other formats", format, worked, tried)
