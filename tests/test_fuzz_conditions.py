"""The conditions a converter defect depends on (issue 46): read without TensorFlow, checked
against TensorFlow's own answer, and used by the labelling (an entry whose conditions do not
hold in a run labels nothing there)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_modelparity.fuzz.conditions import ONEDNN_VAR, conditions_here, describe, differences, env_for
from pytest_modelparity.fuzz.known_defects import CATALOGUE, Label, label_failure


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("TRUE", True), ("0", False), ("false", False)])
def test_the_variable_decides_when_set(value, on):
    got = conditions_here({ONEDNN_VAR: value})
    assert got["onednn"] is on and got["onednn_why"] == f"{ONEDNN_VAR}={value}"
    assert got["env"] == {ONEDNN_VAR: value}


def test_reading_conditions_does_not_import_tensorflow():
    code = ("import sys; from pytest_modelparity.fuzz.conditions import conditions_here; conditions_here(); "
            "from pytest_modelparity.fuzz import known_defects, defect_status, reproducer, fuzz_worker; "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


@pytest.mark.parametrize("value", [None, "1", "0"])
def test_the_reading_agrees_with_tensorflow_in_a_new_process(value):
    """The prediction (the variable, else TensorFlow's default for this CPU's flags) against
    TensorFlow's own IsMklEnabled in a fresh process started with that environment."""
    env = {k: v for k, v in os.environ.items() if k != ONEDNN_VAR}
    if value is not None:
        env[ONEDNN_VAR] = value
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    code = "import tensorflow; from tensorflow.python.util import _pywrap_util_port as p; print(p.IsMklEnabled())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    told = out.stdout.strip().splitlines()[-1] == "True"
    predicted = conditions_here(env)
    if value == "1" and not told:
        pytest.skip(f"this TensorFlow is built without oneDNN: {ONEDNN_VAR}=1 leaves it off")
    assert predicted["onednn"] is told, (predicted, told)


_SWITCHES = st.fixed_dictionaries({"onednn": st.booleans(), "xnnpack": st.booleans()})
_CONDITIONAL = [e for e in CATALOGUE if e.conditions]


def _symptom(entry) -> str:
    return ""  # the one conditional entry today fails on values: no message to match


def test_the_catalogue_states_the_conditions_measured():
    assert {e.name for e in _CONDITIONAL} >= {"tfjs-maximum-as-leakyrelu"}
    assert all(dict(e.conditions) == {"onednn": True} for e in _CONDITIONAL)


@settings(max_examples=60, deadline=None)
@given(entry=st.sampled_from(_CONDITIONAL), here=_SWITCHES)
def test_an_entry_labels_only_under_its_conditions(entry, here):
    """Known only where every condition of the entry holds; elsewhere new, resembling it, with a
    note naming the switch that differs and how it stands in this run."""
    label = label_failure(entry.model, entry.format, _symptom(entry), entry.outcome,
                          passes_without=lambda d: True, conditions=here)
    differ = differences(entry.conditions, here)
    if not differ:
        assert label == Label(known=entry.name)
    else:
        assert label.known is None and label.resembles == entry.name
        assert label.note and "oneDNN" in label.note and ("off" if not here["onednn"] else "on") in label.note
        assert f"resembles {entry.name}; the entry was seen with oneDNN on" in str(label)


@settings(max_examples=40, deadline=None)
@given(required=st.dictionaries(st.just("onednn"), st.booleans()), other=st.sampled_from([None, "0", "1"]))
def test_the_environment_written_for_conditions_gives_them(required, other):
    """What a reproducer sets (``env_for``) over whatever the shell had gives the conditions."""
    shell = {} if other is None else {ONEDNN_VAR: other}
    got = conditions_here({**shell, **env_for(required)})
    assert differences(required, got) == []
    assert ("oneDNN on" in describe(got)) is got["onednn"]
