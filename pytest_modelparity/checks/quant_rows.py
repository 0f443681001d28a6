"""Rows enough for a quantised decision: drawn until the acceptance test decides, up to a cap.

Why: a quantised decision over rows (top-1 agreement, the share of elements beyond a share of
scale) is an acceptance test (``checks/acceptance.py``): it PASSES only when the rows prove the
miss rate within the budget and FAILS only when they prove it beyond. Two rows prove neither.
So the check looks at the given rows, and while some output is undecided (and none failed) it
runs the quantised file, its float32 sibling and the reference on more rows from the
candidate's ``judging_rows`` (``JudgingRows``, attached by the plugin's ``parity_candidate``)
and looks again (the rows at least double each time, at most ``acceptance.MAX_LOOKS`` looks),
up to ``max_rows()`` rows in all (``--modelparity-quant-max-rows``, default ``DEFAULT_MAX_ROWS``).

Where the rows come from: the rows of ``modelparity_dataset`` after its calibration rows, then
the dataset's rows perturbed by ``PERTURB`` of each float input's span (never uniform rows
when a dataset exists: on a detector whose 200-row dataset ran short, uniform [-1, 1] rows
from ``modelparity_elements`` failed a correct int8 file); without a dataset, seeded rows in the
session's input range (``modelparity_elements``, else the dtype's default range parity_batch
draws from too). Rows equal to a row already judged are dropped (a row counted twice is not
twice the evidence). Undecided at the cap, or where no more rows can be had (the reference is
arrays, no row source), the decision is inconclusive and says why (``quantized.settle``).
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import hashlib
import warnings
from contextvars import ContextVar
from typing import Any, Callable, Iterator

import numpy as np

from . import acceptance, quantized
from .alignment import align_structures
from .batches import batch_length, concat
from ..errors import InconclusiveVerdict
from ..verdict import tree

# Rows judged at most by default (given and drawn together): at a 95% budget a file at 99%
# agreement passes within it nearly always, one at 85% fails within 64 (tests/test_quant_acceptance.py,
# bench/quantized.py --decisions); a file close to its budget stays inconclusive.
DEFAULT_MAX_ROWS = 1024
# The most bytes of extra input rows drawn (beyond it the decision stays inconclusive, and says so).
MAX_INPUT_BYTES = 256 << 20
# Extra rows run through the models this many at a time.
CHUNK_ROWS = 256
# Outputs on drawn rows kept per row source (candidate, sibling and reference of the latest draws).
MEMO_ENTRIES = 12
# The seed of the seeded rows drawn for a verdict (parity_batch is 0, int8 calibration 1).
JUDGING_SEED = 2
# Dataset rows, once used, are drawn again with uniform noise of up to this share of each float
# input's span (clipped to it), as strategies.dataset_batches(perturb=) does.
PERTURB = 0.02

_MAX_ROWS: ContextVar[int] = ContextVar("modelparity_quant_max_rows", default=DEFAULT_MAX_ROWS)


@contextlib.contextmanager
def max_rows_of(rows: int | None) -> Iterator[None]:
    """Within the block a quantised decision draws up to ``rows`` rows (None: the default);
    the plugin wraps each test in it (``--modelparity-quant-max-rows``)."""
    token = _MAX_ROWS.set(int(rows) if rows else DEFAULT_MAX_ROWS)
    try:
        yield
    finally:
        _MAX_ROWS.reset(token)


def max_rows() -> int:
    """The cap of rows a quantised decision may judge, in force now."""
    return _MAX_ROWS.get()


def _undecided(cand: Any, ref_model: Any, act: Any, exp: Any, sib: Any, bind: Any) -> bool:
    """Whether the rows so far leave some output undecided and none failed (one look)."""
    variant = quantized.variant_of(cand)
    if variant is None:
        return False
    budget, _ = quantized.current_budget(variant)
    q, e, _, _ = align_structures(act, exp, from_models=True, models=(cand, ref_model), bind=bind)
    f = e if sib is None else align_structures(sib, exp, from_models=True, models=(quantized.sibling_of(cand),
                                                                                   ref_model))[0]
    verdicts = quantized.decide_outputs(tree.flatten(q), tree.flatten(f), budget).values()
    return acceptance.FAIL not in verdicts and acceptance.UNDECIDED in verdicts


def widen(cand: Any, ref_model: Any, inputs: Any, act: Any, exp: Any,
          run: Callable[[Any, Any], Any], bind: Any = None) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``(inputs, act, exp, note)`` with rows added until every output's acceptance test decides
    (or one fails), ``act``/``exp`` the raw outputs of the candidate and the reference on them
    (``run(model, batch)``); ``note``: ``{"given", "drawn", "max_rows", "source"}`` and, where the
    rows did not settle it, ``"missing"``: why, and what to pass instead."""
    given = batch_length(inputs)
    cap = max_rows()
    note: dict[str, Any] = {"given": given, "drawn": 0, "max_rows": cap}
    sibling = quantized.sibling_of(cand)
    sib = run(sibling, inputs) if sibling is not None else None
    source = getattr(cand, "judging_rows", None)
    fix = f"pass inputs= with more rows, or raise --modelparity-quant-max-rows (now {cap})"
    said, looks = "", 1
    while _undecided(cand, ref_model, act, exp, sib, bind):
        have = batch_length(inputs)
        if have >= cap:
            note["missing"] = (f"undecided at the cap of {cap} rows"
                               + (f" ({note['drawn']} drawn from {said})" if note["drawn"] else "")
                               + ": the file is close to its budget; raise --modelparity-quant-max-rows "
                                 "(ini modelparity_quant_max_rows) to decide it")
            break
        if ref_model is None:
            note["missing"] = ("the reference is arrays, so it cannot be run on more rows: pass inputs= with more "
                               "rows (and the reference's outputs on them), or pass the reference model")
            break
        if source is None:
            note["missing"] = ("no rows to draw: pass inputs= with more rows, or test through parity_candidate, which "
                               "draws them from modelparity_dataset (--modelparity-data) and the input range")
            break
        target = acceptance.next_rows(have, cap, looks)
        block, said = source(note["drawn"] + (target - have) + given)
        keep = _kept(block, inputs, target - have)
        if block is None or keep is None:
            note["missing"] = f"no more rows could be drawn ({said or 'no rows'}): {fix}"
            break
        # the models run on the new rows' span only (rows before it were judged at an earlier look)
        first = keep[0]
        block = {k: np.asarray(v)[first:keep[-1] + 1] for k, v in block.items()}
        keep = [i - first for i in keep]
        joined = _join(inputs, {k: v[keep] for k, v in block.items()})
        if joined is None:
            note["missing"] = f"the drawn rows do not line up with the given batch: {fix}"
            break
        pick = lambda path, arr: np.asarray(arr)[keep]  # noqa: E731
        act = concat([act, tree.map_paths(pick, _outputs(source, cand, block, run))], where="quantised outputs")
        exp = concat([exp, tree.map_paths(pick, _outputs(source, ref_model, block, run))], where="reference outputs")
        if sibling is not None:
            sib = concat([sib, tree.map_paths(pick, _outputs(source, sibling, block, run))], where="sibling outputs")
        inputs = joined
        note.update(drawn=note["drawn"] + len(keep), source=said)
        looks += 1
    return inputs, act, exp, note


def warn_inconclusive(report: Any) -> None:
    """An ``InconclusiveVerdict`` warning per inconclusive output (pytest lists them), so a
    decision the rows did not settle is heard of outside the plugin's summary too."""
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
    ``dataset`` after its calibration rows, then the dataset's rows perturbed by ``PERTURB`` of
    each float input's span (a new noise draw on each pass over them); without a dataset, rows
    seeded with ``JUDGING_SEED`` in ``elements`` (the session's input range), else in each
    dtype's default range (where ``parity_batch`` draws too). ``reference``: a callable giving
    the model whose inputs the rows fit. ``rows(n)`` gives the same first rows for every n."""

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
        if data is None:
            where = "modelparity_elements" if self._elements is not None else "each input dtype's default range"
            return (dict(seeded_batch(specs, batch_size=n, seed=JUDGING_SEED, elements=self._elements)),
                    f"{n} seeded row(s) drawn from {where}")
        arrays = data.arrays(specs)
        total = data.rows(specs)
        start = max(1, min(CALIBRATION_ROWS, total // 2)) if total > 1 else 0
        real = {k: v[start:start + n] for k, v in arrays.items()}
        got = len(next(iter(real.values())))
        parts = [real] if got else []
        said = [f"{got} row(s) of modelparity_dataset {data.label} after its calibration rows"] if got else []
        perturbed = perturbed_rows(arrays, n - got, start)
        if perturbed is not None:
            parts.append(perturbed)
            said.append(f"{n - got} of its rows perturbed by {PERTURB:.0%} of each float input's span")
        elif n > got:
            said.append("no more: its inputs are not floats, so its rows cannot be perturbed into new ones")
        joined = {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in parts[0]} if parts else None
        return joined, " and ".join(said) or "no rows"


def perturbed_rows(arrays: dict[str, np.ndarray], n: int, start: int = 0) -> dict[str, np.ndarray] | None:
    """``n`` rows of ``arrays`` (the dataset's rows after ``start`` first, then the rest, over
    and over) with uniform noise of up to ``PERTURB`` x each float input's span, clipped to the
    span; row ``i``'s noise is seeded ``(JUDGING_SEED, i)``, so the first rows are the same for
    any ``n``. None when ``n`` <= 0 or no input is a float (a token id nudged is another token:
    no new rows)."""
    total = len(next(iter(arrays.values()))) if arrays else 0
    spans = {k: (float(np.min(v)), float(np.max(v))) for k, v in arrays.items() if v.dtype.kind == "f" and v.size}
    if n <= 0 or not total or not spans or all(hi <= lo for lo, hi in spans.values()):
        return None
    order = np.concatenate([np.arange(start, total), np.arange(0, start)]).astype(np.intp)
    picked = order[np.arange(n) % total]
    out = {k: np.asarray(v)[picked] for k, v in arrays.items()}
    for i in range(n):
        rng = np.random.default_rng((JUDGING_SEED, i))
        for k, (lo, hi) in spans.items():
            row = out[k][i].astype(np.float64) + rng.uniform(-1.0, 1.0, out[k][i].shape) * PERTURB * (hi - lo)
            out[k][i] = np.clip(row, lo, hi)
    return out
