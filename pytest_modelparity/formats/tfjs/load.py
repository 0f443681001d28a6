"""TensorFlow.js graph models: load one and run it in Node.js (``export.py`` writes one,
``browser.py`` runs one in a headless Chromium page).

Why Node.js and not a Python re-implementation: seed 003 is a SavedModel and its TFJS
conversion disagreeing; only tfjs's own kernels (pure-JS CPU backend, or the wasm backend)
show what the browser will compute. ``load`` starts one ``node runner.js`` process per model
(``pytest_modelparity.runtime.tfjs_process``) and keeps it for every predict.

Keras 3 *layers* models (``format: layers-model``) do not load in tfjs-layers 4.22; this
format loads graph models only and says so.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...errors import ModelLoadError, RuntimeMissing
from .._files import check_not_special, read_regular
from ..base import LoadedModel, TensorSpec
from . import rewrite as tfjs_rewrite
from .errors import run_error
from .errors import runner_message as _runner_message

NAME = "tfjs"
BACKENDS = ("auto", "cpu", "wasm")

# model.json dtypes -> what tfjs computes in (it has no 64-bit or half types).
_DTYPES = {
    "DT_FLOAT": "float32", "DT_HALF": "float32", "DT_DOUBLE": "float32", "DT_BFLOAT16": "float32",
    "DT_INT32": "int32", "DT_INT64": "int32", "DT_INT16": "int32", "DT_INT8": "int32",
    "DT_UINT8": "int32", "DT_UINT16": "int32", "DT_BOOL": "bool",
}
# bytes per element of a weight as stored in the shards (quantization dtype wins).
_WEIGHT_ITEMSIZE = {"float32": 4, "int32": 4, "bool": 1, "uint8": 1, "uint16": 2, "float16": 2,
                    "int8": 1, "int16": 2, "complex64": 8}


# -- detection -------------------------------------------------------------------------
def detect(path: Path) -> bool:
    """A ``model.json`` file, a directory holding one, or a ``.json`` file with a ``modelTopology``."""
    if path.is_dir():  # a model.json that is no regular file is detected, then refused by name
        return (path / "model.json").exists() and not (path / "model.json").is_dir()
    if path.name == "model.json":
        return True
    if path.suffix.lower() == ".json" and path.is_file():
        try:
            with open(path, "rb") as fh:
                head = fh.read(65536)
        except OSError:
            return False
        return b'"modelTopology"' in head or b'"weightsManifest"' in head
    return False


# -- reading model.json safely ----------------------------------------------------------
def model_json_path(source: Any) -> Path:
    path = Path(source)
    if path.is_dir():
        path = path / "model.json"
    check_not_special(path, NAME)
    if not path.is_file():
        raise ModelLoadError(path, NAME, "no such file (a tfjs graph model is a model.json beside its "
                             "group*-shard*.bin weight files)", "check the path, or export with "
                             "export_model(model, 'tfjs', directory)")
    return path


def read_model_json(path: Path) -> dict[str, Any]:
    """Parse and check ``model.json``: a graph model whose weight files are complete and inside its directory."""
    try:
        spec = json.loads(read_regular(path, NAME).decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(path, NAME, f"model.json cannot be read as JSON ({type(exc).__name__}: {exc})",
                             "re-export or re-copy the model") from exc
    except RecursionError:
        raise ModelLoadError(path, NAME, "model.json is nested deeper than Python's JSON parser goes (a converter "
                             "writes a few levels)", "re-export or re-copy the model") from None
    if not isinstance(spec, dict) or "modelTopology" not in spec:
        raise ModelLoadError(path, NAME, "this JSON has no 'modelTopology': not a TensorFlow.js model",
                             "pass the model.json written by the tensorflowjs converter")
    topology = spec["modelTopology"]
    if spec.get("format") == "layers-model" or (isinstance(topology, dict) and "node" not in topology):
        raise ModelLoadError(path, NAME, "this is a tfjs *layers* model; only graph models are supported "
                             "(tfjs-layers 4.22 cannot load Keras 3 layer models)",
                             "convert a SavedModel to a graph model: export_model(model, 'tfjs', dir) or "
                             "tensorflowjs_converter --input_format=tf_saved_model")
    check_weight_files(path, spec.get("weightsManifest") or [])
    return spec


def _weight_nbytes(entry: dict[str, Any]) -> int | None:
    """Bytes one weight takes in the shards, or None when it cannot be known (strings)."""
    dtype = (entry.get("quantization") or {}).get("dtype") or entry.get("dtype", "float32")
    if dtype not in _WEIGHT_ITEMSIZE:
        return None
    return math.prod(int(d) for d in entry.get("shape", [])) * _WEIGHT_ITEMSIZE[dtype]


def check_weight_files(path: Path, manifest: list[dict[str, Any]]) -> list[tuple[list[Path], list[dict[str, Any]]]]:
    """Refuse weight paths outside the model's directory, missing shards and truncated ones.

    A weight path is data from the model file: ``../secret`` or ``/etc/passwd`` must never be
    read. The shards of each group must hold exactly the bytes the manifest's weights need.
    """
    root = path.parent.resolve()
    groups = []
    for index, group in enumerate(manifest):
        files = []
        for rel in group.get("paths", []):
            target = (root / rel).resolve()
            if os.path.isabs(rel) or not target.is_relative_to(root):
                raise ModelLoadError(path, NAME, f"weightsManifest path {rel!r} points outside the model's "
                                     f"directory {str(root)!r}; refusing to read it",
                                     "weight shards must sit beside model.json (re-export the model)")
            check_not_special(target, NAME)
            if not target.is_file():
                raise ModelLoadError(target, NAME, f"weight file {rel!r} named by {path.name} is missing",
                                     "copy every group*-shard*.bin file beside model.json")
            files.append(target)
        weights = group.get("weights", [])
        sizes = [_weight_nbytes(w) for w in weights]
        known = [n for n in sizes if n is not None]
        if files and len(known) == len(sizes):
            need = sum(known)
            have = sum(f.stat().st_size for f in files)
            if have != need:
                short = "truncated" if have < need else "longer than expected"
                raise ModelLoadError(
                    files[-1], NAME,
                    f"weight file(s) {', '.join(f.name for f in files)} hold {have} bytes but {path.name}'s "
                    f"weightsManifest group {index} needs {need} bytes for {len(weights)} weights: the "
                    f"weights are {short}",
                    "re-copy the weight files (an interrupted download or copy truncates them) or re-export")
        groups.append((files, weights))
    return groups


STRING_INPUT_FIX = ("test the string model in formats keras and saved_model (they carry strings and lookup tables; "
                    "graphdef only when the model has no lookup table, e.g. keras.layers.Hashing); for tfjs, move the "
                    "text preprocessing (StringLookup/TextVectorization) out of the model and export the "
                    "model that takes its integer token ids")


def check_input_dtypes(path: Path, spec: dict[str, Any]) -> None:
    """Refuse string inputs up front: the runner's protocol carries float32, int32 and bool only."""
    for key, value in ((spec.get("signature") or {}).get("inputs") or {}).items():
        if isinstance(value, dict) and value.get("dtype") == "DT_STRING":
            raise ModelLoadError(path, NAME, f"input {key!r} is a string tensor; the tfjs format here runs "
                                 f"float32, int32 and bool inputs only", STRING_INPUT_FIX, not_applicable=True)


def _tfjs_dtype(tf_dtype: str | None) -> str:
    return _DTYPES.get(tf_dtype or "DT_FLOAT", "float32")


def signature_specs(entries: dict[str, Any]) -> list[TensorSpec]:
    specs = []
    for key, value in entries.items():
        dims = (value.get("tensorShape") or {}).get("dim", [])
        shape = tuple(None if int(d.get("size", -1)) < 0 else int(d["size"]) for d in dims)
        specs.append(TensorSpec(key, shape, _tfjs_dtype(value.get("dtype"))))
    return specs


# Where a tfjs export of the plugin records which output holds which source output, in
# model.json's userDefinedMetadata (export.write_output_record): {"outputs": {source name: tfjs name}}.
RECORD_KEY = "modelparity"


def output_record(spec: dict[str, Any], names: list[str]) -> tuple[dict[str, str], str]:
    """``{source output name: tfjs output name}`` as ``model.json`` says it, and where it says it:
    the plugin's own record (``RECORD_KEY``), else tensorflowjs' ``structuredOutputKeys`` (written
    with ``--use_structured_outputs_names``: the k-th key names the k-th output). ``names``: the
    outputs as the runner lists them; a record naming anything else is not used ({}, "")."""
    meta = spec.get("userDefinedMetadata")
    if not isinstance(meta, dict):
        return {}, ""
    own = meta.get(RECORD_KEY)
    kept = own.get("outputs") if isinstance(own, dict) else None
    if isinstance(kept, dict) and kept and all(isinstance(v, str) and v in names for v in kept.values()) \
            and len(set(kept.values())) == len(kept):
        return {str(k): v for k, v in kept.items()}, f"model.json's userDefinedMetadata.{RECORD_KEY}, written at export"
    keys = meta.get("structuredOutputKeys")
    if isinstance(keys, list) and len(keys) == len(names) and len(set(map(str, keys))) == len(keys):
        return dict(zip(map(str, keys), names)), "model.json's structuredOutputKeys (k-th key, k-th output)"
    return {}, ""


def _meta_specs(entries: list[dict[str, Any]]) -> list[TensorSpec]:
    specs = []
    for e in entries:
        shape = e.get("shape")
        specs.append(TensorSpec(e["name"], tuple(shape) if shape is not None else (None,), e.get("dtype") or "float32"))
    return specs



# -- layer table: which graph nodes to fetch ------------------------------------------------
MAX_LAYER_NODES = 512  # bounds one fetch (each is a tensor read back from tfjs)
_NOT_LAYER_OPS = frozenset({"Const", "Placeholder", "Identity", "IdentityN", "NoOp", "Shape", "ShapeN", "Size",
                            "Rank", "StopGradient", "Enter", "Switch", "NextIteration", "LoopCond",
                            "ReadVariableOp", "VarHandleOp"})
# Ops whose output is bool whatever their ``T`` (the input type) says.
_BOOL_OPS = frozenset({"Greater", "GreaterEqual", "Less", "LessEqual", "Equal", "NotEqual", "LogicalAnd",
                       "LogicalOr", "LogicalNot", "IsNan", "IsInf", "IsFinite", "ApproximateEqual"})


def _node_of(ref: str) -> str:
    """``name:1`` or ``^name`` (a control input) -> ``name``."""
    return ref.lstrip("^").split(":")[0]


def _output_dtype(node: dict[str, Any]) -> str:
    if node.get("op") in _BOOL_OPS:
        return "bool"
    attr = node.get("attr") or {}
    for key in ("out_type", "output_type", "DstT", "dtype", "T"):
        value = attr.get(key)
        if isinstance(value, dict) and "type" in value:
            return _tfjs_dtype(value["type"])
    return "float32"


def _inside_control_flow(nodes: list[dict[str, Any]]) -> set[str]:
    """Nodes inside a loop body or a conditional branch, which tfjs cannot fetch by name (a
    branch not taken has no value; a loop's nodes have one per iteration): forward from each
    ``Enter`` up to its ``Exit``, from each ``Switch`` up to its ``Merge``. The ``Merge`` and
    ``Exit`` themselves (the branch's or loop's result) stay fetchable."""
    consumers: dict[str, list[dict[str, Any]]] = {}
    for n in nodes:
        for ref in n.get("input", []):
            consumers.setdefault(_node_of(ref), []).append(n)
    inside: set[str] = set()
    for start in nodes:
        op = start.get("op")
        if op not in ("Enter", "Switch"):
            continue
        stops = ("Exit",) if op == "Enter" else ("Merge", "Exit")
        seen: set[str] = set()
        todo = [start["name"]]
        while todo:
            name = todo.pop()
            for c in consumers.get(name, []):
                if c["name"] in seen or c.get("op") in stops:
                    continue
                seen.add(c["name"])
                todo.append(c["name"])
        inside |= seen
    return inside


def _scope(name: str) -> str:
    return name.rpartition("/")[0]


def select_layer_nodes(nodes: list[dict[str, Any]], inputs: set[str],
                       limit: int | None = None) -> list[tuple[str, str]]:
    """``(node name, op)`` of the graph nodes a layer table fetches, in topological order.

    The converter keeps Keras' name scopes (``StatefulPartitionedCall/model/conv_1/Relu``), so
    a layer's output is the last float op of its scope; ops whose output leaves their scope
    are kept too (a graph without layer scopes, e.g. a ``tf.Module``, has one scope for
    everything). Skipped: constants, weights, identities, shape arithmetic, non-float outputs,
    ops no input flows into, and ops inside loop bodies or conditional branches (tfjs cannot
    fetch them; the loop's or branch's result is kept). At most ``limit``
    (:data:`MAX_LAYER_NODES`) are kept, evenly spread, the last always kept.
    """
    limit = MAX_LAYER_NODES if limit is None else limit
    ordered = _topological(nodes)
    inside = _inside_control_flow(nodes)
    consumers: dict[str, list[str]] = {}
    for n in nodes:
        for ref in n.get("input", []):
            if not ref.startswith("^"):
                consumers.setdefault(_node_of(ref), []).append(n["name"])
    fed = set(inputs) | {n["name"] for n in nodes if n.get("op") == "Placeholder"}
    todo = list(fed)
    while todo:  # forward from the inputs (order-free: loops make any order imperfect)
        for c in consumers.get(todo.pop(), []):
            if c not in fed:
                fed.add(c)
                todo.append(c)
    last_of_scope: dict[str, int] = {}
    leaving: set[int] = set()
    for pos, node in enumerate(ordered):
        name, op = node["name"], node.get("op", "?")
        if (name not in fed or op in _NOT_LAYER_OPS or name in inside or op == "Placeholder"
                or _output_dtype(node) != "float32"):
            continue
        last_of_scope[_scope(name)] = pos
        if any(_scope(c) != _scope(name) for c in consumers.get(name, [])):
            leaving.add(pos)
    picked = sorted(set(last_of_scope.values()) | leaving)
    if len(picked) > limit > 0:
        step = len(picked) / limit
        picked = sorted({picked[min(len(picked) - 1, round((k + 1) * step) - 1)] for k in range(limit)})
    return [(ordered[i]["name"], ordered[i].get("op", "?")) for i in picked]


def _topological(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The nodes in an order where every node follows its inputs, model.json's order kept
    where it already is one (the converter usually writes it so; it is not promised)."""
    by_name = {n["name"]: n for n in nodes}
    done: set[str] = set()
    visiting: set[str] = set()  # on the current path: a loop (NextIteration) is cut there
    out: list[dict[str, Any]] = []
    for root in nodes:
        stack: list[tuple[dict[str, Any], bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            name = node["name"]
            if expanded:
                done.add(name)
                out.append(node)
                continue
            if name in done or name in visiting:
                continue
            visiting.add(name)
            stack.append((node, True))
            for ref in reversed(node.get("input", [])):
                dep = by_name.get(_node_of(ref))
                if dep is not None and dep["name"] not in done and dep is not node:
                    stack.append((dep, False))
    return out


# -- the loaded model ------------------------------------------------------------------
class TFJSModel(LoadedModel):
    """A tfjs graph model served by its own Node.js process.

    ``last_compute_ms`` is tfjs's own time for the last predict, measured inside Node
    (tensor creation, execute, read back); ``process`` is the :class:`NodeProcess`.
    """

    format = NAME

    def __init__(self, path: Path, spec: dict[str, Any], process: Any, *, backend: str, device: str,
                 requested: str | None = None, start: Any = None, fallback_reason: str | None = None) -> None:
        self.backend = backend  # the backend that runs now ("cpu" or "wasm")
        self.requested_backend = requested or backend  # what the caller asked for ("auto" included)
        # Why "auto" runs on cpu rather than wasm (None while wasm serves, or when asked for).
        self.fallback_reason = fallback_reason
        self.process = process
        self._start = start  # backend -> NodeProcess: falls back from wasm to cpu, replaces a dead process
        self._closed = False
        self.restarts = 0  # Node processes started again after one died
        # Why each restart happened (the dead process's exit status and stderr tail), in order.
        self.restart_reasons: list[str] = []
        self._spec = spec
        signature = spec.get("signature") or {}
        meta = process.meta
        inputs = signature_specs(signature["inputs"]) if signature.get("inputs") else _meta_specs(meta["inputs"])
        outputs = signature_specs(signature["outputs"]) if signature.get("outputs") else _meta_specs(meta["outputs"])
        # The runner addresses inputs/outputs by the names tfjs gives them (signature keys).
        by_name = {s.name for s in inputs}
        if by_name != {e["name"] for e in meta["inputs"]}:
            inputs = _meta_specs(meta["inputs"])
        if [s.name for s in outputs] != [e["name"] for e in meta["outputs"]]:
            known = {s.name: s for s in outputs}
            outputs = [known.get(e["name"]) or _meta_specs([e])[0] for e in meta["outputs"]]
        super().__init__(device=device, inputs=inputs, outputs=outputs, source=path)
        # which output holds which source output, as the file says (formats/binding.py's "export record")
        record, self.export_record_how = output_record(spec, [s.name for s in outputs])
        self.export_record = {"outputs": record} if record else None

    @functools.cached_property
    def converter_defects(self) -> list[tuple[str, list[str], str, str]]:
        """Ops of this graph tensorflowjs 4.22 is known to run wrong (a model.json converted
        elsewhere), for the diagnosis of a failed comparison: read when first asked, since a
        Cumsum's axis is read from the weight shards."""
        return tfjs_rewrite.known_defects(self._spec, self.weights)

    @property
    def format_variant(self) -> str:
        """``tfjs:wasm`` or ``tfjs:cpu``: the backend that computed, shown in reports and JSON."""
        return f"{NAME}:{self.backend}"

    @property
    def last_compute_ms(self) -> float | None:
        return self.process.last_compute_ms

    @property
    def tfjs_version(self) -> str:
        return self.process.meta.get("tfjs_version", "?")

    def prepare_batch(self, batch: Any) -> dict[str, np.ndarray]:
        """As the base class, but refuse integers that int32 cannot hold.

        tfjs has no int64: an ``int64`` input runs as ``int32``, and numpy's cast would wrap
        2**31 + 5 to a negative number silently, giving an answer TensorFlow never gives.
        """
        if any(s.dtype == np.int32 for s in self.inputs):
            info = np.iinfo(np.int32)
            for name, value in self._named_values(batch):
                arr = value if isinstance(value, np.ndarray) else np.asarray(value)
                if arr.dtype.kind in "iu" and arr.dtype.itemsize >= 4 and arr.size:
                    low, high = int(arr.min()), int(arr.max())
                    if low < info.min or high > info.max:
                        self._mismatch(
                            f"input {name!r} holds integers outside int32's range (min {low}, max {high}); tfjs "
                            f"has no int64 and computes this input in int32, where they would wrap around", batch)
        return super().prepare_batch(batch)

    def _named_values(self, batch: Any) -> list[tuple[str, Any]]:
        names = [s.name for s in self.inputs]
        if isinstance(batch, Mapping):
            return list(batch.items())
        if isinstance(batch, (list, tuple)) and batch and all(hasattr(v, "dtype") for v in batch):
            return list(zip(names, batch))
        return [(names[0] if len(names) == 1 else "?", batch)]

    def _serving(self) -> Any:
        """The live Node process. One that died during a call (killed, crashed, timed out) failed
        that call with ``NodeProcessDied`` (what happened, its stderr); the call after that gets a
        fresh process that loads the model again. One that died while idle (between tests) is
        replaced before this call, which does not fail: ``restart_reasons`` says what happened."""
        if self._closed or self._start is None:
            return self.process
        idle_death = None if self.process.reported_dead else self.process.reap_if_died_idle()
        if self.process.reported_dead:
            death = getattr(self.process, "death", None)
            self.process = self._start(self.backend)
            self.restarts += 1
            self.restart_reasons.append(idle_death or death or "the previous call failed with NodeProcessDied")
        return self.process

    def _served(self, call: Any) -> Any:
        """``call(process)`` on the live process; a death before any byte of the answer (not the
        call's: ``tfjs_process.retry_unanswered``) is retried once on a new process."""
        from ...runtime.tfjs_process import retry_unanswered

        if self._closed or self._start is None:
            return call(self._serving())
        return retry_unanswered(lambda: call(self._serving()), f"tfjs model {str(self.source)!r} ({self.backend} backend)")

    def _predict(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from ...runtime.tfjs_process import RunnerError

        try:
            result = self._served(lambda process: process.predict(feeds))
        except RunnerError as exc:
            if not self._can_fall_back():
                raise self._run_failure(feeds, str(exc)) from exc
            self._fall_back(str(exc))
            try:
                result = self.process.predict(feeds)
            except RunnerError as exc2:
                raise self._run_failure(feeds, str(exc2), wasm_error=str(exc)) from exc2
        return {s.name: result[s.name] for s in self.outputs}

    def _run_failure(self, feeds: dict[str, np.ndarray], message: str, wasm_error: str | None = None) -> ModelLoadError:
        """``run_error``, naming the node (and layer) a bare JavaScript error came from (tfjs_errors)."""
        from ...runtime.tfjs_process import RunnerError
        from . import errors as tfjs_errors

        def fetch(names: list[str]) -> None:
            try:
                self.process.fetch(feeds, names, max_bytes=0)
            except RunnerError as exc:
                raise tfjs_errors.NotComputed(str(exc)) from exc

        error = run_error(Path(str(self.source)), self.backend, message, wasm_error=wasm_error)
        if tfjs_errors.is_raw_js_error(_runner_message(message)):
            with contextlib.suppress(Exception):  # a dead process: the error as it was
                found = tfjs_errors.failing_node(self._spec, fetch)
                if found is not None:
                    problem, fix = tfjs_errors.located_problem(*found, _runner_message(message), self.backend)
                    error = ModelLoadError(Path(str(self.source)), NAME, problem, fix, action="run")
        return error

    def _can_fall_back(self) -> bool:
        return self.requested_backend == "auto" and self.backend == "wasm" and self._start is not None

    def _fall_back(self, reason: str) -> None:
        """backend="auto": wasm failed on this model, so serve it from the cpu backend from now on."""
        self.process.close()
        self.process = self._start("cpu")
        self.backend = "cpu"
        self.fallback_reason = f"wasm backend failed: {_runner_message(reason)}"

    def op_types(self) -> list[tuple[str, str]]:
        """``(node name, op)`` of the graph and of its function library, from model.json."""
        topology = self._spec.get("modelTopology") or {}
        ops = [(n.get("name", "?"), n.get("op", "?")) for n in topology.get("node", [])]
        for fn in (topology.get("library") or {}).get("function", []) or []:
            fname = (fn.get("signature") or {}).get("name", "function")
            ops.extend((f"{fname}/{n.get('name', '?')}", n.get("op", "?")) for n in fn.get("nodeDef", []))
        return ops

    def weights(self) -> dict[str, np.ndarray] | None:
        """The weights decoded from the shards (dequantized), by manifest name."""
        out: dict[str, np.ndarray] = {}
        assert self.source is not None
        for files, entries in check_weight_files(Path(self.source), self._spec.get("weightsManifest") or []):
            data = b"".join(f.read_bytes() for f in files)
            offset = 0
            for entry in entries:
                nbytes = _weight_nbytes(entry)
                if nbytes is None:
                    return None  # string weights: offsets after them are unknowable here
                shape = tuple(int(d) for d in entry.get("shape", []))
                quant = entry.get("quantization") or {}
                raw = data[offset:offset + nbytes]
                offset += nbytes
                qdtype = quant.get("dtype")
                if qdtype in ("uint8", "uint16"):
                    q = np.frombuffer(raw, dtype=np.dtype(qdtype).newbyteorder("<")).astype(np.float32)
                    value = q * np.float32(quant.get("scale", 1.0)) + np.float32(quant.get("min", 0.0))
                elif qdtype == "float16":
                    value = np.frombuffer(raw, dtype="<f2").astype(np.float32)
                else:
                    dtype = {"float32": "<f4", "int32": "<i4", "bool": "u1"}.get(entry.get("dtype", "float32"))
                    if dtype is None:
                        return None
                    value = np.frombuffer(raw, dtype=dtype).copy()
                out[entry["name"]] = value.reshape(shape)
        return out

    def layer_nodes(self) -> list[tuple[str, str]]:
        """``(node name, op)`` worth fetching for a layer table, in topological order.

        See :func:`select_layer_nodes`.
        """
        topology = self._spec.get("modelTopology") or {}
        nodes = [n for n in topology.get("node", []) if isinstance(n, dict) and "name" in n]
        return select_layer_nodes(nodes, {s.name.split(":")[0] for s in self.inputs})

    def intermediates(self, batch: Any, *, max_bytes: int = 256 << 20) -> list[tuple[str, str, np.ndarray]]:
        """``(node name, op, value)`` of :meth:`layer_nodes` on ``batch``, run by tfjs in Node
        (``model.execute(inputs, nodes)``; executeAsync for control flow), in graph order.

        tfjs keeps TensorFlow's layout (NHWC), so values have the Keras layers' shapes.
        Tensors past ``max_bytes`` are left out (the table then ends early).
        """
        nodes = self.layer_nodes()
        if not nodes:
            return []
        feeds = self.prepare_batch(batch)
        values = self._served(lambda process: process.fetch(feeds, [n for n, _ in nodes], max_bytes=max_bytes))
        return [(name, op, values[name]) for name, op in nodes if name in values]

    def close(self) -> None:
        self._closed = True
        self.process.close()


def _check_device(device: str) -> str:
    from ...runtime.devices import require_cpu_only

    require_cpu_only(device, NAME, "it runs in Node.js on the CPU (backend 'cpu' or 'wasm'; tfjs-node-gpu "
                     "is not used)", "Use device='cpu' and backend='wasm' for the fast path.")
    return "cpu"


# Integer arithmetic the wasm backend computes through float32 (exact only below 2**24): a
# floormod/floordiv/mul of int32 values near 2**31 came back off by up to 7 where cpu was exact.
_INT_ARITHMETIC = frozenset({"FloorDiv", "FloorMod", "Mul", "AddV2", "Add", "Sub", "Div", "RealDiv",
                             "TruncateDiv", "TruncateMod", "Pow", "Square", "Prod", "Sum", "Cumsum", "MatMul"})


def wasm_unsafe_reason(spec: dict[str, Any]) -> str | None:
    """Why backend="auto" should not pick wasm for this graph, or None: integer arithmetic on
    values that flow from an integer input (shape arithmetic, e.g. ``batch * 4``, is harmless)."""
    nodes = [n for n in (spec.get("modelTopology") or {}).get("node", []) if isinstance(n, dict) and "name" in n]
    consumers: dict[str, list[dict[str, Any]]] = {}
    for n in nodes:
        for ref in n.get("input", []):
            if not ref.startswith("^"):
                consumers.setdefault(_node_of(ref), []).append(n)
    todo = [n for n in nodes if n.get("op") == "Placeholder"
            and _tfjs_dtype(((n.get("attr") or {}).get("dtype") or {}).get("type")) == "int32"]
    seen = {n["name"] for n in todo}
    while todo:
        node = todo.pop()
        t = ((node.get("attr") or {}).get("T") or {}).get("type")
        if node.get("op") in _INT_ARITHMETIC and t in ("DT_INT32", "DT_INT64"):
            return (f"integer arithmetic ({node['op']} on an integer input): the wasm backend computes it in "
                    f"float32, exact only below 2**24")
        for c in consumers.get(node["name"], []):
            if c["name"] not in seen and c.get("op") not in ("Shape", "ShapeN", "Size", "Rank"):
                seen.add(c["name"])
                todo.append(c)
    return None


class NodeRuntimeFailed(ModelLoadError):
    """Node.js itself failed the load (no handshake, or out of time): another backend cannot help."""


# node executable -> why it failed its handshake: later loads in this process fail at once.
_BROKEN_NODES: dict[str, str] = {}


def load(source: Any, *, device: str = "cpu", backend: str = "auto", timeout_s: float | None = 600.0,
         **options: Any) -> TFJSModel:
    """Load a graph model (``model.json`` or its directory) into a new Node.js process.

    ``backend``: ``"auto"`` (default: the wasm backend, falling back to the pure-JS cpu backend
    when wasm cannot load or run the model; ``model.backend`` and ``format_variant`` say which
    runs, ``fallback_reason`` why), ``"cpu"`` (pure-JS kernels of @tensorflow/tfjs-backend-cpu) or
    ``"wasm"`` (@tensorflow/tfjs-backend-wasm, about 10x faster on convolutions). npm packages
    are installed on first use (see ``pytest_modelparity.runtime.tfjs_runner``). ``timeout_s``: how long
    one load or predict may take before the Node process is killed and the call fails (None:
    wait forever). A model tfjs cannot run raises ``ModelLoadError`` naming the op, the backend
    and a workaround.
    """
    if options:
        raise TypeError(f"unexpected option(s) for format 'tfjs': {', '.join(sorted(options))}; "
                        f"it takes backend='auto'|'cpu'|'wasm' and timeout_s")
    device = _check_device(device)
    if backend not in BACKENDS:
        raise ValueError(f"unknown tfjs backend {backend!r}; use one of {', '.join(BACKENDS)}")
    from ...runtime import progress, tfjs_runner
    from ...runtime.tfjs_process import NodeHandshakeFailed, NodeProcess, NodeProcessDied, RunnerError, retry_unanswered

    path = model_json_path(source)
    spec = read_model_json(path)
    check_input_dtypes(path, spec)
    node = tfjs_runner.node_executable()
    node_modules = tfjs_runner.ensure_node_modules()

    def start(which: str) -> Any:
        description = f"tfjs model {str(path)!r} ({which} backend)"
        broken = _BROKEN_NODES.get(node)
        if broken is not None:  # a hung node costs its handshake limit once per process, not per model
            raise NodeRuntimeFailed(path, NAME, f"{broken} (remembered from an earlier load in this process)",
                                    "put a working Node.js >= 18 first on PATH")
        try:  # a death before the load's answer (not the load's: a kill, the OOM killer) is retried once
            with progress.step(f"starting Node.js for tfjs ({which} backend)"):
                return retry_unanswered(lambda: NodeProcess(
                    path, backend=which, node=node, runner_js=tfjs_runner.RUNNER_JS, node_modules=node_modules,
                    description=description, timeout_s=timeout_s), description)
        except RunnerError as exc:
            if "cannot load @tensorflow/tfjs" in str(exc):
                raise RuntimeMissing(f"@tensorflow/tfjs in {node_modules} ({exc})",
                                     f"remove that directory and run `{tfjs_runner.INSTALL_COMMAND}`") from exc
            raise run_error(path, which, str(exc), action="load") from exc
        except NodeHandshakeFailed as exc:
            text, _, fix = str(exc).rpartition("\n  fix: ")
            _BROKEN_NODES[node] = text.splitlines()[-1].strip()
            raise NodeRuntimeFailed(path, NAME, text, fix) from exc
        except NodeProcessDied as exc:
            if exc.timed_out:  # a slow load would be slower still on cpu: no fallback
                raise NodeRuntimeFailed(path, NAME, str(exc)) from exc
            raise ModelLoadError(path, NAME, str(exc)) from exc

    reason = wasm_unsafe_reason(spec) if backend == "auto" else None
    first = backend if backend != "auto" else ("cpu" if reason else "wasm")
    try:
        process = start(first)
    except NodeRuntimeFailed:
        raise  # Node itself is hung or the load ran out of time: the cpu backend would wait as long again
    except ModelLoadError as exc:
        if backend != "auto":
            raise
        reason = f"wasm backend failed to load it: {exc.problem}"
        first, process = "cpu", start("cpu")
    return TFJSModel(path, spec, process, backend=first, device=device, requested=backend, start=start,
                     fallback_reason=reason)


