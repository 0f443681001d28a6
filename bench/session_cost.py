"""Bench: where a plugin session's time and memory go, per phase, against the bare converters.

For each net (a CNN trained on scikit-learn digits, MobileNetV2 at 64 px with trained-like
batch-norm statistics, MobileNetV3Small at 64 px), saved once as a ``.keras`` file, this runs in
fresh processes, one after another, in the same run:

* **bare**: import TensorFlow, load the file, export each format with the converters
  themselves (``model.export``, ``TFLiteConverter.from_concrete_functions``,
  ``tf2onnx.convert.from_function``), load each and run it once (``tf.saved_model.load``,
  LiteRT's ``Interpreter``, onnxruntime);
* **cold**: a pytest session (``pytest.main`` in that process) with one
  ``assert_outputs_close`` per format on a fresh export cache;
* **warm**: the same session again on that cache.

A session's phases are timed by wrapping the plugin's functions in that process (self time:
a phase nested in another is taken out of it): importing TF, loading the reference, the
twin that measures the noise floor (built and run; on a warm cache read from the floor cache
instead), the cache keys, starting the export worker and handing
the model over, each export (with its validation, in the worker; the first includes the
worker's own TensorFlow import), each load, the runs, the comparison (and report), the
diagnosis (failing tests only). Memory: the process's peak RSS and the export worker's
(its VmHWM), and the process tree's peak PSS (``TreePss``: sampled, shared pages counted once). Medians over ``--repeats`` runs. Every child writes and reads bytecode caches, as a
user's machine does, primed once before the timed runs (``_prime_bytecode``), whatever
``PYTHONDONTWRITEBYTECODE`` says in the caller's environment. In a session TensorFlow is imported where
the plugin first needs it (loading the ``.keras`` file), and timed there as ``import TF``.

    .venv/bin/python bench/session_cost.py [--nets digits,mobilenet_v2,mobilenet_v3] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORMATS = ("saved_model", "tflite", "onnx")
NETS = ("digits", "mobilenet_v2", "mobilenet_v3")


# -- the nets (built once, saved as .keras) --------------------------------------------------
def build(net: str, path: Path) -> None:
    import numpy as np

    sys.path.insert(0, str(ROOT / "tests"))
    import keras

    if net == "digits":
        from digits import digits_cnn

        model, _, x_test = digits_cnn(seed=0)
        batch = x_test[:8]
    elif net == "mobilenet_v2":
        from families import _trained_like_batchnorm

        keras.utils.set_random_seed(0)
        model = keras.applications.MobileNetV2(input_shape=(64, 64, 3), weights=None, classes=10)
        _trained_like_batchnorm(model)
        batch = np.random.default_rng(0).uniform(-1, 1, (4, 64, 64, 3)).astype("float32")
    elif net == "mobilenet_v3":
        from families import mobilenet_v3_small

        model, batch = mobilenet_v3_small()
    else:
        raise SystemExit(f"unknown net {net!r}; one of {', '.join(NETS)}")
    model.save(str(path))
    np.save(str(path.with_suffix(".npy")), batch)


# -- memory -----------------------------------------------------------------------------------
def _rss() -> int:
    with open("/proc/self/status", "rb") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(b"VmRSS:"))


def _peaks(worker_peak: int = 0) -> dict:
    """The process's peak RSS and the export worker's (its VmHWM, read by the plugin; not
    RUSAGE_CHILDREN, which counts a forked child's copy of the parent's pages)."""
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_mb": round(self_kb / 1024), "worker_peak_mb": round(worker_peak / 2**20)}


class TreePss:
    """The peak of the process tree's PSS (this process and every descendant, the export worker
    included), sampled every 0.2 s in a thread. PSS shares a page among the processes mapping
    it, so the tree's sum is the physical memory it holds; summing RSS would count the
    libraries both processes map (336 MB of TensorFlow's and Keras' file pages) twice."""

    def __init__(self, every: float = 0.2) -> None:
        import threading

        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    @staticmethod
    def _tree(pid: int) -> list[int]:
        pids, todo = [], [pid]
        while todo:
            p = todo.pop()
            pids.append(p)
            try:
                for task in os.listdir(f"/proc/{p}/task"):
                    with open(f"/proc/{p}/task/{task}/children") as fh:
                        todo += [int(c) for c in fh.read().split()]
            except OSError:
                continue
        return pids

    @staticmethod
    def _pss_kb(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
                return next((int(line.split()[1]) for line in fh if line.startswith(b"Pss:")), 0)
        except OSError:  # exited between the listing and the read
            return 0

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.peak_kb = max(self.peak_kb, sum(self._pss_kb(p) for p in self._tree(os.getpid())))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return round(self.peak_kb / 1024)


# -- bare converters ---------------------------------------------------------------------------
def bare(model_path: Path, out: Path) -> dict:
    import numpy as np

    phases: dict[str, float] = {}
    tree = TreePss()
    t0 = time.perf_counter()

    def mark(name: str, since: float) -> float:
        now = time.perf_counter()
        phases[name] = phases.get(name, 0.0) + now - since
        return now

    t = time.perf_counter()
    import keras
    import tensorflow as tf

    t = mark("import TF", t)
    model = keras.saving.load_model(str(model_path), compile=False)
    batch = np.load(str(model_path.with_suffix(".npy")))
    t = mark("load reference", t)
    model(batch)
    t = mark("runs", t)
    spec = tf.TensorSpec((None,) + tuple(model.inputs[0].shape[1:]), tf.float32)
    fn = tf.function(lambda x: model(x, training=False))
    concrete = fn.get_concrete_function(spec)
    model.export(str(out / "saved_model"), verbose=False)
    t = mark("export saved_model", t)
    tflite = tf.lite.TFLiteConverter.from_concrete_functions([concrete], model).convert()
    (out / "model.tflite").write_bytes(tflite)
    t = mark("export tflite", t)
    import tf2onnx

    proto, _ = tf2onnx.convert.from_function(fn, input_signature=[spec], opset=17)
    (out / "model.onnx").write_bytes(proto.SerializeToString())
    t = mark("export onnx", t)
    loaded = tf.saved_model.load(str(out / "saved_model"))
    t = mark("load saved_model", t)
    loaded.serve(tf.constant(batch))
    t = mark("runs", t)
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(out / "model.tflite"))
    detail = interp.get_input_details()[0]
    interp.resize_tensor_input(detail["index"], batch.shape)
    interp.allocate_tensors()
    t = mark("load tflite", t)
    interp.set_tensor(detail["index"], batch)
    interp.invoke()
    interp.get_tensor(interp.get_output_details()[0]["index"])
    t = mark("runs", t)
    import onnxruntime as ort

    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    t = mark("load onnx", t)
    sess.run(None, {sess.get_inputs()[0].name: batch})
    mark("runs", t)
    return {"total_s": time.perf_counter() - t0, "phases": phases, **_peaks(), "tree_pss_mb": tree.stop()}


# -- a plugin session with its phases timed -----------------------------------------------------
class Phases:
    """Self time per phase: a phase started inside another is taken out of the outer one."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.rss: dict[str, int] = {}
        self._stack: list[list] = []
        self.worker_peak = 0

    def wrap(self, owner: object, attr: str, name) -> None:
        original = getattr(owner, attr)
        phases = self

        def timed(*args, **kwargs):
            label = name(*args, **kwargs) if callable(name) else name
            frame = [label, time.perf_counter(), 0.0, _rss()]
            phases._stack.append(frame)
            try:
                return original(*args, **kwargs)
            finally:
                worker_peak = getattr(args[0], "peak_rss", None) if args else None
                if isinstance(worker_peak, int):  # ExportProcess: the worker's VmHWM after this export
                    phases.worker_peak = max(phases.worker_peak, worker_peak)
                phases._stack.pop()
                took = time.perf_counter() - frame[1]
                phases.seconds[label] = phases.seconds.get(label, 0.0) + took - frame[2]
                phases.rss[label] = max(phases.rss.get(label, 0), _rss() - frame[3])
                if phases._stack:
                    phases._stack[-1][2] += took

        setattr(owner, attr, timed)


SUITE = textwrap.dedent('''
    import numpy as np
    import pytest
    from pytest_modelparity import assert_outputs_close

    @pytest.fixture(scope="session")
    def modelparity_source():
        return {model!r}

    @pytest.fixture(scope="session")
    def modelparity_dataset():
        return np.load({batch!r})

    def test_close(parity_candidate, parity_batch, parity_reference):
        assert_outputs_close(parity_candidate.predict(parity_batch), parity_reference, inputs=parity_batch)
''')


def session(model_path: Path, cache: Path, workdir: Path) -> dict:
    import pytest

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "conftest.py").write_text("")
    (workdir / "test_cost.py").write_text(SUITE.format(model=str(model_path),
                                                       batch=str(model_path.with_suffix(".npy"))))
    phases = Phases()
    tree = TreePss()
    t0 = time.perf_counter()

    class Timing:
        @pytest.hookimpl(tryfirst=True)
        def pytest_sessionstart(self, session):
            from pytest_modelparity import diagnose
            from pytest_modelparity.checks import assertions
            from pytest_modelparity.floor import measure as floor
            from pytest_modelparity.exports import cache, floor_cache, worker
            from pytest_modelparity.formats import base
            from pytest_modelparity.plugin import session as fixtures  # the session state: where the models are loaded

            def importing_tf_first(fn):  # TF is imported where the plugin first needs it: timed there
                def call(*args, **kwargs):
                    if "tensorflow" not in sys.modules:
                        start = time.perf_counter()
                        import keras  # noqa: F401
                        import tensorflow  # noqa: F401

                        phases.seconds["import TF"] = time.perf_counter() - start
                        if phases._stack:
                            phases._stack[-1][2] += time.perf_counter() - start
                    return fn(*args, **kwargs)
                return call

            fixtures._load_source = importing_tf_first(fixtures._load_source)
            phases.wrap(fixtures, "_load_reference", "load reference")
            phases.wrap(fixtures, "_load_source", lambda src, fmt, *a, **k: f"load {fmt}")
            phases.wrap(floor, "measure_floor", lambda model, kind, *a, **k: (
                "reordered twin (the sharper floor)" if kind == floor.FLOAT32_REORDERED else "twin (build + run)"))
            phases.wrap(floor_cache, "measured", "floor cache (key, read, write)")
            phases.wrap(cache.ExportCache, "key", "cache keys (hashing the weights)")
            phases.wrap(worker.ExportProcess, "_start", "start worker")
            phases.wrap(worker.ExportProcess, "_handover", "hand model over")
            phases.wrap(worker.ExportProcess, "_reply", lambda self, posted, fmt, path: f"export {fmt} (+validation, waited for)")
            phases.wrap(base.LoadedModel, "predict", "runs")
            phases.wrap(assertions, "assert_outputs_close", "comparison")
            phases.wrap(diagnose, "diagnose_comparison", "diagnosis")

    code = pytest.main([str(workdir), "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                        f"--modelparity-formats={','.join(FORMATS)}", f"--modelparity-cache-dir={cache}",
                        f"--rootdir={workdir}"], plugins=[Timing()])
    total = time.perf_counter() - t0
    return {"total_s": total, "exit": int(code), "phases": phases.seconds,
            "phase_rss_mb": {k: round(v / 2**20) for k, v in phases.rss.items()}, **_peaks(phases.worker_peak),
            "tree_pss_mb": tree.stop()}


# -- the driver ---------------------------------------------------------------------------------
def _child(*args: str) -> dict:
    # Bytecode caches as a user's machine keeps them: with PYTHONDONTWRITEBYTECODE set (as in
    # .ci/run) every session compiles the plugin's modules again and pytest rewrites Hypothesis'
    # 73 modules again (its pytest11 entry point marks them), 1.5-2 s that the bare converters,
    # reading site-packages' installed .pyc files, never pay.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env, timeout=1800)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if proc.returncode != 0 or not last.startswith("{"):
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(last)


def _prime_bytecode(root: Path) -> None:
    """Write the .pyc files a user's first session writes (the plugin's modules, pytest's rewrite
    of Hypothesis'), so that no timed run is the one that compiles them."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "pytest_modelparity")],
                   env=env, check=True, capture_output=True)
    (root / "prime").mkdir()
    (root / "prime" / "test_prime.py").write_text("def test_nothing():\n    pass\n")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "prime")],
                   env=env, check=True, capture_output=True, timeout=600)


def _fmt_phases(runs: list[dict]) -> dict[str, float]:
    names = sorted({k for r in runs for k in r["phases"]})
    return {k: statistics.median(r["phases"].get(k, 0.0) for r in runs) for k in names}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--_build", nargs=2)
    parser.add_argument("--_bare", nargs=2)
    parser.add_argument("--_session", nargs=3)
    args = parser.parse_args()
    if args._build:
        build(args._build[0], Path(args._build[1]))
        print("{}")
        return
    if args._bare:
        print(json.dumps(bare(Path(args._bare[0]), Path(args._bare[1]))))
        return
    if args._session:
        print(json.dumps(session(Path(args._session[0]), Path(args._session[1]), Path(args._session[2]))))
        return

    results = {}
    with tempfile.TemporaryDirectory(prefix="session-cost-") as tmp:
        root = Path(tmp)
        _prime_bytecode(root)
        for net in args.nets.split(","):
            model = root / f"{net}.keras"
            _child("--_build", net, str(model))
            runs: dict[str, list[dict]] = {"bare": [], "cold": [], "warm": []}
            for i in range(args.repeats):
                out = root / f"{net}-bare-{i}"
                out.mkdir()
                runs["bare"].append(_child("--_bare", str(model), str(out)))
                cache = root / f"{net}-cache-{i}"
                runs["cold"].append(_child("--_session", str(model), str(cache), str(root / f"{net}-s{i}c")))
                runs["warm"].append(_child("--_session", str(model), str(cache), str(root / f"{net}-s{i}w")))
            results[net] = runs
            bare_s = statistics.median(r["total_s"] for r in runs["bare"])
            print(f"\n== {net} ({args.repeats} run(s) each; medians)")
            for kind in ("bare", "cold", "warm"):
                total = statistics.median(r["total_s"] for r in runs[kind])
                peak = statistics.median(r["peak_mb"] for r in runs[kind])
                child = statistics.median(r["worker_peak_mb"] for r in runs[kind])
                tree = statistics.median(r["tree_pss_mb"] for r in runs[kind])
                bare_tree = statistics.median(r["tree_pss_mb"] for r in runs["bare"])
                exits = {r.get("exit", 0) for r in runs[kind]}
                print(f"  {kind:5s} total {total:6.1f} s ({total / bare_s:4.2f}x bare)  peak RSS {peak} MB, "
                      f"export worker {child} MB, process tree PSS {tree} MB ({tree / bare_tree:4.2f}x bare)  "
                      f"exit {sorted(exits)}")
                for name, secs in sorted(_fmt_phases(runs[kind]).items(), key=lambda kv: -kv[1]):
                    if secs >= 0.05:
                        print(f"      {name:34s} {secs:6.2f} s")
    print("\n" + json.dumps(results))


if __name__ == "__main__":
    main()
