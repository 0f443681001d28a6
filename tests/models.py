"""Tiny models built in code for the tests (no hub downloads, seconds to build).

Import TensorFlow lazily: call these from tests or fixtures only.
"""

from __future__ import annotations

import textwrap

import numpy as np

# A conftest.py for pytester suites: a one-Dense-layer Keras model as ``modelparity_source``.
TINY_SOURCE_CONFTEST = textwrap.dedent('''
    import pytest

    @pytest.fixture(scope="session")
    def modelparity_source():
        import keras
        x = keras.Input((6,), name="x")
        y = keras.layers.Dense(3, name="out", kernel_initializer=keras.initializers.GlorotUniform(seed=2))(x)
        return keras.Model(x, y, name="tiny")
''')


# A pytester test module: the session's candidate set against its reference, one test per format.
CLOSE_SUITE = textwrap.dedent('''
    from pytest_modelparity import assert_outputs_close

    def test_close(parity_candidate, parity_batch, parity_reference):
        assert_outputs_close(parity_candidate.predict(parity_batch), parity_reference, inputs=parity_batch)
''')


# A module for pytester suites (``pytester.makepyfile(export_workers=EXPORT_WORKERS_MODULE)``):
# the pids of this pytest process's export workers, read from /proc, so a suite can check that
# one was started, stop it or kill it.
EXPORT_WORKERS_MODULE = textwrap.dedent('''
    import os
    from pathlib import Path

    def export_workers():
        found = []
        for pid in os.listdir("/proc"):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
            if ppid == os.getpid() and b"pytest_modelparity.exports.worker" in cmd:
                found.append(int(pid))
        return found
''')

def tiny_cnn(seed: int = 0, *, input_shape=(8, 8, 3), classes: int = 4, name: str = "tiny_cnn"):
    """conv -> batchnorm -> relu -> dropout -> dense -> softmax, weights from ``seed``."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Conv2D(4, 3, padding="same", name="conv")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.ReLU(name="relu")(x)
    x = keras.layers.Dropout(0.5, name="dropout")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(classes, name="logits")(x)
    outputs = keras.layers.Softmax(name="probs")(x)
    model = keras.Model(inputs, outputs, name=name)
    # Non-trivial batchnorm statistics so a form that ignores them shows it.
    bn = model.get_layer("bn")
    rng = np.random.default_rng(seed)
    gamma, beta, mean, var = bn.get_weights()
    bn.set_weights([gamma * rng.uniform(0.5, 1.5, gamma.shape).astype("float32"),
                    rng.normal(0, 0.1, beta.shape).astype("float32"),
                    rng.normal(0, 0.1, mean.shape).astype("float32"),
                    rng.uniform(0.5, 2.0, var.shape).astype("float32")])
    return model


def mlp(seed: int = 0, *, inputs: int = 16, hidden: int = 32, outputs: int = 5, name: str = "mlp"):
    """Dense -> relu -> Dense: a small model for fast checks."""
    import keras

    keras.utils.set_random_seed(seed)
    x_in = keras.Input(shape=(inputs,), name="x")
    h = keras.layers.Dense(hidden, activation="relu", name="hidden")(x_in)
    out = keras.layers.Dense(outputs, name="out")(h)
    return keras.Model(x_in, out, name=name)


def dense_784(seed: int = 0):
    """The Dense 784->1024->10 model of DESIGN.md's tolerance measurements."""
    import keras

    keras.utils.set_random_seed(seed)
    x_in = keras.Input(shape=(784,), name="pixels")
    h = keras.layers.Dense(1024, activation="relu", name="fc1")(x_in)
    out = keras.layers.Dense(10, name="fc2")(h)
    return keras.Model(x_in, out, name="dense_784")


def images(batch: int, shape=(8, 8, 3), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 1, (batch, *shape)).astype("float32")


def two_in_two_out():
    """Two inputs, two outputs, named out of alphabetical order: exporters must keep the order."""
    import keras

    keras.utils.set_random_seed(0)
    a, b = keras.Input((4,), name="zeta"), keras.Input((3,), name="alpha")
    h = keras.layers.Concatenate()([a, b])
    return keras.Model([a, b], [keras.layers.Dense(2, name="score")(h), keras.layers.Dense(5, name="aux")(h)])


def trained_like(model, x):
    """Give a random-weight net trained-like statistics (random nets collapse to near-constant
    outputs that hide both false alarms and bugs): batch-norm statistics from one training-mode
    pass with momentum 0, and the classifier scaled so its raw scores have std 1 (spread ~4)."""
    import keras

    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.0
    x_in = [x] if isinstance(getattr(model, "_inputs_struct", None), (list, tuple)) else x  # as built
    model(x_in, training=True)
    head = [layer for layer in model.layers if getattr(layer, "kernel", None) is not None][-1]
    activation, head.activation = head.activation, keras.activations.linear
    logits = np.asarray(keras.Model(model.inputs, head.output)([x], training=False), np.float64)
    head.activation = activation
    spread = float(np.std(logits)) or 1.0
    head.set_weights([w / spread for w in head.get_weights()])
    return model


def keras_app(name: str, size: int = 64, *, classes: int = 10, seed: int = 0):
    """A Keras Applications net (weights=None) with trained-like statistics, and its batch of 4."""
    import keras

    keras.utils.set_random_seed(seed)
    build = {"mobilenetv2": lambda: keras.applications.MobileNetV2(
                 input_shape=(size, size, 3), alpha=0.35, weights=None, classes=classes),
             "inceptionv3": lambda: keras.applications.InceptionV3(
                 input_shape=(size, size, 3), weights=None, classes=classes)}[name]
    model = build()
    x = np.random.default_rng(seed).uniform(-1, 1, (4, size, size, 3)).astype("float32")
    return trained_like(model, x), x


def call_with_deadline(fn, seconds: float, unblock):
    """Run ``fn()`` in a daemon thread; if it is still running after ``seconds``, call
    ``unblock()`` (open the FIFO it waits on, kill the process it waits for) and give it 10 s
    more. Returns ``(hung, elapsed seconds, box)``, box holding ``"result"`` or ``"error"``."""
    import threading
    import time

    box: dict = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(seconds)
    hung = thread.is_alive()
    if hung:
        unblock()
        thread.join(10)
    return hung, time.monotonic() - start, box


def skip_unless_exportable(formats) -> None:
    """Skip the calling test, naming the install step, when any of ``formats`` cannot be exported
    and loaded here (its converter or runtime is missing)."""
    import pytest

    from pytest_modelparity.formats import missing_runtime

    missing = [f for f in formats if missing_runtime(f, export=True) is not None]
    if missing:
        pytest.skip(f"runtimes missing for {missing}: bash scripts/install.sh installs them all")


# The recording suites' source (tests/test_recorded_plugin.py, test_recorded_whole.py): a tiny Dense
# net whose last kernel's seed WEIGHT_SEED can change (a new release of the model), and the
# parity test they run through the fixtures.
RECORDED_CONFTEST = textwrap.dedent('''
    import os
    import pytest

    def build():
        import keras
        x = keras.Input((6,), name="x")
        h = keras.layers.Dense(12, activation="tanh", name="h",
                               kernel_initializer=keras.initializers.GlorotUniform(seed=1))(x)
        y = keras.layers.Dense(3, name="out", kernel_initializer=keras.initializers.GlorotUniform(
            seed=int(os.environ.get("WEIGHT_SEED", "2"))))(h)
        return keras.Model(x, y, name="tiny")

    @pytest.fixture(scope="session")
    def modelparity_source():
        return build
''')

PARITY_SUITE = textwrap.dedent('''
    from pytest_modelparity import assert_outputs_close

    def test_parity(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
''')


def normalized_tabular(mean):
    """Four features through a Normalization built with ``mean=`` (constants, not weights; std
    2, 1, 3, 0.5), then two Dense layers: a port whose mean is off agrees weight for weight."""
    import keras

    keras.utils.set_random_seed(7)
    x = keras.Input((4,), name="features")
    h = keras.layers.Normalization(mean=mean, variance=[4.0, 1.0, 9.0, 0.25], name="norm")(x)
    h = keras.layers.Dense(8, activation="relu", name="hidden")(h)
    return keras.Model(x, keras.layers.Dense(2, name="out")(h), name="tabular")
