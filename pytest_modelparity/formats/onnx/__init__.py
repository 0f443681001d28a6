"""ONNX, the format ``onnx``: the file run by onnxruntime (``load.py``) and made by tf2onnx
(``export.py``). This package is the format's entry in the registry."""

from .export import CONVERTS_SAVED_MODEL, DEFAULT_OPSET, EXPORT_REQUIRES, EXPORT_VALIDATES, export, validate
from .load import NAME, ONNXModel, detect, load, providers_for

__all__ = ["CONVERTS_SAVED_MODEL", "DEFAULT_OPSET", "EXPORT_REQUIRES", "EXPORT_VALIDATES", "NAME", "ONNXModel",
           "detect", "export", "load", "providers_for", "validate"]
