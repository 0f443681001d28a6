"""The graph twin: a reference's frozen TensorFlow graph, rewritten to compute in float64.

Why: the Keras-config twin (``keras_twin.py``) rebuilds only functional and Sequential Keras
models. A SavedModel signature, a frozen GraphDef, a TF1 checkpoint, a subclassed Keras model
or a ``tf.Module`` has no config, yet each is a TensorFlow graph: freeze it (variables become
constants), rewrite every float type to float64 and every float constant to float64, and the
same arithmetic runs in float64 (notes/graph-twin.md: MobileNetV2, ResNet50, EfficientNetB0
and an LSTM gave the Keras twin's e32 this way, 1-7 s).

Ops without a float64 kernel are replaced by their inference arithmetic
(``FusedBatchNorm``/``V2``/``V3``: ``x * scale / sqrt(var + eps) + (offset - mean * ...)``;
``MaxPool3D``: two ``MaxPool``, exact; ``ResizeBilinear``, whose output is float32 whatever its
input: two float64 contractions with its interpolation matrices; ``ResizeBicubic``,
``ResizeArea``, ``ScaleAndTranslate``: the same, with the matrices read from the op);
an op that stays unsupported makes the twin unavailable, with the op named.

The ``float16 weights`` twin is the same graph in float32 with every float constant of more
than one element rounded to float16 (what a ``tflite:float16`` export stores).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np

from ..formats.common import quiet
from ..formats.tensorflow.graph import FrozenGraph, GraphUnavailable, import_tf, inline_kept_functions

# TensorFlow DataType enum values (types.proto).
DT_FLOAT, DT_DOUBLE, DT_HALF, DT_BFLOAT16 = 1, 2, 19, 14
DT_COMPLEX64, DT_COMPLEX128 = 8, 18
# What each low-precision type becomes in the float64 twin: a complex64 (an STFT's spectrum)
# becomes complex128, or ComplexAbs's complex64 -> float signature would not match.
_WIDER = {DT_FLOAT: DT_DOUBLE, DT_HALF: DT_DOUBLE, DT_BFLOAT16: DT_DOUBLE, DT_COMPLEX64: DT_COMPLEX128}
_BATCH_NORMS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
# Ops that sum products: a float64 twin of a graph holding one cannot equal its float32
# model bitwise on a whole output, unless part of it stayed float32 (not a faithful twin).
ACCUMULATING_OPS = frozenset({
    "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "Conv3D", "Conv1D",
    "DepthwiseConv2dNative", "Conv2DBackpropInput", "Einsum", "Sum", "Mean", "_FusedMatMul",
    "_FusedConv2D", "BiasAdd"})


# -- rewriting ----------------------------------------------------------------------------

def float64_graph_def(graph_def: Any, outputs: list[str] | None = None) -> Any:
    """A copy of ``graph_def`` computing in float64 (batch norms decomposed first; the
    functions Keras keeps from inlining, its grouped convolutions, inlined when ``outputs``
    says what to keep)."""
    tf = import_tf()
    out = tf.compat.v1.GraphDef()
    out.CopyFrom(graph_def)
    if outputs:
        inline_kept_functions(out, outputs)
    _decompose_batch_norms(out)
    _depthwise_as_shifted_products(out)
    _max_pool3d_as_2d(out)
    _resizes_as_products(out)
    for node in out.node:
        _retype_node(node, tf)
    for function in out.library.function:
        for arg in list(function.signature.input_arg) + list(function.signature.output_arg):
            arg.type = _WIDER.get(arg.type, arg.type)
        if any(n.op in _BATCH_NORMS for n in function.node_def):
            raise GraphUnavailable(f"a fused batch norm inside function {function.signature.name} "
                                       "(control flow) cannot be rewritten to float64")
        for node in function.node_def:
            _retype_node(node, tf)
    return out


def _graph_for_shapes(graph_def: Any, tf: Any, *, strict: bool = False) -> Any:
    """``graph_def`` imported into a graph of its own, to read its tensors' static shapes; None
    when it does not import (``strict``: raise ``GraphUnavailable`` saying why instead)."""
    graph = tf.Graph()
    try:
        with quiet(), graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
    except Exception as exc:  # noqa: BLE001 - shapes unknown: the caller keeps the graph as it is
        if strict:
            raise GraphUnavailable(f"its graph does not import for shapes ({_first(exc)})") from exc
        return None
    return graph


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


# Ops whose float32 result another implementation rounds differently by an ULP or so
# (their own approximations of exp, log, tanh...): the reordered twin nudges their outputs.
_TRANSCENDENTAL_OPS = frozenset({"Exp", "Log", "Log1p", "Expm1", "Tanh", "Sigmoid", "Erf", "Erfc", "Softmax",
                                 "LogSoftmax", "Rsqrt", "Sqrt", "Pow", "Softplus", "Elu", "Selu", "Sin", "Cos"})
_NUDGE = 1.0 + 2.0 ** -23   # one float32 ULP just above 1
_REORDERED_SUMS = frozenset({"Conv2D", "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})
# Product sums the reordered twin cannot split: a graph holding one has no reordered twin (the
# float64 floor judges), so no form's other order of them is missed.
UNREORDERED_SUMS = frozenset({"Einsum", "Conv3D", "DepthwiseConv2dNative", "Conv2DBackpropInput",
                               "Conv3DBackpropInputV2", "_FusedMatMul", "_FusedConv2D"})


def reordered_graph_def(graph_def: Any) -> Any:
    """A copy of ``graph_def`` still in float32 that rounds the way another correct float32
    implementation could: every product sum (``Conv2D``, ``MatMul``, ``BatchMatMul*``) whose
    reduction holds two or more channels / a contraction of 2 or more is split in two halves
    added after (what a kernel with another blocking of the reduction does), a convolution over
    one input channel has its products rounded otherwise (``_round_products_otherwise``), and
    the output of each transcendental op is moved by one ULP (another library's approximation).

    A graph with a product sum the twin cannot vary (one it cannot plan, an ``Einsum``, a
    depthwise convolution, any inside a function such as an LSTM's loop) or with none to vary
    has no reordered twin (``GraphUnavailable``): it would miss what a form's other order of
    that sum costs, and the float64 floor judges."""
    inside = sorted({n.op for f in graph_def.library.function for n in f.node_def}
                    & (_REORDERED_SUMS | UNREORDERED_SUMS | _TRANSCENDENTAL_OPS))
    if inside:  # a while loop's body (an LSTM): its sums would keep their order, unlike a form's
        raise GraphUnavailable(f"its {', '.join(inside)} sit inside functions (control flow), which are not "
                               "reordered")
    fixed = next((n for n in graph_def.node if n.op in UNREORDERED_SUMS and _float_op(n)), None)
    if fixed is not None:
        raise GraphUnavailable(f"{fixed.name} ({fixed.op}) sums products in an order the twin does not vary")
    tf = import_tf()
    out = tf.compat.v1.GraphDef()
    out.CopyFrom(graph_def)
    graph = _graph_for_shapes(out, tf, strict=True)
    new: list[Any] = []
    split = 0
    for node in list(out.node):
        if node.op == "Conv2D" and node.attr["T"].type == DT_FLOAT:
            added = _split_conv(node, graph)
            if not added and not _one_channel(node, graph):
                raise GraphUnavailable(f"{node.name} (Conv2D) could not be reordered (grouped, or shapes unknown)")
        elif node.op in ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3") and _float_op(node):
            added = _split_matmul(node, graph)
            if not added and not _contraction_of_one(node, graph):
                raise GraphUnavailable(f"{node.name} ({node.op}) could not be reordered (shapes unknown)")
        else:
            if node.op in _TRANSCENDENTAL_OPS and _float_op(node):
                new += _nudge(node)
            continue
        split += bool(added)
        new += added
    if not split:
        raise GraphUnavailable("no product sum in its graph could be reordered (a single product has no order; "
                               "others are inside functions or of unknown shape)")
    out.node.extend(new)
    return out


def _one_channel(conv: Any, graph: Any) -> bool:
    """A Conv2D of one tap over one input channel: a single product, nothing to reorder."""
    fshape = _static_shape(graph, list(conv.input)[1])
    return fshape is not None and len(fshape) == 4 and fshape[0] == fshape[1] == fshape[2] == 1


def _contraction_of_one(mm: Any, graph: Any) -> bool:
    ashape = _static_shape(graph, list(mm.input)[0])
    if ashape is None or len(ashape) < 2:
        return False
    transposed = mm.attr["transpose_a"].b if mm.op == "MatMul" else mm.attr["adj_x"].b
    return ashape[len(ashape) - (2 if transposed else 1)] == 1


def _float_op(node: Any) -> bool:
    return any(node.attr[k].type == DT_FLOAT for k in ("T", "Ta") if k in node.attr)


def _static_shape(graph: Any, name: str) -> list[int | None] | None:
    try:
        shape = graph.get_tensor_by_name(name if ":" in name else f"{name}:0").shape
        return None if shape.rank is None else shape.as_list()
    except Exception:  # noqa: BLE001
        return None


def _halves(x: str, axis: int, size: int, tag: str) -> tuple[list[Any], str, str]:
    """``SplitV`` of ``x`` into its first ``size // 2`` and the rest along ``axis``."""
    first = size // 2
    sizes = _const(f"{tag}/sizes", np.array([first, size - first], np.int32))
    dim = _const(f"{tag}/axis", np.array(axis, np.int32))
    split = _node(f"{tag}/split", "SplitV", [x, f"{tag}/sizes", f"{tag}/axis"], {"Tlen": 3})
    split.attr["num_split"].i = 2
    return [sizes, dim, split], f"{tag}/split:0", f"{tag}/split:1"


def _split_conv(conv: Any, graph: Any) -> list[Any]:
    x, filt = list(conv.input)[:2]
    fshape, xshape = _static_shape(graph, filt), _static_shape(graph, x)
    fmt = conv.attr["data_format"].s or b"NHWC"
    if fshape is None or xshape is None or len(fshape) != 4 or fmt != b"NHWC":
        return []
    channels = fshape[2]
    if channels == 1 and xshape[3] == 1:
        return _round_products_otherwise(conv, filt, fshape)
    if channels is None or channels < 2 or xshape[3] != channels:  # grouped, or unknown
        return []
    base = conv.name
    nx, x1, x2 = _halves(x, 3, channels, f"{base}/r32_x")
    nw, w1, w2 = _halves(filt, 2, channels, f"{base}/r32_w")
    return [*nx, *nw, *_sum_of_two_parts(conv, ((x1, w1), (x2, w2)), DT_FLOAT)]


def _round_products_otherwise(conv: Any, filt: str, fshape: list[int | None]) -> list[Any]:
    """A one-channel convolution (a filter bank over a waveform) with its products rounded
    otherwise: each kernel weight moved by one ULP up or down (a fixed pseudo-random sign per
    weight). Its taps keep their order, which a GEMM's blocking barely moves; what moves it is
    whether a kernel rounds each product before adding it (no FMA) or not: TensorFlow and
    XNNPACK were 1.1x the float64 error apart on an AMD EPYC without AVX-512, and to the last
    digit together on another CPU. A rounding of each product is what a ULP per weight models."""
    dims = tuple(d for d in fshape if d is not None)
    if len(dims) != len(fshape) or int(np.prod(dims)) < 2:
        return []
    signs = np.where(np.random.default_rng(0).random(dims) < 0.5, np.float32(-1.0), np.float32(1.0))
    base = conv.name
    nudge = _const(f"{base}/r32_ulps", (1.0 + signs * np.float32(_NUDGE - 1.0)).astype(np.float32))
    nudged = _node(f"{base}/r32_w", "Mul", [filt, f"{base}/r32_ulps"])
    conv.input[1] = f"{base}/r32_w"
    return [nudge, nudged]


def _split_matmul(mm: Any, graph: Any) -> list[Any]:
    a, b = list(mm.input)[:2]
    ashape, bshape = _static_shape(graph, a), _static_shape(graph, b)
    if ashape is None or bshape is None or len(ashape) < 2 or len(bshape) < 2:
        return []
    if mm.op == "MatMul":
        ta, tb = mm.attr["transpose_a"].b, mm.attr["transpose_b"].b
    else:
        ta, tb = mm.attr["adj_x"].b, mm.attr["adj_y"].b
    a_axis = len(ashape) - (2 if ta else 1)
    b_axis = len(bshape) - (1 if tb else 2)
    k = ashape[a_axis]
    if k is None or k < 2 or bshape[b_axis] != k:
        return []
    base = mm.name
    na, a1, a2 = _halves(a, a_axis, k, f"{base}/r32_a")
    nb, b1, b2 = _halves(b, b_axis, k, f"{base}/r32_b")
    t = mm.attr["T"].type if "T" in mm.attr else DT_FLOAT
    return [*na, *nb, *_sum_of_two_parts(mm, ((a1, b1), (a2, b2)), t)]


def _sum_of_two_parts(node: Any, halves: tuple[tuple[str, str], tuple[str, str]], dtype: int) -> list[Any]:
    """``node`` (a product sum) computed on each pair of ``halves`` of its reduction as two
    copies of itself, ``<name>/r32_part0`` and ``1``; ``node`` becomes their ``AddV2`` (keeping
    its name and control inputs). Returns the two copies, to be added to the graph."""
    base = node.name
    parts = []
    for i, (a, b) in enumerate(halves):
        part = type(node)()
        part.CopyFrom(node)
        part.name = f"{base}/r32_part{i}"
        del part.input[:]
        part.input.extend([a, b])
        parts.append(part)
    controls = [i for i in node.input if i.startswith("^")]
    node.Clear()
    node.name, node.op = base, "AddV2"
    node.input.extend([f"{base}/r32_part0", f"{base}/r32_part1", *controls])
    node.attr["T"].type = dtype
    return parts


def _nudge(node: Any) -> list[Any]:
    """``node``'s output times (1 + 1 ULP): the node is renamed, a ``Mul`` takes its name."""
    base = node.name
    inner = type(node)()
    inner.CopyFrom(node)
    inner.name = f"{base}/r32_op"
    controls = [i for i in node.input if i.startswith("^")]
    t = node.attr["T"].type
    node.Clear()
    node.name, node.op = base, "Mul"
    node.input.extend([f"{base}/r32_op", f"{base}/r32_ulp", *controls])
    node.attr["T"].type = t
    return [inner, _node(f"{base}/r32_ulp", "Const", [], value=np.float32(_NUDGE))]


def _retype_node(node: Any, tf: Any) -> None:
    for key in node.attr:
        attr = node.attr[key]
        field = attr.WhichOneof("value")
        if field == "type" and attr.type in _WIDER:
            attr.type = _WIDER[attr.type]
        elif field == "list" and attr.list.type:
            types = [_WIDER.get(t, t) for t in attr.list.type]
            del attr.list.type[:]
            attr.list.type.extend(types)
        elif field == "tensor" and attr.tensor.dtype in _WIDER:
            wide = np.complex128 if attr.tensor.dtype == DT_COMPLEX64 else np.float64
            value = tf.make_ndarray(attr.tensor).astype(wide)
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
                raise GraphUnavailable(f"{bare} ({_op_of(nodes, bare)}) has another output than y read "
                                           f"by {node.name}; it cannot be decomposed for a float64 run")
    for norm in norms:
        if norm.attr["is_training"].b:
            raise GraphUnavailable(f"{norm.name} is a batch norm in training mode")
        if norm.attr["data_format"].s not in (b"NHWC", b"", b"NDHWC"):
            raise GraphUnavailable(f"{norm.name} is a {norm.attr['data_format'].s.decode()} batch norm")
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


def _depthwise_as_shifted_products(graph_def: Any) -> None:
    """Depthwise convolutions as sums of shifted products (plain elementwise float64 ops).

    Why: TensorFlow's CPU float64 depthwise kernel is ~30x slower than float32 (ConvNeXtTiny's
    graph twin cost 22-57x a reference call); the Keras twin does the same for the same
    reason. Only the plain case is rewritten (NHWC, multiplier 1, no dilation, SAME/VALID,
    a constant filter, static height and width); any other stays as it is, slow but right.
    """
    tf = import_tf()
    nodes = {n.name: n for n in graph_def.node}
    convs = [n for n in graph_def.node if n.op in ("DepthwiseConv2dNative", "Conv2D")]
    if not convs:
        return
    graph = _graph_for_shapes(graph_def, tf)
    if graph is None:  # shapes unknown: keep the convolutions as they are
        return
    for conv in convs:
        plan = _depthwise_plan(conv, nodes, graph, tf)
        if plan is None:
            continue
        x, kernel, (sh, sw), pads, (oh, ow) = plan
        base, new = conv.name, []
        if any(pads):
            paddings = np.array([[0, 0], [pads[0], pads[1]], [pads[2], pads[3]], [0, 0]], np.int32)
            new.append(_const(f"{base}/mp64_paddings", paddings))
            new.append(_node(f"{base}/mp64_pad", "Pad", [x, f"{base}/mp64_paddings"], {"Tpaddings": 3}))
            x = f"{base}/mp64_pad"
        terms = []
        for i in range(kernel.shape[0]):
            for j in range(kernel.shape[1]):
                tag = f"{base}/mp64_{i}_{j}"
                begin = np.array([0, i, j, 0], np.int32)
                end = np.array([0, i + (oh - 1) * sh + 1, j + (ow - 1) * sw + 1, 0], np.int32)
                new += [_const(f"{tag}/begin", begin), _const(f"{tag}/end", end),
                        _const(f"{tag}/strides", np.array([1, sh, sw, 1], np.int32)),
                        _const(f"{tag}/w", kernel[i, j, :, 0].astype(np.float32))]
                window = _node(f"{tag}/window", "StridedSlice", [x, f"{tag}/begin", f"{tag}/end", f"{tag}/strides"],
                               {"Index": 3})
                window.attr["begin_mask"].i = 9  # batch and channel axes whole
                window.attr["end_mask"].i = 9
                new += [window, _node(f"{tag}/term", "Mul", [f"{tag}/window", f"{tag}/w"])]
                terms.append(f"{tag}/term")
        controls = [i for i in conv.input if i.startswith("^")]
        conv.Clear()
        conv.name, conv.op = base, "AddN"
        conv.input.extend([*terms, *controls])
        conv.attr["N"].i = len(terms)
        conv.attr["T"].type = DT_FLOAT
        graph_def.node.extend(new)


def _max_pool3d_as_2d(graph_def: Any) -> None:
    """``MaxPool3D`` (no float64 kernel) as two ``MaxPool`` (which has one): the max over a
    kd x kh x kw box is the max over depth of the max over height x width, and SAME padding is
    per axis, so the result is exact. Depth, height, width and channels must be static (the
    batch is folded into the rows by ``Reshape``); an other MaxPool3D stays, and the twin then
    names it as the op without a float64 kernel."""
    tf = import_tf()
    pools = [n for n in graph_def.node if n.op == "MaxPool3D" and n.attr["data_format"].s in (b"NDHWC", b"")]
    if not pools:
        return
    graph = _graph_for_shapes(graph_def, tf)
    if graph is None:  # shapes unknown: keep the pools as they are
        return
    for pool in pools:
        x = list(pool.input)[0]
        try:
            d, h, w, c = graph.get_tensor_by_name(x if ":" in x else f"{x}:0").shape.as_list()[1:]
            od, oh, ow, _ = graph.get_tensor_by_name(f"{pool.name}:0").shape.as_list()[1:]
        except Exception:  # noqa: BLE001
            continue
        if None in (d, h, w, c, od, oh, ow):
            continue
        _, kd, kh, kw, _ = list(pool.attr["ksize"].list.i)
        _, sd, sh, sw, _ = list(pool.attr["strides"].list.i)
        padding, base = pool.attr["padding"].s, pool.name
        controls = [i for i in pool.input if i.startswith("^")]
        new = [_const(f"{base}/mp64_rows", np.array([-1, h, w, c], np.int32)),
               _node(f"{base}/mp64_r1", "Reshape", [x, f"{base}/mp64_rows"], {"Tshape": 3}),
               _max_pool(f"{base}/mp64_hw", f"{base}/mp64_r1", (kh, kw), (sh, sw), padding),
               _const(f"{base}/mp64_depth", np.array([-1, d, oh * ow, c], np.int32)),
               _node(f"{base}/mp64_r2", "Reshape", [f"{base}/mp64_hw", f"{base}/mp64_depth"], {"Tshape": 3}),
               _max_pool(f"{base}/mp64_d", f"{base}/mp64_r2", (kd, 1), (sd, 1), padding),
               _const(f"{base}/mp64_out", np.array([-1, od, oh, ow, c], np.int32))]
        pool.Clear()
        pool.name, pool.op = base, "Reshape"
        pool.input.extend([f"{base}/mp64_d", f"{base}/mp64_out", *controls])
        pool.attr["T"].type = DT_FLOAT
        pool.attr["Tshape"].type = 3
        graph_def.node.extend(new)


def bilinear_weights(in_size: int, out_size: int, *, align_corners: bool, half_pixel_centers: bool) -> np.ndarray:
    """The ``(out_size, in_size)`` float64 matrix of TensorFlow's ``ResizeBilinear`` along one axis
    (resize_bilinear_op.cc: source position ``(i + 0.5) * scale - 0.5`` with half-pixel centers,
    else ``i * scale``; the lower tap ``max(floor, 0)``, the upper ``min(ceil, in - 1)``)."""
    scale = (in_size - 1) / (out_size - 1) if align_corners and out_size > 1 else in_size / out_size
    weights = np.zeros((out_size, in_size), np.float64)
    for i in range(out_size):
        where = (i + 0.5) * scale - 0.5 if half_pixel_centers else i * scale
        floor = np.floor(where)
        lower, upper = max(int(floor), 0), min(int(np.ceil(where)), in_size - 1)
        lerp = where - floor
        weights[i, lower] += 1.0 - lerp
        weights[i, upper] += lerp
    return weights


def _const_value(nodes: dict, ref: str, tf: Any) -> np.ndarray | None:
    node = nodes.get(ref.split(":")[0].lstrip("^"))
    while node is not None and node.op == "Identity" and node.input:
        node = nodes.get(node.input[0].split(":")[0])
    if node is None or node.op != "Const":
        return None
    return tf.make_ndarray(node.attr["value"].tensor)


# Float32-output resizes whose weights TensorFlow computes its own way (ResizeBicubic from a
# 1024-entry table of the cubic kernel, not the kernel itself): the twin takes each axis' matrix
# from the op, run on one-hot rows; their inputs beside the images, by name.
_MEASURED_RESIZES = {"ResizeBicubic": ("size",), "ResizeArea": ("size",),
                     "ScaleAndTranslate": ("size", "scale", "translation")}


def _resizes_as_products(graph_def: Any) -> None:
    """Resizes with a float32 output whatever their input, as two float64 contractions.

    Why: ``ResizeBilinear`` (and ``ResizeBicubic``, ``ResizeArea``, ``ScaleAndTranslate``) return
    float32 (``passed float ... incompatible with expected double``), so a model with
    ``UpSampling2D(interpolation="bilinear")`` or ``tf.image.resize`` had no float64 twin and was
    judged by the fixed rule. A resize is linear and separable: ``y[n, i, j, c] = sum_hw A[i, h]
    B[j, w] x[n, h, w, c]``, two ``Einsum`` with float64 matrices. ``ResizeBilinear``'s are
    computed (``bilinear_weights``: exact, a scale of 2/3 is not rounded to float32); the others'
    are read from the op itself, one axis at a time on one-hot rows (float32: the weights the
    model uses, to float32 rounding: TensorFlow's bicubic reads a 1024-entry table of its
    kernel), kept only when they reproduce the op on a random image. Needs the input's static
    height and width and sizes computed from constants (and static shapes); any other stays,
    and the twin names it."""
    tf = import_tf()
    resizes = [n for n in graph_def.node if n.op == "ResizeBilinear" or n.op in _MEASURED_RESIZES]
    if not resizes:
        return
    graph = _graph_for_shapes(graph_def, tf)  # before any rewrite: the new nodes import only once retyped
    if graph is None:
        return
    nodes = {n.name: n for n in graph_def.node}
    for node in resizes:
        names = _MEASURED_RESIZES.get(node.op, ("size",))
        x, *rest = list(node.input)[:1 + len(names)]
        found = [_const_value(nodes, ref, tf) for ref in rest]
        found = [v if v is not None else _evaluated(graph, ref, tf) for v, ref in zip(found, rest)]
        shape = _static_shape(graph, x)
        values = [v for v in found if v is not None]
        if len(values) != len(names) or shape is None or len(shape) != 4 or shape[1] is None or shape[2] is None:
            continue
        height, width = int(shape[1]), int(shape[2])
        if node.op == "ResizeBilinear":
            size = values[0]
            options = {"align_corners": node.attr["align_corners"].b,
                       "half_pixel_centers": node.attr["half_pixel_centers"].b}
            matrices: tuple[np.ndarray, np.ndarray] | None = (
                bilinear_weights(height, int(size[0]), **options), bilinear_weights(width, int(size[1]), **options))
        else:
            matrices = _measure_resize(node, dict(zip(names, values)), height, width, tf)
        if matrices is None:
            continue
        base, new = node.name, []
        if node.attr["T"].type not in (DT_FLOAT, DT_HALF, DT_BFLOAT16, DT_DOUBLE):  # uint8 pixels: to float first
            cast = _node(f"{base}/mp64_cast", "Cast", [x], {"SrcT": node.attr["T"].type, "DstT": DT_FLOAT})
            del cast.attr["T"]
            new.append(cast)
            x = cast.name
        new += [_const(f"{base}/mp64_rows", matrices[0]), _const(f"{base}/mp64_cols", matrices[1]),
                _einsum(f"{base}/mp64_h", "nhwc,ih->niwc", [x, f"{base}/mp64_rows"])]
        controls = [i for i in node.input if i.startswith("^")]
        node.CopyFrom(_einsum(base, "niwc,jw->nijc", [f"{base}/mp64_h", f"{base}/mp64_cols", *controls]))
        graph_def.node.extend(new)


def _evaluated(graph: Any, ref: str, tf: Any) -> np.ndarray | None:
    """The value of ``ref`` when it is computed from constants and static shapes alone
    (``tf.image.resize`` computes ScaleAndTranslate's scale as the size over the image's
    ``Shape``), else None. The tensors it reads only through shape ops are fed zeros with a
    batch of 1 and of 2: the value must not change (it may not depend on the batch)."""
    shape_ops = ("Shape", "ShapeN", "Size", "Rank")
    try:
        tensor = graph.get_tensor_by_name(ref if ":" in ref else f"{ref}:0")
        pending, seen, shaped = [tensor.op], set(), set()
        while pending:
            op = pending.pop()
            if op.name in seen:
                continue
            seen.add(op.name)
            if op.type.startswith("Placeholder") or op.type in ("VarHandleOp", "ReadVariableOp") or len(seen) > 200:
                return None
            if op.type in shape_ops:  # only the shape of its input is read: fed zeros of that shape
                shaped.update(op.inputs)
                continue
            pending.extend(t.op for t in op.inputs)
        found = []
        with quiet(), tf.compat.v1.Session(graph=graph) as session:
            for batch in (1, 2):
                feeds = {}
                for fed in shaped:
                    dims = fed.shape
                    if dims.rank is None or None in dims.as_list()[1:]:
                        return None
                    feeds[fed] = np.zeros([batch if d is None else d for d in dims.as_list()], fed.dtype.as_numpy_dtype)
                found.append(np.asarray(session.run(tensor, feeds)))
        return found[0] if np.array_equal(found[0], found[1]) else None
    except Exception:  # noqa: BLE001
        return None


def _measure_resize(node: Any, values: dict[str, np.ndarray], height: int, width: int,
                    tf: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """``(rows, cols)``: the op's matrix along height and along width (float64 of its float32
    weights), or None when they do not reproduce it on a random image."""
    size = [int(v) for v in values["size"]]
    attrs = {k: node.attr[k].b for k in ("align_corners", "half_pixel_centers", "antialias") if k in node.attr}
    if node.op == "ScaleAndTranslate":
        attrs["kernel_type"] = node.attr["kernel_type"].s.decode()

    def axis(extra: dict[str, Any], scale: list[float], shift: list[float]) -> dict[str, Any]:
        if node.op == "ScaleAndTranslate":
            extra = {**extra, "scale": np.array(scale, np.float32), "translation": np.array(shift, np.float32)}
        return extra

    scale = [float(v) for v in values.get("scale", [1.0, 1.0])]
    shift = [float(v) for v in values.get("translation", [0.0, 0.0])]
    run = getattr(tf.raw_ops, node.op)
    graph = tf.Graph()
    try:
        with graph.as_default():
            rows_in = tf.constant(np.eye(height, dtype=np.float32).reshape(1, height, 1, height))
            cols_in = tf.constant(np.eye(width, dtype=np.float32).reshape(1, 1, width, width))
            sample = np.random.default_rng(0).normal(size=(1, height, width, 2)).astype(np.float32)
            rows = run(images=rows_in, size=[size[0], 1], **axis(attrs, [scale[0], 1.0], [shift[0], 0.0]))
            cols = run(images=cols_in, size=[1, size[1]], **axis(attrs, [1.0, scale[1]], [0.0, shift[1]]))
            whole = run(images=tf.constant(sample), size=size, **axis(attrs, scale, shift))
            with quiet(), tf.compat.v1.Session(graph=graph) as session:
                a, b, want = session.run([rows, cols, whole])
    except Exception:  # noqa: BLE001 - not measurable: the op stays, and the twin names it
        return None
    a = np.asarray(a, np.float64)[0, :, 0, :]
    b = np.asarray(b, np.float64)[0, 0, :, :]
    got = np.einsum("ih,jw,nhwc->nijc", a, b, sample.astype(np.float64))
    if got.shape != want.shape or np.abs(got - want).max() > 1e-5 * max(np.abs(want).max(), 1.0):
        return None
    return a, b


def _einsum(name: str, equation: str, inputs: list[str]) -> Any:
    node = _node(name, "Einsum", inputs)
    node.attr["equation"].s = equation.encode()
    node.attr["N"].i = 2
    return node


def _max_pool(name: str, x: str, ksize: tuple[int, int], strides: tuple[int, int], padding: bytes) -> Any:
    node = _node(name, "MaxPool", [x])
    node.attr["ksize"].list.i.extend([1, ksize[0], ksize[1], 1])
    node.attr["strides"].list.i.extend([1, strides[0], strides[1], 1])
    node.attr["padding"].s = padding
    node.attr["data_format"].s = b"NHWC"
    return node


def _depthwise_plan(conv: Any, nodes: dict, graph: Any, tf: Any) -> Any:
    """``(input, kernel, strides, pads, output size)`` of a plain depthwise convolution, else None."""
    attr = conv.attr
    if (attr["data_format"].s not in (b"NHWC", b"") or attr["padding"].s not in (b"SAME", b"VALID")
            or any(d != 1 for d in attr["dilations"].list.i) or attr["T"].type != DT_FLOAT):
        return None
    x, filt = list(conv.input)[:2]
    source = nodes.get(filt.split(":")[0].lstrip("^"))
    while source is not None and source.op == "Identity":
        source = nodes.get(source.input[0].split(":")[0])
    if source is None or source.op != "Const":
        return None
    kernel = tf.make_ndarray(source.attr["value"].tensor)
    try:
        height, width, channels = graph.get_tensor_by_name(x if ":" in x else f"{x}:0").shape.as_list()[1:4]
    except Exception:  # noqa: BLE001
        return None
    if height is None or width is None or kernel.ndim != 4:
        return None
    if conv.op == "Conv2D":  # grouped, one group per channel (ConvNeXt): a depthwise kernel
        if kernel.shape[2] != 1 or channels is None or channels < 2 or kernel.shape[3] != channels:
            return None
        kernel = kernel.transpose(0, 1, 3, 2)
    elif kernel.shape[3] != 1:
        return None
    strides = list(attr["strides"].list.i)
    sh, sw = (strides[1], strides[2]) if len(strides) == 4 else (1, 1)
    kh, kw = kernel.shape[:2]
    if attr["padding"].s == b"SAME":  # TensorFlow's SAME: the extra row/column goes after
        oh, ow = -(-height // sh), -(-width // sw)
        ph, pw = max((oh - 1) * sh + kh - height, 0), max((ow - 1) * sw + kw - width, 0)
        pads = (ph // 2, ph - ph // 2, pw // 2, pw - pw // 2)
    else:
        oh, ow = -(-(height - kh + 1) // sh), -(-(width - kw + 1) // sw)
        pads = (0, 0, 0, 0)
    return x, kernel, (sh, sw), pads, (oh, ow)


def _const(name: str, value: np.ndarray) -> Any:
    tf = import_tf()
    node = tf.compat.v1.NodeDef()
    node.name, node.op = name, "Const"
    node.attr["dtype"].type = tf.as_dtype(value.dtype).as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    return node


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


def carry_tables(graph_def: Any, tables: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> list[str]:
    """Each table placeholder of ``graph_def`` (``FrozenGraph.tables``: a lookup table's handle,
    fed from a capture) made a ``HashTableV2`` of its own, filled with the captured table's keys
    and values by an ``InitializeTableV2`` node; returns the names of those nodes (run them once).

    Why: a freeze makes variables constants, not tables, so the graph twin of a model with an
    adapted ``StringLookup``/``IntegerLookup``/``TextVectorization`` failed on an unfed table
    handle ("running the rewritten graph failed") and had no second estimate to give."""
    tf = import_tf()
    inits = []
    for node in graph_def.node:
        found = tables.get(f"{node.name}:0")
        if node.op != "Placeholder" or found is None:
            continue
        keys, values = found
        base = node.name
        node.ClearField("attr")
        node.op = "HashTableV2"
        node.attr["key_dtype"].type = tf.as_dtype(keys.dtype).as_datatype_enum
        node.attr["value_dtype"].type = tf.as_dtype(values.dtype).as_datatype_enum
        node.attr["shared_name"].s = f"modelparity_twin_{base}".encode()
        new = [_const(f"{base}/mp64_keys", keys), _const(f"{base}/mp64_values", values)]
        init = _node(f"{base}/mp64_init", "InitializeTableV2", [base, f"{base}/mp64_keys", f"{base}/mp64_values"])
        init.ClearField("attr")
        init.attr["Tkey"].type = node.attr["key_dtype"].type
        init.attr["Tval"].type = node.attr["value_dtype"].type
        graph_def.node.extend([*new, init])
        inits.append(init.name)
    return inits


# -- running ------------------------------------------------------------------------------

class GraphTwin:
    """A rewritten graph in its own ``tf.Graph`` and Session, fed and fetched by position."""

    def __init__(self, frozen: FrozenGraph, graph_def: Any, input_dtype: Any) -> None:
        tf = import_tf()
        self.graph = tf.Graph()
        inits = carry_tables(graph_def, frozen.tables) if frozen.tables else []
        try:
            with quiet(), self.graph.as_default():
                tf.graph_util.import_graph_def(graph_def, name="")
        except Exception as exc:  # noqa: BLE001
            raise GraphUnavailable(f"the rewritten graph does not import ({type(exc).__name__}: "
                                       f"{_first(exc)})") from exc
        self.inputs = [self.graph.get_tensor_by_name(n) for n in frozen.inputs]
        self.outputs = [self.graph.get_tensor_by_name(n) for n in frozen.outputs]
        self.input_dtype = input_dtype
        config = tf.compat.v1.ConfigProto(device_count={"GPU": 0})
        # Grappler off: the twin runs the ops as rewritten (a fusion or an arithmetic rewrite
        # would run others), and its first run was most of its cost (InceptionV3 at 75 px: the
        # float64 and reordered twins' first runs 4.25 s + 1.95 s with Grappler, 0.82 s + 0.51 s
        # without; outputs equal to 5e-12 of 0.35 in float64, bitwise in the reordered float32).
        config.graph_options.rewrite_options.disable_meta_optimizer = True
        self.session = tf.compat.v1.Session(graph=self.graph, config=config)
        if inits:
            try:
                self.session.run([self.graph.get_operation_by_name(n) for n in inits])
            except Exception as exc:  # noqa: BLE001
                raise GraphUnavailable(f"filling its lookup tables failed ({type(exc).__name__}: "
                                       f"{_first(exc)})") from exc

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
            raise GraphUnavailable(f"running the rewritten graph failed ({type(exc).__name__}: "
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
    """The float64 twin (``kind="float64"``), the reordered float32 twin (``"float32
    reordered"``) or the float16-weights twin of ``frozen``."""
    if kind == "float32 reordered":
        return GraphTwin(frozen, reordered_graph_def(frozen.graph_def), np.float32)
    if kind == "float64":
        return GraphTwin(frozen, float64_graph_def(frozen.graph_def, frozen.outputs), np.float64)
    if kind == "float16 weights":
        return GraphTwin(frozen, float16_weights_graph_def(frozen.graph_def), np.float32)
    raise ValueError(f"graph twin kind {kind!r}")


_NODE_IN_TEXT = re.compile(r"\{\{node ([^}]+)\}\}|Detected at node '([^']+)'|node ([\w/.-]+) ")
_NOT_THE_CAUSE = ("Graph execution error", "Detected at node", "Node:", "[[", "File ", "Traceback", "Stack trace",
                  "defined at")


def _first(exc: BaseException) -> str:
    """The cause of ``exc`` in a line, with the node it happened at when TensorFlow says:
    "Graph execution error:" alone named neither (the graph twin of an STFT front-end)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    cause = next((ln for ln in lines if not ln.startswith(_NOT_THE_CAUSE)), lines[0] if lines else type(exc).__name__)
    node_def = getattr(exc, "node_def", None)
    node, op = getattr(node_def, "name", "") or "", getattr(node_def, "op", "") or ""
    if not node:
        found = _NODE_IN_TEXT.search(str(exc))
        node = next((g for g in found.groups() if g), "") if found else ""
    where = f"at node {node!r}" + (f" ({op})" if op else "") + ": " if node else ""
    return (where + cause)[:300]
