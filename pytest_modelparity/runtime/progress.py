"""Long steps said as they happen: an export, Node.js starting, a fuzz run's tallies.

Why here, at the bottom: the steps happen in every layer above (``formats`` starts Node.js,
``plugin`` exports), and the one that listens (the plugin's terminal line) sits at the top. A
step with no listener costs a ``time.monotonic()`` and a list lookup; nothing is printed
outside a pytest run that listens.

The listener added last (the innermost pytest session) gets ``begin(what)`` when a step starts and ``end(what, seconds, note)`` when it
ends (``note``: what the step found, e.g. ``"from the export cache"``, or the error's type when
it failed), and ``say(text)`` for a line that is no step (a fuzz run's every-30-s tallies).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

__all__ = ["Listener", "Step", "add_listener", "listen", "remove_listener", "say", "step"]


class Listener(Protocol):
    def begin(self, what: str) -> None: ...

    def end(self, what: str, seconds: float, note: str | None) -> None: ...

    def say(self, text: str) -> None: ...


_listeners: list[Listener] = []
_lock = threading.Lock()


class Step:
    """A step under way; set ``note`` to say what it found (shown after its time)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.note: str | None = None


def add_listener(listener: Listener) -> None:
    """Tell ``listener`` of every step from now on (the plugin: at configure)."""
    with _lock:
        _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


@contextlib.contextmanager
def listen(listener: Listener) -> Iterator[None]:
    """Tell ``listener`` of every step while the block runs."""
    add_listener(listener)
    try:
        yield
    finally:
        remove_listener(listener)


def _each(call: str, *args: Any) -> None:
    """Tell the listener added last: a pytest session run inside another (pytester) is the one
    whose steps these are, and the outer one's terminal must not hear them."""
    with _lock:
        listener = _listeners[-1] if _listeners else None
    if listener is None:
        return
    try:
        getattr(listener, call)(*args)
    except Exception:  # noqa: BLE001 - a status line must never fail the step it tells of
        pass


@contextlib.contextmanager
def step(what: str) -> Iterator[Step]:
    """``what`` (``"exporting tflite:int8"``) begins; its listeners hear how long it took."""
    current = Step(what)
    if not _listeners:  # nobody listens: no clock, no lock
        yield current
        return
    _each("begin", what)
    start = time.monotonic()
    try:
        yield current
    except BaseException as exc:
        _each("end", what, time.monotonic() - start, current.note or f"failed ({type(exc).__name__})")
        raise
    _each("end", what, time.monotonic() - start, current.note)


def say(text: str) -> None:
    """One line that is no step (a fuzz run's tallies), for whoever listens."""
    if _listeners:
        _each("say", text)
