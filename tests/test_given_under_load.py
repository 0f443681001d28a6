"""A plain ``@given`` test with the plugin's models and Hypothesis' default settings (a user who
never read about the ``modelparity`` profile) holds on a busy machine (issue 49).

Two parts. The one-time work (the forms' first runs, the reference's twin) is done at set-up,
so the first example costs what the others do. And where such a test keeps the active
profile's deadline and health checks, the plugin drops the deadline and ``too_slow`` for it, as
Hypothesis' own ``ci`` profile does: with four busy loops beside a 2-core machine, a 1-row
example took 294 ms against the 200 ms deadline and one draw 3.4 s (the process waited for a
core), so no warm-up alone could hold. A deadline the user set is kept. The run under load
itself (four busy loops, repeated) is ``bench/given_under_load.py``: it costs minutes of CPU the
suite should not spend.
"""

from __future__ import annotations

import textwrap

import pytest

pytestmark = pytest.mark.inline_exports

CONFTEST = textwrap.dedent('''
    import pytest

    @pytest.fixture(scope="session")
    def modelparity_source():
        import keras
        keras.utils.set_random_seed(4)
        x = keras.Input((12,), name="features")
        h = keras.layers.Dense(32, activation="relu", name="hidden")(x)
        return keras.Model(x, keras.layers.Dense(3, name="logits")(h), name="small_mlp")
''')

GIVEN = textwrap.dedent('''
    from datetime import timedelta

    from hypothesis import HealthCheck, given, settings, strategies as st
    from pytest_modelparity import assert_outputs_close, strategies

    @settings(max_examples=5)  # the profile's deadline (200 ms) and health checks
    @given(data=st.data())
    def test_plain(parity_candidate, parity_reference, data):
        used = test_plain._hypothesis_internal_use_settings
        assert used.deadline is None and HealthCheck.too_slow in used.suppress_health_check, used
        assert used.max_examples == 5  # the rest is the user's
        batch = data.draw(strategies.batches(parity_reference, batch_size=st.integers(1, 8)))
        assert_outputs_close(parity_candidate, parity_reference, inputs=batch)

    @settings(max_examples=3, deadline=timedelta(seconds=30), suppress_health_check=[HealthCheck.filter_too_much])
    @given(data=st.data())
    def test_chosen(parity_candidate, parity_reference, data):
        used = test_chosen._hypothesis_internal_use_settings
        assert used.deadline == timedelta(seconds=30), used
        assert list(used.suppress_health_check) == [HealthCheck.filter_too_much], used
        batch = data.draw(strategies.batches(parity_reference, batch_size=st.integers(1, 4)))
        assert_outputs_close(parity_candidate, parity_reference, inputs=batch)

    @given(n=st.integers(1, 3))
    def test_without_the_plugins_models(n):
        used = test_without_the_plugins_models._hypothesis_internal_use_settings
        assert used.deadline == settings.default.deadline, used  # the active profile's, untouched (CI: none)
        assert list(used.suppress_health_check) == list(settings.default.suppress_health_check), used
''')


def test_a_plain_given_test_leaves_timing_to_the_machine_and_a_chosen_deadline_is_kept(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_given=GIVEN)
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=tflite,saved_model",
                                f"--modelparity-cache-dir={pytester.path / 'cache'}")
    result.assert_outcomes(passed=5)
