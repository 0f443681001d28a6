"""Issue 48: an untrusted graph may run only ops known to compute.

The list is derived (op_allowlist.py: TensorFlow's own op modules, each judged once), so the
tests take what the installed TensorFlow registers and what the converters map, not a list
copied here: every op of ``tf.raw_ops`` outside the allowlist is refused by the scan the loaders
call (a one-node graph per op), every op tensorflowjs and tf2onnx map is allowed, and a real
SavedModel that runs an op outside the list is refused untrusted and runs trusted.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from pytest_modelparity import ModelLoadError, load_model
from pytest_modelparity.formats import missing_runtime

pytestmark = pytest.mark.skipif(missing_runtime("saved_model") is not None,
                                reason="needs TensorFlow: pip install 'pytest-modelparity[tensorflow]'")


def _scan_one(tmp_path: Path, op: str) -> list:
    from tensorflow.core.framework import graph_pb2

    from pytest_modelparity.formats.tensorflow.trust import scan_file

    graph = graph_pb2.GraphDef()
    graph.node.add(name="n", op=op)
    return scan_file(tmp_path / "one.pb", "graphdef", proto=graph)


def test_every_tensorflow_op_outside_the_allowlist_is_refused_by_the_scan(tmp_path):
    import tensorflow as tf

    from pytest_modelparity.formats.tensorflow.op_allowlist import not_known_to_compute
    from pytest_modelparity.formats.tensorflow.trust import REACHING_OPS

    ops = sorted(o for o in dir(tf.raw_ops) if not o.startswith("_"))
    wrong = []
    refused = 0
    for op in ops:
        found = _scan_one(tmp_path, op)
        expected = not_known_to_compute(op) is not None or op in REACHING_OPS
        refused += expected
        if bool(found) != expected:
            wrong.append((op, [f.words() for f in found]))
    assert not wrong, wrong[:20]
    # the derivation leaves a real list on both sides
    assert 250 < refused < len(ops) - 700, (refused, len(ops))
    for op in ("ReadFile", "WriteFile", "PyFunc", "CacheDatasetV2", "ShardedFilename", "CollectiveReduceV2", "Fact",
               "DebugIdentityV3", "BatchFunction"):
        assert _scan_one(tmp_path, op), op
    for op in ("MatMul", "Conv2D", "VarHandleOp", "ReadVariableOp", "StatefulPartitionedCall", "While",
               "LookupTableFindV2", "StringSplitV2", "ResourceApplyAdam", "TensorListReserve", "Assert"):
        assert not _scan_one(tmp_path, op), op


def test_an_op_no_library_registers_is_refused_as_unknown(tmp_path):
    (finding,) = _scan_one(tmp_path, "MyCustomOpFromASharedLibrary")
    assert "no TensorFlow library" in finding.reaches


def _converter_ops() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    spec = importlib.util.find_spec("tensorflowjs")
    if spec is not None and spec.origin:
        tfjs: set[str] = set()
        import json
        for path in glob.glob(os.path.join(os.path.dirname(spec.origin), "op_list", "*.json")):
            tfjs.update(entry["tfOpName"] for entry in json.loads(Path(path).read_text()))
        found["tensorflowjs"] = tfjs
    if importlib.util.find_spec("tf2onnx") is not None:
        import tf2onnx.onnx_opset  # noqa: F401  (registers the handlers)
        from tf2onnx.handler import tf_op

        found["tf2onnx"] = {op for versions in tf_op.get_opsets().values() for handlers in versions for op in handlers}
    return found


def test_every_registered_op_the_converters_map_is_known_to_compute():
    from tensorflow.python.framework import op_def_registry

    from pytest_modelparity.formats.tensorflow.op_allowlist import not_known_to_compute

    converters = _converter_ops()
    if not converters:
        pytest.skip("neither tensorflowjs nor tf2onnx is installed: bash scripts/install.sh installs both")
    # mapped, yet refused untrusted with their reason: input pipelines (a TF1 graph's iterator),
    # TensorFlow Decision Forests' model loaded from a path
    refused_by_design = {"IteratorGetNext", "IteratorV2", "SimpleMLCreateModelResource",
                         "SimpleMLInferenceOpWithHandle", "SimpleMLLoadModelFromPathWithHandle"}
    for name, ops in converters.items():
        registered = {op for op in ops if op_def_registry.get(op) is not None}
        assert len(registered) > 150, (name, len(registered))
        outside = sorted(op for op in registered - refused_by_design if not_known_to_compute(op) is not None)
        assert not outside, (name, outside)


def _module_with(tmp_path: Path, which: str) -> Path:
    """A tf.Module SavedModel whose serving function runs ``which``: an op of a refused module
    (``ShardedFilename``, io) or of no known library (``Fact``), folded into a numeric output."""
    import tensorflow as tf

    class Net(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")], autograph=False)
        def __call__(self, x):
            if which == "io":
                text = tf.raw_ops.ShardedFilename(basename="model", shard=0, num_shards=1)
            else:
                text = tf.raw_ops.Fact()
            return {"y": x * 2.0 + tf.cast(tf.strings.length(text), tf.float32) * 0.0}

    net = Net()
    path = tmp_path / f"sm_{which}"
    tf.saved_model.save(net, str(path), signatures=net.__call__)
    return path


@pytest.mark.parametrize("which,op,words", [("io", "ShardedFilename", "reach files"),
                                            ("unknown", "Fact", "no TensorFlow library known to compute")])
def test_a_saved_model_running_an_op_outside_the_list_is_refused_untrusted_and_runs_trusted(tmp_path, which, op,
                                                                                             words):
    path = _module_with(tmp_path, which)
    with pytest.raises(ModelLoadError) as refused:
        load_model(path, format="saved_model")
    text = str(refused.value)
    assert op in text and words in text and str(path) in text and "trust" in text, text
    model = load_model(path, format="saved_model", trusted=True)
    x = np.arange(6, dtype="float32").reshape(2, 3)
    out = model.predict(x)
    (y,) = out.values() if isinstance(out, dict) else (out,)
    np.testing.assert_allclose(np.asarray(y), x * 2.0)
