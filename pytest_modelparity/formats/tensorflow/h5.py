"""Format ``h5``: a legacy Keras HDF5 file (``model.save("m.h5")``).

Loaded with Keras like ``.keras`` and run the same way (``model(x, training=False)``).
Keras' legacy HDF5 loader does not honour ``safe_mode`` for Lambda layers (their code is
stored as marshalled bytecode), so this module refuses them itself unless
``safe_mode=False`` is passed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import ModelLoadError
from ...runtime.devices import require_tf_device
from ..common import first_line
from .graph import require_path
from .keras import KerasModel, load_keras_file, save_keras_file
from .keras_specs import declare_input_specs

NAME = "h5"
EXPORT_REQUIRES: tuple[tuple[str, str], ...] = (("h5py", "pip install h5py"),)
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def detect(path: Path) -> bool:
    return path.suffix.lower() in (".h5", ".hdf5", ".keras5") and path.is_file()


def _model_config(path: Path) -> str:
    """The JSON model config stored in the file's attributes ("" when there is none)."""
    import h5py

    try:
        with h5py.File(str(path), "r") as f:
            raw = f.attrs.get("model_config")
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(path, NAME, f"HDF5 could not read the file ({first_line(exc)})",
                             "the file is corrupt or truncated: re-save it with model.save('m.h5')") from exc
    if raw is None:
        raise ModelLoadError(path, NAME, "the HDF5 file holds no model_config: it has weights only "
                             "(save_weights) or was not written by Keras",
                             "build the model in code and call model.load_weights(path), then pass the model")
    return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)


def _has_lambda(config: str) -> bool:
    found = False

    def visit(node: Any) -> None:
        nonlocal found
        if isinstance(node, dict):
            if node.get("class_name") == "Lambda":
                found = True
            for v in node.values():
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)

    try:
        visit(json.loads(config))
    except ValueError:
        return '"Lambda"' in config
    return found


def load(source: Any, *, device: str = "cpu", safe_mode: bool = True,
         custom_objects: dict | None = None, input_specs: Any = None) -> KerasModel:
    path = require_path(Path(source), NAME)
    with open(path, "rb") as f:
        head = f.read(8)
    if head != _HDF5_MAGIC:
        raise ModelLoadError(path, NAME, "not an HDF5 file (its first bytes are not the HDF5 signature)",
                             "pass a file saved with model.save('m.h5'), or the right format=")
    config = _model_config(path)
    if safe_mode and _has_lambda(config):
        raise ModelLoadError(path, NAME, "the file holds a Lambda layer (Python bytecode), which is not "
                             "loaded by default because loading it runs that code",
                             "only if you trust this file: run pytest with --modelparity-trust-models, or give "
                             "safe_mode=False (or trusted=True) in load_model(...) or modelparity_load_options")
    require_tf_device(device, format=NAME)
    model = load_keras_file(path, NAME, safe_mode=safe_mode, custom_objects=custom_objects)
    declare_input_specs(model, input_specs)
    return KerasModel(model, device=device, source=path, format=NAME)


def export(model: Any, path: Path, **options: Any) -> Path:
    """Save ``model`` in the legacy HDF5 format at ``path`` (``.h5``); export_model then
    ``validate``s it (a model Keras' legacy loader cannot rebuild is refused, and removed)."""
    return save_keras_file(model, path, NAME, (".h5", ".hdf5"), **options)


def validate(path: Path) -> None:
    """Raise ExportError (and remove the file) unless Keras can load ``path`` back.

    Keras 3 saves some functional models to HDF5 that its legacy loader cannot rebuild: an
    ``Embedding(mask_zero=True)`` mask is stored as a ``NotEqual`` op layer it does not know.
    """
    from ...errors import ExportError

    try:
        load(path, safe_mode=False)
    except ModelLoadError as exc:
        path.unlink(missing_ok=True)
        raise ExportError(path, NAME, f"Keras' legacy HDF5 loader cannot load the file it wrote: {exc.problem}",
                          "save this model as .keras (format 'keras'); the legacy HDF5 format cannot carry it"
                          ) from exc
