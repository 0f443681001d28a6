"""A conftest that overrides modelparity_source (or another of the plugin's fixtures) without
``scope="session"`` gets the cause and the fix, not pytest's bare ``ScopeMismatch``."""

from __future__ import annotations

import pytest

from pytest_modelparity.plugin.scope_hint import scope_mismatch_message

pytestmark = [pytest.mark.usefixtures("_heavy_modules_stay_loaded"),
              pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker


@pytest.mark.parametrize("scope", ["function", "class"])
def test_a_narrow_modelparity_source_names_the_cause_and_the_fix(pytester: pytest.Pytester, scope) -> None:
    pytester.makeconftest(f"""
        import pytest

        @pytest.fixture(scope="{scope}")
        def modelparity_source():
            import keras
            x = keras.Input((6,), name="x")
            return keras.Model(x, keras.layers.Dense(3)(x))
    """)
    pytester.makepyfile("""
        from pytest_modelparity import assert_outputs_close

        def test_export(parity_candidate, parity_reference, parity_batch):
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=keras")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"modelparity: the fixture modelparity_source (conftest.py:3) is {scope}-scoped, but "
                                 "the plugin reads it from *-scoped fixtures*Declare it session-scoped in conftest.py:",
                                 "*@pytest.fixture(scope=\"session\")", "*def modelparity_source():"])


def test_other_scope_mismatches_are_left_as_pytest_says_them():
    assert scope_mismatch_message("ScopeMismatch: You tried to access the function scoped fixture tmp_path with a "
                                  "module scoped request object") is None
    assert "modelparity_load_options" in scope_mismatch_message(
        "ScopeMismatch: You tried to access the function scoped fixture modelparity_load_options with a session "
        "scoped request object")
