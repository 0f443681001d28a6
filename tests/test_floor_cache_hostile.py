"""The floor cache cannot lie or hang (issue 39): a FIFO or a link to /dev/zero in place of an
entry is refused at once and measured again; an entry edited with its digest recomputed (or
copied under another key) fails its HMAC and is measured again; the folder stays bounded."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_modelparity.exports.floor_cache import FloorCache
from pytest_modelparity.exports.floor_seal import KEY_NAME

pytestmark = [pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker

ERRORS = {"['probs']": 1.5e-7}


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Fail instead of hanging: a blocked open() of a FIFO is interrupted by the alarm."""
    def _expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"still blocked after {seconds} s")

    before = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def _old_style_forgery(path: Path, factor: float) -> None:
    """What an editor who knows the entry format does: scale the errors and recompute a SHA-256
    of the payload (the check before issue 39)."""
    entry = json.loads(path.read_text())
    entry["payload"]["errors"] = {k: v * factor for k, v in entry["payload"]["errors"].items()}
    entry["sha256"] = hashlib.sha256(json.dumps(entry["payload"], sort_keys=True).encode()).hexdigest()
    path.write_text(json.dumps(entry))


def test_a_fifo_in_place_of_an_entry_is_refused_at_once(tmp_path: Path) -> None:
    cache = FloorCache(tmp_path)
    cache.folder.mkdir(parents=True)
    os.mkfifo(cache.path("k1"))
    start = time.perf_counter()
    with _deadline(20):
        assert cache.get("k1") is None
    assert time.perf_counter() - start < 2
    assert "a FIFO (named pipe), not a regular file" in cache.notes[-1] and "measured again" in cache.notes[-1]
    assert not cache.path("k1").exists()  # dropped: the next put writes a regular file there
    cache.put("k1", ERRORS, "keras", None)
    assert stat.S_ISREG(os.lstat(cache.path("k1")).st_mode) and cache.get("k1")["errors"] == ERRORS


def test_a_link_to_dev_zero_is_refused_unread_and_only_the_link_removed(tmp_path: Path) -> None:
    cache = FloorCache(tmp_path)
    cache.folder.mkdir(parents=True)
    os.symlink("/dev/zero", cache.path("k1"))
    target = tmp_path / "real.json"
    target.write_text("{}")
    os.symlink(target, cache.path("k2"))  # a link to a regular file is refused too: entries are never links
    with _deadline(20):
        assert cache.get("k1") is None and cache.get("k2") is None
    assert "a symbolic link (to /dev/zero)" in cache.notes[0]
    assert not os.path.lexists(cache.path("k1")) and target.exists()


def test_an_oversized_entry_is_refused_without_being_read(tmp_path: Path) -> None:
    cache = FloorCache(tmp_path)
    cache.folder.mkdir(parents=True)
    with open(cache.path("k1"), "wb") as fh:
        fh.truncate(8 << 30)  # sparse: 8 GiB that would be read whole before
    assert cache.get("k1") is None and "more than the 1048576 an entry may hold" in cache.notes[-1]


def test_an_edited_entry_with_its_sha256_recomputed_is_measured_again(tmp_path: Path) -> None:
    cache = FloorCache(tmp_path)
    cache.put("k1", ERRORS, "keras", None)
    _old_style_forgery(cache.path("k1"), 1e9)
    assert cache.get("k1") is None and "its HMAC differs from its content" in cache.notes[-1]
    # A whole valid entry copied under another key is refused too: the key is signed with it.
    cache.put("k2", {"['probs']": 3.0}, "keras", None)
    cache.path("k1").write_bytes(cache.path("k2").read_bytes())
    assert cache.get("k1") is None and "HMAC differs" in cache.notes[-1]
    assert cache.get("k2") == {"errors": {"['probs']": 3.0}, "method": "keras", "reason": None}


def test_the_signing_key_is_private_and_a_shared_one_is_replaced(tmp_path: Path) -> None:
    cache = FloorCache(tmp_path)
    cache.put("k1", ERRORS, "keras", None)
    key_file = cache.folder / KEY_NAME
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and key_file.stat().st_size == 32
    assert FloorCache(tmp_path).get("k1") is not None  # another session, the same key: trusted
    key_file.chmod(0o644)  # readable by others: whoever read it could sign a forgery
    other = FloorCache(tmp_path)
    assert other.get("k1") is None
    assert "not private" in other.notes[0] and "replaced it" in other.notes[0] and "HMAC differs" in other.notes[1]
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_the_folder_is_bounded_least_recently_used_first(tmp_path: Path) -> None:
    cache = FloorCache(tmp_path, max_entries=50)
    cache.put("keep", ERRORS, "keras", None)
    for i in range(300):
        cache.put(f"k{i:04d}", ERRORS, "keras", None)
        if i % 20 == 0:
            assert cache.get("keep") is not None  # used: refreshed, so never the oldest
    files = list(cache.folder.glob("*.json"))
    assert len(files) <= 50 and cache.evicted >= 250
    assert cache.path("keep").exists() and cache.path("k0299").exists() and not cache.path("k0000").exists()
    by_bytes = FloorCache(tmp_path / "b", max_bytes=20_000)
    for i in range(300):
        by_bytes.put(f"k{i:04d}", ERRORS, "keras", None)
    assert sum(p.stat().st_size for p in by_bytes.folder.glob("*.json")) <= 20_000


def test_3000_distinct_batches_leave_at_most_the_default_bound(tmp_path: Path) -> None:
    """The sweep's figure: 3,000 Hypothesis examples made 2,588 entries, unbounded."""
    cache = FloorCache(tmp_path)
    start = time.perf_counter()
    for i in range(3000):
        cache.put(hashlib.sha256(b"%d" % i).hexdigest(), ERRORS, "keras", None)
    seconds = time.perf_counter() - start
    assert len(list(cache.folder.glob("*.json"))) <= cache.max_entries == 1000
    assert seconds < 30, seconds  # pruned in batches, not one folder scan per entry


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
@pytest.mark.usefixtures("_heavy_modules_stay_loaded")  # in-process pytester runs import the runtimes once
def test_a_session_with_a_fifo_a_dev_zero_link_and_a_forged_entry_measures_again(pytester: pytest.Pytester) -> None:
    """On the real runtime: the entries a cold session kept are swapped for a FIFO and a link
    to /dev/zero, then forged; each warm session ends promptly, measures again, says so, and
    judges by the tolerance the cold one measured."""
    pytest.importorskip("tensorflow", reason="the float64 twins need TensorFlow")
    from test_floor_cache import ARGS, CONFTEST, SUITE, _tolerance

    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)

    def run() -> tuple[pytest.RunResult, dict]:
        with _deadline(300):
            result = pytester.runpytest(*ARGS)
        result.assert_outcomes(passed=1)
        return result, json.loads((pytester.path / "r.json").read_text())["rows"][0]

    cold, first = run()
    entries = sorted((pytester.path / "cache" / "floor").glob("*.json"))
    assert len(entries) == 2, entries
    for entry in entries:
        entry.unlink()
    os.mkfifo(entries[0])
    os.symlink("/dev/zero", entries[1])
    hostile, second = run()
    hostile.stdout.fnmatch_lines(["*float64 twins built: 1*"])
    text = hostile.stdout.str()
    assert "a FIFO (named pipe), not a regular file); dropped it and measured again" in text
    assert "a symbolic link (to /dev/zero), not a regular file); dropped it and measured again" in text
    assert second["floor_cached"] is False and _tolerance(second) == _tolerance(first)
    assert all(stat.S_ISREG(os.lstat(e).st_mode) for e in entries)  # replaced by measured entries

    for entry in entries:
        _old_style_forgery(entry, 1e6)  # every floor a million times looser: every check would pass
    forged, third = run()
    forged.stdout.fnmatch_lines(["*float64 twins built: 1*"])
    assert forged.stdout.str().count("its HMAC differs from its content") == 2
    assert third["floor_cached"] is False and _tolerance(third) == _tolerance(first)
