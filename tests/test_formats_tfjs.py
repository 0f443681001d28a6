"""The tfjs format with real Node.js running real @tensorflow/tfjs (CPU and wasm backends).

Node.js missing or npm packages not installable -> these tests skip with the reason (the
plugin does the same for users). Models are tiny and exported once per module.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from pytest_modelparity import errors
from pytest_modelparity.runtime.tfjs_process import NodeProcessDied, decode_tensors, encode_tensors

import models

_started_pids: list[int] = []


def _load(path, **options):
    from pytest_modelparity import load_model

    try:
        model = load_model(path, "tfjs", **options)
    except errors.RuntimeMissing as exc:
        pytest.skip(f"tfjs runtime missing: {exc}")
    _started_pids.append(model.process.pid)
    return model


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module", autouse=True)
def no_node_left_behind():
    """Every node process these tests started is gone once the models are closed or collected."""
    yield
    import gc

    gc.collect()
    left = [pid for pid in _started_pids if not _wait_gone(pid, 5.0)]
    assert not left, f"node processes left running: {left}"


@pytest.fixture(scope="module")
def cnn():
    return models.tiny_cnn(seed=3)


@pytest.fixture(scope="module")
def cnn_tfjs(cnn, tmp_path_factory):
    from pytest_modelparity import export_model

    try:
        return export_model(cnn, "tfjs", tmp_path_factory.mktemp("tfjs") / "cnn")
    except errors.RuntimeMissing as exc:
        pytest.skip(f"tfjs converter missing: {exc}")


def _copy_model(src_json: Path, dst: Path) -> Path:
    shutil.copytree(src_json.parent, dst)
    return dst / "model.json"


# -- the acceptance checks ----------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cpu", "wasm"])
def test_cnn_matches_keras_on_batches_1_4_9(cnn, cnn_tfjs, backend):
    from pytest_modelparity import assert_outputs_close

    with _load(cnn_tfjs, backend=backend) as model:
        assert model.process.meta["backend"] == backend
        assert [s.name for s in model.inputs] == ["image"]
        assert model.inputs[0].shape == (None, 8, 8, 3)
        pid = model.process.pid
        for batch in (1, 4, 9):
            x = models.images(batch, seed=batch)
            got = model.predict(x)
            assert list(got) == ["probs"] and got["probs"].shape == (batch, 4)
            assert got["probs"].dtype == np.float32
            assert_outputs_close(got["probs"], cnn(x, training=False).numpy())
            assert model.last_compute_ms is not None and model.last_compute_ms > 0
        # The same process served every call, and a repeat gives the same answer.
        x = models.images(4, seed=4)
        again = model.predict(x)["probs"]
        np.testing.assert_array_equal(again, model.predict(x)["probs"])
        assert model.process.pid == pid and model.process.alive
    assert _wait_gone(pid), "close() must stop the node process"


def test_doubled_softmax_fails_assert_outputs_close(cnn, tmp_path):
    """Seed 003's bug: the JS side applies softmax to probabilities again (0.96 becomes ~0.46)."""
    import keras

    from pytest_modelparity import ParityError, assert_outputs_close, export_model

    doubled = keras.Model(cnn.inputs, keras.layers.Softmax(name="softmax_again")(cnn.outputs[0]))
    path = export_model(doubled, "tfjs", tmp_path / "doubled")
    x = models.images(9, seed=7)
    expected = cnn(x, training=False).numpy()
    with _load(path) as model:
        actual = model.predict(x)["softmax_again"]
        assert any(op == "Softmax" for _, op in model.op_types())
        assert sum(op == "Softmax" for _, op in model.op_types()) == 2
    # It really is softmax(expected): the form runs, the numbers are just wrong.
    e = np.exp(expected - expected.max(-1, keepdims=True))
    np.testing.assert_allclose(actual, e / e.sum(-1, keepdims=True), atol=1e-5)
    with pytest.raises(ParityError) as info:
        assert_outputs_close(actual, expected)
    assert not info.value.report.passed
    # The diagnosis names the cause (DESIGN.md: "the failure says actual ≈ softmax(expected)").
    assert "softmax(expected)" in str(info.value)


def test_node_killed_while_idle_is_restarted_before_the_next_call_which_passes(cnn, cnn_tfjs):
    """Kill the real node child between calls: nothing was asked of it, so the next call gets a
    new Node process that loaded the model again and answers; ``restart_reasons`` says what
    happened (pid, signal, stderr tail). A closed model is never restarted."""
    x = models.images(2)
    model = _load(cnn_tfjs, backend="cpu")  # the cpu backend prints the banner checked below
    first = model.predict(x)["probs"]
    pid = model.process.pid
    os.kill(pid, signal.SIGKILL)
    assert _wait_gone(pid)
    np.testing.assert_array_equal(model.predict(x)["probs"], first)
    assert model.process.pid != pid and model.restarts == 1 and model.backend == "cpu"
    _started_pids.append(model.process.pid)
    (reason,) = model.restart_reasons
    assert str(pid) in reason and "SIGKILL while idle between calls" in reason
    assert "stderr tail" in reason and "TensorFlow.js" in reason  # tfjs's Node banner went to stderr
    model.close()
    with pytest.raises(NodeProcessDied, match="closed"):  # a closed model is not restarted
        model.predict(x)


def test_node_dying_during_a_call_before_answering_is_retried_once_on_a_new_process(cnn, cnn_tfjs):
    """A death during a call that reached Python before any byte of the answer (node stopped
    with SIGSTOP so the call is surely waiting, then killed, as the OOM killer would) is not the
    call's: the predict is sent again to a new process and answers; ``restart_reasons`` names the
    death (pid, signal, stderr tail)."""
    import threading

    x = models.images(2)
    model = _load(cnn_tfjs, backend="cpu")
    first = model.predict(x)["probs"]
    pid = model.process.pid
    os.kill(pid, signal.SIGSTOP)
    threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
    np.testing.assert_array_equal(model.predict(x)["probs"], first)
    assert model.process.pid != pid and model.restarts == 1
    _started_pids.append(model.process.pid)
    (reason,) = model.restart_reasons
    assert str(pid) in reason and "SIGKILL while Python" in reason
    assert "stderr tail" in reason and "TensorFlow.js" in reason
    model.close()


def test_node_killed_as_a_call_starts_is_retried_and_the_call_passes(cnn_tfjs):
    """The race of a loaded machine, made certain: the kill is sent after the call found the
    process alive and before its request is written (``before_request``, the process's hook for
    that moment), so the death reaches Python during the call, before any byte of the answer.
    The same predict on a new process answers what an undisturbed one answers."""
    x = models.images(3, seed=5)
    model = _load(cnn_tfjs, backend="cpu")
    expected = model.predict(x)["probs"]
    pid = model.process.pid
    model.process.before_request = lambda: os.kill(pid, signal.SIGKILL)
    np.testing.assert_array_equal(model.predict(x)["probs"], expected)
    assert model.process.pid != pid and model.restarts == 1
    _started_pids.append(model.process.pid)
    assert re.search(r"\(pid %d\) was killed by signal SIGKILL while Python (sent it a batch|waited for its answer)"
                     % pid, model.restart_reasons[0]), model.restart_reasons
    model.close()


def test_node_killed_between_calls_then_called_at_once_passes(cnn_tfjs):
    """SIGKILL and the next call at once, without waiting for the death to show: whether the call
    finds the process dead before it (idle) or only while it waits (the kill still in flight), it
    passes on a new process."""
    x = models.images(2, seed=9)
    model = _load(cnn_tfjs, backend="cpu")
    expected = model.predict(x)["probs"]
    pid = model.process.pid
    os.kill(pid, signal.SIGKILL)
    np.testing.assert_array_equal(model.predict(x)["probs"], expected)
    assert model.process.pid != pid and model.restarts == 1
    assert str(pid) in model.restart_reasons[0] and "SIGKILL" in model.restart_reasons[0]
    _started_pids.append(model.process.pid)
    model.close()


# A preloaded script (NODE_OPTIONS=--require) that SIGKILLs its own Node, as the OOM killer
# would, at the moment it would send the answer of kind MODELPARITY_DIE_ON ('R': a predict's,
# 'H': a load's), before any byte of it; with MODELPARITY_DIE_ONCE=<file>, only the first Node
# to get there dies (it leaves its pid in the file).
_SELF_KILL_JS = textwrap.dedent("""
    const fs = require('fs');
    const kind = process.env.MODELPARITY_DIE_ON.charCodeAt(0);
    const once = process.env.MODELPARITY_DIE_ONCE;
    const real = process.stdout.write.bind(process.stdout);
    process.stdout.write = (chunk, ...rest) => {
      if (Buffer.isBuffer(chunk) && chunk[4] === kind) {
        if (!once || !fs.existsSync(once)) {
          if (once) fs.writeFileSync(once, String(process.pid));
          process.stderr.write(`self_kill.js: pid ${process.pid} dies before answering\\n`);
          process.kill(process.pid, 'SIGKILL');
        }
      }
      return real(chunk, ...rest);
    };
    """)


def _self_killing_node(tmp_path: Path, monkeypatch, kind: str, once: bool) -> Path | None:
    script = tmp_path / "self_kill.js"
    script.write_text(_SELF_KILL_JS)
    monkeypatch.setenv("NODE_OPTIONS", f"--require {script}")
    monkeypatch.setenv("MODELPARITY_DIE_ON", kind)
    marker = tmp_path / "died" if once else None
    if marker is not None:
        monkeypatch.setenv("MODELPARITY_DIE_ONCE", str(marker))
    return marker


def test_a_model_whose_node_dies_on_every_predict_fails_naming_both_deaths(cnn_tfjs, tmp_path, monkeypatch):
    """A retry is once: when the new process dies before answering too, the call fails with
    both deaths (two pids, each with its stderr tail), and says it is no chance."""
    _self_killing_node(tmp_path, monkeypatch, "R", once=False)
    model = _load(cnn_tfjs, backend="cpu", timeout_s=60.0)
    first_pid = model.process.pid
    with pytest.raises(NodeProcessDied) as info:
        model.predict(models.images(2))
    text = str(info.value)
    second_pid = model.process.pid
    _started_pids.append(second_pid)
    assert second_pid != first_pid and model.restarts == 1
    assert "its replacement died too on the same request" in text, text
    first, second = text.split("first death: ")[1].split("second death: ")
    assert f"(pid {first_pid}) was killed by signal SIGKILL while Python waited" in first
    assert f"(pid {second_pid}) was killed by signal SIGKILL while Python waited" in second
    assert f"pid {first_pid} dies before answering" in first and f"pid {second_pid} dies before answering" in second
    assert "a death on every try is not chance" in text and not info.value.unanswered
    model.close()


def test_node_killed_as_it_starts_is_retried_and_not_taken_for_a_broken_node(cnn_tfjs, tmp_path, monkeypatch):
    """SIGKILL before runner.js's start-up handshake (the OOM killer as Node starts) is a death,
    not a hung or wrong ``node``: the load is retried on a new process, and later loads are not
    refused as if Node.js were broken."""
    marker = tmp_path / "died"
    script = tmp_path / "die_at_start.js"
    script.write_text("const fs = require('fs');\n"
                      "if (!fs.existsSync(process.env.MODELPARITY_DIE_ONCE)) {\n"
                      "  fs.writeFileSync(process.env.MODELPARITY_DIE_ONCE, String(process.pid));\n"
                      "  process.kill(process.pid, 'SIGKILL');\n}\n")
    monkeypatch.setenv("NODE_OPTIONS", f"--require {script}")
    monkeypatch.setenv("MODELPARITY_DIE_ONCE", str(marker))
    model = _load(cnn_tfjs, backend="cpu", timeout_s=60.0)
    assert marker.exists() and int(marker.read_text()) != model.process.pid
    assert model.predict(models.images(1))["probs"].shape == (1, 4)
    model.close()
    _load(cnn_tfjs, backend="cpu", timeout_s=60.0).close()  # not remembered as a broken node


def test_node_dying_before_answering_a_load_is_retried_once(cnn, cnn_tfjs, tmp_path, monkeypatch):
    """A load is a request that changes nothing too: the first Node dies as it would send the
    loaded model's description, the second loads it and predicts what TensorFlow predicts."""
    from pytest_modelparity import assert_outputs_close

    marker = _self_killing_node(tmp_path, monkeypatch, "H", once=True)
    model = _load(cnn_tfjs, backend="cpu", timeout_s=60.0)
    assert marker is not None and marker.exists()
    assert int(marker.read_text()) != model.process.pid
    x = models.images(2)
    assert_outputs_close(model.predict(x)["probs"], cnn(x, training=False).numpy())
    model.close()


def _hung_node(tmp_path: Path) -> Path:
    """A real ``node`` on PATH that never answers (a hung wrapper): a shell that sleeps."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "node"
    fake.write_text("#!/bin/sh\nexec sleep 600\n")
    fake.chmod(0o755)
    return bin_dir


def test_node_that_never_answers_fails_its_handshake_fast_and_once(cnn_tfjs, tmp_path, monkeypatch):
    """backend="auto" would try wasm then cpu: a dead runtime must not double the wait, and a
    second model fails at once instead of waiting again."""
    from pytest_modelparity import load_model

    _load(cnn_tfjs).close()  # installs the npm packages first, with the real node
    monkeypatch.setenv("PATH", f"{_hung_node(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    start = time.monotonic()
    with pytest.raises(errors.ModelLoadError) as info:
        load_model(cnn_tfjs, "tfjs", timeout_s=2.0)
    took = time.monotonic() - start
    text = str(info.value)
    assert "handshake within 2 s" in text and str(tmp_path / "bin" / "node") in text and "Node.js" in text
    assert took < 6, f"waited {took:.1f} s: the wasm -> cpu fallback must not wait again"
    start = time.monotonic()
    with pytest.raises(errors.ModelLoadError, match="remembered"):
        load_model(cnn_tfjs, "tfjs", timeout_s=2.0)
    assert time.monotonic() - start < 1


def test_hung_process_times_out_and_is_killed(cnn_tfjs):
    # Start and warm up without the 1 s limit (a loaded machine can take longer to start Node),
    # then apply it to the call under test.
    model = _load(cnn_tfjs, backend="cpu")
    model.predict(models.images(1))
    model.process.timeout_s = 1.0
    pid = model.process.pid
    os.kill(pid, signal.SIGSTOP)  # alive but never answers
    start = time.monotonic()
    with pytest.raises(NodeProcessDied, match=r"not answering within 1 s"):
        model.predict(models.images(1))
    assert time.monotonic() - start < 6
    assert _wait_gone(pid)
    model.close()


@pytest.mark.parametrize("how", ["exit", "sigkill", "sigkill_pipe_held"])
def test_no_orphan_node_when_python_exits(cnn_tfjs, tmp_path, how):
    """A Python that exits without close(), or is SIGKILLed, takes its node process with it.

    ``sigkill_pipe_held``: a grandchild keeps node's stdin open, so no EOF reaches node; only
    PR_SET_PDEATHSIG can stop it then.
    """
    script = textwrap.dedent(f"""
        import os, signal, subprocess, sys
        from pytest_modelparity import load_model
        m = load_model({str(cnn_tfjs)!r}, "tfjs")
        m.predict(__import__("numpy").zeros((1, 8, 8, 3), "float32"))
        print(m.process.pid, flush=True)
        if {how!r} == "sigkill_pipe_held":
            holder = subprocess.Popen(["sleep", "60"], pass_fds=[m.process.proc.stdin.fileno()],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            print(holder.pid, flush=True)
        if {how!r} != "exit":
            os.kill(os.getpid(), signal.SIGKILL)
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    pids = [int(p) for p in proc.stdout.split()]
    if proc.returncode not in (0, -signal.SIGKILL) or not pids:
        raise AssertionError(f"child failed: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    try:
        assert _wait_gone(pids[0]), f"node pid {pids[0]} outlived its Python ({how})"
    finally:
        for holder in pids[1:]:
            os.kill(holder, signal.SIGKILL)


def test_no_node_left_after_a_pytest_session(cnn_tfjs, pytester):
    """A test that never closes its model still leaves no node behind once pytest exits."""
    pid_file = pytester.path / "pid.txt"
    pytester.makepyfile(test_inner=f"""
        from pytest_modelparity import load_model
        KEEP = []
        def test_leaky():
            m = load_model({str(cnn_tfjs)!r}, "tfjs", backend="wasm")
            m.predict(__import__("numpy").zeros((1, 8, 8, 3), "float32"))
            KEEP.append(m)
            open({str(pid_file)!r}, "w").write(str(m.process.pid))
        """)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert _wait_gone(int(pid_file.read_text())), "node outlived the pytest session"


def test_multi_input_multi_output_model_keeps_names_and_int_inputs(tmp_path):
    """Dict inputs (one int32 for an Embedding) and dict outputs round-trip by name on wasm."""
    import keras

    from pytest_modelparity import assert_outputs_close, export_model

    keras.utils.set_random_seed(1)
    ids = keras.Input((5,), dtype="int32", name="ids")
    x = keras.Input((3,), name="x")
    h = keras.layers.Concatenate()([keras.layers.Flatten()(keras.layers.Embedding(10, 2)(ids)), x])
    model = keras.Model({"ids": ids, "x": x}, {"a": keras.layers.Dense(4)(h),
                                               "b": keras.layers.Dense(1, activation="sigmoid")(h)})
    path = export_model(model, "tfjs", tmp_path / "multi")
    rng = np.random.default_rng(0)
    feeds = {"ids": rng.integers(0, 10, (6, 5)), "x": rng.uniform(size=(6, 3))}  # int64, float64 given
    expected = model({"ids": feeds["ids"].astype("int32"), "x": feeds["x"].astype("float32")}, training=False)
    with _load(path, backend="wasm") as js:
        assert {s.name: s.dtype.name for s in js.inputs} == {"ids": "int32", "x": "float32"}
        actual = js.predict(feeds)
    assert sorted(actual) == ["a", "b"]
    assert_outputs_close(actual, {k: np.asarray(v) for k, v in expected.items()})


class _ControlFlow:
    """A tf.Module whose graph really branches and loops on tensor values (not Python values).

    ``while_loop`` halves ``x @ w`` until its largest magnitude is <= 1 (the trip count depends
    on the data), then ``cond`` on the batch mean picks relu or tanh. Saved with a None batch dim.
    """

    @staticmethod
    def build(directory: Path):
        import tensorflow as tf

        class Branchy(tf.Module):
            def __init__(self):
                super().__init__()
                self.w = tf.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))

            @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
            def __call__(self, x):
                h = tf.matmul(x, self.w)
                steps, h = tf.while_loop(lambda i, h: tf.reduce_max(tf.abs(h)) > 1.0,
                                         lambda i, h: (i + 1, h * 0.5), [tf.constant(0), h])
                y = tf.cond(tf.reduce_mean(x) > 0.0, lambda: tf.nn.relu(h) + 1.0, lambda: tf.tanh(h))
                return {"y": y, "steps": steps}

        module = Branchy()
        tf.saved_model.save(module, str(directory), signatures=module.__call__)
        return module


@pytest.mark.parametrize("backend,control_flow_v2", [("cpu", True), ("wasm", True), ("cpu", False)])
def test_control_flow_graph_runs_with_execute_async_and_matches_tensorflow(tmp_path, backend, control_flow_v2):
    """While/If stay StatelessWhile/StatelessIf (the default, control_flow_v2=True) or become
    Enter/Merge/Switch/LoopCond (False): model.execute refuses both, the runner falls back to
    executeAsync and the answers still match TensorFlow."""
    from pytest_modelparity import assert_outputs_close, export_model

    module = _ControlFlow.build(tmp_path / "saved_model")
    path = export_model(tmp_path / "saved_model", "tfjs", tmp_path / "web", control_flow_v2=control_flow_v2)
    rng = np.random.default_rng(5)
    batches = [np.full((2, 4), 3.0, np.float32),           # loop runs, relu branch
               np.full((3, 4), -0.1, np.float32),          # loop does not run, tanh branch
               (rng.normal(size=(7, 4)) * 10).astype(np.float32),
               (rng.normal(size=(1, 4)) * 10).astype(np.float32)]
    with _load(path, backend=backend) as js:
        ops = {op for _, op in js.op_types()}
        lowered = {"LoopCond", "Switch", "Merge", "NextIteration"}
        assert (lowered <= ops) if not control_flow_v2 else ({"StatelessWhile", "StatelessIf"} <= ops), ops
        assert js.inputs[0].shape == (None, 4)
        steps = []
        for x in batches:
            expected = {k: v.numpy() for k, v in module(x).items()}
            actual = js.predict(x)
            assert js.process.execution == "executeAsync"
            assert sorted(actual) == ["steps", "y"] and actual["y"].shape == (len(x), 3)
            assert actual["steps"].dtype == np.int32 and actual["steps"].shape == ()
            assert int(actual["steps"]) == int(expected["steps"])
            assert_outputs_close(actual["y"], expected["y"])
            steps.append(int(actual["steps"]))
        assert steps[1] == 0 and steps[0] > 0 and len(set(steps)) > 2, steps  # data-dependent trip counts
        assert js.process.alive


def test_plain_graph_uses_synchronous_execute(cnn_tfjs):
    with _load(cnn_tfjs) as js:
        js.predict(models.images(2))
        assert js.process.execution == "execute"


# -- robustness: large frames, interrupted calls, threads, stray output, int ranges -----------

_BIG = 16384  # images of 8x8x3 float32: a 12.6 MB frame, many pipe buffers' worth


def test_large_batch_round_trips_and_costs_little_over_compute(cnn, cnn_tfjs):
    """A 12.6 MB batch matches Keras; the pipe adds tens of ms, not the 250 ms that joining the
    runner's input buffer on every 64 KB chunk cost (quadratic copying)."""
    from pytest_modelparity import assert_outputs_close

    x = models.images(_BIG, seed=11)
    with _load(cnn_tfjs, backend="wasm") as js:
        got = js.predict(x)["probs"]
        overheads = []
        for _ in range(3):
            start = time.perf_counter()
            js.predict(x)
            overheads.append((time.perf_counter() - start) * 1e3 - js.last_compute_ms)
    assert got.shape == (_BIG, 4)
    assert_outputs_close(got, cnn(x, training=False).numpy())
    assert min(overheads) < 120, f"round trip minus tfjs compute: {overheads} ms"


def _call_with_guard(fn, pid: int, limit: float):
    """Run ``fn`` in a thread; if it is still blocked after ``limit`` s, SIGKILL ``pid`` to free it."""
    from models import call_with_deadline

    return call_with_deadline(fn, limit, lambda: os.kill(pid, signal.SIGKILL))


def test_timeout_covers_sending_a_large_batch_to_a_stopped_process(cnn_tfjs):
    """A frame bigger than the pipe buffer blocks the writer while node is stopped: timeout_s
    must still fire (stdin is non-blocking and polled), not hang forever."""
    # Start and warm up without the 1 s limit (a loaded machine can take longer to start Node),
    # then apply it to the call under test.
    model = _load(cnn_tfjs, backend="cpu")
    model.predict(models.images(1))
    model.process.timeout_s = 1.0
    pid = model.process.pid
    os.kill(pid, signal.SIGSTOP)
    hung, took, box = _call_with_guard(lambda: model.predict(models.images(_BIG)), pid, 15.0)
    assert not hung, "predict hung while writing to a stopped node process"
    assert isinstance(box.get("error"), NodeProcessDied), box
    assert "not answering within 1 s" in str(box["error"]) and took < 8
    assert _wait_gone(pid)
    model.close()


class _Interrupted(Exception):
    pass


@pytest.mark.parametrize("batch", [2, _BIG], ids=["waiting_for_the_answer", "half_way_through_sending"])
def test_call_interrupted_mid_exchange_never_returns_a_stale_answer(cnn_tfjs, batch):
    """An exception raised half-way (here from a SIGALRM handler, as Ctrl-C would) leaves an
    answer in flight or a partial frame in the pipe: the next call must not read the old answer
    as its own. The process is killed and the model says why. Node is stopped first so the
    exchange is certainly in progress when the alarm fires (a 12.6 MB frame fills the pipe)."""
    model = _load(cnn_tfjs, timeout_s=5.0)  # were the pipes left out of step, calls would hang: bounded
    small = models.images(2, seed=2)
    expected_small = model.predict(small)["probs"]
    pid = model.process.pid
    x = models.images(batch)

    def interrupt(signum, frame):
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    os.kill(pid, signal.SIGSTOP)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(_Interrupted):
            model.predict(x)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if _alive(pid):
            os.kill(pid, signal.SIGCONT)
    try:
        with pytest.raises(NodeProcessDied) as info:
            model.predict(small)
        assert "interrupted (_Interrupted)" in str(info.value) and "starts a new Node.js process" in str(info.value)
        assert _wait_gone(pid)
        # The call after that gets a fresh process, answering its own batch.
        np.testing.assert_array_equal(model.predict(small)["probs"], expected_small)
        assert model.process.pid != pid
        _started_pids.append(model.process.pid)
    finally:
        model.close()


def test_node_dying_half_way_through_its_answer_is_reported(cnn_tfjs, tmp_path, monkeypatch):
    """A partial frame then exit (as a crash while writing would leave): the call fails with
    the exit status and stderr tail, it does not hang or decode half a tensor."""
    crash = tmp_path / "crash.js"
    crash.write_text(textwrap.dedent("""
        const real = process.stdout.write.bind(process.stdout);
        process.stdout.write = (chunk, ...rest) => {
          if (Buffer.isBuffer(chunk) && chunk[4] === 0x52) {  // an 'R' frame: send half, then die
            real(chunk.subarray(0, chunk.length >> 1));
            process.stderr.write('crash.js: died half-way through a frame\\n');
            process.exit(3);
          }
          return real(chunk, ...rest);
        };
        """))
    monkeypatch.setenv("NODE_OPTIONS", f"--require {crash}")
    model = _load(cnn_tfjs, timeout_s=20.0)
    start = time.monotonic()
    with pytest.raises(NodeProcessDied) as info:
        model.predict(models.images(300))
    text = str(info.value)
    assert model.restarts == 0 and not info.value.unanswered  # half an answer came back: not retried
    assert "exited with code 3 while Python waited for its answer" in text, text
    assert "died half-way through a frame" in text and time.monotonic() - start < 10
    with pytest.raises(NodeProcessDied, match="code 3"):
        model.predict(models.images(1))
    model.close()


def test_node_killed_while_sending_a_large_batch_is_retried(cnn_tfjs):
    """A kill while the 12.6 MB request is still being written (or waited on): no byte of the
    answer came back, so the predict is made again on a new process and answers."""
    model = _load(cnn_tfjs, backend="cpu")  # the big batch takes a while to send and compute
    pid = model.process.pid
    import threading

    x = models.images(_BIG)  # made before the timer: on a loaded machine it took > 0.1 s (the kill
    threading.Timer(0.1, os.kill, (pid, signal.SIGKILL)).start()  # then landed "before this call")
    assert model.predict(x)["probs"].shape == (_BIG, 4)
    assert model.restarts == 1 and model.process.pid != pid
    assert re.search(r"killed by signal SIGKILL (while Python (sent it a batch|waited)|before this call|while idle)",
                     model.restart_reasons[0])
    _started_pids.append(model.process.pid)
    assert _wait_gone(pid)
    model.close()


def test_two_threads_predicting_on_one_model_are_served_in_turn(cnn_tfjs):
    """The exchange is locked: each thread gets the answer to its own batch, never the other's."""
    from concurrent.futures import ThreadPoolExecutor

    batches = {t: [models.images(1 + (t * 5 + i) % 7, seed=100 * t + i) for i in range(8)] for t in (0, 1)}
    with _load(cnn_tfjs) as js:
        alone = {t: [js.predict(x)["probs"] for x in xs] for t, xs in batches.items()}
        with ThreadPoolExecutor(2) as pool:
            together = dict(zip(batches, pool.map(lambda xs: [js.predict(x)["probs"] for x in xs],
                                                  batches.values())))
        assert js.process.alive
    for t in batches:
        for a, b in zip(alone[t], together[t]):
            np.testing.assert_array_equal(a, b)


def test_close_from_another_thread_during_a_predict_stops_node_at_once(cnn_tfjs):
    """close() while a call is in flight kills node (not the pipes under the caller's feet):
    it returns at once and the call fails with NodeProcessDied."""
    import threading

    model = _load(cnn_tfjs, timeout_s=30.0)
    pid = model.process.pid
    os.kill(pid, signal.SIGSTOP)  # the call below is certainly in flight when close() runs
    box: dict = {}

    def call():
        try:
            model.predict(models.images(_BIG))
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30  # encoding the big batch can take a while on a loaded machine
    while not model.process._lock.locked() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    start = time.monotonic()
    model.close()
    assert time.monotonic() - start < 0.5
    thread.join(10)
    assert not thread.is_alive() and isinstance(box.get("error"), NodeProcessDied), box
    assert _wait_gone(pid)
    with pytest.raises(NodeProcessDied):
        model.predict(models.images(1))


def test_a_library_writing_to_stdout_does_not_break_the_protocol(cnn, cnn_tfjs, tmp_path, monkeypatch):
    """stdout carries frames only: a preloaded script writing to process.stdout (as a chatty npm
    package would) is diverted to stderr instead of being read as a frame length."""
    from pytest_modelparity import assert_outputs_close

    noisy = tmp_path / "noisy.js"
    noisy.write_text("setImmediate(() => process.stdout.write('noise from a library\\n'));\n"
                     "setTimeout(() => process.stdout.write('more noise\\n'), 200);\n")
    monkeypatch.setenv("NODE_OPTIONS", f"--require {noisy}")
    x = models.images(3)
    with _load(cnn_tfjs, timeout_s=20.0) as js:
        first = js.predict(x)["probs"]
        time.sleep(0.4)
        assert_outputs_close(first, cnn(x, training=False).numpy())
        np.testing.assert_array_equal(js.predict(x)["probs"], first)
        deadline = time.monotonic() + 5
        while "more noise" not in js.process.stderr_tail and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {"noise from a library", "more noise"} <= set(js.process.stderr_tail)


def test_malformed_frame_is_answered_with_an_error_and_the_runner_keeps_serving(cnn_tfjs):
    """A tensor whose bytes are fewer than its shape needs is an error, not silently zero-filled."""
    import struct

    from pytest_modelparity.runtime.tfjs_process import RunnerError

    short = b"P" + struct.pack("<HH5sBB4I", 1, 5, b"image", 0, 4, 1, 8, 8, 3) + b"\0" * 4
    with _load(cnn_tfjs) as js:
        kind, body = js.process.exchange(short)
        assert kind == "E" and "malformed frame" in body.tobytes().decode() and "768 bytes" in body.tobytes().decode()
        kind, body = js.process.exchange(b"P" + encode_tensors({"image": models.images(1)}) + b"junk")
        assert kind == "E" and "4 bytes after the last tensor" in body.tobytes().decode()
        with pytest.raises(RunnerError, match="predict failed"):  # tfjs refusing a feed: same process
            js.process.predict({"not_an_input": np.zeros((1, 8, 8, 3), np.float32)})
        assert js.predict(models.images(1))["probs"].shape == (1, 4)


def test_int64_inputs_run_as_int32_and_values_int32_cannot_hold_are_refused(tmp_path):
    import tensorflow as tf

    from pytest_modelparity import export_model

    class Ints(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64, name="ids")])
        def __call__(self, ids):
            return {"r": tf.math.floormod(ids, 7) * 3 - ids // 5}

    module = Ints()
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures=module.__call__)
    path = export_model(tmp_path / "sm", "tfjs", tmp_path / "web")
    ok = np.array([[1, 50, -9], [2**31 - 1, -(2**31), 4]], np.int64)
    with _load(path) as js:  # backend "auto" picks cpu: wasm computes int32 arithmetic in float32
        assert js.backend == "cpu" and js.format_variant == "tfjs:cpu" and "float32" in js.fallback_reason
        assert js.inputs[0].dtype == np.int32 and js.outputs[0].dtype == np.int32
        np.testing.assert_array_equal(js.predict(ok)["r"], module(ok)["r"].numpy())
        np.testing.assert_array_equal(js.predict({"ids": ok.astype(np.int32)})["r"], module(ok)["r"].numpy())
        bad = ok.copy()
        bad[1, 0] = 2**31 + 5
        for batch in (bad, {"ids": bad}, [bad]):
            with pytest.raises(errors.BatchMismatchError) as info:
                js.predict(batch)
            text = str(info.value)
            assert "'ids'" in text and "int32" in text and str(2**31 + 5) in text
        assert js.process.alive


# -- bad model files ----------------------------------------------------------------------

def test_weight_path_outside_the_model_directory_is_refused(cnn_tfjs, tmp_path):
    path = _copy_model(cnn_tfjs, tmp_path / "evil")
    shard = path.parent / "group1-shard1of1.bin"
    shutil.copy(shard, tmp_path / "outside.bin")
    spec = json.loads(path.read_text())
    for bad in ("../outside.bin", str(tmp_path / "outside.bin")):
        spec["weightsManifest"][0]["paths"] = [bad]
        path.write_text(json.dumps(spec))
        with pytest.raises(errors.ModelLoadError) as info:
            _load(path)
        text = str(info.value)
        assert "outside" in text and "'tfjs'" in text and bad in text and "fix:" in text


def test_truncated_weights_file_is_a_clear_error(cnn_tfjs, tmp_path):
    path = _copy_model(cnn_tfjs, tmp_path / "cut")
    shard = path.parent / "group1-shard1of1.bin"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(errors.ModelLoadError) as info:
        _load(path)
    text = str(info.value)
    assert "truncated" in text and "group1-shard1of1.bin" in text and "'tfjs'" in text
    assert f"{len(data) // 2} bytes" in text and f"needs {len(data)} bytes" in text
    shard.unlink()
    with pytest.raises(errors.ModelLoadError, match="missing"):
        _load(path)


def test_layers_model_and_non_model_json_are_refused(tmp_path):
    layers = tmp_path / "layers" / "model.json"
    layers.parent.mkdir()
    layers.write_text(json.dumps({"format": "layers-model", "modelTopology": {"class_name": "Sequential"},
                                  "weightsManifest": []}))
    with pytest.raises(errors.ModelLoadError, match="layers"):
        _load(layers)
    other = tmp_path / "other" / "model.json"
    other.parent.mkdir()
    other.write_text('{"hello": 1}')
    with pytest.raises(errors.ModelLoadError, match="modelTopology"):
        _load(other)
    with pytest.raises(errors.ModelLoadError, match="no such file"):
        _load(tmp_path / "nothing" / "model.json")


def test_loading_never_modifies_the_users_files(cnn_tfjs):
    def digest() -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in cnn_tfjs.parent.iterdir()}

    before = digest()
    with _load(cnn_tfjs, backend="wasm") as model:
        model.predict(models.images(1))
    assert digest() == before


def test_gpu_device_and_unknown_backend_are_refused(cnn_tfjs):
    from pytest_modelparity import load_model

    with pytest.raises(errors.DeviceUnavailable, match="tfjs.* runs on the CPU only.*Node.js"):
        load_model(cnn_tfjs, "tfjs", device="gpu")
    with pytest.raises(ValueError, match="cpu, wasm"):
        load_model(cnn_tfjs, "tfjs", backend="opengl")   # webgl is a backend now (in Chromium)


# -- diagnosis hooks ----------------------------------------------------------------------

def test_op_types_and_weights_come_from_model_json(cnn, cnn_tfjs):
    with _load(cnn_tfjs) as model:
        ops = model.op_types()
        weights = model.weights()
    assert ("image", "Placeholder") in ops
    assert any(op == "Softmax" for _, op in ops)
    dense = [w for name, w in weights.items() if w.shape == (256, 4)]
    assert len(dense) == 1
    np.testing.assert_array_equal(dense[0], cnn.get_layer("logits").get_weights()[0])


def _keras_layer_outputs(model, x):
    import keras

    names = ["relu", "flatten", "logits", "probs"]
    probe = keras.Model(model.input, [model.get_layer(n).output for n in names])
    return dict(zip(names, (np.asarray(v) for v in probe(x, training=False))))


def test_intermediates_fetch_the_last_op_of_each_layer_scope_in_graph_order(cnn, cnn_tfjs):
    """The runner's 'I' frame runs model.execute(inputs, nodes): one tensor per Keras layer
    scope (conv+bn+relu fused by the converter into one _FusedConv2D), NHWC like Keras,
    equal to the Keras layer outputs; no constants, weights, identities or shape ops."""
    x = models.images(3, seed=7)
    with _load(cnn_tfjs) as js:
        nodes = js.layer_nodes()
        names = [n for n, _ in nodes]
        assert [n.split("/")[-2] for n in names] == ["relu_1", "flatten_1", "logits_1", "probs_1"], nodes
        assert not {op for _, op in nodes} & {"Const", "Identity", "Placeholder", "Shape", "StridedSlice", "Pack"}
        got = js.intermediates(x)
        assert [n for n, _, _ in got] == names and js.process.execution == "execute"
        expected = _keras_layer_outputs(cnn, x)
        for (name, op, value), layer in zip(got, expected):
            assert value.shape == expected[layer].shape and value.dtype == np.float32, (name, value.shape)
            np.testing.assert_allclose(value, expected[layer], rtol=1e-5, atol=1e-6, err_msg=name)
        # The same process still predicts, and the last intermediate is the model's output.
        np.testing.assert_array_equal(js.predict(x)["probs"], got[-1][2])


def test_fetch_leaves_out_tensors_past_the_byte_budget_and_names_unknown_nodes(cnn_tfjs):
    from pytest_modelparity.runtime.tfjs_process import RunnerError

    x = models.images(2, seed=1)
    with _load(cnn_tfjs) as js:
        names = [n for n, _ in js.layer_nodes()]
        feeds = js.prepare_batch(x)
        conv_bytes = 2 * 8 * 8 * 4 * 4
        got = js.process.fetch(feeds, names, max_bytes=conv_bytes)   # room for the conv output only
        assert list(got) == names[:1] and got[names[0]].shape == (2, 8, 8, 4)
        assert js.process.fetch(feeds, names, max_bytes=0) == {}
        with pytest.raises(RunnerError, match="intermediates failed.*no/such/node"):
            js.process.fetch(feeds, ["no/such/node"])
        with pytest.raises(ValueError, match="at least one node"):
            js.process.fetch(feeds, [])
        assert js.process.alive and js.predict(x)["probs"].shape == (2, 4)  # still serving


def test_layer_node_selection_is_bounded_and_keeps_the_last(cnn_tfjs):
    from pytest_modelparity.formats.tfjs.load import MAX_LAYER_NODES, select_layer_nodes

    nodes = json.loads(Path(cnn_tfjs).read_text())["modelTopology"]["node"]
    full = select_layer_nodes(nodes, {"image"})
    assert 4 == len(full) <= MAX_LAYER_NODES
    two = select_layer_nodes(nodes, {"image"}, limit=2)
    assert len(two) == 2 and two[-1] == full[-1] and set(two) <= set(full)
    # Order-free: shuffled model.json nodes give the same (topological) selection.
    shuffled = list(reversed(nodes))
    assert select_layer_nodes(shuffled, {"image"}) == full


def test_intermediates_of_a_control_flow_graph_skip_loop_and_branch_internals(tmp_path):
    """Nodes inside a while body or an untaken cond branch cannot be fetched by name: only the
    loop's and the branch's results are (with executeAsync), and they match TensorFlow."""
    from pytest_modelparity import export_model

    module = _ControlFlow.build(tmp_path / "saved_model")
    path = export_model(tmp_path / "saved_model", "tfjs", tmp_path / "web", control_flow_v2=False)
    x = np.full((2, 4), 3.0, np.float32)
    with _load(path) as js:
        got = {name: (op, value) for name, op, value in js.intermediates(x)}
        assert js.process.execution == "executeAsync"
    ops = sorted(op for op, _ in got.values())
    assert ops == ["Exit", "MatMul", "Mean", "Merge"], got.keys()
    assert not any("/body/" in n or "/then/" in n or "/else/" in n for n in got)
    merge = next(v for op, v in got.values() if op == "Merge")
    np.testing.assert_allclose(merge, module(x)["y"].numpy(), rtol=1e-6)


def test_detection_finds_model_json_and_its_directory(cnn_tfjs):
    from pytest_modelparity.formats import detect_format

    assert detect_format(cnn_tfjs) == "tfjs"
    assert detect_format(cnn_tfjs.parent) == "tfjs"


# -- environment: converter import, runtime missing ----------------------------------------

def test_converter_import_leaves_no_stand_in_modules(cnn_tfjs):
    """Exporting happened (fixture); no fake jax/tfdf/tf_keras may remain importable."""
    import importlib.util

    for name in ("jax", "jax.experimental", "jax.experimental.jax2tf", "tensorflow_decision_forests", "tf_keras"):
        mod = sys.modules.get(name)
        assert mod is None or "stand-in" not in (mod.__doc__ or ""), f"stand-in {name} left in sys.modules"
    hub = sys.modules.get("tensorflow_hub")
    assert hub is None or importlib.util.find_spec("tf_keras") is not None
    import keras

    assert keras.layers.Dense(2)(np.ones((1, 3), "float32")).shape == (1, 2)


def test_no_node_on_path_raises_runtime_missing(cnn_tfjs, monkeypatch, tmp_path):
    from pytest_modelparity import load_model

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(errors.RuntimeMissing) as info:
        load_model(cnn_tfjs, "tfjs")
    assert "Node.js" in str(info.value) and "install" in str(info.value)


def test_failed_npm_install_raises_runtime_missing_and_leaves_no_cache(monkeypatch, tmp_path):
    """Real npm against an unreachable registry: the error says what to run, the cache stays clean."""
    from pytest_modelparity.runtime import tfjs_runner

    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: apt-get install nodejs npm")
    monkeypatch.setenv("MODELPARITY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm-cache"))
    monkeypatch.setenv("npm_config_offline", "false")
    with pytest.raises(errors.RuntimeMissing) as info:
        tfjs_runner.ensure_node_modules(quiet=True)
    text = str(info.value)
    assert "npm ci failed" in text and tfjs_runner.INSTALL_COMMAND in text
    assert not tfjs_runner.is_installed()
    left = [p.name for p in (tmp_path / "cache" / "tfjs-node-modules").iterdir() if not p.name.endswith(".lock")]
    assert left == []


def test_two_processes_racing_for_the_first_install_run_npm_ci_once(tmp_path):
    """pytest-xdist workers starting together: the file lock makes one run `npm ci` while the
    other waits and then uses it. Real npm (from its local cache when it has the packages), two
    real processes; a staging directory left by a killed install is cleared."""
    from pytest_modelparity.runtime import tfjs_runner

    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("Node.js and npm are not installed: apt-get install nodejs npm")
    cache = tmp_path / "cache"
    env = dict(os.environ, MODELPARITY_CACHE_DIR=str(cache), npm_config_prefer_offline="true")
    target = cache / "tfjs-node-modules" / tfjs_runner.lock_hash()
    stale = target.parent / f"{target.name}.tmp-killed"
    (stale / "node_modules").mkdir(parents=True)
    script = ("import sys; from pytest_modelparity.runtime import tfjs_runner; "
              "sys.stdin.readline(); print(tfjs_runner.ensure_node_modules(), flush=True)")
    workers = [subprocess.Popen([sys.executable, "-c", script], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for w in workers:  # both are up and imported: release them together
            w.stdin.write("go\n")
            w.stdin.flush()
        results = [w.communicate(timeout=600) for w in workers]
        for w, (out, err) in zip(workers, results):
            if w.returncode != 0:
                if "npm ci failed" in err:
                    pytest.skip(f"npm ci cannot run here (no registry, no cache): {err[-500:]}")
                raise AssertionError(f"worker failed ({w.returncode}):\n{err}")
        paths = {out.strip() for out, _ in results}
        assert paths == {str(target / "node_modules")}
        installs = sum(err.count("installing @tensorflow/tfjs") for _, err in results)
        assert installs == 1, [err for _, err in results]
        assert sum(err.count("npm ci finished in") for _, err in results) == 1
        assert (target / ".modelparity-installed").is_file()
        assert sorted(p.name for p in target.parent.iterdir()) == [target.name, f"{target.name}.lock"]
        assert target.stat().st_mode & 0o777 == 0o755
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        shutil.rmtree(cache, ignore_errors=True)  # 300 MB


# -- the protocol ---------------------------------------------------------------------------

def test_protocol_round_trips_raw_little_endian_arrays():
    tensors = {
        "f": np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7,
        "i": np.array([[-3, 2**31 - 1]], dtype=np.int32),
        "b": np.array([True, False, True]),
        "scalar": np.float32(2.5) * np.ones((), np.float32),
        "empty": np.zeros((0, 5), np.float32),
        "ünï": np.ones((1,), np.float32),
    }
    raw = encode_tensors(tensors)
    back = decode_tensors(raw)
    assert list(back) == list(tensors)
    for name, value in tensors.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape
        np.testing.assert_array_equal(back[name], value)
    # Big-endian input is sent little-endian.
    be = np.arange(3, dtype=">f4")
    np.testing.assert_array_equal(decode_tensors(encode_tensors({"x": be}))["x"], be)
    with pytest.raises(TypeError, match="float64"):
        encode_tensors({"x": np.zeros(2)})


def test_tfjs_outputs_carry_the_keras_names(cnn, tmp_path):
    """Like every other export, the TFJS form names its outputs as the Keras model does
    (model.export() would call them output_0)."""
    from pytest_modelparity import export_model

    with _load(export_model(cnn, "tfjs", tmp_path / "named")) as js:
        assert [s.name for s in js.outputs] == ["probs"]
