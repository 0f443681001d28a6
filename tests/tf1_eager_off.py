"""A TF1 training graph written the way a newcomer writes one today: ``tf.compat.v1`` after
``tf.compat.v1.disable_eager_execution()`` (issue 50). ``tf.cond`` is then an ``If`` op and
``tf.while_loop`` a ``While`` op (control flow v2, branch and body functions), variables are
resource variables, and ``minimize`` rewrites the forward If/While for gradients (Optional
outputs, TensorList accumulators). Saved by a Saver after one training step.

``disable_eager_execution`` is process-wide, so this file runs as its own process:
``python tf1_eager_off.py DIR`` writes ``DIR/model/model.ckpt*`` (input ``x`` (None, 8, 8, 3),
switch ``is_training``, labels, output ``predictions`` (None, 3)), ``DIR/truth.npy`` (its
inference predictions on ``batch()``) and ``DIR/stateful/model.ckpt*``: a graph whose output
``served`` runs a call counter's ``AssignAddVariableOp`` first (``tf.control_dependencies``),
``predictions`` being the tensor before it. ``build(DIR)`` runs it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

SIDE, CHANNELS, FILTERS, CLASSES = 8, 3, 4, 3


def batch(rows: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, SIDE, SIDE, CHANNELS)).astype("float32")


def build(directory: Path, timeout: float = 300) -> Path:
    """Write the graphs into ``directory`` from a child process; ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, __file__, str(directory)], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"building the eager-off graphs failed:\n{done.stderr[-4000:]}")
    return directory


def _model(tf, rng, *, stateful: bool):
    v1 = tf.compat.v1
    x = v1.placeholder(tf.float32, [None, SIDE, SIDE, CHANNELS], name="x")
    is_training = v1.placeholder(tf.bool, [], name="is_training")
    labels = v1.placeholder(tf.int64, [None], name="labels")
    kernel = v1.get_variable("conv/kernel", initializer=rng.normal(0, .4, (3, 3, CHANNELS, FILTERS)).astype("float32"))
    h = tf.nn.conv2d(x, kernel, 1, "SAME")
    scale = v1.get_variable("bn/gamma", initializer=rng.uniform(.5, 1.5, FILTERS).astype("float32"))
    offset = v1.get_variable("bn/beta", initializer=rng.normal(0, .1, FILTERS).astype("float32"))
    mean = v1.get_variable("bn/moving_mean", initializer=rng.normal(0, .3, FILTERS).astype("float32"),
                           trainable=False)
    var = v1.get_variable("bn/moving_variance", initializer=rng.uniform(.5, 2, FILTERS).astype("float32"),
                          trainable=False)

    def bn_train():  # batch statistics, and the moving averages updated (AssignVariableOp)
        m, v = tf.nn.moments(h, [0, 1, 2])
        with tf.control_dependencies([v1.assign(mean, .9 * mean + .1 * m), v1.assign(var, .9 * var + .1 * v)]):
            return tf.nn.batch_normalization(h, m, v, offset, scale, 1e-3)

    def bn_infer():
        return tf.nn.batch_normalization(h, mean, var, offset, scale, 1e-3)

    h = v1.cond(is_training, bn_train, bn_infer, name="bn_cond")
    pooled, _variance = tf.nn.moments(tf.nn.relu(h), axes=[1, 2])  # the variance is left unused
    # a loop whose body reads a variable (the freeze rewrites the body: a function of its own)
    mix = v1.get_variable("loop/mix", initializer=rng.normal(0, .5, (FILTERS, FILTERS)).astype("float32"))
    _, pooled = tf.while_loop(lambda i, t: i < 2, lambda i, t: (i + 1, t + 0.5 * tf.tanh(tf.matmul(t, mix))),
                              [tf.constant(0), pooled])
    pooled = v1.cond(is_training, lambda: v1.nn.dropout(pooled, rate=0.5), lambda: tf.identity(pooled))
    w = v1.get_variable("dense/kernel", initializer=rng.normal(0, .6, (FILTERS, CLASSES)).astype("float32"))
    logits = tf.matmul(pooled, w, name="logits")
    predictions = tf.nn.softmax(logits, name="predictions")
    if stateful:
        calls = v1.get_variable("calls", initializer=np.int64(0), trainable=False)
        with tf.control_dependencies([v1.assign_add(calls, 1)]):
            tf.identity(predictions, name="served")
        return x, is_training, labels, None
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    return x, is_training, labels, v1.train.AdamOptimizer(1e-3).minimize(loss)


def _main(directory: Path) -> None:
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    for name, stateful in (("model", False), ("stateful", True)):
        rng = np.random.default_rng(0)
        graph = tf.Graph()
        with graph.as_default():
            x, is_training, labels, train = _model(tf, rng, stateful=stateful)
            ops = {n.op for n in graph.as_graph_def().node}
            assert {"If", "VarHandleOp"} <= ops and ops & {"While", "StatelessWhile"}, ops
            with v1.Session(graph=graph) as sess:
                sess.run(v1.global_variables_initializer())
                if train is not None:
                    sess.run(train, {x: batch(4, seed=1), labels: [0, 1, 2, 0], is_training: True})
                v1.train.Saver().save(sess, str(directory / name / "model.ckpt"))
                if not stateful:
                    np.save(directory / "truth.npy", sess.run("predictions:0", {x: batch(), is_training: False}))


if __name__ == "__main__":
    _main(Path(sys.argv[1]))
