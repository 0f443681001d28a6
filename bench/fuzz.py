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

``--plant FACTOR`` (issue 47): after the drawing, for every ``--plant-every``-th model that
passed on a format, the kernel whose x FACTOR moves the Keras model's outputs most is planted
into the converted file itself (its float32 bytes found in the .tflite, the .onnx or the tfjs
weight shards in the layout that format stores them, and rewritten in a copy), and the copy is
judged against the clean model by the default verdict. The figure: caught or missed, by how
far the plant moves the outputs (max |change| / scale of the float32 Keras model), binned.

Diversity (issue 46), read from each drawn model's own code: distinct layer and op kinds,
layers per model, the longest branch and the draws that join two branches of two or more ops
each, the share of draws holding each catalogue entry's trigger (its signature, any format);
and defects (distinct failures) per hour of drawing.
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


def diversity(draws: list) -> dict:
    """What the run drew, from each model's source and steps (nothing built)."""
    import re

    from pytest_modelparity.fuzz.known_defects import CATALOGUE

    kinds: dict[str, int] = {}
    ops, longest, two_multi, sources = [], [], 0, set()
    triggers = {entry.name: 0 for entry in CATALOGUE}
    for drawn in draws:
        source = drawn.source()
        sources.add(source)
        found = re.findall(r"keras\.(?:layers|ops)\.(\w+)", source)
        ops.append(len(found))
        for kind in set(found):
            kinds[kind] = kinds.get(kind, 0) + 1
        layers = drawn.layers
        branches = [(len(s.left), len(s.right)) for s in layers if type(s).__name__ == "Branch"]
        longest.append(max((max(b) for b in branches), default=0))
        two_multi += any(min(b) >= 2 for b in branches)
        for entry in CATALOGUE:
            triggers[entry.name] += bool(entry.signature(layers))
    n = max(len(draws), 1)
    return {"draws": len(draws), "distinct_sources": len(sources), "distinct_kinds": len(kinds),
            "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
            "ops_per_model": {"median": statistics.median(ops) if ops else None, "max": max(ops, default=0)},
            "longest_branch_ops": max(longest, default=0),
            "draws_with_two_multi_op_branches": two_multi,
            "trigger_share": {k: round(v / n, 4) for k, v in triggers.items()}}


def _layouts(kernel, fmt: str) -> list:
    """The arrays a format stores ``kernel`` (a Keras kernel, float32) as, most likely first."""
    import numpy as np

    k = np.ascontiguousarray(kernel, dtype="<f4")
    out = [k]
    if k.ndim == 2:
        out.append(np.ascontiguousarray(k.T))                             # TFLite FullyConnected [units, in]
    if k.ndim == 4:
        out.append(np.ascontiguousarray(k.transpose(3, 0, 1, 2)))         # TFLite conv OHWI
        out.append(np.ascontiguousarray(k.transpose(3, 2, 0, 1)))         # ONNX conv OIHW
        out.append(np.ascontiguousarray(k.transpose(2, 3, 0, 1).reshape(-1, 1, *k.shape[:2])))  # ONNX depthwise
        out.append(np.ascontiguousarray(k.transpose(2, 3, 0, 1)))         # ONNX conv-transpose (Keras HWOI)
    if k.ndim == 3:
        out.append(np.ascontiguousarray(k.transpose(2, 0, 1)))            # ONNX Conv1D OIW
        out.append(np.ascontiguousarray(k.transpose(2, 1, 0)))
    return out


def plant_in_file(folder: Path, fmt: str, kernel, factor: float) -> Path | None:
    """A copy of the converted model (``folder``) with ``kernel``'s bytes times ``factor``, or
    None where its bytes are not found exactly once in one file (folded, split or packed)."""
    import shutil

    import numpy as np

    files = [p for p in folder.rglob("*") if p.is_file() and p.suffix in (".tflite", ".onnx", ".bin")]
    for layout in _layouts(kernel, fmt):
        needle = layout.tobytes()
        hits = [(p, p.read_bytes()) for p in files]
        hits = [(p, data) for p, data in hits if data.count(needle) == 1]
        if len(hits) != 1:
            continue
        path, data = hits[0]
        planted = (layout.astype(np.float64) * factor).astype("<f4").tobytes()
        copy = folder.parent / f"{folder.name}-planted"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(folder, copy)
        (copy / path.relative_to(folder)).write_bytes(data.replace(needle, planted))
        return copy
    return None


def plant_phase(passed: list, factor: float, budget_s: float, workdir: str) -> dict:
    """Plant ``factor`` into converted files of passing (drawn, format) pairs; caught by move."""
    import numpy as np

    from pytest_modelparity import errors, export_model, load_model
    from pytest_modelparity.checks.assertions import assert_outputs_close
    from pytest_modelparity.checks.power import output_effect

    start, rows = time.monotonic(), []
    for i, (drawn, fmt) in enumerate(passed):
        if time.monotonic() - start > budget_s:
            break
        model = drawn.build()
        batch = drawn.batch()
        inputs = batch if len(batch) > 1 else batch[0]
        clean = model(inputs)
        best = None
        for w in [w for w in model.weights if len(w.shape) >= 2 and "float" in str(w.dtype)][-12:]:
            original = np.asarray(w.numpy())
            w.assign(original * np.asarray(factor, original.dtype))
            move = output_effect(model(inputs), clean)
            w.assign(original)
            if best is None or move > best[0]:
                best = (move, w, original)
        if best is None or best[0] == 0.0:
            continue
        move, w, original = best
        folder = Path(workdir) / f"plant-{i}"
        try:
            path = Path(export_model(model, fmt, folder / fmt.replace(":", "_")))
        except errors.ExportError:
            continue
        root = path if path.is_dir() else path.parent
        copy = plant_in_file(root, fmt, original, factor)
        if copy is None:
            rows.append({"format": fmt, "move": move, "found": False})
            continue
        candidate = load_model(copy if path.is_dir() else copy / path.name, fmt.split(":")[0])
        try:
            assert_outputs_close(candidate, model, inputs=inputs)
            caught = False
        except errors.ParityError:
            caught = True
        finally:
            getattr(candidate, "close", lambda: None)()
        rows.append({"format": fmt, "move": move, "found": True, "caught": caught, "kernel": w.path})
    bins = [(0, 1e-6), (1e-6, 2e-6), (2e-6, 4e-6), (4e-6, 8e-6), (8e-6, float("inf"))]
    table = {}
    for lo, hi in bins:
        mine = [r for r in rows if r["found"] and lo <= r["move"] < hi]
        table[f"{lo:g}..{hi:g}"] = {"planted": len(mine), "caught": sum(r["caught"] for r in mine)}
    found = [r for r in rows if r["found"]]
    caught_moves = sorted(r["move"] for r in found if r["caught"])
    missed_moves = sorted(r["move"] for r in found if not r["caught"])
    return {"factor": factor, "tried": len(rows), "found_in_file": len(found), "by_move": table,
            "smallest_move_caught": caught_moves[0] if caught_moves else None,
            "largest_move_missed": missed_moves[-1] if missed_moves else None,
            "per_format": {f: {"planted": sum(r["format"] == f for r in found),
                               "caught": sum(r["format"] == f and r["caught"] for r in found)}
                           for f in sorted({r["format"] for r in found})},
            "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--formats", default="tflite,onnx,tfjs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-models", type=int, default=100000)
    parser.add_argument("--shrink-seconds", type=float, default=90.0)
    parser.add_argument("--models-per-child", type=int, default=200, help="a new child process after this many")
    parser.add_argument("--out", default="fuzz-bench.json")
    parser.add_argument("--plant", type=float, default=None, help="plant this kernel factor into converted files")
    parser.add_argument("--plant-every", type=int, default=2, help="every N-th passing model of each format")
    parser.add_argument("--plant-minutes", type=float, default=15.0)
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

    draws: list = []
    passes: list = []

    def visit(drawn) -> None:
        draws.append(drawn)
        for o in worker.check(drawn, formats, workdir=work):
            rows.append({"format": o.format, "status": o.status, "cause": o.cause, "known": o.known,
                         "seconds": round(o.seconds, 3), "ratio": o.ratio, "layers": len(drawn.layers)})
            if o.status in ("fail", "error") and o.key not in failures:
                failures[o.key] = (drawn, o)
            if o.status == "pass":
                passes.append((drawn, o.format))
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
                     "conditions": worker.conditions,  # oneDNN, XNNPACK, CPU: what the child ran under (issue 46)
                     "comparisons": sum(r["status"] in ("pass", "fail") for r in rows),
                     "defects_per_hour": {"distinct_failures": round(len(failures) / (elapsed / 3600), 2),
                                          "new": round(sum(not o.known for _, o in failures.values())
                                                       / (elapsed / 3600), 2)},
                     "diversity": diversity(draws)}
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
    if args.plant:
        every = [pair for i, pair in enumerate(passes) if i % max(args.plant_every, 1) == 0]
        summary["plant"] = plant_phase(every, args.plant, args.plant_minutes * 60, work)
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
    print(json.dumps({k: ({kk: vv for kk, vv in v.items() if kk != "rows"} if k == "plant" else v)
                      for k, v in summary.items() if k != "shrinks"}, indent=1))
    for s in shrinks:
        print(f"{s['key']} known={s['known']}: {s['before']} -> {s['after']} layers, {s['checks']} checks, "
              f"{s['seconds']} s; recheck {s['recheck']}\n  {s['minimal']}")


if __name__ == "__main__":
    main()
