"""The measured noise floor of a reference, kept beside the export cache across sessions.

Why: the default tolerance of a comparison against a Keras reference is a multiple of the
reference's own float32 error on the batch under test, measured by a float64 twin
(``floor/measure.py``). Building and running that twin costs 1-1.6 s on MobileNet at 64 px
(docs/performance.md), every session, while the figure it measures is a function of the
model, the batch and the twin kind only. A warm session reads it from here instead.

Key: the export cache's content key of the model (architecture, input names, weights, the
versions of Python, TensorFlow, Keras and the converters: ``ExportCache.key``), with the
twin kind, the digest of the batch and the digest of the reference's own outputs on it (so
a reference run elsewhere, on a GPU say, that computed other float32 outputs never reuses a
floor measured against these). Value: the per-output errors, the twin that measured them, the
outputs no second estimate confirmed (issue 36) and its note. Only measured floors are kept (a
reference no twin can measure is tried again).

Each entry is one JSON file ``<cache root>/floor/<key>.json``, written atomically, with the
SHA-256 of its payload: an entry that does not parse, whose digest differs, or whose errors
are not finite non-negative numbers is dropped, measured again and said in ``notes``.

The plugin turns it on for a session (``use(root)``, off with ``--modelparity-no-cache``);
outside a pytest session with the plugin nothing is kept. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from ..runtime.quiet import make_ignored_dir
from .cache import FLOOR_DIR, ExportCache
from ..runtime.scratch import owned_prefix

__all__ = ["FLOOR_DIR", "FROM_CACHE", "FloorCache", "measured", "restore", "take_notes", "use"]

FROM_CACHE = "read from the floor cache, where an earlier run on this model and batch kept it"
# 2: a float64 figure looser than the fixed rule needs a second estimate (issue 36); the twin of a
# bound model speaks its binding; floors measured before may have come from an unfaithful twin.
_VERSION = 2
_log = logging.getLogger("pytest_modelparity.floor_cache")

T = TypeVar("T")


class FloorCache:
    """Measured floors under ``root/floor`` (see the module docstring)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).expanduser()
        self.hits = 0
        self.misses = 0
        self.notes: list[str] = []
        self._keyer: Any = None

    @property
    def folder(self) -> Path:
        return self.root / FLOOR_DIR

    def key(self, model: Any, parts: Callable[[], tuple]) -> str | None:
        """The entry's key: the model's content key with ``parts()`` (kind, batch digest, reference
        outputs' digest) as its options; None when the model or the batch cannot be keyed (then
        nothing is kept)."""
        if self._keyer is None:
            self._keyer = ExportCache(self.root)
        native = getattr(model, "native", model)  # a loaded Keras reference (formats/tensorflow/keras.KerasModel)
        try:
            return str(self._keyer.key(native, "floor", {"floor": list(parts()), "version": _VERSION}))
        except Exception:  # noqa: BLE001 - a model without a content key: measured every time, as before
            return None

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def get(self, key: str) -> dict | None:
        """The payload kept under ``key`` (``errors``, ``method``, ``reason``), or None; a
        damaged entry is dropped and noted."""
        path = self.path(key)
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._bad(path, f"unreadable ({type(exc).__name__})")
            return None
        problem, payload = _check(text)
        if problem is not None:
            self._bad(path, problem)
            return None
        self.hits += 1
        return payload

    def put(self, key: str, errors: dict[str, float], method: str | None, reason: str | None,
            unproven: tuple[str, ...] = ()) -> None:
        """Keep a measured floor (atomically; a cache that cannot be written only loses the saving)."""
        payload: dict[str, Any] = {"errors": {str(k): float(v) for k, v in errors.items()}, "method": method,
                                   "reason": reason}
        if unproven:
            payload["unproven"] = [str(p) for p in unproven]
        body = json.dumps({"payload": payload, "sha256": _digest(payload)}, indent=1, sort_keys=True)
        tmp = self.folder / owned_prefix(f".{key[:16]}.tmp-{os.getpid()}-")
        try:
            make_ignored_dir(self.root)  # a new cache dir ignores itself for git, as the export cache's does
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp.write_text(body)
            os.replace(tmp, self.path(key))
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def _bad(self, path: Path, problem: str) -> None:
        with contextlib.suppress(OSError):
            path.unlink()
        self.notes.append(f"floor cache: the entry {path} was damaged ({problem}); dropped it and measured again")

    def clear(self) -> int:
        """Remove every entry; return how many there were."""
        found = list(self.folder.glob("*.json")) if self.folder.is_dir() else []
        for path in found:
            with contextlib.suppress(OSError):
                path.unlink()
        with contextlib.suppress(OSError):
            for leftover in self.folder.iterdir():
                leftover.unlink()
            self.folder.rmdir()
        return len(found)


def _digest(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _check(text: str) -> tuple[str | None, dict]:
    """``(what is wrong, payload)`` of an entry's text (``None``: nothing)."""
    try:
        entry = json.loads(text)
        payload, digest = entry["payload"], entry["sha256"]
    except (ValueError, KeyError, TypeError) as exc:
        return f"not a floor entry ({type(exc).__name__})", {}
    if not isinstance(payload, dict) or _digest(payload) != digest:
        return "its SHA-256 differs from its content", {}
    errors = payload.get("errors")
    if (not isinstance(errors, dict) or not errors
            or not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in errors.values())):
        return "its errors are not finite non-negative numbers", {}
    return None, payload


# -- the session's cache ---------------------------------------------------------------------
_ACTIVE: FloorCache | None = None


def use(root: str | os.PathLike | None) -> FloorCache | None:
    """Keep floors under ``root`` from now on (None: keep none); returns the cache that was in
    use before, for ``restore`` (a pytester session inside a session gives the outer one back)."""
    global _ACTIVE
    before, _ACTIVE = _ACTIVE, (FloorCache(root) if root is not None else None)
    return before


def restore(before: FloorCache | None) -> None:
    """Put back the cache ``use`` returned."""
    global _ACTIVE
    _ACTIVE = before


def take_notes() -> list[str]:
    """What the floor cache repaired since the last call (each said once)."""
    if _ACTIVE is None:
        return []
    notes, _ACTIVE.notes = _ACTIVE.notes, []
    return notes


def measured(model: Any, parts: Callable[[], tuple], measure: Callable[[], T], rebuild: Callable[..., T]) -> T:
    """``measure()`` (a ``floor.measure.Floor``), or the floor an earlier session measured for
    this model and ``parts()`` (twin kind, batch digest, reference outputs' digest), rebuilt as
    ``rebuild(errors, method, reason, seconds)`` with ``FROM_CACHE`` in its reason (and
    ``unproven=``, the outputs no second estimate confirmed, where there are any)."""
    store = _ACTIVE
    key = store.key(model, parts) if store is not None else None
    if store is None or key is None:
        return measure()
    start = time.perf_counter()
    kept = store.get(key)
    if kept is not None:
        _log.info("noise floor of %s from the floor cache (%s): no twin built", type(model).__name__, key[:12])
        reason = "; ".join(r for r in (FROM_CACHE, kept.get("reason")) if r)
        unproven = tuple(str(p) for p in kept.get("unproven") or ())
        return rebuild(dict(kept["errors"]), kept.get("method"), reason, time.perf_counter() - start,
                       **({"unproven": unproven} if unproven else {}))
    store.misses += 1
    found = measure()
    errors = getattr(found, "errors", None)
    if errors and all(math.isfinite(v) for v in errors.values()):
        store.put(key, errors, getattr(found, "method", None), getattr(found, "reason", None),
                  tuple(getattr(found, "unproven", ())))
    return found
