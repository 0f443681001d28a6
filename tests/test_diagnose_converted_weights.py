"""A kernel changed in a converted file (TFLite, ONNX), named against a graph reference.

The reference is a Keras-2-era SavedModel with optimizer slot records (loaded by the v1 loader,
frozen: a graph reference with no Keras layers), as a trained audio model's wheel ships one;
its TFLite and ONNX forms are converted from it, then one late conv kernel is scaled x1.01 in a
copy of each file. The failure must name that kernel (issue 50), found among the file's
constants and confirmed by a run of the reference with it; a correct form, made to fail by an
exact tolerance, must name no weight (the converter folded the batch-norm into the stem's
kernel, so that kernel is in neither file as it is, only near it: a suspect the reference's run
with it rejects).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pytest_modelparity import ParityError, assert_outputs_close, export_model, load_model

tf = pytest.importorskip("tensorflow", reason="graph references need TensorFlow: pip install -e '.[all]'")

WRITE = textwrap.dedent('''
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import numpy as np
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    x = tf_keras.Input((12, 12, 1), name="image")
    h = tf_keras.layers.Conv2D(8, 3, name="stem")(x)
    h = tf_keras.layers.BatchNormalization(name="bn")(h)
    h = tf_keras.layers.ReLU(name="relu")(h)
    model = tf_keras.Model(x, tf_keras.layers.Conv2D(1, 3, activation="sigmoid", name="head")(h))
    rng = np.random.default_rng(0)
    # statistics near identity: the folded stem kernel is near its own (a suspect), yet folded
    model.get_layer("bn").set_weights([rng.uniform(0.97, 1.03, 8), rng.normal(0, 0.05, 8), rng.normal(0, 0.05, 8),
                                       rng.uniform(0.95, 1.05, 8)])
    model.compile(optimizer=tf_keras.optimizers.legacy.Adam(1e-3), loss="mse")
    model.fit(rng.normal(size=(4, 12, 12, 1)).astype("float32"), rng.uniform(size=(4, 8, 8, 1)).astype("float32"),
              epochs=1, verbose=0)
    model.save(sys.argv[1], save_format="tf", include_optimizer=True)
''')

# Where each converter stores a Keras (H, W, I, O) conv kernel.
LAYOUT = {"tflite": (3, 0, 1, 2), "onnx": (3, 2, 0, 1)}


@pytest.fixture(scope="module")
def graph_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SavedModel directory, written by tf_keras in a child process (Keras 3 here)."""
    if importlib.util.find_spec("tf_keras") is None:
        pytest.fail("tf_keras is not installed: run scripts/install.sh (it installs tf_keras==2.21.0 --no-deps)")
    out = tmp_path_factory.mktemp("graph_ref") / "sm"
    subprocess.run([sys.executable, "-c", WRITE, str(out)], check=True, timeout=240)
    return out


@pytest.fixture(scope="module")
def converted(graph_reference: Path) -> dict[str, tuple[Path, Path]]:
    """{format: (the converted file, a copy with the head kernel x1.01)}."""
    kernel = np.asarray(load_model(graph_reference).weights()["head/kernel"], "<f4")
    out = {}
    for fmt, axes in LAYOUT.items():
        path = Path(export_model(graph_reference, fmt, graph_reference.parent / f"m.{fmt}"))
        data = path.read_bytes()
        needle = np.ascontiguousarray(kernel.transpose(axes)).tobytes()
        assert data.count(needle) == 1, f"the head kernel is not in the {fmt} file once as {axes}"
        planted = path.with_name(f"planted.{fmt}")
        scaled = (kernel.transpose(axes).astype(np.float64) * 1.01).astype("<f4")
        planted.write_bytes(data.replace(needle, np.ascontiguousarray(scaled).tobytes()))
        out[fmt] = (path, planted)
    return out


def _rows(n: int = 6) -> np.ndarray:
    return np.random.default_rng(1).normal(size=(n, 12, 12, 1)).astype("float32")


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_a_kernel_scaled_in_a_converted_file_is_named_on_a_graph_reference(graph_reference, converted, fmt):
    reference = load_model(graph_reference)
    assert type(reference).__name__ == "FrozenSignatureModel"  # the v1 loader's graph: no Keras layers
    with pytest.raises(ParityError) as info:
        assert_outputs_close(load_model(converted[fmt][1]), reference, inputs=_rows())
    hints = info.value.report.hints
    first = hints[0]
    assert first.cause == "weights_differ", [str(h) for h in hints]
    assert "the reference's `head/kernel` x1.01" in first.message, str(first)
    assert "reproduces the candidate's outputs" in first.evidence, str(first)
    assert [h.cause for h in hints] == ["weights_differ"], [str(h) for h in hints]  # nothing after it


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_a_correct_converted_file_names_no_weight(graph_reference, converted, fmt):
    from pytest_modelparity.diagnose.converted_weights import suspects

    reference = load_model(graph_reference)
    candidate = load_model(converted[fmt][0])
    found, exact, kernels = suspects(reference.weights(), candidate.weights())
    assert (exact, kernels, [s[1] for s in found]) == (1, 2, ["stem/kernel"])  # the folded one: a suspect
    assert_outputs_close(candidate, reference, inputs=_rows())
    # made to fail by exact equality: the folded stem kernel is a suspect, never named
    with pytest.raises(ParityError) as info:
        assert_outputs_close(candidate, reference, inputs=_rows(), rtol=0.0, atol=0.0)
    assert "weights_differ" not in [h.cause for h in info.value.report.hints], \
        [str(h) for h in info.value.report.hints]


def test_predict_with_weights_leaves_the_reference_as_it_was(graph_reference):
    reference = load_model(graph_reference)
    x = _rows(2)
    before = reference.predict(x)["head"]
    kernel = reference.weights()["head/kernel"]
    changed = reference.predict_with_weights(x, {"head/kernel": np.zeros_like(kernel)})["head"]
    assert np.ptp(changed) == 0 and np.ptp(before) > 0.01  # a zero kernel: sigmoid(bias) everywhere
    np.testing.assert_array_equal(reference.predict(x)["head"], before)


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_the_layer_table_of_a_correct_form_against_the_graph_reference(graph_reference, converted, fmt):
    """Its inference batch-norm's unused outputs are not fetched (the session rewrites that node
    into one output: the whole table failed); no row diverges."""
    from pytest_modelparity import localize_divergence

    rows = localize_divergence(load_model(graph_reference), load_model(converted[fmt][0]), _rows(2))
    assert any(r.op == "FusedBatchNormV3" for r in rows), [(r.layer, r.op) for r in rows]
    assert not any(r.diverged for r in rows), [(r.layer, r.max_rel) for r in rows if r.diverged]


@pytest.mark.parametrize("kind", ["saved_model", "graphdef", "checkpoint"])
def test_predict_with_weights_on_every_graph_form(kind, tmp_path):
    """A TF2 SavedModel's variables, a frozen graph's constants, a checkpoint's (resource)
    variables: replaced for one run, as they were after it."""
    from tests import tf1_graphs
    from tests.models import images, tiny_cnn

    if kind == "saved_model":
        model, x = load_model(export_model(tiny_cnn(0), "saved_model", tmp_path / "sm")), images(2)
    else:
        writer = tf1_graphs.freeze if kind == "graphdef" else tf1_graphs.save_checkpoint
        model, x = load_model(writer(tmp_path / "g", dropout=False, seed=0), kind), tf1_graphs.features(3)
    weights = model.weights()
    name = next(n for n, v in weights.items() if v.ndim >= 2)
    before = model.predict(x)
    changed = model.predict_with_weights(x, {name: np.zeros_like(weights[name])})
    assert any(not np.allclose(changed[k], before[k]) for k in before), name
    after = model.predict(x)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])
