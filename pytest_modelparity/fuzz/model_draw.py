"""``strategies.models()``: valid Keras functional models, drawn to shrink well.

A draw is an input (vector, sequence, image or tokens; one or two of them), a *list* of steps
(``model_steps``) and a weight seed. Steps adapt to the shape they meet or are skipped, so
deleting any step is another valid draw and Hypothesis' list shrinking can remove the layers a
failure does not need. Weights come from the seed (one generator, not element by element) with
trained-like statistics: kernels scaled by 1/sqrt(fan-in) so activations stay of order 1, and
BatchNorm moving statistics away from the identity (0 and 1) so a converter that folds them
wrongly shows. The model is built by running its own source text (``DrawnModel.source``), so a
reproducer is exactly what was built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np
from hypothesis import strategies as st

from .model_steps import Shape, Step, step_strategy

__all__ = ["DrawnModel", "InputKind", "models", "minimize", "for_each_drawn", "INPUT_KINDS", "VOCAB_SIZE"]

VOCAB_SIZE = 10
INPUT_KINDS = ("vector", "sequence", "image", "tokens")


@dataclass(frozen=True)
class InputKind:
    kind: str = "vector"
    shape: Shape = (8,)

    @property
    def dtype(self) -> str:
        return "int32" if self.kind == "tokens" else "float32"


@dataclass(frozen=True)
class DrawnModel:
    """A drawn model: inputs, steps and the weight seed; ``build()`` makes the Keras model."""

    input: InputKind = InputKind()
    steps: tuple[Step, ...] = ()
    seed: int = 0
    two_inputs: bool = False
    join: str = "Add"  # how a second input joins the main path when the shapes match
    base: Any = field(default=None, compare=False)  # a user's Keras model to vary around

    # --- the code -------------------------------------------------------------------------
    def plan(self) -> tuple[list[str], list[Step], Shape]:
        """(code lines of the body, the steps that applied, the final shape of the main path)."""
        lines: list[str] = []
        shape = self.input.shape
        if self.base is not None:
            lines.append("x = base(x)")
            shape = tuple(int(d) for d in self.base.outputs[0].shape[1:])
        elif self.input.kind == "tokens":
            lines.append(f"x = keras.layers.Embedding({VOCAB_SIZE}, 4)(x)")
            shape = shape + (4,)
        used: list[Step] = []
        for step in self.steps:
            emitted = step.emit(shape)
            if emitted is None:
                continue
            code, shape = emitted
            lines += code
            used.append(step)
        return lines, used, shape

    @property
    def layers(self) -> list[Step]:
        """The steps that apply (a skipped step is no layer of the model)."""
        return self.plan()[1]

    def without(self, index: int) -> DrawnModel:
        """The same draw with step ``index`` deleted: also a valid draw (what shrinking does)."""
        return replace(self, steps=self.steps[:index] + self.steps[index + 1:])

    def source(self) -> str:
        """Python source of ``build_model()`` (plain Keras; weights are set by the caller)."""
        body, _, shape = self.plan()
        shape_text = repr(tuple(self.input.shape))
        head = [f"inp = keras.Input({shape_text}, dtype={self.input.dtype!r}, name='input_1')", "x = inp"]
        tail = ["outputs = [x]", "inputs = [inp]"]
        if self.two_inputs:
            head.insert(1, f"inp2 = keras.Input({shape_text}, dtype='float32', name='input_2')")
            if shape == self.input.shape and self.input.kind != "tokens":
                tail = [f"x = keras.layers.{self.join}()([x, inp2])", "outputs = [x]", "inputs = [inp, inp2]"]
            else:
                tail = ["outputs = [x, keras.ops.tanh(inp2)]", "inputs = [inp, inp2]"]
        lines = head + body + tail + ["return keras.Model(inputs if len(inputs) > 1 else inputs[0], "
                                      "outputs if len(outputs) > 1 else outputs[0])"]
        return "def build_model(keras, base=None):\n" + "".join(f"    {line}\n" for line in lines)

    def build(self) -> Any:
        """The Keras model with its seeded, trained-like weights."""
        import keras

        scope: dict[str, Any] = {}
        exec(compile(self.source(), "<drawn model>", "exec"), scope)  # noqa: S102 - our own emitted code
        model = scope["build_model"](keras, self.base)
        set_trained_like_weights(model, self.seed, skip=self.base)
        return model

    def batch(self, batch_size: int = 4, seed: int = 0) -> list[np.ndarray]:
        """Inputs to run it on, drawn from ``seed``: floats in [-1, 1], tokens in [0, VOCAB_SIZE)."""
        rng = np.random.default_rng(seed)
        shape = (batch_size,) + self.input.shape
        first = (rng.integers(0, VOCAB_SIZE, size=shape).astype("int32") if self.input.kind == "tokens"
                 else rng.uniform(-1, 1, size=shape).astype("float32"))
        if not self.two_inputs:
            return [first]
        return [first, rng.uniform(-1, 1, size=shape).astype("float32")]

    def __repr__(self) -> str:
        steps = ", ".join(repr(s) for s in self.layers)
        extra = ", two_inputs=True" + (f", join={self.join!r}" if self.join != "Add" else "") if self.two_inputs else ""
        return f"DrawnModel(input={self.input!r}, layers=[{steps}], seed={self.seed}{extra})"


def minimize(drawn: DrawnModel, fails: Any, *, budget_s: float | None = None) -> DrawnModel:
    """Delete steps one at a time while ``fails(draw)`` still holds, then simplify the rest.

    Why beside Hypothesis' shrinker: it reaches a local minimum (measured: a planted two-layer
    failure kept a third, harmless layer) and each of its calls costs an export per format in a
    fuzz run; one pass of single deletions is at most one call per step, and every deletion is a
    valid draw by construction. Skipped steps go first (they cost nothing and change nothing).
    """
    import time

    start = time.monotonic()
    current = replace(drawn, steps=tuple(drawn.layers))
    current = _simplify(current, fails)
    changed = True
    while changed:
        changed = False
        for i in reversed(range(len(current.steps))):
            if budget_s is not None and time.monotonic() - start > budget_s:
                return current
            if len(current.steps) == 1:
                break  # a draw keeps one layer (``models``): without it the model is its input
            shorter = current.without(i)
            shorter = replace(shorter, steps=tuple(shorter.layers))
            if fails(shorter):
                current, changed = shorter, True
                break
    return _simplify(current, fails)  # again, now it is small


# Each made from the draw as it is when its turn comes: built up front from the draw before the
# loop, the seed's simplification brought back the second input the first had just dropped (a
# cumsum failure needing 1 input and 1 layer shrank to 2 and 2).
_SIMPLIFICATIONS = (lambda d: replace(d, two_inputs=False), lambda d: replace(d, seed=0))


def _simplify(current: DrawnModel, fails: Any) -> DrawnModel:
    """Drop the second input, then zero the seed, each kept while ``fails`` holds, each applied
    to the best draw so far (the shrink keeps its progress)."""
    for simplify in _SIMPLIFICATIONS:
        candidate = simplify(current)
        if candidate != current and fails(candidate):
            current = candidate
    return current


def _fan_in(shape: Sequence[int]) -> int:
    return max(1, math.prod(shape[:-1])) if len(shape) > 1 else max(1, int(shape[0]))


def set_trained_like_weights(model: Any, seed: int, *, skip: Any = None) -> None:
    """Seeded weights with trained-like statistics (see the module docstring)."""
    rng = np.random.default_rng(seed)
    skipped = {id(v) for v in getattr(skip, "weights", [])} if skip is not None else set()
    for var in model.weights:
        if id(var) in skipped:
            continue
        name = var.path.rsplit("/", 1)[-1]
        shape = tuple(var.shape)
        if name == "moving_mean":
            value = rng.normal(0.0, 0.2, shape)
        elif name == "moving_variance":
            value = rng.uniform(0.5, 2.0, shape)
        elif name == "gamma":
            value = rng.uniform(0.8, 1.2, shape)
        elif name in ("beta", "bias"):
            value = rng.normal(0.0, 0.1, shape)
        elif name == "embeddings":
            value = rng.normal(0.0, 1.0, shape)
        elif len(shape) >= 2:
            if "depthwise" in name:
                fan = math.prod(shape[:-2]) or 1
            elif len(shape) == 4 and "conv2d_transpose" in var.path:
                fan = math.prod(shape[:2]) * shape[3]
            else:
                fan = _fan_in(shape)
            value = rng.normal(0.0, 1.0 / math.sqrt(fan), shape)
        else:
            value = rng.normal(0.0, 0.1, shape)
        var.assign(value.astype(var.dtype))


def models(*, vocabulary: Sequence[str] | None = None, extra: Sequence[Any] = (), max_layers: int = 6,
           inputs: Sequence[str] = INPUT_KINDS, two_inputs: bool = True, base: Any = None,
           discontinuous: bool = False) -> Any:
    """A Hypothesis strategy of ``DrawnModel`` (call ``.build()`` for the Keras model).

    ``vocabulary`` names the step kinds to draw from (``model_steps.VOCABULARY``); ``extra`` adds
    your own strategies of ``Step`` objects (a ``Step`` subclass whose ``emit`` writes the code);
    ``base`` a Keras model (one input, one output) the steps are drawn after, to vary around it;
    ``discontinuous=True`` also draws floor/round, which a correct converter's last-bit rounding
    can flip.
    """
    from hypothesis.errors import InvalidArgument

    if max_layers < 0:
        raise InvalidArgument(f"models(max_layers={max_layers}): pass a count >= 0")
    bad = [k for k in inputs if k not in INPUT_KINDS]
    if bad or not inputs:
        raise InvalidArgument(f"models(inputs={list(inputs)!r}): choose a non-empty subset of {list(INPUT_KINDS)}")
    # at least one layer that applies (issue 46: 82 of 332 draws had none; ONNX then refuses
    # "an output is an input unchanged"), unless max_layers=0 asks for none
    steps = st.lists(step_strategy(vocabulary, extra=extra, discontinuous=discontinuous),
                     min_size=min(1, max_layers), max_size=max_layers).map(tuple)
    if base is not None:
        if len(base.inputs) != 1 or len(base.outputs) != 1:
            raise InvalidArgument("models(base=...): pass a Keras model with one input and one output")
        spec = tuple(int(d) for d in base.inputs[0].shape[1:])
        kind = st.just(InputKind("tokens" if "int" in str(base.inputs[0].dtype) else "vector", spec))
        drawn = st.builds(DrawnModel, input=kind, steps=steps, seed=st.integers(0, 2**16),
                          two_inputs=st.just(False), base=st.just(base))
    else:
        drawn = st.builds(DrawnModel, input=_inputs(inputs), steps=steps, seed=st.integers(0, 2**16),
                          two_inputs=st.booleans() if two_inputs else st.just(False),
                          join=st.sampled_from(["Add", "Multiply", "Maximum", "Subtract"]))
    return drawn.filter(lambda d: bool(d.layers)) if max_layers >= 1 else drawn


class _BudgetSpent(Exception):
    """Ends a Hypothesis run from inside: returning early would still draw every remaining example."""


class _VisitFailed(Exception):
    """Carries an error of ``visit`` out of the Hypothesis run. Raised as itself, Hypothesis replays
    the example to report it, the replay rejects the model as already seen, and the user got
    "FlakyFailure: Unreliable assumption" instead of the error."""


def for_each_drawn(visit: Any, *, seed: int, max_examples: int, deadline: float | None = None,
                   max_layers: int = 6) -> bool:
    """Call ``visit(drawn)`` on up to ``max_examples`` drawn models, in Hypothesis' seeded order,
    until ``time.monotonic()`` passes ``deadline`` (the first model is visited whatever the
    deadline: a budget shorter than the fuzz child's start still checks one). Returns True when
    the deadline ended it. An exception ``visit`` raises ends the run and is raised as it is.

    A time budget must stop the drawing, not only the checking: returning early from each
    example left Hypothesis drawing (and discarding) the rest of ``max_examples``, 8 minutes
    past a 12-minute budget in ``bench/fuzz.py``.
    """
    import hashlib
    import time

    from hypothesis import HealthCheck, Phase, Verbosity, given, reject, settings
    from hypothesis import seed as seed_of

    seen: set[str] = set()

    @seed_of(seed)
    @settings(max_examples=max_examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet)
    @given(models(max_layers=max_layers))
    def draw(drawn: DrawnModel) -> None:
        if failed:  # Hypothesis' replay of the example that failed: the same ending, nothing run again
            raise _VisitFailed
        if deadline is not None and visited and time.monotonic() > deadline:
            raise _BudgetSpent
        source = hashlib.sha256(drawn.source().encode()).hexdigest()
        if source in seen:  # an exact repeat of an earlier draw's model (59 of 332 were): draw again
            reject()
        seen.add(source)
        visited.append(1)
        try:
            visit(drawn)
        except Exception as exc:  # noqa: BLE001 - raised below, as it is, once Hypothesis is done
            failed.append(exc)
            raise _VisitFailed from None

    visited: list[int] = []
    failed: list[Exception] = []

    try:
        draw()
    except _BudgetSpent:
        return True
    except _VisitFailed:
        raise failed[0] from None
    return False


def _inputs(kinds: Sequence[str]) -> Any:
    side = st.sampled_from([4, 6, 8])
    chans = st.sampled_from([2, 1, 3])
    options = {
        "vector": st.builds(lambda n: InputKind("vector", (n,)), st.sampled_from([8, 4, 16])),
        "sequence": st.builds(lambda t, f: InputKind("sequence", (t, f)), st.sampled_from([6, 4, 8]), chans),
        "image": st.builds(lambda h, w, c: InputKind("image", (h, w, c)), side, side, chans),
        "tokens": st.builds(lambda t: InputKind("tokens", (t,)), st.sampled_from([6, 4, 8])),
    }
    return st.one_of(*[options[k] for k in INPUT_KINDS if k in kinds])
