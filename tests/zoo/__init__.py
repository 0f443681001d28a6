"""The bug zoo: one small model pair per cause the diagnosis must name, plus clean pairs.

Each builder returns a ``Case``: the check to run (``outputs_close``, ``deterministic`` or
``batch_invariant``), the models (real TF, LiteRT, onnxruntime, tfjs in Node.js; built in code, exported to ``directory``),
the inputs, and the cause the failure must name (``None`` for a clean pair).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np


@dataclass
class Case:
    name: str
    check: str                      # outputs_close | deterministic | batch_invariant
    candidate: Any                  # the form under test (actual)
    reference: Any = None           # the trusted form (expected), for outputs_close
    inputs: Any = None
    cause: str | None = None        # the cause the failure must name; None: a clean pair
    kwargs: dict = field(default_factory=dict)
    passes_by_default: bool = False  # cause 6: drift explained, but no failure at default tolerance
    expect_in_text: tuple[str, ...] = ()


def _keras():
    import keras
    return keras


def trained(model: Any, seed: int = 1) -> Any:
    """Move every weight away from its initial value, as training does (biases non-zero)."""
    rng = np.random.default_rng(seed)
    model.set_weights([w + rng.normal(0, 0.2, w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


def pixels(batch: int, shape=(8, 8, 3), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (batch, *shape)).astype("float32")


def _core(keras, x, seed_name: str = ""):
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(8, activation="relu", name="hidden")(x)
    x = keras.layers.Dense(4, name="logits")(x)
    return keras.layers.Softmax(name="probs")(x)


def classifier(seed: int = 0, *, preprocess: Callable | None = None, name: str = "classifier"):
    """pixels -> preprocess (default /255) -> conv -> flatten -> hidden -> logits -> softmax."""
    keras = _keras()
    keras.utils.set_random_seed(seed)
    inp = keras.Input(shape=(8, 8, 3), name="image")
    x = (preprocess or (lambda t: keras.layers.Rescaling(1 / 255, name="scale")(t)))(inp)
    model = keras.Model(inp, _core(keras, x), name=name)
    return trained(model, seed + 1)


def _same_weights(dst: Any, src: Any) -> Any:
    for layer in src.layers:
        if layer.weights:
            dst.get_layer(layer.name).set_weights(layer.get_weights())
    return dst


# -- causes --------------------------------------------------------------------------------

def tf1_dropout_frozen(directory: Path) -> Case:
    """Seed 000: dropout left active in a TF1 frozen graph: runs differ, random op named."""
    from pytest_modelparity import load_model
    from tests import tf1_graphs

    pb = tf1_graphs.freeze(directory / "tf1_dropout", dropout=True)
    return Case("tf1_dropout_frozen", "deterministic", load_model(pb, "graphdef"), inputs=tf1_graphs.features(6),
                cause="random_ops", expect_in_text=("dropout/random_uniform/RandomUniform", "unseeded"))


def tf1_dropout_vs_clean(directory: Path) -> Case:
    """Seed 000 as a comparison: the frozen graph with dropout against the one without."""
    from pytest_modelparity import load_model
    from tests import tf1_graphs

    bad = load_model(tf1_graphs.freeze(directory / "tf1_dropout_cmp", dropout=True), "graphdef")
    good = load_model(tf1_graphs.freeze(directory / "tf1_clean_cmp", dropout=False), "graphdef")
    return Case("tf1_dropout_vs_clean", "outputs_close", bad, good, tf1_graphs.features(6), cause="random_ops",
                expect_in_text=("RandomUniform",))


def saved_model_reinitialised(directory: Path) -> Case:
    """Seed 002: the SavedModel was exported after the weights were re-initialised."""
    from pytest_modelparity import export_model, load_model

    keras = _keras()
    reference = classifier(3)
    keras.utils.set_random_seed(99)
    fresh = keras.models.clone_model(reference)  # new variables from the initializers
    path = export_model(fresh, "saved_model", directory / "reinit_sm")
    return Case("saved_model_reinitialised", "outputs_close", load_model(path, "saved_model"), load_model(reference),
                pixels(4), cause="weights_reinitialised", expect_in_text=("freshly initialised", "all zero"))


def doubled_softmax(directory: Path) -> Case:
    """Seed 003: the candidate applies softmax to the model's probabilities again."""
    keras = _keras()
    reference = classifier(5)
    twice = keras.Model(reference.input, keras.layers.Softmax(name="again")(reference.output), name="twice")
    return Case("doubled_softmax", "outputs_close", twice, reference, pixels(6), cause="double_softmax",
                expect_in_text=("softmax(expected)", "applied twice"))


def input_scaled_by_256(directory: Path) -> Case:
    """Seed 000: the candidate divides pixels by 256 where the reference divides by 255."""
    keras = _keras()
    reference = classifier(7)
    cand = classifier(7, preprocess=lambda t: keras.layers.Rescaling(1 / 256, name="scale")(t), name="by256")
    return Case("input_scaled_by_256", "outputs_close", _same_weights(cand, reference), reference, pixels(6),
                cause="input_scaling", expect_in_text=("255/256",))


def bgr_input(directory: Path) -> Case:
    """Seed 003: the candidate reverses the channels (BGR) before the same network (SavedModel)."""
    from pytest_modelparity import export_model, load_model

    keras = _keras()
    reference = classifier(9)

    def bgr_then_scale(t):
        t = keras.layers.Permute((1, 2, 3), name="noop")(t)
        t = keras.layers.Lambda(lambda v: v[..., ::-1], name="bgr")(t)
        return keras.layers.Rescaling(1 / 255, name="scale")(t)

    cand = _same_weights(classifier(9, preprocess=bgr_then_scale, name="bgr"), reference)
    path = export_model(cand, "saved_model", directory / "bgr_sm")
    return Case("bgr_input", "outputs_close", load_model(path, "saved_model"), load_model(reference), pixels(6),
                cause="input_channel_order", expect_in_text=("RGB <-> BGR",))


def two_input_classifier(seed: int = 0, *, bgr: bool = False, name: str = "two_input"):
    """(image (8, 8, 3) pixels, side (5,) features) -> conv on image/255, concat side -> dense."""
    keras = _keras()
    keras.utils.set_random_seed(seed)
    image = keras.Input(shape=(8, 8, 3), name="image")
    side = keras.Input(shape=(5,), name="side")
    x = image
    if bgr:
        x = keras.layers.Lambda(lambda v: v[..., ::-1], name="bgr")(x)
    x = keras.layers.Rescaling(1 / 255, name="scale")(x)
    x = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Concatenate(name="join")([x, keras.layers.Dense(4, activation="relu", name="side_dense")(side)])
    x = keras.layers.Dense(4, name="logits")(x)
    return trained(keras.Model([image, side], keras.layers.Softmax(name="probs")(x), name=name), seed + 1)


def two_input_batch(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"image": pixels(batch, seed=seed),
            "side": np.random.default_rng(seed + 1).normal(0, 1, (batch, 5)).astype("float32")}


def bgr_image_two_inputs(directory: Path) -> Case:
    """A 2-input model (image + dense side input) whose SavedModel form reads the image as BGR."""
    from pytest_modelparity import export_model, load_model

    reference = two_input_classifier(21)
    cand = _same_weights(two_input_classifier(21, bgr=True, name="two_input_bgr"), reference)
    path = export_model(cand, "saved_model", directory / "bgr_two_inputs_sm")
    return Case("bgr_image_two_inputs", "outputs_close", load_model(path, "saved_model"), load_model(reference),
                two_input_batch(6), cause="input_channel_order",
                expect_in_text=("input 'image' channels reversed (RGB <-> BGR)", "other inputs unchanged"))


def tflite_one_layer_perturbed(directory: Path) -> Case:
    """A TFLite form whose `hidden` kernel was perturbed: the first divergent layer is `hidden`."""
    from pytest_modelparity import export_model, load_model

    keras = _keras()
    reference = classifier(11)
    cand = _same_weights(keras.models.clone_model(reference), reference)
    kernel, bias = cand.get_layer("hidden").get_weights()
    cand.get_layer("hidden").set_weights([kernel + np.random.default_rng(0).normal(0, 0.05, kernel.shape)
                                          .astype("float32"), bias])
    path = export_model(cand, "tflite", directory / "perturbed.tflite")
    return Case("tflite_one_layer_perturbed", "outputs_close", load_model(path, "tflite"), load_model(reference),
                pixels(6),
                cause="first_divergent_layer", expect_in_text=("`hidden`",))


def perturb_onnx_layer(source: Path, layer: str, dest: Path, *, sigma: float = 0.05) -> list[str]:
    """Copy ``source`` to ``dest`` with noise added to ``layer``'s kernel initializer (rank >= 2;
    tf2onnx keeps the Keras layer name as a path component, ``…/conv_1/…``). Returns the
    initializers changed; the exported file itself is left as it is."""
    import re

    import onnx
    from onnx import numpy_helper

    proto = onnx.load(str(source))
    pattern = re.compile(re.escape(layer) + r"(_\d+)?")
    changed = []
    for init in proto.graph.initializer:
        if len(init.dims) >= 2 and any(pattern.fullmatch(part) for part in init.name.split("/")):
            kernel = numpy_helper.to_array(init)
            noisy = kernel + np.random.default_rng(0).normal(0, sigma, kernel.shape).astype(kernel.dtype)
            init.CopyFrom(numpy_helper.from_array(noisy, init.name))
            changed.append(init.name)
    onnx.save(proto, str(dest))
    return changed


def onnx_conv_perturbed(directory: Path) -> Case:
    """An ONNX form whose `conv` kernel was perturbed in the initializer: the first divergent
    layer is `conv`, compared through tf2onnx's NCHW layout (transposed back)."""
    from pytest_modelparity import export_model, load_model

    reference = classifier(25)
    exported = export_model(reference, "onnx", directory / "onnx_clean_25.onnx")
    changed = perturb_onnx_layer(exported, "conv", directory / "onnx_conv_perturbed.onnx")
    assert len(changed) == 1, changed
    return Case("onnx_conv_perturbed", "outputs_close", load_model(directory / "onnx_conv_perturbed.onnx", "onnx"),
                load_model(reference), pixels(6), cause="first_divergent_layer",
                expect_in_text=("`conv`", "channels-first, transposed"))


def perturb_tfjs_layer(model_json: Path, layer: str, dest: Path, *, sigma: float = 0.05) -> list[str]:
    """Copy the tfjs model beside ``model_json`` into directory ``dest`` with noise added to
    ``layer``'s kernel (float32 weights of rank >= 2 whose name has the layer as a path part,
    ``StatefulPartitionedCall/model_1/conv_1/...``), edited in the copied weight shard at the
    offset model.json's weightsManifest gives. Returns the weights changed; the export itself
    is left as it is."""
    import json
    import re
    import shutil

    shutil.rmtree(dest, ignore_errors=True)  # a copy this helper made before (the zoo builds twice)
    shutil.copytree(model_json.parent, dest)
    spec = json.loads((dest / "model.json").read_text())
    pattern = re.compile(re.escape(layer) + r"(_\d+)?")
    itemsize = {"float32": 4, "int32": 4, "bool": 1, "uint8": 1, "uint16": 2, "float16": 2}
    changed = []
    for group in spec["weightsManifest"]:
        files = [dest / p for p in group["paths"]]
        data = bytearray(b"".join(f.read_bytes() for f in files))
        offset = 0
        for entry in group["weights"]:
            assert "quantization" not in entry, "perturb_tfjs_layer handles unquantized exports only"
            count = int(np.prod(entry["shape"], dtype=np.int64))
            nbytes = count * itemsize[entry["dtype"]]
            if (entry["dtype"] == "float32" and len(entry["shape"]) >= 2
                    and any(pattern.fullmatch(part) for part in entry["name"].split("/"))):
                kernel = np.frombuffer(bytes(data[offset:offset + nbytes]), "<f4")
                noisy = kernel + np.random.default_rng(0).normal(0, sigma, kernel.shape).astype("<f4")
                data[offset:offset + nbytes] = noisy.astype("<f4").tobytes()
                changed.append(entry["name"])
            offset += nbytes
        assert offset == len(data), (offset, len(data))
        start = 0
        for f in files:  # write the shards back with their original sizes
            size = f.stat().st_size
            f.write_bytes(bytes(data[start:start + size]))
            start += size
    return changed


def _tfjs_export(model: Any, directory: Path) -> Path:
    from pytest_modelparity import export_model

    return export_model(model, "tfjs", directory)


def tfjs_conv_perturbed(directory: Path) -> Case:
    """A TFJS form (run by tfjs in Node.js) whose `conv` kernel was perturbed in its weight
    shard: the first divergent layer is `conv`."""
    from pytest_modelparity import load_model

    reference = classifier(29)
    exported = _tfjs_export(reference, directory / "tfjs_clean_29")
    changed = perturb_tfjs_layer(exported, "conv", directory / "tfjs_conv_perturbed")
    assert len(changed) == 1, changed
    return Case("tfjs_conv_perturbed", "outputs_close", load_model(directory / "tfjs_conv_perturbed", "tfjs"),
                load_model(reference), pixels(6), cause="first_divergent_layer",
                expect_in_text=("`conv`", "_FusedConv2D"))


def batch_drift(directory: Path) -> Case:
    """Seed 004: a Dense 784->1024->10 model on [0, 255] inputs drifts with the batch size."""
    from tests.models import dense_784

    x = np.random.default_rng(0).uniform(0, 255, (64, 784)).astype("float32")
    return Case("batch_drift", "batch_invariant", dense_784(0), inputs=x, cause="accumulation_noise",
                kwargs={"batch_sizes": (1,)}, passes_by_default=True, expect_in_text=("ULP", "not a conversion error"))


def _tf1_batchnorm_graph(path: Path, *, training: bool) -> Path:
    """A TF1 graph image -> conv -> batch-norm -> flatten -> dense, frozen to ``path``.

    ``training=True`` is ``tf.compat.v1.layers.batch_normalization(training=True)``'s op
    (FusedBatchNormV3, is_training=True: batch statistics); False uses the moving statistics.
    """
    import tensorflow as tf

    v1 = tf.compat.v1
    rng = np.random.default_rng(0)
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 8, 8, 3], name="image")
        kernel = v1.get_variable("conv/kernel", initializer=rng.normal(0, 0.5, (3, 3, 3, 4)).astype("float32"))
        h = tf.nn.conv2d(x, kernel, 1, "VALID", name="conv/Conv2D")
        gamma = v1.get_variable("bn/gamma", initializer=rng.uniform(0.5, 1.5, 4).astype("float32"))
        beta = v1.get_variable("bn/beta", initializer=rng.normal(0, 0.1, 4).astype("float32"))
        stats = {} if training else {"mean": np.full(4, 0.2, "float32"), "variance": np.full(4, 1.5, "float32")}
        h, _, _ = v1.nn.fused_batch_norm(h, gamma, beta, is_training=training, name="bn/FusedBatchNorm", **stats)
        h = tf.reshape(h, [-1, 6 * 6 * 4], name="flatten")
        dense = v1.get_variable("dense/kernel", initializer=rng.normal(0, 0.3, (144, 3)).astype("float32"))
        tf.identity(tf.matmul(h, dense), name="logits")
        init = v1.global_variables_initializer()
    with v1.Session(graph=graph) as sess:
        sess.run(init)
        frozen = v1.graph_util.convert_variables_to_constants(sess, graph.as_graph_def(), ["logits"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(frozen.SerializeToString())
    return path


def tf1_batchnorm_training_frozen(directory: Path) -> Case:
    """A TF1 frozen graph whose batch-norm kept is_training=True: rows change with the batch."""
    from pytest_modelparity import load_model

    pb = _tf1_batchnorm_graph(directory / "tf1_bn_training" / "frozen.pb", training=True)
    return Case("tf1_batchnorm_training_frozen", "batch_invariant", load_model(pb, "graphdef"),
                inputs=pixels(6) / 255, cause="training_mode",
                expect_in_text=("batch-norm runs in training mode", "bn/FusedBatchNorm", "is_training=True"))


def keras_batchnorm_training_saved_model(directory: Path) -> Case:
    """A Keras model traced with training=True and exported as a SavedModel (Keras 3's
    batch-norm computes moments, no FusedBatchNorm): rows change with the batch."""
    import tensorflow as tf

    from pytest_modelparity import load_model

    keras = _keras()
    keras.utils.set_random_seed(17)
    inp = keras.Input((8, 8, 3), name="image")
    x = keras.layers.Conv2D(4, 3, name="conv")(inp)
    x = keras.layers.BatchNormalization(name="bn")(x)
    model = trained(keras.Model(inp, keras.layers.Flatten(name="flat")(x)), 17)
    module = tf.Module()
    module.model = model
    module.serve = tf.function(lambda image: {"out": model(image, training=True)},
                               input_signature=[tf.TensorSpec([None, 8, 8, 3], tf.float32, name="image")])
    path = directory / "keras_bn_training_sm"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return Case("keras_batchnorm_training_saved_model", "batch_invariant", load_model(path, "saved_model"),
                inputs=pixels(6) / 255, cause="training_mode",
                expect_in_text=("batch-norm runs in training mode", "bn_1/moments/mean", "over the batch axis"))


# -- clean pairs ------------------------------------------------------------------------------

def _clean_export(name: str, fmt: str, seed: int, target: Path) -> Case:
    """A faithful export of the classifier: outputs close, no cause named."""
    from pytest_modelparity import export_model, load_model

    reference = classifier(seed)
    path = export_model(reference, fmt, target)
    return Case(name, "outputs_close", load_model(path, fmt), load_model(reference), pixels(6))


def clean_saved_model(directory: Path) -> Case:
    return _clean_export("clean_saved_model", "saved_model", 13, directory / "clean_sm")


def clean_tflite(directory: Path) -> Case:
    return _clean_export("clean_tflite", "tflite", 15, directory / "clean.tflite")


def clean_tf1_frozen(directory: Path) -> Case:
    from pytest_modelparity import load_model
    from tests import tf1_graphs

    pb = tf1_graphs.freeze(directory / "tf1_clean", dropout=False)
    return Case("clean_tf1_frozen", "deterministic", load_model(pb, "graphdef"), inputs=tf1_graphs.features(6))


def clean_tf1_batchnorm_inference(directory: Path) -> Case:
    """The batch-norm graph frozen with is_training=False: batch-invariant, no cause."""
    from pytest_modelparity import load_model

    pb = _tf1_batchnorm_graph(directory / "tf1_bn_inference" / "frozen.pb", training=False)
    return Case("clean_tf1_batchnorm_inference", "batch_invariant", load_model(pb, "graphdef"), inputs=pixels(6) / 255)


def clean_onnx(directory: Path) -> Case:
    return _clean_export("clean_onnx", "onnx", 27, directory / "clean.onnx")


def clean_tfjs(directory: Path) -> Case:
    from pytest_modelparity import load_model

    reference = classifier(31)
    return Case("clean_tfjs", "outputs_close", load_model(_tfjs_export(reference, directory / "clean_tfjs"), "tfjs"),
                load_model(reference), pixels(6))


CAUSES = [tf1_dropout_frozen, tf1_dropout_vs_clean, saved_model_reinitialised, doubled_softmax, input_scaled_by_256,
          bgr_input, bgr_image_two_inputs, tflite_one_layer_perturbed, onnx_conv_perturbed, tfjs_conv_perturbed,
          batch_drift, tf1_batchnorm_training_frozen, keras_batchnorm_training_saved_model]
CLEAN = [clean_saved_model, clean_tflite, clean_onnx, clean_tfjs, clean_tf1_frozen, clean_tf1_batchnorm_inference]
