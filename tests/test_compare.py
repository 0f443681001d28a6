"""compare(): structure, shape, dtype checks in order; the value rule; every statistic."""

from __future__ import annotations

import json
import math

from dataclasses import replace

import numpy as np
import pytest

from pytest_modelparity.verdict.compare import Blocking, ComparisonReport, compare, elementwise_close
from pytest_modelparity.verdict.tolerances import Tolerance

from pytest_modelparity.verdict import scanning, statistics

PLAIN = Tolerance(rtol=1.3e-6, atol=1e-5, source="argument")


def only(report: ComparisonReport):
    (oc,) = report.outputs
    return oc


# ----------------------------------------------------------------- structure / shape / dtype


def test_nested_structures_name_every_path():
    e = {"logits": np.zeros((2, 3), np.float32), "aux": [np.ones(2), {"b": np.arange(3)}]}
    a = {"logits": np.zeros((2, 3), np.float32), "aux": [np.ones(2), {"b": np.arange(3)}]}
    r = compare(a, e)
    assert r.passed
    assert [o.path for o in r.outputs] == ["['logits']", "['aux'][0]", "['aux'][1]['b']"]


def test_bare_array_has_empty_path():
    assert only(compare(np.ones(3), np.ones(3))).path == ""


def test_missing_and_extra_keys_are_their_own_failures():
    r = compare({"a": np.ones(2), "extra": np.ones(1)}, {"a": np.ones(2), "logits": np.ones(4)})
    by_path = {o.path: o for o in r.outputs}
    assert by_path["['a']"].passed
    assert "missing output" in by_path["['logits']"].problem
    assert "'logits'" in by_path["['logits']"].problem
    assert by_path["['logits']"].expected_shape == (4,)
    assert "unexpected output" in by_path["['extra']"].problem
    assert not r.passed and len(r.failed) == 2


def test_sequence_length_mismatch_names_the_index():
    r = compare([np.ones(2), np.ones(2)], [np.ones(2), np.ones(2), np.ones(3)])
    assert [o.path for o in r.failed] == ["[2]"]
    assert "actual has 2 outputs, expected 3" in r.failed[0].problem


def test_mapping_against_sequence_is_a_structure_problem():
    oc = only(compare({"a": np.ones(1)}, [np.ones(1)]))
    assert "structure differs" in oc.problem and "mapping" in oc.problem


def test_shape_checked_before_values():
    oc = only(compare(np.ones((2, 3)), np.ones((3, 2))))
    assert not oc.passed
    assert oc.problem == "shape differs: actual (2, 3), expected (3, 2)"
    assert oc.max_abs is None                      # values never compared


def test_no_broadcasting():
    assert "shape differs" in only(compare(np.ones((1, 3)), np.ones(3))).problem


def test_float_against_int_is_a_dtype_problem():
    oc = only(compare(np.ones(3, np.float32), np.ones(3, np.int64)))
    assert not oc.passed and "dtype differs" in oc.problem


def test_float32_against_float64_is_allowed_and_noted():
    e = np.linspace(0, 1, 50)
    oc = only(compare(e.astype(np.float32), e))
    assert oc.passed
    assert any("float32 compared against float64" in n for n in oc.notes)
    assert oc.tolerance.source.startswith("built-in float32")   # the less precise dtype judges


def test_python_scalars_take_the_other_dtype():
    oc = only(compare(0.5, np.float32(0.5)))
    assert oc.passed and oc.notes == []


def test_flat_list_of_numbers_is_one_array():
    oc = only(compare([1.0, 2.0, 3.0], np.array([1.0, 2.0, 3.5])))
    assert oc.path == "" and oc.mismatched == 1


def test_bad_tolerance_argument_says_what_to_pass():
    with pytest.raises(TypeError, match="Tolerance"):
        compare(np.ones(1), np.ones(1), tolerance=1e-3)


# ----------------------------------------------------------------- values


def test_integers_and_bools_exact_even_with_loose_tolerance():
    loose = Tolerance(rtol=0.5, atol=10, source="argument")
    oc = only(compare(np.array([1, 2, 3]), np.array([1, 2, 4]), tolerance=loose))
    assert not oc.passed and oc.mismatched == 1
    assert oc.max_abs_index == (2,)
    assert "compare exactly" in oc.tolerance.source
    assert only(compare(np.array([True, False]), np.array([True, True]))).mismatched == 1


def test_int_widths_compared_exactly_with_a_note():
    oc = only(compare(np.arange(4, dtype=np.int32), np.arange(4, dtype=np.int64)))
    assert oc.passed and "int32 compared against int64" in oc.notes[0]


def test_nan_only_equal_with_equal_nan():
    a = np.array([1.0, np.nan], np.float32)
    assert not compare(a, a.copy(), tolerance=PLAIN).passed
    assert compare(a, a.copy(), tolerance=PLAIN, equal_nan=True).passed
    oc = only(compare(a, np.array([1.0, 2.0], np.float32), tolerance=PLAIN, equal_nan=True))
    assert oc.mismatched == 1 and any("NaN" in n for n in oc.notes)


def test_infinities_must_match_in_sign():
    a = np.array([np.inf, -np.inf, 1.0])
    assert compare(a, a.copy(), tolerance=PLAIN).passed
    oc = only(compare(a, np.array([np.inf, np.inf, 1.0]), tolerance=PLAIN))
    assert oc.mismatched == 1
    oc = only(compare(np.array([1e308]), np.array([np.inf]),
                      tolerance=Tolerance(1.0, 1e308, source="argument")))
    assert not oc.passed
    assert oc.min_atol == math.inf                # no tolerance fixes an infinity mismatch


def test_size_zero_and_scalars():
    assert compare(np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32)).passed
    assert only(compare(np.float64(1.0), np.float64(1.0 + 1e-12))).passed


def test_scaled_rule_judges_against_the_output_magnitude():
    """Seed 004's numbers: relative 1.5e-6 fails a plain rtol 1.3e-6, passes a scaled rule."""
    e = np.array([729026.4375, 12.0, -3.0], np.float32)
    a = np.array([729027.5625, 12.0, -3.0], np.float32)
    plain = only(compare(a, e, tolerance=PLAIN))
    assert not plain.passed and plain.max_ulp == 18
    scaled = only(compare(a, e, tolerance=Tolerance(1.3e-6, 1e-5, scale=1e-5, source="s")))
    assert scaled.passed and scaled.scale == pytest.approx(729026.4375)
    # the same absolute error on a small element also passes: it is judged against max|e|
    a2 = e.copy()
    a2[1] += 1.125
    assert compare(a2, e, tolerance=Tolerance(1.3e-6, 1e-5, scale=1e-5, source="s")).passed
    assert not compare(a2, e, tolerance=PLAIN).passed


def test_scale_that_grows_after_a_suspect_chunk():
    """A chunk that looks bad under the running maximum is re-judged with the final one."""
    blocking = Blocking(chunk=4)
    e = np.array([1, 1, 1, 1, 1, 1, 1, 1000], np.float32)
    a = e.copy()
    a[0] += 0.5                                   # 0.5 <= 1e-3 * 1000 only with the final scale
    tol = Tolerance(0.0, 0.0, scale=1e-3, source="s")
    assert compare(a, e, tolerance=tol, blocking=blocking).passed
    a[0] += 0.6
    oc = only(compare(a, e, tolerance=tol, blocking=blocking))
    assert oc.mismatched == 1 and oc.max_abs_index == (0,)


def test_max_mismatch_fraction_and_its_min_atol():
    e = np.zeros(100, np.float32)
    a = e.copy()
    a[:3] = [0.5, 0.2, 0.1]
    tol = Tolerance(0.0, 0.01, max_mismatch_fraction=0.02, source="format")
    oc = only(compare(a, e, tolerance=tol, full_stats=True))
    assert not oc.passed and oc.mismatched == 3
    # the smallest atol= *argument*: an explicit atol is the plain rule, where no element may
    # stay out, so the worst one decides (not the third worst, as under this rule)
    assert 0.5 <= oc.min_atol == pytest.approx(0.5)
    assert compare(a, e, tolerance=Tolerance(0.0, oc.min_atol, source="argument")).passed
    a[2] = 0
    assert compare(a, e, tolerance=tol).passed


def test_top1_agreement():
    e = np.array([[0.1, 0.9], [0.8, 0.2], [0.4, 0.6], [0.3, 0.7]], np.float32)
    a = e.copy()
    a[0] = [0.9, 0.1]
    # elements may all be out (max_mismatch_fraction=1): only top-1 agreement decides
    tol = Tolerance(0.0, 0.05, min_top1=0.9, max_mismatch_fraction=1.0, source="format")
    oc = only(compare(a, e, tolerance=tol))
    assert oc.top1_agreement == 0.75 and oc.top1_rows == 4 and not oc.passed
    assert compare(a, e, tolerance=Tolerance(0.0, 0.05, min_top1=0.75, max_mismatch_fraction=1.0,
                                             source="f")).passed


def test_top1_near_ties_are_not_evidence():
    # rows 0 and 1 are near-ties (margin 0.02 <= twice the allowed 0.05): their argmax is noise
    e = np.array([[0.49, 0.51], [0.51, 0.49], [0.1, 0.9], [0.8, 0.2]], np.float32)
    a = np.array([[0.51, 0.49], [0.49, 0.51], [0.1, 0.9], [0.8, 0.2]], np.float32)
    tol = Tolerance(0.0, 0.05, min_top1=0.9, source="format")
    oc = only(compare(a, e, tolerance=tol))
    assert oc.passed and oc.top1_agreement == 1.0 and (oc.top1_rows, oc.top1_near_ties) == (2, 2)
    assert any("2 near-tie row(s) left out" in n for n in oc.notes)
    # a clear row that flips still fails, and the note counts what was left out
    a[2] = [0.9, 0.1]
    oc = only(compare(a, e, tolerance=replace(tol, max_mismatch_fraction=1.0)))
    assert not oc.passed and oc.top1_agreement == 0.5
    assert any("over 2 row(s) is below the required 90%" in n and "near-tie" in n for n in oc.notes)
    # every row a near-tie: top-1 is not judged at all (no evidence either way)
    oc = only(compare(a[:2], e[:2], tolerance=tol))
    assert oc.passed and oc.top1_agreement is None
    assert any("not judged" in n for n in oc.notes)


def test_vacuous_comparison_fails_unless_allowed():
    e = np.full((3, 4), 3e-10, np.float32)            # random-weight feature maps are this small
    a = np.zeros_like(e)                               # an all-zero candidate
    oc = only(compare(a, e, tolerance=Tolerance(1.3e-6, 1e-5, source="argument")))
    assert oc.vacuous and not oc.passed and oc.problem.startswith("vacuous comparison")
    assert "allow_vacuous=True" in oc.problem and "3e-10" in oc.problem
    ok = only(compare(a, e, tolerance=Tolerance(1.3e-6, 1e-5, source="argument", allow_vacuous=True)))
    assert ok.passed and not ok.vacuous
    # the same pair under the default (scaled, no absolute term) rule is a real failure
    oc = only(compare(a, e))
    assert not oc.passed and not oc.vacuous and oc.mismatched == 12
    # an exactly-zero output is compared exactly, never vacuous; atol below the scale is fine
    assert compare(np.zeros(3, np.float32), np.zeros(3, np.float32), tolerance=Tolerance(0, 1e-5)).passed
    assert compare(e * 1e6, e * 1e6, tolerance=Tolerance(0, 1e-5)).passed


def test_bfloat16_judged_in_float32():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes (ships with TF)")
    e = np.array([1.0, 2.0, 3.0], dtype=ml_dtypes.bfloat16)
    a = np.array([1.0, 2.0, 3.015625], dtype=ml_dtypes.bfloat16)   # one bfloat16 ULP at 3 (2**-6)
    oc = only(compare(a, e, tolerance=PLAIN, full_stats=True))
    assert oc.mismatched == 1 and oc.max_ulp == 1.0


def test_strings_compare_exactly():
    oc = only(compare(np.array(["cat", "dog"]), np.array(["cat", "cow"])))
    assert oc.mismatched == 1 and oc.worst[0][0] == (1,)


# ----------------------------------------------------------------- statistics


@pytest.fixture
def known_pair():
    e = np.linspace(-3, 3, 640, dtype=np.float32).reshape(64, 10)
    a = e.copy()
    a[3, 4] += 0.01
    a[5, 5] *= 1.001
    return a, e


def test_statistics_of_a_known_pair(known_pair):
    a, e = known_pair
    oc = only(compare(a, e, tolerance=PLAIN))
    assert not oc.passed
    assert (oc.size, oc.mismatched) == (640, 2)
    assert oc.max_abs_index == (3, 4)
    assert oc.max_abs == pytest.approx(0.01, rel=1e-4)
    assert oc.max_abs_allowed == pytest.approx(1e-5 + 1.3e-6 * abs(float(e[3, 4])))
    assert oc.max_rel_index == (3, 4)
    assert oc.max_rel == pytest.approx(0.01 / abs(float(e[3, 4])), rel=1e-4)
    assert oc.mean_abs == pytest.approx(float(np.abs(a - e).mean()), rel=1e-5)
    ulp = np.spacing(np.abs(e[3, 4]))
    assert oc.max_ulp == pytest.approx(float(abs(a[3, 4] - e[3, 4]) / ulp))
    assert [w[0] for w in oc.worst] == [(3, 4), (5, 5)]
    assert oc.worst[0][1] == pytest.approx(float(a[3, 4]))
    assert oc.min_atol == pytest.approx(float(abs(a[3, 4] - e[3, 4])) - 1.3e-6 * abs(float(e[3, 4])),
                                        rel=1e-5)
    assert compare(a, e, tolerance=Tolerance(1.3e-6, oc.min_atol * 1.0001, source="t")).passed
    assert compare(a, e, tolerance=Tolerance(oc.min_rtol * 1.0001, 1e-5, source="t")).passed
    assert not compare(a, e, tolerance=Tolerance(oc.min_rtol * 0.99, 1e-5, source="t")).passed
    assert oc.error_histogram is None            # only with full_stats (report/HTML use)
    counts, edges = only(compare(a, e, tolerance=PLAIN, full_stats=True)).error_histogram
    assert sum(counts) == int(np.count_nonzero(a != e)) and len(edges) == len(counts) + 1
    # bins are binary exponents: 0.01 lies in [2**-7, 2**-6)
    k = next(i for i, c in enumerate(counts) if c and edges[i] > -2.5)
    assert edges[k] == pytest.approx(-7 * math.log10(2), abs=1e-4)


def test_passing_output_gets_cheap_stats_unless_full_stats(known_pair):
    _, e = known_pair
    a = e + np.float32(1e-7)
    oc = only(compare(a, e, tolerance=PLAIN))
    assert oc.passed and oc.max_abs is not None and oc.max_ulp is None
    oc = only(compare(a, e, tolerance=PLAIN, full_stats=True))
    assert oc.max_ulp is not None and oc.mean_abs is not None and oc.error_histogram is not None
    assert 0 < oc.min_atol <= PLAIN.atol and oc.min_rtol == 0.0   # passing: within bounds


def test_statistics_identical_across_chunk_sizes(known_pair):
    a, e = known_pair
    a = a.copy()
    a[60, 9] = np.nan
    ref = only(compare(a, e, tolerance=PLAIN)).to_dict()
    assert only(compare(a, e, tolerance=PLAIN, blocking=Blocking(chunk=13))).to_dict() == ref


def test_large_array_crosses_real_chunks():
    rng = np.random.default_rng(0)
    e = rng.standard_normal(scanning.CHUNK * 3 + 17).astype(np.float32)
    a = e.copy()
    a[scanning.CHUNK * 2 + 5] += 1.0
    oc = only(compare(a, e, tolerance=PLAIN))
    assert oc.mismatched == 1 and oc.max_abs_index == (scanning.CHUNK * 2 + 5,)
    mask = elementwise_close(a, e, PLAIN)
    assert np.flatnonzero(~mask).tolist() == [scanning.CHUNK * 2 + 5]


def test_tolerance_callable_gets_dtype_and_path():
    seen = []

    def tol(dtype, path):
        seen.append((np.dtype(dtype).name, path))
        return Tolerance(0.0, 0.5 if path == "['loose']" else 0.0, source=f"callable {path}")

    r = compare({"loose": np.ones(2, np.float32) + 0.25, "tight": np.ones(2)},
                {"loose": np.ones(2, np.float32), "tight": np.ones(2)}, tolerance=tol)
    assert r.passed
    assert sorted(seen) == [("float32", "['loose']"), ("float64", "['tight']")]
    assert r.outputs[0].tolerance.source == "callable ['loose']"


def test_to_dict_is_strict_json(known_pair):
    a, e = known_pair
    a = a.copy()
    a[0, 0] = np.inf
    r = compare({"x": a, "y": np.ones(2)}, {"x": e, "z": np.ones(2)}, tolerance=PLAIN)
    r.meta["runs"] = 3
    d = json.loads(json.dumps(r.to_dict(), allow_nan=False))
    x = d["outputs"][0]
    assert x["tolerance"]["source"] == "argument" and x["tolerance"]["rule"] == "elementwise"
    assert x["min_atol"] == "inf" and x["max_abs_index"] == [3, 4]
    assert d["passed"] is False and d["meta"] == {"runs": 3}


def test_public_name_is_callable_whatever_the_import_order():
    import pytest_modelparity

    assert pytest_modelparity.compare(np.ones(2), np.ones(2)).passed


# --------------------------------------------------------------------------- short path
# A failing output's statistics are computed on a superset of the elements that can still
# change them (verdict.statistics.StatsAcc); they must equal the full computation exactly.


def _failing_pairs():
    rng = np.random.default_rng(7)
    n = 3000
    e = (rng.standard_normal(n) * 10).astype(np.float32)
    noisy = (e + e * rng.uniform(-5e-7, 5e-7, n).astype(np.float32)).astype(np.float32)
    bad = noisy.copy()
    bad[rng.choice(n, 30, replace=False)] *= np.float32(1.001)
    yield "spread", bad, e, PLAIN
    ties = bad.copy()
    ties[[5, 700, 701, 2999]] = e[[5, 700, 701, 2999]] + np.float32(4.0)   # equal excess
    e_t = e.copy()
    e_t[[5, 700, 701, 2999]] = np.float32(2.0)
    ties[[5, 700, 701, 2999]] = np.float32(6.0)
    yield "ties in excess, rel and ulp", ties, e_t, PLAIN
    zeros = bad.copy()
    e_z = e.copy()
    e_z[100:400] = 0.0
    zeros[100:300] = 0.0                 # 0/0: skipped; [300:400] tiny values over zero
    zeros[300:400] = np.float32(3e-6)
    yield "zeros and tiny values (rel inf)", zeros, e_z, PLAIN
    sub = bad.copy()
    e_s = e.copy()
    e_s[50:90] = np.float32(1e-40)       # subnormal expected values
    sub[50:90] = np.float32(3e-40)
    yield "subnormals", sub, e_s, PLAIN
    late = noisy.copy()
    late[-3:] += np.float32(0.5)         # failures only in the last chunk
    yield "failures only at the end", late, e, PLAIN
    barely = noisy.copy()
    b_ = (np.abs(e[::97]) * np.float32(1.3e-6) + np.float32(1e-5)).astype(np.float32)
    barely[::97] = e[::97] + np.nextafter(b_, np.float32(np.inf)) * np.float32(1.0000001)
    yield "barely failing elements", barely, e, PLAIN
    nan = bad.copy()
    nan[1234] = np.nan
    yield "a NaN in one chunk", nan, e, PLAIN
    yield "scaled rule", bad, e, Tolerance(1.3e-6, 1e-5, scale=1e-5, source="s")
    yield "float16", bad.astype(np.float16), e.astype(np.float16), Tolerance(1e-3, 1e-5,
                                                                               source="a")
    yield "float32 vs float64", bad, e.astype(np.float64), PLAIN
    yield "float64", bad.astype(np.float64) * (1 + 1e-9), e.astype(np.float64), \
        Tolerance(1e-7, 1e-7, source="a")
    try:
        import ml_dtypes
    except ImportError:                  # ships with TensorFlow; the other cases still run
        pass
    else:
        off = noisy.copy()
        off[::37] *= np.float32(1.1)     # bfloat16's own rtol is 1.6e-2
        yield "bfloat16", off.astype(ml_dtypes.bfloat16), e.astype(ml_dtypes.bfloat16), \
            Tolerance(1.6e-2, 1e-5, source="a")
    big = e * np.float32(1000)
    big_a = (big + big * rng.uniform(-1e-6, 1e-6, n).astype(np.float32)).astype(np.float32)
    big_a[::50] *= np.float32(1.001)
    yield "large values: the rtol part of the bound matters", big_a, big, PLAIN
    many = e * np.float32(1.01)
    yield "every element out", many, e, PLAIN


@pytest.mark.parametrize("chunk,batch", [(64, 1 << 15), (257, 40), (1 << 16, 1 << 15)])
def test_short_path_statistics_equal_the_full_computation(chunk, batch):
    short = Blocking(chunk=chunk, subset_batch=batch)
    for name, a, e, tol in _failing_pairs():
        fast = only(compare(a, e, tolerance=tol, blocking=short)).to_dict()
        full = only(compare(a, e, tolerance=tol, blocking=replace(short, short_stats=False))).to_dict()
        assert not full["passed"], name
        assert fast == full, name
        assert fast["mismatched"] == np.count_nonzero(~elementwise_close(a, e, tol)), name


def test_short_path_is_taken(monkeypatch):
    """The equality test above proves nothing if every chunk took the full path."""
    calls = {"subset": 0, "full": 0}
    orig_sub, orig_full = statistics.StatsAcc.add_subset, statistics.StatsAcc.full_chunk

    def add_subset(self, *args):
        calls["subset"] += 1
        return orig_sub(self, *args)

    def full_chunk(self, *args, **kw):
        calls["full"] += 1
        return orig_full(self, *args, **kw)

    monkeypatch.setattr(statistics.StatsAcc, "add_subset", add_subset)
    monkeypatch.setattr(statistics.StatsAcc, "full_chunk", full_chunk)
    name, a, e, tol = next(iter(_failing_pairs()))
    only(compare(a, e, tolerance=tol, blocking=Blocking(chunk=64)))
    assert calls["subset"] > 2 * calls["full"] > 0


def test_worst_ties_go_to_the_lowest_index():
    e = np.zeros(200, np.float32)
    a = e.copy()
    a[[190, 3, 150, 40, 77, 120, 9]] = 1.0          # seven equal errors, five shown
    oc = only(compare(a, e, tolerance=PLAIN, blocking=Blocking(chunk=16)))
    assert [w[0] for w in oc.worst] == [(3,), (9,), (40,), (77,), (120,)]
    assert oc.max_abs_index == (3,) and oc.max_rel_index == (3,)
