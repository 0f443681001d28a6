"""How a check's two sides meet: a loaded form bound to the reference's tensor names, and the
outputs of two models paired by what they are (formats/binding.py), never by bare position."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

__all__ = ["align_structures", "bound_to_expected", "is_loaded_model", "named_outputs", "paired"]


def is_loaded_model(model: Any) -> bool:
    try:
        from ..formats.base import LoadedModel
    except ImportError:  # pragma: no cover
        return False
    return isinstance(model, LoadedModel)


def bound_to_expected(actual_model: Any, expected_model: Any, inputs: Any, bind: Any) -> Any:
    """``actual_model`` speaking ``expected_model``'s tensor names when both are loaded forms
    (``formats/binding.py``); a candidate the plugin's session bound to a reference with these
    names already stays as it is."""
    if is_loaded_model(actual_model) and _positional_to_keras(expected_model, inputs):
        # A list is in expected's input order; a converted form may list its inputs in another
        # (a tfjs model.json's order changed from one export to the next): fed as they are, two
        # same-shape inputs were swapped and a correct form FAILED. Bind to a view of the model.
        from ..formats import load_model
        from ..formats.binding import bind_model

        return bind_model(actual_model, load_model(expected_model), explicit=bind, probe=inputs)
    if not (is_loaded_model(actual_model) and is_loaded_model(expected_model)):
        return actual_model
    if not bind and getattr(actual_model, "input_binding", None) is not None and \
            [s.name for s in actual_model.inputs] == [s.name for s in expected_model.inputs] and \
            [s.name for s in actual_model.outputs] == [s.name for s in expected_model.outputs]:
        return actual_model
    from ..formats.binding import bind_model

    return bind_model(actual_model, expected_model, explicit=bind, probe=inputs)


def _positional_to_keras(model: Any, inputs: Any) -> bool:
    """``inputs`` a list for a raw Keras model of several inputs (the case a loaded form's own
    input order can silently swap)."""
    if is_loaded_model(model) or not isinstance(inputs, (list, tuple)) or len(inputs) < 2:
        return False
    try:
        return len(getattr(model, "inputs", None) or ()) == len(inputs)
    except Exception:  # noqa: BLE001 - an unbuilt subclassed model has no inputs yet
        return False


def recorded_inputs(actual_model: Any, expected_model: Any, inputs: Any) -> Any:
    """A recording's ``inputs_batch`` (keyed by the recorded form's own input names) keyed by the
    reference's names through the binding, so ``inputs=recorded.inputs_batch`` feeds both sides;
    one input to a model that is not a loaded form: the array itself."""
    if not getattr(actual_model, "replays_recording", False) or not isinstance(inputs, dict):
        return inputs
    inner = getattr(actual_model, "inner", actual_model)
    own = [s.name for s in inner.inputs]
    if set(inputs) != set(own):
        return inputs
    to_other = getattr(actual_model, "input_binding", None)
    if to_other is not None:
        return {p.reference: inputs[p.other] for p in to_other.pairs if p.other in inputs}
    if not is_loaded_model(expected_model) and len(own) == 1:
        return inputs[own[0]]
    return inputs


def named_outputs(model: Any, outputs: Any) -> Any:
    """A raw Keras model's list of outputs as ``{output name: array}`` (the names every loaded
    form of it uses), so it can meet a loaded form's dict by name, never by position."""
    if not isinstance(outputs, (list, tuple)) or model is None or is_loaded_model(model):
        return outputs
    from ..formats import is_keras_model

    if not is_keras_model(model):
        return outputs
    from ..formats.tensorflow.keras_specs import keras_output_names

    names = keras_output_names(model)
    return dict(zip(names, outputs)) if len(names) == len(outputs) else outputs


def align_structures(act: Any, exp: Any, *, from_models: bool, models: tuple[Any, Any] = (None, None),
                      bind: Any = None) -> tuple[Any, Any, str | None, list[dict[str, str]] | None]:
    """Let a ``LoadedModel``'s ``{name: array}`` meet another model's outputs.

    Only when a model produced at least one side (arrays the caller passed are compared as
    given: ``{"y": a}`` against ``[a]`` is a structure mismatch). Two dicts with other names, or
    a list against a dict, are paired by ``formats/binding.py``'s rules (a raw Keras model's
    list is named by its output names first); what they cannot settle raises ``BindingError``.
    Returns (actual, expected, what was paired and why, the pairs for the JSON report).
    """
    if not from_models:
        return act, exp, None, None
    if isinstance(act, Mapping) != isinstance(exp, Mapping):
        act, exp = named_outputs(models[0], act), named_outputs(models[1], exp)
    if isinstance(act, Mapping) and isinstance(exp, Mapping) and act and exp and set(act) != set(exp):
        return paired(act, exp, bind)
    for flip in (False, True):
        d, other = (exp, act) if flip else (act, exp)
        if not isinstance(d, Mapping) or isinstance(other, Mapping):
            continue
        if isinstance(other, np.ndarray) and len(d) == 1:
            only = next(iter(d.values()))
            note = f"single output {next(iter(d))!r} compared with a bare array"
            return (other, only, note, None) if flip else (only, other, note, None)
        if isinstance(other, (list, tuple)) and len(other) == len(d) and all(isinstance(x, np.ndarray) for x in other):
            listed = {f"[{i}]": x for i, x in enumerate(other)}
            if flip:
                return paired(listed, d, bind)
            _, _, why, pairs = paired(d, listed, bind)  # expected is the list: key it by actual's names
            by_name = {p["other"]: listed[p["reference"]] for p in pairs or []}
            return d, {k: by_name[k] for k in d}, why, pairs
    return act, exp, None, None


def paired(act: Mapping, exp: Mapping, bind: Any) -> tuple[dict, Mapping, str | None, list[dict[str, str]]]:
    """``act`` re-keyed by ``exp``'s names through the binding rules (values on this batch last)."""
    from ..formats.binding import bind as bind_tensors
    from ..formats.binding import specs_of_arrays

    binding = bind_tensors("outputs", specs_of_arrays(exp), specs_of_arrays(act),
                           explicit=(bind or {}).get("outputs"), values=(exp, act),
                           reference_label="expected", other_label="actual")
    renamed = {p.reference: act[p.other] for p in binding.pairs}
    return renamed, exp, binding.describe(), [p.to_dict() for p in binding.pairs]
