"""Random ops in graphs (function-library branches, seeds, Keras traces), training mode,
and the rule that diagnosis never raises into an assertion."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_modelparity import ParityError, assert_deterministic, assert_outputs_close
from pytest_modelparity import compare
from pytest_modelparity.diagnose import (diagnose_batch_variance, diagnose_comparison, diagnose_nondeterminism,
                                         find_random_ops)
from pytest_modelparity.diagnose.random_ops import scan_graph_def

tf = pytest.importorskip("tensorflow", reason="graph scans need TensorFlow: pip install -e '.[all]'")


def test_random_op_inside_a_cond_branch_is_found_with_its_function():
    # Another test may have set a global seed (keras.utils.set_random_seed), which gives
    # every op seed attributes; this test is about an unseeded op.
    tf.random.set_seed(None)
    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([], tf.bool)])
    def f(x, augment):
        return tf.cond(augment, lambda: x + tf.random.uniform(tf.shape(x)), lambda: x)

    gd = f.get_concrete_function().graph.as_graph_def()
    ops, training = scan_graph_def(gd)
    assert [o.op for o in ops] == ["RandomUniform"]
    assert "in function" in ops[0].detail and ops[0].name.startswith(ops[0].detail.split("in function ")[1])
    assert ops[0].seeded is False and "unseeded" in ops[0].detail and not training


def test_seeded_and_unreachable_tf1_ops():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        w = tf.compat.v1.get_variable("w", [3, 2])                      # initializer: RandomUniform
        noise = tf.compat.v1.random_normal(tf.shape(x), seed=7, name="noise")
        tf.identity(tf.matmul(x + noise, w), name="y")
        tf.identity(tf.matmul(x, w), name="clean")
    gd = graph.as_graph_def()
    ops, _ = scan_graph_def(gd, ["y:0"])
    assert [(o.name, o.op, o.seeded) for o in ops] == [("noise/RandomStandardNormal", "RandomStandardNormal", True)]
    assert "seed2=7" in ops[0].detail
    assert scan_graph_def(gd, ["clean"])[0] == []        # the initializer does not feed the output
    assert [o.name for o in scan_graph_def(gd)[0]] == ["noise/RandomStandardNormal"]  # initializers skipped


def test_keras_model_with_dropout_forced_on_is_traced_and_named():
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((6,), name="x")
    h = keras.layers.Dense(8, name="dense")(inp)
    out = keras.layers.Dropout(0.5, name="mc_dropout")(h, training=True)   # Monte-Carlo dropout
    model = keras.Model(inp, out)
    x = np.ones((4, 6), "float32")
    with pytest.raises(ParityError) as info:
        assert_deterministic(model, x)
    causes = [h.cause for h in info.value.report.hints]
    assert causes[:2] == ["random_ops", "training_mode"]
    assert "StatelessRandomUniformV2" in str(info.value) and "mc_dropout" in str(info.value)


def test_batchnorm_in_training_mode_is_named():
    import keras

    from tests.models import tiny_cnn

    def bn_model():
        keras.utils.set_random_seed(0)
        inp = keras.Input((8, 8, 3), name="image")
        x = keras.layers.Conv2D(4, 3, name="conv")(inp)
        x = keras.layers.BatchNormalization(name="bn")(x)
        return keras.Model(inp, keras.layers.Flatten(name="flat")(x))

    reference, twin = bn_model(), bn_model()
    rng = np.random.default_rng(0)
    for m in (reference, twin):  # the same non-trivial moving statistics in both
        bn = m.get_layer("bn")
        bn.set_weights([np.ones(4, "float32"), np.zeros(4, "float32"), np.full(4, 0.3, "float32"),
                        np.full(4, 2.0, "float32")])
    twin.set_weights(reference.get_weights())
    trained_mode = tf.function(lambda v: twin(v, training=True))  # exported in training mode
    x = rng.uniform(0, 1, (6, 8, 8, 3)).astype("float32")
    with pytest.raises(ParityError) as info:
        assert_outputs_close(trained_mode, reference, inputs=x)
    causes = [h.cause for h in info.value.report.hints]
    assert causes == ["training_mode"], causes
    assert "training=True" in str(info.value)
    del tiny_cnn


def test_no_random_op_in_a_deterministic_inference_model():
    from tests.models import tiny_cnn

    ops, training = find_random_ops(tiny_cnn())
    assert ops == [] and training == []


def test_diagnosis_never_raises_on_bad_context():
    report = compare(np.ones(3, "float32"), np.zeros(3, "float32"))
    assert not report.passed

    def broken(batch):
        raise RuntimeError("boom")

    assert isinstance(diagnose_comparison(report, actual=np.ones(3), expected=np.zeros(3), actual_model=broken,
                                          expected_model=broken, inputs=np.ones((3, 2))), list)
    assert diagnose_nondeterminism(report, model=broken, inputs=None, runs=[1, 2]) == []
    assert diagnose_batch_variance(report, model=broken, inputs=object(), batched=object(), split={1: None}) == []
    assert diagnose_comparison(object(), actual=None, expected=None) == []


def test_tf1_graph_forms_localize_and_compare_weights(tmp_path):
    """Checkpoint (with its training ops) vs frozen graphs: intermediates fetched in a session,
    only the ops that feed the outputs (no unfed `labels` placeholder)."""
    from pytest_modelparity import load_model, localize_divergence
    from tests import tf1_graphs

    ckpt = load_model(tf1_graphs.save_checkpoint(tmp_path / "c", dropout=False, seed=0), "checkpoint")
    same = load_model(tf1_graphs.freeze(tmp_path / "a", dropout=False, seed=0), "graphdef")
    other = load_model(tf1_graphs.freeze(tmp_path / "b", dropout=False, seed=1), "graphdef")
    x = tf1_graphs.features(5)
    rows = localize_divergence(ckpt, same, x)
    assert [r.layer for r in rows][-1] == "predictions" and not any(r.diverged for r in rows)
    rows = localize_divergence(ckpt, other, x)
    assert [r.layer for r in rows if r.first] == ["MatMul"]
    with pytest.raises(ParityError) as info:
        assert_outputs_close(other, ckpt, inputs=x)
    causes = [h.cause for h in info.value.report.hints]
    assert causes[0] == "weights_differ" and "first_divergent_layer" in causes
    assert "4 of 4 matched weight tensors differ" in str(info.value)


def test_checkpoint_meta_graph_with_dropout_names_only_the_inference_random_op(tmp_path):
    from pytest_modelparity import load_model
    from tests import tf1_graphs

    model = load_model(tf1_graphs.save_checkpoint(tmp_path / "c", dropout=True), "checkpoint")
    ops, _ = find_random_ops(model)
    assert [(o.name, o.detail) for o in ops] == [("dropout/random_uniform/RandomUniform", "unseeded")]
    with pytest.raises(ParityError) as info:
        assert_deterministic(model, tf1_graphs.features(4), runs=3)
    assert "3 runs differ; the graph draws random numbers at `dropout/random_uniform/RandomUniform` " \
           "(RandomUniform, unseeded)" in str(info.value)


def test_heavy_checks_use_a_few_rows_of_a_large_batch():
    """A /256 scaling on a batch of 40 is found from its first rows (same cause, cheaper)."""
    from tests import zoo

    case = zoo.input_scaled_by_256(None)
    x = zoo.pixels(40)
    calls = []
    cand = case.candidate

    def counting(batch):
        calls.append(len(batch))
        return cand(batch)

    with pytest.raises(ParityError) as info:
        assert_outputs_close(counting, case.reference, inputs=x)
    assert [h.cause for h in info.value.report.hints] == ["input_scaling"]
    assert calls[0] == 40 and set(calls[1:]) == {8}  # reruns and transforms on 8 rows


def test_batch_statistics_found_only_in_a_training_trace():
    """Keras 3 batch-norm in training mode is a Mean over axis 0 (no FusedBatchNorm); pooling
    and layer-norm reduce other axes and are not batch statistics."""
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 6, 3), name="image")
    x = keras.layers.Conv2D(4, 3, name="conv")(inp)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    model = keras.Model(inp, keras.layers.LayerNormalization(name="ln")(x))
    spec = tf.TensorSpec([None, 6, 6, 3], tf.float32)
    inference = tf.function(lambda v: model(v, training=False)).get_concrete_function(spec)
    training = tf.function(lambda v: model(v, training=True)).get_concrete_function(spec)
    assert scan_graph_def(inference.graph.as_graph_def())[1] == []
    found = scan_graph_def(training.graph.as_graph_def())[1]
    assert len(found) == 1 and found[0].name.endswith("bn_1/moments/mean"), found
    assert found[0].detail.startswith("over the batch axis")


def test_localizing_a_raw_keras_reference_raises_no_keras_structure_warning(tmp_path):
    """A user's Keras model as the reference of a failing comparison: the layer table must not
    print Keras' "The structure of `inputs` doesn't match" UserWarning in their test output."""
    import warnings

    from pytest_modelparity import export_model, load_model
    from tests.models import images, tiny_cnn

    reference, changed = tiny_cnn(0), tiny_cnn(0)
    kernel, bias = changed.get_layer("logits").get_weights()
    kernel[:, 0] += 0.3  # one class only: a shift of every logit would cancel in the softmax
    changed.get_layer("logits").set_weights([kernel, bias])
    candidate = load_model(export_model(changed, "tflite", tmp_path / "m.tflite"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ParityError) as info:
            assert_outputs_close(candidate, reference, inputs=images(4))
    assert "first_divergent_layer" in [h.cause for h in info.value.report.hints]
    assert [str(w.message) for w in caught if "structure" in str(w.message)] == []
