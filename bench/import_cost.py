"""CPU seconds a fresh Python spends importing a module (default ``tensorflow``), median of N
runs, for the installed packages and for variants put ahead of them on ``PYTHONPATH``.

Every child session, export worker and helper Python of the suite pays TensorFlow's import
(issue 49), so a package that makes it dearer costs the suite once per process. The variants
run alternately with the baseline in the same loop, so machine load hits them alike:

    .venv/bin/python bench/import_cost.py --runs 7
    pip install --no-deps --target /tmp/mld07 ml_dtypes==0.7.0
    .venv/bin/python bench/import_cost.py --runs 7 --variant ml_dtypes-0.7.0=/tmp/mld07
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys


def cost(module: str, pythonpath: str) -> tuple[float, str]:
    """One fresh Python importing ``module``: (CPU seconds of user + sys, ml_dtypes' version)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH", "")) if p)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", f"import {module}, sys; "
                           "m = sys.modules.get('ml_dtypes'); print(getattr(m, '__version__', '-'))"],
                          env=env, capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return spent, done.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", default="tensorflow")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=PATH",
                        help="a folder put first on PYTHONPATH (a package installed with --target)")
    args = parser.parse_args(argv)
    variants = [("installed", "")] + [tuple(v.split("=", 1)) for v in args.variant]  # type: ignore[misc]
    spent: dict[str, list[float]] = {name: [] for name, _ in variants}
    versions: dict[str, str] = {}
    cost(args.module, "")  # a first run warms the page cache and the bytecode
    for _ in range(args.runs):
        for name, path in variants:
            seconds, versions[name] = cost(args.module, path)
            spent[name].append(seconds)
    base = statistics.median(spent["installed"])
    print(f"import {args.module}: median CPU seconds (user + sys) of {args.runs} fresh Pythons each")
    for name, _ in variants:
        median = statistics.median(spent[name])
        print(f"  {name:24s} ml_dtypes {versions[name]:8s} {median:6.2f} s  x{median / base:.2f}  "
              f"(runs: {', '.join(f'{s:.2f}' for s in spent[name])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
