"""One drawn model through every selected converter: pass, fail, or refused (counted by cause).

Why a module without pytest: the zero-code fuzz run (``plugin/fuzz.py``) and ``bench/fuzz.py``
share it. Each model is exported into its own folder that is removed afterwards and each loaded
form is closed (tfjs: its Node.js process), so a long run does not keep one model's files,
interpreters or processes per model.
"""

from __future__ import annotations

import gc
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .model_draw import DrawnModel

__all__ = ["Outcome", "check_model", "refusal_cause"]


@dataclass
class Outcome:
    """What one format made of one drawn model."""

    format: str
    status: str                 # "pass" | "fail" | "refused" | "error"
    cause: str = ""             # refused/error: the short cause; fail: the known defect or "new"
    text: str = ""              # the verdict text (fail) or the converter's message
    known: str | None = None    # the catalogue entry the failure was proven to be (``label_failure``)
    resembles: str | None = None  # else an entry whose layers it holds, not proven to be it
    note: str | None = None       # why ``resembles`` did not label it (a condition of the entry's differs here)
    seconds: float = 0.0
    ratio: float | None = None  # worst error / allowed, for a pass or a fail

    @property
    def key(self) -> tuple[str, str, str]:
        """Failures with one key are one bug: shrunk once, reported once."""
        return (self.format, self.status, self.known or self.cause)


_REFUSALS = (
    (r"graph input.*not exist|pass.?through|returns its input .* unchanged", "tf2onnx: an output is an input unchanged"),
    (r"output shape is not the model's", "tf2onnx: the file's output shape is not the model's"),
    (r"\bErfc?\b", "exact GELU (Erf/Erfc) unsupported"),
    (r"negative pad|pads.*-\d", "negative pads in a transposed conv"),
    (r"reading 'outputs'", "tfjs run-time error: reading 'outputs'"),
    (r"unsupported ops?: ([\w, ]+)", None),
)


def refusal_cause(text: str) -> str:
    """A short, stable cause for a converter's refusal, so refusals are counted by kind."""
    for pattern, label in _REFUSALS:
        found = re.search(pattern, text, re.IGNORECASE)
        if found:
            return label or f"unsupported ops: {found.group(1).strip()}"
    first = text.strip().splitlines()[0] if text.strip() else "no message"
    first = re.sub(r"/\S+", "<path>", first)  # paths differ per model
    return re.sub(r"\d+", "N", first)[:100]


def _ratio(report: Any) -> float | None:
    """Worst error over its bound across outputs. A pass carries no per-element bound (the
    verdict stops before its statistics pass), so its bound is the rule's constant part,
    ``atol + scale x max|expected|``: with an rtol the ratio is an upper bound."""
    try:
        worst = []
        for o in report.outputs:
            tol = o.tolerance
            if o.max_abs is None or tol is None:
                continue
            allowed = o.max_abs_allowed or (tol.atol + tol.scale * (o.scale or 0.0))
            if allowed:
                worst.append(o.max_abs / allowed)
        return float(max(worst)) if worst else None
    except Exception:  # noqa: BLE001 - a figure for the bench, never a reason to fail
        return None


def check_model(drawn: DrawnModel, formats: Sequence[str], *, workdir: str | Path | None = None,
                batch_size: int = 4, batch_seed: int = 0) -> list[Outcome]:
    """Export ``drawn`` to each format, judge each with the default verdict, release all."""
    from .. import errors
    from ..formats import export_model, load_model
    from ..checks.assertions import assert_outputs_close
    from .conditions import conditions_here
    from .known_defects import label_failure

    model = drawn.build()
    here = conditions_here()  # TensorFlow is imported by now: its own word on oneDNN
    batch = drawn.batch(batch_size, batch_seed)
    inputs = batch if len(batch) > 1 else batch[0]
    outcomes = []
    root = Path(tempfile.mkdtemp(prefix="modelparity-fuzz-", dir=workdir))
    try:
        for fmt in formats:
            start = time.perf_counter()
            outcome = _one(model, drawn, fmt, root, inputs, export_model, load_model, assert_outputs_close, errors)
            outcome.seconds = time.perf_counter() - start
            if outcome.status in ("fail", "error", "refused"):
                def passes_without(reduced: DrawnModel, fmt: str = fmt) -> bool:
                    proof = reduced.build()
                    return _one(proof, reduced, fmt, root / "proof", inputs, export_model, load_model,
                                assert_outputs_close, errors).status == "pass"

                label = label_failure(drawn, fmt, outcome.text, outcome.status, passes_without=passes_without,
                                      conditions=here)
                outcome.known, outcome.resembles, outcome.note = label.known, label.resembles, label.note
            outcomes.append(outcome)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        del model
        _release()
    return outcomes


def _one(model: Any, drawn: DrawnModel, fmt: str, root: Path, inputs: Any, export_model: Any, load_model: Any,
         assert_outputs_close: Any, errors: Any) -> Outcome:
    root.mkdir(parents=True, exist_ok=True)
    try:
        path = export_model(model, fmt, root / fmt.replace(":", "_"))
    except errors.ExportError as exc:
        return Outcome(fmt, "refused", refusal_cause(str(exc)), str(exc))
    candidate = None
    try:
        candidate = load_model(path, fmt.split(":")[0])
        report = assert_outputs_close(candidate, model, inputs=inputs)
        return Outcome(fmt, "pass", ratio=_ratio(report))
    except errors.ParityError as exc:
        return Outcome(fmt, "fail", "new", str(exc), ratio=_ratio(exc.report))
    except (errors.ModelLoadError, RuntimeError, ValueError) as exc:
        text = str(exc)
        return Outcome(fmt, "error", refusal_cause(text), text)
    finally:
        close = getattr(candidate, "close", None)
        if close is not None:
            close()


def _release() -> None:
    """Drop the Keras graph state a model leaves behind (names, traced functions)."""
    try:
        import keras

        keras.backend.clear_session()
    except Exception:  # noqa: BLE001 - a release that fails costs memory, not correctness
        pass
    gc.collect()
