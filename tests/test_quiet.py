"""Quiet by default: TensorFlow/converter output goes to a log the run names; the cache dir
ignores itself for git."""

from __future__ import annotations

import os
import sys

import pytest

from pytest_modelparity.runtime.quiet import GITIGNORE, LogSink, make_ignored_dir

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_log_sink_takes_file_descriptor_and_python_output_and_gives_them_back(tmp_path, capfd):
    sink = LogSink(tmp_path / "cache" / "logs" / "main.log", root=tmp_path / "cache")
    with sink.capture("exporting"):
        os.write(2, b"I0000 port.cc:153] oneDNN custom operations are on\n")
        os.write(1, b"converter chatter\n")
        print("python print", file=sys.stderr)
    os.write(2, b"after\n")
    out, err = capfd.readouterr()
    assert "oneDNN" not in err and "chatter" not in out and "python print" not in err
    assert "after" in err  # the descriptors are restored
    log = (tmp_path / "cache" / "logs" / "main.log").read_text()
    assert "== exporting" in log and "oneDNN" in log and "converter chatter" in log and "python print" in log
    assert sink.written and (tmp_path / "cache" / ".gitignore").read_text() == GITIGNORE


def test_log_sink_shows_everything_when_asked(tmp_path, capfd):
    sink = LogSink(tmp_path / "logs" / "main.log", show=True)
    with sink.capture("exporting"):
        os.write(2, b"visible\n")
    assert "visible" in capfd.readouterr().err and not (tmp_path / "logs").exists()


def test_a_cache_dir_created_here_ignores_itself_and_an_existing_one_is_left_alone(tmp_path):
    made = make_ignored_dir(tmp_path / "new" / ".modelparity-cache")
    assert (made / ".gitignore").read_text().splitlines()[-1] == "*"
    existing = tmp_path / "mine"
    existing.mkdir()
    make_ignored_dir(existing)
    assert not (existing / ".gitignore").exists()


def test_a_passing_plugin_run_prints_no_tensorflow_log_lines(pytester: pytest.Pytester,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Zero-code mode builds, converts (TFLite, ONNX) and loads in a fresh process; with -rA
    (captured output of passing tests shown) no TF C++/absl line reaches the terminal, and
    the run names the log that holds them."""
    monkeypatch.delenv("MODELPARITY_CACHE_DIR", raising=False)  # CI sets it: the cache is then elsewhere
    env_level = os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
    try:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", "--modelparity-model=demo",
                                               "--modelparity-formats=tflite,onnx", "-k", "outputs_close",
                                               timeout=600)
    finally:
        if env_level is not None:
            os.environ["TF_CPP_MIN_LOG_LEVEL"] = env_level
    result.assert_outcomes(passed=2)
    text = result.stdout.str() + result.stderr.str()
    for marker in ("I0000", "W0000", "absl::", "port.cc", "XNNPACK"):
        assert marker not in text, text[-3000:]
    result.stdout.fnmatch_lines(["*TensorFlow and converter output kept in*logs*-v -s shows it on the terminal instead*"])
    logs = pytester.path / ".modelparity-cache" / "logs" / "main.log"
    assert "== exporting to tflite" in logs.read_text()
    assert (pytester.path / ".modelparity-cache" / ".gitignore").exists()


def test_the_advice_in_that_line_shows_the_output(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """"-v -s shows it": with both, TensorFlow's C++ lines reach the terminal (with -v alone
    pytest's capture keeps them, which is why the line names both)."""
    monkeypatch.delenv("MODELPARITY_CACHE_DIR", raising=False)
    env_level = os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
    try:
        # the session's own TensorFlow import writes the lines; its export worker would only
        # import TensorFlow once more (issue 49): the export runs inline
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "-s", "--modelparity-model=demo",
                                               "--modelparity-formats=keras", "--modelparity-export-process=inline",
                                               "-k", "outputs_close", timeout=600)
    finally:
        if env_level is not None:
            os.environ["TF_CPP_MIN_LOG_LEVEL"] = env_level
    result.assert_outcomes(passed=1)
    text = result.stdout.str() + result.stderr.str()
    assert any(marker in text for marker in ("I0000", "W0000", "oneDNN", "cpu_feature_guard")), text[-3000:]
