"""Drop the branches a constant predicate leaves untaken in a TF1 (v1 control flow) GraphDef.

Why: once a switch is folded (``feeds={"is_training": False}``), each ``tf.cond`` still holds
both branches, joined by Switch/Merge. The untaken one can hold what the float64 twin cannot
rewrite (a batch norm in training mode, a dropout's RandomUniform), so the graph was judged
by the fixed rule for code that never runs. Here a Switch whose predicate is a constant
becomes its data input on the taken side; what reads the other side is dead (data or control
input, as TensorFlow's dead tensors propagate); a Merge with one live input becomes an
Identity of it. Graphs with loops (Enter/NextIteration) are left as they are.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..common import import_tf

_SWITCHES = ("Switch", "RefSwitch")
_MERGES = ("Merge", "RefMerge")
_LOOPS = {"Enter", "RefEnter", "NextIteration", "RefNextIteration", "LoopCond", "Exit", "RefExit"}
_PASS_THROUGH = ("Identity", "Snapshot", "PlaceholderWithDefault", "StopGradient")


def split_ref(ref: str) -> tuple[str, int, bool]:
    """``"a:1"`` -> ``("a", 1, False)``; ``"^a"`` -> ``("a", 0, True)``."""
    control = ref.startswith("^")
    name, _, port = ref.lstrip("^").partition(":")
    return name, int(port) if port else 0, control


def _order(nodes: dict[str, Any]) -> list[str] | None:
    """Names in an order where every input comes first; None on a cycle."""
    indegree = {n: 0 for n in nodes}
    users: dict[str, list[str]] = {n: [] for n in nodes}
    for name, node in nodes.items():
        for ref in node.input:
            src = split_ref(ref)[0]
            if src in nodes:
                indegree[name] += 1
                users[src].append(name)
    ready = [n for n, d in indegree.items() if d == 0]
    out: list[str] = []
    while ready:
        name = ready.pop()
        out.append(name)
        for user in users[name]:
            indegree[user] -= 1
            if indegree[user] == 0:
                ready.append(user)
    return out if len(out) == len(nodes) else None


def constant_bool(nodes: dict[str, Any], ref: str, memo: dict[str, Any]) -> bool | None:
    """The value of a bool scalar ``ref`` when it is a constant (through identities, LogicalNot)."""
    name = split_ref(ref)[0]
    if name in memo:
        return memo[name]
    memo[name] = None
    node = nodes.get(name)
    value: bool | None = None
    if node is not None and node.op == "Const" and node.attr["dtype"].type == 10:  # DT_BOOL
        array = import_tf().make_ndarray(node.attr["value"].tensor)
        value = bool(array) if np.size(array) == 1 else None
    elif node is not None and node.op in _PASS_THROUGH and node.input:
        value = constant_bool(nodes, node.input[0], memo)
    elif node is not None and node.op == "LogicalNot" and node.input:
        inner = constant_bool(nodes, node.input[0], memo)
        value = None if inner is None else not inner
    memo[name] = value
    return value


def _fold(graph_def: Any) -> tuple[dict[str, bool], dict[tuple[str, int], str], set[str], dict[str, Any]] | None:
    """``(decided, alias, dead, rewritten)`` of the Switches whose predicate is a constant: the
    value of each, each taken port's data input, the nodes only an untaken side reaches, the
    Merges left with one live input (as Identities); None when nothing folds (or on loops)."""
    tf = import_tf()
    nodes = {n.name: n for n in graph_def.node}
    if any(n.op in _LOOPS for n in graph_def.node):
        return None
    memo: dict[str, Any] = {}
    found = {n.name: constant_bool(nodes, n.input[1], memo) for n in graph_def.node
             if n.op in _SWITCHES and len(n.input) >= 2}
    decided = {k: v for k, v in found.items() if v is not None}
    if not decided:
        return None
    order = _order(nodes)
    if order is None:
        return None
    alias: dict[tuple[str, int], str] = {}  # a folded Switch's taken port -> its data input
    dead_ports: set[tuple[str, int]] = set()
    dead: set[str] = set()
    rewritten: dict[str, Any] = {}
    for name in order:
        node = nodes[name]
        refs = [split_ref(r) for r in node.input]

        def is_dead(src: str, port: int, control: bool) -> bool:
            return src in dead or (not control and (src, port) in dead_ports)

        if node.op in _MERGES:
            live = [r for r, (src, port, control) in zip(node.input, refs) if not control and not is_dead(src, port, control)]
            data = [r for r in refs if not r[2]]
            if not live:
                dead.add(name)
                continue
            if len(live) < len(data):
                new = tf.compat.v1.NodeDef()
                new.name, new.op = name, "Identity"
                new.input.append(live[0])
                new.attr["T"].CopyFrom(node.attr["T"])
                rewritten[name] = new
            continue
        if any(is_dead(*r) for r in refs):
            dead.add(name)
            continue
        if name in decided:
            taken = 1 if decided[name] else 0
            dead_ports.add((name, 1 - taken))
            alias[(name, taken)] = node.input[0]
    return decided, alias, dead, rewritten


def untaken(graph_def: Any) -> set[str]:
    """Names of the nodes only the untaken side of a constant-predicate ``tf.cond`` (v1) reaches:
    code that never runs once a switch is folded (the output search leaves their sinks out)."""
    folded = _fold(graph_def)
    return folded[2] if folded is not None else set()


def prune_constant_conds(graph_def: Any, outputs: Sequence[str]) -> tuple[Any, int]:
    """``(graph_def, number of Switches folded)``: a pruned copy of ``graph_def`` keeping what
    ``outputs`` (tensor names) need, or ``graph_def`` itself when nothing folds."""
    tf = import_tf()
    folded = _fold(graph_def)
    if folded is None:
        return graph_def, 0
    decided, alias, dead, rewritten = folded
    merge_index_read = any(split_ref(r)[0] in rewritten and split_ref(r)[1] == 1 and not split_ref(r)[2]
                           for n in graph_def.node for r in n.input)
    if merge_index_read or any(split_ref(o)[0] in dead for o in outputs):
        return graph_def, 0  # the outputs are in an untaken branch: leave the graph as it is

    def resolve(ref: str) -> str | None:
        src, port, control = split_ref(ref)
        seen = 0
        while not control and (src, port) in alias and seen < 10_000:
            ref = alias[(src, port)]
            src, port, control = split_ref(ref)
            seen += 1
        if control and src in decided:
            return None  # a control edge from a folded Switch: it always ran
        return ref

    out = tf.compat.v1.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name in dead or node.name in decided:
            continue
        copy = out.node.add()
        copy.CopyFrom(rewritten.get(node.name, node))
        inputs = [resolve(r) for r in copy.input]
        del copy.input[:]
        copy.input.extend(r for r in inputs if r is not None and split_ref(r)[0] not in dead)
    names = sorted({split_ref(o)[0] for o in outputs})
    try:
        pruned = tf.compat.v1.graph_util.extract_sub_graph(out, names)
    except Exception:  # noqa: BLE001 - a graph this cannot rewrite stays as it was
        return graph_def, 0
    return pruned, len(decided)

