"""What the tfjs runner's errors mean, and which node they came from.

``classify_runner_error`` words a runner error (op, backend, fix); ``run_error`` is the typed
error of a model tfjs loads but cannot run. tfjs's graph executor reports some failures as a
bare JavaScript error (``TypeError: Cannot read properties of undefined (reading 'backend')``:
a tensor it had already disposed was read) that names no node: ``failing_node`` finds it by
running the model again up to single nodes (``fetch``: ``model.execute(inputs, [node])``):
from a failing output, up through the first input that fails too, to the node that fails
while every input it reads is computed. No TensorFlow here; the Node process is the caller's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Mapping

from ...errors import ModelLoadError

NAME = "tfjs"


def runner_message(text: str) -> str:
    """The runner's own words, without the "tfjs model '...' (cpu backend): predict failed: " prefix."""
    text = str(text).strip()
    for marker in ("predict failed: ", "intermediates failed: ", " backend: "):
        if marker in text:
            text = text.split(marker, 1)[1]
    return text.splitlines()[0] if text else "?"


# What the tfjs runner's errors mean, and what to do: (pattern, problem, fix).
_CONTROL_FLOW_FIX = ("re-export with export_model(model, 'tfjs', dir), which keeps While loops as TF2 "
                     "control-flow ops tfjs runs with executeAsync (converter option control_flow_v2=True; "
                     "tensorflowjs_converter --control_flow_v2=true), or give the sequence a fixed length "
                     "and unroll the RNN (unroll=True)")


def classify_runner_error(message: str, backend: str) -> tuple[str, str]:
    """``(problem, fix)`` for a tfjs runner error: names the op and the backend where it can."""
    msg = runner_message(message)
    activation = re.search(r"[Aa]ctivation (_?\w+) has not been implemented|(_?\w+) activation not yet supported",
                           msg)
    if activation:
        op = activation.group(1) or activation.group(2)
        problem = (f"tfjs's {backend} backend lacks the fused activation {op!r} in a fused conv/matmul op "
                   f"({msg})")
        if "swish" in op.lower() or op.lower() == "tanh":  # the fused activations the plugin's export splits
            why = ("" if "swish" in op.lower() else
                   "; Grappler's oneDNN remapper fused Dense/Conv + tanh into the op before the converter saw the "
                   "graph (TensorFlow's default on CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX)")
            return (problem + why,
                    f"export the Keras model with export_model(model, 'tfjs', dir): it splits a fused "
                    f"{'hard-swish' if 'swish' in op.lower() else 'tanh'} into ops tfjs has (formats/tfjs/rewrite.py); "
                    "for a model.json converted elsewhere, convert it again that way, or with "
                    "TF_ENABLE_ONEDNN_OPTS=0 set before TensorFlow is imported, which stops the fusion (a separate "
                    "Activation layer does not help: the fusion is made on the graph)")
        return (problem, "try the other backend (backend='cpu' or 'wasm'); for a model.json converted elsewhere, "
                         "convert it with TF_ENABLE_ONEDNN_OPTS=0 set before TensorFlow is imported, which keeps "
                         "activations their own ops")
    kernel = re.search(r"[Kk]ernel '(\w+)' not registered for backend '(\w+)'", msg)
    if kernel:
        return (f"tfjs's {kernel.group(2)} backend has no kernel for op {kernel.group(1)!r} ({msg})",
                "load with backend='cpu' (the pure-JS backend has the most kernels), or replace the layer "
                "using that op")
    unsupported = re.search(r"(\w+) (?:is not|not) (?:yet )?(?:supported|implemented)|"
                            r"(\w+) only supports (.*)", msg)
    if unsupported:
        op = unsupported.group(1) or unsupported.group(2)
        return (f"tfjs's {backend} backend cannot run op {op!r} here ({msg})",
                "load with the other backend (backend='cpu' or 'wasm'; the default 'auto' tries wasm, then "
                "cpu), or replace the layer using that op")
    if "Cannot compute the outputs" in msg:
        return (f"tfjs's graph executor cannot run this graph's lowered control flow (Enter/Merge/Switch "
                f"loops, e.g. from Keras LSTM/GRU layers or tf.while_loop) on the {backend} backend ({msg})",
                _CONTROL_FLOW_FIX)
    return (f"tfjs's {backend} backend failed to run the model ({msg})",
            "try the other backend (backend='cpu' or 'wasm'), and check the model's ops against "
            "tfjs-converter/docs/supported_ops.md")


def run_error(path: Path, backend: str, message: str, *, wasm_error: str | None = None,
              action: str = "run") -> ModelLoadError:
    """The typed error for a model tfjs loads but cannot run: op, backend and workaround named."""
    problem, fix = classify_runner_error(message, backend)
    if wasm_error is not None:
        problem += f"; the wasm backend failed first ({runner_message(wasm_error)})"
    return ModelLoadError(path, NAME, problem, fix, action=action)


# Nodes that hold no computation of their own: never the culprit, never fetched.
_SOURCES = frozenset({"Const", "Placeholder"})
# Ops of a Keras RNN's loop (control flow v2): a failure there is the loop's.
LOOP_OPS = frozenset({"While", "StatelessWhile", "TensorListStack", "TensorListFromTensor", "TensorListReserve",
                      "TensorListGetItem", "TensorListSetItem"})
# A JavaScript error the runner passed on as it was (no op or kernel named in it).
_RAW_JS = re.compile(r"\b(TypeError|ReferenceError|RangeError)\b|Cannot read propert")


class NotComputed(Exception):
    """What ``fetch`` raises for a node tfjs cannot compute (any other exception stops the search)."""


def is_raw_js_error(message: str) -> bool:
    """Whether a runner error is a bare JavaScript error that names no node."""
    return bool(_RAW_JS.search(message))


def _node_of(ref: str) -> str:
    return ref.lstrip("^").split(":", 1)[0]


def failing_node(spec: Mapping[str, Any], fetch: Callable[[list[str]], Any], *,
                 max_fetches: int = 64) -> tuple[str, str] | None:
    """``(node name, op)`` of the node tfjs cannot compute although it computes every input the
    node reads, or None (no failing output, or ``max_fetches`` runs spent first).

    ``fetch(names)`` runs the model up to ``names`` and raises ``NotComputed`` where tfjs fails
    (anything else it raises, a dead process, propagates).
    """
    topology = spec.get("modelTopology") or {}
    nodes = {n["name"]: n for n in topology.get("node", []) if isinstance(n, dict) and "name" in n}
    outputs = [_node_of(e.get("name", "")) for e in ((spec.get("signature") or {}).get("outputs") or {}).values()
               if isinstance(e, dict)]
    spent = 0
    known: dict[str, bool] = {}

    def computes(ref: str) -> bool:
        nonlocal spent
        if ref not in known:
            spent += 1
            try:
                fetch([ref])
                known[ref] = True
            except NotComputed:
                known[ref] = False
        return known[ref]

    current = next((o for o in outputs if o in nodes and not computes(o)), None)
    while current is not None and spent < max_fetches:
        reads = [r.lstrip("^") for r in nodes[current].get("input", []) if not r.startswith("^")]
        reads = [r for r in reads if _node_of(r) in nodes and nodes[_node_of(r)].get("op") not in _SOURCES]
        failed = next((r for r in reads if not computes(r)), None)
        if failed is None:
            return current, str(nodes[current].get("op", "?"))
        current = _node_of(failed)
    return None


def layer_of(node: str) -> str | None:
    """The Keras layer a node of an exported model belongs to (``decoder`` for
    ``StatefulPartitionedCall/functional_1/decoder_1/TensorArrayV2Stack/TensorListStack``)."""
    parts = node.split("/")
    while parts and parts[0].startswith("StatefulPartitionedCall"):
        parts = parts[1:]
    if len(parts) >= 3:  # <model>/<layer>/<op...>: the first scope is the model's own name
        parts = parts[1:]
    if len(parts) < 2:
        return None
    return re.sub(r"_\d+$", "", parts[0])


def located_problem(node: str, op: str, message: str, backend: str) -> tuple[str, str]:
    """``(problem, fix)`` for a bare JavaScript error located at ``node`` (``op``)."""
    layer = layer_of(node)
    where = f"node {node!r} ({op}" + (f", in layer {layer!r})" if layer else ")")
    if op in LOOP_OPS or "/while" in node or "TensorArray" in node:
        named = f" {layer!r}" if layer else ""
        if op == "TensorListStack":
            return (f"tfjs's {backend} backend failed at {where}: it read a tensor tfjs had already disposed "
                    f"({message}), the per-step outputs of a recurrent layer with return_sequences=True, which this "
                    "node stacks: the loop body returns each step's output through an Identity that runs before the "
                    "step is written to the list, so tfjs disposes the value the list holds",
                    "convert the model with pytest_modelparity.export_model(model, 'tfjs', dir), which orders that "
                    "Identity after the write (its model.json runs in tfjs anywhere)")
        return (f"tfjs's {backend} backend failed at {where}: it read a tensor tfjs had already disposed ({message}), "
                "a value of a recurrent layer's loop; tfjs's While-loop executor cannot run this loop",
                f"give the sequences a fixed length and build the recurrent layer{named} (and the ones feeding its "
                "state) with unroll=True: the loop is then unrolled into plain ops; or compare this model through "
                "saved_model")
    return (f"tfjs's {backend} backend failed at {where} ({message})",
            f"replace the layer computing {op} (tfjs-converter/docs/supported_ops.md lists the ops tfjs runs), or "
            "compare this model through saved_model")
