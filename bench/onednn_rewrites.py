"""Do the tfjs converter's oneDNN-dependent rewrites happen here? (issue 46)

    python bench/onednn_rewrites.py            # runs each case under TF_ENABLE_ONEDNN_OPTS unset, 1 and 0

Each case is a tiny Keras model converted by the bare tensorflowjs converter
(``convert_tf_saved_model``, no plugin rewrites) in a fresh process with the variable set before
TensorFlow is imported; the ops of the written model.json are read, and the file is run by the
plugin's Node.js tfjs runner (cpu backend) against Keras. Cases:

- ``maximum``: Dense(4) -> maximum(2x, x): is it rewritten to LeakyRelu(alpha=2)?
- ``dense_tanh``: Dense(4, activation='tanh') with a non-zero bias: is it fused into one
  _FusedMatMul with a tanh activation, and does tfjs run it?
- ``dense_then_tanh``: the same with tanh as a separate Activation layer (the workaround tried).

Prints one JSON line per (case, setting) and the CPU's flags that decide TensorFlow's oneDNN default.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ("maximum", "dense_tanh", "dense_then_tanh")


def one(case: str, workdir: str) -> dict:
    import numpy as np
    import keras

    sys.path.insert(0, str(ROOT))
    from pytest_modelparity.formats.tfjs.export import import_converter
    from pytest_modelparity.formats import load_model

    keras.utils.set_random_seed(0)
    inp = keras.Input((8,))
    if case == "maximum":
        x = keras.layers.Dense(4)(inp)
        out = keras.ops.maximum(x * 2.0, x)
    elif case == "dense_tanh":
        out = keras.layers.Dense(4, activation="tanh", bias_initializer="random_normal")(inp)
    else:
        x = keras.layers.Dense(4, bias_initializer="random_normal")(inp)
        out = keras.layers.Activation("tanh")(x)
    model = keras.Model(inp, out)
    batch = np.random.default_rng(0).normal(size=(4, 8)).astype("float32")
    expected = np.asarray(model(batch))
    model.export(os.path.join(workdir, "saved"), verbose=False)
    import_converter().convert_tf_saved_model(os.path.join(workdir, "saved"), os.path.join(workdir, "tfjs"))
    spec = json.loads(Path(workdir, "tfjs", "model.json").read_text())
    nodes = spec["modelTopology"]["node"]
    ops = sorted({n["op"] for n in nodes if n["op"] not in ("Const", "Placeholder", "Identity")})
    fused = [[f.decode() if isinstance(f, bytes) else f for f in n.get("attr", {}).get("fused_ops", {}).get("list", {}).get("s", [])]
             for n in nodes if n["op"].startswith("_Fused")]
    import base64
    fused = [[base64.b64decode(f).decode() for f in fl] for fl in fused]
    result: dict = {"ops": ops, "fused_ops": fused}
    for backend in ("cpu", "wasm"):
        try:
            cand = load_model(os.path.join(workdir, "tfjs", "model.json"), "tfjs", backend=backend)
            try:
                got = np.asarray(list(cand.predict(batch).values())[0])
            finally:
                cand.close()
            result[backend] = f"runs, max abs error {float(np.max(np.abs(got - expected))):.2g}"
        except Exception as exc:  # noqa: BLE001 - what tfjs said is the measurement
            result[backend] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:240]}"
    from tensorflow.python.util import _pywrap_util_port
    result["tf_onednn_enabled"] = bool(_pywrap_util_port.IsMklEnabled())
    return result


def cpu_flags() -> dict:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    model = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                  if l.startswith("model name")), "?")
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
    return {"cpu": model, **{f: f in flags for f in wanted}}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        with tempfile.TemporaryDirectory() as tmp:
            print("RESULT " + json.dumps(one(sys.argv[2], tmp)))
        return
    print(json.dumps(cpu_flags()))
    for setting in (None, "1", "0"):
        for case in CASES:
            env = dict(os.environ)
            env.pop("TF_ENABLE_ONEDNN_OPTS", None)
            if setting is not None:
                env["TF_ENABLE_ONEDNN_OPTS"] = setting
            env["TF_CPP_MIN_LOG_LEVEL"] = "2"
            proc = subprocess.run([sys.executable, __file__, "--child", case], env=env, capture_output=True, text=True)
            line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
            got = json.loads(line[7:]) if line else {"crashed": proc.stderr[-500:]}
            print(json.dumps({"TF_ENABLE_ONEDNN_OPTS": setting, "case": case, **got}), flush=True)


if __name__ == "__main__":
    main()
