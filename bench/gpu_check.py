"""Does the GPU serving path match the CPU? Run the example suites on a GPU and say by how much.

For a machine that has TensorFlow with a GPU (and, for ONNX, onnxruntime-gpu). It

1. lists the devices TensorFlow and onnxruntime see (and whether TF32 is on);
2. runs the example suites (``conftest_examples/``) with ``--modelparity-device=gpu
   --modelparity-reference-device=cpu``, once with TF32 on (TensorFlow's default) and once
   with ``--modelparity-tf32=off``, each into a JSON report;
3. prints each form's error against the GPU rule: max |actual - expected| as a share of
   the output's scale (max |expected|), beside the share the rule allows there
   (rtol + scale), and the verdict.

TFLite and TFJS run on the CPU only, so the GPU matrix leaves them out (one summary line).
Without any GPU it says so and exits 0 (``--require-gpu``: exit 2). ``--device cpu`` runs
the same path on a CPU (the reference still on ``--reference-device``), which is how the
script itself is checked on machines without a GPU.

    .venv/bin/python bench/gpu_check.py                       # both TF32 modes, all suites
    .venv/bin/python bench/gpu_check.py --tf32 off --suites conftest_examples/keras_all_formats
    .venv/bin/python bench/gpu_check.py --device cpu --run-anyway --tf32 on   # the path, on a CPU

Exit status: 0 when every comparison that ran passed (or nothing could run for lack of a
GPU), 1 when one failed or pytest errored, 2 with ``--require-gpu`` and no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SUITES = REPO / "conftest_examples"
# Checks judged by the scaled rule (the GPU rule); assert_deterministic is exact and is shown
# only when it failed.
CHECKS_SHOWN = ("outputs_close", "batch_invariant")


# -- 1. devices ---------------------------------------------------------------------------

def tensorflow_devices() -> dict[str, Any]:
    """What TensorFlow sees: version, CUDA build, GPUs (name, compute capability), TF32."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError as exc:
        return {"error": f"TensorFlow is not importable ({exc})", "gpus": []}
    gpus = []
    for dev in tf.config.list_physical_devices("GPU"):
        try:
            details = tf.config.experimental.get_device_details(dev)
        except Exception:  # noqa: BLE001 - details are informative only
            details = {}
        gpus.append({"name": dev.name, "device_name": details.get("device_name"),
                     "compute_capability": details.get("compute_capability")})
    return {"version": tf.__version__, "built_with_cuda": bool(tf.test.is_built_with_cuda()),
            "gpus": gpus, "cpus": len(tf.config.list_physical_devices("CPU")),
            "tf32": bool(tf.config.experimental.tensor_float_32_execution_enabled())}


def onnxruntime_devices() -> dict[str, Any]:
    """What onnxruntime sees: version, providers, and whether CUDA is among them."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return {"error": f"onnxruntime is not importable ({exc})", "providers": [], "cuda": False}
    providers = list(ort.get_available_providers())
    return {"version": ort.__version__, "providers": providers, "device": ort.get_device(),
            "cuda": "CUDAExecutionProvider" in providers}


def print_devices(tf_info: dict, ort_info: dict) -> None:
    print("== devices")
    if "error" in tf_info:
        print(f"TensorFlow: {tf_info['error']}")
    else:
        gpus = ", ".join(f"{g['name']} ({g.get('device_name') or '?'}, compute capability "
                         f"{g.get('compute_capability') or '?'})" for g in tf_info["gpus"]) or "none"
        print(f"TensorFlow {tf_info['version']} (built with CUDA: {tf_info['built_with_cuda']}): "
              f"GPUs: {gpus}; CPUs: {tf_info['cpus']}; TF32 enabled: {tf_info['tf32']}")
    if "error" in ort_info:
        print(f"onnxruntime: {ort_info['error']}")
    else:
        print(f"onnxruntime {ort_info['version']} (device {ort_info['device']}): "
              f"providers {', '.join(ort_info['providers'])}")
    print("TFLite (LiteRT) and TFJS (Node.js): CPU only in pytest-modelparity")


def no_gpu_message(tf_info: dict, ort_info: dict) -> str | None:
    """The reason nothing can run on a GPU here, or None when something can."""
    if tf_info.get("gpus") or ort_info.get("cuda"):
        return None
    tf_why = tf_info.get("error") or (
        "TensorFlow sees no GPU (tf.config.list_physical_devices('GPU') is empty"
        + ("" if tf_info.get("built_with_cuda") else "; this TensorFlow is not built with CUDA") + ")")
    ort_why = ort_info.get("error") or (
        f"onnxruntime has no CUDAExecutionProvider (providers: {', '.join(ort_info.get('providers', []))})")
    return (f"NO GPU PRESENT: {tf_why}; {ort_why}. Nothing here can run on a GPU: run this on a "
            "machine with a CUDA GPU, TensorFlow built with CUDA (pip install 'tensorflow[and-cuda]') "
            "and onnxruntime-gpu.")


# -- 2. the suites ----------------------------------------------------------------------------

def run_suites(suites: list[str], *, device: str, reference_device: str, tf32: str, workdir: Path,
               timeout: float, extra: list[str]) -> tuple[int, dict | None, str]:
    """pytest on the suites with the GPU options; (exit code, JSON report or None, output tail)."""
    report = workdir / f"gpu_check_tf32_{tf32}.json"
    cmd = [sys.executable, "-m", "pytest", *suites, f"--modelparity-device={device}",
           f"--modelparity-reference-device={reference_device}", f"--modelparity-tf32={tf32}",
           f"--modelparity-report={report}", "-p", "no:cacheprovider", "-q", "-rs", *extra]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print(f"\n== TF32 {tf32}: {' '.join(cmd[2:])}", flush=True)
    try:
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code, out = 124, f"pytest did not finish within {timeout:.0f} s ({exc})"
    doc = json.loads(report.read_text()) if report.exists() else None
    return code, doc, out


# -- 3. each form's error against the GPU rule ---------------------------------------------

def _f(value: Any) -> float | None:
    return value if isinstance(value, (int, float)) else None


def error_rows(doc: dict) -> list[dict]:
    """One line per output compared: the error as a share of scale beside the rule's share."""
    lines = []
    for row in doc.get("rows", []):
        if row.get("check") not in CHECKS_SHOWN and row.get("verdict") != "fail":
            continue
        max_abs, scale = _f(row.get("max_abs")), _f(row.get("output_scale"))
        share = max_abs / scale if max_abs is not None and scale else None
        rtol, rule_scale = _f(row.get("rtol")) or 0.0, _f(row.get("scale")) or 0.0
        allowed = rtol + rule_scale if row.get("tolerance_rule") == "scaled" else None
        lines.append({"test": row["nodeid"].split("::")[-1], "format": row.get("format") or "-",
                      "device": row.get("device") or "-", "reference": row.get("reference_device") or "-",
                      "check": row.get("check"), "output": row.get("output") or "",
                      "err_share": share, "allowed_share": allowed, "max_abs": max_abs,
                      "verdict": row.get("verdict"), "source": row.get("tolerance_source") or ""})
    return lines


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def print_errors(lines: list[dict]) -> None:
    if not lines:
        print("(no comparison ran: see the skips above)")
        return
    header = ("test", "format", "device", "ref", "check", "err/scale", "allowed", "used", "verdict", "rule")
    body = []
    for ln in lines:
        used = (ln["err_share"] / ln["allowed_share"]
                if ln["err_share"] is not None and ln["allowed_share"] else None)
        body.append((ln["test"][:60], ln["format"], ln["device"], ln["reference"], ln["check"],
                     _g(ln["err_share"]), _g(ln["allowed_share"]), "-" if used is None else f"{used:.0%}",
                     str(ln["verdict"]).upper(), ln["source"]))
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]
    for r in [header, *body]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())


def outcome_counts(doc: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in doc.get("tests", {}).values() if isinstance(doc.get("tests"), dict) else doc.get("tests", []):
        outcome = entry.get("outcome", "?")
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suites", nargs="*", default=[str(SUITES)], help="test paths (default: conftest_examples)")
    parser.add_argument("--device", default="gpu", help="candidate device (default gpu)")
    parser.add_argument("--reference-device", default="cpu", help="reference device (default cpu)")
    parser.add_argument("--tf32", default="on,off", help="TF32 modes to run, comma-separated (default on,off)")
    parser.add_argument("--run-anyway", action="store_true", help="run the suites even without a GPU")
    parser.add_argument("--require-gpu", action="store_true", help="exit 2 when no GPU is present")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per pytest run")
    parser.add_argument("pytest_args", nargs="*", default=[], help="after --: passed to pytest")
    args = parser.parse_args(argv)

    tf_info, ort_info = tensorflow_devices(), onnxruntime_devices()
    print_devices(tf_info, ort_info)
    missing = no_gpu_message(tf_info, ort_info)
    if missing:
        print(missing, flush=True)
        if args.require_gpu:
            return 2
        if not args.run_anyway:
            return 0
    worst = 0
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for mode in [m.strip() for m in args.tf32.split(",") if m.strip()]:
            code, doc, out = run_suites(args.suites, device=args.device, reference_device=args.reference_device,
                                        tf32=mode, workdir=Path(tmp), timeout=args.timeout, extra=args.pytest_args)
            tail = [ln for ln in out.splitlines() if ln.strip()]
            for ln in [ln for ln in tail if "left out" in ln or ln.startswith("SKIPPED")][:20]:
                print(ln)
            if doc is None:
                print(f"pytest exit {code}, no report written; its output ends with:\n" + "\n".join(tail[-30:]))
                worst = max(worst, 1)
                continue
            print_errors(error_rows(doc))
            print(f"pytest exit {code}; tests: {outcome_counts(doc)}; options: device "
                  f"{doc.get('options', {}).get('devices')}, reference "
                  f"{doc.get('options', {}).get('reference_device')}, TF32 {doc.get('options', {}).get('tf32')}")
            if code not in (0, 5):  # 5: nothing collected
                worst = max(worst, 1)
    return worst


if __name__ == "__main__":
    sys.exit(main())
