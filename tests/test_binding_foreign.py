"""Files made outside the plugin (issue 25): a SavedModel with three dict outputs of two shapes and
the ONNX file tf2onnx's own command made from it (outputs StatefulPartitionedCall:0..2, input
serving_default_input_2:0). Paired by luck, it failed or passed depending on the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tf2onnx", reason="needs tf2onnx and onnxruntime: pip install tf2onnx onnx onnxruntime")
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]

def _build(path: Path) -> None:
    """The SavedModel, written in this process (issue 49: a child only imported TensorFlow again;
    the file is the same, its weights from a seeded generator)."""
    import tensorflow as tf

    class Transcriber(tf.Module):
        """The shape of the report's audio model: contour and note (N, 6, 4), onset (N, 6, 12)."""
        def __init__(self):
            g = tf.random.Generator.from_seed(7)
            self.w = {k: tf.Variable(g.normal((5, n))) for k, n in (("contour", 4), ("note", 4), ("onset", 12))}

        @tf.function(input_signature=[tf.TensorSpec((None, 6, 5), tf.float32, name="input_2")])
        def serve(self, input_2):
            return {"contour": tf.tanh(input_2 @ self.w["contour"]),
                    "note": tf.sigmoid(input_2 @ self.w["note"]),
                    "onset": input_2 @ self.w["onset"]}

    m = Transcriber()
    tf.saved_model.save(m, str(path), signatures={"serving_default": m.serve})

CHECK = textwrap.dedent('''
    import json, sys
    import numpy as np
    from pytest_modelparity import assert_outputs_close, load_model

    sm, onnx = load_model(sys.argv[1]), load_model(sys.argv[2])
    x = np.random.default_rng(0).normal(size=(3, 6, 5)).astype("float32")
    by_array = assert_outputs_close(onnx, sm, inputs=x)
    by_name = assert_outputs_close(onnx, sm, inputs={"input_2": x})
    print(json.dumps({"order": [s.name for s in sm.outputs], "pairs": by_array.meta["binding"]["outputs"],
                      "inputs": by_name.meta["binding"]["inputs"],
                      "alignment": by_name.meta.get("alignment")}))
''')


@pytest.fixture(scope="module")
def foreign(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("foreign")
    sm, onnx = root / "transcriber", root / "transcriber.onnx"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    _build(sm)
    # --use-graph-names: the graph's own tensor names; the input renamed as in the report's shipped file
    made = subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--saved-model", str(sm), "--output", str(onnx),
                           "--opset", "17", "--use-graph-names", "--rename-inputs", "serving_default_input_2:0"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    return sm, onnx


def test_tf2onnx_wrote_placeholder_names(foreign) -> None:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(foreign[1]), providers=["CPUExecutionProvider"])
    from pytest_modelparity.formats.binding import placeholder_index

    names = [o.name for o in session.get_outputs()]   # Identity:0, Identity_1:0, ... (tf2onnx 1.17)
    assert sorted(placeholder_index(n) for n in names) == [0, 1, 2], names
    assert [i.name for i in session.get_inputs()] == ["serving_default_input_2:0"]


def test_the_foreign_onnx_file_passes_in_five_processes_out_of_five(foreign) -> None:
    runs = []
    for seed in range(5):
        env = {**os.environ, "PYTHONHASHSEED": str(seed), "TF_CPP_MIN_LOG_LEVEL": "3"}
        done = subprocess.run([sys.executable, "-c", CHECK, str(foreign[0]), str(foreign[1])], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert all(r == runs[0] for r in runs), runs               # one order, one pairing, in every process
    first = runs[0]
    assert first["order"] == ["contour", "note", "onset"]    # sorted, as TensorFlow flattens the dict
    from pytest_modelparity.formats.binding import placeholder_index

    assert {p["reference"]: placeholder_index(p["other"]) for p in first["pairs"]} == {"contour": 0, "note": 1, "onset": 2}
    assert {p["basis"] for p in first["pairs"]} == {"converter name"}
    assert first["inputs"] == [{"reference": "input_2", "other": "serving_default_input_2:0", "basis": "converter name",
                                "how": "'serving_default_input_2:0' is what converters write for 'input_2'"}]
    assert "'onset'~'Identity_2:0' (converter name: index 2 in sorted-name order)" in first["alignment"]


def test_a_pairing_by_position_would_have_failed(foreign) -> None:
    """The check can fail: the onnx outputs named in the ONNX file's order against the SavedModel's
    outputs in another order (what luck gave before) disagree, shapes or values."""
    from pytest_modelparity import ParityError, assert_outputs_close, load_model
    from pytest_modelparity.formats.binding import placeholder_index

    sm, onnx = load_model(foreign[0]), load_model(foreign[1])
    x = np.random.default_rng(0).normal(size=(3, 6, 5)).astype("float32")
    by_index = {placeholder_index(s.name): s.name for s in onnx.outputs}
    wrong = {"outputs": {"contour": by_index[1], "note": by_index[0], "onset": by_index[2]}}
    with pytest.raises(ParityError) as err:
        assert_outputs_close(onnx, sm, inputs=x, bind=wrong)
    assert "bind=" in str(err.value)      # the failure says the pairing was the caller's


@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
@pytest.mark.inline_exports  # conftest.py: no export worker (its pairing, not the process, is the subject)
def test_the_savedmodel_as_a_suites_source_passes_on_its_exports(pytester: pytest.Pytester, foreign) -> None:
    pytester.makeconftest(f'''
        import pytest

        @pytest.fixture(scope="session")
        def modelparity_source():
            return {str(foreign[0])!r}
    ''')
    pytester.makepyfile(test_sm='''
        from pytest_modelparity import assert_outputs_close

        def test_forms(parity_candidate, parity_reference, parity_batch):
            assert [s.name for s in parity_candidate.outputs] == ["contour", "note", "onset"]
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=saved_model,onnx,tflite")
    result.assert_outcomes(passed=2, skipped=1)  # saved_model: the directory compared with itself, skipped
