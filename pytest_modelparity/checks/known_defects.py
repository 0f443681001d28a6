"""Converter defects found with generated models: a catalogue in code, not prose.

Why: a fuzz run that meets a defect again should say "known: <name>" instead of reporting it
as new, and a test per entry tells when an upgraded converter has fixed it. Each entry holds
its minimal model (a ``DrawnModel``, so it is built by the same code a fuzz run uses), the
versions it was seen on, and a signature over the layers of a failing model and the format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .model_draw import DrawnModel, InputKind
from .model_steps import Act, Conv, ConvTranspose, Dense, DepthwiseConv, Math, Merge, Resize, Shape, Step

__all__ = ["KnownDefect", "CATALOGUE", "label_failure", "by_name", "bare_reproduces", "status_here", "DefectStatus"]


@dataclass(frozen=True, repr=False)
class DepthwiseBranches(Step):
    """Two branches of one tensor (depthwise + gelu, depthwise + relu) joined by Add: defect 6."""

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        if len(shape) != 3:
            return None
        return ["a = keras.layers.DepthwiseConv2D(3, padding='same')(x)",
                "a = keras.layers.Activation('gelu')(a)",
                "b = keras.layers.DepthwiseConv2D(3, padding='same')(x)",
                "b = keras.layers.Activation('relu')(b)",
                "x = keras.layers.Add()([a, b])"], shape


@dataclass(frozen=True)
class KnownDefect:
    name: str
    format: str
    summary: str
    seen_with: str
    model: DrawnModel
    outcome: str                       # what the plugin reports: "fail" (wrong values) or "refused"/"error"
    signature: Callable[[list[Step]], bool]
    symptom: str = ""                  # regex a converter's or runtime's error must match to be this defect

    def matches(self, drawn: DrawnModel, fmt: str) -> bool:
        return fmt.split(":")[0] == self.format and self.signature(drawn.layers)


def _follows(layers: list[Step], first: Callable[[Step], bool], then: Callable[[Step], bool]) -> bool:
    return any(first(a) and then(b) for a, b in zip(layers, layers[1:]))


IMAGE = InputKind("image", (4, 4, 2))

CATALOGUE: tuple[KnownDefect, ...] = (
    KnownDefect(
        "tflite-l2-normalization-eps", "tflite",
        "x / sqrt(sum(x^2) + eps) is fused into L2_NORMALIZATION, whose kernel divides by max(norm, 1e-6) "
        "whatever eps was",
        "TF 2.21, ai-edge-litert 2.x",
        DrawnModel(InputKind("vector", (8,)), (Math("tiny"), Math("l2norm"))),
        "fail", lambda layers: any(isinstance(s, Math) and s.op == "l2norm" for s in layers)),
    KnownDefect(
        "tfjs-maximum-as-leakyrelu", "tfjs",
        "maximum(a*x, x) with a > 1 is remapped to LeakyRelu(alpha=a), right only for a <= 1",
        "tensorflowjs 4.22",
        DrawnModel(InputKind("vector", (8,)), (Dense(4), Merge("Maximum", "scale", 2.0))),
        "fail", lambda layers: any(isinstance(s, Merge) and s.op == "Maximum"
                                   and ((s.branch == "scale" and s.scale > 1) or s.branch == "double") for s in layers)),
    KnownDefect(
        "tf2onnx-pad-dilated-same-conv", "onnx",
        "ZeroPadding2D then Conv2D(dilation 2, padding='same'): the pad is folded into the conv and SAME "
        "padding is lost (a smaller output); onnxruntime only warns",
        "tf2onnx 1.17, opset 17",
        DrawnModel(IMAGE, (Resize("pad"), Conv(4, 3, 1, 2, "same"))),
        "fail", lambda layers: _follows(layers, lambda a: isinstance(a, Resize) and a.op == "pad",
                                        lambda b: isinstance(b, Conv) and b.dilation > 1 and b.padding == "same")),
    KnownDefect(
        "tf2onnx-dense-then-conv-transpose", "onnx",
        "Dense on a 4-D tensor, then Conv2DTranspose(kernel 2, stride 1, 'same'): wrong values",
        "tf2onnx 1.17, opset 17",
        DrawnModel(IMAGE, (Dense(8), ConvTranspose(4, 2, 1, "same"))),
        "fail", lambda layers: any(isinstance(s, ConvTranspose) and s.stride == 1 and s.padding == "same"
                                   and s.kernel % 2 == 0 for s in layers)),
    KnownDefect(
        "tf2onnx-conv-transpose-negative-pads", "onnx",
        "Conv2DTranspose(kernel 1, stride 2): negative pads, onnxruntime refuses the file",
        "tf2onnx 1.17, opset 17",
        DrawnModel(IMAGE, (ConvTranspose(4, 1, 2, "same"),)),
        "refused", lambda layers: any(isinstance(s, ConvTranspose) and s.kernel < s.stride for s in layers),
        r"pads must not contain negative|negative"),
    KnownDefect(
        "tfjs-two-branch-reading-outputs", "tfjs",
        "two branches of one tensor (depthwise + gelu / relu) joined: converts, then fails in tfjs "
        "(\"Cannot read properties of undefined (reading 'outputs')\")",
        "tensorflowjs 4.22",
        DrawnModel(IMAGE, (DepthwiseBranches(),)),
        "error", lambda layers: any(isinstance(s, DepthwiseBranches) for s in layers)
        or (sum(isinstance(s, DepthwiseConv) for s in layers) >= 1 and any(isinstance(s, Act) for s in layers)),
        r"reading 'outputs'"),
)


def by_name(name: str) -> KnownDefect:
    for entry in CATALOGUE:
        if entry.name == name:
            return entry
    raise KeyError(f"no known defect {name!r}; known: {', '.join(e.name for e in CATALOGUE)}")


def label_failure(drawn: DrawnModel, fmt: str, text: str = "") -> str | None:
    """The name of the known defect a failure of ``drawn`` on ``fmt`` matches, or None (new)."""
    for entry in CATALOGUE:
        if entry.matches(drawn, fmt):
            return entry.name
    return None


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

    @property
    def verdict(self) -> str:
        if self.plugin == self.entry.outcome:
            return "caught"
        if self.plugin == "pass" and not self.bare:
            return "fixed"
        if self.plugin == "pass":
            return "avoided by the plugin's export route"
        return f"changed: the plugin now reports {self.plugin}"

    def __str__(self) -> str:
        label = f"known: {self.label}" if self.label else "no label"
        return (f"{self.entry.name} ({self.entry.format}, seen with {self.entry.seen_with}): {self.verdict}; "
                f"plugin {self.plugin} ({label}); bare converter "
                f"{'reproduces it' if self.bare else 'does not'}: {self.bare_text}")


def status_here(entry: KnownDefect, workdir: str) -> DefectStatus:
    """Run ``entry``'s model through the plugin (export + default verdict) and the bare converter."""
    from .fuzzing import check_model

    (outcome,) = check_model(entry.model, [entry.format], workdir=workdir)
    bare, bare_text = bare_reproduces(entry, workdir)
    return DefectStatus(entry, outcome.status, outcome.known, bare, bare_text, outcome.text)
