"""A recording's manifest (``modelparity-recording.json``): what a person reads, what an app
writes, what the loader trusts only after checking (docs/recorded.md is its reference).

    {"modelparity_recording": 1,
     "model": {"name": ..., "content_hash": "sha256:..."},
     "form": {"format": "tflite", "variant": "tflite:float16", "device": "cpu", "device_name": ...},
     "produced_by": {"tensorflow": "2.21.0", "tfjs": "4.22.0", "browser": ..., ...},
     "inputs": [{"name", "shape", "dtype"}], "outputs": [...],
     "binding": {...} | null, "floor": {output: {"float64": error}} | null,
     "batches": [{"inputs": "batch-0.inputs.npz", "outputs": "batch-0.outputs.npz", "rows": 4}]}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import ModelLoadError
from .arrays import FORMAT, check_shape, json_file, member

__all__ = ["MANIFEST", "VERSION", "is_recording", "manifest_path", "read_manifest"]

MANIFEST = "modelparity-recording.json"
VERSION = 1
MAX_BATCHES = 1000
MAX_TENSORS = 256


def manifest_path(path: str | Path) -> Path | None:
    """The manifest ``path`` is, or holds; None when it is not a recording."""
    p = Path(path)
    if p.name == MANIFEST:
        return p
    if p.is_dir() and (p / MANIFEST).exists():
        return p / MANIFEST
    return None


def is_recording(path: str | Path) -> bool:
    return manifest_path(path) is not None


def _bad(path: Path, problem: str, fix: str = "see docs/recorded.md for the manifest format") -> ModelLoadError:
    return ModelLoadError(path, FORMAT, problem, fix)


def _specs(path: Path, raw: Any, what: str) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_TENSORS:
        raise _bad(path, f"'{what}' must be a list of at most {MAX_TENSORS} {{name, shape, dtype}} entries")
    out = []
    for spec in raw:
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise _bad(path, f"an entry of '{what}' is {spec!r}; each is {{\"name\", \"shape\", \"dtype\"}}")
        shape = spec.get("shape", [])
        if not isinstance(shape, list) or not all(d is None or (isinstance(d, int) and d >= 0) for d in shape):
            raise _bad(path, f"{what} {spec['name']!r} has shape {shape!r}; a list of ints (null: any size)")
        check_shape(path, spec["name"], [1 if d is None else d for d in shape])
        out.append({"name": spec["name"], "shape": shape, "dtype": str(spec.get("dtype", "float32"))})
    return out


def read_manifest(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """(the recording's folder, its checked manifest); ``ModelLoadError`` naming what is wrong."""
    found = manifest_path(path)
    if found is None:
        raise _bad(Path(path), f"no {MANIFEST} here", "pass a recording's folder (one holding its manifest)")
    folder = found.parent
    found = member(folder, MANIFEST, "the manifest")
    data = json_file(found)
    if not isinstance(data, dict) or data.get("modelparity_recording") != VERSION:
        got = data.get("modelparity_recording") if isinstance(data, dict) else None
        raise _bad(found, f"'modelparity_recording' is {got!r}; this plugin reads version {VERSION}",
                   "write \"modelparity_recording\": 1 (or record again with this version of the plugin)")
    batches = data.get("batches")
    if not isinstance(batches, list) or not batches or len(batches) > MAX_BATCHES:
        raise _bad(found, f"'batches' must list 1 to {MAX_BATCHES} batches, each "
                   "{\"inputs\": file, \"outputs\": file}")
    checked = []
    for i, batch in enumerate(batches):
        if not isinstance(batch, dict):
            raise _bad(found, f"batch {i} is {batch!r}; each is {{\"inputs\": file, \"outputs\": file}}")
        for key in ("inputs", "outputs"):
            member(folder, batch.get(key), f"batch {i}'s {key} file")  # plain names inside the folder
        checked.append({"inputs": batch["inputs"], "outputs": batch["outputs"], "rows": batch.get("rows")})
    form: dict[str, Any] = data["form"] if isinstance(data.get("form"), dict) else {}
    model: dict[str, Any] = data["model"] if isinstance(data.get("model"), dict) else {}
    clean = dict(data)
    clean.update({"batches": checked, "form": {"format": str(form.get("format") or "unknown"),
                                                "variant": form.get("variant"), **{k: v for k, v in form.items()
                                                                                 if k not in ("format", "variant")}},
                  "model": model, "inputs": _specs(found, data.get("inputs"), "inputs"),
                  "outputs": _specs(found, data.get("outputs"), "outputs")})
    return folder, clean
