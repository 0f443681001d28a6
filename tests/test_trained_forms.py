"""The models teams already have (issue 26), each built in the test with the property that
broke it, run through the plugin's fixtures in a pytester session as a user would.

- a SavedModel written by TF 2.x + Keras 2 (``tf_keras``) with its legacy optimizer: the
  object graph holds slot variables TF 2.21 cannot revive without tf_keras.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded")]

WRITE_KERAS2 = textwrap.dedent('''
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import numpy as np
    import tf_keras

    out = sys.argv[1]
    x = tf_keras.Input((8,), name="features")
    h = tf_keras.layers.Dense(6, activation="relu", name="h")(x)
    y = tf_keras.layers.Dense(3, name="score")(h)
    model = tf_keras.Model(x, y)
    model.compile(optimizer=tf_keras.optimizers.legacy.Adam(1e-3), loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(4, 8)).astype("float32"), rng.normal(size=(4, 3)).astype("float32"),
              epochs=1, verbose=0)
    model.save(out, save_format="tf", include_optimizer=True)
    rows = rng.normal(size=(3, 8)).astype("float32")
    np.save(out + "-rows.npy", rows)
    np.save(out + "-expected.npy", model.predict(rows, verbose=0))
''')


@pytest.fixture(scope="module")
def keras2_saved_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Keras-2-era SavedModel with optimizer slot variables, written by tf_keras in a child
    process (this process has Keras 3, and the loading side must not have tf_keras)."""
    if importlib.util.find_spec("tf_keras") is None:
        pytest.fail("tf_keras is not installed: run scripts/install.sh (it installs tf_keras==2.21.0 --no-deps)")
    out = tmp_path_factory.mktemp("keras2") / "trained_sm"
    subprocess.run([sys.executable, "-c", WRITE_KERAS2, str(out)], check=True, timeout=240)
    return out


def test_keras2_saved_model_with_optimizer_slots_loads_and_exports(pytester: pytest.Pytester,
                                                                    keras2_saved_model: Path) -> None:
    pytester.makeconftest(textwrap.dedent(f'''
        import sys
        # A user's machine without tf_keras (TF 2.21 + Keras 3): blocked before TensorFlow loads.
        assert "tensorflow" not in sys.modules, "TensorFlow was imported before the conftest"
        sys.modules["tf_keras"] = None
        import pytest

        SOURCE = {str(keras2_saved_model)!r}

        @pytest.fixture(scope="session")
        def modelparity_source():
            return SOURCE
    '''))
    pytester.makepyfile(test_trained=f'''
        import numpy as np
        import pytest
        from pytest_modelparity import assert_outputs_close

        def test_tf_own_loader_fails():
            import tensorflow as tf
            with pytest.raises(AttributeError, match="add_slot"):
                tf.saved_model.load({str(keras2_saved_model)!r})

        def test_reference_is_the_trained_model(parity_reference):
            rows = np.load({str(keras2_saved_model) + "-rows.npy"!r})
            expected = np.load({str(keras2_saved_model) + "-expected.npy"!r})
            np.testing.assert_allclose(parity_reference.predict(rows)["score"], expected, rtol=1e-6, atol=1e-6)
            assert "slot variables" in parity_reference.load_note
            assert sorted(parity_reference.weights()) == ["h/bias", "h/kernel", "score/bias", "score/kernel"]

        def test_forms(parity_candidate, parity_reference, parity_batch):
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
    ''')
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider",
                                           "--modelparity-formats=saved_model,tflite,onnx,tfjs",
                                           "--modelparity-report=r.json", timeout=400)
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*test_forms[[]tflite-cpu[]] PASSED*", "*test_forms[[]onnx-cpu[]] PASSED*",
                                 "*test_forms[[]tfjs-cpu[]] PASSED*"])
    doc = json.loads((pytester.path / "r.json").read_text())
    routes = {a["format"]: a.get("route") or "" for a in doc["artifacts"]}
    assert "signature frozen" in routes["tfjs"], routes
