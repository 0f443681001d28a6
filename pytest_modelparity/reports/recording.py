"""A tiny publish/subscribe point so the plugin can collect every comparison report.

The assertions call :func:`emit` with each report they produce (pass or fail); the pytest
plugin subscribes while a test runs to build its summary table and JSON/HTML reports. This
keeps ``checks/assertions.py`` free of any pytest knowledge.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

Listener = Callable[[str, Any], None]
_listeners: list[Listener] = []
_muted = [0]


@contextlib.contextmanager
def muted() -> Iterator[None]:
    """No report reaches a listener inside: a warm-up comparison is no test's verdict."""
    _muted[0] += 1
    try:
        yield
    finally:
        _muted[0] -= 1


def subscribe(listener: Listener) -> None:
    _listeners.append(listener)


def unsubscribe(listener: Listener) -> None:
    try:
        _listeners.remove(listener)
    except ValueError:
        pass


def emit(kind: str, report: Any) -> None:
    """Hand ``report`` (a ComparisonReport) from check ``kind`` to every listener.

    ``kind`` is the name of the assertion: ``outputs_close``, ``deterministic`` or
    ``batch_invariant``. A listener's exception is not allowed to mask the check.
    """
    if _muted[0]:
        return
    for listener in list(_listeners):
        try:
            listener(kind, report)
        except Exception:  # noqa: BLE001 - reporting must never break a test
            pass


def is_muted() -> bool:
    return bool(_muted[0])


def listening() -> bool:
    """Whether anyone collects reports (the plugin does during a test): assertions then ask
    ``compare(full_stats=True)`` so passing rows carry max rel / ULP / histogram too."""
    return bool(_listeners)
