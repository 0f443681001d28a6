"""A TF1 graph source (a frozen ``.pb`` GraphDef, a TF1 checkpoint) as the function the
converters take: tflite and onnx trace it like a SavedModel signature, tfjs converts a
SavedModel written from it.

Why: freezing and wrapping is the usual TF1 deployment path (a wrapped function for TFLite,
the frozen graph for tf2onnx and tfjs); before, "only a Keras model or a SavedModel directory
can be converted" left a TF1 source with nothing to compare. A checkpoint is frozen first
(its session's variables become constants). Imports ``graphdef`` and ``checkpoint``; only
``serving`` and ``tfjs`` import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ModelLoadError
from ..common import quiet
from .graph import GraphUnavailable, import_tf, wrap_frozen
from ..base import LoadedModel


# The load options that say which sub-graph of a TF1 source is the model: they reach every
# conversion of it (export_model(..., inputs=, outputs=, feeds=), modelparity_load_options).
GRAPH_OPTIONS = ("inputs", "outputs", "feeds")


def kind(path: Path) -> str | None:
    """``"graphdef"`` or ``"checkpoint"`` when ``path`` is such a source, else None."""
    from . import checkpoint, graphdef

    path = Path(path)
    if graphdef.detect(path):
        return "graphdef"
    if checkpoint.detect(path):
        return "checkpoint"
    return None


@dataclass
class GraphFunction:
    """A TF1 source frozen and wrapped: ``function`` takes the inputs by name (keyword, or
    positional in sorted-name order) and returns a dict by output name; ``loaded`` is the
    source as ``load_model`` gives it (its inputs and outputs name the function's)."""

    function: Any
    holder: Any
    loaded: LoadedModel
    route: str


def graph_function(path: Path, **load_options: Any) -> GraphFunction:
    """Load ``path`` (graphdef or checkpoint), freeze it and wrap the frozen graph."""
    from . import checkpoint, graphdef

    source_kind = kind(path)
    module = {"graphdef": graphdef, "checkpoint": checkpoint}[source_kind or "graphdef"]
    # The load options (inputs, outputs, feeds) are the reference's: the converters read the
    # same sub-graph with the same switches folded, so every form computes the same thing.
    loaded = module.load(path, device="cpu", **{k: v for k, v in load_options.items() if v is not None})
    try:
        frozen = loaded.frozen_graph()
    except GraphUnavailable as exc:
        raise ModelLoadError(path, source_kind, f"the graph cannot be frozen for conversion ({exc})",
                             exc.fix or "freeze it yourself (tf.compat.v1.graph_util.convert_variables_to_constants) "
                             "and pass the .pb", action="convert") from exc
    inputs = {s.name: t for s, t in zip(loaded.inputs, frozen.inputs)}
    outputs = {s.name: t for s, t in zip(loaded.outputs, frozen.outputs)}
    shapes = {s.name: [d for d in s.shape] for s in loaded.outputs if s.shape}
    function, holder = wrap_frozen(frozen.graph_def, inputs, outputs, shapes)
    route = "TF1 graph wrapped as a function" if source_kind == "graphdef" else "TF1 checkpoint frozen, wrapped"
    named = [f"{k}={load_options[k]!r}" for k in GRAPH_OPTIONS if load_options.get(k)]
    if named:
        route += f" ({', '.join(named)})"
    if getattr(loaded, "load_route", None):  # an old MetaGraph imported on a retry
        route += f"; {loaded.load_route}"
    return GraphFunction(function, holder, loaded, route)


def write_saved_model(path: Path, dest: Path, **load_options: Any) -> tuple[Path, str]:
    """A SavedModel at ``dest`` whose ``serving_default`` is the frozen TF1 graph of ``path``
    (what tensorflowjs' converter reads), and the route the graph took."""
    tf = import_tf()
    graph = graph_function(path, **load_options)
    try:
        with quiet():
            tf.saved_model.save(graph.holder, str(dest), signatures={"serving_default": graph.function})
    finally:
        graph.loaded.close()
    return dest, graph.route
