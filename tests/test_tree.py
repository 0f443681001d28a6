"""The output tree: one rule for "a list of numbers is one array", one path spelling, and
every walker (compare, assertions, diagnosis) agreeing with both."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_modelparity.verdict import tree
from pytest_modelparity.checks.assertions import assert_outputs_close
from pytest_modelparity.verdict.compare import compare
from pytest_modelparity.diagnose import _util


@pytest.mark.parametrize("value", [
    [1.0, 2.0], (1, 2), [], (), [1j, 2 + 0j], [np.bool_(True), np.bool_(False)], [True, 3],
    [np.float32(1.5), np.int64(2)], [np.complex64(1j)],
], ids=["floats", "int-tuple", "empty-list", "empty-tuple", "complex", "np.bool_", "bool-int",
        "numpy-scalars", "numpy-complex"])
def test_a_list_of_numbers_is_one_array(value) -> None:
    assert tree.is_number_list(value) and not tree.is_branch(value)
    flat = tree.flatten(value)
    assert list(flat) == [""]
    np.testing.assert_array_equal(flat[""], np.asarray(value))


@pytest.mark.parametrize("value", [
    [np.zeros(2)], [1.0, np.zeros(2)], [[1.0, 2.0], [3.0]], ["a", "b"], [1.0, None], {"a": 1.0},
], ids=["array", "number-and-array", "nested-lists", "strings", "none", "mapping"])
def test_anything_else_in_a_list_makes_it_a_list_of_outputs(value) -> None:
    assert tree.is_branch(value) and not tree.is_number_list(value)


def test_nested_paths_are_spelled_one_way() -> None:
    outputs = {"a": [np.zeros(2), [1.0, 2.0]], "b": ({"c": np.ones(3)}, []), 0: np.int8(1)}
    assert list(tree.flatten(outputs)) == ["['a'][0]", "['a'][1]", "['b'][0]['c']", "['b'][1]", "[0]"]
    assert tree.flatten(np.zeros(3)).keys() == {""}


def test_map_paths_keeps_containers_and_passes_paths() -> None:
    out = tree.map_paths(lambda path, x, y: (path, x + y), {"a": [1, np.zeros(1)], "b": (np.ones(1),)},
                         {"a": [2, np.ones(1)], "b": (np.ones(1),)})
    assert isinstance(out["b"], tuple) and out["a"][0] == ("['a'][0]", 3)
    assert out["b"][0][0] == "['b'][0]"


def test_a_batch_is_one_level_deep() -> None:
    """An input given as nested Python lists is one input, cut by rows."""
    batch = {"x": [[1, 2], [3, 4], [5, 6]]}
    assert tree.map_inputs(lambda v: np.asarray(v)[:2], batch)["x"].tolist() == [[1, 2], [3, 4]]
    assert isinstance(tree.map_inputs(lambda v: v, (np.zeros(1), np.ones(1))), tuple)


def test_a_flat_tree_is_returned_as_it_is() -> None:
    flat = tree.FlatTree({"['a'][0]": np.zeros(2)})
    assert list(tree.flatten(flat)) == ["['a'][0]"]


@pytest.mark.parametrize("outputs", [
    {"a": [np.float32(1.0), np.float32(2.0)], "b": [np.zeros(2, np.float32), [1j, 2j]]},
    [[], np.zeros(2, np.float32), [np.bool_(True)]],
    {"x": (np.ones(3, np.float32), {"y": [1.0, 2.5]})},
], ids=["numpy-scalars-and-complex", "empty-and-np.bool_", "nested"])
def test_compare_assertions_and_diagnosis_agree_on_paths(outputs) -> None:
    paths = list(tree.flatten(outputs))
    assert [o.path for o in compare(outputs, outputs).outputs] == paths
    assert list(_util.flatten(outputs)) == paths
    report = assert_outputs_close(outputs, outputs, allow_vacuous=True)
    assert [o.path for o in report.outputs] == paths
