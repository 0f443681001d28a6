"""A log-magnitude audio front-end, small: built by the floor tests and bench/noise_floor.py.

The shape of a trained transcription model (issue 27): a fixed cos/sin filter bank as a
``Conv1D`` over a 1-channel waveform (a constant-Q-like transform), the magnitude
``sqrt(re^2 + im^2)``, ``log(mag + eps)``, a few convolutions over time with trained-like
batch-norm statistics, and three sigmoid heads (``onsets``, ``frames``, ``offsets``).

The waveform has loud notes and low-energy stretches (a quiet tail and near silence), where
the filter bank's output cancels almost to nothing and its log is far from exact in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

RATE = 8000.0
HEADS = ("onsets", "frames", "offsets")


def filter_bank(bins: int, length: int) -> np.ndarray:
    """(length, 1, 2 * bins) cos then sin kernels, Hann-windowed, log-spaced frequencies."""
    t = np.arange(length) / RATE
    freqs = 110.0 * 2.0 ** (np.arange(bins) / 4.0)  # quarter-octave steps from A2
    window = np.hanning(length)
    cos = np.cos(2 * np.pi * freqs[None, :] * t[:, None]) * window[:, None]
    sin = np.sin(2 * np.pi * freqs[None, :] * t[:, None]) * window[:, None]
    return np.concatenate([cos, sin], axis=1)[:, None, :].astype("float32") / length


def waveform(batch: int = 2, samples: int = 1024, seed: int = 0) -> np.ndarray:
    """(batch, samples, 1) float32: notes, then a quiet tail (x1e-3), then near silence (1e-6 noise)."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / RATE
    out = np.empty((batch, samples, 1), np.float32)
    for i in range(batch):
        f = 110.0 * 2.0 ** (rng.integers(0, 24, 3) / 4.0)
        x = sum(rng.uniform(0.2, 0.6) * np.sin(2 * np.pi * fk * t + rng.uniform(0, 6)) for fk in f)
        env = np.ones(samples)
        a, b = samples // 2, (3 * samples) // 4
        env[a:b] = 1e-3
        env[b:] = 0.0
        x = x * env + rng.normal(0, 1e-6, samples)
        out[i, :, 0] = x
    return out


def log_magnitude(samples: int = 1024, *, bins: int = 16, kernel: int = 256, hop: int = 32,
                  pitches: int = 8, eps: float = 1e-8, seed: int = 0, trained: bool = True):
    """``(model, batch)``: the log-magnitude model and a waveform batch it takes."""
    import keras

    keras.utils.set_random_seed(seed)
    wav = keras.Input((samples, 1), name="waveform")
    bank = keras.layers.Conv1D(2 * bins, kernel, strides=hop, use_bias=False, trainable=False,
                               name="filter_bank")
    z = bank(wav)
    re, im = z[..., :bins], z[..., bins:]
    mag = keras.ops.sqrt(re * re + im * im)
    h = keras.ops.log(mag + eps)
    for i, width in enumerate((32, 32)):
        h = keras.layers.Conv1D(width, 3, padding="same", name=f"conv{i + 1}")(h)
        h = keras.layers.BatchNormalization(name=f"bn{i + 1}")(h)
        h = keras.layers.ReLU()(h)
    # the late convolution is a residual branch: a 1% change of its kernel moves the heads
    # by ~0.1-0.3% of their scale, below the float64 floor of some (the report)
    branch = keras.layers.Conv1D(32, 3, padding="same", name="late_conv")(h)
    late = keras.layers.ReLU(name="late")(h + 0.5 * branch)
    outs = [keras.layers.Conv1D(pitches, 1, activation="sigmoid", name=n)(late) for n in HEADS]
    model = keras.Model(wav, outs, name="log_magnitude")
    bank.set_weights([filter_bank(bins, kernel)])
    x = waveform(4, samples, seed)
    if trained:
        _trained_like(model, x)
    return model, x[:2]


def _trained_like(model: Any, x: np.ndarray) -> None:
    """Batch-norm statistics from one training pass (momentum 0); heads scaled so their
    logits spread ~4 around 0, so the sigmoids are neither saturated nor constant."""
    import keras

    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.0
    model(x, training=True)
    late = model.get_layer("late").output
    feats = np.asarray(keras.Model(model.inputs, late)(x), np.float64)
    for name in HEADS:
        head = model.get_layer(name)
        k, b = head.get_weights()
        logits = feats @ k[0].astype(np.float64) + b
        spread = float(np.std(logits)) or 1.0
        head.set_weights([(k / spread).astype("float32"),
                          (-(logits.mean(axis=(0, 1)) / spread)).astype("float32")])


def perturb_late_kernel(model: Any, factor: float = 1.01, layer: str = "late_conv") -> Any:
    """A copy of ``model`` whose ``layer`` kernel is scaled by ``factor`` (a 1% change: 1.01)."""
    import keras

    twin = keras.models.clone_model(model)
    twin.set_weights(model.get_weights())
    target = twin.get_layer(layer)
    w = target.get_weights()
    target.set_weights([w[0] * factor, *w[1:]])
    return twin
