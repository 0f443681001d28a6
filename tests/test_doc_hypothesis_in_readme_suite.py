"""docs/plugin.md's Hypothesis blocks copied, as they are, next to the README's one-fixture
conftest: the random-batch test runs there; the real-rows test says on one screen what it
needs (rows) instead of a traceback ending in ``dataset is None``, and runs once given them."""

from __future__ import annotations

import numpy as np
import pytest
from test_doc_examples import BLOCKS, conftest_given

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]


def _files() -> dict[str, str]:
    readme_conftest = [b for b in BLOCKS if b.doc == "README.md" and b.file_name == "conftest.py"]
    hypothesis = [b for b in BLOCKS if b.doc == "docs/plugin.md" and b.section == "Hypothesis" and b.kind == "file"]
    assert len(readme_conftest) == 1 and [b.file_name for b in hypothesis] == ["test_hypothesis.py", "test_real_rows.py"]
    files = {"conftest.py": readme_conftest[0].code + conftest_given("tiny_cnn")}
    files.update({str(b.file_name): b.code for b in hypothesis})
    return files


def test_the_hypothesis_blocks_in_the_readme_suite(pytester: pytest.Pytester, _heavy_modules_stay_loaded: None) -> None:
    for name, code in _files().items():
        (pytester.path / name).write_text(code)
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=keras", "--hypothesis-seed=0")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*_ test_real_rows[[]keras-cpu[]] _*",
                                 "dataset_batches(model, dataset=None): *(modelparity_dataset is None)*"
                                 "--modelparity-data=rows.npz*modelparity_dataset in conftest.py*strategies.batches(model)*"])
    out = result.stdout.str()
    assert "Traceback" not in out and "Falsifying" not in out and "reproduce_failure" not in out
    assert len(out[out.index("= FAILURES ="):out.index("short test summary info")].splitlines()) < 10

    np.savez(pytester.path / "rows.npz", image=np.random.default_rng(0).uniform(-1, 1, (40, 8, 8, 3)).astype("float32"))
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=keras", "--hypothesis-seed=0",
                                "--modelparity-data=rows.npz")
    result.assert_outcomes(passed=2)
