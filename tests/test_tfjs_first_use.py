"""The first use of the tfjs format installs its Node.js packages with ``npm ci``; under the
plugin that install's progress message goes to the log with the rest of the load's output, so
the end of the run reports it (docs/tfjs.md said it was reported; it was not)."""

from __future__ import annotations

import importlib.util
import shutil

import pytest

from models import TINY_SOURCE_CONFTEST

# Exports inline (conftest.py): the first-use install is the subject, not the export process,
# whose worker would import TensorFlow once more.
pytestmark = [pytest.mark.usefixtures("_heavy_modules_stay_loaded", "_tfjs_converter_loaded"), pytest.mark.inline_exports]


@pytest.mark.skipif(shutil.which("npm") is None or importlib.util.find_spec("tensorflowjs") is None,
                    reason="needs npm and the tensorflowjs converter (docs/tfjs.md#installing)")
def test_the_first_use_npm_ci_is_reported_at_the_end_of_the_run(pytester: pytest.Pytester,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELPARITY_CACHE_DIR", str(pytester.path / "fresh-cache"))  # nothing installed there
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile("""
        from pytest_modelparity import assert_outputs_close

        def test_export(parity_candidate, parity_reference, parity_batch):
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", "--modelparity-formats=tfjs")
    outcomes = result.parseoutcomes()
    if outcomes.get("skipped"):
        pytest.skip(f"npm ci could not install here (no network, no npm cache): {result.stdout.str()[-600:]}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["modelparity: installed the Node.js packages of the tfjs format on first use "
                                 "(npm ci into *fresh-cache*tfjs-node-modules* took * s)"])
    again = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=tfjs")
    again.assert_outcomes(passed=1)
    assert "installed the Node.js packages" not in again.stdout.str()  # the second run installs nothing
