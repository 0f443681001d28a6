"""Drawn models checked in a child process that is replaced every few hundred models.

Why: a fuzz run loads hundreds of converters' outputs, interpreters and traced graphs in one
process; what TensorFlow and the runtimes keep per model grew the process by 0.3-0.85 MB a
model over 200 models (docs/fuzzing.md), and a converter that aborts (a C++ CHECK) would take
the pytest session down with it. In a child, the growth ends with the child
(a new child every ``MODELS_PER_CHILD`` models), and a child that dies or hangs costs that model one ``error``
outcome per format, never the session. The child's stdout and stderr (TensorFlow's and the
converters' log flood) go to a log file, not the terminal.

A draw that varies a user's own Keras model (``DrawnModel.base``) cannot be sent to a child
(a live model is not picklable): it is checked in this process, as before.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Sequence

from .fuzzing import Outcome, check_model

__all__ = ["FuzzWorker", "MODELS_PER_CHILD"]

# A new child after this many models: 200 x 0.3-0.85 MB is 60-170 MB at most, and a child's
# start (importing TensorFlow, ~5 s) is then ~1% of the 200 models' ~400 s.
MODELS_PER_CHILD = 200
# One model through three converters takes a median 2 s (tfjs the slowest, ~2.3 s); a model
# still running after this long is hung, not slow.
MODEL_TIMEOUT_S = 600.0


def _quiet(log_path: str, env: dict[str, str] | None = None) -> None:
    """In the child: its fds 1 and 2 go to the log (TensorFlow writes to them from C++), and
    ``env`` is set before anything imports TensorFlow (which reads TF_ENABLE_ONEDNN_OPTS once)."""
    os.environ.update(env or {})
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the child
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def _check_in_child(drawn: Any, formats: Sequence[str],
                    workdir: str | None) -> tuple[list[Outcome], float, int, dict[str, object]]:
    """``check_model`` in the child, with the child's resident memory after it (MB), pid and the
    conditions it ran under (``conditions_here``, TensorFlow's own word on oneDNN by then)."""
    from .conditions import conditions_here

    outcomes = check_model(drawn, formats, workdir=workdir)
    return outcomes, _rss_mb(), os.getpid(), conditions_here()


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return float("nan")


class FuzzWorker:
    """``check(drawn, formats)`` in a child process, replaced every ``models_per_child`` models,
    after a crash, or after a model that ran past ``timeout_s``."""

    def __init__(self, log_path: str | Path, *, models_per_child: int = MODELS_PER_CHILD,
                 timeout_s: float = MODEL_TIMEOUT_S, env: dict[str, str] | None = None) -> None:
        self.log_path = str(log_path)
        self.env = dict(env or {})         # set in each child before TensorFlow is imported
        self.conditions: dict[str, object] | None = None  # what the last model ran under
        self.models_per_child = models_per_child
        self.timeout_s = timeout_s
        self.children: set[int] = set()    # the pids of the children that checked a model
        self.rss_mb: float | None = None   # the child's resident memory after its last model
        self._pool: ProcessPoolExecutor | None = None
        self._models_in_child = 0

    def check(self, drawn: Any, formats: Sequence[str], *, workdir: str | Path | None = None) -> list[Outcome]:
        if getattr(drawn, "base", None) is not None:
            from .conditions import conditions_here

            outcomes = check_model(drawn, formats, workdir=workdir)
            self.conditions = conditions_here()
            return outcomes
        if self._models_in_child >= self.models_per_child:
            self._stop()       # what the child grew by ends with it
        pool = self._pool or self._start()
        self._models_in_child += 1
        future = pool.submit(_check_in_child, drawn, list(formats), None if workdir is None else str(workdir))
        try:
            outcomes, self.rss_mb, pid, self.conditions = future.result(timeout=self.timeout_s)
            self.children.add(pid)
            return outcomes
        except BrokenProcessPool:
            why = f"the process checking it died (a converter or runtime crashed; its output is in {self.log_path})"
        except FutureTimeout:
            why = f"the check ran past {self.timeout_s:.0f} s and its process was stopped"
        self._stop(kill=True)
        return [Outcome(fmt, "error", why, why) for fmt in formats]

    def _start(self) -> ProcessPoolExecutor:
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_quiet, initargs=(self.log_path, self.env))
        self._models_in_child = 0
        return self._pool

    def _stop(self, *, kill: bool = False) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if kill:  # a hung child never returns: shutdown(wait=True) would wait for it
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.kill()
        pool.shutdown(wait=not kill, cancel_futures=True)

    def close(self) -> None:
        self._stop()

    def __enter__(self) -> FuzzWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
