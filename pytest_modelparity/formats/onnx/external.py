"""ONNX external data: read from the model's own folder only, never from outside it.

Why: an ONNX model may keep its initializers in separate files named by a ``location`` in the
protobuf. Given the model's bytes, onnxruntime (and ``onnx.numpy_helper``) resolve a location
against the *current directory*: run from a folder holding another ``ok.bin``, the model
loaded that file's weights, silently. Every location is therefore checked against the model
file's folder before a session is made (relative, no ``..``, resolved through links still
inside the folder, a regular file), and onnxruntime is told that folder
(``session.model_external_initializers_file_folder_path``), so what it reads is what was
checked. Without the ``onnx`` package the locations cannot be listed here; onnxruntime's own
check (it refuses absolute and escaping paths once it knows the folder) is then translated.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Iterator

from ...errors import ModelLoadError
from .._files import special_kind

__all__ = ["FOLDER_KEY", "check_external_data", "folder_options", "ort_external_error"]

NAME = "onnx"
# onnxruntime's session config key for the folder external data is resolved against.
FOLDER_KEY = "session.model_external_initializers_file_folder_path"
_FIX = ("keep the external data files beside the .onnx file (or in a folder under it) and name them by a "
        "relative location, e.g. re-save with onnx.save_model(model, path, save_as_external_data=True, "
        "location='weights.bin')")


def _tensors(graph: Any) -> Iterator[Any]:
    """Every TensorProto of ``graph``: initializers, sparse ones, and those in node attributes
    and subgraphs (If/Loop/Scan bodies)."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _tensors(attribute.g)
            for sub in attribute.graphs:
                yield from _tensors(sub)


def _locations(content: bytes) -> list[tuple[str, str]] | None:
    """``(tensor name, location)`` of every tensor kept in external data; None when this cannot
    be told here (no ``onnx`` package, or bytes it cannot parse: onnxruntime says why)."""
    if b"location" not in content:  # the key every external-data entry has: no parse of a plain model
        return []
    try:
        import onnx
    except ImportError:
        return None
    try:
        proto = onnx.load_model_from_string(content)
    except Exception:  # noqa: BLE001 - a protobuf onnx cannot parse: onnxruntime's own error follows
        return None
    found = []
    for tensor in _tensors(proto.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {entry.key: entry.value for entry in tensor.external_data}
            found.append((tensor.name, entries.get("location", "")))
    for function in proto.functions:
        for node in function.node:
            for attribute in node.attribute:
                if attribute.HasField("t") and attribute.t.data_location == onnx.TensorProto.EXTERNAL:
                    entries = {entry.key: entry.value for entry in attribute.t.external_data}
                    found.append((attribute.t.name, entries.get("location", "")))
    return found


def _refused(path: Path, tensor: str, location: str, why: str, fix: str = _FIX) -> ModelLoadError:
    return ModelLoadError(path, NAME, f"the external data of initializer {tensor!r} is at location "
                          f"{location!r}, which {why}; external data is read only from the model's own "
                          f"folder ({path.parent})", fix)


def check_external_data(path: Path, content: bytes) -> bool | None:
    """Refuse (``ModelLoadError``) any external-data location that is absolute, climbs out with
    ``..``, leads outside the model's folder through a link, is missing, or is not a regular
    file. Returns whether the model uses external data (None: unknown, no ``onnx`` package)."""
    locations = _locations(content)
    if locations is None:
        return None
    folder = Path(os.path.realpath(path.parent))
    for tensor, location in locations:
        if not location:
            raise _refused(path, tensor, location, "is empty")
        if os.path.isabs(location) or Path(location).is_absolute() or location.startswith(("\\", "/")):
            raise _refused(path, tensor, location, "is an absolute path")
        if ".." in Path(location.replace("\\", "/")).parts:
            raise _refused(path, tensor, location, "climbs out of the model's folder with '..'")
        target = Path(os.path.realpath(folder / location))
        if target != folder and folder not in target.parents:
            raise _refused(path, tensor, location, f"leads outside it through a link (to {target})")
        try:
            mode = os.stat(target).st_mode
        except OSError as exc:
            raise _refused(path, tensor, location, f"cannot be read ({exc.strerror or exc})",
                           "copy the external data file(s) saved with the model into the model's folder") from exc
        kind = special_kind(mode) or (None if stat.S_ISREG(mode) else "not a regular file")
        if kind is not None:
            raise _refused(path, tensor, location, f"is {kind}, not a regular file",
                           "put the external data file itself there (a pipe or device could block or never end)")
    return bool(locations)


def folder_options(path: Path, session_options: Any, uses_external: bool | None) -> Any:
    """Session options that make onnxruntime resolve external data against ``path``'s folder
    (the user's options, with that one entry added, when the model has external data)."""
    if uses_external is False:
        return session_options
    import onnxruntime as ort

    options = session_options if session_options is not None else ort.SessionOptions()
    folder = os.path.realpath(path.parent)
    try:
        current = options.get_session_config_entry(FOLDER_KEY)
    except Exception:  # noqa: BLE001 - onnxruntime raises when the key is not set
        current = None
    if current != folder:
        options.add_session_config_entry(FOLDER_KEY, folder)
    return options


def ort_external_error(path: Path, exc: BaseException) -> ModelLoadError | None:
    """onnxruntime's refusal of an external-data path, in our words (None: another error)."""
    text = str(exc)
    if "External data path" not in text and "external data" not in text.lower():
        return None
    detail = text.split("Error:", 1)[-1].strip().splitlines()[0] if "Error:" in text else text.splitlines()[0]
    return ModelLoadError(path, NAME, f"onnxruntime refused the model's external data: {detail[:300]}; external "
                          f"data is read only from the model's own folder ({path.parent})", _FIX)
