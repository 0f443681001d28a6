"""TFLite: export a Keras model (or a SavedModel directory) to a ``.tflite`` file with
TensorFlow's converter, in one of its variants (float32, float16, dynamic range, int8), and
validate the file with the LiteRT interpreter before it is written.

Exporting needs TensorFlow's converter; loading (``load.py``) needs only ``ai_edge_litert``.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from ...errors import ExportError
from ..common import TF_INSTALL, ConverterLog, finish_export, first_line, probe_note, run_probe
from ..tensorflow.serving import begin_export, converter_holder, graph_op_types
from ..base import TensorSpec
from .load import DIV_FIX, NAME, div_cause, div_zero_point_cause, new_interpreter, tensor_shape

CONVERTS_SAVED_MODEL = True  # export() also takes a SavedModel directory
EXPORT_VALIDATES = True  # export() runs validate_content() before writing: no broken file is written
EXPORT_REQUIRES = (("tensorflow", TF_INSTALL),)

QUANTIZATIONS = ("float32", "float16", "dynamic_range", "int8")
REPRESENTATIVE_SAMPLES = 100
class DefaultCalibration(UserWarning):
    """An int8 export calibrated on generated uniform [0, 1) rows, not on data."""


def _representative(specs: list[Any], data: Iterable[Any] | None, samples: int, batch: int = 1):
    """Calibration samples of ``batch`` rows, as dicts by input name.

    By name, not by position: the converter's input order is not the Keras input order (a
    model with inputs ``image`` and ``meta`` converts to ``(meta, image)``), and a list fed in
    the wrong order reaches a Conv2D with the rank-2 input.
    """
    names = [s.name for s in specs]

    def rows(given: Any):
        if isinstance(given, dict):
            if all(n in given for n in names):
                arrays = [np.asarray(given[n]) for n in names]
            elif len(given) == len(names) == 1:
                arrays = [np.asarray(next(iter(given.values())))]
            else:
                raise ValueError(f"representative_data: a dict batch needs the keys {names}, got {sorted(given)}")
        elif isinstance(given, (list, tuple)) and len(names) > 1:
            arrays = [np.asarray(b) for b in given]
        else:
            arrays = [np.asarray(given)]
        for i in range(0, arrays[0].shape[0] - batch + 1, batch):
            yield {n: a[i:i + batch].astype(s.dtype.as_numpy_dtype) for n, a, s in zip(names, arrays, specs)}

    def generated():
        rng = np.random.default_rng(0)
        for _ in range(samples):
            yield {s.name: rng.uniform(0.0, 1.0, (batch, *[d or 1 for d in s.shape[1:]])).astype(s.dtype.as_numpy_dtype)
                   for s in specs}

    def dataset():
        if data is None:
            yield from generated()
        else:
            # One array (or dict of arrays) of rows is one batch: iterated, it would give single
            # rows (or the dict's keys), which calibrated nothing and left a float32 file.
            one = isinstance(data, dict) or (isinstance(data, np.ndarray) and len(specs) == 1
                                             and data.ndim == len(specs[0].shape))
            for given in ([data] if one else data):
                yield from rows(given)

    return dataset


# Ops that mean "a loop over a sequence": Keras RNN layers trace to a While over TensorLists,
# which TFLite's builtins convert only with a static batch size.
_LOOP_OPS = frozenset({"While", "StatelessWhile", "TensorListReserve", "TensorListFromTensor"})
ROUTES = ("auto", "dynamic", "static_batch")
_OPS_SETS = {"TFLITE_BUILTINS", "SELECT_TF_OPS", "TFLITE_BUILTINS_INT8", "EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8"}


def export(model: Any, path: Path, *, quantization: str | None = None,
           representative_data: Iterable[Any] | None = None,
           representative_samples: int = REPRESENTATIVE_SAMPLES, io_dtype: str = "float32",
           converter_options: dict[str, Any] | None = None, graph_options: dict[str, Any] | None = None) -> Path:
    """Convert a Keras model (or a SavedModel directory) to ``path`` (a ``.tflite`` file);
    float32 unless ``quantization``. The file is run once in LiteRT before it is returned.

    ``quantization``: ``"float16"`` (float16 weights), ``"dynamic_range"`` (int8 weights,
    float activations) or ``"int8"`` (int8 weights and activations, float32 inputs/outputs).
    ``int8`` calibrates on ``representative_data`` (an iterable of batches: arrays, lists or
    dicts by input name); without it, ``representative_samples`` uniform [0, 1) samples are
    generated from the input specs, which fits inputs scaled to [0, 1] only.
    ``io_dtype="int8"`` or ``"uint8"`` (``int8`` only) makes the inputs and outputs integer too,
    as microcontroller deployments want; ``load`` shows them as float32 again by default.

    Routes: ``dynamic`` converts the serving function with a free batch dim (the default);
    a graph with loops (Keras LSTM/GRU/RNN) takes ``static_batch``: the function is traced
    with a fixed batch size (1 unless ``static_batch``), frozen without lowering its control
    flow, and converted; ``load`` runs other batch sizes in chunks of it. ``auto`` also
    retries ``static_batch`` when the dynamic route fails on tensor lists or on a new-axis
    StridedSlice (which converts only with every dim fixed). An int8 file with a DIV by a computed
    tensor is quantised again with DIV kept in float (LiteRT refuses an int8 divisor at its zero
    point); the route says so.
    ``converter_options``: ``route`` (above), ``static_batch`` (int), ``supported_ops``
    (names of ``tf.lite.OpsSet`` members, e.g. ``["TFLITE_BUILTINS", "SELECT_TF_OPS"]``),
    ``lower_tensor_list_ops`` (bool), ``float_nodes`` (int8 only: tensor names kept in float,
    the quantisation hint's fix), and any other attribute of ``TFLiteConverter``
    (``allow_custom_ops``, ``experimental_new_quantizer``, ...) set as given.
    """
    variant = quantization or "float32"
    if variant not in QUANTIZATIONS:
        raise ValueError(f"unknown tflite quantization {quantization!r}; use one of {', '.join(QUANTIZATIONS)}")
    if io_dtype not in ("float32", "int8", "uint8") or (io_dtype != "float32" and variant != "int8"):
        raise ValueError(f"io_dtype={io_dtype!r}: use 'float32', or 'int8'/'uint8' with quantization='int8'")
    options = dict(converter_options or {})
    route = options.pop("route", "auto")
    static_batch = options.pop("static_batch", None)
    float_nodes = options.pop("float_nodes", None)
    if float_nodes is not None:
        if variant != "int8":
            raise ValueError(f"converter_options float_nodes keeps nodes of an int8 file in float; quantization="
                             f"{quantization!r} is not int8 (QuantizationDebugger needs a representative dataset)")
        if isinstance(float_nodes, str) or not all(isinstance(n, str) for n in float_nodes):
            raise ValueError("converter_options float_nodes takes a list of tensor names, as the quantisation "
                             "hint prints them")
        options["float_nodes"] = list(float_nodes)
    if route not in ROUTES:
        raise ValueError(f"unknown tflite route {route!r}; use one of {', '.join(ROUTES)}")
    if static_batch is not None and (not isinstance(static_batch, int) or static_batch < 1):
        raise ValueError(f"static_batch must be a positive int, got {static_batch!r}")
    if variant == "int8" and representative_data is None:
        warnings.warn(DefaultCalibration(
            f"tflite int8 export to {path}: no representative_data, so the file is calibrated on "
            f"{representative_samples} uniform [0, 1) rows; inputs outside [0, 1] are clipped at the input's "
            "quantisation. Pass representative_data=[rows like the model's inputs]"), stacklevel=3)
    from ..tensorflow.mixed_precision import float32_plan

    # A half-precision model computes in float32 with the same weights: TFLite has no float16
    # kernels and no converter option makes it take them (mixed_precision.py, measured).
    plan = float32_plan(model)
    path, serving, log = begin_export(plan.subject, path, NAME, "model.tflite", graph_options)
    try:
        with log.capture(), plan.scope:
            concrete = serving.function.get_concrete_function()
            loops = sorted(graph_op_types(concrete) & _LOOP_OPS)
            if variant == "int8" and loops:
                raise ExportError(
                    path, NAME, f"int8 calibration of a graph with loops ({', '.join(loops)}: a Keras RNN) crashes "
                    "TensorFlow's calibrator with a segmentation fault (measured with TF 2.21), so it is not attempted",
                    "compare tflite:dynamic_range or tflite:float16 for this model (both convert and run)",
                    unsupported_ops=loops, route="static_batch")
            if route == "auto":
                routes = ["static_batch"] if loops or static_batch else ["dynamic", "static_batch"]
            else:
                routes = [route]
            content, taken, failure, kept = None, routes[0], None, ""
            for taken in routes:
                try:
                    content, kept = _convert(serving, concrete, taken, static_batch or 1, variant, io_dtype,
                                             representative_data, representative_samples, options)
                    break
                except FloatDivisionNeeded as exc:
                    raise ExportError(path, NAME, str(exc), "export with io_dtype='float32' (float inputs and "
                                      "outputs): the DIV is then kept in float and the rest is int8",
                                      log_path=log.keep(), route=taken) from None
                except Exception as exc:  # noqa: BLE001 - converter errors are many and untyped
                    if isinstance(exc, (TypeError, ValueError)) and "converter_options" in str(exc):
                        raise  # the caller's mistake, not the converter's
                    failure = exc
                    log.note(f"modelparity: route {taken!r} failed: {exc}")
                    # Only tensor-list and new-axis slice failures are fixed by a static batch;
                    # others fail as they are.
                    if "TensorList" not in str(exc) and new_axis_slice(str(exc)) is None:
                        break
            if content is None:
                assert failure is not None
                raise _converter_error(path, failure, log, variant, taken, loops, plan.policy)
            why = f" (the graph has {', '.join(loops)})" if loops and taken == "static_batch" else ""
            if not why and failure is not None and new_axis_slice(str(failure)) is not None:
                why = " (a new-axis StridedSlice converts only with every dim fixed)"
            route_text = taken + (f" {static_batch or 1}" if taken == "static_batch" else "") + why
            if kept:
                route_text += f"; {kept}"
            if plan.route:
                route_text += f"; {plan.route}"
            if serving.route:  # a TF1 source: how its graph was read and frozen
                route_text += f"; {serving.route}"
        finish_export(path, content, NAME, route_text, log, validate_content)
    finally:
        log.discard()
    return path


def _convert(serving: Any, concrete: Any, route: str, batch: int, variant: str, io_dtype: str,
             representative_data: Any, representative_samples: int, options: dict[str, Any]) -> tuple[bytes, str]:
    """The converted file, and what of it was kept in float (``""``: nothing)."""
    import tensorflow as tf

    if route == "static_batch":
        concrete, holder = _static_batch_function(serving, concrete, batch)
    else:
        holder, batch = converter_holder(serving, concrete), 1

    def converter() -> Any:  # a TFLiteConverter converts once: a second pass needs a new one
        made = tf.lite.TFLiteConverter.from_concrete_functions([concrete], holder)
        if variant != "float32":
            made.optimizations = [tf.lite.Optimize.DEFAULT]
        if variant == "float16":
            made.target_spec.supported_types = [tf.float16]
        elif variant == "int8":
            made.representative_dataset = _representative(serving.specs, representative_data,
                                                          representative_samples, batch)
            made.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            if io_dtype != "float32":
                made.inference_input_type = made.inference_output_type = tf.as_dtype(io_dtype)
        _apply_options(made, {k: v for k, v in options.items() if k != "float_nodes"})
        return made

    if options.get("float_nodes"):
        # The quantisation hint's fix: the named nodes kept in float (selective quantisation).
        content = _float_quantized(converter(), nodes=options["float_nodes"])
        _check_float_nodes(content, options["float_nodes"])
        return content, f"kept in float: {len(options['float_nodes'])} node(s) named by converter_options float_nodes"
    content = converter().convert()
    divisions = int8_divisions(content) if variant == "int8" else []
    if divisions and io_dtype != "float32":
        raise FloatDivisionNeeded(
            f"{div_cause(divisions[0])}; keeping it in float leaves a float tensor where io_dtype={io_dtype!r} wants "
            "integer inputs and outputs")
    if divisions:
        return _float_divisions(converter()), FLOAT_DIV_ROUTE
    return content, ""


def _check_float_nodes(content: bytes, nodes: list[str]) -> None:
    """Refuse ``float_nodes`` names that match no tensor of the file: QuantizationDebugger
    ignores them without a word, and the file came out as int8 as without them (measured)."""
    names = {str(d["name"]) for d in new_interpreter(content).get_tensor_details()}
    unmatched = [n for n in nodes if n not in names]
    if unmatched:
        raise ValueError(
            f"converter_options float_nodes: {len(unmatched)} of {len(nodes)} name(s) match no tensor of the int8 "
            f"file, so nothing would be kept in float for them: {unmatched[:5]!r}; use the full tensor names the "
            "quantisation hint prints (a layer's short name, 'conv1', matches nothing)")


class FloatDivisionNeeded(Exception):
    """An int8 export with integer I/O whose DIV must stay in float (``export`` says the fix)."""


# LiteRT's int8 DIV refuses a divisor element equal to the divisor's zero point (div.cc:
# ``TF_LITE_ENSURE(context, data[i] != zero_point)``, "Node number N (DIV) failed to invoke"):
# the quantised value of real 0. An activation's int8 range always holds 0, so any row whose
# divisor rounds to 0 (a ReLU's zeros, a Dense output crossing 0, the export check's zeros)
# fails; a float DIV divides such rows as the source model does.
FLOAT_DIV_ROUTE = ("DIV kept in float (its int8 divisor's range holds zero, and LiteRT's int8 DIV refuses a "
                   "divisor at its zero point)")


def int8_divisions(content: bytes) -> list[int]:
    """The DIV nodes of a file that divide by a computed int8 tensor (not a constant)."""
    interp = new_interpreter(content)
    details = {int(d["index"]): d for d in interp.get_tensor_details()}
    produced = {int(i) for op in interp._get_ops_details() for i in op["outputs"]}
    fed = {int(d["index"]) for d in interp.get_input_details()}
    nodes = []
    for op in interp._get_ops_details():
        if op["op_name"] != "DIV" or len(op["inputs"]) < 2:
            continue
        divisor = int(op["inputs"][1])
        if np.dtype(details[divisor]["dtype"]).kind in "iu" and (divisor in produced or divisor in fed):
            nodes.append(int(op["index"]))
    return nodes


def _float_divisions(converter: Any) -> bytes:
    """Quantise again with every DIV kept in float (``_float_quantized``)."""
    return _float_quantized(converter, ops=["DIV"])


def _float_quantized(converter: Any, *, ops: list[str] | None = None, nodes: list[str] | None = None) -> bytes:
    """Quantise with the op types ``ops`` and the nodes (tensor names) ``nodes`` kept in float:
    TFLite's selective quantisation (``tf.lite.experimental.QuantizationDebugger`` with
    ``denylisted_ops``/``denylisted_nodes``) on ``converter`` (new, with the options and the
    calibration data of the export)."""
    import tensorflow as tf

    options = tf.lite.experimental.QuantizationDebugOptions(denylisted_ops=ops or None, denylisted_nodes=nodes or None)
    with warnings.catch_warnings():
        # The debugger opens its own (deprecated) tf.lite.Interpreter on the instrumented file.
        warnings.filterwarnings("ignore", message=".*tf.lite.Interpreter is deprecated.*")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        debugger = tf.lite.experimental.QuantizationDebugger(
            converter=converter, debug_dataset=converter.representative_dataset, debug_options=options)
        return bytes(debugger.get_nondebug_quantized_model())


def _apply_options(converter: Any, options: dict[str, Any]) -> None:
    """Set the user's ``converter_options`` on the converter (names checked, typed errors)."""
    import tensorflow as tf

    for key, value in options.items():
        if key == "supported_ops":
            names = [getattr(v, "name", v) for v in value]
            unknown = [n for n in names if n not in _OPS_SETS]
            if unknown:
                raise ValueError(f"converter_options supported_ops: unknown {unknown}; use names of "
                                 f"tf.lite.OpsSet: {', '.join(sorted(_OPS_SETS))}")
            converter.target_spec.supported_ops = {getattr(tf.lite.OpsSet, n) for n in names}
        elif key == "lower_tensor_list_ops":
            converter._experimental_lower_tensor_list_ops = bool(value)
        elif key == "supported_types":
            converter.target_spec.supported_types = [tf.as_dtype(v) for v in value]
        elif hasattr(converter, key) and not key.startswith("_"):
            setattr(converter, key, value)
        else:
            raise TypeError(f"unknown converter_options key {key!r} for format 'tflite'; known: route, "
                            "static_batch, supported_ops, supported_types, lower_tensor_list_ops, float_nodes, or an "
                            "attribute of tf.lite.TFLiteConverter")


def _static_batch_function(serving: Any, concrete: Any, batch: int) -> tuple[Any, Any]:
    """The serving function traced with batch ``batch`` and frozen with its loops kept as
    functional While ops (lowering them, or leaving variables inside the loop body, makes a
    file that fails at invoke with READ_VARIABLE). Outputs keep their names."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    specs = [tf.TensorSpec((batch, *s.shape[1:]), s.dtype, name=s.name) for s in serving.specs]
    fixed = tf.function(serving.function.python_function, input_signature=specs,
                        autograph=False).get_concrete_function()
    frozen = convert_variables_to_constants_v2(fixed, lower_control_flow=False)

    def serve(*xs: Any) -> Any:
        return tf.nest.pack_sequence_as(fixed.structured_outputs, tf.nest.flatten(frozen(*xs)))

    return tf.function(serve, input_signature=specs, autograph=False).get_concrete_function(), tf.Module()


def _converter_error(path: Path, exc: BaseException, log: ConverterLog, variant: str, route: str,
                     loops: list[str], policy: str | None = None) -> ExportError:
    text = str(exc)
    log.note(f"modelparity: the TFLite converter failed ({variant}, route {route}):\n{text}")
    ops = sorted(set(re.findall(r"'tf\.(\w+)' op", text)) | set(re.findall(r"\btf\.(\w+)\(", text)))
    advice = next((ln.strip() for ln in text.replace("\\n", " ").splitlines()
                   if re.search(r"TF Select|Select TF|you can enable|Flex|consider", ln) and len(ln.strip()) < 600), None)
    if advice:  # drop the MLIR location prefix ("<unknown>:0: error: ")
        advice = re.sub(r"^.*?\berror:\s*", "", advice)
    if policy is not None and ops:
        from ..tensorflow.mixed_precision import policy_cause

        # Every variant converts the same float16 graph: no other tflite variant is advice here.
        return ExportError(path, NAME, f"{policy_cause(policy)} (the TFLite converter failed: {variant}, route "
                           f"{route})", f"build the model under the 'float32' policy, or 'mixed_{policy.split('_')[-1]}' "
                           "(float32 weights: exported as a float32-policy trace), for tflite; or compare it through "
                           "saved_model, onnx or tfjs, which run float16 graphs", unsupported_ops=ops,
                           log_path=log.keep(), route=route)
    sliced = new_axis_slice(text)
    if sliced is not None:
        return _new_axis_error(path, sliced, log, variant, route)
    table = _TABLE_INPUT.search(text)
    if route == "static_batch" and loops and table is not None:
        return ExportError(
            path, NAME, f"the model has a lookup table ({table.group(1)}: TextVectorization, StringLookup, "
            f"IntegerLookup) and a loop ({', '.join(loops)}: a Keras RNN); TFLite's builtin ops convert the loop only "
            "with a static batch, whose frozen graph cannot hold a table (freezing leaves it as an input), and with "
            "a dynamic batch the loop's tensor lists need Flex kernels, which the Python LiteRT interpreter has no "
            "delegate for, so no converter option makes a file that runs here",
            "compare this model through saved_model or keras (they keep the table); for tflite, move the lookup "
            "(text preprocessing) out of the model and export the model that takes its integer ids",
            unsupported_ops=[], log_path=log.keep(), route=route, not_applicable=True)
    if any(op.startswith("TensorList") for op in ops) and route != "static_batch":
        fix = ("a loop over tensor lists (a Keras RNN) converts with a static batch: leave converter_options' "
               "route at 'auto' (the default) or pass {'route': 'static_batch'}")
    elif variant == "int8" and not ops and ("dims" in text or "representative" in text.lower()):
        # calibration data that does not fit; a missing kernel (ops) fails every variant alike
        fix = ("check the representative data matches the model's inputs (fed by input name), or compare "
               "tflite:dynamic_range instead")
    elif ops:
        fix = ("these ops have no TFLite builtin kernel, and the Python LiteRT interpreter has no Flex delegate to "
               "run them (Select TF ops, the converter's suggestion, makes a file that cannot run here): compare "
               "this model through saved_model or onnx, or deselect tflite")
    else:
        fix = "compare this model through saved_model or onnx, or pass converter_options to the converter"
    return ExportError(path, NAME, f"the TFLite converter failed ({variant}, route {route}): {first_line(exc, 200)}",
                       fix, unsupported_ops=ops, advice=advice, log_path=log.keep(), route=route)


# A frozen static-batch function whose lookup table became an input: "pruned(text, .../LookupTableFindV2/
# table_handle) missing required arguments: .../table_handle" (measured with TF 2.21).
_TABLE_INPUT = re.compile(r"missing required arguments: (\S*?(?:table_handle|hash_table)\S*?)[.,\s]")


# The converter has a builtin STRIDED_SLICE, but not for the new_axis variant (``x[:, None]``,
# what tf.signal.stft's callers write to add a channel) on a tensor with a dynamic dim: it
# asks for Flex ("'tf.StridedSlice' op is neither a custom op nor a flex op"). With every dim
# fixed (a fixed length, traced with a static batch) it converts (measured with TF 2.21).
_NEW_AXIS = re.compile(r'tf\.StridedSlice\(tensor<([^>]*)>[^\n]*->\s*\(?tensor<([^>]*)>\)?\s*:\s*\{[^}]*'
                       r'new_axis_mask = ([1-9]\d*)')


def new_axis_slice(text: str) -> tuple[str, str, int] | None:
    """``(input shape, output shape, new_axis_mask)`` of a new-axis StridedSlice the converter
    refused, from its "Details:" line; None for another failure."""
    match = _NEW_AXIS.search(text)
    return None if match is None else (match.group(1), match.group(2), int(match.group(3)))


def _new_axis_error(path: Path, sliced: tuple[str, str, int], log: ConverterLog, variant: str,
                    route: str) -> ExportError:
    shape_in, shape_out, mask = sliced
    dims = shape_in.split("x")[:-1]  # the last item is the dtype (f32)
    open_dims = [i for i, d in enumerate(dims) if d == "?"]
    nodes = re.findall(r'fused\["StridedSlice:", callsite\("([^"@]+)@', log.text())
    node = f" {nodes[0]!r}" if nodes else ""
    problem = (f"the TFLite converter failed ({variant}, route {route}): StridedSlice{node} is the new_axis variant "
               f"(new_axis_mask={mask}: an axis added by indexing, x[..., tf.newaxis] or x[:, None]; {shape_in} -> "
               f"{shape_out}) on a tensor with a dynamic "
               f"dim: TFLite's builtin STRIDED_SLICE has no new-axis form for dynamic dims (StridedSlice itself has a "
               "builtin kernel), so the converter asked for Flex")
    if open_dims and open_dims != [0]:
        fix = ("give that input a fixed length (e.g. keras.Input((512,)) instead of keras.Input((None,))): the "
               "export then converts it with a static batch (route static_batch); or add the axis with "
               "tf.expand_dims instead of indexing, which converts with dynamic dims")
    else:
        fix = ("leave converter_options' route at 'auto' (it retries with a static batch), or add the axis with "
               "tf.expand_dims instead of indexing, which converts with dynamic dims")
    return ExportError(path, NAME, problem, fix, unsupported_ops=["StridedSlice"], log_path=log.keep(), route=route)


def validate(path: Path) -> None:
    """Raise ExportError unless ``path`` loads and runs once in LiteRT (zeros in)."""
    validate_content(Path(path).read_bytes(), Path(path))


def validate_content(content: bytes, path: Path, *, log: ConverterLog | None = None, route: str | None = None) -> None:
    """Allocate and invoke ``content`` once on zeros (open non-batch dims at the smallest of
    ``probe_sizes`` the file takes): what fails here would fail at load."""
    try:
        probe = new_interpreter(content)
        details = probe.get_input_details()
        specs = [TensorSpec(d["name"], tensor_shape(d), d["dtype"]) for d in details]

        def run(batch: dict[str, np.ndarray]) -> list[np.ndarray]:
            interp = new_interpreter(content)
            for det, spec in zip(details, specs):
                if any(d is None for d in spec.shape):
                    interp.resize_tensor_input(det["index"], batch[spec.name].shape, strict=True)
            interp.allocate_tensors()
            for det, spec in zip(details, specs):
                interp.set_tensor(det["index"], batch[spec.name])
            interp.invoke()
            return [interp.get_tensor(o["index"]) for o in interp.get_output_details()]

        run_probe(run, specs)
    except Exception as exc:  # noqa: BLE001 - LiteRT raises RuntimeError/ValueError with C++ text
        text = str(exc)
        ops = sorted(set(re.findall(r"\((Flex\w+)\)", text)) | set(re.findall(r"\b(Flex\w+)\b", text)))
        if log is not None:
            log.note(f"modelparity: LiteRT refused the converted file:\n{text}")
        cause = div_zero_point_cause(text)
        if cause is not None:
            raise ExportError(path, NAME, f"the converted file does not run in LiteRT: {cause}{probe_note(exc)}",
                              DIV_FIX, log_path=log.keep() if log is not None else None, route=route) from exc
        raise ExportError(
            path, NAME, f"the converted file does not run in LiteRT: {first_line(exc, 200)}{probe_note(exc)}",
            "the Python LiteRT interpreter has no Flex (Select TF ops) delegate: convert with builtin ops "
            "only (drop SELECT_TF_OPS), or compare this model through saved_model or onnx" if ops else
            "compare this model through saved_model or onnx, or deselect tflite for it",
            unsupported_ops=ops, log_path=log.keep() if log is not None else None, route=route) from exc
