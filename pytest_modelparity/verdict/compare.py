"""The comparison engine: are two model results the same, and if not, by how much and where.

numpy only (never TensorFlow). ``compare(actual, expected)`` walks nested dicts/lists/tuples
of arrays in parallel and checks, in this order, structure, shape, dtype and values, giving
one ``OutputComparison`` per output inside a ``ComparisonReport``.

Value rule (``tolerances.Tolerance``): an element passes when
``|a - e| <= atol + rtol * |e| + scale * max|e over that output|``; NaN equals NaN only with
``equal_nan``; an infinity equals only the same infinity; integers and bools compare exactly
whatever the tolerance (in exact integer arithmetic), and so do strings, objects, dates and
durations (NaT like NaN); a record dtype is compared field by field, each field an output;
shapes must match (no broadcasting). This is ``numpy.isclose`` (same formula, same NaN/inf
rules) plus the ``scale`` term, with these deliberate differences: float16/bfloat16 are
judged in float32 arithmetic (numpy.isclose computes in float16, where ``a - e`` can
overflow), a float32 output compared against float64 values is judged in float64 with the
float32 tolerance, and so is any output under an rtol too large for float32 (inf x 0 would
be NaN there). A rule whose bound reaches an output's own magnitude is a failure
("vacuous") unless allowed. README, "How this compares with numpy and torch.testing".

Why blockwise: model outputs can be tens of millions of elements. The engine streams both
arrays in cache-sized chunks through preallocated buffers. A first pass decides the verdict
with the cheapest test that can prove "all close" (the greatest difference of a chunk
against the smallest bound any element of it can have); only chunks that fail that test are
checked element by element. The full statistics (relative error, ULPs, the smallest passing
tolerance, worst elements) cost a second pass, taken only on failure or when
``full_stats=True``; the error histogram (for summaries and the HTML report) only with
``full_stats=True``, since counting bins costs more than all the other statistics together.
On a failing output that second pass is short: apart from the sum and maximum of |a - e|,
every statistic is a maximum (or a top 5) that only a few elements can still reach once
the first chunk has set a level, so each chunk costs one candidate mask and the exact
arithmetic runs on the candidates only, in batches (``_StatsAcc``; tests check it against
the full computation, ties included).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from . import tree
from .arrays import as_numpy
from .formatting import json_number, json_value
from .tolerances import Tolerance, default_tolerance
from .validators import check_tolerance_value

__all__ = ["compare", "elementwise_close", "passing_bound", "Blocking", "ComparisonReport",
           "OutputComparison", "ToleranceSpec"]

ToleranceSpec = Union[Tolerance, Callable[[np.dtype, str], Tolerance], None]

CHUNK = 1 << 16          # elements per block: 256 KiB of float32, fits L2 with its buffers
WORST_COUNT = 5          # worst elements kept per failing output
_EXPONENT_BITS: dict[int, tuple[np.signedinteger[Any], int]] = {       # work itemsize -> (mask of the exponent bits, unused)
    4: (np.int32(0x7F800000), 23),
    8: (np.int64(0x7FF0000000000000), 52),
}
_FEW_SHARE = 16          # verdict: judge only the elements above atol when at most 1/16
_ABOVE_MASK = 1.0 + 2.0 ** -16   # the slope-free mask is below c_low (1+u)**3: this is above
_MARGIN = 2.0 ** -20     # relative slack of the candidate mask, far above rounding (2**-24)
# an rtol this large is inf in float32, and inf x 0 is NaN, a bound nothing is compared
# against: such a rule is judged in float64, where rtol x 0 stays 0
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_ULP_FORMATS = {         # dtype name -> (explicit mantissa bits, min normal exponent)
    "float16": (10, -14),
    "bfloat16": (7, -126),
    "float32": (23, -126),
    "float64": (52, -1022),
}




@dataclass(frozen=True)
class Blocking:
    """How the engine streams arrays. Verdicts and statistics never depend on it: the tests
    shrink it so tiny arrays cross every chunk boundary and every path of the short
    statistics pass, and switch that pass off to check it against the full one."""

    chunk: int = CHUNK             # elements per block
    short_stats: bool = True       # failing outputs: statistics over candidate elements only
    subset_max_share: int = 8      # a chunk with more than 1/8 candidates is computed in full
    cheap_max_share: int = 32      # the slope-free mask is dropped once it picks more than 1/32
    subset_batch: int = 1 << 15    # candidates gathered before their statistics are computed


@dataclass(frozen=True)
class _Settings:
    """What every output of one ``compare`` call is judged with."""

    tol: ToleranceSpec
    equal_nan: bool
    full_stats: bool
    blocking: Blocking


# --------------------------------------------------------------------------- results


@dataclass
class OutputComparison:
    """The verdict and statistics for one output (one leaf of the structure)."""

    path: str
    passed: bool
    actual_shape: tuple | None = None
    expected_shape: tuple | None = None
    actual_dtype: str | None = None
    expected_dtype: str | None = None
    problem: str | None = None
    notes: list[str] = field(default_factory=list)
    tolerance: Tolerance | None = None
    size: int = 0
    mismatched: int = 0
    max_abs: float | None = None
    max_abs_index: tuple | None = None
    max_rel: float | None = None
    max_rel_index: tuple | None = None
    max_abs_allowed: float | None = None   # the bound at max_abs_index (beside it in the text)
    max_rel_allowed: float | None = None   # the bound at max_rel_index, as a relative value
    mean_abs: float | None = None
    max_ulp: float | None = None
    min_atol: float | None = None
    min_rtol: float | None = None
    scale: float | None = None
    worst: list[tuple[tuple, float, float]] = field(default_factory=list)
    top1_agreement: float | None = None
    top1_rows: int | None = None           # rows judged for top-1 (the reference's argmax is clear)
    top1_near_ties: int = 0                # rows left out: reference top-1 margin within the bound
    vacuous: bool = False                  # the bound reached the output's own magnitude
    error_histogram: tuple[list[int], list[float]] | None = None

    @property
    def mismatched_fraction(self) -> float:
        return self.mismatched / self.size if self.size else 0.0

    def to_dict(self) -> dict:
        """JSON-serialisable form; non-finite floats become the strings "inf"/"-inf"/"nan"."""
        tol = self.tolerance
        return {
            "path": self.path,
            "passed": self.passed,
            "actual_shape": _listify(self.actual_shape),
            "expected_shape": _listify(self.expected_shape),
            "actual_dtype": self.actual_dtype,
            "expected_dtype": self.expected_dtype,
            "problem": self.problem,
            "notes": list(self.notes),
            "tolerance": None if tol is None else {
                "rule": tol.rule, "rtol": json_number(tol.rtol), "atol": json_number(tol.atol),
                "scale": json_number(tol.scale), "min_top1": json_number(tol.min_top1),
                "max_mismatch_fraction": json_number(tol.max_mismatch_fraction),
                "source": tol.source, "text": tol.describe(), "floor_note": tol.floor_note,
            },
            "size": self.size,
            "mismatched": self.mismatched,
            "mismatched_fraction": self.mismatched_fraction,
            "max_abs": json_number(self.max_abs), "max_abs_index": _listify(self.max_abs_index),
            "max_rel": json_number(self.max_rel), "max_rel_index": _listify(self.max_rel_index),
            "max_abs_allowed": json_number(self.max_abs_allowed),
            "max_rel_allowed": json_number(self.max_rel_allowed),
            "mean_abs": json_number(self.mean_abs),
            "max_ulp": json_number(self.max_ulp),
            "min_atol": json_number(self.min_atol),
            "min_rtol": json_number(self.min_rtol),
            "scale": json_number(self.scale),
            "worst": [{"index": list(i), "actual": json_number(a), "expected": json_number(e)}
                      for i, a, e in self.worst],
            "top1_agreement": json_number(self.top1_agreement),
            "top1_rows": self.top1_rows,
            "top1_near_ties": self.top1_near_ties,
            "vacuous": self.vacuous,
            "error_histogram": None if self.error_histogram is None else {
                "counts": list(self.error_histogram[0]),
                "log10_edges": [json_number(x) for x in self.error_histogram[1]],
            },
        }


@dataclass
class ComparisonReport:
    """All outputs of one comparison; ``str()`` is the failure text (report.format_report)."""

    outputs: list[OutputComparison]
    title: str = "outputs"
    hints: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def failed(self) -> list[OutputComparison]:
        return [o for o in self.outputs if not o.passed]

    def to_dict(self) -> dict:
        return {
            "title": self.title,
            "passed": self.passed,
            "outputs": [o.to_dict() for o in self.outputs],
            "hints": [_hint_dict(h) for h in self.hints],
            "meta": json_value(self.meta),
        }

    def __str__(self) -> str:
        from .failure_text import format_report

        return format_report(self)


def _listify(t: tuple | None) -> list | None:
    return None if t is None else [int(v) for v in t]


def _hint_dict(h: Any) -> dict:
    keys = ("cause", "message", "evidence")
    return {k: str(getattr(h, k)) for k in keys if hasattr(h, k)} or {"message": str(h)}


# --------------------------------------------------------------------------- structure


def compare(actual: Any, expected: Any, *, tolerance: ToleranceSpec = None,
            equal_nan: bool = False, full_stats: bool = False,
            blocking: Blocking = Blocking()) -> ComparisonReport:
    """Compare ``actual`` with ``expected`` (arrays, scalars, or nested dicts/lists/tuples).

    ``tolerance``: one ``Tolerance`` for every output, or a callable
    ``(dtype, path) -> Tolerance`` (``dtype`` is the dtype the output is judged in: the less
    precise of the two when both are floating), or None for ``default_tolerance(dtype)``.
    ``full_stats``: compute every statistic for passing outputs too (summaries, HTML).
    ``blocking``: how arrays are streamed (results never depend on it; tests vary it).
    """
    if tolerance is not None and not isinstance(tolerance, Tolerance) and not callable(tolerance):
        raise TypeError(
            f"tolerance must be a Tolerance, a callable (dtype, path) -> Tolerance, or None; "
            f"got {type(tolerance).__name__}. Build one with "
            f"pytest_modelparity.Tolerance(rtol=..., atol=...).")
    outputs: list[OutputComparison] = []
    _walk(actual, expected, "", outputs, _Settings(tolerance, equal_nan, full_stats, blocking))
    return ComparisonReport(outputs)


def _kind_name(x: Any) -> str:
    if isinstance(x, Mapping):
        return f"a mapping with keys {sorted(map(str, x.keys()))}"
    if isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of length {len(x)}"
    if isinstance(x, np.ndarray):
        return f"an array of shape {x.shape}"
    return f"a {type(x).__name__}"


def _walk(a: Any, e: Any, path: str, out: list, how: _Settings) -> None:
    if not (tree.is_branch(a) or tree.is_branch(e)):
        if _is_record(a) and _is_record(e):
            _walk_records(np.asarray(a), np.asarray(e), path, out, how)
        else:
            out.append(_compare_leaf(a, e, path, how))
    elif isinstance(a, Mapping) and isinstance(e, Mapping):
        _walk_mappings(a, e, path, out, how)
    elif isinstance(a, (list, tuple)) and isinstance(e, (list, tuple)):
        _walk_sequences(a, e, path, out, how)
    else:
        out.append(_structure_problem(
            path, f"structure differs: actual is {_kind_name(a)}, expected is {_kind_name(e)}"))


def _is_record(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.void)) and x.dtype.names is not None


def _walk_records(a: np.ndarray, e: np.ndarray, path: str, out: list, how: _Settings) -> None:
    """Structured (record) arrays: each field is an output of its own (``"['x']"``), judged
    by its own dtype's rule, as if the record were a mapping of arrays."""
    names = a.dtype.names or ()
    if a.shape != e.shape or names != e.dtype.names:
        out.append(_compare_leaf(a, e, path, how))
        return
    _walk_mappings({k: a[k] for k in names}, {k: e[k] for k in names}, path, out, how)


def _walk_mappings(a: Mapping, e: Mapping, path: str, out: list, how: _Settings) -> None:
    for key in e:
        sub = tree.child_path(path, key)
        if key in a:
            _walk(a[key], e[key], sub, out, how)
        else:
            out.append(_structure_problem(
                sub, f"missing output: expected has key {key!r}, actual does not "
                     f"(actual keys: {sorted(map(str, a.keys()))})", e=e[key]))
    for key in a:
        if key not in e:
            out.append(_structure_problem(
                tree.child_path(path, key), f"unexpected output: actual has key {key!r}, "
                f"expected does not (expected keys: {sorted(map(str, e.keys()))})", a=a[key]))


def _walk_sequences(a: Any, e: Any, path: str, out: list, how: _Settings) -> None:
    for i in range(min(len(a), len(e))):
        _walk(a[i], e[i], tree.child_path(path, i), out, how)
    for i in range(len(e), len(a)):
        out.append(_structure_problem(
            tree.child_path(path, i), f"unexpected output: actual has {len(a)} outputs, "
                                      f"expected {len(e)}", a=a[i]))
    for i in range(len(a), len(e)):
        out.append(_structure_problem(
            tree.child_path(path, i), f"missing output: actual has {len(a)} outputs, "
                                      f"expected {len(e)}", e=e[i]))


def _structure_problem(path: str, problem: str, a: Any = None, e: Any = None) -> OutputComparison:
    oc = OutputComparison(path=path, passed=False, problem=problem)
    for side, value in (("actual", a), ("expected", e)):
        if value is not None and not tree.is_branch(value):
            arr = np.asarray(as_numpy(value))
            setattr(oc, f"{side}_shape", tuple(arr.shape))
            setattr(oc, f"{side}_dtype", str(arr.dtype))
    return oc


# --------------------------------------------------------------------------- one output


def _float_format(dt: np.dtype) -> tuple[int, int] | None:
    """(mantissa bits, min exponent) for floating dtypes we can judge, else None."""
    if dt.kind == "f" or dt.name in _ULP_FORMATS:
        if dt.name in _ULP_FORMATS:
            return _ULP_FORMATS[dt.name]
        info = np.finfo(dt)                  # longdouble and friends
        return int(info.nmant), int(info.minexp)
    return None


def _is_python_scalar(x: Any) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, np.generic)


def _as_array(x: Any, other: Any) -> np.ndarray:
    """numpy array of ``x``; a plain Python scalar takes the other side's dtype if it fits."""
    if _is_python_scalar(x):
        odt = getattr(other, "dtype", None)
        if odt is not None:
            odt = np.dtype(odt)
            fits = (isinstance(x, bool) and odt.kind == "b") or (
                not isinstance(x, bool) and (odt.kind == "f" or _float_format(odt) is not None
                                             or (isinstance(x, int) and odt.kind in "iu")))
            if fits:
                try:
                    return np.asarray(x, dtype=odt)
                except (OverflowError, ValueError):
                    pass
    return np.asarray(as_numpy(x))


def _resolve(tol: ToleranceSpec, dt: np.dtype, path: str) -> Tolerance:
    if tol is None:
        return default_tolerance(dt)
    result = tol if isinstance(tol, Tolerance) else tol(dt, path)
    if not isinstance(result, Tolerance):
        raise TypeError(f"the tolerance callable returned {type(result).__name__} for output "
                        f"{path or '(array)'!r}; it must return a Tolerance")
    for what in ("rtol", "atol", "scale"):   # an infinite or NaN bound cannot fail
        check_tolerance_value(what, getattr(result, what), f"Tolerance({result.source})")
    return result


def _work_dtype(a: np.ndarray, e: np.ndarray, tol: Tolerance) -> np.dtype:
    """float64 when either side is float64 (or wider), or when a bound is too large for
    float32 (an rtol: inf x 0 = NaN there; an atol: it rounds to inf, and inf - 0 <= inf
    would let an infinity pass); else float32 (float16 and bfloat16 widened)."""
    wide = np.float64 in (a.dtype.type, e.dtype.type) or a.dtype.itemsize > 8 or \
        e.dtype.itemsize > 8 or max(float(tol.rtol), float(tol.atol), float(tol.scale)) >= _FLOAT32_MAX
    return np.dtype(np.float64) if wide else np.dtype(np.float32)


def passing_bound(x: float, work: Any) -> float:
    """The smallest atol/rtol ``x`` measured in ``work`` arithmetic, raised just past that
    arithmetic's rounding (the bound is rounded to ``work`` and summed there), so that
    passing it back makes the comparison pass; 0 when nothing needs to be allowed."""
    if not x > 0:
        return 0.0
    info = np.finfo(work)
    return x * (1.0 + 8.0 * float(info.eps)) + 4.0 * float(info.smallest_subnormal)


def _compare_leaf(a_in: Any, e_in: Any, path: str, how: _Settings) -> OutputComparison:
    # foreign arrays (torch, TensorFlow) first, so a Python scalar meets a numpy dtype
    a_in, e_in = (x if _is_python_scalar(x) else as_numpy(x) for x in (a_in, e_in))
    a = _as_array(a_in, e_in)
    e = _as_array(e_in, a_in if not isinstance(a_in, np.ndarray) else a)
    oc = OutputComparison(path=path, passed=False, actual_shape=tuple(a.shape),
                          expected_shape=tuple(e.shape), actual_dtype=str(a.dtype),
                          expected_dtype=str(e.dtype))
    if a.shape != e.shape:
        oc.problem = f"shape differs: actual {a.shape}, expected {e.shape}"
        return oc
    fa, fe = _float_format(a.dtype), _float_format(e.dtype)
    ka, ke = a.dtype.kind, e.dtype.kind
    oc.size = int(e.size)
    if fa is not None and fe is not None:
        # judge in the less precise float dtype's tolerance, compute in the wider one
        less = a.dtype if fa[0] <= fe[0] else e.dtype
        if a.dtype != e.dtype:
            oc.notes.append(f"{a.dtype} compared against {e.dtype} values "
                            f"(tolerance of {less})")
        oc.tolerance = _resolve(how.tol, less, path)
        _compare_floats(a, e, oc, oc.tolerance, how, _float_format(less))
        return oc
    if ka in "iu" and ke in "iu" or ka == ke == "b":
        if a.dtype != e.dtype:
            oc.notes.append(f"{a.dtype} compared against {e.dtype} values (exactly)")
        oc.tolerance = _exact_for_integers(e.dtype, _resolve(how.tol, e.dtype, path))
        _compare_exact_numbers(a, e, oc, how.full_stats)
        return oc
    if ka == "c" and ke in "cf" or ke == "c" and ka in "cf":
        oc.tolerance = _resolve(how.tol, e.dtype, path)
        _compare_complex(a, e, oc, oc.tolerance, how.equal_nan)
        return oc
    if ka == ke and ka in "USOMmV" and (ka != "V" or a.dtype == e.dtype):
        if a.dtype != e.dtype:
            oc.notes.append(f"{a.dtype} compared against {e.dtype} values (exactly)")
        oc.tolerance = None
        _compare_exact_values(a, e, oc, how.equal_nan)
        return oc
    if a.dtype == e.dtype:
        oc.problem = f"values of dtype {a.dtype} cannot be compared (no rule for this kind)"
    else:
        oc.problem = (f"dtype differs: actual {a.dtype}, expected {e.dtype} "
                      f"(values are not compared across these kinds{_cast_hint(a, e)})")
    return oc


def _cast_hint(a: np.ndarray, e: np.ndarray) -> str:
    if {a.dtype.kind, e.dtype.kind} <= set("iubf") and "f" in (a.dtype.kind, e.dtype.kind):
        floating = a.dtype if a.dtype.kind == "f" else e.dtype
        return (f"; integer outputs compare exactly, floating ones within a tolerance: cast one "
                f"side, e.g. .astype(np.{floating.name}), to compare them as floats")
    return ""


def _exact_for_integers(dtype: np.dtype, resolved: Tolerance) -> Tolerance:
    """Integers and bools compare exactly whatever rtol/atol was given (a class id or a
    token id off by one is another answer, not rounding); the report says so when one was."""
    source = f"{dtype} values compare exactly"
    if resolved.rtol or resolved.atol or resolved.scale:
        source += (f"; rtol={resolved.rtol:g}, atol={resolved.atol:g} ({resolved.source}) "
                   "applies to floating outputs only")
    return Tolerance(0.0, 0.0, source=source)


def _unravel(flat: int | np.integer, shape: tuple) -> tuple:
    if not shape:
        return ()
    return tuple(int(i) for i in np.unravel_index(int(flat), shape))


# --------------------------------------------------------------------------- exact kinds


def _exact_int_diff(af: np.ndarray, ef: np.ndarray) -> np.ndarray:
    """|a - e| of two flat integer arrays, exactly: uint64 (a difference of int64 or uint64
    values may need all 64 bits, which float64 would round: 2**53 vs 2**53 + 1 is 1, not 0),
    Python ints for the rare int64-against-uint64 pair, whose difference may need 65."""
    if af.dtype.kind == "b":
        return (af != ef).astype(np.uint64)
    signed = "i" in (af.dtype.kind, ef.dtype.kind)
    if signed and np.uint64 in (af.dtype.type, ef.dtype.type):
        return np.array([abs(int(x) - int(y)) for x, y in zip(af.tolist(), ef.tolist())],
                        dtype=object)
    wide = np.int64 if signed else np.uint64
    x, y = af.astype(wide), ef.astype(wide)
    ge = x >= y
    # modulo 2**64 the difference is exact, and 0 <= |a - e| < 2**64
    x, y = x.view(np.uint64), y.view(np.uint64)
    return np.where(ge, x - y, y - x)


def _compare_exact_numbers(a: np.ndarray, e: np.ndarray, oc: OutputComparison,
                           full_stats: bool) -> None:
    """Integers and bools: equal or not. The differences are exact integers (``_exact_int_diff``),
    in float64 only for the relative and mean statistics; no "smallest passing tolerance"
    (no tolerance applies)."""
    af, ef = a.reshape(-1), e.reshape(-1)
    neq = af != ef
    oc.mismatched = int(np.count_nonzero(neq))
    oc.passed = oc.mismatched == 0
    if not oc.size:
        return
    exact = _exact_int_diff(af, ef)
    i = int(np.argmax(exact))
    oc.max_abs, oc.max_abs_index = float(exact[i]), _unravel(i, a.shape)
    oc.scale = float(np.max(np.abs(ef.astype(np.float64))))
    if oc.passed and not full_stats:
        return
    d = exact.astype(np.float64)
    oc.mean_abs = float(d.mean())
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = d / np.abs(ef.astype(np.float64))
    rel[d == 0] = 0.0
    j = int(np.argmax(rel))
    oc.max_rel, oc.max_rel_index = float(rel[j]), _unravel(j, a.shape)
    order = np.argsort(-d, kind="stable")[:WORST_COUNT]
    oc.worst = [(_unravel(k, a.shape), _py(af[k]), _py(ef[k])) for k in order if neq[k]]
    oc.error_histogram = _histogram(d[d > 0])


def _compare_exact_values(a: np.ndarray, e: np.ndarray, oc: OutputComparison,
                          equal_nan: bool) -> None:
    """Strings, objects, dates and durations, raw bytes: equal or not (NaT, like NaN,
    equals NaT only with ``equal_nan``)."""
    if a.dtype.kind == "V":                  # unstructured void: compare the bytes
        width = a.dtype.itemsize
        neq = (np.ascontiguousarray(a).view(np.uint8).reshape(-1, width)
               != np.ascontiguousarray(e).view(np.uint8).reshape(-1, width)).any(axis=1)
    else:
        neq = np.asarray(a != e, dtype=bool).reshape(-1)
        if equal_nan and a.dtype.kind in "Mm":
            neq &= ~(np.isnat(a) & np.isnat(e)).reshape(-1)
    oc.mismatched = int(np.count_nonzero(neq))
    if oc.mismatched:
        flat = np.flatnonzero(neq)[:WORST_COUNT]
        oc.worst = [(_unravel(i, a.shape), a.reshape(-1)[i], e.reshape(-1)[i]) for i in flat]
    oc.passed = oc.mismatched == 0
    if a.dtype.kind in "Mm" and oc.mismatched and bool(np.isnat(a).any() or np.isnat(e).any()):
        oc.notes.append("NaT equals NaT only with equal_nan=True")


def _py(x: Any) -> Any:
    return x.item() if isinstance(x, np.generic) else x


def _compare_complex(a: np.ndarray, e: np.ndarray, oc: OutputComparison, tol: Tolerance,
                     equal_nan: bool) -> None:
    """Complex outputs (rare in models): numpy.isclose semantics, simple statistics."""
    af, ef = a.reshape(-1).astype(np.complex128), e.reshape(-1).astype(np.complex128)
    fin = np.isfinite(ef)
    scale = float(np.max(np.abs(ef[fin]))) if fin.any() else 0.0
    ok = np.isclose(af, ef, rtol=tol.rtol, atol=tol.atol + tol.scale * scale, equal_nan=equal_nan)
    oc.scale = scale
    oc.mismatched = int(ok.size - np.count_nonzero(ok))
    oc.passed = oc.mismatched <= tol.max_mismatch_fraction * oc.size
    if oc.passed and not tol.allow_vacuous and tol.is_vacuous(scale):
        oc.vacuous, oc.passed, oc.problem = True, False, _vacuous_problem(tol, scale)
    if oc.size:
        with np.errstate(invalid="ignore"):
            d = np.abs(af - ef)
        d = np.where(np.isfinite(d), d, 0.0)
        i = int(np.argmax(d))
        oc.max_abs, oc.max_abs_index = float(d[i]), _unravel(i, a.shape)
        oc.mean_abs = float(d.mean())
    oc.notes.append("complex values: |a - e| is the modulus of the difference")


# --------------------------------------------------------------------------- floats


def elementwise_close(actual: Any, expected: Any, tolerance: Tolerance, *,
                      equal_nan: bool = False, blocking: Blocking = Blocking()) -> np.ndarray:
    """Per-element verdict of the value rule (same chunks and kernel as ``compare``).

    For floating arrays of one shape; the rule is ``numpy.isclose``'s with the ``scale``
    term added (and float16/bfloat16 judged in float32). ``compare`` only counts the
    elements out; this says *which* are, for callers who want the mask (the tests check
    ``compare``'s counts against it).
    """
    a, e = np.asarray(as_numpy(actual)), np.asarray(as_numpy(expected))
    if a.shape != e.shape:
        raise ValueError(f"shapes differ: actual {a.shape}, expected {e.shape}")
    for what in ("rtol", "atol", "scale"):
        check_tolerance_value(what, getattr(tolerance, what), f"Tolerance({tolerance.source})")
    if _float_format(a.dtype) is None or _float_format(e.dtype) is None:
        return np.asarray(a == e, dtype=bool).reshape(a.shape)
    af, ef = np.ravel(a), np.ravel(e)
    work = _work_dtype(a, e, tolerance)
    native = all(x.dtype.kind == "f" and x.dtype.itemsize <= 8 for x in (af, ef))
    scan = _Scanner(af, ef, work, native, blocking)
    scale = 0.0
    for _, _, ec, _ in scan.chunks():
        scale = max(scale, scan._finite_absmax(ec))
    out = np.empty(af.size, bool)
    const = float(tolerance.atol) + float(tolerance.scale) * scale
    for start, ac, ec, m in scan.chunks():
        d = scan._absdiff(ac, ec, m)
        b = scan._bound(ec, m, float(tolerance.rtol), const)
        out[start:start + m] = scan._ok(ac, ec, d, b, equal_nan)
    return out.reshape(a.shape)


def _compare_floats(a: np.ndarray, e: np.ndarray, oc: OutputComparison, tol: Tolerance,
                    how: _Settings, fmt: tuple[int, int] | None) -> None:
    equal_nan, full_stats = how.equal_nan, how.full_stats
    work = _work_dtype(a, e, tol)
    if a.dtype.itemsize > 8 or e.dtype.itemsize > 8:
        oc.notes.append("extended precision judged in float64")
    af, ef = np.ravel(a), np.ravel(e)
    native = all(x.dtype.kind == "f" and x.dtype.itemsize <= 8 for x in (af, ef))
    scan = _Scanner(af, ef, work, native, how.blocking)
    n = oc.size

    # pass 1: verdict, cheapest test first -------------------------------------------
    allowed = tol.max_mismatch_fraction * n
    # a failing output needs the statistics pass anyway: stop counting once it surely fails
    v = scan.verdict(tol, equal_nan, stop_after=None if full_stats else allowed)
    oc.scale = v.scale
    oc.max_abs = v.max_abs
    oc.max_abs_index = None if v.max_abs_index is None else _unravel(v.max_abs_index, a.shape)
    oc.mismatched = v.mismatched
    passed = v.mismatched <= allowed
    if tol.min_top1 is not None and a.ndim >= 1 and n:
        passed = _judge_top1(a, e, oc, tol) and passed
    if passed and v.scale is not None and not tol.allow_vacuous and tol.is_vacuous(v.scale):
        oc.vacuous = True
        oc.problem = _vacuous_problem(tol, v.scale)
        passed = False
    oc.passed = passed
    if n == 0 or (passed and not full_stats):
        _note_nonfinite(oc, v.nonfinite_mismatched, equal_nan)
        return

    # pass 2: full statistics ------------------------------------------------------
    # (with tol.scale > 0 the verdict pass always reads to the end: its scale is final)
    s = scan.statistics(tol, equal_nan, v.scale if tol.scale else None, fmt,
                        want_histogram=full_stats,
                        expect_failures=v.mismatched > 0)
    oc.scale = s.scale
    if not v.complete:                    # the statistics pass counted the whole output
        oc.mismatched, oc.scale, oc.max_abs = s.mismatched, s.scale, s.max_abs
        oc.max_abs_index = None if s.max_abs_index is None else _unravel(s.max_abs_index,
                                                                           a.shape)
        v = _Verdict(s.mismatched, s.nonfinite_mismatched, s.scale, s.max_abs, s.max_abs_index)
        # the verdict's count was an upper bound (a scale that grew late); this one is exact
        oc.passed = s.mismatched <= allowed and not oc.vacuous and (
            oc.top1_agreement is None or tol.min_top1 is None or oc.top1_agreement >= tol.min_top1)
    _note_nonfinite(oc, v.nonfinite_mismatched, equal_nan)
    oc.mean_abs = s.mean_abs
    oc.max_rel = s.max_rel
    oc.max_rel_index = None if s.max_rel_index is None else _unravel(s.max_rel_index, a.shape)
    oc.max_ulp = s.max_ulp
    oc.min_atol = s.min_atol
    oc.min_rtol = s.min_rtol
    oc.worst = [(_unravel(i, a.shape), float(x), float(y)) for i, x, y in s.worst]
    oc.error_histogram = s.histogram
    const = tol.atol + tol.scale * s.scale
    if v.max_abs_index is not None:
        oc.max_abs_allowed = const + tol.rtol * abs(float(ef[v.max_abs_index]))
    if s.max_rel_index is not None:
        ev = abs(float(ef[s.max_rel_index]))
        oc.max_rel_allowed = tol.rtol + const / ev if ev else math.inf


def _vacuous_problem(tol: Tolerance, scale: float) -> str:
    return (f"vacuous comparison: the allowed difference ({tol.describe()}) is at least the "
            f"output's largest magnitude {scale:.3g}, so even an all-zero output would pass "
            "and this check cannot fail; use a tolerance below the output's scale (the "
            "default rule scales with it), or pass allow_vacuous=True to accept it")


def _note_nonfinite(oc: OutputComparison, count: int, equal_nan: bool) -> None:
    if count:
        oc.notes.append(f"{count} mismatched element(s) involve NaN or infinity"
                        + ("" if equal_nan else " (NaN equals NaN only with equal_nan=True)"))


def _judge_top1(a: np.ndarray, e: np.ndarray, oc: OutputComparison, tol: Tolerance) -> bool:
    """Top-1 agreement over the rows whose reference argmax is evidence; notes what it left out."""
    agreement, judged, ties = _top1(a, e, tol)
    oc.top1_agreement, oc.top1_rows, oc.top1_near_ties = agreement, judged, ties
    excluded = (f" ({ties} near-tie row(s) left out: their reference top-1 margin is within twice "
                f"the allowed difference, so their argmax is noise)") if ties else ""
    if judged == 0 and ties:
        oc.top1_agreement = None
        oc.notes.append(f"top-1 agreement not judged: all {ties} rows are near-ties (reference top-1 "
                        "margin within twice the allowed difference)")
        return True
    assert tol.min_top1 is not None
    if agreement < tol.min_top1:
        oc.notes.append(f"top-1 agreement {agreement:.1%} over {judged} row(s) is below the required "
                        f"{tol.min_top1:.0%}{excluded}")
        return False
    if ties:
        oc.notes.append(f"top-1 agreement {agreement:.1%} over {judged} row(s){excluded}")
    return True


def _top1(a: np.ndarray, e: np.ndarray, tol: Tolerance | None = None) -> tuple[float, int, int]:
    """(agreement, rows judged, near-tie rows left out) of the argmax over the last axis.

    A row whose reference top-1 beats its runner-up by no more than twice the allowed
    difference (each may move by the bound) is a near-tie: its argmax is not evidence.
    """
    if a.shape[-1] == 0:
        return 1.0, 0, 0
    a2 = a.reshape(-1, a.shape[-1])
    e2 = e.reshape(-1, e.shape[-1]).astype(np.float64)
    if a2.shape[0] == 0:
        return 1.0, 0, 0
    agree = np.argmax(a2, axis=-1) == np.argmax(e2, axis=-1)
    judged = np.ones(agree.shape, bool)
    if tol is not None and e2.shape[1] >= 2:
        finite = e2[np.isfinite(e2)]
        scale = float(np.max(np.abs(finite))) if finite.size else 0.0
        top2 = np.partition(e2, -2, axis=-1)[:, -2:]
        margin = top2[:, 1] - top2[:, 0]
        with np.errstate(invalid="ignore"):
            judged = ~(margin <= 2.0 * tol.allowed(np.abs(top2[:, 1]), scale))
    count = int(judged.sum())
    if count == 0:
        return 1.0, 0, int(agree.size)
    return float(np.mean(agree[judged])), count, int(agree.size) - count


@dataclass
class _Verdict:
    mismatched: int
    nonfinite_mismatched: int
    scale: float | None                   # None when the rule did not need it (scale == 0)
    max_abs: float | None
    max_abs_index: int | None
    complete: bool = True                 # False: stopped early; the statistics pass counts


@dataclass
class _Stats:
    mean_abs: float | None
    max_rel: float | None
    max_rel_index: int | None
    max_ulp: float | None
    min_atol: float | None
    min_rtol: float | None
    worst: list
    histogram: tuple[list[int], list[float]] | None
    mismatched: int = 0
    nonfinite_mismatched: int = 0
    scale: float = 0.0
    max_abs: float | None = None
    max_abs_index: int | None = None


class _Scanner:
    """Streams two flat arrays in chunks through preallocated work buffers."""

    def __init__(self, a: np.ndarray, e: np.ndarray, work: np.dtype, native: bool,
                 blocking: Blocking) -> None:
        self.a, self.e, self.work, self.native = a, e, work, native
        self.blocking = blocking
        self.chunk = chunk = blocking.chunk
        self.n = e.size
        size = min(chunk, max(self.n, 1))
        self.d = np.empty(size, work)      # |a - e|
        self.b = np.empty(size, work)      # bound, or scratch
        self.t = np.empty(size, work)      # scratch
        self.mask = np.empty(size, bool)   # scratch

    def chunks(self):
        for start in range(0, self.n, self.chunk):
            stop = min(start + self.chunk, self.n)
            ac, ec = self.a[start:stop], self.e[start:stop]
            if not self.native:            # bfloat16 and friends: widen first
                ac, ec = ac.astype(self.work), ec.astype(self.work)
            yield start, ac, ec, stop - start

    def _absdiff(self, ac: np.ndarray, ec: np.ndarray, m: int) -> np.ndarray:
        d = self.d[:m]
        with np.errstate(invalid="ignore", over="ignore"):
            np.subtract(ac, ec, out=d, dtype=self.work)
        np.abs(d, out=d)
        return d

    def _bound(self, ec: np.ndarray, m: int, rtol: float, const: float) -> np.ndarray:
        b = self.b[:m]
        np.abs(ec, out=b, dtype=self.work)
        with np.errstate(over="ignore", invalid="ignore"):
            np.multiply(b, rtol, out=b)
            np.add(b, const, out=b)
        return b

    @staticmethod
    def _finite_absmax(ec: np.ndarray) -> float:
        hi, lo = float(ec.max()), float(ec.min())
        if math.isfinite(hi) and math.isfinite(lo):
            return max(hi, -lo)
        fin = ec[np.isfinite(ec)]
        return float(np.max(np.abs(fin))) if fin.size else 0.0

    def _ok(self, ac, ec, d, b, equal_nan: bool) -> np.ndarray:
        """numpy.isclose's rule on one chunk, given |a-e| and the bound."""
        with np.errstate(invalid="ignore"):
            ok = np.less_equal(d, b)
            ok &= np.isfinite(ec)
            ok |= ac == ec
            if equal_nan:
                ok |= np.isnan(ac) & np.isnan(ec)
        return ok

    def _count_bad(self, ac, ec, d, dmax: float, m: int, rtol: float, const: float,
                   equal_nan: bool) -> tuple[int, int]:
        """(mismatched, of which NaN/inf) in one chunk."""
        if math.isfinite(dmax):
            # all pairs finite: numpy.isclose's rule reduces to d <= bound. The bound is at
            # least fl(const), so only elements with d > const can be out: when those are
            # few, judge just them (same float operations, so the same verdicts)
            mask = self.mask[:m]
            np.greater(d, const, out=mask)
            few = int(np.count_nonzero(mask))
            if few <= m // _FEW_SHARE:
                if not few:
                    return 0, 0
                idx = mask.nonzero()[0]
                with np.errstate(over="ignore", invalid="ignore"):
                    bound = np.abs(ec[idx], dtype=self.work)
                    np.multiply(bound, rtol, out=bound)
                    np.add(bound, const, out=bound)
                return int(np.count_nonzero(np.greater(d[idx], bound))), 0
            b = self._bound(ec, m, rtol, const)
            return int(np.count_nonzero(np.greater(d, b))), 0
        b = self._bound(ec, m, rtol, const)
        bad = ~self._ok(ac, ec, d, b, equal_nan)
        return int(np.count_nonzero(bad)), int(np.count_nonzero(bad & ~np.isfinite(d)))

    def _argmax_finite(self, start: int) -> int:
        """Flat index of the greatest finite |a - e| in the chunk starting at ``start``."""
        stop = min(start + self.chunk, self.n)
        ac, ec = self.a[start:stop], self.e[start:stop]
        if not self.native:
            ac, ec = ac.astype(self.work), ec.astype(self.work)
        d = self._absdiff(ac, ec, stop - start)
        d[~np.isfinite(d)] = -1.0
        return start + int(np.argmax(d))

    def verdict(self, tol: Tolerance, equal_nan: bool, stop_after: float | None = None
                ) -> _Verdict:
        """Count mismatches; with ``stop_after``, stop once more than that many are out and
        the bound does not depend on the output's scale (the statistics pass recounts)."""
        rtol, atol, sc = float(tol.rtol), float(tol.atol), float(tol.scale)
        # max|e| sets the bound when sc > 0; with an absolute term it also tells whether the
        # rule is vacuous (Tolerance.is_vacuous), so measure it then too
        want_scale = bool(sc) or ((atol > 0 or rtol >= 1) and not tol.allow_vacuous)
        scale = 0.0
        best, best_at = -1.0, None            # greatest finite |a - e| and its chunk
        suspects: list[int] = []              # chunk starts that need a look with the final scale
        suspect_bad = 0                       # their mismatches under the running scale (>= final)
        mismatched = nonfinite = 0
        with np.errstate(all="ignore"):   # NaN/inf are judged explicitly below
            for start, ac, ec, m in self.chunks():
                if want_scale:
                    scale = max(scale, self._finite_absmax(ec))
                    if stop_after is not None and suspect_bad > stop_after:
                        continue                  # probably failing: only the scale is needed
                d = self.d[:m]
                np.subtract(ac, ec, out=d, dtype=self.work)
                np.abs(d, out=d)
                dmax = float(d.max())
                if math.isfinite(dmax):
                    if dmax > best:
                        best, best_at = dmax, start
                    if dmax <= atol + sc * scale:
                        continue                  # every element of the chunk is within its bound
                else:
                    fin = np.isfinite(d)
                    if fin.any():
                        fmax = float(d[fin].max())
                        if fmax > best:
                            best, best_at = fmax, start
                bad, bad_nf = self._count_bad(ac, ec, d, dmax, m, rtol, atol + sc * scale, equal_nan)
                if not bad:
                    continue
                if sc == 0.0:                     # bound does not depend on the scale: count now
                    mismatched += bad
                    nonfinite += bad_nf
                    if stop_after is not None and mismatched > stop_after:
                        return _Verdict(mismatched, nonfinite, scale, None, None, complete=False)
                else:
                    suspects.append(start)
                    suspect_bad += bad
        if stop_after is not None and suspect_bad > stop_after:
            # probably failing, and the statistics pass counts with the final scale anyway:
            # re-reading the suspects here would only repeat that count
            return _Verdict(suspect_bad, nonfinite, scale, None, None, complete=False)
        # the scale may have grown after a suspect chunk was seen: judge those with the final one
        for start in suspects:
            stop = min(start + self.chunk, self.n)
            ac, ec = self.a[start:stop], self.e[start:stop]
            if not self.native:
                ac, ec = ac.astype(self.work), ec.astype(self.work)
            m = stop - start
            d = self._absdiff(ac, ec, m)
            bad, bad_nf = self._count_bad(ac, ec, d, float(d.max()), m, rtol, atol + sc * scale,
                                          equal_nan)
            mismatched += bad
            nonfinite += bad_nf
        max_abs_index = None if best_at is None else self._argmax_finite(best_at)
        return _Verdict(mismatched, nonfinite, scale if want_scale else None,
                        None if best_at is None else best, max_abs_index)

    def statistics(self, tol: Tolerance, equal_nan: bool, scale: float | None,
                   fmt: tuple[int, int] | None,
                   want_histogram: bool, expect_failures: bool = False) -> _Stats:
        """Every statistic in one pass (``_StatsPass``). ``scale=None`` (only for
        ``tol.scale == 0``, where the bound does not need it): measure max|e| on the way."""
        return _StatsPass(self, tol, equal_nan, scale, fmt, want_histogram,
                          expect_failures).run()


class _StatsPass:
    """One statistics pass over a ``_Scanner``'s chunks: its running state, one method per
    kind of chunk, and the summary.

    With ``expect_failures`` (the verdict saw mismatches) most chunks take a short path:
    every statistic except max|a - e| and the mean is a maximum (or a top-5) that only a few
    elements can reach once the first chunks set a level, so one mask
    ``d > min(k|e| + c, kr|e|)`` (margins proven in ``_StatsAcc``) picks a superset of those
    elements and of the mismatches; their exact values are computed in batches. Chunks with
    non-finite values or too many candidates take the full path."""

    def __init__(self, scan: _Scanner, tol: Tolerance, equal_nan: bool, scale: float | None,
                 fmt: tuple[int, int] | None, want_histogram: bool,
                 expect_failures: bool) -> None:
        self.scan, self.tol, self.equal_nan = scan, tol, equal_nan
        self.want_histogram = want_histogram
        self.rtol, self.sc = float(tol.rtol), float(tol.scale)
        self.measure_scale = scale is None
        if scale is None:
            assert self.sc == 0.0
            scale = 0.0
        self.scale = scale
        self.const = const = float(tol.atol) + self.sc * scale
        nmant, minexp = fmt if fmt is not None else (52, -1022)
        size, work, blocking = scan.d.size, scan.work, scan.blocking
        self.acc = _StatsAcc(work, self.rtol, const, float(tol.atol), nmant, minexp, size,
                             blocking.subset_batch)
        self.best = -1.0                         # greatest finite |a - e|...
        self.best_at: int | None = None          # ...and its chunk
        self.total, self.finite_count = 0.0, 0
        self.hist = np.zeros(2100, np.int64)     # binary exponents of |a-e|, offset by 1100
        self.ones = np.ones(size, work)
        self.fast = (blocking.short_stats and expect_failures
                     and not want_histogram and self.acc.ulp_floor > 0
                     and nmant <= np.finfo(work).nmant
                     and self.rtol >= 0 and math.isfinite(const) and const >= 0)
        # buffers of the candidate mask (empty when the short path is off)
        fast_size = size if self.fast else 0
        self.xb, self.mk = np.empty(fast_size, work), np.empty(fast_size, bool)
        self.thb = np.empty(fast_size, work)
        self.theta_at: float | None = None
        self.cheap = True                        # candidate mask without the rtol slope, while small

    def run(self) -> _Stats:
        scan = self.scan
        with np.errstate(all="ignore"):          # every case below is handled explicitly
            for start, ac, ec, m in scan.chunks():
                d = scan.d[:m]
                np.subtract(ac, ec, out=d, dtype=scan.work)
                np.abs(d, out=d)
                part = float(np.dot(d, self.ones[:m]))   # BLAS dot: a fast sum of |a - e|
                levels = self.acc.levels() if self.fast else None
                # a finite sum means finite pairs; then, with the slope-free mask, every
                # element above the best |a - e| so far is a candidate: no max pass needed
                skip_max = (math.isfinite(part) and self.cheap and levels is not None
                            and self.best > levels[1] * _ABOVE_MASK)
                dmax = part if skip_max else float(d.max())
                if math.isfinite(dmax):
                    self._finite_chunk(start, ec, d, m, part, dmax, levels, skip_max)
                else:
                    self._nonfinite_chunk(start, ac, ec, d, m)
        self.acc.flush()
        return self._summary()

    def _take_best(self, dmax: float, start: int) -> None:
        if dmax > self.best:
            self.best, self.best_at = dmax, start

    def _finite_chunk(self, start: int, ec: np.ndarray, d: np.ndarray, m: int, part: float,
                      dmax: float, levels: tuple[float, float, float] | None,
                      skip_max: bool) -> None:
        """A chunk of finite pairs: the short path when few candidates, else in full."""
        if not math.isfinite(part):
            part = float(np.sum(d, dtype=np.float64))
        self.total += part
        self.finite_count += m
        if not skip_max:
            self._take_best(dmax, start)
        if levels is not None:
            if self._short_chunk(start, ec, d, m, levels, skip_max):
                return
            # too many candidates: this chunk is cheaper done in full
        elif self.measure_scale:
            self.scale = max(self.scale, self.scan._finite_absmax(ec))
        self.acc.full_chunk(start, ec, d, None, self.scan.b[:m], self.scan.t[:m])
        self._keep_for_summary(d, m)

    def _short_chunk(self, start: int, ec: np.ndarray, d: np.ndarray, m: int,
                     levels: tuple[float, float, float], skip_max: bool) -> bool:
        """Feed the chunk's candidates to the accumulator; False (nothing fed) when they are
        too many and the chunk is cheaper done in full. ``|e|`` is left in ``scan.b``."""
        ae = self.scan.b[:m]
        np.abs(ec, out=ae, dtype=self.scan.work)
        if self.measure_scale:
            self.scale = max(self.scale, float(ae.max()))
        idx = self._candidates(d, ae, m, levels)
        if idx.size <= m // self.scan.blocking.subset_max_share:
            ds = d[idx]
            if skip_max:
                if not self.cheap:               # the mask just used had the slope
                    self._take_best(float(d.max()), start)
                else:
                    self._take_best(float(ds.max()) if idx.size else -1.0, start)
            self.acc.add_subset(idx + start, ds, ae[idx])
            return True
        if skip_max:
            self._take_best(float(d.max()), start)
        return False

    def _candidates(self, d: np.ndarray, ae: np.ndarray, m: int,
                    levels: tuple[float, float, float]) -> np.ndarray:
        """Flat chunk indices of the elements that can still change a statistic
        (``_StatsAcc`` proves the mask). Tries the cheaper slope-free mask first, and stops
        trying it for good once it picks too many."""
        k, c_low, kr = levels
        x, mask = self.xb[:m], self.mk[:m]
        if self.cheap:                           # drop the rtol slope: 2 passes fewer
            if kr == math.inf or kr == 0:
                np.greater(d, c_low if kr else 0.0, out=mask)
            else:
                theta = c_low / kr
                if theta != self.theta_at:       # np.minimum with a scalar is slow
                    self.thb.fill(theta)
                    self.theta_at = theta
                np.minimum(ae, self.thb[:m], out=x)
                np.multiply(x, kr, out=x)
                np.greater(d, x, out=mask)
            idx = mask.nonzero()[0]
            if idx.size <= m // self.scan.blocking.cheap_max_share:
                return idx
            self.cheap = False                   # the slope matters here
        np.multiply(ae, k, out=x)
        np.add(x, c_low, out=x)
        if kr != math.inf:
            y = self.scan.t[:m]
            np.multiply(ae, kr, out=y)
            np.minimum(x, y, out=x)
        np.greater(d, x, out=mask)
        return mask.nonzero()[0]

    def _nonfinite_chunk(self, start: int, ac: np.ndarray, ec: np.ndarray, d: np.ndarray,
                         m: int) -> None:
        """A chunk with NaN or infinity: judged element by element, statistics over its
        finite pairs."""
        scan, acc = self.scan, self.acc
        if self.measure_scale:
            self.scale = max(self.scale, scan._finite_absmax(ec))
        fin = np.isfinite(d)
        b = scan._bound(ec, m, self.rtol, self.const)
        ok = scan._ok(ac, ec, d, b, self.equal_nan)
        acc.mismatched += int(m - np.count_nonzero(ok))
        bad_nf = np.flatnonzero(~ok & ~fin)
        acc.nonfinite += int(bad_nf.size)
        if bad_nf.size:
            acc.impossible = True
            acc.nonfinite_worst.extend(int(start + i) for i in bad_nf[:WORST_COUNT])
        d[~fin] = 0.0                            # statistics below are over finite pairs
        nfin = int(np.count_nonzero(fin))
        self.finite_count += nfin
        self._take_best(float(d.max()) if nfin else -1.0, start)
        with np.errstate(over="ignore", invalid="ignore"):
            self.total += float(np.sum(d, dtype=np.float64))
        acc.full_chunk(start, ec, d, fin, scan.b[:m], scan.t[:m], counted=True)
        self._keep_for_summary(d, m)

    def _keep_for_summary(self, d: np.ndarray, m: int) -> None:
        """What only a fully computed chunk gives: its error histogram."""
        if self.want_histogram:
            _histogram_add(self.hist, d)

    # ---------------------------------------------------------------- summary
    def _summary(self) -> _Stats:
        acc, scan, finite_count = self.acc, self.scan, self.finite_count
        mean_abs = (self.total / finite_count if math.isfinite(self.total)
                    else float(np.finfo(np.float64).max)) if finite_count else None
        max_rel: float | None = acc.max_rel if finite_count else None
        min_atol, min_rtol = self._smallest_tolerance()
        worst_rows = [(i, _py(scan.a[i]), _py(scan.e[i])) for i in self._worst_picks()]
        found = self.best_at is not None
        return _Stats(mean_abs, max_rel if max_rel is None or max_rel >= 0 else None,
                      acc.max_rel_index, acc.max_ulp if finite_count else None, min_atol,
                      min_rtol, worst_rows, _histogram_of(self.hist), acc.mismatched,
                      acc.nonfinite, self.scale, self.best if found else None,
                      scan._argmax_finite(self.best_at) if self.best_at is not None else None)

    def _smallest_tolerance(self) -> tuple[float, float]:
        """(min_atol, min_rtol): the smallest ``atol=`` (with the rule's rtol) and ``rtol=``
        (with its atol) that pass when given as arguments, i.e. under the plain per-element
        rule (no scale term, no share of elements allowed out: what an explicit value
        means), rounded up past the arithmetic's rounding (``passing_bound``); inf when a
        non-finite mismatch makes every tolerance fail."""
        acc = self.acc
        if acc.impossible:
            return math.inf, math.inf
        work = self.scan.work
        min_atol = passing_bound(acc.need_atol, work) if math.isfinite(acc.need_atol) else 0.0
        min_rtol = passing_bound(acc.need_rtol, work) if acc.need_rtol != -math.inf else 0.0
        return min_atol, min_rtol

    def _worst_picks(self) -> list[int]:
        """Flat indices of the worst elements: non-finite mismatches first, then the largest
        excesses (mismatches only, when the output fails)."""
        acc = self.acc
        worst = acc.worst
        if any(x > self.const for x, _ in worst) or acc.nonfinite_worst:
            worst = [(x, i) for x, i in worst if x > self.const]   # failing: mismatches only
        picks = acc.nonfinite_worst[:WORST_COUNT] + [i for _, i in worst]
        return list(dict.fromkeys(picks))[:WORST_COUNT]


def _histogram_add(hist: np.ndarray, d: np.ndarray) -> None:
    """log2|a-e| over nonzero finite differences (non-finite ones are zeroed before)."""
    nz = d[d > 0]
    if nz.size:
        _, ex = np.frexp(nz)
        hist += np.bincount(ex.astype(np.int64) + 1100, minlength=hist.size)[:hist.size]


def _histogram_of(hist: np.ndarray) -> tuple[list[int], list[float]] | None:
    """(counts, log10 edges) of the occupied bins of ``_histogram_add``'s counts."""
    if not hist.any():
        return None
    nzb = np.flatnonzero(hist)
    lo, hi = int(nzb[0]), int(nzb[-1]) + 1
    counts = [int(c) for c in hist[lo:hi]]
    # frexp exponent x means |d| in [2**(x-1), 2**x)
    edges = [round((k - 1100 - 1) * math.log10(2), 4) for k in range(lo, hi + 1)]
    return counts, edges


class _StatsAcc:
    """Running statistics, fed whole chunks (``full_chunk``) or gathered candidate elements
    (``add_subset``); the same float arithmetic either way, so the results are identical.

    Ties are broken by the lowest flat index (numpy's argmax), whatever the feeding order.

    Why the candidate mask ``d > min(fl(k|e|) + c_low, fl(kr|e|))`` (``levels``) keeps every
    element that can still change a result (u = unit roundoff <= 2**-24, margin 2**-20):
    - a mismatch has d > fl(fl(rtol|e|) + c) >= the first term, since k <= rtol, c_low <= c;
    - an excess fl(d - fl(rtol|e|)) above the current level A (smallest atol so far, or the
      5th-worst excess) means d > fl(rtol|e|) + A/(1+u) > the first term, c_low <= A(1-margin);
    - a relative difference fl(d/|e|) above R means d > |e| R/(1+u) > fl(kr|e|), kr <= R(1-m);
      the rtol ratio fl((d - atol)/|e|) is at most fl(d/|e|); and a ULP distance
      d / max(2**E(e) 2**-nmant, floor) is below 2**(nmant+1) d/|e|, so one above the current
      maximum U needs d/|e| > U 2**-(nmant+1)/(1+u): R = min(max_rel, need_rtol, U 2**-(nmant+2)).
    The cheaper mask ``d > fl(min(|e|, c_low/kr) kr)`` is below both terms too (it is at most
    c_low (1+u)**3 and at most fl(kr|e|)); it only picks more elements where rtol|e| matters.
    """

    def __init__(self, work: np.dtype, rtol: float, const: float, atol: float, nmant: int,
                 minexp: int, chunk: int, batch: int) -> None:
        self.work, self.rtol, self.const, self.nmant = work, rtol, const, nmant
        self.atol = atol                      # need_rtol is for an explicit rtol=: atol only
        self.mismatched = self.nonfinite = 0
        self.max_rel = -1.0
        self.max_rel_index: int | None = None
        self.max_ulp = 0.0
        self.need_atol = -math.inf            # max over elements of d - rtol|e|
        self.need_rtol = -math.inf            # max over elements of (d - atol) / |e|
        self.impossible = False               # a non-finite mismatch: no tolerance passes
        self.worst: list[tuple[float, int]] = []   # (excess, flat index), best first
        self.nonfinite_worst: list[int] = []
        self.pow2_mask, _ = _EXPONENT_BITS[work.itemsize]
        self.ulp_floor = 2.0 ** (minexp - nmant)
        self.u = np.empty(chunk, work)
        self.pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.pending_size = 0
        self.batch = batch                    # candidates gathered before flush() computes them
        self._levels: tuple[float, float, float] | None = None
        self._levels_stale = True             # the levels move only when results do

    # ---------------------------------------------------------------- candidate levels
    def levels(self) -> tuple[float, float, float] | None:
        """(k, c_low, kr) for the candidate mask, or None while the levels are unknown."""
        if self._levels_stale:
            self._levels, self._levels_stale = self._compute_levels(), False
        return self._levels

    def _compute_levels(self) -> tuple[float, float, float] | None:
        if len(self.worst) < WORST_COUNT:
            return None
        level_a = min(self.need_atol, self.worst[-1][0])
        if not (level_a > 0 and math.isfinite(level_a)):
            return None
        r = min(self.max_rel, self.need_rtol, self.max_ulp * 2.0 ** -(self.nmant + 2))
        if not r >= 0:                        # also NaN
            return None
        shrink = 1.0 - _MARGIN
        kr = r * shrink if math.isfinite(r) else math.inf
        return self.rtol * shrink, min(self.const, level_a) * shrink, kr

    # ---------------------------------------------------------------- feeding
    def add_subset(self, idx: np.ndarray, d: np.ndarray, ae: np.ndarray) -> None:
        if idx.size:
            self.pending.append((idx, d, ae))
            self.pending_size += idx.size
            if self.pending_size >= self.batch:
                self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        if len(self.pending) == 1:
            idx, d, ae = self.pending[0]
        else:
            idx, d, ae = (np.concatenate(p) for p in zip(*self.pending))
        self.pending, self.pending_size = [], 0
        self._levels_stale = True
        t = np.empty_like(d)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # mismatches, as verdict() counts them: d > rtol|e| + const
            p = np.multiply(ae, self.rtol)
            self.mismatched += int(np.count_nonzero(np.greater(d, np.add(p, self.const))))
            self._take_ratios(d, ae, t, idx)
            np.subtract(d, p, out=t)
        self._take_excess(t, idx)

    def full_chunk(self, start: int, ec: np.ndarray, d: np.ndarray, fin: np.ndarray | None,
                   ae: np.ndarray, t: np.ndarray, counted: bool = False) -> None:
        """Every statistic of one chunk (``fin``: its finite pairs, None when all are);
        leaves the excess d - rtol|e| in ``t``. ``counted``: mismatches already counted."""
        m = d.size
        self._levels_stale = True
        np.abs(ec, out=ae, dtype=self.work)
        if fin is not None:
            ae[~fin] = 1.0                   # keep non-finite pairs out of rel/ulp/rtol
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            self._take_ratios(d, ae, t, start)
            np.multiply(ae, self.rtol, out=t)
            if not counted:                  # count as verdict() does: d > rtol|e| + const
                uu = self.u[:m]
                np.add(t, self.const, out=uu)
                self.mismatched += int(np.count_nonzero(np.greater(d, uu)))
            np.subtract(d, t, out=t)
            if fin is not None:
                t[~fin] = -math.inf
        self._take_excess(t, start)

    # ---------------------------------------------------------------- reductions
    def _take_ratios(self, d: np.ndarray, ae: np.ndarray, t: np.ndarray,
                     where: int | np.ndarray) -> None:
        """The statistics that divide by |e| (``t`` is scratch; call under np.errstate)."""
        # relative difference; 0/0 (exact zero both sides) is NaN and skipped
        np.divide(d, ae, out=t)
        self._take_rel(t, where)
        np.subtract(d, self.atol, out=t)
        np.divide(t, ae, out=t)
        self._take_rtol(t)
        self._take_ulp(d, ae, t)

    def _take_rel(self, t: np.ndarray, where: int | np.ndarray) -> None:
        if not t.size:
            return
        r = float(t.max())
        if math.isnan(r):
            r = float(np.fmax.reduce(t))
        if math.isnan(r) or r < self.max_rel:
            return
        first = int(np.argmax(t == r))
        i = where + first if isinstance(where, int) else int(where[first])
        if r > self.max_rel or self.max_rel_index is None or i < self.max_rel_index:
            self.max_rel, self.max_rel_index = r, i

    def _take_rtol(self, t: np.ndarray) -> None:
        if t.size:
            r = float(t.max())
            if math.isnan(r):
                r = float(np.fmax.reduce(t))
            if r > self.need_rtol:           # NaN compares False
                self.need_rtol = r

    def _take_ulp(self, d: np.ndarray, ae: np.ndarray, t: np.ndarray) -> None:
        """ULP distance in the less precise format: d / ulp(e), where ulp(e) is 2**exponent(e)
        (the exponent bits of |e| read as a float) * 2**-nmant, at least the format's floor."""
        if not t.size:
            return
        tv = t.view(self.pow2_mask.dtype)
        np.bitwise_and(ae.view(self.pow2_mask.dtype), self.pow2_mask, out=tv)
        np.multiply(t, 2.0 ** -self.nmant, out=t)
        np.maximum(t, self.ulp_floor, out=t)
        np.divide(d, t, out=t)
        self.max_ulp = max(self.max_ulp, float(t.max()))

    def _take_excess(self, t: np.ndarray, where: int | np.ndarray) -> None:
        """``t``: excess d - rtol|e| (smallest atol: its max; worst elements: its top 5)."""
        if not t.size:
            return
        cmax = float(t.max())
        self.need_atol = max(self.need_atol, cmax)
        full = len(self.worst) >= WORST_COUNT
        if full and not cmax >= self.worst[-1][0]:
            return
        if full:
            thr = self.worst[-1][0]
        elif t.size > WORST_COUNT:           # the 5th largest value: ties at it all count
            # when 5 or more are out (excess > const), the 5th largest is among them: a
            # partition of those few instead of the whole chunk
            hot = t[t > self.const]
            pool = hot if hot.size >= WORST_COUNT else t
            thr = float(np.partition(pool, pool.size - WORST_COUNT)[pool.size - WORST_COUNT])
        else:
            thr = -math.inf
        cand = np.flatnonzero(t >= thr)
        if cand.size > WORST_COUNT:
            # top WORST_COUNT by value, ties to the lowest index (stable sort)
            cand = cand[np.argsort(-t[cand], kind="stable")[:WORST_COUNT]]
        for i in cand:
            gi = where + int(i) if isinstance(where, int) else int(where[i])
            self.worst.append((float(t[i]), gi))
        self.worst = sorted(set(self.worst), key=lambda w: (-w[0], w[1]))[:WORST_COUNT]


def _histogram(d: np.ndarray) -> tuple[list[int], list[float]] | None:
    if not d.size:
        return None
    _, ex = np.frexp(d.astype(np.float64))
    lo, hi = int(ex.min()), int(ex.max())
    counts = np.bincount(ex - lo, minlength=hi - lo + 1)
    return ([int(c) for c in counts],
            [round((k - 1) * math.log10(2), 4) for k in range(lo, hi + 2)])
