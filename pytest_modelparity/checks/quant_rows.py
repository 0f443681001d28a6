"""Rows enough for a quantised verdict: how many its budget needs, and where the check gets them.

Why: a decision over rows (top-1 agreement, the share of elements beyond a share of scale)
judged with the binomial margin of a small batch cannot fail. An int8 file agreeing with its
sibling on 31% of rows passed on 2 rows; at the int8 budget 1-2 rows can never fail, and 64
logits allow 6 values beyond (9.4% against "2%"). So before judging, the check counts what the
budget needs (``quantized.trials_needed``: a file at half the agreement, or twice the share
beyond, fails with probability ``POWER``), and when the given rows fall short it runs the
quantised file, its float32 sibling and the reference on more rows from the candidate's
``judging_rows`` (``JudgingRows``, attached by the plugin's ``parity_candidate``): the rows of
``modelparity_dataset`` after its calibration rows, then seeded rows in the session's input
range (``modelparity_elements``; without a dataset, the dtype's default range parity_batch
draws from too). Rows equal to a given row are dropped (a row counted twice is not twice the evidence).
Where no more rows can be had (the reference is arrays, no row source), the decision that did
not fail is inconclusive and says why (``quantized.settle``). Nothing here imports TensorFlow.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from typing import Any, Callable

import numpy as np

from . import quantized
from .batches import batch_length, concat, leaves
from ..errors import InconclusiveVerdict
from ..verdict import tree

# Rows judged at most, and the most bytes of extra input rows drawn (beyond either the decision
# stays inconclusive, and says so): a 4-value regression head on 224 px images would want 700.
MAX_ROWS = 2048
MAX_INPUT_BYTES = 256 << 20
# Extra rows run through the models this many at a time.
CHUNK_ROWS = 256
# Outputs on drawn rows kept per row source (candidate and reference of the latest draws).
MEMO_ENTRIES = 8
# Draws at most (near-ties among drawn rows can leave fewer judged rows than estimated).
ROUNDS = 3
# The seed of the seeded rows drawn for a verdict (parity_batch is 0, int8 calibration 1).
JUDGING_SEED = 2


def rows_wanted(expected: Any, variant: str) -> int:
    """The rows the ``variant``'s budget needs to decide every output of ``expected`` (the
    float outputs on the given rows): judged rows for class scores (near-ties, at their share
    on the given rows, taken as at least a quarter, are left out), elements for regression."""
    budget, _ = quantized.current_budget(variant)
    wanted = 0
    for path, arr in leaves(expected):
        arr = np.asarray(arr)
        if arr.dtype.kind != "f" or arr.ndim == 0 or not arr.size or not arr.shape[0]:
            continue
        rows = int(arr.shape[0])
        kind, _, k = quantized.output_kind(path, arr)
        if kind == quantized.CLASS_SCORES:
            need = quantized.trials_needed(1.0 - budget.top1, quantized.outside_top1(budget.top1))
            share = max(quantized.judged_share(arr, k, budget.scale), 0.25)
            wanted = max(wanted, math.ceil(need / share))
        else:
            need = quantized.trials_needed(budget.beyond, quantized.clearly_outside(budget.beyond))
            wanted = max(wanted, math.ceil(need / max(1, arr.size // rows)))
    return wanted


def widen(cand: Any, ref_model: Any, inputs: Any, act: Any, exp: Any,
          run: Callable[[Any, Any], Any]) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``(inputs, act, exp, note)`` with rows added until the budget can decide (``rows_wanted``),
    ``act``/``exp`` the raw outputs of the candidate and the reference on them (``run(model,
    batch)``); ``note``: ``{"given", "drawn", "wanted", "source"}`` and, where rows fell short,
    ``"missing"``: why, and what to pass instead."""
    variant = quantized.variant_of(cand)
    given = batch_length(inputs)
    wanted = rows_wanted(exp, variant) if variant else 0
    note: dict[str, Any] = {"given": given, "drawn": 0, "wanted": wanted}
    if given >= wanted:
        return inputs, act, exp, note
    fix = f"pass inputs= with at least {wanted} rows"
    source = getattr(cand, "judging_rows", None)
    if ref_model is None:
        note["missing"] = (f"the reference is arrays, so it cannot be run on more rows: {fix} (and the reference's "
                           "outputs on them), or pass the reference model")
        return inputs, act, exp, note
    if source is None:
        note["missing"] = (f"{fix}, or test through parity_candidate, which draws them from modelparity_dataset "
                           "(--modelparity-data) and the input range")
        return inputs, act, exp, note
    said = ""
    for _ in range(ROUNDS):  # near-ties among the drawn rows may leave fewer judged: draw again
        have = batch_length(inputs)
        limit = min(wanted, MAX_ROWS) - have
        block, said = source(min(wanted, MAX_ROWS) + given + note["drawn"]) if limit > 0 else (None, said)
        keep = _kept(block, inputs, limit)
        if block is None or keep is None:
            break
        block = {k: np.asarray(v)[:keep[-1] + 1] for k, v in block.items()}
        extra = {k: v[keep] for k, v in block.items()}
        joined = _join(inputs, extra)
        if joined is None:
            break
        drawn = len(keep)
        pick = lambda path, arr: np.asarray(arr)[keep]  # noqa: E731
        act = concat([act, tree.map_paths(pick, _outputs(source, cand, block, run))], where="quantised outputs")
        exp = concat([exp, tree.map_paths(pick, _outputs(source, ref_model, block, run))], where="reference outputs")
        inputs = joined
        note.update(drawn=note["drawn"] + drawn, source=said)
        wanted = max(wanted, rows_wanted(exp, variant) if variant else 0)
        note["wanted"] = wanted
        if batch_length(inputs) >= wanted:
            return inputs, act, exp, note
    if not note["drawn"]:
        note["missing"] = f"no rows could be drawn to add to the given ones ({said or 'no rows'}): {fix}"
    else:
        note["missing"] = (f"{batch_length(inputs)} rows were all that could be had (at most {MAX_ROWS} rows, "
                           f"{MAX_INPUT_BYTES >> 20} MB of inputs, from {said}): {fix}")
    return inputs, act, exp, note


def warn_inconclusive(report: Any) -> None:
    """An ``InconclusiveVerdict`` warning per inconclusive output (pytest lists them), so a
    decision made on too few rows is heard of outside the plugin's summary too."""
    for o in getattr(report, "inconclusive", []):
        if o.passed:
            warnings.warn(InconclusiveVerdict(f"{report.title} {o.path}: {o.inconclusive}"), stacklevel=4)


def _chunk(batch: dict[str, np.ndarray], start: int) -> dict[str, np.ndarray]:
    return {k: v[start:start + CHUNK_ROWS] for k, v in batch.items()}


def _row_keys(batch: Any) -> list[bytes]:
    """One key per row over every input (equal rows, equal keys)."""
    arrays = [np.ascontiguousarray(np.asarray(v)) for _, v in _inputs_in_order(batch)]
    n = len(arrays[0]) if arrays else 0
    return [b"".join(a[i].tobytes() for a in arrays) for i in range(n)]


def _inputs_in_order(batch: Any) -> list[tuple[str, Any]]:
    if isinstance(batch, dict):
        return list(batch.items())
    if isinstance(batch, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(batch)]
    return [("", batch)]


def _kept(block: dict[str, np.ndarray] | None, given: Any, limit: int) -> list[int] | None:
    """Indices of ``block``'s rows that are not among ``given``'s, at most ``limit`` and
    ``MAX_INPUT_BYTES``; None when none is left."""
    if not block or limit <= 0:
        return None
    seen = set(_row_keys(given)) if len(_inputs_in_order(given)) == len(block) else set()
    per_row = sum(np.asarray(v)[:1].nbytes for v in block.values()) or 1
    keep = [i for i, key in enumerate(_row_keys(block)) if key not in seen][:min(limit, MAX_INPUT_BYTES // per_row)]
    return keep or None


def _outputs(source: Any, model: Any, block: dict[str, np.ndarray], run: Callable[[Any, Any], Any]) -> Any:
    """``model``'s outputs on ``block`` (run ``CHUNK_ROWS`` at a time), kept on the row source
    for the next call: every example of a Hypothesis test draws the same block."""
    memo = getattr(source, "memo", None)
    key = None
    if isinstance(memo, dict):
        h = hashlib.blake2b(digest_size=16)
        for name in sorted(block):
            h.update(f"{name}{block[name].shape}{block[name].dtype}".encode())
            h.update(np.ascontiguousarray(block[name]).tobytes())
        key = (id(model), h.hexdigest())
        hit = memo.get(key)
        if hit is not None and hit[0] is model:
            return hit[1]
    rows = batch_length(block)
    out = concat([run(model, _chunk(block, i)) for i in range(0, rows, CHUNK_ROWS)], where="outputs on drawn rows")
    if key is not None and isinstance(memo, dict):
        while len(memo) >= MEMO_ENTRIES:
            memo.pop(next(iter(memo)))
        memo[key] = (model, out)  # the model is held, so its id is not reused while the entry lives
    return out


def _join(given: Any, extra: dict[str, np.ndarray]) -> Any:
    """The given batch with ``extra``'s rows after its own, in the given batch's form (a dict by
    input name, a list in input order, one array); None where the two do not line up."""
    try:
        if isinstance(given, dict):
            if set(map(str, given)) != set(extra):
                return None
            return {k: np.concatenate([np.asarray(v), extra[str(k)].astype(np.asarray(v).dtype, copy=False)])
                    for k, v in given.items()}
        values = list(extra.values())
        if isinstance(given, (list, tuple)):
            if len(given) != len(values):
                return None
            return [np.concatenate([np.asarray(g), e.astype(np.asarray(g).dtype, copy=False)])
                    for g, e in zip(given, values)]
        if len(values) != 1:
            return None
        g = np.asarray(given)
        return np.concatenate([g, values[0].astype(g.dtype, copy=False)])
    except ValueError:  # shapes that do not line up (another row shape)
        return None


class JudgingRows:
    """The rows a quantised verdict may add (``candidate.judging_rows``): the rows of
    ``dataset`` after its calibration rows, then rows seeded with ``JUDGING_SEED`` in
    ``elements``, the session's input range; without a dataset, in each dtype's default range
    (where ``parity_batch`` draws too); a dataset with no declared range adds real rows only.
    ``reference``: a callable giving the model whose inputs the rows fit."""

    def __init__(self, reference: Callable[[], Any], dataset: Any = None, elements: Any = None) -> None:
        self._reference = reference
        self._dataset = dataset
        self._elements = elements
        self.memo: dict[tuple, tuple[Any, Any]] = {}  # outputs on drawn rows (_outputs)

    def __call__(self, n: int) -> tuple[dict[str, np.ndarray] | None, str]:
        from .dataset import CALIBRATION_ROWS, as_dataset
        from .strategies import fixed_batch, seeded_batch, specs_of

        specs = specs_of(self._reference())
        if fixed_batch(specs):
            return None, f"the model is built for a fixed batch of {fixed_batch(specs)}"
        data = as_dataset(self._dataset)
        parts: list[dict[str, np.ndarray]] = []
        said = []
        elements = self._elements
        if data is not None:
            arrays = data.arrays(specs)
            total = data.rows(specs)
            start = max(1, min(CALIBRATION_ROWS, total // 2)) if total > 1 else 0
            real = {k: v[start:start + n] for k, v in arrays.items()}
            got = len(next(iter(real.values())))
            if got:
                parts.append(real)
                said.append(f"{got} row(s) of modelparity_dataset {data.label} after its calibration rows")
        rest = n - sum(len(next(iter(p.values()))) for p in parts)
        if rest > 0 and data is not None and elements is None:
            # Real rows only: uniform rows in the data's span are not the data (on the digits
            # two-head CNN they failed its good int8 file's box head), and no range was declared.
            said.append(f"no more: modelparity_dataset has no further rows and no modelparity_elements "
                        f"(--modelparity-input-range) says where to draw {rest} more")
        elif rest > 0:
            parts.append(dict(seeded_batch(specs, batch_size=rest, seed=JUDGING_SEED, elements=elements)))
            where = "modelparity_elements" if elements is not None else "each input dtype's default range"
            said.append(f"{rest} seeded row(s) drawn from {where}")
        joined = {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in parts[0]} if parts else None
        return joined, " and ".join(said) or "no rows"
