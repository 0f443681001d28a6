"""Functional control flow (v2: ``If``, ``While``) of a TF1-style graph, made freezable.

Why: a graph built with ``tf.compat.v1`` after ``tf.compat.v1.disable_eager_execution()`` holds
``tf.cond`` as an ``If`` op and ``tf.while_loop`` as a ``While`` op whose branches and bodies are
functions, and resource variables. Saved by a Saver with a training op, measured (TF 2.21):

- the freeze turns every captured variable handle into a constant, so the training branch's
  moving-average update became an ``AssignVariableOp`` fed a float and TFLite, tf2onnx and
  tensorflowjs all refused the frozen graph ("input resource[0] expected type resource != float");
- ``tf.gradients`` rewrites the forward ops in place: the ``If`` calls ``<branch>_rewritten``
  functions that also return ``Optional`` intermediates, the ``While`` carries ``TensorList``
  accumulators; the TFLite converter aborted the process on that graph.

So, before freezing: an ``If`` whose predicate is a constant (a folded switch, ``feeds``)
becomes a call of its taken branch; forward ops rewritten for gradients call their original
functions again when nothing kept reads the extra outputs; functions no node calls are dropped.
The result computes the same outputs. Nothing here imports TensorFlow at module level.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from ..common import import_tf
from .cond_prune import constant_bool, split_ref

_IFS = ("If", "StatelessIf")
_WHILES = ("While", "StatelessWhile")
_CALLS = ("PartitionedCall", "StatefulPartitionedCall")
_REWRITTEN = "_rewritten"


def lower_constant_ifs(graph_def: Any) -> list[str]:
    """Each ``If`` whose predicate is a constant calls its taken branch alone, in place; the
    names of the Ifs changed. The call is ``<if>/taken_branch``, and an ``IdentityN`` keeps the
    If's name and outputs, so nothing that reads it changes (a call named like the If made
    Grappler's inlining abort the process: its nodes "<if>/Identity" clashed with the If's own
    output Identity)."""
    tf = import_tf()
    nodes = {n.name: n for n in graph_def.node}
    memo: dict[str, Any] = {}
    changed: list[str] = []
    added = []
    for node in graph_def.node:
        if node.op not in _IFS or not node.input or node.input[0].startswith("^"):
            continue
        value = constant_bool(nodes, node.input[0], memo)
        if value is None:
            continue
        call = tf.compat.v1.NodeDef()
        call.name = f"{node.name}/taken_branch"
        while call.name in nodes:
            call.name += "_"
        call.device = node.device
        call.op = "StatefulPartitionedCall" if node.op == "If" else "PartitionedCall"
        call.input.extend(node.input[1:])
        call.attr["Tin"].CopyFrom(node.attr["Tin"])
        call.attr["Tout"].CopyFrom(node.attr["Tout"])
        call.attr["f"].func.CopyFrom(node.attr["then_branch" if value else "else_branch"].func)
        outputs = len(node.attr["Tout"].list.type)
        keep = tf.compat.v1.NodeDef()
        keep.name, keep.op, keep.device = node.name, "IdentityN", node.device
        keep.input.extend(f"{call.name}:{i}" for i in range(outputs))
        keep.attr["T"].CopyFrom(node.attr["Tout"])
        node.CopyFrom(keep)
        added.append(call)
        nodes[call.name] = call
        changed.append(node.name)
    graph_def.node.extend(added)
    return changed


def _types(args: Any) -> list[int]:
    return [a.type for a in args]


def _ports_read(graph_def: Any) -> dict[str, int]:
    """The highest output port of each node that some node reads (data inputs)."""
    top: dict[str, int] = {}
    for node in graph_def.node:
        for ref in node.input:
            src, port, control = split_ref(ref)
            if not control:
                top[src] = max(top.get(src, 0), port)
    return top


def _original(library: dict[str, Any], name: str) -> Any:
    return library.get(name[: -len(_REWRITTEN)]) if name.endswith(_REWRITTEN) else None


def undo_gradient_rewrites(graph_def: Any) -> list[str]:
    """Forward ``If``/``While``/calls that call ``<f>_rewritten`` (extra outputs for gradients)
    call ``<f>`` again, in place, where ``<f>`` takes the same leading inputs, returns a prefix of
    the outputs, and no node reads the outputs dropped; the names of the nodes changed."""
    library = {f.signature.name: f for f in graph_def.library.function}
    read = _ports_read(graph_def)
    changed: list[str] = []
    for node in graph_def.node:
        if node.op in _CALLS or node.op in _IFS:
            keys = ["f"] if node.op in _CALLS else ["then_branch", "else_branch"]
            originals = [_original(library, node.attr[k].func.name) for k in keys]
            if any(o is None for o in originals):
                continue
            tin, tout = list(node.attr["Tin"].list.type), list(node.attr["Tout"].list.type)
            count = len(originals[0].signature.output_arg)
            if any(_types(o.signature.input_arg) != tin or _types(o.signature.output_arg) != tout[:count]
                   or len(o.signature.output_arg) != count for o in originals):
                continue
            if read.get(node.name, -1) >= count:
                continue
            for key, original in zip(keys, originals):
                node.attr[key].func.name = original.signature.name
            del node.attr["Tout"].list.type[count:]
        elif node.op in _WHILES:
            body, cond = (_original(library, node.attr[k].func.name) for k in ("body", "cond"))
            if body is None or cond is None:
                continue
            kinds = list(node.attr["T"].list.type)
            count = len(body.signature.input_arg)
            if (_types(body.signature.input_arg) != kinds[:count] or _types(body.signature.output_arg) != kinds[:count]
                    or _types(cond.signature.input_arg) != kinds[:count] or read.get(node.name, -1) >= count):
                continue
            node.attr["body"].func.name = body.signature.name
            node.attr["cond"].func.name = cond.signature.name
            del node.attr["T"].list.type[count:]
            if "output_shapes" in node.attr:
                del node.attr["output_shapes"].list.shape[count:]
            if "_num_original_outputs" in node.attr:
                node.attr["_num_original_outputs"].i = count
            data = [r for r in node.input if not r.startswith("^")][:count]
            control = [r for r in node.input if r.startswith("^")]
            del node.input[:]
            node.input.extend(data + control)
        else:
            continue
        if "_output_shapes" in node.attr:
            del node.attr["_output_shapes"]
        changed.append(node.name)
    return changed


def _called(attr: Any) -> list[str]:
    names = [attr.func.name] if attr.HasField("func") else []
    if attr.HasField("list"):
        names += [f.name for f in attr.list.func]
    return names


def drop_unused_functions(graph_def: Any) -> int:
    """Remove the library functions no node (of the graph, or of a kept function) calls; how many."""
    library = {f.signature.name: f for f in graph_def.library.function}
    pending = [name for node in graph_def.node for attr in node.attr.values() for name in _called(attr)]
    pending += [node.op for node in graph_def.node if node.op in library]
    kept: set[str] = set()
    while pending:
        name = pending.pop()
        if name in kept or name not in library:
            continue
        kept.add(name)
        for node in library[name].node_def:
            pending.extend(n for attr in node.attr.values() for n in _called(attr))
            if node.op in library:
                pending.append(node.op)
    dropped = [f for f in graph_def.library.function if f.signature.name not in kept]
    if not dropped:
        return 0
    functions = [f for f in graph_def.library.function if f.signature.name in kept]
    del graph_def.library.function[:]
    graph_def.library.function.extend(functions)
    gradients = [g for g in graph_def.library.gradient if g.function_name in kept]
    del graph_def.library.gradient[:]
    graph_def.library.gradient.extend(gradients)
    return len(dropped)


def has_v2_flow(graph_def: Any) -> bool:
    return any(n.op in _IFS or n.op in _WHILES for n in graph_def.node)


# Ops that change a resource variable: a frozen graph holds constants, so none can stay in it.
_UPDATES = re.compile(r"^(Assign(Add|Sub)?VariableOp|ResourceApply\w+|ResourceSparseApply\w+|ResourceScatter\w+)$")


class FrozenUpdate(Exception):
    """A variable update the outputs need (data or control input): the graph cannot be frozen.
    ``op``, ``op_type``, ``variable``: what and where; ``fix``: what to pass instead."""

    def __init__(self, message: str, op: str, op_type: str, fix: str) -> None:
        super().__init__(message)
        self.op, self.op_type, self.fix = op, op_type, fix


def _check_no_updates(graph_def: Any, outputs: Sequence[str]) -> None:
    """Raise ``FrozenUpdate`` when what computes ``outputs`` still updates a variable."""
    from .cond_prune import untaken

    library = {f.signature.name: f for f in graph_def.library.function}
    by_name = {n.name: n for n in graph_def.node}
    dead = untaken(graph_def)  # a v1 tf.cond's untaken branch is pruned after the freeze: no update runs there
    found: tuple[str, str, str] | None = None  # (node or "function/node", op type, variable read)
    for node in graph_def.node:
        if _UPDATES.match(node.op) and node.name not in dead:
            found = (node.name, node.op, _variable_of(by_name, node.input[0]) if node.input else "?")
            break
    if found is None:
        kept = {name for node in graph_def.node for attr in node.attr.values() for name in _called(attr)}
        for name in sorted(kept):
            function = library.get(name)
            hit = next((n for n in function.node_def if _UPDATES.match(n.op)), None) if function else None
            if hit is not None:
                found = (f"{name}/{hit.name}", hit.op, "a variable passed to the function")
                break
    if found is None:
        return
    op, op_type, variable = found
    gated = [o for o in outputs if any(r == "^" + op or r.startswith("^") and _reaches(by_name, r[1:], op)
                                       for r in by_name.get(split_ref(o)[0], _EMPTY).input)]
    before = [by_name[split_ref(o)[0]].input[0] for o in gated
              if by_name[split_ref(o)[0]].op == "Identity" and by_name[split_ref(o)[0]].input]
    if before:
        fix = (f"pass outputs={[b if ':' in b else b + ':0' for b in before]!r} (the tensor before the "
               "tf.control_dependencies that runs the update) as a load option")
    else:
        fix = ("compute the outputs without the update (an update under tf.cond on a training flag goes with "
               "feeds={'<flag>': False}; otherwise move it out of the inference path), or pass as outputs= a "
               "tensor the update does not gate")
    raise FrozenUpdate(
        f"the outputs run {op} ({op_type} on {variable}), which changes a variable on every run: a frozen graph "
        "holds the variables as constants, and every converter (tflite, onnx, tfjs) is given the frozen graph, "
        "so none can convert this one",
        op, op_type, fix)


def _variable_of(by_name: dict[str, Any], ref: str) -> str:
    """The variable a resource input reads: its ``VarHandleOp``, through Switch/Identity/Enter."""
    name = split_ref(ref)[0]
    for _ in range(64):
        node = by_name.get(name)
        if node is None or node.op not in ("Switch", "RefSwitch", "Identity", "Enter", "RefEnter") or not node.input:
            break
        name = split_ref(node.input[0])[0]
    return name


class _Empty:
    input: tuple[str, ...] = ()


_EMPTY = _Empty()


def _reaches(by_name: dict[str, Any], start: str, target: str) -> bool:
    """Whether ``target`` is ``start`` or above it (data and control inputs)."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        name = stack.pop()
        if name == target:
            return True
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        stack.extend(split_ref(r)[0] for r in by_name[name].input)
    return False


def freezable(graph_def: Any, outputs: Sequence[str]) -> tuple[Any, str | None]:
    """``(graph_def, what was done or None)``: the part of ``graph_def`` that computes ``outputs``
    (tensor names) with constant Ifs lowered and gradient rewrites undone; ``graph_def`` itself
    when it holds no functional control flow and updates no resource variable. ``FrozenUpdate``
    when the outputs still need a variable update."""
    tf = import_tf()
    names = sorted({split_ref(o)[0] for o in outputs})
    if not has_v2_flow(graph_def):
        if any(_UPDATES.match(n.op) for n in graph_def.node):  # (what the outputs need is checked)
            _check_no_updates(tf.compat.v1.graph_util.extract_sub_graph(graph_def, names), outputs)
        return graph_def, None
    work = tf.compat.v1.graph_util.extract_sub_graph(graph_def, names)
    undone = undo_gradient_rewrites(work)  # first: the IdentityN of a lowered If reads every output
    lowered = lower_constant_ifs(work)
    if lowered:
        work = tf.compat.v1.graph_util.extract_sub_graph(work, names)
    dropped = drop_unused_functions(work)
    _check_no_updates(work, outputs)
    done = []
    if lowered:
        done.append(f"{len(lowered)} If op(s) on a constant predicate run their taken branch alone")
    if undone:
        done.append(f"{len(undone)} op(s) rewritten for gradients call their inference functions again")
    if dropped:
        done.append(f"{dropped} unused function(s) dropped")
    return work, "; ".join(done) or None
