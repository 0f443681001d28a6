"""assert_outputs_close / assert_deterministic / assert_batch_invariant on arrays and on
plain callables (numpy only here; the Keras acceptance tests are in test_default_rule.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_modelparity import ParityError, assert_batch_invariant, assert_deterministic, assert_outputs_close, diagnose
from pytest_modelparity.reports import recording
from pytest_modelparity.verdict import tolerances as t
from pytest_modelparity.formats.base import LoadedModel, TensorSpec

RNG = np.random.default_rng(0)
X = RNG.normal(0, 1, (12, 6)).astype(np.float32)
W = RNG.normal(0, 1, (6, 3)).astype(np.float32)


def rowwise(batch):
    return np.asarray(batch, np.float32) @ W


@pytest.fixture
def emitted():
    seen: list[tuple[str, object]] = []

    def listener(kind, report):
        seen.append((kind, report))

    recording.subscribe(listener)
    yield seen
    recording.unsubscribe(listener)


# --- assert_outputs_close -------------------------------------------------------------

def test_close_arrays_pass_and_return_the_report(emitted):
    report = assert_outputs_close(X + 1e-7, X)
    assert report.passed and report.outputs[0].tolerance.rule == "scaled"
    assert emitted == [("outputs_close", report)]


def test_far_arrays_raise_parity_error_with_report_and_msg(emitted):
    with pytest.raises(ParityError) as info:
        assert_outputs_close(X * 1.01, X, msg="tflite vs keras")
    err = info.value
    assert isinstance(err, AssertionError)
    assert str(err).startswith("tflite vs keras\n")
    assert "Mismatched elements" in str(err)
    assert err.report.outputs[0].mismatched > 0
    assert emitted and emitted[0][0] == "outputs_close" and not emitted[0][1].passed


def test_nested_outputs_and_paths():
    expected = {"logits": X, "extra": [X[:, 0], np.arange(4)]}
    actual = {"logits": X.copy(), "extra": [X[:, 0].copy(), np.array([0, 1, 2, 5])]}
    with pytest.raises(ParityError) as info:
        assert_outputs_close(actual, expected)
    failed = [o.path for o in info.value.report.failed]
    assert failed == ["['extra'][1]"]


def test_models_are_run_on_inputs_and_need_them():
    report = assert_outputs_close(rowwise, lambda b: np.asarray(b) @ W.astype(np.float64), inputs=X)
    assert report.passed and "rowwise" in report.title
    with pytest.raises(TypeError, match="pass inputs="):
        assert_outputs_close(rowwise, X @ W)


def test_explicit_tolerance_is_plain_per_element_and_named():
    expected = np.array([100.0, 0.001], np.float32)
    actual = np.array([100.0, 0.0015], np.float32)
    assert_outputs_close(actual, expected)                      # scaled default passes
    with pytest.raises(ParityError) as info:
        assert_outputs_close(actual, expected, rtol=1e-3, atol=1e-6)
    tol = info.value.report.outputs[0].tolerance
    assert (tol.scale, tol.source) == (0.0, "argument")
    assert "argument" in str(info.value)


def test_marker_and_ini_layers_apply_below_the_argument():
    expected = np.array([1.0, 2.0], np.float32)
    actual = expected + np.float32(0.01)
    with t.tolerance_layers([("marker", None, 0.1), ("ini", 0.0, 1e-9)]):
        report = assert_outputs_close(actual, expected)
        assert report.outputs[0].tolerance.source == "rtol from ini, atol from marker"
        with pytest.raises(ParityError, match="argument"):
            assert_outputs_close(actual, expected, atol=1e-3)
    with pytest.raises(ParityError):   # outside the block the scaled default (2e-5 here) applies
        assert_outputs_close(actual, expected)


def test_tolerance_object_and_bad_tolerance_arguments():
    tol = t.Tolerance(0.0, 0.5, source="mine")
    assert assert_outputs_close(X + 0.4, X, tolerance=tol).outputs[0].tolerance.source == "mine"
    with pytest.raises(ValueError, match="not both"):
        assert_outputs_close(X, X, tolerance=tol, rtol=1e-3)
    with pytest.raises(ValueError, match="'calibrated'"):
        assert_outputs_close(X, X, tolerance="loose")
    with pytest.raises(TypeError, match="expected must be a model"):
        assert_outputs_close(X, X, tolerance="calibrated")


def test_failure_is_diagnosed_and_a_diagnosis_crash_never_hides_it(monkeypatch):
    hint = diagnose.Hint("scaled_input", "actual = expected x 1.01", "ratio 1.01 on every element")
    monkeypatch.setattr(diagnose, "diagnose_comparison", lambda report, **kw: [hint])
    with pytest.raises(ParityError) as info:
        assert_outputs_close(X * 1.01, X)
    assert info.value.report.hints == [hint]

    def broken(report, **kw):
        raise RuntimeError("diagnosis bug")

    monkeypatch.setattr(diagnose, "diagnose_comparison", broken)
    with pytest.raises(ParityError) as info:
        assert_outputs_close(X * 1.01, X)
    assert "Mismatched elements" in str(info.value)  # the text renders; the diagnosis ran then
    assert "diagnosis bug" in info.value.report.meta["diagnosis_error"]


def test_the_diagnosis_runs_when_the_failure_is_read_and_only_once(monkeypatch):
    calls = []
    hint = diagnose.Hint("scaled_output", "actual = expected x 1.02", "ratio 1.02")

    def counting(report, **kw):
        calls.append(report)
        return [hint]

    monkeypatch.setattr(diagnose, "diagnose_comparison", counting)
    for _ in range(5):  # five caught failures nobody reads: no diagnosis
        with pytest.raises(ParityError):
            assert_outputs_close(X * 1.02, X)
    assert calls == []
    with pytest.raises(ParityError) as info:
        assert_outputs_close(X * 1.02, X)
    assert "Likely cause:" in str(info.value) and "actual = expected x 1.02" in str(info.value)
    assert list(info.value.report.hints) == [hint] and len(calls) == 1


class NumpyModel(LoadedModel):
    """A LoadedModel subclass computing in numpy: stands for a format whose variant and
    device decide the default tolerance (no GPU or quantised runtime needed)."""

    format = "tflite"

    def __init__(self, *, device="cpu", variant=None, noise=0.0):
        super().__init__(device=device, inputs=[TensorSpec("x", (None, 6), np.float32)],
                         outputs=[TensorSpec("y", (None, 3), np.float32)])
        if variant:
            self.format_variant = variant
        self.noise = noise

    def _predict(self, feeds):
        y = feeds["x"] @ W
        return {"y": (y * (1 + self.noise)).astype(np.float32)}


def test_loaded_model_format_variant_and_device_choose_the_default():
    reference = lambda b: {"y": rowwise(b)}  # noqa: E731
    report = assert_outputs_close(NumpyModel(variant="tflite:int8", noise=0.01), reference, inputs=X)
    tol = report.outputs[0].tolerance
    # a quantised file without a float sibling: the int8 budget against the reference (issue 27);
    # "y" is not a softmax, so it is judged as regression (no top-1)
    assert "tflite:int8 quantisation budget for regression outputs vs the reference" in tol.source and tol.min_top1 is None
    assert report.title.startswith("tflite:int8 vs")
    with pytest.raises(ParityError):   # 1% is far beyond float32 TFLite's default
        assert_outputs_close(NumpyModel(noise=0.01), reference, inputs=X)
    gpu = assert_outputs_close(NumpyModel(device="gpu", noise=1e-4), reference, inputs=X)
    assert "gpu (TF32 on)" in gpu.outputs[0].tolerance.source and gpu.meta["device"] == "gpu"


# --- assert_deterministic -------------------------------------------------------------

def test_deterministic_passes_for_a_pure_function(emitted):
    report = assert_deterministic(rowwise, X, runs=4)
    assert report.passed and report.meta["differing_runs"] == []
    assert [kind for kind, _ in emitted] == ["deterministic"]


def test_deterministic_catches_noise_and_names_the_run():
    calls = {"n": 0}

    def noisy_on_third_call(batch):
        calls["n"] += 1
        out = rowwise(batch)
        return out + np.float32(1e-6) if calls["n"] == 3 else out

    with pytest.raises(ParityError) as info:
        assert_deterministic(noisy_on_third_call, X, runs=3)
    meta = info.value.report.meta
    assert meta["differing_runs"] == [3] and meta["first_differing_run"] == 3
    assert meta["per_run"][0]["identical"] and meta["per_run"][1]["max_abs"] > 0
    assert [o.path for o in info.value.report.failed] == ["['run 3']"]


def test_deterministic_catches_random_noise_even_at_tiny_scale():
    rng = np.random.default_rng(1)
    with pytest.raises(ParityError, match="2 runs"):
        assert_deterministic(lambda b: rowwise(b) + rng.normal(0, 1e-7, (len(b), 3)), X, runs=2)


def test_deterministic_with_tolerance_and_bad_runs():
    rng = np.random.default_rng(2)
    noisy = lambda b: rowwise(b) + rng.normal(0, 1e-7, (len(b), 3)).astype(np.float32)  # noqa: E731
    assert assert_deterministic(noisy, X, atol=1e-5).passed
    with pytest.raises(ValueError, match="runs=1"):
        assert_deterministic(rowwise, X, runs=1)
    with pytest.raises(TypeError, match="callable"):
        assert_deterministic(X, X)


# --- assert_batch_invariant -----------------------------------------------------------

def batch_normalised(batch):
    """Output depends on the whole batch: the bug of a BatchNorm left in training mode."""
    b = np.asarray(batch, np.float32)
    return (b - b.mean(axis=0)) @ W


def test_batch_invariant_passes_for_rowwise(emitted):
    report = assert_batch_invariant(rowwise, X, batch_sizes=(1, 5))   # 12 = 5 + 5 + 2
    assert report.passed
    assert report.meta["batch"] == 12 and report.meta["batch_sizes"] == [1, 5]
    assert {o.path for o in report.outputs} == {"['sub-batches of 1']", "['sub-batches of 5']"}
    assert emitted[-1][0] == "batch_invariant"


def test_batch_invariant_catches_batch_dependence():
    with pytest.raises(ParityError) as info:
        assert_batch_invariant(batch_normalised, X)
    report = info.value.report
    assert report.meta["check"] == "batch_invariant" and report.outputs[0].mismatched > 0
    assert "batch of 12 at once vs sub-batches of 1" in str(info.value)


def test_dict_inputs_are_split_together():
    seen_rows = []

    def two_inputs(batch):
        a, b = np.asarray(batch["a"]), np.asarray(batch["b"])
        assert len(a) == len(b)
        seen_rows.append(len(a))
        return {"sum": a + b[:, :1]}

    report = assert_batch_invariant(two_inputs, {"a": X, "b": X[:, ::-1].copy()}, batch_sizes=(5,))
    assert report.passed and seen_rows == [12, 5, 5, 2]


def test_batch_invariant_exact_mode_and_bad_sizes():
    def reorders_sum(batch):
        b = np.asarray(batch, np.float32)
        # summation order depends on the batch size, like a blocked matmul
        return b.sum(axis=1, keepdims=True) if len(b) > 1 else b[:, ::-1].sum(axis=1, keepdims=True)

    x = np.random.default_rng(3).uniform(0, 1000, (8, 50)).astype(np.float32)
    assert assert_batch_invariant(reorders_sum, x).passed
    with pytest.raises(ParityError) as info:
        assert_batch_invariant(reorders_sum, x, rtol=0, atol=0)
    assert info.value.report.outputs[0].max_ulp >= 1
    with pytest.raises(ValueError, match="int >= 1"):
        assert_batch_invariant(rowwise, X, batch_sizes=(0,))
    with pytest.raises(ValueError, match="same rows"):
        assert_batch_invariant(rowwise, {"a": X, "b": X[:3]})


def test_batch_invariant_calibrated_catches_batch_dependence():
    report = assert_batch_invariant(rowwise, X, tolerance="calibrated")
    assert "the reference's own float noise" in report.meta["calibration"]["summary"]
    with pytest.raises(ParityError, match="the reference's own float noise"):
        assert_batch_invariant(batch_normalised, X, tolerance="calibrated")


def test_named_single_output_meets_bare_array():
    """A LoadedModel's {name: array} against a raw model's bare array compares values."""
    from pytest_modelparity import assert_outputs_close, ParityError

    x = np.linspace(-1, 1, 12, dtype="float32").reshape(3, 4)
    report = assert_outputs_close(lambda b: {"probs": b * 2}, lambda b: b * 2, inputs=x)
    assert report.meta["alignment"].startswith("single output 'probs'")
    with pytest.raises(ParityError, match="Mismatched elements"):
        assert_outputs_close(lambda b: {"probs": b * 2}, lambda b: b * 3, inputs=x)


def test_list_outputs_meet_named_outputs_by_values_never_by_position():
    """Issue 25: a list against named outputs is paired by what the arrays are, not where they sit."""
    from pytest_modelparity import assert_outputs_close, ParityError
    from pytest_modelparity.formats.binding import BindingError

    x = np.ones((2, 3), "float32")
    assert_outputs_close(lambda b: [b, b + 1], lambda b: {"a": b, "b": b + 1}, inputs=x)
    report = assert_outputs_close(lambda b: [b + 1, b], lambda b: {"a": b, "b": b + 1}, inputs=x)
    assert "'a'~'[1]' (values" in report.meta["alignment"] and "'b'~'[0]' (values" in report.meta["alignment"]
    with pytest.raises(ParityError):                       # one output wrong: still a failure
        assert_outputs_close(lambda b: [b, b[:, :1] * 0 + 9], lambda b: {"a": b, "b": b[:, :1] + 1}, inputs=x)
    with pytest.raises(BindingError, match="cannot tell which output is which"):
        assert_outputs_close(lambda b: [b + 5, b + 7], lambda b: {"a": b, "b": b + 1}, inputs=x)


def test_differently_named_outputs_meet_by_what_they_are():
    """A SavedModel's 'output_0' against the Keras name 'probs' is the same output."""
    from pytest_modelparity import assert_outputs_close, ParityError
    from pytest_modelparity.formats.binding import BindingError

    x = np.ones((2, 3), "float32")
    report = assert_outputs_close(lambda b: {"output_0": b}, lambda b: {"probs": b}, inputs=x)
    assert "'probs'~'output_0' (converter name" in report.meta["alignment"]
    assert report.meta["binding"]["outputs"][0] == {"reference": "probs", "other": "output_0",
                                                   "basis": "converter name", "how": "index 0 in sorted-name order"}
    with pytest.raises(ParityError):
        assert_outputs_close(lambda b: {"output_0": b + 1}, lambda b: {"probs": b}, inputs=x)
    # Shared names are never re-paired, and two real names that differ are never paired at all.
    with pytest.raises(BindingError, match="'b' with 'c'.*two real names that differ"):
        assert_outputs_close(lambda b: {"a": b, "c": b}, lambda b: {"a": b, "b": b}, inputs=x)


def test_a_raw_keras_model_fed_a_named_batch_gets_no_structure_warning():
    """parity_batch is {input name: array}; a user's single-input Keras model as the expected
    side must be fed it without Keras' "structure of `inputs` doesn't match" UserWarning."""
    import warnings

    pytest.importorskip("tensorflow", reason="needs TensorFlow: pip install -e '.[all]'")
    from tests.models import images, tiny_cnn

    model, changed = tiny_cnn(0), tiny_cnn(0)
    kernel, bias = changed.get_layer("logits").get_weights()
    kernel[:, 0] += 0.3
    changed.get_layer("logits").set_weights([kernel, bias])
    x = images(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_outputs_close(model, model, inputs={"image": x})
        with pytest.raises(ParityError):  # the diagnosis reruns both models on the batch
            assert_outputs_close(changed, model, inputs={"image": x})
    assert [str(w.message) for w in caught if "structure" in str(w.message)] == []


def test_a_raw_keras_model_is_named_as_one_in_the_title():
    from models import mlp

    from pytest_modelparity import assert_outputs_close, load_model

    model = mlp(seed=2)
    x = np.ones((2, 16), "float32")
    report = assert_outputs_close(load_model(model), model, inputs=x)
    assert report.title == "keras vs keras model 'mlp'"


def test_model_running_checks_keep_to_their_budget_and_say_what_was_skipped(monkeypatch):
    """Each model run costs 0.1 s and the budget is 0.3 s: the reruns run (and measure one
    run), the checks predicted to overrun are skipped, and a hint names them."""
    import time as _time

    monkeypatch.setattr(diagnose, "MODEL_CHECKS_BUDGET_S", 0.3)

    def slow(scale):
        def model(x):
            _time.sleep(0.1)
            return np.asarray(x, np.float32)[:, :3] * scale
        return model

    x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    with pytest.raises(ParityError) as info:
        assert_outputs_close(slow(1.7), slow(1.0), inputs=x)
    text = str(info.value)
    (budget,) = [h for h in info.value.report.hints if h.cause == "diagnosis_budget"]
    assert "input transforms" in budget.message and "0.3 s" in budget.evidence
    assert "not run, to keep the failure fast" in text
