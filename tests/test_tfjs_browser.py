"""The tfjs format in a real headless Chromium: tfjs:webgl (float32 textures), tfjs:webgl-f16
(float16 textures forced), tfjs:webgpu (where Chromium offers an adapter).

Every test runs the real system Chromium (`apt-get install chromium`) on SwiftShader, driven by
runtime/tfjs_runner/browser.js; without one they skip, saying so (CI installs it with
scripts/install.sh). Kept few: a browser start costs ~1.5 s, a page ~0.5 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import textwrap
import time

import numpy as np
import pytest

from pytest_modelparity.runtime import browser_process

pytestmark = [pytest.mark.skipif(
    not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) or not shutil.which("node"),
    reason="needs Chromium and Node.js: apt-get install chromium nodejs npm (scripts/install.sh does it as root)"),
    pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker

@pytest.fixture(autouse=True)
def _installed_node_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytester runs get a temporary HOME: point them at the installed npm modules (and export
    cache) instead of an `npm ci` per run."""
    from pytest_modelparity.runtime.tfjs_runner import INSTALL_COMMAND, cache_root, is_installed

    if not is_installed():
        pytest.skip(f"the Node runner's npm modules are not installed: {INSTALL_COMMAND}")
    monkeypatch.setenv("MODELPARITY_CACHE_DIR", str(cache_root()))


CONFTEST = textwrap.dedent('''
    import sys
    sys.path.insert(0, {tests!r})
    import keras
    import pytest
    from digits import digits_cnn

    _MODEL = {{}}

    def trained():
        if not _MODEL:
            model, x_train, x_test = digits_cnn()
            probs = keras.layers.Softmax(name="probs")(model.outputs[0])
            _MODEL["good"] = keras.Model(model.inputs, probs, name="digits_probs")
            # seed 003: the web side applies softmax to the probabilities again
            again = keras.layers.Softmax(name="softmax_again")(probs)
            _MODEL["doubled"] = keras.Model(model.inputs, again, name="digits_doubled")
            _MODEL["x_test"] = x_test
        return _MODEL

    @pytest.fixture(scope="session")
    def modelparity_source():
        return trained()[{source!r}]

    @pytest.fixture(scope="session")
    def modelparity_dataset():
        return trained()["x_test"]
''')

TINY_CONFTEST = textwrap.dedent('''
    import sys
    sys.path.insert(0, {tests!r})
    import pytest
    from models import tiny_cnn

    @pytest.fixture(scope="session")
    def modelparity_source():
        return tiny_cnn()
''')

TINY_SUITE = textwrap.dedent('''
    from pytest_modelparity import assert_outputs_close

    def test_web(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
''')

SUITE = textwrap.dedent('''
    from pytest_modelparity import assert_outputs_close
    from conftest import trained

    def test_web(parity_candidate, parity_batch):
        assert_outputs_close(parity_candidate, trained()["good"], inputs=parity_batch)
''')


def _run_suite(pytester, request, source: str, *args: str):
    if source == "tiny":
        pytester.makeconftest(TINY_CONFTEST.format(tests=str(request.path.parent)))
        pytester.makepyfile(test_web=TINY_SUITE)
    else:
        pytester.makeconftest(CONFTEST.format(tests=str(request.path.parent), source=source))
        pytester.makepyfile(test_web=SUITE)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "--modelparity-formats=tfjs:webgl,tfjs:webgl-f16",
                                        "--modelparity-report=r.json", *args)


def test_digits_cnn_passes_on_webgl_and_float16_textures(pytester, _heavy_modules_stay_loaded, request):
    result = _run_suite(pytester, request, "good")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    # which browser and renderer ran it, in the summary
    # the headless shell says HeadlessChrome/, the full browser Chrome/
    assert re.search(r"modelparity: tfjs:webgl ran in (Headless)?Chrome/", out) and "SwiftShader" in out
    assert re.search(r"tfjs:webgl-f16 ran in (Headless)?Chrome/", out) and "float16 textures" in out
    doc = json.loads((pytester.path / "r.json").read_text())
    runs = {b["format"]: b for b in doc["browsers"]}
    assert set(runs) == {"tfjs:webgl", "tfjs:webgl-f16"}
    assert runs["tfjs:webgl"]["textures"] == "float32" and runs["tfjs:webgl-f16"]["textures"] == "float16"
    assert runs["tfjs:webgl"]["chromium"].startswith(("Chrome/", "HeadlessChrome/")) and runs["tfjs:webgl"]["webgl_version"] == 2
    f16 = [r for r in doc["rows"] if r["format_variant"] == "tfjs:webgl-f16"]
    parts = {r["quantized"]["part"]: r for r in f16}
    assert set(parts) == {"conversion", "float16 textures"} and all(r["verdict"] == "pass" for r in f16)
    cost = parts["float16 textures"]
    # float16 storage really ran (it moves the output), and was judged by the model's own floor
    assert cost["max_abs"] > 1e-5
    assert "float16-activation floor" in cost["tolerance_source"]
    assert "judged in two parts" in cost["quantized"]["summary"]
    plain = [r for r in doc["rows"] if r["format_variant"] == "tfjs:webgl"]
    assert len(plain) == 1 and plain[0]["max_abs"] < 1e-5  # float32 textures: float32 noise only


def test_doubled_softmax_fails_on_both_with_the_cause_named(pytester, _heavy_modules_stay_loaded, request):
    result = _run_suite(pytester, request, "doubled")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert out.count("softmax(expected)") >= 2  # the diagnosis names the cause on both variants
    assert "the model differs from the reference on float32 textures already" in out  # f16: conversion, not f16


def test_without_chromium_the_formats_skip_saying_how_and_strict_fails(pytester, _heavy_modules_stay_loaded,
                                                                       request, monkeypatch):
    monkeypatch.setenv("MODELPARITY_CHROMIUM", "/nonexistent/chromium")
    result = _run_suite(pytester, request, "tiny")
    result.assert_outcomes(skipped=2)
    result.stdout.no_fnmatch_line("*Traceback*")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--modelparity-formats=tfjs:webgl",
                                          "--modelparity-strict", "-rs")
    result.assert_outcomes(errors=1)  # the candidate fixture fails under --modelparity-strict
    out = result.stdout.str()
    assert "apt-get install chromium" in out and "[--modelparity-strict turns this skip into a failure]" in out
    assert "ran in Chrome/" not in out and "ran in HeadlessChrome/" not in out  # no browser ran in this session


def test_webgpu_skips_saying_chromium_offers_no_adapter(pytester, _heavy_modules_stay_loaded, request):
    pytester.makeconftest(TINY_CONFTEST.format(tests=str(request.path.parent)))
    pytester.makepyfile(test_web=TINY_SUITE)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--modelparity-formats=tfjs:webgpu", "-rs")
    out = result.stdout.str()
    if result.parseoutcomes().get("passed"):  # a machine whose Chromium has a WebGPU adapter
        return
    result.assert_outcomes(skipped=1)
    assert "WebGPU adapter" in out and "tfjs:webgl" in out


@pytest.fixture(scope="module")
def rank7(tmp_path_factory, _heavy_modules_stay_loaded):
    """A Permute on a 6-D input: a rank-7 transpose, which tfjs's cpu backend runs and WebGL cannot."""
    import keras
    from pytest_modelparity import export_model

    keras.utils.set_random_seed(0)
    inp = keras.Input((2, 2, 2, 2, 2, 3), name="cube")
    h = keras.layers.Permute((6, 1, 2, 3, 4, 5), name="to_channels_first")(inp)
    model = keras.Model(inp, keras.layers.Dense(3, name="score")(keras.layers.Flatten()(h)))
    return model, export_model(model, "tfjs", tmp_path_factory.mktemp("rank7") / "web")


def test_an_op_webgl_cannot_run_names_the_op_node_and_backend(rank7):
    from pytest_modelparity import load_model
    from pytest_modelparity.errors import ModelLoadError

    model, path = rank7
    x = np.random.default_rng(0).random((2, 2, 2, 2, 2, 2, 3), dtype=np.float32)
    with load_model(path, "tfjs", backend="cpu") as js:  # the model itself is fine
        np.testing.assert_allclose(js.predict(x)["score"], model(x).numpy(), atol=1e-5)
    with load_model(path, "tfjs", backend="webgl") as js:
        with pytest.raises(ModelLoadError) as info:
            js.predict(x)
        text = str(info.value)
        assert "tfjs's webgl backend cannot run op 'Transpose'" in text and "to_channels_first" in text
        assert "rank-7" in text and "backend 'cpu' or 'wasm'" in text and str(path) in text
        assert js.process.alive  # the page and its browser keep serving


def test_a_killed_browser_leaves_no_orphan_and_the_next_call_starts_a_new_one(rank7):
    from pytest_modelparity import load_model
    from pytest_modelparity.runtime.tfjs_process import NodeProcessDied

    model, path = rank7
    x = np.zeros((1, 2, 2, 2, 2, 2, 3), np.float32)
    flat = keras_free_model(path)
    with load_model(flat, "tfjs", backend="webgl", timeout_s=60) as js:
        first = js.predict({"v": np.ones((2, 4), np.float32)})["y"]
        host = js.process.host
        pid = host.process.pid
        browsers = _chromium_children_of(pid)
        assert browsers, "Chromium runs as a child of the Node driver"
        os.kill(pid, signal.SIGKILL)
        host.process.proc.wait(timeout=10)
        deadline = time.monotonic() + 10  # Chromium exits with its DevTools pipe: no orphan browser
        while any(_running(b) for b in browsers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_running(b) for b in browsers)
        again = js.predict({"v": np.ones((2, 4), np.float32)})["y"]  # a new browser, the model loaded again
        assert js.restarts == 1 and js.process.host is not host
        assert not host.folder.exists(), "the dead driver's profile went when its host was replaced"
        np.testing.assert_array_equal(first, again)
        # The driver killed as a call starts, its death reaching Python during the call before any
        # byte of the answer (a kill in flight under load): the predict is made again in a new
        # browser and passes.
        driver = js.process.host.process
        driver.before_request = lambda: os.kill(driver.pid, signal.SIGKILL)
        np.testing.assert_array_equal(js.predict({"v": np.ones((2, 4), np.float32)})["y"], first)
        assert js.restarts == 2 and js.process.host.process is not driver
        assert f"(pid {driver.pid}) was killed by signal SIGKILL" in js.restart_reasons[-1]
    del model, x
    with pytest.raises(NodeProcessDied):
        js.predict({"v": np.ones((2, 4), np.float32)})  # a closed model is never restarted


def keras_free_model(path):
    """The smallest graph model there is, written by hand: y = v @ w (no converter needed)."""
    target = path.parent.parent / "handmade"
    target.mkdir(exist_ok=True)
    w = np.arange(12, dtype="<f4").reshape(4, 3) / 10
    (target / "group1-shard1of1.bin").write_bytes(w.tobytes())
    spec = {"format": "graph-model", "generatedBy": "hand", "convertedBy": "hand",
            "modelTopology": {"node": [
                {"name": "v", "op": "Placeholder", "attr": {"dtype": {"type": "DT_FLOAT"},
                                                              "shape": {"shape": {"dim": [{"size": "-1"}, {"size": "4"}]}}}},
                {"name": "w", "op": "Const", "attr": {"dtype": {"type": "DT_FLOAT"}, "value": {"tensor": {
                    "dtype": "DT_FLOAT", "tensorShape": {"dim": [{"size": "4"}, {"size": "3"}]}}}}},
                {"name": "y", "op": "MatMul", "input": ["v", "w"], "attr": {"T": {"type": "DT_FLOAT"}}}],
                "versions": {"producer": 1}},
            "weightsManifest": [{"paths": ["group1-shard1of1.bin"],
                                 "weights": [{"name": "w", "shape": [4, 3], "dtype": "float32"}]}]}
    (target / "model.json").write_text(json.dumps(spec))
    return target / "model.json"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _chromium_children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read()
        except OSError:
            continue
        if int(fields[1]) == pid and b"chrom" in cmd:
            found.append(int(entry))
    return found


def test_a_browser_that_never_answers_is_stopped_at_its_start_limit(tmp_path, monkeypatch, rank7):
    from pytest_modelparity import load_model
    from pytest_modelparity.errors import RuntimeMissing

    hung = tmp_path / "chromium"
    hung.write_text("#!/bin/bash\nexec -a modelparity-fake-chromium sleep 60\n")  # never speaks DevTools
    hung.chmod(0o755)
    monkeypatch.setenv("MODELPARITY_CHROMIUM", str(hung))
    monkeypatch.setenv("MODELPARITY_BROWSER_START_S", "2")
    start = time.monotonic()
    with pytest.raises(RuntimeMissing) as info:
        load_model(rank7[1], "tfjs", backend="webgl", timeout_s=60)
    assert time.monotonic() - start < 20
    text = str(info.value)
    assert "hung: it started but did not answer the DevTools protocol within 2 s" in text and str(hung) in text
    assert "apt-get install" not in text and "MODELPARITY_BROWSER_START_S" in text
    time.sleep(0.5)
    left = [p for p in os.listdir("/proc") if p.isdigit() and _running(int(p))
            and _cmdline(p).startswith(b"modelparity-fake-chromium")]
    assert not left, "the hung browser was killed with its failed start"


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def test_browser_variants_match_the_loader():
    from pytest_modelparity.formats.tfjs.browser import BROWSER_BACKENDS
    from pytest_modelparity.plugin.options import FORMAT_VARIANTS

    assert FORMAT_VARIANTS["tfjs"] == BROWSER_BACKENDS
    assert browser_process.BROWSER_JS.is_file()
