"""Per-process ledger for ``bench/suite_cost.py --per-process``: every Python of the run appends
one JSON line at its exit (its own CPU seconds, its waited-for children's, whether it imported
TensorFlow, the test that was running when it started), so the suite's cost can be read by
process kind and by test. On the run's ``PYTHONPATH`` only; a process ended by a signal or
``os._exit`` writes nothing, nor does a child whose ``PYTHONPATH`` a test replaced (as
tests/test_gpu_check.py does): the process tree's total still counts them, so the ledger's sum
is below it (2026-12-04: 1,474 of 1,707 CPU-s)."""

import atexit
import json
import os
import resource
import sys
import time

_LEDGER = os.environ.get("MODELPARITY_SUITE_LEDGER")
_STARTED_IN = os.environ.get("PYTEST_CURRENT_TEST", "")
_START = time.monotonic()


def _write() -> None:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = {
        "pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv[:6],
        "worker": os.environ.get("PYTEST_XDIST_WORKER", ""), "started_in": _STARTED_IN,
        "ended_in": os.environ.get("PYTEST_CURRENT_TEST", ""),
        "tensorflow": "tensorflow" in sys.modules, "wall": time.monotonic() - _START,
        "cpu": own.ru_utime + own.ru_stime, "children_cpu": kids.ru_utime + kids.ru_stime,
    }
    with open(_LEDGER, "a") as out:
        out.write(json.dumps(line) + "\n")


if _LEDGER:
    atexit.register(_write)
