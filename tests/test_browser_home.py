"""The browser formats stay home: no connection but loopback, nothing written outside the session's
own folder (removed however the session ends), a file server no request can kill, and no hung
browser outliving the session.

Real Chromium, Node and the real driver (runtime/tfjs_runner/browser.js); the hand-written
`y = v @ w` graph model needs no converter. Browser launches are slow on 2 cores: four here.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from pytest_modelparity.runtime import browser_process
from test_tfjs_browser import _cmdline, _running, keras_free_model

pytestmark = pytest.mark.skipif(
    not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) or not shutil.which("node"),
    reason="needs Chromium and Node.js: apt-get install chromium nodejs npm (scripts/install.sh does it as root)")

X = np.ones((2, 4), np.float32)
Y = X @ (np.arange(12, dtype=np.float32).reshape(4, 3) / 10)


@pytest.fixture(autouse=True)
def _installed_node_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_modelparity.runtime.tfjs_runner import INSTALL_COMMAND, cache_root, is_installed

    if not is_installed():
        pytest.skip(f"the Node runner's npm modules are not installed: {INSTALL_COMMAND}")
    monkeypatch.setenv("MODELPARITY_CACHE_DIR", str(cache_root()))


@pytest.fixture
def handmade(tmp_path: Path) -> Path:
    (tmp_path / "x" / "y").mkdir(parents=True)
    return keras_free_model(tmp_path / "x" / "y")


def _get(base: str, target: str) -> tuple[int, bytes]:
    """A raw GET (the URL exactly as given), with the Host header the server accepts."""
    host, port = base.split("//", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", f"{host}:{port}")
        conn.endheaders()
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def test_file_server_survives_a_malformed_url_and_refuses_a_shard_swapped_for_a_link(handmade, tmp_path):
    from pytest_modelparity import load_model
    from pytest_modelparity.errors import ModelLoadError

    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\x00" * 48)  # 12 float32 zeros: served, it would turn the weights to 0
    with load_model(handmade, "tfjs", backend="webgl", timeout_s=120) as js:
        host = js.process.host
        base, url = host.meta["server"], js.process.meta["model_url"]
        folder = host.folder
        assert folder.is_dir() and folder.name.startswith(f"modelparity-browser-h") and f"-p{os.getpid()}-" in folder.name
        assert _get(base, "/%E0%A4%A") == (400, b"")  # was an uncaught URIError that killed the driver
        assert _get(base, "/m/%ZZ/model.json")[0] == 400
        shard = url.rsplit("/", 1)[0] + "/group1-shard1of1.bin"
        assert _get(base, shard[len(base):]) == (200, (np.arange(12, dtype="<f4") / 10).tobytes())
        np.testing.assert_allclose(js.predict({"v": X})["y"], Y, rtol=1e-6)  # the driver still serves

        (handmade.parent / "group1-shard1of1.bin").unlink()
        (handmade.parent / "group1-shard1of1.bin").symlink_to(secret)  # swapped after the load's checks
        status, body = _get(base, shard[len(base):])
        assert status == 403 and body == b""
        with pytest.raises(ModelLoadError) as info:
            js._start("webgl")  # what a restart does: a new page loads the model again, with no Python check
        text = str(info.value)
        assert "group1-shard1of1.bin is a symbolic link now" in text and str(handmade) in text
        assert "replace the link with the file itself" in text
        np.testing.assert_allclose(js.predict({"v": X})["y"], Y, rtol=1e-6)  # the loaded page is untouched
        (handmade.parent / "group1-shard1of1.bin").unlink()
        os.mkfifo(handmade.parent / "group1-shard1of1.bin")  # opening it for reading would block
        for _ in range(6):  # more than libuv's 4 pool threads: none of them is left hanging
            assert _get(base, shard[len(base):]) == (403, b"")
        assert _get(base, url[len(base):])[0] == 200
        assert host.process.alive
    browser_process.close_shared_browser()
    assert not folder.exists(), "the browser's folder (profile, crash dumps, HOME) goes with the session"


def test_sweep_takes_folders_of_dead_sessions_only(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = re.sub(r"[^A-Za-z0-9]", "", os.uname().nodename)[:24]
    old = time.time() - 3600
    names = {"dead": f"modelparity-browser-h{host}-p{dead.pid}-abc", "alive": f"modelparity-browser-h{host}-p{os.getpid()}-abc",
             "young": f"modelparity-browser-h{host}-p{dead.pid}-young", "legacy": "modelparity-chromium-Xy12ab",
             "other": f"something-h{host}-p{dead.pid}-abc"}
    for key, name in names.items():
        (tmp_path / name / "profile").mkdir(parents=True)
        if key != "young":
            os.utime(tmp_path / name, (old, old))
    legacy_old = time.time() - 7 * 3600
    os.utime(tmp_path / names["legacy"], (legacy_old, legacy_old))
    removed = {p.name for p in browser_process.sweep_browser_folders(tmp_path)}
    assert removed == {names["dead"], names["legacy"]}
    assert all((tmp_path / names[k]).exists() for k in ("alive", "young", "other"))


def _fake_chromium(tmp_path: Path, body: str) -> Path:
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/bash\n" + body)
    fake.chmod(0o755)
    return fake


def _marked(mark: bytes) -> list[str]:
    return [p for p in os.listdir("/proc") if p.isdigit() and _running(int(p)) and mark in _cmdline(p)]


def test_a_hung_browser_dies_with_its_group_when_the_timeout_fires_before_the_start_limit(tmp_path, monkeypatch,
                                                                                         handmade):
    from pytest_modelparity import load_model
    from pytest_modelparity.errors import RuntimeMissing

    # The browser's own child ignores SIGTERM and is not Chromium: only the process group reaches it.
    fake = _fake_chromium(tmp_path, "(trap '' TERM; exec -a mp-hung-child-39b sleep 120) &\n"
                                    "exec -a mp-hung-browser-39b sleep 120\n")
    monkeypatch.setenv("MODELPARITY_CHROMIUM", str(fake))
    monkeypatch.delenv("MODELPARITY_BROWSER_START_S", raising=False)  # 60 s: the session's timeout comes first
    start = time.monotonic()
    with pytest.raises(RuntimeMissing) as info:
        load_model(handmade, "tfjs", backend="webgl", timeout_s=3)
    assert time.monotonic() - start < 20
    text = str(info.value)
    assert "hung" in text and "3 s" in text and "--modelparity-timeout" in text and str(fake) in text
    assert "apt-get install" not in text and "is not available" not in text
    deadline = time.monotonic() + 5
    while _marked(b"mp-hung-") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _marked(b"mp-hung-"), "the hung browser and its child were killed with the driver's group"
    assert not [p for d in {Path(tempfile.gettempdir()), Path("/tmp")}
                for p in d.glob(f"modelparity-browser-*-p{os.getpid()}-*")]


def test_an_interrupt_during_a_hung_start_leaves_nothing(tmp_path, monkeypatch, handmade):
    """Ctrl-C while the browser starts (the session ends): the driver's group and folder go at once."""
    from pytest_modelparity import load_model

    fake = _fake_chromium(tmp_path, "exec -a mp-hung-browser-39b sleep 120\n")
    monkeypatch.setenv("MODELPARITY_CHROMIUM", str(fake))

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGALRM, interrupt)
    signal.alarm(2)
    try:
        with pytest.raises(KeyboardInterrupt):
            load_model(handmade, "tfjs", backend="webgl", timeout_s=60)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    time.sleep(0.3)
    assert not _marked(b"mp-hung-"), "the hung browser went with the interrupted start"
    assert not [p for d in {Path(tempfile.gettempdir()), Path("/tmp")}
                for p in d.glob(f"modelparity-browser-*-p{os.getpid()}-*")]


def test_a_chromium_that_exits_at_start_shows_its_own_stderr(tmp_path, monkeypatch, handmade):
    from pytest_modelparity import load_model
    from pytest_modelparity.errors import RuntimeMissing

    fake = _fake_chromium(tmp_path, "echo 'chromium: error while loading shared libraries: libnss3.so: cannot "
                                    "open shared object file' >&2\nexit 127\n")
    monkeypatch.setenv("MODELPARITY_CHROMIUM", str(fake))
    with pytest.raises(RuntimeMissing) as info:
        load_model(handmade, "tfjs", backend="webgl", timeout_s=60)
    text = str(info.value)
    assert "exited at start-up (code 127)" in text and "libnss3.so: cannot open shared object file" in text
    assert "EPIPE" not in text and "    at " not in text  # not node's stack
    assert f"{fake} --headless=new --no-sandbox --dump-dom about:blank" in text


CHILD = textwrap.dedent('''
    import os, sys, time
    import numpy as np
    from pytest_modelparity import load_model
    js = load_model(sys.argv[1], "tfjs", backend="webgl", timeout_s=120)
    y = js.predict({"v": np.ones((2, 4), np.float32)})["y"]
    print("FOLDER", js.process.host.folder, "DRIVER", js.process.host.process.pid, "Y", y.ravel().tolist(), flush=True)
    if sys.argv[2] == "wait":
        time.sleep(600)
''')


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def test_sigterm_leaves_no_browser_and_no_folder(tmp_path, handmade):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(handmade), "wait"], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("FOLDER"), line
        words = line.split()
        folder, driver = Path(words[1]), int(words[3])
        assert folder.is_dir()
        group = [p for p in os.listdir("/proc") if p.isdigit() and _group_of(int(p)) == driver]
        assert len(group) > 2  # the driver, Chromium and Chromium's own processes
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        # the driver sees stdin close, stops Chromium, then removes the folder: 2-3 s quiet, but one
        # full run of the suite in three (2 workers, 2 cores) was still at it after 15 s
        deadline = time.monotonic() + 45
        while (folder.exists() or any(_running(int(p)) for p in group)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not folder.exists(), "the driver removed the folder on its death signal"
        assert not [p for p in group if _running(int(p))], "nothing of the browser's group survives"
    finally:
        proc.kill()
        proc.wait()


def _connects(trace_dir: Path, *, probe_excused: bool = False) -> list[str]:
    """Each connect() of the traced process tree that is neither AF_UNIX/AF_NETLINK nor loopback.
    Chromium's IPv6 reachability probe (a UDP connect() to 2001:4860:4860::8888, which it runs
    before any host resolution) counts, unless ``probe_excused``: the pages' requests are answered
    over DevTools, so they resolve nothing; only the full browser's own services (GCM check-in,
    the account list) still resolve the sink's address, and the headless shell has none."""
    bad = []
    for trace in trace_dir.glob("trace.*"):
        kinds: dict[str, str] = {}
        for line in trace.read_text(errors="replace").splitlines():
            made = re.match(r"socket\((\w+), (\w+)", line)
            fd = re.search(r"= (\d+)$", line)
            if made and fd:
                kinds[fd.group(1)] = made.group(2)
            found = re.match(r"connect\((\d+), \{sa_family=(\w+)(.*)", line)
            if found is None or found.group(2) in ("AF_UNIX", "AF_NETLINK"):
                continue
            rest = found.group(3)
            if 'inet_addr("127.0.0.1")' in rest or '"::1"' in rest:
                continue
            if probe_excused and kinds.get(found.group(1)) == "SOCK_DGRAM" and "htons(443)" in rest \
                    and "2001:4860:4860::8888" in rest:
                continue  # the full browser's services, on their way to the sink: a route lookup, no packet
            bad.append(f"{trace.name}: {line}")
        for line in trace.read_text(errors="replace").splitlines():
            if line.startswith(("sendto(", "sendmsg(")) and "sin" in line and "127.0.0.1" not in line \
                    and '"::1"' not in line:
                bad.append(f"{trace.name}: {line}")
    return bad


def test_a_browser_session_connects_to_nothing_but_loopback_and_writes_nothing_under_home(tmp_path, handmade):
    """Inside a network namespace with only loopback (so a slip reaches nothing), traced: every
    connect() of the whole process tree is checked, and $HOME and $TMPDIR are left as found."""
    for tool in ("unshare", "strace", "ip"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} (apt-get install util-linux strace iproute2)")
    if subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode != 0:
        pytest.skip("unprivileged user and network namespaces are not allowed here (unshare -rn)")
    home, tmp, traces = tmp_path / "home", tmp_path / "tmp", tmp_path / "traces"
    for d in (home, tmp, traces):
        d.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = re.sub(r"[^A-Za-z0-9]", "", os.uname().nodename)[:24]
    stale = tmp / f"modelparity-browser-h{host}-p{dead.pid}-left"  # left by a session killed with SIGKILL
    (stale / "profile" / "Default").mkdir(parents=True)
    os.utime(stale, (time.time() - 3600,) * 2)
    env = dict(os.environ, HOME=str(home), TMPDIR=str(tmp))
    env.pop("XDG_CONFIG_HOME", None)
    env.pop("XDG_CACHE_HOME", None)
    script = (f"ip link set lo up && exec strace -f -ff -qq -e trace=socket,connect,sendto,sendmsg "
              f"-o {traces}/trace {sys.executable} -c '{CHILD}' {handmade} once")
    done = subprocess.run(["unshare", "-rn", "sh", "-c", script], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Y [1.79999" in done.stdout  # the predict worked with no network at all
    assert len(list(traces.glob("trace.*"))) > 10  # Python, Node, Chromium and its processes were traced
    from pytest_modelparity.runtime.browser_process import chromium_executable

    shell = "headless-shell" in Path(chromium_executable()).name
    assert _connects(traces, probe_excused=not shell) == []
    assert list(home.rglob("*")) == [], "nothing under $HOME (Chromium's Crash Reports, .pki, .cache)"
    assert list(tmp.iterdir()) == [], "the dead session's folder swept"
    folder = Path(done.stdout.split()[1])  # in /tmp: $TMPDIR here is too long for Chromium's socket path
    assert folder.name.startswith("modelparity-browser-") and not folder.exists(), "the session's folder removed"
