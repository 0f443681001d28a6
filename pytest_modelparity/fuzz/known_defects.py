"""Converter defects found with generated models: a catalogue in code, not prose.

Why: a fuzz run that meets a defect again should say "known: <name>" instead of reporting it
as new, and a test per entry tells when an upgraded converter has fixed it. Each entry holds
its minimal model (a ``DrawnModel``, so it is built by the same code a fuzz run uses), the
versions it was seen on, the conditions it needs (``conditions``: oneDNN on, e.g., for the
tfjs defects Grappler's oneDNN rewrites make), and a signature over the layers of a failing
model and the format.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from .conditions import conditions_here, differences
from .model_draw import DrawnModel, InputKind
from .model_steps import Act, Conv, ConvTranspose, Dense, DepthwiseConv, Math, Merge, Resize, Shape, Step

__all__ = ["KnownDefect", "CATALOGUE", "Label", "label_failure", "by_name", "without_trigger"]


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
    # The switches it was seen under and needs (``fuzz/conditions.py``: "onednn", "xnnpack"); a run
    # where one differs does not label a failure with it. Empty: seen whatever they were.
    conditions: Mapping[str, bool] = field(default_factory=dict, hash=False)
    advice: str = ""                   # what works around it, verified (tests/test_known_defects.py)

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
                                   and ((s.branch == "scale" and s.scale > 1) or s.branch == "double") for s in layers),
        conditions={"onednn": True},
        advice="convert with TF_ENABLE_ONEDNN_OPTS=0 set before TensorFlow is imported: Grappler's oneDNN remapper "
               "makes the LeakyRelu, and without it the Maximum is kept (measured, docs/fuzzing.md)"),
    KnownDefect(
        "tf2onnx-pad-dilated-same-conv", "onnx",
        "ZeroPadding2D then Conv2D(dilation 2, padding='same'): the pad is folded into the conv and SAME "
        "padding is lost (a smaller output); onnxruntime only warns, the plugin's export check refuses the file",
        "tf2onnx 1.17, opset 17",
        DrawnModel(IMAGE, (Resize("pad"), Conv(4, 3, 1, 2, "same"))),
        "refused", lambda layers: _follows(layers, lambda a: isinstance(a, Resize) and a.op == "pad",
                                           lambda b: isinstance(b, Conv) and b.dilation > 1 and b.padding == "same"),
        r"output shape|instead of"),
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
    KnownDefect(
        "tfjs-cumsum-negative-axis", "tfjs",
        "keras.ops.cumsum(x, axis=-1): tfjs-core reads a negative Cumsum axis wrong and returns a batch of 0 rows, "
        "shape (0, 4) instead of (4, 8) (found by bench/fuzz.py on Embedding -> cumsum, then on every input kind; "
        "tfjs-core alone, no converter and no runner, gives tf.cumsum(ones([4, 8]), -1) the shape [null, 4]; "
        "axis=1 is right)",
        "tensorflowjs 4.22, @tensorflow/tfjs-core 4.22 (cpu backend)",
        DrawnModel(InputKind("vector", (8,)), (Math("cumsum"),)),
        "fail", lambda layers: any(isinstance(s, Math) and s.op == "cumsum" for s in layers)),
)


def by_name(name: str) -> KnownDefect:
    for entry in CATALOGUE:
        if entry.name == name:
            return entry
    raise KeyError(f"no known defect {name!r}; known: {', '.join(e.name for e in CATALOGUE)}")


@dataclass(frozen=True)
class Label:
    """What a failure is: ``known`` (a catalogue entry it was proven to be) or new, and then
    ``resembles`` (an entry whose layers it holds on that format, not proven to be it)."""

    known: str | None = None
    resembles: str | None = None
    note: str | None = None   # why ``resembles`` did not label it, where a condition differs

    def __str__(self) -> str:
        if self.known:
            return f"known: {self.known}"
        if not self.resembles:
            return "new"
        return f"new (resembles {self.resembles}" + (f"; {self.note})" if self.note else ")")


def without_trigger(entry: KnownDefect, drawn: DrawnModel) -> DrawnModel | None:
    """``drawn`` with the steps the entry's signature needs taken out (each step whose removal
    alone makes the signature false), or replaced by ``abs`` where none would be left; None
    when no single step carries the signature."""
    layers = list(drawn.layers)
    triggers = [i for i in range(len(layers)) if not entry.signature(layers[:i] + layers[i + 1:])]
    if not triggers:
        return None
    kept = tuple(step for i, step in enumerate(layers) if i not in triggers) or (Math("abs"),)
    return replace(drawn, steps=kept)


def label_failure(drawn: DrawnModel, fmt: str, text: str = "", status: str | None = None, *,
                  passes_without: Callable[[DrawnModel], bool] | None = None,
                  conditions: Mapping[str, object] | None = None) -> Label:
    """What a failure of ``drawn`` on ``fmt`` (its ``status`` and message ``text``) is.

    Known only when proven (issue 46): an entry whose layers the model holds on that format
    labels it when the outcome kind is the entry's, the message matches the entry's ``symptom``
    (refusals, errors), and, for wrong values, the model passes with the entry's steps taken out
    (``passes_without(draw)``, one more export; without it nothing is proven). Otherwise the
    failure is new, and ``resembles`` names the entry; a signature matched on layers alone made
    3.9% of tfjs draws' failures "known", whatever they were.

    An entry whose ``conditions`` do not hold in this run (``conditions``, default: this
    process's, ``conditions_here()``) labels nothing either: the failure is new, resembling it,
    with a note of the condition that differs (a oneDNN rewrite cannot be why a run with oneDNN
    off failed)."""
    resembles, note = None, None
    here = conditions_here() if conditions is None else conditions
    for entry in CATALOGUE:
        if not entry.matches(drawn, fmt):
            continue
        resembles = resembles or entry.name
        if status != entry.outcome:
            continue
        if entry.symptom and not re.search(entry.symptom, text or "", re.IGNORECASE):
            continue
        differ = differences(entry.conditions, here)
        if differ:
            if note is None:  # the entry it would have been: named, with why it is not
                resembles, note = entry.name, "; ".join(differ)
            continue
        if entry.outcome == "fail":
            reduced = without_trigger(entry, drawn)
            if reduced is None or passes_without is None or not passes_without(reduced):
                continue
        return Label(known=entry.name)
    return Label(resembles=resembles, note=note)
