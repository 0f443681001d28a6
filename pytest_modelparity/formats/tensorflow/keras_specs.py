"""What a Keras model takes and returns, functional or subclassed.

Why one home: a functional (or Sequential) model carries symbolic inputs and outputs; a
subclassed ``keras.Model`` never does, even after a call. Its inputs are read from the shapes
it was built or first called with (Keras keeps them in ``_build_shapes_dict``) or declared by
the user (``input_specs=`` of ``load_model``/``export_model``, the ``modelparity_input_specs``
fixture); its outputs are found by tracing it once on those inputs. Every exporter traces the
model through these specs, so all forms of a model name its inputs and outputs alike.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ...errors import ModelLoadError
from ..common import import_tf
from ..base import TensorSpec

DECLARE_FIX = ("declare its inputs: in a pytest suite a session-scoped fixture "
               "modelparity_input_specs in conftest.py returning [(name, shape, dtype)] (shape with the "
               "batch dim first, e.g. ('x', (None, 5), 'float32')), or pass input_specs=[...] to "
               "load_model/export_model")
FIXTURE_FIX = ("call the model once on a batch (model(x)) or build it (model.build((None, ...))) before "
               "handing it over; or " + DECLARE_FIX)


@dataclass(frozen=True)
class Declared:
    """Inputs of a subclassed model and how its ``call`` takes them: ``single`` (one tensor),
    ``list`` (a list of tensors) or ``dict`` (a dict by input name)."""

    specs: tuple[TensorSpec, ...]
    packing: str


# Inputs declared by the user, per model object (weak: a model that goes away takes them along).
_DECLARED: "weakref.WeakKeyDictionary[Any, Declared]" = weakref.WeakKeyDictionary()
# Output specs found by tracing, per model object, with the inputs they were traced for.
_TRACED: "weakref.WeakKeyDictionary[Any, tuple[tuple[TensorSpec, ...], list[TensorSpec]]]" = weakref.WeakKeyDictionary()


def has_symbolic_inputs(model: Any) -> bool:
    """A functional or Sequential model built on ``keras.Input`` (not a subclassed one)."""
    try:
        return bool(list(model.inputs))
    except (AttributeError, ValueError, TypeError):
        return False


def is_subclassed(model: Any) -> bool:
    """A Keras model without symbolic inputs: traced through its input specs instead."""
    return not has_symbolic_inputs(model)


# -- declared and inferred inputs ------------------------------------------------------------

def declare_input_specs(model: Any, specs: Any) -> None:
    """Record the inputs of ``model`` (ignored for a functional model, which has its own)."""
    if specs is None or has_symbolic_inputs(model):
        return
    _DECLARED[model] = normalise_specs(specs)


def normalise_specs(specs: Any) -> Declared:
    """``specs`` as ``Declared``: a ``TensorSpec`` (ours or ``tf.TensorSpec``), a ``(name,
    shape, dtype)`` tuple, a list of those, or a dict ``{name: shape | (shape, dtype) | spec}``
    (the model is then called with a dict). Shapes include the batch dim (freed to ``None``)."""
    if isinstance(specs, Mapping):
        items = [_one(name, value) for name, value in specs.items()]
        return Declared(tuple(sorted(items, key=lambda s: s.name)), "dict")  # Keras flattens a dict sorted
    if _is_single(specs):
        return Declared((_one(None, specs, 0),), "single")
    if isinstance(specs, Sequence) and not isinstance(specs, (str, bytes)) and specs:
        items = [_one(None, s, i) for i, s in enumerate(specs)]
        return Declared(tuple(items), "single" if len(items) == 1 else "list")
    raise TypeError(f"input specs: expected (name, shape, dtype), a TensorSpec, a list of them or a dict "
                    f"by input name, got {specs!r}")


def _is_single(value: Any) -> bool:
    if isinstance(value, TensorSpec) or _is_tf_spec(value):
        return True
    return isinstance(value, tuple) and len(value) in (2, 3) and isinstance(value[0], str)


def _is_tf_spec(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and type(value).__name__ == "TensorSpec"


def _one(name: str | None, value: Any, index: int = 0) -> TensorSpec:
    """One input spec from the forms ``normalise_specs`` accepts; the batch dim is freed."""
    dtype: Any = "float32"
    shape: Any
    if isinstance(value, TensorSpec):
        name, shape, dtype = name or value.name, value.shape, value.dtype
    elif _is_tf_spec(value):
        name = name or getattr(value, "name", None)
        shape = tuple(value.shape.as_list()) if value.shape.rank is not None else ()
        dtype = value.dtype.name
    elif isinstance(value, tuple) and value and isinstance(value[0], str):
        name, shape = value[0], value[1]
        dtype = value[2] if len(value) > 2 else dtype
    elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], (tuple, list)):
        shape, dtype = value  # dict value: (shape, dtype)
    elif isinstance(value, (tuple, list)):
        shape = value  # dict value: a shape alone
    else:
        raise TypeError(f"input spec {value!r}: expected (name, shape, dtype), (shape, dtype), a shape or a TensorSpec")
    dims = tuple(None if d is None else int(d) for d in shape)
    if not dims:
        raise ValueError(f"input spec {name!r}: the shape needs at least the batch dim, e.g. (None, 5)")
    return TensorSpec(str(name or f"input_{index}"), (None, *dims[1:]), getattr(dtype, "name", dtype))


def _inferred(model: Any) -> Declared | None:
    """The inputs a built (or once called) subclassed model was built for, or None."""
    shapes = getattr(model, "_build_shapes_dict", None)
    if isinstance(shapes, dict) and not shapes and getattr(model, "built", False):
        shapes = _build_defaults(model)  # build() called bare: its shape is build's default argument
    if not isinstance(shapes, dict) or len(shapes) != 1:
        return None  # never built, or a call taking several tensor arguments
    shape = next(iter(shapes.values()))
    # The variable dtype: under mixed_float16 a model is fed float32 (input_dtype says float16).
    dtype = str(getattr(getattr(model, "dtype_policy", None), "variable_dtype", None) or "float32")
    param = _call_argument(model)
    if isinstance(shape, dict):
        return normalise_specs({str(k): (tuple(v), dtype) for k, v in shape.items()})
    if _is_shape(shape):
        return Declared((_one(param, (param, tuple(shape), dtype)),), "single")
    if isinstance(shape, (list, tuple)) and shape and all(_is_shape(s) for s in shape):
        return Declared(tuple(_one(None, (f"{param}_{i}", tuple(s), dtype)) for i, s in enumerate(shape)), "list")
    return None


def _build_defaults(model: Any) -> dict[str, Any]:
    """The default arguments of a model's own ``build`` (``def build(self, input_shape=(None,
    64, 64, 3))`` called as ``model.build()``): Keras records only the arguments given, none."""
    import inspect

    build = getattr(getattr(model, "build", None), "__wrapped__", None)
    try:
        params = inspect.signature(build).parameters.values() if build is not None else []
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty and p.default is not None}


def _is_shape(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(d is None or isinstance(d, int) for d in value)


def _call_argument(model: Any) -> str:
    """The name of ``call``'s first argument (``x``, ``inputs``): the input's name."""
    signature = getattr(model, "_call_signature", None)
    params = list(getattr(signature, "parameters", {}) or [])
    return str(params[0]) if params else "input"


def declared(model: Any) -> Declared | None:
    """The inputs of a subclassed model: declared by the user, else the shapes it was built for."""
    return _DECLARED.get(model) or _inferred(model)


def input_specs(model: Any, *, source: str | Path | None = None, format: str = "keras",
                action: str = "load") -> list[TensorSpec]:
    """The model's inputs (name, shape with ``None`` batch dim, dtype), in positional order."""
    if has_symbolic_inputs(model):
        return _symbolic_input_specs(model)
    found = declared(model)
    if found is None:
        shapes = getattr(model, "_build_shapes_dict", None)
        how = ("was built, but its build() recorded no single input shape "
               f"({'it takes no shape argument' if not shapes else 'it took ' + ', '.join(map(str, shapes))})"
               if getattr(model, "built", False) else "was never built or called")
        raise ModelLoadError(source, format, f"the subclassed Keras model {type(model).__name__} has no symbolic "
                             f"inputs and {how}, so its input shapes are unknown",
                             DECLARE_FIX if getattr(model, "built", False) else FIXTURE_FIX, action=action)
    return list(found.specs)


def _symbolic_input_specs(model: Any) -> list[TensorSpec]:
    specs, seen = [], set()
    for i, t in enumerate(model.inputs):
        name = getattr(t, "name", None) or f"input_{i}"
        name = name[:-2] if name.endswith(":0") else name
        if name in seen:
            name = f"{name}_{i}"
        seen.add(name)
        specs.append(TensorSpec(name, tuple(t.shape), t.dtype))
    return specs


def tf_specs(specs: Sequence[TensorSpec]) -> list[Any]:
    """``tf.TensorSpec`` per input, batch dim ``None`` (object dtype: TensorFlow's string)."""

    tf = import_tf()
    return [tf.TensorSpec((None, *s.shape[1:]), tf.string if s.dtype.kind == "O" else tf.as_dtype(s.dtype), name=s.name)
            for s in specs]


def pack_declared(model: Any, xs: list[Any]) -> Any:
    """Flat inputs arranged the way a subclassed model's ``call`` takes them."""
    found = declared(model)
    if found is None or found.packing == "single":
        return xs[0] if len(xs) == 1 else list(xs)
    if found.packing == "dict":
        return {s.name: x for s, x in zip(found.specs, xs)}
    return list(xs)


# -- outputs ---------------------------------------------------------------------------------

def output_specs(model: Any) -> list[TensorSpec]:
    """The model's outputs named like every exported form names them (``keras_output_names``):
    for a subclassed model, found by tracing it once on its input specs."""
    if has_symbolic_inputs(model):

        return [TensorSpec(n, tuple(t.shape), t.dtype) for n, t in zip(keras_output_names(model), model.outputs)]
    inputs = tuple(input_specs(model, action="export"))
    cached = _TRACED.get(model)
    if cached is not None and cached[0] == inputs:
        return list(cached[1])
    found = _traced_outputs(model, list(inputs))
    _TRACED[model] = (inputs, found)
    return list(found)


def _traced_outputs(model: Any, inputs: list[TensorSpec]) -> list[TensorSpec]:

    tf = import_tf()
    signature = tf_specs(inputs)

    def call(*xs: Any) -> Any:
        return model(pack_declared(model, list(xs)), training=False)

    structure = tf.function(call, autograph=False).get_concrete_function(*signature).structured_outputs
    if isinstance(structure, dict):
        names = sorted(str(k) for k in structure)  # Keras (and tf.nest) flatten a dict by sorted key
        tensors = [structure[k] for k in sorted(structure, key=str)]
    else:
        tensors = list(tf.nest.flatten(structure))
        names = [f"output_{i}" for i in range(len(tensors))]
    return [TensorSpec(n, tuple(t.shape.as_list()) if t.shape.rank is not None else (), np.dtype(t.dtype.as_numpy_dtype))
            for n, t in zip(names, tensors)]


def subclassed_output_names(model: Any) -> list[str]:
    return [s.name for s in output_specs(model)]


def input_tensor_names(model: Any) -> list[str]:
    """The names of a Keras model's input tensors, which every export names its inputs after
    (``[]`` for a subclassed model, keyed by its specs instead). An unnamed input is
    ``keras_tensor_<n>``, numbered per process, until saved; it loads back from ``.keras`` as
    its layer's name (``input_layer``). The export cache keys them; the export worker puts
    them back on the copy it loads (``set_input_tensor_names``)."""
    try:
        return [str(getattr(t, "name", "")) for t in (getattr(model, "inputs", None) or [])]
    except (AttributeError, ValueError):
        return []


def set_input_tensor_names(model: Any, names: list[str]) -> None:
    """Give a model loaded back from ``.keras`` the input tensor names it was saved from."""
    try:
        tensors = list(model.inputs)
    except (AttributeError, ValueError):
        return
    if names and len(names) == len(tensors):
        for tensor, name in zip(tensors, names):
            tensor.name = name


def keras_output_names(model: Any) -> list[str]:
    """The output names every form uses: the keys a dict-output model returns, else Keras'
    ``output_names`` (layer names), else ``output_<i>``; in ``model.outputs`` order."""
    if is_subclassed(model):
        return subclassed_output_names(model)
    n = len(getattr(model, "outputs", None) or []) or 1
    struct = getattr(model, "_outputs_struct", None)
    if isinstance(struct, dict) and len(struct) == n:
        return sorted(str(k) for k in struct)  # Keras flattens a dict by sorted key
    names = [str(n_) for n_ in (getattr(model, "output_names", None) or [])]
    return names if len(names) == n and len(set(names)) == n else [f"output_{i}" for i in range(n)]


def pack_inputs(model: Any, xs: list[Any]) -> Any:
    """Arrange flat inputs the way the model was built (single tensor, list or dict)."""
    struct = getattr(model, "_inputs_struct", None)
    if isinstance(struct, dict):
        # model.inputs (the order of xs) is Keras' flattening of the dict, sorted by key, not
        # the dict's insertion order: pack with Keras' own inverse of that flattening.
        return keras_module().tree.pack_sequence_as(struct, list(xs))
    if isinstance(struct, (list, tuple)):
        return list(xs)
    if struct is None and not hasattr(model, "_inputs_struct"):  # subclassed: as its specs say
        return pack_declared(model, xs)
    return xs[0] if len(xs) == 1 else list(xs)


def keras_module() -> Any:
    import_tf()
    import keras

    return keras
