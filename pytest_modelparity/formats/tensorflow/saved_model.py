"""Format ``saved_model``: a TensorFlow SavedModel directory, run through a signature.

A signature is a concrete function with a free batch dim, so any batch size runs without
retracing. Inputs are cast to the signature dtype (a signature rejects float64 given for
float32). Export writes a Keras 3 export archive whose outputs are named like the Keras
model's outputs, so forms can be compared output by output.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...errors import ModelLoadError
from ...runtime.devices import require_tf_device
from ..common import first_line, name_outputs, quiet
from .._files import read_regular
from .graph import freeze_concrete, import_tf, require_path, spec
from ..base import LoadedModel
from .keras_specs import pack_inputs
from .trust import missing_python, refuse_untrusted

NAME = "saved_model"
EXPORT_REQUIRES: tuple[tuple[str, str], ...] = ()
_log = logging.getLogger("pytest_modelparity.load")


def detect(path: Path) -> bool:
    if path.is_dir():
        return (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file()
    return path.name in ("saved_model.pb", "saved_model.pbtxt") and path.is_file()


class SavedModelModel(LoadedModel):
    """A SavedModel signature; ``native`` is the signature's ConcreteFunction."""

    format = NAME

    def __init__(self, loaded: Any, fn: Any, signature: str, *, device: str, source: Path) -> None:
        self.loaded = loaded  # keeps the variables alive
        self.native = fn
        self.signature = signature
        self._device = require_tf_device(device, format=NAME)
        args, kwargs = fn.structured_input_signature
        if args:
            raise ModelLoadError(source, NAME, f"signature {signature!r} takes positional inputs",
                                 "export a signature with named inputs (model.export() does)")
        outputs = fn.structured_outputs
        if isinstance(outputs, dict):
            out_order = sorted(outputs)
        else:  # a tuple or list: its flattened order, named output_0, output_1, ...
            outputs = {f"output_{i}": t for i, t in enumerate(import_tf().nest.flatten(outputs))}
            out_order = list(outputs)
        # One order in every process: sorted names, as TensorFlow flattens a signature's dicts
        # (the loaded dicts came in another order in each process: 4 runs, 4 orders). A list
        # batch fed to a SavedModel follows it; fed through the plugin's binding, the
        # reference's order instead (formats/binding.py).
        super().__init__(device=device, source=source,
                         inputs=[spec(name, kwargs[name].shape, kwargs[name].dtype) for name in sorted(kwargs)],
                         outputs=[spec(name, outputs[name].shape, outputs[name].dtype) for name in out_order])

    def _predict(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tf = import_tf()
        try:
            with tf.device(self._device.tf_name):
                result = self.native(**{name: tf.constant(x) for name, x in feeds.items()})
        except Exception as exc:  # noqa: BLE001 - one known cause is reworded, the rest re-raised
            found = missing_python(exc, self)
            if found is None:
                raise
            raise found from exc
        if not isinstance(result, dict):
            result = dict(zip((s.name for s in self.outputs), tf.nest.flatten(result)))
        return {s.name: np.asarray(result[s.name]) for s in self.outputs}

    def graph_defs(self) -> list[Any]:
        return [self.native.graph.as_graph_def()]

    def frozen_graph(self) -> Any:
        """The signature with its variables as constants (for the graph twin)."""
        # A signature's inputs are keyword arguments and its outputs a dict: both flatten
        # in sorted-name order; the specs follow the exporter's order.
        flat_in = sorted(s.name for s in self.inputs)
        frozen = freeze_concrete(self.native, [flat_in.index(s.name) for s in self.inputs])
        outputs = self.native.structured_outputs
        if isinstance(outputs, dict):
            flat_out = sorted(outputs)
            frozen.outputs = [frozen.outputs[flat_out.index(s.name)] for s in self.outputs]
        return frozen

    def weights(self) -> dict[str, np.ndarray]:
        out = {}
        for v in self.native.variables:
            name = v.name[:-2] if v.name.endswith(":0") else v.name
            out[name] = np.asarray(v.numpy())
        return out

    def predict_with_weights(self, batch: Any, values: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """One run with the named variables holding ``values``, restored afterwards. A name is
        ``weights()``'s, or where those collide (every kernel ``model/kernel``), the variable's
        path suffixed ``#2``, ``#3`` in order, as the diagnosis numbers them; a name two
        variables share is refused, never guessed."""
        by_name: dict[str, Any] = {}
        shared: set[str] = set()
        seen: dict[str, int] = {}
        for v in self.native.variables:
            short = v.name[:-2] if v.name.endswith(":0") else v.name
            if short in by_name:
                shared.add(short)
            by_name[short] = v
            full = getattr(v, "path", None) or v.name
            seen[full] = seen.get(full, 0) + 1
            by_name.setdefault(full if seen[full] == 1 else f"{full}#{seen[full]}", v)
        for name in shared:
            del by_name[name]
        missing = sorted(set(values) - set(by_name))
        if missing:
            raise KeyError(f"no variable named {missing[0]!r}")
        saved = {name: by_name[name].numpy() for name in values}
        try:
            for name, value in values.items():
                by_name[name].assign(value)
            return self.predict(batch)
        finally:
            for name, value in saved.items():
                by_name[name].assign(value)


def load(source: Any, *, device: str = "cpu", signature: str | None = None,
         tags: Sequence[str] | None = None, trusted: bool | None = None) -> SavedModelModel:
    """Load a SavedModel directory (or its ``saved_model.pb``) and pick a signature."""
    path = Path(source)
    if path.name in ("saved_model.pb", "saved_model.pbtxt") and path.is_file():
        path = path.parent
    require_path(path, NAME, kind="dir")
    if not ((path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file()):
        raise ModelLoadError(path, NAME, "the directory has no saved_model.pb",
                             "pass the directory written by model.export() or tf.saved_model.save()")
    proto = path / "saved_model.pb"
    if proto.is_file() and proto.stat().st_size == 0:
        # TensorFlow would say "requires a tags= argument ... 0 MetaGraphs", which points away.
        raise ModelLoadError(proto, NAME, "saved_model.pb is empty (0 bytes): the SavedModel is truncated or corrupt",
                             "export the SavedModel again (model.export(path) or tf.saved_model.save)")
    refuse_untrusted(path, NAME, trusted)  # before TensorFlow runs any of it (docs/security.md)
    dev = require_tf_device(device, format=NAME)
    tf = import_tf()
    nodes = _object_nodes(path)  # one read of saved_model.pb for both checks
    check_variables_present(path, nodes)
    if has_slot_variables(path, nodes):  # TF 2.x would fail on them after seconds: go straight to v1
        return _load_signature_v1(path, tags, signature, device=device, problem=SLOT_PROBLEM)
    try:
        with quiet(), tf.device(dev.tf_name):
            loaded = tf.saved_model.load(str(path), tags=list(tags) if tags else None)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a ModelLoadError
        # TF 2.x cannot revive every object graph (a Keras 2 optimizer's slot variables need
        # tf_keras): the MetaGraph's signatures through the v1 loader need none of it.
        return _load_signature_v1(path, tags, signature, device=device, problem=_revival_problem(exc))
    signatures = dict(loaded.signatures)
    if not signatures:
        raise ModelLoadError(path, NAME, "the SavedModel has no signatures",
                             "export it with model.export(path), or tf.saved_model.save(obj, path, "
                             "signatures=...) with an input_signature")
    if signature is None:
        signature = "serving_default" if "serving_default" in signatures else (
            next(iter(signatures)) if len(signatures) == 1 else None)
        if signature is None:
            raise ModelLoadError(path, NAME, f"no serving_default signature and several others: "
                                 f"{', '.join(sorted(signatures))}", "pass signature='name' to load_model")
    else:
        _check_signature(path, signature, signatures)
    return SavedModelModel(loaded, signatures[signature], signature, device=device, source=path)


def _check_signature(path: Path, signature: str, signatures: Any) -> None:
    if signature not in signatures:
        raise ModelLoadError(path, NAME, f"no signature {signature!r}; it has: {', '.join(sorted(signatures))}",
                             "pass one of those as signature=")


SLOT_PROBLEM = ("its object graph holds a Keras 2 optimizer's slot variables (saved with "
                "include_optimizer=True), which TF 2.x cannot revive without tf_keras")


def _revival_problem(exc: BaseException) -> str:
    """What TF 2.x's object-graph revival failed on, in words."""
    if "add_slot" in str(exc):
        return SLOT_PROBLEM
    return f"TF 2.x could not revive its object graph ({first_line(exc)})"


def _object_nodes(path: Path) -> list[Any]:
    """The object-graph nodes of ``path``'s ``saved_model.pb`` (a protobuf read, no TensorFlow
    loading), or [] when there is no readable one (the loaders report a broken file)."""
    proto = Path(path) / "saved_model.pb"
    if not proto.is_file():
        return []
    import_tf()
    from tensorflow.core.protobuf import saved_model_pb2

    message = saved_model_pb2.SavedModel()
    try:
        message.ParseFromString(read_regular(proto, NAME))
    except Exception:  # noqa: BLE001 - a broken file is the loaders' to report
        return []
    return [node for graph in message.meta_graphs for node in graph.object_graph_def.nodes]


def has_slot_variables(path: Path, nodes: list[Any] | None = None) -> bool:
    """Whether the SavedModel's object graph records optimizer slot variables (a Keras 2
    model saved with its legacy optimizer). ``nodes``: ``_object_nodes(path)``, if read."""
    return any(node.slot_variables for node in (_object_nodes(path) if nodes is None else nodes))


def check_variables_present(path: Path, nodes: list[Any] | None = None) -> None:
    """Refuse a SavedModel whose object graph holds variables while ``variables/`` is missing
    (a copy of ``saved_model.pb`` alone), saying so, before a loader or converter fails on
    "Unsuccessful TensorSliceReader constructor"."""
    if (Path(path) / "variables").is_dir():
        return
    count = sum(node.WhichOneof("kind") == "variable" for node in (_object_nodes(path) if nodes is None else nodes))
    if count:
        raise ModelLoadError(path, NAME, "the directory has no variables/ folder, and the SavedModel's object graph "
                             "holds variables: saved_model.pb alone is only the graph",
                             "copy the whole SavedModel directory (saved_model.pb with variables/ beside it)")


def frozen_copy(path: Path, dest: Path) -> Path:
    """A SavedModel at ``dest`` holding only ``path``'s serving signature, frozen (what a
    converter that calls ``tf.saved_model.load`` itself, as tensorflowjs does, can read when
    ``has_slot_variables(path)``)."""
    model = _load_signature_v1(Path(path), None, None, device="cpu", problem=SLOT_PROBLEM)
    tf = import_tf()
    with quiet():
        tf.saved_model.save(model.loaded, str(dest), signatures={"serving_default": model.native})
    return dest


class FrozenSignatureModel(SavedModelModel):
    """A SavedModel signature loaded by the v1 loader and frozen (variables as constants):
    ``native`` is a variable-free ConcreteFunction with the signature's keyword inputs and
    output dict, so exporters, the graph twin and the predict path treat it as any other."""

    def __init__(self, holder: Any, fn: Any, signature: str, *, device: str, source: Path,
                 graph_def: Any, note: str, wiring: tuple[dict[str, str], dict[str, str]] | None = None) -> None:
        self._frozen_def = graph_def
        self._wiring = wiring  # ({input key: tensor name}, {output key: tensor name}) in graph_def
        self.load_note = note
        super().__init__(holder, fn, signature, device=device, source=source)

    def weights(self) -> dict[str, np.ndarray]:
        from .graph import const_weights

        return const_weights(self._frozen_def)

    def predict_with_weights(self, batch: Any, values: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """One run of the frozen graph with the named constants fed ``values``."""
        from .graph import run_with_constants

        if self._wiring is None:
            return None
        ins, outs = self._wiring
        got = run_with_constants(self._frozen_def, ins, outs, self.prepare_batch(batch), values)
        return {s.name: got[s.name] for s in self.outputs}


def _load_signature_v1(path: Path, tags: Sequence[str] | None, signature: str | None, *, device: str,
                       problem: str) -> SavedModelModel:
    """The MetaGraph's signature through ``tf.compat.v1.saved_model.loader`` in its own graph,
    frozen with the session's variables and wrapped as a ConcreteFunction (``FrozenSignatureModel``);
    where that fails too, a ModelLoadError naming both failures."""
    tf = import_tf()
    from .graph import new_session, wrap_frozen

    has_variables = (path / "variables").is_dir()
    graph = tf.Graph()
    session = new_session(graph)
    try:
        with quiet(), graph.as_default():
            meta = tf.compat.v1.saved_model.loader.load(session, list(tags) if tags else ["serve"], str(path))
        signatures = {k: v for k, v in meta.signature_def.items() if v.inputs and v.outputs}
        if signature is None:
            signature = "serving_default" if "serving_default" in signatures else (
                next(iter(signatures)) if len(signatures) == 1 else None)
            if signature is None:
                raise ModelLoadError(path, NAME, f"{problem}; its MetaGraph has no serving_default signature "
                                     f"and {len(signatures)} others: {', '.join(sorted(signatures)) or 'none'}",
                                     "pass signature='name' to load_model")
        _check_signature(path, signature, signatures)
        sig = signatures[signature]
        ins = {k: v.name for k, v in sig.inputs.items()}
        outs = {k: (v.name, v.tensor_shape) for k, v in sig.outputs.items()}
        with quiet():
            frozen = tf.compat.v1.graph_util.convert_variables_to_constants(
                session, graph.as_graph_def(), sorted({n.split(":")[0] for n, _ in outs.values()}))
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - both loaders failed: say what each said
        missing = "" if has_variables else "; the directory has no variables/ folder"
        raise ModelLoadError(path, NAME, f"TensorFlow could not load the SavedModel: {problem}, and the v1 "
                             f"loader could not read its signatures either ({first_line(exc)}){missing}",
                             "copy the SavedModel again with its variables/ folder" if not has_variables else
                             "check saved_model.pb and variables/ are complete (not truncated) and written "
                             "by a compatible TensorFlow") from exc
    finally:
        session.close()

    fn, holder = wrap_frozen(frozen, ins, {k: name for k, (name, _) in outs.items()},
                             {k: shape for k, (_, shape) in outs.items()})
    note = f"loaded by the v1 loader (signature {signature!r}, frozen): {problem}"
    _log.info("saved_model %s: %s", path, note)
    return FrozenSignatureModel(holder, fn, signature, device=device, source=path, graph_def=frozen, note=note,
                                wiring=(ins, {k: name for k, (name, _) in outs.items()}))


def export(model: Any, path: Path, **options: Any) -> Path:
    """Write ``model`` as a SavedModel whose ``serving_default`` outputs carry the Keras output names."""
    if options:
        raise TypeError(f"saved_model export takes no options, got {sorted(options)}")
    tf = import_tf()
    import keras

    from .keras import KerasModel

    km = KerasModel(model, device="cpu")
    names = [s.name for s in km.outputs]
    signature = [tf.TensorSpec(s.shape, s.dtype, name=s.name) for s in km.inputs]

    def serve(*xs: Any) -> dict[str, Any]:
        return name_outputs(model(pack_inputs(model, list(xs)), training=False), names, numpy=False)

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serve", serve, input_signature=signature)
    path.parent.mkdir(parents=True, exist_ok=True)
    with quiet():
        archive.write_out(str(path), verbose=False)
    return path
