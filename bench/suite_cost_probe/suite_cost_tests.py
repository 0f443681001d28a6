"""pytest plugin for ``bench/suite_cost.py --per-process``: each test of the measured run
appends a JSON line to the ledger with the CPU its own process spent on it (setup, call and
teardown: in-process pytester sessions included, child processes not), so the in-process half
of the suite's cost can be read per test and per file. Loaded with ``-p suite_cost_tests`` on
the run's command line only (xdist forwards it to its workers; pytester sessions do not get it)."""

from __future__ import annotations

import json
import os
import resource
from typing import Any

import pytest

_LEDGER = os.environ.get("MODELPARITY_SUITE_LEDGER")


def _cpu() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Any:
    own, kids = _cpu()
    yield
    if _LEDGER:
        own_after, kids_after = _cpu()
        line = {"kind": "test", "nodeid": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
                "self_cpu": own_after - own, "children_cpu": kids_after - kids}
        with open(_LEDGER, "a") as out:
            out.write(json.dumps(line) + "\n")
