"""A damaged tfjs install (real damage to a COPY of the installed npm packages, in a temporary
MODELPARITY_CACHE_DIR; the shared cache is never touched) in a real plugin session: detected,
repaired once with real `npm ci`, and, when the repair cannot run, a skip naming what is missing
(a failure under --modelparity-strict), never a silent cpu-backend run."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from models import TINY_SOURCE_CONFTEST

pytestmark = [pytest.mark.skipif(shutil.which("node") is None or shutil.which("npm") is None,
                                 reason="Node.js and npm are not installed (apt-get install nodejs npm)"),
              # the sessions run in the test's process (issue 49): what is tested is the plugin's
              # handling of the damaged install (npm ci and node are real children either way); a
              # child session imported TensorFlow again for nothing the test reads
              pytest.mark.usefixtures("_heavy_modules_stay_loaded", "_tfjs_converter_loaded")]

SUITE = textwrap.dedent('''
    from pytest_modelparity import assert_outputs_close

    def test_tfjs_runs_on_wasm(parity_candidate, parity_batch, parity_reference):
        assert parity_candidate.format_variant == "tfjs:wasm", parity_candidate.fallback_reason
        assert_outputs_close(parity_candidate.predict(parity_batch), parity_reference, inputs=parity_batch)
''')


@pytest.fixture
def damaged_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the real install under a temporary MODELPARITY_CACHE_DIR (for this test and
    its pytester session); returns the copy's install directory."""
    from pytest_modelparity.runtime import tfjs_runner

    if not tfjs_runner.is_installed():
        pytest.skip(f"the Node runner's npm modules are not installed: {tfjs_runner.INSTALL_COMMAND}")
    real = tfjs_runner.modules_dir()
    cache = tmp_path / "mp-cache"
    copy = cache / "tfjs-node-modules" / real.name
    shutil.copytree(real, copy, symlinks=True)
    monkeypatch.setenv("MODELPARITY_CACHE_DIR", str(cache))
    assert tfjs_runner.modules_dir() == copy and tfjs_runner.damage(copy) == []
    return copy


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile(test_damage=SUITE)
    return pytester.runpytest("--modelparity-formats=tfjs", "--modelparity-cache-dir=cache",
                              "-p", "no:cacheprovider", "-p", "no:randomly", *args)


@pytest.mark.inline_exports  # its export worker would import TensorFlow once more; the repair is the same
def test_truncated_node_modules_is_detected_and_repaired_once_with_npm_ci(
        damaged_copy: Path, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_modelparity.runtime import tfjs_runner

    converter = damaged_copy / "node_modules" / "@tensorflow" / "tfjs-converter"
    shutil.rmtree(converter / "dist")  # package.json stays: the old check saw nothing wrong
    problems = tfjs_runner.damage(damaged_copy)
    assert any("tfjs-converter" in p and "entry file" in p for p in problems), problems
    monkeypatch.setenv("npm_config_prefer_offline", "true")  # npm's own cache when it has the packages
    result = _run(pytester)
    if "npm ci failed" in result.stdout.str():
        pytest.skip(f"npm ci cannot run here (no registry, no npm cache): {result.stdout.str()[-400:]}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*installed the Node.js packages of the tfjs format again*repairing a damaged "
                                 "install*tfjs-converter*"])
    assert tfjs_runner.damage(damaged_copy) == []
    assert (converter / "dist").is_dir()


def test_deleted_wasm_files_that_cannot_be_repaired_fail_under_strict_naming_them(
        damaged_copy: Path, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pytest_modelparity.runtime import tfjs_runner

    for wasm in (damaged_copy / "node_modules").rglob("*.wasm"):
        wasm.unlink()
    assert any(".wasm" in p for p in tfjs_runner.damage(damaged_copy))
    # npm can reach no registry and has no cache: the repair fails for real.
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    monkeypatch.setenv("npm_config_offline", "true")
    monkeypatch.setenv("npm_config_cache", str(tmp_path / "empty-npm-cache"))
    # the default export worker (not inline): it tries its own npm ci, which fails, in its own
    # process; this session's one try is the one reported (inline, the export's try is this
    # process's only one, and the candidate's load says "tried once" instead)
    result = _run(pytester, "--modelparity-strict", "-rs")
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert "npm ci failed" in out and "the install there was damaged" in out and ".wasm files" in out, out
    assert "--modelparity-strict turns this skip into a failure" in out
    assert "tfjs:cpu" not in out and "repairing it with npm ci was tried once" not in out  # one npm ci
