"""A source that cannot be had fails once (pytester): a ``modelparity_source`` factory that
raises is called once and its traceback shown at the first test that needed it; every later
test says it in one line. The same for an overridden fixture that raises (the source itself,
the dataset). The issue's run: 21 tests, 2,563 lines of the same traceback.
"""

from __future__ import annotations

import textwrap

import pytest

# inline_exports (conftest.py): no export worker; the process is not what these tests are about
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]

# Two modules (module-scoped fixtures are set up again in each) and two formats.
TESTS = textwrap.dedent('''
    def test_reference(parity_reference):
        pass

    def test_candidate(parity_candidate, parity_batch):
        pass
''')

ONE_LINE = "(the same error as at the setup of "


def _run(pytester: pytest.Pytester, conftest: str) -> tuple[pytest.RunResult, str]:
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_a=TESTS, test_b=TESTS)
    result = pytester.runpytest("--modelparity-formats=keras,saved_model", "-p", "no:cacheprovider",
                                "-p", "no:randomly")
    return result, result.stdout.str()


def test_a_factory_that_raises_is_called_once_and_shown_in_full_once(pytester: pytest.Pytester) -> None:
    result, out = _run(pytester, textwrap.dedent('''
        import pytest

        CALLS = []

        def build_from_weights():
            CALLS.append(1)
            raise FileNotFoundError("no weights at /models/net.weights.h5")

        @pytest.fixture(scope="session")
        def modelparity_source():
            return build_from_weights

        def pytest_sessionfinish(session):
            print(f"factory called {len(CALLS)} time(s)")
    '''))
    result.assert_outcomes(errors=6)  # per module: the reference, the candidate on 2 formats
    assert "factory called 1 time(s)" in out, out[-2000:]
    assert out.count('raise FileNotFoundError("no weights at /models/net.weights.h5")') == 1, out
    assert out.count(ONE_LINE) == 5, out
    result.stdout.fnmatch_lines([
        "modelparity: the source (modelparity_source's factory) failed: FileNotFoundError: no weights at "
        "/models/net.weights.h5 (the same error as at the setup of test_a.py::test_reference[[]cpu[]], where its "
        "full traceback is shown; the source (modelparity_source's factory) is not run again)"])
    assert len(out.splitlines()) < 120, len(out.splitlines())


@pytest.mark.parametrize("fixture", ["modelparity_source", "modelparity_dataset"])
def test_an_overridden_fixture_that_raises_is_shown_in_full_once(pytester: pytest.Pytester, fixture: str) -> None:
    source = "" if fixture == "modelparity_source" else textwrap.dedent('''
        @pytest.fixture(scope="session")
        def modelparity_source():
            import keras
            x = keras.Input((6,), name="x")
            return keras.Model(x, keras.layers.Dense(3, name="out")(x), name="tiny")
    ''')
    result, out = _run(pytester, textwrap.dedent(f'''
        import pytest

        def _rows():
            raise ConnectionError("the feature store at 10.0.0.7 did not answer")

        @pytest.fixture(scope="session")
        def {fixture}():
            return _rows()
    ''') + source)
    # the dataset is read by parity_batch and parity_candidate: test_reference passes without it
    errors = 6 if fixture == "modelparity_source" else 4
    result.assert_outcomes(errors=errors, passed=6 - errors)
    assert out.count('raise ConnectionError("the feature store at 10.0.0.7 did not answer")') == 1, out
    assert out.count(ONE_LINE) == errors - 1, out
    result.stdout.fnmatch_lines([f"modelparity: the fixture {fixture} failed: ConnectionError: the feature store at "
                                 f"10.0.0.7 did not answer (the same error as at the setup of test_a.py::*"])
