"""Importing a TF1 ``.meta`` MetaGraph, old ones included.

Why: a MetaGraph written by TF 1.x can carry attributes TF 2 now checks and rejects although
inference never reads them. The measured case (TF1 music taggers of TF 1.11/1.12, TF 2.21): a
stale ``_output_shapes`` on a gradient node, ``_output_shapes attribute inconsistent with the
GraphDef``. Such attributes are dropped and the import retried; the returned route says so.
A file that does not parse is truncated or corrupt; one that parses but is refused is not,
and its message says which.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ...errors import ModelLoadError
from ..common import first_line, quiet

# Attributes a node may carry that TF 2's importer checks, and inference does not need:
# ``_output_shapes`` is a shape hint that TF 1 wrote and TF 2 validates against its own inference.
DROPPABLE_ATTRS: tuple[str, ...] = ("_output_shapes",)


def read_meta_graph(meta: Path, format: str) -> Any:
    """The ``MetaGraphDef`` of ``meta``, or a ModelLoadError when the file does not parse."""
    from tensorflow.core.protobuf import meta_graph_pb2

    proto = meta_graph_pb2.MetaGraphDef()
    try:
        proto.ParseFromString(meta.read_bytes())
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise ModelLoadError(meta, format, f"the .meta MetaGraph cannot be read ({first_line(exc)})",
                             "the file is truncated or corrupt: save the checkpoint again") from exc
    return proto


def drop_attrs(proto: Any, names: tuple[str, ...] = DROPPABLE_ATTRS) -> int:
    """Remove the attributes ``names`` from every node (graph and function library) of the
    MetaGraphDef ``proto``, in place; the number of nodes changed."""
    changed = 0
    nodes = list(proto.graph_def.node)
    for function in proto.graph_def.library.function:
        nodes.extend(function.node_def)
    for node in nodes:
        present = [name for name in names if name in node.attr]
        for name in present:
            del node.attr[name]
        changed += bool(present)
    return changed


def _refused_by_droppable(exc: Exception) -> bool:
    return any(name in str(exc) for name in DROPPABLE_ATTRS)


def import_meta_graph(tf: Any, meta: Path, device: str, format: str,
                      rewrite: Callable[[Any], Any] | None = None) -> tuple[Any, Any, str | None]:
    """Import ``meta`` into a new ``tf.Graph`` on ``device``: ``(graph, saver or None, route
    or None)``. The route is None for a plain import and says what was dropped when the
    import was retried (in another new graph: a failed import can leave ops behind).
    ``rewrite`` edits the GraphDef first (graph switches folded to constants)."""
    proto = read_meta_graph(meta, format)
    if rewrite is not None:
        rewrite(proto.graph_def)
    graph = tf.Graph()
    try:
        with quiet(), graph.as_default(), tf.device(device):
            return graph, tf.compat.v1.train.import_meta_graph(proto, clear_devices=True), None
    except Exception as exc:  # noqa: BLE001
        first = exc
    if not _refused_by_droppable(first):
        raise _refused(meta, format, tf, first) from first
    changed = drop_attrs(proto)
    graph = tf.Graph()
    try:
        with quiet(), graph.as_default(), tf.device(device):
            saver = tf.compat.v1.train.import_meta_graph(proto, clear_devices=True)
    except Exception as exc:  # noqa: BLE001
        raise _refused(meta, format, tf, exc, retried=first) from exc
    route = (f"old MetaGraph: TensorFlow {tf.__version__} refused it ({first_line(first)}); "
             f"dropped {', '.join(DROPPABLE_ATTRS)} from {changed} nodes (inference does not need it) "
             "and imported it again")
    return graph, saver, route


def _refused(meta: Path, format: str, tf: Any, exc: Exception, retried: Exception | None = None) -> ModelLoadError:
    """The file parses, so it is not corrupt: TensorFlow refuses what it describes."""
    problem = f"TensorFlow {tf.__version__} refuses the .meta MetaGraph ({first_line(exc)})"
    if retried is not None:
        problem += (f"; it first refused it for {first_line(retried)}, and dropping "
                    f"{', '.join(DROPPABLE_ATTRS)} did not help")
    return ModelLoadError(meta, format, problem,
                          "the file reads whole, so the graph itself is the cause: load it in the TensorFlow "
                          "version that wrote it and freeze it there (tf.compat.v1.graph_util."
                          "convert_variables_to_constants), then pass the .pb")
