"""The output tree: nested dicts/lists/tuples of arrays, and the one spelling of a path in it.

Model outputs (and batches of inputs) come as an array or nested containers of arrays. Every
module that walks them (``compare``, ``assertions``, ``diagnose``) goes through here, so they
agree on two things:

- what is a leaf: anything that is not a mapping, list or tuple, and also a list or tuple of
  plain numbers (``[1.0, 2.0]``, ``[]``, ``[1j]``, ``[np.bool_(True)]``), which numpy reads as
  one array, just as ``np.asarray`` would. A list holding any non-number (an array, a list,
  a string) is a list of outputs; where a list of numbers meets a list of outputs on the
  other side (``(np.float32(1), np.float32(2))`` against ``[np.array(1.0), np.array(2.0)]``)
  both are walked item by item, by ``compare`` and the assertions alike;
- how a path is spelled: ``""`` for a bare array, ``"['a']"``, ``"[0]"``, ``"['a'][0]"``.

numpy only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

__all__ = ["NUMBER_TYPES", "FlatTree", "is_number_list", "is_branch", "child_path", "children",
           "leaves", "flatten", "map_leaves", "map_paths", "map_inputs"]

# Python bool is an int; np.number covers numpy's integers, floats and complex numbers
NUMBER_TYPES = (int, float, complex, np.number, np.bool_)


class FlatTree(dict):
    """Outputs already flattened to ``{path: array}``: ``flatten`` returns them as they are
    (diagnosis cuts outputs to a few rows without rebuilding their containers)."""


def is_number_list(x: Any) -> bool:
    """A list or tuple of plain numbers (the empty one included) is one array, as numpy reads it."""
    return isinstance(x, (list, tuple)) and all(isinstance(v, NUMBER_TYPES) for v in x)


def is_branch(x: Any) -> bool:
    """A container of outputs: a mapping, or a list/tuple that is not a list of numbers."""
    return isinstance(x, Mapping) or (isinstance(x, (list, tuple)) and not is_number_list(x))


def child_path(path: str, key: Any) -> str:
    """The path of entry ``key`` (a mapping key or a list index) below ``path``."""
    return f"{path}[{key!r}]"


def children(node: Any) -> Iterator[tuple[Any, Any]]:
    """``(key, child)`` of a branch: mapping items, or (index, item) of a list/tuple."""
    return iter(node.items()) if isinstance(node, Mapping) else enumerate(node)


def leaves(tree: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, leaf)`` pairs in order, leaves as given (not converted to arrays)."""
    if isinstance(tree, FlatTree):
        yield from tree.items()
    elif is_branch(tree):
        for key, child in children(tree):
            yield from leaves(child, child_path(path, key))
    else:
        yield path, tree


def flatten(tree: Any) -> dict[str, np.ndarray]:
    """``{path: array}`` of every leaf."""
    return {path: np.asarray(leaf) for path, leaf in leaves(tree)}


def map_leaves(fn: Callable[[Any], Any], tree: Any) -> Any:
    """The same containers with ``fn`` applied to each leaf (mappings become dicts)."""
    return map_paths(lambda _path, leaf: fn(leaf), tree)


def map_paths(fn: Callable[..., Any], tree: Any, *others: Any, path: str = "") -> Any:
    """The containers of ``tree`` with each leaf replaced by ``fn(path, leaf, *other_leaves)``,
    where ``others`` have the same structure (indexed by the keys of ``tree``)."""
    if not is_branch(tree):
        return fn(path, tree, *others)
    if isinstance(tree, Mapping):
        return {k: map_paths(fn, v, *(o[k] for o in others), path=child_path(path, k))
                for k, v in tree.items()}
    mapped = [map_paths(fn, v, *(o[i] for o in others), path=child_path(path, i))
              for i, v in enumerate(tree)]
    return tuple(mapped) if isinstance(tree, tuple) else mapped


def map_inputs(fn: Callable[[Any], Any], batch: Any) -> Any:
    """A batch of inputs with ``fn`` applied to each input. A batch is one level deep (one
    input, or a mapping or list/tuple of inputs), so an input given as nested Python lists
    (``{"x": [[1, 2], [3, 4]]}``) is one input, cut by rows like an array."""
    if isinstance(batch, Mapping):
        return {k: fn(v) for k, v in batch.items()}
    if is_branch(batch):
        mapped = [fn(v) for v in batch]
        return tuple(mapped) if isinstance(batch, tuple) else mapped
    return fn(batch)
