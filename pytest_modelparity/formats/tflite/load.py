"""TFLite: load a ``.tflite`` file with the LiteRT interpreter (``export.py`` writes one).

Loading needs only ``ai_edge_litert`` (it imports in a few hundredths of a second, without
TensorFlow). ``tf.lite.Interpreter`` is deprecated and is never used.

Why an LRU of interpreters: a LiteRT interpreter has one input shape at a time and
``resize_tensor_input`` + ``allocate_tensors`` replans memory. A test suite that alternates
batch sizes would pay that on every call; one interpreter per recent input shape pays it
once per shape (``TFLiteModel.resize_count`` counts it).

The variant of a file (``format_variant``: ``tflite:float32``, ``tflite:float16``,
``tflite:dynamic_range``, ``tflite:int8``) is read from the tensor dtypes of the file itself,
so it works for any user's file and needs no sidecar.
"""

from __future__ import annotations

import re
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...errors import ModelLoadError
from ..common import first_line, read_model_bytes, run_probe, unique
from ..base import LoadedModel, TensorSpec

NAME = "tflite"
_MAGIC = b"TFL3"  # FlatBuffer file identifier, bytes 4..8 of every .tflite file


# -- detection -------------------------------------------------------------------------
def detect(path: Path) -> bool:
    """A ``.tflite`` file (the suffix is the only cheap, reliable sign)."""
    return path.suffix.lower() == ".tflite" and not path.is_dir()


# -- loading ---------------------------------------------------------------------------
def check_cpu_device(device: str) -> str:
    """TFLite accepts ``cpu``; a GPU request says why not (unknown names: ValueError)."""
    from ...runtime.devices import require_cpu_only

    require_cpu_only(device, NAME, "the LiteRT Python interpreter has no desktop GPU delegate",
                     f"Use device='cpu' for {NAME}, and compare GPU results through saved_model or onnx.")
    return "cpu"


def _check_magic(path: Path, content: bytes) -> None:
    if len(content) < 8 or content[4:8] != _MAGIC:
        got = content[4:8] if len(content) >= 8 else content[:8]
        raise ModelLoadError(
            path, NAME,
            f"not a TFLite FlatBuffer: the file identifier 'TFL3' is missing at byte 4 (found {got!r}, "
            f"file size {len(content)} bytes)",
            "pass a file written by TFLiteConverter (or export_model(model, 'tflite', path)); "
            "if it is another format, pass format=... or give it its own suffix")


def load(source: Any, *, device: str = "cpu", preserve_all_tensors: bool = False,
         num_threads: int | None = None, max_interpreters: int = 8, signature: str | None = None,
         dequantize_io: bool = True, float_sibling: Any = None, **options: Any) -> "TFLiteModel":
    """Load ``source`` (a ``.tflite`` path) on the CPU.

    ``preserve_all_tensors=True`` keeps every intermediate tensor readable (LiteRT's
    ``experimental_preserve_all_tensors``); ``max_interpreters`` bounds the per-shape cache;
    ``signature`` picks a named signature (default: ``serving_default`` or the only one).
    ``dequantize_io`` (default True): a fully quantised model with int8/uint8 inputs or
    outputs takes and returns float32, quantised with the file's own scale and zero point,
    so it compares directly with the float model; False exposes the raw integer tensors.
    ``float_sibling``: the float32 ``.tflite`` of the same source (a path or a loaded model);
    a quantised file with one is judged in two parts by ``assert_outputs_close`` (conversion:
    the sibling vs the reference; quantisation cost: this file vs the sibling, ``checks/quantized.py``).
    """
    if options:
        raise TypeError(f"unknown option(s) for format 'tflite': {', '.join(sorted(options))}; "
                        "known: preserve_all_tensors, num_threads, max_interpreters, signature, dequantize_io, "
                        "float_sibling")
    device = check_cpu_device(device)
    path, content = read_model_bytes(source, NAME, ".tflite", _check_magic)
    model = TFLiteModel(content, path=path, device=device, preserve_all_tensors=preserve_all_tensors,
                        num_threads=num_threads, max_interpreters=max_interpreters, signature=signature,
                        dequantize_io=dequantize_io)
    if float_sibling is not None:
        sibling = float_sibling if isinstance(float_sibling, TFLiteModel) else load(float_sibling, device=device)
        if sibling.format_variant != f"{NAME}:float32":
            raise ModelLoadError(sibling.source, NAME, f"float_sibling is {sibling.format_variant}, not float32",
                                 "pass the float32 .tflite exported from the same source (export_model(model, "
                                 "'tflite', path) without quantization)")
        model.float_sibling = sibling
    return model


def new_interpreter(content: bytes, *, preserve_all_tensors: bool = False, num_threads: int | None = None,
                     no_delegates: bool = False):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    kwargs: dict[str, Any] = {"model_content": content, "num_threads": num_threads}
    if preserve_all_tensors:
        kwargs["experimental_preserve_all_tensors"] = True
    if no_delegates:
        # XNNPACK would fuse ops into DELEGATE nodes whose intermediates are never written.
        kwargs["experimental_op_resolver_type"] = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    with warnings.catch_warnings():
        # Asking for preserved tensors is deliberate here; LiteRT warns about memory.
        warnings.filterwarnings("ignore", message=".*experimental_preserve_all_tensors.*")
        return Interpreter(**kwargs)


def _allocate(native: Any, fresh: Callable[[], Any]) -> Any:
    """``native`` with its tensors allocated; a file with open non-batch dims that cannot be
    planned at 1 (valid convolutions) is planned at the smallest of ``probe_sizes`` it takes."""
    specs = [TensorSpec(d["name"], tensor_shape(d), d["dtype"]) for d in native.get_input_details()]

    def plan(batch: dict[str, np.ndarray]) -> Any:
        interp = native if size_one(batch) else fresh()
        if not size_one(batch):
            for det in interp.get_input_details():
                interp.resize_tensor_input(det["index"], batch[det["name"]].shape, strict=False)
        interp.allocate_tensors()
        return interp

    def size_one(batch: dict[str, np.ndarray]) -> bool:
        return all(v.shape == tuple(int(d) for d in det["shape"])
                   for v, det in zip(batch.values(), native.get_input_details()))

    return run_probe(plan, specs)[1]


def _dtype(detail: dict) -> np.dtype:
    return np.dtype(detail["dtype"])


def tensor_shape(detail: dict) -> tuple[int | None, ...]:
    sig = detail.get("shape_signature")
    dims = sig if sig is not None and len(sig) == len(detail["shape"]) else detail["shape"]
    return tuple(None if int(d) < 0 else int(d) for d in dims)


def _clean_tensor_name(name: str) -> str:
    name = name.split(":", 1)[0]
    return name[len("serving_default_"):] if name.startswith("serving_default_") else name


# LiteRT's int8 DIV refuses a divisor element equal to the divisor's zero point (export.py keeps
# such a DIV in float; a file made elsewhere fails when it runs).
_DIV_ZERO = re.compile(r"div\.cc:\d+ data\[i\] != zero_point was not true\.?\s*Node number (\d+) \(DIV\)")


def div_cause(node: int | str) -> str:
    return (f"node {node} (DIV) divides by an int8 tensor: its quantised divisor's range holds zero, so int8 "
            "cannot represent a divisor that must not be 0 (LiteRT's div.cc refuses a divisor at its zero point)")


def div_zero_point_cause(text: str) -> str | None:
    """What LiteRT's int8 DIV refusal means, naming the node; None for another failure."""
    match = _DIV_ZERO.search(text)
    return None if match is None else div_cause(match.group(1))


DIV_FIX = ("keep the DIV in float: let the plugin export tflite:int8 from the float model (it does so and says "
           "'DIV kept in float' in the route), or quantise your converter with "
           "tf.lite.experimental.QuantizationDebugger(converter=converter, debug_dataset=..., debug_options="
           "tf.lite.experimental.QuantizationDebugOptions(denylisted_ops=['DIV'])).get_nondebug_quantized_model()")


class TFLiteModel(LoadedModel):
    """A ``.tflite`` model on a LiteRT interpreter (one interpreter per recent input shape)."""

    format = NAME

    def __init__(self, content: bytes, *, path: Path | None, device: str = "cpu",
                 preserve_all_tensors: bool = False, num_threads: int | None = None,
                 max_interpreters: int = 8, signature: str | None = None, dequantize_io: bool = True) -> None:
        self._content = content
        self._preserve = preserve_all_tensors
        self._threads = num_threads
        self._max = max(1, int(max_interpreters))
        self.resize_count = 0
        try:
            native = new_interpreter(content, preserve_all_tensors=preserve_all_tensors, num_threads=num_threads)
            native = _allocate(native, lambda: new_interpreter(content, preserve_all_tensors=preserve_all_tensors,
                                                                num_threads=num_threads))
        except (ValueError, RuntimeError) as exc:
            raise _interpreter_error(path, content, exc) from exc
        except ModelLoadError as exc:  # a declared input too large to feed (common.check_declared_input)
            if exc.path is not None:
                raise
            raise ModelLoadError(path, NAME, exc.problem, exc.fix) from exc
        self.native = native
        in_details = native.get_input_details()
        out_details = native.get_output_details()
        in_names, out_names = self._signature_names(native, signature, in_details, out_details, path)
        self._in_index = {n: int(d["index"]) for n, d in zip(in_names, in_details)}
        self._out_index = {n: int(d["index"]) for n, d in zip(out_names, out_details)}
        # name -> (scale, zero point, integer dtype) for quantised I/O shown as float32.
        self._quant: dict[str, tuple[float, int, np.dtype]] = {}
        if dequantize_io:
            for n, d in [*zip(in_names, in_details), *zip(out_names, out_details)]:
                scale, zero = d["quantization"]
                if _dtype(d).kind in "iu" and scale:
                    self._quant[n] = (float(scale), int(zero), _dtype(d))
        inputs = [TensorSpec(n, tensor_shape(d), np.float32 if n in self._quant else _dtype(d))
                  for n, d in zip(in_names, in_details)]
        outputs = [TensorSpec(n, tensor_shape(d), np.float32 if n in self._quant else _dtype(d))
                   for n, d in zip(out_names, out_details)]
        # A file whose inputs all share one fixed batch size (an RNN converted with a static
        # batch) runs any batch in chunks of it (_predict_in_chunks): its specs say so with a
        # free batch dim, and ``fixed_batch`` keeps the size.
        firsts = {spec.shape[0] if spec.shape else None for spec in inputs}
        self.fixed_batch: int | None = firsts.pop() if len(firsts) == 1 and None not in firsts else None
        if self.fixed_batch is not None:
            inputs = [TensorSpec(spec.name, (None, *spec.shape[1:]), spec.dtype) for spec in inputs]
            outputs = [TensorSpec(spec.name, (None, *spec.shape[1:]) if spec.shape and spec.shape[0] == self.fixed_batch
                                  else spec.shape, spec.dtype) for spec in outputs]
        super().__init__(device=device, inputs=inputs, outputs=outputs, source=path)
        self.format_variant = f"{NAME}:{_variant(native, content)}"
        self._pool: OrderedDict[tuple, Any] = OrderedDict()
        self._pool[self._shape_key_of(native)] = native
        self._debug: tuple[tuple, Any] | None = None   # (input shapes, interpreter keeping all tensors)
        self.float_sibling: TFLiteModel | None = None  # the float32 file of the same source (checks/quantized.py)

    # -- names ----------------------------------------------------------------------
    @staticmethod
    def _signature_names(native, signature, in_details, out_details, path) -> tuple[list[str], list[str]]:
        """Name tensors by the file's signature (as TF's SavedModel does); else by tensor name."""
        try:
            sigs = native._get_full_signature_list() or {}
        except Exception:  # noqa: BLE001 - older runtimes; fall back to tensor names
            sigs = {}
        if signature is not None and signature not in sigs:
            raise ModelLoadError(path, NAME, f"no signature {signature!r}; the file has {sorted(sigs) or 'none'}",
                                 "pass one of those as signature=..., or leave it out")
        key = signature or ("serving_default" if "serving_default" in sigs else
                            (next(iter(sigs)) if len(sigs) == 1 else None))
        in_names = [_clean_tensor_name(d["name"]) for d in in_details]
        out_names = [_clean_tensor_name(d["name"]) for d in out_details]
        if key is not None:
            by_in = {int(i): n for n, i in sigs[key].get("inputs", {}).items()}
            by_out = {int(i): n for n, i in sigs[key].get("outputs", {}).items()}
            # Only trust a signature that describes the main subgraph's own tensors.
            if set(by_in) == {int(d["index"]) for d in in_details} and \
               set(by_out) == {int(d["index"]) for d in out_details}:
                in_names = [by_in[int(d["index"])] for d in in_details]
                out_names = [by_out[int(d["index"])] for d in out_details]
        return unique(in_names), unique(out_names)

    # -- prediction -------------------------------------------------------------------
    def _shape_key_of(self, interp) -> tuple:
        return tuple(tuple(int(d) for d in det["shape"]) for det in interp.get_input_details())

    def interpreter_for(self, shapes: tuple) -> Any:
        """The interpreter planned for these input shapes (created and resized once per shape)."""
        interp = self._pool.get(shapes)
        if interp is not None:
            self._pool.move_to_end(shapes)
            return interp
        interp = new_interpreter(self._content, preserve_all_tensors=self._preserve, num_threads=self._threads)
        for det, shape in zip(interp.get_input_details(), shapes):
            interp.resize_tensor_input(det["index"], list(shape), strict=False)
        interp.allocate_tensors()
        self.resize_count += 1
        self._pool[shapes] = interp
        while len(self._pool) > self._max:
            self._pool.popitem(last=False)
        return interp

    def _predict(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        fixed = self.fixed_batch
        rows = {feeds[s.name].shape[0] for s in self.inputs if feeds[s.name].ndim}
        if fixed is not None and len(rows) == 1 and rows != {fixed}:
            return self._predict_in_chunks(feeds, fixed, rows.pop())
        shapes = tuple(tuple(feeds[s.name].shape) for s in self.inputs)
        interp = self.interpreter_for(shapes)
        self._run(interp, feeds)
        return {s.name: self._read_output(interp, s.name) for s in self.outputs}

    def _predict_in_chunks(self, feeds: dict[str, np.ndarray], fixed: int, n: int) -> dict[str, np.ndarray]:
        """Run a fixed-batch file on ``n`` rows, ``fixed`` at a time; a short last chunk is padded
        by repeating its last row, and the padding's outputs are dropped."""
        parts: dict[str, list[np.ndarray]] = {s.name: [] for s in self.outputs}
        for start in range(0, n, fixed):
            chunk = {}
            for name, value in feeds.items():
                piece = value[start:start + fixed]
                if len(piece) < fixed:
                    piece = np.concatenate([piece, np.repeat(piece[-1:], fixed - len(piece), axis=0)])
                chunk[name] = piece
            out = self._predict(chunk)
            for name, value in out.items():
                parts[name].append(value[: min(fixed, n - start)])
        return {name: np.concatenate(values) for name, values in parts.items()}

    def _run(self, interp, feeds: dict[str, np.ndarray]) -> None:
        for spec in self.inputs:
            value = feeds[spec.name]
            if spec.name in self._quant:
                scale, zero, dtype = self._quant[spec.name]
                info = np.iinfo(dtype)
                value = np.clip(np.round(value / scale) + zero, info.min, info.max).astype(dtype)
            interp.set_tensor(self._in_index[spec.name], value)
        try:
            interp.invoke()
        except RuntimeError as exc:
            cause = div_zero_point_cause(str(exc))
            if cause is None:
                raise
            raise ModelLoadError(self.source, NAME, f"LiteRT could not run the file on these rows: {cause}",
                                 DIV_FIX) from exc

    def _read_output(self, interp, name: str) -> np.ndarray:
        value = np.array(interp.get_tensor(self._out_index[name]))
        if name in self._quant:
            scale, zero, _ = self._quant[name]
            value = ((value.astype(np.float32) - zero) * np.float32(scale)).astype(np.float32)
        return value

    # -- diagnosis hooks ----------------------------------------------------------------
    def _ops(self, interp=None) -> list[dict]:
        interp = interp or self.native
        return [op for op in interp._get_ops_details() if op.get("op_name") != "DELEGATE"]

    def op_types(self) -> list[tuple[str, str]]:
        """``(name of the op's first output tensor, op type)`` in execution order."""
        names = {int(d["index"]): d["name"] for d in self.native.get_tensor_details()}
        result = []
        for op in self._ops():
            outs = [int(i) for i in op["outputs"] if int(i) >= 0]
            label = names.get(outs[0], f"op_{op['index']}") if outs else f"op_{op['index']}"
            result.append((label, op["op_name"]))
        return result

    def intermediates(self, batch: Any) -> list[tuple[str, str, np.ndarray]]:
        """Every op's outputs for ``batch``, in execution order.

        Runs on a separate interpreter with all tensors preserved and no XNNPACK delegate
        (a delegate fuses ops and never writes their intermediates), so the final values can
        differ from ``predict`` by float noise (measured: 6e-8 on the tiny CNN).
        """
        interp = self.preserved_run(batch)
        names = {int(d["index"]): d["name"] for d in interp.get_tensor_details()}
        result = []
        for op in self._ops(interp):
            for idx in (int(i) for i in op["outputs"]):
                if idx >= 0:
                    result.append((names.get(idx, f"tensor_{idx}"), op["op_name"], np.array(interp.get_tensor(idx))))
        return result

    def preserved_run(self, batch: Any) -> Any:
        """Run ``batch`` on an interpreter that keeps every tensor (no XNNPACK delegate, which
        fuses ops and never writes their intermediates) and return that interpreter, for
        reading intermediates and their quantisation parameters (``quant.py``)."""
        feeds = self.prepare_batch(batch)
        shapes = tuple(tuple(feeds[s.name].shape) for s in self.inputs)
        if self._debug is None or self._debug[0] != shapes:
            interp = new_interpreter(self._content, preserve_all_tensors=True, num_threads=self._threads,
                                      no_delegates=True)
            for det, shape in zip(interp.get_input_details(), shapes):
                interp.resize_tensor_input(det["index"], list(shape), strict=False)
            interp.allocate_tensors()
            self._debug = (shapes, interp)
        interp = self._debug[1]
        self._run(interp, feeds)
        return interp

    @property
    def content(self) -> bytes:
        """The file's bytes (a float16 twin is built from a float32 file's, ``quant.py``)."""
        return self._content

    def input_tensor_index(self, name: str) -> int:
        """The tensor index of input ``name`` in the file."""
        return self._in_index[name]

    def weights(self) -> dict[str, np.ndarray]:
        """Constant tensors (weights, biases, quantisation-free or not) by tensor name."""
        interp = self.native
        produced = {int(i) for op in interp._get_ops_details() for i in op["outputs"]}
        fed = {int(d["index"]) for d in interp.get_input_details()}
        result: dict[str, np.ndarray] = {}
        for det in interp.get_tensor_details():
            idx = int(det["index"])
            if idx in produced or idx in fed or np.dtype(det["dtype"]).kind not in "fiu":
                continue
            try:
                value = np.array(interp.get_tensor(idx))
            except ValueError:  # tensors without data (scratch buffers)
                continue
            is_float = np.dtype(det["dtype"]).kind == "f"
            # Per-channel quantisation leaves ``quantization`` at (0, 0): look at the scales.
            is_quantized = len(det.get("quantization_parameters", {}).get("scales", ())) > 0
            if value.size > 1 and (is_float or is_quantized):
                result[det["name"]] = value
        return result

    def close(self) -> None:
        self._pool.clear()
        self._debug = None


def _interpreter_error(path: Path | None, content: bytes, exc: BaseException) -> ModelLoadError:
    """Say why LiteRT refused a file that looked like TFLite: missing ops, or a broken file."""
    text = str(exc)
    if "Select TensorFlow op" in text or "Flex" in text or "custom op" in text.lower():
        ops = sorted(set(re.findall(r"\((Flex\w+)\)", text))) or ["custom or Flex ops"]
        return ModelLoadError(
            path, NAME, f"the model uses ops this LiteRT interpreter does not have: {', '.join(ops)}",
            "convert with TFLITE_BUILTINS only (no SELECT_TF_OPS / custom ops), or compare this model "
            "through saved_model; the Python LiteRT wheel has no Flex delegate")
    return ModelLoadError(
        path, NAME, f"LiteRT cannot read the model: {first_line(exc)} (file size {len(content)} bytes)",
        "the file is corrupt or truncated: re-export it (export_model(model, 'tflite', path)) or copy it again")


def _variant(interp, content: bytes | None = None) -> str:
    """Read the quantisation scheme from the file: int8 activations, int8 or float16 weights.
    Weights are read from every subgraph (``_constant_kinds``): a recurrent net keeps its
    int8 weights inside its While-loop bodies, and a ConvLSTM dynamic-range file read from the
    main subgraph alone was labelled float32 and judged by the float rule (issue 47)."""
    produced = {int(i) for op in interp._get_ops_details() for i in op["outputs"]}
    kinds_const = {np.dtype(det["dtype"]).name for det in interp.get_tensor_details()
                   if int(det["index"]) not in produced}
    if content is not None and interp.num_subgraphs() > 1:
        kinds_const |= _constant_kinds(content)
    quantized = {"int8", "uint8", "int16", "int4"}
    # int8 means quantised activations: integer inputs, or a QUANTIZE op turning a float
    # tensor into an integer one. Dynamic-range files also produce integer tensors (a GATHER
    # over int8 embedding weights in a GPT decoder), which must not make them "int8".
    dtypes = {int(d["index"]): np.dtype(d["dtype"]).name for d in interp.get_tensor_details()}
    inputs_quantized = any(np.dtype(d["dtype"]).name in quantized and d["quantization"][0]
                           for d in interp.get_input_details())
    quantize_ops = any(op["op_name"] == "QUANTIZE" and any(dtypes.get(int(i)) == "float32" for i in op["inputs"])
                       and any(dtypes.get(int(o)) in quantized for o in op["outputs"])
                       for op in interp._get_ops_details())
    if inputs_quantized or quantize_ops:
        return "int8"
    if kinds_const & quantized:
        return "dynamic_range"
    if "float16" in kinds_const:
        return "float16"
    return "float32"


def _constant_kinds(content: bytes) -> set[str]:
    """The dtypes (``int8``, ``float16``...) of the constant tensors of every subgraph of the
    file (While/If bodies, call_once's initialiser): tensors no op of their subgraph produces
    that hold data, read from the flatbuffer without copying it."""
    from ai_edge_litert import schema_py_generated as schema

    names = {v: k.lower() for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
    model = schema.Model.GetRootAs(content, 0)
    kinds: set[str] = set()
    for g in range(model.SubgraphsLength()):
        graph = model.Subgraphs(g)
        produced: set[int] = set()
        for o in range(graph.OperatorsLength()):
            op = graph.Operators(o)
            produced.update(op.Outputs(j) for j in range(op.OutputsLength()))
        for t in range(graph.TensorsLength()):
            tensor = graph.Tensors(t)
            if t in produced or tensor.Buffer() >= model.BuffersLength():
                continue
            buffer = model.Buffers(tensor.Buffer())
            if buffer is not None and (buffer.DataLength() or buffer.Offset() > 1):
                kinds.add(names.get(tensor.Type(), ""))
    return kinds


# -- export ----------------------------------------------------------------------------
