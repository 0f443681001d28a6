"""Every source cached: a SavedModel folder, a frozen ``.pb`` or a TF1 checkpoint given as the
source is keyed by its files' bytes (not their path, not their times) and its load options, so
its conversions come from the export cache in the next session; a changed file is a miss."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

# inline_exports (conftest.py): no export worker; the process is not what these tests are about
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]


def _saved_model(path: Path, seed: int) -> Path:
    import keras

    from pytest_modelparity import export_model

    x = keras.Input((6,), name="x")
    y = keras.layers.Dense(3, name="out", kernel_initializer=keras.initializers.GlorotUniform(seed=seed))(x)
    return Path(export_model(keras.Model(x, y, name="tiny"), "saved_model", path))


def test_the_key_is_the_files_content_not_their_path_or_times(tmp_path: Path) -> None:
    from pytest_modelparity.exports.cache import ExportCache

    cache = ExportCache(tmp_path / "cache")
    first = _saved_model(tmp_path / "a" / "saved_model", seed=1)
    copy = tmp_path / "b" / "elsewhere"
    shutil.copytree(first, copy)
    os.utime(copy / "saved_model.pb", (1, 1))  # another time: the same content
    assert cache.key(str(first), "tflite") == cache.key(copy, "tflite")
    assert cache.key(first, "tflite") != cache.key(first, "onnx")
    assert cache.key(first, "tflite", {"inputs": ["x:0"]}) != cache.key(first, "tflite")  # load options
    other = _saved_model(tmp_path / "c" / "saved_model", seed=2)
    shutil.rmtree(copy / "variables")
    shutil.copytree(other / "variables", copy / "variables")  # other weights, same graph
    assert cache.key(copy, "tflite") != cache.key(first, "tflite")


SUITE = textwrap.dedent('''
    def test_close(parity_candidate, parity_batch, parity_reference):
        from pytest_modelparity import assert_outputs_close
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
''')


def test_a_saved_model_source_is_exported_once_across_sessions(pytester: pytest.Pytester, tmp_path: Path) -> None:
    source = _saved_model(tmp_path / "model" / "saved_model", seed=1)
    pytester.makeconftest(textwrap.dedent(f'''
        import pytest

        @pytest.fixture(scope="session")
        def modelparity_source():
            return {str(source)!r}
    '''))
    pytester.makepyfile(test_close=SUITE)
    report = pytester.path / "report.json"

    def run() -> list[dict]:
        result = pytester.runpytest("--modelparity-formats=tflite", f"--modelparity-cache-dir={tmp_path / 'cache'}",
                                    "--modelparity-export-process=inline", f"--modelparity-report={report}",
                                    "-p", "no:cacheprovider")
        result.assert_outcomes(passed=1)
        return [a for a in json.loads(report.read_text())["artifacts"] if a["format"] == "tflite"]

    (first,) = run()
    assert first["cache_hit"] is False
    (second,) = run()  # a new session: the conversion comes from the cache
    assert second["cache_hit"] is True and second["path"] == first["path"]
    other = _saved_model(tmp_path / "other" / "saved_model", seed=2)
    shutil.copy(other / "variables" / "variables.data-00000-of-00001", source / "variables")
    shutil.copy(other / "variables" / "variables.index", source / "variables")  # its checksums
    (third,) = run()  # changed weights: converted again, and the candidate still matches
    assert third["cache_hit"] is False and third["path"] != first["path"]
