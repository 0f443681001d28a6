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

from ..formats.common import quiet
from ..formats.tensorflow.graph import import_tf

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
    custom: dict[str, Any] = {}
    if dtype is not None:
        config = _retype(config, dtype)
    if dtype == "float64":
        config, custom = _fast_float64_layers(config, keras)
    try:
        with quiet(), keras.saving.custom_object_scope(custom):
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
    carry_state(model, twin, cast, keras)
    return twin


def carry_state(model: Any, twin: Any, cast: Any, keras: Any) -> None:
    """Carry into ``twin`` the state of ``model``'s layers that ``get_config`` + ``set_weights``
    lose, the way Keras loads a ``.keras`` file: each layer's own variables through
    ``save_own_variables``/``load_own_variables`` where the layer overrides them (an adapted
    ``Normalization`` recomputes its mean and variance from ``adapt_mean``/``adapt_variance``;
    a ``tf_idf`` lookup's IDF weights), and its assets through ``save_assets``/``load_assets``
    (an adapted ``StringLookup``, ``IntegerLookup`` or ``TextVectorization``'s vocabulary).

    Why not ``finalize_state()`` on every layer (what was done before): it recomputes state
    from what ``adapt`` accumulated, which a rebuilt layer never saw. An adapted
    ``Discretization`` keeps its bin boundaries in its config; its ``finalize_state`` recomputed
    them from an empty summary, so every row fell in bucket 0 and the twin differed from the
    model by 2.8e-2 to 6.6e-2 of scale (issue 36). ``Hashing`` and ``CategoryEncoding`` hold no
    state beyond their config."""
    import tempfile

    base = keras.layers.Layer
    own, rebuilt = list(model._flatten_layers()), list(twin._flatten_layers())
    pairs = list(zip(own, rebuilt))
    # by position and class (a layer's inner layers, a TextVectorization's lookup, are named anew)
    if len(own) != len(rebuilt) or any(not isinstance(b, type(a)) for a, b in pairs):
        raise ShadowUnavailable("the rebuilt model's layers do not line up with the original's")
    for src, dst in pairs:
        cls = type(src)
        try:
            if cls.save_own_variables is not base.save_own_variables or \
                    cls.load_own_variables is not base.load_own_variables:
                store: dict[str, Any] = {}
                src.save_own_variables(store)
                if _state_beyond_weights(src, store):
                    dst.load_own_variables({k: _cast_value(v, cast) for k, v in store.items()})
            if callable(getattr(src, "save_assets", None)) and callable(getattr(dst, "load_assets", None)):
                with tempfile.TemporaryDirectory(prefix="modelparity-twin-assets-") as folder:
                    src.save_assets(folder)
                    dst.load_assets(folder)
        except Exception as exc:  # noqa: BLE001
            raise ShadowUnavailable(f"layer {src.name!r} ({cls.__name__}) could not carry its state into the "
                                    f"twin ({type(exc).__name__}: {_first(exc)})") from exc


def _state_beyond_weights(layer: Any, store: dict[str, Any]) -> bool:
    """Whether ``layer``'s saved state needs its own loading in the twin: it holds more than the
    layer's variables (a ``tf_idf`` lookup's IDF weights), or the layer derives state from them
    on loading (``finalize_state``: a ``Normalization``'s mean and variance). A convolution's or
    Dense's override (for quantised kernels) saves its variables, which ``set_weights`` copied:
    loading them again doubled ResNet50's twin build (2.1 s to 4.7 s)."""
    own = {id(v) for v in [*layer._trainable_variables, *layer._non_trainable_variables]}
    return any(id(v) not in own for v in store.values()) or callable(getattr(layer, "finalize_state", None))


def _cast_value(value: Any, cast: Any) -> Any:
    arr = np.asarray(value)
    return cast(arr) if arr.dtype.kind == "f" else arr


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


def _fast_float64_layers(config: Any, keras: Any) -> tuple[Any, dict[str, Any]]:
    """The config with depthwise convolutions swapped for a float64-friendly layer.

    TensorFlow's CPU depthwise convolution has no fast float64 kernel: a 7x7 one runs ~30x
    slower than in float32, which made ConvNeXtTiny's float64 twin cost 25x a reference call.
    As a sum of shifted products (plain elementwise float64 ops) it costs about what float32
    does; the arithmetic is the same convolution, in float64.
    """
    cls = _float64_depthwise_class(keras)
    swapped = False

    def walk(node: Any) -> Any:
        nonlocal swapped
        if isinstance(node, dict):
            cfg = node.get("config")
            kind = node.get("class_name")
            if kind in ("DepthwiseConv2D", "Conv2D") and isinstance(cfg, dict) and _plain_depthwise(kind, cfg):
                swapped = True
                name = cls[kind].__name__
                return {**node, "class_name": name, "module": None, "registered_name": name, "config": walk(cfg)}
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    config = walk(config)
    return config, ({c.__name__: c for c in cls.values()} if swapped else {})


def _plain_depthwise(kind: str, cfg: dict[str, Any]) -> bool:
    """A depthwise convolution: ``DepthwiseConv2D`` with multiplier 1, or a grouped
    ``Conv2D`` with one group per filter (how ConvNeXt writes its 7x7 depthwise layers)."""
    ones = (1, 1)
    plain = (tuple(cfg.get("dilation_rate", ones)) == ones
             and cfg.get("data_format", "channels_last") in ("channels_last", None)
             and cfg.get("padding") in ("same", "valid"))
    if kind == "DepthwiseConv2D":
        return plain and cfg.get("depth_multiplier", 1) == 1
    groups = cfg.get("groups", 1)
    return plain and groups > 1 and groups == cfg.get("filters")


_FLOAT64_DEPTHWISE: Any = None


def _float64_depthwise_class(keras: Any) -> dict[str, Any]:
    """{"DepthwiseConv2D": subclass, "Conv2D": subclass} computing as shifted products."""
    global _FLOAT64_DEPTHWISE
    if _FLOAT64_DEPTHWISE is not None:
        return _FLOAT64_DEPTHWISE
    ops = keras.ops

    def shifted_products(layer: Any, inputs: Any, kernel: Any) -> Any:
        (kh, kw), (sh, sw) = layer.kernel_size, layer.strides
        height, width = inputs.shape[1], inputs.shape[2]
        if layer.padding == "same":  # TensorFlow's SAME: the extra row/column goes after
            out_h, out_w = -(-height // sh), -(-width // sw)
            pad_h = max((out_h - 1) * sh + kh - height, 0)
            pad_w = max((out_w - 1) * sw + kw - width, 0)
            inputs = ops.pad(inputs, [[0, 0], [pad_h // 2, pad_h - pad_h // 2],
                                      [pad_w // 2, pad_w - pad_w // 2], [0, 0]])
        else:
            out_h, out_w = -(-(height - kh + 1) // sh), -(-(width - kw + 1) // sw)
        out = None
        for i in range(kh):
            for j in range(kw):
                window = inputs[:, i:i + (out_h - 1) * sh + 1:sh, j:j + (out_w - 1) * sw + 1:sw, :]
                term = window * kernel[i, j]
                out = term if out is None else out + term
        if layer.use_bias:
            out = out + layer.bias
        return layer.activation(out) if layer.activation is not None else out

    class ModelparityFloat64DepthwiseConv2D(keras.layers.DepthwiseConv2D):
        """DepthwiseConv2D (channels_last, multiplier 1, no dilation) as shifted products."""

        def call(self, inputs: Any) -> Any:
            return shifted_products(self, inputs, self.kernel[:, :, :, 0])

    class ModelparityFloat64GroupedConv2D(keras.layers.Conv2D):
        """Conv2D with one group per filter (depthwise), no dilation, as shifted products."""

        def call(self, inputs: Any) -> Any:
            return shifted_products(self, inputs, self.kernel[:, :, 0, :])

    _FLOAT64_DEPTHWISE = {"DepthwiseConv2D": ModelparityFloat64DepthwiseConv2D,
                          "Conv2D": ModelparityFloat64GroupedConv2D}
    return _FLOAT64_DEPTHWISE


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
