"""Fuzz the converters for a while: models per minute per format, outcomes, false alarms,
shrink cost, memory.

    nice python bench/fuzz.py --minutes 20 --formats tflite,onnx,tfjs --seed 0 --out fuzz.json

Every FAIL is re-checked against a float64 run of the model (its float64 twin): a candidate
no farther from the float64 truth than 2x the Keras float32 model's own error is a false alarm
(a verdict bug; none may be tuned away). Each distinct failure is shrunk (``minimize``) and its
time and size recorded. Models are checked in a child process replaced every
``--models-per-child`` models (``fuzz/fuzz_worker.py``, as ``--modelparity-fuzz`` does).
Memory: this process's RSS and the child's after every model (the first 200 and the slope of
the child's within one child), the most any child held, and how many children ran.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def recheck_float64(drawn, fmt: str, workdir: str) -> dict:
    """How far the candidate is from the float64 truth, against the float32 model's own error."""
    import numpy as np

    from pytest_modelparity import export_model, load_model
    from pytest_modelparity.floor.keras_twin import float64_twin

    model = drawn.build()
    batch = drawn.batch()
    inputs = batch if len(batch) > 1 else batch[0]
    ref32 = model(inputs)
    ref32 = [np.asarray(r, dtype=np.float64) for r in (ref32 if isinstance(ref32, (list, tuple)) else [ref32])]
    twin = float64_twin(model)
    cast = [b.astype("float64") if b.dtype.kind == "f" else b for b in batch]
    ref64 = twin(cast if len(cast) > 1 else cast[0])
    ref64 = [np.asarray(r, dtype=np.float64) for r in (ref64 if isinstance(ref64, (list, tuple)) else [ref64])]
    path = export_model(model, fmt, Path(workdir) / f"recheck-{fmt}")
    candidate = load_model(path, fmt)
    try:
        feed = dict(zip([s.name for s in candidate.inputs], batch)) if len(batch) > 1 else inputs
        got = [np.asarray(v, dtype=np.float64) for v in candidate.predict(feed).values()]
    finally:
        candidate.close()
    worst = []
    for g, r32, r64 in zip(got, ref32, ref64):
        if g.shape != r64.shape:
            return {"false_alarm": False, "why": f"shape {g.shape} vs {r64.shape}"}
        scale = max(float(np.abs(r64).max()), 1e-30)
        own = float(np.abs(r32 - r64).max()) / scale
        cand = float(np.abs(g - r64).max()) / scale
        worst.append((cand, own))
    cand, own = max(worst)
    return {"false_alarm": cand <= 2 * max(own, 1e-7), "candidate_vs_float64": cand, "float32_vs_float64": own}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--formats", default="tflite,onnx,tfjs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-models", type=int, default=100000)
    parser.add_argument("--shrink-seconds", type=float, default=90.0)
    parser.add_argument("--models-per-child", type=int, default=200, help="a new child process after this many")
    parser.add_argument("--out", default="fuzz-bench.json")
    args = parser.parse_args()
    formats = tuple(args.formats.split(","))

    from pytest_modelparity.fuzz.fuzz_worker import FuzzWorker
    from pytest_modelparity.fuzz.model_draw import for_each_drawn, minimize

    work = tempfile.mkdtemp(prefix="fuzz-bench-")
    start = time.monotonic()
    rows: list[dict] = []
    rss: list[float] = []
    child_rss: list[float] = []
    failures: dict = {}
    worker = FuzzWorker(Path(work) / "child.log", models_per_child=args.models_per_child)

    def visit(drawn) -> None:
        for o in worker.check(drawn, formats, workdir=work):
            rows.append({"format": o.format, "status": o.status, "cause": o.cause, "known": o.known,
                         "seconds": round(o.seconds, 3), "ratio": o.ratio, "layers": len(drawn.layers)})
            if o.status in ("fail", "error") and o.key not in failures:
                failures[o.key] = (drawn, o)
        rss.append(rss_mb())
        child_rss.append(worker.rss_mb if worker.rss_mb is not None else float("nan"))
        if len(rss) % 25 == 0:
            print(f"{len(rss)} models, {time.monotonic() - start:.0f} s, rss {rss[-1]:.0f} MB, "
                  f"child {child_rss[-1]:.0f} MB ({len(worker.children)} children)", flush=True)

    for_each_drawn(visit, seed=args.seed, max_examples=args.max_models, deadline=start + args.minutes * 60)
    elapsed = time.monotonic() - start
    shrinks = []
    for key, (drawn, outcome) in failures.items():
        recheck = recheck_float64(drawn, outcome.format, work) if outcome.status == "fail" else {}
        t0, calls = time.monotonic(), [0]

        def same(candidate, outcome=outcome):
            calls[0] += 1
            (got,) = worker.check(candidate, [outcome.format], workdir=work)
            return got.key == outcome.key

        minimal = minimize(drawn, same, budget_s=args.shrink_seconds)
        shrinks.append({"key": list(key), "known": outcome.known, "resembles": outcome.resembles,
                        "note": outcome.note, "before": len(drawn.layers),
                        "after": len(minimal.layers), "checks": calls[0], "seconds": round(time.monotonic() - t0, 1),
                        "minimal": repr(minimal), "recheck": recheck, "text": outcome.text[:2000]})
    summary: dict = {"models": len(rss), "minutes": round(elapsed / 60, 2), "formats": {}, "refusals": {},
                     "shrinks": shrinks, "false_alarms": sum(bool(s["recheck"].get("false_alarm")) for s in shrinks),
                     "conditions": worker.conditions}  # oneDNN, XNNPACK, CPU: what the child ran under (issue 46)
    for fmt in formats:
        mine = [r for r in rows if r["format"] == fmt]
        ratios = [r["ratio"] for r in mine if r["status"] == "pass" and r["ratio"] is not None]
        summary["formats"][fmt] = {
            "models_per_minute": round(len(mine) / max(sum(r["seconds"] for r in mine) / 60, 1e-9), 1),
            "median_seconds": round(statistics.median(r["seconds"] for r in mine), 3) if mine else None,
            "outcomes": {s: sum(r["status"] == s for r in mine) for s in ("pass", "fail", "error", "refused")},
            "pass_ratio_median": round(statistics.median(ratios), 4) if ratios else None,
            "pass_ratio_max": round(max(ratios), 4) if ratios else None}
        for r in mine:
            if r["status"] == "refused":
                k = f"{fmt}: {r['known'] or r['cause']}"
                summary["refusals"][k] = summary["refusals"].get(k, 0) + 1
    worker.close()
    first = rss[:200]
    if len(first) >= 20:
        half = len(first) // 2
        summary["rss_mb"] = {"after_model_1": round(first[0]), f"after_model_{len(first)}": round(first[-1]),
                             "growth_mb_per_model_second_half": round((first[-1] - first[half]) / (len(first) - half), 2)}
    one_child = child_rss[:min(len(child_rss), args.models_per_child)]
    if len(one_child) >= 20:
        half = len(one_child) // 2
        summary["child_rss_mb"] = {
            "after_model_1": round(one_child[0]), f"after_model_{len(one_child)}": round(one_child[-1]),
            "growth_mb_per_model_second_half": round((one_child[-1] - one_child[half]) / (len(one_child) - half), 2),
            "most_any_child_held": round(max(child_rss)), "children": len(worker.children)}
    Path(args.out).write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "shrinks"}, indent=1))
    for s in shrinks:
        print(f"{s['key']} known={s['known']}: {s['before']} -> {s['after']} layers, {s['checks']} checks, "
              f"{s['seconds']} s; recheck {s['recheck']}\n  {s['minimal']}")


if __name__ == "__main__":
    main()
