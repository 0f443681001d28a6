"""A recording run's record of what it recorded (``modelparity-session.json``), written
atomically and last: the proof a recording folder is whole (issue 48).

Why: each form's manifest is rewritten after each batch, so a run killed halfway (or whose disk
filled) leaves folders that read as recordings of fewer batches or forms than the run made, and
``--modelparity-against`` would compare what is there and pass. The plugin's recorder stamps
every form it writes with its run's id (manifest key ``session``) and, when the run ends, writes
``<root>/modelparity-session.json``:

    {"modelparity_session": 1,
     "forms": {"tiny/tflite@cpu": {"session": "<id>", "batches": 1}, ...},
     "not_recorded": ["tiny/tfjs@cpu: OSError: ..."]}

A stamped form is whole only when that record lists it, with its run's id and as many batches as
its manifest. A recording written by ``record_outputs`` or by an app carries no stamp and is read
as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import ModelLoadError
from .arrays import FORMAT, atomic_write

__all__ = ["SESSION", "check_whole", "read_session", "write_session"]

SESSION = "modelparity-session.json"
VERSION = 1
_FIX = "record again (pytest --modelparity-record=DIR --modelparity-record-overwrite) and let the run finish"


def read_session(root: Path) -> dict[str, dict[str, Any]] | None:
    """The forms ``root``'s record lists (``{"model/form@device": {"session", "batches"}}``), or
    None when there is no readable record."""
    path = Path(root) / SESSION
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 16 << 20:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # nested past Python's stack: not our record
        return None
    if not isinstance(data, dict) or data.get("modelparity_session") != VERSION or not isinstance(data.get("forms"), dict):
        return None
    return {str(k): v for k, v in data["forms"].items() if isinstance(v, dict)}


def write_session(root: Path, session: str, forms: dict[str, int], not_recorded: list[str]) -> Path:
    """Write the record of this run's ``forms`` (folder relative to ``root`` -> batches), keeping
    what an earlier record says of folders this run did not write (``--modelparity-record-overwrite``
    replaces only the forms it runs). Atomic: a reader finds the old record or the new one."""
    kept = {k: v for k, v in (read_session(root) or {}).items() if k not in forms}
    record = {"modelparity_session": VERSION,
              "forms": {**kept, **{k: {"session": session, "batches": n} for k, n in sorted(forms.items())}},
              "not_recorded": list(not_recorded)}
    path = Path(root) / SESSION
    atomic_write(path, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    return path


def check_whole(folder: Path, manifest: dict[str, Any]) -> None:
    """Refuse a form a recording run stamped (``manifest["session"]``) that its run's record,
    two folders up, does not list whole; the message names what is missing."""
    session = manifest.get("session")
    if session is None:
        return
    root = folder.parent.parent
    name = f"{folder.parent.name}/{folder.name}"
    forms = read_session(root)
    if forms is None:
        raise ModelLoadError(folder, FORMAT, f"an incomplete recording: the run that wrote it never finished ({root} "
                             f"holds no readable {SESSION}, the record a recording run writes last): it was killed, "
                             "or its disk filled, so forms or batches may be missing", _FIX)
    entry = forms.get(name)
    if entry is None or entry.get("session") != session:
        raise ModelLoadError(folder, FORMAT, f"an incomplete recording: {name} was written by a run whose record "
                             f"({root / SESSION}) does not list it"
                             f"{' (it lists an earlier run of it)' if entry is not None else ''}: that run did not "
                             "finish writing it", _FIX)
    written = len(manifest.get("batches") or [])
    if entry.get("batches") != written:
        raise ModelLoadError(folder, FORMAT, f"an incomplete recording: the run's record lists {entry.get('batches')} "
                             f"batch(es) of {name}, its manifest {written}", _FIX)
