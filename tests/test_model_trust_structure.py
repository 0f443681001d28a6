"""Issue 48: what a model owns is decided by its graph's structure and its values, never by a
name the file chose. A ``SaveV2`` named under the saver's scope (``save/evil_save``) run by
``main_op`` (B1) or wired into ``save/restore_all`` of a TF1 checkpoint (B1b) is refused and
writes nothing; a text-file table whose file name is a ``placeholder_with_default`` of a path
outside the model (B2) is refused; a tf.data cache, a snapshot, a record reader, a proto
decoder's descriptor file, a graph decoded from bytes (B3/B4) are refused. Each attack is
shown real by loading it trusted; the model's own saver, its assets and a Keras vocabulary
file still load untrusted. Tiny TF1 graphs built in this process (no op of them runs while
building).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from pytest_modelparity import ModelLoadError, load_model
from pytest_modelparity.formats import missing_runtime

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.skipif(missing_runtime("saved_model") is not None, reason="needs TensorFlow")]


def _written(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.glob(target.name + "*"))


def _tf1_model(tf: Any, out: Path, wire: Callable[[Any, Any], Any] | None, *, checkpoint: bool,
               assets: Path | None = None) -> None:
    """``y = x * v``, saved by a TF1 Builder (``main_op`` = init + what ``wire`` returns) or as a
    Saver checkpoint (``wire`` gets the graph and the saver and edits the restore)."""
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 2], name="x")
        var = v1.get_variable("v", initializer=2.0)
        y = tf.identity(x * var, name="y")
        saver = v1.train.Saver(sharded=not checkpoint)
        extra = wire(graph, saver) if wire is not None else None
        with v1.Session(graph=graph) as session:
            session.run(v1.global_variables_initializer())
            if checkpoint:
                saver.save(session, str(out / "model.ckpt"))
                return
            builder = v1.saved_model.Builder(str(out))
            sig = v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            main_op = tf.group(v1.global_variables_initializer(), *([extra] if extra is not None else []))
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={"serving_default": sig},
                                                 main_op=main_op, saver=saver)
            builder.save()


def _evil_save(tf: Any, target: Path) -> Any:
    """A SaveV2 in the saver's own name scope: ``save/evil_save``, writing ``target.index``."""
    with tf.name_scope("save/"):
        return tf.raw_ops.SaveV2(prefix=tf.constant(str(target)), tensor_names=["x"], shape_and_slices=[""],
                                 tensors=[tf.constant([1.0])], name="evil_save")


def test_a_save_named_as_the_savers_and_run_by_main_op_is_refused(tmp_path: Path) -> None:
    import tensorflow as tf

    target = tmp_path / "elsewhere" / "written"
    target.parent.mkdir()
    model = tmp_path / "b1"
    _tf1_model(tf, model, lambda graph, saver: _evil_save(tf, target), checkpoint=False)
    with pytest.raises(ModelLoadError) as info:
        load_model(model)
    text = str(info.value)
    assert "SaveV2 (node 'save/evil_save'" in text and "saved_model_main_op at load" in text, text
    assert "outside the saver's own save" in text and "--modelparity-trust-models" in text, text
    assert _written(target) == []
    load_model(model, trusted=True)  # the attack is real: trusted, the load writes there
    assert "written.index" in _written(target)


def test_a_save_wired_into_the_checkpoints_restore_is_refused(tmp_path: Path) -> None:
    import tensorflow as tf

    target = tmp_path / "elsewhere" / "written"
    target.parent.mkdir()
    folder = tmp_path / "b1b"

    def wire(graph: Any, saver: Any) -> None:
        graph.get_operation_by_name(saver.saver_def.restore_op_name)._add_control_input(_evil_save(tf, target))

    _tf1_model(tf, folder, wire, checkpoint=True)
    assert _written(target) == []  # saving ran the save, not the restore
    with pytest.raises(ModelLoadError) as info:
        load_model(folder / "model.ckpt")
    text = str(info.value)
    assert "SaveV2 (node 'save/evil_save'" in text and "restore 'save/restore_all'" in text, text
    assert _written(target) == []
    load_model(folder / "model.ckpt", trusted=True)
    assert "written.index" in _written(target)


def test_a_restore_in_the_savers_subgraph_reading_another_file_is_refused(tmp_path: Path) -> None:
    """The restore subgraph is the saver's, but this RestoreV2 reads a file name of its own
    choosing, not the saver's file-name tensor (which the loader feeds with the model's prefix)."""
    import tensorflow as tf

    def wire(graph: Any, saver: Any) -> None:
        with tf.name_scope("save/"):
            read = tf.raw_ops.RestoreV2(prefix=tf.constant(str(tmp_path / "other")), tensor_names=["v"],
                                        shape_and_slices=[""], dtypes=[tf.float32], name="read_other")
        graph.get_operation_by_name(saver.saver_def.restore_op_name)._add_control_input(read[0].op)

    _tf1_model(tf, tmp_path / "c", wire, checkpoint=True)
    with pytest.raises(ModelLoadError, match=r"RestoreV2 \(node 'save/read_other'.*file name is not the saver's own"):
        load_model(tmp_path / "c" / "model.ckpt")


def test_the_models_own_saver_loads_untrusted(tmp_path: Path) -> None:
    import tensorflow as tf

    _tf1_model(tf, tmp_path / "sm", None, checkpoint=False)
    _tf1_model(tf, tmp_path / "ck", None, checkpoint=True)
    for path in (tmp_path / "sm", tmp_path / "ck" / "model.ckpt"):
        model = load_model(path)
        out = model.predict({model.inputs[0].name: np.ones((1, 2), np.float32)})
        np.testing.assert_allclose(next(iter(out.values())), [[2.0, 2.0]])


def _tf1_table(tf: Any, out: Path, filename: Callable[[], Any], assets: list[Any] | None = None) -> None:
    """A TF1 SavedModel looking words up in a text-file table ``main_op`` fills at load."""
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.string, [None], name="x")
        name = filename()
        init = tf.lookup.TextFileInitializer(name, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64,
                                             tf.lookup.TextFileIndex.LINE_NUMBER)
        table = tf.lookup.StaticHashTable(init, -1)
        y = tf.identity(table.lookup(x), name="y")
        if assets:
            v1.add_to_collection(v1.GraphKeys.ASSET_FILEPATHS, name)
        with v1.Session(graph=graph) as session:
            builder = v1.saved_model.Builder(str(out))
            sig = v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={"serving_default": sig},
                                                 main_op=v1.tables_initializer(),
                                                 assets_collection=v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS)
                                                 if assets else None)
            builder.save()


def _lookup(model: Any, words: list[str]) -> np.ndarray:
    return np.asarray(next(iter(model.predict({model.inputs[0].name: np.array(words, dtype=object)}).values())))


def test_a_table_whose_file_name_defaults_to_a_file_outside_is_refused(tmp_path: Path) -> None:
    import tensorflow as tf

    secret = tmp_path / "secret.txt"
    secret.write_text("alpha\nbeta\n")
    model = tmp_path / "b2"
    _tf1_table(tf, model, lambda: tf.compat.v1.placeholder_with_default(tf.constant(str(secret)), []))
    with pytest.raises(ModelLoadError) as info:
        load_model(model)
    text = str(info.value)
    assert "InitializeTableFromTextFileV2" in text and str(secret) in text and "saved_model_main_op" in text, text
    # The attack is real: trusted, the load read the file (its lines are the table's keys).
    assert _lookup(load_model(model, trusted=True), ["beta", "gamma"]).tolist() == [1, -1]


def test_a_table_a_serving_function_fills_from_a_file_outside_is_refused(tmp_path: Path) -> None:
    """The same read inside a tf.function (TF2): the file name is the function's own constant."""
    import tensorflow as tf

    secret = tmp_path / "secret.txt"
    secret.write_text("alpha\nbeta\n")

    class Reads(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, x: Any) -> Any:
            table = tf.raw_ops.HashTableV2(key_dtype=tf.string, value_dtype=tf.int64)
            init = tf.raw_ops.InitializeTableFromTextFileV2(table_handle=table, filename=tf.constant(str(secret)),
                                                            key_index=-2, value_index=-1)
            with tf.control_dependencies([init]):
                return {"y": tf.raw_ops.LookupTableFindV2(table_handle=table, keys=x,
                                                          default_value=tf.constant(-1, tf.int64))}

    module = Reads()
    tf.saved_model.save(module, str(tmp_path / "tf2"), signatures=module.serve)
    with pytest.raises(ModelLoadError) as info:
        load_model(tmp_path / "tf2")
    text = str(info.value)
    assert "InitializeTableFromTextFileV2" in text and "in function __inference_serve" in text, text
    assert str(secret) in text, text
    assert _lookup(load_model(tmp_path / "tf2", trusted=True), ["beta", "gamma"]).tolist() == [1, -1]


def test_a_table_whose_file_name_is_computed_is_refused(tmp_path: Path) -> None:
    import tensorflow as tf

    model = tmp_path / "joined"
    _tf1_table(tf, model, lambda: tf.strings.join([tf.constant(str(tmp_path)), "secret.txt"], separator="/"))
    with pytest.raises(ModelLoadError, match="InitializeTableFromTextFileV2.*not a constant of the model"):
        load_model(model)


def test_a_tf1_asset_and_a_keras_vocabulary_file_load_untrusted(tmp_path: Path) -> None:
    import keras
    import tensorflow as tf

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("alpha\nbeta\n")
    _tf1_table(tf, tmp_path / "asset", lambda: tf.constant(str(vocab)), assets=[True])
    vocab.unlink()  # the model reads its own copy in assets/, fed by the loader
    assert _lookup(load_model(tmp_path / "asset"), ["beta", "gamma"]).tolist() == [1, -1]

    words = tmp_path / "words.txt"
    words.write_text("the\ncat\n")
    inp = keras.Input((1,), dtype="string")
    keras.Model(inp, keras.layers.StringLookup(vocabulary=str(words))(inp)).export(str(tmp_path / "keras"),
                                                                                   verbose=False)
    words.unlink()
    model = load_model(tmp_path / "keras")
    out = model.predict({model.inputs[0].name: np.array([["cat"], ["dog"]], dtype=object)})
    assert np.asarray(next(iter(out.values()))).ravel().tolist() == [2, 0]


def _cache(tf: Any, x: Any, tmp: Path) -> Any:
    return x + tf.data.Dataset.from_tensors(1.0).cache(str(tmp / "cache")).reduce(0.0, lambda a, b: a + b)


def _snapshot(tf: Any, x: Any, tmp: Path) -> Any:
    return x + tf.data.Dataset.from_tensors(1.0).snapshot(str(tmp / "snap")).reduce(0.0, lambda a, b: a + b)


def _decode_proto(tf: Any, x: Any, tmp: Path) -> Any:
    out = tf.io.decode_proto(tf.constant([b""]), "a.B", ["f"], [tf.int32], descriptor_source=str(tmp / "desc"))
    return x + tf.cast(out.sizes[0, 0], tf.float32)


def _record_input(tf: Any, x: Any, tmp: Path) -> Any:
    records = tf.raw_ops.RecordInput(file_pattern=str(tmp / "*.tfrecord"))
    return x + tf.cast(tf.size(records), tf.float32)


def _from_graph(tf: Any, x: Any, tmp: Path) -> Any:
    ds = tf.raw_ops.DatasetFromGraph(graph_def=tf.constant(b""))
    return x + tf.cast(tf.size(tf.raw_ops.DatasetCardinality(input_dataset=ds)), tf.float32)


@pytest.mark.parametrize("build, op", [(_cache, "CacheDataset"), (_snapshot, "SnapshotDatasetV2"),
                                       (_decode_proto, "DecodeProtoV2"), (_record_input, "RecordInput"),
                                       (_from_graph, "DatasetFromGraph")])
def test_ops_that_reach_files_or_decode_graphs_are_refused(tmp_path: Path, build: Callable[..., Any],
                                                           op: str) -> None:
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        tf.identity(build(tf, x, tmp_path) * 1.0, name="y")
    path = tmp_path / "g.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    with pytest.raises(ModelLoadError, match=rf"{op} \(node "):
        load_model(path, inputs=["x:0"], outputs=["y:0"])
    assert sorted(os.listdir(tmp_path)) == ["g.pb"]


def test_a_meta_collection_is_not_said_to_run_at_load(tmp_path) -> None:
    """Issue 48: a .meta's WriteFile in saved_model_main_op is refused, but the checkpoint loader
    runs no init collection: the refusal said "run by saved_model_main_op at load"."""
    import tensorflow as tf

    from pytest_modelparity.formats.tensorflow.trust import scan_meta_graph

    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, 2), name="x")
        tf.identity(x * 2.0, name="y")
        write = tf.io.write_file(str(tmp_path / "marker.txt"), "x", name="evil_write")
        tf.compat.v1.add_to_collection("saved_model_main_op", write)
        meta = tf.compat.v1.train.export_meta_graph()
    said = "; ".join(f.words() for f in scan_meta_graph(meta, tmp_path))
    assert "evil_write" in said and "in the .meta's saved_model_main_op collection (the checkpoint loader runs none" \
        in said and "run by saved_model_main_op at load" not in said, said
    as_saved = "; ".join(f.words() for f in scan_meta_graph(meta, tmp_path, saved_model=True))
    assert "run by saved_model_main_op at load" in as_saved, as_saved
    assert not (tmp_path / "marker.txt").exists()
