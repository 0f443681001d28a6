"""A reference's measured noise floor is kept in the cache under its content key (issue 28):
a warm session builds no float64 twin and judges by the same tolerance; a damaged entry is
detected, dropped and measured again, and the run says so."""

from __future__ import annotations

import json
import textwrap

import pytest

pytest.importorskip("tensorflow", reason="the float64 twins need TensorFlow: pip install 'pytest-modelparity[tensorflow]'")
# In-process pytester runs import the runtimes once (a second import of onnx aborts the process).
pytestmark = pytest.mark.usefixtures("_heavy_modules_stay_loaded")

CONFTEST = textwrap.dedent('''
    import numpy as np
    import pytest
    from models import tiny_cnn
    from pytest_modelparity.floor import twins

    BUILT = []
    _build_runner = twins.build_runner

    def _counting(model, kind, method):  # the real builder, counted
        BUILT.append((kind, method))
        return _build_runner(model, kind, method)

    def pytest_sessionstart(session):
        BUILT.clear()
        twins.build_runner = _counting

    def pytest_sessionfinish(session):
        twins.build_runner = _build_runner
        print(f"\\ntwins built: {len(BUILT)}; float64 twins built: {sum(k == 'float64' for k, _ in BUILT)}")

    @pytest.fixture(scope="session")
    def modelparity_source():  # a normalisation after the convolutions: the sharper floor is measured too
        import keras

        cnn = tiny_cnn(3)
        return keras.Model(cnn.inputs, keras.layers.LayerNormalization(name="norm")(cnn.outputs[0]), name="normed_cnn")

    @pytest.fixture(scope="session")
    def modelparity_dataset():
        return np.random.default_rng(0).uniform(-1, 1, (6, 8, 8, 3)).astype("float32")
''')

SUITE = textwrap.dedent('''
    from pytest_modelparity import assert_outputs_close

    def test_close(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
''')

# inline: no export worker to start (its TensorFlow import would be most of each run's time)
ARGS = ("--modelparity-formats=saved_model", "--modelparity-cache-dir=cache", "--modelparity-report=r.json",
        "--modelparity-export-process=inline", "-p", "no:cacheprovider", "-p", "no:randomly", "-s")


def _run(pytester: pytest.Pytester) -> tuple[pytest.RunResult, dict]:
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(passed=1)
    rows = json.loads((pytester.path / "r.json").read_text())["rows"]
    assert len(rows) == 1 and rows[0]["twin"] == "keras", rows
    return result, rows[0]


def _tolerance(row: dict) -> tuple:
    return row["tolerance"], row["tolerance_source"], row["rtol"], row["atol"], row["scale"]


def test_a_warm_session_reads_the_floor_and_a_damaged_entry_is_measured_again(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    cold, first = _run(pytester)
    cold.stdout.fnmatch_lines(["*float64 twins built: 1*"])
    assert first["floor_cached"] is False
    # one entry per floor measured: the float64 one (by the Keras twin) and the sharper floor's
    # reordered float32 one (by the graph twin)
    entries = list((pytester.path / "cache" / "floor").glob("*.json"))
    keras = [e for e in entries if json.loads(e.read_text())["payload"]["method"] == "keras"]
    assert len(keras) == 1 and len(entries) == 2, entries

    warm, second = _run(pytester)
    warm.stdout.fnmatch_lines(["*twins built: 0;*"])  # the floors came from the cache: no twin at all
    assert second["floor_cached"] is True
    assert _tolerance(second) == _tolerance(first)  # the same Tolerance line, to the digit

    # A planted corruption: the recorded float64 error is edited, its signature left as written.
    entry = json.loads(keras[0].read_text())
    kept = dict(entry["payload"]["errors"])
    path = next(iter(kept))
    entry["payload"]["errors"][path] *= 1000
    keras[0].write_text(json.dumps(entry))
    repaired, third = _run(pytester)
    repaired.stdout.fnmatch_lines(["*float64 twins built: 1*", "*floor cache: the entry*damaged (its HMAC differs*"
                                   "measured again*"])
    assert third["floor_cached"] is False and _tolerance(third) == _tolerance(first)

    assert json.loads(keras[0].read_text())["payload"]["errors"] == kept  # whole again


def test_an_unreadable_or_implausible_entry_is_dropped(tmp_path) -> None:
    from pytest_modelparity.exports.floor_cache import FloorCache

    cache = FloorCache(tmp_path)
    cache.put("k1", {"['probs']": 1.5e-7}, "keras", None)
    assert cache.get("k1") == {"errors": {"['probs']": 1.5e-7}, "method": "keras", "reason": None}
    for planted, problem in (("{not json", "not a floor entry"), ('{"payload": {}, "hmac": "0"}', "HMAC differs")):
        cache.path("k1").write_text(planted)
        assert cache.get("k1") is None and not cache.path("k1").exists()
        assert problem in cache.notes[-1]
    cache.put("k2", {"['probs']": float("nan")}, "keras", None)  # written by hand: never by measured()
    assert cache.get("k2") is None and "not finite" in cache.notes[-1]
    assert cache.clear() == 0 and not cache.folder.exists()


def test_no_cache_keeps_no_floor(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest(*ARGS, "--modelparity-no-cache")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*float64 twins built: 1*"])
    assert not (pytester.path / "cache" / "floor").exists()


def test_the_key_follows_the_weights_the_batch_and_the_reference_outputs(tmp_path) -> None:
    from models import tiny_cnn

    from pytest_modelparity.exports.floor_cache import FloorCache

    cache = FloorCache(tmp_path)
    model = tiny_cnn(3)
    base = cache.key(model, lambda: ("float64", "batch", "outputs"))
    assert base is not None and base == cache.key(tiny_cnn(3), lambda: ("float64", "batch", "outputs"))
    others = {cache.key(model, lambda: ("float16 weights", "batch", "outputs")),
              cache.key(model, lambda: ("float64", "other batch", "outputs")),
              cache.key(model, lambda: ("float64", "batch", "outputs on a GPU")),
              cache.key(tiny_cnn(4), lambda: ("float64", "batch", "outputs"))}
    assert base not in others and len(others) == 4
    assert cache.key(object(), lambda: ("float64", "batch", "outputs")) is None  # no content key: not kept

    def unhashable() -> tuple:
        raise TypeError("a batch that cannot be digested")

    assert cache.key(model, unhashable) is None
