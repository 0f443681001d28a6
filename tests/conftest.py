"""Shared test setup: quiet TensorFlow, deterministic seeds."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import importlib
import importlib.util
import json
import pkgutil
import sys

import pytest


@pytest.fixture(scope="session")
def _heavy_modules_stay_loaded() -> None:
    """In-process pytester runs drop the modules they imported: TensorFlow cannot be imported
    twice in one process, and a re-imported pytest_modelparity module would hold a second
    Tolerance class. Importing them once, before any such run, keeps one copy of each."""
    import keras  # noqa: F401
    import tensorflow  # noqa: F401

    import pytest_modelparity

    for mod in pkgutil.walk_packages(pytest_modelparity.__path__, "pytest_modelparity."):
        if not mod.name.endswith("__main__"):
            importlib.import_module(mod.name)
    # onnx's C extension aborts the process when imported a second time (nanobind refuses its
    # enums again): a pytester run that exports to onnx must not be the one that imports it.
    for runtime in ("ai_edge_litert.interpreter", "onnxruntime", "onnx", "tf2onnx"):
        if importlib.util.find_spec(runtime.split(".")[0]):
            importlib.import_module(runtime)


@pytest.fixture
def pytester(_heavy_modules_stay_loaded: None, pytester: pytest.Pytester,
              monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> pytest.Pytester:
    """Every pytester test gets the heavy modules loaded before pytester snapshots sys.modules.

    A test that imported TensorFlow in its own body (after the snapshot) lost it at teardown,
    and the next test's import aborted the whole worker (SIGABRT in PyExceptionRegistry::Init):
    test_plugin_options' device test followed by test_not_compared did, whenever one xdist
    worker happened to run both files.

    The inner session runs as on a developer's machine whatever CI sets: under ``CI`` or
    ``BUILD_NUMBER`` pytest prints each error's full text again in the short summary (and
    Hypothesis loads its derandomised profile), so a test counting what the plugin said
    passed here and failed in CI.

    Under the ``inline_exports`` marker its sessions export in their own process (see the marker)."""
    for var in ("CI", "BUILD_NUMBER"):
        monkeypatch.delenv(var, raising=False)
    if request.node.get_closest_marker("inline_exports"):
        addopts = os.environ.get("PYTEST_ADDOPTS", "")  # pytester cleared it; a test may set its own after
        monkeypatch.setenv("PYTEST_ADDOPTS", f"{addopts} --modelparity-export-process=inline".strip())
    return pytester


_PYC_ENV = "MODELPARITY_TESTS_PYCACHE"  # the folder this run's processes keep bytecode in; set by the first
_PYC_BEFORE_ENV = "MODELPARITY_TESTS_PYCACHE_BEFORE"  # the two variables as the run was given them (JSON)


def environ_as_given() -> dict[str, str]:
    """``os.environ`` with the bytecode variables as the run was given them, for a child whose
    memory is the test's subject (``ulimit -v``): compiling and writing bytecode there is not
    what those tests measured."""
    env = dict(os.environ)
    given = json.loads(env.get(_PYC_BEFORE_ENV) or "{}")
    for key, value in given.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _installed_roots() -> list[str]:
    """The folders of sys.path outside the clone: the standard library and the installed packages."""
    from pathlib import Path

    here = Path(__file__).resolve().parents[1]
    roots: list[str] = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if path.is_dir() and path != here and here not in path.parents and str(path) not in roots:
            roots.append(str(path))
    return roots


def _link_installed_bytecode(prefix: str) -> None:
    """Under a ``PYTHONPYCACHEPREFIX`` Python looks for every module's bytecode there only, the
    installed packages' and the standard library's too: an empty folder had each of the run's
    first processes compile TensorFlow and Keras from source (13 more CPU-seconds each). So the
    ``.pyc`` files installed beside them are linked into the folder, where the prefix puts them
    (``<dir>/__pycache__/m.<tag>.pyc`` as ``<prefix><dir>/m.<tag>.pyc``); the clone's own
    modules are left out, compiled by the first process that imports them."""
    tag = f".{sys.implementation.cache_tag}.pyc"
    stack = _installed_roots()
    tops = set(stack)
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if entry.name == "__pycache__":
                names = [n for n in os.listdir(entry.path) if n.endswith(tag) and n.count(".") == 2]
                if names:
                    target = prefix + folder
                    os.makedirs(target, exist_ok=True)
                    for name in names:
                        try:
                            os.symlink(os.path.join(entry.path, name), os.path.join(target, name))
                        except OSError:
                            pass
            # packages only: not TensorFlow's C++ headers and other data folders
            elif folder in tops or os.path.exists(os.path.join(entry.path, "__init__.py")) or \
                    os.path.isdir(os.path.join(entry.path, "__pycache__")):
                stack.append(entry.path)


def _bytecode_cache_for_children(config: pytest.Config) -> None:
    """Every Python this run starts (xdist workers, pytester child sessions, export workers,
    scripts) reads and writes its bytecode in one folder outside the clone
    (``PYTHONPYCACHEPREFIX``): ``~/.cache/pytest-modelparity-tests/pycache-<tag>``.

    Why (issue 49): .ci/run and the shells that run the suite set PYTHONDONTWRITEBYTECODE=1 so
    that a clone gets no ``__pycache__``; then each of the run's child Pythons compiled the
    plugin's modules again, and pytest rewrote the assertions of Hypothesis' and the plugin's
    modules again (pytest's rewrite honours the same flag): 2-4 CPU-seconds of a one-test child
    session with its export worker (14-18 s). With the prefix, the first process compiles and
    the others read, as on a developer's machine; the clone stays as clean. The folder is kept
    between runs, like the export cache: linking the installed packages' bytecode into it
    (``_link_installed_bytecode``) costs 5-15 CPU-seconds on this machine's file system, paid by
    the first run only (a file named after the linked folders says it was done). Set up once, by
    the process that starts the run (xdist's controller, before it starts its workers), and
    handed on through the environment."""
    if os.environ.get(_PYC_ENV) or hasattr(config, "workerinput"):
        return  # an xdist worker, or a child session of a test: the run's folder is in use
    import hashlib
    from pathlib import Path

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pytest-modelparity-tests"
    folder = base / f"pycache-{sys.implementation.cache_tag}"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        roots = "\n".join(_installed_roots())
        stamp = folder / f".linked-{hashlib.sha256(roots.encode()).hexdigest()[:16]}"
        if not stamp.exists():
            _link_installed_bytecode(str(folder))
            stamp.write_text(roots + "\n")
    except OSError:
        return  # no cache folder here: the children compile, as before
    before = {k: os.environ.get(k) for k in (_PYC_ENV, _PYC_BEFORE_ENV, "PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")}
    os.environ[_PYC_BEFORE_ENV] = json.dumps({k: before[k] for k in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")})
    os.environ[_PYC_ENV] = os.environ["PYTHONPYCACHEPREFIX"] = str(folder)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

    def restore() -> None:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    config.add_cleanup(restore)


def pytest_configure(config: pytest.Config) -> None:
    _bytecode_cache_for_children(config)
    config.addinivalue_line(
        "markers", "inline_exports: the test's pytester sessions convert in their own process "
        "(--modelparity-export-process=inline through PYTEST_ADDOPTS; an option on the command line still wins). "
        "With the default child, a session that exports starts a worker that imports TensorFlow again: about "
        "8 CPU-seconds for a one-Dense-layer model, under 1 s inline (issue 49). For files whose tests are "
        "about something else than the export process; use it with usefixtures('_tfjs_converter_loaded').")


@pytest.fixture(scope="session")
def _tfjs_converter_loaded(_heavy_modules_stay_loaded: None) -> None:
    """tensorflowjs' converter imported before pytester's snapshot of sys.modules (a session
    fixture is set up before the function-scoped pytester): an inline tfjs export in an in-process
    run imports it, and TensorFlow modules not loaded yet, which the snapshot would drop at the
    run's end and the next run import again."""
    from pytest_modelparity.formats import missing_runtime

    if missing_runtime("tfjs", export=True) is None:
        from pytest_modelparity.formats.tfjs.export import import_converter

        import_converter()


# The tfjs runner's npm modules, found when the suite starts, before pytester gives each run a
# temporary HOME (which would run `npm ci` again in every suite).
from pytest_modelparity.runtime.tfjs_runner import cache_root  # noqa: E402

_NODE_MODULES_ROOT = str(cache_root())


@pytest.fixture
def installed_node_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytester runs find the installed npm modules (their own export cache is CACHE_ARG's)."""
    monkeypatch.setenv("MODELPARITY_CACHE_DIR", _NODE_MODULES_ROOT)
