"""``pytest --modelparity-fuzz=N``: a seeded run on tflite and onnx to its summary, and the
reproducer a failure leaves behind rebuilding the same model."""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest


def test_a_seeded_fuzz_run_on_tflite_and_onnx_ends_with_its_summary(pytester: pytest.Pytester) -> None:
    # 8 models, with a 40 s budget so a loaded 2-core CI machine still ends in well under a minute;
    # in this process (the models are checked in the fuzz child either way): a child session
    # imported TensorFlow once more for nothing the test reads (issue 49).
    result = pytester.runpytest("--modelparity-fuzz=8", "--modelparity-fuzz-minutes=0.67",
                                "--modelparity-formats=tflite,onnx", "--hypothesis-seed=3", "-p", "no:cacheprovider",
                                "--modelparity-report=report.json")
    text = result.stdout.str()
    # the conditions it ran under (issue 46), as the fuzz child's TensorFlow reported them
    import json

    from pytest_modelparity.fuzz.conditions import conditions_here

    ran_under = json.loads((pytester.path / "report.json").read_text())["fuzz"]["conditions"]
    assert ran_under["onednn"] is conditions_here()["onednn"] and ran_under["xnnpack"] is True, ran_under
    assert re.search(rf"^  conditions: oneDNN {'on' if ran_under['onednn'] else 'off'} \(", text, re.M), text
    found = re.search(r"modelparity fuzz: (\d+) model\(s\) in \d+ s", text)
    assert found, text
    models = int(found.group(1))
    assert 1 <= models <= 8
    assert "stopped by --modelparity-fuzz-minutes" in text or models == 8
    for fmt in ("tflite", "onnx"):  # every model judged or refused on every format
        line = re.search(rf"^  {fmt}: (.*)$", text, re.M)
        assert line, text
        assert sum(int(n) for n in re.findall(r"(\d+) \w+", line.group(1))) == models
    assert "NEW" not in text  # no failure outside the catalogue on these converters (a false alarm would be one)
    result.assert_outcomes(passed=1)


def test_fuzz_minutes_alone_fuzzes_until_they_are_spent(pytester: pytest.Pytester) -> None:
    """``--modelparity-fuzz-minutes=M`` without ``--modelparity-fuzz=N`` collected nothing (exit
    5): it now draws models until the minutes are spent (at least one, whatever the budget)."""
    result = pytester.runpytest("--modelparity-fuzz-minutes=0.05", "--modelparity-formats=tflite",
                                "--hypothesis-seed=3", "-p", "no:cacheprovider")
    text = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, text
    result.assert_outcomes(passed=1)
    found = re.search(r"modelparity fuzz: (\d+) model\(s\) in \d+ s \(stopped by --modelparity-fuzz-minutes\)", text)
    assert found and int(found.group(1)) >= 1, text
    line = re.search(r"^  tflite: (.*)$", text, re.M)
    assert line and sum(int(n) for n in re.findall(r"(\d+) \w+", line.group(1))) == int(found.group(1)), text


def test_a_time_budget_stops_the_drawing_not_only_the_checking() -> None:
    """Past the deadline no model is drawn: returning early from each example had left
    Hypothesis drawing the rest of max_examples (8 minutes past a 12-minute bench budget)."""
    import time

    from pytest_modelparity.fuzz.model_draw import for_each_drawn

    seen: list = []
    start = time.monotonic()
    stopped = for_each_drawn(lambda drawn: (seen.append(drawn), time.sleep(0.05)), seed=0,
                             max_examples=100_000, deadline=start + 0.5)
    elapsed = time.monotonic() - start
    assert stopped
    assert 1 <= len(seen) <= 12, len(seen)
    assert elapsed < 10, f"{elapsed:.1f} s after a 0.5 s budget"
    spent: list = []  # a budget already spent still visits one model, then stops
    assert for_each_drawn(spent.append, seed=0, max_examples=100, deadline=time.monotonic() - 1)
    assert len(spent) == 1

    counted: list = []
    assert not for_each_drawn(counted.append, seed=0, max_examples=5)  # no deadline: every example
    assert len(counted) == 5
    again: list = []
    for_each_drawn(again.append, seed=0, max_examples=5)
    assert [d.source() for d in again] == [d.source() for d in counted]  # seeded: the same models


def test_fuzz_option_values_are_checked(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--modelparity-fuzz=zero")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--modelparity-fuzz=zero: pass a positive whole number*"])


def test_a_reproducer_rebuilds_the_failing_model_bit_for_bit(tmp_path) -> None:
    from pytest_modelparity.fuzz.fuzzing import Outcome
    from pytest_modelparity.fuzz.known_defects import by_name
    from pytest_modelparity.fuzz.reproducer import write_reproducer

    entry = by_name("tf2onnx-dense-then-conv-transpose")
    outcome = Outcome("onnx", "fail", "new", "the verdict text", known=entry.name)
    folder = write_reproducer(tmp_path, entry.model, outcome)
    assert {p.name for p in folder.iterdir()} == {"repro.py", "weights.npz", "inputs.npz", "verdict.txt",
                                                   "conditions.json"}
    assert "known: " + entry.name in (folder / "verdict.txt").read_text()
    spec = importlib.util.spec_from_file_location("repro_under_test", folder / "repro.py")
    repro = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(repro)  # plain Keras code: the same in a fresh interpreter
    model, inputs = repro.model_and_inputs()
    np.save(tmp_path / "out.npy", np.asarray(model(inputs)))
    expected = np.asarray(entry.model.build()(entry.model.batch()[0]))
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected)


def test_each_outcome_says_how_close_to_its_bound_it_came() -> None:
    """A pass carries no per-element bound, so the ratio is the worst error over the rule's
    constant part; a failure's is over the bound at its worst element: both > 0, a pass <= 1."""
    from pytest_modelparity import ParityError, Tolerance, assert_outputs_close
    from pytest_modelparity.fuzz.fuzzing import _ratio

    expected = np.linspace(-2.0, 2.0, 50, dtype=np.float32)
    rule = Tolerance(rtol=0.0, atol=0.0, scale=1e-3)
    near = assert_outputs_close(expected + np.float32(5e-4), expected, tolerance=rule)
    assert _ratio(near) == pytest.approx(5e-4 / (1e-3 * 2.0), rel=1e-3)
    with pytest.raises(ParityError) as failed:
        assert_outputs_close(expected + np.float32(6e-3), expected, tolerance=rule)
    assert _ratio(failed.value.report) == pytest.approx(3.0, rel=1e-3)


class _KillsItsProcess:
    """A draw whose build kills the process building it: what a converter's C++ abort does."""

    base = None
    layers = ()

    def build(self):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def test_the_fuzz_child_is_replaced_every_n_models_and_a_crash_costs_one_model(tmp_path) -> None:
    """Models are checked in a child process: a new one every ``models_per_child`` models (what
    the child grew by ends with it), and a child killed mid-model is that model's error outcome,
    after which the next model is checked in a new child; the log flood goes to the log file."""
    pytest.importorskip("ai_edge_litert", reason="the tflite runtime: pip install 'pytest-modelparity[tflite]'")
    from pytest_modelparity.fuzz.fuzz_worker import FuzzWorker
    from pytest_modelparity.fuzz.model_draw import DrawnModel, InputKind
    from pytest_modelparity.fuzz.model_steps import Dense, Math

    plain = DrawnModel(InputKind("vector", (8,)), (Dense(4), Math("abs")))
    log = tmp_path / "logs" / "child.log"
    with FuzzWorker(log, models_per_child=2) as worker:
        for _ in range(3):
            (outcome,) = worker.check(plain, ["tflite"], workdir=tmp_path)
            assert outcome.status == "pass", outcome.text
            assert worker.rss_mb is not None and worker.rss_mb > 50
        assert len(worker.children) == 2          # models 1-2 in one child, model 3 in the next
        (died,) = worker.check(_KillsItsProcess(), ["tflite"], workdir=tmp_path)
        assert died.status == "error" and "the process checking it died" in died.text, died
        (after,) = worker.check(plain, ["tflite"], workdir=tmp_path)
        assert after.status == "pass" and len(worker.children) == 3
    assert log.stat().st_size > 0                 # TensorFlow's and the converter's output went there


def test_a_reproducer_replays_under_the_conditions_it_was_found_under(tmp_path) -> None:
    """repro.py sets TF_ENABLE_ONEDNN_OPTS before it imports TensorFlow, whatever the shell has:
    written for oneDNN on, the maximum(2x, x) model is read as LeakyRelu(2) on tfjs and fails when
    replayed from a shell with oneDNN off; written for oneDNN off, it passes from a shell with oneDNN on. Real
    converter, real Node tfjs, each replay a fresh `python repro.py`."""
    import os
    import subprocess
    import sys

    from pytest_modelparity.formats import missing_runtime
    from pytest_modelparity.fuzz.conditions import ONEDNN_VAR, conditions_here
    from pytest_modelparity.fuzz.fuzzing import Outcome
    from pytest_modelparity.fuzz.known_defects import by_name
    from pytest_modelparity.fuzz.reproducer import write_reproducer

    missing = missing_runtime("tfjs", export=True)
    if missing is not None:
        pytest.skip(str(missing))
    entry = by_name("tfjs-maximum-as-leakyrelu")
    replays = {}
    for on in (True, False):
        found_under = conditions_here({ONEDNN_VAR: "1" if on else "0"})
        outcome = Outcome("tfjs", "fail", "1 of 1 output differs", "the failure", known=entry.name)
        folder = write_reproducer(tmp_path / str(on), entry.model, outcome, found_under)
        source = (folder / "repro.py").read_text()
        assert source.index(f"'{ONEDNN_VAR}': '{int(on)}'") < source.index("import keras")
        verdict = (folder / "verdict.txt").read_text()
        assert ("oneDNN on" if on else "oneDNN off") in verdict and f"workaround: {entry.advice}" in verdict
        shell = {**os.environ, ONEDNN_VAR: "0" if on else "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
        replays[on] = subprocess.run([sys.executable, str(folder / "repro.py")], capture_output=True, text=True,
                                     env=shell, cwd=folder, timeout=300)
    on, off = replays[True], replays[False]
    assert off.returncode == 0 and "the converted model agrees" in off.stdout, off.stdout + off.stderr[-2000:]
    if on.returncode == 0:
        pytest.skip("the maximum -> LeakyRelu rewrite did not happen with oneDNN on here (fixed, or a TensorFlow "
                    "without oneDNN): the replay under oneDNN on could not be told apart")
    assert "ParityError" in on.stderr and "differs" in on.stderr, on.stderr[-2000:]
