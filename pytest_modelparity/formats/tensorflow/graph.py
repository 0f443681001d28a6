"""Helpers shared by the TensorFlow formats (keras, h5, saved_model, checkpoint, graphdef):
dtype/shape mapping, path checks, the TF1 session-backed model (checkpoint and graphdef)
and freezing a graph (weights as constants, what the graph twin starts from).

Why: each format module stays small. This module imports no format module (the serving
function converters trace lives in ``serving.py``, above them): the ``formats`` package has
no import circle, lazy imports included (``tests/test_layering.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ...errors import ModelLoadError
from ..common import first_line, import_tf, quiet  # noqa: F401 - import_tf: re-exported
from .._files import check_not_special
from ..base import LoadedModel, TensorSpec
from . import switches



def np_dtype(tf_dtype: Any) -> np.dtype:
    tf = import_tf()
    return np.dtype(tf.as_dtype(tf_dtype).as_numpy_dtype)


def shape_tuple(shape: Any) -> tuple[int | None, ...]:
    """A TF shape (TensorShape, list, proto) as a tuple with None for unknown dims."""
    tf = import_tf()
    shape = tf.TensorShape(shape)
    if shape.rank is None:
        return ()
    return tuple(shape.as_list())


def spec(name: str, shape: Any, dtype: Any) -> TensorSpec:
    return TensorSpec(name, shape_tuple(shape), np_dtype(dtype))


def tensor_key(name: str) -> str:
    """The name a graph tensor is shown under: ``"x:0"`` -> ``"x"``, ``"split:1"`` stays."""
    return name[:-2] if name.endswith(":0") else name


def tensor_name(name: str) -> str:
    """The full tensor name: ``"x"`` -> ``"x:0"``."""
    return name if re.search(r":\d+$", name) else f"{name}:0"


# -- paths and errors --------------------------------------------------------------------

def require_path(path: Path, format: str, *, kind: str = "file") -> Path:
    """Check ``path`` exists and is a ``kind`` ("file" or "dir"), or raise ModelLoadError."""
    if not path.exists():
        raise ModelLoadError(path, format, "no such file or directory", "check the path")
    check_not_special(path, format)
    if kind == "file" and not path.is_file():
        raise ModelLoadError(path, format, "is a directory, expected a file",
                             "pass the model file itself, or the right format=")
    if kind == "dir" and not path.is_dir():
        raise ModelLoadError(path, format, "is a file, expected a directory",
                             "pass the directory that holds saved_model.pb")
    return path


# -- TF1 graphs: automatic inputs and outputs -------------------------------------------

# Ops that never carry a model's prediction: bookkeeping, variables, saving, training.
_AUX_OP_TYPES = {
    "NoOp", "Assert", "Print", "PrintV2", "Const", "Placeholder", "PlaceholderWithDefault",
    "VariableV2", "Variable", "VarHandleOp", "ReadVariableOp", "VarIsInitializedOp",
    "IsVariableInitialized", "Assign", "AssignVariableOp", "AssignAdd", "AssignSub",
    "AssignAddVariableOp", "AssignSubVariableOp", "SaveV2", "RestoreV2", "Save", "Restore",
    "SaveSlices", "RestoreSlice", "MergeV2Checkpoints", "ShardedFilename", "StringJoin",
    "ScalarSummary", "HistogramSummary", "ImageSummary", "MergeSummary", "TensorSummary",
    "TensorSummaryV2", "WriteSummary", "ReportUninitializedVariables",
}
_AUX_SCOPES = re.compile(r"^(save(_\d+)?|init(_\d+)?|gradients(_\d+)?|report_uninitialized_variables(_\d+)?|"
                         r"(GradientDescent|Adam|Momentum|RMSProp|Adagrad|Adadelta|Ftrl)(_\d+)?)(/|$)")


_GRAD_SCOPE = re.compile(r"^gradients(?:_\d+)?/(.+)_grad/")
_SHAPE_OPS = {"Shape", "ShapeN", "Size", "Rank"}


def _is_root_aux(op: Any) -> bool:
    return (op.type in _AUX_OP_TYPES or op.type.startswith(("Apply", "ResourceApply", "SparseApply"))
            or bool(_AUX_SCOPES.match(op.name)) or "/Initializer/" in op.name or not op.outputs)


# Control-flow bookkeeping of tf.cond / tf.while_loop (v1): never a prediction.
_FLOW_OP_TYPES = {"Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit", "RefExit",
                  "NextIteration", "RefNextIteration", "LoopCond", "ControlTrigger"}
_FLOW_NAMES = re.compile(r"/(switch_t|switch_f|pred_id|branch_executed)(_\d+)?$")
# Metrics and summaries by scope; losses and metrics by the labels they read.
_METRIC_NAMES = re.compile(r"(^|/)(metrics|summaries|accuracy|mean_iou|precision|recall|auc)(_\d+)?(/|$)", re.I)
_LABEL_NAMES = re.compile(r"(^|/|_)(labels?|targets?|y_true|ground_truth|gt)(_\d+)?$", re.I)
# What a person looks at first: a probability or a logits-like tensor.
_LIKELY_TYPES = {"Softmax", "Sigmoid", "LogSoftmax"}
_LIKELY_NAMES = re.compile(r"(^|/|_)(logits?|predictions?|probs|probabilities|outputs?|scores?|sigmoid|softmax|"
                           r"y_pred|pred)(_\d+)?$", re.I)


def _is_flow(op: Any) -> bool:
    return (op.type in _FLOW_OP_TYPES or bool(_FLOW_NAMES.search(op.name))
            or (op.type == "Identity" and bool(op.inputs) and op.inputs[0].op.type in ("Switch", "RefSwitch")))


def _is_not_output(op: Any) -> bool:
    return _is_flow(op) or "Summary" in op.type or bool(_METRIC_NAMES.search(op.name))


def _placeholders_above(op: Any, memo: dict[str, frozenset[str]]) -> frozenset[str]:
    """Names of the Placeholders ``op`` reads through data inputs (iterative: deep graphs; a
    while loop's back edge adds nothing)."""
    active: set[str] = set()
    stack: list[tuple[Any, bool]] = [(op, False)]
    while stack:
        top, expanded = stack.pop()
        if top.name in memo:
            continue
        if not expanded:
            active.add(top.name)
            stack.append((top, True))
            stack.extend((t.op, False) for t in top.inputs if t.op.name not in memo and t.op.name not in active)
            continue
        found = {top.name} if top.type == "Placeholder" else set()
        for t in top.inputs:
            found |= memo.get(t.op.name, frozenset())
        memo[top.name] = frozenset(found)
        active.discard(top.name)
    return memo[op.name]


def _every_user(op: Any, root: Any, consumers: dict[str, list[Any]], memo: dict[str, bool],
                user_ok: Any = lambda u: False) -> bool:
    """``root(op)``, or ``op`` has users and each is ``user_ok`` or, in turn, ``_every_user``;
    memoised in ``memo``. An op met again on its own path (a TF1 while loop's back edge) reads
    False. Iterative: a recursive walk overflowed Python's stack on EfficientNetB0's frozen graph
    (RecursionError in the output search of a graphdef export)."""
    stack: list[tuple[Any, bool]] = [(op, False)]
    while stack:
        node, expanded = stack.pop()
        if not expanded:
            if node.name in memo:
                continue
            if root(node):
                memo[node.name] = True
                continue
            memo[node.name] = False  # on the path now: a cycle back to it counts as real
            stack.append((node, True))
            stack.extend((u, False) for u in consumers[node.name] if u.name not in memo and not user_ok(u))
            continue
        users = consumers[node.name]
        memo[node.name] = bool(users) and all(user_ok(u) or memo.get(u.name, False) for u in users)
    return memo[op.name]


def find_outputs(graph: Any) -> list[str]:
    """Candidate outputs of ``graph``, the likely ones first: tensors of sink ops that no real
    op consumes, read from the inputs.

    An op is auxiliary (saver, initializer, training, summaries) by type or scope, or when all
    it feeds is auxiliary (a loss feeds only gradients; an initializer only an Assign). tf.cond
    and while bookkeeping (``switch_t``, ``pred_id``, Switch/Merge leftovers), summaries,
    metrics and what reads the labels are never candidates. Why: a TF1 training graph has
    over a hundred such sinks, and the real output was not among the first thirty listed.
    """
    ops = graph.get_operations()
    consumers: dict[str, list[Any]] = {op.name: [] for op in ops}
    for op in ops:
        for t in op.inputs:
            consumers[t.op.name].append(op)
        for c in op.control_inputs:
            consumers[c.name].append(op)
    aux: dict[str, bool] = {}

    def is_aux(op: Any) -> bool:
        return _every_user(op, _is_root_aux, consumers, aux)

    # Ops differentiated by tf.gradients get a "gradients/<op>_grad" scope: a sink with one
    # is a loss, not a prediction.
    differentiated = {m.group(1) for op in ops for m in [_GRAD_SCOPE.match(op.name)] if m}
    sinks = [op for op in ops if not (consumers[op.name] or is_aux(op) or op.type in _SHAPE_OPS
                                      or op.name in differentiated or _is_not_output(op))]
    reporting: dict[str, bool] = {}

    def is_reporting(op: Any) -> bool:
        """Read only by metrics and summaries (and bookkeeping), through any ops."""
        return _every_user(op, lambda o: "Summary" in o.type or bool(_METRIC_NAMES.search(o.name)), consumers,
                           reporting, user_ok=is_aux)

    def likely(op: Any) -> bool:
        return op.type in _LIKELY_TYPES or bool(_LIKELY_NAMES.search(op.name))

    # A prediction read only by an accuracy metric or a summary has consumers, yet is an output
    # (the model/Sigmoid): the likely ones among such ops, topmost first.
    reported = [op for op in ops if consumers[op.name] and likely(op) and not _is_not_output(op)
                and not _is_root_aux(op) and op.name not in differentiated and is_reporting(op)]
    reported_names = {op.name for op in reported}
    sinks += [op for op in reported if not any(u.name in reported_names for u in consumers[op.name])]
    memo: dict[str, frozenset[str]] = {}
    by_name = {op.name: op for op in ops}
    reads = {op.name: {p for p in _placeholders_above(op, memo) if not switches.is_switch_op(by_name[p])}
             for op in sinks}
    if any(reads.values()):  # reachable from the inputs: a constant sink is a leftover
        sinks = [op for op in sinks if reads[op.name]]
    kept = [op for op in sinks if not any(_LABEL_NAMES.search(p) for p in reads[op.name])]
    sinks = kept or sinks
    sinks = _drop_byproducts(_drop_untaken(graph, sinks), likely)
    ordered = [op for op in sinks if likely(op)] + [op for op in sinks if not likely(op)]
    return [t.name for op in ordered for t in op.outputs]


def _drop_untaken(graph: Any, sinks: list[Any]) -> list[Any]:
    """The sinks left once those only the untaken side of a folded ``tf.cond`` reaches are out
    (a switch set by ``feeds`` is a constant: that code never runs)."""
    if not any(op.type in ("Switch", "RefSwitch") for op in graph.get_operations()):
        return sinks
    from .cond_prune import untaken

    dead = untaken(graph.as_graph_def())
    return [op for op in sinks if op.name not in dead] or sinks


# Helpers whose outputs come from ops of their own name scope: ``mean, var = tf.nn.moments(x)``
# writes ``moments/Squeeze`` and ``moments/Squeeze_1``; a model that uses the mean alone leaves
# the variance a sink (the measured TF1 tagger: ``model/moments/Squeeze_1`` beside ``model/Sigmoid``).
_HELPER_SCOPES = re.compile(r"^(moments|weighted_moments|sufficient_statistics|normalize_moments)(_\d+)?$")
_MULTI_OUTPUT_TYPES = {"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase"}


def _byproduct_group(op: Any) -> tuple[str, str] | None:
    """``("scope", name)`` or ``("op", name)``: the helper or multi-output op whose unused output
    ``op`` is, or None. A multi-output op is reached through Identities in its own scope (control
    flow v2 names each output of a While ``while/Identity_<i>``: an unused loop counter or a
    gradient accumulator is a sink)."""
    scope, _, _ = op.name.rpartition("/")
    if scope and _HELPER_SCOPES.match(scope.rpartition("/")[2]):
        return ("scope", scope)
    top = op
    for _ in range(32):
        if top.type in _MULTI_OUTPUT_TYPES:
            # Only the op's own output Identities (``while/Identity_2``): a frozen function's
            # outputs (``Identity_1``) may be a loop's results, and those are outputs.
            return ("op", top.name) if op.name.startswith(top.name + "/") else None
        if top.type not in ("Identity", "IdentityN") or not top.inputs:
            return None
        top = top.inputs[0].op
    return None


def _drop_byproducts(sinks: list[Any], likely: Callable[[Any], bool]) -> list[Any]:
    """The sinks left once the unused outputs of a helper or a multi-output op are out, where
    another sink (the model's output) reads the same helper or op: the variance of a
    ``tf.nn.moments`` whose mean the model uses, a while loop's counter. A likely output
    (a Softmax, a ``logits``) is never dropped, and neither is every sink."""
    groups = {op.name: _byproduct_group(op) for op in sinks}
    candidates = [op for op in sinks if groups[op.name] is not None and not likely(op)]
    others = [op for op in sinks if op not in candidates]
    if not candidates or not others:
        return sinks
    above = ancestor_ops(others)
    scopes = {name.rpartition("/")[0] for name in above}
    dropped = set()
    for op in candidates:
        kind, name = groups[op.name]  # type: ignore[misc]
        if (kind == "op" and name in above) or (kind == "scope" and any(s == name or s.startswith(name + "/")
                                                                         for s in scopes)):
            dropped.add(op.name)
    return [op for op in sinks if op.name not in dropped]


def ancestor_ops(ops: Sequence[Any], *, control: bool = False) -> set[str]:
    """Names of ``ops`` and every op they depend on (through data inputs, and control inputs
    when ``control``): the part of a TF1 graph that computes them."""
    seen: set[str] = set()
    stack = list(ops)
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        stack.extend(t.op for t in op.inputs)
        if control:
            stack.extend(op.control_inputs)
    return seen


def find_inputs(graph: Any, output_tensors: Sequence[Any]) -> list[str]:
    """Placeholders (without default) that the outputs depend on, in graph order; graph
    switches (scalar settings, ``switches``) are not batch inputs."""
    seen = ancestor_ops([t.op for t in output_tensors], control=True)
    return [op.outputs[0].name for op in graph.get_operations()
            if op.type == "Placeholder" and op.name in seen and not switches.is_switch_op(op)]


def resolve_tensors(graph: Any, path: Path, format: str, inputs: Sequence[str] | None,
                    outputs: Sequence[str] | None) -> tuple[list[Any], list[Any]]:
    """The input and output tensors of a TF1 graph, named by the caller or found automatically."""
    def get(name: str, role: str) -> Any:
        try:
            return graph.get_tensor_by_name(tensor_name(name))
        except (KeyError, ValueError) as exc:
            placeholders = [op.name for op in graph.get_operations() if op.type == "Placeholder"]
            raise ModelLoadError(path, format, f"the graph has no {role} tensor {name!r} ({first_line(exc)})",
                                 f"pass {role}s=[...] with existing tensor names; Placeholders here: "
                                 f"{', '.join(placeholders[:20]) or 'none'}; sinks: "
                                 f"{', '.join(find_outputs(graph)[:20]) or 'none'}") from exc

    if outputs:
        out_tensors = [get(n, "output") for n in _as_list(outputs)]
    else:
        found = find_outputs(graph)
        # Several sinks are all outputs when each is an Identity: that is how a frozen
        # tf.function names its outputs. Any other mix is ambiguous (a dangling metric op?).
        all_identity = len(found) > 1 and all(graph.get_tensor_by_name(n).op.type == "Identity" for n in found)
        if len(found) != 1 and not all_identity:
            # An unset switch first: once set (feeds), its untaken branch's sinks are no candidates.
            unset = switches.unfed_switches(graph, [graph.get_tensor_by_name(n) for n in found])
            if unset:
                raise switches.missing_switches_error(unset, path, format, candidates=len(found))
            listing = ", ".join(found[:30]) + (" ..." if len(found) > 30 else "")
            raise ModelLoadError(
                path, format,
                f"cannot tell the output tensor: the graph has {len(found)} candidate sink(s)"
                + (f": {listing}" if found else ""),
                "pass outputs=['name:0', ...] to load_model (the likely outputs are listed first)")
        out_tensors = [graph.get_tensor_by_name(n) for n in found]
    if inputs:
        in_tensors = [get(n, "input") for n in _as_list(inputs)]
        for t in in_tensors:
            if t.op.type == "Placeholder" and switches.is_switch_op(t.op):
                raise switches.switch_as_input_error(t.op, path, format)
    unfed = switches.unfed_switches(graph, out_tensors, stop=in_tensors if inputs else ())
    if unfed:
        raise switches.missing_switches_error(unfed, path, format)
    if not inputs:
        names = find_inputs(graph, out_tensors)
        if not names:
            raise ModelLoadError(path, format, "no Placeholder feeds the outputs "
                                 f"{[t.name for t in out_tensors]}", "pass inputs=['name:0', ...] to load_model")
        in_tensors = [graph.get_tensor_by_name(n) for n in names]
    return in_tensors, out_tensors


def _as_list(names: str | Iterable[str]) -> list[str]:
    return [names] if isinstance(names, str) else list(names)


# -- a TF1 graph run in its own Session --------------------------------------------------

class SessionModel(LoadedModel):
    """A TF1 graph in its own ``tf.Graph`` and ``tf.compat.v1.Session`` (checkpoint, graphdef).

    Placeholders with an unknown batch dim take any batch size: no retracing, one graph.
    ``native`` is ``(graph, session)``. ``load_route`` says how the file had to be read when
    not as it is (an old MetaGraph imported again without attributes TF 2 refuses).
    """

    load_route: str | None = None

    def __init__(self, *, format: str, graph: Any, session: Any, in_tensors: Sequence[Any],
                 out_tensors: Sequence[Any], device: str, source: Path,
                 graph_def: Any = None, weights_fn: Callable[[], dict[str, np.ndarray]] | None = None) -> None:
        self.format = format
        self.graph = graph
        self.session = session
        self.native = (graph, session)
        self._in = list(in_tensors)
        self._out = list(out_tensors)
        self._graph_def = graph_def
        self._weights_fn = weights_fn
        super().__init__(device=device, source=source,
                         inputs=[spec(tensor_key(t.name), t.shape, t.dtype) for t in self._in],
                         outputs=[spec(tensor_key(t.name), t.shape, t.dtype) for t in self._out])

    def prepare_batch(self, batch: Any) -> dict[str, np.ndarray]:
        # Accept "x:0" as well as "x" for the keys of a dict batch.
        if isinstance(batch, Mapping):
            batch = {tensor_key(k) if isinstance(k, str) else k: v for k, v in batch.items()}
        return super().prepare_batch(batch)

    def _predict(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed_dict = {t: feeds[s.name] for t, s in zip(self._in, self.inputs)}
        try:
            values = self.session.run(self._out, feed_dict=feed_dict)
        except Exception as exc:  # noqa: BLE001 - a trusted py_function's missing body in words, the rest re-raised
            from .trust import missing_python

            found = missing_python(exc, self)
            if found is None:
                raise
            raise found from exc
        return {s.name: np.asarray(v) for s, v in zip(self.outputs, values)}

    def graph_defs(self) -> list[Any]:
        return [self._graph_def if self._graph_def is not None else self.graph.as_graph_def()]

    def weights(self) -> dict[str, np.ndarray] | None:
        return self._weights_fn() if self._weights_fn is not None else None

    def predict_with_weights(self, batch: Any, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run with the named weights replaced: a frozen graph's constants fed in place of
        their own values (a session feeds any tensor), a checkpoint's variables loaded and
        loaded back afterwards (a resource variable's handle cannot be fed)."""
        feeds = self.prepare_batch(batch)
        feed_dict = {t: feeds[s.name] for t, s in zip(self._in, self.inputs)}
        with self.graph.as_default():  # a variable loads in graph mode only
            variables = {v.op.name: v for v in import_tf().compat.v1.global_variables()}
            saved = {name: self.session.run(variables[name]) for name in values if name in variables}
            try:
                for name, value in values.items():
                    if name in variables:
                        variables[name].load(value, self.session)
                    else:
                        feed_dict[self.graph.get_tensor_by_name(tensor_name(name))] = value
                values_out = self.session.run(self._out, feed_dict=feed_dict)
            finally:
                for name, value in saved.items():
                    variables[name].load(value, self.session)
        return {s.name: np.asarray(v) for s, v in zip(self.outputs, values_out)}

    def frozen_graph(self) -> Any:
        """The graph with its variables (restored in the session) as constants, for the graph twin."""
        inputs, outputs = [t.name for t in self._in], [t.name for t in self._out]
        with self.graph.as_default():
            has_variables = bool(import_tf().compat.v1.global_variables())
        if has_variables:
            frozen = freeze_session(self.session, self.graph, inputs, outputs)
        else:
            frozen = FrozenGraph(self.graph_defs()[0], inputs, outputs)
        # Switches folded to constants leave tf.cond branches that never run: gone before the
        # twin (a training-mode batch norm there is no reason to lose the float64 floor).
        from .cond_prune import prune_constant_conds

        frozen.graph_def, _folded = prune_constant_conds(frozen.graph_def, outputs)
        return frozen

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


def new_session(graph: Any) -> Any:
    """A Session on ``graph``; soft placement lets ops without a GPU kernel fall back to CPU."""
    tf = import_tf()
    from tensorflow.python.eager import context

    # Start from the eager context's config so tf.config settings (visible devices, logical
    # devices, GPU memory growth) hold for the session too; a bare ConfigProto drops them.
    config = tf.compat.v1.ConfigProto()
    config.CopyFrom(context.context().config)
    config.allow_soft_placement = True
    return tf.compat.v1.Session(graph=graph, config=config)


def const_weights(graph_def: Any) -> dict[str, np.ndarray]:
    """Floating-point Const tensors of a GraphDef (the weights of a frozen graph) by node name."""
    tf = import_tf()
    out: dict[str, np.ndarray] = {}
    for node in graph_def.node:
        if node.op == "Const" and "value" in node.attr:
            arr = tf.make_ndarray(node.attr["value"].tensor)
            if arr.dtype.kind == "f" and arr.size > 1:
                out[node.name] = arr
    return out


# -- frozen graphs: weights as constants (the graph twin starts from one) -------------------

class GraphUnavailable(Exception):
    """The model's graph cannot be frozen; the message says why, ``fix`` (when known) what to do."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix


@dataclass
class FrozenGraph:
    """A reference's inference graph with its weights as constants, and where to feed/fetch.

    ``inputs``/``outputs`` are tensor names (``"x:0"``) in the order of the reference's
    ``LoadedModel.inputs``/``.outputs``. ``tables``: the lookup tables the graph reads (a
    ``StringLookup``'s vocabulary), by the placeholder its handle is fed through: ``(keys,
    values)`` exported from the traced function's captures, which a freeze does not make
    constants (``lookup_tables``).
    """

    graph_def: Any
    inputs: list[str]
    outputs: list[str]
    tables: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def op_types(self) -> set[str]:
        ops = {node.op for node in self.graph_def.node}
        for function in self.graph_def.library.function:
            ops.update(node.op for node in function.node_def)
        return ops


def freeze_concrete(fn: Any, input_order: list[int] | None = None) -> FrozenGraph:
    """Freeze a ConcreteFunction; outputs in ``tf.nest.flatten(structured_outputs)`` order,
    inputs in the function's flat order (``input_order`` reorders them).

    Only the frozen GraphDef is needed, not a function made of it: TensorFlow's
    ``convert_variables_to_constants_v2`` spends most of its time wrapping the GraphDef back
    into a ConcreteFunction (InceptionV3: 4.5 of 5.2 s), so its first step is called alone
    where this TensorFlow has it (``_replace_variables_by_constants``), the public function
    otherwise."""
    import_tf()
    try:
        with quiet():
            try:
                graph_def, frozen_inputs, outputs = _frozen_graph_def(fn)
            except _NoShortcut:
                graph_def, frozen_inputs, outputs = _frozen_by_public_function(fn)
    except Exception as exc:  # noqa: BLE001 - any failure: no graph twin
        raise GraphUnavailable(f"freezing the graph failed ({first_line(exc)})") from exc
    inputs = [t.name for t in frozen_inputs if t.dtype.name != "resource"]
    if input_order is not None:
        inputs = [inputs[i] for i in input_order]
    return FrozenGraph(graph_def, inputs, outputs, tables=lookup_tables(fn, frozen_inputs, graph_def))


class _NoShortcut(Exception):
    """This TensorFlow lacks the private first step of ``convert_variables_to_constants_v2``."""


def _frozen_by_public_function(fn: Any) -> tuple[Any, list[Any], list[str]]:
    """(GraphDef, input tensors, output names) of ``convert_variables_to_constants_v2``'s function."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    frozen = convert_variables_to_constants_v2(fn, lower_control_flow=False)
    return frozen.graph.as_graph_def(), list(frozen.inputs), [t.name for t in frozen.outputs]


def _frozen_graph_def(fn: Any) -> tuple[Any, list[Any], list[str]]:
    """(GraphDef, input tensors, output names) by ``convert_variables_to_constants_v2``'s own
    first step: the GraphDef with every variable a constant, and the inputs it keeps (its
    ``_construct_concrete_function`` keeps the function's inputs that were not converted, and
    its outputs, by name)."""
    try:
        from tensorflow.python.framework import convert_to_constants as c2c

        data_class = c2c._FunctionConverterDataInEager
        replace_variables = c2c._replace_variables_by_constants
    except (ImportError, AttributeError) as exc:
        raise _NoShortcut() from exc
    tf = import_tf()
    data = data_class(func=fn, lower_control_flow=False, aggressive_inlining=False)
    graph_def, converted_indices = replace_variables(converter_data=data)
    captures = list(fn.graph.internal_captures)
    converted = {id(captures[i]) for i in converted_indices}
    kept = [t for t in fn.inputs if id(t) not in converted]
    # What the outputs and inputs reach, as the wrapped function held: the trace's dead nodes
    # (a mask's unused ops, an RNN's unused TensorList) would count among the graph's op types.
    graph_def = tf.compat.v1.graph_util.extract_sub_graph(
        graph_def, list(dict.fromkeys(t.name.split(":")[0] for t in [*fn.outputs, *kept])))
    return graph_def, kept, [t.name for t in fn.outputs]


def lookup_tables(fn: Any, frozen_inputs: list[Any], graph_def: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{placeholder tensor name: (keys, values)}`` of each lookup table the frozen ``fn``
    (its inputs ``frozen_inputs``, its ``graph_def``) still reads through a resource placeholder:
    the table's contents, exported from ``fn``'s captured handle. A freeze turns variables into
    constants, not tables, so without them a twin of the graph had an uninitialised table (an
    adapted ``StringLookup``, ``IntegerLookup`` or ``TextVectorization``). A resource that is no
    table, or one that does not export, is left out (the graph then cannot run on its own)."""
    tf = import_tf()
    captured = list(getattr(fn, "captured_inputs", ()))
    own = list(fn.inputs)[:len(fn.inputs) - len(captured)] if captured else list(fn.inputs)
    handles = {t.name: h for t, h in zip(list(fn.inputs)[len(own):], captured)}
    tables: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for tensor in frozen_inputs:
        if tensor.dtype.name != "resource" or tensor.name not in handles:
            continue
        dtypes = _table_dtypes(graph_def, tensor.name.split(":")[0])
        if dtypes is None:  # no table read from it (never guessed: a wrong dtype aborts the process)
            continue
        try:
            keys, values = tf.raw_ops.LookupTableExportV2(table_handle=handles[tensor.name], Tkeys=dtypes[0],
                                                          Tvalues=dtypes[1])
        except Exception:  # noqa: BLE001 - not an exportable table: the graph keeps its placeholder
            continue
        tables[tensor.name] = (keys.numpy(), values.numpy())
    return tables


_CALLS = ("StatefulPartitionedCall", "PartitionedCall")


def _table_dtypes(graph_def: Any, source: str) -> tuple[Any, Any] | None:
    """``(key dtype, value dtype)`` of the ``LookupTableFindV2`` that reads the table handle
    ``source`` (a node name), followed through identities and into the functions it is passed
    to (a SavedModel signature calls the model's function); None when no lookup reads it."""
    tf = import_tf()
    library = {f.signature.name: f for f in graph_def.library.function}

    def search(nodes: Any, name: str, depth: int) -> tuple[Any, Any] | None:
        for node in nodes:
            for index, inp in enumerate(node.input):
                if inp.startswith("^") or inp.split(":")[0] != name:
                    continue
                if node.op == "LookupTableFindV2" and index == 0:
                    return tf.as_dtype(node.attr["Tin"].type), tf.as_dtype(node.attr["Tout"].type)
                if node.op == "Identity" and depth < 32:  # an inlined call's input
                    found = search(nodes, node.name, depth + 1)
                    if found is not None:
                        return found
                    continue
                function = library.get(node.attr["f"].func.name) if node.op in _CALLS else None
                if function is not None and depth < 32 and index < len(function.signature.input_arg):
                    found = search(function.node_def, function.signature.input_arg[index].name, depth + 1)
                    if found is not None:
                        return found
        return None

    return search(graph_def.node, source, 0)


def freeze_session(session: Any, graph: Any, inputs: list[str], outputs: list[str]) -> FrozenGraph:
    """Freeze a TF1 graph whose variables live in ``session`` (a restored checkpoint)."""
    tf = import_tf()
    from .v2_flow import FrozenUpdate, freezable

    names = sorted({name.split(":")[0] for name in outputs})
    # Functional control flow (a graph built after disable_eager_execution()): an If on a folded
    # switch runs its taken branch alone, gradient rewrites are undone, or the freeze feeds the
    # training branch's variable updates a float and every converter refuses the graph.
    try:
        graph_def, _done = freezable(graph.as_graph_def(), outputs)
    except FrozenUpdate as exc:
        raise GraphUnavailable(str(exc), exc.fix) from exc
    try:
        with quiet():
            graph_def = tf.compat.v1.graph_util.convert_variables_to_constants(session, graph_def, names)
    except Exception as exc:  # noqa: BLE001
        raise GraphUnavailable(f"freezing the checkpoint's graph failed ("
                                   f"{first_line(exc)})") from exc
    _tidy_frozen_functions(graph_def)
    return FrozenGraph(graph_def, list(inputs), list(outputs))


_DT_RESOURCE = 20


def _tidy_frozen_functions(graph_def: Any) -> None:
    """Drop what the freeze leaves of a variable on a function argument it made a constant (the
    resource's ``handle_data`` on what is now a float, and empty ``arg_attr`` entries). Why:
    TensorFlow drops them when it registers the function again, so the second freeze that
    TFLite's static-batch route and tf2onnx make of the wrapped graph registered a copy that
    differs under the same name ("Attempting to add a duplicate function with name:
    while_body_frozen_N where the previous and current definitions differ"): a while loop that
    reads variables (a graph written after disable_eager_execution()) converted with neither."""
    for function in graph_def.library.function:
        for arg in [*function.signature.input_arg, *function.signature.output_arg]:
            if arg.type != _DT_RESOURCE and arg.handle_data:
                del arg.handle_data[:]
        for key in [k for k, v in function.arg_attr.items() if not v.attr]:
            del function.arg_attr[key]


def run_with_constants(graph_def: Any, inputs: Mapping[str, str], outputs: Mapping[str, str],
                       feeds: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``graph_def`` run once in a session of its own, ``feeds`` (by the keys of ``inputs``, which
    map a key to a tensor name) fed, the Const nodes named in ``values`` fed those arrays instead
    of their own: ``{key of outputs: value}``. Raises KeyError for a name that is no Const."""
    tf = import_tf()
    consts = {node.name for node in graph_def.node if node.op == "Const"}
    unknown = sorted(set(values) - consts)
    if unknown:
        raise KeyError(f"no Const node named {unknown[0]!r} in the graph")
    graph = tf.Graph()
    with graph.as_default(), quiet():
        tf.graph_util.import_graph_def(graph_def, name="")
    feed_dict = {graph.get_tensor_by_name(inputs[k]): v for k, v in feeds.items()}
    feed_dict.update({graph.get_tensor_by_name(f"{name}:0"): v for name, v in values.items()})
    keys = list(outputs)
    with new_session(graph) as session:
        got = session.run([graph.get_tensor_by_name(outputs[k]) for k in keys], feed_dict=feed_dict)
    return {k: np.asarray(v) for k, v in zip(keys, got)}


def wrap_frozen(graph_def: Any, inputs: Mapping[str, str], outputs: Mapping[str, str],
                shapes: Mapping[str, Any] | None = None) -> tuple[Any, Any]:
    """A frozen graph as ``(ConcreteFunction, holder)``: the function takes the keys of
    ``inputs`` as keyword (and, in sorted-key order, positional) arguments and returns a dict
    by the keys of ``outputs`` (both map a key to a tensor name); ``shapes`` gives the static
    output shapes pruning drops. ``holder`` is a ``tf.Module`` keeping the graph alive: what
    the TFLite converter re-saves with the output names (given a function, it names them
    ``Identity``) and what ``tf.saved_model.save`` can write with this function as signature.

    Why: a TF1 graph (a frozen ``.pb``, a checkpoint, a SavedModel TF 2.x cannot revive) then
    converts and runs like a SavedModel signature, with no session."""
    tf = import_tf()
    from tensorflow.python.framework import func_graph

    def import_frozen() -> None:
        tf.graph_util.import_graph_def(graph_def, name="")

    with quiet():
        wrapped = tf.compat.v1.wrap_function(import_frozen, [])
        names = sorted(inputs)
        feeds = [wrapped.graph.get_tensor_by_name(inputs[k]) for k in names]
        fetches = {k: wrapped.graph.get_tensor_by_name(v) for k, v in outputs.items()}
        signature = ((), func_graph.convert_structure_to_signature(dict(zip(names, feeds))))
        fn = wrapped.prune(feeds=feeds, fetches=fetches, input_signature=signature,
                           are_keyword_args_also_positional=True)
    fn._arg_keywords = names  # what TF's own v1-in-v2 loader sets: the keyword order
    for key, shape in (shapes or {}).items():
        fn.structured_outputs[key].set_shape(tf.TensorShape(shape))
    holder = tf.Module()
    holder._wrapped = wrapped  # keeps the function's graph alive
    return fn, holder


_NOINLINE_ATTRS = ("_noinline", "_XlaMustCompile")


def inline_kept_functions(graph_def: Any, outputs: list[str]) -> bool:
    """Inline the functions marked never to be inlined (Keras runs grouped convolutions in a
    ``jit_compile`` function), so their convolutions can be rewritten like the others.
    Grappler's function optimizer does the inlining once the marks are cleared; on any
    failure the graph is left as it was (correct, only slower)."""
    marked = [f for f in graph_def.library.function if any(a in f.attr and f.attr[a].b for a in _NOINLINE_ATTRS)]
    if not marked:
        return False
    tf = import_tf()
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.grappler import tf_optimizer
    from tensorflow.python.training import saver

    work = tf.compat.v1.GraphDef()
    work.CopyFrom(graph_def)
    for holder in [*work.library.function, *work.node, *[n for f in work.library.function for n in f.node_def]]:
        for attr in _NOINLINE_ATTRS:
            if attr in holder.attr:
                del holder.attr[attr]
    try:
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(work, name="")
            fetch = graph.get_collection_ref("train_op")
            fetch.extend(graph.get_tensor_by_name(name) for name in outputs)
        meta = saver.export_meta_graph(graph_def=graph.as_graph_def(), graph=graph)
        config = config_pb2.ConfigProto()
        config.graph_options.rewrite_options.min_graph_nodes = -1
        config.graph_options.rewrite_options.optimizers.append("function")
        with quiet():
            inlined = tf_optimizer.OptimizeGraph(config, meta)
    except Exception:  # noqa: BLE001 - keep the functions: the twin is slower, not wrong
        return False
    graph_def.CopyFrom(inlined)
    return True
