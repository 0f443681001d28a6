"""Command-line options and ini keys of the plugin, parsed once into ``ParityOptions``.

Why a module of its own: option parsing must stay free of TensorFlow (``pytest --help`` and
every pytest start run it), and the fixtures, the zero-code suite and the report writers all
read the same parsed, validated values instead of re-reading ``config.getoption``.
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal

import pytest

from ..runtime.devices import parse_device
from ..runtime.scratch import not_private
from ..errors import InvalidArgumentError
from ..formats import ALL_FORMATS, available_formats
from ..verdict.validators import check_tolerance_value

GROUP = "modelparity"
# Variants a format is exported in, named "base:variant" (tflite:int8): the exporter gets
# quantization=<variant>. They mirror formats/tflite/export.py's QUANTIZATIONS (float32 is plain
# "tflite"), kept here because importing that module at start-up would import numpy.
# tfjs's variants are where it runs, not how it is exported: the same model.json in a page of
# headless Chromium (formats/tfjs/browser.py BROWSER_BACKENDS).
FORMAT_VARIANTS: dict[str, tuple[str, ...]] = {"tflite": ("float16", "dynamic_range", "int8"),
                                               "tfjs": ("webgl", "webgl-f16", "webgpu")}
# Variants that change only where the export runs: exported as their base format.
RUNTIME_VARIANTS: dict[str, tuple[str, ...]] = {"tfjs": FORMAT_VARIANTS["tfjs"]}
VALID_FORMATS: tuple[str, ...] = ALL_FORMATS + tuple(
    f"{base}:{variant}" for base, variants in FORMAT_VARIANTS.items() for variant in variants)
DEVICE_CHOICES = ("cpu", "gpu", "all")
# "recorded:FOLDER" in the matrix: a recording (docs/recorded.md) as the candidate, never exported.
RECORDED_PREFIX = "recorded:"
DEFAULT_TIMEOUT_S = 600.0

# (option suffix, ini type, help). Each option --modelparity-X has the ini key modelparity_X.
_OPTIONS: tuple[tuple[str, Literal["string", "bool"], str], ...] = (
    ("device", "string",
     "device(s) to run models on: cpu, gpu, gpu:N, all (every device TensorFlow sees), or a "
     "comma-separated list (default: cpu)"),
    ("formats", "string",
     f"comma-separated export formats to test (default: every installed one; variants such as "
     f"tflite:int8 or tfjs:webgl (headless Chromium) only when named); 'default,tflite:int8' or "
     f"'+tflite:int8' adds to the default matrix, '-tfjs' removes from it; recorded:FOLDER: a recording "
     f"made elsewhere (docs/recorded.md); valid: {', '.join(VALID_FORMATS)}"),
    ("report", "string", "write every comparison as JSON to this path (schema: docs/report-schema.md)"),
    ("html", "string", "write a self-contained HTML report (table + error histograms) to this path"),
    ("cache-dir", "string",
     "where exported models are cached (default: $MODELPARITY_CACHE_DIR, else <rootdir>/.modelparity-cache)"),
    ("no-cache", "bool", "export every model afresh into a temporary directory"),
    ("strict", "bool", "a missing runtime (LiteRT, onnxruntime, Node.js...) or device fails instead of skipping, "
                       "and a format the run was meant to compare and did not (the NOT COMPARED lines) fails the session"),
    ("trust-models", "bool",
     "load and convert models whose graph reads or writes files, runs Python (PyFunc) or calls a debug "
     "server (refused by default, named with their ops), and Keras files with Lambda layers: only for "
     "models you trust (docs/security.md)"),
    ("power", "bool",
     "show the run's power: plant small known bugs in each model reference (per output its most influential "
     "kernel x1.01, input x255/256, two same-shape outputs swapped) and say whether the bound that passed "
     "each candidate would fail on them, and what caught each (docs/tolerances.md)"),
    ("reference-device", "string",
     "run the reference (the source model) on this device (cpu, gpu, gpu:N) and the candidates on "
     "--modelparity-device, e.g. cpu to check a GPU serving path against the CPU (default: same as the candidate)"),
    ("tf32", "string",
     "on|off: TensorFloat-32 for float32 matmul/conv on Ampere+ GPUs (default: on, TensorFlow's default); "
     "off runs full float32 and judges GPU float32 by the tighter measured rule"),
    ("model", "string",
     "zero-code mode: run the built-in parity suite on SOURCE = a model path, module:factory, or 'demo'"),
    ("data", "string",
     "real rows as an .npz (arrays by input name) or .npy: the default modelparity_dataset, so int8 "
     "calibration, parity_batch and the zero-code suite use them instead of random rows"),
    ("quant-budget", "string",
     "loosen what quantisation may cost against the float32 tflite sibling, per variant, without "
     "loosening the conversion check: 'int8:rms=0.1,top1=0.9; dynamic_range:scale=0.1' "
     "(keys rms, scale, beyond, top1; docs/tolerances.md)"),
    ("quant-max-rows", "string",
     "the most rows a quantised verdict judges (given and drawn together) before an undecided one is "
     "reported inconclusive: it passes only when the rows prove its disagreement within the budget, fails "
     "only when they prove it beyond (default: 1024; docs/tolerances.md)"),
    ("input-range", "string",
     "LOW,HIGH: the range the input values are drawn from (e.g. 0,255 for raw pixels), or per input "
     "NAME=LOW,HIGH;NAME=LOW,HIGH; used by zero-code mode, parity_batch and tflite:int8 calibration "
     "(a modelparity_elements fixture in conftest.py wins). Default: [-1, 1] for floats, [0, 10] for ints"),
    ("timeout", "string",
     f"seconds one export (in the export process), one tfjs load or one tfjs predict (in Node.js) may take "
     f"before that process is stopped and the test fails (default: {DEFAULT_TIMEOUT_S:g}; 'none' waits "
     f"forever); in-process runtimes (TensorFlow, LiteRT, onnxruntime) cannot be stopped safely and are not "
     f"bounded. Node.js start-up has its own shorter limit (30 s, or this one when shorter)"),
    ("export-process", "string",
     "child (default): converters run in one persistent child process, so a converter's crash, abort, OOM "
     "kill or hang fails that export only; inline: in the test process"),
    ("fuzz", "string",
     "N: draw N small Keras models, export each to every --modelparity-formats format (default tflite, onnx, "
     "tfjs) and judge each with the default verdict; failures are shrunk and written as reproducers, converter "
     "refusals counted by cause (docs/fuzzing.md)"),
    ("fuzz-minutes", "string", "stop drawing models for --modelparity-fuzz after this many minutes; alone (no "
     "--modelparity-fuzz), fuzz until they are spent"),
    ("export-memory", "string",
     "the most memory one export may add, e.g. 4G or 500M (RLIMIT_AS in the export process; needs "
     "--modelparity-export-process=child): a larger conversion fails with ExportError instead of taking the "
     "machine (default: no limit)"),
    ("record", "string",
     "write what each model and form a test ran answered (inputs, outputs, binding, versions, device, the "
     "reference's floor) as recordings under DIR/<model>/<form>@<device>/ (docs/recorded.md); refused when DIR "
     "already holds recordings, unless --modelparity-record-overwrite"),
    ("record-overwrite", "bool", "let --modelparity-record replace the recordings already in its directory"),
    ("against", "string",
     "compare each form this run ran with its recording under DIR (an earlier --modelparity-record run) and "
     "say per output: identical, changed within float noise, or changed beyond it (which fails the run); a "
     "model whose content hash changed is said, not compared"),
)
# ini-only keys: the "ini" tolerance layer (below a marker, above the built-in table).
_INI_ONLY: tuple[tuple[str, str], ...] = (
    ("modelparity_rtol", "relative tolerance for every parity check of the suite (plain per-element rule)"),
    ("modelparity_atol", "absolute tolerance for every parity check of the suite (plain per-element rule)"),
)


@dataclass(frozen=True)
class ParityOptions:
    """The plugin's settings after command line > ini > default, validated."""

    devices: tuple[str, ...] = ("cpu",)   # may contain "all", expanded lazily (imports TF)
    formats: tuple[str, ...] = field(default_factory=available_formats)
    formats_explicit: bool = False
    # "default,tflite:int8" / "+tflite:int8,-tfjs": the names added to (removed from) the default
    # matrix; an added name is the user's choice as a whole explicit list is (its skip may fail).
    formats_added: tuple[str, ...] = ()
    formats_removed: tuple[str, ...] = ()
    report: Path | None = None
    html: Path | None = None
    cache_dir: Path = Path(".modelparity-cache")
    cache: bool = True
    strict: bool = False
    trust_models: bool = False  # --modelparity-trust-models (docs/security.md)
    power: bool = False  # --modelparity-power: planted bugs judged by each passing bound
    reference_device: str | None = None   # None: the reference runs on the candidate's device
    tf32: bool = True
    model: str | None = None
    rtol: float | None = None
    atol: float | None = None
    data: str | None = None          # --modelparity-data: an .npz/.npy of real rows
    quant_budget: str | None = None  # --modelparity-quant-budget (checked by quantized.parse_budget)
    quant_max_rows: int | None = None  # --modelparity-quant-max-rows (None: quant_rows.DEFAULT_MAX_ROWS)
    # (low, high) or {input name: (low, high)}: what the batches are drawn from (None: per dtype)
    input_range: tuple[float, float] | dict[str, tuple[float, float]] | None = None
    timeout: float | None = DEFAULT_TIMEOUT_S  # None: no limit
    export_process: str = "child"  # or "inline"
    export_memory: int | None = None  # bytes of address space one export may add
    record: Path | None = None  # --modelparity-record: where this run's recordings go (plugin/record.py)
    record_overwrite: bool = False
    against: Path | None = None  # --modelparity-against: an earlier run's recordings to compare with
    fuzz: int | None = None           # --modelparity-fuzz: models to draw
    fuzz_minutes: float | None = None  # --modelparity-fuzz-minutes: the time budget

    def format_named(self, fmt: str) -> bool:
        """Whether the user named this format (a whole list, or one added to the defaults)."""
        return self.formats_explicit or fmt in self.formats_added


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup(GROUP, "model parity (pytest-modelparity)")
    for name, kind, text in _OPTIONS:
        dest = "modelparity_" + name.replace("-", "_")
        if kind == "bool":
            group.addoption(f"--modelparity-{name}", action="store_true", default=None, dest=dest, help=text)
        else:
            group.addoption(f"--modelparity-{name}", action="store", default=None, dest=dest,
                            metavar=name.upper().replace("-", "_"), help=text)
        parser.addini(dest, text, type=kind, default=False if kind == "bool" else None)
    for key, text in _INI_ONLY:
        parser.addini(key, text, type="string", default=None)


def _value(config: pytest.Config, dest: str) -> Any:
    """Command line first, then the ini file (pytest.ini, tox.ini, pyproject.toml)."""
    value = config.getoption(dest, default=None)
    if value is None:
        value = config.getini(dest)
    return value


def _split(text: str) -> list[str]:
    return [p.strip() for p in str(text).replace(" ", ",").split(",") if p.strip()]


def _did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'tflite'?)`` for a near miss, else nothing."""
    close = difflib.get_close_matches(name.lower(), list(choices), n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_devices(text: str | None) -> tuple[str, ...]:
    """``"cpu"``, ``"gpu"``, ``"gpu:1"``, ``"all"`` or a comma list, normalised and checked
    (case-insensitive: ``GPU`` is ``gpu``)."""
    if not text:
        return ("cpu",)
    names: list[str] = []
    for part in _split(text):
        if part.lower() == "all":
            names.append("all")
            continue
        try:
            names.append(str(parse_device(part)))
        except ValueError:
            raise pytest.UsageError(
                f"--modelparity-device: unknown device {part!r}{_did_you_mean(part, DEVICE_CHOICES)}; valid: "
                f"{', '.join(DEVICE_CHOICES)} (or gpu:N, or a comma-separated list such as cpu,gpu)") from None
    return tuple(dict.fromkeys(names))


def parse_reference_device(text: str | None) -> str | None:
    """``--modelparity-reference-device``: one device (``cpu``, ``gpu``, ``gpu:N``), or
    ``same`` / unset for "the candidate's device"."""
    if not text or str(text).strip().lower() == "same":
        return None
    try:
        return str(parse_device(str(text)))
    except ValueError:
        raise pytest.UsageError(
            f"--modelparity-reference-device: unknown device {text!r}; valid: cpu, gpu, gpu:N, or same "
            "(one device: the reference runs there, the candidates on --modelparity-device)") from None


_ON = {"on": True, "true": True, "1": True, "yes": True, "off": False, "false": False, "0": False, "no": False}


def parse_tf32(text: str | None) -> bool:
    """``--modelparity-tf32=on|off`` (default on: TensorFlow's own default)."""
    if text is None or text == "":
        return True
    value = _ON.get(str(text).strip().lower())
    if value is None:
        raise pytest.UsageError(f"--modelparity-tf32: {text!r} is not on or off; valid: on, off")
    return value


def _format_key(name: str) -> str:
    """Spelling-insensitive key: ``TFLite``, ``saved-model`` and ``SavedModel`` all match."""
    return str(name).strip().lower().replace("-", "").replace("_", "").replace(" ", "")


_FORMAT_KEYS = {_format_key(f): f for f in VALID_FORMATS}


def normalize_formats(names: Iterable[str]) -> tuple[list[str], list[str]]:
    """``(valid names in canonical spelling, unknown names with a "did you mean")``."""
    known: list[str] = []
    unknown: list[str] = []
    for name in names:
        canonical = _FORMAT_KEYS.get(_format_key(name))
        if str(name).strip().lower().startswith(RECORDED_PREFIX) and str(name).strip()[len(RECORDED_PREFIX):]:
            known.append(RECORDED_PREFIX + str(name).strip()[len(RECORDED_PREFIX):])  # a recording's folder
        elif canonical is not None:
            known.append(canonical)
        else:
            unknown.append(f"{str(name)!r}{_did_you_mean(str(name), VALID_FORMATS + (DEFAULT_WORD,))}")
    return list(dict.fromkeys(known)), unknown


# "default,tflite:int8" or "+tflite:int8": the default matrix and one more; "-tfjs": one fewer.
DEFAULT_WORD = "default"


def format_words(value: Any) -> list[str]:
    """The words of a formats value: a comma/space-separated string or a list of them."""
    items = [value] if isinstance(value, str) else list(value or ())
    return [w for item in items for w in _split(str(item))]


def is_relative(words: Iterable[str]) -> bool:
    """Whether the words change a matrix (``default``, ``+name``, ``-name``) instead of listing one."""
    return any(w.strip().lower() == DEFAULT_WORD or w.strip()[:1] in "+-" for w in words)


@dataclass(frozen=True)
class FormatChange:
    """What relative words do to a base matrix: the result, and the names added and removed."""

    formats: tuple[str, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]
    unknown: tuple[str, ...]


def apply_format_words(words: Iterable[str], base: Iterable[str]) -> FormatChange:
    """``default`` (or nothing) is ``base``; ``+name`` or a plain name adds, ``-name`` removes."""
    added: list[str] = []
    removed: list[str] = []
    unknown: list[str] = []
    for word in words:
        word = word.strip()
        if word.lower() == DEFAULT_WORD:
            continue
        sign, name = (word[0], word[1:]) if word[:1] in "+-" else ("+", word)
        known, bad = normalize_formats([name])
        unknown.extend(bad)
        (removed if sign == "-" else added).extend(known)
    formats = [f for f in dict.fromkeys([*base, *added]) if f not in removed]
    return FormatChange(tuple(formats), tuple(dict.fromkeys(added)), tuple(dict.fromkeys(removed)), tuple(unknown))


def unknown_formats_text(where: str, unknown: Iterable[str], verb: str = ":") -> str:
    return (f"{where}{verb} unknown format(s) {', '.join(unknown)}; valid formats: {', '.join(VALID_FORMATS)} "
            f"(or '{DEFAULT_WORD},NAME' / '+NAME' / '-NAME' to add to or remove from the default matrix)")


@dataclass(frozen=True)
class FormatSpec:
    """``--modelparity-formats`` read: a whole list (explicit) or the defaults changed."""

    formats: tuple[str, ...]
    explicit: bool
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


def parse_format_spec(text: str | None) -> FormatSpec:
    """``a,b`` (exactly these), ``default,c`` or ``+c`` (the defaults and c), ``-d`` (without d)."""
    words = format_words(text or "")
    if not words:
        return FormatSpec(available_formats(), False)
    if is_relative(words):
        change = apply_format_words(words, available_formats())
        if change.unknown:
            raise pytest.UsageError(unknown_formats_text("--modelparity-formats", change.unknown))
        return FormatSpec(change.formats, False, change.added, change.removed)
    names, unknown = normalize_formats(words)
    if unknown:
        raise pytest.UsageError(unknown_formats_text("--modelparity-formats", unknown))
    return FormatSpec(tuple(names), True)


def split_format(name: str) -> tuple[str, str | None]:
    """``"tflite:int8"`` -> ``("tflite", "int8")``; a plain name has no variant."""
    base, _, variant = name.partition(":")
    return base, variant or None


def parse_timeout(text: Any) -> float | None:
    """``--modelparity-timeout``: seconds > 0, or ``none`` for no limit (default 600)."""
    if text is None or str(text).strip() == "":
        return DEFAULT_TIMEOUT_S
    if str(text).strip().lower() in ("none", "off", "inf"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise pytest.UsageError(f"--modelparity-timeout: {text!r} is not a number of seconds above 0; pass e.g. 120, "
                                "or none to wait forever")
    return value


def parse_export_process(text: Any) -> str:
    value = str(text or "child").strip().lower()
    if value not in ("child", "inline"):
        raise pytest.UsageError(f"--modelparity-export-process: {text!r} is not child or inline")
    return value


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(option: str, text: Any) -> int | None:
    """``4G``, ``500M``, ``1048576`` -> bytes; empty -> None."""
    if text is None or str(text).strip() == "":
        return None
    raw = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    unit = raw[-1:] if raw[-1:] in _UNITS else ""
    try:
        value = float(raw[:-1] if unit else raw) * _UNITS[unit]
    except ValueError:
        value = 0
    if not value >= 1:
        raise pytest.UsageError(f"{option}: {text!r} is not a size; pass e.g. 4G, 500M or a number of bytes")
    return int(value)


def _float(config: pytest.Config, key: str) -> float | None:
    raw = config.getini(key)
    if raw in (None, ""):
        return None
    try:
        return check_tolerance_value(key, raw, "the ini file")
    except InvalidArgumentError as exc:
        raise pytest.UsageError(str(exc)) from None


def _path(config: pytest.Config, value: Any) -> Path | None:
    if not value:
        return None
    p = Path(str(value)).expanduser()
    return p if p.is_absolute() else Path(config.invocation_params.dir) / p


def _nearest_existing(path: Path) -> Path:
    for parent in (path, *path.parents):
        if os.path.lexists(parent):
            return parent
    return Path(path.anchor or ".")


def check_output_file(option: str, path: Path | None) -> Path | None:
    """A report path must be a file we can create: checked at start-up, so a bad path is one
    usage error before any test runs instead of a traceback after all of them passed."""
    if path is None:
        return None
    if path.is_dir():
        raise pytest.UsageError(f"{option}={path} is a directory; pass a file path such as "
                                f"{path / ('modelparity.html' if 'html' in option else 'modelparity.json')}")
    existing = _nearest_existing(path.parent)
    if not existing.is_dir():
        raise pytest.UsageError(f"{option}={path}: {existing} is not a directory, so the report cannot be "
                                "written there; pass a path in a directory")
    if not os.access(existing, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise pytest.UsageError(f"{option}={path} cannot be written (no write permission on "
                                f"{path if path.exists() else existing}); pass a path in a writable directory")
    return path


def check_cache_dir(path: Path, source: str, *, writable: bool = True) -> Path:
    """The cache root must be (or become) a directory: a file there would fail every test.
    ``writable``: also refuse one that cannot be written (for a directory the user named;
    the default one is only checked when an export needs it, so a read-only checkout that
    exports nothing still runs)."""
    existing = _nearest_existing(path)
    if not existing.is_dir():
        what = "is a file" if existing == path else f"is inside {existing}, which is not a directory"
        raise pytest.UsageError(f"{source}={path} {what}; pass a directory (it is created when missing), "
                                "or --modelparity-no-cache to export into temporary directories")
    if writable and not os.access(existing, os.W_OK | os.X_OK):
        raise pytest.UsageError(f"{source}={path} cannot be written (no write permission on {existing}, or a "
                                "read-only filesystem); pass a writable directory, or --modelparity-no-cache")
    problem = not_private(path)
    if problem is not None:  # another user could plant an export or a floor the run would use
        raise pytest.UsageError(f"{source}={path} is not yours alone: {problem}, so another user could put "
                                "a model or a noise floor there that this run would use; pass a private folder "
                                f"you own (chmod go-w {path}, or a new one: the plugin creates it with mode 0700) "
                                "with --modelparity-cache-dir, or --modelparity-no-cache")
    return path


def parse_options(config: pytest.Config) -> ParityOptions:
    """Read and validate every option; raise ``pytest.UsageError`` naming the valid values."""
    spec = parse_format_spec(_value(config, "modelparity_formats"))
    cache_dir = (_path(config, _value(config, "modelparity_cache_dir"))
                 or _path(config, os.environ.get("MODELPARITY_CACHE_DIR"))
                 or Path(config.rootpath) / ".modelparity-cache")
    cache = not bool(_value(config, "modelparity_no_cache"))
    if cache:
        source = ("--modelparity-cache-dir" if _value(config, "modelparity_cache_dir")
                  else "MODELPARITY_CACHE_DIR" if os.environ.get("MODELPARITY_CACHE_DIR") else "the cache directory")
        check_cache_dir(cache_dir, source, writable=source != "the cache directory")
    model = _value(config, "modelparity_model")
    return ParityOptions(
        devices=parse_devices(_value(config, "modelparity_device")),
        formats=spec.formats,
        formats_explicit=spec.explicit,
        formats_added=spec.added,
        formats_removed=spec.removed,
        report=check_output_file("--modelparity-report", _path(config, _value(config, "modelparity_report"))),
        html=check_output_file("--modelparity-html", _path(config, _value(config, "modelparity_html"))),
        cache_dir=cache_dir,
        cache=cache,
        strict=bool(_value(config, "modelparity_strict")),
        trust_models=bool(_value(config, "modelparity_trust_models")),
        power=bool(_value(config, "modelparity_power")),
        reference_device=parse_reference_device(_value(config, "modelparity_reference_device")),
        tf32=parse_tf32(_value(config, "modelparity_tf32")),
        model=str(model) if model else None,
        rtol=_float(config, "modelparity_rtol"),
        atol=_float(config, "modelparity_atol"),
        data=_data_path(config, _value(config, "modelparity_data")),
        quant_budget=_quant_budget(_value(config, "modelparity_quant_budget")),
        quant_max_rows=_positive("--modelparity-quant-max-rows", _value(config, "modelparity_quant_max_rows"), int),
        input_range=parse_input_range(_value(config, "modelparity_input_range")),
        timeout=parse_timeout(_value(config, "modelparity_timeout")),
        export_process=parse_export_process(_value(config, "modelparity_export_process")),
        export_memory=parse_size("--modelparity-export-memory", _value(config, "modelparity_export_memory")),
        record=_path(config, _value(config, "modelparity_record")),
        record_overwrite=bool(_value(config, "modelparity_record_overwrite")),
        against=_path(config, _value(config, "modelparity_against")),
        fuzz=_positive("--modelparity-fuzz", _value(config, "modelparity_fuzz"), int),
        fuzz_minutes=_positive("--modelparity-fuzz-minutes", _value(config, "modelparity_fuzz_minutes"), float),
    )


def _positive(option: str, value: Any, kind: Any) -> Any:
    """A positive number, or a usage error naming the option and an example."""
    if value is None or value == "":
        return None
    try:
        number = kind(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number <= 0:
        raise pytest.UsageError(f"{option}={value}: pass a positive {'whole ' if kind is int else ''}number, "
                                f"e.g. {option}={'20' if kind is int else '5'}")
    return number


def _data_path(config: pytest.Config, value: Any) -> str | None:
    """``--modelparity-data``: an existing .npz/.npy file (relative to the invocation dir)."""
    path = _path(config, value)
    if path is None:
        return None
    if not path.is_file() or path.suffix.lower() not in (".npz", ".npy"):
        raise pytest.UsageError(f"--modelparity-data={value}: {'not an .npz or .npy file' if path.is_file() else 'no such file'} "
                                f"({path}); save real rows with np.savez(path, **{{input name: array}})")
    return str(path)


def _quant_budget(value: Any) -> str | None:
    if not value:
        return None
    from ..checks.quantized import parse_budget

    try:
        parse_budget(value)
    except InvalidArgumentError as exc:
        raise pytest.UsageError(str(exc)) from None
    return str(value)


def _range_pair(text: str, where: str) -> tuple[float, float]:
    parts = [p.strip() for p in text.split(",")]
    try:
        low, high = (float(p) for p in parts)
    except ValueError:
        raise pytest.UsageError(f"{where}: {text!r} is not LOW,HIGH (two numbers, e.g. 0,255)") from None
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise pytest.UsageError(f"{where}: {text!r} needs two finite numbers with LOW <= HIGH, e.g. 0,255")
    return low, high


def parse_input_range(text: str | None) -> tuple[float, float] | dict[str, tuple[float, float]] | None:
    """``--modelparity-input-range``: ``0,255`` for every input, or ``image=0,255;mask=0,1``."""
    if text is None or not str(text).strip():
        return None
    where = "--modelparity-input-range"
    text = str(text).strip()
    if "=" not in text:
        return _range_pair(text, where)
    ranges: dict[str, tuple[float, float]] = {}
    for entry in (e.strip() for e in text.split(";") if e.strip()):
        name, sep, pair = entry.partition("=")
        if not sep or not name.strip():
            raise pytest.UsageError(f"{where}: {entry!r} is not NAME=LOW,HIGH (entries are separated by ';')")
        ranges[name.strip()] = _range_pair(pair, f"{where} ({name.strip()})")
    return ranges


def strict_gpu_problem(options: ParityOptions) -> str | None:
    """Under ``--modelparity-strict`` (a machine that is supposed to have everything), why a GPU
    asked for is missing: by ``--modelparity-device`` (``all`` asks for a GPU too) or by
    ``--modelparity-reference-device``. None when not strict, no GPU is asked, or it is there.
    Imports TensorFlow and onnxruntime only in that case."""
    if not options.strict:
        return None
    asked = [d for d in options.devices if d.startswith("gpu")]
    if "all" in options.devices and not asked:
        asked.append("gpu")
    if options.reference_device and options.reference_device.startswith("gpu"):
        asked.append(options.reference_device)
    from ..runtime import devices

    for device in dict.fromkeys(asked):
        problem = devices.missing_gpu(device)
        if problem:
            return problem
    return None


def expand_devices(devices: tuple[str, ...]) -> tuple[str, ...]:
    """Replace ``all`` by every device TensorFlow sees (imports TensorFlow, so only when asked)."""
    if "all" not in devices:
        return devices
    from ..runtime.devices import available_devices

    out: list[str] = []
    for d in devices:
        out.extend(available_devices() if d == "all" else (d,))
    return tuple(dict.fromkeys(out))
