"""What produced a recording: the model's content hash, the form, the device and its name, the
library versions (TensorFlow, converters, LiteRT, onnxruntime, tfjs) and the browser.

Why: a recording compared weeks later, or on another machine, is only evidence when it says
what made it; ``--modelparity-against`` refuses to compare a model whose hash changed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["content_hash", "device_name", "file_hash", "form_of", "produced_by"]

# Distributions whose versions decide what a form computes (name in the manifest -> dist).
_DISTRIBUTIONS = {"numpy": ("numpy",), "tensorflow": ("tensorflow", "tensorflow-cpu", "tf-nightly"), "keras": ("keras",), "tf2onnx": ("tf2onnx",),
                  "tensorflowjs": ("tensorflowjs",), "ai_edge_litert": ("ai-edge-litert",),
                  "onnxruntime": ("onnxruntime", "onnxruntime-gpu"), "onnx": ("onnx",)}


def _version(dists: tuple[str, ...]) -> str | None:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def file_hash(path: Path) -> str:
    """``sha256:...`` of a model file, or of a folder's files (names and bytes)."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink()) if path.is_dir() else [path]
    for f in files:
        h.update(f"{f.relative_to(path).as_posix() if path.is_dir() else f.name}\0".encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return "sha256:" + h.hexdigest()


def content_hash(model: Any) -> str | None:
    """``sha256:...`` of what the model is: a Keras model's weights (dtype, shape, bytes) and
    layer classes (not their names, which Keras numbers per process), a model file's bytes
    (a folder's files), or None when neither can be read."""
    inner = getattr(model, "inner", model)  # a bound view: its own model
    keras_model = getattr(inner, "keras_model", None) or (inner if hasattr(inner, "get_weights") else None)
    if keras_model is not None and callable(getattr(keras_model, "get_weights", None)):
        h = hashlib.sha256(b"keras weights 1\0")
        for w in keras_model.get_weights():
            arr = np.ascontiguousarray(np.asarray(w))
            h.update(f"{arr.dtype.str}{arr.shape}".encode())
            h.update(arr.tobytes())
        for layer in getattr(keras_model, "layers", []):
            h.update(type(layer).__name__.encode())
        return "sha256:" + h.hexdigest()
    source = getattr(inner, "source", None)
    if isinstance(source, (str, Path)) and Path(source).exists():
        return file_hash(Path(source))
    return None


def device_name(device: str) -> str | None:
    """The device's own name: the GPU's (when TensorFlow is loaded and sees it), else the CPU's."""
    if device.lower().startswith(("gpu", "cuda")) and "tensorflow" in sys.modules:
        try:
            tf = sys.modules["tensorflow"]
            index = int(device.split(":")[1]) if ":" in device else 0
            gpus = tf.config.list_physical_devices("GPU")
            details = tf.config.experimental.get_device_details(gpus[index]) if index < len(gpus) else {}
            return str(details.get("device_name")) or None
        except Exception:  # noqa: BLE001 - a name is a courtesy, never a failure
            return None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def form_of(model: Any) -> dict[str, Any]:
    """Format, variant, device and its name, and the form's own file of a loaded model."""
    fmt = str(getattr(model, "format", None) or "keras")
    variant = getattr(model, "format_variant", None)
    device = str(getattr(model, "device", None) or "cpu")
    source = getattr(model, "source", None)
    form: dict[str, Any] = {"format": fmt, "variant": str(variant) if variant else fmt, "device": device,
                            "device_name": device_name(device),
                            "file": os.path.basename(str(source)) if source else None}
    browser = getattr(model, "browser", None)
    if isinstance(browser, dict):
        form["browser"] = {k: v for k, v in browser.items() if v is not None}
    return form


def produced_by(model: Any = None) -> dict[str, Any]:
    """Python, platform and the versions of every library that could have computed the outputs."""
    out: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(terse=True)}
    for key, dists in _DISTRIBUTIONS.items():
        version = _version(dists)
        if version is not None:
            out[key] = version
    tfjs = getattr(model, "tfjs_version", None) if model is not None else None
    if isinstance(tfjs, str) and tfjs != "?":
        out["tfjs"] = tfjs
    if model is not None and "tensorflow" in sys.modules and str(getattr(model, "device", "")).startswith("gpu"):
        try:
            out["tf32"] = bool(sys.modules["tensorflow"].config.experimental.tensor_float_32_execution_enabled())
        except Exception:  # noqa: BLE001
            pass
    return out
