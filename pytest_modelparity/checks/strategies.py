"""Hypothesis strategies that draw batches fitting a model's inputs.

``batches(model)`` draws a ``Batch`` (a dict ``{input name: array}``) whose batch size and
unknown dims are Hypothesis-drawn integers, so a failure shrinks to the smallest batch that
still fails and Hypothesis prints it.

Why values come from a seeded generator by default instead of element by element: parity
bugs (a swapped channel order, a 255/256 scale, a double softmax) only show on dense, varied
inputs, and an image batch has thousands of elements; element-wise drawing is slow and fills
most elements with one value. The seed is drawn (and shrinks to 0), so every example is
reproducible. Pass a Hypothesis strategy in ``elements`` to draw values element by element.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ..errors import DatasetMismatch
from ..formats.base import TensorSpec
from ..runtime.resources import check_allocation
from ..verdict.validators import check_batch_size

__all__ = ["Batch", "batches", "dataset_batches", "fixed_batch", "specs_of", "seeded_batch", "PROFILE",
           "register_profile"]

PROFILE = "modelparity"
DEFAULT_FLOAT_RANGE = (-1.0, 1.0)
DEFAULT_INT_RANGE = (0, 10)
UNKNOWN_DIM_RANGE = (1, 8)


def register_profile() -> None:
    """Register the ``modelparity`` settings profile (loaded only when the user asks).

    No deadline: the first call of a model traces or warms up and can take seconds. Fewer
    examples: each one runs a model, often twice. ``too_slow``/``data_too_large`` are
    suppressed because model inputs are large by nature.
    """
    settings.register_profile(
        PROFILE,
        deadline=None,
        max_examples=25,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )


class Batch(dict):
    """A drawn batch: ``{input name: array}`` with a short, reproducible repr."""

    @property
    def size(self) -> int:
        first = next(iter(self.values()), None)
        return 0 if first is None or np.ndim(first) == 0 else int(np.shape(first)[0])

    def __repr__(self) -> str:
        with np.printoptions(threshold=64, edgeitems=2, precision=4):
            body = ", ".join(f"{name}={np.array_repr(np.asarray(arr))}" for name, arr in self.items())
        return f"Batch(size={self.size}, {body})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # Hypothesis' and IPython's printer
        p.text(repr(self))


def specs_of(model_or_specs: Any) -> list[TensorSpec]:
    """Input specs of a ``LoadedModel``, a Keras model, or a list of ``TensorSpec``."""
    inputs = getattr(model_or_specs, "inputs", model_or_specs)
    if isinstance(inputs, TensorSpec):
        inputs = [inputs]
    if isinstance(inputs, Mapping):
        inputs = list(inputs.values())
    if not isinstance(inputs, Sequence) or not inputs:
        raise InvalidArgument(
            f"batches() needs a LoadedModel, a Keras model or a list of TensorSpec, got "
            f"{type(model_or_specs).__name__}; pass e.g. parity_reference or parity_reference.inputs")
    specs: list[TensorSpec] = []
    for i, spec in enumerate(inputs):
        if isinstance(spec, TensorSpec):
            specs.append(spec)
            continue
        shape = getattr(spec, "shape", None)
        dtype = getattr(spec, "dtype", None)
        if shape is None or dtype is None:
            raise InvalidArgument(
                f"input {i} of {type(model_or_specs).__name__} has no shape/dtype; pass a list of "
                "pytest_modelparity.TensorSpec(name, shape, dtype) instead")
        name = str(getattr(spec, "name", None) or f"input_{i}").split(":")[0]
        dtype = getattr(dtype, "as_numpy_dtype", dtype)  # tf.DType -> numpy
        specs.append(TensorSpec(name, tuple(None if d is None else int(d) for d in shape), dtype))
    return specs


def _check_range(name: str, value: Any) -> tuple[float, float]:
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or not all(isinstance(v, (int, float, np.integer, np.floating)) for v in value)
            or not value[0] <= value[1]):
        raise InvalidArgument(
            f"elements for input {name!r} must be a Hypothesis strategy or a (low, high) pair with "
            f"low <= high, got {value!r}; e.g. elements={{{name!r}: (0, 255)}}")
    return value[0], value[1]


def _element_rule(spec: TensorSpec, elements: Any) -> Any:
    """What fills ``spec``: a strategy, a (low, high) range, or None for the dtype's default."""
    rule = elements.get(spec.name) if isinstance(elements, Mapping) else elements
    if rule is None or isinstance(rule, st.SearchStrategy):
        return rule
    return _check_range(spec.name, rule)


# Words a text model's vocabulary likely holds, mixed with random ones (out of vocabulary).
_WORDS = ("the", "a", "and", "of", "to", "in", "is", "it", "cat", "dog", "good", "bad", "movie", "great",
          "not", "very")
_LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))


def _strings(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """UTF-8 ``bytes`` (an object array, as TensorFlow holds strings): 1-4 space-separated words,
    each a common English word or random letters, sometimes an empty string."""
    out = np.empty(shape, dtype=object)
    flat = out.reshape(-1)
    for i in range(flat.size):
        words = []
        for _ in range(int(rng.integers(0, 5))):
            if rng.random() < 0.6:
                words.append(_WORDS[int(rng.integers(len(_WORDS)))])
            else:
                words.append("".join(rng.choice(_LETTERS, int(rng.integers(1, 8)))))
        flat[i] = " ".join(words).encode("utf-8")
    return out


def _fill(rng: np.random.Generator, spec: TensorSpec, shape: tuple[int, ...], rule: Any) -> np.ndarray:
    kind = spec.dtype.kind
    # Refused before numpy tries (a shape like (1, 1e6, 1e6, 3) asked for 87 TiB): the random
    # numbers are drawn as 8-byte values, then cast; a string cell costs a Python object.
    per_element = 64 if kind in "OSU" else 8 + spec.dtype.itemsize
    check_allocation(math.prod(shape) * per_element, f"a batch for input {spec.name!r} of shape {shape}")
    if kind in "OSU":  # a string input
        if rule is not None:
            raise InvalidArgument(f"input {spec.name!r} is a string input: pass a Hypothesis strategy "
                                  f"(e.g. st.text()) for it, not a (low, high) range")
        return _strings(rng, shape)
    if kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if kind in "iu":
        lo, hi = rule if rule is not None else DEFAULT_INT_RANGE
        return rng.integers(int(lo), int(hi), shape, endpoint=True).astype(spec.dtype)
    lo, hi = rule if rule is not None else DEFAULT_FLOAT_RANGE
    return rng.uniform(lo, hi, shape).astype(spec.dtype)


def _check_batch_size(batch_size: Any) -> st.SearchStrategy:
    """An int (checked by the shared validator, as in every assertion) or a strategy."""
    if isinstance(batch_size, st.SearchStrategy):
        return batch_size
    return st.just(check_batch_size(batch_size))


@st.composite
def _batches(draw: Any, specs: list[TensorSpec], batch_size: st.SearchStrategy, elements: Any) -> Batch:
    size = draw(batch_size)
    if not isinstance(size, (int, np.integer)) or size < 1:
        raise InvalidArgument(f"batch_size strategy drew {size!r}; it must draw ints >= 1")
    rules = {s.name: _element_rule(s, elements) for s in specs}
    seed = None
    batch = Batch()
    for spec in specs:
        dims = [int(size)]
        for d in spec.shape[1:]:
            dims.append(d if d is not None else draw(st.integers(*UNKNOWN_DIM_RANGE)))
        shape = tuple(dims)
        rule = rules[spec.name]
        if isinstance(rule, st.SearchStrategy):
            from hypothesis.extra import numpy as hnp

            batch[spec.name] = draw(hnp.arrays(spec.dtype, shape, elements=rule))
            continue
        if seed is None:
            seed = draw(st.integers(0, 2**32 - 1))
        batch[spec.name] = _fill(np.random.default_rng([seed, len(batch)]), spec, shape, rule)
    return batch


def batches(model_or_specs: Any, *, batch_size: Any = None, elements: Any = None) -> st.SearchStrategy:
    """Draw ``Batch`` dicts fitting ``model_or_specs`` (a LoadedModel, Keras model or specs).

    ``batch_size``: an int or a strategy (default ``st.integers(1, 16)``), shrinking to small.
    ``elements``: None (floats in [-1, 1], ints in [0, 10], bools, strings of 0-4 words as
    UTF-8 bytes), a ``(low, high)`` pair or a
    strategy for every input, or a dict ``{input name: pair or strategy}`` (e.g. token ids
    ``{"ids": (0, 30521)}``, pixels ``{"image": (0, 255)}``).
    """
    specs = specs_of(model_or_specs)
    if elements is not None and not isinstance(elements, (Mapping, st.SearchStrategy, tuple, list)):
        raise InvalidArgument(
            f"elements must be None, a (low, high) pair, a strategy or a dict by input name, got {elements!r}")
    if isinstance(elements, Mapping):
        unknown = set(elements) - {s.name for s in specs}
        if unknown:
            raise InvalidArgument(
                f"elements names unknown input(s) {sorted(unknown)}; the inputs are {[s.name for s in specs]}")
    for spec in specs:
        _element_rule(spec, elements)  # check ranges up front
    size = _check_batch_size(st.integers(1, 16) if batch_size is None else batch_size)
    fixed = fixed_batch(specs)
    if fixed is not None:
        size = st.just(fixed)  # the only batch the model accepts (LoadedModel.prepare_batch checks it)
    return _batches(specs, size, elements)


def fixed_batch(specs: Sequence[TensorSpec]) -> int | None:
    """The batch size a model was built for (``keras.Input(..., batch_size=4)``), or None.

    Such a model refuses every other batch size, so the batches drawn for it have that size
    whatever ``batch_size`` asks for.
    """
    dims = {s.shape[0] for s in specs if s.shape and s.shape[0] is not None}
    return dims.pop() if len(dims) == 1 else None


def seeded_batch(model_or_specs: Any, *, batch_size: int = 4, seed: int = 0, elements: Any = None) -> Batch:
    """One reproducible batch (no Hypothesis): what the ``parity_batch`` fixture returns.
    A model built for a fixed batch gets a batch of that size (see ``fixed_batch``)."""
    specs = specs_of(model_or_specs)
    requested = check_batch_size(batch_size)
    batch_size = fixed_batch(specs) or requested
    batch = Batch()
    rng_dims = np.random.default_rng(seed)
    for i, spec in enumerate(specs):
        shape = (batch_size,) + tuple(d if d is not None else int(rng_dims.integers(*UNKNOWN_DIM_RANGE, endpoint=True))
                                      for d in spec.shape[1:])
        rule = _element_rule(spec, elements)
        if isinstance(rule, st.SearchStrategy):
            raise InvalidArgument("seeded_batch takes (low, high) ranges, not strategies")
        batch[spec.name] = _fill(np.random.default_rng([seed, i]), spec, shape, rule)
    return batch


class NoRows(InvalidArgument, DatasetMismatch):
    """``dataset_batches`` without rows: Hypothesis' usage error, and a ``DatasetMismatch`` so
    the plugin shows its text alone instead of the traceback through ``@given``."""


def dataset_batches(model_or_specs: Any, dataset: Any, *, batch_size: Any = None, perturb: float = 0.0) -> st.SearchStrategy:
    """Draw ``Batch`` dicts of real rows from ``dataset`` (what ``modelparity_dataset`` takes:
    arrays, a dict, an ``.npz`` path, a ``tf.data.Dataset``, an iterable of batches).

    Rows are drawn by index (shrinking towards the first rows); ``perturb`` > 0 adds uniform
    noise of up to ``perturb`` x each float input's span (clipped to it), so the rows stay
    near the data a model was trained on. ``batch_size``: an int or a strategy (default
    ``st.integers(1, 16)``).
    """
    from .dataset import as_dataset

    if not isinstance(perturb, (int, float)) or not 0 <= perturb < 1:
        raise InvalidArgument(f"perturb={perturb!r}; pass a share of each input's span in [0, 1), e.g. 0.01")
    specs = specs_of(model_or_specs)
    data = as_dataset(dataset)
    if data is None:
        raise NoRows("dataset_batches(model, dataset=None): this run has no real rows to draw from (modelparity_dataset "
                     "is None); give it rows with --modelparity-data=rows.npz (saved with np.savez(path, **{input name: "
                     "rows})) or a session fixture modelparity_dataset in conftest.py that returns them; for random "
                     "rows draw strategies.batches(model) instead")
    arrays = data.arrays(specs)
    total = data.rows(specs)
    size = _check_batch_size(st.integers(1, 16) if batch_size is None else batch_size)
    fixed = fixed_batch(specs)
    if fixed is not None:
        size = st.just(fixed)
    spans = {k: (float(np.min(v)), float(np.max(v))) for k, v in arrays.items() if v.dtype.kind == "f" and v.size}

    @st.composite
    def draw_batch(draw: Any) -> Batch:
        n = int(draw(size))
        index = np.array(draw(st.lists(st.integers(0, total - 1), min_size=n, max_size=n)))
        batch = Batch({k: v[index].copy() for k, v in arrays.items()})
        if perturb:
            seed = draw(st.integers(0, 2**32 - 1))
            rng = np.random.default_rng(seed)
            for k, (lo, hi) in spans.items():
                noise = rng.uniform(-1.0, 1.0, batch[k].shape) * perturb * (hi - lo)
                batch[k] = np.clip(batch[k] + noise, lo, hi).astype(batch[k].dtype)
        return batch

    return draw_batch()
