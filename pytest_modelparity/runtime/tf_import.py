"""Importing TensorFlow: once, with its logging turned down, and the install hint when it is missing.

Why here, under the formats: ``devices`` places work on TensorFlow devices and must import it
the same quiet way the formats do, without importing the formats (they sit above it).

After the first import, the objects alive then are moved out of the garbage collector's sight
(``gc.freeze``): TensorFlow and Keras leave about 300,000 tracked objects that live as long as
the process, and every full collection walked them all again, 0.2-0.3 s each (1.1 s of a 5 s
session on a small net, 0.5 s of it pytest's own two collections at its exit). Frozen objects
are still freed by reference counting; only a reference cycle among them is never collected, so
a model that a conftest built before the plugin's first model load, and that is dropped later,
is kept (docs/performance.md). Objects made after that moment are collected as always.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from typing import Any

from ..errors import RuntimeMissing

__all__ = ["TF_INSTALL", "import_keras", "import_tf"]

# The packages themselves, not `pip install 'pytest-modelparity[x]'`: the plugin is not on PyPI,
# so that command fails unless pip is pointed at a checkout, git URL or wheel (README).
TF_INSTALL = "pip install tensorflow-cpu (or any TensorFlow >= 2.16 build; the plugin's [tensorflow] extra)"

_TF: Any = None


def import_tf() -> Any:
    """``import tensorflow`` once, with its C++ and Python logging turned down."""
    global _TF
    if _TF is None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        try:
            import tensorflow as tf
        except ImportError as exc:
            from .resources import memory_hint

            hint = memory_hint(exc)
            if hint is not None:  # installed, but its libraries do not fit an address-space limit
                raise ImportError(f"TensorFlow could not be imported: {hint}") from exc
            raise RuntimeMissing("tensorflow", TF_INSTALL) from exc  # pragma: no cover - depends on the install
        tf.get_logger().setLevel(logging.ERROR)
        logging.getLogger("absl").setLevel(logging.ERROR)
        _TF = tf
        gc.freeze()
    return _TF


def import_keras() -> Any:
    """``import keras`` after TensorFlow (quiet, as above); its objects frozen like TensorFlow's."""
    import_tf()
    ours = "keras" not in sys.modules
    import keras

    if ours:
        gc.freeze()
    return keras
