"""What the plugin's own test suite costs (issue 49): README command 2, or the test files given,
under a fresh export cache, and the wall time and CPU seconds (user + sys) of the whole process
tree: pytest, its xdist workers, their export workers, Node.js, Chromium, child sessions.

```
.venv/bin/python bench/suite_cost.py                                  # README command 2
.venv/bin/python bench/suite_cost.py tests/test_power.py tests/test_fuzz_run.py
.venv/bin/python bench/suite_cost.py --top 25                         # and the costliest files
.venv/bin/python bench/suite_cost.py --top 25 --per-process /tmp/ledger.jsonl  # and by process and test
```

The CPU seconds are ``resource.getrusage(RUSAGE_CHILDREN)`` of this process after pytest has
exited: every descendant that was waited for (an orphan reparented to init is not counted; the
suite leaves none). The export cache is a new temporary folder (``MODELPARITY_CACHE_DIR``), as on
a fresh clone; the tfjs runner's npm modules are linked from the installed ones so that the run
measures the suite, not ``npm ci`` (``--no-node-modules`` leaves them out). ``--top N`` runs with
``--durations=0`` and prints the N test files that took the most time (setup + call + teardown
of their tests, summed per file: wall seconds in a worker, not CPU). ``--per-process LEDGER``
adds ``bench/suite_cost_probe`` to the run: every Python writes its own CPU to LEDGER at exit
(by process kind: xdist worker, export worker, child pytest, other; with TensorFlow or not), and
every test the CPU its xdist worker's own process spent on it, summed per test and per file.
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


def print_ledger(ledger: Path, top: int) -> None:
    """The ledger's CPU by process kind, and the tests whose child Pythons cost most."""
    import json

    lines = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
    rows = [row for row in lines if row.get("kind") != "test"]
    tests = [row for row in lines if row.get("kind") == "test"]
    kinds: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    by_test: collections.Counter = collections.Counter()
    for row in rows:
        argv = " ".join(row["argv"])
        kind = ("pytest controller" if not row["started_in"] and not row["worker"] and "pytest" in argv
                else "xdist worker" if not row["started_in"] and row["worker"] and row["argv"][:1] == ["-c"]
                else "export worker" if "exports.worker" in argv or "exports/worker" in argv
                else "child pytest" if "pytest" in argv
                else "other python")
        kind += " (TensorFlow)" if row["tensorflow"] else ""
        kinds[kind] += row["cpu"]
        count[kind] += 1
        if row["started_in"]:
            by_test[row["started_in"].rsplit(" (", 1)[0]] += row["cpu"]
    print(f"{len(rows)} Python processes wrote to the ledger:")
    for kind, cpu in kinds.most_common():
        print(f"  {cpu:8.1f} CPU-s  {count[kind]:5d}  {kind}")
    print(f"the {top} tests whose child Pythons cost most (own CPU of Pythons started during the test):")
    for test, cpu in by_test.most_common(top):
        print(f"  {cpu:8.1f} CPU-s  {test}")
    if tests:
        own: collections.Counter = collections.Counter({t["nodeid"]: t["self_cpu"] for t in tests})
        files: collections.Counter = collections.Counter()
        for test in tests:
            files[test["nodeid"].split("::", 1)[0]] += test["self_cpu"]
        print(f"in the xdist workers' own processes: {sum(own.values()):.1f} CPU-s over {len(tests)} tests "
              f"(setup + call + teardown, in-process pytester sessions included, children not); "
              f"the {top} costliest files and tests:")
        for name, cpu in files.most_common(top):
            print(f"  {cpu:8.1f} CPU-s  {name}")
        for name, cpu in own.most_common(top):
            print(f"  {cpu:8.1f} CPU-s  {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="test files (default: the whole suite, README command 2)")
    parser.add_argument("--top", type=int, default=0, help="print the N costliest test files (--durations=0)")
    parser.add_argument("--no-node-modules", action="store_true", help="do not link the installed npm modules")
    parser.add_argument("--log", type=Path, help="write pytest's output here")
    parser.add_argument("--per-process", type=Path, metavar="LEDGER",
                        help="every Python of the run appends a JSON line to LEDGER at its exit, and "
                             "every test one with its own process's CPU (bench/suite_cost_probe); then the "
                             "CPU is summed by process kind, by test and by file")
    args = parser.parse_args(argv)

    cache = Path(tempfile.mkdtemp(prefix="suite-cost-cache-"))
    env = dict(os.environ, MODELPARITY_CACHE_DIR=str(cache))
    if not args.no_node_modules:
        sys.path.insert(0, str(ROOT))
        from pytest_modelparity.runtime.tfjs_runner import cache_root

        installed = cache_root() / "tfjs-node-modules"
        if installed.is_dir():
            (cache / "tfjs-node-modules").symlink_to(installed, target_is_directory=True)
    if args.per_process:
        args.per_process.unlink(missing_ok=True)
        probe = str(ROOT / "bench" / "suite_cost_probe")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (probe, env.get("PYTHONPATH", "")) if p)
        env["MODELPARITY_SUITE_LEDGER"] = str(args.per_process.resolve())
    command = [sys.executable, *README_COMMAND_2, *(["--durations=0"] if args.top else []),
               *(["-p", "suite_cost_tests"] if args.per_process else []), *args.files]
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
    if args.per_process:
        print_ledger(args.per_process, args.top or 25)
    print(f"wall {wall:.0f} s, CPU {user + system:.0f} s (user {user:.0f} + sys {system:.0f}) of the process tree")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
