"""Bench: a warm session's time with and without ``gc.freeze`` after TensorFlow's import.

TensorFlow and Keras leave ~300,000 tracked objects that live as long as the process; without
the freeze every full collection walks them again (``runtime/tf_import``). This runs the same
warm session (``session_cost.py``'s digits CNN and suite: one ``assert_outputs_close`` each for
saved_model, tflite and onnx; here with a conftest that imports Keras first, as most do) in fresh
processes, alternating the plugin as it is with the plugin whose ``gc.freeze`` is made a no-op
in that process, and prints the medians of the session's time and of the time the collector
took (``gc.callbacks``). The export cache is filled by one untimed session first, and bytecode
caches are written and read as on a user's machine.

    .venv/bin/python bench/gc_freeze.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent



def session(workdir: Path, cache: Path, freeze: bool) -> dict:
    import gc

    if not freeze:
        gc.freeze = lambda: None  # the plugin's calls do nothing in this process
    spent = [0.0]
    started: list[float] = []

    def timing(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            spent[0] += time.perf_counter() - started.pop()

    gc.callbacks.append(timing)
    import pytest

    t0 = time.perf_counter()
    code = pytest.main([str(workdir), "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                        "--modelparity-formats=saved_model,tflite,onnx", f"--modelparity-cache-dir={cache}",
                        f"--rootdir={workdir}"])
    return {"total_s": time.perf_counter() - t0, "gc_s": spent[0], "exit": int(code),
            "frozen": gc.get_freeze_count()}


def _child(*args: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode caches as on a user's machine
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env, timeout=900)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if proc.returncode != 0 or not last.startswith("{"):
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(last)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--_session", nargs=3)
    args = parser.parse_args()
    if args._session:
        print(json.dumps(session(Path(args._session[0]), Path(args._session[1]), args._session[2] == "freeze")))
        return
    sys.path.insert(0, str(ROOT / "bench"))
    from session_cost import SUITE, build  # the same net and suite as the session bench

    with tempfile.TemporaryDirectory(prefix="gc-freeze-") as tmp:
        root = Path(tmp)
        model = root / "digits.keras"
        build("digits", model)
        work = root / "suite"
        work.mkdir()
        (work / "conftest.py").write_text("import keras  # noqa: F401 - as most conftests do\n")
        (work / "test_cost.py").write_text(SUITE.format(model=str(model), batch=str(model.with_suffix(".npy"))))
        cache = root / "cache"
        _child("--_session", str(work), str(cache), "freeze")  # fills the export cache, writes bytecode
        runs: dict[str, list[dict]] = {"freeze": [], "no freeze": []}
        for _ in range(args.repeats):
            for kind in runs:
                runs[kind].append(_child("--_session", str(work), str(cache), "freeze" if kind == "freeze" else "none"))
    print(f"warm digits session, {args.repeats} runs each, alternating; medians")
    for kind, rs in runs.items():
        print(f"  {kind:9s} total {statistics.median(r['total_s'] for r in rs):5.2f} s   "
              f"gc {statistics.median(r['gc_s'] for r in rs):5.2f} s   frozen objects "
              f"{statistics.median(r['frozen'] for r in rs):.0f}   exits {sorted({r['exit'] for r in rs})}")
    print(json.dumps(runs))


if __name__ == "__main__":
    main()
