"""One-time work done before a property test's examples: each form's first run (an
interpreter's allocation, a function's trace) and the reference's twins, so the first example
costs what the others do and Hypothesis' deadline judges the check, not the set-up (issue 49)."""

from __future__ import annotations

import weakref
from typing import Any

from ..runtime import progress

_WARM: "weakref.WeakSet[Any]" = weakref.WeakSet()  # models that ran once already


def warm(reference: Any, candidates: list[Any], row: Any) -> None:
    """Run every model not yet warm once on ``row`` (one row of the batch) and build the
    reference's twins; each step is said once per model, never again."""
    from ..floor import measure

    for model in [m for m in (reference, *candidates) if m is not None]:
        try:
            if model in _WARM:
                continue
        except TypeError:  # not weak-referenceable: warmed each time (cheap after the first)
            pass
        with progress.step(f"warming {getattr(model, 'format', 'the model')} on one row"):
            model.predict(row)
        try:
            _WARM.add(model)
        except TypeError:
            pass
    if reference is not None and not measure.twins_built(reference, measure.FLOAT64):
        with progress.step("building the reference's twin before the examples"):
            measure.warm_twins(reference, row)
    if reference is not None:
        for candidate in candidates:  # the comparison's own first-call work, its report heard by nobody
            try:
                done = _COMPARED.setdefault(candidate, weakref.WeakSet())
                if reference in done:
                    continue
                done.add(reference)
            except TypeError:  # not weak-referenceable: compared each time (cheap after the first)
                pass
            _silent_comparison(candidate, reference, row)


# candidate -> the references it was compared with silently (weak: an id of a collected model
# could be reused by a new one, which would then never be warmed)
_COMPARED: "weakref.WeakKeyDictionary[Any, weakref.WeakSet[Any]]" = weakref.WeakKeyDictionary()


def _silent_comparison(candidate: Any, reference: Any, row: Any) -> None:
    from ..reports.recording import muted
    from .assertions import assert_outputs_close

    for rows in (row, {k: v.repeat(2, axis=0) for k, v in row.items()}):  # two batch sizes: shapes settle
        try:
            with muted():
                assert_outputs_close(candidate, reference, inputs=rows)
        except Exception:  # noqa: BLE001 - the test itself judges and says why
            return
