"""``python -m pytest_modelparity.tfjs_runner``: the public command, kept at its first path."""

from __future__ import annotations

import sys

from ..runtime.tfjs_runner.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
