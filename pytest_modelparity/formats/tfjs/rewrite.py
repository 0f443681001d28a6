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
- tfjs-converter 4.22's op table reads ``MatrixBandPart``'s ``num_upper`` from input 1 (its
  ``num_lower``), so Keras' causal mask (``MatrixBandPart(ones, -1, 0)``, lower triangle) runs as
  ``MatrixBandPart(ones, -1, -1)``: all ones, every token attends to the future (a GPT decoder's
  logits off by 1.2x their scale). Each ``MatrixBandPart`` is rewritten after the converter's
  optimisation into the band test written out (``Range``, ``Sub``, comparisons, ``SelectV2``).

All run inside :func:`patched_converter`, which wraps the converter's ``optimize_graph`` for
the duration of one conversion only. TensorFlow is imported lazily (by the caller's converter).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator

# Fused activations the tfjs backends (cpu, wasm) lack, and the ops that compute them.
UNSUPPORTED_FUSED = {"_FusedHardSwish": "hard-swish"}
_FUSED_OPS = ("_FusedConv2D", "_FusedMatMul", "FusedDepthwiseConv2dNative", "_FusedDepthwiseConv2dNative")


def _const(tf: Any, name: str, value: Any, dtype: Any) -> Any:
    node = tf.compat.v1.NodeDef(name=name, op="Const")
    node.attr["dtype"].type = dtype
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, dtype=tf.as_dtype(dtype)))
    return node


def _op(tf: Any, name: str, op: str, inputs: list[str], dtype: Any) -> Any:
    node = tf.compat.v1.NodeDef(name=name, op=op, input=inputs)
    node.attr["T"].type = dtype
    return node


def _rewrite_each(graph_def: Any, op: str, build: Any) -> int:
    """Rewrite every ``op`` node of the graph in place: ``build(tf, node, x, controls, dtype)``
    returns (the node's new op, its new inputs, the nodes those need); the node keeps its name,
    so its consumers need no change. Returns how many."""
    import tensorflow as tf

    count = 0
    new_nodes = []
    for node in graph_def.node:
        if node.op != op:
            continue
        dtype = node.attr["T"].type
        data_inputs = [i for i in node.input if not i.startswith("^")]
        controls = [i for i in node.input if i.startswith("^")]
        node.op, inputs, added = build(tf, node, data_inputs[0], controls, dtype)
        del node.input[:]
        node.input.extend(inputs)
        new_nodes += added
        count += 1
    graph_def.node.extend(new_nodes)
    return count


def rewrite_erfc(graph_def: Any) -> int:
    """Replace every ``Erfc(x)`` of the graph by ``1 - Erf(x)`` in place; return how many."""
    def build(tf: Any, node: Any, x: str, controls: list[str], dtype: Any) -> tuple[str, list[str], list[Any]]:
        erf = _op(tf, f"{node.name}/erf", "Erf", [x] + controls, dtype)
        one = _const(tf, f"{node.name}/one", 1.0, dtype)
        return "Sub", [one.name, erf.name], [erf, one]

    return _rewrite_each(graph_def, "Erfc", build)


def rewrite_softsign(graph_def: Any) -> int:
    """Replace every ``Softsign(x)`` by ``x / (1 + |x|)`` in place (tfjs 4.22 has no Softsign:
    "Unsupported Ops ... Softsign", 8 of 697 drawn models of a fuzz run); return how many."""
    def build(tf: Any, node: Any, x: str, controls: list[str], dtype: Any) -> tuple[str, list[str], list[Any]]:
        magnitude = _op(tf, f"{node.name}/abs", "Abs", [x] + controls, dtype)
        one = _const(tf, f"{node.name}/one", 1.0, dtype)
        denominator = _op(tf, f"{node.name}/one_plus_abs", "AddV2", [one.name, magnitude.name], dtype)
        return "RealDiv", [x, denominator.name], [magnitude, one, denominator]

    return _rewrite_each(graph_def, "Softsign", build)


def split_fused_hard_swish(graph_def: Any, activation: str = "_FusedHardSwish") -> int:
    """Split fused ops ending in ``_FusedHardSwish`` (or ``activation``) into the fused op and
    plain hard-swish ops (a plain ``Tanh`` for ``Tanh``).

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
        if not fused or fused[-1] != activation:
            continue
        dtype = node.attr["T"].type
        name = node.name
        base = f"{name}/fused"
        conv = tf.compat.v1.NodeDef()
        conv.CopyFrom(node)
        conv.name = base
        del conv.attr["fused_ops"].list.s[:]
        conv.attr["fused_ops"].list.s.extend([s.encode() for s in fused[:-1]])
        controls = [i for i in node.input if i.startswith("^")]
        if activation == "Tanh":
            extra, last = [], _op(tf, name, "Tanh", [base] + controls, dtype)
        else:
            three = _const(tf, f"{node.name}/hard_swish/three", 3.0, dtype)
            sixth = _const(tf, f"{node.name}/hard_swish/sixth", 1.0 / 6.0, dtype)
            add = _op(tf, f"{node.name}/hard_swish/add", "AddV2", [base, three.name], dtype)
            relu6 = _op(tf, f"{node.name}/hard_swish/relu6", "Relu6", [add.name], dtype)
            gate = _op(tf, f"{node.name}/hard_swish/gate", "Mul", [relu6.name, sixth.name], dtype)
            extra, last = [three, sixth, add, relu6, gate], _op(tf, name, "Mul", [base, gate.name] + controls, dtype)
        node.Clear()
        node.CopyFrom(last)
        node.device = conv.device
        new_nodes += [conv, *extra]
        count += 1
    graph_def.node.extend(new_nodes)
    return count


def split_fused_tanh(graph_def: Any) -> int:
    """Split fused ops ending in ``Tanh`` into the fused op and a plain ``Tanh``: neither tfjs
    backend runs a fused tanh ("Activation tanh has not been implemented"), and Grappler's oneDNN
    remapper fuses Dense + tanh into one ``_FusedMatMul`` wherever oneDNN is on (TensorFlow's
    default on CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX). Same shape as the hard-swish
    split: the node keeps its name as the tanh's result."""
    return split_fused_hard_swish(graph_def, activation="Tanh")


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


def _strided_last(tf: Any, name: str, shape: str, axis: int) -> list[Any]:
    """``shape[axis]`` (axis -2 or -1) as an int32 scalar: a StridedSlice and its three Consts."""
    i32 = tf.int32.as_datatype_enum
    begin = _const(tf, f"{name}/begin", [axis], i32)
    end = _const(tf, f"{name}/end", [axis + 1 if axis != -1 else 0], i32)
    step = _const(tf, f"{name}/step", [1], i32)
    node = tf.compat.v1.NodeDef(name=name, op="StridedSlice", input=[shape, begin.name, end.name, step.name])
    node.attr["T"].type = tf.int32.as_datatype_enum
    node.attr["Index"].type = tf.int32.as_datatype_enum
    for mask in ("begin_mask", "ellipsis_mask", "new_axis_mask"):
        node.attr[mask].i = 0
    node.attr["end_mask"].i = 1 if axis == -1 else 0
    node.attr["shrink_axis_mask"].i = 1
    return [begin, end, step, node]


def rewrite_band_part(graph_def: Any) -> int:
    """Replace every ``MatrixBandPart(a, lower, upper)`` by ``SelectV2(in_band, a, zeros_like(a))``
    (``LogicalAnd(in_band, a)`` for a bool ``a``: the wasm backend selects bool tensors wrong) with ``in_band[m, n] = (lower < 0 or m - n <= lower) and (upper < 0 or n - m <= upper)``,
    TensorFlow's definition, in ops tfjs 4.22 maps right. The node keeps its name (its consumers
    need no change); returns how many were rewritten."""
    import tensorflow as tf

    i32 = tf.int32.as_datatype_enum
    count = 0
    new_nodes: list[Any] = []
    for node in graph_def.node:
        if node.op != "MatrixBandPart":
            continue
        data = [i for i in node.input if not i.startswith("^")]
        controls = [i for i in node.input if i.startswith("^")]
        if len(data) != 3:
            continue
        a, lower, upper = data
        name, dtype = node.name, node.attr["T"].type
        p = f"{name}/band"
        shape = tf.compat.v1.NodeDef(name=f"{p}/shape", op="Shape", input=[a])
        shape.attr["T"].type = dtype
        shape.attr["out_type"].type = i32
        rows = _strided_last(tf, f"{p}/rows", shape.name, -2)
        cols = _strided_last(tf, f"{p}/cols", shape.name, -1)
        zero = _const(tf, f"{p}/zero", 0, i32)
        one = _const(tf, f"{p}/one", 1, i32)
        nodes = [shape, *rows, *cols, zero, one]
        m_range = tf.compat.v1.NodeDef(name=f"{p}/m", op="Range", input=[zero.name, rows[-1].name, one.name])
        n_range = tf.compat.v1.NodeDef(name=f"{p}/n", op="Range", input=[zero.name, cols[-1].name, one.name])
        for r in (m_range, n_range):
            r.attr["Tidx"].type = i32
        axis = _const(tf, f"{p}/axis", 1, i32)
        m_col = tf.compat.v1.NodeDef(name=f"{p}/m_col", op="ExpandDims", input=[m_range.name, axis.name])
        m_col.attr["T"].type = i32
        m_col.attr["Tdim"].type = i32
        below = _op(tf, f"{p}/m_minus_n", "Sub", [m_col.name, n_range.name], i32)
        above = _op(tf, f"{p}/n_minus_m", "Sub", [n_range.name, m_col.name], i32)
        nodes += [m_range, n_range, axis, m_col, below, above]
        tests = []
        for side, diff, bound in (("lower", below, lower), ("upper", above, upper)):
            unbounded = _op(tf, f"{p}/{side}_unbounded", "Less", [bound, zero.name], i32)
            within = _op(tf, f"{p}/{side}_within", "LessEqual", [diff.name, bound], i32)
            ok = tf.compat.v1.NodeDef(name=f"{p}/{side}_ok", op="LogicalOr", input=[unbounded.name, within.name])
            nodes += [unbounded, within, ok]
            tests.append(ok.name)
        in_band = tf.compat.v1.NodeDef(name=f"{p}/in_band", op="LogicalAnd", input=tests)
        nodes.append(in_band)
        device = node.device
        node.Clear()
        if dtype == tf.bool.as_datatype_enum:
            # Keras' causal mask is a bool band_part; tfjs-backend-wasm 4.22 selects between bool
            # tensors wrong (where(c, ones, zeros) of a lower triangle gave 111100000, cpu 100110111),
            # so a bool band is the logical and, which it computes right
            node.CopyFrom(tf.compat.v1.NodeDef(name=name, op="LogicalAnd", input=[in_band.name, a] + controls))
        else:
            zeros = _op(tf, f"{p}/zeros", "ZerosLike", [a], dtype)
            nodes.append(zeros)
            node.CopyFrom(_op(tf, name, "SelectV2", [in_band.name, a, zeros.name] + controls, dtype))
        node.device = device
        new_nodes += nodes
        count += 1
    graph_def.node.extend(new_nodes)
    return count


def _einsum_plan(equation: str, a_shape: list, b_shape: list) -> dict[str, Any] | None:
    """How ``Einsum(equation)`` of two operands of these static shapes (None: unknown) runs as
    transposes, reshapes and one (batch) matmul; None when it cannot (ellipsis, an index twice in
    one operand, an index summed within one operand, an unknown contracted size or more than one
    unknown size in a reshape)."""
    if "..." in equation or "->" not in equation:
        return None
    ins, out = equation.replace(" ", "").split("->")
    operands = ins.split(",")
    if len(operands) != 2:
        return None
    a, b = operands
    if len(set(a)) != len(a) or len(set(b)) != len(b) or len(set(out)) != len(out):
        return None
    if len(a) != len(a_shape) or len(b) != len(b_shape) or not set(out) <= set(a) | set(b):
        return None
    if (set(a) - set(b) - set(out)) or (set(b) - set(a) - set(out)):
        return None
    size: dict[str, Any] = {}
    for labels, shape in ((a, a_shape), (b, b_shape)):
        for label, dim in zip(labels, shape):
            if dim is not None:
                size[label] = int(dim)
    batch = [c for c in out if c in a and c in b]
    left = [c for c in out if c in a and c not in b]
    right = [c for c in out if c in b and c not in a]
    contract = [c for c in a if c in b and c not in out]

    def prod(labels: list[str]) -> int:
        if any(c not in size for c in labels):
            return -1
        n = 1
        for c in labels:
            n *= size[c]
        return n

    if prod(contract) == -1:
        return None
    a_shape2 = ([prod(batch)] if batch else []) + [prod(left), prod(contract)]
    b_shape2 = ([prod(batch)] if batch else []) + [prod(contract), prod(right)]
    grouped = batch + left + right
    out_shape = [size.get(c, -1) for c in grouped]
    if any(s.count(-1) > 1 for s in (a_shape2, b_shape2, out_shape)):
        return None
    return {"a_perm": [a.index(c) for c in batch + left + contract], "a_shape": a_shape2,
            "b_perm": [b.index(c) for c in batch + contract + right], "b_shape": b_shape2,
            "batched": bool(batch), "out_shape": out_shape, "out_perm": [grouped.index(c) for c in out]}


def rewrite_einsum(graph_def: Any) -> int:
    """Replace every two-operand ``Einsum`` by transposes, reshapes and one ``BatchMatMulV2`` (or
    ``MatMul``), in place; return how many.

    Why: Keras' ``MultiHeadAttention`` and ``EinsumDense`` run as Einsum. tfjs 4.22's cpu backend
    computes it element by element (a MobileViT-like net at 128 px: 21.5 of 22.5 s of a predict in
    24 Einsum kernels) and the wasm backend has no Einsum kernel at all. Sizes come from TensorFlow's
    own shape inference over the optimised graph; an Einsum it cannot plan stays as it was."""
    import tensorflow as tf

    einsums = [n for n in graph_def.node if n.op == "Einsum"]
    if not einsums:
        return 0
    try:
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
    except Exception:  # noqa: BLE001 - no shapes, no rewrite: the graph converts as it is
        return 0
    i32 = tf.int32.as_datatype_enum
    count = 0
    new_nodes: list[Any] = []
    for node in einsums:
        data = [i for i in node.input if not i.startswith("^")]
        controls = [i for i in node.input if i.startswith("^")]
        if len(data) != 2:
            continue
        try:
            op = graph.get_operation_by_name(node.name)
            shapes = [t.shape.as_list() for t in op.inputs]
        except (KeyError, ValueError):
            continue
        plan = _einsum_plan(node.attr["equation"].s.decode(), shapes[0], shapes[1])
        if plan is None:
            continue
        name, dtype, p = node.name, node.attr["T"].type, f"{node.name}/matmul"
        nodes: list[Any] = []

        def transpose(tag: str, source: str, perm: list[int]) -> str:
            if perm == sorted(perm):
                return source
            const = _const(tf, f"{p}/{tag}_perm", perm, i32)
            t = tf.compat.v1.NodeDef(name=f"{p}/{tag}_t", op="Transpose", input=[source, const.name])
            t.attr["T"].type = dtype
            t.attr["Tperm"].type = i32
            nodes.extend([const, t])
            return t.name

        def reshape(tag: str, source: str, shape: list[int], final: str | None = None) -> Any:
            const = _const(tf, f"{p}/{tag}_shape", shape, i32)
            r = tf.compat.v1.NodeDef(name=final or f"{p}/{tag}_r", op="Reshape", input=[source, const.name])
            r.attr["T"].type = dtype
            r.attr["Tshape"].type = i32
            nodes.append(const)
            return r

        lhs = reshape("a", transpose("a", data[0], plan["a_perm"]), plan["a_shape"])
        rhs = reshape("b", transpose("b", data[1], plan["b_perm"]), plan["b_shape"])
        nodes += [lhs, rhs]
        mm = tf.compat.v1.NodeDef(name=f"{p}/mm", op="BatchMatMulV2" if plan["batched"] else "MatMul",
                                  input=[lhs.name, rhs.name] + controls)
        mm.attr["T"].type = dtype
        for flag in (("adj_x", "adj_y") if plan["batched"] else ("transpose_a", "transpose_b")):
            mm.attr[flag].b = False
        nodes.append(mm)
        identity_out = plan["out_perm"] == sorted(plan["out_perm"])
        shaped = reshape("out", mm.name, plan["out_shape"], final=name if identity_out else None)
        device = node.device
        node.Clear()
        if identity_out:
            node.CopyFrom(shaped)
        else:
            nodes.append(shaped)
            const = _const(tf, f"{p}/out_perm", plan["out_perm"], i32)
            nodes.append(const)
            node.CopyFrom(tf.compat.v1.NodeDef(name=name, op="Transpose", input=[shaped.name, const.name]))
            node.attr["T"].type = dtype
            node.attr["Tperm"].type = i32
        node.device = device
        new_nodes += nodes
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


# Ops that only check or print (tf.debugging.assert_*, tf.print, tf.debugging.check_numerics):
# tfjs has no kernel for them, and a trained model carries them in its own code.
DEBUG_OPS = frozenset({"Assert", "CheckNumerics", "Print", "PrintV2"})


def strip_debug_ops(graph_def: Any, outputs: Iterable[str] = ()) -> int:
    """Remove the debug ops of ``graph_def`` in place: ``Assert``/``PrintV2`` with the control
    edges to them, ``CheckNumerics``/``Print`` turned into the ``Identity`` of their input; then
    the nodes only they used (their message's ``StringFormat``, the assert's condition) when
    ``outputs`` (node names) says what the graph computes. Returns how many debug ops went."""
    nodes = list(graph_def.node)
    gone = {n.name for n in nodes if n.op in ("Assert", "PrintV2")}
    count = len(gone) + _strip_debug_functions(graph_def)
    debug_functions = {f.signature.name for f in graph_def.library.function if f.signature.description == _STRIPPED}
    for node in nodes:
        # tf.debugging.assert_* in graph mode: an If ("AssertGuard") whose false branch asserts and
        # whose one output is its condition. With the Assert gone it is the Identity of it.
        branches = {node.attr[a].func.name for a in ("then_branch", "else_branch") if a in node.attr}
        if node.op in ("If", "StatelessIf") and branches & debug_functions and len(node.attr["Tout"].list.type) == 1:
            dtype = node.attr["Tout"].list.type[0]
            data = [i for i in node.input if not i.startswith("^")][:1]
            control = [i for i in node.input if i.startswith("^")]
            node.op = "Identity"
            node.ClearField("input")
            node.input.extend(data + control)
            node.ClearField("attr")
            node.attr["T"].type = dtype
    for node in nodes:
        if node.op in ("CheckNumerics", "Print"):
            data = [i for i in node.input if not i.startswith("^")][:1]
            control = [i for i in node.input if i.startswith("^")]
            dtype = node.attr["T"].type
            node.op = "Identity"
            node.ClearField("input")
            node.input.extend(data + control)
            node.ClearField("attr")
            node.attr["T"].type = dtype
            count += 1
    kept = [n for n in nodes if n.name not in gone]
    for node in kept:
        edges = [i for i in node.input if not (i.startswith("^") and i[1:] in gone)]
        if len(edges) != len(node.input):
            node.ClearField("input")
            node.input.extend(edges)
    wanted = {o.split(":")[0].lstrip("^") for o in outputs}
    if wanted:
        by_name = {n.name: n for n in kept}
        live: set[str] = set()
        stack = [w for w in wanted if w in by_name]
        while stack:
            name = stack.pop()
            if name in live:
                continue
            live.add(name)
            stack.extend(i.lstrip("^").split(":")[0] for i in by_name[name].input if i.lstrip("^").split(":")[0] in by_name)
        kept = [n for n in kept if n.name in live or n.op == "Placeholder"]
    if count:
        del graph_def.node[:]
        graph_def.node.extend(kept)
    return count


def depthwise_grouped_convs(graph_def: Any) -> int:
    """A ``Conv2D`` with one group per channel (filter ``[kh, kw, 1, C]`` on C channels: Keras'
    ``Conv2D(groups=C)``, ConvNeXt's depthwise blocks) as the ``DepthwiseConv2dNative`` it is:
    tfjs's conv2d has no groups ("depth of input (C) must match input depth for filter 1").
    Only with a constant filter and a known channel count. Returns how many were rewritten."""
    import tensorflow as tf

    nodes = {n.name: n for n in graph_def.node}
    candidates = []
    for conv in graph_def.node:
        if conv.op != "Conv2D" or conv.attr["data_format"].s not in (b"NHWC", b""):
            continue
        source = nodes.get(list(conv.input)[1].split(":")[0])
        while source is not None and source.op == "Identity":
            source = nodes.get(source.input[0].split(":")[0])
        if source is not None and source.op == "Const":
            kernel = tf.make_ndarray(source.attr["value"].tensor)
            if kernel.ndim == 4 and kernel.shape[2] == 1 and kernel.shape[3] > 1:
                candidates.append((conv, source, kernel))
    if not candidates:
        return 0
    graph = tf.Graph()
    try:
        with graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
    except Exception:  # noqa: BLE001 - shapes unknown: leave the graph as it is
        return 0
    count = 0
    for conv, source, kernel in candidates:
        x = conv.input[0]
        try:
            channels = graph.get_tensor_by_name(x if ":" in x else f"{x}:0").shape.as_list()[-1]
        except Exception:  # noqa: BLE001
            continue
        if channels != kernel.shape[3]:
            continue
        filter_node = graph_def.node.add()
        filter_node.name, filter_node.op = f"{conv.name}/depthwise_filter", "Const"
        filter_node.attr["dtype"].type = source.attr["dtype"].type
        filter_node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(kernel.transpose(0, 1, 3, 2)))
        conv.op = "DepthwiseConv2dNative"
        conv.input[1] = filter_node.name
        if "use_cudnn_on_gpu" in conv.attr:
            del conv.attr["use_cudnn_on_gpu"]
        count += 1
    return count


_STRIPPED = "modelparity: debug ops stripped"


def _strip_debug_functions(graph_def: Any) -> int:
    """Remove ``Assert``/``PrintV2`` (and their control outputs) from the library's functions;
    a function that had some is marked in its description. Returns how many went."""
    count = 0
    for function in graph_def.library.function:
        gone = {n.name for n in function.node_def if n.op in ("Assert", "PrintV2")}
        if not gone:
            continue
        count += len(gone)
        kept = [n for n in function.node_def if n.name not in gone]
        for node in kept:
            edges = [i for i in node.input if not (i.startswith("^") and i[1:].split(":")[0] in gone)]
            del node.input[:]
            node.input.extend(edges)
        del function.node_def[:]
        function.node_def.extend(kept)
        for key in [k for k, v in function.control_ret.items() if v.split(":")[0] in gone]:
            del function.control_ret[key]
        outputs = [o for o in function.signature.control_output if o in function.control_ret]
        del function.signature.control_output[:]
        function.signature.control_output.extend(outputs)
        function.signature.description = _STRIPPED
    return count


def order_list_writes(graph_def: Any) -> int:
    """In each loop body of the library, make the ``Identity`` that returns a value also written
    to a tensor list (``TensorListSetItem``: a Keras RNN's per-step output with
    ``return_sequences=True``) wait for that write; returns how many were ordered.

    Why: tfjs's ``Identity`` returns a kept tensor itself but clones one not yet kept, and a
    function's end disposes every tensor that is not an output, kept or not. Run before the
    write, the Identity returns a clone and the step's value, now only in the list, is disposed:
    the ``TensorListStack`` after the loop then fails with "Cannot read properties of undefined
    (reading 'backend')". Run after it (the write keeps the value), it returns that value, which
    stays alive as the body's output and then in the list.
    """
    count = 0
    for function in graph_def.library.function:
        returned = {v for v in function.ret.values()}
        writes = [(n.name, n.input[2]) for n in function.node_def if n.op == "TensorListSetItem" and len(n.input) > 2]
        for node in function.node_def:
            if node.op != "Identity" or not node.input or f"{node.name}:output:0" not in returned:
                continue
            for write, item in writes:
                if node.input[0] == item and f"^{write}" not in node.input:
                    node.input.append(f"^{write}")
                    count += 1
    return count


@contextlib.contextmanager
def patched_converter(converter: Any, stats: dict[str, int]) -> Iterator[None]:
    """Run the converter with :func:`strip_debug_ops`, :func:`rewrite_erfc` and :func:`rewrite_softsign` before and :func:`split_fused_hard_swish`,
    :func:`split_fused_tanh`,
    :func:`unfuse_non_vector_bias`, :func:`rewrite_band_part` and :func:`rewrite_einsum` after its ``optimize_graph``; ``stats`` receives how many nodes each rewrote."""
    import tensorflow as tf

    original = converter.optimize_graph

    def optimize_graph(graph: Any, signature_def: Any, *args: Any, **kwargs: Any) -> Any:
        graph_def = graph.as_graph_def()
        debug = any(n.op in DEBUG_OPS for n in graph_def.node) or any(
            n.op in DEBUG_OPS for f in graph_def.library.function for n in f.node_def)
        if debug:
            outputs = [t.name for t in signature_def.outputs.values()] if signature_def is not None else []
            stats["debug_ops"] = stats.get("debug_ops", 0) + strip_debug_ops(graph_def, outputs)
        inlined = False
        if any(n.op in ("StatefulPartitionedCall", "PartitionedCall") for n in graph_def.node) and signature_def is not None:
            # Functions kept from inlining (Keras' jit_compile grouped convolutions: ConvNeXt) reach
            # tfjs as calls it has no op for ("unsupported ops: StatefulPartitionedCall").
            from ..tensorflow.graph import inline_kept_functions

            inlined = inline_kept_functions(graph_def, [t.name for t in signature_def.outputs.values()])
            if inlined:
                stats["inlined"] = stats.get("inlined", 0) + 1
        grouped = depthwise_grouped_convs(graph_def)
        if grouped:
            stats["grouped"] = stats.get("grouped", 0) + grouped
        if any(n.op == "Erfc" for n in graph_def.node):
            stats["erfc"] = stats.get("erfc", 0) + rewrite_erfc(graph_def)
        if any(n.op == "Softsign" for n in graph_def.node):
            stats["softsign"] = stats.get("softsign", 0) + rewrite_softsign(graph_def)
        if debug or inlined or grouped or stats.get("erfc") or stats.get("softsign"):
            graph = tf.Graph()
            with graph.as_default():
                tf.graph_util.import_graph_def(graph_def, name="")
        optimized = original(graph, signature_def, *args, **kwargs)
        stats["hard_swish"] = stats.get("hard_swish", 0) + split_fused_hard_swish(optimized)
        stats["tanh"] = stats.get("tanh", 0) + split_fused_tanh(optimized)
        stats["unfused_bias"] = stats.get("unfused_bias", 0) + unfuse_non_vector_bias(optimized)
        stats["band_part"] = stats.get("band_part", 0) + rewrite_band_part(optimized)
        stats["einsum"] = stats.get("einsum", 0) + rewrite_einsum(optimized)
        stats["list_writes"] = stats.get("list_writes", 0) + order_list_writes(optimized)
        return optimized

    converter.optimize_graph = optimize_graph
    try:
        yield
    finally:
        converter.optimize_graph = original


# Known tensorflowjs 4.22 defects a model.json converted without these rewrites still carries:
# (op, what goes wrong, the fix). Read from model.json alone (no TensorFlow), for the diagnosis.
KNOWN_DEFECTS = {
    "MatrixBandPart": (
        "tensorflowjs 4.22 runs MatrixBandPart with num_upper read from num_lower's input (its op table maps "
        "both to input 1; right only when the two are equal), so a causal attention mask (band_part(ones, -1, 0)) "
        "lets every token see the future",
        "convert with pytest_modelparity.export_model(model, 'tfjs', dir), which writes the band out in ops tfjs "
        "maps right, or build the mask without tf.linalg.band_part (e.g. from tf.range comparisons)"),
}


# Ops whose tfjs-core 4.22 kernel reads a negative axis (their second input, a Const) wrong.
NEGATIVE_AXIS_DEFECTS = {
    "Cumsum": (
        "tfjs-core 4.22 reads a negative Cumsum axis wrong: the result has a batch of 0 rows and its other "
        "dims shifted (tf.cumsum(x, -1) on a (4, 8) tensor has shape (0, 4)), whatever the converter did "
        "(known: tfjs-cumsum-negative-axis)",
        "give the sum a non-negative axis in the model (keras.ops.cumsum(x, axis=1) for a (batch, n) tensor, "
        "axis=rank - 1 for the last); tfjs computes that right"),
}


def known_defects(model_json: dict[str, Any], weights: Any = None) -> list[tuple[str, list[str], str, str]]:
    """``(op, node names, problem, fix)`` for each known converter or tfjs defect in a ``model.json``.

    ``weights`` (a callable returning ``{name: array}``) reads the Const axis of the ops in
    ``NEGATIVE_AXIS_DEFECTS``; it is called only when the graph has one, and without it (or when
    it cannot read them) those ops are not reported: an axis that may be right is no cause.
    """
    nodes = (model_json.get("modelTopology") or {}).get("node") or []
    found = []
    for op, (problem, fix) in KNOWN_DEFECTS.items():
        names = [n.get("name", "?") for n in nodes if n.get("op") == op]
        if names:
            found.append((op, names, problem, fix))
    axis_nodes = [n for n in nodes if n.get("op") in NEGATIVE_AXIS_DEFECTS and len(n.get("input") or []) > 1]
    if not axis_nodes or weights is None:
        return found
    try:
        values = weights() or {}
    except Exception:  # noqa: BLE001 - a shard that cannot be read leaves the axis unknown
        return found
    for op, (problem, fix) in NEGATIVE_AXIS_DEFECTS.items():
        names = [n.get("name", "?") for n in axis_nodes if n.get("op") == op
                 and _negative(values.get(n["input"][1].lstrip("^").split(":")[0]))]
        if names:
            found.append((op, names, problem, fix))
    return found


def _negative(axis: Any) -> bool:
    try:
        return axis is not None and getattr(axis, "size", 1) == 1 and int(axis) < 0
    except (TypeError, ValueError):
        return False
