"""The default verdict's power, swept (issue 47): every net x every float form, the correct form
(a failure is a false alarm) and each planted bug, caught or missed by the plugin's own verdict
(``assert_outputs_close`` with the float64 floor and the bulk statistics), with oneDNN on and off.

Nets: bench/bulk_noise.py's (the log-magnitude audio net, MobileNetV3Small, EfficientNetB0 at
64 px with trained-like statistics, a GELU Transformer encoder, a BiLSTM text model, a two-head
regression net). Bugs: bulk_noise.py's ``planted`` (the most influential, a middle and an early
kernel, each x1.01 and x1.001; the float input x255/256 and x1023/1024) and, where a net has two
outputs of one shape, the two swapped. A bug is planted as ``--modelparity-power`` plants it:
into the reference (a Keras clone), judged against the correct form's outputs, computed once;
the difference judged is the same as a candidate carrying the bug, without exporting 8 more
files per form. ``reached``: the bug moves that output at all (an early kernel of one head may
not reach the other); a bug is ``caught`` on a form when every output it reaches fails.

``--onednn both`` (default) runs two children, ``TF_ENABLE_ONEDNN_OPTS=1`` and ``=0``, and says
what TensorFlow itself reported in each (on a CPU without AVX512_VNNI/BF16, AVX_VNNI or AMX,
TensorFlow leaves oneDNN off unless the variable says 1).

Run:  .venv/bin/python bench/power_sweep.py [--nets logmag,...] [--forms ...] [--onednn on|off|both]
      [--json power-sweep.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

FORMS = ("saved_model", "graphdef", "tflite", "onnx", "tfjs")
SWAP = "swap"


def sweep(nets: list[str], forms: list[str]) -> list[dict]:
    from bulk_noise import BUGS, build, planted, run_form

    from pytest_modelparity import ParityError, assert_outputs_close

    rng = np.random.default_rng(0)
    rows = []
    for name in nets:
        model, x = build(name, rng)
        names = list(model.output_names)
        clean = {k: np.asarray(v) for k, v in _leaves(model(x, training=False), names).items()}
        bugs = {b: planted(model, b, x) for b in BUGS}
        planted_out = {b: {k: np.asarray(v) for k, v in _leaves(bad(x, training=False), names).items()}
                       for b, bad in bugs.items()}
        reached = {b: [k for k, v in out.items() if not np.array_equal(v, clean[k])] for b, out in planted_out.items()}
        # how far each bug moves the Keras float32 outputs: max |change| / scale, the largest over outputs
        moves = {b: max((float(np.max(np.abs(out[k].astype(np.float64) - clean[k]))) / (float(np.max(np.abs(clean[k]))) or 1.0)
                         for k in out), default=0.0) for b, out in planted_out.items()}
        with tempfile.TemporaryDirectory() as t:
            for form in forms:
                t0 = time.time()
                try:
                    got = run_form(model, form, x, Path(t))
                except Exception as exc:  # noqa: BLE001 - a refusal is a row
                    rows.append({"net": name, "form": form, "correct": f"not exported ({type(exc).__name__})"})
                    print(name, form, rows[-1]["correct"], flush=True)
                    continue
                got = {k: v.astype(np.float32) for k, v in _paired(got, clean).items()}
                row = {"net": name, "form": form, "correct": _verdict(got, model, x, assert_outputs_close, ParityError),
                       "bugs": {}}
                for bug, bad in bugs.items():
                    if not reached[bug]:
                        row["bugs"][bug] = "not reached"
                        continue
                    failed = _failed_outputs(got, bad, x, assert_outputs_close, ParityError)
                    row["bugs"][bug] = "caught" if set(reached[bug]) <= failed else (
                        f"missed on {sorted(set(reached[bug]) - failed)} (moves the outputs by {moves[bug]:.2g} of scale)")
                same_shape = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if clean[a].shape == clean[b].shape]
                if same_shape:
                    a, b = same_shape[0]
                    swapped = {**got, a: got[b], b: got[a]}
                    failed = _failed_outputs(swapped, model, x, assert_outputs_close, ParityError)
                    row["bugs"][SWAP] = "caught" if {a, b} <= failed else f"missed on {sorted({a, b} - failed)}"
                rows.append(row)
                print(name, form, row["correct"], row["bugs"], f"({time.time() - t0:.0f} s)", flush=True)
    return rows


def _leaves(out, names) -> dict:
    if isinstance(out, dict):
        return dict(out)
    if isinstance(out, (list, tuple)):
        return dict(zip(names, out))
    return {names[0]: out}


def _paired(got: dict, clean: dict) -> dict:
    if set(got) >= set(clean):
        return {k: got[k] for k in clean}
    if len(got) == len(clean) == 1:
        return {next(iter(clean)): next(iter(got.values()))}
    return dict(zip(clean, got.values()))


def _verdict(got, reference, x, assert_outputs_close, ParityError) -> str:
    try:
        assert_outputs_close(got, reference, inputs=x)
        return "pass"
    except ParityError as exc:
        return f"FALSE ALARM: {str(exc).splitlines()[0][:160]}"


def _failed_outputs(got, reference, x, assert_outputs_close, ParityError) -> set:
    try:
        assert_outputs_close(got, reference, inputs=x)
        return set()
    except ParityError as exc:
        return {o.path.strip("[]'\"") for o in exc.report.outputs if not o.passed} | (
            set(got) if len(got) == 1 else set())  # paths read "['mean']"; a lone output's may be empty


def table(rows: list[dict], conditions: dict) -> str:
    from bulk_noise import BUGS

    bugs = list(BUGS) + [SWAP]
    lines = [f"oneDNN {'on' if conditions.get('onednn') else 'off'} ({conditions.get('onednn_why', '')})", "",
             "| net | form | correct form | " + " | ".join(bugs) + " |", "|---|---|---|" + "---|" * len(bugs)]
    for r in rows:
        lines.append(f"| {r['net']} | {r['form']} | {r['correct'][:40]} | "
                     + " | ".join(_short(r.get("bugs", {}).get(b, "-")) for b in bugs) + " |")
    judged = [r for r in rows if "bugs" in r]
    alarms = sum(r["correct"].startswith("FALSE ALARM") for r in judged)
    lines.append("")
    lines.append(f"false alarms: {alarms} of {len(judged)} correct forms")
    for b in bugs:
        applied = [r["bugs"][b] for r in judged if b in r["bugs"] and r["bugs"][b] != "not reached"]
        lines.append(f"{b}: caught on {sum(v == 'caught' for v in applied)} of {len(applied)} forms")
    return "\n".join(lines)


def _short(v: str) -> str:
    if v.startswith("missed"):
        return "MISSED" + (f" ({v.split('by ')[1].split(' of')[0]})" if "moves the outputs by" in v else "")
    return "caught" if v == "caught" else "n/r" if v == "not reached" else "-" if v == "-" else v


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", default="logmag,mobilenetv3small,efficientnetb0,encoder_gelu,bilstm,two_heads")
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--onednn", default="both", choices=("on", "off", "both"))
    parser.add_argument("--json", default="power-sweep.json")
    args = parser.parse_args()
    if args.onednn == "both":
        for setting, value in (("on", "1"), ("off", "0")):
            child = [sys.executable, __file__, "--nets", args.nets, "--forms", args.forms, "--onednn", setting,
                     "--json", args.json.replace(".json", f"-onednn-{setting}.json")]
            print(f"== oneDNN {setting} (TF_ENABLE_ONEDNN_OPTS={value})", flush=True)
            subprocess.run(child, env={**os.environ, "TF_ENABLE_ONEDNN_OPTS": value}, check=False)
        return
    started = time.time()
    rows = sweep(args.nets.split(","), args.forms.split(","))
    from pytest_modelparity.fuzz.conditions import conditions_here

    conditions = conditions_here()
    text = table(rows, conditions)
    print(f"\n{len(rows)} forms, {time.time() - started:.0f} s\n{text}", flush=True)
    Path(args.json).write_text(json.dumps({"conditions": conditions, "rows": rows, "table": text}, indent=1,
                                          default=str))


if __name__ == "__main__":
    main()
