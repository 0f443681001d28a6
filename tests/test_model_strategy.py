"""strategies.models(): every draw builds and runs, every deletion is a valid draw, and a
planted failure shrinks to exactly the layers it needs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import find, given, settings
from hypothesis.errors import InvalidArgument

from pytest_modelparity import strategies
from pytest_modelparity.fuzz.model_draw import minimize
from pytest_modelparity.fuzz.model_steps import Conv, Merge, Step


def _run(drawn):
    batch = drawn.batch(2)
    out = drawn.build()(batch if len(batch) > 1 else batch[0])
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


@settings(max_examples=8, deadline=None, database=None)
@given(strategies.models(max_layers=4))
def test_every_draw_builds_and_runs_to_finite_outputs_of_order_one(drawn):
    for out in _run(drawn):
        assert out.shape[0] == 2
        assert np.isfinite(out).all(), drawn
        assert np.abs(out).max() < 1e3, drawn  # trained-like scaling: no exploding activations


@settings(max_examples=4, deadline=None, database=None)
@given(strategies.models(max_layers=4, inputs=["image", "sequence"]).filter(lambda d: len(d.layers) >= 2))
def test_deleting_any_step_is_a_valid_draw(drawn):
    for i in range(len(drawn.steps)):
        shorter = drawn.without(i)
        assert len(shorter.steps) == len(drawn.steps) - 1
        shorter.plan()  # shape tracking accepts it (a step that no longer fits is skipped)
        for out in _run(shorter):
            assert np.isfinite(out).all(), shorter


def test_a_planted_failure_shrinks_to_its_minimal_layers():
    # Planted bug: "a converter" is wrong whenever a dilated conv later meets a merge.
    def fails(drawn):
        layers = drawn.layers
        return any(isinstance(a, Conv) and a.dilation == 2 and any(isinstance(b, Merge) for b in layers[i + 1:])
                   for i, a in enumerate(layers))

    vocabulary = ["conv", "merge", "dense", "activation"]
    shrunk = find(strategies.models(max_layers=6, vocabulary=vocabulary, inputs=["image"]), fails,
                  settings=settings(max_examples=300, database=None, derandomize=True))
    # Hypothesis' shrink can stop at a local minimum (a harmless extra layer); the fuzz run's
    # deletion pass finishes the job, one call per step.
    calls = []
    minimal = minimize(shrunk, lambda d: calls.append(d) or fails(d))
    assert len(calls) <= 2 + len(shrunk.layers) * (len(shrunk.layers) + 1) // 2
    assert [type(s) for s in minimal.layers] == [Conv, Merge], minimal
    assert minimal.steps == tuple(minimal.layers)  # no skipped step left over
    assert minimal.seed == 0 and not minimal.two_inputs
    for out in _run(minimal):  # and the minimal model really builds
        assert np.isfinite(out).all()


def test_the_shrink_keeps_its_progress_one_input_one_layer():
    """Issue 46: both simplifications were built from the draw before the loop, so when both
    still failed the seed's brought the second input back (a failure needing 1 input and 1 layer
    shrank to 2 and 2). Each now starts from the best draw so far; no converter runs here."""
    from pytest_modelparity.fuzz.model_draw import DrawnModel, InputKind
    from pytest_modelparity.fuzz.model_steps import Dense, Math

    drawn = DrawnModel(input=InputKind("vector", (8,)), steps=(Dense(4), Math("cumsum"), Dense(3)), seed=7,
                       two_inputs=True)
    assert len(drawn.layers) == 3

    def fails(d):  # the planted defect: any cumsum, whatever the inputs and the seed
        return any(isinstance(s, Math) and s.op == "cumsum" for s in d.layers)

    minimal = minimize(drawn, fails)
    assert not minimal.two_inputs and minimal.seed == 0, minimal
    assert [type(s) for s in minimal.layers] == [Math], minimal


def test_user_steps_and_a_base_model_extend_the_vocabulary():
    import keras
    from dataclasses import dataclass
    from hypothesis import strategies as st

    @dataclass(frozen=True, repr=False)
    class Swish(Step):
        def emit(self, shape):
            return ["x = x * keras.ops.sigmoid(x)"], shape

    drawn = find(strategies.models(vocabulary=["dense"], extra=[st.just(Swish())]),
                 lambda d: any(isinstance(s, Swish) for s in d.layers), settings=settings(database=None))
    assert _run(drawn)
    base = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5)])
    varied = find(strategies.models(base=base, vocabulary=["dense", "activation"]), lambda d: len(d.layers) >= 1,
                  settings=settings(database=None))
    assert varied.build().layers[1] is base and _run(varied)[0].shape[0] == 2
    with pytest.raises(InvalidArgument, match="unknown step"):
        strategies.models(vocabulary=["dense", "lambda"])


def test_strategies_is_a_public_module_that_imports_no_tensorflow() -> None:
    """``from pytest_modelparity.strategies import batches, models`` (issue 46): batch strategies
    live in checks/, generated models in fuzz/; the public module gathers both, and drawing
    (not building) a model needs no TensorFlow."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys
        import pytest_modelparity
        from pytest_modelparity.strategies import batches, models, DrawnModel
        assert pytest_modelparity.strategies.models is models
        assert "tensorflow" not in sys.modules, "TensorFlow was imported"
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def _branch_depths(model) -> list[tuple[int, int]]:
    """For each merge layer of a built Keras model with two or more inputs: the number of
    operations on each of its two longest input paths back to their nearest common ancestor."""
    import keras

    def parents(op):
        node = op._inbound_nodes[0]
        return [t._keras_history.operation for t in node.input_tensors]

    def ancestors(op):  # op -> distance from the start of the walk, nearest first
        found, todo = {op: 0}, [op]
        while todo:
            cur = todo.pop(0)
            for p in parents(cur):
                if p not in found:
                    found[p] = found[cur] + 1
                    todo.append(p)
        return found

    merges = (keras.layers.Add, keras.layers.Multiply, keras.layers.Maximum, keras.layers.Subtract,
              keras.layers.Concatenate)
    depths = []
    for op in model.operations:
        if not isinstance(op, merges) or len(op._inbound_nodes[0].input_tensors) < 2:
            continue
        heads = parents(op)
        for i in range(len(heads)):
            for j in range(i + 1, len(heads)):
                a, b = ancestors(heads[i]), ancestors(heads[j])
                common = [n for n in a if n in b]
                if common:
                    meet = min(common, key=lambda n: a[n] + b[n])
                    depths.append((a[meet], b[meet]))
    return depths


def test_two_hundred_draws_explore_each_has_a_layer_none_repeats_and_branches_are_drawn() -> None:
    """Issue 46's acceptance, on the stream a fuzz run draws (``for_each_drawn`` over
    ``strategies.models()``): no draw without a layer, >= 95% distinct sources (an exact repeat is
    drawn again), and some draw merges two branches of two or more operations each, checked on
    the built Keras model's graph, not on the draw's own description."""
    from pytest_modelparity.fuzz.model_draw import for_each_drawn
    from pytest_modelparity.fuzz.model_steps import Branch

    seen = []
    for_each_drawn(seen.append, seed=0, max_examples=200)
    assert len(seen) == 200
    assert all(d.layers for d in seen)
    assert len({d.source() for d in seen}) >= 0.95 * len(seen)
    branched = [d for d in seen if any(isinstance(s, Branch) and len(s.left) >= 2 and len(s.right) >= 2
                                       for s in d.layers)]
    assert branched, "no draw had two branches of two or more operations"
    depths = _branch_depths(branched[0].build())
    assert any(min(pair) >= 2 for pair in depths), depths


@pytest.mark.parametrize("seed", [0, 3, 11])
def test_an_error_of_the_visit_ends_the_stream_and_is_raised_as_it_is(seed: int) -> None:
    """What a fuzz run's check of a model raises (a fuzz child that cannot start, a bug) reaches
    the user as itself: raised inside Hypothesis' run it was replayed, the replay rejected the
    model as already seen, and the run failed with "FlakyFailure: Unreliable assumption" instead
    (a run here whose fuzz children could not import a module showed only that)."""
    from pytest_modelparity.fuzz.model_draw import for_each_drawn

    visited = []

    def visit(drawn):
        visited.append(drawn.source())
        if len(visited) == 3:
            raise ValueError(f"the check of model {len(visited)} broke")

    with pytest.raises(ValueError, match="the check of model 3 broke"):
        for_each_drawn(visit, seed=seed, max_examples=10)
    assert len(visited) == 3  # nothing drawn or checked after it, the failing model not checked twice


def test_the_new_steps_build_and_run_on_the_shapes_they_accept() -> None:
    from pytest_modelparity.fuzz.model_draw import DrawnModel, InputKind
    from pytest_modelparity.fuzz.model_steps import Attention, Branch, Mask, Reduce, Recurrent

    seq = InputKind("sequence", (6, 3))
    for steps in ((Branch(("dense", "relu", "norm"), ("sigmoid", "square"), "Add3"),),
                  (Branch(("gelu", "scale"), ("tanh", "dense"), "Concatenate"), Reduce("max", 2, False)),
                  (Reduce("mean", 1, True),), (Mask(), Recurrent("GRU", 4, True)),
                  (Attention(2, 4, "causal"),), (Attention(1, 2, "cross"),)):
        drawn = DrawnModel(input=seq, steps=steps, seed=3)
        assert drawn.layers == list(steps), drawn
        for out in _run(drawn):
            assert np.isfinite(out).all(), drawn
    assert Reduce("sum", 3, True).emit((6, 3)) is None  # no third axis: skipped, not an error
