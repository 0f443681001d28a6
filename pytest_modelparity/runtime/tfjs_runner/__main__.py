"""``python -m pytest_modelparity.tfjs_runner install``: install tfjs's npm packages ahead of time.

Also ``path`` (print the node_modules directory, installed or not) and ``check`` (exit 1 when
not installed). Useful in CI images and on machines without network at test time.
"""

from __future__ import annotations

import argparse
import sys

from ...errors import RuntimeMissing
from . import ensure_node_modules, is_installed, modules_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_modelparity.tfjs_runner",
                                     description="Manage the Node.js packages of the tfjs format.")
    parser.add_argument("command", choices=("install", "path", "check"))
    args = parser.parse_args(argv)
    if args.command == "path":
        print(modules_dir() / "node_modules")
        return 0
    if args.command == "check":
        ok = is_installed()
        print(("installed: " if ok else "not installed: ") + str(modules_dir() / "node_modules"))
        return 0 if ok else 1
    try:
        path = ensure_node_modules()
    except RuntimeMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
