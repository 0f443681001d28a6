"""The test matrix: which formats x devices a test (or the zero-code suite) runs on.

Why a module of its own: the plugin's parametrization and the zero-code suite both need
the same selection (options narrowed by a test's marker), and the zero-code items and the
``parity_candidate`` fixture both turn "this candidate cannot be had" into the same skip or
failure (``ParitySession.candidate_or_skip``). Keeping the selection here lets ``plugin``
import ``zero_code`` one way, never back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from .options import expand_devices

if TYPE_CHECKING:
    from .session import ParitySession

__all__ = ["exportable", "marker_names", "select_matrix", "matrix_pairs", "left_out_line", "item_matrix", "nothing_compared_line",
           "matrix_entries", "only_itself_compared", "SELF_COMPARED", "UNREACHABLE"]


def _marker_list(marker: Any, key: str) -> list[str] | None:
    value = marker.kwargs.get(key) if marker is not None else None
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def marker_names(marker: Any, fmt: str) -> bool:
    """Whether a test's marker chose ``fmt``: any format of a plain ``formats=`` list, only the
    added ones of a relative one (``formats=["+tflite:int8"]``)."""
    from .options import apply_format_words, format_words, is_relative

    words = format_words(_marker_list(marker, "formats") or ())
    if not words:
        return False
    return not is_relative(words) or fmt in apply_format_words(words, ()).added


def exportable(name: str) -> bool:
    """Load-only formats (checkpoint) join the default matrix only when asked for by name."""
    from ..formats import format_module
    from .options import split_format

    return hasattr(format_module(split_format(name)[0]), "export")


def select_matrix(state: "ParitySession", marker: Any, where: str) -> tuple[list[str], list[str]]:
    """The formats and devices one test runs on: the options narrowed by its marker (or, for a
    marker such as ``formats=["+tflite:int8"]``, changed by it)."""
    from .options import (apply_format_words, format_words, is_relative, normalize_formats, parse_devices,
                          unknown_formats_text)

    opts = state.options
    formats = (list(opts.formats) if opts.formats_explicit
               else [f for f in opts.formats if f in opts.formats_added or exportable(f)])
    wanted = format_words(_marker_list(marker, "formats") or ())
    if wanted and is_relative(wanted):
        change = apply_format_words(wanted, formats)
        if change.unknown:
            pytest.fail(unknown_formats_text(f"{where}: @pytest.mark.modelparity(formats=...)", change.unknown, " names"),
                        pytrace=False)
        formats = list(change.formats)
    elif wanted:
        wanted, unknown = normalize_formats(wanted)
        if unknown:
            pytest.fail(unknown_formats_text(f"{where}: @pytest.mark.modelparity(formats=...)", unknown, " names"),
                        pytrace=False)
        # With --modelparity-formats the marker narrows it; without, the marker chooses (a format
        # whose runtime is missing then skips with the install hint instead of vanishing).
        formats = [f for f in formats if f in wanted] if opts.formats_explicit else list(dict.fromkeys(wanted))
    devices = list(expand_devices(opts.devices))
    wanted_devices = _marker_list(marker, "devices")
    if wanted_devices is not None:
        try:
            wanted_norm = parse_devices(",".join(wanted_devices))
        except pytest.UsageError as exc:
            pytest.fail(f"{where}: @pytest.mark.modelparity(devices=...): {exc}", pytrace=False)
        wanted_norm = expand_devices(wanted_norm)
        devices = [d for d in devices if d in wanted_norm]
    return formats, devices


def matrix_pairs(state: "ParitySession", formats: list[str], devices: list[str]) -> list[tuple[str, str]]:
    """The (format, device) pairs to run, formats first: a CPU-only format (TFLite, TFJS) on
    a GPU is not a configuration at all, so it is left out (and remembered on the session for
    one summary line) rather than skipped or failed test by test."""
    from ..runtime.devices import runs_on

    pairs = []
    for fmt in formats:
        for device in devices:
            if runs_on(fmt, device):
                pairs.append((fmt, device))
            elif [fmt, device] not in state.left_out:
                state.left_out.append([fmt, device])
    return pairs


def left_out_line(left_out: list[list[str]], cpu_in_matrix: bool = True) -> str | None:
    """``modelparity: left out of the matrix: tflite, tfjs on gpu (they run on the CPU only)``;
    "their cpu tests still run" only when the CPU is in the matrix (``--modelparity-device=gpu``
    alone runs none)."""
    if not left_out:
        return None
    formats = list(dict.fromkeys(f for f, _ in left_out))
    devices = list(dict.fromkeys(d for _, d in left_out))
    rest = ("their cpu tests still run" if cpu_in_matrix
            else "the CPU is not in this run's matrix, so they ran nowhere: --modelparity-device=all runs them")
    return (f"modelparity: left out of the matrix: {', '.join(formats)} on {', '.join(devices)} "
            f"(they run on the CPU only; {rest})")


def nothing_on_gpu_line(outcomes: dict[str, tuple[str, str, str | None]]) -> str | None:
    """When the matrix held GPU tests and every one of them skipped, say so plainly: a green
    run of skips must not read as "checked on the GPU". ``outcomes``: node id -> (device,
    outcome, reason)."""
    gpu = [(outcome, reason) for device, outcome, reason in outcomes.values() if device.startswith("gpu")]
    if not gpu or any(outcome != "skipped" for outcome, _ in gpu):
        return None
    reason = next((r for _, r in gpu if r), "")
    reason = reason.removeprefix("Skipped: ")
    reason = f" ({reason[:200]}{'...' if len(reason) > 200 else ''})" if reason else ""
    ran = sum(outcome not in ("skipped",) for device, outcome, _ in outcomes.values() if not device.startswith("gpu"))
    tail = f"; {ran} test(s) ran on the CPU" if ran else "; no parity test ran at all"
    return f"modelparity: NOTHING RAN ON A GPU: all {len(gpu)} gpu test(s) were skipped{reason}{tail}"


# The skips of a default-matrix format this source cannot become (session.skip_if_unreachable).
UNREACHABLE = ("cannot be made from this source", "does not apply to this model")
# The words of the skip of a comparison whose candidate is the source's own file (not_compared.py).
SELF_COMPARED = "compared with itself"


def matrix_entries(matrix_outcomes: dict[str, dict]) -> list[dict]:
    """The matrix tests with a format (``ParitySession.matrix_outcomes``), leaving out GPU tests
    that skipped: "NOTHING RAN ON A GPU" says those, and the format's CPU tests say the rest."""
    return [e for e in matrix_outcomes.values() if isinstance(e.get("format"), str)
            and not (str(e.get("device") or "").startswith("gpu") and e.get("outcome") == "skipped")]


def only_itself_compared(matrix_outcomes: dict[str, dict]) -> bool:
    """Whether the run's only "passes" compared the source's own file with itself: every matrix
    test with a format ran on that file or skipped because the source cannot become the format
    (a missing runtime is not that: its skip carries the install hint and keeps the run as it was)."""
    entries = matrix_entries(matrix_outcomes)
    if not any(e.get("itself") for e in entries):
        return False
    return all(e.get("itself") or (e.get("outcome") == "skipped" and
                                   any(u in (e.get("reason") or "") for u in UNREACHABLE + (SELF_COMPARED,)))
               for e in entries)


def nothing_compared_line(outcomes: dict[str, tuple[str, str, str | None]],
                          matrix_outcomes: dict[str, dict] | None = None) -> str | None:
    """When every matrix test skipped because the source can become none of the formats in
    the default matrix, the run compared nothing: a green run of such skips read as a pass
    (a TF1 checkpoint source ran no export test). So did a run whose only passes compared the
    source's own file with itself (a frozen ``.pb`` as ``graphdef``, ``matrix_outcomes``).
    The session then fails with this line."""
    if matrix_outcomes and only_itself_compared(matrix_outcomes):
        return ("modelparity: NOTHING WAS COMPARED: the only candidate that ran was the source's own file, "
                f"{SELF_COMPARED} (see the NOT COMPARED lines); the other formats were skipped because this source "
                "cannot become them. Name formats it can become with --modelparity-formats (a SavedModel or a TF1 "
                "graph converts to tflite, onnx, tfjs)")
    if not outcomes or any(outcome != "skipped" or not any(u in (reason or "") for u in UNREACHABLE)
                           for _, outcome, reason in outcomes.values()):
        return None
    return (f"modelparity: NOTHING WAS COMPARED: all {len(outcomes)} matrix test(s) skipped, because this source "
            "can become none of the formats in the matrix (see the skip reasons, -rs); name formats it can become "
            "with --modelparity-formats (a SavedModel or a TF1 graph converts to tflite, onnx, tfjs)")


def item_matrix(item: pytest.Item) -> tuple[str | None, str | None]:
    """The (format, device) a test item runs on, or None where it has none."""
    fixed = getattr(item, "modelparity_matrix", None)
    if fixed is not None:
        return fixed
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("modelparity_format"), params.get("modelparity_device")
