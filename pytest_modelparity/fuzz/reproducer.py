"""What a fuzz run keeps of a failure: the smallest draw that still fails the same way, and a
standalone reproducer folder. No pytest here: ``--modelparity-fuzz`` and ``bench/fuzz.py`` share it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .model_draw import minimize

SHRINK_SECONDS = 120.0  # per distinct failure


def shrink_failure(worker: Any, drawn: Any, outcome: Any, root: Path,
                   budget_s: float = SHRINK_SECONDS) -> tuple[Any, Any, int]:
    """The smallest draw failing the same way on the same format, by single-step deletions."""
    last = {"outcome": outcome}
    calls = 0

    def same(candidate: Any) -> bool:
        nonlocal calls
        calls += 1
        (got,) = worker.check(candidate, [outcome.format], workdir=root)
        if got.key == outcome.key:
            last["outcome"] = got
            return True
        return False

    minimal = minimize(drawn, same, budget_s=budget_s)
    return minimal, last["outcome"], calls


def versions_here() -> dict[str, str]:
    from importlib import metadata

    found = {}
    for dist in ("tensorflow", "tensorflow-cpu", "keras", "ai-edge-litert", "tf2onnx", "onnx", "onnxruntime",
                 "tensorflowjs", "pytest-modelparity"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return found


def write_reproducer(out_dir: Path, drawn: Any, outcome: Any, conditions: dict[str, Any] | None = None) -> Path:
    """``<out_dir>/<format>-<cause>/``: repro.py (plain Keras rebuild), weights.npz, inputs.npz,
    verdict.txt (the plugin's text, the versions and the conditions).

    ``conditions`` (``fuzz/conditions.py``; default: this process's) are the ones the failure was
    found under: repro.py sets their environment variables (TF_ENABLE_ONEDNN_OPTS) before it
    imports TensorFlow, so a replay meets them whatever the shell it runs in has set."""
    import numpy as np

    from .conditions import conditions_here, describe, env_for

    slug = re.sub(r"[^\w.-]+", "-", f"{outcome.format}-{outcome.known or outcome.status + '-' + outcome.cause}")[:80]
    folder = out_dir / slug.strip("-")
    folder.mkdir(parents=True, exist_ok=True)
    model = drawn.build()
    np.savez(folder / "weights.npz", **{f"w{i}": w for i, w in enumerate(model.get_weights())})
    batch = drawn.batch()
    np.savez(folder / "inputs.npz", **{f"x{i}": x for i, x in enumerate(batch)})
    versions = versions_here()
    resembles = getattr(outcome, "resembles", None)
    label = f"known: {outcome.known}" if outcome.known else (f"new, resembles {resembles}" if resembles else "new")
    note = getattr(outcome, "note", None)
    if note:
        label += f"; {note}"
    conditions = conditions_here() if conditions is None else conditions
    advice = ""
    if outcome.known:
        from .known_defects import by_name

        advice = by_name(outcome.known).advice
    env = env_for({"onednn": bool(conditions["onednn"])}) if "onednn" in conditions else {}
    (folder / "verdict.txt").write_text(f"{outcome.format}: {outcome.status} ({label})\n"
                                        f"versions: {json.dumps(versions)}\n"
                                        f"conditions: {describe(conditions)}\n"
                                        f"environment: {json.dumps(env)}\n"
                                        + (f"workaround: {advice}\n" if advice else "") + f"\n{outcome.text}\n")
    (folder / "conditions.json").write_text(json.dumps(conditions, indent=1, default=str) + "\n")
    header = (f'"""Reproducer written by pytest-modelparity --modelparity-fuzz: {outcome.format} {outcome.status} '
              f'({label}).\n\nModel: {drawn!r}\nVersions: {json.dumps(versions)}\n'
              f'Found under: {describe(conditions)}.\nThe verdict is in verdict.txt. '
              f'Run: python repro.py (exports with the plugin and judges again).\n"""\n')
    body = f'''
import os

# The conditions the failure was found under, set before TensorFlow is imported (it reads
# them once): Grappler's oneDNN rewrites change what a converter is given.
ENVIRONMENT = {env!r}
os.environ.update(ENVIRONMENT)

from pathlib import Path

import keras
import numpy as np

HERE = Path(__file__).parent
FORMAT = {outcome.format!r}


{drawn.source()}

def model_and_inputs():
    model = build_model(keras)
    weights = np.load(HERE / "weights.npz")
    model.set_weights([weights[f"w{{i}}"] for i in range(len(weights.files))])
    inputs = np.load(HERE / "inputs.npz")
    batch = [inputs[f"x{{i}}"] for i in range(len(inputs.files))]
    return model, batch if len(batch) > 1 else batch[0]


if __name__ == "__main__":
    from pytest_modelparity import assert_outputs_close, export_model, load_model

    model, inputs = model_and_inputs()
    path = export_model(model, FORMAT, HERE / "candidate")
    assert_outputs_close(load_model(path, FORMAT.split(":")[0]), model, inputs=inputs)
    print("the converted model agrees: the defect no longer reproduces here")
'''
    (folder / "repro.py").write_text(header + body)
    return folder
