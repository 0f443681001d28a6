"""What a TensorFlow graph's structure says, for the trust scan (``trust.py``): which nodes run
when, and which value a string tensor can hold. Read from the protobuf, no TensorFlow.

Why structure and not names: every name in a model file (a node's, a function's, the
``saver_def``'s) is the author's to choose. A ``SaveV2`` named ``save/evil_save`` is the
saver's only by where it sits: in the subgraph ``saver_def.restore_op_name`` runs, reading
the saver's own file name. And a file name is a model's own only by its value: a constant,
a default's constant or a variable's only initial value, followed to its end.

- ``GraphView.roles``: for the ``saver_def``'s two subgraphs, the nodes (and the functions
  they call) that only the saver's save or only its restore can run. A node the loader runs
  otherwise (an init collection such as ``main_op``, a signature) or that anything outside
  the subgraph consumes has no role.
- ``GraphView.values``: the strings a tensor can hold when it runs, or None when that cannot
  be known from the file (a fed placeholder, a computed string, a variable restored from the
  checkpoint, a function argument some caller passes unseen).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

# Collections of ops a TF1 SavedModel loader runs inside load_model (with the assets fed).
INIT_COLLECTIONS = ("saved_model_main_op", "legacy_init_op", "table_initializer")

SAVE_OPS = frozenset({"Save", "SaveV2", "SaveSlices", "MergeV2Checkpoints"})
RESTORE_OPS = frozenset({"Restore", "RestoreV2", "RestoreSlice"})

# Ops that pass their input through unchanged (output i is input i).
_THROUGH = frozenset({"Identity", "IdentityN", "Snapshot", "StopGradient", "PreventGradient"})
# Ops whose data inputs are a called function's arguments in order, after ``skip`` inputs.
_CALL_SKIP = {"PartitionedCall": 0, "StatefulPartitionedCall": 0, "If": 1, "StatelessIf": 1, "Case": 1,
              "StatelessCase": 1}
# What may touch a variable that holds a file name, without changing it behind the scan's back.
_VARIABLE_READERS = frozenset({"ReadVariableOp", "VarIsInitializedOp", "IsVariableInitialized", "Identity",
                               "AssignVariableOp", "Assign", "DestroyResourceOp"})
_VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable"})

Scope = str | None  # a function's name, None: the graph itself


def node_of(ref: str) -> str:
    """``name`` of ``^name``, ``name:1`` or (inside a function) ``name:output:0``."""
    return ref.lstrip("^").split(":")[0]


def output_index(ref: str) -> int:
    parts = ref.split(":")
    try:
        return int(parts[-1]) if len(parts) > 1 else 0
    except ValueError:
        return 0


def data_inputs(node: Any) -> list[str]:
    return [i for i in node.input if not i.startswith("^")]


_FUNC_ATTRS: dict[str, tuple[str, ...] | None] = {}


def _func_attrs(op: str) -> tuple[str, ...] | None:
    """The attributes of a registered op that name functions (None: not registered here, read
    them all). Reading a protobuf map costs: most ops have no such attribute."""
    if op not in _FUNC_ATTRS:
        from tensorflow.python.framework import op_def_registry

        op_def = op_def_registry.get(op)
        _FUNC_ATTRS[op] = None if op_def is None else tuple(
            a.name for a in op_def.attr if a.type in ("func", "list(func)"))
    return _FUNC_ATTRS[op]


def _asset_defs(meta: Any) -> list[Any]:
    """A MetaGraph's ``AssetFileDef``s where the loader reads them: ``asset_file_def``, else
    (a TF1 Builder's) the ``saved_model_assets`` collection."""
    if meta.asset_file_def:
        return list(meta.asset_file_def)
    from tensorflow.core.protobuf import meta_graph_pb2

    found = []
    if "saved_model_assets" in meta.collection_def:
        for packed in meta.collection_def["saved_model_assets"].any_list.value:
            asset = meta_graph_pb2.AssetFileDef()
            if packed.Unpack(asset):
                found.append(asset)
    return found


class GraphView:
    """A GraphDef (with its MetaGraph's saver, signatures, init collections, assets and
    object graph when there is one) indexed for the questions above."""

    def __init__(self, graph_def: Any, meta: Any = None, folder: Path | None = None,
                 asset_root: Path | None = None) -> None:
        self.nodes = {n.name: n for n in graph_def.node}
        self.functions = {f.signature.name: f for f in graph_def.library.function}
        self.fn_nodes = {name: {n.name: n for n in f.node_def} for name, f in self.functions.items()}
        self.inputs = {n.name: [node_of(i) for i in n.input] for n in graph_def.node}
        self.consumers: dict[str, set[str]] = {}
        for name, inputs in self.inputs.items():
            for i in inputs:
                self.consumers.setdefault(i, set()).add(name)
        self.callers: dict[str, list[tuple[Scope, Any]]] = {}
        self.node_calls: dict[str, list[str]] = {}  # graph node -> the functions it calls (read once: protobuf maps are slow)
        self.fn_calls: dict[str, set[str]] = {}  # function -> the functions its nodes call
        for node in graph_def.node:
            called = list(self._calls(node))
            if called:
                self.node_calls[node.name] = called
            for fn in called:
                self.callers.setdefault(fn, []).append((None, node))
        for scope, fn in self.functions.items():
            self.fn_calls[scope] = set()
            for node in fn.node_def:
                for fn_called in self._calls(node):
                    self.callers.setdefault(fn_called, []).append((scope, node))
                    self.fn_calls[scope].add(fn_called)
        self.folder = folder
        self.asset_root = asset_root
        self.saver = meta.saver_def if meta is not None and meta.HasField("saver_def") else None
        self.assets: dict[str, str] = {}  # graph node -> file name under assets/
        self.signature_inputs: set[str] = set()
        self.run_roots: dict[str, list[str]] = {}  # what the loader runs besides the saver -> its nodes
        self.bound: dict[str, list[Any]] = {}  # function -> the object-graph nodes it captures
        self.object_functions: set[str] = set()
        self.meta = meta
        if meta is not None:
            for asset in _asset_defs(meta):
                self.assets[node_of(asset.tensor_info.name)] = asset.filename
            for key, sig in meta.signature_def.items():
                names = [t.name for t in (*sig.inputs.values(), *sig.outputs.values()) if t.name]
                self.run_roots[f"signature {key!r}"] = [node_of(n) for n in names]
                self.signature_inputs.update(node_of(t.name) for t in sig.inputs.values() if t.name)
            for key in INIT_COLLECTIONS:
                if key in meta.collection_def:
                    self.run_roots[key] = [node_of(n) for n in meta.collection_def[key].node_list.value]
            graph = meta.object_graph_def
            for name, concrete in graph.concrete_functions.items():
                self.object_functions.add(name)
                self.bound[name] = [graph.nodes[i] for i in concrete.bound_inputs if i < len(graph.nodes)]
            for node in graph.nodes:  # functions an object names (a resource's _initialize...)
                if node.WhichOneof("kind") == "bare_concrete_function":
                    self.object_functions.add(node.bare_concrete_function.concrete_function_name)
                elif node.WhichOneof("kind") == "function":
                    self.object_functions.update(node.function.concrete_functions)
        self._roles: dict[str, Any] | None = None
        self._unfed: set[str] | None = None
        self.init_runs = True  # the loader runs the init collections (a SavedModel's does)

    # -- structure -------------------------------------------------------------------------

    def calls(self, node: Any) -> list[str]:
        """The functions a graph node calls: its op, or function-valued attributes."""
        return self.node_calls.get(node.name, [])

    def _calls(self, node: Any) -> Iterable[str]:
        if node.op in self.functions:
            yield node.op
        names = _func_attrs(node.op)
        for value in (node.attr.values() if names is None else (node.attr[n] for n in names if n in node.attr)):
            if value.func.name:
                yield value.func.name
            for fn in value.list.func:
                yield fn.name

    def ancestors(self, roots: Iterable[str]) -> set[str]:
        seen: set[str] = set()
        todo = [r for r in roots if r in self.nodes]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(i for i in self.inputs.get(name, ()) if i not in seen and i in self.nodes)
        return seen

    def descendants(self, start: str) -> set[str]:
        seen: set[str] = set()
        todo = list(self.consumers.get(start, ()))
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(self.consumers.get(name, ()))
        return seen

    def closure(self, roots: Iterable[str]) -> set[str]:
        """The functions ``roots`` are, and every function they call, at any depth."""
        seen: set[str] = set()
        todo = [r for r in roots if r in self.functions]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            todo.extend(f for f in self.fn_calls.get(name, ()) if f in self.functions and f not in seen)
        return seen

    def roles(self) -> dict[str, Any]:
        """The saver's subgraphs: ``save``/``restore`` (graph nodes that only the saver's save,
        or only its restore, runs), ``save_fns``/``restore_fns`` (functions only those call),
        ``restored`` (every graph node the restore runs) and ``filename`` (the saver's
        file-name node, which the loader feeds with the model's own variables prefix)."""
        if self._roles is not None:
            return self._roles
        saver = self.saver
        save_nodes = self.ancestors([node_of(saver.save_tensor_name)]) if saver else set()
        restore_nodes = self.ancestors([node_of(saver.restore_op_name)]) if saver else set()
        others = self.ancestors(n for roots in self.run_roots.values() for n in roots)
        role: dict[str, str] = {}
        for name in save_nodes | restore_nodes:
            node = self.nodes[name]
            if name in others or not (node.op in SAVE_OPS or node.op in RESTORE_OPS or any(self.calls(node))):
                continue  # only the ops that act need a role (and a variable's descendants are the model)
            below = self.descendants(name)
            if name in restore_nodes and below <= restore_nodes:
                role[name] = "restore"
            elif name in save_nodes and name not in restore_nodes and below <= save_nodes:
                role[name] = "save"
        called = {kind: self.closure(f for n, r in role.items() if r == kind for f in self.calls(self.nodes[n]))
                  for kind in ("save", "restore")}
        uncalled = [f for f in self.functions if f not in self.callers]
        other_fns = self.closure([*(f for n, node in self.nodes.items() if n not in role for f in self.calls(node)),
                                  *self.object_functions, *uncalled])
        self._roles = {
            "save": {n for n, r in role.items() if r == "save"},
            "restore": {n for n, r in role.items() if r == "restore"},
            "save_fns": called["save"] - called["restore"] - other_fns,
            "restore_fns": called["restore"] - other_fns,
            "restored": restore_nodes,
            "filename": node_of(saver.filename_tensor_name) if saver else None,
            "subgraph": save_nodes | restore_nodes,
            "others": others,
        }
        return self._roles

    def saver_owns(self, scope: Scope, name: str) -> bool:
        """Whether a node is the saver's own by structure: in a function only its save or
        restore calls, or a graph node of its subgraphs that nothing else runs or reads."""
        roles = self.roles()
        if scope is not None:
            return scope in roles["save_fns"] or scope in roles["restore_fns"]
        subgraph = roles["subgraph"]
        return name in subgraph and name not in roles["others"] and self.descendants(name) <= subgraph

    def runs_at_load(self) -> dict[str, str]:
        """Graph node -> what runs it inside ``load_model`` (an init collection, the restore)."""
        ran: dict[str, str] = {}
        if self.saver is not None:
            for name in self.roles()["restored"]:
                ran[name] = f"the saver's restore {node_of(self.saver.restore_op_name)!r}"
        for key in INIT_COLLECTIONS:
            said = key if self.init_runs else (f"in the .meta's {key} collection (the checkpoint loader runs none; "
                                               "a SavedModel loader would)")
            for name in self.ancestors(self.run_roots.get(key, ())):
                ran.setdefault(name, said)
        return ran

    # -- values ----------------------------------------------------------------------------

    def node(self, scope: Scope, name: str) -> Any:
        return self.nodes.get(name) if scope is None else self.fn_nodes[scope].get(name)

    def origins(self, scope: Scope, ref: str, seen: frozenset[tuple[Scope, str]] = frozenset()
                ) -> set[tuple[Scope, str]] | None:
        """The nodes a tensor comes from, through pass-through ops and function arguments to
        every caller; ``("asset", file)``/``("object", kind)`` for an object graph's captures.
        None: some origin cannot be known from the file."""
        key = (scope, ref)
        if key in seen or len(seen) > 64:
            return None
        seen = seen | {key}
        name = node_of(ref)
        node = self.node(scope, name)
        if node is None:
            if scope is None:
                return None
            args = [a.name for a in self.functions[scope].signature.input_arg]
            return self._argument(scope, args.index(name), seen) if name in args else None
        if node.op in _THROUGH and data_inputs(node):
            inputs = data_inputs(node)
            index = output_index(ref) if node.op == "IdentityN" else 0
            return self.origins(scope, inputs[min(index, len(inputs) - 1)], seen)
        return {(scope, name)}

    def _argument(self, fn: str, index: int, seen: frozenset[tuple[Scope, str]]) -> set[tuple[Scope, str]] | None:
        found: set[tuple[Scope, str]] = set()
        nargs = len(self.functions[fn].signature.input_arg)
        if fn in self.object_functions:
            bound = self.bound.get(fn, [])
            first = nargs - len(bound)
            if index < first:
                return None  # an argument the caller of a restored function passes
            captured = bound[index - first]
            kind = captured.WhichOneof("kind")
            defs = _asset_defs(self.meta) if self.meta is not None else []
            if kind == "asset" and captured.asset.asset_file_def_index < len(defs):
                found.add(("asset", defs[captured.asset.asset_file_def_index].filename))
            elif kind == "constant":
                found.add((None, captured.constant.operation))
            else:
                found.add(("object", kind or ""))
        callers = self.callers.get(fn, [])
        if not callers and fn not in self.object_functions:
            return None  # nothing in the file calls it: whoever does passes what they like
        for scope, node in callers:
            skip = _CALL_SKIP.get(node.op, 0 if node.op == fn else None)
            inputs = data_inputs(node)
            if skip is None or skip + index >= len(inputs):
                return None  # a loop, a dataset function...: its arguments change as it runs
            more = self.origins(scope, inputs[skip + index], seen)
            if more is None:
                return None
            found |= more
        return found

    def values(self, scope: Scope, ref: str, seen: frozenset[Any] = frozenset()) -> set[str] | None:
        """Every string ``ref`` can hold when it runs (a path as TensorFlow would open it), or
        None when one cannot be known from the file."""
        origins = self.origins(scope, ref)
        if origins is None or len(seen) > 64:
            return None
        found: set[str] = set()
        for where, name in origins:
            if where == "asset":
                found.add(self._asset_path(name))
                continue
            if where == "object":
                return None  # a variable restored from the checkpoint, a resource...
            node = self.node(where, name)
            if node is None or (where, name) in seen:
                return None
            more = self._node_values(where, node, seen | {(where, name)})
            if more is None:
                return None
            found |= more
        return found

    def unfed(self) -> set[str]:
        """Graph nodes that run without the assets fed: a signature's, the restore's (the
        loader feeds the asset tensors to the init collections only)."""
        if self._unfed is None:
            roots = [n for key, names in self.run_roots.items() if key not in INIT_COLLECTIONS for n in names]
            if self.saver is not None:
                roots.append(node_of(self.saver.restore_op_name))
            self._unfed = self.ancestors(roots)
        return self._unfed

    def _asset_path(self, filename: str) -> str:
        root = self.asset_root if self.asset_root is not None else (self.folder or Path(".")) / "assets"
        return str(root / filename)

    def _node_values(self, scope: Scope, node: Any, seen: frozenset[Any]) -> set[str] | None:
        """The values of one node's output: a constant's, an asset's (what the loader feeds an
        asset tensor in the init collections; where it runs unfed too, its own value as well), a
        default's, a variable's initial value."""
        if scope is None and node.name in self.signature_inputs:
            return None  # fed with the user's data
        asset = {self._asset_path(self.assets[node.name])} if scope is None and node.name in self.assets else None
        if asset is not None and node.name not in self.unfed():
            return asset  # the loader feeds it wherever it runs
        own: set[str] | None = None
        if node.op == "Const":
            own = {v.decode("utf-8", "replace") for v in node.attr["value"].tensor.string_val} or None
        elif scope is None and node.op == "PlaceholderWithDefault" and node.input:
            own = self.values(None, node.input[0], seen)
        elif scope is None and node.op == "Placeholder":
            own = set() if asset is not None else None  # unfed, it fails: no file is opened
        elif scope is None and node.op in ("ReadVariableOp", *_VARIABLE_OPS):
            variable = node if node.op in _VARIABLE_OPS else self.nodes.get(node_of(node.input[0]))
            own = None if variable is None else self._variable_values(variable, seen)
        if own is None:
            return None
        return own | (asset or set())

    def _variable_values(self, variable: Any, seen: frozenset[Any]) -> set[str] | None:
        """A variable's value is its initial value only when nothing else can write it: every
        consumer reads it or assigns it a value the scan can follow (a restore assigns what the
        checkpoint holds: unknown)."""
        if variable.op not in _VARIABLE_OPS:
            return None
        found: set[str] = set()
        assigned = False
        for name in self.consumers.get(variable.name, ()):
            consumer = self.nodes[name]
            if consumer.op not in _VARIABLE_READERS:
                return None
            inputs = data_inputs(consumer)
            if consumer.op in ("AssignVariableOp", "Assign"):
                if len(inputs) < 2 or node_of(inputs[0]) != variable.name:
                    return None
                more = self.values(None, inputs[1], seen)
                if more is None:
                    return None
                found |= more
                assigned = True
        return found if assigned else None
