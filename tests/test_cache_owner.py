"""Issue 48, caches by owner: a cache folder another user owns, or one its group or others may
write, is refused at start-up with the fix (a private folder, ``--modelparity-cache-dir``); an
entry another uid wrote is never handed out (exported afresh, said once, left in place); the
folders the package creates are private (0700). Real exports of a tiny model; the other uid is
made with ``os.chown`` (these tests run as root where they can).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

pytest.importorskip("tensorflow", reason="exporting needs TensorFlow")

from pytest_modelparity import ExportError  # noqa: E402
from pytest_modelparity.exports.cache import ExportCache  # noqa: E402

from models import mlp  # noqa: E402

NOBODY = 65534
as_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")


@pytest.fixture(scope="module")
def model():
    return mlp(inputs=4, hidden=8, outputs=3)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_shared_writable_cache_dir_is_one_usage_error_at_start_up(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    shared = pytester.path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    result = pytester.runpytest(f"--modelparity-cache-dir={shared}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stderr.str()
    assert "is not yours alone: it is writable by its group and others (mode 0777)" in text, text
    assert f"chmod go-w {shared}" in text and "--modelparity-cache-dir" in text, text
    os.chmod(shared, 0o755)  # the fix works
    assert pytester.runpytest(f"--modelparity-cache-dir={shared}").ret == pytest.ExitCode.OK


@as_root
def test_a_cache_dir_owned_by_another_user_is_refused_at_start_up(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    theirs = pytester.path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    result = pytester.runpytest(f"--modelparity-cache-dir={theirs}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"owned by uid {NOBODY}, not by you (uid 0)" in result.stderr.str(), result.stderr.str()
    assert pytester.runpytest(f"--modelparity-cache-dir={theirs}", "--modelparity-no-cache").ret == 0


def test_the_cache_creates_private_folders_and_refuses_a_shared_one(model, tmp_path: Path) -> None:
    root = tmp_path / "new" / "cache"
    ExportCache(root).export(model, "keras")
    assert _mode(root) == 0o700 and _mode(root / "keras") == 0o700
    os.chmod(root / "keras", 0o775)
    with pytest.raises(ExportError) as info:
        ExportCache(root).export(model, "keras")
    text = str(info.value)
    assert "writable by its group (mode 0775)" in text and "--modelparity-cache-dir" in text, text


@as_root
def test_an_entry_written_by_another_uid_is_never_used(model, tmp_path: Path) -> None:
    first = Path(ExportCache(tmp_path).export(model, "keras"))
    entry = first.parent
    os.chown(entry / "meta.json", NOBODY, NOBODY)  # one planted file is enough
    again = ExportCache(tmp_path)
    path = Path(again.export(model, "keras"))
    assert entry not in path.parents and path.is_file(), path
    notes = again.take_notes()
    assert len(notes) == 1 and f"meta.json was written by uid {NOBODY}" in notes[0] and "not used" in notes[0], notes
    assert (entry / "meta.json").is_file() and first.is_file()  # not ours to remove
    assert (again.hits, again.misses) == (0, 0)
