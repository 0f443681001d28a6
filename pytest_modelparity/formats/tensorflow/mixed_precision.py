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
mixed-precision reference allows. A ``float16``/``bfloat16`` policy stores half-precision
weights, which the float32 policy cannot read: a functional model is then rebuilt from its
config under the float32 policy with its weights upcast (exactly). onnx and tfjs convert
float16 graphs as they are (measured on the same CNN under mixed_float16 and float16: both
pass), so only TFLite needs this. Figures: ``bench/mixed_precision_tflite.py``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager, Iterator

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


# Words every route of a float32 rebuild carries (summary.CHANGED_COMPUTATION finds them).
FLOAT32_WORDS = "with a float32 policy"


@dataclass
class Float32Plan:
    """What a TFLite export traces for a model: the model itself, or (half precision) the same
    weights computing in float32; ``route`` says which (None: the model as it is)."""

    subject: Any
    scope: ContextManager[Any]
    route: str | None
    policy: str | None


def float32_plan(model: Any) -> Float32Plan:
    """How ``model`` reaches TFLite: as it is; its layers traced under the float32 policy
    (``mixed_*``: float32 weights); or rebuilt from its config under it with the weights
    upcast (``float16``/``bfloat16`` policy, functional models). Otherwise as it is, and the
    converter's refusal names the policy."""
    policy = half_policy(model)
    if policy is None:
        return Float32Plan(model, contextlib.nullcontext(), None, None)
    why = "TFLite has no float16/bfloat16 kernels"
    if float32_computable(model):
        return Float32Plan(model, computing_in_float32(model), f"{policy} model traced {FLOAT32_WORDS} "
                           f"(same weights: {why})", policy)
    copy = float32_config_copy(model)
    if copy is not None:
        return Float32Plan(copy, contextlib.nullcontext(), f"{policy} model rebuilt from its config {FLOAT32_WORDS} "
                           f"(its half-precision weights upcast exactly: {why})", policy)
    return Float32Plan(model, contextlib.nullcontext(), None, policy)


def float32_config_copy(model: Any) -> Any:
    """A functional/Sequential ``model`` rebuilt from its config with every dtype policy
    float32 and its weights upcast, or None when it cannot be (subclassed, custom layers)."""
    from .keras_specs import has_symbolic_inputs

    if not has_symbolic_inputs(model):
        return None
    try:
        config = model.get_config()
        _float32_policies(config)
        copy = type(model).from_config(config)
        copy.set_weights([w.astype("float32") if w.dtype.kind == "f" else w for w in model.get_weights()])
    except Exception:  # noqa: BLE001 - any failure: no copy, the converter's error names the policy
        return None
    return copy if half_policy(copy) is None else None


def _float32_policies(node: Any) -> None:
    """Every dtype policy in a Keras config set to float32, in place."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "dtype" and isinstance(value, str) and value in ("float16", "bfloat16", "mixed_float16",
                                                                      "mixed_bfloat16"):
                node[key] = "float32"
            elif isinstance(value, dict) and value.get("class_name") == "DTypePolicy":
                value.setdefault("config", {})["name"] = "float32"
            else:
                _float32_policies(value)
    elif isinstance(node, list):
        for value in node:
            _float32_policies(value)


def policy_cause(policy: str) -> str:
    """One sentence naming the policy as the cause of a failed conversion."""
    return (f"the model computes in half precision under the Keras dtype policy {policy!r} with "
            "half-precision weights, and TFLite's builtin ops have no float16/bfloat16 kernels for its layers")

