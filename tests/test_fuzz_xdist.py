"""A fuzz campaign over pytest-xdist (issue 46): each worker draws its own stream until the one
deadline of the run, shrinks what it found, and the controller writes the one summary, the JSON
section and every reproducer, over two ``popen`` gateways with caches and homes of their own
(no shared disk assumed). One campaign carries every check (issue 49): ``-n 2`` starts the same
two popen workers, with the one disk shared, and each campaign costs two workers and two fuzz
children that import TensorFlow."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("xdist", reason="pytest-xdist is not installed: pip install pytest-xdist")


def _fuzzed(result: pytest.RunResult, report: Path) -> tuple[str, dict]:
    text = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, text
    assert len(re.findall(r"^modelparity fuzz: ", text, re.M)) == 1, text  # one summary, the controller's
    return text, json.loads(report.read_text())["fuzz"]


def test_a_model_count_is_shared_by_the_streams() -> None:
    from pytest_modelparity.plugin.fuzz import _share, stream_seed

    assert [_share(7, i, 2) for i in range(2)] == [4, 3]
    assert sum(_share(10**9, i, 3) for i in range(3)) == 10**9
    assert [_share(1, i, 2) for i in range(2)] == [1, 0]
    assert stream_seed(5, 0) == 5 and len({stream_seed(5, i) for i in range(8)}) == 8


def test_two_gateways_with_their_own_caches_and_homes_draw_their_own_streams_to_one_deadline(
        pytester: pytest.Pytester) -> None:
    tx = [f"popen//env:MODELPARITY_CACHE_DIR={pytester.path / f'cache{i}'}//env:HOME={pytester.path / f'home{i}'}"
          for i in (1, 2)]
    for i in (1, 2):
        (pytester.path / f"home{i}").mkdir()
    args = [a for spec in tx for a in ("--tx", spec)]
    result = pytester.runpytest_subprocess("--modelparity-fuzz-minutes=0.2", "--modelparity-formats=tflite",
                                           "--dist", "load", *args, "--hypothesis-seed=5", "-p", "no:cacheprovider",
                                           "--modelparity-report=report.json")
    text, fuzz = _fuzzed(result, pytester.path / "report.json")
    result.assert_outcomes(passed=2)  # modelparity-fuzz[gw0] and [gw1]
    assert sorted(fuzz["workers"]) == ["gw0", "gw1"] and all(n >= 1 for n in fuzz["workers"].values()), fuzz
    assert fuzz["models"] == sum(fuzz["workers"].values())
    assert sum(fuzz["outcomes"]["tflite"].values()) == fuzz["models"]  # every model of both workers tallied once
    assert fuzz["stopped_by_budget"] is True
    assert re.search(rf"modelparity fuzz: {fuzz['models']} model\(s\) .* over 2 xdist workers \(gw0 \d+, gw1 \d+\)",
                     text), text
    for i in (1, 2):  # each worker's fuzz child logged into its own cache
        assert (pytester.path / f"cache{i}" / "logs").is_dir(), sorted(p.name for p in pytester.path.iterdir())


def test_a_workers_failure_arrives_whole_at_the_controller(tmp_path: Path) -> None:
    """What a worker found (its outcome, shrink figures and reproducer files) crosses execnet's
    serializer as it is, and lands in the controller's own folder; the same failure from a
    second worker is kept once, its models counted."""
    from execnet import dumps, loads

    from pytest_modelparity.fuzz.fuzzing import Outcome
    from pytest_modelparity.fuzz.model_draw import for_each_drawn
    from pytest_modelparity.fuzz.reproducer import write_reproducer
    from pytest_modelparity.plugin.fuzz import FuzzResults, merge_payload, payload_of

    drawn_models: list = []
    for_each_drawn(drawn_models.append, seed=2, max_examples=1)
    drawn = drawn_models[0]
    outcome = Outcome(format="tflite", status="fail", cause="new", text="max abs 0.5 at [0, 1]", ratio=40.0)
    worker = FuzzResults(models=5, seconds=12.0, counts={("tflite", "pass"): 4, ("tflite", "fail"): 1})
    worker.failures[outcome.key] = (drawn, outcome)
    worker.shrunk[outcome.key] = (len(drawn.layers), 1, 3)
    worker.written[outcome.key] = write_reproducer(tmp_path / "worker", drawn, outcome, {"onednn": False})

    payload = loads(dumps(payload_of(worker)))  # what execnet carries from a worker's workeroutput
    controller = FuzzResults()
    merge_payload(controller, "gw0", payload, tmp_path / "controller")
    merge_payload(controller, "gw1", payload, tmp_path / "controller")
    assert controller.models == 10 and controller.workers == {"gw0": 5, "gw1": 5}
    assert controller.counts == {("tflite", "pass"): 8, ("tflite", "fail"): 2}
    assert list(controller.failures) == [outcome.key] and controller.failures[outcome.key][1] == outcome
    assert controller.shrunk_of(outcome.key) == (len(drawn.layers), 1, 3)
    written = controller.written[outcome.key]
    assert written.parent == tmp_path / "controller"
    here = worker.written[outcome.key]
    assert sorted(p.name for p in written.iterdir()) == sorted(p.name for p in here.iterdir())
    for p in here.iterdir():
        assert (written / p.name).read_bytes() == p.read_bytes()
    assert "repro.py" in {p.name for p in written.iterdir()}
