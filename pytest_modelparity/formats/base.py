"""What every format returns: a ``LoadedModel`` with named, typed inputs and outputs.

CONTRACT (other modules rely on these names): ``TensorSpec``, ``LoadedModel`` with
``.format``, ``.device``, ``.inputs``, ``.outputs``, ``.source``, ``.predict(batch)``,
``__call__`` (= predict), ``prepare_batch``, ``close()`` and the optional diagnosis hooks
``graph_defs()``, ``weights()``, ``intermediates(batch)``, ``op_types()``.

A format module subclasses ``LoadedModel`` and implements ``_predict(feeds)`` where
``feeds`` has already been checked and cast to the input specs by ``prepare_batch``.
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, SupportsInt

import numpy as np
from numpy.typing import DTypeLike

from ..errors import BatchMismatchError

Shape = tuple  # tuple[int | None, ...]


@dataclass(frozen=True, init=False)
class TensorSpec:
    """Name, shape (``None`` for an unknown dim, usually the batch) and numpy dtype.

    The constructor takes any dtype numpy understands (``"float32"``, ``np.float32``) and any
    iterable of dims (a negative dim means unknown, like ``None``); the attributes are always
    a ``np.dtype`` and a tuple of ``int | None``.
    """

    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype

    def __init__(self, name: str, shape: Iterable[SupportsInt | None], dtype: DTypeLike) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "shape", tuple(None if d is None or int(d) < 0 else int(d) for d in shape))
        object.__setattr__(self, "dtype", _np_dtype(dtype))

    def describe(self) -> str:
        dims = ", ".join("None" if d is None else str(d) for d in self.shape)
        return f"{self.name}: ({dims}) {self.dtype.name}"


_ACCEPTED_KINDS = {"f": "fiub", "c": "fiubc", "i": "iub", "u": "iub", "b": "b", "O": "USO", "S": "USO"}


def _np_dtype(dtype: DTypeLike) -> np.dtype:
    """``np.dtype(dtype)``, with Keras' and TensorFlow's ``"string"`` as ``object`` (TF's numpy
    type for strings: an object array of ``bytes``)."""
    if str(getattr(dtype, "name", dtype)) == "string":
        return np.dtype(object)
    return np.dtype(dtype)


def as_string_array(arr: np.ndarray) -> np.ndarray:
    """A ``str``, ``bytes`` or object array as an object array of UTF-8 ``bytes`` (what a TF
    string tensor holds), so ``str`` and ``bytes`` batches give the same answer."""
    out = np.empty(arr.shape, dtype=object)
    flat = arr.reshape(-1)
    out.reshape(-1)[:] = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in flat.tolist()]
    return out


def describe_specs(specs: Sequence[TensorSpec]) -> str:
    return "; ".join(s.describe() for s in specs) or "(none)"


class LoadedModel(abc.ABC):
    """A model in one format, loaded on one device, callable on numpy batches."""

    format: str = "?"
    # The least precise float dtype the model computes in, when narrower than its outputs
    # (Keras mixed precision: float16 layers under a float32 output). None: its outputs' dtype.
    # The default tolerance follows it, so float16 arithmetic is judged as float16.
    compute_dtype: str | None = None

    def __init__(self, *, device: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                 source: str | Path | None = None) -> None:
        self.device = device
        self.inputs: tuple[TensorSpec, ...] = tuple(inputs)
        self.outputs: tuple[TensorSpec, ...] = tuple(outputs)
        self.source = None if source is None else str(source)

    # -- prediction -------------------------------------------------------------------
    def predict(self, batch: Any) -> dict[str, np.ndarray]:
        """Run the model on ``batch`` (an array, a list in input order, or a dict by name)."""
        feeds = self.prepare_batch(batch)
        return self._predict(feeds)

    __call__ = predict

    @abc.abstractmethod
    def _predict(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on checked, cast inputs; return ``{output name: array}``."""

    def prepare_batch(self, batch: Any) -> dict[str, np.ndarray]:
        """Map ``batch`` onto the input specs, check it fits, cast to each input's dtype."""
        names = [s.name for s in self.inputs]
        if isinstance(batch, Mapping):
            given = by_converter_names(dict(batch), names)
            missing = [n for n in names if n not in given]
            extra = [k for k in given if k not in names]
            if missing or extra:
                # Never guess, not even for one input: a wrong key is a mistake the caller
                # must hear about (it may be the input of another model); a bare array or a
                # one-element list is how to feed a single input without naming it.
                self._mismatch(f"input names do not match (missing {missing}, unexpected {extra}); "
                               f"key the batch by the model's input names {names} (or the names they were "
                               "exported from: 'x' feeds 'serving_default_x:0')", batch)
        elif isinstance(batch, (list, tuple)) and _is_list_of_arrays(batch):
            if len(batch) != len(names):
                self._mismatch(f"{len(batch)} arrays given for {len(names)} inputs", batch)
            given = dict(zip(names, batch))
        else:
            if len(names) != 1:
                self._mismatch(f"one array given but the model has {len(names)} inputs", batch)
            given = {names[0]: batch}
        feeds: dict[str, np.ndarray] = {}
        for spec in self.inputs:
            arr = np.asarray(given[spec.name])
            if arr.ndim != len(spec.shape):
                self._mismatch(f"input {spec.name!r} has rank {arr.ndim}, the model expects rank {len(spec.shape)}", batch,
                               shape_fix(spec.name, tuple(arr.shape), tuple(spec.shape), len(names)))
            for axis, (got, want) in enumerate(zip(arr.shape, spec.shape)):
                if want is not None and got != want:
                    hint = layout_hint(arr.shape, spec.shape)
                    self._mismatch(f"input {spec.name!r} has a batch of {got} rows, but the model was built for a "
                                   f"fixed batch of {want} (axis 0); feed batches of {want}" if axis == 0 else
                                   f"input {spec.name!r} has size {got} on axis {axis}, the model expects {want}"
                                   + hint, batch,
                                   None if hint else shape_fix(spec.name, tuple(arr.shape), tuple(spec.shape), len(names)))
            if arr.dtype.kind not in _ACCEPTED_KINDS.get(spec.dtype.kind, spec.dtype.kind):
                self._mismatch(f"input {spec.name!r} is {arr.dtype.name}, which cannot be cast safely to {spec.dtype.name}", batch)
            changed = _cast_changes_values(arr, spec.dtype)
            if changed:
                self._mismatch(f"input {spec.name!r} is {arr.dtype.name}; as {spec.dtype.name} {changed}: cast it "
                               "yourself if that is what the model should see", batch)
            if arr.dtype.kind in "iub" and spec.dtype.kind in "fc" and arr.dtype != spec.dtype:
                _note_cast(self, spec.name, arr.dtype, spec.dtype)
            if spec.dtype.kind in "OS":  # a string input
                feeds[spec.name] = as_string_array(arr)
                continue
            self._check_fits_memory(spec.name, arr, spec.dtype, batch)
            feeds[spec.name] = np.ascontiguousarray(arr, dtype=spec.dtype)
        return feeds

    def _check_fits_memory(self, name: str, arr: np.ndarray, dtype: np.dtype, batch: Any) -> None:
        """Refuse, with its size, an input the runtime would copy into memory that is not there
        (a 2 GiB batch under a memory limit segfaulted a SavedModel predict)."""
        from ..errors import InvalidArgumentError
        from ..runtime.resources import check_allocation

        try:
            check_allocation(int(arr.size) * dtype.itemsize, f"input {name!r} ({arr.shape}, {dtype.name})")
        except InvalidArgumentError as exc:
            self._mismatch(str(exc), batch)

    def _mismatch(self, problem: str, batch: Any, fix: str | None = None) -> None:
        raise BatchMismatchError(
            f"{self.format} model{' ' + repr(self.source) if self.source else ''}: {problem}.\n"
            f"  model inputs: {describe_specs(self.inputs)}\n"
            f"  given: {_describe_batch(batch)}" + (f"\n  fix: {fix}" if fix else "")
        )

    # -- optional hooks used by diagnosis (return None when the form cannot tell) -------
    def graph_defs(self) -> list[Any] | None:
        """GraphDef protos of the graph that runs (function library included), if any."""
        return None

    def op_types(self) -> list[tuple[str, str]] | None:
        """``(node name, op type)`` of every op (for formats without a GraphDef, e.g. TFLite)."""
        return None

    def weights(self) -> dict[str, np.ndarray] | None:
        """The model's weights by name (variables or constants), if the form exposes them."""
        return None

    def intermediates(self, batch: Any) -> list[tuple[str, str, np.ndarray]] | None:
        """``(layer or tensor name, op type, value)`` in execution order, if the form can expose them."""
        return None

    def predict_with_weights(self, batch: Any, values: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """The outputs for ``batch`` with the weights named in ``values`` (names as ``weights()``
        gives them) replaced by those arrays for this one run, the model left as it was; None
        when the form cannot (a converted file, whose constants are not its source's)."""
        return None

    # -- lifetime ---------------------------------------------------------------------
    def close(self) -> None:
        """Release processes, sessions or interpreters held by this model."""

    def __enter__(self) -> "LoadedModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} format={self.format!r} device={self.device!r} "
                f"inputs=[{describe_specs(self.inputs)}] outputs=[{describe_specs(self.outputs)}]>")


def converter_base(name: str) -> str:
    """The name a converter started from: ``serving_default_x:0`` and ``x:0`` are ``x`` (how
    TFLite, tf2onnx and tfjs name a SavedModel signature's input ``x``)."""
    base = name[:-2] if name.endswith(":0") else name
    return base[len("serving_default_"):] if base.startswith("serving_default_") else base


def by_converter_names(given: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """``given`` re-keyed by ``names`` where its keys are those names before a converter renamed
    them (``x`` for ``serving_default_x:0``), each key matching exactly one name; else unchanged."""
    if set(given) == set(names) or len(given) != len(names):
        return given
    renamed: dict[str, Any] = {}
    for key, value in given.items():
        hits = [n for n in names if converter_base(n) == converter_base(str(key))]
        if len(hits) != 1 or hits[0] in renamed:
            return given
        renamed[hits[0]] = value
    return renamed


class InputCastWarning(UserWarning):
    """An integer batch was fed to a floating input: the cast keeps every value, said once."""


_CAST_NOTED: set[tuple[str, str | None, str, str]] = set()


def _note_cast(model: "LoadedModel", name: str, given: np.dtype, wanted: np.dtype) -> None:
    key = (model.format, model.source, name, given.name)
    if key in _CAST_NOTED:
        return
    _CAST_NOTED.add(key)
    import warnings

    warnings.warn(InputCastWarning(
        f"{model.format} input {name!r}: a {given.name} batch is fed as {wanted.name} (every value kept); "
        f"pass {wanted.name} to make the cast yours"), stacklevel=4)


def _cast_changes_values(arr: np.ndarray, dtype: np.dtype) -> str | None:
    """What casting ``arr`` to ``dtype`` would change (an integer out of range, one a float cannot
    hold exactly), or None when every value survives. Floats to floats round by design."""
    if not arr.size or arr.dtype.kind not in "iu" or dtype.kind not in "iuf":
        return None
    lo, hi = int(arr.min()), int(arr.max())
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if lo < info.min or hi > info.max:
            return f"values {lo}..{hi} do not fit (range {info.min}..{info.max})"
        return None
    exact = 2 ** (np.finfo(dtype).nmant + 1)
    if max(abs(lo), abs(hi)) > exact and not np.array_equal(arr.astype(dtype).astype(arr.dtype), arr):
        return f"values beyond {exact} would be rounded"
    return None


def _is_list_of_arrays(batch: Sequence[Any]) -> bool:
    """A list of arrays is one array per input; a nested list of numbers is one array."""
    return len(batch) > 0 and all(hasattr(b, "shape") and hasattr(b, "dtype") for b in batch)


# (name of the batch's layout, name of the model's, the transpose that turns one into the other)
_LAYOUTS = ((("channels-first (N, C, H, W)", "channels-last (N, H, W, C)", (0, 2, 3, 1)),
             ("channels-last (N, H, W, C)", "channels-first (N, C, H, W)", (0, 3, 1, 2))))


def _shape_text(shape: Sequence[int | None]) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _fits(given: Sequence[int], wanted: Sequence[int | None]) -> bool:
    return len(given) == len(wanted) and all(w is None or g == w for g, w in zip(given, wanted))


def shape_fix(name: str, given: tuple[int, ...], wanted: tuple[int | None, ...], inputs: int = 1) -> str:
    """The line that makes a batch of shape ``given`` the shape the model takes (``wanted``,
    batch dim first), for the ``fix:`` of a ``BatchMismatchError``: a single example missing its
    batch axis, a channel axis of 1 missing or extra, rows of the right size in another shape
    (reshape), or, where no one line can know, the shape to build. Names ``x`` as the batch (or
    ``batch[name]`` for a model of several inputs). Why: "rank 3, expects rank 4" said what was
    wrong and left the reader to work out the line (issue 50)."""
    x = "x" if inputs == 1 else f"batch[{name!r}]"
    takes = f"the model takes {_shape_text(wanted)} (batch first)"
    rows = given[0] if given else 1
    fixed = wanted[0] if wanted else None
    if fixed is not None and given and given[0] != fixed and _fits((fixed, *given[1:]), wanted):
        return (f"feed it {fixed} row(s) at a time, e.g. [model.predict({x}[i:i + {fixed}]) for i in range(0, {rows}, "
                f"{fixed})]; {takes}, a fixed batch of {fixed}")
    if _fits((1, *given), wanted):
        return f"{x} = {x}[np.newaxis]  # one example without its batch axis; {takes}"
    if wanted and wanted[-1] == 1 and _fits((*given, 1), wanted):
        return f"{x} = {x}[..., np.newaxis]  # the channel axis of 1 is missing; {takes}"
    if given and given[-1] == 1 and _fits(given[:-1], wanted):
        return f"{x} = {x}[..., 0]  # an extra axis of 1; {takes}"
    row = [d for d in wanted[1:]]
    if given and all(d is not None for d in row):
        per_row = int(np.prod([d for d in row if d is not None], dtype=np.int64))
        have = int(np.prod(given[1:], dtype=np.int64)) if len(given) > 1 else 1
        if per_row == have and tuple(given[1:]) != tuple(row):
            shape = ", ".join(str(d) for d in row)
            return (f"{x} = {x}.reshape(({rows}, {shape}))  # each row holds {per_row} values, as the model's do, "
                    f"in another shape; {takes} (reshape only if the values are laid out in that order)")
    build = tuple(rows if i == 0 else (1 if d is None else d) for i, d in enumerate(wanted))
    return (f"{takes}: give {x} that shape, e.g. {x}.shape == {_shape_text(build)} (resize or crop the data to "
            "the model's size; a batch of one row is x[np.newaxis])")


def layout_hint(given: tuple[int, ...], wanted: tuple[int | None, ...]) -> str:
    """``"; the batch looks channels-first ... np.transpose(x, (0, 2, 3, 1))"`` when an image
    batch fits the input once its channel axis is moved (PyTorch-style NCHW data fed to a Keras
    NHWC model, or the reverse), else ``""``. Why: a size mismatch on axis 1 says nothing of the
    cause, and transposing (not reshaping, which scrambles pixels silently) is the fix."""
    if len(given) != 4 or len(wanted) != 4:
        return ""
    for batch_layout, model_layout, axes in _LAYOUTS:
        moved = tuple(given[a] for a in axes)
        if moved != tuple(given) and all(w is None or w == m for m, w in zip(moved, wanted)) \
                and moved[3 if axes == (0, 2, 3, 1) else 1] in (1, 3, 4):
            return (f"; the batch looks {batch_layout} while the model takes {model_layout}: pass "
                    f"np.transpose(x, {axes}) (a reshape would scramble the pixels)")
    return ""


def _describe_batch(batch: Any) -> str:
    def one(a: Any) -> str:
        arr = np.asarray(a)
        return f"{tuple(arr.shape)} {arr.dtype.name}"
    try:
        if isinstance(batch, Mapping):
            return "; ".join(f"{k}: {one(v)}" for k, v in batch.items())
        if isinstance(batch, (list, tuple)):
            return "[" + ", ".join(one(v) for v in batch) + "]"
        return one(batch)
    except Exception:  # noqa: BLE001 - describing must not fail
        return type(batch).__name__
