"""What the plugin's own test suite costs (issue 49): README command 2, or the test files given,
under a fresh export cache, and the wall time and CPU seconds (user + sys) of the whole process
tree: pytest, its xdist workers, their export workers, Node.js, Chromium, child sessions.

```
.venv/bin/python bench/suite_cost.py                                  # README command 2
.venv/bin/python bench/suite_cost.py tests/test_power.py tests/test_fuzz_run.py
.venv/bin/python bench/suite_cost.py --top 25                         # and the costliest files
```

The CPU seconds are ``resource.getrusage(RUSAGE_CHILDREN)`` of this process after pytest has
exited: every descendant that was waited for (an orphan reparented to init is not counted; the
suite leaves none). The export cache is a new temporary folder (``MODELPARITY_CACHE_DIR``), as on
a fresh clone; the tfjs runner's npm modules are linked from the installed ones so that the run
measures the suite, not ``npm ci`` (``--no-node-modules`` leaves them out). ``--top N`` runs with
``--durations=0`` and prints the N test files that took the most time (setup + call + teardown
of their tests, summed per file: wall seconds in a worker, not CPU).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_COMMAND_2 = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile"]
DURATION = re.compile(r"^\s*([\d.]+)s (?:setup|call|teardown)\s+(\S+?)::")


def per_file(text: str) -> list[tuple[str, float]]:
    """``--durations=0`` lines summed by test file, the costliest first."""
    total: collections.Counter = collections.Counter()
    for line in text.splitlines():
        found = DURATION.match(line)
        if found:
            total[found.group(2)] += float(found.group(1))
    return total.most_common()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="test files (default: the whole suite, README command 2)")
    parser.add_argument("--top", type=int, default=0, help="print the N costliest test files (--durations=0)")
    parser.add_argument("--no-node-modules", action="store_true", help="do not link the installed npm modules")
    parser.add_argument("--log", type=Path, help="write pytest's output here")
    args = parser.parse_args(argv)

    cache = Path(tempfile.mkdtemp(prefix="suite-cost-cache-"))
    env = dict(os.environ, MODELPARITY_CACHE_DIR=str(cache))
    if not args.no_node_modules:
        sys.path.insert(0, str(ROOT))
        from pytest_modelparity.runtime.tfjs_runner import cache_root

        installed = cache_root() / "tfjs-node-modules"
        if installed.is_dir():
            (cache / "tfjs-node-modules").symlink_to(installed, target_is_directory=True)
    command = [sys.executable, *README_COMMAND_2, *(["--durations=0"] if args.top else []), *args.files]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finally:
        wall = time.monotonic() - start
        shutil.rmtree(cache, ignore_errors=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    if args.log:
        args.log.write_text(done.stdout)
    tail = [ln for ln in done.stdout.splitlines() if ln.strip()][-1:] or ["(no output)"]
    print(f"command: {' '.join(['python', *command[1:]])}")
    print(f"pytest: {tail[0]} (exit status {done.returncode})")
    if args.top:
        files = per_file(done.stdout)
        spent = sum(s for _, s in files) or 1.0
        print(f"the {min(args.top, len(files))} costliest of {len(files)} files (test time summed per file, "
              f"{spent:.0f} s in all):")
        for name, seconds in files[:args.top]:
            print(f"  {seconds:8.1f} s  {100 * seconds / spent:5.1f}%  {name}")
    print(f"wall {wall:.0f} s, CPU {user + system:.0f} s (user {user:.0f} + sys {system:.0f}) of the process tree")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
