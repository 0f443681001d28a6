"""A recorded run as a form (formats/recorded/): written by ``record_outputs`` or by an app
outside Python, loaded by ``load_model``, judged like a form run here, and refused when its
manifest is hostile or its inputs are not the recorded ones."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pytest_modelparity import (BatchMismatchError, InvalidArgumentError, ModelLoadError, ParityError,
                                assert_outputs_close, export_model, load_model, record_outputs, write_inputs)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

NPZ = Path(__file__).parent / "data" / "gpu_drift_h200.npz"


@pytest.fixture(scope="module")
def model():
    import keras

    x = keras.Input((16,), name="x")
    h = keras.layers.Dense(32, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(seed=1))(x)
    y = keras.layers.Dense(10, name="logits", kernel_initializer=keras.initializers.GlorotUniform(seed=2))(h)
    return keras.Model(x, y, name="mlp")


@pytest.fixture(scope="module")
def batch():
    return np.random.default_rng(0).normal(size=(8, 16)).astype(np.float32)


def _tf32_like(reference: np.ndarray) -> np.ndarray:
    """``reference`` with the error TF32 left on a real GPU run: the H200's MLP tf32 error as a
    share of its scale (tests/data), laid onto this output's shape and scale."""
    with np.load(NPZ) as z:
        a, e = z["mlp_784_1024_10__tf32__actual"], z["mlp_784_1024_10__tf32__expected"]
    share = ((a.astype(np.float64) - e) / np.max(np.abs(e))).reshape(-1)[:reference.size].reshape(reference.shape)
    return (reference + share * np.max(np.abs(reference))).astype(np.float32)


def test_a_gpu_run_is_judged_by_the_gpu_rules(tmp_path, model, batch):
    reference = np.asarray(model(batch))
    gpu = _tf32_like(reference)
    share = float(np.max(np.abs(gpu - reference)) / np.max(np.abs(reference)))
    assert 1e-4 < share < 2e-3  # TF32-sized: far above this model's float32 error
    on_gpu = load_model(record_outputs(model, batch, tmp_path / "gpu", outputs={"logits": gpu},
                                       form={"format": "keras", "device": "gpu:0", "device_name": "NVIDIA H200"}))
    assert on_gpu.device == "gpu:0" and on_gpu.format_variant == "keras"
    report = assert_outputs_close(on_gpu, model, inputs=on_gpu.inputs_batch)
    assert report.meta["device"] == "gpu"
    assert "gpu (TF32 on)" in report.outputs[0].tolerance.source
    # the same outputs said to come from a CPU: the model's own float32 error judges, and fails
    on_cpu = load_model(record_outputs(model, batch, tmp_path / "cpu", outputs={"logits": gpu}))
    with pytest.raises(ParityError, match="recorded keras vs keras model 'mlp'"):
        assert_outputs_close(on_cpu, model, inputs=on_cpu.inputs_batch)


def test_a_recording_answers_only_its_inputs(tmp_path, model, batch):
    folder = record_outputs(model, batch, tmp_path / "r")
    recorded = load_model(folder)
    assert set(recorded.inputs_batch) == {"x"} and recorded.inputs_batch["x"].dtype == np.float32
    np.testing.assert_array_equal(recorded.predict(batch)["logits"], np.asarray(model(batch)))
    with pytest.raises(BatchMismatchError, match=r"(?s)cannot run.*input 'x': 1 of 128 values differ.*"
                                                 r"inputs=recorded.inputs_batch"):
        recorded.predict(np.where(np.arange(batch.size).reshape(batch.shape) == 5, 9.0, batch).astype(np.float32))
    with pytest.raises(BatchMismatchError, match=r"shape \(4, 16\) where \(8, 16\) was recorded"):
        recorded.predict(batch[:4])
    with pytest.raises(InvalidArgumentError, match="already holds a recording.*overwrite=True"):
        record_outputs(model, batch, folder)
    record_outputs(model, batch[:2], folder, overwrite=True)
    assert load_model(folder).inputs_batch["x"].shape == (2, 16)


def test_a_form_recorded_under_its_own_names_feeds_the_reference(tmp_path, model, batch):
    """An h5 or graphdef form names its input otherwise ("keras_tensor"): its recorded inputs
    still feed the reference, through the binding (or as the one array a Keras model takes)."""
    outputs = {"Identity:0": np.asarray(model(batch))}
    recorded = load_model(record_outputs(model, {"keras_tensor": batch}, tmp_path / "r", outputs=outputs))
    assert list(recorded.inputs_batch) == ["keras_tensor"]
    report = assert_outputs_close(recorded, load_model(model), inputs=recorded.inputs_batch)
    assert report.meta["binding"]["inputs"][0]["other"] == "keras_tensor"
    assert assert_outputs_close(recorded, model, inputs=recorded.inputs_batch).passed


def test_dtypes_are_kept_as_they_are(tmp_path, model, batch):
    half = np.asarray(model(batch)).astype(np.float16)
    recorded = load_model(record_outputs(model, batch, tmp_path / "f16", outputs={"logits": half}))
    assert recorded.predict(recorded.inputs_batch)["logits"].dtype == np.float16
    assert recorded.outputs[0].dtype == np.float16


# -- outputs made outside Python ---------------------------------------------------------------

APP = textwrap.dedent(r"""
    // A web app's part, in Node: read the inputs the plugin wrote, run the tfjs model, dump.
    const fs = require('fs'), path = require('path');
    const req = require('module').createRequire(path.join(process.env.TFJS_MODULES, 'noop.js'));
    const tf = req('@tensorflow/tfjs-core'); req('@tensorflow/tfjs-backend-cpu');
    const { loadGraphModel } = req('@tensorflow/tfjs-converter');
    async function main() {
      const [modelJson, inputsJson, dumpJson, shift] = process.argv.slice(2);
      await tf.setBackend('cpu');
      const dir = path.dirname(modelJson);
      const model = await loadGraphModel({ load: async () => tf.io.getModelArtifactsForJSON(
        JSON.parse(fs.readFileSync(modelJson, 'utf8')), async (manifest) => {
          const specs = [], parts = [];
          for (const g of manifest) { specs.push(...g.weights); for (const p of g.paths) parts.push(fs.readFileSync(path.join(dir, p))); }
          const all = Buffer.concat(parts);
          return [specs, all.buffer.slice(all.byteOffset, all.byteOffset + all.byteLength)];
        }) });
      const given = JSON.parse(fs.readFileSync(inputsJson, 'utf8'));
      const [name] = Object.keys(given);
      const data = given[name].data.map((v) => v + Number(shift || 0));  // shift: an app that feeds other inputs
      const x = tf.tensor(data, given[name].shape, given[name].dtype);
      const out = model.execute({ [model.inputNodes[0]]: x }, model.outputNodes[0]);
      const dump = { produced_by: { tfjs: tf.version_core, backend: tf.getBackend(), app: 'test app' },
                     inputs: { [name]: { dtype: given[name].dtype, shape: given[name].shape, data: Array.from(await x.data()) } },
                     outputs: { [model.outputNodes[0]]: { dtype: out.dtype, shape: out.shape, data: Array.from(await out.data()) } } };
      fs.writeFileSync(dumpJson, JSON.stringify(dump));
    }
    main().catch((err) => { console.error(err); process.exit(1); });
""")


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is needed for the web-app-style dump")
def test_a_web_app_dump_loads_and_compares_and_other_inputs_are_refused(tmp_path, model, batch):
    from pytest_modelparity.runtime.tfjs_runner import ensure_node_modules

    tfjs = export_model(model, "tfjs", tmp_path / "web")
    folder = write_inputs(batch, tmp_path / "dump", model=load_model(model), format="tfjs")
    assert {"inputs.json", "batch-0.inputs.npz", "modelparity-recording.json"} <= {p.name for p in folder.iterdir()}
    with pytest.raises(ModelLoadError, match="outputs.json.*missing"):
        load_model(folder)  # the app has not dumped yet
    app = tmp_path / "app.js"
    app.write_text(APP)
    env = {**os.environ, "TFJS_MODULES": str(ensure_node_modules(quiet=True))}
    model_json = tfjs / "model.json" if tfjs.is_dir() else tfjs
    subprocess.run(["node", str(app), str(model_json), str(folder / "inputs.json"), str(folder / "outputs.json")],
                   check=True, env=env, timeout=120)
    recorded = load_model(folder)
    assert recorded.format_variant == "tfjs" and recorded.produced_by["backend"] == "cpu"
    report = assert_outputs_close(recorded, model, inputs=recorded.inputs_batch)
    assert report.passed and report.title.startswith("recorded tfjs vs")
    subprocess.run(["node", str(app), str(model_json), str(folder / "inputs.json"), str(folder / "outputs.json"),
                    "0.5"], check=True, env=env, timeout=120)
    with pytest.raises(ModelLoadError, match=r"(?s)the dump's inputs are not the recorded ones \(input 'x': 128 of 128 "
                                             r"values differ, the largest by 0.5\).*feed the app the recorded inputs"):
        load_model(folder)


# -- hostile manifests ----------------------------------------------------------------------------

def _manifest(folder: Path) -> dict:
    return json.loads((folder / "modelparity-recording.json").read_text())


def _rewrite(folder: Path, change) -> None:
    data = _manifest(folder)
    change(data)
    (folder / "modelparity-recording.json").write_text(json.dumps(data))


@pytest.mark.parametrize("name,problem", [("../outside.npz", "not a plain file name"),
                                          ("/etc/passwd", "not a plain file name"),
                                          ("sub/batch.npz", "not a plain file name"),
                                          ("gone.npz", "is missing")])
def test_paths_outside_the_folder_are_refused(tmp_path, model, batch, name, problem):
    folder = record_outputs(model, batch, tmp_path / "r")
    _rewrite(folder, lambda d: d["batches"][0].update(outputs=name))
    with pytest.raises(ModelLoadError, match=problem) as err:
        load_model(folder)
    assert str(folder) in str(err.value) and "'recorded'" in str(err.value)


def test_a_symlinked_file_is_refused(tmp_path, model, batch):
    folder = record_outputs(model, batch, tmp_path / "r")
    secret = tmp_path / "secret.npz"
    shutil.move(folder / "batch-0.outputs.npz", secret)
    os.symlink(secret, folder / "batch-0.outputs.npz")
    with pytest.raises(ModelLoadError, match="is a symbolic link"):
        load_model(folder)


def test_huge_shapes_are_refused_before_allocating(tmp_path, model, batch):
    folder = record_outputs(model, batch, tmp_path / "r")
    _rewrite(folder, lambda d: d["outputs"][0].update(shape=[None, 1 << 20, 1 << 20]))
    with pytest.raises(ModelLoadError, match="more than a recording may hold"):
        load_model(folder)
    # an .npz whose header claims a huge array (a few bytes on disk)
    folder = record_outputs(model, batch, tmp_path / "r2")
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (1 << 20, 1 << 20)})
    with zipfile.ZipFile(folder / "batch-0.outputs.npz", "w") as zf:
        zf.writestr("logits.npy", header.getvalue())
    with pytest.raises(ModelLoadError, match=r"claims shape \(1048576, 1048576\)"):
        load_model(folder)


def test_a_pickle_and_a_wrong_version_are_refused(tmp_path, model, batch):
    folder = record_outputs(model, batch, tmp_path / "r")
    np.savez(folder / "batch-0.outputs.npz", logits=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ModelLoadError, match="Python objects"):
        load_model(folder)
    _rewrite(folder, lambda d: d.update(modelparity_recording=99))
    with pytest.raises(ModelLoadError, match="this plugin reads version 1"):
        load_model(folder)


@pytest.mark.parametrize("odd", [np.array(["a", "b"]), np.array([b"a", b"b"]),
                                 np.array(["2026-12-03"], dtype="datetime64[D]"),
                                 np.zeros(2, dtype=[("x", "f4"), ("y", "i4")])],
                         ids=["str", "bytes", "datetime", "structured"])
def test_non_numeric_arrays_in_a_recording_are_refused_as_docs_say(tmp_path, model, batch, odd):
    folder = record_outputs(model, batch, tmp_path / "r")
    np.savez(folder / "batch-0.outputs.npz", logits=odd)
    with pytest.raises(ModelLoadError, match=r"array 'logits' has dtype .*numeric arrays only"):
        load_model(folder)


def test_json_nested_past_the_parser_is_a_true_error(tmp_path):
    """Issue 48: 200,000 levels deep raised a bare RecursionError."""
    from pytest_modelparity.formats.recorded.arrays import read_tensors
    from pytest_modelparity.formats.tfjs.load import read_model_json

    deep = "[" * 200_000 + "]" * 200_000
    (tmp_path / "outputs.json").write_text('{"outputs": ' + deep + "}")
    with pytest.raises(ModelLoadError, match="nested deeper than Python's parser"):
        read_tensors(tmp_path / "outputs.json")
    (tmp_path / "model.json").write_text('{"modelTopology": ' + deep + "}")
    with pytest.raises(ModelLoadError, match="nested deeper than Python's JSON parser"):
        read_model_json(tmp_path / "model.json")
