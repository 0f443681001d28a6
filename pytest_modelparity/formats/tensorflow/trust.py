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

TRUST_ENV = "MODELPARITY_TRUST_MODELS"

# op -> what it reaches. Every one needs a file name, a Python callable or a server address.
_FILES = "files"
_PYTHON = "Python code"
_DEBUG = "a debug server or dump folder"
REACHING_OPS: dict[str, str] = {
    **dict.fromkeys(("ReadFile", "WriteFile", "MatchingFiles", "ImmutableConst", "WholeFileReader",
                     "WholeFileReaderV2", "TextLineReader", "TextLineReaderV2", "FixedLengthRecordReader",
                     "FixedLengthRecordReaderV2", "TFRecordReader", "TFRecordReaderV2", "LMDBReader",
                     "IdentityReader", "IdentityReaderV2", "ReaderReadV2", "ReaderRead", "ReaderReadUpToV2",
                     "TFRecordDataset", "TFRecordDatasetV2", "TextLineDataset", "FixedLengthRecordDataset",
                     "FixedLengthRecordDatasetV2", "LMDBDataset", "ExperimentalLMDBDataset", "CSVDataset",
                     "CSVDatasetV2", "ExperimentalCSVDataset", "SqlDataset", "ExperimentalSqlDataset",
                     "SnapshotDataset", "SnapshotDatasetV2", "SaveDataset", "SaveDatasetV2", "LoadDataset",
                     "DatasetToTFRecord", "ExperimentalDatasetToTFRecord", "LoadAndRemapMatrix",
                     "GenerateVocabRemapping", "CreateSummaryFileWriter", "CreateSummaryDbWriter",
                     "WriteSummary", "WriteScalarSummary", "WriteHistogramSummary", "WriteImageSummary",
                     "WriteAudioSummary", "WriteGraphSummary", "WriteRawProtoSummary", "ImportEvent",
                     "FlushSummaryWriter", "Save", "SaveV2", "SaveSlices", "Restore", "RestoreV2",
                     "RestoreSlice", "MergeV2Checkpoints", "InitializeTableFromTextFile",
                     "InitializeTableFromTextFileV2"), _FILES),
    **dict.fromkeys(("PyFunc", "PyFuncStateless", "EagerPyFunc"), _PYTHON),
    **dict.fromkeys(("DebugIdentity", "DebugIdentityV2", "DebugIdentityV3", "DebugNanCount",
                     "DebugNumericSummary", "DebugNumericSummaryV2", "RpcClient", "RpcCall", "RpcServer",
                     "RpcServerStart", "RpcServerRegister", "Rpc", "TryRpc"), _DEBUG),
}
# The loader's own checkpoint ops: allowed only where the saver_def names them.
_SAVER_OPS = frozenset({"Save", "SaveV2", "SaveSlices", "Restore", "RestoreV2", "RestoreSlice",
                        "MergeV2Checkpoints"})
_VOCAB_OPS = frozenset({"InitializeTableFromTextFile", "InitializeTableFromTextFileV2"})


@dataclass(frozen=True)
class Finding:
    op: str
    node: str
    function: str | None  # None: the graph itself
    reaches: str
    init: str | None = None  # the init collection (main_op...) that runs it at load, if any

    def words(self) -> str:
        where = f" in function {self.function}" if self.function else ""
        when = f", run by {self.init} at load" if self.init else ""
        return f"{self.op} (node {self.node!r}{where}: {self.reaches}{when})"


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


def _called(node: Any) -> Iterable[str]:
    """Names of the functions a node calls (its op, or function-valued attributes)."""
    for value in node.attr.values():
        if value.func.name:
            yield value.func.name
        for fn in value.list.func:
            yield fn.name


def _closure(roots: Iterable[str], functions: dict[str, Any]) -> set[str]:
    seen: set[str] = set()
    todo = [r for r in roots if r in functions]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in functions[name].node_def:
            todo.extend(n for n in (node.op, *_called(node)) if n in functions and n not in seen)
    return seen


def _vocab_inside(node: Any, nodes: dict[str, Any], args: set[str], folder: Path) -> bool:
    """Whether a text-file table reads its vocabulary from the model: a file name fed in (an
    argument or placeholder, which the SavedModel's assets fill), or a constant inside ``folder``."""
    name = node.input[1] if len(node.input) > 1 else ""
    for _ in range(16):  # through a short chain of Identity nodes
        name = name.split(":")[0].lstrip("^")
        source = nodes.get(name)
        if source is None:
            return name in args
        if source.op == "Identity" and source.input:
            name = source.input[0]
            continue
        if source.op in ("Placeholder", "PlaceholderWithDefault", "ReadVariableOp"):
            return True
        if source.op != "Const" or not source.attr["value"].tensor.string_val:
            return False
        text = source.attr["value"].tensor.string_val[0].decode("utf-8", "replace")
        target = Path(text) if os.path.isabs(text) else folder / text
        try:
            real, root = target.resolve(), folder.resolve()
        except OSError:
            return False
        return real.is_file() and root in real.parents
    return False


def _scan_nodes(nodes: Iterable[Any], function: str | None, args: set[str], folder: Path,
                saver_scope: str | None, saver_nodes: set[str]) -> list[Finding]:
    nodes = list(nodes)
    by_name = {n.name: n for n in nodes}
    found = []
    for node in nodes:
        reaches = REACHING_OPS.get(node.op)
        if reaches is None and node.op in ("Print", "PrintV2"):
            stream = node.attr["output_stream"].s.decode("utf-8", "replace") if "output_stream" in node.attr else ""
            reaches = _FILES if stream.startswith("file://") else None
        if reaches is None:
            continue
        if node.op in _SAVER_OPS and function is None and (
                node.name in saver_nodes or (saver_scope and node.name.startswith(saver_scope))):
            continue
        if node.op in _VOCAB_OPS and _vocab_inside(node, by_name, args, folder):
            continue
        found.append(Finding(node.op, node.name, function, reaches))
    return found


def scan_meta_graph(meta: Any, folder: Path) -> list[Finding]:
    """Every op of a MetaGraphDef (graph and library) that reaches outside the model."""
    saver = meta.saver_def if meta.HasField("saver_def") else None
    saver_nodes = {t.split(":")[0].lstrip("^") for t in (saver.save_tensor_name, saver.restore_op_name,
                                                         saver.filename_tensor_name)} - {""} if saver else set()
    scope = None
    if saver is not None and "/" in saver.restore_op_name:
        scope = saver.restore_op_name.rsplit("/", 1)[0] + "/"
    found = _scan_graph(meta.graph_def, folder, scope, saver_nodes)
    inputs = {n.name: [i.split(":")[0].lstrip("^") for i in n.input] for n in meta.graph_def.node}
    for key in _INIT_COLLECTIONS:  # name the TF1 init op that runs a node inside load_model
        if key in meta.collection_def:
            ran = _ancestors(list(meta.collection_def[key].node_list.value), inputs)
            found = [Finding(f.op, f.node, f.function, f.reaches, f.init or key) if f.function is None
                     and f.node in ran else f for f in found]
    return found


# Collections of ops a TF1 SavedModel loader runs inside load_model.
_INIT_COLLECTIONS = ("saved_model_main_op", "legacy_init_op", "table_initializer")


def _ancestors(roots: list[str], inputs: dict[str, list[str]]) -> set[str]:
    seen: set[str] = set()
    todo = [r.split(":")[0].lstrip("^") for r in roots]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(inputs.get(name, ()))
    return seen


def _scan_graph(graph_def: Any, folder: Path, saver_scope: str | None, saver_nodes: set[str]) -> list[Finding]:
    functions = {f.signature.name: f for f in graph_def.library.function}
    by_name = {n.name: n for n in graph_def.node}
    saver_roots = [fn for n in saver_nodes if n in by_name for fn in (by_name[n].op, *_called(by_name[n]))]
    allowed = _closure(saver_roots, functions)  # by the saver_def's nodes, never by a function's name
    found = _scan_nodes(graph_def.node, None, set(), folder, saver_scope, saver_nodes)
    for name, fn in functions.items():
        args = {a.name for a in fn.signature.input_arg}
        for finding in _scan_nodes(fn.node_def, name, args, folder, None, set()):
            if finding.op in _SAVER_OPS and name in allowed:
                continue
            found.append(finding)
    return found


def scan_file(path: Path, format: str, proto: Any = None) -> list[Finding]:
    """Read a SavedModel directory, a ``.meta`` or a frozen ``.pb`` (or take its parsed
    ``proto``) and list what reaches out."""
    path = Path(path)
    if format == "saved_model":
        proto_path = path / "saved_model.pb" if (path / "saved_model.pb").is_file() else path / "saved_model.pbtxt"
        saved = read_protobuf(proto_path, format, "saved_model")
        return [f for meta in saved.meta_graphs for f in scan_meta_graph(meta, path)]
    if format == "checkpoint":
        return scan_meta_graph(read_protobuf(path, format, "meta_graph"), path.parent)
    graph_def = proto if proto is not None else read_protobuf(path, format, "graph_def")
    return _scan_graph(graph_def, path.parent, None, set())


def refuse_untrusted(path: Path, format: str, trusted: bool | None, *, action: str = "load",
                     proto: Any = None) -> None:
    """Raise ``ModelLoadError`` naming every reaching op, unless the model is trusted. The
    protobuf is parsed either way: a truncated file is named as such before TensorFlow reads it."""
    findings = scan_file(path, format, proto)
    if not findings or is_trusted(trusted):
        return
    shown = "; ".join(f.words() for f in findings[:8]) + (f"; and {len(findings) - 8} more" if len(findings) > 8 else "")
    kinds = sorted({f.reaches for f in findings})
    raise ModelLoadError(path, format, f"the graph holds ops that reach {' and '.join(kinds)} when it is loaded or "
                         f"run: {shown}. Refused before TensorFlow loads it (docs/security.md)",
                         "only if you trust this model (you or your team wrote it): run pytest with "
                         "--modelparity-trust-models (ini: modelparity_trust_models = true), or give trusted=True "
                         "in load_model(...), export_model(...) or modelparity_load_options", action=action)


def missing_python(exc: BaseException, model: Any) -> ModelLoadError | None:
    """A trusted graph's ``tf.py_function`` whose Python body is not in this process (it is never
    saved with the model) as one clear error instead of TensorFlow's traceback; else None."""
    text = str(exc)
    if "PyFunc" not in text or "callback" not in text.lower():
        return None
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
