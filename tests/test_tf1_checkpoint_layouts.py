"""TF1 checkpoints laid out as they really ship (issue 37): a Saver prefix that is a directory
(``<dir>/.meta``, ``<dir>/.index``, ...), a ``checkpoint`` state file naming a path on the
author's machine, the files given one by one, and an old MetaGraph TF 2 refuses for a stale
``_output_shapes`` on a gradient node. The graph is tests/tf1_graphs.py's classifier (with its
training op), built with tf.compat.v1 here; every layout must predict what the graph does.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import tf1_graphs  # noqa: E402
from pytest_modelparity.errors import ModelLoadError  # noqa: E402
from pytest_modelparity.formats import detect_format, export_route, load_model  # noqa: E402

FOREIGN = "/home/author/experiments/MTT_musicnn/"  # the path the author's state file names
STALE_NODE = "gradients/MatMul_1_grad/MatMul_1"  # a training-only node: (16, 3) in truth


def _save_under_directory(directory: Path) -> np.ndarray:
    """Save the classifier with the prefix ``<directory>/`` and return its predictions on
    ``_batch()`` computed in the building session (the truth every layout must give)."""
    import tensorflow as tf

    graph, init = tf1_graphs.build_classifier(dropout=False)
    directory.mkdir(parents=True)
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        written = tf.compat.v1.train.Saver().save(sess, str(directory) + "/")
        truth = sess.run("predictions:0", {"x:0": _batch()})
    assert written == str(directory) + "/"
    assert {p.name for p in directory.iterdir()} == {".meta", ".index", ".data-00000-of-00001", "checkpoint"}
    return np.asarray(truth)


def _batch() -> np.ndarray:
    return np.random.default_rng(3).normal(size=(5, tf1_graphs.FEATURES)).astype("float32")


def _state_file(directory: Path, named: str) -> None:
    (directory / "checkpoint").write_text(f'model_checkpoint_path: "{named}"\n'
                                          f'all_model_checkpoint_paths: "{named}"\n')


def _write_stale_output_shapes(meta: Path) -> None:
    """What a TF 1.x MetaGraph of a training graph carries: an ``_output_shapes`` that TF 2's
    shape inference contradicts, on a node inference never runs."""
    from tensorflow.core.protobuf import meta_graph_pb2

    proto = meta_graph_pb2.MetaGraphDef()
    proto.ParseFromString(meta.read_bytes())
    (node,) = [n for n in proto.graph_def.node if n.name == STALE_NODE]
    shape = node.attr["_output_shapes"].list.shape[0]
    assert [d.size for d in shape.dim] == [16, 3]
    shape.dim[1].size = 64
    meta.write_bytes(proto.SerializeToString())


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """The layout of the shipped taggers: ``<dir>/`` prefix, a foreign state file, a stale
    ``_output_shapes`` in the ``.meta``."""
    directory = tmp_path_factory.mktemp("wheel") / "MTT_musicnn"
    truth = _save_under_directory(directory)
    _state_file(directory, FOREIGN)
    _write_stale_output_shapes(directory / ".meta")
    return directory, truth


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """The same ``<dir>/`` layout with a MetaGraph TF 2 takes as it is."""
    directory = tmp_path_factory.mktemp("plain") / "tagger"
    return directory, _save_under_directory(directory)


def _predict(path: str | Path, **options) -> tuple[np.ndarray, object]:
    loaded = load_model(path, **options)
    try:
        return np.asarray(loaded.predict({"x": _batch()})["predictions"]), loaded
    finally:
        loaded.close()


def test_stale_output_shapes_are_refused_by_tensorflow_as_they_are(shipped):
    # The premise: without the retry, TF 2 refuses this .meta (else the test proves nothing).
    import tensorflow as tf

    with tf.Graph().as_default(), pytest.raises(Exception, match="_output_shapes"):
        tf.compat.v1.train.import_meta_graph(str(shipped[0] / ".meta"), clear_devices=True)


@pytest.mark.parametrize("given", ["dir", "dir/", ".meta", ".index", ".data-00000-of-00001"])
def test_shipped_checkpoint_loads_by_every_path(shipped, given):
    directory, truth = shipped
    path = {"dir": str(directory), "dir/": str(directory) + "/"}.get(given, str(directory / given))
    assert detect_format(path) == "checkpoint"
    got, loaded = _predict(path)
    np.testing.assert_allclose(got, truth, rtol=1e-6, atol=1e-7)
    assert loaded.source == str(directory / ".meta")
    # The retry is said in the route, for the load and for what converts the source.
    route = export_route(directory / ".meta")
    assert route is not None and "_output_shapes" in route and "imported it again" in route, route
    assert loaded.load_route == route


def test_meta_with_format_checkpoint_given_is_not_told_to_pass_the_meta(shipped):
    directory, truth = shipped
    got, _ = _predict(directory / ".meta", format="checkpoint")
    np.testing.assert_allclose(got, truth, rtol=1e-6, atol=1e-7)


def test_plain_directory_prefix_has_no_retry_route(plain):
    directory, truth = plain
    got, loaded = _predict(str(directory) + "/")
    np.testing.assert_allclose(got, truth, rtol=1e-6, atol=1e-7)
    assert loaded.load_route is None


def test_directory_without_state_file_loads_its_only_checkpoint(plain, tmp_path):
    directory, truth = plain
    copy = tmp_path / "copied"
    shutil.copytree(directory, copy)
    (copy / "checkpoint").unlink()
    got, _ = _predict(copy)
    np.testing.assert_allclose(got, truth, rtol=1e-6, atol=1e-7)


def test_foreign_state_file_with_a_named_prefix(tmp_path):
    # The usual layout (model.ckpt-1000.*) whose state file names the author's machine.
    import tensorflow as tf

    graph, init = tf1_graphs.build_classifier(dropout=False)
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        tf.compat.v1.train.Saver().save(sess, str(tmp_path / "model.ckpt"), global_step=1000)
        truth = sess.run("predictions:0", {"x:0": _batch()})
    _state_file(tmp_path, "/home/author/run1/model.ckpt-1000")
    for given in (tmp_path, tmp_path / "model.ckpt-1000", tmp_path / "model.ckpt-1000.index"):
        got, loaded = _predict(given)
        np.testing.assert_allclose(got, truth, rtol=1e-6, atol=1e-7)
        assert loaded.source == str(tmp_path / "model.ckpt-1000.meta")


# -- what the messages say -------------------------------------------------------------------

def _load_error(path, **options) -> ModelLoadError:
    with pytest.raises(ModelLoadError) as info:
        load_model(path, **options)
    return info.value


def test_missing_meta_names_what_was_found(plain, tmp_path):
    directory, _ = plain
    copy = tmp_path / "no_meta"
    shutil.copytree(directory, copy)
    (copy / ".meta").unlink()
    err = _load_error(copy / ".index", format="checkpoint")
    text = str(err)
    assert "found .data-00000-of-00001, .index but no MetaGraph '.meta'" in text, text
    assert "no_meta.meta" not in text, text


def test_directory_with_two_checkpoints_names_both(plain, tmp_path):
    directory, _ = plain
    both = tmp_path / "both"
    both.mkdir()
    for prefix in ("a", "b"):
        for f in directory.iterdir():
            if f.name != "checkpoint":
                shutil.copy(f, both / f"{prefix}{f.name}")
    err = _load_error(both, format="checkpoint")
    assert "2 checkpoints (a.meta, b.meta)" in err.problem, err
    assert "pass the .meta file of the one to load" in err.fix


def test_directory_with_no_checkpoint_lists_its_files(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    err = _load_error(tmp_path, format="checkpoint")
    assert "holds no .meta MetaGraph (it holds notes.txt)" in err.problem, err


def test_unreadable_meta_is_corrupt_but_a_refused_one_is_not(plain, tmp_path):
    directory, _ = plain
    cut = tmp_path / "cut"
    shutil.copytree(directory, cut)
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import meta_graph_pb2

    content = (cut / ".meta").read_bytes()
    # A cut at a field boundary still parses (as a smaller graph): cut inside a field.
    for keep in range(len(content) // 2, 0, -1):
        try:
            meta_graph_pb2.MetaGraphDef().ParseFromString(content[:keep])
        except DecodeError:
            break
    (cut / ".meta").write_bytes(content[:keep])
    err = _load_error(cut)
    assert "cannot be read" in err.problem and "truncated or corrupt" in err.fix, err
    # A MetaGraph that parses but that TF refuses for another reason: never "corrupt".
    refused = tmp_path / "refused"
    shutil.copytree(directory, refused)
    proto = meta_graph_pb2.MetaGraphDef()
    proto.ParseFromString((refused / ".meta").read_bytes())
    proto.graph_def.node[-1].input.append("no_such_node:0")
    (refused / ".meta").write_bytes(proto.SerializeToString())
    err = _load_error(refused)
    assert "refuses the .meta MetaGraph" in err.problem, err
    assert "corrupt" not in str(err), err


def test_a_file_that_is_no_checkpoint_says_what_it_is(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x00" * 16)
    err = _load_error(path, format="checkpoint")
    assert "a file named 'weights.bin' with no weights.bin.meta or weights.bin.index beside it" in err.problem, err


def test_the_retry_reaches_what_converts_the_checkpoint(shipped):
    # The frozen, wrapped graph the converters take (graph_source) carries the retry in its route.
    from pytest_modelparity.formats.tensorflow.graph_source import graph_function

    graph = graph_function(shipped[0])
    try:
        assert graph.route.startswith("TF1 checkpoint frozen, wrapped; old MetaGraph"), graph.route
        assert "_output_shapes" in graph.route
    finally:
        graph.loaded.close()
