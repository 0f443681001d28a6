"""A plain ``@given`` test with the plugin's models and Hypothesis' default settings, run beside
busy loops (issue 49): how many of N child sessions pass, and how long their examples took.

Each repeat: a fresh pytest session in a child process (a tiny MLP, saved_model and tflite,
15 examples, the profile's 200 ms deadline and health checks as a user who never read about
the ``modelparity`` profile leaves them), with ``--loops`` processes spinning beside it. Before
issue 49 this read "Unreliable test timings" (779 ms first example at load 16); with the
warm-up alone it still failed at load 8 (a 294 ms example, a 3.4 s draw).

Run:  .venv/bin/python bench/given_under_load.py [--repeats 10] [--loops 4]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_given_under_load import CONFTEST  # noqa: E402  (the same tiny MLP as the suite's test)

GIVEN = textwrap.dedent('''
    from hypothesis import given, settings, strategies as st
    from pytest_modelparity import assert_outputs_close, strategies

    @settings(max_examples=15)  # the default deadline (200 ms) and health checks
    @given(data=st.data())
    def test_random_batches(parity_candidate, parity_reference, data):
        batch = data.draw(strategies.batches(parity_reference, batch_size=st.integers(1, 8)))
        assert_outputs_close(parity_candidate, parity_reference, inputs=batch)
''')


def session_under_load(files: dict[str, str], options: list[str], loops: int) -> tuple[subprocess.CompletedProcess,
                                                                                     float]:
    """Run ``pytest OPTIONS`` in a fresh folder holding ``files``, with ``loops`` busy-looping
    processes beside it (started before, killed after): the child's result and its wall seconds."""
    with tempfile.TemporaryDirectory(prefix="under-load-") as tmp:
        folder = Path(tmp)
        for name, text in files.items():
            (folder / name).write_text(text)
        spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(loops)]
        start = time.perf_counter()
        env = {k: v for k, v in os.environ.items() if k not in ("CI", "BUILD_NUMBER")}
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   f"--modelparity-cache-dir={folder / 'cache'}", *options],
                                  cwd=folder, env=env, capture_output=True, text=True, timeout=900)
        finally:
            for p in spinning:
                p.kill()
            for p in spinning:
                p.wait()
        return proc, time.perf_counter() - start


def repeat_under_load(files: dict[str, str], options: list[str], describe: Any) -> None:
    """``--repeats`` sessions of ``files`` beside ``--loops`` busy loops (the command line's): a
    PASS or FAIL line each, ``describe(stdout, passed)`` added to it, then the count passed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--loops", type=int, default=4)
    args = parser.parse_args()
    passed = 0
    for i in range(args.repeats):
        proc, took = session_under_load(files, options, args.loops)
        ok = proc.returncode == 0 and "2 passed" in proc.stdout
        passed += ok
        print(f"repeat {i + 1}: {'PASS' if ok else 'FAIL'} in {took:.0f} s, load {os.getloadavg()[0]:.1f}"
              f"{describe(proc.stdout, ok)}", flush=True)
    print(f"{passed}/{args.repeats} passed with {args.loops} busy loops beside them")


def main() -> None:
    def describe(out: str, ok: bool) -> str:
        why = "" if ok else " | " + "; ".join(sorted(set(re.findall(
            r"(DeadlineExceeded|FailedHealthCheck|Unreliable test timings|FlakyFailure|Error)", out))))
        calls = re.findall(r"([\d.]+)s call\s+test_given.py::test_random_batches\[(\w+)-cpu\]", out)
        return f", calls {', '.join(f'{f} {s} s' for s, f in calls)}{why}"

    repeat_under_load({"conftest.py": CONFTEST, "test_given.py": GIVEN},
                      ["--modelparity-formats=tflite,saved_model", "--durations=0"], describe)

if __name__ == "__main__":
    main()
