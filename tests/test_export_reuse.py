"""A Keras model's tfjs export converts the saved_model entry the cache already holds for the
same model (issue 49): the default matrix exports both, and the tfjs exporter would write the
very same SavedModel again first (MobileNetV2: 14 s of its 27 s export). The entry is only
read; a damaged one is not used; the artifact predicts as a fresh export's does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pytest_modelparity.formats import missing_runtime

pytestmark = pytest.mark.skipif(missing_runtime("tfjs", export=True) is not None,
                                reason="needs the tfjs converter and Node.js: bash scripts/install.sh installs them")

REUSED = "from the saved_model export of this model"


def _model():
    import keras

    keras.utils.set_random_seed(3)
    x = keras.Input((6,), name="features")
    h = keras.layers.Dense(8, activation="tanh", name="h")(x)
    return keras.Model(x, keras.layers.Dense(3, name="probs")(h), name="reuse")


def _manifest(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_tfjs_converts_the_cached_saved_model_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    from pytest_modelparity import load_model
    from pytest_modelparity.exports.cache import ExportCache
    from pytest_modelparity.formats import export_route

    model = _model()
    cache = ExportCache(tmp_path / "cache")
    saved = cache.export(model, "saved_model")
    before = _manifest(saved)
    assert cache.conversion_inputs(model, "tfjs") == {"saved_model_of_model": str(saved)}
    assert cache.conversion_inputs(model, "tfjs", {"quantization": "float16"}) != {}  # weights only: same SavedModel
    assert cache.conversion_inputs(model, "tflite") == {} and cache.conversion_inputs(str(saved), "tfjs") == {}
    reused = cache.export(model, "tfjs")
    assert REUSED in (export_route(reused) or "")
    assert _manifest(saved) == before                     # read only, byte for byte
    assert ExportCache(tmp_path / "cache").export(model, "saved_model") == saved  # still an intact entry

    fresh = ExportCache(tmp_path / "fresh").export(model, "tfjs")  # no saved_model entry: written as before
    assert REUSED not in (export_route(fresh) or "")
    x = np.random.default_rng(0).normal(size=(5, 6)).astype("float32")
    a, b = load_model(reused), load_model(fresh)
    try:
        np.testing.assert_array_equal(a.predict(x)["probs"], b.predict(x)["probs"])
    finally:
        a.close(), b.close()


def test_a_damaged_saved_model_entry_is_not_converted(tmp_path: Path) -> None:
    from pytest_modelparity.exports.cache import ExportCache
    from pytest_modelparity.formats import export_route

    model = _model()
    cache = ExportCache(tmp_path / "cache")
    saved = cache.export(model, "saved_model")
    data = next((saved / "variables").glob("variables.data-*"))
    data.write_bytes(data.read_bytes()[:-4])              # truncated, as by a full disk
    assert ExportCache(tmp_path / "cache").conversion_inputs(model, "tfjs") == {}
    tfjs = ExportCache(tmp_path / "cache").export(model, "tfjs")
    assert REUSED not in (export_route(tfjs) or "")
    assert data.exists()  # the saved_model entry is its own export's to drop, not this one's
