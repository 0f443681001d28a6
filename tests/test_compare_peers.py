"""The engine against its peers (numpy.testing, torch.testing): the cases where their own
test suites showed it wrong, fixed, and the differences kept on purpose (README "How this
compares with numpy and torch.testing"), each pinned."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pytest_modelparity import ParityError, assert_outputs_close
from pytest_modelparity.verdict.arrays import as_numpy, is_torch_like
from pytest_modelparity.verdict.compare import compare, elementwise_close
from pytest_modelparity.errors import InvalidArgumentError
from pytest_modelparity.verdict.formatting import ceil_float, exact_float
from pytest_modelparity.verdict.tolerances import Tolerance, resolve_tolerance

pytestmark = [pytest.mark.inline_exports,
              pytest.mark.usefixtures("_tfjs_converter_loaded")]  # conftest.py: no export worker

README = Path(__file__).resolve().parent.parent / "README.md"
ADVICE = re.compile(r"(atol|rtol)=(\S+) \(with (atol|rtol)=([^;)]+)")
ADVICE_FULL = re.compile(r"(atol|rtol)=(\S+) \(with (atol|rtol)=([^;)]+)(; vacuous[^)]*)?\)")


def only(report):
    (oc,) = report.outputs
    return oc


def text_of(excinfo) -> str:
    return str(excinfo.value)


# -- a comparison that cannot fail ---------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_an_rtol_too_large_for_float32_still_fails_against_zeros(dtype):
    """rtol=1e39 is inf in float32 and inf x 0 is NaN, which no element was counted against:
    ones vs zeros passed. numpy.isclose says False; so does the engine now (judged in
    float64 there, where rtol x 0 stays 0)."""
    ones, zeros = np.ones(3, dtype), np.zeros(3, dtype)
    with np.errstate(all="ignore"):
        assert not np.isclose(ones.astype(np.float32), zeros.astype(np.float32), rtol=1e39).any()
    with pytest.raises(ParityError, match="Mismatched elements: 3 / 3"):
        assert_outputs_close(ones, zeros, rtol=1e39)
    assert not elementwise_close(ones, zeros, Tolerance(1e39, 0.0, source="t")).any()
    # the other way round every bound is huge: a vacuous rule, reported as such
    with pytest.raises(ParityError, match="vacuous comparison"):
        assert_outputs_close(zeros, ones, rtol=1e39)


def test_complex_outputs_get_the_vacuous_check_floats_get():
    with pytest.raises(ParityError, match="vacuous comparison"):
        assert_outputs_close(np.array([0.0]), np.array([1e-3]), atol=1)
    with pytest.raises(ParityError, match="vacuous comparison"):
        assert_outputs_close(np.array([0j]), np.array([1e-3 + 0j]), atol=1)
    assert assert_outputs_close(np.array([0j]), np.array([1e-3 + 0j]), atol=1, allow_vacuous=True).passed
    oc = only(compare(np.array([0j]), np.array([1e-3 + 0j]), tolerance=Tolerance(0, 1, source="t")))
    assert oc.vacuous and not oc.passed


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0])
def test_a_tolerance_object_with_an_infinite_or_negative_bound_is_refused(bad):
    with pytest.raises(InvalidArgumentError, match="finite number >= 0"):
        compare(np.ones(2), np.ones(2), tolerance=Tolerance(bad, 0.0, source="mine"))


# -- advice that works when followed ---------------------------------------------------------

def test_ceil_float_never_prints_below_the_value():
    assert ceil_float(0.0537066) == "0.05371"          # to nearest it was 0.0537: fails
    assert ceil_float(0.0537) == "0.0537"
    assert ceil_float(1.423015351387204e-14) == "1.424e-14"
    assert ceil_float(0.0) == "0" and exact_float(1.3e-6) == "1.3e-06" and exact_float(1.0) == "1"
    rng = np.random.default_rng(1)
    for x in np.concatenate([rng.random(300) * 10.0 ** rng.integers(-40, 30, 300),
                             np.nextafter(np.round(rng.random(50), 4), 1.0)]):
        assert float(ceil_float(float(x))) >= x


def _typed_back(a, e, report):
    """Each "atol=X (with rtol=Y)" of a failure text, used as the arguments it names (with
    allow_vacuous=True where the text says the bound needs it)."""
    advice = ADVICE_FULL.findall(str(report))
    assert advice, str(report)
    return [compare(a, e, tolerance=Tolerance(source="argument", allow_vacuous=bool(vac),
                                              **{n: float(v), o: float(ov)})).passed
            for n, v, o, ov, vac in advice]


def test_smallest_passing_tolerance_passes_as_printed_on_a_large_output():
    """The issue's case in small: the greatest difference needs more digits than 3."""
    rng = np.random.default_rng(7)
    e = rng.standard_normal(200_000).astype(np.float32)
    a = e + (rng.standard_normal(e.size) * 0.01).astype(np.float32)
    report = compare(a, e, tolerance=Tolerance(1e-6, 1e-6, source="argument"))
    assert _typed_back(a, e, report) == [True, True]
    # some |expected| is ~1e-5 there: the rtol that passes is > 1, and said to be vacuous
    assert re.search(r"rtol=\S+ \(with atol=1e-06; vacuous: needs allow_vacuous=True\)", str(report))


def test_a_float64_minimum_rtol_passes_as_printed():
    """1.423015351387204e-14 was printed as 1.42e-14 and, used to 16 digits, failed by one
    ulp: the printed value is rounded up past the arithmetic's rounding."""
    e = np.array([0.7, 0.3, -1.9])
    a = e * (1 + np.array([1.423015351387204e-14, 1e-15, -2e-15]))
    (oc,) = compare(a, e, tolerance=Tolerance(1e-15, 0.0, source="argument"), full_stats=True).outputs
    assert oc.min_rtol is not None and oc.min_rtol >= 1.4e-14
    assert compare(a, e, tolerance=Tolerance(oc.min_rtol, 0.0, source="t")).passed
    assert _typed_back(a, e, compare(a, e, tolerance=Tolerance(1e-15, 0.0, source="argument"))) == [True, True]


def test_smallest_passing_tolerance_of_a_scaled_rule_is_the_argument_that_passes():
    """An explicit atol= is the plain rule (no scale term): the advice under the scaled
    default is the atol that passes as an argument, not the part above the scale term."""
    e = np.linspace(-1, 1, 50).astype(np.float32)
    a = e.copy()
    a[10] += 0.01
    report = compare(a, e, tolerance=Tolerance(1.3e-6, 0.0, scale=4e-4, source="built-in"))
    assert _typed_back(a, e, report) == [True, True]
    atol = float(ADVICE.findall(str(report))[0][1])
    assert 0.01 <= atol < 0.0101


# -- integers: exact, and exact arithmetic ---------------------------------------------------

@pytest.mark.parametrize("dtype,actual,expected,diff", [
    (np.int64, 2 ** 53, 2 ** 53 + 1, "1"),
    (np.uint64, 2 ** 64 - 1, 2 ** 64 - 2, "1"),
    (np.int64, -2 ** 63, 2 ** 63 - 1, "1.84e+19"),
])
def test_integer_differences_are_exact(dtype, actual, expected, diff):
    """float64 arithmetic said "Greatest absolute difference: 0" (and suggested atol=0)."""
    a, e = np.array([5, actual], dtype), np.array([5, expected], dtype)
    with pytest.raises(ParityError) as excinfo:
        assert_outputs_close(a, e)
    text = text_of(excinfo)
    assert f"Greatest absolute difference: {diff} at index (1,)" in text
    assert "Smallest passing tolerance" not in text
    assert f"Worst (index actual vs expected): (1,) {actual} vs {expected}" in text


def test_int64_against_uint64_is_exact_too():
    (oc,) = compare(np.array([-1], np.int64), np.array([2 ** 64 - 1], np.uint64)).outputs
    assert oc.mismatched == 1 and oc.max_abs == float(2 ** 64)
    assert compare(np.array([2 ** 62], np.int64), np.array([2 ** 62], np.uint64)).passed


def test_an_explicit_tolerance_does_not_apply_to_integers_and_the_report_says_so():
    """Decided: integers compare exactly whatever rtol/atol (an id off by one is another
    answer); resolve_tolerance's docstring and the report say so, and no atol is suggested."""
    assert "compare`` judges integer and bool" in " ".join(resolve_tolerance.__doc__.split())
    with pytest.raises(ParityError) as excinfo:
        assert_outputs_close(np.array([1, 2, 3]), np.array([1, 2, 5]), atol=2)
    text = text_of(excinfo)
    assert "Tolerance: exact (int64 values compare exactly; rtol=0, atol=2" in text
    assert "applies to floating outputs only" in text
    assert "Smallest passing tolerance" not in text
    # the same tolerance still judges the float output beside it
    report = assert_outputs_close({"p": np.array([0.5, 0.9]), "id": np.array([1, 2])},
                                  {"p": np.array([0.6, 1.0]), "id": np.array([1, 2])}, atol=0.2)
    assert report.passed


def test_integer_against_float_is_not_compared_and_says_how_to():
    oc = only(compare(np.array([1, 2], np.int32), np.array([1.0, 2.0], np.float32)))
    assert not oc.passed and "dtype differs" in oc.problem and ".astype(np.float32)" in oc.problem


# -- dtypes that compare exactly ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["m8[ns]", "M8[ns]", "m8[s]"])
def test_identical_datetime_and_timedelta_dtypes_compare_their_values(dtype):
    a = np.array([1, 2, 3], dtype)
    assert assert_outputs_close(a, a.copy()).passed
    b = a.copy()
    b[2] = np.array(7, dtype)
    oc = only(compare(a, b))
    assert not oc.passed and oc.problem is None and oc.mismatched == 1 and oc.worst[0][0] == (2,)


def test_nat_equals_nat_only_with_equal_nan():
    a = np.array(["NaT", 1], "m8[ns]")
    assert not compare(a, a.copy()).passed
    assert compare(a, a.copy(), equal_nan=True).passed


def test_record_dtypes_compare_field_by_field_each_by_its_own_rule():
    rec = np.dtype([("score", "f4"), ("label", "i4")])
    e = np.array([(0.5, 1), (0.25, 2)], rec)
    assert assert_outputs_close(e, e.copy()).passed
    a = e.copy()
    a["score"] += np.float32(1e-7)                   # float noise: within the float rule
    report = compare(a, e)
    assert report.passed and [o.path for o in report.outputs] == ["['score']", "['label']"]
    a["label"][1] = 3
    (bad,) = compare(a, e).failed
    assert bad.path == "['label']" and bad.mismatched == 1
    other = np.zeros(2, [("score", "f4"), ("id", "i4")])
    assert "differs" in only(compare(other, e)).problem


def test_identical_unstructured_void_dtypes_compare_their_bytes():
    a = np.array([b"ab", b"cd"], "V2")
    assert compare(a, a.copy()).passed
    b = np.array([b"ab", b"ce"], "V2")
    assert only(compare(a, b)).mismatched == 1


# -- torch tensors, without importing torch ---------------------------------------------------

class _TorchLikeParameter:
    """What the engine relies on of a ``torch.nn.Parameter`` (torch is not installed here:
    its PyPI wheel pulls in the CUDA libraries, gigabytes): ``numpy()`` and ``__array__``
    raise like torch's on a tensor that requires grad; ``detach().cpu()`` gives one that
    does not."""

    def __init__(self, values, requires_grad=True):
        self._values = np.asarray(values)
        self.requires_grad = requires_grad
        self.dtype = f"torch.{self._values.dtype.name}"

    def _refuse(self):
        if self.requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. "
                               "Use tensor.detach().numpy() instead.")

    def numpy(self):
        self._refuse()
        return self._values

    def __array__(self, dtype=None, copy=None):
        self._refuse()
        return self._values if dtype is None else self._values.astype(dtype)

    def detach(self):
        return _TorchLikeParameter(self._values, requires_grad=False)

    def cpu(self):
        return self


def test_a_tensor_that_requires_grad_is_detached_not_a_raw_runtime_error():
    param = _TorchLikeParameter(np.array([1.0, 2.0], np.float32))
    with pytest.raises(RuntimeError):
        np.asarray(param)                             # what the engine used to do
    assert is_torch_like(param) and as_numpy(param).dtype == np.float32
    assert assert_outputs_close(param, np.array([1.0, 2.0], np.float32)).passed
    assert compare({"w": param}, {"w": np.array([1.0, 2.0], np.float32)}).passed
    scalar = _TorchLikeParameter(np.array(2.0, np.float32))
    (oc,) = compare(2.0, scalar).outputs               # a Python scalar takes the tensor's dtype
    assert oc.passed and oc.actual_dtype == oc.expected_dtype == "float32"
    with pytest.raises(ParityError, match="Mismatched elements: 1 / 2"):
        assert_outputs_close(param, np.array([1.0, 2.5], np.float32))


def test_real_torch_parameter_bfloat16_and_conjugate():
    torch = pytest.importorskip(
        "torch", reason="torch is not installed: its PyPI wheel (with the CUDA libraries it "
                        "depends on) is gigabytes; `pip install torch` to run this test")
    param = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    assert assert_outputs_close(param, np.array([1.0, 2.0], np.float32)).passed
    bf = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    assert as_numpy(bf).dtype.name == "bfloat16" and as_numpy(bf).astype(float).tolist() == [1.5, -2.0]
    z = torch.tensor([1 + 2j]).conj()
    assert as_numpy(z).tolist() == [1 - 2j]


# -- structures: the same answer from compare() and the assertion ------------------------------

def test_tuple_of_numpy_scalars_against_list_of_0d_arrays():
    actual = (np.float32(1.0), np.float32(2.0))
    expected = [np.array(1.0, np.float32), np.array(2.0, np.float32)]
    assert compare(actual, expected).passed
    assert assert_outputs_close(actual, expected).passed
    wrong = [np.array(1.0, np.float32), np.array(2.5, np.float32)]
    assert [o.path for o in compare(actual, wrong).failed] == ["[1]"]
    with pytest.raises(ParityError) as excinfo:
        assert_outputs_close(actual, wrong)
    assert [o.path for o in excinfo.value.report.failed] == ["[1]"]


def test_no_broadcasting_and_the_readme_says_so():
    """numpy.testing broadcasts a scalar against an array; the engine does not (a model
    output of the wrong shape is a bug, not a shorthand)."""
    oc = only(compare(np.ones(3, np.float32), np.float32(1.0)))
    assert not oc.passed and oc.problem == "shape differs: actual (3,), expected ()"
    with pytest.raises(ParityError, match="shape differs"):
        assert_outputs_close(np.ones((2, 3)), np.ones(3))
    section = README.read_text().split("## How this compares with numpy and torch.testing", 1)[1]
    section = section.split("\n## ", 1)[0]
    for point in ("no broadcasting", "vacuous", "integer or bool outputs", "strings", "rtol=1e39",
                  "torch.nn.Parameter", "Smallest passing tolerance"):
        assert point in section, point


# -- through the plugin: a marker tolerance meets an integer output -----------------------------

CLASSIFIER_CONFTEST = textwrap.dedent('''
    import pytest

    @pytest.fixture(scope="session")
    def modelparity_source():
        import keras
        x = keras.Input((6,), name="x")
        logits = keras.layers.Dense(3, name="logits",
                                    kernel_initializer=keras.initializers.GlorotUniform(seed=2))(x)
        return keras.Model(x, {"logits": logits, "ids": keras.ops.argmax(logits, axis=-1)},
                           name="classifier")
''')


@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
def test_marker_tolerance_on_an_integer_output_through_the_plugin(pytester):
    """A classifier's logits and class ids under a marker atol: the atol judges the logits,
    the ids stay exact and the report says the atol did not apply to them; an rtol too
    large for float32 still fails ones against zeros."""
    pytester.makeconftest(CLASSIFIER_CONFTEST)
    pytester.makepyfile(test_ids=textwrap.dedent('''
        import numpy as np
        import pytest
        from pytest_modelparity import assert_outputs_close

        pytestmark = pytest.mark.modelparity(formats=["saved_model"], atol=1e-4)

        def test_export(parity_candidate, parity_reference, parity_batch):
            assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)

        def test_one_id_off_by_one(parity_candidate, parity_reference, parity_batch):
            out = parity_candidate.predict(parity_batch)
            ids = np.asarray(out["ids"]).copy()
            ids[0] = (ids[0] + 1) % 3
            assert_outputs_close({"logits": out["logits"] + 5e-5, "ids": ids},
                                 parity_reference.predict(parity_batch))

        @pytest.mark.modelparity(rtol=1e39)
        def test_huge_rtol_against_zeros():
            assert_outputs_close(np.ones(4, np.float32), np.zeros(4, np.float32))
    '''))
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-report=r.json")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "*int* values compare exactly; rtol=0, atol=0.0001 (*marker) applies to floating outputs only*",
        "*Mismatched elements: 4 / 4*"])
    rows = json.loads((pytester.path / "r.json").read_text())["rows"]
    off = {r["output"]: r for r in rows if r["nodeid"].endswith("test_one_id_off_by_one[saved_model-cpu]")}
    assert off["['ids']"]["verdict"] == "fail" and off["['ids']"]["max_abs"] == 1.0
    assert off["['ids']"]["min_atol"] is None                  # no tolerance applies to ids
    assert off["['logits']"]["verdict"] == "pass"             # the marker's atol judged them


def test_an_atol_beyond_float32_never_lets_an_infinity_pass():
    """Found by Hypothesis: atol=1e39 rounded to inf in float32 arithmetic, and inf - 0 <= inf
    let an infinite output pass against 0. Bounds beyond float32 are judged in float64."""
    from pytest_modelparity.verdict.compare import compare
    from pytest_modelparity.verdict.tolerances import Tolerance

    for dtype in (np.float16, np.float32):
        (oc,) = compare(np.array(np.inf, dtype), np.array(0.0, dtype), tolerance=Tolerance(0.0, 1e39)).outputs
        assert not oc.passed
