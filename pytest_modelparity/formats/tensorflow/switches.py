"""Graph switches of a TF1 graph: scalar placeholders that are settings, not batch inputs.

Why: a TF1 training graph ships with a bool ``is_training``, a ``keep_prob``, a learning rate or
a Keras-1 learning phase beside its real input. Fed like a batch input, a scalar reaches
TensorFlow as a row (shape [1]: "must be a scalar"); left out, the run dies with "You must feed a
value for placeholder tensor". The load option ``feeds={name: value}`` sets each switch once:
the Placeholder node becomes a Const of that value before the graph is imported, so the
reference, the frozen graph, every conversion and the float64 twin see the same constant (and
``cond_prune`` can drop the branch it leaves untaken). A ``placeholder_with_default`` takes its
default unless named. Nothing here imports TensorFlow at module level.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ...errors import ModelLoadError
from ..common import import_tf

FEEDS_FIX = ("set each switch with the load option feeds={%s} (load_model(..., feeds=...), "
             "export_model(..., feeds=...), or modelparity_load_options in a suite)")

# Unknown-rank placeholders that are switches by their name (tf.placeholder(tf.float32) without
# a shape is how tutorials declare keep_prob).
_SWITCH_NAMES = re.compile(r"(keep_prob|dropout|learning_rate|(^|[/_])lr$|is_train|training|learning_phase|phase)",
                           re.I)


def node_name(name: str) -> str:
    """``"x:0"`` and ``"^x"`` -> ``"x"``."""
    return name.lstrip("^").split(":")[0]


def _rank(node: Any) -> int | None:
    if "shape" not in node.attr:
        return None
    shape = node.attr["shape"].shape
    return None if shape.unknown_rank else len(shape.dim)


def is_switch_node(node: Any) -> bool:
    """A Placeholder (NodeDef) that holds a setting: a scalar, or an unknown-rank bool or
    switch-named placeholder. Everything else with a batch is an input."""
    if node.op not in ("Placeholder", "PlaceholderWithDefault"):
        return False
    rank = _rank(node)
    if rank == 0:
        return True
    if rank is None:
        return node.attr["dtype"].type == 10 or bool(_SWITCH_NAMES.search(node.name))  # 10: DT_BOOL
    return False


def is_switch_op(op: Any) -> bool:
    """``is_switch_node`` for an op of an imported ``tf.Graph``."""
    return is_switch_node(op.node_def)


def describe(op: Any) -> str:
    """``"is_training (bool scalar)"``: a switch as an error message names it."""
    dtype = op.outputs[0].dtype.name
    rank = op.outputs[0].shape.rank
    what = "scalar" if rank == 0 else "unknown shape"
    return f"{op.name} ({dtype} {what})"


def example_value(op: Any) -> str:
    dtype = op.outputs[0].dtype
    if dtype.is_bool:
        return "False"
    if _SWITCH_NAMES.search(op.name) and re.search("keep_prob", op.name, re.I):
        return "1.0"
    return "0" if dtype.is_integer else "0.0"


def fold_feeds(graph_def: Any, feeds: Mapping[str, Any] | None, path: Path, format: str) -> list[str]:
    """Turn each placeholder named in ``feeds`` (``"is_training"`` or ``"is_training:0"``) into a
    Const of its value, in place; the node names folded. A name that is no placeholder of the
    graph, or a value that does not fit the placeholder, is a ModelLoadError."""
    if not feeds:
        return []
    tf = import_tf()
    nodes = {n.name: n for n in graph_def.node}
    placeholders = [n for n in graph_def.node if n.op in ("Placeholder", "PlaceholderWithDefault")]
    folded: list[str] = []
    for key, value in feeds.items():
        name = node_name(str(key))
        node = nodes.get(name)
        if node is None or node.op not in ("Placeholder", "PlaceholderWithDefault"):
            what = f"a {node.op} node" if node is not None else "not in the graph"
            listing = ", ".join(n.name for n in placeholders[:20]) or "none"
            raise ModelLoadError(path, format, f"feeds names {key!r}, which is {what}: feeds sets placeholders",
                                 f"name one of the graph's placeholders: {listing}")
        dtype = tf.as_dtype(node.attr["dtype"].type)
        try:
            array = np.asarray(value)
            cast = array.astype(dtype.as_numpy_dtype)
            if array.dtype.kind in "fc" and dtype.is_bool:
                raise ValueError("a float is not a bool")
            if array.dtype.kind in "fc" and dtype.is_integer and not np.array_equal(cast, array):
                raise ValueError("the value is not a whole number")
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(path, format, f"feeds[{key!r}] = {value!r} does not fit placeholder {name} "
                                 f"({dtype.name}): {exc}", f"give a {dtype.name} value") from exc
        rank = _rank(node)
        if rank is not None and node.op == "Placeholder":
            declared = [d.size for d in node.attr["shape"].shape.dim]
            if len(declared) != cast.ndim or any(d >= 0 and d != g for d, g in zip(declared, cast.shape)):
                raise ModelLoadError(path, format, f"feeds[{key!r}] has shape {cast.shape}, placeholder {name} "
                                     f"is declared {tuple(None if d < 0 else d for d in declared)}",
                                     "give a value of the placeholder's shape (a switch takes a scalar)")
        node.op = "Const"
        del node.input[:]
        for attr in list(node.attr):
            if attr != "dtype":
                del node.attr[attr]
        node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(cast, dtype=dtype))
        folded.append(name)
    return folded


def unfed_switches(graph: Any, output_tensors: Sequence[Any], stop: Sequence[Any] = ()) -> list[Any]:
    """Placeholder switches the outputs need that nothing sets (ops, graph order); the walk
    stops at ``stop`` tensors (named inputs are fed, what is above them never runs)."""
    stopped = {t.op.name for t in stop}
    seen: set[str] = set()
    pending = [t.op for t in output_tensors]
    while pending:
        op = pending.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.name in stopped:
            continue
        pending.extend(t.op for t in op.inputs)
        pending.extend(op.control_inputs)
    return [op for op in graph.get_operations()
            if op.name in seen and op.name not in stopped and op.type == "Placeholder" and is_switch_op(op)]


def missing_switches_error(ops: Sequence[Any], path: Path, format: str, *, candidates: int = 0) -> ModelLoadError:
    """``candidates``: the number of output candidates while the switches are unset (> 1: the
    output is searched again once they are, as the branches they leave untaken drop out)."""
    names = ", ".join(describe(op) for op in ops)
    example = ", ".join(f"{op.name!r}: {example_value(op)}" for op in ops)
    what = "the outputs need" if candidates <= 1 else (
        f"the output cannot be told yet ({candidates} candidate sinks, some in branches a switch picks), and they need")
    return ModelLoadError(path, format, f"{what} {len(ops)} graph switch(es) that are not batch inputs and "
                          f"that nothing sets: {names} (a training flag, keep_prob, a learning rate or a "
                          "learning phase is set once, never fed as a batch row)", FEEDS_FIX % example)


def switch_as_input_error(op: Any, path: Path, format: str) -> ModelLoadError:
    return ModelLoadError(path, format, f"inputs names {op.name!r}, a graph switch ({describe(op)}), not a batch "
                          "input: its value would be fed as a row of every batch",
                          "leave it out of inputs and " + FEEDS_FIX % f"{op.name!r}: {example_value(op)}")
