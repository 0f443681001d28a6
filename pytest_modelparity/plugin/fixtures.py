"""The plugin's fixtures: what a suite overrides (``modelparity_source``, its options, its rows)
and what it receives (``parity_reference``, ``parity_candidate``, ``parity_batch``), all served by
the session's ``ParitySession`` (``session.py``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from .matrix import marker_names
from .options import RECORDED_PREFIX
from .session import BATCH_SEED, BATCH_SIZE, ParitySession, get_state


# -- fixtures ---------------------------------------------------------------------------
# parity_reference/candidate/batch are module-scoped on purpose: a session-scoped fixture is
# computed once for the whole session even when another directory's conftest overrides
# modelparity_source, so two example suites would share the first one's model. Module scope
# re-reads the (directory's) source per module; the models themselves are still built,
# exported and loaded once per session by ParitySession. Not function scope: Hypothesis'
# function_scoped_fixture health check would refuse @given tests using them.

@pytest.fixture(scope="session")
def modelparity_source(request: pytest.FixtureRequest) -> Any:
    """Override in conftest.py (session scope) to return a Keras model, a factory or a path.

    The default returns ``--modelparity-model`` when given.
    """
    model = get_state(request.config).options.model
    if model:
        return model
    pytest.fail(
        "modelparity: no model to test. Define a session-scoped fixture in conftest.py:\n\n"
        "    @pytest.fixture(scope='session')\n"
        "    def modelparity_source():\n"
        "        return build_my_keras_model()   # or a factory, or a path such as 'model.keras'\n\n"
        "or pass --modelparity-model=PATH|module:factory|demo", pytrace=False)


@pytest.fixture(scope="session")
def modelparity_load_options() -> dict:
    """Override in conftest.py (session scope) to return keyword options for ``load_model``.

    They are used wherever the source itself is loaded: the reference, the candidate of the
    source's own format, and a ``.keras``/``.h5`` source read to export it. A frozen ``.pb``
    or TF1 checkpoint whose tensors cannot be found automatically wants
    ``{"inputs": ["x:0"], "outputs": ["predictions:0"]}``. Default: no options.
    """
    return {}


@pytest.fixture(scope="session")
def modelparity_input_specs() -> Any:
    """Override in conftest.py (session scope) to declare the inputs of a subclassed Keras
    model that was never built or called (one that was knows them already):
    ``[(name, shape, dtype)]`` with the batch dim first (``[("x", (None, 5), "float32")]``),
    ``tf.TensorSpec``s, or ``{name: (shape, dtype)}`` when ``call`` takes a dict. They name
    the inputs of every exported form. Default None (functional models have their own).
    """
    return None


@pytest.fixture(scope="session")
def modelparity_export_options() -> dict:
    """Override in conftest.py (session scope) to pass options to the converters:
    ``{format: {option: value}}``, e.g. ``{"onnx": {"opset": 18}, "tflite": {"supported_ops":
    ["TFLITE_BUILTINS"]}}``; a key ``"tflite:int8"`` applies to that variant only and wins
    over ``"tflite"``. They reach ``export_model(..., converter_options=...)`` and are part
    of the export cache key. Default: none (docs/formats.md lists each converter's options).
    """
    return {}


def converter_options_for(export_options: dict, format: str) -> dict | None:
    """The converter options of ``format`` (``tflite:int8`` falls back to ``tflite``)."""
    base = format.split(":", 1)[0]
    found = export_options.get(format, export_options.get(base))
    return dict(found) if found else None


@pytest.fixture(scope="session")
def modelparity_device(request: pytest.FixtureRequest) -> str:
    """The device this test runs on (parametrized by ``--modelparity-device`` and the marker)."""
    return getattr(request, "param", "cpu")


@pytest.fixture(scope="session")
def modelparity_format(request: pytest.FixtureRequest) -> str:
    """The export format of ``parity_candidate`` (parametrized by ``--modelparity-formats``)."""
    if not hasattr(request, "param"):
        pytest.fail("modelparity_format is parametrized by the plugin; it cannot be used here", pytrace=False)
    return request.param


@pytest.fixture(scope="session")
def modelparity_reference_device(request: pytest.FixtureRequest, modelparity_device: str) -> str:
    """The device ``parity_reference`` runs on: ``--modelparity-reference-device`` when given
    (e.g. ``cpu`` while the candidates run on ``gpu``), else ``modelparity_device``."""
    return get_state(request.config).reference_device(modelparity_device)


@pytest.fixture(scope="module")
def parity_reference(request: pytest.FixtureRequest, modelparity_source: Any, modelparity_reference_device: str,
                     modelparity_load_options: dict, modelparity_input_specs: Any) -> Any:
    """The source as a ``LoadedModel`` on ``modelparity_reference_device`` (built once per
    session): the candidate's device unless ``--modelparity-reference-device`` says otherwise."""
    state = get_state(request.config)
    state.declare_input_specs(modelparity_source, modelparity_input_specs)
    reference = state.reference_or_skip(modelparity_source, modelparity_reference_device, modelparity_load_options)
    _mark(state, reference, modelparity_source, modelparity_load_options, None, modelparity_reference_device)
    return reference


def _mark(state: ParitySession, model: Any, source: Any, load_options: dict, form: str | None, device: str) -> None:
    """Tag a served model with what it is a form of, when the run records or compares (record.py)."""
    if state.recorder is None and state.against is None:
        return
    from .record import mark_origin

    src = state.source(source, dict(load_options or {}).get("format"))
    mark_origin(model, src, src.label, form or str(getattr(model, "format", "reference")), device)


@pytest.fixture(scope="module")
def parity_candidate(request: pytest.FixtureRequest, modelparity_source: Any, modelparity_format: str,
                     modelparity_device: str, modelparity_load_options: dict,
                     modelparity_export_options: dict, modelparity_elements: Any,
                     modelparity_input_specs: Any, modelparity_dataset: Any, modelparity_bind: Any) -> Any:
    """The source exported to ``modelparity_format`` (cached), loaded on the device, and bound to
    the reference: fed and answering by the reference's tensor names (formats/binding.py)."""
    state = get_state(request.config)
    if modelparity_format.startswith(RECORDED_PREFIX):
        return _recorded_candidate(request, modelparity_format[len(RECORDED_PREFIX):], modelparity_device)
    state.declare_input_specs(modelparity_source, modelparity_input_specs)
    candidate = state.candidate_or_skip(modelparity_source, modelparity_format, modelparity_device,
                                        named=_formats_named(request, state, modelparity_format), load_options=modelparity_load_options,
                                        converter_options=converter_options_for(modelparity_export_options,
                                                                                modelparity_format),
                                        elements=modelparity_elements, dataset=modelparity_dataset,
                                        bind=bind_for(modelparity_bind, modelparity_format))
    reference_device = state.reference_device(modelparity_device)

    def floor_reference() -> Any:
        """The session's reference, whose twin measures the floor of a candidate-only check
        (``assert_batch_invariant``) on a candidate with no TensorFlow graph of its own."""
        return state.reference(modelparity_source, reference_device, modelparity_load_options)

    with contextlib.suppress(AttributeError):
        candidate.floor_reference = floor_reference
    _mark(state, candidate, modelparity_source, modelparity_load_options, modelparity_format, modelparity_device)
    from ..checks import quant_rows, quantized

    if quantized.variant_of(candidate) is not None:  # a decision over rows draws the rows it needs
        with contextlib.suppress(AttributeError):
            candidate.judging_rows = quant_rows.JudgingRows(floor_reference, modelparity_dataset, modelparity_elements)
    return candidate


def _recorded_candidate(request: pytest.FixtureRequest, folder: str, device: str) -> Any:
    """``recorded:FOLDER`` in the matrix: the recording made elsewhere, answering the inputs it
    recorded (a plugin recording of the same model holds the seeded ``parity_batch``)."""
    from pathlib import Path

    from ..errors import ModelLoadError
    from ..formats import load_model

    path = Path(folder).expanduser()
    path = path if path.is_absolute() else Path(request.config.invocation_params.dir) / path
    try:
        return load_model(path, "recorded", device=device)
    except ModelLoadError as exc:
        pytest.fail(f"modelparity: format recorded:{folder}: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def modelparity_bind() -> Any:
    """Override in conftest.py (session scope) to name which tensor is which where no rule can
    tell (formats/binding.py): ``{"outputs": {reference name: candidate name}}`` (and/or
    ``"inputs"``) for every format, or ``{format: {...}}`` per format (a key ``"tflite:int8"``
    wins over ``"tflite"``). Default: none; the plugin pairs by name, converter naming, the
    export record, shape and dtype, then values, and refuses what none of them settles."""
    return None


def bind_for(bind: Any, format: str) -> dict | None:
    """The ``modelparity_bind`` mapping that applies to ``format``."""
    if not bind:
        return None
    if not isinstance(bind, dict) or not all(isinstance(v, dict) for v in bind.values()):
        raise pytest.UsageError(f"modelparity_bind returned {bind!r}; return {{'outputs': {{reference name: "
                                "candidate name}}}} or {format: {'outputs': {...}}}")
    if set(bind) <= {"inputs", "outputs"}:
        return bind
    base = format.split(":")[0]
    chosen = bind.get(format, bind.get(base))
    return dict(chosen) if chosen else None


def _formats_named(request: pytest.FixtureRequest, state: ParitySession, fmt: str) -> bool:
    """Whether the user chose this format (option, ini or the test's marker). The test's own
    marker: ``request.node`` of this module-scoped fixture is the module, whose markers never
    hold a test's ``formats=`` (a format the marker named skipped as if nobody had)."""
    node = getattr(request, "_pyfuncitem", None) or request.node
    return state.options.format_named(fmt) or marker_names(node.get_closest_marker("modelparity"), fmt)


@pytest.fixture(scope="session")
def modelparity_elements(request: pytest.FixtureRequest) -> Any:
    """Override in conftest.py (session scope) to return the element range of your batches:
    ``(low, high)`` or ``{input name: (low, high)}`` (e.g. ``(0, 255)`` for raw pixels).

    One source of truth for input ranges: ``parity_batch`` draws from it, a ``tflite:int8``
    candidate is calibrated on rows drawn from it, and your own ``batches(parity_reference,
    elements=modelparity_elements)`` should too. Default: ``--modelparity-input-range`` (ini
    ``modelparity_input_range``), else None: each dtype's default range.
    """
    return get_state(request.config).options.input_range


@pytest.fixture(scope="session")
def modelparity_dataset(request: pytest.FixtureRequest) -> Any:
    """Override in conftest.py (session scope) to return real rows: an array, a tuple of arrays
    (one per input), a dict by input name, an ``.npz`` path, a ``tf.data.Dataset`` or an
    iterable of batches (``dataset.py``). They feed a ``tflite:int8`` candidate's calibration
    (the first rows), ``parity_batch`` (up to 64 rows after those), the rows a quantised
    verdict draws when its batch is too small to decide (``checks/quant_rows.py``) and
    ``strategies.dataset_batches``. Default: ``--modelparity-data=PATH.npz``, else None
    (random rows, and an int8 calibration the report calls default rows).
    """
    return get_state(request.config).options.data


@pytest.fixture(autouse=True)
def modelparity_warmup(request: pytest.FixtureRequest) -> None:
    """A ``@given`` test with the plugin's models: their one-time work (first runs, the twin) is
    done here, at set-up, so every example costs the same under Hypothesis' default deadline.
    Other tests pay nothing."""
    function = getattr(request, "function", None)
    names = request.fixturenames
    if not getattr(function, "is_hypothesis_test", False) or not {"parity_reference", "parity_candidate"} & set(names):
        return
    from ..checks.warm import warm

    reference = request.getfixturevalue("parity_reference") if "parity_reference" in names else None
    candidate = request.getfixturevalue("parity_candidate") if "parity_candidate" in names else None
    if reference is None and candidate is None:
        return
    import numpy as np

    from ..checks.strategies import seeded_batch

    drawn = seeded_batch(reference if reference is not None else candidate, batch_size=1, seed=BATCH_SEED,
                         elements=request.getfixturevalue("modelparity_elements"))
    try:
        warm(reference, [candidate] if candidate is not None else [], {k: np.array(v) for k, v in drawn.items()})
    except Exception:  # noqa: BLE001 - a model that cannot run fails in the test itself, with its cause
        pass
    _timings_left_to_the_machine(function)


def _timings_left_to_the_machine(test: Any) -> None:
    """Where a ``@given`` test with the plugin's models keeps the active profile's deadline and
    health checks, drop the deadline and the ``too_slow`` check for it (as Hypothesis' own ``ci``
    profile does): a real model's example takes what the machine gives it, and on a busy one a
    process waits seconds for a core (measured: a 1-row example 294 ms, one draw 3.4 s at load 8).
    A deadline or health checks the user set differently from the profile are kept."""
    from hypothesis import HealthCheck, settings

    current = getattr(test, "_hypothesis_internal_use_settings", None)
    if not isinstance(current, settings):
        return
    profile = settings.default
    if profile is None:
        return
    changes: dict[str, Any] = {}
    if current.deadline is not None and current.deadline == profile.deadline:
        changes["deadline"] = None
    checks = list(current.suppress_health_check)
    if HealthCheck.too_slow not in checks and checks == list(profile.suppress_health_check):
        changes["suppress_health_check"] = [*checks, HealthCheck.too_slow]
    if changes:
        test._hypothesis_internal_use_settings = settings(current, **changes)


@pytest.fixture(scope="module")
def parity_batch(parity_reference: Any, modelparity_elements: Any, modelparity_dataset: Any) -> Any:
    """A seeded batch (size 4) fitting the reference's inputs, or up to 64 rows of
    ``modelparity_dataset`` (not those an int8 candidate calibrated on); read-only (shared)."""
    import numpy as np

    from ..checks.dataset import as_dataset
    from ..checks.strategies import Batch, seeded_batch, specs_of

    data = as_dataset(modelparity_dataset)
    if data is not None:
        batch = Batch({k: np.array(v) for k, v in data.batch(specs_of(parity_reference)).items()})
    else:
        batch = seeded_batch(parity_reference, batch_size=BATCH_SIZE, seed=BATCH_SEED, elements=modelparity_elements)
    for arr in batch.values():
        arr.setflags(write=False)
    return batch
