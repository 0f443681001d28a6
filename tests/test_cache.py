"""Export cache: content keys, reuse, bypass, clear, and two real processes racing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import pytest_modelparity.formats as formats
from models import mlp
from pytest_modelparity import load_model
from pytest_modelparity.exports.cache import ExportCache, default_cache_dir

pytest.importorskip("tensorflow", reason="exports need TensorFlow: pip install 'pytest-modelparity[tensorflow]'")
pytest.importorskip("ai_edge_litert", reason="these tests export to tflite: pip install 'pytest-modelparity[tflite]'")

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def model():
    return mlp()


def test_key_depends_on_content_not_identity(model):
    cache = ExportCache(Path("unused"))
    same = mlp()  # rebuilt from the same seed: same architecture and weights
    key = cache.key(model, "tflite", {})
    assert key == cache.key(same, "tflite", {})
    assert len(key) == 64
    assert key != cache.key(mlp(seed=1), "tflite", {})                       # other weights
    assert key != cache.key(mlp(hidden=33), "tflite", {})                    # other architecture
    assert key != cache.key(model, "onnx", {})                               # other format
    assert key != cache.key(model, "tflite", {"quantization": "float16"})    # other options
    data = [np.ones((2, 16), "float32")]
    assert cache.key(model, "tflite", {"representative_data": data}) != \
        cache.key(model, "tflite", {"representative_data": [np.zeros((2, 16), "float32")]})


def test_key_sees_weights_changed_in_place():
    m = mlp()
    cache = ExportCache(Path("unused"))
    before = cache.key(m, "tflite", {})
    kernel, bias = m.get_layer("out").get_weights()
    m.get_layer("out").set_weights([kernel, bias + 1e-3])
    assert cache.key(m, "tflite", {}) != before


def test_second_export_is_reused(model, tmp_path):
    cache = ExportCache(tmp_path / "cache")
    first = cache.export(model, "tflite")
    stamp = first.stat().st_mtime_ns
    second = ExportCache(tmp_path / "cache").export(mlp(), "tflite")  # new cache object, rebuilt model
    assert second == first and first.name == "model.tflite"
    assert first.stat().st_mtime_ns == stamp
    assert (cache.hits, cache.misses) == (0, 1)
    x = np.random.default_rng(0).normal(size=(3, 16)).astype("float32")
    np.testing.assert_allclose(load_model(second, "tflite").predict(x)["out"], np.asarray(model(x)), atol=1e-5)
    assert [p.parent.name for p in cache.entries()] == ["tflite"]
    assert not [p for p in (tmp_path / "cache" / "tflite").iterdir() if p.name.startswith(".")]  # no temp left


def test_options_make_separate_entries(model, tmp_path):
    cache = ExportCache(tmp_path)
    plain = cache.export(model, "tflite")
    half = cache.export(model, "tflite", quantization="float16")
    assert plain != half
    assert load_model(half, "tflite").format_variant == "tflite:float16"
    assert len(cache.entries()) == 2


def test_disabled_cache_exports_fresh_every_time(model, tmp_path):
    cache = ExportCache(tmp_path / "cache", enabled=False)
    a = cache.export(model, "tflite")
    b = cache.export(model, "tflite")
    assert a != b and a.exists() and b.exists()
    assert not (tmp_path / "cache").exists()
    cache._remove_scratch()
    assert not a.exists()


def test_unhashable_option_bypasses_the_cache(model, tmp_path):
    cache = ExportCache(tmp_path / "cache")
    batches = (np.ones((4, 16), "float32") for _ in range(2))  # a generator: no content to hash
    path = cache.export(model, "tflite", quantization="int8", representative_data=batches)
    assert load_model(path, "tflite").format_variant == "tflite:int8"
    assert cache.entries() == []


def test_clear_removes_entries_but_nothing_else(model, tmp_path):
    root = tmp_path / "cache"
    cache = ExportCache(root)
    cache.export(model, "tflite")
    (root / "notes.txt").write_text("not ours")
    assert cache.clear() == 1
    assert cache.entries() == []
    assert (root / "notes.txt").read_text() == "not ours"
    assert cache.export(model, "tflite").exists()  # usable again after clearing
    assert cache.misses == 2


def test_default_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MODELPARITY_CACHE_DIR", str(tmp_path / "here"))
    assert default_cache_dir() == tmp_path / "here"
    assert ExportCache().root == tmp_path / "here"
    monkeypatch.delenv("MODELPARITY_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "pytest-modelparity"


def test_losing_a_race_uses_the_winners_artifact(model, tmp_path, monkeypatch):
    """Another worker finishes the same export while ours runs: ours is discarded. (The entry
    lock makes this rare: only a worker that gave up waiting, or a filesystem without flock.)"""
    root = tmp_path / "cache"
    real_export = formats.export_model
    winner: list[Path] = []

    def export_while_another_worker_wins(m, fmt, path, **options):
        written = real_export(m, fmt, path, **options)
        if not winner:
            monkeypatch.setattr(formats, "export_model", real_export)
            # A worker that gave up waiting for our lock (lock_timeout_s=0) exports too, and renames first.
            winner.append(ExportCache(root, lock_timeout_s=0).export(m, fmt, **options))
        return written

    monkeypatch.setattr(formats, "export_model", export_while_another_worker_wins)
    cache = ExportCache(root)
    path = cache.export(model, "tflite")
    assert winner and path == winner[0]
    assert len(cache.entries()) == 1
    assert not [p for p in (root / "tflite").iterdir() if p.name.startswith(".")]
    assert load_model(path, "tflite").predict(np.zeros((1, 16), "float32"))["out"].shape == (1, 5)


WORKER = textwrap.dedent("""
    import os, sys, time
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, {tests!r})
    from models import mlp
    from pytest_modelparity.exports.cache import ExportCache
    model = mlp()
    open(os.path.join({ready!r}, str(os.getpid())), "w").close()
    go = {go!r}
    while not os.path.exists(go):   # both workers start exporting at the same moment
        time.sleep(0.01)
    cache = ExportCache({root!r})
    print(cache.export(model, "tflite"), cache.misses)
""")


def test_two_processes_exporting_at_once_export_once_and_share_one_intact_artifact(model, tmp_path):
    root, go, ready = tmp_path / "cache", tmp_path / "go", tmp_path / "ready"
    ready.mkdir()
    script = WORKER.format(tests=str(TESTS), go=str(go), root=str(root), ready=str(ready))
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    # Let both import TensorFlow and build the model, then release them together.
    deadline = time.time() + 120
    while len(list(ready.iterdir())) < 2 and time.time() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.05)
    go.write_text("go")
    results = [p.communicate(timeout=120) for p in procs]
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0, err[-2000:]
    print("workers:", [out.strip() for out, _ in results])
    paths = {out.split()[-2] for out, _ in results}
    assert len(paths) == 1, paths
    # The entry lock: one process converted, the other waited for it and hit.
    assert sorted(int(out.split()[-1]) for out, _ in results) == [0, 1]
    path = Path(paths.pop())
    assert len(ExportCache(root).entries()) == 1
    assert not [p for p in (root / "tflite").iterdir() if p.name.startswith(".")]
    x = np.random.default_rng(1).normal(size=(4, 16)).astype("float32")
    np.testing.assert_allclose(load_model(path, "tflite").predict(x)["out"], np.asarray(model(x)), atol=1e-5)


def test_an_exporter_returning_a_file_inside_its_folder(model, tmp_path):
    missing = formats.missing_runtime("tfjs", export=True)
    if missing is not None:
        pytest.skip(f"tfjs export unavailable: {missing}")
    cache = ExportCache(tmp_path)
    first = cache.export(model, "tfjs")
    assert first.name == "model.json" and first.parent.name == "tfjs" and first.exists()
    assert ExportCache(tmp_path).export(model, "tfjs") == first


def test_key_sees_the_input_names_keras_numbers_per_process():
    """An unnamed Keras input is ``keras_tensor_<n>``, n counted per process, and an export
    names its inputs after it: an entry made under other names must not be hit (its inputs
    would not match the batches of this process, keyed by this model's names)."""
    import keras

    def build(name):
        keras.utils.set_random_seed(0)
        x = keras.Input((4,), name=name)
        return keras.Model(x, keras.layers.Dense(2, name="out")(x), name="m")

    cache = ExportCache(Path("unused"))
    assert cache.key(build("a"), "tflite", {}) == cache.key(build("a"), "tflite", {})
    assert cache.key(build("a"), "tflite", {}) != cache.key(build("b"), "tflite", {})
