"""TensorFlow.js graph models: export a Keras model (or a SavedModel directory) to one.

Export goes Keras -> ``model.export()`` SavedModel (temporary) -> the ``tensorflowjs``
converter's ``convert_tf_saved_model``, with the graph rewrites of ``rewrite.py`` around its
defects, then the files are loaded and run in Node.js before they are moved into place.
``tensorflowjs`` must be installed with ``--no-deps`` (its pins pull TF 2.19 and break TF 2.21)
and imports tensorflow_decision_forests, jax and tf_keras at module level without needing them
for this path: :func:`import_converter` puts empty stand-ins in ``sys.modules`` for the import
only and removes them afterwards.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, Iterator


from ...errors import ExportError, ModelLoadError, RuntimeMissing
from ...runtime.scratch import owned_prefix
from ..common import TF_INSTALL, ConverterLog, probe_note, quiet, record_route, run_probe
from . import rewrite as tfjs_rewrite
from .load import (NAME, RECORD_KEY, STRING_INPUT_FIX, check_input_dtypes, load, model_json_path, read_model_json,
                   signature_specs)

CONVERTS_SAVED_MODEL = True  # export() also takes a SavedModel directory
EXPORT_VALIDATES = True  # export() runs validate() before moving the files into place
TFJS_CONVERTER_INSTALL = ("pip install --no-deps tensorflowjs==4.22.0 tensorflow_hub==0.16.1 && "
                          "pip install packaging six  (the plugin's [tfjs] extra; plain `pip install tensorflowjs` "
                          "downgrades TensorFlow and protobuf)")
EXPORT_REQUIRES = (("tensorflow", TF_INSTALL), ("tensorflowjs", TFJS_CONVERTER_INSTALL))

# -- export ----------------------------------------------------------------------------
_STANDINS = ("tensorflow_decision_forests", "jax", "jax.experimental", "jax.experimental.jax2tf", "tf_keras")


def import_converter() -> types.ModuleType:
    """Import ``tensorflowjs.converters.tf_saved_model_conversion_v2`` without tfdf, jax or tf_keras.

    Those imports sit at module level in tensorflowjs but are unused by the SavedModel ->
    graph model path. Empty stand-ins are put in ``sys.modules`` only for the duration of the
    import and removed afterwards (a fake ``jax`` left importable breaks Keras 3, which does
    ``try: import jax``). TensorFlow and Keras are imported first, for real, for that reason.
    ``tensorflow_hub``, imported meanwhile against a stand-in ``tf_keras``, is dropped from
    ``sys.modules`` too so a later ``import tensorflow_hub`` gets the real thing.
    """
    name = "tensorflowjs.converters.tf_saved_model_conversion_v2"
    if name in sys.modules:
        return sys.modules[name]
    if importlib.util.find_spec("tensorflowjs") is None:
        raise RuntimeMissing("the tensorflowjs converter (needed to export to format 'tfjs')", TFJS_CONVERTER_INSTALL)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import keras  # noqa: F401 - must be real and complete before any stand-in exists
        import tensorflow  # noqa: F401
    except ImportError as exc:
        raise RuntimeMissing("tensorflow (needed to export to format 'tfjs')", TF_INSTALL) from exc

    added: list[str] = []
    for mod in _STANDINS:
        top = mod.split(".")[0]
        if mod in sys.modules or (top not in added and importlib.util.find_spec(top) is not None):
            continue
        stand_in = types.ModuleType(mod, "pytest-modelparity stand-in used while importing tensorflowjs")
        if mod == "tf_keras":
            # tensorflow_hub subclasses tf_keras.layers.Layer at import time.
            setattr(stand_in, "layers", types.SimpleNamespace(Layer=type("Layer", (), {})))
        sys.modules[mod] = stand_in
        added.append(mod)
        if "." in mod:
            parent, _, child = mod.rpartition(".")
            setattr(sys.modules[parent], child, stand_in)
    before = set(sys.modules)
    try:
        import tensorflowjs.converters.tf_saved_model_conversion_v2 as converter
    except ImportError as exc:
        raise RuntimeMissing(f"a working tensorflowjs converter ({type(exc).__name__}: {exc})",
                             TFJS_CONVERTER_INSTALL) from exc
    finally:
        for mod in added:
            sys.modules.pop(mod, None)
        if "tf_keras" in added:
            for mod in set(sys.modules) - before:
                if mod == "tensorflow_hub" or mod.startswith("tensorflow_hub."):
                    sys.modules.pop(mod, None)
    return converter


VALIDATE_TIMEOUT_S = 600.0  # the check's Node.js load and predict, unless the caller bounds them


def validate(model_json: Path, *, timeout_s: float = VALIDATE_TIMEOUT_S) -> None:
    """Check a fresh export runs in tfjs before it is returned or cached: load it on the cpu
    backend (the one "auto" falls back to) and predict a batch of zeros.

    Raises ``ExportError`` naming the op, the backend and a workaround. Without Node.js nothing
    can be checked: the export is returned and loading it says what is missing.
    """
    model_json = model_json_path(model_json)
    spec = read_model_json(model_json)
    check_input_dtypes(model_json, spec)
    try:
        model = load(model_json, backend="cpu", timeout_s=timeout_s)
    except RuntimeMissing:
        return
    except ModelLoadError as exc:
        raise ExportError(model_json, NAME, f"tfjs cannot load the converted model: {exc.problem}", exc.fix,
                          unsupported_ops=_ops_named(exc.problem)) from exc
    try:
        entries = (spec.get("signature") or {}).get("inputs") or {}
        if entries:  # zeros, open non-batch dims at the smallest size the model takes
            try:
                run_probe(model.predict, signature_specs(entries))
            except ModelLoadError as exc:
                raise ExportError(model_json, NAME, f"tfjs cannot run the converted model: {exc.problem}{probe_note(exc)}",
                                  exc.fix, unsupported_ops=_ops_named(exc.problem)) from exc
    finally:
        model.close()


def _write_intermediate(model: Any, saved_model: Path, out_dir: Path) -> None:
    """The SavedModel the converter reads, written by the saved_model format's exporter: it
    names the outputs like the Keras model ("probs"), where model.export() says "output_0", so
    the TFJS outputs then match by name."""
    from ..tensorflow import saved_model as saved_model_format

    try:
        with quiet():
            saved_model_format.export(model, saved_model)
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported with the format and the fix
        raise ExportError(out_dir, NAME, f"writing the intermediate SavedModel failed ({type(exc).__name__}: "
                             f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})",
                             "export a functional or Sequential Keras model built on keras.Input(...)") from exc


def _ops_named(problem: str) -> tuple[str, ...]:
    found = re.search(r"(?:op|activation) '([^']+)'", problem)
    return (found.group(1),) if found else ()


def export(model: Any, path: Path, *, quantization: str | None = None, validate_export: bool = True,
           graph_options: dict[str, Any] | None = None, saved_model_of_model: Path | str | None = None,
           validate_timeout_s: float | None = None, **converter_options: Any) -> Path:
    """Write a tfjs graph model of ``model`` into directory ``path``; return its ``model.json``.

    ``model``: a Keras model (exported to a temporary SavedModel with ``model.export``) or the
    path of a SavedModel directory. ``quantization``: None, ``"float16"``, ``"uint8"`` or
    ``"uint16"`` weight quantization. Other keyword arguments go to ``convert_tf_saved_model``;
    ``control_flow_v2`` defaults to True (Keras RNN loops then run in tfjs; lowered loops do not).

    The converter runs with graph rewrites (:mod:`.rewrite`: ``Erfc`` -> ``1 - Erf``,
    fused hard-swish split, non-vector fused biases unfused) and its output (prints, TensorFlow
    C++ logs) goes to a ``ConverterLog`` file. The result is checked to load and run in tfjs
    (:func:`validate`) before it is moved into ``path``: a failure raises ``ExportError`` naming
    the op, the backend, the fix and the kept log file, and leaves nothing at ``path``. The
    route (``export_route(path)``) says which rewrites applied.

    ``saved_model_of_model``: for a Keras ``model``, a SavedModel the saved_model format's own
    exporter already wrote of this same model (the export cache's entry): converted as it is,
    read only, instead of writing the same SavedModel again (MobileNetV2: 14 s of a 27 s export).
    ``validate_timeout_s``: the most the check's Node.js load and predict may take (default 600 s;
    its start-up handshake takes 30 s or this, the shorter): a session passes its
    ``--modelparity-timeout``, which bounds its other tfjs loads and predicts too.
    """

    path = Path(path)
    out_dir = path.parent if path.suffix.lower() == ".json" else path
    if quantization is not None:
        if quantization not in ("float16", "uint8", "uint16"):
            raise ValueError(f"unknown tfjs quantization {quantization!r}; use float16, uint8 or uint16")
        converter_options["quantization_dtype_map"] = {quantization: True}
    converter_options.setdefault("control_flow_v2", True)
    converter = import_converter()

    rewrites: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix=owned_prefix("modelparity-tfjs-")) as tmp:  # swept if killed
        if isinstance(model, (str, Path)):
            saved_model = Path(model)
            from ..tensorflow import graph_source, saved_model as saved_model_format

            if not (saved_model / "saved_model.pb").is_file() and graph_source.kind(saved_model) is not None:
                saved_model, graph_route = graph_source.write_saved_model(saved_model, Path(tmp) / "saved_model",
                                                                          **dict(graph_options or {}))
                # the _output_shapes retry of an old MetaGraph is said in this route too
                retry = graph_route[graph_route.index("old MetaGraph"):] if "old MetaGraph" in graph_route else ""
                rewrites["signature frozen from the TF1 graph" + (f"; {retry}" if retry else "")] = 1
            elif not (saved_model / "saved_model.pb").is_file():
                raise ModelLoadError(saved_model, None, "it is not a SavedModel directory nor a TF1 graph, and only a "
                                     "Keras model, a SavedModel directory or a TF1 graph can be converted to tflite, onnx "
                                     "or tfjs", "pass the Keras model, or the "
                                     "directory written by model.export() / tf.saved_model.save()", action="convert")
            else:
                saved_model_format.check_variables_present(saved_model)
            if saved_model_format.has_slot_variables(saved_model):  # the converter's TF 2.x load fails
                saved_model = saved_model_format.frozen_copy(saved_model, Path(tmp) / "saved_model")
                rewrites["signature frozen (Keras 2 optimizer slots in the object graph)"] = 1
        else:
            if not hasattr(model, "export"):
                raise TypeError(f"cannot export a {type(model).__name__} to tfjs: pass a Keras model "
                                f"or the path of a SavedModel directory")
            refuse_string_inputs(model, out_dir)
            saved_model = Path(tmp) / "saved_model"
            if saved_model_of_model is not None and (Path(saved_model_of_model) / "saved_model.pb").is_file():
                saved_model = Path(saved_model_of_model)  # the converter only reads it
                rewrites["from the saved_model export of this model"] = 1
            else:
                _write_intermediate(model, saved_model, out_dir)
        staged = Path(tmp) / "tfjs"
        log = ConverterLog(NAME)
        converted: dict[str, str] = {}  # the signature's output names -> their tensors in the graph
        try:
            try:
                with log.capture(), tfjs_rewrite.patched_converter(converter, rewrites), \
                        _signature_outputs(converter, converter_options.get("signature_def"), converted):
                    converter.convert_tf_saved_model(str(saved_model), str(staged), **converter_options)
            except Exception as exc:  # noqa: BLE001
                unsupported = re.search(r"Unsupported Ops in the model (?:before|after) optimization\s*(.*)", str(exc))
                if unsupported:
                    ops = tuple(o.strip() for o in unsupported.group(1).split(",") if o.strip())
                    raise ExportError(out_dir, NAME, "the tensorflowjs converter has no tfjs mapping for some ops",
                                      "replace the layers using those ops (tfjs-converter/docs/supported_ops.md "
                                      "lists the ops tfjs runs), or test this model in the other formats",
                                      unsupported_ops=ops, log_path=log.keep()) from exc
                raise ExportError(out_dir, NAME, f"the tensorflowjs converter failed ({type(exc).__name__}: "
                                  f"{str(exc).strip()[:300]})",
                                  "check the model's ops against the converter's supported ops "
                                  "(tfjs-converter/docs/supported_ops.md in the tfjs repository)",
                                  log_path=log.keep()) from exc
            write_output_record(staged / "model.json", converted)
            if validate_export:
                try:
                    validate(staged / "model.json", timeout_s=validate_timeout_s or VALIDATE_TIMEOUT_S)
                except ExportError as exc:
                    raise ExportError(out_dir, NAME, exc.problem, exc.fix, unsupported_ops=exc.unsupported_ops,
                                      log_path=log.keep(), route=_route(converter_options, rewrites)) from exc
        finally:
            log.discard()
        out_dir.mkdir(parents=True, exist_ok=True)
        for item in staged.iterdir():
            target = out_dir / item.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            shutil.move(str(item), str(target))
    record_route(out_dir / "model.json", NAME, _route(converter_options, rewrites))
    return out_dir / "model.json"


@contextlib.contextmanager
def _signature_outputs(converter: Any, signature: str | None, found: dict[str, str]) -> Iterator[None]:
    """While converting, fill ``found`` with ``{output name: its tensor's name}`` of the signature
    the converter traces (read from the SavedModel the converter itself loads: no second load).
    tfjs keeps those names only where an output's shape is unique; this is what tells two heads
    of one shape apart afterwards (:func:`write_output_record`)."""
    import tensorflow as tf

    original = converter._load_model

    def load_model(*args: Any, **kwargs: Any) -> Any:
        model = original(*args, **kwargs)
        with contextlib.suppress(Exception):  # a record missed is only a record missed: binding says so
            function = model.signatures[signature or "serving_default"]
            structure = function.structured_outputs
            tensors = [t.name for t in function.outputs]
            # A function's outputs are its structured outputs flattened: how TensorFlow itself packs
            # a call's results back into the signature's dict (keys flatten in sorted order).
            if isinstance(structure, dict) and len(tf.nest.flatten(structure)) == len(structure) == len(tensors):
                found.update(zip(map(str, tf.nest.flatten({k: k for k in structure})), tensors))
        return model

    converter._load_model = load_model
    try:
        yield
    finally:
        converter._load_model = original


def write_output_record(model_json: Path, converted: dict[str, str]) -> dict[str, str]:
    """Write which tfjs output holds which source output into ``model.json``'s
    ``userDefinedMetadata`` (``RECORD_KEY``), where the converter's signature lost the names (two
    outputs of one shape come out as ``Identity:0``, ``Identity_1:0``); return that record.

    ``converted``: the source signature's ``{output name: tensor name}``; each entry of the
    converted signature names its tensor, so the record is read off, never guessed by order or
    values. Only written where some tfjs name differs from its source name, and only whole."""
    spec = json.loads(model_json.read_text())
    entries = (spec.get("signature") or {}).get("outputs") or {}
    by_tensor = {tensor: name for name, tensor in converted.items()}
    record = {by_tensor[e.get("name")]: key for key, e in entries.items() if e.get("name") in by_tensor}
    if not entries or len(record) != len(entries) or all(k == v for k, v in record.items()):
        return {}
    spec.setdefault("userDefinedMetadata", {})[RECORD_KEY] = {"outputs": record}
    model_json.write_text(json.dumps(spec))
    return record


def _route(converter_options: dict[str, Any], rewrites: dict[str, int]) -> str:
    """How the export went, e.g. ``control_flow_v2, erfc->1-erf x1, hard_swish split x10``."""
    names = {"erfc": "erfc->1-erf", "softsign": "softsign->x/(1+|x|)", "hard_swish": "hard_swish split", "tanh": "fused tanh split", "unfused_bias": "non-vector bias unfused",
             "band_part": "MatrixBandPart written out", "debug_ops": "debug ops stripped (Assert/CheckNumerics/Print)",
             "inlined": "XLA-only functions inlined", "grouped": "grouped conv as depthwise",
             "list_writes": "RNN step output ordered after its list write", "einsum": "Einsum as matmul"}
    parts = ["control_flow_v2" if converter_options.get("control_flow_v2") else "lowered control flow"]
    parts += [names.get(k, k) + ("" if k.startswith(("signature", "from ")) else f" x{v}") for k, v in rewrites.items() if v]
    return ", ".join(parts)


def refuse_string_inputs(model: Any, out_dir: Path) -> None:
    """A Keras model with string inputs cannot be run by the tfjs runner: say so before converting."""
    for t in getattr(model, "inputs", None) or []:
        if str(getattr(t, "dtype", "")) == "string":
            name = str(getattr(t, "name", "?")).split(":", 1)[0]
            raise ExportError(out_dir, NAME, f"input {name!r} is a string tensor; the tfjs format here runs "
                                 "float32, int32 and bool inputs only", STRING_INPUT_FIX, not_applicable=True)
