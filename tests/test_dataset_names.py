"""Real rows whose array names match no input: one screen (the names in the file, the model's
inputs, the fix), not the traceback through the fixtures that read them."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from pytest_modelparity.checks.dataset import as_dataset
from pytest_modelparity.errors import DatasetMismatch, InvalidArgumentError
from pytest_modelparity.formats.base import TensorSpec

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker


def test_the_text_lists_both_sides_and_pairs_an_array_that_fits_by_shape(tmp_path) -> None:
    path = tmp_path / "rows.npz"
    np.savez(path, pixels=np.zeros((5, 8, 8, 3), np.float32), label=np.zeros(5))
    specs = [TensorSpec("image", (None, 8, 8, 3), np.dtype("float32"))]
    with pytest.raises(DatasetMismatch) as info:
        as_dataset(str(path)).arrays(specs)
    text = str(info.value)
    assert isinstance(info.value, InvalidArgumentError)  # callers catching the old error still do
    assert "'label': (5,) float64" in text and "'pixels': (5, 8, 8, 3) float32" in text
    assert "'image': (None, 8, 8, 3) float32" in text
    assert f"np.savez({str(path)!r}, image=rows['pixels'])" in text
    assert len(text.splitlines()) <= 12


def test_rows_returned_by_a_fixture_get_the_fixture_fix() -> None:
    specs = [TensorSpec("a", (None, 2), np.dtype("float32")), TensorSpec("b", (None, 3), np.dtype("float32"))]
    with pytest.raises(DatasetMismatch, match=r"return \{'a': \.\.\., 'b': \.\.\.\} from modelparity_dataset"):
        as_dataset({"left": np.zeros((4, 2)), "right": np.zeros((4, 3)), "extra": np.zeros(4)}).arrays(specs)


def test_a_run_with_misnamed_rows_shows_one_screen_per_test(pytester: pytest.Pytester,
                                                            _heavy_modules_stay_loaded: None) -> None:
    np.savez(pytester.path / "rows.npz", pixels=np.zeros((6, 4), np.float32), label=np.zeros(6))
    pytester.makepyfile(test_p=textwrap.dedent('''
        from pytest_modelparity import assert_outputs_close

        def test_export(parity_candidate, parity_reference, parity_batch):
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
    '''))
    result = pytester.runpytest("--modelparity-model=demo", "--modelparity-formats=keras",
                                "--modelparity-data=rows.npz", "-k", "test_export or outputs_close")
    result.assert_outcomes(failed=1, errors=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["*ERROR at setup of test_export[[]keras-cpu[]]*",
                                 "modelparity_dataset '*rows.npz': arrays [[]'label', 'pixels'] match none of the model's inputs "
                                 "[[]'image']: name each array after its input",
                                 "    'label': (6,) float64", "    'pixels': (6, 4) float32",
                                 "  the model takes 1 input(s):", "    'image': (None, 8, 8, 3) float32",
                                 "  fix, e.g.:", "    rows = np.load(*); np.savez(*, image=<rows of 'image'>)"])
    assert "Traceback" not in out and "fixtures.py" not in out and "dataset.py" not in out
    # both failures together fit on a screen, where each used to be a ~500-line traceback
    start = out.index("= ERRORS =")
    assert len(out[start:out.index("short test summary info")].splitlines()) < 30
