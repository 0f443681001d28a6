"""GraphDef rewrites that make the tensorflowjs converter's graph runnable by tfjs.

Why: common Keras models convert to graphs tfjs 4.22 cannot run, for reasons that are
the converter's and the JS kernels', not the model's:

- exact GELU (``keras.activations.gelu``) computes ``Erfc``, which the converter refuses
  ("Unsupported Ops ... Erfc"). tfjs has ``Erf``: ``erfc(x) = 1 - erf(x)`` is rewritten in the
  frozen graph *before* the converter's op check.
- on x86 TensorFlow (oneDNN) the converter's grappler pass fuses conv + bias + hard-swish into
  ``_FusedConv2D`` with fused op ``_FusedHardSwish`` (MobileNetV3 with trained batch-norm
  statistics), an activation neither the cpu nor the wasm backend implements. The fused node is
  split *after* the converter's optimisation into the fused conv (bias kept) followed by
  ``x * relu6(x + 3) * (1/6)`` in ops tfjs has.

- the same pass folds a residual ``Add`` of two conv outputs (ResNet) or a scalar into the
  fused op's ``BiasAdd``; the cpu backend broadcasts it, the wasm backend refuses ("FusedConv2D
  only supports rank-1 bias but got rank 4"): such nodes are unfused into the plain op,
  ``AddV2`` and the activation.

All run inside :func:`patched_converter`, which wraps the converter's ``optimize_graph`` for
the duration of one conversion only. TensorFlow is imported lazily (by the caller's converter).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

# Fused activations the tfjs backends (cpu, wasm) lack, and the ops that compute them.
UNSUPPORTED_FUSED = {"_FusedHardSwish": "hard-swish"}
_FUSED_OPS = ("_FusedConv2D", "_FusedMatMul", "FusedDepthwiseConv2dNative", "_FusedDepthwiseConv2dNative")


def _const(tf: Any, name: str, value: float, dtype: Any) -> Any:
    node = tf.compat.v1.NodeDef(name=name, op="Const")
    node.attr["dtype"].type = dtype
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, dtype=tf.as_dtype(dtype)))
    return node


def _op(tf: Any, name: str, op: str, inputs: list[str], dtype: Any) -> Any:
    node = tf.compat.v1.NodeDef(name=name, op=op, input=inputs)
    node.attr["T"].type = dtype
    return node


def rewrite_erfc(graph_def: Any) -> int:
    """Replace every ``Erfc(x)`` of the graph by ``1 - Erf(x)`` in place; return how many."""
    import tensorflow as tf

    count = 0
    new_nodes = []
    for node in graph_def.node:
        if node.op != "Erfc":
            continue
        dtype = node.attr["T"].type
        data_inputs = [i for i in node.input if not i.startswith("^")]
        controls = [i for i in node.input if i.startswith("^")]
        erf = _op(tf, f"{node.name}/erf", "Erf", data_inputs[:1] + controls, dtype)
        one = _const(tf, f"{node.name}/one", 1.0, dtype)
        node.op = "Sub"
        del node.input[:]
        node.input.extend([one.name, erf.name])
        new_nodes += [erf, one]
        count += 1
    graph_def.node.extend(new_nodes)
    return count


def split_fused_hard_swish(graph_def: Any) -> int:
    """Split fused ops ending in ``_FusedHardSwish`` into the fused op and plain hard-swish ops.

    The node keeps its name as the hard-swish's result, so its consumers need no change; the
    fused op becomes ``<name>/fused``. Returns how many nodes were split.
    """
    import tensorflow as tf

    count = 0
    new_nodes = []
    for node in graph_def.node:
        if node.op not in _FUSED_OPS or "fused_ops" not in node.attr:
            continue
        fused = [s.decode() if isinstance(s, bytes) else s for s in node.attr["fused_ops"].list.s]
        if not fused or fused[-1] != "_FusedHardSwish":
            continue
        dtype = node.attr["T"].type
        name = node.name
        base = f"{name}/fused"
        conv = tf.compat.v1.NodeDef()
        conv.CopyFrom(node)
        conv.name = base
        del conv.attr["fused_ops"].list.s[:]
        conv.attr["fused_ops"].list.s.extend([s.encode() for s in fused[:-1]])
        three = _const(tf, f"{node.name}/hard_swish/three", 3.0, dtype)
        sixth = _const(tf, f"{node.name}/hard_swish/sixth", 1.0 / 6.0, dtype)
        add = _op(tf, f"{node.name}/hard_swish/add", "AddV2", [base, three.name], dtype)
        relu6 = _op(tf, f"{node.name}/hard_swish/relu6", "Relu6", [add.name], dtype)
        gate = _op(tf, f"{node.name}/hard_swish/gate", "Mul", [relu6.name, sixth.name], dtype)
        controls = [i for i in node.input if i.startswith("^")]
        node.Clear()
        node.CopyFrom(_op(tf, name, "Mul", [base, gate.name] + controls, dtype))
        node.device = conv.device
        new_nodes += [conv, three, sixth, add, relu6, gate]
        count += 1
    graph_def.node.extend(new_nodes)
    return count


_PLAIN_OP = {"_FusedConv2D": "Conv2D", "_FusedMatMul": "MatMul",
             "FusedDepthwiseConv2dNative": "DepthwiseConv2dNative",
             "_FusedDepthwiseConv2dNative": "DepthwiseConv2dNative"}
_PLAIN_ATTRS = {"Conv2D": ("T", "strides", "padding", "explicit_paddings", "data_format", "dilations",
                           "use_cudnn_on_gpu"),
                "DepthwiseConv2dNative": ("T", "strides", "padding", "explicit_paddings", "data_format",
                                          "dilations"),
                "MatMul": ("T", "transpose_a", "transpose_b")}
_ACTIVATIONS = {"Relu", "Relu6", "Elu", "Sigmoid", "Tanh", "LeakyRelu"}


def unfuse_non_vector_bias(graph_def: Any) -> int:
    """Undo fusions whose "bias" is not a rank-1 constant (the remapper folds a residual ``Add``
    of two conv outputs, or a scalar, into ``BiasAdd``): tfjs's cpu backend broadcasts it, the
    wasm backend refuses ("FusedConv2D only supports rank-1 bias but got rank 4"). The node
    becomes the plain op, ``AddV2`` and the activation, keeping its name on the last."""
    import tensorflow as tf

    consts = {n.name: n for n in graph_def.node if n.op == "Const"}
    count = 0
    new_nodes = []
    for node in graph_def.node:
        plain = _PLAIN_OP.get(node.op)
        if plain is None or "fused_ops" not in node.attr:
            continue
        fused = [s.decode() if isinstance(s, bytes) else s for s in node.attr["fused_ops"].list.s]
        if fused[:1] != ["BiasAdd"] or len(fused) > 2 or (len(fused) == 2 and fused[1] not in _ACTIVATIONS):
            continue
        data = [i for i in node.input if not i.startswith("^")]
        controls = [i for i in node.input if i.startswith("^")]
        if len(data) != 3:
            continue
        bias = consts.get(data[2].split(":")[0])
        if bias is not None and len(bias.attr["value"].tensor.tensor_shape.dim) == 1:
            continue  # a real bias vector: every backend runs the fused op
        name, dtype = node.name, node.attr["T"].type
        op_node = tf.compat.v1.NodeDef(name=f"{name}/unfused/{plain}", op=plain, input=data[:2] + controls,
                                       device=node.device)
        for key in _PLAIN_ATTRS[plain]:
            if key in node.attr:
                op_node.attr[key].CopyFrom(node.attr[key])
        add = _op(tf, f"{name}/unfused/add" if len(fused) == 2 else name, "AddV2", [op_node.name, data[2]], dtype)
        chain = [op_node, add]
        if len(fused) == 2:
            act = _op(tf, name, fused[1], [add.name], dtype)
            if fused[1] == "LeakyRelu":
                act.attr["alpha"].f = node.attr["leakyrelu_alpha"].f
            chain.append(act)
        last = chain.pop()
        node.Clear()
        node.CopyFrom(last)
        new_nodes += chain
        count += 1
    graph_def.node.extend(new_nodes)
    return count


def unsupported_fused(graph_def: Any) -> list[tuple[str, str, str]]:
    """``(node, op, fused activation)`` of fused ops whose activation the tfjs backends lack."""
    out = []
    for node in graph_def.node:
        if node.op in _FUSED_OPS and "fused_ops" in node.attr:
            for s in node.attr["fused_ops"].list.s:
                name = s.decode() if isinstance(s, bytes) else s
                if name in UNSUPPORTED_FUSED:
                    out.append((node.name, node.op, name))
    return out


@contextlib.contextmanager
def patched_converter(converter: Any, stats: dict[str, int]) -> Iterator[None]:
    """Run the converter with :func:`rewrite_erfc` before and :func:`split_fused_hard_swish`
    after its ``optimize_graph``; ``stats`` receives how many nodes each rewrote."""
    import tensorflow as tf

    original = converter.optimize_graph

    def optimize_graph(graph: Any, signature_def: Any, *args: Any, **kwargs: Any) -> Any:
        graph_def = graph.as_graph_def()
        if any(n.op == "Erfc" for n in graph_def.node):
            stats["erfc"] = stats.get("erfc", 0) + rewrite_erfc(graph_def)
            graph = tf.Graph()
            with graph.as_default():
                tf.graph_util.import_graph_def(graph_def, name="")
        optimized = original(graph, signature_def, *args, **kwargs)
        stats["hard_swish"] = stats.get("hard_swish", 0) + split_fused_hard_swish(optimized)
        stats["unfused_bias"] = stats.get("unfused_bias", 0) + unfuse_non_vector_bias(optimized)
        return optimized

    converter.optimize_graph = optimize_graph
    try:
        yield
    finally:
        converter.optimize_graph = original
