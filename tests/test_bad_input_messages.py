"""Weak messages made specific: each bad path says what it is (a directory, a link loop, an
empty file) instead of a misleading "format could not be detected" or TensorFlow's words."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from pytest_modelparity import ModelLoadError, load_model
from pytest_modelparity.formats import detect_format, missing_runtime

pytestmark = [pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker


@pytest.mark.parametrize("name, fmt", [("model.keras", "keras"), ("model.h5", "h5"), ("model.tflite", "tflite"),
                                       ("model.onnx", "onnx"), ("model.pb", "graphdef"), ("model.json", "tfjs")])
def test_a_directory_named_like_a_model_file_says_it_is_a_directory(tmp_path: Path, name: str, fmt: str) -> None:
    target = tmp_path / name
    target.mkdir()
    (target / "inside.txt").write_text("x")
    with pytest.raises(ModelLoadError) as err:
        detect_format(target)
    text = str(err.value)
    assert f"as format {fmt!r}" in text and f"this is a directory, but a {fmt} model named {name!r} is a file" in text
    assert str(target) in text and "fix: pass the" in text
    assert (target / "inside.txt").read_text() == "x"


def test_a_symlink_loop_says_so(tmp_path: Path) -> None:
    a, b = tmp_path / "a.tflite", tmp_path / "b.tflite"
    os.symlink(b, a)
    os.symlink(a, b)
    with pytest.raises(ModelLoadError, match="a symbolic link loop") as err:
        load_model(a)
    assert "no such file" not in str(err.value) and err.value.format == "tflite"
    for fmt in ("tflite", "onnx", "keras"):       # named explicitly: the same message
        with pytest.raises(ModelLoadError, match="a symbolic link loop") as err:
            load_model(a, format=fmt)
        assert err.value.format == fmt


def test_a_dangling_symlink_names_its_target(tmp_path: Path) -> None:
    link = tmp_path / "m.onnx"
    os.symlink(tmp_path / "gone.onnx", link)
    with pytest.raises(ModelLoadError, match="a symbolic link to .*gone.onnx', which does not exist"):
        load_model(link)


@pytest.mark.skipif(missing_runtime("saved_model") is not None, reason="needs TensorFlow: pip install -e '.[all]'")
def test_an_empty_saved_model_pb_says_empty_or_corrupt(tmp_path: Path) -> None:
    (tmp_path / "sm").mkdir()
    (tmp_path / "sm" / "saved_model.pb").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"saved_model.pb is empty \(0 bytes\): the SavedModel is truncated or "
                                             "corrupt") as err:
        load_model(tmp_path / "sm")
    assert "tags=" not in str(err.value)
    assert (tmp_path / "sm" / "saved_model.pb").read_bytes() == b""


@pytest.mark.skipif(missing_runtime("checkpoint") is not None, reason="needs TensorFlow: pip install -e '.[all]'")
def test_a_checkpoint_with_an_empty_meta_says_so(tmp_path: Path) -> None:
    (tmp_path / "model.ckpt.meta").write_bytes(b"")
    (tmp_path / "model.ckpt.index").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"the .meta MetaGraph is empty \(0 bytes\)") as err:
        load_model(tmp_path / "model.ckpt")
    assert "candidate sink" not in str(err.value)


TWO_HEADS = textwrap.dedent('''
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        tf.multiply(x, 2.0, name="double")
        tf.reduce_mean(x, axis=1, name="mean")
    open("two_heads.pb", "wb").write(graph.as_graph_def().SerializeToString())
''')


@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.skipif(missing_runtime("graphdef") is not None, reason="needs TensorFlow: pip install -e '.[all]'")
def test_zero_code_mode_names_the_fixture_not_a_load_model_argument(pytester: pytest.Pytester) -> None:
    """--modelparity-model has no load_model call to pass outputs= to: the fix says what can."""
    exec(compile(TWO_HEADS, "two_heads", "exec"), {})  # writes into pytester's cwd
    result = pytester.runpytest("--modelparity-model=two_heads.pb", "--modelparity-formats=graphdef",
                                "-p", "no:cacheprovider", "-k", "deterministic")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert "cannot tell the output tensor: the graph has 2 candidate sink(s)" in out
    assert "override the session fixture modelparity_load_options" in out and "outputs=" in out
    assert "to load_model" not in out
