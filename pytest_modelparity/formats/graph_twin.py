"""The graph twin: a reference's frozen TensorFlow graph, rewritten to compute in float64.

Why: the Keras-config twin (``keras_shadow.py``) rebuilds only functional and Sequential Keras
models. A SavedModel signature, a frozen GraphDef, a TF1 checkpoint, a subclassed Keras model
or a ``tf.Module`` has no config, yet each is a TensorFlow graph: freeze it (variables become
constants), rewrite every float type to float64 and every float constant to float64, and the
same arithmetic runs in float64 (notes/graph-twin.md: MobileNetV2, ResNet50, EfficientNetB0
and an LSTM gave the Keras twin's e32 this way, 1-7 s).

Ops without a float64 kernel are replaced by their inference arithmetic
(``FusedBatchNorm``/``V2``/``V3``: ``x * scale / sqrt(var + eps) + (offset - mean * ...)``);
an op that stays unsupported makes the twin unavailable, with the op named.

The ``float16 weights`` twin is the same graph in float32 with every float constant of more
than one element rounded to float16 (what a ``tflite:float16`` export stores).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ._common import quiet
from ._tf import import_tf

# TensorFlow DataType enum values (types.proto).
DT_FLOAT, DT_DOUBLE, DT_HALF, DT_BFLOAT16 = 1, 2, 19, 14
_LOW_FLOATS = (DT_FLOAT, DT_HALF, DT_BFLOAT16)
_BATCH_NORMS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
# Ops that sum products: a float64 twin of a graph holding one cannot equal its float32
# model bitwise on a whole output, unless part of it stayed float32 (not a faithful twin).
ACCUMULATING_OPS = frozenset({
    "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "Conv3D", "Conv1D",
    "DepthwiseConv2dNative", "Conv2DBackpropInput", "Einsum", "Sum", "Mean", "_FusedMatMul",
    "_FusedConv2D", "BiasAdd"})


class GraphTwinUnavailable(Exception):
    """The reference has no graph that can be rewritten; the message says why."""


@dataclass
class FrozenGraph:
    """A reference's inference graph with its weights as constants, and where to feed/fetch.

    ``inputs``/``outputs`` are tensor names (``"x:0"``) in the order of the reference's
    ``LoadedModel.inputs``/``.outputs``.
    """

    graph_def: Any
    inputs: list[str]
    outputs: list[str]

    def op_types(self) -> set[str]:
        ops = {node.op for node in self.graph_def.node}
        for function in self.graph_def.library.function:
            ops.update(node.op for node in function.node_def)
        return ops


def freeze_concrete(fn: Any, input_order: list[int] | None = None) -> FrozenGraph:
    """Freeze a ConcreteFunction; outputs in ``tf.nest.flatten(structured_outputs)`` order,
    inputs in the function's flat order (``input_order`` reorders them)."""
    import_tf()
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    try:
        with quiet():
            frozen = convert_variables_to_constants_v2(fn, lower_control_flow=False)
    except Exception as exc:  # noqa: BLE001 - any failure: no graph twin
        raise GraphTwinUnavailable(f"freezing the graph failed ({type(exc).__name__}: {_first(exc)})") from exc
    inputs = [t.name for t in frozen.inputs if t.dtype.name != "resource"]
    if input_order is not None:
        inputs = [inputs[i] for i in input_order]
    return FrozenGraph(frozen.graph.as_graph_def(), inputs, [t.name for t in frozen.outputs])


def freeze_session(session: Any, graph: Any, inputs: list[str], outputs: list[str]) -> FrozenGraph:
    """Freeze a TF1 graph whose variables live in ``session`` (a restored checkpoint)."""
    tf = import_tf()
    names = sorted({name.split(":")[0] for name in outputs})
    try:
        with quiet():
            graph_def = tf.compat.v1.graph_util.convert_variables_to_constants(
                session, graph.as_graph_def(), names)
    except Exception as exc:  # noqa: BLE001
        raise GraphTwinUnavailable(f"freezing the checkpoint's graph failed ({type(exc).__name__}: "
                                   f"{_first(exc)})") from exc
    return FrozenGraph(graph_def, list(inputs), list(outputs))


# -- rewriting ----------------------------------------------------------------------------

def float64_graph_def(graph_def: Any) -> Any:
    """A copy of ``graph_def`` computing in float64 (batch norms decomposed first)."""
    tf = import_tf()
    out = tf.compat.v1.GraphDef()
    out.CopyFrom(graph_def)
    _decompose_batch_norms(out)
    for node in out.node:
        _retype_node(node, tf)
    for function in out.library.function:
        for arg in list(function.signature.input_arg) + list(function.signature.output_arg):
            if arg.type in _LOW_FLOATS:
                arg.type = DT_DOUBLE
        if any(n.op in _BATCH_NORMS for n in function.node_def):
            raise GraphTwinUnavailable(f"a fused batch norm inside function {function.signature.name} "
                                       "(control flow) cannot be rewritten to float64")
        for node in function.node_def:
            _retype_node(node, tf)
    return out


def float16_weights_graph_def(graph_def: Any) -> Any:
    """A copy of ``graph_def`` whose float32 constants (weights) are rounded to float16."""
    tf = import_tf()
    out = tf.compat.v1.GraphDef()
    out.CopyFrom(graph_def)
    nodes = list(out.node) + [n for f in out.library.function for n in f.node_def]
    for node in nodes:
        if node.op == "Const" and node.attr["dtype"].type == DT_FLOAT:
            value = tf.make_ndarray(node.attr["value"].tensor)
            if value.size > 1:
                node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value.astype(np.float16).astype(np.float32)))
    return out


def _retype_node(node: Any, tf: Any) -> None:
    for key in node.attr:
        attr = node.attr[key]
        field = attr.WhichOneof("value")
        if field == "type" and attr.type in _LOW_FLOATS:
            attr.type = DT_DOUBLE
        elif field == "list" and attr.list.type:
            types = [DT_DOUBLE if t in _LOW_FLOATS else t for t in attr.list.type]
            del attr.list.type[:]
            attr.list.type.extend(types)
        elif field == "tensor" and attr.tensor.dtype in _LOW_FLOATS:
            value = tf.make_ndarray(attr.tensor).astype(np.float64)
            attr.tensor.CopyFrom(tf.make_tensor_proto(value))


def _decompose_batch_norms(graph_def: Any) -> None:
    """Replace inference-mode fused batch norms (no float64 kernel) by their arithmetic.

    y = x * m + (offset - mean * m), m = scale * rsqrt(variance + epsilon); the node keeps
    its name (as the final Add), so its consumers are untouched. A batch norm in training
    mode or whose other outputs are read cannot be decomposed: the twin is unavailable.
    """
    nodes = graph_def.node
    norms = [n for n in nodes if n.op in _BATCH_NORMS]
    if not norms:
        return
    names = {n.name for n in norms}
    for node in nodes:
        for inp in node.input:
            bare, _, index = inp.lstrip("^").partition(":")
            if bare in names and index not in ("", "0"):
                raise GraphTwinUnavailable(f"{bare} ({_op_of(nodes, bare)}) has another output than y read "
                                           f"by {node.name}; it cannot be decomposed for a float64 run")
    for norm in norms:
        if norm.attr["is_training"].b:
            raise GraphTwinUnavailable(f"{norm.name} is a batch norm in training mode")
        if norm.attr["data_format"].s not in (b"NHWC", b"", b"NDHWC"):
            raise GraphTwinUnavailable(f"{norm.name} is a {norm.attr['data_format'].s.decode()} batch norm")
        x, scale, offset, mean, variance = list(norm.input)[:5]
        controls = [i for i in norm.input if i.startswith("^")]
        eps = norm.attr["epsilon"].f
        base = norm.name
        new = [
            _node(f"{base}/mp64_eps", "Const", [], {"dtype": DT_FLOAT}, value=np.float32(eps)),
            _node(f"{base}/mp64_var_eps", "AddV2", [variance, f"{base}/mp64_eps"]),
            _node(f"{base}/mp64_rsqrt", "Rsqrt", [f"{base}/mp64_var_eps"]),
            _node(f"{base}/mp64_m", "Mul", [scale, f"{base}/mp64_rsqrt"]),
            _node(f"{base}/mp64_xm", "Mul", [x, f"{base}/mp64_m"]),
            _node(f"{base}/mp64_mean_m", "Mul", [mean, f"{base}/mp64_m"]),
            _node(f"{base}/mp64_shift", "Sub", [offset, f"{base}/mp64_mean_m"]),
        ]
        norm.Clear()
        norm.name = base
        norm.op = "AddV2"
        norm.input.extend([f"{base}/mp64_xm", f"{base}/mp64_shift", *controls])
        norm.attr["T"].type = DT_FLOAT
        nodes.extend(new)


def _node(name: str, op: str, inputs: list[str], types: Mapping[str, int] | None = None, value: Any = None) -> Any:
    tf = import_tf()
    node = tf.compat.v1.NodeDef()
    node.name, node.op = name, op
    node.input.extend(inputs)
    if value is not None:
        node.attr["dtype"].type = DT_FLOAT
        node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    else:
        node.attr["T"].type = DT_FLOAT
    for key, t in (types or {}).items():
        node.attr[key].type = t
    return node


def _op_of(nodes: Any, name: str) -> str:
    return next((n.op for n in nodes if n.name == name), "?")


# -- running ------------------------------------------------------------------------------

class GraphTwin:
    """A rewritten graph in its own ``tf.Graph`` and Session, fed and fetched by position."""

    def __init__(self, frozen: FrozenGraph, graph_def: Any, input_dtype: Any) -> None:
        tf = import_tf()
        self.graph = tf.Graph()
        try:
            with quiet(), self.graph.as_default():
                tf.graph_util.import_graph_def(graph_def, name="")
        except Exception as exc:  # noqa: BLE001
            raise GraphTwinUnavailable(f"the rewritten graph does not import ({type(exc).__name__}: "
                                       f"{_first(exc)})") from exc
        self.inputs = [self.graph.get_tensor_by_name(n) for n in frozen.inputs]
        self.outputs = [self.graph.get_tensor_by_name(n) for n in frozen.outputs]
        self.input_dtype = input_dtype
        config = tf.compat.v1.ConfigProto(device_count={"GPU": 0})
        self.session = tf.compat.v1.Session(graph=self.graph, config=config)

    def run(self, xs: list[np.ndarray]) -> list[np.ndarray]:
        feeds = {}
        for tensor, x in zip(self.inputs, xs):
            arr = np.asarray(x)
            if arr.dtype.kind == "f":
                arr = arr.astype(self.input_dtype)
            feeds[tensor] = arr
        try:
            values = self.session.run(self.outputs, feed_dict=feeds)
        except Exception as exc:  # noqa: BLE001 - e.g. an op without a float64 kernel
            raise GraphTwinUnavailable(f"running the rewritten graph failed ({type(exc).__name__}: "
                                       f"{_first(exc)})") from exc
        return [np.asarray(v) for v in values]

    def close(self) -> None:
        self.session.close()

    def __del__(self) -> None:  # a twin lives as long as its reference: free the session
        try:
            self.session.close()
        except Exception:  # noqa: BLE001
            pass


def build(frozen: FrozenGraph, kind: str) -> GraphTwin:
    """The float64 twin (``kind="float64"``) or the float16-weights twin of ``frozen``."""
    if kind == "float64":
        return GraphTwin(frozen, float64_graph_def(frozen.graph_def), np.float64)
    return GraphTwin(frozen, float16_weights_graph_def(frozen.graph_def), np.float32)


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
