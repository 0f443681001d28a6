"""Find the first layer where two forms start to differ.

Run both forms with their intermediate tensors exposed (Keras: a model over every layer's
output; TFLite: preserved tensors; graphs: fetch every op's output; ONNX and TFJS: their
format's ``intermediates`` hook, TFJS fetching the last op of each name scope in Node.js),
walk the reference's layers in execution order, match each to a candidate tensor (by name,
else by size and order), and report the first layer whose output diverges while its inputs did not."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ._util import first_input, fit_inputs, is_keras_model, native_of, rows, scale_of

DIVERGE_REL = 1e-4  # share of a tensor's largest value; float noise here stays <= 5e-6
MAX_ROWS = 8        # rows of the batch used: enough to see a divergence, cheap to run


@dataclass
class LayerDiff:
    """One row of the divergence table: a reference layer and how its output compares."""

    layer: str
    op: str
    max_abs: float | None
    max_rel: float | None          # max abs over the layer output's largest magnitude
    diverged: bool
    candidate: str | None = None   # the matched candidate tensor
    candidate_op: str | None = None
    note: str = ""
    first: bool = False            # the first divergent layer
    layout: str = ""               # how the candidate tensor was aligned, e.g. "NCHW, transposed"
    inputs: tuple[str, ...] = ()   # the layers feeding this one, read from the reference's graph
    permuted: str = ""             # a transpose only the candidate runs just before this row
    # the first divergent row's candidate tensor, aligned to the reference's shape and layout:
    # what a layer-specific check reads back (a Normalization's statistics)
    value: Any = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        return format_rows([self])

    def as_tuple(self) -> tuple:
        return (self.layer, self.op, self.max_abs, self.max_rel, self.diverged)


def _tail(name: str, width: int) -> str:
    """The end of a long graph name (`…/conv_1/Relu`): its start is the same on every row."""
    return name if len(name) <= width else "…" + name[-(width - 1):]


def format_rows(diffs: list[LayerDiff]) -> str:
    """A plain-text table of divergence rows."""
    head = f"{'layer':<24} {'op':<18} {'max abs':>10} {'max rel':>10}  status"
    lines = [head]
    for d in diffs:
        status = ("FIRST DIVERGENCE" if d.first else "diverged") if d.diverged else (d.note or "ok")
        cand = f"  <- {d.candidate_op or '?'} `{d.candidate}`" if d.candidate else ""
        if d.candidate and d.layout:
            cand += f" ({d.layout})"
        ma = "-" if d.max_abs is None else f"{d.max_abs:.3g}"
        mr = "-" if d.max_rel is None else f"{d.max_rel:.3g}"
        lines.append(f"{_tail(d.layer, 24):<24} {d.op[:18]:<18} {ma:>10} {mr:>10}  {status}{cand}")
    return "\n".join(lines)


# -- exposing intermediates ------------------------------------------------------------

Entry = tuple[str, str, np.ndarray]


def intermediates_of(model: Any, batch: Any, errors: list[str] | None = None) -> list[Entry] | None:
    """(name, op, value) of every intermediate tensor in execution order, or None.

    A format's ``intermediates`` hook that raises counts as absent; its error is appended to
    ``errors`` (when given) so the caller can say why (e.g. the tfjs runner's message)."""
    fn = getattr(model, "intermediates", None)
    got = None
    if callable(fn):
        try:
            got = fn(batch)
        except Exception as exc:  # noqa: BLE001 - reported by the caller, never a crash here
            if errors is not None:
                errors.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
    if got:
        return [(str(n), str(o), np.asarray(v)) for n, o, v in got]
    native = native_of(model)
    if is_keras_model(native):
        return _keras_intermediates(native, batch)
    source = getattr(model, "source", None)
    if getattr(model, "format", None) == "tflite" and source and str(source).endswith(".tflite"):
        return _tflite_intermediates(str(source), model.prepare_batch(batch))
    if hasattr(native, "_get_ops_details"):
        return None  # an interpreter without preserved tensors reuses their memory
    try:
        import tensorflow as tf
    except ImportError:
        return None
    feeds = model.prepare_batch(batch) if hasattr(model, "prepare_batch") else None
    if isinstance(native, tuple) and native and isinstance(native[0], tf.Graph) and feeds is not None:
        outs = getattr(model, "_out", None) or [s.name for s in getattr(model, "outputs", ())]
        return _graph_intermediates(native[0], native[1], feeds, outs)
    if hasattr(native, "graph") and hasattr(native, "structured_input_signature") and feeds is not None:
        return _function_intermediates(native, feeds)
    return None


def _keras_intermediates(model: Any, batch: Any) -> list[Entry]:
    import keras

    if not getattr(model, "inputs", None) and getattr(model, "_inputs_struct", None) is None:
        return _traced_intermediates(model, batch)  # subclassed: its layers have no symbolic outputs
    layers, outputs = [], []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        try:
            out = layer.output
        except Exception:  # noqa: BLE001 - a layer used twice has no single output
            continue
        if isinstance(out, (list, tuple)):
            continue
        layers.append(layer)
        outputs.append(out)
    # Built on the model's own input structure (one tensor, list or dict) and fed in it, so
    # Keras does not warn "The structure of `inputs` doesn't match" into the user's test output.
    struct = getattr(model, "_inputs_struct", None)
    if struct is None:
        struct = model.inputs
    probe = keras.Model(struct, outputs)
    values = probe(fit_inputs(model, batch), training=False)
    if not isinstance(values, (list, tuple)):
        values = [values]
    return [(l.name, type(l).__name__, np.asarray(v)) for l, v in zip(layers, values)]


def _traced_intermediates(model: Any, batch: Any) -> list[Entry]:
    """A subclassed Keras model's ops, traced once as a ``tf.function`` and run frozen: the op
    names carry its layers' scopes (``conv2d/Relu``), which a converted form's tensors share."""
    import tensorflow as tf

    x = fit_inputs(model, batch)

    def trace(x: Any) -> Any:
        specs = tf.nest.map_structure(lambda a: tf.TensorSpec((None,) + tuple(np.shape(a))[1:],
                                                              tf.as_dtype(np.asarray(a).dtype)), x)
        return tf.function(lambda inp: model(inp, training=False)).get_concrete_function(specs)

    try:
        fn = trace(x)
    except Exception:  # noqa: BLE001 - a call that takes one tensor, fed {name: array}: feed the array
        if not (isinstance(x, Mapping) and len(x) == 1):
            raise
        x = next(iter(x.values()))
        fn = trace(x)
    feeds = {f"input_{i}": np.asarray(a) for i, a in enumerate(tf.nest.flatten(x))}
    return _function_intermediates(fn, feeds)


def _tflite_intermediates(path: str, feeds: dict[str, np.ndarray]) -> list[Entry]:
    import warnings

    from ai_edge_litert.interpreter import Interpreter

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = Interpreter(model_path=path, experimental_preserve_all_tensors=True)
    inputs = it.get_input_details()
    arrays = list(feeds.values())
    by_name = {d["name"]: d for d in inputs}
    order = [by_name.get(n) for n in feeds] if all(n in by_name for n in feeds) else inputs
    for det, arr in zip(order, arrays):
        it.resize_tensor_input(det["index"], arr.shape)
    it.allocate_tensors()
    for det, arr in zip(order, arrays):
        it.set_tensor(det["index"], arr.astype(det["dtype"]))
    it.invoke()
    details = {d["index"]: d for d in it.get_tensor_details()}
    out: list[Entry] = []
    seen: set[int] = set()
    for op in it._get_ops_details():
        if op["op_name"] == "DELEGATE":
            continue
        for idx in op["outputs"]:
            if idx < 0 or idx in seen:
                continue
            seen.add(idx)
            try:
                out.append((details[idx]["name"], op["op_name"], np.array(it.get_tensor(idx))))
            except ValueError:
                continue
    return out


def _tensor(graph: Any, ref: Any) -> Any:
    if not isinstance(ref, str):
        return ref
    return graph.get_tensor_by_name(ref if ":" in ref else f"{ref}:0")


def _graph_intermediates(graph: Any, sess: Any, feeds: dict[str, np.ndarray], outputs: Any = ()) -> list[Entry]:
    """Every float op output that feeds the model's outputs (a training graph's loss,
    labels and optimizer are left out), in graph order."""
    feed_dict = {_tensor(graph, name): arr for name, arr in feeds.items()}
    needed: set[str] | None = None
    if outputs:
        from ..formats import ancestor_ops

        needed = ancestor_ops([_tensor(graph, o).op for o in outputs])
    fed = _fed_ops(graph)
    fetch = []
    for op in graph.get_operations():
        if needed is not None and op.name not in needed:
            continue
        if fed and op.name not in fed:
            continue  # a constant's reshape (a bias made 4-D): the same in every batch, no layer's output
        if op.type in ("Const", "Placeholder", "NoOp", "VarHandleOp", "ReadVariableOp", "Identity") or op.name.endswith("/read"):
            continue
        for t in op.outputs:
            # An op's later outputs only where something reads them: an inference
            # FusedBatchNormV3's batch mean/variance are unused, and the session's optimiser
            # rewrites such a node into a Mul/Add with one output, so fetching output 1 fails
            # the whole run ("does not have output 1": a trained audio model's table was empty).
            if t.dtype.is_floating and (t.value_index == 0 or t.consumers()):
                fetch.append((op.name, op.type, t))
    values = sess.run([t for _, _, t in fetch], feed_dict=feed_dict)
    return [(n, o, np.asarray(v)) for (n, o, _), v in zip(fetch, values)]


def _fed_ops(graph: Any) -> set[str]:
    """Names of the ops whose value depends on a placeholder (the model's inputs)."""
    todo = [op for op in graph.get_operations() if op.type == "Placeholder"]
    seen = {op.name for op in todo}
    while todo:
        op = todo.pop()
        for t in op.outputs:
            for consumer in t.consumers():
                if consumer.name not in seen:
                    seen.add(consumer.name)
                    todo.append(consumer)
    return seen


def _function_intermediates(fn: Any, feeds: dict[str, np.ndarray]) -> list[Entry]:
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    frozen = convert_variables_to_constants_v2(fn)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(frozen.graph.as_graph_def(), name="")
    placeholders = [op for op in graph.get_operations() if op.type == "Placeholder"]
    by_name = {op.name: op for op in placeholders}
    fd = {}
    for i, (name, arr) in enumerate(feeds.items()):
        op = by_name.get(name) or (placeholders[i] if i < len(placeholders) else None)
        if op is None:
            return []
        fd[op.name] = arr
    outputs = [t.name for t in frozen.outputs]
    with tf.compat.v1.Session(graph=graph) as sess:
        return _graph_intermediates(graph, sess, fd, outputs)


# -- matching and comparing --------------------------------------------------------------

def _layer_token(name: str) -> str:
    """The layer a reference entry belongs to: a Keras layer name, or a graph op's scope."""
    parts = [p for p in re.split(r"[/;:]", name) if p]
    return parts[-2] if len(parts) >= 2 else (parts[0] if parts else name)


def _name_matches(layer: str, candidate_name: str) -> bool:
    pattern = re.compile(re.escape(layer) + r"(_\d+)?")
    return any(pattern.fullmatch(tok) for tok in re.split(r"[/;:]", candidate_name) if tok)


def _aligned(shape: tuple, target: tuple) -> bool:
    """The same shape, or the same up to the channel move a converter makes."""
    return tuple(shape) == tuple(target) or bool(_layouts(shape, target))


def _pairable(shape: tuple, target: tuple) -> bool:
    """Can a candidate tensor of ``shape`` hold a reference tensor of ``target``'s values: the
    same shape, a layout move, or one is the other with adjacent axes merged (a flatten to
    rank 2, a TFLite FullyConnected's (B*T, D) that keeps the last axis), axes of 1 aside. Two
    tensors of one size but other grids (a stride-8 heatmap (4, 4, 1) and a stride-16 box
    (2, 2, 4)) never pair."""
    if _aligned(shape, target):
        return True
    if not shape or not target or (min(len(shape), len(target)) > 2 and shape[-1] != target[-1]):
        return False
    a = [int(d) for d in shape if d != 1]
    b = [int(d) for d in target if d != 1]
    return _merged(a, b) or _merged(b, a)


def _merged(fine: list[int], coarse: list[int]) -> bool:
    """Is ``coarse`` ``fine`` with runs of adjacent axes multiplied together?"""
    i = 0
    for dim in coarse:
        prod = 1
        while i < len(fine) and prod < dim:
            prod *= fine[i]
            i += 1
        if prod != dim:
            return False
    return i == len(fine)


def _layouts(shape: tuple, target: tuple) -> list[tuple[tuple[int, ...], str]]:
    """Axis permutations that turn a candidate tensor of ``shape`` into ``target``'s layout:
    channels-first to channels-last and back (ONNX converters run convolutions in NCHW)."""
    n = len(shape)
    if n < 3 or n != len(target) or tuple(shape) == tuple(target):
        return []
    first_to_last = (0, *range(2, n), 1)       # NCHW -> NHWC
    last_to_first = (0, n - 1, *range(1, n - 1))  # NHWC -> NCHW
    out = []
    for perm, label in ((first_to_last, "channels-first, transposed"), (last_to_first, "channels-last, transposed")):
        if tuple(shape[i] for i in perm) == tuple(target):
            out.append((perm, label))
    return out


# Rows a candidate tensor is first set against its reference layer on: a difference on them
# is a lower bound of the whole one, so a candidate it already puts out of reach is never
# compared in full (MobileNetV2 at 224 px, 32 rows: 526 full comparisons took 10 s).
_FIRST_ROWS = 2


def _diff(ref: np.ndarray, cand: np.ndarray, rows: int | None = None,
          permute_ok: bool = True) -> tuple[float, float, str]:
    """(max abs, max rel, layout) of ``cand`` against ``ref``: the same shape, or when the
    shapes differ, the better of a layout transpose (NCHW <-> NHWC) and a plain reshape.
    ``rows``: only the first rows of both (the relative figure still against ``ref``'s whole
    scale), a lower bound of the full difference. ``permute_ok`` False: no layout transpose (the
    candidate tensor is a permutation's own output, which a transpose would undo and hide)."""
    r = np.asarray(ref)
    c = np.asarray(cand)
    tries = [(np.transpose(c, perm), label) for perm, label in _layouts(c.shape, r.shape)] if permute_ok else []
    tries.append((c.reshape(r.shape), ""))
    scale = max(scale_of(r), 1e-30)
    if rows is not None:
        r, tries = r[:rows], [(aligned[:rows], label) for aligned, label in tries]
    r = np.asarray(r, np.float64)
    best: tuple[float, float, str] | None = None
    for aligned, label in tries:
        d = np.abs(r - np.asarray(aligned, np.float64))
        d = d[np.isfinite(d)]
        max_abs = float(d.max()) if d.size else 0.0
        if best is None or max_abs < best[0]:
            best = (max_abs, max_abs / scale, label)
    assert best is not None
    return best


class _LazyDiffs(dict):
    """``_diff`` of ``ref`` against each candidate tensor, computed in full on first use;
    ``at_least(j)``: its relative figure on the first rows only (a lower bound, cheap)."""

    def __init__(self, ref: np.ndarray, cand: list[Entry]) -> None:
        super().__init__()
        self.ref, self.cand = ref, cand

    def at_least(self, j: int) -> float:
        if j in self or np.ndim(self.ref) == 0 or np.shape(self.ref)[0] <= _FIRST_ROWS:
            return self[j][1]
        return _diff(self.ref, self.cand[j][2], rows=_FIRST_ROWS, permute_ok=_may_transpose(self.cand[j][1]))[1]

    def __missing__(self, j: int) -> tuple[float, float, str]:
        self[j] = found = _diff(self.ref, self.cand[j][2], permute_ok=_may_transpose(self.cand[j][1]))
        return found


def _may_transpose(op: str) -> bool:
    """A layout transpose aligns a converter's channels-first tensors, never the output of a
    permutation the candidate itself runs (a port's channels-first flatten is the bug)."""
    return op.lower() not in ("permute", "transpose")


def compare_intermediates(ref: list[Entry], cand: list[Entry], *, rel: float = DIVERGE_REL,
                          feeding: Mapping[str, Any] | None = None) -> list[LayerDiff]:
    """Rows for each reference entry; marks the first divergent layer (see module doc).

    ``feeding`` ({layer: the layers it takes}, from the reference's graph): a row that differs
    before a later agreeing row is "fused or not exposed" only when that row depends on it; a
    head on another branch (a detector's stride-16 head after its stride-8 one) diverges on its
    own. Without it, every earlier differing row is."""
    ref = [e for e in ref if np.asarray(e[2]).dtype.kind == "f" and np.ndim(e[2]) >= 1]
    cand = [e for e in cand if np.asarray(e[2]).dtype.kind == "f" and np.ndim(e[2]) >= 1]
    rows_out: list[LayerDiff] = []
    status: list[str] = []
    where: list[int] = []  # the candidate index of each compared row
    pos = 0
    for name, op, r in ref:
        # A graph reference's scope carries Keras' call suffix (`conv_1`): a Keras candidate's
        # layer is `conv`, so the suffix is dropped for the name match.
        token = name if "/" not in name else re.sub(r"_\d+$", "", _layer_token(name))
        pool = [j for j in range(pos, len(cand)) if cand[j][2].size == r.size and _pairable(cand[j][2].shape, r.shape)]
        diffs = _LazyDiffs(r, cand)
        close = [j for j in pool if diffs.at_least(j) <= rel and diffs[j][1] <= rel]
        named = [j for j in pool if _name_matches(token, cand[j][0])]
        # A tensor of the reference's own shape (or its channel move) before a mere reshape
        # of the same values: a Dropout pairs with the candidate's identity, not a RESHAPE.
        aligned = [j for j in pool if _aligned(cand[j][2].shape, r.shape)]
        if close:
            named_close = [j for j in close if j in named]
            group = named_close or close
            group = [j for j in group if j in aligned] or group
            j = group[-1] if named_close else group[0]
            st = "match"
            # agreeing only through a reshape of another tensor while the layer's own tensor
            # (its name, its shape) differs: the difference starts here (a port's flatten
            # after an extra Permute holds the same values in another order)
            own = [k for k in named if k in aligned and k not in close
                   and _name_matches(token, cand[k][0].split(";")[0])] if j not in aligned else []
            if own:
                j, st = own[-1], "differs"
            pos = j
        elif named:
            j = named[-1]
            st = "differs"
            pos = j
        elif (earlier := _agrees_earlier(r, cand, pos, rel)) is not None:
            # heads computed in another order (a trained audio model's TFLite file runs `onset`
            # before `note`, the reference after): the value is there, only earlier, so this
            # row agrees; the same-shaped tensor after it is the other head's (it was blamed)
            j, st = earlier, "match"
        elif aligned and op != "Normalization":
            # never the model's output (or any tensor) merely reshaped to this size; nor, for a
            # Normalization no tensor is named after, an unnamed one of its shape: a port that
            # folds it into the next layer has none, and ONNX's transpose of the raw input
            # before that convolution was blamed ("differ at `norm`", rel 1.18)
            j = min(aligned, key=lambda k: diffs[k][0])
            st = "differs"
        else:
            rows_out.append(LayerDiff(name, op, None, None, False, note="no counterpart"))
            status.append("absent")
            where.append(-1)
            continue
        holder = _fused_holder(name, token, cand[j][0], ref)
        if st == "differs" and holder is None:
            holder = _holds_later(ref, name, r, cand[j][2], diffs[j][1])
        if st == "differs" and holder is not None:
            # a fused TFLite op (CONV_2D + BN + ReLU) holds the output of its last op: set
            # against this earlier part it differs by design (issue 27: "rel 13.2")
            rows_out.append(LayerDiff(name, op, None, None, False, note=f"fused into `{holder}` in the candidate"))
            status.append("fused")
            where.append(-1)
            continue
        rows_out.append(LayerDiff(name, op, diffs[j][0], diffs[j][1], False, cand[j][0], cand[j][1],
                                  layout=diffs[j][2]))
        status.append(st)
        where.append(j)
    last_match = max((i for i, s in enumerate(status) if s == "match"), default=-1)
    hidden = _feeding_later_matches(rows_out, status, feeding) if feeding else None
    first_marked = False
    for i, (row, st) in enumerate(zip(rows_out, status)):
        if st == "differs" and (i < last_match if hidden is None else row.layer in hidden):
            row.note = "fused or not exposed in the candidate"
            row.max_abs = row.max_rel = None
            row.candidate = row.candidate_op = None
            row.layout = ""
        elif st == "differs":
            row.diverged = True
            if not first_marked:
                row.first = first_marked = True
                row.permuted = _slip_before(ref[i][2], cand, where, status, i, rel)
                row.value = _aligned_value(ref[i][2], cand[where[i]][2], row.layout)
    return rows_out


def _aligned_value(r: np.ndarray, c: np.ndarray, layout: str) -> np.ndarray:
    """``c`` in ``r``'s shape, through the layout move ``_diff`` chose (or a plain reshape)."""
    for perm, label in _layouts(c.shape, r.shape):
        if label == layout:
            return np.transpose(c, perm)
    return np.asarray(c).reshape(r.shape)


def _feeding_later_matches(rows_out: list[LayerDiff], status: list[str], feeding: Mapping[str, Any]) -> set[str]:
    """The layers some later agreeing row depends on (its ancestors in the reference's graph):
    had one of them truly differed, that row would differ too."""
    def ancestors(layer: str) -> set[str]:
        seen: set[str] = set()
        todo = list(feeding.get(layer, ()))
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(feeding.get(name, ()))
        return seen

    out: set[str] = set()
    for row, st in zip(rows_out, status):
        if st == "match":
            out |= ancestors(row.layer)
    return out


def _slip_before(r: np.ndarray, cand: list[Entry], where: list[int], status: list[str], i: int, rel: float) -> str:
    """The candidate's extra transpose before row ``i`` when it is the whole difference there:
    undoing an axis permutation of row ``i``'s candidate tensor (in its own shape or in the
    transpose's) makes it agree with the reference. A transpose both forms run (Keras' Dense on
    a rank-3 tensor is a Tensordot with its own transposes) or a converter's layout change
    around a conv is never a slip: there the values differ, not only their order."""
    k = _permutation_before(cand, where, status, i)
    if k < 0:
        return ""
    value = cand[where[i]][2]
    for shape in (value.shape, cand[k][2].shape):
        if _agrees_permuted(r, value, tuple(shape), rel):
            return cand[k][0]
    return ""


def _agrees_permuted(r: np.ndarray, c: np.ndarray, shape: tuple, rel: float) -> bool:
    """Does ``c``, viewed in ``shape`` and with its non-batch axes permuted (never the
    identity), hold ``r``'s values to ``rel`` of ``r``'s scale?"""
    import itertools

    if len(shape) < 3 or int(np.prod(shape)) != c.size or c.size != r.size or len(shape) > 6:
        return False
    scale = max(scale_of(r), 1e-30)
    ref = np.asarray(r, np.float64).reshape(-1)
    view = np.asarray(c, np.float64).reshape(shape)
    for perm in itertools.permutations(range(1, len(shape))):
        if perm == tuple(range(1, len(shape))):
            continue
        moved = np.transpose(view, (0, *perm)).reshape(-1)
        d = np.abs(moved - ref)
        if np.all(np.isfinite(d)) and float(d.max()) <= rel * scale:
            return True
    return False


def _permutation_before(cand: list[Entry], where: list[int], status: list[str], i: int) -> int:
    """The index of a transpose the candidate runs between the last agreeing row's tensor and
    row ``i``'s that no reference row was paired with (a permutation the reference's rows do
    not show), else -1."""
    start = max((where[k] for k in range(i) if status[k] == "match" and where[k] >= 0), default=-1)
    used = set(where)
    for k in range(start + 1, where[i]):
        if k not in used and cand[k][1].lower() in ("transpose", "permute"):
            return k
    return -1


# A candidate tensor holds a later reference entry's value (after the bias, after the
# activation) when it is this many times closer to that entry than to the one it was set against.
_CLOSER = 4.0
_LOOKAHEAD = 4


def _holds_later(ref: list[Entry], name: str, r: np.ndarray, cand_value: np.ndarray, rel_here: float) -> str | None:
    """The later reference entry (within a few) whose value the candidate tensor holds, when
    it is much closer to it than to ``name``'s: a fused op (Conv + BiasAdd + Relu) is set
    against the reference's tensor after the bias and activation, not before them."""
    if not rel_here or not np.isfinite(rel_here):
        return None
    at = next((i for i, e in enumerate(ref) if e[0] == name), None)
    if at is None:
        return None
    for other, _op, value in ref[at + 1:at + 1 + _LOOKAHEAD]:
        if np.size(value) != np.size(cand_value) or np.shape(value) == () or value is r:
            continue
        if _diff(value, cand_value)[1] * _CLOSER < rel_here:
            return other
    return None


def _fused_holder(name: str, token: str, cand_name: str, ref: list[Entry]) -> str | None:
    """The reference entry a fused candidate tensor (``relu1/Relu;bn1/FusedBatchNorm;conv1/...``,
    whose first part is the op whose output it holds) really pairs with, when that is another,
    later entry than ``name``; else None."""
    parts = [p for p in cand_name.split(";") if p]
    if len(parts) < 2:
        return None
    held = parts[0]
    held_tail = held.rsplit("/", 1)[-1]
    later = False
    for other, _op, _v in ref:
        if other == name:
            later = True
            continue
        if not later:
            continue
        other_token = other if "/" not in other else re.sub(r"_\d+$", "", _layer_token(other))
        if "/" in other:  # a graph reference: the same layer scope, the op the fused tensor holds
            if other_token == token and other.rsplit("/", 1)[-1] == held_tail and name.rsplit("/", 1)[-1] != held_tail:
                return other
        elif _name_matches(other_token, held) and not _name_matches(token, held):
            return other
    return None


def localize_divergence(reference: Any, candidate: Any, inputs: Any, *, rel: float = DIVERGE_REL) -> list[LayerDiff]:
    """Rows (layer, op, max abs, max rel, diverged) comparing the two forms layer by layer.

    ``reference`` and ``candidate`` are LoadedModels or Keras models. Raises ValueError when
    a form cannot expose its intermediate tensors (say which, and how to get them).
    """
    batch = rows(inputs, slice(0, MAX_ROWS))
    if first_input(batch) is None and not isinstance(batch, dict):
        batch = inputs
    errors: list[str] = []
    ref = intermediates_of(reference, batch, errors)
    if not ref:
        raise ValueError(f"cannot expose the intermediate tensors of the reference ({_describe(reference)})"
                         f"{_because(errors)}; pass a Keras model, a TFLite file, a GraphDef, a SavedModel, "
                         "an ONNX or a TFJS model")
    cand = intermediates_of(candidate, batch, errors)
    if not cand:
        raise ValueError(f"cannot expose the intermediate tensors of the candidate ({_describe(candidate)})"
                         f"{_because(errors)}; " + _how_to_expose(candidate))
    feeding = _keras_inputs(native_of(reference))
    rows_out = compare_intermediates(ref, cand, rel=rel, feeding=feeding if _whole(feeding, ref) else None)
    for row in rows_out:
        row.inputs = tuple(feeding.get(row.layer, ()))
    return rows_out


def _whole(feeding: dict[str, list[str]], ref: list[Entry]) -> bool:
    """Does the graph read from the reference name the inputs of every layer it has rows for
    (a shared or nested layer has none: then the order of the rows is all there is)?"""
    return bool(feeding) and all(name in feeding for name, _op, _v in ref)


def _keras_inputs(model: Any) -> dict[str, list[str]]:
    """{layer: the layers whose outputs it takes}, from a functional Keras model's graph (a
    WaveNet gate's input is the residual stream, not its sibling listed just before it)."""
    if not is_keras_model(model):
        return {}
    out: dict[str, list[str]] = {}
    for layer in getattr(model, "layers", []):
        try:
            node = layer._inbound_nodes[0]
            tensors = node.input_tensors
        except Exception:  # noqa: BLE001 - a subclassed or shared layer: no single node
            continue
        names = []
        for t in tensors:
            history = getattr(t, "_keras_history", None)
            op = getattr(history, "operation", None) if history is not None else None
            if op is not None and op.name not in names and type(op).__name__ != "InputLayer":
                names.append(op.name)
        out[layer.name] = names
    return out


def _because(errors: list[str]) -> str:
    return f" ({errors[-1]})" if errors else ""


def _how_to_expose(model: Any) -> str:
    fmt = getattr(model, "format", None)
    if fmt == "tfjs":
        return ("tfjs could not fetch the graph's intermediate nodes (see the reason; nodes inside control flow "
                "cannot be fetched): localise against the SavedModel it was converted from")
    if fmt == "onnx":
        return "install the onnx package (pip install onnx), which the ONNX layer table needs"
    return "for TFLite load it from a .tflite file (preserve_all_tensors=True)"


def _describe(model: Any) -> str:
    fmt = getattr(model, "format", None)
    return f"format {fmt!r}" if fmt else type(model).__name__


def first_divergence(diffs: list[LayerDiff]) -> tuple[LayerDiff, LayerDiff | None] | None:
    """(first divergent row, the agreeing row of its input) or None: its input as the
    reference's graph says when it says (else the last agreeing row before it); None as the
    input when the graph names inputs none of which was compared and agrees."""
    before = None
    agreeing: dict[str, LayerDiff] = {}
    for d in diffs:
        if d.first:
            if d.inputs:
                fed = [agreeing[n] for n in d.inputs if n in agreeing]
                return d, (fed[0] if fed else None)
            return d, before
        if d.max_abs is not None and not d.diverged:
            before = d
            agreeing[d.layer] = d
    return None


def _agrees_earlier(r: np.ndarray, cand: list[Entry], pos: int, rel: float) -> int | None:
    """The last candidate tensor before ``pos`` of ``r``'s own shape (or its channel move) that
    agrees with it within ``rel``, or None (the first rows screen each one cheaply)."""
    diffs = _LazyDiffs(r, cand)
    for j in range(pos - 1, -1, -1):
        c = cand[j][2]
        if c.size == r.size and _aligned(c.shape, r.shape) and diffs.at_least(j) <= rel and diffs[j][1] <= rel:
            return j
    return None
