"""``python -m pytest_modelparity.tfjs_runner install``: install tfjs's npm packages ahead of time.

Also ``path`` (print the node_modules directory, installed or not) and ``check`` (exit 1 when
not installed or damaged, saying what is wrong; ``install`` repairs a damaged install). Useful in CI images and on machines without network at test time.
"""

from __future__ import annotations

import argparse
import sys

from ...errors import RuntimeMissing
from . import damage, ensure_node_modules, modules_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_modelparity.tfjs_runner",
                                     description="Manage the Node.js packages of the tfjs format.")
    parser.add_argument("command", choices=("install", "path", "check"))
    args = parser.parse_args(argv)
    if args.command == "path":
        print(modules_dir() / "node_modules")
        return 0
    if args.command == "check":
        problems = damage()
        print(("installed: " if not problems else "not installed: ") + str(modules_dir() / "node_modules"))
        for problem in problems:  # a damaged install: what is wrong with it (`install` repairs it)
            print(f"  {problem}")
        return 0 if not problems else 1
    try:
        path = ensure_node_modules()
    except RuntimeMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
