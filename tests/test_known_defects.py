"""The converter defects catalogue: each entry caught and labelled known, or shown fixed.

Real converters and runtimes (TFLite MLIR + LiteRT, tf2onnx + onnxruntime, tensorflowjs +
Node.js). An entry that no longer reproduces must say so through the fixed path (the plugin
passes it and the bare converter agrees too), never by a silent pass.
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_modelparity.fuzz.conditions import differences
from pytest_modelparity.fuzz.defect_status import status_here
from pytest_modelparity.fuzz.known_defects import CATALOGUE, Label, label_failure, without_trigger
from pytest_modelparity.formats import missing_runtime


@pytest.mark.parametrize("entry", CATALOGUE, ids=[e.name for e in CATALOGUE])
def test_catalogue_entry_is_caught_or_shown_fixed(entry, tmp_path):
    missing = missing_runtime(entry.format, export=True)
    if missing is not None:
        pytest.skip(str(missing))
    status = status_here(entry, str(tmp_path))  # under the entry's conditions (oneDNN on: a child with it on)
    print(status)
    if status.unmet:  # e.g. oneDNN asked for on a TensorFlow built without it: measured, not passed
        pytest.skip(f"{entry.name}: {status.verdict} (ran under {status.conditions.get('onednn_why')})")
    assert differences(dict(entry.conditions), status.conditions) == []
    if status.plugin == entry.outcome:  # reproduces: caught, and labelled known (not "new")
        assert status.label == entry.name, status
        assert status.verdict == "caught"
    else:  # no longer reproduces through the plugin: only a clean pass is the fixed path
        assert status.plugin == "pass", status
        assert status.verdict in ("fixed", "avoided by the plugin's export route"), status
        assert status.label is None


def test_a_failure_outside_the_catalogue_is_new():
    from pytest_modelparity.fuzz.model_draw import DrawnModel, InputKind
    from pytest_modelparity.fuzz.model_steps import Dense, Math

    plain = DrawnModel(InputKind("vector", (8,)), (Dense(4), Math("abs")))
    assert label_failure(plain, "onnx", "", "fail", passes_without=lambda d: True) == Label()
    assert str(Label()) == "new"


def _symptom_text(entry) -> str:
    """A message the entry's symptom matches (the entry's own words where it has a pattern)."""
    examples = {"tf2onnx-pad-dilated-same-conv": "the file's output shape is (1, 2, 2, 4) instead of (1, 6, 6, 4)",
                "tf2onnx-conv-transpose-negative-pads": "pads must not contain negative values",
                "tfjs-two-branch-reading-outputs": "TypeError: Cannot read properties of undefined (reading 'outputs')"}
    return examples.get(entry.name, "")


@pytest.mark.parametrize("entry", CATALOGUE, ids=[e.name for e in CATALOGUE])
def test_an_entry_labels_only_a_failure_it_is_proven_to_be(entry):
    """Issue 46: known only when proven. The entry's own model, format, outcome kind and symptom,
    and (for wrong values) a pass once the entry's steps are taken out: known. Another outcome,
    another format, a message that is not the symptom, or no proof: new, resembling the entry
    where its layers are there. No converter runs: the proof is a predicate here."""
    drawn, fmt, text = entry.model, entry.format, _symptom_text(entry)
    held = {"onednn": False, "xnnpack": True, **entry.conditions}  # a run where the entry's conditions hold
    proven = label_failure(drawn, fmt, text, entry.outcome, passes_without=lambda d: True, conditions=held)
    assert proven == Label(known=entry.name), proven
    other_kind = next(k for k in ("fail", "error", "refused") if k != entry.outcome)
    assert label_failure(drawn, fmt, text, other_kind, passes_without=lambda d: True,
                         conditions=held) == Label(resembles=entry.name)
    other_format = next(f for f in ("tflite", "onnx", "tfjs") if f != entry.format)
    assert label_failure(drawn, other_format, text, entry.outcome, passes_without=lambda d: True,
                         conditions=held).known is None
    if entry.symptom:
        assert label_failure(drawn, fmt, "some other message", entry.outcome, conditions=held).resembles == entry.name
    if entry.outcome == "fail":
        # still failing with the entry's steps taken out: not this defect
        assert label_failure(drawn, fmt, text, "fail", passes_without=lambda d: False,
                             conditions=held) == Label(resembles=entry.name)
        assert label_failure(drawn, fmt, text, "fail", conditions=held) == Label(resembles=entry.name)  # nothing proven
        reduced = without_trigger(entry, drawn)
        assert reduced is not None and reduced.layers and not entry.signature(reduced.layers), reduced


def test_the_diagnosis_names_the_op_tflite_ran_instead(tmp_path):
    from pytest_modelparity import ParityError, assert_outputs_close, export_model, load_model
    from pytest_modelparity.fuzz.known_defects import by_name

    drawn = by_name("tflite-l2-normalization-eps").model
    model = drawn.build()
    candidate = load_model(export_model(model, "tflite", tmp_path / "m.tflite"))
    try:
        ops = {op for _, op in candidate.op_types()}
        if "L2_NORMALIZATION" not in ops:
            pytest.skip(f"this TFLite converter no longer fuses the pattern (ops: {sorted(ops)}): the defect is fixed")
        with pytest.raises(ParityError) as caught:
            assert_outputs_close(candidate, model, inputs=drawn.batch()[0])
    finally:
        candidate.close()
    text = str(caught.value)
    assert "L2_NORMALIZATION" in text and "known: tflite-l2-normalization-eps" in text, text


def test_a_negative_cumsum_axis_on_tfjs_fails_with_its_cause_and_the_fix_passes(tmp_path):
    """tfjs-core 4.22 returns (0, 4) for cumsum(x, -1) of a (4, 8) tensor: a shape that differs
    has no values to localise, so the cause comes from the graph (the Cumsum's Const axis); the
    advice (a non-negative axis) is checked by running it, and names no cause there."""
    missing = missing_runtime("tfjs", export=True)
    if missing is not None:
        pytest.skip(str(missing))
    import keras
    import numpy as np

    from pytest_modelparity import ParityError, assert_outputs_close, export_model, load_model

    x = np.random.default_rng(0).normal(size=(4, 8)).astype("float32")
    results = {}
    for axis in (-1, 1):
        inp = keras.Input((8,), name="x")
        model = keras.Model(inp, keras.ops.cumsum(inp, axis=axis))
        with load_model(export_model(model, "tfjs", tmp_path / f"axis{axis}")) as candidate:
            results[axis] = candidate.converter_defects
            if axis == 1:
                assert_outputs_close(candidate, model, inputs=x)  # the fix works on tfjs
                continue
            with pytest.raises(ParityError) as caught:
                assert_outputs_close(candidate, model, inputs=x)
    text = str(caught.value)
    if "shape differs" not in text:
        pytest.fail(f"tfjs no longer misreads a negative Cumsum axis: move the catalogue entry to fixed\n{text}")
    assert "Likely cause" in text and "known: tfjs-cumsum-negative-axis" in text, text
    assert "non-negative axis" in text and "1 Cumsum node(s) in the tfjs graph" in text, text
    assert results[1] == []  # axis 1 is not a cause


def test_the_cumsum_axis_is_read_from_the_weights_and_unknown_is_no_cause():
    from pytest_modelparity.formats.tfjs.rewrite import known_defects

    spec = {"modelTopology": {"node": [{"name": "x", "op": "Placeholder"}, {"name": "s/axis", "op": "Const"},
                                       {"name": "s", "op": "Cumsum", "input": ["x", "s/axis"]}]}}

    def broken() -> dict:
        raise OSError("shard missing")

    assert [d[:2] for d in known_defects(spec, lambda: {"s/axis": np.array(-1)})] == [("Cumsum", ["s"])]
    assert known_defects(spec, lambda: {"s/axis": np.array(2)}) == []
    assert known_defects(spec) == []  # no weights: the axis may be right
    assert known_defects(spec, broken) == []


def test_dense_tanh_fused_by_onednn_is_split_by_the_export_and_passes(tmp_path):
    """Grappler's oneDNN remapper fuses Dense + tanh into one _FusedMatMul, which neither tfjs
    backend runs (measured: docs/fuzzing.md; it was a catalogue entry, refused, until the export
    split it). Through the real converter and real Node tfjs, in fuzz children started with
    oneDNN on and off (TF_ENABLE_ONEDNN_OPTS set before TensorFlow is imported):
    Dense(4, activation='tanh') and Dense(4) -> Activation('tanh') pass either way, so a user on
    a CPU where oneDNN is on by default is not refused for the converter's fusion."""
    missing = missing_runtime("tfjs", export=True)
    if missing is not None:
        pytest.skip(str(missing))
    from pytest_modelparity.fuzz.conditions import env_for
    from pytest_modelparity.fuzz.fuzz_worker import FuzzWorker
    from pytest_modelparity.fuzz.model_draw import DrawnModel, InputKind
    from pytest_modelparity.fuzz.model_steps import Act, Dense

    models = (DrawnModel(InputKind("vector", (8,)), (Dense(4, "tanh"),)),
              DrawnModel(InputKind("vector", (8,)), (Dense(4), Act("tanh"))))
    outcomes, ran_under = {}, {}
    for on in (True, False):
        with FuzzWorker(tmp_path / f"child-{on}.log", env=env_for({"onednn": on})) as worker:
            outcomes[on] = [worker.check(d, ["tfjs"], workdir=tmp_path)[0] for d in models]
            ran_under[on] = worker.conditions
    assert ran_under[False]["onednn"] is False, ran_under[False]
    if not ran_under[True]["onednn"]:
        pytest.skip(f"this TensorFlow cannot turn oneDNN on ({ran_under[True]['onednn_why']}): the fusion needs it")
    for on in (True, False):
        assert [o.status for o in outcomes[on]] == ["pass", "pass"], (on, [o.text for o in outcomes[on]])


def test_the_split_advised_is_the_fused_activation_the_runner_lacks():
    """The tfjs runner's words for a fused activation it lacks (measured: cpu and wasm backends,
    tanh fused by oneDNN): the export route splits hard-swish and tanh, and each is advised by
    its own name; another activation gets no split advice."""
    from pytest_modelparity.formats.tfjs.errors import classify_runner_error

    for message, backend in (("Activation tanh has not been implemented for the CPU backend.", "cpu"),
                             ("tanh activation not yet supported for FusedConv2D in the wasm backend.", "wasm")):
        problem, fix = classify_runner_error(message, backend)
        assert "'tanh'" in problem and "oneDNN" in problem, problem
        assert "splits a fused tanh" in fix and "hard-swish" not in fix and "TF_ENABLE_ONEDNN_OPTS=0" in fix, fix
        assert "separate Activation layer does not help" in fix
    problem, fix = classify_runner_error("Activation mish has not been implemented for the CPU backend.", "cpu")
    assert "'mish'" in problem and "splits" not in fix, fix
    problem, fix = classify_runner_error("Activation hardswish has not been implemented for the CPU backend.", "cpu")
    assert "splits a fused hard-swish" in fix, fix


@pytest.mark.parametrize("entry", [e for e in CATALOGUE if e.conditions], ids=lambda e: e.name)
def test_an_entry_with_conditions_does_not_happen_without_them_as_its_advice_says(entry, tmp_path):
    """Each oneDNN-made entry (the maximum -> LeakyRelu one today) under oneDNN off (the advice: TF_ENABLE_ONEDNN_OPTS=0):
    the plugin passes and the bare converter's file agrees, and that is reported as 'not
    reproduced under other conditions', never as 'fixed'."""
    missing = missing_runtime(entry.format, export=True)
    if missing is not None:
        pytest.skip(str(missing))
    opposite = {key: not value for key, value in entry.conditions.items()}
    assert "TF_ENABLE_ONEDNN_OPTS=0" in entry.advice and opposite == {"onednn": False}
    off = status_here(entry, str(tmp_path), conditions=opposite)
    assert off.conditions["onednn"] is False, off
    assert off.plugin == "pass" and not off.bare, off
    assert off.verdict.startswith("not reproduced under other conditions than the entry's"), off.verdict
