"""The tfjs candidate in a real plugin session when Node.js misbehaves: the real node child
killed with os.kill between tests, and a real `node` on PATH that never answers."""

from __future__ import annotations

import os
import shutil
import textwrap
import time

import pytest

from models import TINY_SOURCE_CONFTEST

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed (apt-get install nodejs npm)")


@pytest.fixture(autouse=True)
def _installed_node_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pytester subprocess gets a temporary HOME: point it at the runner's installed npm
    modules, or its first tfjs use would run `npm ci` (itself a node script: with the fake
    `node` below it would hang for npm's own 900 s instead of testing the handshake)."""
    from pytest_modelparity.runtime.tfjs_runner import INSTALL_COMMAND, cache_root, is_installed

    if not is_installed():
        pytest.skip(f"the Node runner's npm modules are not installed: {INSTALL_COMMAND}")
    monkeypatch.setenv("MODELPARITY_CACHE_DIR", str(cache_root()))

KILL_SUITE = textwrap.dedent('''
    import os, signal, time
    import pytest
    from pytest_modelparity.runtime.tfjs_process import NodeProcessDied

    def test_1_predicts(parity_candidate, parity_batch):
        assert parity_candidate.predict(parity_batch)

    def test_2_node_dies_during_a_call(parity_candidate, parity_batch):
        import threading
        pid = parity_candidate.process.pid
        os.kill(pid, signal.SIGSTOP)  # the call below surely waits on it when the kill lands
        threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
        parity_candidate.predict(parity_batch)  # no byte of the answer came: retried on a new process
        assert parity_candidate.restarts == 1

    def test_3_node_dies_on_every_predict(parity_candidate, parity_batch):
        pid = parity_candidate.process.pid
        parity_candidate.process.before_request = lambda: os.kill(pid, signal.SIGKILL)
        import pytest_modelparity.runtime.tfjs_process as tp
        real = tp.NodeProcess.__init__
        def dying(self, *args, **kwargs):  # the replacement dies on its first request too
            real(self, *args, **kwargs)
            self.before_request = lambda: os.kill(self.pid, signal.SIGKILL)
        tp.NodeProcess.__init__ = dying
        try:
            parity_candidate.predict(parity_batch)  # fails: NodeProcessDied, both deaths
        finally:
            tp.NodeProcess.__init__ = real

    def test_4_node_killed_between_tests(parity_candidate, parity_batch):
        parity_candidate.predict(parity_batch)  # a live process again (the last one died twice)
        os.kill(parity_candidate.process.pid, signal.SIGKILL)
        time.sleep(0.5)

    def test_5_passes_on_a_new_process(parity_candidate, parity_batch, parity_reference):
        from pytest_modelparity import assert_outputs_close
        assert_outputs_close(parity_candidate.predict(parity_batch), parity_reference, inputs=parity_batch)
        assert parity_candidate.restarts == 4
        assert "while idle between calls" in parity_candidate.restart_reasons[-1]
''')


# Node.js deaths are the subject, not the export process: its worker would import TensorFlow once more.
INLINE = "--modelparity-export-process=inline"


def test_killing_node_mid_session_fails_only_a_call_it_died_in_twice(pytester: pytest.Pytester) -> None:
    """A death before any byte of the answer is retried on a new process, so it fails no test;
    two deaths on one call fail that test naming both; a death between tests fails none."""
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile(test_kill=KILL_SUITE)
    # in this process (issue 49): Node.js is the child whose deaths are tested; a child pytest
    # would only import TensorFlow once more
    result = pytester.runpytest("--modelparity-formats=tfjs", "--modelparity-cache-dir=cache", INLINE,
                                "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*test_3_node_dies_on_every_predict*",
                                 "*NodeProcessDied*its replacement died too on the same request*"])
    assert "nothing to do for the next call" not in result.stdout.str()


def test_a_node_that_never_answers_ends_the_run_fast_naming_node(pytester: pytest.Pytester,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake `node` first on PATH (a shell that sleeps): the tfjs export's check and load name
    it after the handshake, once; the session ends in well under the old 20 minutes. The
    handshake's limit is 30 s, or --modelparity-timeout where shorter, for the inline export's
    check as for the session's loads: 5 s here (issue 49: not 30 s of a sleeping shell)."""
    fake_bin = pytester.path / "fakebin"
    fake_bin.mkdir()
    fake = fake_bin / "node"
    fake.write_text("#!/bin/sh\nexec sleep 600\n")
    fake.chmod(0o755)
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile(test_hung='''
        import pytest

        @pytest.mark.parametrize("i", range(3))
        def test_predicts(parity_candidate, parity_batch, i):
            parity_candidate.predict(parity_batch)
    ''')
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    start = time.monotonic()
    result = pytester.runpytest_subprocess("--modelparity-formats=tfjs", "--modelparity-cache-dir=cache", INLINE,
                                           "--modelparity-timeout=5", "-p", "no:cacheprovider", timeout=600)
    took = time.monotonic() - start
    assert result.ret != 0
    text = result.stdout.str()
    assert f"Node.js ('{fake}') did not complete runner.js's start-up handshake within 5 s" in text, text[-3000:]
    assert took < 120, f"the run took {took:.0f} s"
    assert "within 30 s" not in text, text[-3000:]          # no part of the session waited out the default
