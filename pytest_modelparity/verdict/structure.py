"""Pairing two result structures: nested dicts, lists, tuples and record arrays walked in
parallel, each pair of leaves handed to the caller's judge, each missing or extra output (and a
structure that differs) reported as an ``OutputComparison`` with its problem."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import tree
from .arrays import as_numpy
from .results import OutputComparison

__all__ = ["Leaf", "walk_pair"]

# (actual leaf, expected leaf, path) -> its verdict
Leaf = Callable[[Any, Any, str], OutputComparison]


def _kind_name(x: Any) -> str:
    if isinstance(x, Mapping):
        return f"a mapping with keys {sorted(map(str, x.keys()))}"
    if isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of length {len(x)}"
    if isinstance(x, np.ndarray):
        return f"an array of shape {x.shape}"
    return f"a {type(x).__name__}"


def walk_pair(a: Any, e: Any, path: str, out: list, leaf: Leaf) -> None:
    """Append to ``out`` one ``OutputComparison`` per leaf pair (``leaf`` judges it) or per
    structural problem under ``path``."""
    if not (tree.is_branch(a) or tree.is_branch(e)):
        if _is_record(a) and _is_record(e):
            _walk_records(np.asarray(a), np.asarray(e), path, out, leaf)
        else:
            out.append(leaf(a, e, path))
    elif isinstance(a, Mapping) and isinstance(e, Mapping):
        _walk_mappings(a, e, path, out, leaf)
    elif isinstance(a, (list, tuple)) and isinstance(e, (list, tuple)):
        _walk_sequences(a, e, path, out, leaf)
    else:
        out.append(_structure_problem(
            path, f"structure differs: actual is {_kind_name(a)}, expected is {_kind_name(e)}"))


def _is_record(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.void)) and x.dtype.names is not None


def _walk_records(a: np.ndarray, e: np.ndarray, path: str, out: list, leaf: Leaf) -> None:
    """Structured (record) arrays: each field is an output of its own (``"['x']"``), judged
    by its own dtype's rule, as if the record were a mapping of arrays."""
    names = a.dtype.names or ()
    if a.shape != e.shape or names != e.dtype.names:
        out.append(leaf(a, e, path))
        return
    _walk_mappings({k: a[k] for k in names}, {k: e[k] for k in names}, path, out, leaf)


def _walk_mappings(a: Mapping, e: Mapping, path: str, out: list, leaf: Leaf) -> None:
    for key in e:
        sub = tree.child_path(path, key)
        if key in a:
            walk_pair(a[key], e[key], sub, out, leaf)
        else:
            out.append(_structure_problem(
                sub, f"missing output: expected has key {key!r}, actual does not "
                     f"(actual keys: {sorted(map(str, a.keys()))})", e=e[key]))
    for key in a:
        if key not in e:
            out.append(_structure_problem(
                tree.child_path(path, key), f"unexpected output: actual has key {key!r}, "
                f"expected does not (expected keys: {sorted(map(str, e.keys()))})", a=a[key]))


def _walk_sequences(a: Any, e: Any, path: str, out: list, leaf: Leaf) -> None:
    for i in range(min(len(a), len(e))):
        walk_pair(a[i], e[i], tree.child_path(path, i), out, leaf)
    for i in range(len(e), len(a)):
        out.append(_structure_problem(
            tree.child_path(path, i), f"unexpected output: actual has {len(a)} outputs, "
                                      f"expected {len(e)}", a=a[i]))
    for i in range(len(a), len(e)):
        out.append(_structure_problem(
            tree.child_path(path, i), f"missing output: actual has {len(a)} outputs, "
                                      f"expected {len(e)}", e=e[i]))


def _structure_problem(path: str, problem: str, a: Any = None, e: Any = None) -> OutputComparison:
    oc = OutputComparison(path=path, passed=False, problem=problem)
    for side, value in (("actual", a), ("expected", e)):
        if value is not None and not tree.is_branch(value):
            arr = np.asarray(as_numpy(value))
            setattr(oc, f"{side}_shape", tuple(arr.shape))
            setattr(oc, f"{side}_dtype", str(arr.dtype))
    return oc
