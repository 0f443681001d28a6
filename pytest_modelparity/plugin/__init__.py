"""pytest plugin entry point: wires options, fixtures, marker, reports and zero-code mode.

Only wiring lives here; each concern has its module (options, fixtures, matrix, strategies,
zero_code, summary, html_report). Nothing imported at module level imports TensorFlow, so
``pytest --help`` and test runs that never touch a model stay fast.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from ..reports import recording
from ..errors import DatasetMismatch, NotApplicable, ParityError
from .fixtures import (modelparity_bind, modelparity_device,  # noqa: F401 - fixtures
                       modelparity_dataset, modelparity_elements, modelparity_export_options, modelparity_format,
                       modelparity_input_specs, modelparity_load_options,
                       modelparity_reference_device, modelparity_source, parity_batch, parity_candidate,
                       parity_reference, modelparity_warmup)
from .session import STATE_KEY, ParitySession, get_state
from .matrix import (item_matrix, left_out_line, matrix_pairs, nothing_compared_line, nothing_on_gpu_line,
                     select_matrix)
from .not_compared import (as_json, item_itself, item_model, named_by, not_compared, not_compared_lines,
                           self_comparison_skip)
from .options import add_options, parse_options, strict_gpu_problem
# Imported here, not when a failure is reported: a report made short of memory must not need
# an import (CI saw `from .scope_hint import ...` raise MemoryError under `ulimit -v`).
from .scope_hint import scope_mismatch_message
from ..runtime.resources import AddressSpaceReserve, address_space_limit, memory_hint

MARKER = ("modelparity(formats=None, devices=None, rtol=None, atol=None, quant_budget=None, class_scores=None, "
          "top_k=1): narrow the format x device matrix of this test and set its tolerance (above the ini value, "
          "below explicit arguments); quant_budget={'int8': {'top1': 0.9}} loosens what quantisation may cost; "
          "class_scores=True (or output names) judges those quantised outputs by top-k agreement (docs/tolerances.md)")
# What the marker takes: anything else (a typo such as rtl=) is a usage error, not ignored.
MARKER_KEYS = ("formats", "devices", "rtol", "atol", "quant_budget", "class_scores", "top_k")
_ROWS_KEY = "modelparity_rows"
# Rows the terminal summary shows without -v before it keeps only the failures.
SUMMARY_ROWS = 40


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


# Under `ulimit -v`: room for pytest to report and tear down a test that used up the rest.
_RESERVE = AddressSpaceReserve()


@pytest.hookimpl(tryfirst=True)  # before Hypothesis' own hook loads --hypothesis-profile=modelparity
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    _RESERVE.hold()
    from ..checks.strategies import register_profile

    register_profile()
    if config.option.help:
        return  # never refuse to show help because of a bad ini value
    options = parse_options(config)
    if options.model:
        from .zero_code import check_source

        check_source(options.model, Path(config.invocation_params.dir))
    if getattr(config, "workerinput", None) is None:  # the xdist controller (or a plain run) checks once
        problem = strict_gpu_problem(options)
        if problem:
            raise pytest.UsageError(f"modelparity: {problem}. --modelparity-strict makes a missing device a "
                                    "failure; without it the tests that need the GPU skip with this reason.")
    if options.report or options.html:  # imported now: at the end, short of memory, an import can fail
        import importlib

        for name in ("summary", "html"):
            importlib.import_module(f"..reports.{name}", __package__)
    if options.trust_models:  # read by the loaders here and in the export process (formats/tensorflow/trust.py)
        config.stash[_TRUST_BEFORE] = os.environ.get(TRUST_ENV)
        os.environ[TRUST_ENV] = "1"
    state = config.stash[STATE_KEY] = ParitySession(options, logs=_log_sink(config, options))
    if options.power:
        from ..checks.power import COST

        COST.reset()  # this session's cost (a pytester run inside another one counts its own)
    config.pluginmanager.register(OutcomeRecorder(state), "modelparity-outcomes")
    from . import status

    config.stash[_STATUS] = status.start(config)  # a line per long step (exports, Node.js), not under -q
    if options.record is not None or options.against is not None:
        from .record import watch_run

        watch_run(config, state)
    from ..exports import floor_cache

    # measured noise floors are kept beside the exports (docs/cache.md); --modelparity-no-cache keeps none
    config.stash[_FLOOR_BEFORE] = floor_cache.use(options.cache_dir if options.cache else None)


def _shows_logs(config: pytest.Config) -> bool:
    return int(getattr(config.option, "verbose", 0) or 0) >= 1


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Before any conftest imports TensorFlow: its C++ INFO/WARNING lines off unless -v."""
    from ..runtime.quiet import quiet_tensorflow

    verbose = getattr(early_config.known_args_namespace, "verbose", 0) or 0
    quiet_tensorflow(show=int(verbose) >= 1)


def _log_sink(config: pytest.Config, options: Any) -> Any:
    """TF/converter output of builds, exports and loads: ``<cache dir>/logs/<worker>.log``
    (with --modelparity-no-cache, which must leave no cache dir: a folder in the temp dir)."""
    import tempfile

    from ..runtime.quiet import LogSink

    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    if options.cache:
        root: Path | None = Path(options.cache_dir)
        folder = Path(options.cache_dir) / "logs"
    else:
        root, folder = None, Path(tempfile.gettempdir()) / f"modelparity-logs-{os.getuid() if hasattr(os, 'getuid') else 0}"
    return LogSink(folder / f"{worker}.log", root=root, show=_shows_logs(config))


_FLOOR_BEFORE = pytest.StashKey[Any]()  # the floor cache of a session around this one (pytester)
_TRUST_BEFORE = pytest.StashKey[Any]()  # MODELPARITY_TRUST_MODELS before --modelparity-trust-models set it
_STATUS = pytest.StashKey[Any]()  # the session's status.TerminalStatus (None in an xdist worker)
# formats/tensorflow/trust.TRUST_ENV, spelled here: importing that module at start-up would import numpy
TRUST_ENV = "MODELPARITY_TRUST_MODELS"


def pytest_unconfigure(config: pytest.Config) -> None:
    if _STATUS in config.stash:
        from . import status

        status.stop(config.stash[_STATUS])
    if _TRUST_BEFORE in config.stash:
        before = config.stash[_TRUST_BEFORE]
        if before is None:
            os.environ.pop(TRUST_ENV, None)
        else:
            os.environ[TRUST_ENV] = before
    state = config.stash.get(STATE_KEY, None)
    if state is not None:
        state.close()
        from ..exports import floor_cache

        floor_cache.restore(config.stash.get(_FLOOR_BEFORE, None))


# -- parametrization --------------------------------------------------------------------

def _already_parametrized(metafunc: pytest.Metafunc, name: str) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if name in names:
            return True
    return False


def check_marker(marker: Any, where: str) -> None:
    """Fail the test (at collection) whose ``modelparity`` marker takes an argument the plugin
    does not know, or positional ones, naming the known arguments; checks ``class_scores``/``top_k``."""
    if marker is None:
        return
    unknown = [k for k in marker.kwargs if k not in MARKER_KEYS]
    if unknown or marker.args:
        what = (f"unknown argument(s) {', '.join(map(repr, unknown))}" if unknown
                else f"positional argument(s) {marker.args!r}")
        pytest.fail(f"{where}: @pytest.mark.modelparity got {what}; it takes {', '.join(MARKER_KEYS)} "
                    "(as keywords, e.g. rtol=1e-4)", pytrace=False)
    if "class_scores" in marker.kwargs or "top_k" in marker.kwargs:
        from ..checks.quantized import check_class_scores
        from ..errors import InvalidArgumentError

        try:
            check_class_scores(marker.kwargs.get("class_scores"), marker.kwargs.get("top_k", 1), "marker")
        except InvalidArgumentError as exc:
            pytest.fail(f"{where}: @pytest.mark.modelparity: {exc}", pytrace=False)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    check_marker(metafunc.definition.get_closest_marker("modelparity"), metafunc.definition.nodeid)
    names = metafunc.fixturenames
    wants = [n for n in ("modelparity_format", "modelparity_device") if n in names
             and not _already_parametrized(metafunc, n)]
    if not wants:
        return
    state = get_state(metafunc.config)
    marker = metafunc.definition.get_closest_marker("modelparity")
    formats, devices = select_matrix(state, marker, metafunc.definition.nodeid)
    if len(wants) == 2 and formats and devices:
        # Both axes: parametrized as pairs, so a CPU-only format never meets a GPU.
        pairs = matrix_pairs(state, formats, devices)
        if pairs:
            metafunc.parametrize(",".join(wants), pairs, indirect=True, scope="session",
                                 ids=[f"{f}-{state.matrix_id(d)}" for f, d in pairs])
        else:
            reason = (f"modelparity: {', '.join(formats)} run on the CPU only; none of this test's formats "
                      f"runs on {', '.join(devices)}")
            metafunc.parametrize(",".join(wants), [pytest.param(None, None, marks=pytest.mark.skip(reason=reason),
                                                                id="none")], indirect=True, scope="session")
        return
    for name, values, what in (("modelparity_format", formats, "--modelparity-formats"),
                               ("modelparity_device", devices, "--modelparity-device")):
        if name not in wants:
            continue
        if values:
            ids = [state.matrix_id(v) if name == "modelparity_device" else str(v) for v in values]
            metafunc.parametrize(name, values, indirect=True, scope="session", ids=ids)
        else:
            reason = (f"modelparity: the marker's {name.split('_')[1]}s are not among those selected by "
                      f"{what} ({', '.join(state.options.formats if 'format' in name else state.options.devices)})")
            metafunc.parametrize(name, [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="none")],
                                 indirect=True, scope="session")


# -- running a test: tolerance layers and report collection -----------------------------

def _layers(item: pytest.Item, state: ParitySession) -> list[tuple]:
    layers = []
    marker = item.get_closest_marker("modelparity")
    if marker is not None and (marker.kwargs.get("rtol") is not None or marker.kwargs.get("atol") is not None):
        layers.append(("marker", marker.kwargs.get("rtol"), marker.kwargs.get("atol")))
    if state.options.rtol is not None or state.options.atol is not None:
        layers.append(("ini", state.options.rtol, state.options.atol))
    return layers


def _budget_layers(item: pytest.Item, state: ParitySession) -> list[tuple[str, Any]]:
    """Quantisation budgets: the marker's ``quant_budget=`` over the option/ini value."""
    marker = item.get_closest_marker("modelparity")
    layers: list[tuple[str, Any]] = []
    if marker is not None and marker.kwargs.get("quant_budget"):
        layers.append(("marker", marker.kwargs["quant_budget"]))
    if state.options.quant_budget:
        layers.append(("--modelparity-quant-budget/ini", state.options.quant_budget))
    return layers


def _class_scores(item: pytest.Item) -> tuple[Any, int]:
    """The marker's ``class_scores=`` and ``top_k=`` (checked at collection)."""
    marker = item.get_closest_marker("modelparity")
    if marker is None:
        return None, 1
    return marker.kwargs.get("class_scores"), marker.kwargs.get("top_k", 1)


_ACTIVE: list[Any] = []  # listeners of the tests running now, innermost last


@contextlib.contextmanager
def collecting(item: pytest.Item) -> Iterator[None]:
    """Record every ComparisonReport made while the test runs, under its tolerance layers.

    Only the failures the test lets escape are diagnosed for their rows (once, shared with
    the failure text pytest renders); the other failing reports (Hypothesis examples that
    are not the one reported, failures the test caught) keep their rows without hints.
    """
    from ..checks import power, quant_rows, quantized
    from ..verdict import tolerances
    from ..reports.summary import merge_rows, rows_from_report

    state = get_state(item.config)
    fmt, dev = item_matrix(item)
    seen: list[tuple[str, Any]] = []
    raised: list[Any] = []

    def listener(kind: str, report: Any) -> None:
        if _ACTIVE and _ACTIVE[-1] is listener:  # a nested pytest run (pytester) keeps its own
            seen.append((kind, report))

    recording.subscribe(listener)
    _ACTIVE.append(listener)
    try:
        with tolerances.tolerance_layers(_layers(item, state)), tolerances.gpu_tf32(state.options.tf32), \
                quantized.budget_layers(_budget_layers(item, state)), \
                quantized.class_scores(*_class_scores(item), source="marker"), \
                power.planting(state.options.power), \
                quantized.inconclusive_fails(state.options.strict), \
                quant_rows.max_rows_of(state.options.quant_max_rows):
            yield
    except BaseException as exc:
        raised.extend(_escaped_reports(exc))
        raise
    finally:
        recording.unsubscribe(listener)
        _ACTIVE.remove(listener)
        rows = []
        for seq, (kind, report) in enumerate(seen):
            final = any(report is r for r in raised)
            rows.extend(rows_from_report(report, nodeid=item.nodeid, format=fmt, device=dev, kind=kind, seq=seq,
                                         diagnose=final))
            model = item_model(item, state)
            for row in rows:  # the device the reference ran on (the plugin's fixtures put it there)
                row.setdefault("reference_device", state.reference_device(dev) if dev else None)
                row.setdefault("model", model)
            discard = getattr(getattr(report, "hints", None), "discard", None)
            if not final and discard is not None:
                discard()  # nobody reads it now: let its arrays and models go
        merged = merge_rows(rows)
        item.stash[_ITEM_ROWS] = merged
        state.rows.extend(merged)


_ITEM_ROWS = pytest.StashKey[list]()


def _escaped_reports(exc: BaseException) -> list[Any]:
    """The reports of the ParityErrors in ``exc`` (one, or several in an exception group)."""
    found = []
    todo = [exc]
    while todo:
        e = todo.pop()
        report = getattr(e, "report", None) if isinstance(e, ParityError) else None
        if report is not None:
            found.append(report)
        todo.extend(getattr(e, "exceptions", None) or ())
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    state = _state_or_none(item.config)
    itself = self_comparison_skip(item, state) if state is not None else None
    if itself is not None:  # the candidate is the reference's own file: a pass would compare nothing
        raise _skip_at_item(itself)
    with collecting(item):
        try:
            result = yield
        except NotApplicable as exc:
            # pytest would skip it anyway (a unittest.SkipTest), but at a line of its own
            # unittest.py; this keeps the test's location in the -rs line.
            raise _skip_at_item(str(exc)) from None
        finally:
            changed = state.against.take_pending() if state is not None and state.against is not None else []
    if changed:  # --modelparity-against: the test whose form changed fails, as the summary says
        pytest.fail("--modelparity-against: " + "; ".join(changed), pytrace=False)
    return result


def _skip_at_item(reason: str) -> BaseException:
    try:
        return pytest.skip.Exception(reason, _use_item_location=True)
    except TypeError:  # a pytest without the keyword: the skip is the same, only its location differs
        return pytest.skip.Exception(reason)


def _dataset_mismatch(exc: BaseException | None) -> BaseException | None:
    """The ``DatasetMismatch`` behind a failure (raised, or the cause of what was raised)."""
    for _ in range(8):
        if exc is None or isinstance(exc, DatasetMismatch):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: sees the xfail verdict of the skipping plugin
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Any:
    """A test that passed although an assertion failed in it (``pytest.raises``), or an
    xfail test, expected that failure: its rows say so instead of FAIL. A failure for lack of
    memory gets the limit and the fix; pytest running out of memory while it formats the
    traceback gets a short report instead of an INTERNALERROR that ends the session."""
    try:
        report = yield
    except (MemoryError, SystemError) as exc:  # under `ulimit -v`, compile() failing an allocation
        if isinstance(exc, SystemError) and address_space_limit() is None:  # raises "error return
            raise  # without exception set": memory there, a bug anywhere else
        _RESERVE.release()
        report = _short_report(item, call)
    if call.excinfo is not None:
        _RESERVE.release_if_short()  # the rest of this test's protocol needs some
    if call.excinfo is not None and report.failed:
        try:
            hint = memory_hint(call.excinfo.value)
        except MemoryError:
            hint = None
        if hint:
            report.sections.append(("modelparity: out of memory", hint))
    mismatch = _dataset_mismatch(call.excinfo.value) if call.excinfo is not None and report.failed else None
    if mismatch is not None:  # the text is the whole story; the fixtures' traceback buries it
        report.longrepr = str(mismatch)
    state = _state_or_none(item.config)
    if report.failed and state is not None and call.excinfo is not None:  # one cause, said in full once
        again = state.cause_said_before(call.excinfo.value, item.nodeid)
        if again is not None:
            report.longrepr = again
    if report.when == "setup" and report.failed and state is not None and call.excinfo is not None:
        again = state.said_before(call.excinfo.value, item.nodeid)
        if again is not None:  # shown in full at the first test that needed it
            report.longrepr = again
    if report.when == "setup" and report.failed:
        try:
            explained = scope_mismatch_message(report.longreprtext)
        except MemoryError:  # formatting the setup error needed memory there was not
            explained = None
        if explained:  # pytest's bare ScopeMismatch names neither the cause nor the fix
            report.longrepr = explained
    fmt, device = item_matrix(item)
    if device:  # a plain attribute: pytest-xdist carries it to the controller's OutcomeRecorder
        report.modelparity_device = device
    if isinstance(fmt, str) and state is not None:  # what not_compared.py reads, on the controller too
        report.modelparity_format = fmt
        report.modelparity_named_by = named_by(item, state.options)
        report.modelparity_itself = item_itself(item, state)
    if state is not None and report.when in ("setup", "call"):
        model = item_model(item, state)
        if model is not None:  # which model: rows, NOT COMPARED lines and the HTML name it
            report.modelparity_model = model
    if report.when == "call" and (report.passed or hasattr(report, "wasxfail")):
        why = (f"xfail: {report.wasxfail}".rstrip(": ") if hasattr(report, "wasxfail")
               else "the test expected this failure (it caught it, e.g. pytest.raises)")
        for row in item.stash.get(_ITEM_ROWS, []):
            if row["verdict"] == "fail":
                row["verdict"] = "expected"
                row["expected_because"] = why
    return report


# The fixtures a suite overrides: one that raises fails every test that needs it with the same
# error (pytest keeps a session fixture's error), shown in full once and then in one line.
_OVERRIDDEN = ("modelparity_source", "modelparity_dataset", "modelparity_load_options", "modelparity_export_options",
               "modelparity_input_specs", "modelparity_elements", "modelparity_bind")


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> Any:
    try:
        return (yield)
    except Exception as exc:
        state = _state_or_none(request.config)
        if state is not None and fixturedef.argname in _OVERRIDDEN:
            state.remember_error(exc, f"the fixture {fixturedef.argname}")
        raise


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    """Take the address-space reserve again once a test is torn down (it gave it back if it ran short)."""
    _RESERVE.hold()


def _short_report(item: pytest.Item, call: Any) -> pytest.TestReport:
    """The test's report without its traceback (formatting it needed memory there was not)."""
    exc = call.excinfo.value if call.excinfo is not None else None
    what = f"{type(exc).__name__}: {str(exc)[:500]}" if exc is not None else "the test failed"
    text = (f"{what}\n(modelparity: pytest ran out of memory while formatting this failure's traceback, so it is "
            f"left out; the process is short of memory or address space: raise `ulimit -v` or free memory)")
    if call.excinfo is None:
        return pytest.TestReport(item.nodeid, item.location, {}, "passed", None, call.when, [], call.duration,
                                 call.start, call.stop)
    return pytest.TestReport(item.nodeid, item.location, {}, "failed", text, call.when, [], call.duration,
                             call.start, call.stop)


def _state_or_none(config: Any) -> ParitySession | None:
    return config.stash.get(STATE_KEY, None)


class OutcomeRecorder:
    """Remembers each test's outcome for the JSON report (on the xdist controller too,
    where the workers' reports are replayed through the same hook)."""

    def __init__(self, state: ParitySession) -> None:
        self.state = state
        self._models: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        final = report.when == "call" or report.outcome != "passed"
        entry = self.state.tests.setdefault(report.nodeid, {"outcome": "passed"})
        model = getattr(report, "modelparity_model", None)
        if isinstance(model, str):
            self._models[report.nodeid] = model  # the setup's, where a later report has none
            entry["model"] = model
        if not final or entry["outcome"] in ("failed", "error"):
            return
        outcome: str = report.outcome
        if outcome == "failed" and report.when != "call":
            outcome = "error"
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        entry["outcome"] = outcome
        reason = _reason(report, outcome)
        if reason:
            entry["reason"] = reason
        if outcome == "error":
            entry["when"] = report.when
        device = getattr(report, "modelparity_device", None)
        if isinstance(device, str):
            self.state.device_outcomes[report.nodeid] = (device, outcome, entry.get("reason"))
        fmt = getattr(report, "modelparity_format", None)
        if isinstance(fmt, str):
            self.state.matrix_outcomes[report.nodeid] = {
                "format": fmt, "device": device, "outcome": outcome, "reason": entry.get("reason"),
                "named_by": getattr(report, "modelparity_named_by", None),
                "itself": getattr(report, "modelparity_itself", None),
                "model": self._models.get(report.nodeid)}


REASON_CHARS = 500


def _reason(report: pytest.TestReport, outcome: str) -> str | None:
    """Why a test did not pass, in a few lines: the skip reason, the xfail reason, or the
    first lines of the failure (the exception text pytest shows under ``E``)."""
    if outcome == "skipped" and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    if outcome in ("xfailed", "xpassed"):
        return str(getattr(report, "wasxfail", "") or "") or None
    if outcome not in ("failed", "error"):
        return None
    crash = getattr(report.longrepr, "reprcrash", None)
    text = getattr(crash, "message", None) or report.longreprtext or ""
    lines = [ln for ln in str(text).splitlines() if ln.strip()][:6]
    reason = "\n".join(lines)
    return reason[:REASON_CHARS] + ("..." if len(reason) > REASON_CHARS else "") or None


# -- zero-code mode ---------------------------------------------------------------------

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    state = get_state(config)
    if state.options.model:
        from .zero_code import suite_items

        items.extend(suite_items(session, state))
    if _fuzzed(state):  # minutes alone: fuzz until they are spent
        from .fuzz import fuzz_items

        items.extend(fuzz_items(session, state))


def pytest_collection_finish(session: pytest.Session) -> None:
    """A serial session whose tests export: start the export worker now, so that its
    TensorFlow import runs while this process imports TensorFlow and loads the reference
    (docs/performance.md), and note the order in which the tests export, so that the worker
    converts each test's format ahead of it. Not under xdist, where the per-entry lock leaves most
    workers without an export to make, and not when the cache already holds entries of these formats."""
    state = _state_or_none(session.config)
    if state is None or getattr(session.config, "workerinput", None) is not None:
        return
    from .zero_code import ParityCheck

    exporting = [item for item in session.items
                 if isinstance(item, ParityCheck) or "parity_candidate" in getattr(item, "fixturenames", ())]
    if exporting:
        state.export_order = list(dict.fromkeys(f for f, _ in map(item_matrix, exporting) if f))
        state.prestart_worker()


# -- pytest-xdist: workers hand their rows to the controller ----------------------------

@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    state = _state_or_none(node.config)
    if state is not None and _fuzzed(state):  # the fuzz budget holds for the whole run
        from .fuzz import configure_node

        configure_node(node, state.options, state.started)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    state = _state_or_none(node.config)
    output = getattr(node, "workeroutput", None) or {}
    if state is not None and _fuzzed(state):
        from .fuzz import merge_worker

        merge_worker(node.config, str(getattr(getattr(node, "gateway", None), "id", "?")), output)
    payload = output.get(_ROWS_KEY)
    if state is None or not payload:
        return
    state.rows.extend(payload.get("rows", []))
    state.artifacts.extend(payload.get("artifacts", []))
    state.left_out.extend(p for p in payload.get("left_out", []) if p not in state.left_out)
    state.browsers.extend(b for b in payload.get("browsers", []) if b not in state.browsers)
    state.workers += 1


# -- end of session: terminal summary, JSON and HTML ------------------------------------

def _options_doc(state: ParitySession) -> dict:
    """The options as run: ``devices`` resolved (``all`` -> the devices TensorFlow saw),
    ``devices_requested`` as given."""
    from .options import expand_devices

    o = state.options
    try:
        devices = list(expand_devices(o.devices))
    except Exception:  # noqa: BLE001 - TensorFlow missing or broken: report what was asked
        devices = list(o.devices)
    return {"devices": devices, "devices_requested": list(o.devices), "formats": list(o.formats),
            "strict": o.strict, "model": o.model,
            "logs": str(state.logs.path.parent) if state.logs is not None and state.logs.path is not None else None,
            "cache": o.cache, "cache_dir": str(o.cache_dir), "ini_rtol": o.rtol, "ini_atol": o.atol,
            "reference_device": o.reference_device, "tf32": "on" if o.tf32 else "off",
            "trust_models": o.trust_models, "left_out": [list(p) for p in state.left_out]}


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say up front which GPU precision rule is in force when it is not the default."""
    state = _state_or_none(config)
    if state is None or state.options.tf32:
        return []
    return ["modelparity: TF32 off (--modelparity-tf32=off): GPU float32 runs in full precision and is "
            "judged by the strict GPU rule"]


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    state = _state_or_none(config)
    if state is None:
        return
    browser = sys.modules.get("pytest_modelparity.runtime.browser_process")
    if browser is not None:  # what ran the browser formats (tfjs:webgl...), said in the summary and JSON
        state.browsers.extend(r for r in browser.browser_runs() if r not in state.browsers)
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller writes the reports
        workeroutput[_ROWS_KEY] = {"rows": state.rows, "artifacts": state.artifacts, "left_out": state.left_out,
                                   "browsers": state.browsers}
        if _fuzzed(state):
            from .fuzz import WORKER_RESULTS_KEY, worker_payload

            fuzzed = worker_payload(config)
            if fuzzed is not None:
                workeroutput[WORKER_RESULTS_KEY] = fuzzed
        return
    unchecked = not_compared(state.matrix_outcomes, state.options)
    if state.recorder is not None:  # the run's record of what it recorded, written last; an interrupted run writes none
        state.recorder.finish(interrupted=session.exitstatus == pytest.ExitCode.INTERRUPTED)
    if state.against is not None:
        state.against.finish()  # forms recorded but not run: named, and they fail the run
    if state.against is not None and state.against.failures and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a change beyond float noise: said in the summary
    if (nothing_compared_line(state.device_outcomes, state.matrix_outcomes) or (state.options.strict and unchecked)) \
            and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # said in the terminal summary
    if not state.rows and not (state.options.report or state.options.html):
        return
    _RESERVE.release_if_short()  # under `ulimit -v`: the address space held back is the reports' now
    from ..reports.html import write_html  # imported at configure already (below): a lookup now
    from ..reports.summary import build_document, write_json

    try:
        doc = build_document(rows=state.rows, tests=state.tests, artifacts=state.artifacts,
                             options=_options_doc(state), workers=state.workers, browsers=state.browsers)
        doc["not_compared"] = as_json(unchecked)  # docs/report-schema.md
        if _fuzzed(state):  # imported only then: a session near its memory limit imports nothing more
            from .fuzz import report_section

            fuzzed = report_section(config)
            if fuzzed is not None:  # --modelparity-fuzz: models, outcomes, failures, reproducers
                doc["fuzz"] = fuzzed
    except (MemoryError, SystemError) as exc:
        _RESERVE.release()
        state.write_errors.append(f"the reports ({', '.join(_report_options(state))}) were not written: the "
                                  f"process ran out of memory building them ({type(exc).__name__}); raise "
                                  "`ulimit -v` (the summary above is complete)")
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        return
    state.document = doc
    for option, path, write in (("--modelparity-report", state.options.report, write_json),
                                ("--modelparity-html", state.options.html, write_html)):
        if path is None:
            continue
        try:
            write(path, doc)
        except OSError as exc:  # checked at start-up; still, a full disk must not be a traceback
            state.write_errors.append(f"{option}: could not write {path} ({type(exc).__name__}: {exc})")
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        except (MemoryError, SystemError) as exc:  # each writer on its own: the other may still fit
            _RESERVE.release()
            state.write_errors.append(f"{option}: could not write {path}: the process ran out of memory "
                                      f"writing it ({type(exc).__name__}); raise `ulimit -v`")
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR


def _report_options(state: Any) -> list[str]:
    return [o for o, p in (("--modelparity-report", state.options.report),
                           ("--modelparity-html", state.options.html)) if p is not None]


def _workers_logged(folder: Path, since: float) -> bool:
    """Whether an xdist worker of this run wrote a log in ``folder`` (a suite that touches no
    model writes none, and the folder may not even exist: no line may name it then)."""
    try:
        return any(log.stat().st_mtime >= since - 1.0 for log in folder.glob("*.log"))
    except OSError:
        return False


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    try:
        _terminal_summary(terminalreporter, config)
    except (MemoryError, SystemError) as exc:  # out of memory (address space): one line, not a traceback
        terminalreporter.write_line(f"modelparity: the end-of-run summary was left out: the process ran out of "
                                    f"memory ({type(exc).__name__}); raise `ulimit -v` or free memory", red=True)


def _terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = _state_or_none(config)
    if state is None or getattr(config, "workeroutput", None) is not None:
        return
    if state.rows:
        from ..reports.summary import format_table, hidden_rows_line, sort_rows

        rows = sort_rows(state.rows)
        shown = rows
        if len(rows) > SUMMARY_ROWS and config.getoption("verbose") < 1:
            # A long table buries the failures: keep them, count the rest (-v shows all).
            shown = [r for r in rows if r["verdict"] in ("fail", "inconclusive")][:SUMMARY_ROWS]
        terminalreporter.write_sep("=", "model parity summary")
        for line in format_table(shown) if shown else ():
            terminalreporter.write_line(line)
        if len(shown) < len(rows):
            terminalreporter.write_line(hidden_rows_line(rows, shown))
    if _fuzzed(state):
        from .fuzz import summary_lines

        for line in summary_lines(config):  # --modelparity-fuzz
            terminalreporter.write_line(line, red="NEW" in line)
    logs = state.logs
    lost = logs.lost_line() if logs is not None else None
    if lost is not None:  # a full disk under the log: one line, not an OSError out of an export
        terminalreporter.write_line(lost, yellow=True)
    elif logs is not None and logs.path is not None and (logs.written or (state.workers and _workers_logged(
            logs.path.parent, state.started))):
        terminalreporter.write_line(f"modelparity: TensorFlow and converter output kept in "
                                    f"{logs.path.parent}{os.sep} (-v -s shows it on the terminal instead)")
    devices_run = {d for d, _, _ in state.device_outcomes.values()}
    left_out = left_out_line(state.left_out, cpu_in_matrix=not devices_run or "cpu" in devices_run)
    if left_out:
        terminalreporter.write_line(left_out)
    from ..reports.summary import browser_line, floor_line, inconclusive_line, power_lines, route_lines, values_line

    without_floor = floor_line(state.rows)
    if without_floor:
        terminalreporter.write_line(without_floor, yellow=True)
    for line in power_lines(state.rows):  # --modelparity-power
        terminalreporter.write_line(line, yellow="MISSED" in line)
    if state.options.power:
        from ..checks.power import COST

        if COST.comparisons:  # what the planted bugs cost, beside what they showed
            terminalreporter.write_line(
                f"modelparity: power cost: {COST.seconds:.1f} s for {COST.comparisons} comparison(s), "
                f"{COST.passes} forward pass(es) of a reference with a bug planted"
                + (" (this process; each xdist worker paid its own)" if state.workers else ""))
    by_values = values_line(state.rows)
    if by_values:
        terminalreporter.write_line(by_values, yellow=True)
    short = inconclusive_line(state.rows)
    if short:
        terminalreporter.write_line(short, yellow=True, bold=True)
    for line in route_lines(state.artifacts):
        terminalreporter.write_line(line)
    for run in state.browsers:  # tfjs:webgl ran in Chrome/156... (headless), WebGL 2 on '...', float32 textures
        terminalreporter.write_line(f"modelparity: {browser_line(run)}")
    from ..runtime.tfjs_runner import installed_since

    installed = installed_since(state.started)
    if installed:  # its progress message went to the log with the rest of the load's output
        if "repairing" in installed:
            terminalreporter.write_line(f"modelparity: installed the Node.js packages of the tfjs format again "
                                        f"({installed})", yellow=True)
        else:
            terminalreporter.write_line(f"modelparity: installed the Node.js packages of the tfjs format on "
                                        f"first use ({installed})")
    no_gpu = nothing_on_gpu_line(state.device_outcomes)
    if no_gpu:
        terminalreporter.write_line(no_gpu, yellow=True, bold=True)
    for line in not_compared_lines(not_compared(state.matrix_outcomes, state.options), state.options.strict):
        terminalreporter.write_line(line, yellow=not state.options.strict, red=state.options.strict)
    nothing = nothing_compared_line(state.device_outcomes, state.matrix_outcomes)
    if nothing:
        terminalreporter.write_line(nothing, red=True, bold=True)
    # Once per damaged entry, even when several xdist workers found and repaired it.
    notes = {a["cache_note"].split(" was damaged")[0]: a["cache_note"] for a in reversed(state.artifacts)
             if a.get("cache_note")}
    for note in reversed(notes.values()):
        terminalreporter.write_line(f"modelparity: {note}", yellow=True)
    from ..exports import floor_cache

    for note in dict.fromkeys(floor_cache.take_notes()):  # a damaged floor entry, measured again
        terminalreporter.write_line(f"modelparity: {note}", yellow=True)
    for watcher in (state.recorder, state.against):  # --modelparity-record, --modelparity-against
        for line in watcher.summary() if watcher is not None else ():
            terminalreporter.write_line(f"modelparity: {line}", red="CHANGED beyond" in line or
                                        line.startswith("NOT RECORDED"))
    for error in state.write_errors:
        terminalreporter.write_line(f"modelparity: ERROR {error}", red=True)
    for what, path in (("JSON", state.options.report), ("HTML", state.options.html)):
        if path is not None and Path(path).exists():
            terminalreporter.write_line(f"modelparity: {what} report written to {path}")


def _fuzzed(state: Any) -> bool:
    """Whether this session fuzzes (``--modelparity-fuzz`` or ``--modelparity-fuzz-minutes``): only
    then are the fuzz modules imported (at the summary too, where a session near its memory
    limit should import nothing it does not need)."""
    options = getattr(state, "options", None)
    return bool(options is not None and (options.fuzz or options.fuzz_minutes))
