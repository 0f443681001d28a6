"""Twins of a TensorFlow reference behind one interface: a runner that takes the batch the
reference takes and returns the twin's outputs, in the reference's output order.

Two ways to build one, tried in this order by ``floor/measure.py``:

- ``keras``: a functional/Sequential Keras model rebuilt from its config at another precision
  (``keras_twin.py``); cheap, and it keeps Keras' own layers (the depthwise speed-up).
- ``graph``: any reference with a TensorFlow graph (a Keras model of any kind, a SavedModel
  signature, a frozen GraphDef, a TF1 checkpoint, a ``tf.function``/``tf.Module``) frozen and
  rewritten (``graph_twin.py``).

Why a runner and not a model: the twin must be fed whatever the reference is fed. A
``keras.applications`` model's input is named ``keras_tensor``, its config-rebuilt twin's
``input_layer``; a graph's placeholders have names of their own. The runner fits the batch to
the *reference's* inputs (its ``prepare_batch``: names, dtypes, shapes) and feeds the twin by
position, so names never have to agree.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..formats.common import import_tf, is_keras_model, name_outputs
from ..formats.tensorflow.graph import GraphUnavailable, freeze_concrete, spec
from ..formats.base import LoadedModel
from ..formats.binding import BoundModel
from ..formats.tensorflow.keras_specs import pack_inputs

Runner = Callable[[Any], dict]


class TwinUnavailable(Exception):
    """No twin of this kind can be built for this reference; the message says why."""


class NotApplicable(TwinUnavailable):
    """This way of building a twin does not apply to the reference (a Keras-config twin of a
    SavedModel): not worth saying when another way measures or says why it cannot."""


def build_runner(reference: Any, kind: str, method: str) -> tuple[Runner, bool]:
    """``(runner, accumulates)``: a runner of the ``kind`` twin (``"float64"``,
    ``"float16 weights"`` or ``"float32 reordered"``, graph only) built by ``method``, and whether the model sums products (a
    float64 twin of such a model that equals it bitwise stayed partly float32)."""
    if isinstance(reference, BoundModel):  # a session's candidate: its twin speaks its binding
        runner, accumulates = build_runner(reference.inner, kind, method)
        return through_binding(reference, runner), accumulates
    loaded = as_loaded(reference)
    if method == "keras":
        return _keras_runner(loaded, kind)
    if method == "graph":
        return _graph_runner(loaded, kind)
    raise ValueError(f"twin method {method!r}; expected 'keras' or 'graph'")


def through_binding(bound: BoundModel, runner: Runner) -> Runner:
    """``runner`` (a twin of ``bound.inner``) fed and answering as ``bound`` is: the batch fitted to
    the bound inputs and handed to the inner model by its own names, the outputs renamed to the
    reference's names, in ``bound``'s output order.

    Why: a bound model's inputs and outputs follow the reference's order, its inner form's own
    (a SavedModel's: sorted names) may differ. A twin built on the inner form but labelled in
    ``bound``'s order swapped a two-head net's ``mean`` and ``log_var`` (issue 36): with heads 2%
    apart it measured 2e-2 of scale as the model's float32 error, far apart it was refused as
    unfaithful."""
    to_other = bound.input_binding.to_other()
    to_reference = bound.output_binding.to_reference()
    names = [s.name for s in bound.outputs]

    def run(batch: Any) -> dict:
        feeds = bound.prepare_batch(batch)
        out = runner({to_other[name]: value for name, value in feeds.items()})
        renamed = {to_reference[name]: value for name, value in out.items() if name in to_reference}
        return {name: renamed[name] for name in names}

    return run


def as_loaded(reference: Any) -> LoadedModel:
    """The reference as a ``LoadedModel`` (a raw Keras model or ``tf.function`` is wrapped),
    so every twin fits batches with the reference's own ``prepare_batch``."""
    if isinstance(reference, LoadedModel):
        return reference
    if is_keras_model(reference):
        from ..formats.tensorflow.keras import KerasModel

        try:
            return KerasModel(reference, device="cpu")
        except Exception as exc:  # noqa: BLE001 - e.g. a subclassed model never called
            raise TwinUnavailable(f"its inputs are unknown ({_first(exc)})") from exc
    function = reference if hasattr(reference, "get_concrete_function") else getattr(reference, "__call__", None)
    if hasattr(function, "get_concrete_function"):  # a tf.function, or a tf.Module calling one
        return TracedFunction(function)
    raise TwinUnavailable(f"{type(reference).__name__} is not a TensorFlow model (no graph to run in float64)")


class TracedFunction(LoadedModel):
    """A ``tf.function`` (or a ``tf.Module`` whose ``__call__`` is one) with an input
    signature, seen as a model: positional inputs, outputs flattened as ``tf.nest`` does."""

    format = "tf.function"

    def __init__(self, function: Any) -> None:
        tf = import_tf()
        try:
            self.native = function.get_concrete_function()
        except Exception as exc:  # noqa: BLE001 - no input_signature: nothing to trace
            raise TwinUnavailable("a tf.function without an input_signature cannot be traced for a float64 run; "
                                  "give it input_signature=[tf.TensorSpec(...)]") from exc
        specs = tf.nest.flatten(self.native.structured_input_signature)
        structure = self.native.structured_outputs
        names = sorted(structure) if isinstance(structure, dict) else [
            f"output_{i}" for i in range(len(tf.nest.flatten(structure)))]
        flat_out = tf.nest.flatten(structure)
        super().__init__(device="cpu",
                         inputs=[spec(s.name or f"input_{i}", s.shape, s.dtype) for i, s in enumerate(specs)],
                         outputs=[spec(n, t.shape, t.dtype) for n, t in zip(names, flat_out)])

    def _predict(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tf = import_tf()
        result = self.native(*[tf.constant(feeds[s.name]) for s in self.inputs])
        return {s.name: np.asarray(v) for s, v in zip(self.outputs, tf.nest.flatten(result))}

    def frozen_graph(self) -> Any:
        return freeze_concrete(self.native)


def _feeder(loaded: LoadedModel) -> Callable[[Any], list[np.ndarray]]:
    """The batch fitted to the reference's inputs, as a list in its input order."""
    def feed(batch: Any) -> list[np.ndarray]:
        feeds = loaded.prepare_batch(batch)
        return [feeds[s.name] for s in loaded.inputs]
    return feed


# -- the Keras-config twin ----------------------------------------------------------------

def _keras_runner(loaded: LoadedModel, kind: str) -> tuple[Runner, bool]:
    from .keras_twin import ShadowUnavailable, float16_weights_twin, float64_twin

    native: Any = getattr(loaded, "native", None)
    if loaded.format not in ("keras", "h5") or not is_keras_model(native):
        raise NotApplicable("not a Keras model")
    if kind not in ("float64", "float16 weights"):
        raise NotApplicable(f"a {kind} twin is built from the graph only")
    try:
        twin = float64_twin(native) if kind == "float64" else float16_weights_twin(native)
    except ShadowUnavailable as exc:
        raise TwinUnavailable(str(exc)) from exc
    feed, names = _feeder(loaded), [s.name for s in loaded.outputs]
    tf = import_tf()
    cast = np.float64 if kind == "float64" else None

    def run(batch: Any) -> dict:
        xs = [x.astype(cast) if cast is not None and x.dtype.kind == "f" else x for x in feed(batch)]
        with tf.device("/CPU:0"):
            return name_outputs(twin(pack_inputs(twin, xs), training=False), names)

    accumulates = any(np.ndim(w) >= 2 and np.asarray(w).dtype.kind == "f" for w in native.get_weights())
    return run, accumulates


# -- the graph twin -----------------------------------------------------------------------

def _graph_runner(loaded: LoadedModel, kind: str) -> tuple[Runner, bool]:
    from . import graph_twin

    if kind == "float32 reordered":  # refused before the freeze (the costly part) where it can be
        fixed = sorted((_traced_ops(loaded) or set()) & graph_twin.UNREORDERED_SUMS)
        if fixed:
            raise TwinUnavailable(f"its {', '.join(fixed)} ops sum products in an order the twin does not vary")
    frozen = frozen_graph(loaded)
    try:
        twin = graph_twin.build(frozen, kind)
    except GraphUnavailable as exc:
        raise TwinUnavailable(str(exc)) from exc
    feed, names = _feeder(loaded), [s.name for s in loaded.outputs]

    def run(batch: Any) -> dict:
        try:
            return dict(zip(names, twin.run(feed(batch))))
        except GraphUnavailable as exc:
            raise TwinUnavailable(str(exc)) from exc

    return run, bool(frozen.op_types() & graph_twin.ACCUMULATING_OPS)


# Keras layers whose graph holds a sum the reordered twin cannot vary, as the op it becomes.
_KERAS_SUMS = {"DepthwiseConv2D": "DepthwiseConv2dNative", "SeparableConv2D": "DepthwiseConv2dNative",
               "DepthwiseConv1D": "DepthwiseConv2dNative", "SeparableConv1D": "DepthwiseConv2dNative",
               "MultiHeadAttention": "Einsum", "EinsumDense": "Einsum", "Conv3D": "Conv3D",
               "Conv2DTranspose": "Conv2DBackpropInput", "Conv1DTranspose": "Conv2DBackpropInput"}


# Ops that turn a float32 rounding error into a larger one at the output: a log (of a filter
# bank's cancelling sum, where the float64 error was 600x what correct float32 forms differ
# by), a division by a computed tensor, a power, an arctangent; and the normalisations that
# divide by a computed spread. Without one, every net measured had its reordered spread within
# 0.8-2.2x its float64 error (ResNet50, DenseNet121, the digits CNN: docs/tolerances.md), far
# above the 1/16 at which it judges, so it is not built (ResNet50's: 21 s under load).
_AMPLIFYING_KERAS = {"Log", "Log1p", "Log2", "Log10", "Divide", "TrueDivide", "FloorDivide", "Reciprocal",
                     "Power", "Arctan", "Arctan2", "LayerNormalization", "GroupNormalization",
                     "UnitNormalization", "RMSNormalization"}


def rounding_not_amplified(reference: Any) -> str | None:
    """Why the reordered twin of a Keras reference would not judge, told from its layers and
    ops before any trace: none of them amplifies rounding (``_AMPLIFYING_KERAS``). None where
    one does, or where it cannot be told (a custom layer or a ``Lambda`` runs Python code, a
    subclassed model's ``call`` too, a graph reference's ops need a trace): built as before."""
    native: Any = getattr(reference, "native", reference)
    if not is_keras_model(native) or not hasattr(native, "operations"):
        return None
    from ..formats.tensorflow.keras_specs import is_subclassed

    pending, seen = [native], 0
    while pending:
        model = pending.pop()
        if is_subclassed(model):
            return None
        for op in model.operations:
            cls = type(op)
            if is_keras_model(op):
                pending.append(op)
                continue
            if not cls.__module__.startswith("keras.") or cls.__name__ == "Lambda" or cls.__name__ in _AMPLIFYING_KERAS:
                return None
            seen += 1
    return (f"none of its {seen} layers and ops amplifies float32 rounding (a log, a division by a computed "
            "tensor...), so two float32 forms differ by about its float64 error: that floor judges") if seen else None


def _traced_ops(loaded: LoadedModel) -> set[str] | None:
    """The op types of the reference's traced function, functions included, before any freeze
    (a Keras model's cached trace, a SavedModel signature, a ``tf.function``); None if unknown."""
    native: Any = getattr(loaded, "native", None)
    if is_keras_model(native):  # read from its layers: no trace needed (MobileNetV2's: 2 s)
        layers = list(native._flatten_layers(include_self=False))
        ops = {_KERAS_SUMS[type(layer).__name__] for layer in layers if type(layer).__name__ in _KERAS_SUMS}
        if any(getattr(layer, "groups", 1) > 1 for layer in layers):  # grouped: one group per channel
            ops.add("DepthwiseConv2dNative")
        if ops:
            return ops
    try:
        traced = getattr(loaded, "traced_function", None)
        fn: Any = traced() if callable(traced) else getattr(loaded, "native", None)
        graph_def = fn.graph.as_graph_def()
    except Exception:  # noqa: BLE001 - no trace to read: the frozen graph's check decides
        return None
    return {n.op for n in graph_def.node} | {n.op for f in graph_def.library.function for n in f.node_def}


def frozen_graph(loaded: LoadedModel) -> Any:
    """The reference's inference graph with constants for weights (``graph_twin.FrozenGraph``)."""
    from . import graph_twin

    hook = getattr(loaded, "frozen_graph", None)
    if not callable(hook):
        raise TwinUnavailable(f"the {loaded.format} form has no TensorFlow graph to run in float64")
    try:
        frozen = hook()
    except GraphUnavailable as exc:
        raise TwinUnavailable(str(exc)) from exc
    if frozen is None:
        raise TwinUnavailable(f"this {loaded.format} model exposes no TensorFlow graph")
    if len(frozen.inputs) != len(loaded.inputs) or len(frozen.outputs) != len(loaded.outputs):
        raise TwinUnavailable(f"the frozen graph has {len(frozen.inputs)} inputs and {len(frozen.outputs)} outputs, "
                              f"the model {len(loaded.inputs)} and {len(loaded.outputs)}")
    return frozen


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
