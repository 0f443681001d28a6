"""Who hears what the models of a comparison answered: the inputs, each side's outputs and the
reference's measured floor (``--modelparity-record`` writes them, ``--modelparity-against``
compares them with a recording). ``reports/recording.py`` publishes verdicts; this publishes
the arrays behind them, only while someone listens (nothing is kept otherwise).
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["listening", "ran", "unwatch", "watch"]

# fn(model, inputs, outputs, floor): model is the LoadedModel that answered (candidate or
# reference), floor the reference's measured floor ({path: {kind: error}}) or None.
Watcher = Callable[[Any, Any, Any, Any], None]
_WATCHERS: list[Watcher] = []


def watch(fn: Watcher) -> None:
    _WATCHERS.append(fn)


def unwatch(fn: Watcher) -> None:
    if fn in _WATCHERS:
        _WATCHERS.remove(fn)


def listening() -> bool:
    return bool(_WATCHERS)


def ran(models: tuple[Any, Any], inputs: Any, outputs: tuple[Any, Any], floor: Any = None) -> None:
    """Tell every watcher what (candidate, reference) answered on ``inputs``; a watcher that
    fails is the watcher's problem (it says so itself), never the comparison's."""
    from ..reports.recording import is_muted

    if not _WATCHERS or inputs is None or is_muted():  # a warm-up run is recorded nowhere
        return
    for model, out in zip(models, outputs):
        if model is None or out is None:
            continue
        for fn in list(_WATCHERS):
            fn(model, inputs, out, floor)
