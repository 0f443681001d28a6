"""The session state behind the plugin's fixtures: sources, references, exports and candidates,
built once per session.

Why a session object instead of fixture scopes alone: a model must be built, exported and
loaded once per session per (format, device) even when several conftests (or the zero-code
suite, which has no fixtures) ask for it, and a runtime that is missing must be found once
and then skip every test that needs it with the same reason. ``ParitySession`` holds those
caches, keyed by the source object, so two suites with different models never mix; it also
words what cannot be had as the skip or failure a suite reads. TensorFlow is imported only
when a model is actually resolved or loaded. The fixtures themselves are in ``fixtures.py``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

from ..errors import DeviceUnavailable, ModelLoadError, NotSerializable, RuntimeMissing
from ..runtime import progress
from .options import RUNTIME_VARIANTS, ParityOptions, split_format
from .advice import without_failed_advice
from .causes import cause_head, cause_key, model_reason
from .variants import QUANTIZED_VARIANTS, dataset_key, variant_options

STATE_KEY = pytest.StashKey["ParitySession"]()
BATCH_SIZE = 4
BATCH_SEED = 0

class NotExportable(ValueError):
    """The selected format has no exporter (e.g. TF1 checkpoints are load-only)."""


class ExportFailed(RuntimeError):
    """Exporting the source to a format raised: the converter's message, without the
    hundred lines of converter internals pytest would otherwise print for every test."""


def _export_failed(label: str, format: str, exc: BaseException) -> ExportFailed:
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    shown = lines[:12] + ([f"... ({len(lines) - 12} more lines)"] if len(lines) > 12 else [])
    body = "\n    ".join(shown) or "(no message)"
    return ExportFailed(f"exporting {label!r} to format {format!r} failed: {type(exc).__name__}:\n    {body}")


@dataclass
class Source:
    """What ``modelparity_source`` resolved to: a Keras model and/or a model path."""

    label: str
    keras_model: Any = None          # an in-memory Keras model, when there is one
    path: Path | None = None         # a model file or directory, when given as a path
    path_format: str | None = None   # the detected format of ``path``
    keep: Any = None                 # the object the user returned (kept alive for id())

    @property
    def model_name(self) -> str:
        """What reports call this model: the Keras model's name (with the factory or path it came
        from when that differs), else the path. Why: two models in one run could not be told
        apart in the HTML rows and NOT COMPARED lines (issue 50)."""
        name = getattr(self.keras_model, "name", None) if self.keras_model is not None else None
        if not isinstance(name, str) or not name:
            return self.label
        return name if self.label in (name, "") else f"{name} ({self.label})"


@dataclass
class _Entry:
    value: Any = None
    error: BaseException | None = None


@dataclass
class ParitySession:
    """Per-session caches: resolved sources, references, exports and candidates, rows."""

    options: ParityOptions
    sources: dict[tuple[int, str | None], Source] = field(default_factory=dict)
    source_errors: dict[tuple[int, str | None], ModelLoadError] = field(default_factory=dict)
    references: dict[tuple, _Entry] = field(default_factory=dict)
    exports: dict[tuple, _Entry] = field(default_factory=dict)
    export_failures: dict[str, BaseException] = field(default_factory=dict)  # format -> its export error
    candidates: dict[tuple, _Entry] = field(default_factory=dict)
    artifacts: list[dict] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    tests: dict[str, dict] = field(default_factory=dict)
    workers: int = 0
    document: dict | None = None
    write_errors: list[str] = field(default_factory=list)  # report files that could not be written
    logs: Any = None  # a quiet.LogSink: TensorFlow and converter output while building
    # format -> {input name: (low, high)} of the rows a quantised export was calibrated on
    calibration_ranges: dict[str, dict] = field(default_factory=dict)
    # format -> {"rows", "source", "default"}: how those rows were chosen (said in the report)
    calibrations: dict[str, dict] = field(default_factory=dict)
    _cache: Any = None
    _exporter: Any = None  # export_process.ExportProcess, or None for export_model in this process
    left_out: list[list[str]] = field(default_factory=list)  # [format, device] pairs a format cannot run on
    # What ran the browser formats (tfjs:webgl...): Chromium's version, WebGL's renderer, textures.
    browsers: list[dict] = field(default_factory=list)
    started: float = field(default_factory=time.time)  # wall clock: what this run installed (tfjs npm ci)
    # node id -> (device, outcome, skip/failure reason) of every matrix test: "nothing ran on a GPU"
    device_outcomes: dict[str, tuple[str, str, str | None]] = field(default_factory=dict)
    # the formats the session's tests export to, in test order (a serial session: the export
    # worker converts the next one ahead of its test)
    export_order: list[str] = field(default_factory=list)
    # (id(source), format, device) -> the source's path, where that candidate is the source's own
    # file on the reference's device: comparing the two compares the file with itself (not_compared.py)
    itself: dict[tuple[int, str, str], str] = field(default_factory=dict)
    # node id -> {format, device, outcome, reason, named_by, itself} of every matrix test with a format
    matrix_outcomes: dict[str, dict] = field(default_factory=dict)
    # --modelparity-record / --modelparity-against (plugin/record.py): what hears each model's answers
    recorder: Any = None
    against: Any = None
    _precision_set: bool = False
    _tf32_before: bool | None = None  # TF's TF32 setting before --modelparity-tf32=off changed it
    # id(error) -> [what failed, the test that showed it in full (None until one has), the error]:
    # a failing source factory or overridden fixture is one error, shown in full once (said_before)
    shown_errors: dict[int, list] = field(default_factory=dict)
    # source key -> what its factory raised (not a ModelLoadError): raised again, never called again
    source_failures: dict[tuple[int, str | None], BaseException] = field(default_factory=dict)

    # -- which model, and which of its formats worked -------------------------------
    def model_of(self, obj: Any) -> str | None:
        """The name of the model ``obj`` (a ``modelparity_source`` value) resolved to, or None
        while it is unresolved (this never resolves it)."""
        for (key, _fmt), src in self.sources.items():
            if key == id(obj):
                return src.model_name
        return None

    def worked_formats(self, model: str | None) -> list[str]:
        """The formats exported and compared for ``model`` so far in this session: a test of the
        format ran (passed or failed its check) on a candidate that is not the source's own file."""
        from .causes import CHECKED

        return list(dict.fromkeys(
            e["format"] for e in self.matrix_outcomes.values()
            if e.get("model") == model and e.get("outcome") in CHECKED
            and not e.get("itself") and isinstance(e.get("format"), str)))

    def _name_working(self, exc: BaseException, obj: Any, format: str) -> None:
        """Rewrite ``exc``'s fix so that the formats it advises are those that worked for this
        model in this session (advice.py), never one that failed or was never tried."""
        from .advice import with_working_formats

        model = self.model_of(obj)
        tried = [e["format"] for e in self.matrix_outcomes.values() if e.get("model") == model]
        with_working_formats(exc, format, self.worked_formats(model), tried)

    # -- an error shown once --------------------------------------------------------
    def remember_error(self, exc: BaseException, what: str) -> None:
        """``exc`` failed ``what`` (the source's factory, an overridden fixture): raised again in
        every test that needs it, it is shown in full at the first and in one line at the others."""
        self.shown_errors.setdefault(id(exc), [what, None, exc])

    def said_before(self, exc: BaseException | None, nodeid: str) -> str | None:
        """The one line a test's setup failure becomes when it is a remembered error that an
        earlier test showed in full; None the first time (that test keeps the full traceback).
        Why: a factory that raises failed 21 tests with 2,563 lines of the same traceback."""
        entry = self.shown_errors.get(id(exc)) if exc is not None else None
        if entry is None or entry[2] is not exc:
            return None
        what, first = entry[0], entry[1]
        if first is None or first == nodeid:
            entry[1] = nodeid
            return None
        lines = str(exc).strip().splitlines()
        head = lines[0] if lines else ""
        head = head if len(head) <= 160 else head[:157] + "..."
        return (f"modelparity: {what} failed: {type(exc).__name__}{': ' + head if head else ''} (the same error as "
                f"at the setup of {first}, where its full traceback is shown; {what} is not run again)")

    # -- devices and precision ------------------------------------------------------
    def reference_device(self, device: str) -> str:
        """Where the reference runs when the candidate runs on ``device``: the
        ``--modelparity-reference-device`` if given, else the same device."""
        return self.options.reference_device or device

    def matrix_id(self, device: str) -> str:
        """The test-id part for ``device``: ``gpu``, or ``gpu-refcpu`` when the reference
        device is chosen (then both devices are named, even when they are the same)."""
        ref = self.options.reference_device
        return f"{device}-ref{ref}" if ref else device

    def _set_precision(self) -> None:
        """Apply ``--modelparity-tf32=off`` before the first model is loaded (imports TF)."""
        if self._precision_set:
            return
        self._precision_set = True
        if not self.options.tf32:
            from ..runtime.devices import set_tf32

            self._tf32_before = set_tf32(False)

    def _quietly(self, what: str, build: Any) -> Any:
        """``build`` with TF/converter output sent to the session's log (``quiet.LogSink``)."""
        if self.logs is None:
            return build

        def run() -> Any:
            with self.logs.capture(what):
                return build()

        return run

    # -- sources --------------------------------------------------------------------
    def source(self, obj: Any, format: str | None = None) -> Source:
        """What ``obj`` resolves to, once per session. A path's format is detected unless
        ``format`` (``modelparity_load_options``' ``"format"``) names it. A source that cannot
        be resolved is said in full once; every later test that needs it gets one line (a
        factory that raised is not called again: its error is raised again and reported in one
        line, ``said_before``)."""
        key = (id(obj), format)
        if key in self.source_failures:  # the same object: the report shows it once (said_before)
            raise self.source_failures[key]
        if key in self.source_errors:
            first = self.source_errors[key]
            raise ModelLoadError(first.path, first.format, "the source could not be resolved (the full "
                                 "error and its fix are on the first test that needed it)") from None
        if key not in self.sources:
            try:
                self.sources[key] = self._quietly("resolving the source", lambda: resolve_source(obj, format=format))()
            except ModelLoadError as exc:
                self.source_errors[key] = exc
                raise
            except Exception as exc:  # a factory that raised: not called again in this session
                self.source_failures[key] = exc
                self.remember_error(exc, "the source (modelparity_source's factory)")
                raise
            self.sources[key].keep = obj
        return self.sources[key]

    def declare_input_specs(self, obj: Any, specs: Any) -> None:
        """Give a subclassed Keras source the inputs of ``modelparity_input_specs`` (a source
        that fails to resolve is reported by the reference or candidate that needs it)."""
        if specs is None or isinstance(obj, (str, Path)):  # a path or module:factory: nothing to declare on
            return
        try:
            src = self.source(obj)
        except Exception:  # noqa: BLE001 - reported, with its context, where the model is needed
            return
        if src.keras_model is not None:
            from ..formats.tensorflow.keras_specs import declare_input_specs

            declare_input_specs(src.keras_model, specs)

    # -- models ---------------------------------------------------------------------
    def reference(self, obj: Any, device: str, load_options: dict | None = None) -> Any:
        """The source loaded as a ``LoadedModel`` on ``device`` (once per session).

        ``load_options`` (``modelparity_load_options``) go to ``load_model`` with the source.
        """
        opts = dict(load_options or {})
        src = self.source(obj, opts.pop("format", None))
        self._set_precision()
        return self._once(self.references, (id(obj), device, _options_key(opts)),
                          self._quietly(f"loading the reference on {device}", lambda: _load_reference(src, device, opts)))

    def candidate(self, obj: Any, format: str, device: str, load_options: dict | None = None,
                  converter_options: dict | None = None, elements: Any = None, dataset: Any = None,
                  bind: dict | None = None) -> Any:
        """The source exported to ``format`` (once) and loaded on ``device`` (once).

        ``load_options`` apply where the source file itself is loaded: as the candidate of its
        own format (loaded as is), or as the Keras model the exports are made from.
        ``converter_options`` (from ``modelparity_export_options``) go to the converter.
        ``elements`` (``modelparity_elements``): the range an int8 export's calibration rows
        are drawn from, the same as the test batches'. ``dataset`` (``modelparity_dataset``):
        real rows, which an int8 export calibrates on instead. A quantised tflite candidate
        gets its float32 sibling (``float_sibling``): judged in two parts (``checks/quantized.py``).
        """
        given = dict(load_options or {})  # with "format": what export() and the sibling resolve by
        opts = {k: v for k, v in given.items() if k != "format"}
        src = self.source(obj, given.get("format"))  # first: a bad source is reported as such
        conv = dict(converter_options or {})

        def build() -> Any:
            from ..formats import missing_runtime

            base, _variant = split_format(format)
            missing = missing_runtime(base)
            if missing is not None:
                raise missing
            path = self.export(obj, format, given, conv, elements, dataset)
            as_is = src.path is not None and path == src.path
            self._set_precision()
            load_opts = dict(opts if as_is else {})
            if base == "tfjs":  # Node.js runs it: --modelparity-timeout bounds its load and each predict
                load_opts.setdefault("timeout_s", self.options.timeout)
                if _variant is not None:  # tfjs:webgl...: a page of headless Chromium runs it
                    load_opts["backend"] = _variant
            loaded = _load_source(path, base, device, load_opts)
            self._note_itself(obj, src, format, device, path)
            ranges = self.calibration_ranges.get(format)
            if ranges:  # diagnosis names inputs outside them (diagnose.calibration)
                with contextlib.suppress(AttributeError):
                    loaded.calibration_ranges = ranges
            if format in self.calibrations:
                with contextlib.suppress(AttributeError):
                    loaded.calibration = self.calibrations[format]
            loaded = self._bound(loaded, obj, device, given, elements, bind, None if as_is else path)
            if base == "tflite" and _variant in QUANTIZED_VARIANTS and not as_is:
                self._attach_sibling(loaded, obj, device, given, conv, elements, dataset, bind)
            if base == "tflite" and _variant == "int8" and not as_is:
                self._attach_requantizer(loaded, obj, format, device, given, conv, elements, dataset, bind, path)
            if format == "tfjs:webgl-f16":  # judged against float32 textures (checks/float16_textures.py)
                self._attach_sibling(loaded, obj, device, given, conv, elements, dataset, bind, sibling="tfjs:webgl")
            return loaded

        return self._once(self.candidates, (id(obj), format, device, _options_key(opts), _options_key(conv),
                                            repr(elements), dataset_key(dataset), repr(bind)),
                          self._quietly(f"exporting to {format} and loading on {device}", build))

    def _note_itself(self, obj: Any, src: Source, format: str, device: str, path: Path) -> None:
        """Remember a candidate that is the source's own file (its path, or the same bytes) loaded
        on the reference's device: a comparison of the two is not one (not_compared.py)."""
        if self.reference_device(device) == device and _same_file(path, src.path):
            self.itself[(id(obj), format, device)] = str(src.path)

    def candidate_itself(self, obj: Any, format: str, device: str) -> str | None:
        """The source's path when the candidate of ``format`` on ``device`` is that file itself."""
        return self.itself.get((id(obj), format, device))

    def _bound(self, loaded: Any, obj: Any, device: str, load_options: dict, elements: Any,
               bind: dict | None, exported: Path | None) -> Any:
        """The candidate speaking the reference's names: fed by its input names (or a list in its
        input order) and answering by its output names, each pair on a recorded basis
        (formats/binding.py). Values on the seeded batch pair outputs only where nothing else can;
        a pairing made by shape is kept with the cached export (its "export record"), one made by
        values is not: kept, it would pass as a record in later runs and the end-of-run line that
        names value pairings (reports/summary.values_line) would no longer see it."""
        from ..checks.strategies import seeded_batch
        from ..formats.binding import bind_model

        # the reference's names, or the one skip/failure that says why the reference cannot be had
        ref = self.reference_or_skip(obj, self.reference_device(device), load_options)
        cache = self._cache if exported is not None else None
        recorded = cache.pairing(exported) if cache is not None else None
        bound = bind_model(loaded, ref, explicit=bind, recorded=recorded,
                           probe=lambda: seeded_batch(ref, batch_size=BATCH_SIZE, seed=BATCH_SEED, elements=elements))
        weak = {kind: {p.reference: p.other for p in getattr(bound, f"{kind[:-1]}_binding").pairs
                       if p.basis == "shape and dtype"} for kind in ("inputs", "outputs")} \
            if bound is not loaded else {}
        if cache is not None and any(weak.values()):
            cache.keep_pairing(exported, weak)
        return bound

    def _attach_sibling(self, loaded: Any, obj: Any, device: str, opts: dict, conv: dict, elements: Any,
                        dataset: Any, bind: dict | None = None, sibling: str = "tflite") -> None:
        """The float32 form of the same source (``sibling``: tflite, or tfjs:webgl for float16
        textures; cached like any candidate) on ``loaded``; when it cannot be had, the
        candidate keeps the one fixed rule and says why."""
        try:
            loaded.float_sibling = self.candidate(obj, sibling, device, opts, conv, elements, dataset, bind)
        except Exception as exc:  # noqa: BLE001 - the sibling is extra evidence, never a new failure
            loaded.float_sibling_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    def _attach_requantizer(self, loaded: Any, obj: Any, format: str, device: str, given: dict, conv: dict,
                            elements: Any, dataset: Any, bind: dict | None, path: Path) -> None:
        """``loaded.requantize(names)``: the same int8 export (same source, calibration rows and
        converter options) with ``names`` kept in float, loaded like ``loaded``, so that the
        quantisation hint measures what its advice gains before giving it
        (diagnose/quantization.py); ``loaded.requantize_seconds``: what the int8 export cost
        (None from the cache), which predicts a re-quantisation's."""
        made = next((a for a in reversed(self.artifacts) if a.get("path") == str(path)), None)

        def requantize(names: list[str]) -> Any:
            kept = dict(conv)
            kept["float_nodes"] = list(dict.fromkeys([*(conv.get("float_nodes") or []), *names]))
            failed_before = dict(self.export_failures)
            try:
                again = self.export(obj, format, given, kept, elements, dataset)
            finally:  # the diagnosis's export failing is not the format's (export_failures drops advice)
                self.export_failures = failed_before
            base = split_format(format)[0]
            return self._bound(_load_source(again, base, device, {}), obj, device, given, elements, bind, again)

        with contextlib.suppress(AttributeError):
            loaded.requantize = requantize
            loaded.requantize_seconds = None if made is None or made.get("cache_hit") else made.get("seconds")

    def export(self, obj: Any, format: str, load_options: dict | None = None,
               converter_options: dict | None = None, elements: Any = None, dataset: Any = None) -> Path:
        given = dict(load_options or {})
        opts = {k: v for k, v in given.items() if k != "format"}
        src = self.source(obj, given.get("format"))
        conv = dict(converter_options or {})
        base, variant = split_format(format)
        if variant in RUNTIME_VARIANTS.get(base, ()):
            format = base  # tfjs:webgl runs tfjs's own model.json: one export for every browser
        return self._once(self.exports, (id(obj), format, _options_key(opts), _options_key(conv), repr(elements),
                                         dataset_key(dataset)),
                          lambda: self._export(obj, src, format, given, conv, elements, dataset))

    def _export_subject(self, obj: Any, src: Source, given: dict) -> Any:
        """What the exports are made from: the source's Keras model, or for a ``.keras``/``.h5``
        file the CPU reference's own model (loaded once per session, not once per format: three
        loads of MobileNetV2 were 3-4 s of a session); else the path, for the format's exporter."""
        if src.keras_model is not None:
            return src.keras_model
        if src.path_format in ("keras", "h5"):
            from ..formats.tensorflow.keras import KerasModel

            loaded = self.reference(obj, "cpu", given)
            assert isinstance(loaded, KerasModel)  # both formats load as KerasModel
            return loaded.native
        assert src.path is not None
        return src.path  # let the format's exporter decide whether it converts from this path

    def _export(self, obj: Any, src: Source, format: str, given: dict, converter_options: dict | None = None,
                elements: Any = None, dataset: Any = None) -> Path:
        """``export``'s work; ``given``: the load options with their ``"format"``."""
        from ..formats import missing_runtime

        if src.path is not None and src.path_format == format:
            return src.path  # the source already is this format: load it as is, never rewrite it
        from ..formats import format_module

        base, variant = split_format(format)
        if not hasattr(format_module(base), "export"):
            raise NotExportable(
                f"format {format!r} can be loaded but not exported to, so it cannot be a candidate "
                f"for {src.label!r}; return a {format} path from modelparity_source (it is then "
                "loaded as is), or deselect it from --modelparity-formats")
        missing = missing_runtime(base, export=True)
        if missing is not None:
            raise missing
        self.prestart_worker([base])
        model = self._export_subject(obj, src, given)
        options, calibration = variant_options(model, variant, elements, dataset,
                                               specs=lambda: self.reference(obj, "cpu", given))
        if calibration is not None:
            self.calibrations[format] = calibration
        for rows in options.get("representative_data") or []:
            if isinstance(rows, dict):
                import numpy as np

                self.calibration_ranges[format] = {
                    str(k): (float(np.min(v)), float(np.max(v))) for k, v in rows.items()
                    if np.asarray(v).dtype.kind in "fiu" and np.asarray(v).size}
        if converter_options:
            options["converter_options"] = dict(converter_options)
        if isinstance(model, (str, Path)) and src.path_format in ("graphdef", "checkpoint") and \
                getattr(format_module(base), "CONVERTS_SAVED_MODEL", False):
            # A TF1 graph's named tensors and switches make the model: every conversion gets them.
            options.update({k: given[k] for k in ("inputs", "outputs", "feeds") if given.get(k) is not None})
        if isinstance(model, (str, Path)) and given.get("trusted") is not None:
            options["trusted"] = given["trusted"]  # the user's word reaches the conversions of the file too
        start = time.perf_counter()
        # The cache keys Keras models by architecture and weights, a file source (a SavedModel
        # folder, a .pb, a checkpoint) by its files' bytes and load options (user files are
        # never written to); uncached only with --modelparity-no-cache.
        cache = self._export_cache()
        hits_before = cache.hits
        try:
            kept = len((converter_options or {}).get("float_nodes") or [])
            with progress.step(f"exporting {format}" + (f" with {kept} node(s) kept in float" if kept else "")) as step:
                path = Path(cache.export(model, base, **options))
                if cache.hits > hits_before:
                    step.note = "from the export cache, nothing exported"
        except (RuntimeMissing, DeviceUnavailable):
            raise
        except ModelLoadError as exc:  # advice this session has already seen fail is not given again
            self.export_failures[format] = exc
            raise without_failed_advice(exc, format, self.export_failures)
        except Exception as exc:  # noqa: BLE001 - any converter failure, reported once per format
            self.export_failures[format] = exc
            failed = _export_failed(src.label, format, exc)
            if self.logs is not None and self.logs.written:
                failed.args = (f"{failed}\n    converter output: {self.logs.path}",)
            raise failed from exc
        if cache.hits == hits_before:  # a cold cache: the next test's export starts now
            self._export_next_ahead(obj, src, model, format, cache)
        artifact = {"source": src.label, "format": format, "path": str(path),
                    "seconds": round(time.perf_counter() - start, 3),
                    # a cache hit is a reused artifact, not an export made by this run
                    "cache_hit": cache.hits > hits_before}
        from ..formats import export_route

        route = export_route(path)
        if route:  # how the converter got there (e.g. a mixed_float16 model traced in float32)
            artifact["route"] = route
        notes = cache.take_notes()
        if notes:  # a damaged cache entry was dropped and re-exported: said once, in the summary
            artifact["cache_note"] = "; ".join(notes)
        self.artifacts.append(artifact)
        return path

    def _export_next_ahead(self, obj: Any, src: Source, model: Any, done: str, cache: Any) -> None:
        """Send the export the session's next test needs (``export_order``, after ``done``) to
        the worker now, so that it converts while this process loads, runs and compares
        ``done`` (docs/performance.md). Only a plain format (no variant; converter options
        would make the request another, which is then exported as usual), from a Keras model,
        to a running worker, and not one the cache holds. Never a failure of its own."""
        exporter = self._exporter
        if exporter is None or done not in self.export_order or isinstance(model, (str, Path)):
            return
        exported = {key[1] for key in self.exports if key[0] == id(obj)}
        following = [f for f in self.export_order[self.export_order.index(done) + 1:] if f not in exported]
        if not following:
            return
        format = following[0]
        try:
            from ..exports.cache import ARTIFACT_NAMES
            from ..formats import format_module, missing_runtime

            base, variant = split_format(format)
            if variant is not None or (src.path is not None and src.path_format == base) or \
                    not hasattr(format_module(base), "export") or missing_runtime(base, export=True) is not None:
                return
            if not cache.holds(model, base):  # the same keywords as its own export will carry
                exporter.ahead(model, base, ARTIFACT_NAMES.get(base, "model"), **cache.conversion_inputs(model, base))
        except Exception:  # noqa: BLE001 - only a head start: the test's own export says what fails
            return

    def _export_cache(self) -> Any:
        if self._cache is None:
            from ..exports import cache as cache_mod

            self._cache = cache_mod.ExportCache(self.options.cache_dir, enabled=self.options.cache,
                                                exporter=self.exporter(), lock_timeout_s=self.options.timeout)
        return self._cache

    def prestart_worker(self, formats: Any = None) -> None:
        """Start the export worker before the model is loaded and keyed, so its own TensorFlow
        import overlaps that work (docs/performance.md), unless the cache already holds entries
        of any of ``formats`` (default: the session's): a warm run then hits the cache and
        needs no worker at all."""
        if self.options.export_process != "child" or self._exporter is not None:
            return
        wanted = {split_format(f)[0] for f in (self.options.formats if formats is None else formats)}
        if self.options.cache:
            root = Path(self.options.cache_dir)  # read only: the cache dir is not created here
            cached = {p.parent.parent.name for p in root.glob("*/*/meta.json")} if root.is_dir() else set()
            if wanted & cached:  # a warm (or partly warm) cache: most exports will be hits
                return
        if self.logs is not None and getattr(self.logs, "root", None) is not None:
            from ..runtime.quiet import make_ignored_dir

            with contextlib.suppress(OSError):  # the worker's log lives there: created ignored, as always
                make_ignored_dir(self.logs.root)
        self.exporter()
        if self._exporter is not None:
            self._exporter.prestart()

    def exporter(self) -> Any:
        """What converts: ``export_model`` here, or the persistent child process (the default)
        that turns a converter's crash, abort, OOM kill or hang into one ``ExportError``."""
        if self.options.export_process != "child":
            return functools.partial(export_inline, timeout_s=self.options.timeout)
        if self._exporter is None:
            from ..exports.worker import ExportProcess

            self._exporter = ExportProcess(timeout_s=self.options.timeout, memory_limit=self.options.export_memory,
                                           log_path=None if self.logs is None else self.logs.path)
        return self._exporter.export

    @staticmethod
    def _once(table: dict, key: tuple, build: Any) -> Any:
        entry = table.get(key)
        if entry is None:
            entry = table[key] = _Entry()
            try:
                entry.value = build()
            except BaseException as exc:  # noqa: BLE001 - remembered and re-raised for every test
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    del table[key]
                    raise
                entry.error = exc
        if entry.error is not None:
            raise entry.error
        return entry.value

    # -- skip or fail ---------------------------------------------------------------
    def unavailable(self, exc: BaseException, what: str) -> None:
        """A runtime or device is missing: skip with the install hint, or fail if strict."""
        reason = f"modelparity: {what}: {exc}"
        if self.options.strict:
            raise pytest.fail.Exception(reason + " [--modelparity-strict turns this skip into a failure]",
                                        pytrace=False) from None  # called in an except: no chained repeat
        pytest.skip(reason)

    def candidate_or_skip(self, source: Any, format: str, device: str, *, named: bool,
                          load_options: dict | None = None, explain: Any = None,
                          converter_options: dict | None = None, elements: Any = None, dataset: Any = None,
                          bind: dict | None = None) -> Any:
        """The candidate model, or the one skip/failure that says why it cannot be had.

        Shared by the ``parity_candidate`` fixture and the zero-code items: a missing runtime
        or device skips (fails under --modelparity-strict); a format this source cannot become
        skips unless the user named it; any other export or load failure fails the test with
        the converter's message (``explain(exc)`` may word it for the caller: zero-code mode
        has no fixture to name in the fix).
        """
        from ..formats.binding import BindingError

        try:
            return self.candidate(source, format, device, load_options, converter_options, elements, dataset, bind)
        except (RuntimeMissing, DeviceUnavailable) as exc:
            self.unavailable(exc, f"format {format!r} on {device}")
        except BindingError as exc:  # never paired by position: the user names the pairing
            _fail(f"modelparity: {format} on {device}: {exc}")
        except (NotExportable, ExportFailed, ModelLoadError) as exc:
            self._name_working(exc, source, format)
            skip_if_unreachable(exc, format, named=named)
            raise self._said_once(exc, f"modelparity: {explain(exc) if explain else _suite_text(exc)}") from None

    def reference_or_skip(self, source: Any, device: str, load_options: dict | None = None, *,
                          explain: Any = None) -> Any:
        """The reference model, or the skip (missing runtime/device) or failure (a bad source)."""
        try:
            return self.reference(source, device, load_options)
        except (RuntimeMissing, DeviceUnavailable) as exc:
            # parity_batch is drawn from the reference's inputs: a test that only checks the
            # candidate (assert_deterministic) skips too, and would not know why.
            self.unavailable(exc, f"reference on {device} (parity_reference, and parity_batch, which is drawn "
                                  "from the reference's inputs)")
        except ModelLoadError as exc:  # the message names the file, the format and the fix
            raise self._said_once(exc, f"modelparity: reference: {explain(exc) if explain else _suite_text(exc)}") \
                from None

    def _said_once(self, exc: BaseException, text: str) -> BaseException:
        """The failure of a test that needed what ``exc`` stopped, carrying its cause: the
        report hook (``cause_said_before``) shows ``text`` in full at the first test of the
        session that failed with this cause and one line pointing back to it at the others.
        Why: one cause (a subclassed model never built, a converter refusing the model, a TF1
        graph's switch) failed every test of every format with the same full message: 21
        times, 183 lines, for an unbuilt model."""
        failure = pytest.fail.Exception(text, pytrace=False)
        failure.modelparity_cause = cause_key(exc)  # type: ignore[attr-defined]
        failure.modelparity_head = cause_head(exc, text)  # type: ignore[attr-defined]
        return failure

    def cause_said_before(self, failure: BaseException | None, nodeid: str) -> str | None:
        """The one line a failure with a cause already shown in full becomes; None for the first
        test with that cause (it keeps the full text)."""
        cause = getattr(failure, "modelparity_cause", None)
        if not isinstance(cause, str):
            return None
        said: dict[str, str] = self.__dict__.setdefault("_said_causes", {})
        first = said.setdefault(cause, nodeid)
        if first == nodeid:
            return None
        head = str(getattr(failure, "modelparity_head", "") or "")
        return (f"{head} (the same error as the first test that needed it, where its full text and fix are shown) "
                f"-- shown at {first}")

    def close(self) -> None:
        for table in (self.candidates, self.references):
            for entry in table.values():
                close = getattr(entry.value, "close", None)
                if close is not None:
                    try:
                        close()
                    except Exception:  # noqa: BLE001 - closing must not mask results
                        pass
        if self._exporter is not None:
            self._exporter.close()
            self._exporter = None
        browser = sys.modules.get("pytest_modelparity.runtime.browser_process")
        if browser is not None:  # the session's one Chromium, when a browser format started it
            browser.close_shared_browser()
        if self._tf32_before is not None:  # TF's switch is process-wide: give it back
            from ..runtime.devices import set_tf32

            set_tf32(self._tf32_before)
            self._tf32_before = None


def get_state(config: pytest.Config) -> ParitySession:
    return config.stash[STATE_KEY]


# -- resolving a source -----------------------------------------------------------------

# How a ``module:factory`` source is imported, for the fix of an import that failed: the
# module is found on sys.path of the pytest process, which plain ``pytest`` does not start
# with the current directory on.
IMPORT_FIX = ("pass module:factory where `import module` works in the pytest process and factory is a "
              "zero-argument function returning a Keras model. Imports resolve on sys.path: "
              "`python -m pytest` puts the current directory on it (plain `pytest` does not); otherwise "
              "add the module's folder to PYTHONPATH, or set `pythonpath = .` in the pytest ini "
              "(paths relative to the rootdir)")


def resolve_source(obj: Any, *, format: str | None = None, _depth: int = 0) -> Source:
    """A Keras model, a factory returning one, a path, ``module:factory`` or ``demo``;
    ``format`` names a path's format instead of detecting it."""
    from ..formats import is_keras_model

    if is_keras_model(obj):
        return Source(label=getattr(obj, "name", type(obj).__name__), keras_model=obj)
    if isinstance(obj, (str, Path)):
        text = str(obj)
        path = Path(text).expanduser()
        if text == "demo" and not path.exists():
            from .demo import build_demo_model

            return Source(label="demo", keras_model=build_demo_model())
        if not path.exists() and ":" in text and not text.startswith(("/", ".")):
            module_name, _, attr = text.partition(":")
            try:
                factory = getattr(importlib.import_module(module_name), attr)
            except (ImportError, AttributeError) as exc:
                raise ModelLoadError(None, None, f"cannot import {text!r} ({exc})", IMPORT_FIX) from exc
            src = resolve_source(factory, _depth=_depth + 1)
            src.label = text
            return src
        from ..formats import ALL_FORMATS, detect_format

        if format is not None and format not in ALL_FORMATS:
            raise ModelLoadError(path, format, f"unknown format {format!r} in modelparity_load_options",
                                 f"use one of: {', '.join(ALL_FORMATS)}")
        # detect_format raises ModelLoadError naming the path when unknown or missing
        fmt = format if format is not None and path.exists() else detect_format(path)
        return Source(label=str(path), path=path.resolve(), path_format=fmt)
    if callable(obj) and _depth < 2:
        src = resolve_source(obj(), _depth=_depth + 1)
        src.label = getattr(obj, "__qualname__", src.label)
        return src
    raise TypeError(
        f"modelparity_source returned {type(obj).__name__}; return a Keras model, a zero-argument "
        "factory returning one, or a path to a saved model (.keras, .h5, SavedModel dir, .pb, "
        ".tflite, model.json, .onnx)")


def _options_key(options: dict) -> str:
    """A session-cache key for load options (their values may be unhashable lists)."""
    return repr(sorted(options.items(), key=lambda kv: str(kv[0])))


def export_inline(model: Any, format: str, path: Any, *, timeout_s: float | None, **options: Any) -> Any:
    """``export_model`` in the session's process (``--modelparity-export-process=inline``). A tfjs
    export's check loads and runs the file in Node.js: ``--modelparity-timeout`` bounds that load
    as it bounds the session's other tfjs loads (in the export process the whole export is bounded)."""
    from ..formats import export_model

    if timeout_s is not None and split_format(format)[0] == "tfjs":
        options.setdefault("validate_timeout_s", timeout_s)
    return export_model(model, format, path, **options)


def _load_source(source: Any, format: str, device: str, options: dict) -> Any:
    """``load_model`` with the user's load options; an option the loader lacks says so."""
    from ..formats import load_model

    try:
        return load_model(source, format, device=device, **options)
    except TypeError as exc:
        if not options or "unexpected keyword argument" not in str(exc):
            raise
        path = source if isinstance(source, (str, Path)) else None
        raise ModelLoadError(
            path, format, f"modelparity_load_options {options!r} holds an option that format {format!r} "
            f"does not take ({exc})",
            "return only options of this format's loader from modelparity_load_options (graphdef, "
            "checkpoint: inputs, outputs, feeds; keras, h5: safe_mode, custom_objects; any format: "
            "trusted, docs/security.md)") from exc


def _load_reference(src: Source, device: str, options: dict | None = None) -> Any:
    if src.keras_model is not None:
        return _load_source(src.keras_model, "keras", device, dict(options or {}))
    assert src.path_format is not None
    return _load_source(src.path, src.path_format, device, dict(options or {}))


# Reading more than this to compare two files' bytes is not worth it (paths compare first).
_SAME_FILE_HASH_LIMIT = 256 * 1024 * 1024


def _same_file(a: Path | None, b: Path | None) -> bool:
    """Whether two paths are one model file: the same path, or two files with the same bytes
    (sizes compared first, so different files cost one ``stat`` each)."""
    if a is None or b is None:
        return False
    try:
        if Path(a).resolve() == Path(b).resolve():
            return True
        if not (Path(a).is_file() and Path(b).is_file()):
            return False
        size = Path(a).stat().st_size
        if size != Path(b).stat().st_size or size > _SAME_FILE_HASH_LIMIT:
            return False
        import hashlib

        return hashlib.sha256(Path(a).read_bytes()).digest() == hashlib.sha256(Path(b).read_bytes()).digest()
    except OSError:
        return False


def _fail(text: str) -> NoReturn:
    # ``from None``: the message already carries the error; a chained traceback repeats it.
    raise pytest.fail.Exception(text, pytrace=False) from None


def _suite_text(exc: BaseException) -> str:
    """The error as a suite reads it: its fix says what to write in conftest.py, not the
    argument of a library call the suite never makes."""
    from ..formats import DETECTION_FIX

    if isinstance(exc, ModelLoadError) and exc.fix == DETECTION_FIX:
        return str(ModelLoadError(exc.path, exc.format, exc.problem, SUITE_DETECTION_FIX, action=exc.action))
    return f"{exc}{_load_options_hint(exc)}"


SUITE_DETECTION_FIX = ("point modelparity_source at the model file or directory itself, or name its format "
                       "from a session-scoped fixture in conftest.py:\n"
                       "    @pytest.fixture(scope='session')\n"
                       "    def modelparity_load_options():\n"
                       "        return {'format': 'saved_model'}")


def _load_options_hint(exc: BaseException) -> str:
    """A fix that says "pass X to load_model" reads, in a suite, "return X from the fixture",
    with X's own example: an unbuilt subclassed model's "pass input_specs=[...] to
    load_model/export_model" (a fixture of its own, which its fix names) got a graph tensor's
    ``{'inputs': ['x:0']}`` example it has nothing to do with (issue 50)."""
    match = re.search(r"\bpass (\w+)=\S*.* to load_model\b", str(exc))  # not "loaded with load_model"
    if match is None or match.group(1) not in _LOAD_OPTION_EXAMPLES:
        return ""
    return ("\n(in a pytest suite, load_model's options come from a session-scoped fixture in conftest.py:\n"
            "    @pytest.fixture(scope='session')\n"
            "    def modelparity_load_options():\n"
            f"        return {_LOAD_OPTION_EXAMPLES[match.group(1)]})")


# The fixture's return value that passes each load option a fix may name (modelparity_load_options).
_LOAD_OPTION_EXAMPLES = {"inputs": "{'inputs': ['x:0'], 'outputs': ['predictions:0']}",
                         "outputs": "{'inputs': ['x:0'], 'outputs': ['predictions:0']}",
                         "feeds": "{'feeds': {'is_training': False}}",
                         "signature": "{'signature': 'name'}",
                         "custom_objects": "{'custom_objects': {'Name': cls}}"}


def skip_if_unreachable(exc: BaseException, format: str, *, named: bool) -> None:
    """Skip a default-matrix format the source cannot be converted to at all (a frozen .pb is
    not a Keras model), or that cannot carry this kind of model (a string input on tfjs, a
    lookup table on graphdef/onnx): not applicable rather than broken. Named by the user, it
    is an error."""
    if named:
        return
    cause = model_reason(exc)
    if cause is not None:
        fix = f"; {getattr(exc, 'fix')}" if getattr(exc, "fix", None) else ""
        pytest.skip(f"modelparity: format {format!r} does not apply to this model ({cause}){fix}. "
                    "Naming the formats (--modelparity-formats, or the marker's formats=) makes this a failure")
    if isinstance(exc, ModelLoadError) and exc.not_applicable:
        fix = f"; {exc.fix}" if exc.fix else ""
        pytest.skip(f"modelparity: format {format!r} does not apply to this model ({exc.problem}){fix}. "
                    "Naming the formats (--modelparity-formats, or the marker's formats=) makes this a failure")
    if isinstance(exc, (NotExportable, NotSerializable)) or (isinstance(exc, ModelLoadError)
                                                              and exc.action == "convert"):
        pytest.skip(f"modelparity: format {format!r} cannot be made from this source "
                    f"({str(exc).splitlines()[0]}); name the formats to test with "
                    "--modelparity-formats to make this a failure")

