"""Which layers quantisation costs the most: a quantised TFLite file against its float32 sibling.

Why this and not the layer table of ``localize.py``: a Keras layer paired with a fused TFLite
op reports inflated errors (VGG16 ``predictions`` "2.55" while the output differed by 0.025),
and inside an int8 graph no Keras layer pairs at all. The float32 file and the quantised one
made from the same graph share their op names, so their tensors pair one to one. Both run
with every tensor preserved (LiteRT ``experimental_preserve_all_tensors``; TensorFlow's
``QuantizationDebugger`` does the same on one model but drives the deprecated
``tf.lite.Interpreter`` and needs the converter and its data, which a file does not carry).

A layer's *cost* is the relative RMS error it adds: the error of its output minus the
largest error among its inputs, so the layers downstream of a costly one are not blamed for
what they received.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

# Rows of the batch the two files are run on (intermediates of every op are kept in memory).
LAYER_ROWS = 8
# The runs that keep every tensor go without XNNPACK, on LiteRT's reference kernels, and what
# they cost grows with the elements they keep (MobileNetV2 at 224 px: 7.2 M per row, 8 rows
# 4.3 s for the two files, bench/quant_diagnosis.py): fewer rows where one row keeps many, at
# least one, so that neither file keeps more than this many elements in all.
LAYER_ELEMENTS = 16_000_000
SHOWN = 3
# The float16 file and its twin round the same weights: they agree bitwise (digits CNN) or
# within float32 noise; a layer whose weights differ by 1% shows 1e-2.
TWIN_AGREES = 1e-5
_PASS_THROUGH = {"QUANTIZE", "DEQUANTIZE", "RESHAPE", "SQUEEZE", "EXPAND_DIMS"}
_REQUANTIZE = {"QUANTIZE", "DEQUANTIZE"}
# Weightless ops whose output error grows with their input's (a SOFTMAX turns a logit error into
# a larger probability error): never blamed, what they add is credited to the op feeding them,
# whose quantised weights or output made the error (issue 27: SOFTMAX named with "keep it in float").
_AMPLIFIERS = {"SOFTMAX", "LOG_SOFTMAX", "LOGISTIC", "TANH"}


@dataclass(frozen=True)
class LayerCost:
    tensor: str         # the op's output tensor name (shared by both files)
    op: str             # the op type in the quantised file
    error: float        # relative RMS error of the output vs the float32 sibling
    added: float        # error minus the largest error among its inputs
    position: int = 0   # the op's place in execution order
    amplified_by: str = ""  # a weightless op after it whose added error is credited here
    fed_by: tuple[str, ...] = ()  # ``tensor`` of the measured ops whose outputs it reads

    @property
    def layer(self) -> str:
        """The Keras layers of a fused tensor name: ``m_1/relu1_1/Relu;m_1/bn1_1/...;m_1/conv1_1/...``
        -> ``relu1 (fused: bn1, conv1)``."""
        names: list[str] = []
        for piece in self.tensor.split(";"):
            name = _layer_of(piece)
            if name not in names:
                names.append(name)
        return names[0] + (f" (fused: {', '.join(names[1:4])})" if len(names) > 1 else "")


def _layer_of(piece: str) -> str:
    parts = [p for p in piece.split("/") if p]
    if len(parts) <= 2:
        return piece
    # A retraced Keras model names every scope with one suffix ("digits_1/conv1_1"): drop it.
    suffix = re.search(r"_\d+$", parts[0])
    if suffix and parts[1].endswith(suffix.group()):
        return parts[1][: -len(suffix.group())]
    return parts[1]


def _rel_rms(q: np.ndarray, f: np.ndarray) -> float:
    diff = float(np.sqrt(np.mean((q - f) ** 2)))
    denom = float(np.sqrt(np.mean(f ** 2)))
    return diff / denom if denom else (0.0 if diff == 0 else float("inf"))


def layer_costs(quantized: Any, sibling: Any, inputs: Any) -> list[LayerCost]:
    """Every op of ``quantized`` whose output pairs with a ``sibling`` tensor, costliest first."""
    return _measured(quantized, sibling, inputs)[0]


def _intermediates(quantized: Any, sibling: Any, inputs: Any) -> tuple[Any, Any, int | None]:
    """Both files' intermediates on the first rows of ``inputs``: ``LAYER_ROWS`` at most, fewer
    where a row of the quantised file keeps more than ``LAYER_ELEMENTS / LAYER_ROWS`` elements
    (it runs one row first, to count them); and how many rows that was (None: a batch whose
    rows are unknown)."""
    from ..formats.tflite.quant import float_intermediates
    from ._util import batch_size, rows

    n = batch_size(inputs)
    if not n:
        return float_intermediates(quantized, inputs), float_intermediates(sibling, inputs), None
    one = rows(inputs, slice(0, 1)) if n > 1 else inputs
    q = float_intermediates(quantized, one)  # the sibling has the same graph, less its (de)quantise ops
    want = max(1, min(n, LAYER_ROWS, LAYER_ELEMENTS // max(sum(int(v.size) for v in q[0].values()), 1)))
    few = rows(inputs, slice(0, want)) if want < n else inputs
    return q if want == 1 else float_intermediates(quantized, few), float_intermediates(sibling, few), want


def _measured(quantized: Any, sibling: Any, inputs: Any) -> tuple[list[LayerCost], int | None]:
    """``layer_costs`` and the rows it ran on."""
    (q_tensors, q_ops), (f_tensors, f_ops), used = _intermediates(quantized, sibling, inputs)
    aligned = _by_position(q_ops, f_ops)
    error: dict[str, float] = {}
    producer: dict[str, Any] = {}
    recorded: set[int] = set()
    costs: list[LayerCost] = []
    owners: list[Any] = []
    tensor_of: dict[int, str] = {}  # id(owner op) -> the tensor its cost is recorded under
    for op in q_ops:
        incoming = max((error.get(name, 0.0) for name in op.inputs), default=0.0)
        # An int8 file names an op's output "...:01" and its DEQUANTIZE's output as the float
        # file does: the cost measured after a pass-through op belongs to the op before it.
        owner = op
        while owner.op in _REQUANTIZE and owner.inputs and owner.inputs[0] in producer:
            owner = producer[owner.inputs[0]]
        owner_incoming = max((error.get(name, 0.0) for name in owner.inputs), default=0.0) if owner is not op \
            else incoming
        for name in op.outputs:
            producer[name] = op
            q = q_tensors.get(name)
            f = f_tensors.get(name)
            if f is None or (q is not None and f.shape != q.shape):
                f = f_tensors.get(aligned.get(name, ""))
            if q is None or f is None or q.shape != f.shape or not q.size:
                error[name] = incoming  # a renamed or requantised tensor carries what it received
                continue
            err = _rel_rms(q, f)
            error[name] = err
            if owner.op not in _PASS_THROUGH and id(owner) not in recorded:
                recorded.add(id(owner))
                tensor_of[id(owner)] = name
                costs.append(LayerCost(name, owner.op, err, err - owner_incoming, len(costs),
                                       fed_by=_feeders(owner, producer, tensor_of)))
                owners.append(owner)
    return sorted(_credit_amplified(costs, owners, producer), key=lambda c: c.added, reverse=True), used


def _feeders(op: Any, producer: dict[str, Any], tensor_of: dict[int, str]) -> tuple[str, ...]:
    """The recorded tensors of the ops whose outputs ``op`` reads, through pass-through ops
    (an int8 file's QUANTIZE/DEQUANTIZE, reshapes)."""
    found: list[str] = []
    for name in op.inputs:
        source = producer.get(name)
        while source is not None and source.op in _PASS_THROUGH and source.inputs:
            source = producer.get(source.inputs[0])
        if source is not None and id(source) in tensor_of and tensor_of[id(source)] not in found:
            found.append(tensor_of[id(source)])
    return tuple(found)


def _credit_amplified(costs: list[LayerCost], owners: list[Any], producer: dict[str, Any]) -> list[LayerCost]:
    """Drop the weightless amplifiers (``_AMPLIFIERS``), crediting what they add to the op that
    produced their input (through requantisation and reshapes)."""
    at = {id(owner): i for i, owner in enumerate(owners)}
    kept: list[LayerCost | None] = list(costs)
    for i, (cost, owner) in enumerate(zip(costs, owners)):
        if cost.op not in _AMPLIFIERS:
            continue
        kept[i] = None
        source = producer.get(owner.inputs[0]) if owner.inputs else None
        while source is not None and source.op in _PASS_THROUGH and source.inputs:
            source = producer.get(source.inputs[0])
        j = at.get(id(source)) if source is not None else None
        target = kept[j] if j is not None else None
        if j is not None and target is not None:
            kept[j] = replace(target, added=target.added + max(cost.added, 0.0), amplified_by=cost.op)
    return [c for c in kept if c is not None]


def _by_position(q_ops: list, f_ops: list) -> dict[str, str]:
    """{quantised tensor name: float tensor name} of ops paired by position, when both files
    run the same op sequence (requantisation aside). Names pair files exported from one Keras
    object; a file exported from another object of the same architecture (a retrained or
    patched copy) has other scope suffixes ("model_2/conv1_2/...") and pairs only this way."""
    q_seq = [op for op in q_ops if op.op not in _REQUANTIZE]
    f_seq = [op for op in f_ops if op.op not in _REQUANTIZE]
    if len(q_seq) != len(f_seq) or any(a.op != b.op or len(a.outputs) != len(b.outputs)
                                       for a, b in zip(q_seq, f_seq)):
        return {}
    return {qa: fb for a, b in zip(q_seq, f_seq) for qa, fb in zip(a.outputs, b.outputs)}


def _rows_text(costs: list[LayerCost]) -> str:
    return "\n".join(f"      {c.layer:<28} {c.op:<18} error {c.error:.3g} of its RMS (adds {c.added:+.3g}"
                     + (f", with what the {c.amplified_by} after it amplifies" if c.amplified_by else "")
                     + f")  [{c.tensor.split(';', 1)[0]}]" for c in costs[:max(SHOWN, 6)])


def _top_costs(costs: list[LayerCost]) -> list[LayerCost]:
    return [c for c in costs[:SHOWN] if c.added > 0] or costs[:1]


def _top(costs: list[LayerCost]) -> str:
    top = _top_costs(costs)
    return ", ".join(f"`{c.layer}` ({c.op})" for c in top)


def cost_hint(quantized: Any, sibling: Any, inputs: Any, variant: str) -> tuple[str, str, str] | None:
    """(cause, message, evidence) naming the costliest layers and how to keep them in float; for
    an int8 file the session exported, what keeping them in float gains, measured (``Trial``)."""
    costs, used = _measured(quantized, sibling, inputs)
    if not costs:
        return None
    trial = try_keeping(quantized, sibling, inputs, kept_names(costs)) if variant == "int8" else None
    fix = advice(variant, costs, source_route(quantized), trial)
    evidence = (f"each op's output in the tflite:{variant} file vs the same tensor of its float32 sibling (relative "
                f"RMS over {_rows_said(used)}), costliest first:\n{_rows_text(costs)}")
    if trial is not None:
        evidence += "\n" + trial.evidence()
    return ("quantization_cost", f"quantisation costs the most at {_top(costs)}: {fix}", evidence)


# Keeping the named ops in float "helps" when the re-quantised file's output error is at most
# this share of the failing file's (musicnn MTT: the three costliest ops and their feeders
# took 0.279 to 0.248, which is no fix; one layer whose int8 output range is set by an
# outlier channel: 1.17 to 0.012, bench/quant_advice.py).
HELPS = 0.5
# A re-quantisation is one more int8 conversion: measured when the failing file's own export
# took at most this long (musicnn: 22 s under load; a 300 k-parameter CNN: 0.3 s).
REQUANTIZE_BUDGET_S = 60.0


def kept_names(costs: list[LayerCost]) -> list[str]:
    """The ops the advice keeps in float: the costliest, and the measured ops they read. An
    op's added error is often the int8 rounding of its *input* tensor (an outlier channel
    sets the range, the small channels round to zero): keeping only the op leaves that tensor
    int8 and gains nothing; keeping its feeders too keeps the tensor float (measured above)."""
    names: list[str] = []
    for cost in _top_costs(costs):
        for name in (cost.tensor, *cost.fed_by):
            if name not in names:
                names.append(name)
    return names


@dataclass(frozen=True)
class Trial:
    """The int8 export again with ``names`` in float, and the output's relative RMS error (vs
    the float32 sibling, the worst output) before and after; ``not_run`` says why it was not."""

    names: tuple[str, ...]
    before: float | None = None
    after: float | None = None
    seconds: float | None = None
    not_run: str = ""

    @property
    def helps(self) -> bool:
        return self.after is not None and self.before is not None and self.after <= HELPS * self.before

    def figures(self) -> str:
        return (f"re-quantised with these {len(self.names)} op(s) in float, the output's relative RMS error went "
                f"from {self.before:.3g} to {self.after:.3g}")

    def evidence(self) -> str:
        if self.after is None:
            return f"what keeping them in float gains was not measured: {self.not_run}"
        took = f" ({self.seconds:.1f} s)" if self.seconds is not None else ""
        return f"measured: {self.figures()}{took}, on the batch's rows, against the float32 sibling"


def try_keeping(quantized: Any, sibling: Any, inputs: Any, names: list[str]) -> Trial:
    """``Trial`` of keeping ``names`` in float, when ``quantized`` can be re-exported (the
    session attaches ``requantize``: same source, calibration rows and converter options)."""
    requantize = getattr(quantized, "requantize", None)
    if requantize is None:
        return Trial(tuple(names), not_run="the file was not exported by this session (it cannot be re-quantised "
                                            "here); run the call below and compare the file it writes")
    took = getattr(quantized, "requantize_seconds", None)
    if took is not None and took > REQUANTIZE_BUDGET_S:
        return Trial(tuple(names), not_run=f"its int8 export took {took:.0f} s, more than the {REQUANTIZE_BUDGET_S:g} s "
                                            "a diagnosis spends on one re-quantisation")
    start = time.perf_counter()
    try:
        kept = requantize(names)
    except Exception as exc:  # noqa: BLE001 - the advice is then given unmeasured, with the reason
        first = str(exc).splitlines()[0] if str(exc) else ""
        return Trial(tuple(names), not_run=f"the re-quantisation failed ({type(exc).__name__}: {first[:300]})")
    try:
        reference = _flat_outputs(sibling, inputs)
        before = _output_error(_flat_outputs(quantized, inputs), reference)
        after = _output_error(_flat_outputs(kept, inputs), reference)
    except Exception as exc:  # noqa: BLE001 - the cost hint stays, its advice unmeasured
        first = str(exc).splitlines()[0] if str(exc) else ""
        return Trial(tuple(names), not_run=f"running the re-quantised file failed ({type(exc).__name__}: {first[:300]})")
    finally:
        close = getattr(kept, "close", None)
        if close is not None:
            close()
    return Trial(tuple(names), before, after, time.perf_counter() - start)


def _flat_outputs(model: Any, inputs: Any) -> dict[str, np.ndarray]:
    from ._util import flatten, run_model

    return flatten(run_model(model, inputs))


def _output_error(mine: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> float:
    """The worst output's relative RMS error of ``mine`` vs ``theirs`` (outputs paired by name)."""
    errors = [_rel_rms(np.asarray(mine[k], np.float64), np.asarray(theirs[k], np.float64))
              for k in mine if k in theirs and np.shape(mine[k]) == np.shape(theirs[k])]
    if not errors:
        raise ValueError("no output of the re-quantised file pairs with the sibling's")
    return max(errors)


def source_route(quantized: Any) -> str | None:
    """The route the exporter recorded for the quantised file (what it was converted from and
    with which load options), or None."""
    from ..formats import export_route

    path = getattr(quantized, "source", None)
    return export_route(path) if path is not None else None


# What a TF1 source's conversion route names: graph_source writes "TF1 checkpoint frozen,
# wrapped (feeds={...})" or "TF1 graph wrapped as a function (outputs=[...])".
_TF1_ROUTE = re.compile(r"TF1 (checkpoint frozen, wrapped|graph wrapped as a function)(?: \(((?:inputs|outputs|feeds)=.*?)\))?"
                        r"(?:;|$)")


def _export_call(names: list[str], route: str | None) -> str:
    """``export_model(...)`` that quantises the source the file came from with ``names`` kept in
    float: the plugin freezes a TF1 checkpoint or ``.pb`` (with the same load options) and
    builds the converter as it did, so nothing is redone by hand."""
    found = _TF1_ROUTE.search(route or "")
    if found is not None and found.group(1).startswith("checkpoint"):
        source, what = "CHECKPOINT", "CHECKPOINT: the TF1 checkpoint the suite loads (its directory, prefix or .meta)"
    elif found is not None:
        source, what = "FROZEN_PB", "FROZEN_PB: the frozen .pb the suite loads"
    else:
        source, what = "model", "model: the Keras model or SavedModel directory the suite compares"
    options = f", {found.group(2)}" if found is not None and found.group(2) else ""
    return (f"export_model({source}, \"tflite\", \"model_int8.tflite\", quantization=\"int8\", "
            f"representative_data=ROWS, converter_options={{\"float_nodes\": {names!r}}}{options}) "
            f"(from pytest_modelparity; {what}; ROWS: batches like the model's inputs, as modelparity_dataset gives)")


def advice(variant: str, costs: list[LayerCost], route: str | None = None, trial: Trial | None = None) -> str:
    """How to keep the costliest layers in float, on a route that runs for ``variant``, as code
    that runs on the source the file was converted from (``route``: its export route); for
    int8, what ``trial`` measured that it gains, and no such advice where it gains little."""
    if variant == "float16":
        return ("float16 weights cost this model more than the float16 budget: keep those layers in float32 "
                "(compare tflite instead), or loosen the budget if the cost is acceptable")
    if variant == "dynamic_range":
        # QuantizationDebugger refuses a converter without a representative dataset: no
        # denylist advice here that cannot run.
        return ("dynamic-range quantisation rounds their weights to int8 (tf.lite.experimental.QuantizationDebugger "
                "does not run on a dynamic-range converter): compare tflite:float16 instead, or quantise int8 with "
                "a representative dataset and keep them in float there (converter_options float_nodes)")
    names = list(trial.names) if trial is not None else kept_names(costs)
    call = _export_call(names, route) + (" -- the full tensor names, as written here (a layer's short name "
                                         "matches nothing; the plugin runs tf.lite.experimental.QuantizationDebugger "
                                         "with denylisted_nodes on the converter it builds)")
    if trial is not None and trial.after is not None and not trial.helps:
        spread = sum(1 for c in costs if c.added > 0)
        return (f"keeping them in float barely helps (measured: {trial.figures()}), so the cost is spread over the "
                f"graph ({spread} ops add error) and no few ops explain it: calibrate on rows like the inputs "
                "(modelparity_dataset: a calibration on another range costs every op), compare tflite:dynamic_range "
                "or tflite:float16 instead, train with quantisation awareness, or loosen the int8 budget "
                "(--modelparity-quant-budget) if the cost is acceptable. What was measured: " + call)
    said = f" (measured: {trial.figures()})" if trial is not None and trial.helps else \
        " (not measured)" if trial is not None else ""
    extra = len(names) - len(_top_costs(costs))
    keep = "keep them in float" if extra <= 0 else \
        f"keep them and the {extra} op{'s' if extra > 1 else ''} whose output{'s' if extra > 1 else ''} they read in float"
    return (f"{keep}{said}: " + call + "; or quantise their weights per "
            "channel, or calibrate on representative rows (modelparity_dataset)")


def _rows_said(used: int | None) -> str:
    if used is None:
        return "the batch"
    return (f"the batch's first {used} row{'s' if used > 1 else ''}: {LAYER_ROWS} at most, fewer where one row keeps "
            f"many tensor elements")


def float16_weights_hint(quantized: Any, twin: Any, inputs: Any) -> tuple[str, str, str] | None:
    """(cause, message, evidence) naming where a float16 file first departs from its sibling's
    weights rounded to float16: the twin rounds what the file rounds, so every layer before
    the one whose weights differ agrees bitwise."""
    costs = sorted((c for c in layer_costs(quantized, twin, inputs) if c.error > TWIN_AGREES),
                   key=lambda c: c.position)
    if not costs:
        return None
    first = costs[0]
    return ("float16_weights_differ",
            f"the float16 file's weights are not its float32 sibling's rounded to float16, first at `{first.layer}` "
            f"({first.op}): the float16 export was made from other weights (or a converter changed them); "
            "re-export both from the same model",
            "each op's output in the float16 file vs its sibling with weights rounded to float16 (relative RMS; "
            f"every op before the first listed agrees within {TWIN_AGREES:g}), in execution order:\n"
            f"{_rows_text(costs)}")

