"""Bad input to the TF formats: every case is a ModelLoadError naming the file, the format and
what was wrong, and the user's files are byte-identical afterwards."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

pytest.importorskip("tensorflow", reason="the TF formats need TensorFlow: pip install 'pytest-modelparity[tensorflow]'")

from pytest_modelparity import export_model, load_model  # noqa: E402
from pytest_modelparity.errors import ModelLoadError  # noqa: E402

import tf1_graphs  # noqa: E402
from models import mlp  # noqa: E402


def digest(path: Path) -> str:
    """sha256 over every file under ``path`` (names and bytes)."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    root = tmp_path_factory.mktemp("good")
    model = mlp()
    out = {fmt: export_model(model, fmt, root / name)
           for fmt, name in (("keras", "m.keras"), ("h5", "m.h5"), ("saved_model", "sm"), ("graphdef", "g.pb"))}
    out["checkpoint"] = tf1_graphs.save_checkpoint(root / "ckpt", dropout=False)
    return out


def truncate(src: Path, dst: Path, keep: float = 0.5) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[: int(len(data) * keep)])
    return dst


def check(path: Path, fmt: str | None, expect: str, shown: Path | None = None, **options) -> ModelLoadError:
    """Load must fail with a ModelLoadError mentioning the file, the format and ``expect``."""
    before = digest(path) if path.exists() else None
    with pytest.raises(ModelLoadError) as info:
        load_model(path, format=fmt, **options)
    err = info.value
    text = str(err)
    assert str(shown or path) in text, text
    if fmt is not None:
        assert f"format {fmt!r}" in text, text
    assert expect.lower() in text.lower(), text
    assert "fix:" in text, text
    if before is not None:
        assert digest(path) == before, "the user's file was modified"
    return err


def test_truncated_keras(good, tmp_path):
    check(truncate(good["keras"], tmp_path / "cut.keras"), "keras", "not a zip archive")


def test_keras_zip_without_model(tmp_path):
    import zipfile

    path = tmp_path / "empty.keras"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "not a model")
    check(path, "keras", "Keras could not read the file")


def test_truncated_h5(good, tmp_path):
    check(truncate(good["h5"], tmp_path / "cut.h5"), "h5", "HDF5 could not read the file")


def test_not_hdf5(tmp_path):
    path = tmp_path / "text.h5"
    path.write_text("this is not a model\n")
    check(path, "h5", "not an HDF5 file")


def test_weights_only_h5(tmp_path):
    path = tmp_path / "only.weights.h5"
    mlp().save_weights(str(path))
    check(path, "h5", "holds no model_config")


def test_directory_without_saved_model_pb(tmp_path):
    (tmp_path / "variables").mkdir()
    (tmp_path / "variables" / "variables.index").write_bytes(b"x")
    check(tmp_path, "saved_model", "has no saved_model.pb")


def test_truncated_saved_model_pb(good, tmp_path):
    copy = tmp_path / "sm"
    shutil.copytree(good["saved_model"], copy)
    truncate(good["saved_model"] / "saved_model.pb", copy / "saved_model.pb")
    check(copy, "saved_model", "saved_model.pb cannot be read")  # read before TensorFlow (formats/tensorflow/trust.py)


def test_truncated_saved_model_variables(good, tmp_path):
    copy = tmp_path / "sm"
    shutil.copytree(good["saved_model"], copy)
    (data,) = (copy / "variables").glob("variables.data-*")
    truncate(good["saved_model"] / "variables" / data.name, data, keep=0.3)
    check(copy, "saved_model", "could not load")


def test_saved_model_given_a_file(good):
    check(good["keras"], "saved_model", "is a file, expected a directory")


def test_truncated_meta(good, tmp_path):
    prefix = good["checkpoint"]
    for f in prefix.parent.iterdir():
        shutil.copy(f, tmp_path / f.name)
    meta = tmp_path / "model.ckpt.meta"
    truncate(Path(str(prefix) + ".meta"), meta)
    check(meta, "checkpoint", "MetaGraph cannot be read")


def test_truncated_checkpoint_data(good, tmp_path):
    prefix = good["checkpoint"]
    for f in prefix.parent.iterdir():
        shutil.copy(f, tmp_path / f.name)
    (data,) = tmp_path.glob("model.ckpt.data-*")
    truncate(data, data, keep=0.3)
    before = digest(tmp_path)
    check(tmp_path / "model.ckpt", "checkpoint", "variables cannot be restored")
    assert digest(tmp_path) == before


def test_checkpoint_without_meta(good, tmp_path):
    prefix = good["checkpoint"]
    for f in prefix.parent.iterdir():
        if f.suffix != ".meta":
            shutil.copy(f, tmp_path / f.name)
    err = check(tmp_path / "model.ckpt.index", "checkpoint", "no MetaGraph", shown=tmp_path / "model.ckpt.index")
    assert "tf.train.Checkpoint" in err.fix


def test_truncated_graphdef(good, tmp_path):
    check(truncate(good["graphdef"], tmp_path / "cut.pb", keep=0.6), "graphdef", "not a GraphDef")


def test_pb_that_is_not_a_graphdef(tmp_path):
    path = tmp_path / "notes.pb"
    path.write_text("hello, this is a text file with a .pb name\n" * 20)
    check(path, "graphdef", "not a GraphDef")


def test_saved_model_pb_as_graphdef_points_to_saved_model(good):
    err = check(good["saved_model"] / "saved_model.pb", "graphdef", "GraphDef")
    assert "format='saved_model'" in err.fix


@pytest.mark.parametrize("fmt", ["keras", "h5", "saved_model", "checkpoint", "graphdef"])
def test_missing_path(tmp_path, fmt):
    check(tmp_path / "nope" / "model.bin", fmt, "no such file")


def test_missing_path_autodetect(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file") as info:
        load_model(tmp_path / "absent.keras")
    assert "absent.keras" in str(info.value)


def test_undetectable_file_lists_what_was_looked_for(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelLoadError, match=r"(?s)could not be detected.*saved_model\.pb.*format=") as info:
        load_model(path)
    assert "model.bin" in str(info.value)
