"""ONNX: export a Keras model (or a SavedModel directory) with tf2onnx (opset 17, ``None``
batch dim, Keras input/output names), and validate the file with onnxruntime before it is
written.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ExportError
from .load import NAME, ort_spec
from ..common import ONNX_INSTALL, TF_INSTALL, ConverterLog, finish_export, first_line, probe_note, run_probe
from ..tensorflow.serving import begin_export, graph_op_types


CONVERTS_SAVED_MODEL = True  # export() also takes a SavedModel directory
EXPORT_VALIDATES = True  # export() runs validate_content() before writing: no broken file is written
EXPORT_REQUIRES = (("tensorflow", TF_INSTALL), ("tf2onnx", ONNX_INSTALL))
DEFAULT_OPSET = 17
# -- export ----------------------------------------------------------------------------
# Ops whose presence means the graph has loops or branches (Keras RNNs): frozen with its
# control flow lowered, tf2onnx meets Enter/Exit/Merge it cannot rewrite into an ONNX Loop.
_CONTROL_FLOW_OPS = frozenset({"While", "StatelessWhile", "If", "StatelessIf"})


def export(model: Any, path: Path, *, opset: int = DEFAULT_OPSET,
           converter_options: dict[str, Any] | None = None, graph_options: dict[str, Any] | None = None) -> Path:
    """Convert a Keras model (or a SavedModel directory) to ``path`` (a ``.onnx`` file) with
    tf2onnx; the file passes ``onnx.checker`` and runs once in onnxruntime before it is returned.

    Routes: the serving function is frozen first (``frozen``); a graph with While/If ops
    (Keras LSTM, GRU, RNN) is frozen keeping them as functional ops
    (``frozen-keep-control-flow``), which tf2onnx turns into ONNX Loop/If; a graph with
    functions marked never to be inlined (Keras runs grouped convolutions under XLA) is
    converted from its GraphDef with those marks cleared (``...-inlined``).
    ``Erfc`` (exact GELU) is converted as ``1 - Erf(x)``, ``ComplexAbs`` of an FFT (an STFT's
    magnitude) as ``sqrt(re^2 + im^2)``, ``Bucketize`` (a Keras ``Discretization``) as the count
    of boundaries ``<= x``.
    ``converter_options``: ``opset``, ``lower_control_flow`` (bool: force a route),
    ``custom_op_handlers`` (added to the built-in Erfc, ComplexAbs and Bucketize handlers; ``{"Erfc": None}`` removes one) and any other keyword of
    ``tf2onnx.convert.from_function`` (``custom_ops``, ``extra_opset``, ``optimizers``, ...).
    """
    import tf2onnx

    options = dict(converter_options or {})
    opset = int(options.pop("opset", opset))
    lower = options.pop("lower_control_flow", None)
    handlers: dict[str, Any] = {"Erfc": (_erfc_as_one_minus_erf, []), "ComplexAbs": (_complex_abs, []),
                                "Bucketize": (_bucketize, [])}
    handlers.update(options.pop("custom_op_handlers", None) or {})
    handlers = {op: h for op, h in handlers.items() if h is not None}  # {"Erfc": None} turns ours off
    known = set(inspect.signature(tf2onnx.convert.from_function).parameters) - {"function", "input_signature"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"unknown converter_options key(s) {unknown} for format 'onnx'; known: opset, "
                        f"lower_control_flow, custom_op_handlers, {', '.join(sorted(known - {'opset', 'custom_op_handlers'}))}")
    path, serving, log = begin_export(model, path, NAME, "model.onnx", graph_options)
    try:
        with log.capture():
            concrete = serving.function.get_concrete_function()
            flow = sorted(graph_op_types(concrete) & _CONTROL_FLOW_OPS)
            # Frozen by tf2onnx itself where ours adds nothing: no control flow to keep, no
            # constant capture to fold (MobileNetV2 at 64 px: 4.8 s a conversion instead of 9.6 s).
            as_traced = lower is None and not flow and not _constant_captures(concrete)
            if lower is None:
                lower = not flow
            route = "frozen" if lower else "frozen-keep-control-flow" + (f" (the graph has {', '.join(flow)})" if flow else "")
            kept = _must_compile_functions(concrete)
            try:
                if kept:
                    route += f"-inlined (XLA-only functions: {', '.join(kept[:3])}{' ...' if len(kept) > 3 else ''})"
                    proto = _convert_inlined(serving, concrete, lower, opset=opset, custom_op_handlers=handlers,
                                             **options)
                else:
                    function = serving.function if as_traced else _frozen(serving, concrete, lower)
                    proto, _ = tf2onnx.convert.from_function(function,
                                                             input_signature=serving.specs, opset=opset,
                                                             custom_op_handlers=handlers, **options)
            except _ResourceLeft as exc:
                raise ExportError(path, NAME, str(exc), "compare this model through saved_model or tflite (both "
                                  "carry lookup tables), or export the model without its lookup layer",
                                  route=route, not_applicable=True) from exc
            except Exception as exc:  # noqa: BLE001 - converter errors are many and untyped
                passed = re.search(r"graph input '([^']+)' not exist", str(exc))
                if passed:  # tf2onnx 1.17: an output that is an input unchanged (measured: 27 of 40 fuzz refusals)
                    raise ExportError(path, NAME, f"the model returns its input {passed.group(1)!r} unchanged as an "
                                      "output, and tf2onnx's function route cannot convert a graph whose output is "
                                      "one of its inputs (\"graph input not exist\")",
                                      "compare this model through saved_model or tflite (both carry it), or convert "
                                      "its SavedModel with tf2onnx's command line (python -m tf2onnx.convert "
                                      "--saved-model DIR --output model.onnx), which converts it; or drop the "
                                      "pass-through output", route=route, log_path=log.keep()) from exc
                raise _export_error(path, f"tf2onnx failed (opset {opset}): {first_line(exc, 200)}", log, route,
                                    exc) from exc
            _keep_keras_output_order(proto, serving.output_names)
            content = proto.SerializeToString()
        finish_export(path, content, NAME, f"{route}; {serving.route}" if serving.route else route, log,
                      validate_content)
    finally:
        log.discard()
    return path


def _erfc_as_one_minus_erf(ctx: Any, node: Any, name: str, args: Any) -> Any:
    """tf2onnx handler: ``Erfc(x)`` as ``1 - Erf(x)`` (ONNX has Erf since opset 9, no Erfc).

    Keras' exact GELU computes ``0.5 * x * erfc(-x / sqrt(2))``. For large |x| the subtraction
    loses the tail erfc keeps, but that tail is multiplied by a small x there: measured 7e-8
    relative on a transformer encoder.
    """
    from tf2onnx import utils

    node.type = "Erf"
    node.domain = ""
    dtype = ctx.get_dtype(node.output[0])
    one = ctx.make_const(utils.make_name(f"{name}_one"), np.array(1, dtype=utils.map_onnx_to_numpy_type(dtype)))
    out = node.output[0]
    sub = ctx.insert_new_node_on_output("Sub", out, name=utils.make_name(f"{name}_erfc"), inputs=[one.output[0], out])
    ctx.copy_shape(out, sub.output[0])
    ctx.set_dtype(sub.output[0], dtype)
    return node


def _complex_abs(ctx: Any, node: Any, name: str, args: Any) -> Any:
    """tf2onnx handler: ``ComplexAbs`` of an (R)FFT as ``sqrt(re^2 + im^2)``.

    tf2onnx writes an FFT's complex output as a real tensor whose first axis holds the real
    and imaginary parts; its own ComplexAbs handler refuses when that axis' size is not known
    statically ("expected the first dimension to be 2", an STFT's framed signal), at every
    opset. The arithmetic is the same, without that check.
    """
    from tf2onnx import utils
    from tf2onnx.graph_builder import GraphBuilder

    parts = []
    for index in (0, 1):
        at = ctx.make_const(utils.make_name(f"{name}_at{index}"), np.array([index], dtype=np.int64))
        part = ctx.make_node("Gather", inputs=[node.input[0], at.output[0]], attr={"axis": 0},
                             name=utils.make_name(f"{name}_part{index}"))
        parts.append(ctx.make_node("Mul", inputs=[part.output[0], part.output[0]],
                                   name=utils.make_name(f"{name}_square{index}")).output[0])
    ctx.remove_node(node.name)
    total = ctx.make_node("Add", inputs=parts, name=utils.make_name(f"{name}_sum"))
    squeezed = GraphBuilder(ctx).make_squeeze({"data": total.output[0], "axes": [0]},
                                              name=utils.make_name(f"{name}_squeeze"), return_node=True)
    root = ctx.make_node("Sqrt", inputs=squeezed.output[:1], name=utils.make_name(f"{name}_abs"))
    ctx.replace_all_inputs(node.output[0], root.output[0])
    return root


def _bucketize(ctx: Any, node: Any, name: str, args: Any) -> Any:
    """tf2onnx handler: ``Bucketize(x, boundaries)`` (a Keras ``Discretization``) as the count of
    boundaries ``<= x``: ``ReduceSum(Cast(Unsqueeze(x, -1) >= boundaries), -1)``.

    ONNX has no Bucketize and tf2onnx no mapping for it at any opset ("No Op registered for
    Bucketize"), so a model with a Discretization layer had no ONNX form. The boundaries are
    sorted (Keras and TensorFlow require it), so the count is the bucket index exactly.
    """
    from onnx import TensorProto
    from tf2onnx import utils
    from tf2onnx.graph_builder import GraphBuilder

    boundaries = np.asarray(node.get_attr_value("boundaries"), dtype=np.float32)
    x, out = node.input[0], node.output[0]
    dtype = ctx.get_dtype(x)
    bounds = ctx.make_const(utils.make_name(f"{name}_boundaries"),
                            boundaries.astype(utils.map_onnx_to_numpy_type(dtype)))
    builder = GraphBuilder(ctx)
    column = builder.make_unsqueeze({"data": x, "axes": [-1]}, name=utils.make_name(f"{name}_column"))
    above = ctx.make_node("GreaterOrEqual", inputs=[column, bounds.output[0]], name=utils.make_name(f"{name}_ge"))
    counted = ctx.make_node("Cast", inputs=above.output, attr={"to": TensorProto.INT32},
                            name=utils.make_name(f"{name}_int"))
    shape, out_dtype = ctx.get_shape(out), ctx.get_dtype(out)
    ctx.remove_node(node.name)
    builder.make_reduce_sum({"data": counted.output[0], "axes": [-1], "keepdims": 0, "outputs": [out]},
                            name=utils.make_name(f"{name}_count"), shapes=[shape], dtypes=[out_dtype])
    return None


def _constant_captures(concrete: Any) -> int:
    """How many values the function closes over that are not resources (variables, tables):
    tf2onnx would make each a graph input, so ``_frozen`` folds them first."""
    import tensorflow as tf

    return sum(1 for t in concrete.captured_inputs if t.dtype != tf.resource)


class _ResourceLeft(Exception):
    """Freezing could not fold a resource (a lookup table) into the graph."""


def _frozen(serving: Any, concrete: Any, lower_control_flow: bool) -> Any:
    """The serving function with its variables and captures frozen into the graph.

    tf2onnx lists every non-resource capture of the function as a graph input, so a
    constant the model closes over (an adapted ``Normalization``'s mean and variance are
    eager tensors) became a required ONNX input. Freezing first leaves only the real inputs.
    """
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    frozen = convert_variables_to_constants_v2(concrete, lower_control_flow=lower_control_flow)
    left = len(frozen.inputs) - len(serving.specs)
    if left > 0:
        raise _ResourceLeft(f"freezing left {left} resource input(s) besides the model's inputs: a lookup table "
                            "(StringLookup, IntegerLookup, TextVectorization, StaticHashTable) that freezing cannot fold "
                            "into the graph, so tf2onnx cannot convert it")

    def serve(*xs: Any) -> Any:  # the frozen function returns a flat list: give back the dict
        return tf.nest.pack_sequence_as(concrete.structured_outputs, tf.nest.flatten(frozen(*xs)))

    return tf.function(serve, input_signature=serving.specs, autograph=False)


# Attributes that keep a function from being inlined: Keras' TensorFlow backend runs grouped
# convolutions (ConvNeXt's depthwise Conv2D(groups=...)) in a tf.function(jit_compile=True),
# which tf2onnx leaves as a StatefulPartitionedCall no ONNX runtime knows.
_NOINLINE_ATTRS = ("_noinline", "_XlaMustCompile")


def _must_compile_functions(concrete: Any) -> list[str]:
    """Names of the functions in the graph that are marked never to be inlined."""
    library = concrete.graph.as_graph_def().library.function
    return [f.signature.name for f in library if any(a in f.attr and f.attr[a].b for a in _NOINLINE_ATTRS)]


def _convert_inlined(serving: Any, concrete: Any, lower_control_flow: bool, **kwargs: Any) -> Any:
    """Freeze, clear the never-inline marks so tf2onnx's graph optimizer inlines every call,
    and convert the GraphDef with the Keras input and output names."""
    import tf2onnx
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    frozen = convert_variables_to_constants_v2(concrete, lower_control_flow=lower_control_flow)
    graph_def = frozen.graph.as_graph_def()
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    for holder in [*graph_def.library.function, *nodes]:
        for attr in _NOINLINE_ATTRS:
            if attr in holder.attr:
                del holder.attr[attr]
    inputs = [t.name for t in frozen.inputs]
    outputs = [t.name for t in frozen.outputs]
    # The frozen function's outputs are the flattened dict of outputs: sorted by name.
    names = {**dict(zip(inputs, [s.name for s in serving.specs])),
             **dict(zip(outputs, sorted(concrete.structured_outputs)))}
    proto, _ = tf2onnx.convert.from_graph_def(graph_def, input_names=inputs, output_names=outputs,
                                              tensors_to_rename=names, **kwargs)
    return proto


def _export_error(path: Path, problem: str, log: ConverterLog, route: str, exc: BaseException | None) -> ExportError:
    """One ExportError from a failed conversion or a file onnxruntime refuses: the ops tf2onnx
    logged as unsupported, and the fix."""
    text = log.text() + ("\n" + str(exc) if exc is not None else "")
    ops: list[str] = []
    for found in re.findall(r"Unsupported ops: Counter\(\{([^}]*)\}\)", text):
        ops.extend(re.findall(r"'(\w+)'", found))
    ops.extend(re.findall(r"No Op registered for (\w+)", text))
    ops = sorted(set(ops) - {"PartitionedCall", "StatefulPartitionedCall"}) or sorted(set(ops))
    advice = next((ln.split(":", 2)[-1].strip() for ln in text.splitlines()
                   if "rewrite failed" in ln or "opset" in ln.lower() and "try" in ln.lower()), None)
    fix = ("tf2onnx has no ONNX mapping for these ops at this opset: pass converter_options={'opset': N} "
           "for a newer opset, or {'custom_op_handlers': {op: (handler, [])}} (tf2onnx's API), or compare "
           "this model through saved_model" if ops else
           "tf2onnx could not convert this graph (the converter log has the details): compare this model "
           "through saved_model, or try converter_options={'opset': N} or {'lower_control_flow': True/False}")
    return ExportError(path, NAME, problem, fix, unsupported_ops=ops, advice=advice, log_path=log.keep(), route=route)


def validate(path: Path) -> None:
    """Raise ExportError unless ``path`` passes onnx.checker and runs once in onnxruntime."""
    validate_content(Path(path).read_bytes(), Path(path))


def validate_content(content: bytes, path: Path, *, log: ConverterLog | None = None, route: str | None = None) -> None:
    """``onnx.checker`` (when installed), an onnxruntime session, one run on zeros."""
    import onnxruntime as ort

    try:
        if importlib.util.find_spec("onnx") is not None:  # the checker comes with tf2onnx
            import onnx

            onnx.checker.check_model(onnx.load_model_from_string(content))
        options = ort.SessionOptions()
        options.log_severity_level = 4  # a probe size the model cannot take is not worth an ERROR line
        session = ort.InferenceSession(content, options, providers=["CPUExecutionProvider"])
        # Open non-batch dims at the smallest size the file takes (a valid-conv net takes no 1x1).
        _, results = run_probe(lambda feeds: session.run(None, feeds), [ort_spec(arg) for arg in session.get_inputs()])
        lost = _shape_mismatch(content, results)
    except Exception as exc:  # noqa: BLE001 - onnx/onnxruntime raise their own untyped errors
        if log is None:
            raise ExportError(path, NAME, f"the converted file does not load or run in onnxruntime: "
                              f"{first_line(exc, 200)}{probe_note(exc)}", "re-export it with export_model(model, 'onnx', path)",
                              route=route) from exc
        log.note(f"modelparity: the converted file is invalid:\n{exc}")
        raise _export_error(path, f"tf2onnx wrote a file onnxruntime refuses: {first_line(exc, 200)}{probe_note(exc)}",
                            log, route or "?", exc) from exc
    if lost:
        problem = (f"tf2onnx wrote a file whose output shape is not the model's: {lost} (onnxruntime only warns "
                   f"\"Error merging shape info\" and runs it); a converter defect, e.g. SAME padding lost when a "
                   f"ZeroPadding2D is folded into a dilated Conv2D")
        fix = ("compare this model through tflite or saved_model, or pad explicitly (Conv2D padding='valid' after "
               "the ZeroPadding2D that gives the same output size)")
        if log is None:
            raise ExportError(path, NAME, problem, fix, route=route)
        raise ExportError(path, NAME, problem, fix, route=route, log_path=log.keep())


def _shape_mismatch(content: bytes, results: Any) -> str:
    """``"output 'x' computes (N, 2, 2, 4), the file declares (N, 6, 6, 4)"`` where the fixed dims that
    the file declares (from the source model) differ from what onnxruntime computed, else ``""``."""
    if importlib.util.find_spec("onnx") is None:
        return ""
    import onnx

    declared = onnx.load_model_from_string(content).graph.output
    found = []
    for out, value in zip(declared, results or []):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in out.type.tensor_type.shape.dim]
        shape = tuple(getattr(value, "shape", ()))
        if not dims or len(dims) != len(shape):
            continue
        if any(want is not None and want > 0 and want != got for want, got in zip(dims[1:], shape[1:])):
            show = lambda ds: "(" + ", ".join("N" if i == 0 else str(d) for i, d in enumerate(ds)) + ")"  # noqa: E731
            found.append(f"output {out.name!r} computes {show(shape)}, the file declares {show(dims)}")
    return "; ".join(found)


def _keep_keras_output_order(proto: Any, names: list[str]) -> None:
    """Order the graph outputs like the Keras model's (tf2onnx sorts a dict of outputs by name)."""
    outputs = {o.name: o for o in proto.graph.output}
    if sorted(outputs) != sorted(names):
        return
    ordered = [outputs[n] for n in names]
    copies = [type(o)() for o in ordered]
    for copy, original in zip(copies, ordered):
        copy.CopyFrom(original)
    del proto.graph.output[:]
    proto.graph.output.extend(copies)
