"""Recorded runs through the plugin: ``--modelparity-record`` writes each form a test ran, a
second session (another cache) compares each recording with the live reference, an edited
recording fails with its cause named, and ``--modelparity-against`` says what changed."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from models import PARITY_SUITE as PARITY
from models import RECORDED_CONFTEST as CONFTEST

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded", "installed_node_modules")]

COMPARE = textwrap.dedent('''
    import os, pathlib
    import pytest
    from pytest_modelparity import assert_outputs_close, load_model

    REC = pathlib.Path(os.environ["RECORDED"])

    @pytest.mark.parametrize("form", ["tflite", "onnx", "tfjs"])
    def test_recorded(form, parity_reference):
        (folder,) = REC.glob(f"*/{form}@cpu")
        recorded = load_model(folder)
        assert recorded.format == "recorded" and recorded.format_variant.startswith(form)
        assert_outputs_close(recorded, parity_reference, inputs=recorded.inputs_batch)
''')

FORMS = "--modelparity-formats=tflite,onnx,tfjs"
INLINE = "--modelparity-export-process=inline"  # no export worker to start: these models are tiny


def test_record_then_compare_elsewhere(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_parity=PARITY)
    rec = pytester.path / "rec"
    first = pytester.runpytest("-p", "no:cacheprovider", INLINE, FORMS, f"--modelparity-record={rec}")
    first.assert_outcomes(passed=3)
    first.stdout.fnmatch_lines(["*recorded 4 form(s) into*rec*"])
    folders = sorted(p.relative_to(rec).as_posix() for p in rec.glob("*/*"))
    assert folders == ["tiny/keras@cpu", "tiny/onnx@cpu", "tiny/tfjs@cpu", "tiny/tflite@cpu"], folders
    manifest = json.loads((rec / "tiny/tflite@cpu/modelparity-recording.json").read_text())
    assert manifest["model"]["content_hash"].startswith("sha256:")
    assert manifest["form"]["variant"] == "tflite:float32" and manifest["form"]["device"] == "cpu"
    assert {"tensorflow", "ai_edge_litert", "onnxruntime"} <= set(manifest["produced_by"])
    assert manifest["binding"]["outputs"][0]["reference"] == "out"
    keras_manifest = json.loads((rec / "tiny/keras@cpu/modelparity-recording.json").read_text())
    assert keras_manifest["floor"]["out"]["float64"] > 0  # the reference's measured floor
    assert "tfjs" in json.loads((rec / "tiny/tfjs@cpu/modelparity-recording.json").read_text())["produced_by"]

    # never overwritten without being asked
    again = pytester.runpytest("-p", "no:cacheprovider", FORMS, f"--modelparity-record={rec}")
    assert again.ret == pytest.ExitCode.USAGE_ERROR
    again.stderr.fnmatch_lines(["*already holds recordings*--modelparity-record-overwrite*"])

    # a second session with another cache: every recorded form against the live reference
    monkeypatch.setenv("RECORDED", str(rec))
    pytester.makepyfile(test_parity=COMPARE)
    second = pytester.runpytest("-p", "no:cacheprovider", f"--modelparity-cache-dir={pytester.path / 'cache2'}")
    second.assert_outcomes(passed=3)

    # outputs edited x1.001: the cause is named
    npz = rec / "tiny/onnx@cpu/batch-0.outputs.npz"
    with np.load(npz) as z:
        edited = {k: z[k] * np.float32(1.001) for k in z.files}
    np.savez(npz, **edited)
    third = pytester.runpytest("-p", "no:cacheprovider", "-k", "onnx",
                               f"--modelparity-cache-dir={pytester.path / 'cache2'}")
    third.assert_outcomes(failed=1, deselected=2)
    third.stdout.fnmatch_lines(["*recorded onnx* vs keras: 1 of 1 output differs", "*FAILED*", "*scaled by a constant*",
                                "*not run: the checks that rerun the candidate*recorded run*"])


def test_against_says_identical_and_a_changed_model(pytester: pytest.Pytester,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_parity=PARITY)
    rec, cache = pytester.path / "rec", INLINE
    forms = "--modelparity-formats=tflite"
    pytester.runpytest("-p", "no:cacheprovider", forms, cache, f"--modelparity-record={rec}").assert_outcomes(passed=1)
    # a recording in the matrix: the candidate, on the seeded parity_batch it recorded
    matrix = pytester.runpytest("-p", "no:cacheprovider", "-v", cache, "--modelparity-formats=recorded:rec/tiny/tflite@cpu")
    matrix.assert_outcomes(passed=1)
    matrix.stdout.fnmatch_lines(["*test_parity?recorded:rec/tiny/tflite@cpu-cpu? PASSED*"])
    same = pytester.runpytest("-p", "no:cacheprovider", forms, cache, f"--modelparity-against={rec}")
    same.assert_outcomes(passed=1)
    same.stdout.fnmatch_lines(["*against*rec: 0 change(s) beyond float noise*",
                               "*tiny keras@cpu output 'out': identical*",
                               "*tiny tflite@cpu output 'out': identical*"])
    # an output changed beyond float noise fails the run, and says so
    npz = rec / "tiny/tflite@cpu/batch-0.outputs.npz"
    with np.load(npz) as z:
        edited = {k: z[k] * np.float32(1.01) for k in z.files}
    np.savez(npz, **edited)
    changed = pytester.runpytest("-p", "no:cacheprovider", forms, cache, f"--modelparity-against={rec}")
    assert changed.ret == pytest.ExitCode.TESTS_FAILED
    changed.stdout.fnmatch_lines(["*1 change(s) beyond float noise*",
                                  "*tiny tflite@cpu output 'out': CHANGED beyond float noise*of scale; bound: 8 x the model's "
                                  "own float32 error*; likely (actual: this run, expected: the recording): actual ≈ 0.99*"
                                  "× expected: the output is scaled by a constant*"])
    # a model with other weights is said, not compared
    monkeypatch.setenv("WEIGHT_SEED", "3")
    other = pytester.runpytest("-p", "no:cacheprovider", forms, cache, f"--modelparity-against={rec}")
    other.assert_outcomes(passed=1)
    other.stdout.fnmatch_lines(["*tiny tflite@cpu: the model changed (content hash sha256:*): not compared*"])
    assert "CHANGED" not in other.stdout.str()


def test_against_names_outputs_exchanged_as_the_library_does() -> None:
    """Issue 50: two same-shape outputs exchanged between the recording and this run read as a
    swap, not two unexplained CHANGED lines; a lone change with no transform is left unnamed."""
    from pytest_modelparity.plugin.record import named_changes
    from pytest_modelparity.verdict.compare import compare

    rng = np.random.default_rng(0)
    mean, log_var = rng.normal(size=(6, 4)).astype("float32"), rng.normal(size=(6, 4)).astype("float32")
    then = {"mean": mean, "log_var": log_var}
    now = {"mean": log_var, "log_var": mean}
    changed = {k: compare(now[k], then[k]).outputs[0] for k in now}
    causes = named_changes(now, then, changed)
    assert set(causes) == {"mean", "log_var"} and all("another order" in c for c in causes.values()), causes
    noise = {"mean": rng.normal(size=(6, 4)).astype("float32"), "log_var": log_var}
    assert named_changes(noise, then, {"mean": compare(noise["mean"], mean).outputs[0]}) == {}
