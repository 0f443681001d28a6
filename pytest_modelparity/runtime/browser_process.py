"""One headless Chromium per Python process, and a page in it per loaded model.

Why one browser: Chromium with SwiftShader takes seconds to start and hundreds of MB; a test
session loading a dozen browser models must not start a dozen. ``shared_browser()`` starts
``node browser.js <chromium> chromium`` (``runtime/tfjs_runner/browser.js``, which drives
Chromium over the DevTools protocol) once and hands it out; each model gets a
:class:`BrowserPage` that talks to its page through that process.

The Node process is a ``tfjs_process.NodeProcess``: the same frames, the same start-up
handshake, the same ``timeout_s`` on every exchange (past it Python kills Node, and Chromium,
which exits when its DevTools pipe closes, with it), the same ``NodeProcessDied`` for the
call that finds it dead. A page whose browser died is reported dead too, so its model starts
a new browser (``shared_browser()`` again) and loads the model into a fresh page on its next
call, like a Node runner that died.

Where it lives: each browser gets a folder of its own, ``$TMPDIR/modelparity-browser-h<host>-
p<pid>-*`` (Chromium's profile, crash dumps, the ``$HOME``/XDG folders and temporaries it is
given), removed when the browser stops whichever way: ``close``, interpreter exit, the driver's
own exit (it empties the folder on stdin EOF, on SIGTERM, which is also its death signal when
Python dies, and when Chromium dies), and a crash of the driver (the next ``shared_browser()``
closes the dead host). Folders whose owner process is gone are swept by the next browser's
start. The driver leads its own process group, so a timeout or a close kills Chromium and
anything it started (or a hung stand-in) with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import RuntimeMissing
from .scratch import owned_prefix, sweep
from .tfjs_process import NodeProcess, NodeProcessDied, RunnerError, decode_tensors, encode_tensors

__all__ = ["BROWSER_JS", "CHROMIUM_HINT", "BrowserHost", "BrowserPage", "BrowserUnusable", "chromium_executable",
           "shared_browser", "close_shared_browser", "browser_runs", "record_run", "sweep_browser_folders"]

BROWSER_JS = Path(__file__).resolve().parent / "tfjs_runner" / "browser.js"
CHROMIUM_HINT = ("`apt-get install chromium-headless-shell chromium` as root (Debian; Ubuntu: "
                 "`apt-get install chromium-browser` or the snap; "
                 "scripts/install.sh does it), or set MODELPARITY_CHROMIUM=/path/to/chrome")
# The headless shell first (Debian's chromium-headless-shell; Chrome for Testing's
# chrome-headless-shell): the same Blink, V8 and ANGLE/SwiftShader as the full browser, without
# its background services. The full browser's GCM check-in and account list ask the network
# within seconds of start-up, whatever the flags: each goes to the driver's sink, and each runs
# Chromium's IPv6 reachability probe (a UDP connect() to a public address, no packet) on the way.
_NAMES = ("chromium-headless-shell", "chrome-headless-shell", "chromium", "chromium-browser", "google-chrome",
          "google-chrome-stable", "chrome")
BROWSER_DIR_PREFIX = "modelparity-browser-"
_BROWSER_DIR = re.compile(r"^modelparity-browser-(?=h[A-Za-z0-9]*-p\d+-)")
_OLD_PROFILE = re.compile(r"^modelparity-chromium-")  # versions before the session folder: no owner tag


class BrowserUnusable(RuntimeMissing):
    """Chromium is there but cannot serve (it hung at start-up, or exits at once): skipped like a
    missing runtime (a failure under --modelparity-strict), with what happened and a true fix
    rather than "install it"."""

    def __init__(self, what: str, fix: str) -> None:
        self.what = what
        self.install = fix
        ImportError.__init__(self, f"{what}\n  fix: {fix}")


def _folder_parent() -> Path:
    """``$TMPDIR``, or ``/tmp`` when ``$TMPDIR`` is long: Chromium puts its singleton socket in the
    folder's ``t/``, and a Unix socket path has 107 bytes at most ("Socket path too long")."""
    here = Path(tempfile.gettempdir())
    if len(str(here)) > 20 and os.path.isdir("/tmp") and os.access("/tmp", os.W_OK):
        return Path("/tmp")
    return here


def sweep_browser_folders(directory: Path | None = None) -> list[Path]:
    """Remove the browser folders of sessions whose process is gone (and unowned profiles of
    older versions once ``ORPHAN_S`` old) in ``directory``, else in ``$TMPDIR`` and where
    ``_folder_parent`` puts them; never raises."""
    removed: list[Path] = []
    for where in [Path(directory)] if directory else sorted({Path(tempfile.gettempdir()), _folder_parent()}):
        removed += sweep(where, _BROWSER_DIR) + sweep(where, _OLD_PROFILE, unowned=True)
    return removed


def _stop_host(process: NodeProcess, folder: Path) -> None:
    """Stop the driver (and its process group), then remove the browser's folder."""
    try:
        process.close()  # stops it and its process group (kills them if a call is in flight)
        try:
            process.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
    finally:
        shutil.rmtree(folder, ignore_errors=True)

_lock = threading.Lock()
_shared: "BrowserHost | None" = None
# What ran the browser models of this process, once per distinct (format, browser, renderer,
# textures): the plugin's summary and JSON report say it (``browser_runs``).
_RUNS: list[dict[str, Any]] = []


def record_run(run: dict[str, Any]) -> None:
    with _lock:
        if run not in _RUNS:
            _RUNS.append(dict(run))


def browser_runs() -> list[dict[str, Any]]:
    with _lock:
        return [dict(r) for r in _RUNS]


def chromium_executable() -> str:
    """``$MODELPARITY_CHROMIUM``, else the first Chromium on PATH; ``RuntimeMissing`` when none."""
    env = os.environ.get("MODELPARITY_CHROMIUM")
    if env:
        if shutil.which(env) is None:
            raise RuntimeMissing(f"the browser MODELPARITY_CHROMIUM={env!r} (not an executable file)", CHROMIUM_HINT)
        return str(shutil.which(env))
    for name in _NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeMissing("a Chromium browser (needed by formats tfjs:webgl, tfjs:webgl-f16 and tfjs:webgpu)",
                         CHROMIUM_HINT)


class BrowserHost:
    """The Node process driving one Chromium; ``meta`` holds ``chromium`` (its version string)."""

    def __init__(self, *, node: str, node_modules: Path, timeout_s: float | None) -> None:
        self.executable = chromium_executable()
        sweep_browser_folders()
        self.folder = Path(tempfile.mkdtemp(prefix=owned_prefix(BROWSER_DIR_PREFIX), dir=_folder_parent()))
        try:
            self.process = NodeProcess(self.executable, backend="chromium", node=node, runner_js=BROWSER_JS,
                                       node_modules=node_modules, timeout_s=timeout_s,
                                       description=f"headless Chromium ({self.executable})",
                                       env={"MODELPARITY_BROWSER_DIR": str(self.folder),
                                            "MODELPARITY_BROWSER_GROUP": "1"}, own_group=True)
        except BaseException as exc:
            shutil.rmtree(self.folder, ignore_errors=True)
            told = _start_error(self.executable, timeout_s, exc)
            if told is exc:
                raise
            raise told from exc
        self._finalizer = weakref.finalize(self, _stop_host, self.process, self.folder)
        self.meta: dict[str, Any] = self.process.meta

    @property
    def alive(self) -> bool:
        return self.process.alive

    @property
    def reported_dead(self) -> bool:
        return self.process.reported_dead

    def request(self, message: bytes, what: str) -> tuple[str, memoryview]:
        kind, payload = self.process.exchange(message)
        if kind == "E":
            raise RunnerError(f"{what}: {payload.tobytes().decode('utf-8', 'replace')}")
        return kind, payload

    def open_page(self, model_json: Path, files: Sequence[str], backend: str, f16: bool, description: str) -> "BrowserPage":
        body = json.dumps({"model": str(model_json), "files": list(files), "backend": backend, "f16": f16})
        kind, payload = self.request(b"L" + body.encode("utf-8"), description)
        if kind != "H":
            raise RunnerError(f"{description}: unexpected answer {kind!r} to a page load")
        return BrowserPage(self, json.loads(payload.tobytes().decode("utf-8")), description)

    def close(self) -> None:
        self._finalizer()


_CHECK = "--headless=new --no-sandbox --dump-dom about:blank"


def _start_error(executable: str, timeout_s: float | None, exc: BaseException) -> BaseException:
    """What a failed browser start says: hung (either limit), exited at once, or not startable."""
    if isinstance(exc, NodeProcessDied) and exc.timed_out:
        return BrowserUnusable(
            f"Chromium ({executable}) hung: it did not answer within {timeout_s:g} s of starting (timeout_s, the "
            f"plugin's --modelparity-timeout), so Python killed it with its whole process group",
            f"check that `{executable} {_CHECK}` prints a page and exits; on a slow machine raise "
            f"--modelparity-timeout (Chromium may take up to MODELPARITY_BROWSER_START_S, 60 s, to start)")
    if not isinstance(exc, RunnerError) or "cannot start the browser: " not in str(exc):
        return exc
    text = str(exc).split("cannot start the browser: ", 1)[1]
    if " hung: " in text:
        return BrowserUnusable(text, f"check that `{executable} {_CHECK}` prints a page and exits; on a slow "
                                     f"machine raise MODELPARITY_BROWSER_START_S")
    if " exited at start-up " in text:
        return BrowserUnusable(text, f"run `{executable} {_CHECK}` to see the same error; if it names a missing "
                                     f"file or library, reinstall Chromium: {CHROMIUM_HINT}")
    return RuntimeMissing(f"a working Chromium ({executable}: {text})", CHROMIUM_HINT)


def shared_browser(*, node: str, node_modules: Path, timeout_s: float | None) -> BrowserHost:
    """The session's browser: started on first use, started again once the old one died."""
    global _shared
    with _lock:
        if _shared is None or not _shared.alive or _shared.executable != chromium_executable():
            if _shared is not None:
                _shared.close()
            _shared = BrowserHost(node=node, node_modules=node_modules, timeout_s=timeout_s)
        return _shared


def close_shared_browser() -> None:
    """Stop the session's browser and forget what ran (the plugin calls this at the end of a session)."""
    global _shared
    with _lock:
        _RUNS.clear()
        if _shared is not None:
            _shared.close()
            _shared = None


class BrowserPage:
    """One model's page: the ``NodeProcess`` interface a ``TFJSModel`` serves from."""

    def __init__(self, host: BrowserHost, meta: dict[str, Any], description: str) -> None:
        self.host = host
        self.meta = meta
        self.page = int(meta["page"])
        self.description = description
        self.last_compute_ms: float | None = None
        self.execution: str | None = None
        self._closed = False

    @property
    def reported_dead(self) -> bool:
        """The browser under this page died and a call has been told: a new page may replace it."""
        return self.host.reported_dead or (not self.host.alive and not self._closed)

    @property
    def alive(self) -> bool:
        return self.host.alive and not self._closed

    @property
    def death(self) -> str | None:
        """What ended the browser's driver (``NodeProcess.death``), or None."""
        return self.host.process.death

    def reap_if_died_idle(self) -> str | None:
        """The browser's driver died while nothing was asked of it (the Node runner's rule,
        ``NodeProcess.reap_if_died_idle``): the model opens a new page before the next call."""
        return None if self._closed else self.host.process.reap_if_died_idle()

    def _call(self, message: bytes, what: str) -> dict[str, np.ndarray]:
        if self._closed:
            raise NodeProcessDied(f"{self.description}: the model was closed; load it again to predict")
        kind, payload = self.host.request(message, f"{self.description}")
        if kind != "R":
            raise RunnerError(f"{self.description}: unexpected answer {kind!r} to {what}")
        self.last_compute_ms, mode = struct.unpack_from("<dB", payload, 0)
        self.execution = ("execute", "executeAsync")[mode]
        return decode_tensors(payload, 9)

    def predict(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._call(b"P" + struct.pack("<H", self.page) + encode_tensors(feeds), "predict")

    def fetch(self, feeds: Mapping[str, np.ndarray], nodes: Sequence[str], *,
              max_bytes: int = 256 << 20) -> dict[str, np.ndarray]:
        if not nodes or len(nodes) > 0xFFFF:
            raise ValueError(f"fetch() takes 1 to 65535 node names, got {len(nodes)}")
        head = [struct.pack("<HIH", self.page, min(int(max_bytes), 0xFFFFFFFF), len(nodes))]
        for name in nodes:
            raw = name.encode("utf-8")
            head.append(struct.pack(f"<H{len(raw)}s", len(raw), raw))
        return self._call(b"I" + b"".join(head) + encode_tensors(feeds), "intermediates")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.host.alive:
            try:
                self.host.request(b"C" + struct.pack("<H", self.page), self.description)
            except (RunnerError, NodeProcessDied, OSError):
                pass  # the page goes with its browser anyway
