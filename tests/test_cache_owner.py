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

# inline_exports (conftest.py): no export worker; the process is not what these tests are about
pytestmark = [pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]

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


@as_root
def test_a_floor_entry_written_by_another_uid_is_never_used(tmp_path: Path) -> None:
    from pytest_modelparity.exports.floor_cache import FloorCache

    key = "f" * 64
    FloorCache(tmp_path).put(key, {"y": 1e-6}, "float64 twin", None)
    assert FloorCache(tmp_path).get(key) is not None  # kept and signed: usable as written
    os.chown(FloorCache(tmp_path).path(key), NOBODY, NOBODY)
    cache = FloorCache(tmp_path)
    assert cache.get(key) is None
    assert any(f"written by uid {NOBODY}" in note for note in cache.notes), cache.notes


def test_a_tfjs_install_folder_others_may_write_is_refused_before_node_runs(tmp_path: Path, monkeypatch) -> None:
    import shutil

    from pytest_modelparity.errors import RuntimeMissing
    from pytest_modelparity.runtime import tfjs_runner

    if shutil.which("node") is None:
        pytest.skip("needs Node.js (the check runs where the tfjs format could): bash scripts/install.sh")
    monkeypatch.setenv("MODELPARITY_CACHE_DIR", str(tmp_path))
    shared = tmp_path / "tfjs-node-modules"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(RuntimeMissing) as info:
        tfjs_runner.ensure_node_modules(quiet=True)
    text = str(info.value)
    assert f"{shared}: it is writable by its group and others (mode 0777)" in text, text
    assert "Node.js would run" in text and "MODELPARITY_CACHE_DIR" in text, text
    assert not any(shared.iterdir())  # nothing installed into it
    os.chmod(shared, 0o755)
    assert tfjs_runner.not_yours(tfjs_runner.modules_dir()) is None


@as_root
def test_a_tfjs_install_file_another_uid_wrote_is_damage(tmp_path: Path, monkeypatch) -> None:
    """A complete-looking install (the lock's packages, the marker, a manifest) in which one file
    listed by npm ci now belongs to another uid: ``damage`` names it, so it is reinstalled, not run."""
    import json

    from pytest_modelparity.runtime import tfjs_runner

    monkeypatch.setenv("MODELPARITY_CACHE_DIR", str(tmp_path))
    target = tfjs_runner.modules_dir()
    target.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        (target / name).write_bytes((tfjs_runner.RUNNER_DIR / name).read_bytes())
    for key, version in tfjs_runner._lock_packages(target / "package-lock.json").items():
        (target / key).mkdir(parents=True, exist_ok=True)
        (target / key / "package.json").write_text(json.dumps({"version": version}))
    wasm = target / "node_modules" / tfjs_runner._WASM_PACKAGE / "dist"
    if wasm.parent.is_dir():
        wasm.mkdir(exist_ok=True)
        (wasm / "tfjs-backend-wasm.wasm").write_bytes(b"\0asm")
    tfjs_runner._write_manifest(target)
    (target / tfjs_runner._MARKER).write_text("npm ci took 1.0 s\n")
    assert tfjs_runner.damage(target) == []
    planted = next(p for p in sorted((target / "node_modules").rglob("package.json")))
    os.chown(planted, NOBODY, NOBODY)
    (problem,) = tfjs_runner.damage(target)
    assert "1 file(s) were written by another user" in problem and f"(uid {NOBODY})" in problem, problem
