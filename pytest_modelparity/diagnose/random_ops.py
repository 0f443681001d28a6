"""Find the ops that draw random numbers (or run batch-norm in training mode) in a model's
graph, function-library branches included (seed 000: dropout left in a frozen graph)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from ._util import hook, is_keras_model, native_of

# TensorFlow op types that draw random numbers (stateful, stateless, datasets, images).
_TF_RANDOM = {
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomGamma", "RandomPoisson", "RandomPoissonV2",
    "RandomShuffle", "RandomCrop", "Multinomial", "RandomIndexShuffle",
    "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt", "StatefulStandardNormal",
    "StatefulStandardNormalV2", "StatefulTruncatedNormal", "StatefulRandomBinomial",
    "RngReadAndSkip", "RngSkip", "SampleDistortedBoundingBox", "SampleDistortedBoundingBoxV2",
    "ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3", "RandomDataset", "RandomDatasetV2",
    "ShuffleAndRepeatDataset", "ShuffleAndRepeatDatasetV2", "AnonymousSeedGenerator",
}
_TF_RANDOM_PREFIX = ("StatelessRandom", "StatelessTruncatedNormal", "StatelessMultinomial",
                     "StatelessParameterizedTruncatedNormal", "StatelessShuffle",
                     "StatelessSampleDistortedBoundingBox")
# Ops that only derive keys for stateless ops: listed only when no sampling op is found.
_KEY_ONLY = {"StatelessRandomGetKeyCounter", "StatelessRandomGetKeyCounterAlg", "StatelessRandomGetAlg"}
# TFLite builtins and ONNX ops that draw random numbers.
_OTHER_RANDOM = {"RANDOM_UNIFORM", "RANDOM_STANDARD_NORMAL", "MULTINOMIAL", "RandomUniform",
                 "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Bernoulli"}
_BATCHNORM = re.compile(r"^FusedBatchNorm(V2|V3)?$")
# Reductions that, over the batch axis, make each row depend on the others (Keras 3 and
# tf.nn.moments batch-norm in training mode: ``…/moments/mean``, ``…/moments/variance``).
_BATCH_REDUCTIONS = {"Mean", "Sum"}


@dataclass(frozen=True)
class RandomOp:
    name: str               # node name (prefixed by its function for library nodes)
    op: str                 # op type
    seeded: bool | None     # None for stateless ops and non-TF graphs (no seed attributes)
    detail: str             # "unseeded", "seed=1, seed2=7", "stateless", "in function f"

    def describe(self) -> str:
        return f"`{self.name}` ({self.op}, {self.detail})"


def is_random_op(op_type: str) -> bool:
    return (op_type in _TF_RANDOM or op_type in _OTHER_RANDOM or op_type in _KEY_ONLY
            or op_type.startswith(_TF_RANDOM_PREFIX))


def _node_random(node: Any, prefix: str, where: str) -> RandomOp | None:
    if not is_random_op(node.op):
        return None
    name = f"{prefix}{node.name}"
    if node.op.startswith("Stateless"):
        detail, seeded = "stateless", None
    elif "seed" in node.attr or "seed2" in node.attr:
        s1, s2 = node.attr["seed"].i, node.attr["seed2"].i
        seeded = bool(s1 or s2)
        detail = f"seed={s1}, seed2={s2}" if seeded else "unseeded"
    else:
        detail, seeded = "stateful", None
    if where:
        detail += f", in function {where}"
    return RandomOp(name, node.op, seeded, detail)


def _strip(inp: str) -> str:
    return inp.lstrip("^").split(":")[0]


def _const_ints(node: Any) -> list[int] | None:
    """The integer values of a Const node, or None."""
    if node is None or node.op != "Const" or "value" not in node.attr:
        return None
    try:
        import tensorflow as tf

        return [int(v) for v in tf.make_ndarray(node.attr["value"].tensor).ravel()]
    except Exception:  # noqa: BLE001 - not an integer constant: not an axis list
        return None


def _batch_reduction(node: Any, by_name: dict[str, Any]) -> bool:
    """A Mean/Sum of a computed tensor over axis 0 (the batch axis): batch statistics."""
    if node.op not in _BATCH_REDUCTIONS or len(node.input) < 2:
        return False
    data = by_name.get(_strip(node.input[0]))
    if data is not None and data.op == "Const":
        return False
    axes = _const_ints(by_name.get(_strip(node.input[1])))
    return axes is not None and 0 in axes


def _scope(name: str) -> str:
    return name.rsplit("/", 1)[0] if "/" in name else name


def _ancestors(nodes: Iterable[Any], fetches: Iterable[str]) -> set[str] | None:
    by_name = {n.name: n for n in nodes}
    todo = [_strip(f) for f in fetches]
    if not todo or any(t not in by_name for t in todo):
        return None
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        todo.extend(_strip(i) for i in by_name[name].input)
    return seen


def _called_functions(node: Any) -> list[str]:
    names = []
    for value in node.attr.values():
        if value.HasField("func") and value.func.name:
            names.append(value.func.name)
        if value.HasField("list"):
            names.extend(f.name for f in value.list.func if f.name)
    if node.op not in ("Const", "Placeholder") and not names:
        names.append(node.op)  # a node whose op is itself a library function
    return names


def scan_graph_def(graph_def: Any, fetches: Iterable[str] = ()) -> tuple[list[RandomOp], list[RandomOp]]:
    """(random ops, batch-norm ops in training mode) reachable from ``fetches``.

    Training-mode batch-norm is ``FusedBatchNorm*`` with ``is_training=True`` (TF1, tf.keras)
    or a Mean/Sum over axis 0 of a computed tensor (Keras 3 and ``tf.nn.moments``).

    Without fetches (or when they are not all in the graph) every node counts, except the
    variable initializers of a TF1 graph, which do not run at inference.
    """
    library = {f.signature.name: f for f in graph_def.library.function}
    keep = _ancestors(graph_def.node, fetches)
    found: list[RandomOp] = []
    training: list[RandomOp] = []
    visited: set[str] = set()

    reduced_scopes: set[str] = set()

    def visit(nodes: Iterable[Any], prefix: str, where: str) -> None:
        nodes = list(nodes)
        by_name = {n.name: n for n in nodes}
        in_fn = f", in function {where}" if where else ""
        for node in nodes:
            if not prefix and (keep is not None and node.name not in keep):
                continue
            if not prefix and keep is None and "/Initializer/" in f"/{node.name}/":
                continue
            hit = _node_random(node, prefix, where)
            if hit is not None:
                found.append(hit)
            if _BATCHNORM.match(node.op) and "is_training" in node.attr and node.attr["is_training"].b:
                training.append(RandomOp(f"{prefix}{node.name}", node.op, None, "is_training=True" + in_fn))
            elif _batch_reduction(node, by_name) and f"{prefix}{_scope(node.name)}" not in reduced_scopes:
                # one row per moments scope (its mean and variance reduce the same batch)
                reduced_scopes.add(f"{prefix}{_scope(node.name)}")
                training.append(RandomOp(f"{prefix}{node.name}", node.op, None,
                                         "over the batch axis: batch statistics" + in_fn))
            for fname in _called_functions(node):
                if fname in library and fname not in visited:
                    visited.add(fname)
                    visit(library[fname].node_def, f"{fname}/", fname)

    visit(graph_def.node, "", "")
    samplers = [r for r in found if r.op not in _KEY_ONLY]
    return (samplers or found), training


def _graph_defs(model: Any) -> tuple[list[Any], list[str]]:
    """GraphDefs of the graph that runs and the fetch names when known."""
    fetches = []
    for spec in getattr(model, "outputs", ()) or ():
        name = getattr(spec, "name", None)
        if isinstance(name, str):
            fetches.append(name)
    defs = hook(model, "graph_defs")
    if defs:
        return list(defs), fetches
    native = native_of(model)
    try:
        import tensorflow as tf
    except ImportError:
        return [], fetches
    if isinstance(native, tuple) and native and isinstance(native[0], tf.Graph):
        return [native[0].as_graph_def()], fetches
    if isinstance(native, tf.Graph):
        return [native.as_graph_def()], fetches
    if hasattr(native, "node") and hasattr(native, "library"):
        return [native], fetches
    if hasattr(native, "graph") and hasattr(native.graph, "as_graph_def"):  # ConcreteFunction
        return [native.graph.as_graph_def()], []
    if is_keras_model(native):
        specs = [tf.TensorSpec((None, *t.shape[1:]), t.dtype) for t in native.inputs]
        arg = specs[0] if len(specs) == 1 else specs
        # Trace the call the assertions make (``model(x)``): a layer built with an explicit
        # training=True (Monte-Carlo dropout) stays random there.
        fn = tf.function(lambda x: native(x)).get_concrete_function(arg)
        return [fn.graph.as_graph_def()], []
    return [], fetches


def _op_list(model: Any) -> list[tuple[str, str]]:
    ops = hook(model, "op_types")
    if ops:
        return list(ops)
    native = native_of(model)
    if hasattr(native, "_get_ops_details"):  # a LiteRT interpreter
        details = {d["index"]: d["name"] for d in native.get_tensor_details()}
        return [(details.get(op["outputs"][0], str(op["index"])) if len(op["outputs"]) else str(op["index"]),
                 op["op_name"]) for op in native._get_ops_details()]
    return []


def find_random_ops(model: Any) -> tuple[list[RandomOp], list[RandomOp]]:
    """(random ops, training-mode batch-norm ops) of any model form; empty when it has no graph."""
    defs, fetches = _graph_defs(model)
    found: list[RandomOp] = []
    training: list[RandomOp] = []
    for gd in defs:
        r, t = scan_graph_def(gd, fetches)
        found += r
        training += t
    if not defs:
        found = [RandomOp(name, op, None, "op") for name, op in _op_list(model) if is_random_op(op)]
    return found, training


def describe_ops(ops: list[RandomOp], limit: int = 3) -> str:
    text = ", ".join(o.describe() for o in ops[:limit])
    if len(ops) > limit:
        text += f" and {len(ops) - limit} more"
    return text
