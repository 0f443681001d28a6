"""Writing recordings: ``record_outputs`` (a form's outputs on a batch, with what produced them)
and ``write_inputs`` (the inputs an app outside Python reads, and the manifest its dump joins).

Every file is written atomically; an existing recording is never overwritten unless asked
(``overwrite=True``, the plugin's ``--modelparity-record-overwrite``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ...errors import InvalidArgumentError
from .arrays import atomic_write, tensors_json, write_npz
from .manifest import MANIFEST, VERSION
from .provenance import content_hash, form_of, produced_by

__all__ = ["Recording", "record_outputs", "write_inputs"]


def _named(model: Any, inputs: Any) -> dict[str, np.ndarray]:
    """``inputs`` keyed by the model's input names, as the model is fed them."""
    prepare = getattr(model, "prepare_batch", None)
    if callable(prepare):
        return {k: np.asarray(v) for k, v in prepare(inputs).items()}
    if isinstance(inputs, Mapping):
        return {str(k): np.asarray(v) for k, v in inputs.items()}
    try:  # a Keras model's input tensors name its inputs
        names = [str(getattr(t, "name", "")).split(":")[0] for t in (getattr(model, "inputs", None) or [])]
    except Exception:  # noqa: BLE001 - an unbuilt model has none
        names = []
    arrays = list(inputs) if isinstance(inputs, (list, tuple)) and inputs and \
        all(hasattr(v, "shape") for v in inputs) else [inputs]
    if len(names) != len(arrays) or not all(names):
        names = ["input"] if len(arrays) == 1 else [f"input_{i}" for i in range(len(arrays))]
    return {n: np.asarray(v) for n, v in zip(names, arrays)}


def _output_names(model: Any) -> list[str]:
    """A Keras model's output names (its output layers'), else none."""
    try:
        names = list(getattr(model, "output_names", None) or [])
        return [str(n) for n in names] or [str(getattr(t, "name", "")).split(":")[0].split("/")[0]
                                           for t in (getattr(model, "outputs", None) or [])]
    except Exception:  # noqa: BLE001 - an unbuilt model has none
        return []


def _as_outputs(result: Any, model: Any = None) -> dict[str, np.ndarray]:
    from ...verdict import tree
    from ...verdict.arrays import as_numpy as to_numpy

    if isinstance(result, Mapping):
        return {str(k): np.asarray(to_numpy(v)) for k, v in result.items()}
    leaves = list(tree.leaves(result)) if isinstance(result, (list, tuple)) else [("", result)]
    names = _output_names(model) if model is not None else []
    if len(names) == len(leaves) and all(names) and len(set(names)) == len(names):
        return {n: np.asarray(to_numpy(v)) for n, (_, v) in zip(names, leaves)}
    return {(p or "output"): np.asarray(to_numpy(v)) for p, v in leaves}


def _specs(arrays: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    return [{"name": k, "shape": [None, *a.shape[1:]] if a.ndim else [], "dtype": a.dtype.name}
            for k, a in arrays.items()]


def _same(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    return set(a) == set(b) and all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype and
                                    np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind in "fc") for k in a)


class Recording:
    """One form's recording folder, batch by batch: each ``add`` writes the batch's two files,
    then the manifest (so a run killed halfway leaves a recording of the batches it finished)."""

    def __init__(self, folder: str | Path, *, header: dict[str, Any], overwrite: bool = False) -> None:
        self.folder = Path(folder)
        if self.folder.exists() and any(self.folder.iterdir()):
            if not overwrite:
                raise InvalidArgumentError(
                    f"{self.folder} already holds a recording ({MANIFEST}); a recording is never overwritten "
                    "silently: pass overwrite=True (--modelparity-record-overwrite) or another folder")
            if not (self.folder / MANIFEST).exists():
                raise InvalidArgumentError(f"{self.folder} holds files but no {MANIFEST}; it is not a recording, so "
                                           "it is not replaced: choose an empty or new folder")
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.manifest: dict[str, Any] = {"modelparity_recording": VERSION, **header, "batches": []}
        self._inputs: list[dict[str, np.ndarray]] = []

    def add(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> bool:
        """Record one batch (False, nothing written, when these inputs were recorded already)."""
        inputs = {k: np.asarray(v) for k, v in inputs.items()}
        if any(_same(inputs, seen) for seen in self._inputs):
            return False
        i = len(self._inputs)
        files = {"inputs": f"batch-{i}.inputs.npz", "outputs": f"batch-{i}.outputs.npz"}
        write_npz(self.folder / files["inputs"], inputs)
        write_npz(self.folder / files["outputs"], outputs)
        rows = next((int(a.shape[0]) for a in inputs.values() if a.ndim), None)
        self.manifest["batches"].append({**files, "rows": rows})
        if not self.manifest.get("inputs"):
            self.manifest["inputs"] = _specs(inputs)
            self.manifest["outputs"] = _specs(outputs)
        self._inputs.append(inputs)
        self.write_manifest()
        return True

    def write_manifest(self) -> None:
        text = json.dumps(self.manifest, indent=1, sort_keys=False, default=_jsonable)
        atomic_write(self.folder / MANIFEST, (text + "\n").encode("utf-8"))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)


def header_for(model: Any, *, name: str | None = None, model_hash: str | None = None,
               binding: Any = None, floor: Any = None, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The manifest's description of ``model`` (all but its batches)."""
    binding_of = getattr(model, "binding_dict", None)
    if binding is None and not callable(binding_of) and getattr(model, "outputs", None) and \
            all(hasattr(s, "name") for s in model.outputs):  # a loaded form answering by its own names
        binding = {kind: [{"reference": s.name, "other": s.name, "basis": "same name", "how": ""}
                          for s in getattr(model, kind)] for kind in ("inputs", "outputs")}
    return {"model": {"name": name or str(getattr(model, "name", None) or getattr(model, "source", None) or
                                          type(model).__name__),
                      "content_hash": model_hash or content_hash(model)},
            "form": form_of(model), "produced_by": {**produced_by(model), **dict(extra or {})},
            "binding": binding if binding is not None else (binding_of() if callable(binding_of) else None),
            "floor": floor}


def record_outputs(model: Any, inputs: Any, path: str | Path, *, outputs: Any = None, overwrite: bool = False,
                   name: str | None = None, model_hash: str | None = None, floor: Any = None,
                   produced_by: Mapping[str, Any] | None = None, form: Mapping[str, Any] | None = None) -> Path:
    """Run ``model`` on ``inputs`` (or take the ``outputs`` it gave elsewhere) and write a
    recording at ``path``; return the folder, which ``load_model`` opens as a form. ``form``
    overrides what the manifest says ran (``{"device": "gpu:0", "device_name": ...}``),
    ``floor`` ({output: {"float64": error}}) keeps the reference's measured float32 error."""
    named = _named(model, inputs)
    result = outputs if outputs is not None else model(inputs)
    header = header_for(model, name=name, model_hash=model_hash, floor=floor, extra=produced_by)
    header["form"].update(dict(form or {}))
    recording = Recording(path, header=header, overwrite=overwrite)
    recording.add(named, _as_outputs(result, model))
    return recording.folder


def write_inputs(inputs: Any, path: str | Path, *, model: Any = None, format: str = "tfjs", device: str = "cpu",
                 outputs_file: str = "outputs.json", overwrite: bool = False) -> Path:
    """Write ``inputs`` for an app outside Python to read (``inputs.json``, and ``.npz``), with a
    manifest whose batch expects the app's dump in ``outputs_file`` (docs/recorded.md). Once the
    app has written it, ``load_model(path)`` opens the folder as a recorded form."""
    named = _named(model, inputs) if model is not None else _as_outputs(inputs)
    folder = Path(path)
    if (folder / MANIFEST).exists() and not overwrite:
        raise InvalidArgumentError(f"{folder} already holds a recording; pass overwrite=True or another folder")
    folder.mkdir(parents=True, exist_ok=True)
    write_npz(folder / "batch-0.inputs.npz", named)
    atomic_write(folder / "inputs.json", json.dumps(tensors_json(named)).encode("utf-8"))
    header = header_for(model) if model is not None else {"model": {}, "binding": None, "floor": None,
                                                          "produced_by": {}}
    header["form"] = {"format": format.split(":")[0], "variant": format, "device": device}
    header["produced_by"] = {}  # the app says what ran it, in its dump
    manifest = {"modelparity_recording": VERSION, **header, "inputs": _specs(named), "outputs": [],
                "batches": [{"inputs": "batch-0.inputs.npz", "outputs": outputs_file,
                             "rows": next((int(a.shape[0]) for a in named.values() if a.ndim), None)}]}
    atomic_write(folder / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode("utf-8"))
    return folder
