"""Bad arguments to the assertions: one validator, one exception type, and no silent pass.

Each case was tried as a user would (issue 15's sweep): a check that should fail must fail
with a message that says what did not match, and a misuse is an ``InvalidArgumentError``
naming the argument and the fix.
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_modelparity import ParityError, assert_batch_invariant, assert_deterministic, assert_outputs_close
from pytest_modelparity.errors import InvalidArgumentError
from pytest_modelparity.verdict.validators import check_batch_sizes, check_tolerance_value

A = np.linspace(-1, 1, 12, dtype="float32").reshape(3, 4)


def double(b):
    return b * 2


def test_a_named_output_against_a_one_element_list_of_arrays_is_a_structure_failure() -> None:
    """compare() says "structure differs" for this pair; the assertion must not pass it."""
    with pytest.raises(ParityError, match="structure|missing|unexpected"):
        assert_outputs_close({"y": A}, [A])
    with pytest.raises(ParityError):
        assert_outputs_close([A], {"y": A})


def test_differently_named_arrays_are_never_paired() -> None:
    with pytest.raises(ParityError):
        assert_outputs_close({"y": A}, {"z": A})


def test_models_with_two_real_names_that_differ_are_never_paired() -> None:
    from pytest_modelparity.formats.binding import BindingError

    with pytest.raises(BindingError, match="'logits' with 'probs'.*two real names that differ"):
        assert_outputs_close(lambda b: {"probs": b}, lambda b: {"logits": b}, inputs=A)


def test_an_alignment_made_on_purpose_is_said_in_the_report_text() -> None:
    report = assert_outputs_close(lambda b: {"probs": b * 2}, lambda b: [b * 2], inputs=A)
    assert report.passed
    assert "structures aligned: outputs paired: '[0]'~'probs' (shape and dtype: the only (3, 4) float32)" in str(report)
    assert report.to_dict()["meta"]["binding"]["outputs"][0]["basis"] == "shape and dtype"


@pytest.mark.parametrize("call", [
    lambda x: assert_outputs_close(double, double, inputs=x),
    lambda x: assert_deterministic(double, x),
    lambda x: assert_batch_invariant(double, x),
], ids=["outputs_close", "deterministic", "batch_invariant"])
@pytest.mark.parametrize("empty", [np.zeros((0, 4), "float32"), {"x": np.zeros((0, 4), "float32")}],
                         ids=["array", "dict"])
def test_an_empty_batch_is_a_usage_error_in_every_assertion(call, empty) -> None:
    with pytest.raises(InvalidArgumentError, match="0 rows .* pass a batch with at least one row"):
        call(empty)


@pytest.mark.parametrize("value, problem", [
    (float("nan"), "must be a finite number >= 0"),
    (float("inf"), "must be a finite number >= 0"),
    (-1e-5, "must be a finite number >= 0"),
    ("tight", "is not a number"),
    (True, "is a bool"),
])
def test_a_bad_rtol_is_the_same_error_everywhere(value, problem) -> None:
    with pytest.raises(InvalidArgumentError, match=problem):
        check_tolerance_value("rtol", value)
    with pytest.raises(InvalidArgumentError, match=f"rtol=.* from argument {problem}"):
        assert_outputs_close(A, A, rtol=value)
    with pytest.raises(InvalidArgumentError, match=problem):
        assert_deterministic(double, A, rtol=value)
    with pytest.raises(InvalidArgumentError, match=problem):
        assert_batch_invariant(double, A, rtol=value)


@pytest.mark.parametrize("sizes", [0, (), (1, 0), ("2",), (True,), "12"])
def test_bad_batch_sizes_name_the_fix(sizes) -> None:
    with pytest.raises(InvalidArgumentError, match="batch_sizes"):
        check_batch_sizes(sizes)
    with pytest.raises(InvalidArgumentError, match="batch_sizes"):
        assert_batch_invariant(double, A, batch_sizes=sizes)


def test_invalid_argument_error_is_a_value_error() -> None:
    """Code that caught ValueError before the validators were shared still catches it."""
    assert issubclass(InvalidArgumentError, ValueError)
    with pytest.raises(ValueError):
        assert_deterministic(double, A, runs=1)


@pytest.mark.parametrize("kwargs, message", [
    ({"tolerance": "loose"}, "pass a Tolerance, None or the string 'calibrated'"),
    ({"tolerance": 1e-3}, "pass a Tolerance, None or the string 'calibrated'"),
    ({"tolerance": "calibrated", "rtol": 1e-3}, "exclude each other"),
])
def test_a_bad_tolerance_choice_fails_before_any_model_runs(kwargs, message) -> None:
    calls = []

    def counted(b):
        calls.append(1)
        return b

    with pytest.raises(InvalidArgumentError, match=message):
        assert_outputs_close(counted, counted, inputs=A, **kwargs)
    with pytest.raises(InvalidArgumentError, match=message):
        assert_batch_invariant(counted, A, **kwargs)
    assert calls == []


@pytest.mark.parametrize("inputs, message", [
    ({}, "empty dict"),
    (np.float32(1.0), "no batch axis"),
    ({"a": A, "b": A[:2]}, "disagree on the batch size"),
])
def test_a_batch_of_the_wrong_form_is_an_invalid_argument(inputs, message) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        assert_batch_invariant(double, inputs)
