"""Acceptance of the diagnosis: every bug-zoo entry, run through the public assertions,
names its cause in the failure; clean pairs pass and name nothing, even when compared exactly."""

from __future__ import annotations

import pytest

from pytest_modelparity import (ParityError, assert_batch_invariant, assert_deterministic, assert_outputs_close,
                                localize_divergence)
from tests import zoo

pytest.importorskip("tensorflow", reason="the bug zoo builds real TensorFlow models: pip install -e '.[all]'")

# Causes that describe noise rather than a bug: allowed on clean pairs compared exactly.
BENIGN = {"accumulation_noise"}


def _run(case: zoo.Case, **override):
    kwargs = {**case.kwargs, **override}
    if case.check == "outputs_close":
        return assert_outputs_close(case.candidate, case.reference, inputs=case.inputs, **kwargs)
    if case.check == "deterministic":
        return assert_deterministic(case.candidate, case.inputs, **kwargs)
    return assert_batch_invariant(case.candidate, case.inputs, **kwargs)


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo")


@pytest.mark.parametrize("build", zoo.CAUSES, ids=lambda b: b.__name__)
def test_zoo_entry_names_its_cause(build, zoo_dir):
    case = _tfjs_or_skip(build, zoo_dir)
    if case.passes_by_default:
        report = _run(case)                       # float drift is not a failure by default...
        assert report.passed
        with pytest.raises(ParityError) as info:  # ...and, demanded exactly, it is explained
            _run(case, rtol=0.0, atol=0.0)
    else:
        with pytest.raises(ParityError) as info:
            _run(case)
    hints = info.value.report.hints
    causes = [h.cause for h in hints]
    assert causes and causes[0] == case.cause, f"{case.name}: got {causes}\n{info.value}"
    text = str(info.value)
    assert "Likely cause" in text
    for fragment in case.expect_in_text:
        assert fragment in text, f"{case.name}: {fragment!r} missing from\n{text}"
    assert all(h.evidence for h in hints)


@pytest.mark.parametrize("build", zoo.CLEAN, ids=lambda b: b.__name__)
def test_clean_pair_passes_and_names_no_cause(build, zoo_dir):
    case = _tfjs_or_skip(build, zoo_dir)
    report = _run(case)
    assert report.passed and not report.hints
    if case.check == "outputs_close":
        # Exact comparison fails on float noise; the diagnosis must not invent a bug.
        try:
            report = _run(case, rtol=0.0, atol=0.0)
        except ParityError as exc:
            report = exc.report
        assert {h.cause for h in report.hints} <= BENIGN, [str(h) for h in report.hints]


def test_localize_names_the_perturbed_tflite_layer(zoo_dir):
    case = zoo.tflite_one_layer_perturbed(zoo_dir)
    rows = localize_divergence(case.reference, case.candidate, case.inputs)
    first = [r for r in rows if r.first]
    assert [r.layer for r in first] == ["hidden"]
    by_layer = {r.layer: r for r in rows}
    assert not by_layer["flatten"].diverged and by_layer["flatten"].max_abs is not None
    assert by_layer["logits"].diverged and by_layer["probs"].diverged
    assert all(len(r.as_tuple()) == 5 for r in rows)


def test_localize_clean_tflite_has_no_divergence(zoo_dir):
    case = zoo.clean_tflite(zoo_dir)
    rows = localize_divergence(case.reference, case.candidate, case.inputs)
    assert rows and not any(r.diverged for r in rows)
    assert sum(r.max_abs is not None for r in rows) >= 3


def test_input_transform_on_one_of_a_list_of_inputs():
    """Inputs given as a list: the image (index 0) is scaled, the side input (index 1) is not;
    the hint names the image input and no transform of the side input is claimed."""
    reference = zoo.two_input_classifier(23)
    batch = zoo.two_input_batch(6)
    inputs = [batch["image"], batch["side"]]

    def by256(b):  # the candidate divides pixels by 256 where the reference divides by 255
        return reference([b[0] * (255 / 256), b[1]])

    with pytest.raises(ParityError) as info:
        assert_outputs_close(by256, reference, inputs=inputs)
    hints = info.value.report.hints
    assert [h.cause for h in hints] == ["input_scaling"], [str(h) for h in hints]
    assert "input 0 scaled by 255/256" in hints[0].message


def test_localize_onnx_perturbed_conv_through_the_layout_transpose(zoo_dir):
    case = zoo.onnx_conv_perturbed(zoo_dir)
    rows = localize_divergence(case.reference, case.candidate, case.inputs)
    by_layer = {r.layer: r for r in rows}
    assert [r.layer for r in rows if r.first] == ["conv"]
    assert not by_layer["scale"].diverged and by_layer["scale"].max_abs is not None
    conv = by_layer["conv"]
    assert "conv" in conv.candidate and conv.layout == "channels-first, transposed"
    # Compared in the reference's layout, the conv output differs exactly as its flattened copy
    # (a plain reshape of the NCHW tensor would scramble it and report a larger difference).
    assert conv.max_abs == pytest.approx(by_layer["flatten"].max_abs, rel=1e-6)
    assert all(by_layer[n].diverged for n in ("flatten", "hidden", "logits", "probs"))


def _two_convs(seed):
    keras = zoo._keras()
    keras.utils.set_random_seed(seed)
    inp = keras.Input((8, 8, 3), name="image")
    x = keras.layers.Rescaling(1 / 255, name="scale")(inp)
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv_a")(x)
    x = keras.layers.Conv2D(6, 3, padding="same", activation="relu", name="conv_b")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return zoo.trained(keras.Model(inp, keras.layers.Dense(3, name="logits")(x)), seed)


def test_localize_onnx_two_convs_in_nchw(zoo_dir):
    """tf2onnx keeps consecutive convolutions in NCHW with no transpose between them: each is
    compared transposed (no false divergence, nothing marked fused); then conv_b perturbed."""
    from pytest_modelparity import export_model, load_model

    reference = _two_convs(31)
    path = export_model(reference, "onnx", zoo_dir / "two_convs.onnx")
    x = zoo.pixels(4)
    rows = localize_divergence(load_model(reference), load_model(path, "onnx"), x)
    by_layer = {r.layer: r for r in rows}
    assert not any(r.diverged for r in rows), "\n".join(map(str, rows))
    for name in ("conv_a", "conv_b"):
        assert by_layer[name].max_abs is not None and by_layer[name].layout, by_layer[name]
    zoo.perturb_onnx_layer(path, "conv_b", zoo_dir / "two_convs_b.onnx")
    rows = localize_divergence(load_model(reference), load_model(zoo_dir / "two_convs_b.onnx", "onnx"), x)
    by_layer = {r.layer: r for r in rows}
    assert [r.layer for r in rows if r.first] == ["conv_b"], "\n".join(map(str, rows))
    assert not by_layer["conv_a"].diverged and by_layer["conv_a"].max_abs is not None


def _tfjs_or_skip(build, directory):
    """Build a case needing Node.js/tfjs, skipping (with the fix) where they are missing."""
    from pytest_modelparity import errors

    try:
        return build(directory)
    except errors.RuntimeMissing as exc:
        pytest.skip(f"tfjs converter/runtime missing (pip install -e '.[tfjs]', Node.js >= 18 and npm): {exc}")


def test_localize_tfjs_perturbed_conv_in_the_weight_shard(zoo_dir):
    """Real tfjs in Node.js: the conv kernel edited in the weight shard; the layer table fetched
    through model.execute(inputs, nodes) names `conv` first, its input agreeing bitwise-close."""
    case = _tfjs_or_skip(zoo.tfjs_conv_perturbed, zoo_dir)
    rows = localize_divergence(case.reference, case.candidate, case.inputs)
    by_layer = {r.layer: r for r in rows}
    assert [r.layer for r in rows if r.first] == ["conv"], "\n".join(map(str, rows))
    assert by_layer["scale"].max_abs is not None and by_layer["scale"].max_abs < 1e-6
    conv = by_layer["conv"]
    assert conv.candidate == "StatefulPartitionedCall/classifier_1/conv_1/Relu" and conv.candidate_op == "_FusedConv2D"
    assert conv.layout == ""  # tfjs keeps NHWC: compared as is, no transpose
    assert conv.max_rel is not None and conv.max_rel > 1e-2
    assert all(by_layer[n].diverged for n in ("flatten", "hidden", "logits", "probs"))
    case.candidate.close()


def test_localize_clean_tfjs_has_no_divergence(zoo_dir):
    case = _tfjs_or_skip(zoo.clean_tfjs, zoo_dir)
    rows = localize_divergence(case.reference, case.candidate, case.inputs)
    assert not any(r.diverged for r in rows), "\n".join(map(str, rows))
    # Every Keras layer has its tfjs counterpart, matched by scope name (`conv` <- `.../conv_1/Relu`).
    for r in rows:
        assert r.max_abs is not None and r.max_rel is not None and r.max_rel < 1e-5, r
        assert f"/{r.layer}_1/" in (r.candidate or ""), r
    case.candidate.close()


def test_tfjs_as_the_reference_and_two_convs(zoo_dir):
    """A TFJS form on either side: the second of two convolutions perturbed in the shard is found
    (tfjs as candidate), and a clean tfjs reference against Keras shows no divergence."""
    from pytest_modelparity import export_model, load_model

    reference = _two_convs(37)
    path = _tfjs_or_skip(lambda d: export_model(reference, "tfjs", d / "two_convs_tfjs"), zoo_dir)
    changed = zoo.perturb_tfjs_layer(path, "conv_b", zoo_dir / "two_convs_tfjs_b")
    assert len(changed) == 1 and "conv_b" in changed[0], changed
    x = zoo.pixels(4)
    with load_model(zoo_dir / "two_convs_tfjs_b", "tfjs") as bad, load_model(path, "tfjs") as clean:
        rows = localize_divergence(load_model(reference), bad, x)
        assert [r.layer for r in rows if r.first] == ["conv_b"], "\n".join(map(str, rows))
        assert not {r.layer: r for r in rows}["conv_a"].diverged
        rows = localize_divergence(clean, load_model(reference), x)
        assert rows and not any(r.diverged for r in rows), "\n".join(map(str, rows))
        assert sum(r.max_abs is not None for r in rows) >= 4


def test_tfjs_fused_conv_bn_relu_divergence_is_reported_at_conv(zoo_dir):
    """The converter fuses conv + batch-norm + relu into one _FusedConv2D (kernel
    `conv_1/convolution/merged_input`): agreeing, conv and bn show as fused; with the merged
    kernel perturbed in the shard the first divergence is `conv`, the first of the fused layers."""
    from pytest_modelparity import export_model, load_model
    from tests.models import images, tiny_cnn

    reference = tiny_cnn(seed=5)
    path = _tfjs_or_skip(lambda d: export_model(reference, "tfjs", d / "tiny_cnn_tfjs"), zoo_dir)
    assert zoo.perturb_tfjs_layer(path, "conv", zoo_dir / "tiny_cnn_tfjs_bad") == [
        "StatefulPartitionedCall/tiny_cnn_1/conv_1/convolution/merged_input"]
    x = images(4)
    with load_model(path, "tfjs") as clean, load_model(zoo_dir / "tiny_cnn_tfjs_bad", "tfjs") as bad:
        rows = {r.layer: r for r in localize_divergence(load_model(reference), clean, x)}
        assert not any(r.diverged for r in rows.values())
        assert rows["conv"].note.startswith("fused") and rows["bn"].note.startswith("fused")
        assert rows["relu"].candidate_op == "_FusedConv2D" and rows["relu"].max_abs is not None
        rows_bad = localize_divergence(load_model(reference), bad, x)
        assert [r.layer for r in rows_bad if r.first] == ["conv"], "\n".join(map(str, rows_bad))


def test_localize_quotes_the_tfjs_runner_error_when_it_cannot_fetch(zoo_dir):
    """A TFJS form whose Node process is gone: the ValueError says why (the hook's own error)."""
    case = _tfjs_or_skip(zoo.clean_tfjs, zoo_dir)
    case.candidate.close()
    with pytest.raises(ValueError, match=r"candidate \(format 'tfjs'\) \(NodeProcessDied: .*closed"):
        localize_divergence(case.reference, case.candidate, case.inputs)
