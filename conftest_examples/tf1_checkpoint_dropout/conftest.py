"""Example (b), seed 000: a TF1 checkpoint and its frozen .pb give different predictions,
and every run differs a little, because dropout was left in the inference graph.

The fixtures write both forms of two graphs, the buggy one (dropout active) and the fixed
one (dropout behind a ``training`` flag that defaults to False), and load them with the
public ``load_model``. Copy the pattern: load your own ``.ckpt`` prefix and ``.pb``.
"""

import numpy as np
import pytest

from pytest_modelparity import load_model


def write_tf1_model(directory, *, dropout_left_in):
    """Build, save (checkpoint) and freeze (.pb) a 2-layer TF1 classifier in its own graph."""
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 12], name="x")
        w1 = v1.get_variable("w1", [12, 16], initializer=v1.glorot_uniform_initializer(seed=1))
        w2 = v1.get_variable("w2", [16, 3], initializer=v1.glorot_uniform_initializer(seed=2))
        hidden = tf.nn.relu(tf.matmul(x, w1), name="hidden")
        if dropout_left_in:
            hidden = v1.nn.dropout(hidden, keep_prob=0.5, name="dropout")  # the seed 000 bug
        else:
            training = v1.placeholder_with_default(False, [], name="training")
            hidden = tf.cond(training, lambda: v1.nn.dropout(hidden, keep_prob=0.5), lambda: hidden,
                             name="dropout")
        tf.nn.softmax(tf.matmul(hidden, w2), name="probs")
        saver = v1.train.Saver()
        with v1.Session(graph=graph) as session:
            session.run(v1.global_variables_initializer())
            prefix = saver.save(session, str(directory / "model.ckpt"))
            frozen = v1.graph_util.convert_variables_to_constants(session, graph.as_graph_def(), ["probs"])
    pb = directory / "frozen.pb"
    pb.write_bytes(frozen.SerializeToString())
    return prefix, pb


def _load_pair(tmp_path_factory, name, dropout_left_in):
    prefix, pb = write_tf1_model(tmp_path_factory.mktemp(name), dropout_left_in=dropout_left_in)
    io = {"inputs": ["x"], "outputs": ["probs"]}
    return load_model(prefix, "checkpoint", **io), load_model(pb, "graphdef", **io)


@pytest.fixture(scope="session")
def buggy_models(tmp_path_factory):
    """(checkpoint, frozen graph) with dropout active at inference."""
    return _load_pair(tmp_path_factory, "buggy", dropout_left_in=True)


@pytest.fixture(scope="session")
def fixed_models(tmp_path_factory):
    """(checkpoint, frozen graph) with dropout off unless training=True is fed."""
    return _load_pair(tmp_path_factory, "fixed", dropout_left_in=False)


@pytest.fixture(scope="session")
def images():
    return {"x": np.random.default_rng(0).uniform(0, 1, (8, 12)).astype("float32")}
