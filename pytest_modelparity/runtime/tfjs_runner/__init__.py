"""The Node.js side of the ``tfjs`` format: where its npm dependencies live and how they get there.

``runner.js`` needs ``@tensorflow/tfjs-core``, ``-converter``, ``-backend-cpu`` and ``-backend-wasm``
(about 100 MB of node_modules; the whole ``@tensorflow/tfjs`` bundle took 308 MB), pinned by
``package-lock.json``. They are installed with ``npm ci`` on first
use into a cache directory keyed by the lock file's hash, so an upgrade of the lock file
installs afresh and two versions never mix:

    $MODELPARITY_CACHE_DIR/tfjs-node-modules/<hash>/      (default ~/.cache/pytest-modelparity)

Install ahead of time (CI images, machines without network at test time) with::

    python -m pytest_modelparity.tfjs_runner install

No Node.js, no npm, or a failed install raises ``errors.RuntimeMissing`` saying what to install;
the plugin turns it into a skip.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from ...errors import RuntimeMissing

__all__ = ["RUNNER_DIR", "RUNNER_JS", "INSTALL_COMMAND", "cache_root", "ensure_node_modules",
           "installed_since", "modules_dir", "node_executable"]

RUNNER_DIR = Path(__file__).resolve().parent
RUNNER_JS = RUNNER_DIR / "runner.js"
INSTALL_COMMAND = "python -m pytest_modelparity.tfjs_runner install"
NODE_HINT = "Node.js >= 18 and npm on PATH (e.g. `apt-get install nodejs npm`, or https://nodejs.org)"
_MARKER = ".modelparity-installed"
_REQUIRED = ("@tensorflow/tfjs-core", "@tensorflow/tfjs-converter", "@tensorflow/tfjs-backend-cpu",
             "@tensorflow/tfjs-backend-wasm")


def cache_root() -> Path:
    """``$MODELPARITY_CACHE_DIR`` or ``~/.cache/pytest-modelparity`` (XDG_CACHE_HOME honoured)."""
    env = os.environ.get("MODELPARITY_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "pytest-modelparity"


def lock_hash() -> str:
    """Short hash of package.json + package-lock.json: the cache key of an install."""
    h = hashlib.sha256()
    for name in ("package.json", "package-lock.json"):
        h.update((RUNNER_DIR / name).read_bytes())
    return h.hexdigest()[:16]


def modules_dir() -> Path:
    """The directory whose ``node_modules`` holds this lock file's install (may not exist yet)."""
    return cache_root() / "tfjs-node-modules" / lock_hash()


def node_executable() -> str:
    """Path of ``node``, or raise ``RuntimeMissing``."""
    node = shutil.which("node")
    if node is None:
        raise RuntimeMissing("Node.js (needed by format 'tfjs')", NODE_HINT)
    return node


def is_installed(target: Path | None = None) -> bool:
    target = target or modules_dir()
    return (target / _MARKER).is_file() and all(
        (target / "node_modules" / pkg / "package.json").is_file() for pkg in _REQUIRED)


def installed_since(start: float) -> str | None:
    """``"npm ci into <dir> took 7.1 s"`` when this lock file's install finished after ``start``
    (a ``time.time()``), else None. Read from the install's marker file, so a pytest run learns of
    an install made by any of its xdist workers (whose stderr went to the plugin's log)."""
    marker = modules_dir() / _MARKER
    try:
        if marker.stat().st_mtime < start:
            return None
        took = marker.read_text().strip().removeprefix("npm ci took ")
    except OSError:
        return None
    return f"npm ci into {modules_dir()} took {took}"


@contextlib.contextmanager
def _install_lock(path: Path) -> Iterator[None]:
    """Serialise installs across processes (pytest-xdist workers) with an flock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        try:
            import fcntl
        except ImportError:  # not POSIX: no cross-process lock, installs are still atomic
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_node_modules(*, quiet: bool = False) -> Path:
    """Return the ``node_modules`` directory for runner.js, installing it with ``npm ci`` if needed.

    The install happens in a temporary directory renamed into place when complete, so an
    interrupted install never leaves a half-filled cache behind.
    """
    node_executable()
    target = modules_dir()
    if is_installed(target):
        return target / "node_modules"
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeMissing("npm (needed to install @tensorflow/tfjs for format 'tfjs')", NODE_HINT)
    with _install_lock(target.parent / f"{target.name}.lock"):
        if is_installed(target):  # another process installed it while we waited
            return target / "node_modules"
        # Staging directories left by an install that was killed (SIGKILL, power loss): nobody
        # else can be using one while we hold the lock, and each holds up to 100 MB.
        for stale in target.parent.glob(f"{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-", dir=target.parent))
        os.chmod(staging, 0o755)  # mkdtemp makes it 0700: a cache shared between users must be readable
        try:
            for name in ("package.json", "package-lock.json"):
                shutil.copyfile(RUNNER_DIR / name, staging / name)
            if not quiet:
                print(f"pytest-modelparity: installing @tensorflow/tfjs for the tfjs format with `npm ci` "
                      f"into {target} (first use only, about 100 MB) ...", file=sys.stderr, flush=True)
            start = time.perf_counter()
            # --ignore-scripts: tfjs needs no install scripts (core-js's only prints a banner).
            proc = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--omit=dev", "--loglevel=error"],
                cwd=staging, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, timeout=900)
            took = time.perf_counter() - start
            if proc.returncode != 0:
                tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
                raise RuntimeMissing(
                    f"@tensorflow/tfjs for Node.js (npm ci failed with exit code {proc.returncode} after "
                    f"{took:.1f} s:\n{tail}\n)",
                    f"`{INSTALL_COMMAND}` on a machine that reaches the npm registry "
                    f"(set MODELPARITY_CACHE_DIR to share the cache)")
            (staging / _MARKER).write_text(f"npm ci took {took:.1f} s\n")
            if target.exists():  # a stale, incomplete install from an older version of this code
                shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
            if not quiet:
                print(f"pytest-modelparity: npm ci finished in {took:.1f} s", file=sys.stderr, flush=True)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeMissing("@tensorflow/tfjs for Node.js (npm ci timed out after 900 s)",
                                 f"`{INSTALL_COMMAND}` with a working network") from exc
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return target / "node_modules"
