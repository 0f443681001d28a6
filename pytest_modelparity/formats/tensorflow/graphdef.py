"""Format ``graphdef``: a frozen ``.pb`` GraphDef (weights folded into Const nodes).

Loaded into its own ``tf.Graph`` and run by a ``tf.compat.v1.Session``: Placeholders with a
free batch dim take any batch size without rebuilding anything. Inputs and outputs are
named (``inputs=["x:0"]``, ``outputs=["predictions:0"]``) or found automatically.
Export freezes the Keras model's inference function (``convert_variables_to_constants_v2``)
and names the output nodes after the Keras outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from ...errors import ExportError, ModelLoadError
from ...runtime.devices import require_tf_device
from ..common import first_line, quiet
from .._files import read_regular
from .switches import fold_feeds
from .graph import SessionModel, const_weights, import_tf, new_session, require_path, resolve_tensors
from .trust import refuse_untrusted

NAME = "graphdef"
EXPORT_REQUIRES: tuple[tuple[str, str], ...] = ()


def detect(path: Path) -> bool:
    return path.suffix.lower() == ".pb" and path.is_file() and path.name != "saved_model.pb"


def read_graph_def(path: Path) -> Any:
    """Parse ``path`` as a binary GraphDef, or raise a ModelLoadError saying why it is not one."""
    tf = import_tf()
    data = read_regular(path, NAME)
    hint = ("this is a SavedModel's graph: load its directory with format='saved_model'"
            if path.name == "saved_model.pb" else
            "pass a frozen GraphDef (.pb written by graph_util / convert_variables_to_constants_v2)")
    graph_def = tf.compat.v1.GraphDef()
    try:
        graph_def.ParseFromString(data)
    except Exception as exc:  # noqa: BLE001 - protobuf DecodeError and friends
        raise ModelLoadError(path, NAME, f"not a GraphDef: the protobuf does not parse ({first_line(exc)}); "
                             "the file is truncated, corrupt, or another kind of .pb", hint) from exc
    if not graph_def.node:
        raise ModelLoadError(path, NAME, "not a GraphDef: it parses but holds no nodes", hint)
    if any(not node.op or not node.name for node in graph_def.node):
        raise ModelLoadError(path, NAME, "not a GraphDef: some nodes have no name or op", hint)
    return graph_def


def load(source: Any, *, device: str = "cpu", inputs: Sequence[str] | None = None,
         outputs: Sequence[str] | None = None, feeds: Mapping[str, Any] | None = None,
         trusted: bool | None = None) -> SessionModel:
    """``feeds`` sets graph switches (``{"is_training": False}``), folded in as constants."""
    path = require_path(Path(source), NAME)
    dev = require_tf_device(device, format=NAME)
    graph_def = read_graph_def(path)
    refuse_untrusted(path, NAME, trusted, proto=graph_def)  # before TensorFlow imports it (docs/security.md)
    fold_feeds(graph_def, feeds, path, NAME)
    tf = import_tf()
    graph = tf.Graph()
    try:
        with graph.as_default(), tf.device(dev.tf_name):
            tf.graph_util.import_graph_def(graph_def, name="")
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(path, NAME, f"TensorFlow cannot import the GraphDef ({first_line(exc)})",
                             "the file is corrupt, or uses ops this TensorFlow does not have") from exc
    in_tensors, out_tensors = resolve_tensors(graph, path, NAME, inputs, outputs)
    return SessionModel(format=NAME, graph=graph, session=new_session(graph), in_tensors=in_tensors,
                        out_tensors=out_tensors, device=device, source=path, graph_def=graph_def,
                        weights_fn=lambda: const_weights(graph_def))


def export(model: Any, path: Path, **options: Any) -> Path:
    """Freeze the inference function of a Keras model and write its GraphDef to ``path``."""
    if options:
        raise TypeError(f"graphdef export takes no options, got {sorted(options)}")
    import_tf()  # quiet TF's start-up logging before the first TF import below
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    from .keras import KerasModel

    with quiet():
        fn = KerasModel(model, device="cpu").traced_function()
        frozen = convert_variables_to_constants_v2(fn)
    graph_def = frozen.graph.as_graph_def()
    tables = [n.name for n in graph_def.node if n.op == "Placeholder" and n.attr["dtype"].type == 20]  # DT_RESOURCE
    if tables:
        raise ExportError(path, NAME, f"freezing left {len(tables)} resource input(s) ({', '.join(tables[:3])}): "
                             "lookup tables (StringLookup, IntegerLookup, TextVectorization) are not variables, "
                             "and a frozen GraphDef cannot hold or initialise them",
                             "test this model as keras or saved_model (they keep the tables; tflite often does too); string inputs "
                             "without tables (e.g. keras.layers.Hashing) do export to graphdef", not_applicable=True)
    # Rename the function's output Identity nodes to the Keras output names ("probs:0").
    taken = {node.name for node in graph_def.node}
    renames = {}
    # The frozen function keeps the flat output order of the traced one (dict keys, sorted).
    flat_names = sorted(fn.structured_outputs)
    for name, tensor in zip(flat_names, frozen.outputs):
        old = tensor.op.name
        if name not in taken and tensor.value_index == 0:
            renames[old] = name
            taken.add(name)
    for node in graph_def.node:
        node.name = renames.get(node.name, node.name)
        for i, inp in enumerate(node.input):
            bare = inp.lstrip("^").split(":")[0]
            if bare in renames:
                node.input[i] = inp.replace(bare, renames[bare], 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(graph_def.SerializeToString())
    tmp.replace(path)
    return path
