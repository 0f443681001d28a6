"""Models with ``dtype="string"`` inputs: load, export, compare; formats that cannot carry them say so.

Measured (TF 2.21): keras and saved_model carry string inputs and lookup tables; graphdef
carries string inputs but not lookup tables (a frozen GraphDef cannot initialise a table);
LiteRT fails the tflite file of a StringLookup model at batch 1, so that export is refused;
the tfjs runner carries no strings. Tiny models built here, real TensorFlow.
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_modelparity import errors

keras = pytest.importorskip("keras")

WORDS = np.array([["the"], ["dog"], ["zebra"], [""]])


def lookup_model():
    """StringLookup (a hash table) -> Embedding -> Dense: the shape of a TextVectorization model."""
    keras.utils.set_random_seed(1)
    inp = keras.Input((1,), dtype="string", name="word")
    ids = keras.layers.StringLookup(vocabulary=["the", "a", "cat", "dog", "good"])(inp)
    h = keras.layers.Flatten()(keras.layers.Embedding(7, 4)(ids))
    return keras.Model(inp, keras.layers.Dense(3, name="probs")(h))


def hashing_model():
    """Hashing (no table) -> Embedding -> Dense: string inputs a frozen GraphDef can carry."""
    keras.utils.set_random_seed(2)
    inp = keras.Input((2,), dtype="string", name="words")
    ids = keras.layers.Hashing(num_bins=11)(inp)
    h = keras.layers.Flatten()(keras.layers.Embedding(11, 4)(ids))
    return keras.Model(inp, keras.layers.Dense(3, name="probs")(h))


def _keras_answer(model, words):
    import tensorflow as tf

    return np.asarray(model(tf.constant(words)))


def test_keras_string_model_loads_and_takes_str_bytes_and_object_arrays():
    from pytest_modelparity import load_model

    model = lookup_model()
    loaded = load_model(model)
    assert loaded.inputs[0].dtype == np.dtype(object) and loaded.inputs[0].name == "word"
    expected = _keras_answer(model, WORDS)
    for batch in (WORDS, WORDS.astype("S"), WORDS.astype(object),
                  np.array([[w.encode()] for w in WORDS[:, 0]], dtype=object)):
        np.testing.assert_array_equal(loaded.predict(batch)["probs"], expected)
    # the out-of-vocabulary word and the empty string map to the OOV id, the others do not
    assert not np.array_equal(expected[0], expected[1]) and np.array_equal(expected[2], expected[3])


def test_saved_model_of_a_lookup_model_matches_keras(tmp_path):
    from pytest_modelparity import assert_outputs_close, export_model, load_model
    from pytest_modelparity.checks.strategies import seeded_batch

    model = lookup_model()
    reference = load_model(model)
    candidate = load_model(export_model(model, "saved_model", tmp_path / "sm"))
    assert candidate.inputs[0].dtype == np.dtype(object)
    batch = seeded_batch(reference, batch_size=6, seed=3)
    assert batch["word"].dtype == object and all(isinstance(v, bytes) for v in batch["word"].ravel())
    assert_outputs_close(candidate, reference, inputs=batch)
    assert_outputs_close(candidate, reference, inputs=WORDS)  # a str array works too


def test_tflite_string_lookup_model_is_a_typed_export_error(tmp_path):
    """Measured: the converter takes a StringLookup model (string input, hash table) and LiteRT
    runs the file at batch >= 2, but fails it at batch 1 ("RESHAPE ... (4 != 16)"; with
    GlobalAveragePooling1D instead of Flatten, "XNNPack delegate failed to reshape"). The
    validated export runs batch 1, so it refuses the file with a typed ExportError rather
    than returning one that fails later."""
    import importlib.util

    from pytest_modelparity import export_model

    if importlib.util.find_spec("ai_edge_litert") is None:
        pytest.skip("LiteRT is not installed: pip install 'pytest-modelparity[tflite]'")
    target = tmp_path / "m.tflite"
    with pytest.raises(errors.ExportError, match="does not run in LiteRT") as info:
        export_model(lookup_model(), "tflite", target)
    assert info.value.format == "tflite" and not target.exists()


def test_graphdef_carries_string_inputs_without_tables(tmp_path):
    from pytest_modelparity import assert_outputs_close, export_model, load_model
    from pytest_modelparity.checks.strategies import seeded_batch

    model = hashing_model()
    reference = load_model(model)
    candidate = load_model(export_model(model, "graphdef", tmp_path / "m.pb"))
    batch = seeded_batch(reference, batch_size=5, seed=4)
    assert_outputs_close(candidate, reference, inputs=batch)
    words = np.array([["good", "movie"], ["", "zebra"]])
    np.testing.assert_array_equal(candidate.predict(words)["probs"], _keras_answer(model, words))


def test_graphdef_export_of_a_lookup_table_is_a_typed_error_and_writes_nothing(tmp_path):
    from pytest_modelparity import export_model

    target = tmp_path / "m.pb"
    with pytest.raises(errors.ExportError, match="lookup tables") as info:
        export_model(lookup_model(), "graphdef", target)
    assert info.value.format == "graphdef" and info.value.action == "export"
    assert "saved_model" in info.value.fix
    assert not target.exists()


def test_tfjs_refuses_a_string_model_with_a_typed_error(tmp_path):
    from pytest_modelparity import export_model

    import importlib.util

    if importlib.util.find_spec("tensorflowjs") is None:
        pytest.skip("the tensorflowjs converter is not installed: pip install 'pytest-modelparity[tfjs]'")
    with pytest.raises(errors.ExportError, match="string tensor") as info:
        export_model(lookup_model(), "tfjs", tmp_path / "web")
    assert info.value.format == "tfjs" and "token ids" in info.value.fix
    assert not (tmp_path / "web").exists()


def test_seeded_string_batches_are_reproducible_words():
    from pytest_modelparity.formats.base import TensorSpec
    from pytest_modelparity.checks.strategies import seeded_batch

    spec = [TensorSpec("text", (None, 3), "string")]
    a, b = seeded_batch(spec, batch_size=8, seed=1), seeded_batch(spec, batch_size=8, seed=1)
    assert a["text"].shape == (8, 3) and a["text"].dtype == object
    assert a["text"].tolist() == b["text"].tolist()
    values = set(a["text"].ravel().tolist())
    assert len(values) > 5 and all(isinstance(v, bytes) for v in values)
    assert seeded_batch(spec, batch_size=8, seed=2)["text"].tolist() != a["text"].tolist()
