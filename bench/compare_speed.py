"""How fast is compare() on 10 million float32 elements, against what people use today?

Times, on the same arrays in one process: a "read both arrays" baseline (``a.sum();
e.sum()``, and ``np.add(a, e, out=buf)``), ``np.allclose``, ``numpy.testing.assert_allclose``
(pass and fail), ``torch.testing.assert_close`` when torch is importable, and
``pytest_modelparity.verdict.compare`` on a passing pair (the default scaled rule, and an explicit
elementwise rtol/atol whose bound needs the per-element check) and on a failing pair (full
statistics, which only failing outputs pay for). Prints medians and ratios to the baseline.

Issue 2's targets: a passing compare within 2x of reading both arrays, a failing one with
full statistics within 4x. Issue 12's: ``assert_outputs_close`` passing within 2.5x, and
failing with its "Likely cause" hints (bounded: sampled, confirmed on every element) within 25x.

    .venv/bin/python bench/compare_speed.py [--n 10000000] [--repeat 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from pytest_modelparity import ParityError, assert_outputs_close
from pytest_modelparity.verdict.compare import compare
from pytest_modelparity.verdict.tolerances import Tolerance, default_tolerance


def median_ms(fn, repeat: int) -> float:
    fn()                                             # warm up (page faults, caches)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def expect_raise(fn):
    def run():
        try:
            fn()
        except AssertionError:
            return
        raise RuntimeError("expected a failure")
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000_000)
    p.add_argument("--repeat", type=int, default=15)
    args = p.parse_args()
    n, rep = args.n, args.repeat

    rng = np.random.default_rng(0)
    e = (rng.standard_normal(n) * 10).astype(np.float32)
    # passing pair: float-noise-sized differences (a few ULPs)
    close = (e + e * rng.uniform(-5e-7, 5e-7, n).astype(np.float32)).astype(np.float32)
    # failing pair: 1% of the elements off by 1e-3 relative (a real bug's size)
    bad = close.copy()
    idx = rng.choice(n, n // 100, replace=False)
    bad[idx] *= np.float32(1.001)

    plain = Tolerance(rtol=1.3e-6, atol=1e-5, source="argument")
    default = default_tolerance(np.float32)
    buf = np.empty_like(e)

    rows: list[tuple[str, float]] = []

    def add(name, fn):
        rows.append((name, median_ms(fn, rep)))

    add("baseline: a.sum(); e.sum()", lambda: (close.sum(), e.sum()))
    add("baseline: np.add(a, e, out=buf)", lambda: np.add(close, e, out=buf))
    add("np.allclose (pass)", lambda: np.allclose(close, e, rtol=1.3e-6, atol=1e-5))
    add("numpy.testing.assert_allclose (pass)",
        lambda: np.testing.assert_allclose(close, e, rtol=1.3e-6, atol=1e-5))
    add("numpy.testing.assert_allclose (fail)",
        expect_raise(lambda: np.testing.assert_allclose(bad, e, rtol=1.3e-6, atol=1e-5)))
    try:
        import torch
    except ImportError:
        print("torch not importable: torch.testing.assert_close not timed")
    else:
        ta, tb, te = torch.from_numpy(close), torch.from_numpy(bad), torch.from_numpy(e)
        add("torch.testing.assert_close (pass)", lambda: torch.testing.assert_close(ta, te))
        add("torch.testing.assert_close (fail)",
            expect_raise(lambda: torch.testing.assert_close(tb, te)))

    assert compare(close, e, tolerance=default).passed
    assert compare(close, e, tolerance=plain).passed
    assert not compare(bad, e, tolerance=plain).passed
    add(f"compare, pass, default {default.rule} rule",
        lambda: compare(close, e, tolerance=default))
    add("compare, pass, elementwise rtol=1.3e-6 atol=1e-5",
        lambda: compare(close, e, tolerance=plain))
    add("compare, pass, full_stats=True", lambda: compare(close, e, tolerance=plain,
                                                          full_stats=True))
    add("compare, fail (1% out), full statistics", lambda: compare(bad, e, tolerance=plain))
    # the same bug judged by the default scaled rule: 1e-3 relative is over scale * max|e|
    # for the larger elements only, so fewer are out, and the verdict pass runs to the end
    assert not compare(bad, e, tolerance=default).passed
    add(f"compare, fail, default {default.rule} rule", lambda: compare(bad, e, tolerance=default))

    # The assertion as a user calls it: compare, and on failure the text with its "Likely
    # cause" hints (rendered by str(), as pytest does). Each failing run perturbs one element
    # so it is a new failure (the diagnosis of an identical one is remembered).
    add("assert_outputs_close, pass (default rule)", lambda: assert_outputs_close(close, e))
    bumped = [0]

    def failing_with_hints() -> None:
        bumped[0] += 1
        bad[0] = e[0] + np.float32(bumped[0])
        try:
            assert_outputs_close(bad, e)
        except ParityError as exc:
            text = str(exc)
            assert "Mismatched elements" in text
            return
        raise RuntimeError("expected a failure")

    add("assert_outputs_close, fail, hints included", failing_with_hints)

    base_read = rows[0][1]
    base_add = rows[1][1]
    print(f"n = {n:,} float32 elements, median of {rep} runs (numpy {np.__version__})")
    print(f"{'':52s} {'ms':>8s} {'x sum':>7s} {'x add':>7s}")
    for name, ms in rows:
        print(f"{name:52s} {ms:8.2f} {ms / base_read:7.2f} {ms / base_add:7.2f}")
    t_pass = max(ms for name, ms in rows if name.startswith("compare, pass,")
                 and "full_stats" not in name)
    t_fail = max(ms for name, ms in rows if name.startswith("compare, fail"))
    print(f"targets: pass <= 2x read -> {t_pass / base_read:.2f}x (sum) / "
          f"{t_pass / base_add:.2f}x (add); fail with full stats <= 4x -> "
          f"{t_fail / base_read:.2f}x (sum) / {t_fail / base_add:.2f}x (add)")
    a_pass = dict(rows)["assert_outputs_close, pass (default rule)"]
    a_fail = dict(rows)["assert_outputs_close, fail, hints included"]
    print(f"issue 12 targets: assert_outputs_close pass <= 2.5x read -> {a_pass / base_read:.2f}x; "
          f"fail with hints <= 25x read -> {a_fail / base_read:.2f}x")


if __name__ == "__main__":
    main()
