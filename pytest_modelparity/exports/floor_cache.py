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

Each entry is one JSON file ``<cache root>/floor/<key>.json``, written atomically, signed with
an HMAC under the cache's own secret key (``floor_seal.py``: an entry edited with its digest
recomputed is not trusted) and read only when it is a small regular file (a FIFO or a link to
``/dev/zero`` never blocks or fills memory). An entry that is not, does not parse, whose
signature differs, or whose errors are not finite non-negative numbers is dropped, measured
again and said in ``notes``. The folder holds at most ``MAX_ENTRIES`` entries and
``MAX_BYTES``: past either, the least recently used are evicted (a hit refreshes an entry's
time).

The plugin turns it on for a session (``use(root)``, off with ``--modelparity-no-cache``);
outside a pytest session with the plugin nothing is kept. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from ..runtime.quiet import make_ignored_dir
from .cache import FLOOR_DIR, ExportCache
from .floor_seal import UnsafeFile, read_small_regular, secret_key, signature
from ..runtime.scratch import ORPHAN_S, foreign, owned_prefix

__all__ = ["FLOOR_DIR", "FROM_CACHE", "MAX_BYTES", "MAX_ENTRIES", "FloorCache", "measured", "restore", "take_notes", "use"]

FROM_CACHE = "read from the floor cache, where an earlier run on this model and batch kept it"
# 2: a float64 figure looser than the fixed rule needs a second estimate (issue 36); the twin of a
# bound model speaks its binding; floors measured before may have come from an unfaithful twin.
# 3: entries signed with the cache's key (floor_seal.py); version-2 entries are simply not found.
# 4: entries carry the noise's distribution per output (``bulk``, issue 47).
_VERSION = 4
# 3,000 Hypothesis examples made 2,588 entries of ~300 bytes: a bound far above one suite's
# models and batches, far below what a long property test would otherwise leave.
MAX_ENTRIES = 1000
MAX_BYTES = 16 << 20
# Pruned when this process' estimate passes the bound, down to this share of it: one folder
# scan per ~100 new entries, not one per entry.
_LOW_WATER = 0.9
_log = logging.getLogger("pytest_modelparity.floor_cache")

T = TypeVar("T")


class FloorCache:
    """Measured floors under ``root/floor`` (see the module docstring)."""

    def __init__(self, root: str | os.PathLike, *, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.root = Path(root).expanduser()
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self.evicted = 0
        self.notes: list[str] = []
        self._keyer: Any = None
        self._secret: bytes | None = None
        self._no_secret = False
        self._estimate: tuple[int, int] | None = None  # (entries, bytes) since the last scan

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
            raw = read_small_regular(path)
        except FileNotFoundError:
            return None
        except UnsafeFile as exc:
            self._bad(path, f"it is {exc}")
            return None
        problem = foreign([path])
        if problem is not None:  # signed or not: an entry another user wrote is never used
            self._bad(path, problem)
            return None
        secret = self._signing_key()
        if secret is None:
            return None
        problem, payload = _check(raw, key, secret)
        if problem is not None:
            self._bad(path, problem)
            return None
        self.hits += 1
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: evicted last
        return payload

    def _signing_key(self) -> bytes | None:
        """The cache's secret key (created on first use); None when it can be neither read nor
        written: then no entry is trusted or kept, and the run says so once."""
        if self._secret is None and not self._no_secret:
            try:
                self._secret, note = secret_key(self.folder)
            except (OSError, UnsafeFile) as exc:
                self._no_secret = True
                self.notes.append(f"floor cache: its key file in {self.folder} can be neither read nor written "
                                  f"({type(exc).__name__}: {exc}); floors are measured every time, none kept")
                return None
            if note:
                self.notes.append(note)
        return self._secret

    def put(self, key: str, errors: dict[str, float], method: str | None, reason: str | None,
            unproven: tuple[str, ...] = (), bulk: dict[str, dict[str, float]] | None = None) -> None:
        """Keep a measured floor (atomically; a cache that cannot be written only loses the saving)."""
        payload: dict[str, Any] = {"errors": {str(k): float(v) for k, v in errors.items()}, "method": method,
                                   "reason": reason}
        if unproven:
            payload["unproven"] = [str(p) for p in unproven]
        if bulk:
            payload["bulk"] = {str(p): {str(k): float(v) for k, v in stats.items()} for p, stats in bulk.items()}
        tmp = self.folder / owned_prefix(f".{key[:16]}.tmp-{os.getpid()}-")
        try:
            make_ignored_dir(self.root)  # a new cache dir ignores itself for git, as the export cache's does
            self.folder.mkdir(parents=True, exist_ok=True)
            secret = self._signing_key()
            if secret is None:
                return
            body = json.dumps({"payload": payload, "hmac": signature(secret, key, payload)}, indent=1,
                              sort_keys=True).encode()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
            with open(fd, "wb", closefd=True) as fh:
                fh.write(body)
            os.replace(tmp, self.path(key))
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            return
        self._count_new(len(body))

    def _bad(self, path: Path, problem: str) -> None:
        try:
            path.unlink()  # a link is removed, never what it leads to
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.notes.append(f"floor cache: the entry {path} was damaged ({problem}) and cannot be removed "
                              f"({type(exc).__name__}); measured again, and will be until it is removed")
            return
        self.notes.append(f"floor cache: the entry {path} was damaged ({problem}); dropped it and measured again")

    # -- the bound --------------------------------------------------------------------------
    def _count_new(self, size: int) -> None:
        if self._estimate is None:
            self._estimate = self._scan_totals()
        entries, total = self._estimate
        self._estimate = (entries + 1, total + size)
        if self._estimate[0] > self.max_entries or self._estimate[1] > self.max_bytes:
            self.prune()

    def _scan(self) -> list[tuple[float, int, Path]]:
        """``(last used, size, path)`` of every regular entry file, oldest first."""
        found = []
        try:
            with os.scandir(self.folder) as it:
                for item in it:
                    if not item.name.endswith(".json") or item.name.startswith("."):
                        continue
                    with contextlib.suppress(OSError):
                        info = item.stat(follow_symlinks=False)
                        found.append((info.st_mtime, info.st_size, Path(item.path)))
        except OSError:
            return []
        return sorted(found)

    def _scan_totals(self) -> tuple[int, int]:
        found = self._scan()
        return len(found), sum(size for _, size, _ in found)

    def prune(self) -> int:
        """Evict the least recently used entries until at most ``_LOW_WATER`` of both bounds is
        used (and remove temporaries of writers dead for hours); return how many were evicted."""
        found = self._scan()
        entries, total = len(found), sum(size for _, size, _ in found)
        evicted = 0
        for _, size, path in found:
            if entries <= _LOW_WATER * self.max_entries and total <= _LOW_WATER * self.max_bytes:
                break
            with contextlib.suppress(OSError):
                path.unlink()
                evicted += 1
            entries, total = entries - 1, total - size
        self._estimate = (entries, total)
        self.evicted += evicted
        if evicted:
            _log.info("floor cache: evicted the %d least recently used entries (bound: %d entries, %d bytes)",
                      evicted, self.max_entries, self.max_bytes)
        self._sweep_temporaries()
        return evicted

    def _sweep_temporaries(self) -> None:
        now = time.time()
        with contextlib.suppress(OSError), os.scandir(self.folder) as it:
            for item in it:
                if ".tmp-" in item.name and item.name.startswith("."):
                    with contextlib.suppress(OSError):
                        if now - item.stat(follow_symlinks=False).st_mtime > ORPHAN_S:
                            os.unlink(item.path)

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


def _check(raw: bytes, key: str, secret: bytes) -> tuple[str | None, dict]:
    """``(what is wrong, payload)`` of an entry's bytes (``None``: nothing)."""
    try:
        entry = json.loads(raw)
        payload, mac = entry["payload"], entry["hmac"]
    except (ValueError, KeyError, TypeError) as exc:
        return f"not a floor entry ({type(exc).__name__})", {}
    if not isinstance(payload, dict) or not isinstance(mac, str):
        return "not a floor entry (no payload and signature)", {}
    if not hmac.compare_digest(signature(secret, key, payload), mac):
        return "its HMAC differs from its content: edited or copied since it was written", {}
    errors = payload.get("errors")
    if (not isinstance(errors, dict) or not errors
            or not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in errors.values())):
        return "its errors are not finite non-negative numbers", {}
    bulk = payload.get("bulk", {})
    if not isinstance(bulk, dict) or not all(
            isinstance(stats, dict) and all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0
                                            for v in stats.values()) for stats in bulk.values()):
        return "its noise statistics are not finite non-negative numbers", {}
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
    ``unproven=``, the outputs no second estimate confirmed, where there are any; ``bulk=``, the
    noise's distribution per output, where it was measured)."""
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
        bulk = {str(p): dict(v) for p, v in (kept.get("bulk") or {}).items()}
        return rebuild(dict(kept["errors"]), kept.get("method"), reason, time.perf_counter() - start,
                       **({"unproven": unproven} if unproven else {}), **({"bulk": bulk} if bulk else {}))
    store.misses += 1
    found = measure()
    errors = getattr(found, "errors", None)
    if errors and all(math.isfinite(v) for v in errors.values()):
        store.put(key, errors, getattr(found, "method", None), getattr(found, "reason", None),
                  tuple(getattr(found, "unproven", ())), getattr(found, "bulk", None))
    return found
