"""A TF1 training graph written after ``tf.compat.v1.disable_eager_execution()`` (If/While v2,
resource variables, Adam; issue 50), saved by a Saver: it loads with ``feeds`` alone, freezes,
and converts to tflite, onnx and tfjs, each form passing against the checkpoint at the float64
twin's floor. Before, every conversion failed ("input resource[0] expected type resource !=
float"; TFLite aborted the process; a loop body that reads a variable, frozen twice, was "a
duplicate function ... where the definitions differ"). A graph whose output runs a variable update cannot be
frozen: the error names the op and an ``outputs=`` that works, and following it converts.
The graphs are built once, in a child process (``tests/tf1_eager_off.py``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import tf1_eager_off  # noqa: E402
from pytest_modelparity import assert_outputs_close, export_model, load_model  # noqa: E402
from pytest_modelparity.errors import ModelLoadError  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]

FEEDS = {"is_training": False}
TWIN_FLOOR = "float64 run of its graph twin"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tf1_eager_off.build(tmp_path_factory.mktemp("eager_off"))


def test_loads_with_feeds_alone_and_freezes_without_the_training_branch(written: Path) -> None:
    with load_model(written / "model", feeds=FEEDS) as model:
        assert [s.name for s in model.inputs] == ["x"]
        assert [s.name for s in model.outputs] == ["predictions"]  # not moments/Squeeze_1, not while/Identity*
        np.testing.assert_array_equal(model.predict(tf1_eager_off.batch())["predictions"],
                                      np.load(written / "truth.npy"))
        frozen = model.frozen_graph().graph_def
    ops = {n.op for n in frozen.node} | {n.op for f in frozen.library.function for n in f.node_def}
    assert not ops & {"If", "StatelessIf", "VarHandleOp", "ReadVariableOp", "AssignVariableOp", "OptionalFromValue",
                      "TensorListPushBack", "EmptyTensorList", "RandomUniform"}, ops
    assert ops & {"While", "StatelessWhile"}, ops  # the loop is kept, with its inference body


@pytest.mark.usefixtures("installed_node_modules")
@pytest.mark.parametrize("format", ["tflite", "onnx", "tfjs"])
def test_converts_and_passes_at_the_twins_floor(written: Path, tmp_path: Path, format: str) -> None:
    path = export_model(written / "model", format, tmp_path / "m", feeds=FEEDS)
    with load_model(path) as converted, load_model(written / "model", feeds=FEEDS) as reference:
        report = assert_outputs_close(converted, reference, inputs=tf1_eager_off.batch(6, seed=3))
    assert TWIN_FLOOR in str(report), str(report)


def test_an_output_that_runs_a_variable_update_is_refused_with_a_fix_that_works(written: Path,
                                                                                 tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as info:
        export_model(written / "stateful", "tflite", tmp_path / "m", feeds=FEEDS)
    text = str(info.value)
    assert "AssignAddVariableOp on calls" in text and "tflite, onnx, tfjs" in text, text
    assert "fix: pass outputs=['predictions:0']" in text, text
    path = export_model(written / "stateful", "tflite", tmp_path / "m", feeds=FEEDS, outputs=["predictions:0"])
    with load_model(path) as converted, load_model(written / "stateful", feeds=FEEDS,
                                                   outputs=["predictions:0"]) as reference:
        assert_outputs_close(converted, reference, inputs=tf1_eager_off.batch())


def test_an_update_in_the_untaken_branch_of_a_v1_cond_is_no_refusal(tmp_path: Path) -> None:
    """A v1 ``tf.cond`` (Switch/Merge) whose training branch assigns a resource variable: the
    branch is pruned after the freeze once ``is_training`` is folded, so it is no variable update
    the outputs run (the check refused it until it left the untaken branch out)."""
    import tensorflow as tf
    import tf1_training

    v1 = tf.compat.v1
    with tf1_training.tf1_graph() as graph:
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        is_training = v1.placeholder(tf.bool, [], name="is_training")
        w = v1.get_variable("w", initializer=np.random.default_rng(0).normal(size=(4, 2)).astype("float32"))
        moving = v1.get_variable("moving_mean", initializer=np.full(2, 0.5, "float32"), trainable=False)
        h = tf.matmul(x, w)

        def train():
            mean, _ = tf.nn.moments(h, [0])
            with tf.control_dependencies([v1.assign(moving, mean)]):
                return h - mean

        tf.nn.softmax(v1.cond(is_training, train, lambda: h - moving), name="predictions")
        with v1.Session(graph=graph) as session:
            session.run(v1.global_variables_initializer())
            v1.train.Saver().save(session, str(tmp_path / "ckpt" / "model.ckpt"))
    assert "AssignVariableOp" in {n.op for n in graph.as_graph_def().node}
    path = export_model(tmp_path / "ckpt", "tflite", tmp_path / "m", feeds=FEEDS)
    batch = np.random.default_rng(1).normal(size=(3, 4)).astype("float32")
    with load_model(path) as converted, load_model(tmp_path / "ckpt", feeds=FEEDS) as reference:
        assert_outputs_close(converted, reference, inputs=batch)


def test_a_frozen_functions_loop_results_stay_outputs(tmp_path: Path) -> None:
    """The unused outputs of a While (``while/Identity_<i>``) are no output candidates, but a frozen
    tf.function's own outputs (``Identity``, ``Identity_1``) that are a loop's results are."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")], autograph=False)
    def run(x):
        _, state = tf.while_loop(lambda i, s: i < 3, lambda i, s: (i + 1, tf.tanh(s * 1.5)), [tf.constant(0), x])
        return {"state": state, "probs": tf.nn.softmax(state)}

    frozen = convert_variables_to_constants_v2(run.get_concrete_function(), lower_control_flow=False)
    path = tmp_path / "loop.pb"
    path.write_bytes(frozen.graph.as_graph_def().SerializeToString())
    with load_model(path) as model:
        assert len(model.outputs) == 2, model.outputs
