"""A run that shows its own power: small known bugs planted into the reference, judged by the
same bounds that passed the real candidate.

Why: a PASS is worth what the check could have caught. A bound set by the wrong twin, or a
decision on too few rows, passes a broken form as readily as a good one, and nothing in a green
run says so. Planting bugs whose size is known (a 1% change of the reference's most influential
kernel, an input gain of 255/256, a swap of two same-shape outputs) and asking whether the very
tolerance that judged the candidate would fail on each turns "passed" into "passed, and would
have caught these".

The bug is planted in the reference (a Keras model: its variables are changed in place and
restored before returning, whatever happens); the candidate's outputs are the ones already
computed, so no export or conversion runs again. Nothing here imports TensorFlow or pytest.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from ..verdict import tree
from ..verdict.compare import compare

__all__ = ["COST", "KERNEL", "INPUT_GAIN", "SWAP", "PlantedBug", "PowerCost", "kernel_name", "measure_power",
           "most_influential_kernel", "output_effect", "plantable_kernels", "planting", "requested"]

KERNEL = "kernel x1.01"
INPUT_GAIN = "input x255/256"
SWAP = "outputs swapped"
KERNEL_FACTOR = 1.01
INPUT_FACTOR = 255.0 / 256.0
# Kernels tried when looking for the most influential one: each costs one forward pass of the
# reference on the batch, so a deep net is sampled (the last ones, nearest the outputs, and an
# even spread of the rest).
MAX_KERNELS_TRIED = 12

_REQUESTED: ContextVar[bool] = ContextVar("modelparity_power", default=False)


@contextlib.contextmanager
def planting(on: bool = True) -> Iterator[None]:
    """Measure the power of every default comparison in the block (``--modelparity-power``)."""
    token = _REQUESTED.set(on)
    try:
        yield
    finally:
        _REQUESTED.reset(token)


def requested() -> bool:
    return _REQUESTED.get()


@dataclass
class PowerCost:
    """What ``--modelparity-power`` cost this process: comparisons measured, forward passes of the
    reference with a bug planted, and the seconds spent (said at the end of the run)."""

    comparisons: int = 0
    passes: int = 0
    seconds: float = 0.0

    def reset(self) -> None:
        self.comparisons, self.passes, self.seconds = 0, 0, 0.0


COST = PowerCost()


@dataclass
class PlantedBug:
    """One bug planted in the reference: what, where, and per output whether the bound caught it
    (None: the bug does not reach that output, so it says nothing of it)."""

    kind: str
    where: str
    caught: dict[str, bool | None] = field(default_factory=dict)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"bug": self.kind, "where": self.where, "note": self.note,
                "outputs": {p: ("caught" if c else "missed" if c is not None else "not reached")
                            for p, c in self.caught.items()}}


def measure_power(reference: Any, inputs: Any, actual: Any, expected: Any,
                  tolerance: Callable[[Any, str], Any], *, equal_nan: bool = False,
                  run: Callable[[Any, Any], Any]) -> list[PlantedBug]:
    """For each planted bug, whether ``compare(actual, planted expected, tolerance)`` fails per
    output. ``reference`` is the model that produced ``expected`` on ``inputs`` (its Keras model
    is reached through ``.native``); ``run(model, inputs)`` runs it as the check did. A bug that
    cannot be planted in this model (no float input, no kernel, no two same-shape outputs) is
    left out, with a note."""
    import time

    start = time.perf_counter()

    def counted(model: Any, batch: Any) -> Any:  # the cost said at the end of the run
        COST.passes += 1
        return run(model, batch)

    try:
        return _measure(reference, inputs, actual, expected, tolerance, equal_nan, counted)
    finally:
        COST.comparisons += 1
        COST.seconds += time.perf_counter() - start


def _measure(reference: Any, inputs: Any, actual: Any, expected: Any, tolerance: Callable[[Any, str], Any],
             equal_nan: bool, run: Callable[[Any, Any], Any]) -> list[PlantedBug]:
    found: list[PlantedBug] = []
    paths = list(tree.flatten(expected))
    native = getattr(reference, "native", reference)
    kernel = most_influential_kernel(reference, native, inputs, expected, run)
    if kernel is not None:
        found.append(_judge(KERNEL, kernel_name(kernel[0]), actual, kernel[1], expected, tolerance, equal_nan,
                            paths))
    gained = _gain_inputs(inputs)
    if gained is not None:
        found.append(_judge(INPUT_GAIN, "every float input", actual, run(reference, gained), expected, tolerance,
                            equal_nan, paths))
    swapped = _swap_outputs(expected)
    if swapped is not None:
        found.append(_judge(SWAP, f"{swapped[0]} <-> {swapped[1]}", actual, swapped[2], expected, tolerance,
                            equal_nan, paths))
    return found


def _judge(kind: str, where: str, actual: Any, planted: Any, expected: Any, tolerance: Callable[[Any, str], Any],
           equal_nan: bool, paths: list[str]) -> PlantedBug:
    bug = PlantedBug(kind, where)
    report = compare(actual, planted, tolerance=tolerance, equal_nan=equal_nan)
    flat_expected = tree.flatten(expected)
    moved = {p: p not in flat_expected or not np.array_equal(np.asarray(a), np.asarray(flat_expected[p]),
                                                            equal_nan=True)
             for p, a in tree.flatten(planted).items()}
    for o in report.outputs:
        bug.caught[o.path] = (not o.passed) if moved.get(o.path, True) else None
    for p in paths:
        bug.caught.setdefault(p, None)
    return bug


def plantable_kernels(native: Any) -> list[Any]:
    """The float weight matrices and convolution kernels of a Keras model (rank >= 2)."""
    try:
        weights = list(native.weights)
    except Exception:  # noqa: BLE001 - not a Keras model: no kernel to plant in
        return []
    kernels = []
    for w in weights:
        shape = tuple(getattr(w, "shape", ()))
        dtype = str(getattr(getattr(w, "dtype", None), "name", getattr(w, "dtype", "")))
        if len(shape) >= 2 and "float" in dtype and hasattr(w, "assign") and getattr(w, "trainable", True):
            kernels.append(w)
    if len(kernels) > MAX_KERNELS_TRIED:
        last = kernels[-(MAX_KERNELS_TRIED // 2):]
        rest = kernels[:-(MAX_KERNELS_TRIED // 2)]
        step = max(1, len(rest) // (MAX_KERNELS_TRIED - len(last)))
        kernels = rest[::step][: MAX_KERNELS_TRIED - len(last)] + last
    return kernels


def most_influential_kernel(reference: Any, native: Any, inputs: Any, expected: Any,
                            run: Callable[[Any, Any], Any]) -> tuple[Any, Any] | None:
    """(the kernel variable, the reference's outputs with it x1.01) for the kernel that moves the
    outputs most, relative to each output's scale; every kernel is restored before returning."""
    best: tuple[float, Any, Any] | None = None
    for w in plantable_kernels(native):
        original = np.asarray(w.numpy())
        try:
            w.assign(original * np.asarray(KERNEL_FACTOR, original.dtype))
            out = run(reference, inputs)
        finally:
            w.assign(original)
        effect = output_effect(out, expected)
        if best is None or effect > best[0]:
            best = (effect, w, out)
    return None if best is None or best[0] == 0.0 else (best[1], best[2])


def kernel_name(variable: Any) -> str:
    return str(getattr(variable, "path", getattr(variable, "name", "kernel")))



def output_effect(planted: Any, expected: Any) -> float:
    """The largest change over outputs, each relative to its own scale."""
    worst = 0.0
    flat_expected = tree.flatten(expected)
    for path, a in tree.flatten(planted).items():
        if path not in flat_expected:
            continue
        a64, b64 = np.asarray(a, np.float64), np.asarray(flat_expected[path], np.float64)
        if a64.shape != b64.shape or not b64.size:
            continue
        scale = float(np.nanmax(np.abs(b64))) or 1.0
        worst = max(worst, float(np.nanmax(np.abs(a64 - b64))) / scale)
    return worst


def _gain_inputs(inputs: Any) -> Any:
    """The batch with every float input times 255/256 (None when no input is float)."""
    if isinstance(inputs, Mapping):
        scaled = {k: _gain(v) for k, v in inputs.items()}
        return scaled if any(s is not v for s, v in zip(scaled.values(), inputs.values())) else None
    if isinstance(inputs, (list, tuple)):
        scaled_list = [_gain(v) for v in inputs]
        return type(inputs)(scaled_list) if any(s is not v for s, v in zip(scaled_list, inputs)) else None
    scaled_one = _gain(inputs)
    return scaled_one if scaled_one is not inputs else None


def _gain(value: Any) -> Any:
    array = np.asarray(value) if not isinstance(value, np.ndarray) else value
    if array.dtype.kind != "f":
        return value
    return (array * np.asarray(INPUT_FACTOR, array.dtype)).astype(array.dtype)


def _swap_outputs(expected: Any) -> tuple[str, str, Any] | None:
    """The two first outputs of one shape and dtype exchanged, or None where there are none."""
    if not isinstance(expected, Mapping):
        return None
    keys = list(expected)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            x, y = np.asarray(expected[a]), np.asarray(expected[b])
            if x.shape == y.shape and x.dtype == y.dtype and not np.array_equal(x, y):
                swapped = dict(expected)
                swapped[a], swapped[b] = expected[b], expected[a]
                return str(a), str(b), swapped
    return None
