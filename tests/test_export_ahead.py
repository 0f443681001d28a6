"""Exports sent ahead of their test (``ExportProcess.ahead``, docs/performance.md): the worker
converts the session's next format while the pytest process loads, runs and compares the
current one. An export sent ahead is taken by the same request only, moved to that request's
path; its failure is that export's, said of that path; a request for another export waits for
it to end and is exported as usual."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pytest_modelparity import load_model
from pytest_modelparity.exports.worker import ExportProcess

import models
from models import CLOSE_SUITE, TINY_SOURCE_CONFTEST


def _counted_worker(log: Path) -> ExportProcess:
    process = ExportProcess(timeout_s=300, log_path=log)
    posts: list[str] = []
    post = process._post

    def counted(request):
        posts.append(request["format"])
        return post(request)

    process._post = counted  # what the worker is asked, in order
    process.posts = posts
    process.prestart()
    return process


@pytest.fixture(scope="module")
def _one_worker(tmp_path_factory: pytest.TempPathFactory):
    """One export worker for the tests that leave it alive: each new one imported TensorFlow
    again (about 8 CPU-seconds, issue 49). Nothing is left sent ahead between them."""
    process = _counted_worker(tmp_path_factory.mktemp("logs") / "export.log")
    yield process
    process.close()


@pytest.fixture
def worker(_one_worker: ExportProcess):
    """The module's worker, its record of what it was asked emptied for this test."""
    _one_worker.posts.clear()
    yield _one_worker
    assert _one_worker._ahead is None, "a test left an export sent ahead"


@pytest.fixture
def own_worker(tmp_path: Path):
    """A worker of the test's own, for a test that kills it."""
    process = _counted_worker(tmp_path / "logs" / "export.log")
    yield process
    process.close()


def _close_to(path: Path, model, format: str) -> None:
    x = np.random.default_rng(0).normal(size=(3, 16)).astype("float32")
    np.testing.assert_allclose(load_model(path, format).predict(x)["out"], np.asarray(model(x)), atol=1e-5)


def test_an_export_sent_ahead_is_taken_by_its_request_and_moved_to_its_path(worker, tmp_path: Path) -> None:
    model = models.mlp(seed=1)
    assert worker.ahead(model, "tflite", "model.tflite")
    assert not worker.ahead(model, "onnx", "model.onnx")  # one at a time
    path = worker.export(model, "tflite", tmp_path / "entry" / "model.tflite")
    assert path == tmp_path / "entry" / "model.tflite" and worker.posts == ["tflite"]  # not asked again
    _close_to(path, model, "tflite")
    assert not list(worker._dir.glob("ahead-*"))  # nothing left where it was written


def test_a_failing_export_sent_ahead_fails_its_request_as_if_asked_then(worker, tmp_path: Path) -> None:
    model = models.mlp(seed=2)
    bad = {"converter_options": {"route": "no_such_route"}}
    assert worker.ahead(model, "tflite", "model.tflite", **bad)
    with pytest.raises(Exception) as ahead:
        worker.export(model, "tflite", tmp_path / "a" / "model.tflite", **bad)
    with pytest.raises(Exception) as asked:
        worker.export(model, "tflite", tmp_path / "b" / "model.tflite", **bad)
    assert worker.posts == ["tflite", "tflite"]
    assert type(ahead.value) is type(asked.value)
    assert str(ahead.value).replace(str(tmp_path / "a"), "X") == str(asked.value).replace(str(tmp_path / "b"), "X")
    assert "ahead-" not in str(ahead.value)


def test_another_request_waits_for_the_export_sent_ahead_and_is_exported_as_usual(worker, tmp_path: Path) -> None:
    model = models.mlp(seed=3)
    assert worker.ahead(model, "tflite", "model.tflite")
    onnx = worker.export(model, "onnx", tmp_path / "o" / "model.onnx")
    _close_to(onnx, model, "onnx")
    tflite = worker.export(model, "tflite", tmp_path / "t" / "model.tflite")  # the discarded one is not reused
    _close_to(tflite, model, "tflite")
    assert worker.posts == ["tflite", "onnx", "tflite"]


def test_an_export_sent_ahead_to_a_worker_that_dies_is_that_exports_failure(own_worker, tmp_path: Path) -> None:
    """SIGKILL during the export sent ahead (the OOM killer's signal): its request fails once,
    naming its own path; the next export gets a new worker."""
    import os
    import signal

    from pytest_modelparity import errors

    model = models.tiny_cnn(seed=4)
    own_worker.export(model, "keras", tmp_path / "warm" / "m")  # TensorFlow imported in the worker
    assert own_worker.ahead(model, "onnx", "model.onnx")
    os.kill(own_worker.pid, signal.SIGKILL)  # at once: the export sent ahead is under way
    with pytest.raises(errors.ExportError, match="killed by SIGKILL") as info:
        own_worker.export(model, "onnx", tmp_path / "o" / "model.onnx")
    assert Path(info.value.path) == tmp_path / "o" / "model.onnx"
    assert own_worker.export(model, "tflite", tmp_path / "t" / "model.tflite").exists()


# Appended to a conftest: records each export the session sends ahead, and whether it was sent.
AHEAD_RECORDER = textwrap.dedent('''
    from pathlib import Path

    from pytest_modelparity.exports.worker import ExportProcess

    _ahead = ExportProcess.ahead

    def ahead(self, model, format, name, **options):
        sent = _ahead(self, model, format, name, **options)
        with open(Path(__file__).parent / "sent-ahead.txt", "a") as fh:  # print would go to the session log
            fh.write(f"{format} {sent}\\n")
        return sent

    ExportProcess.ahead = ahead

    def pytest_unconfigure(config):
        ExportProcess.ahead = _ahead  # the session runs in the test's process: leave the class as found
''')
SESSION_CONFTEST = TINY_SOURCE_CONFTEST + AHEAD_RECORDER


def test_a_cold_session_sends_each_next_format_ahead_and_a_warm_one_none(pytester: pytest.Pytester) -> None:
    """Through the fixtures: the tests run saved_model, tflite, onnx in that order; the worker
    is sent tflite when saved_model is done and onnx when tflite is, every test passes, and the
    cache then holds all three (a warm run sends nothing and passes)."""
    pytester.makeconftest(SESSION_CONFTEST)
    pytester.makepyfile(test_m=CLOSE_SUITE)
    args = ("--modelparity-formats=saved_model,tflite,onnx", "--modelparity-cache-dir=cache", "-p",
            "no:cacheprovider", "-p", "no:randomly")
    # both sessions in this process (issue 49): their export worker is the real child either way;
    # a child pytest session only imported TensorFlow once more
    cold = pytester.runpytest(*args)
    cold.assert_outcomes(passed=3)
    sent = pytester.path / "sent-ahead.txt"
    assert sent.read_text().splitlines() == ["tflite True", "onnx True"]
    sent.unlink()
    warm = pytester.runpytest(*args)
    warm.assert_outcomes(passed=3)
    assert not sent.exists()


APP_CONFTEST = textwrap.dedent('''
    import numpy as np
    import pytest
    from models import keras_app

    @pytest.fixture(scope="session")
    def modelparity_source(tmp_path_factory):
        model, x = keras_app("mobilenetv2", 32)
        path = tmp_path_factory.mktemp("src") / "mobilenet_v2.keras"
        model.save(str(path))
        np.save(str(path.with_suffix(".npy")), x[:2])
        return str(path)

    @pytest.fixture(scope="session")
    def modelparity_dataset(modelparity_source):
        return np.load(modelparity_source[:-len(".keras")] + ".npy")
''') + AHEAD_RECORDER


def test_a_keras_application_file_session_sends_its_exports_ahead_and_passes(pytester: pytest.Pytester,
                                                                             monkeypatch) -> None:
    """The path users take: a trained-like MobileNetV2 saved as a .keras file, three formats
    through the fixtures. tflite and onnx go to the worker ahead of their tests, each is taken
    by its own test, and every form passes against its float64 floor."""
    paths = [str(Path(__file__).parent), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))  # the conftest imports tests/models.py
    pytester.makeconftest(APP_CONFTEST)
    pytester.makepyfile(test_m=CLOSE_SUITE)
    result = pytester.runpytest("--modelparity-formats=saved_model,tflite,onnx",  # in this process, as above
                                "--modelparity-cache-dir=cache", "--modelparity-report=r.json",
                                "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=3)
    assert (pytester.path / "sent-ahead.txt").read_text().splitlines() == ["tflite True", "onnx True"]
    rows = json.loads((pytester.path / "r.json").read_text())["rows"]
    assert {r["format"]: r["verdict"] for r in rows} == {"saved_model": "pass", "tflite": "pass", "onnx": "pass"}
    assert all("from a float64 run of its Keras twin" in r["tolerance_source"] for r in rows)


@pytest.mark.usefixtures("installed_node_modules")
def test_a_tfjs_export_sent_ahead_converts_the_saved_model_entry_and_is_taken(pytester: pytest.Pytester) -> None:
    """saved_model then tfjs through the fixtures, the worker a real child: tfjs is sent ahead
    once saved_model is in the cache, with the keyword that points it at that entry, so the
    test's own request is the same and takes it (one tfjs conversion in the worker's log), and
    the JSON report's tfjs route says it was converted from the saved_model export."""
    from pytest_modelparity.formats import missing_runtime

    if missing_runtime("tfjs", export=True) is not None:
        pytest.skip("needs the tfjs converter and Node.js: bash scripts/install.sh installs them")
    pytester.makeconftest(SESSION_CONFTEST)
    pytester.makepyfile(test_m=CLOSE_SUITE)
    result = pytester.runpytest("--modelparity-formats=saved_model,tfjs", "--modelparity-cache-dir=cache",
                                "--modelparity-report=r.json", "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    assert (pytester.path / "sent-ahead.txt").read_text().splitlines() == ["tfjs True"]
    routes = {a["format"]: a.get("route") or "" for a in json.loads((pytester.path / "r.json").read_text())["artifacts"]}
    assert "from the saved_model export of this model" in routes["tfjs"], routes
    logs = "".join(p.read_text() for p in (pytester.path / "cache").rglob("*.log"))
    assert logs.count("== export to tfjs done") == 1, logs[-3000:]
