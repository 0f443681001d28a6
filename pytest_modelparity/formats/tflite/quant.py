"""What a quantised TFLite file says about itself: input ranges, dequantised intermediates,
and the float16 twin of a float32 file.

Why a module of its own: ``tflite.py`` loads and exports; judging a quantised file needs
three readings of the file that only the quantisation verdict (``checks/quantized.py``) and its
per-layer diagnosis (``diagnose/quantization.py``) use:

- ``input_ranges``: an int8 file records each input's quantisation (scale, zero point), so
  the range of values it can represent, i.e. its calibration range, is readable from the
  file without the calibration rows (notes/quantization.md).
- ``float_intermediates``: every op's outputs with all tensors preserved, dequantised with
  their own scale and zero point (per channel where the file says so), by tensor name. A
  float32 file and its quantised sibling made from the same graph share op names (fused
  names such as ``.../Relu;.../BiasAdd;.../convolution``), so their tensors pair by name.
- ``float16_twin``: the float32 file with its constant float tensors rounded to float16.
  The converter folds batch norm into the convolutions before rounding the weights, so a
  twin made from the float32 *file* rounds exactly what the float16 file rounded: on the
  digits CNN the float16 file and its twin agree bitwise, where float16 weights cost the
  outputs 2.5e-4 of scale. A float16 file whose weights are not those of its sibling
  (a conv kernel x1.01) cannot hide inside the float16 rounding.

Needs only ``ai_edge_litert`` (its flatbuffer tools), not TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

_QUANTIZED = ("int8", "uint8", "int16")


@dataclass(frozen=True)
class OpRecord:
    """One op of a file: its type, and its input and output tensor names."""

    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def _dequantize(value: np.ndarray, detail: dict) -> np.ndarray | None:
    """A tensor as float64: integer tensors through their (per-tensor or per-axis) scale;
    None for a true integer tensor (a shape, indices)."""
    if np.dtype(detail["dtype"]).kind not in "iu":
        return np.asarray(value, dtype=np.float64)
    params = detail.get("quantization_parameters") or {}
    scales = np.asarray(params.get("scales", ()), dtype=np.float64)
    zeros = np.asarray(params.get("zero_points", ()), dtype=np.float64)
    if scales.size == 0:
        scale, zero = detail.get("quantization", (0.0, 0))
        if not scale:
            return None
        scales, zeros = np.array([scale]), np.array([zero])
    value = np.asarray(value, dtype=np.float64)
    if scales.size == 1:
        return (value - zeros.reshape(-1)[0]) * scales[0]
    axis = int(params.get("quantized_dimension", 0))
    shape = [1] * value.ndim
    shape[axis] = scales.size
    zeros = zeros if zeros.size == scales.size else np.zeros_like(scales)
    return (value - zeros.reshape(shape)) * scales.reshape(shape)


def input_ranges(model: Any) -> dict[str, tuple[float, float]]:
    """{input name: (low, high)} an int8 file can represent at each input (empty otherwise).

    Read from the input tensor itself when it is integer, else from the QUANTIZE op that
    turns the float input into int8: values beyond the range are clipped there.
    """
    interp = model.native
    details = {int(d["index"]): d for d in interp.get_tensor_details()}
    ops = interp._get_ops_details()
    found: dict[str, tuple[float, float]] = {}
    for spec in model.inputs:
        index = model.input_tensor_index(spec.name)
        target = details.get(index)
        if target is None or np.dtype(target["dtype"]).name not in _QUANTIZED:
            quantize = next((op for op in ops if op["op_name"] == "QUANTIZE" and int(op["inputs"][0]) == index), None)
            target = details.get(int(quantize["outputs"][0])) if quantize is not None else None
        if target is None or np.dtype(target["dtype"]).name not in _QUANTIZED:
            continue
        scale, zero = target["quantization"]
        if not scale:
            continue
        info = np.iinfo(np.dtype(target["dtype"]))
        found[spec.name] = (float((info.min - zero) * scale), float((info.max - zero) * scale))
    return found


def float_intermediates(model: Any, batch: Any) -> tuple[dict[str, np.ndarray], list[OpRecord]]:
    """({tensor name: dequantised value}, ops in execution order) of ``model`` on ``batch``.

    Constants (weights) are left out of the tensors; every op's inputs and outputs are named
    so a caller can tell what an op added to the error it received.
    """
    interp = model.preserved_run(batch)
    details = {int(d["index"]): d for d in interp.get_tensor_details()}
    ops = [op for op in interp._get_ops_details() if op.get("op_name") != "DELEGATE"]
    fed = {int(d["index"]) for d in interp.get_input_details()}
    # A DEQUANTIZE of a constant (float16 or int8 weights) is a weight, not an activation, and
    # the converter may give it the fused name of the op that uses it: leave it out.
    activations = {int(i) for op in ops for i in op["outputs"] if int(i) >= 0} | fed
    ops = [op for op in ops if not (op["op_name"] == "DEQUANTIZE"
                                    and all(int(i) not in activations for i in op["inputs"]))]
    produced = {int(i) for op in ops for i in op["outputs"] if int(i) >= 0}
    tensors: dict[str, np.ndarray] = {}
    for index in produced | fed:
        det = details.get(index)
        if det is None or np.dtype(det["dtype"]).kind not in "fiu":
            continue
        try:
            value = _dequantize(np.array(interp.get_tensor(index)), det)
        except ValueError:  # a tensor the interpreter did not keep
            continue
        if value is not None:
            tensors[det["name"]] = value
    records = []
    for op in ops:
        ins = tuple(details[int(i)]["name"] for i in op["inputs"] if int(i) >= 0 and int(i) in produced | fed)
        outs = tuple(details[int(i)]["name"] for i in op["outputs"] if int(i) >= 0)
        records.append(OpRecord(str(op["op_name"]), ins, outs))
    return tensors, records


def float16_twin(content: bytes) -> bytes:
    """``content`` (a float32 .tflite) with every constant float32 tensor rounded to float16."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    for graph in model.subgraphs:
        produced = {int(i) for op in graph.operators for i in (op.outputs if op.outputs is not None else ())}
        for index, tensor in enumerate(graph.tensors):
            if index in produced or tensor.type != schema.TensorType.FLOAT32:
                continue
            buffer = model.buffers[tensor.buffer]
            data = getattr(buffer, "data", None)
            if data is None or len(data) < 4 or len(data) % 4:
                continue
            values = np.frombuffer(bytes(bytearray(data)), dtype=np.float32)
            rounded = values.astype(np.float16).astype(np.float32)
            buffer.data = np.frombuffer(rounded.tobytes(), dtype=np.uint8)
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def float16_twin_model(sibling: Any) -> Any:
    """``float16_twin`` of a loaded float32 file, loaded in LiteRT."""
    from .load import TFLiteModel

    return TFLiteModel(float16_twin(sibling.content), path=None)
