"""Does a catalogued converter defect still reproduce here, through the plugin and without it?

Why apart from the catalogue: this runs the converters (the plugin's export route and the bare
converter API), while ``known_defects`` only labels failures and ``fuzzing`` uses it for that.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Mapping

from .conditions import conditions_here, differences, env_for
from .known_defects import KnownDefect, by_name

__all__ = ["bare_reproduces", "status_here", "DefectStatus"]



def bare_reproduces(entry: KnownDefect, workdir: str) -> tuple[bool, str]:
    """Does the converter alone (no plugin route, no rewrites) reproduce ``entry``? (yes/no, what it did)

    The converter's own API writes the file; the runtime runs it (tfjs: the plugin's Node.js
    loader, which only reads the file). Reproduced: the conversion or the run fails, the shape
    differs, or the values differ by more than 1e-3 of the output's scale.
    """
    import numpy as np

    from ..formats import load_model

    model = entry.model.build()
    batch = entry.model.batch()
    inputs = batch if len(batch) > 1 else batch[0]
    expected = model(inputs)
    expected = [np.asarray(e) for e in (expected if isinstance(expected, (list, tuple)) else [expected])]
    try:
        path = _bare_convert(model, entry.format, workdir)
        candidate = load_model(path, entry.format)
        try:
            feed = dict(zip([spec.name for spec in candidate.inputs], batch)) if len(batch) > 1 else inputs
            got = list(candidate.predict(feed).values())
        finally:
            candidate.close()
    except Exception as exc:  # noqa: BLE001 - a converter's or runtime's failure is the answer here
        import re

        said = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        if entry.symptom and not re.search(entry.symptom, str(exc)):
            return False, f"not this defect: the bare route failed otherwise ({said})"
        return True, said
    for g, e in zip(got, expected):
        if np.shape(g) != np.shape(e):
            return True, f"output shape {np.shape(g)} instead of {np.shape(e)}"
        err = float(np.max(np.abs(g - e))) / max(float(np.max(np.abs(e))), 1e-30)
        if err > 1e-3:
            return True, f"values differ by {err:.3g} of scale"
    return False, "the bare converter's file agrees (within 1e-3 of scale)"


def _bare_convert(model: object, fmt: str, workdir: str) -> str:
    from pathlib import Path

    out = Path(workdir)
    if fmt == "tflite":
        import tensorflow as tf

        data = tf.lite.TFLiteConverter.from_keras_model(model).convert()
        (out / "bare.tflite").write_bytes(data)
        return str(out / "bare.tflite")
    if fmt == "onnx":
        import tf2onnx

        tf2onnx.convert.from_keras(model, opset=17, output_path=str(out / "bare.onnx"))
        return str(out / "bare.onnx")
    from ..formats.tfjs.export import import_converter

    model.export(str(out / "saved"), verbose=False)  # type: ignore[attr-defined]
    import_converter().convert_tf_saved_model(str(out / "saved"), str(out / "bare_tfjs"))
    return str(out / "bare_tfjs" / "model.json")


@dataclass
class DefectStatus:
    """How a catalogue entry stands on the installed converters."""

    entry: KnownDefect
    plugin: str            # the plugin's outcome on the entry's model: pass | fail | refused | error
    label: str | None      # the known-defect label the plugin's failure got
    bare: bool             # the bare converter alone reproduces it
    bare_text: str
    text: str = ""
    conditions: dict = field(default_factory=dict)  # what it ran under (``conditions_here`` there)
    unmet: list[str] = field(default_factory=list)  # the entry's conditions this machine could not give

    @property
    def verdict(self) -> str:
        if self.unmet:
            return "not reproducible here: " + "; ".join(self.unmet)
        if self.plugin == self.entry.outcome:
            return "caught"
        outside = differences(dict(self.entry.conditions), self.conditions)
        if outside:  # asked for other conditions than the entry's: its absence there proves nothing fixed
            return f"not reproduced under other conditions than the entry's ({'; '.join(outside)})"
        if self.plugin == self.entry.outcome:
            return "caught"
        if self.plugin == "pass" and not self.bare:
            return "fixed"
        if self.plugin == "pass":
            return "avoided by the plugin's export route"
        return f"changed: the plugin now reports {self.plugin}"

    def __str__(self) -> str:
        label = f"known: {self.label}" if self.label else "no label"
        from .conditions import describe

        return (f"{self.entry.name} ({self.entry.format}, seen with {self.entry.seen_with}; run under "
                f"{describe(self.conditions)}): {self.verdict}; "
                f"plugin {self.plugin} ({label}); bare converter "
                f"{'reproduces it' if self.bare else 'does not'}: {self.bare_text}")


def _status_now(name: str, workdir: str) -> tuple[str, str | None, bool, str, str, dict]:
    from .fuzzing import check_model

    entry = by_name(name)
    (outcome,) = check_model(entry.model, [entry.format], workdir=workdir)
    bare, bare_text = bare_reproduces(entry, workdir)
    return outcome.status, outcome.known, bare, bare_text, outcome.text, conditions_here()


def _set_env(env: dict[str, str]) -> None:
    import os

    os.environ.update(env)


def status_here(entry: KnownDefect, workdir: str, *, conditions: Mapping[str, bool] | None = None) -> DefectStatus:
    """Run ``entry``'s model through the plugin (export + default verdict) and the bare converter,
    under the entry's conditions (or ``conditions``): in a new process whose environment gives
    them (TF_ENABLE_ONEDNN_OPTS set before TensorFlow is imported) when they are not this
    process's. What that process ran under is read there, after TensorFlow's import; a condition
    it could not get (oneDNN asked for on a TensorFlow built without it) is in ``unmet``."""
    wanted = dict(entry.conditions if conditions is None else conditions)
    if not differences(wanted, conditions_here()):
        found = _status_now(entry.name, workdir)
    else:
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_set_env, initargs=(env_for(wanted),)) as pool:
            found = pool.submit(_status_now, entry.name, workdir).result()
    plugin, label, bare, bare_text, text, ran_under = found
    return DefectStatus(entry, plugin, label, bare, bare_text, text, ran_under, differences(wanted, ran_under))
