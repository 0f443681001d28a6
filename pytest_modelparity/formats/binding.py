"""Which tensor is which: the inputs and outputs of two forms of one model, paired by what they are.

Why one home: a SavedModel listed its signature's outputs in another order in each process,
tf2onnx names them ``StatefulPartitionedCall:k``, TFLite and tfjs add ``serving_default_`` and
``:0`` to input names; pairing by position or by luck made verdicts change from run to run and
blamed converters for the plugin's own mistake. Every pair records its basis, tried in order:

1. ``bind=``: the caller named the pairing;
2. ``same name``;
3. ``converter name``: a name a converter writes for the other's name (``serving_default_<n>:0``,
   ``<n>:0``);
4. ``export record``: the pairing written when the plugin made the export, which knew it then (a
   tfjs ``model.json``'s ``userDefinedMetadata``, or its ``structuredOutputKeys``; the cache
   entry's ``pairing.json``), before the index rule below, which is a convention, not knowledge;
5. ``converter name`` by index: where every tensor of one side is a placeholder with an index
   (``StatefulPartitionedCall:k``, ``Identity_k``, ``output_k``), the converters' order rule: a
   signature's dict flattens in sorted-name order, so index k is the k-th name in sorted order;
6. ``shape and dtype``: the only tensor of that shape and dtype on both sides;
7. ``values`` (outputs only): the reference output and the other output closest to each other on
   the batch, taken only where that pairing is clearly better than any other, and refused where
   two of the other form's outputs lie within ``CLOSE_OUTPUTS`` of each other on the batch (a file
   labelling them the wrong way round would pass: issue 36's two heads 2% apart).

Never bare position where two tensors could swap: what no rule settles raises ``BindingError``
listing both sides and how to name the pairing. numpy only; nothing here imports TensorFlow.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import BatchMismatchError
from .base import LoadedModel, TensorSpec, converter_base, describe_specs

__all__ = ["BASES", "CLOSE_OUTPUTS", "Binding", "BindingError", "BoundModel", "Pair", "bind", "bind_model", "close_outputs",
           "converter_base", "made_up", "merged_record", "placeholder_index", "specs_of_arrays"]

BASES = ("bind=", "same name", "converter name", "export record", "shape and dtype", "values")

# Names converters make up when they lose the model's own: the index says which flattened
# output (or input) of the signature the tensor is.
_PLACEHOLDER = re.compile(r"^(?:StatefulPartitionedCall|PartitionedCall|Identity|output|outputs)"
                          r"(?:_(\d+))?(?::(\d+))?$")
# Names no one chose: Keras' automatic input names and a list's positions. With the placeholders
# above they are "made up"; a tensor is paired by shape or by values only when one of the two
# names is made up (two real names that differ are two different tensors, or a mistake to hear of).
_AUTO_NAME = re.compile(r"^(?:keras_tensor|input_layer|input|inputs)(?:_\d+)?(?::0)?$|^\[\d+\]$")
# A value pairing counts only when its distance is below this share of the next best's.
CLEAR_MARGIN = 0.25
# Two outputs of one form closer than this share of their scale on the batch are never paired by
# values: the conversion bugs this plugin exists to catch measure 2e-3 (input scaled by 255/256)
# to 0.1 (BGR input) of scale (DESIGN.md), so outputs within 0.1 of each other could be taken for
# one another by such a bug, and a file that labels them the wrong way round would pass.
CLOSE_OUTPUTS = 0.1


class BindingError(BatchMismatchError):
    """Two forms' tensors cannot be paired by any rule: the message lists both sides and the fix."""


@dataclass(frozen=True)
class Pair:
    reference: str   # the tensor's name in the reference form
    other: str       # its name in the other form
    basis: str       # one of BASES
    how: str = ""    # e.g. "index 2 in sorted-name order"

    def describe(self) -> str:
        same = self.reference == self.other
        text = repr(self.reference) if same else f"{self.reference!r}~{self.other!r}"
        return f"{text} ({self.basis}{': ' + self.how if self.how else ''})"

    def to_dict(self) -> dict[str, str]:
        return {"reference": self.reference, "other": self.other, "basis": self.basis, "how": self.how}


@dataclass(frozen=True)
class Binding:
    """The pairs of one kind (inputs or outputs), in the reference's order."""

    kind: str
    pairs: tuple[Pair, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_other(self) -> dict[str, str]:
        return {p.reference: p.other for p in self.pairs}

    def to_reference(self) -> dict[str, str]:
        return {p.other: p.reference for p in self.pairs}

    @property
    def trivial(self) -> bool:
        """Every pair by the same name: nothing worth saying in a report."""
        return all(p.basis == "same name" for p in self.pairs)

    def counts(self) -> Counter:
        return Counter(p.basis for p in self.pairs)

    def describe(self) -> str:
        return f"{self.kind} paired: " + ", ".join(p.describe() for p in self.pairs)


def placeholder_index(name: str) -> int | None:
    """k of a made-up name (``StatefulPartitionedCall:k``, ``Identity_k``, ``output_k``), else None."""
    m = _PLACEHOLDER.match(name)
    if m is None:
        return None
    under, colon = (int(g) if g is not None else None for g in m.groups())
    if under is not None and colon not in (None, 0):
        return None  # Identity_1:2: no converter writes both
    return under if under is not None else (colon or 0)


def made_up(name: str) -> bool:
    """A name a converter or Keras made up (``Identity_1``, ``keras_tensor_3``, ``[0]``), not a real one."""
    return placeholder_index(name) is not None or bool(_AUTO_NAME.match(converter_base(name)))


def specs_of_arrays(values: Mapping[str, Any]) -> list[TensorSpec]:
    """Specs of outputs known only by their arrays (a raw model's named results)."""
    out = []
    for name, v in values.items():
        arr = np.asarray(v)
        out.append(TensorSpec(str(name), arr.shape, arr.dtype if arr.dtype.kind != "U" else object))
    return out


def _compatible(a: TensorSpec, b: TensorSpec) -> bool:
    """Same rank, no two known dims that differ, dtypes of one kind (float32 vs float16 is one)."""
    if len(a.shape) != len(b.shape):
        return False
    if any(x is not None and y is not None and x != y for x, y in zip(a.shape, b.shape)):
        return False
    kinds = {a.dtype.kind, b.dtype.kind}
    return len(kinds) == 1 or kinds <= set("iu") or kinds <= set("OSU")


def bind(kind: str, reference: Sequence[TensorSpec], other: Sequence[TensorSpec], *,
         explicit: Mapping[str, str] | None = None, recorded: Mapping[str, str] | None = None,
         values: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None,
         reference_label: str = "reference", other_label: str = "other",
         recorded_how: Mapping[str, str] | None = None) -> Binding:
    """Pair every ``reference`` tensor with one ``other`` tensor (``kind``: "inputs" or "outputs").

    ``explicit``: ``{reference name: other name}`` the caller gave (``bind=``); ``recorded``: the
    pairing kept when the plugin made the export (``recorded_how``: where each was kept);
    ``values``: (reference arrays, other arrays) by name on one batch, for outputs. Raises ``BindingError`` when the two sides differ in count
    or a tensor stays unpaired.
    """
    ref = list(reference)
    oth = list(other)
    ref_names, oth_names = [s.name for s in ref], [s.name for s in oth]
    by_ref = {s.name: s for s in ref}
    by_oth = {s.name: s for s in oth}
    pairs: dict[str, Pair] = {}
    notes: list[str] = []

    def left() -> tuple[list[str], list[str]]:
        used = {p.other for p in pairs.values()}
        return [n for n in ref_names if n not in pairs], [n for n in oth_names if n not in used]

    def fail(problem: str) -> BindingError:
        return BindingError(_error_text(kind, problem, ref, oth, pairs, reference_label, other_label))

    for r, o in (explicit or {}).items():
        if r not in by_ref:
            raise fail(f"bind= names {r!r}, which is no {kind[:-1]} of the {reference_label}")
        if o not in by_oth:
            raise fail(f"bind= names {o!r}, which is no {kind[:-1]} of the {other_label}")
        pairs[r] = Pair(r, o, "bind=")
    if len(ref) != len(oth):
        raise fail(f"the {reference_label} has {len(ref)} {kind} and the {other_label} {len(oth)}")

    rl, ol = left()
    for r in rl:
        if r in ol:
            pairs[r] = Pair(r, r, "same name")

    rl, ol = left()
    for r in rl:
        hits = [o for o in ol if converter_base(o) == r or converter_base(r) == o or
                converter_base(o) == converter_base(r)]
        hits = [o for o in hits if o not in {p.other for p in pairs.values()}]
        if len(hits) == 1:
            pairs[r] = Pair(r, hits[0], "converter name", _converter_how(r, hits[0]))

    rl, ol = left()
    for r in rl:
        kept = (recorded or {}).get(r)
        if kept is not None and kept in ol and _compatible(by_ref[r], by_oth[kept]):
            pairs[r] = Pair(r, kept, "export record", (recorded_how or {}).get(r, ""))

    _bind_by_index(pairs, ref, oth, by_ref, by_oth, notes)

    _bind_unique_shapes(pairs, ref_names, oth_names, by_ref, by_oth)

    too_close = None
    if values is not None and kind == "outputs":
        too_close = close_outputs(pairs, ref_names, oth_names, by_ref, by_oth, values[1])
        if too_close is None:
            _bind_by_values(pairs, ref_names, oth_names, by_ref, by_oth, values, notes)

    rl, ol = left()
    if rl:
        if not any(made_up(n) for n in [*rl, *ol]):
            why = "names differ, and two real names that differ are never paired by shape or values"
        elif too_close is not None:
            a, b, d = too_close
            why = (f"names differ, shapes and dtypes do not tell them apart, and values may not: {other_label} outputs "
                   f"{a!r} and {b!r} are {d:.2g} of scale apart on the batch (under {CLOSE_OUTPUTS:g}), so pairing "
                   "them by values would pass a file that labels them the wrong way round")
        elif kind == "outputs" and values is not None:
            why = "names differ, shapes and dtypes do not tell them apart, and values on the batch do not single " \
                  "out one pairing"
        else:
            why = "names differ, and shapes and dtypes do not tell them apart"
        raise fail("no rule pairs " + ", ".join(map(repr, rl)) + " with " + ", ".join(map(repr, ol)) + f" ({why})")
    return Binding(kind, tuple(pairs[n] for n in ref_names), tuple(notes))


def _converter_how(r: str, o: str) -> str:
    return f"{o!r} is what converters write for {r!r}" if converter_base(o) == r else \
        f"{r!r} and {o!r} name one tensor"


def _bind_by_index(pairs: dict[str, Pair], ref: list[TensorSpec], oth: list[TensorSpec],
                   by_ref: dict[str, TensorSpec], by_oth: dict[str, TensorSpec], notes: list[str]) -> None:
    """Where every tensor of one side is a placeholder with an index (tf2onnx's and TFLite's
    ``StatefulPartitionedCall:k``, a frozen graph's ``Identity_k``), index k is the k-th tensor of
    the other side in sorted-name order (a signature's dict flattens that way)."""
    for placeholders, named, flip in ((oth, ref, False), (ref, oth, True)):
        found = {s.name: placeholder_index(s.name) for s in placeholders}
        idx = {n: k for n, k in found.items() if k is not None}
        if not placeholders or len(idx) != len(found) or sorted(idx.values()) != list(range(len(placeholders))):
            continue
        if any(placeholder_index(s.name) is not None for s in named) or len(named) != len(placeholders):
            continue  # both sides made up: the index says nothing of the other side's order
        order = sorted(s.name for s in named)
        if [s.name for s in named] != order:
            # a list-returning function numbers its outputs in list order, a signature's dict in
            # sorted-name order: only where the two agree (a SavedModel's, sorted here) is k known
            continue
        proposed = {}
        for name, k in idx.items():
            r, o = (name, order[k]) if flip else (order[k], name)
            proposed[r] = o
        if not all(_compatible(by_ref[r], by_oth[o]) for r, o in proposed.items()):
            notes.append("placeholder names' indexes read in sorted-name order give pairs of different shapes: "
                         "not used")
            return
        used = {p.other for p in pairs.values()}
        for r, o in proposed.items():
            if r in pairs:
                if pairs[r].other != o:
                    notes.append(f"{r!r}: the placeholder index says {o!r}, the {pairs[r].basis} said {pairs[r].other!r}")
                continue
            if o in used:
                continue
            k = idx[r] if flip else idx[o]
            pairs[r] = Pair(r, o, "converter name", f"index {k} in sorted-name order")
        return


def _bind_unique_shapes(pairs: dict[str, Pair], ref_names: list[str], oth_names: list[str],
                        by_ref: dict[str, TensorSpec], by_oth: dict[str, TensorSpec]) -> None:
    changed = True
    while changed:
        changed = False
        used = {p.other for p in pairs.values()}
        rl = [n for n in ref_names if n not in pairs]
        ol = [n for n in oth_names if n not in used]
        for r in rl:
            fits = [o for o in ol if _compatible(by_ref[r], by_oth[o]) and (made_up(r) or made_up(o))]
            if len(fits) == 1 and [x for x in rl if _compatible(by_ref[x], by_oth[fits[0]])] == [r]:
                s = by_oth[fits[0]]
                pairs[r] = Pair(r, fits[0], "shape and dtype", f"the only {_shape_text(s)}")
                changed = True
                break


def _shape_text(s: TensorSpec) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in s.shape) + f") {s.dtype.name}"


def _distance(a: Any, e: Any) -> float | None:
    a, e = np.asarray(a), np.asarray(e)
    if a.shape != e.shape or a.dtype.kind not in "fiub" or e.dtype.kind not in "fiub" or not e.size:
        return None
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    if not (np.all(np.isfinite(a64)) and np.all(np.isfinite(e64))):
        return None
    scale = float(np.max(np.abs(e64))) or 1.0
    return float(np.max(np.abs(a64 - e64))) / scale


def close_outputs(pairs: Mapping[str, Pair], ref_names: list[str], oth_names: list[str],
                  by_ref: dict[str, TensorSpec], by_oth: dict[str, TensorSpec],
                  oth_vals: Mapping[str, Any]) -> tuple[str, str, float] | None:
    """The two unpaired outputs of the other form that values would have to tell apart (one
    shape, a reference output both could pair with) and that lie within ``CLOSE_OUTPUTS`` of each
    other on the batch, the closest such two first; None when values can be trusted."""
    used = {p.other for p in pairs.values()}
    rl = [n for n in ref_names if n not in pairs]
    ol = [n for n in oth_names if n not in used and n in oth_vals]
    found = []
    for i, a in enumerate(ol):
        for b in ol[i + 1:]:
            rivals = any(_compatible(by_ref[r], by_oth[a]) and _compatible(by_ref[r], by_oth[b]) for r in rl)
            if not rivals:
                continue
            # max |a - b| over the larger of the two scales: symmetric
            d = [x for x in (_distance(oth_vals[a], oth_vals[b]), _distance(oth_vals[b], oth_vals[a])) if x is not None]
            if d and min(d) < CLOSE_OUTPUTS:
                found.append((a, b, min(d)))
    return min(found, key=lambda t: t[2]) if found else None


def _bind_by_values(pairs: dict[str, Pair], ref_names: list[str], oth_names: list[str],
                    by_ref: dict[str, TensorSpec], by_oth: dict[str, TensorSpec],
                    values: tuple[Mapping[str, Any], Mapping[str, Any]], notes: list[str]) -> None:
    """Greedy: the remaining (reference, other) pair with the smallest distance, taken only when
    it is under CLEAR_MARGIN of every rival distance on its row and its column."""
    ref_vals, oth_vals = values
    while True:
        used = {p.other for p in pairs.values()}
        rl = [n for n in ref_names if n not in pairs and n in ref_vals]
        ol = [n for n in oth_names if n not in used and n in oth_vals]
        dist = {(r, o): d for r in rl for o in ol
                if _compatible(by_ref[r], by_oth[o]) and (made_up(r) or made_up(o))
                and (d := _distance(oth_vals[o], ref_vals[r])) is not None}
        if not dist:
            return
        (r, o), best = min(dist.items(), key=lambda kv: kv[1])
        rivals = [d for (x, y), d in dist.items() if (x == r) != (y == o)]
        if rivals and not best < CLEAR_MARGIN * min(rivals):
            notes.append(f"values do not single out a pairing for {r!r}: closest {o!r} at {best:.3g} of scale, "
                         f"next at {min(rivals):.3g}")
            return
        pairs[r] = Pair(r, o, "values", f"closest on the batch ({best:.2g} of scale"
                        + (f"; next {min(rivals):.2g})" if rivals else ")"))


def _error_text(kind: str, problem: str, ref: list[TensorSpec], oth: list[TensorSpec], pairs: Mapping[str, Pair],
                reference_label: str, other_label: str) -> str:
    found = ", ".join(p.describe() for p in pairs.values()) or "none"
    example = ", ".join(f"{s.name!r}: '<{other_label} name>'" for s in ref if s.name not in pairs)[:200]
    return (f"cannot tell which {kind[:-1]} is which: {problem}.\n"
            f"  {reference_label} {kind}: {describe_specs(ref)}\n"
            f"  {other_label} {kind}: {describe_specs(oth)}\n"
            f"  paired so far: {found}\n"
            f"  fix: name the pairing, {{reference name: other name}}: bind={{'{kind}': {{{example}}}}} on the "
            "assertion, in @pytest.mark.modelparity(bind=...), or from a session-scoped modelparity_bind fixture")



# -- a form seen through its binding ------------------------------------------------------

class BoundModel(LoadedModel):
    """``model`` seen through its binding to a reference: fed by the reference's input names (or
    a list in the reference's input order, or its own names), answering by the reference's output
    names. Everything else (format, hooks, the float sibling, a fixed batch) is the model's own."""

    def __init__(self, model: LoadedModel, inputs: Binding, outputs: Binding) -> None:
        self.inner = model
        self.input_binding, self.output_binding = inputs, outputs
        own_in = {s.name: s for s in model.inputs}
        own_out = {s.name: s for s in model.outputs}
        super().__init__(device=model.device, source=model.source,
                         inputs=[TensorSpec(p.reference, own_in[p.other].shape, own_in[p.other].dtype)
                                 for p in inputs.pairs],
                         outputs=[TensorSpec(p.reference, own_out[p.other].shape, own_out[p.other].dtype)
                                  for p in outputs.pairs])
        self.format = model.format
        self.compute_dtype = model.compute_dtype
        self._to_other = inputs.to_other()
        self._to_reference = outputs.to_reference()

    def __getattr__(self, name: str) -> Any:  # only for what this view does not define
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def prepare_batch(self, batch: Any) -> dict[str, np.ndarray]:
        if isinstance(batch, Mapping) and set(batch) == {s.name for s in self.inner.inputs} \
                and set(batch) != {s.name for s in self.inputs}:
            own_to_ref = {o: r for r, o in self._to_other.items()}
            batch = {own_to_ref[k]: v for k, v in batch.items()}  # fed by its own names
        return super().prepare_batch(batch)

    def _predict(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self.inner._predict({self._to_other[k]: v for k, v in feeds.items()})
        return {self._to_reference[k]: v for k, v in out.items() if k in self._to_reference}

    def describe_binding(self) -> str:
        """The "structures aligned" line: each pair and its basis (empty when all by name)."""
        parts = [b.describe() for b in (self.input_binding, self.output_binding) if not b.trivial]
        return "; ".join(parts)

    def binding_dict(self) -> dict[str, Any]:
        """Every pair (JSON ``meta.binding``) and the other form's file (``model``: the end-of-run
        line that names value pairings says which model it was)."""
        return {"inputs": [p.to_dict() for p in self.input_binding.pairs],
                "outputs": [p.to_dict() for p in self.output_binding.pairs], "model": self.inner.source}

    # the diagnosis hooks and the lifetime are the model's own
    def graph_defs(self) -> list[Any] | None:
        return self.inner.graph_defs()

    def op_types(self) -> list[tuple[str, str]] | None:
        return self.inner.op_types()

    def weights(self) -> dict[str, np.ndarray] | None:
        return self.inner.weights()

    def intermediates(self, batch: Any) -> list[tuple[str, str, np.ndarray]] | None:
        return self.inner.intermediates(self._inner_batch(batch))

    def predict_with_weights(self, batch: Any, values: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        out = self.inner.predict_with_weights(self._inner_batch(batch), values)
        return None if out is None else {self._to_reference[k]: v for k, v in out.items() if k in self._to_reference}

    def _inner_batch(self, batch: Any) -> dict[str, np.ndarray]:
        return {self._to_other[k]: v for k, v in self.prepare_batch(batch).items()}

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"<bound {self.inner!r}>"


def bind_model(model: LoadedModel, reference: LoadedModel, *, explicit: Mapping[str, Mapping[str, str]] | None = None,
               recorded: Mapping[str, Mapping[str, str]] | None = None,
               probe: Any = None) -> LoadedModel:
    """``model`` as a ``BoundModel`` that speaks ``reference``'s names, or ``model`` itself when
    every input and output already has the reference's name and order.

    ``explicit``/``recorded``: ``{"inputs": {ref: other}, "outputs": {ref: other}}``; ``probe``:
    a batch (in the reference's terms) both are run on when only values can pair the outputs.
    The file's own record (``model.export_record``, e.g. what a tfjs export wrote in its
    ``model.json``) wins over ``recorded`` (the cache entry's).
    """
    if isinstance(model, BoundModel):
        model = model.inner
    ref_label, other_label = f"reference ({reference.format})", f"{model.format} form"
    explicit = explicit or {}
    recorded, how = merged_record(model, recorded)
    inputs = bind("inputs", reference.inputs, model.inputs, explicit=explicit.get("inputs"),
                  recorded=recorded.get("inputs"), reference_label=ref_label, other_label=other_label,
                  recorded_how=how.get("inputs"))
    try:
        outputs = bind("outputs", reference.outputs, model.outputs, explicit=explicit.get("outputs"),
                       recorded=recorded.get("outputs"), reference_label=ref_label, other_label=other_label,
                       recorded_how=how.get("outputs"))
    except BindingError:
        if probe is None:
            raise
        batch = probe() if callable(probe) else probe
        ref_values = reference.predict(batch)
        view = BoundModel(model, inputs, Binding("outputs", tuple(Pair(s.name, s.name, "same name")
                                                                    for s in model.outputs)))
        own_values = view.predict(batch)
        outputs = bind("outputs", reference.outputs, model.outputs, explicit=explicit.get("outputs"),
                       recorded=recorded.get("outputs"), values=(ref_values, own_values),
                       reference_label=ref_label, other_label=other_label, recorded_how=how.get("outputs"))
    if inputs.trivial and outputs.trivial and [s.name for s in reference.inputs] == [s.name for s in model.inputs] \
            and [s.name for s in reference.outputs] == [s.name for s in model.outputs]:
        return model
    return BoundModel(model, inputs, outputs)


def merged_record(model: LoadedModel, cached: Mapping[str, Mapping[str, str]] | None
                  ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """The export record of ``model``: what its own file says (``export_record``, written when the
    plugin made it; ``export_record_how`` says where) over what the cache entry kept; and, per
    kind and reference name, where each pair was kept (the pair's ``how``)."""
    own = getattr(model, "export_record", None) or {}
    own_how = str(getattr(model, "export_record_how", "") or "written in the file at export")
    record: dict[str, dict[str, str]] = {}
    how: dict[str, dict[str, str]] = {}
    for kind in ("inputs", "outputs"):
        kept = dict((cached or {}).get(kind) or {})
        where = {r: "kept with the cached export" for r in kept}
        for r, o in (own.get(kind) or {}).items():
            kept[r], where[r] = o, own_how
        record[kind], how[kind] = kept, where
    return record, how
