"""Devices: ``"cpu"``, ``"gpu"``, ``"gpu:1"`` -> TensorFlow device scopes and ONNX providers.

Why a module of its own: every format, the plugin (which turns a missing GPU into a skip)
and the tolerances (GPU float32 may run with TF32) need the same parsing and the same
"is it really there" check. TensorFlow and onnxruntime are imported only when asked.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any, Iterator

from ..errors import DeviceUnavailable, RuntimeMissing

__all__ = ["DeviceSpec", "parse_device", "tf_available", "require_tf_device", "tf_device_scope",
           "tf_device_name", "onnx_providers", "require_cpu_only", "available_devices", "set_tf32",
           "tf32_enabled", "CPU_ONLY_FORMATS", "runs_on", "missing_gpu"]

# Formats whose runtime runs on the CPU only here (LiteRT has no desktop GPU delegate; tfjs runs
# in Node.js with the cpu/wasm backends): a GPU device is not a configuration of theirs.
CPU_ONLY_FORMATS = ("tflite", "tfjs")

_DEVICE_RE = re.compile(r"^\s*(?:/?device:)?(cpu|gpu)(?:\s*:\s*(\d+))?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class DeviceSpec:
    """A device asked for by name: ``kind`` is "cpu" or "gpu", ``index`` None means the first."""

    kind: str
    index: int | None = None

    @property
    def ordinal(self) -> int:
        return 0 if self.index is None else self.index

    @property
    def tf_name(self) -> str:
        """The TensorFlow device string, e.g. ``/device:GPU:1``."""
        return f"/device:{self.kind.upper()}:{self.ordinal}"

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


def parse_device(device: str | DeviceSpec) -> DeviceSpec:
    """Parse ``"cpu"``, ``"gpu"``, ``"gpu:1"`` (case-insensitive; ``"/device:GPU:0"`` too)."""
    if isinstance(device, DeviceSpec):
        return device
    if not isinstance(device, str):
        raise ValueError(f"device must be a string such as 'cpu', 'gpu' or 'gpu:1', not {type(device).__name__}")
    match = _DEVICE_RE.match(device)
    if match is None:
        raise ValueError(f"unknown device {device!r}; use 'cpu', 'gpu' or 'gpu:N' (e.g. 'gpu:1')")
    kind, index = match.group(1).lower(), match.group(2)
    return DeviceSpec(kind, None if index is None else int(index))


def tf_device_name(device: str | DeviceSpec) -> str:
    return parse_device(device).tf_name


def _tf_devices(kind: str) -> list[Any]:
    from .tf_import import import_tf

    tf = import_tf()
    # Physical devices for GPUs (what the hardware has); logical ones for CPUs, because a CPU
    # can be split into several logical devices (that is how placement is tested without a GPU).
    if kind == "gpu":
        return list(tf.config.list_physical_devices("GPU"))
    return list(tf.config.list_logical_devices("CPU"))


def tf_available(device: str | DeviceSpec) -> bool:
    """Whether TensorFlow can run on ``device`` here (imports TensorFlow)."""
    spec = parse_device(device)
    return spec.ordinal < len(_tf_devices(spec.kind))


def require_tf_device(device: str | DeviceSpec, *, format: str | None = None) -> DeviceSpec:
    """Return the parsed device, or raise ``DeviceUnavailable`` saying what exists instead."""
    spec = parse_device(device)
    found = _tf_devices(spec.kind)
    if spec.ordinal < len(found):
        return spec
    what = f" for format {format!r}" if format else ""
    if spec.kind == "gpu" and not found:
        raise DeviceUnavailable(
            f"device {str(spec)!r} was asked{what} but TensorFlow sees no GPU on this machine "
            "(tf.config.list_physical_devices('GPU') is empty). Run on a machine with a CUDA GPU "
            "and a GPU build of TensorFlow (pip install 'tensorflow[and-cuda]'; tensorflow-cpu has "
            "no GPU support), or use device='cpu'.")
    raise DeviceUnavailable(
        f"device {str(spec)!r} was asked{what} but TensorFlow sees only {len(found)} "
        f"{spec.kind.upper()} device(s) (indices 0..{len(found) - 1}); use one of those.")


@contextlib.contextmanager
def tf_device_scope(device: str | DeviceSpec) -> Iterator[DeviceSpec]:
    """``with tf.device(...)`` for a checked device; raises ``DeviceUnavailable`` first."""
    from .tf_import import import_tf

    spec = require_tf_device(device)
    with import_tf().device(spec.tf_name):
        yield spec


def onnx_providers(device: str | DeviceSpec, available: list[str] | None = None, *,
                   tf32: bool | None = None) -> list[Any]:
    """onnxruntime ``providers=`` for ``device``: CUDA (with ``device_id``) then CPU for a GPU.

    ``available`` defaults to ``onnxruntime.get_available_providers()``; raises
    ``DeviceUnavailable`` when a GPU is asked and no CUDA provider is installed. ``tf32=False``
    (default: the session's ``set_tf32``) adds ``use_tf32=0`` to the CUDA options.
    """
    spec = parse_device(device)
    if available is None:
        import onnxruntime

        available = list(onnxruntime.get_available_providers())
    if spec.kind == "cpu":
        if spec.ordinal != 0:
            raise DeviceUnavailable(f"device {str(spec)!r}: onnxruntime has one CPU device; use 'cpu'")
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in available:
        raise DeviceUnavailable(
            f"device {str(spec)!r} was asked for format 'onnx' but onnxruntime has no "
            f"CUDAExecutionProvider (available: {', '.join(available) or 'none'}). Install "
            "onnxruntime-gpu on a machine with a CUDA GPU, or use device='cpu'.")
    options: dict[str, Any] = {"device_id": spec.ordinal}
    if not (tf32_enabled() if tf32 is None else tf32):
        options["use_tf32"] = "0"
    return [("CUDAExecutionProvider", options), "CPUExecutionProvider"]


def require_cpu_only(device: str | DeviceSpec, format: str, why: str, fix: str) -> DeviceSpec:
    """For runtimes that only run on the CPU here (``CPU_ONLY_FORMATS``): accept cpu, refuse
    any other device with the runtime's reason (``why``) and what to do instead (``fix``)."""
    spec = parse_device(device)
    if spec.kind != "cpu" or spec.ordinal != 0:
        raise DeviceUnavailable(
            f"format {format!r} runs on the CPU only in pytest-modelparity: {why}, so "
            f"device={str(spec)!r} cannot be honoured. {fix}")
    return spec


def available_devices() -> tuple[str, ...]:
    """``("cpu",)`` plus ``"gpu"``, ``"gpu:1"``... for each GPU TensorFlow sees (imports TF)."""
    gpus = _tf_devices("gpu")
    return ("cpu",) + tuple("gpu" if i == 0 else f"gpu:{i}" for i in range(len(gpus)))


def missing_gpu(device: str | DeviceSpec = "gpu") -> str | None:
    """Why GPU ``device`` is missing on this machine for every runtime, or None when
    TensorFlow sees it or onnxruntime has a CUDA provider (imports both when installed)."""
    spec = parse_device(device)
    if spec.kind != "gpu":
        return None
    try:
        seen = len(_tf_devices("gpu"))
        tf_why = (f"TensorFlow sees {seen} GPU(s) (indices 0..{seen - 1})" if seen else
                  "TensorFlow sees no GPU (tf.config.list_physical_devices('GPU') is empty)")
    except RuntimeMissing:
        seen, tf_why = 0, "TensorFlow is not installed"
    if spec.ordinal < seen:
        return None
    try:
        import onnxruntime

        providers = list(onnxruntime.get_available_providers())
    except ImportError:
        providers = []
    if "CUDAExecutionProvider" in providers:
        return None
    ort_why = ("onnxruntime has no CUDAExecutionProvider" if providers else "onnxruntime is not installed")
    return (f"device {str(spec)!r} is not on this machine: {tf_why}, and {ort_why}. Run on a machine "
            "with a CUDA GPU, a GPU build of TensorFlow (pip install 'tensorflow[and-cuda]') and "
            "onnxruntime-gpu")


def runs_on(format: str, device: str | DeviceSpec) -> bool:
    """Whether ``format`` (``"tflite:int8"`` counts as tflite) can run on ``device`` at all."""
    base = format.partition(":")[0]
    return base not in CPU_ONLY_FORMATS or parse_device(device).kind == "cpu"


# -- TensorFloat-32 ----------------------------------------------------------------------
# TensorFlow's switch is process-wide; onnxruntime's is a CUDA provider option, so the choice
# is remembered here for the sessions created after it.
_TF32 = {"enabled": True}


def tf32_enabled() -> bool:
    """The TF32 choice made with ``set_tf32`` (True, TensorFlow's default, until then)."""
    return _TF32["enabled"]


def set_tf32(enabled: bool) -> bool:
    """Turn TensorFloat-32 on or off for float32 matmul/conv on GPUs, for the whole process;
    return the setting it replaced (to restore it).

    Imports TensorFlow and calls ``tf.config.experimental.enable_tensor_float_32_execution``
    (which also makes XLA use full float32 precision); onnxruntime sessions created afterwards
    get ``use_tf32=0`` on their CUDA provider. Without TensorFlow installed only the latter.
    """
    previous = _TF32["enabled"]
    _TF32["enabled"] = bool(enabled)
    try:
        from .tf_import import import_tf

        tf = import_tf()
    except RuntimeMissing:
        return previous
    previous = bool(tf.config.experimental.tensor_float_32_execution_enabled())
    tf.config.experimental.enable_tensor_float_32_execution(bool(enabled))
    return previous
