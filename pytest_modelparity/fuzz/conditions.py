"""The environment switches a converter defect depends on, read without importing TensorFlow.

Why: both tfjs defects the fuzz run found are made by Grappler's oneDNN rewrites before the
tensorflowjs converter sees the graph (maximum(2x, x) -> LeakyRelu(2), Dense + tanh -> one
_FusedMatMul with a tanh activation). With oneDNN off they do not happen, and TensorFlow turns
oneDNN on by default only on some CPUs, so the same catalogue entry reproduced on an Intel Xeon
and not on an AMD EPYC. A catalogue entry states the conditions it was seen under, a fuzz run
records the conditions it ran under (report, JSON, reproducer), and a failure is labelled with
an entry only where the entry's conditions hold (``known_defects.label_failure``).

The switches:

- ``onednn``: TensorFlow's oneDNN rewrites. ``TF_ENABLE_ONEDNN_OPTS`` decides when set (TF reads
  it once, when it is imported: ``1``/``true`` on, ``0``/``false`` off); unset, TensorFlow's
  default on Linux x86 is on only for CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX
  (tensorflow/core/util/util.cc, ``IsMKLEnabled``). Where TensorFlow is already imported, its own
  answer (``IsMklEnabled``) is taken instead.
- ``xnnpack``: the LiteRT XNNPACK delegate. The plugin's tflite loader runs the file with
  LiteRT's default delegates (XNNPACK on); only its per-layer runs go without. Recorded, so an
  entry seen with it can say so.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Mapping

__all__ = ["ONEDNN_VAR", "ONEDNN_CPU_FLAGS", "conditions_here", "differences", "env_for", "describe"]

ONEDNN_VAR = "TF_ENABLE_ONEDNN_OPTS"
# The CPU features for which TensorFlow turns oneDNN on by default on Linux (util.cc, IsMKLEnabled).
ONEDNN_CPU_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
_TRUE, _FALSE = ("1", "true"), ("0", "false")


def _cpu() -> tuple[str, set[str]]:
    """The CPU's model name and flags (/proc/cpuinfo; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "?", set()
    name, flags = "?", set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and name == "?":
            name = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return name, flags


def _onednn(env: Mapping[str, str], flags: set[str]) -> tuple[bool, str]:
    """(on, why) for oneDNN in a process started with ``env``, before TensorFlow is imported."""
    value = env.get(ONEDNN_VAR)
    if value is not None and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE, f"{ONEDNN_VAR}={value.strip()}"
    x86_linux = sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")
    has = sorted(f for f in ONEDNN_CPU_FLAGS if f in flags)
    if not x86_linux:
        return False, f"TensorFlow's default off {sys.platform}/{platform.machine()}: {ONEDNN_VAR} unset"
    if has:
        return True, f"TensorFlow's default on this CPU: {ONEDNN_VAR} unset, it has {', '.join(f.upper() for f in has)}"
    return False, (f"TensorFlow's default on this CPU: {ONEDNN_VAR} unset, it has none of "
                   f"{', '.join(f.upper() for f in ONEDNN_CPU_FLAGS)}")


def conditions_here(env: Mapping[str, str] | None = None) -> dict[str, object]:
    """The conditions a process with ``env`` (default: this one's) converts and runs under:
    ``onednn`` and ``xnnpack`` (bools), why oneDNN is so, the CPU, and the variables set."""
    env = os.environ if env is None else env
    name, flags = _cpu()
    onednn, why = _onednn(env, flags)
    if env is os.environ and "tensorflow" in sys.modules:  # TensorFlow read the variable already: ask it
        try:
            from tensorflow.python.util import _pywrap_util_port  # noqa: PLC0415 - only when TF is loaded

            told = bool(_pywrap_util_port.IsMklEnabled())
            if told != onednn:
                why = f"TensorFlow says {'on' if told else 'off'} (expected {'on' if onednn else 'off'}: {why})"
            onednn = told
        except Exception:  # noqa: BLE001 - the reading above stands
            pass
    return {"onednn": onednn, "onednn_why": why, "xnnpack": True,
            "xnnpack_why": "LiteRT's default delegates, as the plugin's tflite loader runs a file",
            "cpu": name, "env": {ONEDNN_VAR: env[ONEDNN_VAR]} if ONEDNN_VAR in env else {}}


SWITCHES = {"onednn": "oneDNN", "xnnpack": "XNNPACK"}


def describe(conditions: Mapping[str, object]) -> str:
    """``oneDNN on (TF_ENABLE_ONEDNN_OPTS=1), XNNPACK on, CPU AMD EPYC``."""
    parts = []
    for key, label in SWITCHES.items():
        if key in conditions:
            why = conditions.get(f"{key}_why")
            parts.append(f"{label} {'on' if conditions[key] else 'off'}" + (f" ({why})" if key == "onednn" and why else ""))
    if conditions.get("cpu"):
        parts.append(f"CPU {conditions['cpu']}")
    return ", ".join(parts)


def differences(required: Mapping[str, bool], here: Mapping[str, object]) -> list[str]:
    """One note per switch ``required`` sets that ``here`` does not hold."""
    notes = []
    for key, wanted in required.items():
        if key in here and bool(here[key]) != bool(wanted):
            label = SWITCHES.get(key, key)
            why = here.get(f"{key}_why")
            notes.append(f"the entry was seen with {label} {'on' if wanted else 'off'}; this run has it "
                         f"{'on' if here[key] else 'off'}" + (f" ({why})" if why else ""))
    return notes


def env_for(required: Mapping[str, bool]) -> dict[str, str]:
    """The environment variables that give a new process the ``required`` conditions (set before
    TensorFlow is imported). XNNPACK has no variable: the plugin's tflite loader always uses it."""
    env = {}
    if "onednn" in required:
        env[ONEDNN_VAR] = "1" if required["onednn"] else "0"
    return env
