"""The run says what it is doing: one terminal line per long step (``runtime/progress.py``).

``modelparity: exporting tflite:int8 ... 12.1 s`` is written when the step begins and its time
when it ends, where pytest shows its progress (the test's line is written again after it, as
pytest does after any line of its own), with the capture suspended for that line as pytest's
live logging does. Quiet under ``-q``, and in an xdist worker (its terminal is not shown).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from .session import STATE_KEY


class TerminalStatus:
    """A ``progress`` listener writing to pytest's terminal."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._open: str | None = None  # the step whose line is written, its time not yet
        self._prefix: Any = None  # the test file pytest's progress line was on before ours

    def _terminal(self) -> Any:
        if (self.config.getoption("verbose", 0) or 0) < 0:
            return None
        return self.config.pluginmanager.get_plugin("terminalreporter")

    @contextlib.contextmanager
    def _uncaptured(self) -> Iterator[None]:
        """The terminal for one line: out of the session log's capture when a build or export
        is under way (``quiet.LogSink.let_through``; pytest's suspend would otherwise undo the
        log's redirection, and TensorFlow's lines after it would reach the terminal), then out of
        pytest's own capture, as its live logging does."""
        from .session import get_state

        logs = get_state(self.config).logs if self.config.stash.get(STATE_KEY, None) is not None else None
        capman = self.config.pluginmanager.get_plugin("capturemanager")
        with logs.let_through() if logs is not None else contextlib.nullcontext():
            if capman is None:
                yield
                return
            with capman.global_and_fixture_disabled():
                yield

    def begin(self, what: str) -> None:
        terminal = self._terminal()
        if terminal is None:
            return
        with self._uncaptured():
            self._close_open(terminal)
            self._leave_progress(terminal)
            terminal.write(f"modelparity: {what} ...", flush=True)
        self._open = what

    def end(self, what: str, seconds: float, note: str | None) -> None:
        terminal = self._terminal()
        if terminal is None:
            return
        tail = f"{seconds:.1f} s" + (f", {note}" if note else "")
        with self._uncaptured():
            if self._open == what:  # its line is still the last one: the time goes after it
                terminal.write_line(f" {tail}")
            else:  # another line came between (a step inside it): a line of its own
                self._close_open(terminal)
                terminal.write_line(f"modelparity: {what}: {tail}")
            self._open = None
            self._back_to_progress(terminal)

    def say(self, text: str) -> None:
        terminal = self._terminal()
        if terminal is None:
            return
        with self._uncaptured():
            self._close_open(terminal)
            self._leave_progress(terminal)
            terminal.write_line(text)
            self._back_to_progress(terminal)

    def _leave_progress(self, terminal: Any) -> None:
        """End pytest's progress line (``test_a.py ..``), remembering its file."""
        if self._prefix is None and terminal.currentfspath is not None:
            self._prefix = terminal.currentfspath  # a file's Path, or under -v the test's id line
        terminal.ensure_newline()

    def _back_to_progress(self, terminal: Any) -> None:
        """Start pytest's progress line again (its file, or under -v the test's id), as pytest
        does after a line of its own."""
        prefix, self._prefix = self._prefix, None
        if prefix is not None and terminal.currentfspath is None:
            terminal.write(f"{os.path.relpath(prefix, terminal.startpath)} " if isinstance(prefix, Path) else prefix)
            terminal.currentfspath = prefix

    def _close_open(self, terminal: Any) -> None:
        if self._open is not None:  # a step still under way: end its line before another
            terminal.write_line("")
            self._open = None


def start(config: pytest.Config) -> TerminalStatus | None:
    """Listen to the steps of this session (not in an xdist worker: nobody sees its terminal)."""
    if hasattr(config, "workerinput"):
        return None
    from ..runtime import progress

    status = TerminalStatus(config)
    progress.add_listener(status)
    return status


def stop(status: TerminalStatus | None) -> None:
    if status is not None:
        from ..runtime import progress

        progress.remove_listener(status)
