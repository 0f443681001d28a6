"""Every ```python block of README.md and docs/*.md is run, or marked as a fragment.

A block is one of:

- a **fragment**: the line right before its fence is ``<!-- fragment: why -->`` (the reason is
  mandatory). It is not run. Keep these few: a fixture or a marker to paste into your own suite.
- a **suite file**: its first line names the file (``# conftest.py``, ``# test_parity.py: ...``).
  The file blocks of one doc form one suite, written into a ``pytester`` directory and run with
  ``runpytest`` (in the test's process: TensorFlow is imported once); a ``conftest.py`` block, or a file name already in the suite, starts
  a new one. A suite without a conftest gets :func:`default_conftest`, one without a test file
  :data:`DEFAULT_TEST`. It must pass (no failure or error, at least one test passed) and show
  what :data:`SUITES` says its doc states.
- a **script**: it starts with its imports. Each runs as ``__main__`` (``runpy.run_path``) in a
  directory of its own, with ``MODELPARITY_CACHE_DIR`` of its own; all of them in one Python
  subprocess, so TensorFlow is imported once (about 5 s each on a 2-core machine), and each
  block's test reads its own result.

Anything else fails :func:`test_every_python_block_is_run_or_marked`, so a new example cannot
slip in unrun. The names a block uses but leaves to the reader (``keras_model``, ``x``,
``build_my_model``...) are given by the test (:data:`SCRIPT_GIVEN`, :data:`CONFTEST_GIVEN`): a
script gets them as globals before it runs, a conftest has their definitions appended (fixtures
read them when called), so the lines of the file are the doc's lines. A name nobody defines
fails, naming it.

Time: about 45 s on a 2-core machine (the suites use tiny models and a few formats; run
every default format by hand when changing the examples: ``SUITES`` names them).
"""

from __future__ import annotations

import ast
import builtins
import fnmatch
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>.*)$")  # any info string: "```python title=x" too
FRAGMENT = re.compile(r"^\s*<!--\s*fragment\b(?P<rest>.*?)-->\s*$")
FILE_LINE = re.compile(r"^#\s*(?P<name>[\w./-]+\.py)\b")
PYTHON = {"python", "py", "python3"}


@dataclass(frozen=True)
class Block:
    doc: str        # path relative to the repository root
    line: int       # 1-based line of the opening fence
    section: str    # the heading above it
    code: str       # dedented to the fence
    marker: str | None  # the line before the fence when it is a fragment comment

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def file_name(self) -> str | None:
        first = self.code.splitlines()[0] if self.code.strip() else ""
        match = FILE_LINE.match(first)
        return match.group("name") if match else None

    @property
    def fragment_reason(self) -> str | None:
        if self.marker is None:
            return None
        match = FRAGMENT.match(self.marker)
        reason = match.group("rest").strip() if match else ""
        return reason[1:].strip() if reason.startswith(":") else ""

    @property
    def kind(self) -> str:
        if self.marker is not None:
            return "fragment"
        if self.file_name:
            return "file"
        statements = [ln for ln in self.code.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        defines_tests = re.search(r"^\s*def test_", self.code, flags=re.M)
        if statements and statements[0].startswith(("import ", "from ")) and not defines_tests:
            return "script"
        return "unknown"


def python_blocks() -> list[Block]:
    blocks = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        section, i = "", 0
        while i < len(lines):
            if lines[i].startswith("#"):
                section = lines[i].lstrip("#").strip()
            fence = FENCE.match(lines[i])
            if not fence:
                i += 1
                continue
            indent, end = fence.group("indent"), i + 1
            while end < len(lines) and not re.match(r"^\s*```\s*$", lines[end]):
                end += 1
            words = fence.group("info").replace("{", " ").split()
            if words and words[0].lower() in PYTHON:
                body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1:end]]
                before = lines[i - 1] if i else ""
                blocks.append(Block(str(doc.relative_to(ROOT)), i + 1, section, "\n".join(body) + "\n",
                                    before if FRAGMENT.match(before) else None))
            i = end + 1
    return blocks


BLOCKS = python_blocks()


def free_names(code: str) -> set[str]:
    """Names the code reads but never binds (approximate: any binding anywhere counts)."""
    tree = ast.parse(code)
    bound: set[str] = set()
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return read - bound - set(dir(builtins))


# -- what the test gives the names a doc leaves to the reader ------------------------------------

# A script's names: each line runs in the script runner (tests/ on sys.path) before the script.
SCRIPT_GIVEN = {
    "keras_model": "keras_model = _tiny_cnn()",
    "model": "model = _tiny_cnn()",
    "x": "x = _images(4)",
    "batch1": "batch1 = _images(8, seed=1)",
    "batch2": "batch2 = _images(8, seed=2)",
    "expected_array": "expected_array = np.asarray(_tiny_cnn()(_images(4), training=False))",
    "actual_array": "actual_array = np.asarray(_tiny_cnn()(_images(4), training=False)) + np.float32(1e-7)",
    "tmp_path": "tmp_path = pathlib.Path('tmp_path'); tmp_path.mkdir()",
}

# A conftest's names: the factory its modelparity_source returns, appended to the file.
CONFTEST_GIVEN = {"build_my_model", "build_my_keras_model"}

# The suite's model (SUITES "model"), built in the pytest subprocess by a function of tests/.
MODELS = {
    "tiny_cnn": ("models", "tiny_cnn()"),
    # trained on the digits (a few seconds): what int8 quantisation costs depends on real weights
    "digits_cnn": ("digits", "digits_cnn()[0]"),
}


def conftest_given(model: str) -> str:
    module, call = MODELS[model]
    return "\n".join([
        "", "",
        "# -- appended by tests/test_doc_examples.py: the factory the doc leaves to you --",
        "def build_my_keras_model():",
        "    import sys",
        f"    sys.path.insert(0, {str(TESTS)!r})",
        f"    from {module} import {call.split('(')[0]}",
        f"    return {call}",
        "",
        "",
        "build_my_model = build_my_keras_model",
        ""])


def default_conftest(model: str) -> str:
    return ("import pytest\n\n\n@pytest.fixture(scope=\"session\")\ndef modelparity_source():\n"
            "    return build_my_model\n" + conftest_given(model))


DEFAULT_TEST = textwrap.dedent('''
    from pytest_modelparity import assert_outputs_close

    def test_export(parity_candidate, parity_reference, parity_batch):
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
''')

# How each doc's suites run: the model behind build_my_model, the formats (fast ones; the docs
# allow narrowing them), extra options, whether the model's held-out rows are written as
# rows.npz first, and the lines the doc says the run shows (fnmatch, in any order).
DEFAULT_SUITE: dict[str, Any] = {"model": "tiny_cnn", "formats": "keras,tflite", "args": (), "expect": ()}
SUITES: dict[str, dict[str, Any]] = {
    # "ids like test_export[saved_model-cpu]"
    "README.md": {"model": "tiny_cnn", "formats": "keras,saved_model,tflite", "args": (),
                  "expect": ("*test_export[[]saved_model-cpu[]] PASSED*",
                             "*test_batch_invariant[[]tflite-cpu[]] PASSED*")},
    # "Ids read test_export[saved_model-cpu]"; the Hypothesis tests draw from the pixels' range
    # and from real rows, on tflite:int8 too, which calibrates on those rows: a trained model,
    # its held-out digits as rows.npz, and its inputs' range [0, 1] as modelparity_elements
    "docs/plugin.md": {"model": "digits_cnn", "formats": "saved_model,tflite,tflite:int8",
                       "args": ("--modelparity-data=rows.npz", "--modelparity-input-range=image=0,1"),
                       "rows": True,
                       "expect": ("*test_export[[]saved_model-cpu[]] PASSED*",
                                  "*test_random_batches[[]tflite:int8-cpu[]] PASSED*",
                                  "*test_real_rows[[]tflite:int8-cpu[]] PASSED*",
                                  "*test_mobile[[]tflite-cpu[]] PASSED*")},
}


def suites() -> list[list[Block]]:
    out: list[list[Block]] = []
    current: list[Block] = []
    for block in BLOCKS:
        if block.kind != "file":
            continue
        names = {b.file_name for b in current}
        if (not current or current[0].doc != block.doc or block.file_name == "conftest.py"
                or block.file_name in names):
            current = []
            out.append(current)
        current.append(block)
    return out


SUITE_LIST = suites()
SCRIPTS = [b for b in BLOCKS if b.kind == "script"]


def _installed_cache_root() -> Path:
    """The npm modules of the tfjs runner live under the real cache root; pytester moves HOME."""
    from pytest_modelparity.runtime.tfjs_runner import cache_root

    return cache_root()


REAL_CACHE = _installed_cache_root()


def _tfjs_missing(block: Block) -> str | None:
    """Why a block that runs the tfjs format cannot run here (as the tfjs tests skip), else None."""
    if '"tfjs"' not in block.code:
        return None
    import shutil

    from pytest_modelparity.runtime.tfjs_runner import INSTALL_COMMAND, is_installed

    if shutil.which("node") is None:
        return "Node.js is not installed (apt-get install nodejs npm)"
    if not is_installed():
        return f"the Node runner's npm modules are not installed: {INSTALL_COMMAND}"
    return None


# -- the inventory ------------------------------------------------------------------------------

def test_every_python_block_is_run_or_marked() -> None:
    assert len(BLOCKS) >= 10, f"found only {len(BLOCKS)} python blocks: is the fence parser broken?"
    problems = []
    for block in BLOCKS:
        if block.kind == "unknown":
            problems.append(f"{block.id} ({block.section}): neither a script (starts with its imports), a suite "
                            "file (first line '# conftest.py' / '# test_x.py') nor marked "
                            "'<!-- fragment: reason -->' on the line before the fence")
        elif block.kind == "fragment" and not block.fragment_reason:
            problems.append(f"{block.id}: a fragment needs its reason: <!-- fragment: why it cannot run -->")
        else:
            try:
                ast.parse(block.code)
            except SyntaxError as exc:
                problems.append(f"{block.id}: not valid Python: {exc}")
    assert not problems, "\n".join(problems)


def test_fragments_stay_few() -> None:
    fragments = [b for b in BLOCKS if b.kind == "fragment"]
    assert len(fragments) <= len(BLOCKS) // 3, [f"{b.id}: {b.fragment_reason}" for b in fragments]


def test_every_name_a_block_reads_is_defined_by_it_or_the_test() -> None:
    missing = []
    for block in BLOCKS:
        if block.kind in ("file", "script"):
            given = (CONFTEST_GIVEN if block.file_name == "conftest.py"
                     else set(SCRIPT_GIVEN) if block.kind == "script" else set())
            unknown = free_names(block.code) - given
            if unknown:
                missing.append(f"{block.id}: reads {sorted(unknown)}, which neither it nor the test defines")
    assert not missing, "\n".join(missing)


# -- suites -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shared_export_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One export cache for every suite: the same tiny model is exported once."""
    return tmp_path_factory.mktemp("doc-export-cache")


@pytest.mark.parametrize("suite", SUITE_LIST, ids=lambda s: "+".join([s[0].id, *(str(b.line) for b in s[1:])]))
def test_suite_passes(suite: list[Block], pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                      shared_export_cache: Path) -> None:
    config = SUITES.get(suite[0].doc, DEFAULT_SUITE)
    files: dict[str, str] = {}
    for block in suite:
        code, name = block.code, block.file_name or ""
        if name == "conftest.py" and free_names(code) & CONFTEST_GIVEN:
            code += conftest_given(config["model"])
        files[name] = code
    files.setdefault("conftest.py", default_conftest(config["model"]))
    if not any(Path(name).name.startswith("test_") for name in files):
        files["test_default.py"] = DEFAULT_TEST
    for name, code in files.items():
        target = pytester.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(code)
    if config.get("rows"):
        import numpy as np

        from digits import digits_data

        assert config["model"] == "digits_cnn", "rows.npz holds the digits model's held-out rows"
        np.savez(pytester.path / "rows.npz", image=digits_data()[2])
    monkeypatch.setenv("MODELPARITY_CACHE_DIR", str(REAL_CACHE))  # npm modules, should tfjs be named
    # in this process (issue 49): what is tested is the doc's suite, not a fresh Python; a child
    # session imported TensorFlow again (and trained the digits net again) for nothing it reads
    result = pytester.runpytest(
        "-v", "-p", "no:cacheprovider", f"--modelparity-formats={config['formats']}",
        f"--modelparity-cache-dir={shared_export_cache}", "--modelparity-export-process=inline",
        *config["args"])
    text = result.stdout.str()
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes.get("passed", 0) >= 1, text[-6000:] + result.stderr.str()[-3000:]
    assert not outcomes.get("failed") and not outcomes.get("errors"), text[-6000:]
    lines = result.stdout.lines
    unmatched = [want for want in config["expect"] if not any(fnmatch.fnmatch(line, want) for line in lines)]
    assert not unmatched, f"the doc says the run shows {unmatched}; it showed:\n{text[-6000:]}"


# -- scripts ------------------------------------------------------------------------------------

RUNNER = textwrap.dedent('''
    """Run doc scripts one after the other in one process: each in its own directory."""
    import contextlib, io, json, os, pathlib, runpy, sys, time, traceback
    sys.path.insert(0, sys.argv[2])

    import numpy as np
    import keras
    from models import images as _images, tiny_cnn as _tiny_cnn
    from pytest_modelparity.errors import RuntimeMissing

    spec = json.loads(pathlib.Path(sys.argv[1]).read_text())
    results = {}
    for job in spec["jobs"]:
        os.chdir(job["dir"])
        os.environ["MODELPARITY_CACHE_DIR"] = job["cache"]
        keras.backend.clear_session()
        out = io.StringIO()
        start = time.monotonic()
        status, detail = "passed", ""
        try:
            scope = {"np": np, "pathlib": pathlib, "_tiny_cnn": _tiny_cnn, "_images": _images}
            for line in job["provide"]:
                exec(line, scope)
            given = {name: scope[name] for name in job["names"]}
            with contextlib.redirect_stdout(out):
                runpy.run_path(job["file"], init_globals=given, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (0, None):
                status, detail = "failed", f"exit status {exc.code!r}"
        except RuntimeMissing as exc:
            status, detail = "skipped", str(exc)
        except BaseException:
            status, detail = "failed", traceback.format_exc()
        results[job["id"]] = {"status": status, "detail": detail, "stdout": out.getvalue()[-4000:],
                              "seconds": round(time.monotonic() - start, 2)}
        pathlib.Path(spec["results"]).write_text(json.dumps(results))
''')


@pytest.fixture(scope="module")
def script_results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Run the selected script blocks in one subprocess; ``{block id: result}``."""
    wanted = {item.callspec.params["block"].id for item in request.session.items
              if getattr(item, "originalname", "") == "test_script_runs" and hasattr(item, "callspec")}
    base = tmp_path_factory.mktemp("doc-scripts")
    installed = REAL_CACHE / "tfjs-node-modules"
    jobs = []
    for n, block in enumerate(b for b in SCRIPTS if b.id in wanted and not _tfjs_missing(b)):
        work = base / f"{n:02d}-{Path(block.doc).stem}-{block.line}"
        cache = work.parent / f"{work.name}-cache"
        work.mkdir()
        cache.mkdir()
        if installed.is_dir():
            (cache / "tfjs-node-modules").symlink_to(installed, target_is_directory=True)
        script = work.parent / f"{work.name}.py"  # beside, so the script sees an empty directory
        script.write_text(block.code)
        names = sorted(free_names(block.code) & set(SCRIPT_GIVEN))
        jobs.append({"id": block.id, "dir": str(work), "cache": str(cache), "file": str(script),
                     "names": names, "provide": [SCRIPT_GIVEN[name] for name in names]})
    results_path = base / "results.json"
    (base / "spec.json").write_text(json.dumps({"jobs": jobs, "results": str(results_path)}))
    (base / "runner.py").write_text(RUNNER)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, str(base / "runner.py"), str(base / "spec.json"), str(TESTS)],
                          capture_output=True, text=True, env=env, timeout=600, cwd=base)
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    for job in jobs:
        results.setdefault(job["id"], {"status": "failed", "seconds": None, "stdout": proc.stdout[-4000:],
                                       "detail": f"the runner ended (exit status {proc.returncode}) before this "
                                                 f"block finished:\n{proc.stderr[-4000:]}"})
    return results


@pytest.mark.parametrize("block", SCRIPTS, ids=lambda b: b.id)
def test_script_runs(block: Block, script_results: dict) -> None:
    missing = _tfjs_missing(block)
    if missing:
        pytest.skip(f"{block.id}: {missing}")
    result = script_results[block.id]
    print(f"{block.id}: {result['status']} in {result['seconds']} s\n{result['stdout']}")
    if result["status"] == "skipped":
        pytest.skip(f"{block.id}: {result['detail']}")
    assert result["status"] == "passed", (
        f"{block.id} ({block.section}) failed (line N of the script is line {block.line} + N of the doc):\n"
        f"{result['detail']}\nstdout:\n{result['stdout']}")
