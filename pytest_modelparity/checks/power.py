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

__all__ = ["COST", "KERNEL", "INPUT_GAIN", "SWAP", "PlantedBug", "PowerCost", "caught_by", "kernel_name",
           "measure_power", "most_influential_kernel", "most_influential_kernels", "output_effect", "output_effects",
           "plantable_kernels", "planting", "requested"]

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
    # per output it caught: what failed ("max": the per-element bound; "median", "q90",
    # "mean_signed": the bulk of the error, verdict/bulk.py; "top-1"; "shape"...)
    caught_by: dict[str, str] = field(default_factory=dict)
    # the outputs this plant was chosen for (a kernel is planted per output: the one most
    # influential on it); the others are judged by their own plant, so it says nothing of them
    judged: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"bug": self.kind, "where": self.where, "note": self.note,
                "outputs": {p: ("caught" if c else "missed" if c is not None else "not reached")
                            for p, c in self.caught.items() if self.judged is None or p in self.judged},
                "caught_by": dict(self.caught_by)}


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
    chosen: dict[int, tuple[Any, Any, list[str]]] = {}  # one plant per kernel, for the outputs it moves most
    for path, (variable, planted) in most_influential_kernels(reference, native, inputs, expected, run).items():
        chosen.setdefault(id(variable), (variable, planted, []))[2].append(path)
    for variable, planted, outputs in chosen.values():
        bug = _judge(KERNEL, f"{kernel_name(variable)} x{KERNEL_FACTOR:g}", actual, planted, expected, tolerance,
                     equal_nan, paths)
        bug.judged = tuple(outputs)
        found.append(bug)
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
        if bug.caught[o.path]:
            bug.caught_by[o.path] = caught_by(o)
    for p in paths:
        bug.caught.setdefault(p, None)
    return bug


def caught_by(o: Any) -> str:
    """Which part of a failed output's verdict failed: ``max`` (elements beyond the per-element
    bound), a statistic of the bulk of the error (``median``...), ``top-1``, or its problem."""
    if o.problem and not o.vacuous:
        return o.problem.split(":")[0]
    if o.mismatched:
        return "max"
    failed = [row["statistic"] for row in (o.bulk or []) if not row.get("holds", True)]
    if failed:
        return "+".join(failed)
    if o.top1_agreement is not None:
        return "top-1"
    return "other"


def plantable_kernels(native: Any) -> list[Any]:
    """The float weight matrices and convolution kernels (rank >= 2) of a Keras model, or the
    variables a SavedModel signature (a ConcreteFunction) reads; a frozen graph has none (its
    weights are constants), so only the input gain and the swap are planted there."""
    try:
        weights = list(native.weights) if hasattr(native, "weights") else list(native.variables)
    except Exception:  # noqa: BLE001 - no variables to plant in
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


def most_influential_kernels(reference: Any, native: Any, inputs: Any, expected: Any,
                             run: Callable[[Any, Any], Any]) -> dict[str, tuple[Any, Any]]:
    """Per output path: (the kernel variable that moves that output most, relative to its scale,
    the reference's outputs with it x1.01), from one run per kernel tried; outputs no kernel moves
    are left out. Every kernel is restored before returning. A multi-head net gets a plant for
    each head, not one for the head the strongest kernel feeds."""
    best: dict[str, tuple[float, Any, Any]] = {}
    for w, out in _planted_runs(reference, native, inputs, run):
        for path, effect in output_effects(out, expected).items():
            if effect > 0.0 and (path not in best or effect > best[path][0]):
                best[path] = (effect, w, out)
    return {path: (w, out) for path, (_, w, out) in best.items()}


def _planted_runs(reference: Any, native: Any, inputs: Any, run: Callable[[Any, Any], Any]) -> Iterator[tuple[Any, Any]]:
    """(kernel, the reference's outputs with that kernel x1.01) for each kernel tried; each kernel
    is restored before the next is planted, whatever happens."""
    for w in plantable_kernels(native):
        original = np.asarray(w.numpy())
        try:
            w.assign(original * np.asarray(KERNEL_FACTOR, original.dtype))
            out = run(reference, inputs)
        finally:
            w.assign(original)
        yield w, out


def output_effects(planted: Any, expected: Any) -> dict[str, float]:
    """Per output: the largest change relative to its own scale."""
    found = {}
    flat_expected = tree.flatten(expected)
    for path, a in tree.flatten(planted).items():
        if path not in flat_expected:
            continue
        a64, b64 = np.asarray(a, np.float64), np.asarray(flat_expected[path], np.float64)
        if a64.shape != b64.shape or not b64.size:
            continue
        scale = float(np.nanmax(np.abs(b64))) or 1.0
        found[path] = float(np.nanmax(np.abs(a64 - b64))) / scale
    return found


def most_influential_kernel(reference: Any, native: Any, inputs: Any, expected: Any,
                            run: Callable[[Any, Any], Any]) -> tuple[Any, Any] | None:
    """(the kernel variable, the reference's outputs with it x1.01) for the kernel that moves the
    outputs most, relative to each output's scale; every kernel is restored before returning."""
    best: tuple[float, Any, Any] | None = None
    for w, out in _planted_runs(reference, native, inputs, run):
        effect = output_effect(out, expected)
        if best is None or effect > best[0]:
            best = (effect, w, out)
    return None if best is None or best[0] == 0.0 else (best[1], best[2])


def kernel_name(variable: Any) -> str:
    return str(getattr(variable, "path", getattr(variable, "name", "kernel")))



def output_effect(planted: Any, expected: Any) -> float:
    """The largest change over outputs, each relative to its own scale."""
    return max(output_effects(planted, expected).values(), default=0.0)


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
