"""A damaged export-cache entry is never handed out: the cache records every file's size and
SHA-256 when it writes an entry, checks them when it reuses one, and on a mismatch drops the
entry, exports again and says so once."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("tensorflow", reason="exporting needs TensorFlow: pip install 'pytest-modelparity[tensorflow]'")

from pytest_modelparity.exports.cache import ExportCache  # noqa: E402

from models import TINY_SOURCE_CONFTEST, mlp  # noqa: E402

pytestmark = [pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker


@pytest.fixture(scope="module")
def model():
    return mlp(inputs=4, hidden=8, outputs=3)


def _files(entry: Path) -> dict[str, bytes]:
    return {p.relative_to(entry).as_posix(): p.read_bytes() for p in entry.rglob("*") if p.is_file()
            and p.name != "meta.json"}


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_a_damaged_artifact_is_dropped_and_exported_again(model, tmp_path: Path, damage: str) -> None:
    cache = ExportCache(tmp_path)
    path = Path(cache.export(model, "keras"))
    entry = path.parent
    original = _files(entry)
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["files"]["model.keras"][0] == len(original["model.keras"])   # size recorded at write time
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])     # same size, other bytes
    else:
        path.unlink()

    again = ExportCache(tmp_path)                       # a later run
    assert Path(again.export(model, "keras")) == path
    assert (again.hits, again.misses) == (0, 1)
    notes = again.take_notes()
    assert len(notes) == 1 and "was damaged" in notes[0] and "exported again" in notes[0], notes
    assert again.take_notes() == []                    # said once
    assert _files(entry).keys() == original.keys()
    assert again.export(model, "keras") == path and again.hits == 1


def test_an_intact_entry_is_reused_without_a_note(model, tmp_path: Path) -> None:
    ExportCache(tmp_path).export(model, "saved_model")
    again = ExportCache(tmp_path)
    again.export(model, "saved_model")
    assert (again.hits, again.misses, again.take_notes()) == (1, 0, [])


def test_an_entry_without_a_size_record_is_exported_again(model, tmp_path: Path) -> None:
    """An entry written before sizes were recorded cannot be checked, so it is not trusted."""
    path = Path(ExportCache(tmp_path).export(model, "keras"))
    meta_path = path.parent / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["files"]
    meta_path.write_text(json.dumps(meta))
    again = ExportCache(tmp_path)
    again.export(model, "keras")
    assert again.misses == 1 and "no size/hash record" in again.take_notes()[0]
    assert "files" in json.loads(meta_path.read_text())


CONFTEST = TINY_SOURCE_CONFTEST
TEST = textwrap.dedent('''
    from pytest_modelparity import assert_outputs_close

    def test_a(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)

    def test_b(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
''')


@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_the_next_run_passes_after_one_re_export_and_one_line(pytester: pytest.Pytester, workers) -> None:
    if workers:
        pytest.importorskip("xdist", reason="pytest-xdist is not installed: pip install pytest-xdist")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_cached=TEST)
    args = ("--modelparity-formats=keras", "--modelparity-cache-dir=cache", "-p", "no:cacheprovider")
    pytester.runpytest(*args).assert_outcomes(passed=2)
    (artifact,) = (pytester.path / "cache").glob("keras/*/model.keras")
    artifact.write_bytes(artifact.read_bytes()[:64])             # truncated, as by a full disk
    result = pytester.runpytest(*args, *workers)          # with xdist, both workers may find it
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert out.count("was damaged") == 1, out
    # (With xdist a worker may see the entry half-dropped by the other: "model.keras is missing".)
    why = "model.keras is 64 bytes, * when written" if not workers else "model.keras is *"
    result.stdout.fnmatch_lines([f"modelparity: export cache: the keras entry * was damaged ({why}); "
                                 "dropped it and exported again"])
    assert "was damaged" not in pytester.runpytest(*args).stdout.str()   # repaired for good


_LEAVE_BEHIND = textwrap.dedent('''
    import sys, tempfile
    from pytest_modelparity.runtime.scratch import owned_prefix
    # What a run killed mid-export leaves: a half-written cache entry and a tfjs intermediate.
    print(tempfile.mkdtemp(dir=sys.argv[1], prefix=owned_prefix(".0123456789abcdef.tmp-")))
    tfjs = tempfile.mkdtemp(prefix=owned_prefix("modelparity-tfjs-"))
    open(tfjs + "/saved_model.pb", "wb").close()
    print(tfjs)
''')


def test_the_next_run_removes_what_a_killed_run_left(model, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys
    import tempfile

    from pytest_modelparity.runtime.scratch import GRACE_S, owned_prefix

    (tmp_path / "keras").mkdir()
    done = subprocess.run([sys.executable, "-c", _LEAVE_BEHIND, str(tmp_path / "keras")], capture_output=True,
                          text=True, timeout=60, check=True)
    dead = [Path(line) for line in done.stdout.split()]
    old = os.stat(dead[0]).st_mtime - GRACE_S - 5
    for path in dead:
        os.utime(path, (old, old))
    # Kept: this process' own temporary (alive), and a dead one younger than the grace time.
    mine = Path(tempfile.mkdtemp(prefix=owned_prefix("modelparity-tfjs-")))
    os.utime(mine, (old, old))
    young = tmp_path / "keras" / (dead[0].name[:-3] + "new")
    young.mkdir()
    unrelated = Path(tempfile.mkdtemp(prefix="modelparity-notes-"))   # no owner tag: not ours to judge
    os.utime(unrelated, (old, old))
    try:
        cache = ExportCache(tmp_path)
        cache.export(model, "keras")
        assert not any(p.exists() for p in dead), dead
        assert mine.is_dir() and young.is_dir() and unrelated.is_dir()
        assert cache.sweep() == []                       # once per cache object
    finally:
        for p in (mine, unrelated):
            p.rmdir()


def test_a_cache_that_cannot_be_written_is_an_export_error(model, tmp_path: Path) -> None:
    from pytest_modelparity import ExportError

    (tmp_path / "afile").write_text("x")
    cache = ExportCache(tmp_path / "afile" / "cache")
    with pytest.raises(ExportError) as err:
        cache.export(model, "keras")
    text = str(err.value)
    assert "as format 'keras'" in text and "the export cache cannot be written" in text, text
    assert "--modelparity-cache-dir" in text and "--modelparity-no-cache" in text
    assert (tmp_path / "afile").read_text() == "x"
