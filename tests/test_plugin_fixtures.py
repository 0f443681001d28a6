"""Fixtures, ids, session scoping, the marker and missing runtimes/devices (pytester).

Each run uses a tiny Dense model and the cheap formats (keras, saved_model) so the suite
stays fast; TensorFlow is imported once by this process and reused by in-process runs.
"""

from __future__ import annotations

import json
import textwrap

import pytest

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]

CONFTEST = textwrap.dedent('''
    import pytest

    BUILDS = []

    def build():
        import keras
        BUILDS.append(1)
        x = keras.Input((6,), name="x")
        h = keras.layers.Dense(5, activation="relu", name="h",
                               kernel_initializer=keras.initializers.GlorotUniform(seed=1))(x)
        y = keras.layers.Dense(3, name="out", kernel_initializer=keras.initializers.GlorotUniform(seed=2))(h)
        return keras.Model(x, y, name="tiny")

    @pytest.fixture(scope="session")
    def modelparity_source():
        return build
''')


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    return pytester


def test_ids_session_scoping_and_one_export_per_format(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_parity='''
        import conftest
        from pytest_modelparity import assert_outputs_close
        SEEN = {}

        def _seen(fmt, model):
            SEEN.setdefault(fmt, set()).add(id(model))

        def test_export(parity_candidate, parity_reference, parity_batch, modelparity_format):
            _seen(modelparity_format, parity_candidate)
            assert parity_candidate.format == modelparity_format
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)

        def test_again(parity_candidate, modelparity_format):
            _seen(modelparity_format, parity_candidate)

        def test_reference_only(parity_reference, modelparity_device):
            assert parity_reference.device == modelparity_device

        def test_zz_once():
            assert conftest.BUILDS == [1], "the factory must run once per session"
            assert sorted(SEEN) == ["keras", "saved_model"]
            assert all(len(ids) == 1 for ids in SEEN.values()), SEEN
    ''')
    suite.makepyfile(test_other_module='''
        def test_elsewhere(parity_candidate, parity_reference):
            assert parity_candidate.inputs == parity_reference.inputs
    ''')
    result = suite.runpytest("-v", "--modelparity-formats=keras,saved_model", "--modelparity-report=r.json")
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines(["*test_export[[]keras-cpu[]] PASSED*", "*test_export[[]saved_model-cpu[]] PASSED*",
                                 "*test_again[[]saved_model-cpu[]] PASSED*", "*test_reference_only[[]cpu[]] PASSED*"])
    doc = json.loads((suite.path / "r.json").read_text())
    # 8 tests in two modules, 2 formats: each exported exactly once
    assert sorted(a["format"] for a in doc["artifacts"]) == ["keras", "saved_model"]


def test_batch_is_seeded_and_read_only(suite: pytest.Pytester) -> None:
    suite.makepyfile('''
        import numpy as np, pytest
        from pytest_modelparity.checks.strategies import seeded_batch

        def test_batch(parity_batch, parity_reference):
            assert list(parity_batch) == ["x"] and parity_batch["x"].shape == (4, 6)
            np.testing.assert_array_equal(parity_batch["x"], seeded_batch(parity_reference)["x"])
            with pytest.raises(ValueError):
                parity_batch["x"][0, 0] = 1.0
    ''')
    suite.runpytest().assert_outcomes(passed=1)


def test_marker_narrows_the_matrix_and_sets_the_tolerance(suite: pytest.Pytester) -> None:
    suite.makeini("[pytest]\nmodelparity_rtol = 0.125\n")
    suite.makepyfile('''
        import pytest
        from pytest_modelparity import assert_outputs_close

        @pytest.mark.modelparity(formats=["saved_model"], rtol=0.5, atol=0.25)
        def test_marked(parity_candidate, parity_reference, parity_batch):
            tol = assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch).outputs[0].tolerance
            assert (tol.rtol, tol.atol, tol.source) == (0.5, 0.25, "marker")

        @pytest.mark.modelparity(formats="keras")
        def test_ini_layer(parity_candidate, parity_reference, parity_batch):
            tol = assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch).outputs[0].tolerance
            assert tol.rtol == 0.125 and "ini" in tol.source

        def test_argument_wins(parity_candidate, parity_reference, parity_batch):
            tol = assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch,
                                       rtol=0.0, atol=0.01).outputs[0].tolerance
            assert (tol.rtol, tol.atol, tol.source) == (0.0, 0.01, "argument")

        @pytest.mark.modelparity(devices=["gpu"])
        def test_gpu_only(parity_reference):
            pass
    ''')
    result = suite.runpytest("-v", "-rs", "--modelparity-formats=keras,saved_model")
    result.stdout.fnmatch_lines(["*test_marked[[]saved_model-cpu[]] PASSED*", "*test_ini_layer[[]keras-cpu[]] PASSED*"])
    assert "test_marked[keras-cpu]" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*test_gpu_only[[]none[]] SKIPPED*",
                                 "SKIPPED*modelparity: the marker's devices are not among those selected by "
                                 "--modelparity-device (cpu)"])
    result.assert_outcomes(passed=4, skipped=1)


def _without_node(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def test_missing_runtime_skips_with_the_install_hint(suite: pytest.Pytester, monkeypatch, tmp_path) -> None:
    _without_node(monkeypatch, tmp_path)  # a real machine without Node.js: no tfjs runtime
    suite.makepyfile("def test_export(parity_candidate): pass")
    result = suite.runpytest("-rs", "--modelparity-formats=tfjs,keras")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*modelparity: format 'tfjs' on cpu: Node.js is not available; "
                                 "install it with: *apt-get install nodejs npm*"])


def test_strict_turns_a_missing_runtime_into_a_failure(suite: pytest.Pytester, monkeypatch, tmp_path) -> None:
    _without_node(monkeypatch, tmp_path)
    suite.makepyfile("def test_export(parity_candidate): pass")
    result = suite.runpytest("--modelparity-formats=tfjs", "--modelparity-strict")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*Node.js is not available*--modelparity-strict turns this skip into a failure*"])


def _tf_sees_gpu() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def test_missing_gpu_skips_with_reason_or_fails_when_strict(suite: pytest.Pytester) -> None:
    suite.makepyfile("def test_export(parity_candidate, parity_reference): pass")
    if _tf_sees_gpu():  # on a GPU machine the same run must pass on the GPU
        suite.runpytest("--modelparity-device=gpu", "--modelparity-formats=saved_model").assert_outcomes(passed=1)
        return
    result = suite.runpytest("-rs", "--modelparity-device=cpu,gpu", "--modelparity-formats=saved_model")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*modelparity: * on gpu: *TensorFlow sees no GPU*"])
    # Strict: one message before collection, not one error per test (tests/test_gpu_matrix.py).
    strict = suite.runpytest("--modelparity-device=gpu", "--modelparity-formats=saved_model", "--modelparity-strict")
    assert strict.ret == pytest.ExitCode.USAGE_ERROR
    strict.stderr.fnmatch_lines(["*device 'gpu' is not on this machine*--modelparity-strict*"])


def test_without_a_source_the_error_says_what_to_define(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_export(parity_reference): pass")
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*no model to test. Define a session-scoped fixture in conftest.py*",
                                 "*--modelparity-model=PATH|module:factory|demo*"])


def test_a_saved_file_is_a_source_and_is_never_rewritten(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('''
        import pytest

        @pytest.fixture(scope="session")
        def modelparity_source(tmp_path_factory):
            import keras
            x = keras.Input((4,), name="x")
            model = keras.Model(x, keras.layers.Dense(2, name="y")(x))
            path = tmp_path_factory.mktemp("m") / "model.keras"
            model.save(path)
            return path
    ''')
    pytester.makepyfile('''
        import os
        from pytest_modelparity import assert_outputs_close

        def test_export(modelparity_source, parity_candidate, parity_reference, parity_batch, modelparity_format):
            before = os.stat(modelparity_source).st_mtime_ns
            assert parity_reference.source == str(modelparity_source.resolve())
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
            assert os.stat(modelparity_source).st_mtime_ns == before

        def test_in_place(modelparity_source, parity_candidate, modelparity_format):
            if modelparity_format == "keras":  # same format: loaded in place, not exported
                assert parity_candidate.source == str(modelparity_source.resolve())
    ''')
    result = pytester.runpytest("-rs", "--modelparity-formats=keras,saved_model")
    # the .keras file as the keras candidate is the source compared with itself: skipped, said so
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines(["modelparity: NOT COMPARED: keras for model * (--modelparity-formats): compared with itself*"])
    result.stdout.fnmatch_lines(["SKIPPED*format 'keras' on cpu compared with itself*"])


def test_cache_dir_option_and_no_cache(suite: pytest.Pytester) -> None:
    suite.makepyfile("def test_export(parity_candidate): pass")
    suite.runpytest("--modelparity-formats=saved_model", "--modelparity-cache-dir=mycache",
                    "--modelparity-report=r.json").assert_outcomes(passed=1)
    (artifact,) = json.loads((suite.path / "r.json").read_text())["artifacts"]
    assert artifact["path"].startswith(str(suite.path / "mycache" / "saved_model"))
    suite.runpytest("--modelparity-formats=saved_model", "--modelparity-no-cache", "--modelparity-cache-dir=other",
                    "--modelparity-report=r2.json").assert_outcomes(passed=1)
    (artifact,) = json.loads((suite.path / "r2.json").read_text())["artifacts"]
    assert not (suite.path / "other").exists() and not artifact["path"].startswith(str(suite.path))
