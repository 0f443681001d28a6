"""Quantised TFLite forms judged in two parts (conversion vs quantisation cost), on a CNN
trained on scikit-learn's bundled digits (tests/digits.py, a few seconds to train)."""

from __future__ import annotations

import json
import textwrap
import warnings

import numpy as np
import pytest

from pytest_modelparity import ParityError, assert_outputs_close, export_model, load_model  # noqa: E402
from digits import digits_conftest  # noqa: E402
from pytest_modelparity.checks import quantized
from pytest_modelparity.errors import InvalidArgumentError  # noqa: E402

pytestmark = [pytest.mark.inline_exports, pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from digits import digits_cnn

    model, x_train, x_test = digits_cnn()
    where = tmp_path_factory.mktemp("digits")
    sibling = export_model(model, "tflite", where / "f32.tflite")
    return model, x_train, x_test, where, sibling


def _candidate(digits, variant, name=None, model=None, **options):
    ref, x_train, _, where, sibling = digits
    path = export_model(model or ref, "tflite", where / f"{name or variant}.tflite", quantization=variant, **options)
    return load_model(path, float_sibling=sibling)


def _judged(digits):
    """597 rows: the held-out rows and training rows not calibrated on (5,970 logits: at the
    dynamic-range budget, <= 1% beyond, 32 beyond still pass, 91 fail)."""
    _, x_train, x_test, _, _ = digits
    return np.concatenate([x_test, x_train[400:600]])


def _buggy(model):
    """The model with conv1's kernel x1.01 (a bug an export could carry)."""
    import keras

    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    kernel, bias = clone.get_layer("conv1").get_weights()
    clone.get_layer("conv1").set_weights([kernel * 1.01, bias])
    return clone


@pytest.mark.parametrize("variant", ["float16", "dynamic_range", "int8"])
def test_trained_model_passes_every_variant_in_two_parts(digits, variant):
    ref, x_train, x_test, _, _ = digits
    extra = {"representative_data": [x_train[:200]]} if variant == "int8" else {}
    cand = _candidate(digits, variant, **extra)
    assert cand.format_variant == f"tflite:{variant}"
    report = assert_outputs_close(cand, ref, inputs=_judged(digits))
    assert not report.inconclusive, report.meta["summary"]
    parts = report.meta["quantized"]["parts"]
    assert set(parts) >= {"conversion", "quantisation"}
    assert parts["conversion"]["max_rel_of_scale"] < 1e-4
    assert 0 < parts["quantisation"]["relative_rms"] < quantized.DEFAULT_BUDGETS[variant].rms
    assert ("float16 weights" in parts) == (variant == "float16")


def test_int8_calibrated_on_another_range_fails_naming_calibration(digits):
    ref, x_train, x_test, _, _ = digits
    cand = _candidate(digits, "int8", "int8_narrow", representative_data=[x_train[:200] * 0.25])
    with pytest.raises(ParityError) as info:
        assert_outputs_close(cand, ref, inputs=_judged(digits))
    report = info.value.report
    assert report.meta["quantized"]["failed_parts"] == ["quantisation"]
    text = str(info.value)
    assert "quantisation cost (tflite:int8 vs float32 sibling) FAILED" in text
    assert "conversion (float32 sibling vs reference) passed" in text
    causes = [h.cause for h in report.hints]
    assert causes[0] == "inputs_outside_calibration"
    assert "input 'image' spans [0, 1]" in report.hints[0].evidence and "[0, 0.25" in report.hints[0].evidence
    assert "quantization_cost" in causes  # the costliest layers, by name
    cost = next(h for h in report.hints if h.cause == "quantization_cost")
    assert "`relu1 (fused: bn1, conv1)` (CONV_2D)" in cost.message, cost  # the clipped input's first layer


def test_int8_without_representative_data_warns_about_default_rows(digits):
    with pytest.warns(UserWarning, match="no representative_data.*uniform \\[0, 1\\)"):
        _candidate(digits, "int8", "int8_default")


def test_float16_kernel_bug_fails_on_the_float16_weights_line(digits):
    ref, _, x_test, _, _ = digits
    cand = _candidate(digits, "float16", "float16_bug", model=_buggy(ref))
    with pytest.raises(ParityError) as info:
        assert_outputs_close(cand, ref, inputs=_judged(digits))
    parts = info.value.report.meta["quantized"]["parts"]
    assert not parts["float16 weights"]["passed"]
    assert parts["conversion"]["passed"]
    hint = next(h for h in info.value.report.hints if h.cause == "float16_weights_differ")
    # the first layer whose weights differ: conv1, fused with its batch norm and relu
    assert "first at `relu1 (fused: bn1, conv1)` (CONV_2D)" in hint.message, hint


def test_a_conversion_bug_fails_as_conversion_even_with_a_loose_budget(digits, tmp_path):
    ref, x_train, x_test, _, _ = digits
    bug = _buggy(ref)
    sibling = export_model(bug, "tflite", tmp_path / "bug32.tflite")
    path = export_model(bug, "tflite", tmp_path / "bug8.tflite", quantization="dynamic_range")
    cand = load_model(path, float_sibling=sibling)
    with quantized.budget_layers([("test", "dynamic_range:rms=1,scale=0.5,beyond=1,top1=0")]):
        with pytest.raises(ParityError) as info:
            assert_outputs_close(cand, ref, inputs=_judged(digits))
    meta = info.value.report.meta["quantized"]
    assert meta["failed_parts"] == ["conversion"]
    assert "loosened by test" in meta["budget_source"]
    assert "a conversion bug, not quantisation" in str(info.value)


def test_loosening_the_budget_lets_a_costly_quantisation_pass(digits):
    ref, x_train, x_test, _, _ = digits
    cand = _candidate(digits, "int8", "int8_narrow2", representative_data=[x_train[:200] * 0.25])
    with quantized.budget_layers([("test", {"int8": {"rms": 2.0, "scale": 0.9, "beyond": 1.0, "top1": 0.0}})]):
        report = assert_outputs_close(cand, ref, inputs=_judged(digits))
    assert report.meta["quantized"]["budget"]["rms"] == 2.0


def test_budget_text_is_checked():
    assert quantized.parse_budget("int8:rms=0.1,top1=0.9; tflite:dynamic_range:scale=0.2") == {
        "int8": {"rms": 0.1, "top1": 0.9}, "dynamic_range": {"scale": 0.2}}
    for bad, match in [("int4:rms=1", "unknown variant"), ("int8:speed=1", "unknown budget key"),
                       ("int8:top1=2", "<= 1"), ("rms=1", "no variant"), ("int8:rms=x", "not a number")]:
        with pytest.raises(InvalidArgumentError, match=match):
            quantized.parse_budget(bad)


def test_dynamic_range_with_an_embedding_is_labelled_dynamic_range(tmp_path):
    import keras

    keras.utils.set_random_seed(0)
    ids = keras.Input((6,), dtype="int32", name="ids")
    h = keras.layers.Embedding(300, 32)(ids)  # large enough to be quantised (>= 1024 weights)
    out = keras.layers.Dense(300)(h)
    model = keras.Model(ids, out)
    path = export_model(model, "tflite", tmp_path / "emb.tflite", quantization="dynamic_range")
    # The GATHER over int8 embedding weights produces an int8 tensor: still not an int8 model.
    assert load_model(path).format_variant == "tflite:dynamic_range"


def test_dataset_shapes(tmp_path):
    from pytest_modelparity.checks.dataset import as_dataset
    from pytest_modelparity.formats.base import TensorSpec

    specs = [TensorSpec("image", (None, 2, 2), np.dtype("float32"))]
    rows = np.arange(40, dtype="float64").reshape(10, 2, 2)
    np.savez(tmp_path / "d.npz", image=rows)
    for raw in (rows, (rows, np.arange(10)), {"image": rows}, str(tmp_path / "d.npz"), [rows[:4], rows[4:]],
                (r for r in rows)):
        data = as_dataset(raw)
        got = data.arrays(specs)["image"]
        assert got.dtype == np.float32 and got.shape == (10, 2, 2)
        np.testing.assert_array_equal(got, rows)
        assert data.calibration(specs)["image"].shape[0] == 5 and data.batch(specs)["image"].shape[0] == 5
    with pytest.raises(InvalidArgumentError, match="arrays \\['x2', 'y'\\].*name each array after its input"):
        as_dataset({"x2": rows, "y": rows}).arrays(specs)
    with pytest.raises(InvalidArgumentError, match="no such file"):
        as_dataset(str(tmp_path / "missing.npz"))


def test_dataset_batches_draw_real_rows_optionally_perturbed():
    from hypothesis import given, settings

    from pytest_modelparity.formats.base import TensorSpec
    from pytest_modelparity.checks.strategies import dataset_batches

    specs = [TensorSpec("x", (None, 3), np.dtype("float32"))]
    rows = np.random.default_rng(0).uniform(0, 1, (20, 3)).astype("float32")

    @settings(max_examples=10, database=None)
    @given(batch=dataset_batches(specs, rows, batch_size=4))
    def exact(batch):
        assert batch["x"].shape == (4, 3)
        assert all(any(np.array_equal(r, row) for row in rows) for r in batch["x"])

    @settings(max_examples=10, database=None)
    @given(batch=dataset_batches(specs, rows, batch_size=4, perturb=0.01))
    def near(batch):
        gaps = np.min(np.abs(batch["x"][:, None, :] - rows[None]).max(-1), axis=1)
        assert np.all(gaps <= 0.01 + 1e-6) and batch["x"].min() >= rows.min() and batch["x"].max() <= rows.max()

    exact()
    near()


SUITE = textwrap.dedent('''
    from hypothesis import given, settings, strategies as st
    from pytest_modelparity import assert_outputs_close, strategies

    def test_parity(parity_candidate, parity_reference, parity_batch):
        assert parity_batch["image"].shape[0] == 64  # real rows from modelparity_dataset
        assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)

    @settings(max_examples=3, deadline=None, database=None)
    @given(data=st.data())
    def test_real_rows(parity_candidate, parity_reference, modelparity_dataset, data):
        batch = data.draw(strategies.dataset_batches(parity_reference, modelparity_dataset, batch_size=16,
                                                     perturb=0.01))
        assert batch["image"].min() >= 0.0 and batch["image"].max() <= 1.0  # stays in the data's range
        assert_outputs_close(parity_candidate, parity_reference, inputs=batch)
''')


def test_plugin_digits_suite_with_a_dataset_passes_every_variant(pytester, _heavy_modules_stay_loaded, request):
    tests = str(request.path.parent)
    pytester.makeconftest(digits_conftest(tests))
    pytester.makepyfile(test_digits=SUITE)
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "--modelparity-formats=tflite:int8,tflite:float16,tflite:dynamic_range",
        "--modelparity-report=r.json")
    result.assert_outcomes(passed=6)
    doc = json.loads((pytester.path / "r.json").read_text())
    text = json.dumps(doc)
    assert "modelparity_dataset" in text and "judged in two parts" in text


def test_plugin_savedmodel_dir_int8_calibrates_on_the_suite_rows(pytester, _heavy_modules_stay_loaded, tmp_path):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    x = keras.Input((6,), name="x")
    h = keras.layers.Dense(16, activation="relu")(x)
    model = keras.Model(x, keras.layers.Dense(4)(h))
    saved = tmp_path / "sm"
    tf.saved_model.save(model, str(saved))
    pytester.makeconftest(textwrap.dedent(f'''
        import pytest

        @pytest.fixture(scope="session")
        def modelparity_source():
            return {str(saved)!r}
    '''))
    pytester.makepyfile(test_sm=textwrap.dedent('''
        from pytest_modelparity import assert_outputs_close

        def test_parity(parity_candidate, parity_reference, parity_batch):
            assert next(iter(parity_batch.values())).min() < -0.2  # default rows span [-1, 1], not [0, 1)
            report = assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
            calibration = report.meta["quantized"]["calibration"]
            assert calibration["default"] and "seeded random rows" in calibration["source"]
            assert "calibrated on default rows" in report.meta["summary"]
    '''))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--modelparity-formats=tflite:int8")
    result.assert_outcomes(passed=1)


def test_zero_code_data_option_feeds_calibration_and_batches(pytester, _heavy_modules_stay_loaded, digits):
    ref, x_train, x_test, where, _ = digits
    ref.save(pytester.path / "digits.keras")
    np.savez(pytester.path / "rows.npz", image=np.concatenate([x_train[:100], x_test]))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--modelparity-model=digits.keras",
                                          "--modelparity-data=rows.npz", "--modelparity-formats=tflite:int8",
                                          "-k", "outputs_close", "--modelparity-report=r.json")
    result.assert_outcomes(passed=1)
    # each drawn batch (1-16 rows) is decided on rows drawn from the data, not inconclusive: its
    # share beyond is proved within the budget (the upper bound of the interval)
    rows = [r for r in json.loads((pytester.path / "r.json").read_text())["rows"] if r["decision"]]
    assert rows and {r["verdict"] for r in rows} == {"pass"}, [r["inconclusive"] for r in rows]
    assert all(r["decision"]["upper"] <= r["decision"]["budget_rate"] < 1 for r in rows)
    assert all(r["decision"]["rows_drawn"] > 0 and "rows.npz" in r["decision"]["rows_source"] for r in rows)


def test_data_and_budget_options_are_checked_at_start(pytester, _heavy_modules_stay_loaded):
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--modelparity-data=missing.npz")
    assert "no such file" in result.stderr.str()
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--modelparity-quant-budget=int8:speed=2")
    assert "unknown budget key 'speed'" in result.stderr.str()


def test_a_quantised_file_without_sibling_is_judged_by_the_same_budget(digits):
    """Loaded alone (no float sibling) an int8/dynamic-range file is still recognised as
    quantised and judged by its budget against the reference: the same verdict either way."""
    ref, x_train, x_test, where, sibling = digits
    cases = [("dynamic_range", "alone_dr", {}, True), ("int8", "alone_int8", {"representative_data": [x_train[:200]]}, True),
             ("int8", "alone_narrow", {"representative_data": [x_train[:200] * 0.25]}, False)]
    for variant, name, extra, good in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            path = export_model(ref, "tflite", where / f"{name}.tflite", quantization=variant, **extra)
        verdicts = []
        for cand in (load_model(path), load_model(path, float_sibling=sibling)):
            try:
                report = assert_outputs_close(cand, ref, inputs=_judged(digits))
            except ParityError as exc:
                report = exc.report
            verdicts.append(report.passed)
            meta = report.meta["quantized"]
            assert meta["variant"] == variant
            assert meta["parts"]["quantisation"]["passed"] is good, report.meta["summary"]
        assert verdicts == [good, good], (name, verdicts)
        alone = load_model(path)
        try:
            report = assert_outputs_close(alone, ref, inputs=_judged(digits))
        except ParityError as exc:
            report = exc.report
        summary = report.meta["summary"]
        assert f"judged by the tflite:{variant} budget against the reference: no float32 sibling" in summary
        assert "as regression (not a softmax over the last axis)" in summary  # logits: the share-of-scale budget
        assert quantized.judged_alone(alone)


def test_three_flipped_rows_of_four_are_not_evidence_four_are():
    """At 99.99% confidence 4 rows prove a miss rate beyond 5% only when all 4 differ (the
    lower bound 10%); with 0-3 flipped the decision is inconclusive, never a pass (before
    issue 47: 0-2 flipped passed)."""
    from pytest_modelparity.verdict.tolerances import Tolerance

    sibling = np.tile(np.array([[4.0, 0.0, 0.0]], np.float32), (4, 1))
    conversion = lambda dtype, path: Tolerance(0.0, 0.0, scale=1e-6)  # noqa: E731
    loose = {"int8": {"rms": 10.0, "scale": 0.2, "beyond": 1.0}}  # only top-1 judges here
    for flipped, verdict in ((0, "inconclusive"), (1, "inconclusive"), (3, "inconclusive"), (4, "fail")):
        quant = sibling.copy()
        quant[:flipped] = [0.0, 4.0, 0.0]
        with quantized.budget_layers([("test", loose)]), quantized.class_scores(True, source="test"):
            report = quantized.two_part_report(quantized=quant, sibling=sibling, reference=sibling, variant="int8",
                                               conversion_tolerance=conversion)
        out = report.outputs[-1]
        assert out.decision["verdict"] == verdict and report.passed is (verdict != "fail"), str(report)
        assert bool(report.inconclusive) is (verdict == "inconclusive")
        assert report.meta["quantized"]["parts"]["conversion"]["passed"]
        # one rule, the applied one, in the summary and in the Tolerance line alike
        assert f"{flipped} differ ({flipped / 4:.1%}), 99.99% interval [" in report.meta["summary"]
        assert "against budget <= 5.0% (top-1 >= 95%)" in report.meta["summary"]
        assert "(on 4 row(s) no count passes, fails from 4)" in out.tolerance.describe()


def test_tf_data_dataset_feeds_rows():
    import tensorflow as tf

    from pytest_modelparity.checks.dataset import as_dataset
    from pytest_modelparity.formats.base import TensorSpec

    rows = np.arange(24, dtype="float32").reshape(12, 2)
    specs = [TensorSpec("x", (None, 2), np.dtype("float32"))]
    labelled = tf.data.Dataset.from_tensor_slices((rows, np.arange(12))).batch(5)  # (x, y) batches
    np.testing.assert_array_equal(as_dataset(labelled).arrays(specs)["x"], rows)
    unbatched = tf.data.Dataset.from_tensor_slices({"x": rows})  # one row per element
    np.testing.assert_array_equal(as_dataset(unbatched).arrays(specs)["x"], rows)


def test_library_int8_without_sibling_names_the_file_input_range(digits):
    """No sibling, no plugin: the range is read from the int8 file itself."""
    ref, x_train, x_test, where, _ = digits
    path = export_model(ref, "tflite", where / "narrow_alone.tflite", quantization="int8",
                        representative_data=[x_train[:200] * 0.25])
    with pytest.raises(ParityError) as info:
        assert_outputs_close(load_model(path), ref, inputs=_judged(digits))
    hint = next(h for h in info.value.report.hints if h.cause == "inputs_outside_calibration")
    assert "input 'image' spans [0, 1]; the int8 file's input quantisation represents [0, 0.25" in hint.evidence
    assert "representative_data" in hint.message


def test_a_recurrent_dynamic_range_file_is_read_as_dynamic_range_and_passes(tmp_path):
    """Issue 47: a recurrent net's dynamic-range file keeps its int8 weights inside its While
    body (subgraph 2 of 3 here); read from the main subgraph alone it was labelled float32 and
    judged by the float rule (a ConvLSTM failed at 44,792x the float32 error, with no hint).
    Read whole, a GRU's file is dynamic_range, judged by its budget against its float32
    sibling, and passes on 256 rows (1,280 regression values, proved within <= 1% beyond)."""
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 4), name="seq")
    out = keras.layers.Dense(5, name="out")(keras.layers.GRU(32, name="gru")(inp))  # >= 1024 weights: quantised
    model = keras.Model(inp, out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sibling = export_model(model, "tflite", tmp_path / "f32.tflite")
        path = export_model(model, "tflite", tmp_path / "dr.tflite", quantization="dynamic_range")
    cand = load_model(path, float_sibling=sibling)
    native = cand.native
    main_kinds = {np.dtype(d["dtype"]).name for d in native.get_tensor_details()}
    assert native.num_subgraphs() > 1 and "int8" not in main_kinds  # the weights are not in the main graph
    assert cand.format_variant == "tflite:dynamic_range"
    assert load_model(sibling).format_variant == "tflite:float32"
    rows = np.random.default_rng(0).uniform(-1, 1, (256, 8, 4)).astype(np.float32)
    report = assert_outputs_close(cand, model, inputs=rows)
    assert report.meta["quantized"]["variant"] == "dynamic_range" and not report.inconclusive
    cost = report.outputs[-1].decision
    assert cost["unit"] == "elements" and cost["trials"] == 1280 and cost["upper"] <= 0.01 < 1


def test_inputs_outside_a_data_calibration_do_not_advise_calibrating_on_the_data():
    """Issue 47: a detector's int8 file, calibrated on its dataset, failed on uniform rows the
    check had added, and the hint advised calibrating on the dataset, which it was. When the
    file was calibrated on data the hint now says the inputs are unlike it; on default rows it
    still sends to modelparity_dataset."""
    from types import SimpleNamespace

    from pytest_modelparity.diagnose.calibration import CALIBRATION_FIX, outside_calibration

    inputs = {"x": np.linspace(-1.0, 1.0, 8, dtype=np.float32)}
    data = SimpleNamespace(calibration_ranges={"x": (0.0, 1.0)}, calibration={
        "rows": 100, "source": "the first rows of modelparity_dataset boxes.npz", "default": False})
    cause, message, evidence = outside_calibration(data, inputs)
    assert cause == "inputs_outside_calibration" and "input 'x' spans [-1, 1]" in evidence
    assert "calibrated on 100 rows (the first rows of modelparity_dataset boxes.npz)" in message
    assert CALIBRATION_FIX not in message
    default = SimpleNamespace(calibration_ranges={"x": (0.0, 1.0)}, calibration={"rows": 100, "default": True})
    assert CALIBRATION_FIX in outside_calibration(default, inputs)[1]
