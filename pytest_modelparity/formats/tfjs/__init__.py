"""TensorFlow.js graph models, the format ``tfjs``: the Node.js loader (``load.py``), the
browser loader (``browser.py``: ``tfjs:webgl``, ``tfjs:webgl-f16``, ``tfjs:webgpu``), the export
through the tensorflowjs converter (``export.py``), the graph rewrites around the converter's
defects (``rewrite.py``) and the runner's error classifier (``errors.py``). This package is the
format's entry in the registry."""

from .export import (CONVERTS_SAVED_MODEL, EXPORT_REQUIRES, EXPORT_VALIDATES, TFJS_CONVERTER_INSTALL, export,
                     validate)
from .load import BACKENDS, NAME, TFJSModel, detect, load

__all__ = ["BACKENDS", "CONVERTS_SAVED_MODEL", "EXPORT_REQUIRES", "EXPORT_VALIDATES", "NAME", "TFJSModel",
           "TFJS_CONVERTER_INSTALL", "detect", "export", "load", "validate"]
