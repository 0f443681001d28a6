"""docs/ci.md's GitHub Actions workflow, parsed as YAML and checked against the plugin: it
installs the plugin (extras that exist) and the tfjs converter without its pins, restores and
saves the export cache and the TFJS runner in the directory the plugin uses, runs ``-n auto``
with options the plugin has, and uploads the JSON and HTML reports it writes, also after a
failure. A recipe that drifts from the code fails here."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml parses the workflow: pip install 'pytest-modelparity[test]'")

ROOT = Path(__file__).resolve().parents[1]


def _workflow() -> dict:
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "ci.md").read_text(), flags=re.S)
    assert len(blocks) == 1, "docs/ci.md should hold exactly one workflow"
    return yaml.safe_load(blocks[0])


@pytest.fixture(scope="module")
def job() -> dict:
    workflow = _workflow()
    assert workflow.get("on", workflow.get(True))  # YAML 1.1 reads the key `on` as True
    (job,) = workflow["jobs"].values()
    return job


def _step(job: dict, uses: str | None = None, run: str | None = None) -> tuple[int, dict]:
    for i, step in enumerate(job["steps"]):
        if (uses and str(step.get("uses", "")).startswith(uses)) or (run and run in str(step.get("run", ""))):
            return i, step
    raise AssertionError(f"no step {'uses ' + uses if uses else 'runs ' + str(run)}")


def test_it_sets_up_python_and_a_node_the_tfjs_runner_accepts(job):
    _step(job, uses="actions/checkout@")
    _, python = _step(job, uses="actions/setup-python@")
    assert tuple(int(p) for p in str(python["with"]["python-version"]).split(".")) >= (3, 10)
    _, node = _step(job, uses="actions/setup-node@")
    assert int(str(node["with"]["node-version"]).split(".")[0]) >= 18


def test_it_installs_extras_that_exist_and_tensorflowjs_without_its_pins(job):
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    _, install = _step(job, run="pytest-modelparity[")
    asked = re.findall(r"pytest-modelparity\[([\w,]+)\]", install["run"])
    assert asked and all(set(a.split(",")) <= extras for a in asked), (asked, extras)
    assert re.search(r"pip install --no-deps tensorflowjs==4\.22\.0", install["run"])
    # -n auto needs pytest-xdist: the [all] extra brings it (issue 24: it did not, and a separate
    # pip line was the only thing installing it)
    all_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["all"][0]
    assert any("all" in a.split(",") for a in asked) and "xdist" in all_extra


def test_it_caches_the_directory_the_plugin_and_the_tfjs_runner_use(job):
    cache_env = job["env"]["MODELPARITY_CACHE_DIR"]
    i_cache, cache = _step(job, uses="actions/cache@")
    paths = cache["with"]["path"].strip().splitlines()
    assert "${{ env.MODELPARITY_CACHE_DIR }}" in paths and "!${{ env.MODELPARITY_CACHE_DIR }}/logs" in paths
    assert "${{ github.run_id }}" in cache["with"]["key"]  # a new key per run saves this run's exports
    assert cache["with"]["key"].startswith(cache["with"]["restore-keys"].split()[0])
    i_runner, runner = _step(job, run="pytest_modelparity.tfjs_runner install")
    i_tests, _ = _step(job, run="python -m pytest ")
    assert i_cache < i_runner < i_tests
    assert cache_env.endswith(".modelparity-cache")
    # The runner installs under $MODELPARITY_CACHE_DIR (what the cache step saves), not elsewhere.
    from pytest_modelparity.runtime.tfjs_runner import modules_dir

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELPARITY_CACHE_DIR", "/ws/.modelparity-cache")
        assert str(modules_dir()).startswith("/ws/.modelparity-cache/tfjs-node-modules/")


def _pytest_args(job) -> list[str]:
    _, run = _step(job, run="python -m pytest ")
    return shlex.split(run["run"])[3:]


def test_it_runs_every_core_and_uploads_the_reports_it_writes_even_after_a_failure(job):
    args = _pytest_args(job)
    assert args[args.index("-n") + 1] == "auto"
    written = {a.split("=", 1)[1] for a in args if a.startswith(("--modelparity-report=", "--modelparity-html="))}
    assert len(written) == 2
    _, upload = _step(job, uses="actions/upload-artifact@")
    assert upload.get("if") == "always()"
    assert written <= set(upload["with"]["path"].strip().splitlines())


def test_the_plugin_accepts_its_options(job, pytester: pytest.Pytester):
    """The workflow's pytest options, less ``-n``, start a real session (a typo is a usage error)."""
    args = [a for a in _pytest_args(job) if a not in ("-n", "auto")]
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()[-2000:] + result.stderr.str()[-2000:]
    assert (pytester.path / "reports" / "modelparity.json").is_file()
    assert (pytester.path / "reports" / "modelparity.html").is_file()
