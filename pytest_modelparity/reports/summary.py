"""Rows of the parity summary, the terminal table and the JSON report.

A row is one output of one comparison made during one test: plain JSON values only, so
rows travel from pytest-xdist workers to the controller unchanged and the JSON report, the
terminal table and the HTML page are all built from the same list. The schema is documented
in docs/report-schema.md; versions are read with importlib.metadata (no TensorFlow import).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..verdict.formatting import json_value, table_number

SCHEMA_VERSION = 3  # 2: summary counts tests and rows apart; verdict "expected"; test reasons; 3: "inconclusive"
# Distributions whose versions explain a parity result (first installed name wins).
_PACKAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tensorflow", ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly")),
    ("keras", ("keras",)),
    ("numpy", ("numpy",)),
    ("ai-edge-litert", ("ai-edge-litert",)),
    ("onnxruntime", ("onnxruntime", "onnxruntime-gpu")),
    ("tf2onnx", ("tf2onnx",)),
    ("onnx", ("onnx",)),
    ("tensorflowjs", ("tensorflowjs",)),
    ("hypothesis", ("hypothesis",)),
    ("pytest", ("pytest",)),
    ("pytest-modelparity", ("pytest-modelparity",)),
)


def rows_from_report(report: Any, *, nodeid: str, format: str | None, device: str | None,
                     kind: str, seq: int, diagnose: bool = True) -> list[dict]:
    """One row per output of a ``ComparisonReport`` (``seq`` orders comparisons in a test),
    built on each output's own JSON form (``OutputComparison.to_dict``).

    ``diagnose=False`` leaves out hints not computed yet (a failing Hypothesis example that
    is not the one reported) instead of running the diagnosis for a row nobody reads first.
    """
    rows: list[dict] = []
    found = getattr(report, "hints", None)
    pending = bool(getattr(found, "pending", False)) and not diagnose
    hint_list = [] if pending else list(found or [])
    hints = [getattr(h, "message", str(h)) for h in hint_list]
    evidence = [str(getattr(h, "evidence", "") or "") for h in hint_list]
    title = getattr(report, "title", kind)
    meta = getattr(report, "meta", None) or {}
    # A test without the matrix fixtures (e.g. models loaded with load_model) still gets the
    # format/device when the assertion recorded them.
    format = format or (meta.get("format") if isinstance(meta.get("format"), str) else None)
    device = device or (meta.get("device") if isinstance(meta.get("device"), str) else None)
    calib = meta.get("calibration")
    calibration: dict = calib if isinstance(calib, dict) else {}
    shadow_meta = meta.get("shadow")
    twin_info: dict = shadow_meta if isinstance(shadow_meta, dict) else {}
    found_binding = meta.get("binding")
    bound: dict = found_binding if isinstance(found_binding, dict) else {}
    paired = {f"[{p['reference']!r}]": {**p, "model": bound.get("model")} for p in bound.get("outputs") or []
              if isinstance(p, dict)}
    for out in getattr(report, "outputs", []) or []:
        d = out.to_dict()
        tol = d["tolerance"] or {}
        row = {
            "nodeid": nodeid,
            "format": format,
            # What actually computed, when the model says more than its format name: the tfjs
            # backend that ran ("tfjs:wasm" / "tfjs:cpu"), the tflite variant, the onnx opset.
            "format_variant": meta.get("format") if isinstance(meta.get("format"), str) else None,
            "device": device,
            "check": kind,
            "title": title,
            "seq": seq,
            "output": d["path"] or "",
            # a decision made on too few rows (checks/quant_rows.py) is neither a pass nor a failure
            "verdict": ("inconclusive" if d["inconclusive"] else "pass") if d["passed"] else "fail",
            "max_abs": d["max_abs"],
            "max_abs_index": d["max_abs_index"],
            "output_scale": d["scale"],
            **{k: d[k] for k in ("max_rel", "max_ulp", "mean_abs", "min_atol", "min_rtol", "size", "mismatched")},
            "shape": d["expected_shape"],
            "dtype": d["expected_dtype"],
            "problem": d["problem"],
            "notes": d["notes"],
            "hints": hints,
            "hint_evidence": evidence,
            "reported": diagnose,
            "calibration": calibration.get("summary") if isinstance(calibration.get("summary"), str) else None,
            "error_histogram": d["error_histogram"],
            "tolerance": tol.get("text"),
            "tolerance_source": tol.get("source"),
            "tolerance_rule": tol.get("rule"),
            # Which float64 twin measured the model's own error ("keras", "graph"), or why
            # none could and the output was judged by a fixed rule instead.
            "twin": twin_info.get("twin") if "run of its" in str(tol.get("source")) else None,
            # that twin's measurement was read from the floor cache (exports/floor_cache.py): none built
            "floor_cached": ("floor cache" in str(twin_info.get("float64", ""))) if "run of its" in
                            str(tol.get("source")) else None,
            "noise_floor_missing": tol.get("floor_note"),
            "rtol": tol.get("rtol"),
            "atol": tol.get("atol"),
            "scale": tol.get("scale"),
            # the bulk of the error (verdict/bulk.py): each statistic's value, bound and noise figure,
            # and what failed in words; null where no bulk bound judged
            "bulk": d["bulk"],
            "quantized": _quantized_row(meta, d["path"] or ""),
            # the decision over rows and the threshold it applied (at most "allowed" of "trials")
            "decision": d["decision"],
            "inconclusive": d["inconclusive"],
            # which tensor of the other form this output was compared with, and on what basis
            # (formats/binding.py): None where the two forms' outputs were not paired
            "paired_with": _paired_row(paired, d["path"] or ""),
            # --modelparity-power: each planted bug and whether this output's bound caught it
            "power": _power_row(meta, d["path"] or ""),
            # ...and what each plant was (the kernel and its factor) and which part of the verdict caught it
            "power_plants": _power_plants(meta, d["path"] or ""),
        }
        rows.append(row)
    return rows


def _power_row(meta: dict, path: str) -> dict | None:
    """``{"kernel x1.01": "caught", ...}`` for one output (checks/power.py), or None when the run
    did not measure its power here."""
    plants = _plants_of(meta, path)
    return None if plants is None else {kind: str((b.get("outputs") or {}).get(path, "not reached"))
                                        for kind, b in plants.items()}


def _plants_of(meta: dict, path: str) -> dict[str, dict] | None:
    """Per bug kind, the plant that judged output ``path``: a kernel is planted per output (the one
    most influential on it), so of several plants of one kind the one whose outputs name ``path``."""
    planted = meta.get("power")
    if not isinstance(planted, list):
        return None
    found: dict[str, dict] = {}
    for b in planted:
        if not isinstance(b, dict):
            continue
        kind = str(b.get("bug"))
        if kind not in found or path in (b.get("outputs") or {}):
            found[kind] = b
    return found


def _power_plants(meta: dict, path: str) -> dict | None:
    """``{"kernel x1.01": {"where": "dense/kernel x1.01", "caught_by": "median"}, ...}`` for one output."""
    plants = _plants_of(meta, path)
    if plants is None:
        return None
    return {kind: {"where": str(b.get("where") or ""), "caught_by": (b.get("caught_by") or {}).get(path)}
            for kind, b in plants.items()}


def power_lines(rows: Sequence[dict]) -> list[str]:
    """End-of-run lines of ``--modelparity-power``: one line for the comparisons whose bounds
    caught every planted bug that reached them, and one per comparison that missed one (a PASS
    that could not have failed such a bug)."""
    found: dict[str, dict[str, dict[str, str]]] = {}
    where: dict[tuple[str, str, str], str] = {}
    by: dict[str, int] = {}
    for r in rows:
        power = r.get("power")
        if not isinstance(power, dict):
            continue
        test = str(r.get("nodeid") or "").rpartition("::")[2]
        who = f"{test} ({r.get('title') or r.get('check')})" if test else str(r.get("title") or r.get("check"))
        raw = r.get("power_plants")
        plants: dict = raw if isinstance(raw, dict) else {}
        for bug, verdict in power.items():
            found.setdefault(who, {}).setdefault(bug, {})[str(r.get("output") or "")] = verdict
            plant = plants.get(bug) or {}
            where[(who, bug, str(r.get("output") or ""))] = str(plant.get("where") or "")
            if verdict == "caught" and plant.get("caught_by"):
                by[str(plant["caught_by"])] = by.get(str(plant["caught_by"]), 0) + 1
    caught_all: dict[str, int] = {}
    lines = []
    for who, bugs in found.items():
        judged = {b: v for b, v in bugs.items() if any(x != "not reached" for x in v.values())}
        missed = {b: [o for o, x in v.items() if x == "missed"] for b, v in judged.items()}
        missed = {b: o for b, o in missed.items() if o}
        if not missed:
            for b in judged:
                caught_all[b] = caught_all.get(b, 0) + 1
            continue
        lines.append(f"modelparity: power of {who}: {len(judged) - len(missed)} of {len(judged)} planted bug(s) "
                     "caught; MISSED " + "; ".join(
                         f"{b} on " + ", ".join(_missed_where(o, where.get((who, b, o), "")) for o in outs)
                         for b, outs in missed.items())
                     + " (these bounds would pass such a bug: see docs/tolerances.md)")
    full = len(found) - len(lines)
    if full:
        each = ", ".join(f"{b} in {n}" for b, n in caught_all.items())
        lines.insert(0, f"modelparity: power: {full} of {len(found)} comparison(s) caught every planted bug that "
                        f"reached them ({each or 'none reached'})")
    if by and lines:
        lines.insert(1, "modelparity: power: what caught the plants, per output: " + ", ".join(
            f"{k} {n}" for k, n in sorted(by.items(), key=lambda kv: -kv[1])) + " (max: the per-element bound; "
            "median, q90, mean_signed: the bulk of the error; top-1: the rows' argmax)")
    return lines


def _missed_where(output: str, where: str) -> str:
    """``['scores'] (dense_1/kernel x1.01)``: a missed output with the plant that missed it."""
    name = output or "the output"
    return f"{name} ({where})" if where and where != "every float input" else name


def _paired_row(paired: dict, path: str) -> dict | None:
    pair = paired.get(path)
    if pair is None and path.startswith("[") and len(paired) == 1:  # e.g. ['probs'][0] under one output
        pair = next((p for k, p in paired.items() if path.startswith(k)), None)
    if pair is None:
        return None
    return {"name": pair.get("other"), "basis": pair.get("basis"), "how": pair.get("how") or None,
            "model": pair.get("model") if isinstance(pair.get("model"), str) else None}


def values_line(rows: Sequence[dict]) -> str | None:
    """The end-of-run line naming every (model, format) whose outputs were paired by their values
    on the batch (formats/binding.py's last resort: no name or export record said which is which),
    and the pairs; None when none was. A passing row says nothing of it, so it is said here."""
    found: dict[tuple[str, str], dict[str, str]] = {}
    for r in rows:
        p = r.get("paired_with") or {}
        if p.get("basis") == "values":
            where = (str(p.get("model") or r.get("nodeid")), str(r.get("format_variant") or r.get("format") or "?"))
            found.setdefault(where, {})[str(r.get("output"))] = str(p.get("name"))
    if not found:
        return None
    parts = [f"{fmt} of {model!r}: " + ", ".join(f"{out}~{name!r}" for out, name in sorted(pairs.items()))
             for (model, fmt), pairs in found.items()]
    return ("modelparity: outputs paired by their values on the batch, not by name or export record (a file that "
            "labels them the wrong way round would not be seen): " + "; ".join(parts) +
            "; name the pairing with bind= or a modelparity_bind fixture to check it")


_PARTS = ("conversion", "quantisation", "float16 weights", "float16 textures")  # checks/quantized.py and float16_textures.py


def _quantized_row(meta: dict, path: str) -> dict | None:
    """For a quantised candidate judged in two parts (checks/quantized.py): which part this output
    row is, the verdict's summary and how the int8 file was calibrated; else None."""
    info = meta.get("quantized")
    if not isinstance(info, dict):
        return None
    part = path[2:].split("'", 1)[0] if path.startswith("['") else ""
    if part not in _PARTS:  # a file without its float sibling: one part, the budget against the reference
        part = "quantisation"
    return {"part": part, "against": info.get("against"), "variant": info.get("variant"), "failed_parts": info.get("failed_parts"),
            "summary": meta.get("summary"), "calibration": info.get("calibration")}


def _badness(row: dict) -> tuple:
    m = row.get("max_abs")
    m = float("inf") if isinstance(m, str) else (m or 0.0)
    # the failure the test reported (with its diagnosis) before a larger one it did not
    return (row["verdict"] == "fail", row["verdict"] == "inconclusive", bool(row.get("reported")), m)


def merge_rows(rows: Sequence[dict]) -> list[dict]:
    """Keep the worst row per (check, title, output) of one test, counting the runs merged.

    A ``@given`` test compares once per example; the table wants one line per output, and
    the worst example (a failure first, then the largest error) is the one worth showing.
    """
    merged: dict[tuple, dict] = {}
    for row in rows:
        key = (row["nodeid"], row["check"], row["title"], row["output"])
        runs = merged[key]["runs"] + 1 if key in merged else 1
        if key not in merged or _badness(row) > _badness(merged[key]):
            merged[key] = dict(row)
        merged[key]["runs"] = runs
    return list(merged.values())


def inconclusive_line(rows: Sequence[dict]) -> str | None:
    """The end-of-run line counting quantised decisions the rows did not settle (verdict
    ``inconclusive``): a green run must not read as judged. None when there are none."""
    short = [r for r in rows if r["verdict"] == "inconclusive"]
    if not short:
        return None
    first = short[0]
    tests = len({r["nodeid"] for r in short})
    return (f"modelparity: {len(short)} quantised verdict(s) in {tests} test(s) INCONCLUSIVE, not passed: the rows "
            f"proved them neither within nor beyond their budget (first: {first['nodeid']} {first['output'] or 'output'}: "
            f"{str(first.get('inconclusive') or '').removeprefix('INCONCLUSIVE: ')}); --modelparity-strict makes "
            "them failures")


def floor_line(rows: Sequence[dict]) -> str | None:
    """The end-of-run line counting outputs of model references judged without their float64
    floor (a fixed rule), with the most common reason; None when every one had its floor."""
    missing = [r for r in rows if r.get("noise_floor_missing")]
    if not missing:
        return None
    reasons: dict[str, int] = {}
    for r in missing:
        reason = str(r["noise_floor_missing"]).split("; the fixed rule")[0]
        reasons[reason] = reasons.get(reason, 0) + 1
    top = max(reasons, key=lambda k: reasons[k])
    more = f" (and {len(reasons) - 1} other reason(s))" if len(reasons) > 1 else ""
    return (f"modelparity: {len(missing)} of {len(rows)} outputs were judged without their noise floor, by a "
            f"fixed rule that is likely looser than the model's own float32 error: {top}{more}; "
            "the JSON rows' noise_floor_missing says why for each")


# -- terminal table ---------------------------------------------------------------------

def _short_tolerance(row: dict) -> str:
    if row.get("rtol") is None:
        return row.get("tolerance") or "-"
    text = f"rtol={table_number(row['rtol'])} atol={table_number(row['atol'])}"
    if row.get("scale"):
        text += f" scale={table_number(row['scale'])}"
    return f"{text} ({row.get('tolerance_source') or '?'})"


def device_label(row: dict) -> str:
    """``gpu``, or ``gpu (ref cpu)`` when the reference ran on another device
    (``--modelparity-reference-device``; the test id names both devices either way)."""
    device, ref = row.get("device") or "-", row.get("reference_device")
    return f"{device} (ref {ref})" if ref and ref != device else device


def format_table(rows: Sequence[dict]) -> list[str]:
    """The terminal summary: one line per (test, format, device, check, output)."""
    header = ("test", "format", "device", "check", "output", "verdict", "max abs", "max rel", "max ULP", "tolerance")
    body = []
    for r in rows:
        test = r["nodeid"].rsplit("::", 1)[-1]
        body.append((test, r.get("format") or "-", device_label(r), r.get("check") or "-",
                     r.get("output") or "-", r["verdict"].upper(), table_number(r.get("max_abs")),
                     table_number(r.get("max_rel")), table_number(r.get("max_ulp"), ".4g"), _short_tolerance(r)))
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    widths[0] = min(widths[0], 64)
    lines = []
    for cells in (header, *body):
        cells = tuple(c if len(c) <= widths[i] else c[: widths[i] - 1] + "~" for i, c in enumerate(cells))
        lines.append("  ".join(c.ljust(widths[i]) for i, c in enumerate(cells)).rstrip())
    return lines


# -- JSON report ------------------------------------------------------------------------

def _version(names: Iterable[str]) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        except (MemoryError, OSError, ValueError):  # under a memory limit the report still gets written
            return None
    return None


def _node_version() -> str | None:
    node = shutil.which("node")
    if node is None:
        return None
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _tfjs_version() -> str | None:
    """The @tensorflow/tfjs(-core) version the runner installed (in the npm cache), if installed."""
    try:
        from ..runtime.tfjs_runner import modules_dir

        pkg = modules_dir() / "node_modules" / "@tensorflow" / "tfjs-core" / "package.json"
        return json.loads(pkg.read_text()).get("version")
    except (OSError, ValueError, ImportError):
        return None


def environment() -> dict:
    """Python, platform and the versions of TF and every runtime, without importing them. Each
    field is read on its own: under an address-space limit (``ulimit -v``) starting ``uname -p``
    or ``node --version`` can raise MemoryError, which leaves that field null, not the report."""
    return {
        "python": platform.python_version(),
        "platform": _or_none(platform.platform),
        "packages": {label: _or_none(lambda names=names: _version(names)) for label, names in _PACKAGES},
        "node": _or_none(_node_version),
        "tfjs_npm": _or_none(_tfjs_version),
        "env": {k: os.environ[k] for k in ("TF_ENABLE_ONEDNN_OPTS", "CUDA_VISIBLE_DEVICES") if k in os.environ},
    }


def _or_none(read: Any) -> Any:
    try:
        return read()
    except (MemoryError, OSError, subprocess.SubprocessError):
        return None


def hidden_rows_line(rows: Sequence[dict], shown: Sequence[dict]) -> str:
    """What a shortened table left out, counted by verdict. When nothing was shown (a green
    run), it says so: "N more rows not shown" above no row at all read as a lost table."""
    hidden = [r for r in rows if not any(r is s for s in shown)]
    counts = {v: sum(r["verdict"] == v for r in hidden) for v in ("pass", "expected", "fail", "inconclusive")}
    parts = [f"{counts['pass']} passed"] if counts["pass"] else []
    if counts["expected"]:
        parts.append(f"{counts['expected']} failed as the test expected")
    if counts["fail"]:
        parts.append(f"{counts['fail']} more failed")
    if counts["inconclusive"]:
        parts.append(f"{counts['inconclusive']} more inconclusive")
    what = ", ".join(parts) or "no verdict"
    where = "-v shows every row, --modelparity-report/--modelparity-html write them all"
    if not shown:
        return f"{len(rows)} rows, none failed, so none shown ({what}); {where}"
    return f"... {len(hidden)} more rows not shown ({what}); {where}"


# Words of an export route that changes what the candidate computes (formats/tensorflow/mixed_precision.py).
CHANGED_COMPUTATION = "with a float32 policy"


def route_lines(artifacts: Sequence[dict]) -> list[str]:
    """One line per (source, format) whose export computes differently from the source, e.g.
    a mixed_float16 model converted to TFLite as a float32-policy trace (same weights)."""
    seen: dict[tuple[str, str], str] = {}
    for a in artifacts:
        route = a.get("route")
        if isinstance(route, str) and CHANGED_COMPUTATION in route:
            seen.setdefault((str(a.get("source")), str(a.get("format"))), route)
    return [f"modelparity: {fmt} of {source!r} was exported as a "
            f"{next(p for p in route.split('; ') if CHANGED_COMPUTATION in p)}" for (source, fmt), route in seen.items()]


def browser_line(run: dict) -> str:
    """``tfjs:webgl ran in Chrome/156.0.8078.114 (headless), WebGL 2 on 'ANGLE (...)', float32 textures``."""
    gl = f"WebGL {run.get('webgl_version')} on {run.get('renderer')!r}" if run.get("renderer") else "WebGPU"
    return f"{run.get('format')} ran in {run.get('chromium')} (headless), {gl}, {run.get('textures')} textures"


def sort_rows(rows: Iterable[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["nodeid"], r.get("seq", 0)))


TEST_OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
ROW_VERDICTS = ("pass", "fail", "expected", "inconclusive")


def build_document(*, rows: Sequence[dict], tests: dict[str, dict], artifacts: Sequence[dict],
                   options: dict, workers: int = 0, browsers: Sequence[dict] = ()) -> dict:
    """The JSON report. ``summary`` counts tests by outcome (``failed``, ``error``: tests) and
    rows by verdict (``rows_failed``: outputs) separately: one failing test may hold many rows."""
    rows = sort_rows(rows)
    verdicts = [r["verdict"] for r in rows]
    outcomes = [t.get("outcome") for t in tests.values()]
    summary: dict[str, int] = {"tests": len(tests)}
    summary.update({name: outcomes.count(name) for name in TEST_OUTCOMES})
    summary.update({"comparisons": len({(r["nodeid"], r.get("seq")) for r in rows}), "rows": len(rows)})
    summary.update({f"rows_{'passed' if v == 'pass' else 'failed' if v == 'fail' else v}": verdicts.count(v)
                    for v in ROW_VERDICTS})
    return {
        "schema": "pytest-modelparity/report",
        "schema_version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "environment": environment(),
        "options": json_value(options),
        "workers": workers,
        "summary": summary,
        "tests": [dict(nodeid=k, **v) for k, v in sorted(tests.items())],
        "artifacts": json_value(list(artifacts)),
        "browsers": json_value(list(browsers)),
        "rows": json_value(rows),
    }


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temp file renamed into place, so a crash never
    leaves half a report; when writing fails the temp file is removed before the error rises."""
    return _write_atomic(path, lambda fh: fh.write(text))


def write_json(path: Path, document: dict) -> Path:
    """The JSON report, written atomically and streamed: no copy of the whole text is held (a
    large run's report under ``ulimit -v`` failed building that one string)."""
    def dump(fh: Any) -> None:
        json.dump(document, fh, indent=2, allow_nan=False)
        fh.write("\n")
    return _write_atomic(path, dump)


def _write_atomic(path: Path, write: Callable[[Any], Any]) -> Path:
    """``write(file)`` into a temp file beside ``path``, renamed into place; removed on failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path
