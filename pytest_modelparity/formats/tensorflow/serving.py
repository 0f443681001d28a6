"""The serving function a converting export (tflite, onnx) traces, and what it closes over.

Why its own module: it sits above the formats it reads (a Keras model through
``keras_specs``, a SavedModel directory through ``saved_model``), so ``graph.py``, which those
formats build on, imports none of them and the ``formats`` package has no import circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ...errors import ModelLoadError
from . import graph_source, saved_model
from ..common import ConverterLog, import_tf, name_outputs, unique
from .keras_specs import input_specs, keras_output_names, pack_inputs, tf_specs


def keras_signature(model: Any, format: str) -> tuple[list[Any], list[str]]:
    """``tf.TensorSpec`` per Keras input (batch dim ``None``) and the output names.

    Shared by the TFLite and ONNX exporters so both name inputs and outputs after the Keras
    model (``image`` -> ``probs``), whatever the converter would have called them. A
    subclassed model's inputs come from ``keras_specs`` (built shapes or declared specs).
    """
    return tf_specs(input_specs(model, format=format, action="export")), unique(keras_output_names(model))


@dataclass
class Serving:
    """What a converter needs from a model: a traced function and what it closes over."""

    function: Any            # tf.function, None batch dim, returning {output name: tensor}
    specs: list[Any]         # tf.TensorSpec per input, in the model's input order
    output_names: list[str]  # in the model's output order
    holder: Any              # an object tracking the variables, for the TFLite converter
    model: Any = None        # the Keras model, tracked by the holder only where it must be
    route: str | None = None  # how a TF1 source was read and frozen (its export route says it)


def begin_export(model: Any, path: str | Path, format: str, filename: str,
                 graph_options: Mapping[str, Any] | None = None) -> tuple[Path, Serving, ConverterLog]:
    """What a converting export (tflite, onnx) starts from: the file to write (``filename``
    inside ``path`` when that is a directory), the model's serving function, and a log that
    will hold the converter's output. ``graph_options``: a TF1 source's inputs/outputs/feeds."""
    path = Path(path)
    if path.is_dir():
        path = path / filename
    return path, serving_function(model, format, graph_options), ConverterLog(format)


def serving_function(model: Any, format: str = "tflite", graph_options: Mapping[str, Any] | None = None) -> Serving:
    """The serving function of a Keras model, or of a SavedModel directory's signature.

    Shared by the TFLite and ONNX exporters: tracing the model ourselves works for
    Sequential and functional models alike (tf2onnx's ``from_keras`` fails on Keras 3
    Sequential models with a KeyError on an internal tensor name), and lets a user's
    SavedModel be converted without a Keras model at hand.
    """
    tf = import_tf()

    if isinstance(model, (str, Path)):
        return _saved_model_serving(Path(model), graph_options)
    specs, out_names = keras_signature(model, format)

    def serve(*args: Any) -> dict[str, Any]:
        # Inputs packed as the model was built (a dict model refuses a list); outputs named
        # like KerasModel names them, so the reference and the export agree on names.
        return name_outputs(model(pack_inputs(model, list(args)), training=False), out_names, numpy=False)

    function = tf.function(serve, input_signature=specs, autograph=False)
    return Serving(function, specs, out_names, variable_holder(model), model)


def _saved_model_serving(path: Path, graph_options: Mapping[str, Any] | None = None) -> Serving:
    """A positional tf.function over a SavedModel's serving signature (keyword-only)."""
    tf = import_tf()

    if not saved_model.detect(path):
        if graph_source.kind(path) is not None:
            return _graph_serving(path, graph_options)
        raise ModelLoadError(path, None, "it is not a SavedModel directory nor a TF1 graph (.pb, checkpoint), and "
                             "only a Keras model, a SavedModel directory or a TF1 graph can be converted to tflite, "
                             "onnx or tfjs", "pass the Keras model, or the directory "
                             "written by model.export() / tf.saved_model.save()", action="convert")
    loaded = saved_model.load(path, device="cpu")
    names = [s.name for s in loaded.inputs]
    specs = [tf.TensorSpec(s.shape, tf.as_dtype(s.dtype), name=s.name) for s in loaded.inputs]
    signature = loaded.native

    def serve(*args: Any) -> Any:
        return signature(**dict(zip(names, args)))

    function = tf.function(serve, input_signature=specs, autograph=False)
    return Serving(function, specs, [s.name for s in loaded.outputs], loaded.loaded)


def _graph_serving(path: Path, graph_options: Mapping[str, Any] | None = None) -> Serving:
    """A positional tf.function over a TF1 graph source, frozen and wrapped (``graph_source``)."""
    tf = import_tf()
    graph = graph_source.graph_function(path, **dict(graph_options or {}))
    names = [s.name for s in graph.loaded.inputs]
    specs = [tf.TensorSpec(s.shape, tf.as_dtype(s.dtype), name=s.name) for s in graph.loaded.inputs]
    output_names = [s.name for s in graph.loaded.outputs]
    graph.loaded.close()
    wrapped = graph.function

    def serve(*args: Any) -> Any:
        return wrapped(**dict(zip(names, args)))

    function = tf.function(serve, input_signature=specs, autograph=False)
    return Serving(function, specs, output_names, graph.holder, route=graph.route)


def variable_holder(model: Any):
    """A ``tf.Module`` that tracks the model's ``tf.Variable``s (and lookup tables) so the
    converter freezes them.

    Keras 3 wraps each ``tf.Variable`` in a ``keras.Variable`` the converter does not see
    through: without this, the weights stay as uninitialised resource variables and the
    .tflite file outputs NaN. The model itself is not tracked: the converter saves its holder
    as a SavedModel first, and a tracked Keras model makes that save walk and trace every
    layer (MobileNetV2 at 64 px: 8.7-9.2 s per conversion against 3.3-3.6 s, measured in one
    process). ``converter_holder`` tracks it after all where the function captures a resource
    neither the variables nor the tables hold.
    """
    tf = import_tf()

    holder = tf.Module()
    holder.variables_ = [v.value if isinstance(getattr(v, "value", None), tf.Variable) else v
                         for v in getattr(model, "variables", [])]
    holder.resources_ = _layer_resources(model)
    return holder


def _layer_resources(model: Any) -> list[Any]:
    """The ``TrackableResource``s (``StringLookup``'s hash table...) held by the model's layers."""
    tf = import_tf()
    flatten = getattr(model, "_flatten_layers", None)
    found: dict[int, Any] = {}
    for layer in (flatten(include_self=True) if callable(flatten) else []):
        for value in vars(layer).values():
            for item in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(item, tf.saved_model.experimental.TrackableResource):
                    found[id(item)] = item
    return list(found.values())


def converter_holder(serving: Serving, concrete: Any) -> Any:
    """``serving.holder``, tracking the whole model where ``concrete`` captures a resource the
    holder's variables and tables do not cover (a custom layer's own resource): complete,
    at the cost of the slower save."""
    holder = serving.holder
    if serving.model is None or getattr(holder, "model", None) is not None:
        return holder
    tf = import_tf()
    tracked = {id(v.handle) for v in getattr(holder, "variables_", []) if hasattr(v, "handle")}
    tracked |= {id(r.resource_handle) for r in getattr(holder, "resources_", [])}
    captured = [t for t in concrete.captured_inputs if t.dtype == tf.resource]
    if any(id(t) not in tracked for t in captured):
        holder.model = serving.model
    return holder


def graph_op_types(concrete: Any) -> set[str]:
    """Op types in a concrete function's graph and every function it calls."""
    graph_def = concrete.graph.as_graph_def()
    ops = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        ops.update(node.op for node in function.node_def)
    return ops
