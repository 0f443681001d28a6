"""A recorded run as a form: a ``LoadedModel`` that answers its recorded inputs with its
recorded outputs and refuses any other batch (it cannot run).

Why a form: a GPU run, a phone's run, a browser's or last release's is then judged by
``assert_outputs_close(recorded, reference, inputs=recorded.inputs_batch)``, the same verdict,
floor and diagnosis as a form run here (the diagnosis skips what needs to run it, and says so).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ...errors import BatchMismatchError, ModelLoadError
from ..base import LoadedModel, TensorSpec
from .arrays import FORMAT, json_file, member, read_tensors, tensors_from_json
from .manifest import is_recording, read_manifest
from .session import check_whole

__all__ = ["NAME", "RecordedModel", "detect", "load"]

NAME = FORMAT


def detect(path: Path) -> bool:
    """A folder holding ``modelparity-recording.json``, or that file itself."""
    return is_recording(path)


def _specs(declared: list[dict[str, Any]], arrays: dict[str, np.ndarray]) -> list[TensorSpec]:
    """The manifest's specs (batch dim unknown), else those of the first batch's arrays."""
    if declared:
        return [TensorSpec(s["name"], [None, *s["shape"][1:]] if s["shape"] else [], s["dtype"]) for s in declared]
    return [TensorSpec(name, [None, *arr.shape[1:]] if arr.ndim else [], arr.dtype) for name, arr in arrays.items()]


def _differs(given: np.ndarray, recorded: np.ndarray) -> str | None:
    """How ``given`` differs from a recorded input, or None when it is the same array."""
    if given.shape != recorded.shape:
        return f"shape {given.shape} where {recorded.shape} was recorded"
    if given.dtype.kind == "f" or recorded.dtype.kind == "f":
        a, b = given.astype(np.float64), recorded.astype(np.float64)
        same = (a == b) | (np.isnan(a) & np.isnan(b))
    else:
        same = given == recorded
    if bool(np.all(same)):
        return None
    bad = int(same.size - np.count_nonzero(same))
    worst = ""
    if given.dtype.kind in "fiu" and recorded.dtype.kind in "fiu":
        worst = f", the largest by {float(np.nanmax(np.abs(given.astype(np.float64) - recorded.astype(np.float64)))):.3g}"
    return f"{bad} of {same.size} values differ{worst}"


class RecordedModel(LoadedModel):
    """The outputs a form gave on recorded inputs, answered without running anything."""

    # Diagnosis and the assertions read it: checks that would run this candidate (more rows,
    # reruns, the layer table) are skipped and said so.
    replays_recording: bool = True

    def __init__(self, folder: Path, manifest: dict[str, Any], batches: list[tuple[dict, str, dict | None]],
                 *, device: str | None = None) -> None:
        self.folder = folder
        self.manifest = manifest
        self._batches = batches  # (inputs, outputs file name, outputs once read)
        first_inputs = batches[0][0]
        form = manifest["form"]
        super().__init__(device=device or str(form.get("device") or "cpu"),
                         inputs=_specs(manifest["inputs"], first_inputs),
                         outputs=_specs(manifest["outputs"], self._outputs(0)), source=folder)
        self.format = NAME
        self.recorded_format = str(form.get("format"))
        # What decides the default tolerance is the form that ran (tflite:float16 on a phone is
        # judged as tflite:float16), and the device it ran on.
        self.format_variant = str(form.get("variant") or form.get("format"))
        self.produced_by = dict(manifest.get("produced_by") or {})
        self.model_hash = (manifest.get("model") or {}).get("content_hash")
        self.floor = manifest.get("floor")

    @property
    def inputs_batch(self) -> dict[str, np.ndarray]:
        """The first recorded batch's inputs by name (read-only): what to compare on."""
        return self._batches[0][0]

    @property
    def input_batches(self) -> list[dict[str, np.ndarray]]:
        return [b[0] for b in self._batches]

    def describe(self) -> str:
        form = self.manifest["form"]
        name = form.get("device_name")
        return (f"recorded {self.format_variant} on {self.device}{f' ({name})' if name else ''}"
                f" ({self.folder})")

    def _outputs(self, index: int) -> dict[str, np.ndarray]:
        inputs, name, outputs = self._batches[index]
        if outputs is None:
            outputs = read_tensors(member(self.folder, name, f"batch {index}'s outputs file"))
            for arr in outputs.values():
                arr.setflags(write=False)
            self._batches[index] = (inputs, name, outputs)
        return outputs

    def _predict(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        problems = []
        for index, (recorded, _, _) in enumerate(self._batches):
            found = [f"input {k!r}: {why}" for k in recorded
                     if (why := _differs(feeds[k], recorded[k]) if k in feeds else "missing") is not None]
            if not found:
                return {k: np.array(v) for k, v in self._outputs(index).items()}
            problems.append(f"batch {index}: {found[0]}")
        raise BatchMismatchError(
            f"{self.describe()}: a recorded run cannot run; it answers only the inputs it recorded, and this "
            f"batch is none of them ({'; '.join(problems[:3])}).\n  fix: compare on the recorded inputs: "
            "assert_outputs_close(recorded, reference, inputs=recorded.inputs_batch)")


def _inputs_of(folder: Path, index: int, batch: dict[str, Any]) -> dict[str, np.ndarray]:
    arrays = read_tensors(member(folder, batch["inputs"], f"batch {index}'s inputs file"))
    for arr in arrays.values():
        arr.setflags(write=False)
    return arrays


def _check_dump_inputs(folder: Path, index: int, batch: dict[str, Any], recorded: dict[str, np.ndarray]) -> dict:
    """An app's JSON dump that echoes the inputs it was fed must have been fed the recorded ones;
    returns what the dump says produced it (``produced_by``), else {}."""
    name = batch["outputs"]
    if not str(name).lower().endswith(".json"):
        return {}
    path = member(folder, name, f"batch {index}'s outputs file")
    data = json_file(path)
    said: dict = data["produced_by"] if isinstance(data, dict) and isinstance(data.get("produced_by"), dict) else {}
    echoed = data.get("inputs") if isinstance(data, dict) and isinstance(data.get("outputs"), dict) else None
    if not isinstance(echoed, dict):
        return said
    fed = tensors_from_json(path, echoed)
    for key, arr in recorded.items():
        got = fed.get(key)
        why = "not in the dump" if got is None else _differs(got, arr)
        if why is not None:
            raise ModelLoadError(path, FORMAT, f"the dump's inputs are not the recorded ones (input {key!r}: {why}): "
                                 "its outputs answer other inputs, so they cannot be compared",
                                 f"feed the app the recorded inputs ({batch['inputs']} beside the manifest) and dump again")
    return said


def load(source: Any, *, device: str = "cpu", **options: Any) -> RecordedModel:
    """Open a recording (its folder or manifest). ``device`` is where the recording ran (its
    manifest says so); a different ``device=`` overrides it only when given explicitly."""
    if options:
        raise TypeError(f"a recorded run takes no load options (got {', '.join(sorted(options))})")
    folder, manifest = read_manifest(source)
    check_whole(folder, manifest)  # a form a recording run wrote is whole only once its run's record lists it
    batches: list[tuple[dict, str, dict | None]] = []
    said: dict[str, Any] = {}
    for index, batch in enumerate(manifest["batches"]):
        inputs = _inputs_of(folder, index, batch)
        said.update(_check_dump_inputs(folder, index, batch, inputs))
        batches.append((inputs, batch["outputs"], None))
    model = RecordedModel(folder, manifest, batches, device=None if device == "cpu" else device)
    model.produced_by.update({str(k): v for k, v in said.items() if isinstance(v, (str, int, float, bool))})
    model._outputs(0)  # a missing or damaged first outputs file is said at load, not at compare
    return model
