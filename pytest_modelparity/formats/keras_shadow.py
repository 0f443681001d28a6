"""Shadow twins of a Keras model: the same layers and weights at another precision.

Why: a float32 model's own rounding error (how far it is from the same model computed in
float64) predicts how far its *correct* exported forms drift; that error differs 600x
between networks (ResNet50 1e-4 of scale, a Transformer 2e-7), so no constant tolerance fits
them all (notes/noise-floor.md). The float64 twin measures it on the very batch under test;
a float32 twin whose weights were rounded to float16 measures what ``tflite:float16`` costs.

How (measured to work on Keras Applications and text models, Keras 3.15): rewrite the
model's config (every float32 or mixed dtype policy and every ``"dtype": "float32"`` string
becomes float64; integer and string input dtypes stay), ``from_config``, and copy the
weights cast to float64. ``keras.models.clone_model`` with a per-layer dtype fails on
functional graphs holding operation nodes (``+`` becomes an ``Add`` op), so it is not used.
A model that cannot be rebuilt this way (subclassed, custom or quantised layers) raises
:class:`ShadowUnavailable` with the reason; the caller falls back to a fixed rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._common import quiet
from ._tf import import_tf

_FLOAT_POLICIES = {"float32", "mixed_float16", "mixed_bfloat16", "float16", "bfloat16"}


class ShadowUnavailable(Exception):
    """The model cannot be rebuilt at another precision; the message says why."""


def float64_twin(model: Any) -> Any:
    """The same model (same weights) computing in float64."""
    return _rebuild(model, "float64", lambda w: w.astype(np.float64))


def float16_weights_twin(model: Any) -> Any:
    """The same model in float32 with every float weight rounded to float16 (what a
    ``tflite:float16`` export stores; it computes in float32 after dequantising)."""
    return _rebuild(model, None, lambda w: w.astype(np.float16).astype(w.dtype))


def _rebuild(model: Any, dtype: str | None, cast: Any) -> Any:
    import_tf()
    import keras

    if not isinstance(model, keras.Model):
        raise ShadowUnavailable(f"{type(model).__name__} is not a keras.Model")
    if not _is_graph_model(model, keras):
        raise ShadowUnavailable("a subclassed Keras model has no config to rebuild it from")
    try:
        config = model.get_config()
    except Exception as exc:  # noqa: BLE001 - any failure means: no shadow
        raise ShadowUnavailable(f"get_config() failed ({type(exc).__name__}: {_first(exc)})") from exc
    if dtype is not None:
        config = _retype(config, dtype)
    try:
        with quiet():
            twin = type(model).from_config(config)
    except Exception as exc:  # noqa: BLE001
        raise ShadowUnavailable(f"the model could not be rebuilt in {dtype or 'float32'} "
                                f"({type(exc).__name__}: {_first(exc)})") from exc
    weights = model.get_weights()
    twin_weights = twin.get_weights()
    if len(weights) != len(twin_weights) or any(a.shape != b.shape for a, b in zip(weights, twin_weights)):
        raise ShadowUnavailable("the rebuilt model's weights do not line up with the original's")
    try:
        twin.set_weights([cast(w) if w.dtype.kind == "f" else w for w in weights])
    except Exception as exc:  # noqa: BLE001
        raise ShadowUnavailable(f"copying the weights failed ({type(exc).__name__}: {_first(exc)})") from exc
    # Layers whose state is derived from their weights (an adapted Normalization keeps mean
    # and variance as tensors computed from adapt_mean/adapt_variance) recompute it here, as
    # Keras does after loading a file.
    for layer in twin._flatten_layers():
        finalize = getattr(layer, "finalize_state", None)
        if callable(finalize):
            try:
                finalize()
            except Exception as exc:  # noqa: BLE001
                raise ShadowUnavailable(f"layer {layer.name!r} could not restore its state "
                                        f"({type(exc).__name__}: {_first(exc)})") from exc
    return twin


def _is_graph_model(model: Any, keras: Any) -> bool:
    """Functional and Sequential models have a config that rebuilds them; subclasses may not."""
    functional = getattr(getattr(keras, "src", None), "models", None)
    cls = getattr(getattr(functional, "functional", None), "Functional", None)
    return isinstance(model, keras.Sequential) or (cls is not None and isinstance(model, cls))


def _retype(node: Any, dtype: str) -> Any:
    """The config with every float dtype policy and float32 dtype string set to ``dtype``."""
    if isinstance(node, dict):
        if node.get("class_name") == "DTypePolicy" and isinstance(node.get("config"), dict):
            name = node["config"].get("name")
            if name in _FLOAT_POLICIES:
                return {**node, "config": {**node["config"], "name": dtype}}
            return node
        out = {}
        for key, value in node.items():
            if key == "dtype" and isinstance(value, str) and value in _FLOAT_POLICIES:
                out[key] = dtype
            else:
                out[key] = _retype(value, dtype)
        return out
    if isinstance(node, list):
        return [_retype(v, dtype) for v in node]
    return node


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
