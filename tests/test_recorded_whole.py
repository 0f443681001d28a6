"""Issue 48, recordings whole or refused: a recording run writes its record of what it recorded
(``modelparity-session.json``) atomically and last; a folder without it (a run killed, a disk
full) is refused by ``--modelparity-against`` and by ``load_model`` as an incomplete recording
naming what is missing; against a whole recording, a form run but not recorded, or recorded but
not run, is named and fails the run, and a form whose comparison changed beyond float noise
fails its own test item (the summary line and the exit code agree). Through pytester, as
tests/test_recorded_plugin.py, with the tiny model and the tflite form only.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from models import PARITY_SUITE as PARITY
from models import RECORDED_CONFTEST as CONFTEST
from pytest_modelparity import ModelLoadError, load_model
from pytest_modelparity.formats import missing_runtime

# inline_exports (conftest.py): no export worker; the process is not what these tests are about
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]

RUN = ("-p", "no:cacheprovider", "--modelparity-export-process=inline")


def _record(pytester: pytest.Pytester, formats: str = "tflite") -> object:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_parity=PARITY)
    rec = pytester.path / "rec"
    pytester.runpytest(*RUN, f"--modelparity-formats={formats}", f"--modelparity-record={rec}").assert_outcomes(passed=1)
    return rec


def test_a_recording_without_its_runs_record_is_refused_as_incomplete(pytester: pytest.Pytester) -> None:
    rec = _record(pytester)
    record = json.loads((rec / "modelparity-session.json").read_text())
    assert sorted(record["forms"]) == ["tiny/keras@cpu", "tiny/tflite@cpu"], record
    assert record["forms"]["tiny/tflite@cpu"]["batches"] == 1 and record["not_recorded"] == []
    form = rec / "tiny" / "tflite@cpu"
    assert load_model(form).format == "recorded"  # whole: it loads

    # one batch more in the manifest than the run recorded (a later write the run never finished)
    manifest = json.loads((form / "modelparity-recording.json").read_text())
    manifest["batches"].append(dict(manifest["batches"][0]))
    (form / "modelparity-recording.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError, match=r"incomplete recording: the run's record lists 1 batch\(es\) of "
                                             r"tiny/tflite@cpu, its manifest 2"):
        load_model(form)
    manifest["batches"].pop()
    (form / "modelparity-recording.json").write_text(json.dumps(manifest))

    # the run killed before its record was written
    (rec / "modelparity-session.json").unlink()
    with pytest.raises(ModelLoadError) as info:
        load_model(form)
    text = str(info.value)
    assert "an incomplete recording" in text and "modelparity-session.json" in text and "record again" in text, text
    against = pytester.runpytest(*RUN, "--modelparity-formats=tflite", f"--modelparity-against={rec}")
    assert against.ret == pytest.ExitCode.USAGE_ERROR
    against.stderr.fnmatch_lines(["*--modelparity-against=*rec: an incomplete recording*modelparity-session.json*"])


def test_an_interrupted_recording_run_writes_no_record(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_parity=PARITY + "\n\ndef test_stop():\n    raise KeyboardInterrupt\n")
    rec = pytester.path / "rec"
    result = pytester.runpytest(*RUN, "--modelparity-formats=tflite", f"--modelparity-record={rec}",
                                no_reraise_ctrlc=True)  # Ctrl-C of the inner run, not of this one
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*NOT RECORDED*rec: the run was interrupted, so its record was not written*"])
    assert (rec / "tiny" / "tflite@cpu" / "modelparity-recording.json").is_file()
    assert not (rec / "modelparity-session.json").exists()
    with pytest.raises(ModelLoadError, match="an incomplete recording"):
        load_model(rec / "tiny" / "tflite@cpu")


def test_against_names_forms_on_one_side_and_fails_the_test_that_changed(pytester: pytest.Pytester) -> None:
    rec = _record(pytester)
    against = f"--modelparity-against={rec}"
    # onnx was not recorded: its test fails; tflite was recorded and not run: named, the run fails
    if missing_runtime("onnx", export=True) is None:
        other = pytester.runpytest(*RUN, "--modelparity-formats=onnx", against)
        other.assert_outcomes(failed=1)
        other.stdout.fnmatch_lines(["*--modelparity-against: tiny onnx@cpu: run this time but not recorded*",
                                    "*tiny tflite@cpu: recorded in*rec but not run this time*"])
    # an output changed beyond float noise: the tflite test fails, the keras one it shares passes
    npz = rec / "tiny" / "tflite@cpu" / "batch-0.outputs.npz"
    with np.load(npz) as z:
        edited = {k: z[k] * np.float32(1.01) for k in z.files}
    np.savez(npz, **edited)
    changed = pytester.runpytest(*RUN, "--modelparity-formats=tflite", against)
    changed.assert_outcomes(failed=1)
    assert changed.ret == pytest.ExitCode.TESTS_FAILED
    changed.stdout.fnmatch_lines(["*_ test_parity?tflite-cpu? _*",
                                  "--modelparity-against: tiny tflite@cpu output 'out': CHANGED beyond float noise*",
                                  "*against*rec: 1 change(s) beyond float noise*",
                                  "FAILED test_parity.py::test_parity?tflite-cpu?*"])
