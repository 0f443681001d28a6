"""Bad .tflite / .onnx input: a ModelLoadError naming file, format, problem and fix; the
user's file is never touched (same bytes, same mtime)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from models import mlp
from pytest_modelparity import ModelLoadError, export_model, load_model

pytest.importorskip("tensorflow", reason="the valid files are exported with TensorFlow")
pytest.importorskip("ai_edge_litert", reason="install LiteRT: pip install 'pytest-modelparity[tflite]'")
pytest.importorskip("onnxruntime", reason="install onnxruntime: pip install 'pytest-modelparity[onnx]'")


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> dict[str, bytes]:
    d = tmp_path_factory.mktemp("valid")
    model = mlp()
    return {fmt: export_model(model, fmt, d / f"m.{fmt}").read_bytes() for fmt in ("tflite", "onnx")}


def fingerprint(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mtime_ns, st.st_mode


def expect_load_error(path: Path, fmt: str | None, *, load_as: str | None = None, match: str) -> ModelLoadError:
    before = fingerprint(path) if path.is_file() else None
    with pytest.raises(ModelLoadError) as info:
        load_model(path, load_as)
    err = info.value
    text = str(err)
    assert str(path) in text, text
    if fmt is not None:
        assert f"format {fmt!r}" in text and err.format == fmt, text
    assert "fix:" in text, text
    assert re.search(match, text, re.S), text
    if before is not None:
        assert fingerprint(path) == before, "the user's file was modified"
    return err


CASES = {
    "garbage": lambda good: os.urandom(64) + good[100:400],
    "truncated": lambda good: good[: len(good) // 2],
    "truncated_header": lambda good: good[:6],
    "empty": lambda good: b"",
    "text": lambda good: b"<html>404 not found</html>\n",
}
EXPECTED = {
    ("tflite", "garbage"): "identifier 'TFL3' is missing",
    ("tflite", "truncated"): "not a valid Flatbuffer",
    ("tflite", "truncated_header"): "identifier 'TFL3' is missing",
    ("tflite", "empty"): "empty",
    ("tflite", "text"): "identifier 'TFL3' is missing",
    ("onnx", "garbage"): "onnxruntime cannot load|not an ONNX",
    ("onnx", "truncated"): "onnxruntime cannot load",
    ("onnx", "truncated_header"): "onnxruntime cannot load",
    ("onnx", "empty"): "empty",
    ("onnx", "text"): "not an ONNX protobuf",
}


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("detected", [True, False], ids=["detected", "explicit"])
def test_broken_file(valid, tmp_path, fmt, case, detected):
    path = tmp_path / f"broken.{fmt}"
    path.write_bytes(CASES[case](valid[fmt]))
    os.chmod(path, 0o444)  # read-only, as a user's artifact may be: loading must still work
    expect_load_error(path, fmt, load_as=None if detected else fmt, match=EXPECTED[(fmt, case)])


def test_onnx_file_with_a_tflite_suffix(valid, tmp_path):
    path = tmp_path / "model.tflite"
    path.write_bytes(valid["onnx"])
    expect_load_error(path, "tflite", match="not a TFLite FlatBuffer.*pass format=")


def test_tflite_file_loaded_as_onnx(valid, tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(valid["tflite"])
    expect_load_error(path, "onnx", load_as="onnx", match="TFLite FlatBuffer, not an ONNX model.*format='tflite'")


def test_unknown_extension_lists_what_was_looked_for(valid, tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(valid["tflite"])
    err = expect_load_error(path, None, match="could not be detected")
    assert ".tflite file (tflite)" in str(err) and ".onnx file (onnx)" in str(err)


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_missing_path(tmp_path, fmt):
    path = tmp_path / f"nowhere.{fmt}"
    expect_load_error(path, fmt, load_as=fmt, match="no such file")
    assert not path.exists()


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_directory_instead_of_file(tmp_path, fmt):
    path = tmp_path / f"dir.{fmt}"
    path.mkdir()
    expect_load_error(path, fmt, load_as=fmt, match="directory, not a")


def test_valid_read_only_files_load(valid, tmp_path):
    for fmt, content in valid.items():
        path = tmp_path / f"ok.{fmt}"
        path.write_bytes(content)
        os.chmod(path, 0o444)
        before = fingerprint(path)
        assert load_model(path, fmt).predict([[0.5] * 16])  # a nested list is one array
        assert fingerprint(path) == before


def test_tflite_with_tensorflow_ops_names_the_missing_ops(tmp_path):
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec((None, 4), tf.float32)])
    def as_text_length(x):
        return tf.strings.length(tf.strings.as_string(x))  # no TFLite builtin: needs Flex

    converter = tf.lite.TFLiteConverter.from_concrete_functions([as_text_length.get_concrete_function()],
                                                                tf.Module())
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
    path = tmp_path / "flex.tflite"
    path.write_bytes(converter.convert())
    expect_load_error(path, "tflite", match="ops this LiteRT interpreter does not have: FlexAsString.*SELECT_TF_OPS")


def test_a_missing_path_names_the_format_its_suffix_implies(tmp_path):
    from pytest_modelparity import ModelLoadError

    missing = tmp_path / "nowhere" / "model.tflite"
    with pytest.raises(ModelLoadError, match=r"cannot load '.*model.tflite' as format 'tflite': "
                                             r"no such file or directory\n  fix: check the path"):
        load_model(missing)
