"""A TF1 conv net with FusedBatchNormV3 (inference mode), saved as a TF1 checkpoint and frozen
to a ``.pb`` the TF1 way: the usual TF1 deployment sources (tests/test_trained_forms.py).
Input ``image:0`` (None, 8, 8, 3), output ``probs:0`` (None, 4); batch-norm statistics and a
classifier scaled like a trained net's, so the softmax does not collapse."""

from __future__ import annotations

from pathlib import Path

import numpy as np

def build(directory: Path) -> tuple[Path, Path]:
    """``(checkpoint prefix, frozen .pb)`` written into ``directory``."""
    import tensorflow as tf
    v1 = tf.compat.v1
    rng = np.random.default_rng(0)
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 8, 8, 3], name="image")
        k = v1.get_variable("conv/kernel", initializer=rng.normal(0, 0.4, (3, 3, 3, 8)).astype("float32"))
        h = tf.nn.conv2d(x, k, 1, "SAME")
        scale = v1.get_variable("bn/gamma", initializer=rng.uniform(0.5, 1.5, 8).astype("float32"))
        offset = v1.get_variable("bn/beta", initializer=rng.normal(0, 0.1, 8).astype("float32"))
        mean = v1.get_variable("bn/moving_mean", initializer=rng.normal(0, 0.2, 8).astype("float32"), trainable=False)
        var = v1.get_variable("bn/moving_variance", initializer=rng.uniform(0.5, 2.0, 8).astype("float32"), trainable=False)
        h, _, _ = v1.nn.fused_batch_norm(h, scale, offset, mean=mean, variance=var, is_training=False, name="bn")
        h = tf.reduce_mean(tf.nn.relu(h), axis=[1, 2])
        w = v1.get_variable("logits/kernel", initializer=rng.normal(0, 1.5, (8, 4)).astype("float32"))
        tf.nn.softmax(tf.matmul(h, w), name="probs")
        init = v1.global_variables_initializer()
        with v1.Session(graph=graph) as sess:
            sess.run(init)
            prefix = v1.train.Saver().save(sess, str(Path(directory) / "model.ckpt"))
            frozen = v1.graph_util.convert_variables_to_constants(sess, graph.as_graph_def(), ["probs"])
    assert any(n.op == "FusedBatchNormV3" for n in frozen.node)
    pb = Path(directory) / "frozen.pb"
    pb.write_bytes(frozen.SerializeToString())
    return Path(prefix), pb
