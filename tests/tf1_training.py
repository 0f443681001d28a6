"""A TF1 *training* graph as third parties ship one (issue 37): a Placeholder input, a bool
``is_training`` placeholder switching a fused batch norm and a dropout through ``tf.cond``
(v1 control flow: Switch/Merge, as TF 1.x wrote it), a labels placeholder, a loss and Adam.

Tensor names: input ``x`` (None, 8, 8, 3), switch ``is_training`` (bool scalar), labels
``labels`` (None,), output ``predictions`` (None, 3), a Softmax found without naming it.
Small on purpose: a test builds, saves and converts it in seconds.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

import numpy as np

SIDE, CHANNELS, FILTERS, CLASSES = 8, 3, 4, 3
FOREIGN = "/home/author/experiments/tagger/"  # the path the author's state file names


@contextlib.contextmanager
def tf1_graph() -> Iterator[Any]:
    """A new ``tf.Graph``, made the default, whose ``tf.cond`` writes v1 control flow (Switch/Merge,
    as TF 1.x graphs hold it); control flow v2 is switched back on afterwards if it was on."""
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    v2_flow = v1.control_flow_v2_enabled()
    v1.disable_control_flow_v2()
    try:
        with graph.as_default():
            yield graph
    finally:
        if v2_flow:
            v1.enable_control_flow_v2()


def build(*, seed: int = 0, kernel_scale: float = 1.0, trained_init: bool = True):
    """``(graph, init_op, assign_trained)``: conv -> cond(batch norm) -> relu -> mean (the mean
    of ``tf.nn.moments``) -> cond(dropout) -> dense -> softmax. Three sinks besides the output,
    as the tagger of issue 50 has: the moments' unused variance and, inside the training
    branch, the two outputs of an unused ``tf.nn.moments``. ``assign_trained`` sets the batch
    norm's moving statistics to trained-like values (an initialised net has mean 0, variance 1)."""
    import tensorflow as tf

    v1 = tf.compat.v1
    rng = np.random.default_rng(seed)
    with tf1_graph() as graph:
        x = v1.placeholder(tf.float32, [None, SIDE, SIDE, CHANNELS], name="x")
        is_training = v1.placeholder(tf.bool, [], name="is_training")
        labels = v1.placeholder(tf.int64, [None], name="labels")
        kernel = v1.get_variable("conv/kernel", initializer=(rng.normal(0, 0.4, (3, 3, CHANNELS, FILTERS))
                                                             * kernel_scale).astype("float32"))
        h = tf.nn.conv2d(x, kernel, strides=1, padding="SAME")
        scale = v1.get_variable("bn/gamma", initializer=rng.uniform(0.5, 1.5, FILTERS).astype("float32"))
        offset = v1.get_variable("bn/beta", initializer=rng.normal(0, 0.1, FILTERS).astype("float32"))
        mean = v1.get_variable("bn/moving_mean", initializer=np.zeros(FILTERS, "float32"), trainable=False)
        var = v1.get_variable("bn/moving_variance", initializer=np.ones(FILTERS, "float32"), trainable=False)

        def bn_train():
            y, _m, _v = v1.nn.fused_batch_norm(h, scale, offset, epsilon=1e-3, is_training=True)
            tf.nn.moments(h, [0, 1, 2], name="batch_moments")  # computed, never used: two sinks here
            return y

        def bn_infer():
            y, _m, _v = v1.nn.fused_batch_norm(h, scale, offset, mean=mean, variance=var, epsilon=1e-3,
                                               is_training=False)
            return y

        h = v1.cond(is_training, bn_train, bn_infer, name="bn_cond")
        # Mean pooling as the TF1 tagger does it: the variance of the moments is left unused, a sink.
        h, _variance = tf.nn.moments(tf.nn.relu(h), axes=[1, 2])
        h = v1.cond(is_training, lambda: v1.nn.dropout(h, rate=0.5), lambda: tf.identity(h), name="dropout")
        w = v1.get_variable("dense/kernel", initializer=rng.normal(0, 0.6, (FILTERS, CLASSES)).astype("float32"))
        b = v1.get_variable("dense/bias", initializer=rng.normal(0, 0.1, CLASSES).astype("float32"))
        logits = tf.add(tf.matmul(h, w), b, name="logits")
        tf.nn.softmax(logits, name="predictions")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        v1.train.AdamOptimizer(1e-3).minimize(loss)
        init = v1.global_variables_initializer()
        assign = tf.group(v1.assign(mean, rng.normal(0, 0.3, FILTERS).astype("float32")),
                          v1.assign(var, rng.uniform(0.5, 2.0, FILTERS).astype("float32")))
    return graph, init, assign if trained_init else None


def batch(rows: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, SIDE, SIDE, CHANNELS)).astype("float32")


def save_shipped(directory: Path, *, seed: int = 0, kernel_scale: float = 1.0, frozen: Path | None = None
                 ) -> np.ndarray:
    """Save under the prefix ``<directory>/`` with a state file naming the author's machine and a
    stale ``_output_shapes`` in the ``.meta``; freeze to ``frozen`` (``is_training`` folded to
    False, only ``predictions`` kept) when given. Returns the inference predictions on ``batch()``."""
    import tensorflow as tf

    graph, init, assign = build(seed=seed, kernel_scale=kernel_scale)
    directory.mkdir(parents=True, exist_ok=True)
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        sess.run(assign)
        tf.compat.v1.train.Saver().save(sess, str(directory) + "/")
        truth = sess.run("predictions:0", {"x:0": batch(), "is_training:0": False})
        if frozen is not None:  # frozen by hand: the flag folded to False, only the output kept
            graph_def = tf.compat.v1.graph_util.convert_variables_to_constants(
                sess, graph.as_graph_def(), ["predictions"])
            folded = tf.Graph()
            with folded.as_default():
                tf.graph_util.import_graph_def(graph_def, {"is_training:0": tf.constant(False, name="is_training_value")},
                                               name="")
            kept = tf.compat.v1.graph_util.extract_sub_graph(folded.as_graph_def(), ["predictions"])
            frozen.write_bytes(kept.SerializeToString())
    (directory / "checkpoint").write_text(f'model_checkpoint_path: "{FOREIGN}"\n'
                                          f'all_model_checkpoint_paths: "{FOREIGN}"\n')
    _stale_output_shapes(directory / ".meta")
    return np.asarray(truth)


def _stale_output_shapes(meta: Path) -> None:
    """A TF 1.x ``_output_shapes`` that TF 2 contradicts, on a gradient node inference never runs."""
    from tensorflow.core.protobuf import meta_graph_pb2

    proto = meta_graph_pb2.MetaGraphDef()
    proto.ParseFromString(meta.read_bytes())
    node = next(n for n in proto.graph_def.node if n.name.startswith("gradients/") and n.op == "MatMul")
    shape = node.attr["_output_shapes"].list.shape.add() if not node.attr["_output_shapes"].list.shape \
        else node.attr["_output_shapes"].list.shape[0]
    del shape.dim[:]
    shape.dim.add().size = 7
    shape.dim.add().size = 5
    meta.write_bytes(proto.SerializeToString())
