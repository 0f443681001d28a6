"""``--modelparity-record=DIR`` and ``--modelparity-against=DIR``: a run's forms written as
recordings, and a later run's forms compared with them (docs/recorded.md).

Each model and form a test ran (the reference and every candidate the fixtures served) is one
recording folder, ``DIR/<model>/<form>@<device>/``, holding every distinct batch it answered.
Against a recording, each output is said identical, changed within float noise (the bound the
recorded reference's float32 error allows) or changed beyond it, which fails the run; a model
whose content hash differs is said and not compared.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

__all__ = ["Against", "Recorder", "folder_for", "mark_origin", "watch_run"]

ORIGIN = "modelparity_origin"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "model"


def folder_for(root: Path, origin: dict[str, Any]) -> Path:
    """``root/<model>/<form>@<device>``, each part a plain name."""
    return root / _safe(origin["model"]) / f"{_safe(origin['form'])}@{_safe(origin['device'])}"


_HASHES: dict[int, str | None] = {}


def mark_origin(model: Any, source: Any, label: str, form: str, device: str) -> None:
    """Tag a served model with what it is a form of, so the watchers can file what it answers."""
    from ..formats.recorded.provenance import content_hash, file_hash

    key = id(source)
    if key not in _HASHES:
        _HASHES[key] = (content_hash(source.keras_model) if source.keras_model is not None else
                        file_hash(Path(source.path)) if source.path is not None else None)
    named = str(getattr(source.keras_model, "name", "") or "")
    if named and not re.fullmatch(r"(functional|sequential|model)(_\d+)?", named):
        label = named  # Keras numbers unnamed models per process: their name would not find the recording again
    try:
        setattr(model, ORIGIN, {"model": Path(label).name if "/" in label else label, "content_hash": _HASHES[key],
                                "form": form, "device": device})
    except AttributeError:
        pass


def _named_outputs(model: Any, outputs: Any) -> dict[str, np.ndarray] | None:
    if isinstance(outputs, dict) and all(isinstance(v, np.ndarray) for v in outputs.values()):
        return {str(k): v for k, v in outputs.items()}
    return None


def _floor_by_name(floor: Any, names: list[str]) -> dict[str, dict[str, float]] | None:
    """The assertion's floor ({"['probs']": {...}} or {"": {...}} for one output) by output name."""
    if not isinstance(floor, dict):
        return None
    out = {}
    for path, kinds in floor.items():
        m = re.fullmatch(r"\['(.*)'\]", str(path))
        name = m.group(1) if m else (names[0] if path == "" and len(names) == 1 else None)
        if name is not None and isinstance(kinds, dict):
            out[name] = {str(k): float(v) for k, v in kinds.items() if isinstance(v, (int, float))}
    return out or None


@dataclass
class Recorder:
    """Writes what each tagged model answered under ``root`` (never over an earlier run's)."""

    root: Path
    overwrite: bool = False
    recordings: dict[Path, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    session: str = field(default_factory=lambda: uuid.uuid4().hex)  # stamped on every form this run writes
    failed: set[Path] = field(default_factory=set)
    record: Path | None = None  # the run's record, once written (last)

    def check_start(self) -> None:
        """An existing recording under ``root`` is refused at start-up unless overwriting."""
        if self.overwrite or not self.root.exists():
            return
        if not self.root.is_dir():
            raise pytest.UsageError(f"--modelparity-record={self.root}: this is a file; pass a directory")
        found = next(self.root.rglob("modelparity-recording.json"), None)
        if found is not None:
            raise pytest.UsageError(
                f"--modelparity-record={self.root}: it already holds recordings ({found}); recordings are never "
                "overwritten silently: add --modelparity-record-overwrite, or record into another directory")

    def __call__(self, model: Any, inputs: Any, outputs: Any, floor: Any) -> None:
        origin = getattr(model, ORIGIN, None)
        named = _named_outputs(model, outputs)
        if origin is None or (named is None and floor is None):
            return
        from ..formats.recorded.write import Recording, header_for

        folder = folder_for(self.root, origin)
        try:
            rec = self.recordings.get(folder)
            if rec is None:
                header = header_for(model, name=origin["model"], model_hash=origin["content_hash"])
                rec = Recording(folder, overwrite=self.overwrite, header={**header, "session": self.session})
                self.recordings[folder] = rec
            if named is not None:
                rec.add(model.prepare_batch(inputs), named)
            if floor is not None and rec.manifest.get("floor") is None:
                rec.manifest["floor"] = _floor_by_name(floor, [s["name"] for s in rec.manifest.get("outputs") or []])
                rec.write_manifest()
        except Exception as exc:  # noqa: BLE001 - a recording that cannot be written is said at the end
            self.errors.append(f"{folder}: {type(exc).__name__}: {exc}")
            self.failed.add(folder)

    def finish(self, interrupted: bool = False) -> None:
        """Write the run's record of the forms it recorded whole, atomically and last
        (formats/recorded/session.py): without it the recording is refused as incomplete. An
        interrupted run (Ctrl-C) writes none: what it recorded is not all it meant to."""
        if not self.recordings and not self.errors:
            return
        if interrupted:
            self.errors.append(f"{self.root}: the run was interrupted, so its record was not written: the "
                               "recording is incomplete (refused by load_model and --modelparity-against)")
            return
        from ..formats.recorded.session import write_session

        whole = {f"{folder.parent.name}/{folder.name}": len(rec.manifest["batches"])
                 for folder, rec in self.recordings.items() if folder not in self.failed}
        try:
            self.record = write_session(self.root, self.session, whole, self.errors)
        except OSError as exc:
            self.errors.append(f"{self.root}: the run's record cannot be written ({type(exc).__name__}: {exc}): "
                               "the recording is incomplete")

    def summary(self) -> list[str]:
        whole = len(self.recordings) - len(self.failed)
        lines = [f"recorded {whole} form(s) into {self.root}"] if self.recordings and self.record else []
        return lines + [f"NOT RECORDED {e}" for e in self.errors]


@dataclass
class Against:
    """Compares what each tagged model answers with its recording under ``root``."""

    root: Path
    lines: dict[tuple[str, str], str] = field(default_factory=dict)
    changed: int = 0  # outputs changed beyond float noise
    missing: int = 0  # forms or outputs on one side only, recordings that cannot be read
    _loaded: dict[Path, Any] = field(default_factory=dict)
    recorded: dict[str, Any] = field(default_factory=dict)  # what the recording run's record lists
    ran: set[str] = field(default_factory=set)  # the forms this run executed ("model/form@device")
    pending: list[str] = field(default_factory=list)  # changes beyond noise the running test has not failed on yet

    def check_start(self) -> None:
        """The folder must be a whole recording: its run's record says which forms it holds."""
        from ..formats.recorded.session import SESSION, read_session

        if not self.root.is_dir():
            raise pytest.UsageError(f"--modelparity-against={self.root}: no such directory; pass the directory an "
                                    "earlier run wrote with --modelparity-record")
        forms = read_session(self.root)
        if forms is None:
            raise pytest.UsageError(
                f"--modelparity-against={self.root}: an incomplete recording: it holds no readable {SESSION}, the "
                "record a recording run writes last (the run was killed, its disk filled, or a plugin before issue "
                "48 wrote it), so forms or batches may be missing; record again with --modelparity-record and let "
                "the run finish")
        self.recorded = forms

    def finish(self) -> None:
        """A form this run executed that the recording lacks, or one recorded that this run did
        not execute, is named and fails the run."""
        for name in sorted(set(self.recorded) - self.ran):
            self.lines[(name.replace("/", " "), "")] = (f"{name.replace('/', ' ')}: recorded in {self.root} but not "
                                                        "run this time")
            self.missing += 1

    def _recording(self, folder: Path) -> Any:
        if folder not in self._loaded:
            from ..formats.recorded import load

            self._loaded[folder] = load(folder) if (folder / "modelparity-recording.json").exists() else None
        return self._loaded[folder]

    def __call__(self, model: Any, inputs: Any, outputs: Any, floor: Any) -> None:
        origin = getattr(model, ORIGIN, None)
        named = _named_outputs(model, outputs)
        if origin is None or named is None:
            return
        where = f"{origin['model']} {origin['form']}@{origin['device']}"
        folder = folder_for(self.root, origin)
        self.ran.add(f"{folder.parent.name}/{folder.name}")
        try:
            recorded = self._recording(folder)
        except Exception as exc:  # noqa: BLE001 - a damaged recording fails the test that ran the form
            self.lines[(where, "")] = f"{where}: the recording cannot be read: {exc}"
            self.missing += 1
            self.pending.append(self.lines[(where, "")])
            return
        if recorded is None:
            self.lines[(where, "")] = f"{where}: run this time but not recorded in {self.root} (not compared)"
            self.missing += 1
            self.pending.append(self.lines[(where, "")])
            return
        if recorded.model_hash and origin["content_hash"] and recorded.model_hash != origin["content_hash"]:
            self.lines[(where, "")] = (f"{where}: the model changed (content hash {recorded.model_hash[:19]}... "
                                       f"recorded, {origin['content_hash'][:19]}... now): not compared")
            return
        try:
            then = recorded.predict(model.prepare_batch(inputs))
        except Exception:  # noqa: BLE001 - other inputs than recorded: said once
            self.lines.setdefault((where, "?"), f"{where}: a batch that was not recorded (not compared)")
            return
        self._judge(where, recorded, named, then, recorded.floor or self._model_floor(folder.parent))

    def _model_floor(self, model_folder: Path) -> dict:
        """The reference's floor, kept in its own recording beside this model's other forms."""
        for manifest in sorted(model_folder.glob("*/modelparity-recording.json")):
            try:
                recorded = self._recording(manifest.parent)
            except Exception:  # noqa: BLE001 - another form's damaged recording is said where it is compared
                continue
            if recorded is not None and isinstance(recorded.floor, dict):
                return recorded.floor
        return {}

    def _judge(self, where: str, recorded: Any, now: dict[str, np.ndarray], then: dict[str, np.ndarray],
               floors: dict) -> None:
        from ..verdict import tolerances as tol
        from ..verdict.compare import compare

        device, form = recorded.device, recorded.format_variant
        changed: dict[str, Any] = {}
        for name in sorted(set(now) | set(then)):
            if name not in now or name not in then:
                self.lines[(where, name)] = f"{where} output {name!r}: {'gone' if name in then else 'new'} (not compared)"
                self.missing += 1
                self.pending.append(self.lines[(where, name)])
                continue
            a, e = now[name], then[name]
            measured = (floors.get(name) or {}).get("float64")
            if e.dtype.kind == "f" and measured is not None:
                rule = tol.shadow_tolerance(e.dtype, measured, device=device, format=form)
            else:
                rule = tol.default_tolerance(e.dtype, device=device, format=form)
            out = compare(a, e, tolerance=rule).outputs[0]
            bound = out.tolerance.source if out.tolerance is not None else "exact"
            if a.shape == e.shape and a.dtype == e.dtype and np.array_equal(a, e, equal_nan=a.dtype.kind in "fc"):
                verdict = "identical"
            elif out.passed:
                verdict = f"changed within float noise ({_share(out)}; bound: {bound})"
            else:
                verdict = f"CHANGED beyond float noise ({_share(out)}; bound: {bound})"
                self.changed += 1
                changed[name] = out
            self.lines[(where, name)] = f"{where} output {name!r}: {verdict}"
        causes = named_changes(now, then, changed)
        for name in changed:
            if name in causes:
                self.lines[(where, name)] += f"; likely (actual: this run, expected: the recording): {causes[name]}"
            self.pending.append(self.lines[(where, name)])

    def take_pending(self) -> list[str]:
        """What the test that just ran changed beyond noise, once (the plugin fails that test)."""
        found, self.pending = list(dict.fromkeys(self.pending)), []
        return found

    @property
    def failures(self) -> int:
        return self.changed + self.missing

    def summary(self) -> list[str]:
        head = f"against {self.root}: {self.changed} change(s) beyond float noise"
        if self.missing:
            head += f", {self.missing} form(s) or output(s) on one side only or unreadable"
        return [head] + [self.lines[k] for k in sorted(self.lines)]


def named_changes(now: dict[str, np.ndarray], then: dict[str, np.ndarray], changed: dict[str, Any]) -> dict[str, str]:
    """{output: the cause} for the outputs that changed beyond noise, as the library names them
    from arrays alone: outputs exchanged (this run's `a` is the recording's `b`), then a
    transform of the recorded output (a scale, a shift, a softmax applied twice)."""
    from ..diagnose.outputs import output_swap
    from ..diagnose.transforms import output_transform

    if not changed:
        return {}
    tolerances = {name: out.tolerance for name, out in changed.items()}
    swap = output_swap(now, then, list(changed), tolerances)
    if swap is not None:
        return {name: swap[1] for name in changed}
    found = {}
    for name, out in changed.items():
        got = output_transform(now[name], then[name], out.tolerance)
        if got is not None:
            found[name] = got[1]
    return found


def _share(out: Any) -> str:
    if out.max_abs is None or not out.scale:
        return out.problem or "not a float output"
    return f"max |now - recorded| {out.max_abs / out.scale:.2g} of scale"


def watch_run(config: pytest.Config, state: Any) -> None:
    """Start recording and/or comparing for this run (checked first: refused with a usage error)."""
    from ..checks import observers

    options = state.options
    if getattr(config.option, "numprocesses", None) and getattr(config, "workerinput", None) is None:
        raise pytest.UsageError("--modelparity-record/--modelparity-against run in one process: drop -n (xdist "
                                "workers would write the same recordings)")
    if options.record is not None:
        state.recorder = Recorder(Path(options.record), overwrite=options.record_overwrite)
        state.recorder.check_start()
        observers.watch(state.recorder)
    if options.against is not None:
        state.against = Against(Path(options.against))
        state.against.check_start()
        observers.watch(state.against)

    def stop() -> None:
        for watcher in (state.recorder, state.against):
            if watcher is not None:
                observers.unwatch(watcher)

    config.add_cleanup(stop)
