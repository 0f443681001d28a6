"""Keras mixed precision and the converters: which policy a model computes in, and a
float32-policy trace of it for TFLite.

Why: under ``mixed_float16`` (or ``mixed_bfloat16``) a model keeps float32 weights but its
layers compute in float16, so the traced graph holds float16 Conv2D/MatMul/Relu. TFLite's
builtin ops have no float16 kernels for them, and no converter option accepts them (measured
with TF 2.21: ``target_spec.supported_types=[tf.float16]`` with or without
``Optimize.DEFAULT``, and ``_experimental_reduce_type_precision``, all fail with "'tf.Conv2D'
op is neither a custom op nor a flex op"). Tracing the same layers with a float32 policy reads
the same float32 weights and converts; it differs from the mixed model by that model's own
float16 rounding (1.5e-4 of scale on a small CNN), which the float16 tolerance of a
mixed-precision reference allows. onnx and tfjs convert float16 graphs as they are (measured
on the same CNN under mixed_float16 and float16: both pass), so only TFLite needs this.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

_HALF = ("float16", "bfloat16")


def _layers(model: Any) -> list[Any]:
    return [model, *getattr(model, "_flatten_layers", lambda: [])()]


def half_policy(model: Any) -> str | None:
    """The name of the Keras dtype policy that makes ``model`` compute in float16/bfloat16
    (``mixed_float16``, ``float16``...), or None. Paths and other objects: None."""
    if isinstance(model, (str, bytes)) or not hasattr(model, "layers"):
        return None
    for layer in _layers(model):
        policy = getattr(layer, "dtype_policy", None)
        if str(getattr(policy, "compute_dtype", "")) in _HALF:
            return str(getattr(policy, "name", policy))
    return None


def float32_computable(model: Any) -> bool:
    """Every half-precision layer keeps float32 weights (a ``mixed_*`` policy): the same
    weights then compute in float32 under a float32 policy. A ``float16`` policy stores
    float16 weights: no float32 copy without changing them."""
    half = [getattr(layer, "dtype_policy", None) for layer in _layers(model)]
    half = [p for p in half if str(getattr(p, "compute_dtype", "")) in _HALF]
    return bool(half) and all(str(getattr(p, "variable_dtype", "")) == "float32" for p in half)


@contextlib.contextmanager
def computing_in_float32(model: Any) -> Iterator[None]:
    """Within the block, every half-precision layer of ``model`` has the float32 policy (what
    is traced meanwhile computes in float32 with the same weights); restored afterwards."""
    changed = []
    try:
        for layer in _layers(model):
            policy = getattr(layer, "dtype_policy", None)
            if str(getattr(policy, "compute_dtype", "")) in _HALF:
                changed.append((layer, policy))
                layer.dtype_policy = "float32"
        yield
    finally:
        for layer, policy in reversed(changed):
            layer.dtype_policy = policy


def float32_route(policy: str) -> str:
    """The words an export route carries when it converted a float32-policy trace."""
    return f"{policy} model traced with a float32 policy (same weights: TFLite has no float16/bfloat16 kernels)"


def policy_cause(policy: str) -> str:
    """One sentence naming the policy as the cause of a failed conversion."""
    return (f"the model computes in half precision under the Keras dtype policy {policy!r} with "
            "half-precision weights, and TFLite's builtin ops have no float16/bfloat16 kernels for its layers")

