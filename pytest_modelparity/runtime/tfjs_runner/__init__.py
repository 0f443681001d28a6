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
the plugin turns it into a skip (a failure under ``--modelparity-strict``).

An install is verified once per process before it is used (``damage``): its marker, its copy
of the lock file (the hash it is keyed by), every package the lock names at its locked version
with its entry file, the wasm backend's ``.wasm`` files, and every file ``npm ci`` wrote (the
``.modelparity-files`` manifest, sizes included; installs made before the manifest existed get
the other checks). A damaged install (a truncated ``node_modules``, deleted ``.wasm`` files,
which would otherwise make ``backend="auto"`` run on the cpu backend without saying why) is
removed and installed again with ``npm ci``, once per process; if that fails too, the error
names what was missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from ...errors import RuntimeMissing
from ..quiet import make_ignored_dir
from ..scratch import not_private

__all__ = ["RUNNER_DIR", "RUNNER_JS", "INSTALL_COMMAND", "cache_root", "damage", "ensure_node_modules",
           "installed_since", "modules_dir", "node_executable"]

RUNNER_DIR = Path(__file__).resolve().parent
RUNNER_JS = RUNNER_DIR / "runner.js"
INSTALL_COMMAND = "python -m pytest_modelparity.tfjs_runner install"
NODE_HINT = "Node.js >= 18 and npm on PATH (e.g. `apt-get install nodejs npm`, or https://nodejs.org)"
_MARKER = ".modelparity-installed"
_MANIFEST = ".modelparity-files"  # "<size>\t<path under node_modules>" per file npm ci wrote
_WASM_PACKAGE = "@tensorflow/tfjs-backend-wasm"
# install directory -> verified in this process (a damaged one is repaired once, not per load).
_VERIFIED: set[Path] = set()
_REPAIR_TRIED: set[Path] = set()
# Every package the runner and the browser pages load: package.json's dependencies (the Node
# backends and the browser ones, so a missing webgl bundle counts as a damaged install too).
_REQUIRED = tuple(sorted(json.loads((Path(__file__).resolve().parent / "package.json").read_text())["dependencies"]))


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
    return all((target / "node_modules" / pkg / "package.json").is_file() for pkg in _REQUIRED) and not damage(target)


def _lock_packages(lock_file: Path) -> dict[str, str]:
    """``node_modules/...`` path -> version of every package ``npm ci --omit=dev`` installs."""
    lock = json.loads(lock_file.read_text())
    return {key: str(entry.get("version", "")) for key, entry in (lock.get("packages") or {}).items()
            if key.startswith("node_modules/") and not entry.get("dev") and not entry.get("optional")}


def _write_manifest(target: Path) -> None:
    modules = target / "node_modules"
    lines = []
    for path in sorted(modules.rglob("*")):
        if path.is_file() and not path.is_symlink():
            lines.append(f"{path.stat().st_size}\t{path.relative_to(modules).as_posix()}")
    (target / _MANIFEST).write_text("\n".join(lines) + "\n")


def _only_mine_may_write(folder: Path) -> None:
    """Clear the group and others' write bits npm ci left under a loose umask (002): a folder
    others may write is refused (``not_yours``), since Node.js runs what is put there."""
    for root, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            path = os.path.join(root, name)
            with contextlib.suppress(OSError):
                mode = os.lstat(path).st_mode
                if mode & 0o022 and not os.path.islink(path):
                    os.chmod(path, mode & 0o7755)


def damage(target: Path | None = None) -> list[str]:
    """What is wrong with the install in ``target`` (default: this lock file's), as short
    phrases; empty when it is complete. Reads the lock, stats files: tens of milliseconds."""
    target = target or modules_dir()
    if not (target / _MARKER).is_file():
        return [f"no {_MARKER} marker (the install never finished)"]
    problems: list[str] = []
    for name in ("package.json", "package-lock.json"):
        copy = target / name
        if not copy.is_file() or copy.read_bytes() != (RUNNER_DIR / name).read_bytes():
            problems.append(f"its {name} is not the one it is keyed by (hash {lock_hash()})")
    if problems:
        return problems
    modules = target / "node_modules"
    for key, version in _lock_packages(target / "package-lock.json").items():
        meta_file = target / key / "package.json"
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, ValueError):
            problems.append(f"{key}/package.json is missing or unreadable")
            continue
        if version and meta.get("version") != version:
            problems.append(f"{key} is version {meta.get('version')!r}, the lock says {version!r}")
        main = meta.get("main")
        if isinstance(main, str) and main and not any(
                (target / key / cand).is_file() for cand in (main, f"{main}.js", f"{main}/index.js")):
            problems.append(f"{key}/{main} (its entry file) is missing")
    wasm_dist = modules / _WASM_PACKAGE / "dist"
    if (modules / _WASM_PACKAGE).is_dir() and not any(
            p.stat().st_size > 0 for p in wasm_dist.glob("*.wasm")):
        problems.append(f"{_WASM_PACKAGE}/dist has no .wasm files (the wasm backend cannot start; tfjs would "
                        f"run on its cpu backend)")
    manifest = target / _MANIFEST
    if manifest.is_file():
        missing, changed, foreign = [], [], []
        me = os.getuid() if hasattr(os, "getuid") else None
        for line in manifest.read_text().splitlines():
            size, _, rel = line.partition("\t")
            try:
                info = (modules / rel).stat()
            except OSError:
                missing.append(rel)
                continue
            if str(info.st_size) != size:
                changed.append(rel)
            if me is not None and info.st_uid != me:
                foreign.append(f"{rel} (uid {info.st_uid})")
        if missing:
            problems.append(f"{len(missing)} file(s) npm ci wrote are missing (e.g. {missing[0]})")
        if changed:
            problems.append(f"{len(changed)} file(s) changed size since npm ci wrote them (e.g. {changed[0]})")
        if foreign:
            problems.append(f"{len(foreign)} file(s) were written by another user (e.g. {foreign[0]}): Node.js "
                            "would run their code")
    return problems


def not_yours(target: Path) -> str | None:
    """Why the folders holding the install are not this user's alone (owned by another uid, or
    writable by its group or others, who could then put code there that Node.js runs), or None.
    Checked before the install is used or repaired; folders not made yet are None."""
    for folder in (cache_root(), target.parent, target, target / "node_modules"):
        problem = not_private(folder)
        if problem is not None:
            return f"{folder}: {problem}"
    return None


def installed_since(start: float) -> str | None:
    """``"npm ci into <dir> took 7.1 s"`` when this lock file's install finished after ``start``
    (a ``time.time()``), else None; ``"... took 7.1 s, repairing a damaged install (...)"`` when it
    replaced a damaged one. Read from the install's marker file, so a pytest run learns of an
    install made by any of its xdist workers (whose stderr went to the plugin's log)."""
    marker = modules_dir() / _MARKER
    try:
        if marker.stat().st_mtime < start:
            return None
        first, _, repaired = marker.read_text().strip().partition("\n")
    except OSError:
        return None
    took = first.removeprefix("npm ci took ")
    how = f", repairing a damaged install ({repaired.removeprefix('repaired: ')})" if repaired else ""
    return f"npm ci into {modules_dir()} took {took}{how}"


@contextlib.contextmanager
def _install_lock(path: Path) -> Iterator[None]:
    """Serialise installs across processes (pytest-xdist workers) with an flock."""
    make_ignored_dir(cache_root())  # private (0700), as every folder the package makes
    path.parent.mkdir(mode=0o700, exist_ok=True)
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
    if target in _VERIFIED:
        return target / "node_modules"
    problem = not_yours(target)
    if problem is not None:
        raise RuntimeMissing(f"a tfjs install of your own ({problem}, so another user could put code there that "
                             "Node.js would run)",
                             "set MODELPARITY_CACHE_DIR to a private folder you own (the plugin creates it with mode "
                             f"0700 and installs there), or make {target.parent} yours alone (chown, chmod go-w)")
    found = damage(target) if target.exists() else ["not installed"]
    if not found:
        _VERIFIED.add(target)
        return target / "node_modules"
    damaged = target.exists()
    if damaged and target in _REPAIR_TRIED:
        raise RuntimeMissing(f"a complete @tensorflow/tfjs install in {target} ({'; '.join(found)}; "
                             f"repairing it with npm ci was tried once in this process)",
                             f"remove {target} and run `{INSTALL_COMMAND}`")
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeMissing("npm (needed to install @tensorflow/tfjs for format 'tfjs')", NODE_HINT)
    with _install_lock(target.parent / f"{target.name}.lock"):
        found = damage(target) if target.exists() else ["not installed"]
        if not found:  # another process installed (or repaired) it while we waited
            _VERIFIED.add(target)
            return target / "node_modules"
        if target.exists():
            _REPAIR_TRIED.add(target)
            print(f"pytest-modelparity: the tfjs install in {target} is damaged ({'; '.join(found)}); "
                  f"installing it again with npm ci", file=sys.stderr, flush=True)
        # Staging directories left by an install that was killed (SIGKILL, power loss): nobody
        # else can be using one while we hold the lock, and each holds up to 100 MB.
        for stale in target.parent.glob(f"{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-", dir=target.parent))
        os.chmod(staging, 0o755)  # readable by others (never writable): the folders' owner check is not_yours
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
                was = f"; the install there was damaged: {'; '.join(found)}" if damaged else ""
                raise RuntimeMissing(
                    f"@tensorflow/tfjs for Node.js (npm ci failed with exit code {proc.returncode} after "
                    f"{took:.1f} s{was}:\n{tail}\n)",
                    f"`{INSTALL_COMMAND}` on a machine that reaches the npm registry "
                    f"(set MODELPARITY_CACHE_DIR to share the cache)")
            _only_mine_may_write(staging)
            _write_manifest(staging)
            repaired = f"repaired: {'; '.join(found)}\n" if damaged else ""
            (staging / _MARKER).write_text(f"npm ci took {took:.1f} s\n{repaired}")
            if target.exists():  # damaged, or a stale, incomplete install from an older version of this code
                shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
            if not quiet or damaged:
                print(f"pytest-modelparity: npm ci finished in {took:.1f} s", file=sys.stderr, flush=True)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeMissing("@tensorflow/tfjs for Node.js (npm ci timed out after 900 s)",
                                 f"`{INSTALL_COMMAND}` with a working network") from exc
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    _VERIFIED.add(target)
    return target / "node_modules"
