"""A Node.js runner killed between two tests, on a busy machine (issue 49): how many of N child
sessions pass.

Each repeat: a fresh pytest session in a child process (a tiny MLP exported to tfjs), with
``--loops`` processes spinning beside it. Its first test compares the tfjs form and then
SIGKILLs the form's Node.js process, as the OOM killer would, without waiting for the death to
show; its second test compares again at once. Before issue 49 the second failed at load 16
(``NodeProcessDied: ... killed by signal SIGKILL while Python waited for its answer``: the kill
was still in flight when the next call wrote its request). The deterministic form of that race
is in the suite (tests/test_formats_tfjs.py, ``before_request``).

Run:  .venv/bin/python bench/node_kill_under_load.py [--repeats 10] [--loops 4]
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from given_under_load import repeat_under_load  # noqa: E402
from test_given_under_load import CONFTEST  # noqa: E402  (the suite's tiny MLP)

TESTS = textwrap.dedent('''
    import os
    import signal

    import numpy as np
    from pytest_modelparity import assert_outputs_close

    def test_compare_then_kill_node(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
        os.kill(parity_candidate.process.pid, signal.SIGKILL)  # not waited for

    def test_compare_again(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
''')


def main() -> None:
    repeat_under_load({"conftest.py": CONFTEST, "test_kill.py": TESTS}, ["--modelparity-formats=tfjs"],
                      lambda out, ok: "" if ok else " | " + out.strip().splitlines()[-1][:300])

if __name__ == "__main__":
    main()
