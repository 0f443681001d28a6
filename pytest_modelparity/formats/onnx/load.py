"""ONNX: load a ``.onnx`` file with onnxruntime (CPU, or CUDA when asked and present).

Loading needs only ``onnxruntime``; the ``onnx`` package, when installed, adds the
diagnosis hooks ``weights()`` (initializers) and ``op_types()``. External data is read from
the model file's folder only (``external.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import DeviceUnavailable, ModelLoadError
from ..base import LoadedModel, TensorSpec
from ..common import first_line, read_model_bytes
from .external import check_external_data, folder_options, ort_external_error

if TYPE_CHECKING:  # imported lazily at run time: onnx is optional
    import onnx
    import onnxruntime

NAME = "onnx"

_ORT_TYPES = {
    "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
    "tensor(bfloat16)": "float32", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
    "tensor(int16)": "int16", "tensor(uint16)": "uint16", "tensor(int32)": "int32",
    "tensor(uint32)": "uint32", "tensor(int64)": "int64", "tensor(uint64)": "uint64",
    "tensor(bool)": "bool", "tensor(string)": "object",
}


def detect(path: Path) -> bool:
    """A ``.onnx`` file."""
    return path.suffix.lower() == ".onnx" and not path.is_dir()


# -- devices ---------------------------------------------------------------------------
def providers_for(device: str) -> tuple[str, list[Any]]:
    """Normalised device name and the onnxruntime providers that honour it.

    ``cpu`` -> CPUExecutionProvider; ``gpu``/``gpu:N`` -> CUDAExecutionProvider on device N
    (CPU kept as fallback for ops CUDA lacks). No CUDA provider -> DeviceUnavailable; an
    unknown device name -> ValueError.
    """
    from ...runtime.devices import onnx_providers, parse_device

    spec = parse_device(device)
    return str(spec), onnx_providers(spec)


# -- loading ---------------------------------------------------------------------------
def _check_magic(path: Path, content: bytes) -> None:
    # An ONNX ModelProto is a protobuf; its first field is normally ir_version (tag 0x08).
    # Text, HTML or a TFLite file are caught here; anything else is left to onnxruntime.
    if content[4:8] == b"TFL3":
        raise ModelLoadError(path, NAME, "this is a TFLite FlatBuffer, not an ONNX model",
                             "load it with format='tflite' (or give it a .tflite suffix)")
    if content[:1] in (b"{", b"<", b"#") or content[:4] == b"PK\x03\x04":
        raise ModelLoadError(path, NAME, f"not an ONNX protobuf (starts with {content[:16]!r})",
                             "pass a file written by tf2onnx / torch.onnx / export_model(model, 'onnx', path)")


def load(source: Any, *, device: str = "cpu", session_options: Any = None, **options: Any) -> "ONNXModel":
    """Load ``source`` (a ``.onnx`` path) in an onnxruntime ``InferenceSession`` on ``device``."""
    if options:
        raise TypeError(f"unknown option(s) for format 'onnx': {', '.join(sorted(options))}; "
                        "known: session_options")
    import onnxruntime as ort

    device, providers = providers_for(device)
    path, content = read_model_bytes(source, NAME, ".onnx", _check_magic)
    uses_external = check_external_data(path, content)  # refuses locations outside the model's folder
    session_options = folder_options(path, session_options, uses_external)
    try:
        session = ort.InferenceSession(content, sess_options=session_options, providers=providers)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own untyped errors
        refused = ort_external_error(path, exc)
        if refused is not None:
            raise refused from exc
        raise ModelLoadError(
            path, NAME, f"onnxruntime cannot load the model: {first_line(exc)} (file size {len(content)} bytes)",
            "the file is corrupt, truncated or uses an opset/operator this onnxruntime lacks: re-export it "
            "(export_model(model, 'onnx', path)) or upgrade onnxruntime") from exc
    if device.startswith("gpu") and session.get_providers()[0] != "CUDAExecutionProvider":
        # onnxruntime falls back to CPU silently when the CUDA libraries fail to load.
        raise DeviceUnavailable(
            f"onnxruntime could not start its CUDA provider for {str(path)!r} (session runs on "
            f"{session.get_providers()}); check CUDA/cuDNN versions against onnxruntime-gpu's, or use device='cpu'")
    return ONNXModel(session, content, path=path, device=device, session_options=session_options)


def ort_spec(arg: Any) -> TensorSpec:
    shape = tuple(d if isinstance(d, int) and d >= 0 else None for d in (arg.shape or ()))
    return TensorSpec(arg.name, shape, np.dtype(_ORT_TYPES.get(arg.type, "float32")))


class ONNXModel(LoadedModel):
    """An ONNX model in an onnxruntime session; ``native`` is the ``InferenceSession``."""

    format = NAME

    def __init__(self, session: Any, content: bytes, *, path: Path | None, device: str,
                 session_options: Any = None) -> None:
        self.native = session
        self._content = content
        # the options that point external data at the model's folder: the debug session needs them too
        self._session_options = session_options
        self._proto: onnx.ModelProto | None = None
        self._debug: onnxruntime.InferenceSession | None = None   # every tensor an output
        super().__init__(device=device, inputs=[ort_spec(a) for a in session.get_inputs()],
                         outputs=[ort_spec(a) for a in session.get_outputs()], source=path)
        self.format_variant = f"{NAME}:opset{self.opset}" if self.opset else NAME

    @property
    def providers(self) -> list[str]:
        return list(self.native.get_providers())

    @property
    def opset(self) -> int | None:
        """The default-domain opset (None without the ``onnx`` package)."""
        proto = self.proto()
        if proto is None:
            return None
        return next((int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)

    def _predict(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [s.name for s in self.outputs]
        values = self.native.run(names, feeds)
        return dict(zip(names, values))

    # -- diagnosis hooks (need the ``onnx`` package) -----------------------------------
    def proto(self) -> Any:
        """The parsed ``onnx.ModelProto``, or None when the ``onnx`` package is missing."""
        if self._proto is None:
            try:
                import onnx
            except ImportError:
                return None
            self._proto = onnx.load_model_from_string(self._content)
        return self._proto

    def op_types(self) -> list[tuple[str, str]] | None:
        proto = self.proto()
        if proto is None:
            return None
        return [(node.name or (node.output[0] if node.output else f"node_{i}"), node.op_type)
                for i, node in enumerate(proto.graph.node)]

    def weights(self) -> dict[str, np.ndarray] | None:
        proto = self.proto()
        if proto is None:
            return None
        from onnx import numpy_helper

        # external data from the model's folder (checked at load), never the current directory
        folder = str(Path(self.source).parent) if self.source is not None else ""
        return {init.name: numpy_helper.to_array(init, base_dir=folder) for init in proto.graph.initializer}

    def intermediates(self, batch: Any) -> list[tuple[str, str, np.ndarray]] | None:
        """Every node's outputs for ``batch``, in graph (topological) order.

        Runs a second session on a copy of the model whose graph outputs list every node
        output (the user's file is not touched); None without the ``onnx`` package.
        """
        proto = self.proto()
        if proto is None:
            return None
        import onnx
        import onnxruntime as ort

        if self._debug is None:
            debug = onnx.ModelProto()
            debug.CopyFrom(proto)
            existing = {o.name for o in debug.graph.output}
            for node in debug.graph.node:
                for name in node.output:
                    if name and name not in existing:
                        debug.graph.output.append(onnx.ValueInfoProto(name=name))
                        existing.add(name)
            self._debug = ort.InferenceSession(debug.SerializeToString(), sess_options=self._session_options,
                                               providers=self.native.get_providers())
        feeds = self.prepare_batch(batch)
        names = [o.name for o in self._debug.get_outputs()]
        values = dict(zip(names, self._debug.run(names, feeds)))
        return [(name, node.op_type, values[name]) for node in proto.graph.node for name in node.output
                if name in values]

    def close(self) -> None:
        self._proto = None
        self._debug = None


