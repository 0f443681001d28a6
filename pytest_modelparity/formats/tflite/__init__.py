"""TFLite, the format ``tflite``: the file (``load.py``: the LiteRT interpreter; ``export.py``:
TensorFlow's converter, with its float16, dynamic-range and int8 variants) and readings of a
quantised file (``quant.py``). This package is the format's entry in the registry."""

from .export import CONVERTS_SAVED_MODEL, EXPORT_REQUIRES, EXPORT_VALIDATES, QUANTIZATIONS, export, validate
from .load import NAME, TFLiteModel, detect, load

__all__ = ["CONVERTS_SAVED_MODEL", "EXPORT_REQUIRES", "EXPORT_VALIDATES", "NAME", "QUANTIZATIONS", "TFLiteModel",
           "detect", "export", "load", "validate"]
