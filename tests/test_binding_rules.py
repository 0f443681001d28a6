"""formats/binding.py on specs and arrays alone (no TensorFlow): each rule, its order, and the refusal
when nothing settles a pairing (issue 25: never bare position where two tensors could swap)."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_modelparity.formats.base import TensorSpec, by_converter_names, converter_base
from pytest_modelparity.formats.binding import CLOSE_OUTPUTS, BindingError, bind, merged_record, placeholder_index
from pytest_modelparity.reports.summary import values_line


def S(name: str, *shape: int | None, dtype: str = "float32") -> TensorSpec:
    return TensorSpec(name, (None, *shape), dtype)


def test_converter_names_reduce_to_the_name_they_came_from() -> None:
    assert converter_base("serving_default_input_2:0") == "input_2"
    assert converter_base("ids:0") == "ids" and converter_base("ids") == "ids"
    assert [placeholder_index(n) for n in ("StatefulPartitionedCall:2", "Identity", "Identity_3", "output_1",
                                           "Identity_1:0", "logits", "Identity_1:2")] == [2, 0, 3, 1, 1, None, None]


def test_same_name_comes_first_whatever_the_order() -> None:
    b = bind("outputs", [S("a", 3), S("b", 3)], [S("b", 3), S("a", 3)])
    assert [(p.reference, p.other, p.basis) for p in b.pairs] == [("a", "a", "same name"), ("b", "b", "same name")]


def test_tf2onnx_placeholders_are_read_in_sorted_name_order() -> None:
    """The report's SavedModel: contour, note (N,172,88) and onset (N,172,264); its ONNX file names
    them StatefulPartitionedCall:0..2, the k-th output in sorted-name order."""
    ref = [S("contour", 172, 88), S("note", 172, 88), S("onset", 172, 264)]   # a SavedModel's: sorted
    onnx = [S("StatefulPartitionedCall:1", 172, 88), S("StatefulPartitionedCall:0", 172, 88),
            S("StatefulPartitionedCall:2", 172, 264)]
    b = bind("outputs", ref, onnx)
    assert b.to_other() == {"contour": "StatefulPartitionedCall:0", "note": "StatefulPartitionedCall:1",
                            "onset": "StatefulPartitionedCall:2"}
    assert {p.basis for p in b.pairs} == {"converter name"} and "sorted-name order" in b.pairs[1].how


def test_the_index_rule_is_not_used_where_the_references_order_is_not_sorted() -> None:
    """A list-returning function numbers its outputs in list order: a Keras model with outputs
    [onset, contour, note] gives Identity_k in that order, not in sorted-name order."""
    ref = [S("onset", 172, 264), S("contour", 172, 88), S("note", 172, 88)]
    oth = [S("Identity", 172, 264), S("Identity_1", 172, 88), S("Identity_2", 172, 88)]
    with pytest.raises(BindingError, match="no rule pairs 'contour', 'note'"):
        bind("outputs", ref, oth)          # onset by its unique shape; the two (172, 88) stay open


def test_an_index_rule_that_contradicts_the_shapes_is_not_used() -> None:
    ref = [S("a", 5), S("b", 7)]
    oth = [S("Identity", 7), S("Identity_1", 5)]   # index order says a~Identity, but a is (5,)
    b = bind("outputs", ref, oth)
    assert b.to_other() == {"a": "Identity_1", "b": "Identity"} and {p.basis for p in b.pairs} == {"shape and dtype"}
    assert any("not used" in n for n in b.notes)


def test_input_names_a_converter_wrote_pair_with_the_reference_names() -> None:
    b = bind("inputs", [S("ids", 8, dtype="int32"), S("mask", 8, dtype="int32")],
             [S("mask:0", 8, dtype="int32"), S("ids:0", 8, dtype="int32")])
    assert b.to_other() == {"ids": "ids:0", "mask": "mask:0"} and {p.basis for p in b.pairs} == {"converter name"}
    assert by_converter_names({"input_2": 1}, ["serving_default_input_2:0"]) == {"serving_default_input_2:0": 1}
    assert by_converter_names({"other": 1}, ["serving_default_input_2:0"]) == {"other": 1}


def test_the_export_record_then_a_unique_shape_settle_what_names_do_not() -> None:
    ref = [S("probs", 10), S("boxes", 4), S("mask", 10)]
    oth = [S("Identity", 10), S("Identity_7", 4), S("Identity_9", 10)]   # indexes that say nothing
    b = bind("outputs", ref, oth, recorded={"probs": "Identity_9", "mask": "Identity"})
    assert b.to_other() == {"probs": "Identity_9", "boxes": "Identity_7", "mask": "Identity"}
    assert [p.basis for p in b.pairs] == ["export record", "shape and dtype", "export record"]


def test_values_pair_outputs_only_when_one_pairing_is_clearly_best() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 6)), rng.normal(size=(4, 6))
    ref, oth = [S("x", 6), S("y", 6)], [S("output_3", 6), S("output_5", 6)]
    b = bind("outputs", ref, oth, values=({"x": x, "y": y}, {"output_3": y + 1e-7, "output_5": x}))
    assert b.to_other() == {"x": "output_5", "y": "output_3"} and {p.basis for p in b.pairs} == {"values"}
    with pytest.raises(BindingError) as err:                # two look-alikes: nothing is clearly best
        bind("outputs", ref, oth, values=({"x": x, "y": x + 1e-9}, {"output_3": x, "output_5": x}))
    text = str(err.value)
    assert "cannot tell which output is which" in text and "'output_3'" in text and "'x'" in text
    assert "'output_3' and 'output_5' are 0 of scale apart on the batch" in text   # identical: refused outright
    assert "bind={'outputs'" in text and "(None, 6) float32" in text
    with pytest.raises(BindingError, match="values on the batch do not single out one pairing"):
        mid = (x + y) / 2                                   # as near to x as to y; output_5 far from both
        bind("outputs", ref, oth, values=({"x": x, "y": y}, {"output_3": mid, "output_5": 3 * mid}))


def test_two_outputs_of_one_shape_with_lost_names_are_refused_never_paired_by_position() -> None:
    with pytest.raises(BindingError) as err:
        bind("outputs", [S("left", 3), S("right", 3)], [S("Identity_4", 3), S("Identity_6", 3)])
    text = str(err.value)
    assert "no rule pairs 'left', 'right' with 'Identity_4', 'Identity_6'" in text
    assert "reference outputs: left: (None, 3) float32; right: (None, 3) float32" in text
    assert "fix: name the pairing" in text and "modelparity_bind" in text


def test_bind_names_a_pairing_and_wrong_names_in_it_are_said() -> None:
    b = bind("outputs", [S("left", 3), S("right", 3)], [S("t0", 3), S("t1", 3)],
             explicit={"left": "t1", "right": "t0"})
    assert b.to_other() == {"left": "t1", "right": "t0"} and {p.basis for p in b.pairs} == {"bind="}
    with pytest.raises(BindingError, match="bind= names 't9', which is no output of the other"):
        bind("outputs", [S("left", 3)], [S("t0", 3)], explicit={"left": "t9"})


def test_different_counts_are_refused() -> None:
    with pytest.raises(BindingError, match="the reference has 2 outputs and the other 1"):
        bind("outputs", [S("a", 3), S("b", 3)], [S("a", 3)])


def test_real_names_that_differ_are_never_paired_by_shape() -> None:
    with pytest.raises(BindingError, match="two real names that differ are never paired"):
        bind("outputs", [S("a", 3), S("b", 3)], [S("a", 3), S("c", 3)])
    one = bind("inputs", [S("keras_tensor", 8)], [S("input_layer", 8)])    # Keras' own made-up names
    assert one.to_other() == {"keras_tensor": "input_layer"} and one.pairs[0].basis == "shape and dtype"


def test_two_outputs_close_on_the_batch_are_never_paired_by_values() -> None:
    """Issue 36: two heads 2% apart (log_var = mean*1.02 + small). Values would single out a pairing
    (each copy is 0 from its twin, 2% from the other), yet a file labelling them the wrong way
    round would pass that way: refused, naming both outputs, how close they are and the fix."""
    mean = np.random.default_rng(1).normal(size=(4, 6))
    log_var = mean * 1.02 + 1e-3
    ref, oth = [S("mean", 6), S("log_var", 6)], [S("Identity", 6), S("Identity_1", 6)]
    with pytest.raises(BindingError) as err:
        bind("outputs", ref, oth, values=({"mean": mean, "log_var": log_var}, {"Identity": log_var, "Identity_1": mean}),
             other_label="tfjs form")
    text = str(err.value)
    assert "tfjs form outputs 'Identity' and 'Identity_1' are 0.02 of scale apart on the batch (under 0.1)" in text
    assert "labels them the wrong way round" in text
    assert "bind={'outputs': {'mean': '<tfjs form name>', 'log_var': '<tfjs form name>'}}" in text
    assert "modelparity_bind" in text
    far = mean * (1 + 2 * CLOSE_OUTPUTS)                   # heads further apart than CLOSE_OUTPUTS: values pair them
    b = bind("outputs", ref, oth, values=({"mean": mean, "log_var": far}, {"Identity": far, "Identity_1": mean}))
    assert b.to_other() == {"mean": "Identity_1", "log_var": "Identity"} and {p.basis for p in b.pairs} == {"values"}


def test_an_export_record_outranks_the_index_rule_and_the_files_own_record_the_caches() -> None:
    """The index rule reads Identity_k as the k-th name in sorted order, a convention; a record
    written when the export was made is knowledge, so it is read first."""
    ref, oth = [S("log_var", 6), S("mean", 6)], [S("Identity", 6), S("Identity_1", 6)]   # sorted: the index rule applies
    assert bind("outputs", ref, oth).to_other() == {"log_var": "Identity", "mean": "Identity_1"}
    b = bind("outputs", ref, oth, recorded={"log_var": "Identity_1", "mean": "Identity"},
             recorded_how={"log_var": "in the file", "mean": "in the file"})
    assert b.to_other() == {"log_var": "Identity_1", "mean": "Identity"}
    assert [(p.basis, p.how) for p in b.pairs] == [("export record", "in the file")] * 2

    class FileWithRecord:
        export_record = {"outputs": {"mean": "Identity_1"}}
        export_record_how = "model.json"

    record, how = merged_record(FileWithRecord(), {"outputs": {"mean": "Identity", "log_var": "Identity"}})  # type: ignore[arg-type]
    assert record["outputs"] == {"mean": "Identity_1", "log_var": "Identity"}
    assert how["outputs"] == {"mean": "model.json", "log_var": "kept with the cached export"}


def test_the_end_of_run_line_names_each_model_and_format_paired_by_values() -> None:
    row = {"nodeid": "t.py::test[tfjs-cpu]", "format": "tfjs", "format_variant": "tfjs:wasm"}
    rows = [{**row, "output": "['a']", "paired_with": {"name": "Identity_1:0", "basis": "values", "model": "m/model.json"}},
            {**row, "output": "['b']", "paired_with": {"name": "Identity:0", "basis": "values", "model": "m/model.json"}},
            {**row, "format": "onnx", "format_variant": None, "output": "['a']",
             "paired_with": {"name": "a", "basis": "same name", "model": "m.onnx"}}]
    line = values_line(rows)
    assert line is not None and "tfjs:wasm of 'm/model.json': ['a']~'Identity_1:0', ['b']~'Identity:0'" in line
    assert "onnx" not in line and "bind=" in line and "modelparity_bind" in line
    assert values_line(rows[2:]) is None


def test_a_tfjs_model_json_says_which_output_is_which_by_its_record_or_its_structured_keys() -> None:
    """formats/tfjs/load.output_record: the plugin's own record first, then tensorflowjs'
    structuredOutputKeys (k-th key, k-th output as the runner lists them); a record naming an
    output the file does not have, or two keys on one output, is not used."""
    from pytest_modelparity.formats.tfjs.load import RECORD_KEY, output_record

    names = ["Identity_1:0", "Identity:0"]
    own = {"userDefinedMetadata": {RECORD_KEY: {"outputs": {"mean": "Identity_1:0", "log_var": "Identity:0"}},
                                   "structuredOutputKeys": ["log_var", "mean"]}}
    assert output_record(own, names) == ({"mean": "Identity_1:0", "log_var": "Identity:0"},
                                         "model.json's userDefinedMetadata.modelparity, written at export")
    keys = {"userDefinedMetadata": {"structuredOutputKeys": ["log_var", "mean"]}}
    assert output_record(keys, names)[0] == {"log_var": "Identity_1:0", "mean": "Identity:0"}
    stale = {"userDefinedMetadata": {RECORD_KEY: {"outputs": {"mean": "Identity_7:0", "log_var": "Identity:0"}}}}
    twice = {"userDefinedMetadata": {RECORD_KEY: {"outputs": {"mean": "Identity:0", "log_var": "Identity:0"}}}}
    assert output_record(stale, names) == output_record(twice, names) == output_record({}, names) == ({}, "")
