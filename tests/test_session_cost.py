"""What a session costs (docs/performance.md): the export worker of a serial session with a
cold cache is started when collection ends, before any export, so its TensorFlow import
overlaps the pytest process's; a warm cache starts no worker at all."""

from __future__ import annotations

import textwrap

import pytest

from models import EXPORT_WORKERS_MODULE, TINY_SOURCE_CONFTEST

SUITE = {
    "test_a_first.py": '''
        from export_workers import export_workers

        def test_before_any_export():
            print(f"export workers before any export: {len(export_workers())}")
    ''',
    "test_b_model.py": '''
        from pytest_modelparity import assert_outputs_close

        def test_close(parity_candidate, parity_batch, parity_reference):
            assert_outputs_close(parity_candidate.predict(parity_batch), parity_reference, inputs=parity_batch)
    ''',
}


def test_a_cold_session_starts_its_export_worker_at_collection_and_a_warm_one_none(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TINY_SOURCE_CONFTEST)
    pytester.makepyfile(export_workers=EXPORT_WORKERS_MODULE,
                        **{name[:-3]: textwrap.dedent(body) for name, body in SUITE.items()})
    args = ("--modelparity-formats=tflite", "--modelparity-cache-dir=cache", "-p", "no:cacheprovider",
            "-p", "no:randomly", "-s")
    cold = pytester.runpytest_subprocess(*args, timeout=600)
    cold.assert_outcomes(passed=2)
    cold.stdout.fnmatch_lines(["*export workers before any export: 1*"])
    warm = pytester.runpytest_subprocess(*args, timeout=600)
    warm.assert_outcomes(passed=2)
    warm.stdout.fnmatch_lines(["*export workers before any export: 0*"])
