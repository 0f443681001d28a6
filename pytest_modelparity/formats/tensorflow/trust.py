"""Refuse a TensorFlow graph that reaches outside the model before any of it runs.

Why: loading a SavedModel runs its init ops (a TF1 Builder's ``main_op`` runs inside
``load_model``) and a predict runs its graph; a graph may read or write any file, run
Python (``PyFunc``) or call a debug server. Loading code the user did not write is a
decision the user makes, as for Keras ``Lambda`` layers. So the graph is read from its
protobuf (``saved_model.pb``, ``.pb``, ``.meta``) without importing it in TensorFlow, every
node of it and of every library function is checked, and a model holding such ops is
refused with the ops, nodes and functions named, unless it is trusted: ``trusted=True`` to
``load_model``/``export_model``, ``--modelparity-trust-models`` or the ini key
``modelparity_trust_models`` (the plugin sets ``MODELPARITY_TRUST_MODELS=1`` for the session
and its export process). docs/security.md says what is refused and what runs.

Allowed though listed: the loader's own restore (Save/Restore ops named by the MetaGraph's
``saver_def`` and the functions those nodes call, TF2's ``__inference__traced_save/restore``) and a vocabulary
table (``InitializeTableFromTextFile``) whose file name is fed by the SavedModel's asset
mechanism (a function argument or placeholder; TensorFlow points it at ``assets/``), or a
constant naming a file inside the model's own folder.
"""

from __future__ import annotations

import contextlib
import os
import re
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from ...errors import ModelLoadError
from ..common import first_line
from .op_allowlist import UNKNOWN, module_of, not_known_to_compute
from .trust_graph import RESTORE_OPS, SAVE_OPS, GraphView, data_inputs, node_of

TRUST_ENV = "MODELPARITY_TRUST_MODELS"

# op -> what it reaches. Every one needs a file name, a Python callable or a server address.
_FILES = "files"
_PYTHON = "Python code"
_DEBUG = "a debug server or dump folder"
_SERVICE = "a tf.data service (a network address)"
_GRAPHS = "a graph decoded from bytes (it runs ops the scan never saw)"
_VARIANT = 21  # types_pb2.DT_VARIANT
REACHING_OPS: dict[str, str] = {
    **dict.fromkeys(("ReadFile", "WriteFile", "MatchingFiles", "ImmutableConst", "WholeFileReader",
                     "WholeFileReaderV2", "TextLineReader", "TextLineReaderV2", "FixedLengthRecordReader",
                     "FixedLengthRecordReaderV2", "TFRecordReader", "TFRecordReaderV2", "LMDBReader",
                     "IdentityReader", "IdentityReaderV2", "ReaderReadV2", "ReaderRead", "ReaderReadUpTo",
                     "ReaderReadUpToV2", "RecordInput",
                     "TFRecordDataset", "TFRecordDatasetV2", "TextLineDataset", "FixedLengthRecordDataset",
                     "FixedLengthRecordDatasetV2", "LMDBDataset", "ExperimentalLMDBDataset", "CSVDataset",
                     "CSVDatasetV2", "ExperimentalCSVDataset", "SqlDataset", "ExperimentalSqlDataset",
                     "MatchingFilesDataset", "ExperimentalMatchingFilesDataset", "CacheDataset", "CacheDatasetV2",
                     "SnapshotDataset", "SnapshotDatasetV2", "SnapshotDatasetReader", "SnapshotNestedDatasetReader",
                     "SnapshotChunkDataset", "ListSnapshotChunksDataset", "SaveDataset", "SaveDatasetV2",
                     "LoadDataset", "DistributedSave",
                     "DatasetToTFRecord", "ExperimentalDatasetToTFRecord", "LoadAndRemapMatrix",
                     "GenerateVocabRemapping", "CreateSummaryFileWriter", "CreateSummaryDbWriter",
                     "WriteSummary", "WriteScalarSummary", "WriteHistogramSummary", "WriteImageSummary",
                     "WriteAudioSummary", "WriteGraphSummary", "WriteRawProtoSummary", "ImportEvent",
                     "FlushSummaryWriter", "CalibrationStatisticsSaver", "FileSystemSetConfiguration",
                     "DecodeProtoV2", "EncodeProto",  # descriptor_source: a file of descriptors
                     "Save", "SaveV2", "SaveSlices", "Restore", "RestoreV2",
                     "RestoreSlice", "MergeV2Checkpoints", "InitializeTableFromTextFile",
                     "InitializeTableFromTextFileV2"), _FILES),
    **dict.fromkeys(("PyFunc", "PyFuncStateless", "EagerPyFunc"), _PYTHON),
    **dict.fromkeys(("DebugIdentity", "DebugIdentityV2", "DebugIdentityV3", "DebugNanCount",
                     "DebugNumericSummary", "DebugNumericSummaryV2", "RpcClient", "RpcCall", "RpcServer",
                     "RpcServerStart", "RpcServerRegister", "Rpc", "TryRpc"), _DEBUG),
    **dict.fromkeys(("DataServiceDataset", "DataServiceDatasetV2", "DataServiceDatasetV3", "DataServiceDatasetV4",
                     "RegisterDataset", "RegisterDatasetV2"), _SERVICE),
    **dict.fromkeys(("DatasetFromGraph", "DeserializeIterator"), _GRAPHS),
}
_VOCAB_OPS = frozenset({"InitializeTableFromTextFile", "InitializeTableFromTextFileV2"})


@dataclass(frozen=True)
class Finding:
    op: str
    node: str
    function: str | None  # None: the graph itself
    reaches: str
    init: str | None = None  # the init collection (main_op...) or restore that runs it at load, if any
    why: str | None = None  # why an op the model may own (a saver's, a vocabulary's) is not its own

    def words(self) -> str:
        where = f" in function {self.function}" if self.function else ""
        why = f", {self.why}" if self.why else ""
        when = "" if not self.init else (f", {self.init}" if self.init.startswith("in the ") else
                                         f", run by {self.init} at load")
        return f"{self.op} (node {self.node!r}{where}: {self.reaches}{why}{when})"


# The word given to export_model(..., trusted=...), for the loads its converter makes itself
# (a SavedModel or TF1 graph is loaded again inside the conversion, without the argument).
_GIVEN: ContextVar[bool | None] = ContextVar("modelparity_trusted", default=None)


@contextlib.contextmanager
def trusting(trusted: bool | None) -> Iterator[None]:
    """Within the block, a load that is not told otherwise takes ``trusted`` (None: no change)."""
    token = _GIVEN.set(trusted)
    try:
        yield
    finally:
        _GIVEN.reset(token)


def is_trusted(trusted: bool | None) -> bool:
    """The caller's word, else export_model's (``trusting``), else the session's
    (``MODELPARITY_TRUST_MODELS``)."""
    if trusted is not None:
        return bool(trusted)
    if _GIVEN.get() is not None:
        return bool(_GIVEN.get())
    return os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def read_protobuf(path: Path, format: str, kind: str) -> Any:
    """Parse ``path`` as ``kind`` (saved_model, meta_graph, graph_def) without running anything;
    a file that does not parse is named truncated or corrupt with its fix."""
    from ...runtime.tf_import import import_tf
    from .._files import read_regular

    import_tf()  # the protobuf classes live in the tensorflow package; quietly imported once
    from tensorflow.core.framework import graph_pb2
    from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

    proto = {"saved_model": saved_model_pb2.SavedModel, "meta_graph": meta_graph_pb2.MetaGraphDef,
             "graph_def": graph_pb2.GraphDef}[kind]()
    data = read_regular(path, format)
    try:
        if path.suffix == ".pbtxt":
            from google.protobuf import text_format  # type: ignore[import-untyped]

            text_format.Parse(data.decode("utf-8"), proto)
        else:
            proto.ParseFromString(data)
    except Exception as exc:  # noqa: BLE001 - DecodeError, ParseError, UnicodeDecodeError
        label = {"saved_model": "SavedModel's saved_model.pb", "meta_graph": ".meta MetaGraph",
                 "graph_def": "GraphDef"}[kind]
        raise ModelLoadError(path, format, f"the {label} cannot be read ({path.name} does not parse as a "
                             f"protobuf: {first_line(exc)})",
                             "the file is truncated or corrupt: export the model again (model.export(path), "
                             "tf.saved_model.save or the Saver), or copy it again whole") from exc
    if kind == "saved_model" and not proto.meta_graphs:
        raise ModelLoadError(path, format, f"{path.name} parses but holds no MetaGraph: the file is truncated "
                             "or corrupt", "export the SavedModel again (model.export(path) or tf.saved_model.save)")
    return proto


def _inside(value: str, root: Path) -> bool:
    """Whether TensorFlow, opening ``value`` (relative: from the working directory), reads a
    regular file inside ``root`` (symlinks resolved)."""
    try:
        real, top = Path(os.path.abspath(value)).resolve(), root.resolve()
    except (OSError, RuntimeError):
        return False
    return real.is_file() and top in real.parents


def _why_refused(view: GraphView, scope: str | None, node: Any, root: Path) -> str | None:
    """Why a file-reaching op is refused, or None when it is the model's own: the saver's
    save and restore by structure (trust_graph.roles), a vocabulary by its file name's value."""
    roles = view.roles()
    if node.op in SAVE_OPS:
        if (node.name in roles["save"]) if scope is None else (scope in roles["save_fns"]):
            return None
        restore = node_of(view.saver.restore_op_name) if view.saver is not None else None
        if scope is None and node.name in roles["restored"]:
            return f"a checkpoint write that the saver's restore {restore!r} runs"
        return "a checkpoint write outside the saver's own save subgraph"
    if node.op in RESTORE_OPS:
        mine = (node.name in roles["restore"]) if scope is None else (scope in roles["restore_fns"])
        inputs = data_inputs(node)
        if mine and inputs and roles["filename"] and view.origins(scope, inputs[0]) == {(None, roles["filename"])}:
            return None
        if not mine:
            return "a checkpoint read outside the saver's own restore subgraph"
        return "a checkpoint read whose file name is not the saver's own (the model's variables)"
    if node.op in _VOCAB_OPS:
        inputs = data_inputs(node)
        values = view.values(scope, inputs[1]) if len(inputs) > 1 else None
        if values is None:
            return "its file name is not a constant of the model (fed, computed or restored when it runs)"
        outside = sorted(v for v in values if not _inside(v, root))
        if not outside:
            return None
        return f"its file name {outside[0]!r} is no file inside {root}"
    return ""


def _reaches(node: Any) -> str | None:
    reaches = REACHING_OPS.get(node.op)
    if reaches is None and node.op in ("Print", "PrintV2"):
        stream = node.attr["output_stream"].s.decode("utf-8", "replace") if "output_stream" in node.attr else ""
        reaches = _FILES if stream.startswith("file://") else None
    if reaches is None and _VARIANT in (node.attr["out_type"].type if node.op == "ParseTensor" else None,
                                         node.attr["dtype"].type if node.op == "Const" else None):
        reaches = _GRAPHS  # a variant decoded from bytes in the file: a dataset or iterator graph
    return reaches


def _unknown(view: GraphView, scope: str | None, node: Any) -> str | None:
    """What an op outside the allowlist (op_allowlist.py) may reach, or None when it is known to
    compute, calls one of the graph's own functions (scanned in turn), or is the saver's own
    plumbing by structure (``ShardedFilename`` and the like in its save or restore subgraph)."""
    if node.op in view.functions:
        return None
    reaches = not_known_to_compute(node.op)
    if reaches is None or (module_of(node.op) == "gen_io_ops" and view.saver_owns(scope, node.name)):
        return None
    return reaches


def _scan_view(view: GraphView, root: Path) -> list[Finding]:
    """Every op of the graph and of every library function that reaches out or is not known to
    compute, and is not the model's own (its saver's, its vocabulary's)."""
    at_load = view.runs_at_load()
    fn_at_load: dict[str, str] = {}
    for label in dict.fromkeys(at_load.values()):
        called = [fn for name, why in at_load.items() if why == label for fn in view.calls(view.nodes[name])]
        for fn in view.closure(called):
            fn_at_load.setdefault(fn, label)
    found = []
    scopes: list[tuple[str | None, Iterable[Any]]] = [(None, view.nodes.values())]
    scopes += [(name, fn.node_def) for name, fn in view.functions.items()]
    for scope, nodes in scopes:
        for node in nodes:
            reaches = _reaches(node)
            why = _why_refused(view, scope, node, root) if reaches is not None else ""
            reaches = reaches or _unknown(view, scope, node)
            if why is None or reaches is None:
                continue
            init = at_load.get(node.name) if scope is None else fn_at_load.get(scope)
            found.append(Finding(node.op, node.name, scope, reaches, init, why or None))
    return found


def scan_meta_graph(meta: Any, folder: Path, saved_model: bool = False) -> list[Finding]:
    """Every op of a MetaGraphDef (graph and library) that reaches outside the model."""
    view = GraphView(meta.graph_def, meta, folder, folder / "assets" if saved_model else None)
    view.init_runs = saved_model  # a checkpoint's loader restores; it runs no init collection
    return _scan_view(view, folder / "assets" if saved_model else folder)


def scan_file(path: Path, format: str, proto: Any = None) -> list[Finding]:
    """Read a SavedModel directory, a ``.meta`` or a frozen ``.pb`` (or take its parsed
    ``proto``) and list what reaches out."""
    path = Path(path)
    if format == "saved_model":
        proto_path = path / "saved_model.pb" if (path / "saved_model.pb").is_file() else path / "saved_model.pbtxt"
        saved = read_protobuf(proto_path, format, "saved_model")
        return [f for meta in saved.meta_graphs for f in scan_meta_graph(meta, path, saved_model=True)]
    if format == "checkpoint":
        return scan_meta_graph(read_protobuf(path, format, "meta_graph"), path.parent)
    graph_def = proto if proto is not None else read_protobuf(path, format, "graph_def")
    return _scan_view(GraphView(graph_def, folder=path.parent), path.parent)


def refuse_untrusted(path: Path, format: str, trusted: bool | None, *, action: str = "load",
                     proto: Any = None) -> None:
    """Raise ``ModelLoadError`` naming every reaching op, unless the model is trusted. The
    protobuf is parsed either way: a truncated file is named as such before TensorFlow reads it."""
    findings = scan_file(path, format, proto)
    if not findings or is_trusted(trusted):
        return
    shown = "; ".join(f.words() for f in findings[:8]) + (f"; and {len(findings) - 8} more" if len(findings) > 8 else "")
    kinds = sorted({f.reaches for f in findings} - {UNKNOWN})
    held = [f"ops that reach {' and '.join(kinds)} when it is loaded or run"] if kinds else []
    if any(f.reaches == UNKNOWN for f in findings):
        held.append("ops of no TensorFlow library known to compute")
    raise ModelLoadError(path, format, f"the graph holds {' and '.join(held)}: {shown}. Refused before TensorFlow "
                         "loads it: an untrusted graph may run only ops known to compute (docs/security.md)",
                         "only if you trust this model (you or your team wrote it): run pytest with "
                         "--modelparity-trust-models (ini: modelparity_trust_models = true), or give trusted=True "
                         "in load_model(...), export_model(...) or modelparity_load_options", action=action)


def missing_python(exc: BaseException, model: Any) -> ModelLoadError | None:
    """A trusted graph's ``tf.py_function`` whose Python body is not in this process (it is never
    saved with the model) as one clear error instead of TensorFlow's traceback; else None."""
    text = str(exc)
    if not re.search(r"py_?func", text, re.IGNORECASE) or "callback" not in text.lower():
        return None  # the callback's key (``pyfunc_2``) names it whatever the node is called
    node = re.search(r"Detected at node '?([^'\s]+)'? defined", text) or re.search(r"\{\{node ([^}]+)\}\}", text)
    where = f" (node {node.group(1)!r})" if node else ""
    return ModelLoadError(getattr(model, "source", None), getattr(model, "format", None),
                          f"the graph calls a tf.py_function / tf.numpy_function{where} whose Python body is not "
                          "saved with the model: it exists only in the process that built it",
                          "export a model that computes with TensorFlow ops only (replace the py_function), or "
                          "compare the model in the process that defines it", action="run")


def refuse_untrusted_source(path: Path, trusted: bool | None) -> None:
    """``refuse_untrusted`` for a path a converter starts from: a SavedModel directory, a frozen
    ``.pb``, a TF1 ``.meta`` or checkpoint prefix, or a folder of checkpoints (each ``.meta``)."""
    path = Path(path)
    if path.is_dir():
        if (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file():
            refuse_untrusted(path, "saved_model", trusted, action="convert")
        else:
            for meta in sorted(path.glob("*.meta")):
                refuse_untrusted(meta, "checkpoint", trusted, action="convert")
    elif path.suffix == ".pb" and path.is_file():
        refuse_untrusted(path, "graphdef", trusted, action="convert")
    elif path.suffix == ".meta" and path.is_file():
        refuse_untrusted(path, "checkpoint", trusted, action="convert")
    elif Path(f"{path}.meta").is_file():
        refuse_untrusted(Path(f"{path}.meta"), "checkpoint", trusted, action="convert")
