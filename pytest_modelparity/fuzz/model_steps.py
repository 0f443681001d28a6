"""The layer vocabulary of ``strategies.models``: steps that each fit any shape they meet.

Why steps that adapt instead of a drawn layer count: Hypothesis shrinks a list by deleting
elements, and a deletion is only a valid smaller draw when every later step still builds on
the shape it now meets. So a step is data (its drawn parameters) plus ``emit``, which writes the
Keras code for the shape it meets, or returns ``None`` when it cannot apply there (the step is
then skipped). The model is built by running that code, so the reproducer a fuzz run writes is
the very code that built the failing model. No TensorFlow here: emitting code is pure Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar

from hypothesis import strategies as st

__all__ = ["Step", "Shape", "Dense", "Conv", "DepthwiseConv", "ConvTranspose", "Pool", "Norm", "Act", "Merge",
           "Branch", "Reduce", "Mask", "Reshape", "Resize", "Recurrent", "Attention", "Math", "VOCABULARY", "DISCONTINUOUS", "step_strategy", "MAX_ELEMENTS", "MAX_SIDE"]

Shape = tuple[int, ...]          # without the batch dimension
MAX_ELEMENTS = 4096               # a step that would make a bigger tensor is skipped: tiny models stay fast
MAX_SIDE = 24


def _size_ok(shape: Shape) -> bool:
    return all(d >= 1 for d in shape) and math.prod(shape) <= MAX_ELEMENTS and all(d <= MAX_SIDE * 8 for d in shape)


def _conv_len(n: int, k: int, s: int, d: int, padding: str) -> int:
    if padding == "same":
        return -(-n // s)
    return (n - (k - 1) * d - 1) // s + 1


@dataclass(frozen=True)
class Step:
    """One drawn layer. ``emit(var, shape)`` -> (code lines assigning ``x``, new shape) or None."""

    kind: ClassVar[str] = "step"

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))
        return f"{type(self).__name__}({args})"


@dataclass(frozen=True, repr=False)
class Dense(Step):
    units: int = 4
    activation: str | None = None

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        out = shape[:-1] + (self.units,)
        if not _size_ok(out):
            return None
        return [f"x = keras.layers.Dense({self.units}, activation={self.activation!r})(x)"], out


@dataclass(frozen=True, repr=False)
class Conv(Step):
    """Conv1D on a sequence, Conv2D on an image (the rank decides): strides, dilation, padding."""

    filters: int = 4
    kernel: int = 3
    stride: int = 1
    dilation: int = 1
    padding: str = "same"

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        if len(shape) not in (2, 3) or (self.stride > 1 and self.dilation > 1):
            return None
        sides = tuple(_conv_len(n, self.kernel, self.stride, self.dilation, self.padding) for n in shape[:-1])
        out = sides + (self.filters,)
        if not _size_ok(out):
            return None
        layer = "Conv1D" if len(shape) == 2 else "Conv2D"
        return [f"x = keras.layers.{layer}({self.filters}, {self.kernel}, strides={self.stride}, "
                f"dilation_rate={self.dilation}, padding={self.padding!r})(x)"], out


@dataclass(frozen=True, repr=False)
class DepthwiseConv(Step):
    kernel: int = 3
    stride: int = 1
    padding: str = "same"
    separable_filters: int = 0  # 0: DepthwiseConv2D; n: SeparableConv2D(n)

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        if len(shape) != 3:
            return None
        sides = tuple(_conv_len(n, self.kernel, self.stride, 1, self.padding) for n in shape[:-1])
        out = sides + ((self.separable_filters or shape[-1]),)
        if not _size_ok(out):
            return None
        if self.separable_filters:
            return [f"x = keras.layers.SeparableConv2D({self.separable_filters}, {self.kernel}, "
                    f"strides={self.stride}, padding={self.padding!r})(x)"], out
        return [f"x = keras.layers.DepthwiseConv2D({self.kernel}, strides={self.stride}, "
                f"padding={self.padding!r})(x)"], out


@dataclass(frozen=True, repr=False)
class ConvTranspose(Step):
    filters: int = 4
    kernel: int = 2
    stride: int = 1
    padding: str = "same"

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        if len(shape) != 3:
            return None
        sides = tuple(n * self.stride if self.padding == "same" else (n - 1) * self.stride + self.kernel
                      for n in shape[:-1])
        out = sides + (self.filters,)
        if not _size_ok(out) or max(sides) > MAX_SIDE:
            return None
        return [f"x = keras.layers.Conv2DTranspose({self.filters}, {self.kernel}, strides={self.stride}, "
                f"padding={self.padding!r})(x)"], out


@dataclass(frozen=True, repr=False)
class Pool(Step):
    op: str = "max"         # max | average | global
    padding: str = "valid"

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        if len(shape) not in (2, 3):
            return None
        dims = "1D" if len(shape) == 2 else "2D"
        if self.op == "global":
            return [f"x = keras.layers.GlobalAveragePooling{dims}()(x)"], (shape[-1],)
        sides = tuple(_conv_len(n, 2, 2, 1, self.padding) for n in shape[:-1])
        if min(sides) < 1:
            return None
        layer = "MaxPooling" if self.op == "max" else "AveragePooling"
        return [f"x = keras.layers.{layer}{dims}(2, padding={self.padding!r})(x)"], sides + (shape[-1],)


@dataclass(frozen=True, repr=False)
class Norm(Step):
    op: str = "batch"  # batch | layer

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        if self.op == "layer" and shape[-1] == 1:
            return None  # normalising one value gives a constant (beta)
        layer = "BatchNormalization" if self.op == "batch" else "LayerNormalization"
        return [f"x = keras.layers.{layer}()(x)"], shape


ACTIVATIONS = {
    "relu": "keras.layers.Activation('relu')(x)",
    "gelu": "keras.layers.Activation('gelu')(x)",  # exact (erf)
    "gelu_approx": "keras.ops.gelu(x, approximate=True)",
    "hard_swish": "keras.layers.Activation('hard_swish')(x)",
    "sigmoid": "keras.layers.Activation('sigmoid')(x)",
    "tanh": "keras.layers.Activation('tanh')(x)",
    "leaky": "keras.layers.LeakyReLU(negative_slope=0.2)(x)",
    "elu": "keras.layers.Activation('elu')(x)",
    "softmax": "keras.layers.Softmax()(x)",
    "selu": "keras.layers.Activation('selu')(x)",
    "softplus": "keras.layers.Activation('softplus')(x)",
    "softsign": "keras.layers.Activation('softsign')(x)",
    "swish": "keras.layers.Activation('silu')(x)",
    "relu6": "keras.layers.ReLU(max_value=6.0)(x)",
    "hard_sigmoid": "keras.layers.Activation('hard_sigmoid')(x)",
    "mish": "keras.layers.Activation('mish')(x)",
    "prelu": "keras.layers.PReLU()(x)",
    "log_softmax": "keras.layers.Activation('log_softmax')(x)",
}


@dataclass(frozen=True, repr=False)
class Act(Step):
    name: str = "relu"

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        if self.name == "softmax" and shape[-1] == 1:
            return None  # a constant 1: every later layer would compare constants
        return [f"x = {ACTIVATIONS[self.name]}"], shape


@dataclass(frozen=True, repr=False)
class Merge(Step):
    """Two branches joined: ``x`` and a same-shape branch of it (a Dense, a scale or a sigmoid)."""

    op: str = "Add"        # Add | Multiply | Subtract | Maximum | Concatenate
    branch: str = "dense"  # dense | scale (x * scale) | double (x + x) | sigmoid
    scale: float = 2.0

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        out = shape[:-1] + (shape[-1] * 2,) if self.op == "Concatenate" else shape
        if not _size_ok(out):
            return None
        branch = {"dense": f"keras.layers.Dense({shape[-1]})(x)",
                  "scale": f"x * {self.scale!r}",
                  "double": "x + x",
                  "sigmoid": "keras.layers.Activation('sigmoid')(x)"}[self.branch]
        return [f"b = {branch}", f"x = keras.layers.{self.op}()([b, x])"], out


# Same-shape ops a branch is made of (the variable name is filled in): layers with weights, the
# activations the converters map, arithmetic.
BRANCH_OPS = {
    "dense": "keras.layers.Dense({c})({v})",
    "relu": "keras.layers.ReLU()({v})",
    "tanh": "keras.layers.Activation('tanh')({v})",
    "sigmoid": "keras.layers.Activation('sigmoid')({v})",
    "scale": "{v} * 0.5",
    "square": "keras.ops.square({v})",
    "norm": "keras.layers.LayerNormalization()({v})",
    "gelu": "keras.layers.Activation('gelu')({v})",
}


@dataclass(frozen=True, repr=False)
class Branch(Step):
    """Two branches of several ops each, from ``x``, joined (issue 46: a defect that needs two
    multi-op branches, the catalogue's two-branch entry, could not be drawn by ``Merge``, which
    joins ``x`` with one op); ``Add3`` also adds ``x`` back (a three-way merge, a skip connection)."""

    left: tuple[str, ...] = ("dense", "relu")
    right: tuple[str, ...] = ("dense", "tanh")
    join: str = "Add"  # Add | Add3 | Multiply | Maximum | Subtract | Concatenate

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        out = shape[:-1] + (shape[-1] * 2,) if self.join == "Concatenate" else shape
        if not _size_ok(out) or not self.left or not self.right:
            return None
        lines = ["a = x"] + [f"a = {BRANCH_OPS[op].format(v='a', c=shape[-1])}" for op in self.left]
        lines += ["c = x"] + [f"c = {BRANCH_OPS[op].format(v='c', c=shape[-1])}" for op in self.right]
        if self.join == "Add3":
            lines.append("x = keras.layers.Add()([a, c, x])")
        else:
            lines.append(f"x = keras.layers.{self.join}()([a, c])")
        return lines, out


@dataclass(frozen=True, repr=False)
class Reduce(Step):
    """A reduction over any axis (issue 46: only the last axis was ever reduced)."""

    op: str = "mean"  # mean | sum | max | min
    axis: int = 1     # 1-based over the non-batch dims; skipped where the tensor has fewer
    keepdims: bool = True

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        if self.axis > len(shape) or (not self.keepdims and len(shape) == 1):
            return None  # nothing to keep a batch of scalars apart from
        out = tuple(1 if i == self.axis - 1 else d for i, d in enumerate(shape)) if self.keepdims else \
            tuple(d for i, d in enumerate(shape) if i != self.axis - 1)
        return [f"x = keras.ops.{self.op}(x, axis={self.axis}, keepdims={self.keepdims})"], out


@dataclass(frozen=True, repr=False)
class Mask(Step):
    """``Masking(0.0)`` on a sequence: the layers after it (a recurrent one, attention) get a mask."""

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        if len(shape) != 2:
            return None
        return ["x = keras.layers.Masking(0.0)(x)"], shape


@dataclass(frozen=True, repr=False)
class Reshape(Step):
    op: str = "flatten"  # flatten | permute | fold (vector -> (n/2, 2) sequence)

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        if self.op == "flatten":
            if len(shape) < 2:
                return None
            return ["x = keras.layers.Flatten()(x)"], (math.prod(shape),)
        if self.op == "permute":
            if len(shape) == 2:
                return ["x = keras.layers.Permute((2, 1))(x)"], (shape[1], shape[0])
            if len(shape) == 3:
                return ["x = keras.layers.Permute((2, 1, 3))(x)"], (shape[1], shape[0], shape[2])
            return None
        if len(shape) != 1 or shape[0] % 2 or shape[0] < 4:
            return None
        return [f"x = keras.layers.Reshape(({shape[0] // 2}, 2))(x)"], (shape[0] // 2, 2)


@dataclass(frozen=True, repr=False)
class Resize(Step):
    op: str = "upsample"  # upsample | pad | crop

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        if len(shape) not in (2, 3):
            return None
        dims = "1D" if len(shape) == 2 else "2D"
        sides = shape[:-1]
        if self.op == "upsample":
            new = tuple(n * 2 for n in sides)
            if max(new) > MAX_SIDE or not _size_ok(new + shape[-1:]):
                return None
            return [f"x = keras.layers.UpSampling{dims}(2)(x)"], new + shape[-1:]
        if self.op == "pad":
            new = tuple(n + 2 for n in sides)
            if max(new) > MAX_SIDE or not _size_ok(new + shape[-1:]):
                return None
            return [f"x = keras.layers.ZeroPadding{dims}(1)(x)"], new + shape[-1:]
        if min(sides) < 3:
            return None
        return [f"x = keras.layers.Cropping{dims}(1)(x)"], tuple(n - 2 for n in sides) + shape[-1:]


@dataclass(frozen=True, repr=False)
class Recurrent(Step):
    cell: str = "GRU"  # GRU | LSTM | SimpleRNN
    units: int = 4
    sequences: bool = True

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        if len(shape) != 2 or shape[0] > 16:
            return None
        out = (shape[0], self.units) if self.sequences else (self.units,)
        return [f"x = keras.layers.{self.cell}({self.units}, return_sequences={self.sequences})(x)"], out


@dataclass(frozen=True, repr=False)
class Attention(Step):
    heads: int = 2
    key_dim: int = 4
    variant: str = "self"  # self | causal | cross (keys and values from a Dense of x)

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        if len(shape) != 2 or shape[0] > 16:
            return None
        layer = f"keras.layers.MultiHeadAttention({self.heads}, {self.key_dim})"
        if self.variant == "causal":
            return [f"x = {layer}(x, x, use_causal_mask=True)"], shape
        if self.variant == "cross":
            return ["k = keras.layers.Dense(3)(x)", f"x = {layer}(x, k)"], shape
        return [f"x = {layer}(x, x)"], shape


# keras.ops on symbolic tensors are serialisable operation nodes (no Lambda, which the plugin refuses).
MATH = {
    "exp": "keras.ops.exp(keras.ops.clip(x, -3.0, 3.0))",
    "log": "keras.ops.log(keras.ops.abs(x) + 0.1)",
    "sqrt": "keras.ops.sqrt(keras.ops.abs(x) + 0.01)",
    "rsqrt": "keras.ops.rsqrt(keras.ops.abs(x) + 0.1)",
    "pow": "keras.ops.power(keras.ops.abs(x) + 0.1, 1.5)",
    "square": "keras.ops.square(x)",
    "clip": "keras.ops.clip(x, -0.5, 0.5)",
    "cumsum": "keras.ops.cumsum(x, axis=-1)",
    "mean": "keras.ops.mean(x, axis=-1, keepdims=True)",
    "sum": "keras.ops.sum(x, axis=-1, keepdims=True)",
    "max": "keras.ops.max(x, axis=-1, keepdims=True)",
    "where": "keras.ops.where(x > 0, x, x * 0.5)",
    "abs": "keras.ops.abs(x)",
    "tiny": "x * 0.001",
    "l2norm": "x / keras.ops.sqrt(keras.ops.sum(keras.ops.square(x), axis=-1, keepdims=True) + 1e-6)",
    "floor": "keras.ops.floor(x * 4.0)",
    "round": "keras.ops.round(x * 4.0)",
}
# Steps whose output jumps on a float rounding of their input: a correct converter's last-bit
# difference can flip floor(x) by 1. Drawn only when asked for (``models(discontinuous=True)``).
DISCONTINUOUS = ("floor", "round")


@dataclass(frozen=True, repr=False)
class Math(Step):
    op: str = "abs"

    def emit(self, shape: Shape) -> tuple[list[str], Shape] | None:
        out = shape[:-1] + (1,) if self.op in ("mean", "sum", "max") else shape
        return [f"x = {MATH[self.op]}"], out


def _kinds(values: Any) -> Any:
    return st.sampled_from(list(values))


# Each entry: (name, strategy of that step). The first values of every sampled_from are the
# simplest, so Hypothesis shrinks parameters towards them.
VOCABULARY: dict[str, Callable[[bool], Any]] = {
    "dense": lambda d: st.builds(Dense, units=_kinds([4, 2, 8]), activation=_kinds([None, "relu", "tanh"])),
    "conv": lambda d: st.builds(Conv, filters=_kinds([4, 2]), kernel=_kinds([1, 2, 3]), stride=_kinds([1, 2]),
                                dilation=_kinds([1, 2]), padding=_kinds(["same", "valid"])),
    "depthwise": lambda d: st.builds(DepthwiseConv, kernel=_kinds([1, 3]), stride=_kinds([1, 2]),
                                     padding=_kinds(["same", "valid"]), separable_filters=_kinds([0, 4])),
    "conv_transpose": lambda d: st.builds(ConvTranspose, filters=_kinds([4, 2]), kernel=_kinds([1, 2, 3]),
                                          stride=_kinds([1, 2]), padding=_kinds(["same", "valid"])),
    "pool": lambda d: st.builds(Pool, op=_kinds(["max", "average", "global"]), padding=_kinds(["valid", "same"])),
    "norm": lambda d: st.builds(Norm, op=_kinds(["batch", "layer"])),
    "activation": lambda d: st.builds(Act, name=_kinds(ACTIVATIONS)),
    "merge": lambda d: st.builds(Merge, op=_kinds(["Add", "Multiply", "Subtract", "Maximum", "Concatenate"]),
                                 branch=_kinds(["dense", "scale", "double", "sigmoid"]), scale=_kinds([2.0, 0.5, -1.0])),
    "reshape": lambda d: st.builds(Reshape, op=_kinds(["flatten", "permute", "fold"])),
    "resize": lambda d: st.builds(Resize, op=_kinds(["upsample", "pad", "crop"])),
    "recurrent": lambda d: st.builds(Recurrent, cell=_kinds(["GRU", "LSTM", "SimpleRNN"]), units=_kinds([4, 2]),
                                     sequences=st.booleans()),
    "attention": lambda d: st.builds(Attention, heads=_kinds([2, 1]), key_dim=_kinds([4, 2]),
                                     variant=_kinds(["self", "causal", "cross"])),
    "branch": lambda d: st.builds(Branch, left=st.lists(_kinds(BRANCH_OPS), min_size=1, max_size=3).map(tuple),
                                  right=st.lists(_kinds(BRANCH_OPS), min_size=1, max_size=3).map(tuple),
                                  join=_kinds(["Add", "Add3", "Multiply", "Maximum", "Subtract", "Concatenate"])),
    "reduce": lambda d: st.builds(Reduce, op=_kinds(["mean", "sum", "max", "min"]), axis=_kinds([1, 2, 3]),
                                  keepdims=st.booleans()),
    "mask": lambda d: st.just(Mask()),
    "math": lambda d: st.builds(Math, op=_kinds([k for k in MATH if d or k not in DISCONTINUOUS])),
}


def step_strategy(vocabulary: Any = None, *, extra: Any = (), discontinuous: bool = False) -> Any:
    """One step from the named vocabulary entries (default: all) plus ``extra`` step strategies."""
    names = list(VOCABULARY) if vocabulary is None else list(vocabulary)
    unknown = [n for n in names if n not in VOCABULARY]
    if unknown:
        from hypothesis.errors import InvalidArgument

        raise InvalidArgument(f"models(vocabulary=...): unknown step(s) {unknown}; choose from {sorted(VOCABULARY)}, "
                              "or pass your own steps as extra=[a strategy of Step objects]")
    return st.one_of(*[VOCABULARY[n](discontinuous) for n in names], *extra)
