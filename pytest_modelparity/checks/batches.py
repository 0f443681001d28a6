"""A batch and a model's outputs as trees of arrays: rows counted, sliced, reversed and joined,
read as numpy the way ``compare`` walks them. Why apart from the assertions: every check needs
these, none of them judges anything. numpy only.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import numpy as np

from ..errors import InvalidArgumentError
from ..verdict import tree, validators
from ..verdict.arrays import as_numpy


def to_numpy(obj: Any) -> Any:
    """Model outputs as numpy: dicts stay dicts, lists/tuples become lists, tensors arrays."""
    if tree.is_branch(obj):
        return {k: to_numpy(v) for k, v in obj.items()} if isinstance(obj, Mapping) else [to_numpy(v) for v in obj]
    return np.asarray(as_numpy(obj))


def to_numpy_pair(actual: Any, expected: Any) -> tuple[Any, Any]:
    """Both sides as numpy, walked the way ``compare`` walks them: a list of plain numbers
    met by a list of outputs (``(np.float32(1), np.float32(2))`` against
    ``[np.array(1.0), np.array(2.0)]``) is read item by item, as compare reads it, instead of
    becoming one array that no longer matches the other side's structure."""
    if isinstance(actual, Mapping) and isinstance(expected, Mapping):
        pairs = {k: to_numpy_pair(actual[k], expected[k]) for k in actual if k in expected}
        return ({k: pairs[k][0] if k in pairs else to_numpy(v) for k, v in actual.items()},
                {k: pairs[k][1] if k in pairs else to_numpy(v) for k, v in expected.items()})
    if (isinstance(actual, (list, tuple)) and isinstance(expected, (list, tuple))
            and (tree.is_branch(actual) or tree.is_branch(expected))):
        n = min(len(actual), len(expected))
        items = [to_numpy_pair(a, e) for a, e in zip(actual, expected)]
        return ([a for a, _ in items] + [to_numpy(v) for v in actual[n:]],
                [e for _, e in items] + [to_numpy(v) for v in expected[n:]])
    return to_numpy(actual), to_numpy(expected)


def leaves(outputs: Any) -> Iterator[tuple[str, np.ndarray]]:
    """``(path, array)`` pairs, paths spelled as ``compare`` spells them (``tree``)."""
    return iter(tree.flatten(outputs).items())


def max_abs_tree(a: Any, b: Any) -> float:
    worst = 0.0
    b_leaves = dict(leaves(b))
    for path, x in leaves(a):
        y = b_leaves.get(path)
        if y is None or x.shape != y.shape:
            return float("inf")
        if x.size == 0:
            continue
        if x.dtype.kind in "fc" or y.dtype.kind in "fc":
            xf, yf = x.astype(np.float64), y.astype(np.float64)
            same = (xf == yf) | (np.isnan(xf) & np.isnan(yf))
            d = np.where(same, 0.0, np.abs(xf - yf))
            worst = max(worst, float(np.nanmax(np.where(np.isnan(d), np.inf, d))))
        else:
            worst = max(worst, float(np.max(x != y)))
    return worst


def first_array(inputs: Any) -> Any:
    if isinstance(inputs, Mapping):
        if not inputs:
            raise InvalidArgumentError("inputs is an empty dict; pass at least one input array")
        return next(iter(inputs.values()))
    if isinstance(inputs, (list, tuple)) and inputs and tree.is_branch(inputs):
        return inputs[0]
    return inputs


def batch_length(inputs: Any) -> int:
    first = first_array(inputs)
    shape = getattr(first, "shape", None)
    if shape is None:
        shape = np.shape(first)
    if len(shape) == 0:
        raise InvalidArgumentError("inputs have no batch axis (a scalar); pass a batch whose axis 0 indexes the rows")
    n = int(shape[0])
    for other in all_arrays(inputs):
        other_shape = getattr(other, "shape", None) or np.shape(other)
        if len(other_shape) == 0 or int(other_shape[0]) != n:
            raise InvalidArgumentError(f"inputs disagree on the batch size (axis 0): {n} vs "
                                       f"{other_shape[0] if len(other_shape) else 'a scalar'}; every input must have the same rows")
    return n


def check_rows(inputs: Any, where: str) -> None:
    """A batch with 0 rows runs nothing worth comparing: refuse it (scalars are left alone)."""
    first = first_array(inputs)
    shape = getattr(first, "shape", None)
    if shape is None:
        shape = np.shape(first)
    if len(shape) > 0 and shape[0] is not None:
        validators.check_nonempty_batch(int(shape[0]), where)


def all_arrays(inputs: Any):
    if isinstance(inputs, Mapping):
        yield from inputs.values()
    elif tree.is_branch(inputs):
        yield from inputs
    else:
        yield inputs


def slice_rows(inputs: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of every input (the batch's own containers kept)."""
    return tree.map_inputs(lambda v: v[start:stop], inputs)


def reverse(inputs: Any, n: int) -> Any:
    order = np.arange(n - 1, -1, -1)
    return tree.map_inputs(lambda v: np.asarray(v)[order], inputs)


def reverse_tree(outputs: Any) -> Any:
    """Outputs with their rows reversed (a scalar output stays as it is)."""
    return tree.map_leaves(lambda v: np.asarray(v)[::-1] if np.ndim(v) else np.asarray(v), outputs)


def slice_tree(outputs: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of every output (a scalar output stays as it is)."""
    return tree.map_leaves(lambda v: np.asarray(v)[start:stop] if np.ndim(v) else np.asarray(v), outputs)


def concat(parts: list[Any], *, where: str) -> Any:
    """One output tree from the outputs of consecutive sub-batches (joined on axis 0)."""
    def join(path: str, *leaves: Any) -> np.ndarray:
        arrays = [np.asarray(p) for p in leaves]
        if any(a.ndim == 0 for a in arrays):
            raise ValueError(f"{where}{' ' + path if path else ''} is a scalar per call: batch invariance needs "
                             "outputs whose axis 0 is the batch")
        return np.concatenate(arrays, axis=0)

    return tree.map_paths(join, parts[0], *parts[1:])
