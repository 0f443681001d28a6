"""Format ``keras``: an in-memory Keras model, or a Keras 3 ``.keras`` file.

Predictions use ``model(x, training=False)``: bitwise equal to ``model.predict`` here, but
without its per-call overhead and progress bars, and with dropout and batch-norm in
inference mode. ``.keras`` files load with ``safe_mode=True`` unless the caller passes
``safe_mode=False``, so a Lambda layer in a file cannot run code by default.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ModelLoadError
from ...runtime.devices import require_tf_device
from ...runtime.tf_import import import_keras
from ..common import first_line, is_keras_model, name_outputs, quiet
from .graph import freeze_concrete, import_tf, require_path
from ..base import LoadedModel
from .keras_specs import declare_input_specs, input_specs, is_subclassed, keras_output_names, output_specs, pack_inputs

NAME = "keras"
EXPORT_REQUIRES: tuple[tuple[str, str], ...] = ()


def detect(path: Path) -> bool:
    return path.suffix.lower() == ".keras" and path.is_file()


class KerasModel(LoadedModel):
    """A Keras model called eagerly in inference mode; ``native`` is the ``keras.Model``."""

    def __init__(self, model: Any, *, device: str, source: str | Path | None = None, format: str = NAME) -> None:
        self.format = format
        self.native = model
        self._device = require_tf_device(device, format=format)
        self._traced: Any = None
        self.compute_dtype = _compute_dtype(model)
        # A subclassed model has no symbolic inputs: its specs come from the shapes it was
        # built for, or from the user (keras_specs); its outputs from tracing it once.
        super().__init__(device=device, source=source, inputs=input_specs(model, source=source, format=format),
                         outputs=output_specs(model))

    def _predict(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tf = import_tf()
        xs = [feeds[s.name] for s in self.inputs]
        with tf.device(self._device.tf_name):
            result = self.native(pack_inputs(self.native, xs), training=False)
        return name_outputs(result, [s.name for s in self.outputs])

    def traced_function(self) -> Any:
        """The model traced once as a ``tf.function`` with a free batch dim (for graph_defs)."""
        if self._traced is None:
            tf = import_tf()
            model, names = self.native, [s.name for s in self.outputs]
            signature = [tf.TensorSpec(s.shape, s.dtype, name=s.name) for s in self.inputs]

            def serve(*xs: Any) -> dict[str, Any]:
                return name_outputs(model(pack_inputs(model, list(xs)), training=False), names, numpy=False)

            self._traced = tf.function(serve, autograph=False).get_concrete_function(*signature)
        return self._traced

    def graph_defs(self) -> list[Any]:
        return [self.traced_function().graph.as_graph_def()]

    def frozen_graph(self) -> Any:
        """The traced inference function with its weights as constants (for the graph twin)."""
        frozen = freeze_concrete(self.traced_function())
        # A dict-returning function flattens its outputs by sorted key.
        flat = sorted(s.name for s in self.outputs)
        frozen.outputs = [frozen.outputs[flat.index(s.name)] for s in self.outputs]
        return frozen

    def weights(self) -> dict[str, np.ndarray]:
        return {getattr(v, "path", v.name): np.asarray(v.numpy()) for v in self.native.weights}

    def intermediates(self, batch: Any) -> list[tuple[str, str, np.ndarray]] | None:
        """Every layer's output of a functional/Sequential model, in layer order."""
        keras = import_keras()
        model = self.native
        layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
        try:
            probe = keras.Model(model.inputs, [layer.output for layer in layers])
        except Exception:  # noqa: BLE001 - subclassed models have no symbolic outputs
            return None
        feeds = self.prepare_batch(batch)
        tf = import_tf()
        with tf.device(self._device.tf_name):
            values = probe(pack_inputs(probe, [feeds[s.name] for s in self.inputs]), training=False)
        return [(layer.name, type(layer).__name__, np.asarray(v)) for layer, v in zip(layers, values)]


def _compute_dtype(model: Any) -> str | None:
    """The least precise float compute dtype of the model's layers (mixed_float16 -> float16)."""
    from ...verdict.tolerances import less_precise

    least: Any = None
    for layer in [model, *getattr(model, "_flatten_layers", lambda: [])()]:
        dtype = getattr(getattr(layer, "dtype_policy", None), "compute_dtype", None)
        if dtype not in ("float16", "bfloat16", "float32", "float64"):
            continue
        least = dtype if least is None else less_precise(least, dtype)
    name = None if least is None else str(least)
    return name if name in ("float16", "bfloat16") else None






def load_keras_file(path: Path, format: str, *, safe_mode: bool, custom_objects: dict | None) -> Any:
    """``keras.saving.load_model`` with errors that name the file, the format and the fix."""
    keras = import_keras()
    try:
        with quiet():
            return keras.saving.load_model(str(path), custom_objects=custom_objects, compile=False,
                                           safe_mode=safe_mode)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a ModelLoadError
        text = str(exc)
        if "safe_mode" in text or "Lambda" in text and "unsafe" in text.lower():
            what = ("a TFSMLayer, which loads an external SavedModel (a program: its graph can read and write "
                    "files) that is not loaded by default" if "TFSMLayer" in text else
                    "a Lambda layer (Python code), which is not loaded by default because loading it runs that code")
            raise ModelLoadError(path, format, f"the file holds {what}",
                                 "only if you trust this file: run pytest with --modelparity-trust-models, or give "
                                 "safe_mode=False (or trusted=True) in load_model(...) or modelparity_load_options") from exc
        if "Unknown layer" in text or "custom_objects" in text or "Could not locate" in text:
            raise ModelLoadError(path, format, f"the file uses a class Keras does not know ({first_line(exc)})",
                                 "pass custom_objects={'Name': cls} to load_model, or import the module "
                                 "that registers it") from exc
        raise ModelLoadError(path, format, f"Keras could not read the file ({first_line(exc)})",
                             "check the file is complete (not truncated) and was saved by Keras") from exc


def load(source: Any, *, device: str = "cpu", safe_mode: bool = True,
         custom_objects: dict | None = None, input_specs: Any = None) -> KerasModel:
    """Load an in-memory Keras model (or a zero-argument factory returning one) or a ``.keras`` file.

    ``input_specs`` declares the inputs of a subclassed model that was never built or called
    (``[(name, shape, dtype)]``, shapes with the batch dim first; see ``keras_specs``); every
    later export of the same model object uses them too.
    """
    if isinstance(source, (str, Path)):
        path = require_path(Path(source), NAME)
        if not zipfile.is_zipfile(path):
            raise ModelLoadError(path, NAME, "not a zip archive (a .keras file is a zip): the file is "
                                 "corrupt, truncated, or another format",
                                 "re-save it with model.save('m.keras'), or pass the right format=")
        require_tf_device(device, format=NAME)
        model = load_keras_file(path, NAME, safe_mode=safe_mode, custom_objects=custom_objects)
        declare_input_specs(model, input_specs)
        return KerasModel(model, device=device, source=path)
    model = source
    if not is_keras_model(model) and callable(model) and (isinstance(model, type) or not hasattr(model, "weights")):
        model = model()  # a zero-argument factory (a Layer that is not a Model is refused below)
    if not is_keras_model(model):
        raise ModelLoadError(None, NAME, f"expected a keras.Model (or a factory returning one), got "
                             f"{type(model).__name__}", "pass a Keras model, or a path with format=")
    declare_input_specs(model, input_specs)
    return KerasModel(model, device=device)


def export(model: Any, path: Path, **options: Any) -> Path:
    """Save ``model`` as a Keras 3 ``.keras`` zip at ``path``."""
    return save_keras_file(model, path, NAME, (".keras",), **options)


def save_keras_file(model: Any, path: Path, format: str, suffixes: tuple[str, ...], **options: Any) -> Path:
    """``keras.saving.save_model`` to ``path``, whose suffix picks Keras' file format."""
    if path.suffix.lower() not in suffixes:
        raise ValueError(f"a {format} export path must end with {' or '.join(suffixes)}, got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if is_subclassed(model):
        return _save_subclassed(model, path, format, options)
    with quiet():
        import_keras().saving.save_model(model, str(path), **options)
    return path


def _save_subclassed(model: Any, path: Path, format: str, options: dict[str, Any]) -> Path:
    """Save a subclassed model and load it back: Keras writes one without complaint even when
    it cannot rebuild it (an unregistered class, an ``__init__`` its config does not fit), so
    such a file would fail only when read. That model cannot have this format: NotSerializable."""
    from ...errors import NotSerializable

    fix = ("register the class with @keras.saving.register_keras_serializable() and make get_config() "
           "return its __init__ arguments; the other formats (saved_model, graphdef, tflite, onnx, tfjs) "
           "trace the model and need neither")
    name = type(model).__name__
    try:
        with quiet():
            import_keras().saving.save_model(model, str(path), **options)
        load_keras_file(path, format, safe_mode=True, custom_objects=None)
    except Exception as exc:  # noqa: BLE001 - any failure means "does not serialise"
        path.unlink(missing_ok=True)
        why = exc.problem if isinstance(exc, ModelLoadError) else first_line(exc)
        raise NotSerializable(path, format, f"the subclassed model {name} does not serialise to {format} "
                              f"({why})", fix) from exc
    return path
