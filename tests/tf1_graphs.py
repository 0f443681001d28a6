"""TF1 graphs like the one of seed 000: a classifier whose dropout stays active at inference.

Built with ``tf.compat.v1`` in its own ``tf.Graph`` (never global graph mode), then saved as
a checkpoint (``.meta`` + variables) and frozen to a ``.pb``. Reused by the diagnosis tests.
Tensor names: input ``x:0`` (None, 12), output ``predictions:0`` (None, 3).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

FEATURES = 12
CLASSES = 3


def build_classifier(*, dropout: bool, seed: int = 0, with_training: bool = True, logit_scale: float = 1.0):
    """``(graph, init_op)``: x -> dense(16, relu) -> [dropout rate 0.5] -> dense(3) -> softmax.

    With ``with_training`` the graph also holds labels, a loss and a GradientDescent train op,
    as a real training script's graph does (the automatic output search must skip them).
    ``logit_scale`` multiplies the classifier's weights (a planted bug of that relative size).
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    rng = np.random.default_rng(seed)
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, FEATURES], name="x")
        w1 = v1.get_variable("dense/kernel", initializer=rng.normal(0, 0.5, (FEATURES, 16)).astype("float32"))
        b1 = v1.get_variable("dense/bias", initializer=rng.normal(0, 0.1, (16,)).astype("float32"))
        h = tf.nn.relu(tf.matmul(x, w1) + b1, name="hidden")
        if dropout:
            # The bug of seed 000: dropout left active in the inference graph (unseeded).
            h = v1.nn.dropout(h, rate=0.5, name="dropout")
        w2 = v1.get_variable("logits/kernel", initializer=(rng.normal(0, 0.5, (16, CLASSES)) * logit_scale).astype("float32"))
        b2 = v1.get_variable("logits/bias", initializer=(rng.normal(0, 0.1, (CLASSES,)) * logit_scale).astype("float32"))
        logits = tf.add(tf.matmul(h, w2), b2, name="logits")
        tf.nn.softmax(logits, name="predictions")
        if with_training:
            labels = v1.placeholder(tf.int64, [None], name="labels")
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits),
                                  name="loss")
            v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
        init = v1.global_variables_initializer()
    return graph, init


def save_checkpoint(directory: Path, *, dropout: bool, seed: int = 0, logit_scale: float = 1.0) -> Path:
    """Save the classifier with a v1 Saver; return the prefix (``<dir>/model.ckpt``)."""
    import tensorflow as tf

    graph, init = build_classifier(dropout=dropout, seed=seed, logit_scale=logit_scale)
    directory.mkdir(parents=True, exist_ok=True)
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        saver = tf.compat.v1.train.Saver()
        return Path(saver.save(sess, str(directory / "model.ckpt")))


def freeze(directory: Path, *, dropout: bool, seed: int = 0, name: str = "frozen.pb",
           logit_scale: float = 1.0) -> Path:
    """Freeze the classifier to ``<dir>/<name>`` the TF1 way (``convert_variables_to_constants``)."""
    import tensorflow as tf

    graph, init = build_classifier(dropout=dropout, seed=seed, logit_scale=logit_scale)
    directory.mkdir(parents=True, exist_ok=True)
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        frozen = tf.compat.v1.graph_util.convert_variables_to_constants(
            sess, graph.as_graph_def(), ["predictions"])
    path = directory / name
    path.write_bytes(frozen.SerializeToString())
    return path


def features(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (batch, FEATURES)).astype("float32")


# A pytester conftest: a frozen graph with two sinks (the softmax and a mean of the logits,
# neither an Identity) as modelparity_source, so its outputs cannot be found automatically;
# ``freeze_two_sinks(directory)`` is defined in it too.
TWO_SINKS_CONFTEST = textwrap.dedent('''
    import numpy as np
    import pytest
    from pathlib import Path


    def freeze_two_sinks(directory):
        import tensorflow as tf

        v1 = tf.compat.v1
        rng = np.random.default_rng(0)
        graph = tf.Graph()
        with graph.as_default():
            x = v1.placeholder(tf.float32, [None, 12], name="x")
            w = v1.get_variable("dense/kernel", initializer=rng.normal(0, 0.5, (12, 3)).astype("float32"))
            logits = tf.matmul(x, w, name="logits")
            tf.nn.softmax(logits, name="predictions")
            tf.reduce_mean(logits, axis=1, name="mean_logit")  # a second, non-Identity sink
            init = v1.global_variables_initializer()
        with v1.Session(graph=graph) as sess:
            sess.run(init)
            frozen = v1.graph_util.convert_variables_to_constants(
                sess, graph.as_graph_def(), ["predictions", "mean_logit"])
        path = Path(directory) / "frozen.pb"
        path.write_bytes(frozen.SerializeToString())
        return path


    @pytest.fixture(scope="session")
    def modelparity_source(tmp_path_factory):
        return freeze_two_sinks(tmp_path_factory.mktemp("graph"))
''')

# ...and the fixture that names its tensors (append it to the conftest above).
NAMED_OUTPUT_OPTIONS = textwrap.dedent('''
    @pytest.fixture(scope="session")
    def modelparity_load_options():
        return {"inputs": ["x:0"], "outputs": ["predictions:0"]}
''')
