"""Einsum on tfjs: tfjs 4.22's cpu backend computes it element by element (a MobileViT-like net
at 128 px spent 21.5 of 22.5 s of a predict in 24 Einsum kernels) and its wasm backend has none,
so ``export_model`` writes each two-operand Einsum as transposes, reshapes and one matmul
(``formats/tfjs/rewrite.rewrite_einsum``). The plan is checked against numpy's einsum over many
equations (a property), and attention nets against Keras on both tfjs backends through Node."""

from __future__ import annotations

import importlib.util
import json
import string

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_modelparity.formats.tfjs.rewrite import _einsum_plan


def _run_plan(plan: dict, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What the rewritten graph computes, in numpy (the batch size is the one unknown)."""
    lhs = a.transpose(plan["a_perm"]).reshape(plan["a_shape"])
    rhs = b.transpose(plan["b_perm"]).reshape(plan["b_shape"])
    return np.matmul(lhs, rhs).reshape(plan["out_shape"]).transpose(plan["out_perm"])


# Keras' own: EinsumDense and MultiHeadAttention on 3-D and on 4-D (MobileViT's patches) tensors
KERAS_EQUATIONS = ["abc,cde->abde", "abcd,def->abcef", "abcde,abfde->abdfc", "abcde,abecf->abdcf",
                   "abcd,cde->abe", "aecd,abcd->acbe", "acbe,aecd->abcd", "abc,cd->abd"]


@pytest.mark.parametrize("equation", KERAS_EQUATIONS)
def test_the_plan_computes_what_einsum_computes_for_keras_equations(equation: str) -> None:
    rng = np.random.default_rng(0)
    ins, out = equation.split("->")
    sizes = {c: int(rng.integers(1, 5)) for c in set(ins) - {","}}
    a_labels, b_labels = ins.split(",")
    a = rng.normal(size=[sizes[c] for c in a_labels])
    b = rng.normal(size=[sizes[c] for c in b_labels])
    a_shape = [None if c == "a" else sizes[c] for c in a_labels]  # the batch size unknown, as in the graph
    b_shape = [None if c == "a" else sizes[c] for c in b_labels]
    plan = _einsum_plan(equation, a_shape, b_shape)
    assert plan is not None
    np.testing.assert_allclose(_run_plan(plan, a, b), np.einsum(equation, a, b), rtol=1e-12, atol=1e-12)


@st.composite
def _equations(draw):
    labels = draw(st.lists(st.sampled_from(string.ascii_lowercase[:8]), min_size=1, max_size=6, unique=True))
    a = draw(st.lists(st.sampled_from(labels), min_size=1, max_size=4, unique=True))
    b = draw(st.lists(st.sampled_from(labels), min_size=1, max_size=4, unique=True))
    both = set(a) & set(b)
    contracted = draw(st.sets(st.sampled_from(sorted(both)))) if both else set()
    out = [c for c in dict.fromkeys(a + b) if c not in contracted]
    out = draw(st.permutations(out))
    sizes = {c: draw(st.integers(1, 4)) for c in set(a) | set(b)}
    unknown = draw(st.sampled_from([None, *[c for c in dict.fromkeys(a + b) if c not in contracted]]))
    return f"{''.join(a)},{''.join(b)}->{''.join(out)}", a, b, sizes, unknown


@settings(max_examples=200, deadline=None)
@given(_equations())
def test_any_two_operand_equation_is_planned_right_or_left_as_it_was(drawn) -> None:
    """For equations with any batch, free and contracted indices in any order, and one unknown
    size anywhere but a contracted index: the plan computes np.einsum's answer, or there is none
    (only where two reshapes would each need the unknown size)."""
    equation, a_labels, b_labels, sizes, unknown = drawn
    rng = np.random.default_rng(1)
    a = rng.normal(size=[sizes[c] for c in a_labels])
    b = rng.normal(size=[sizes[c] for c in b_labels])
    plan = _einsum_plan(equation, [None if c == unknown else sizes[c] for c in a_labels],
                        [None if c == unknown else sizes[c] for c in b_labels])
    if plan is None:
        return
    np.testing.assert_allclose(_run_plan(plan, a, b), np.einsum(equation, a, b), rtol=1e-12, atol=1e-12)


def test_what_cannot_be_planned_is_left_alone() -> None:
    assert _einsum_plan("...c,cd->...d", [None, 3], [3, 4]) is None  # ellipsis
    assert _einsum_plan("aab,bc->ac", [2, 2, 3], [3, 4]) is None     # an index twice in one operand
    assert _einsum_plan("abc,cd->ad", [2, 5, 3], [3, 4]) is None     # b summed within one operand
    assert _einsum_plan("abc,acd->abd", [2, 3, None], [2, None, 4]) is None  # the contracted size unknown
    assert _einsum_plan("ab,bc,cd->ad", [2, 3], [3, 4]) is None      # three operands


needs_tfjs = pytest.mark.skipif(importlib.util.find_spec("tensorflowjs") is None,
                                reason="the tensorflowjs converter is not installed: "
                                       "pip install --no-deps tensorflowjs==4.22.0 tensorflow_hub==0.16.1")


def _patch_attention():
    """MobileViT's block in small: a conv, the feature map unfolded into 2x2 patches, attention
    over the patches of each position (4-D MultiHeadAttention), folded back; beside it a sequence
    with 3-D attention, causal attention and an EinsumDense."""
    import keras

    keras.utils.set_random_seed(3)
    image = keras.Input((8, 8, 3), name="image")
    y = keras.layers.Conv2D(8, 3, padding="same", activation="swish")(image)
    y = keras.layers.Reshape((4, 2, 4, 2, 8))(y)
    y = keras.layers.Permute((2, 4, 1, 3, 5))(y)
    y = keras.layers.Reshape((4, 16, 8))(y)
    y = y + keras.layers.MultiHeadAttention(2, 4, attention_axes=(2,))(y, y)
    y = keras.layers.Reshape((2, 2, 4, 4, 8))(y)
    y = keras.layers.Permute((3, 1, 4, 2, 5))(y)
    y = keras.layers.Reshape((8, 8, 8))(y)
    y = keras.layers.GlobalAveragePooling2D()(y)
    tokens = keras.Input((6, 8), name="tokens")
    t = tokens + keras.layers.MultiHeadAttention(2, 4)(tokens, tokens)
    # causal: a bool band_part, which wasm selected wrong once Einsum let it run attention at all
    t = t + keras.layers.MultiHeadAttention(2, 4)(t, t, use_causal_mask=True)
    t = keras.layers.EinsumDense("abc,cd->abd", output_shape=(None, 5), bias_axes="d")(t)
    t = keras.layers.GlobalAveragePooling1D()(t)
    model = keras.Model([image, tokens], keras.layers.Concatenate(name="out")([y, t]))
    rng = np.random.default_rng(0)
    return model, [rng.normal(size=(3, 8, 8, 3)).astype("float32"), rng.normal(size=(3, 6, 8)).astype("float32")]


@needs_tfjs
@pytest.mark.inline_exports
@pytest.mark.usefixtures("_tfjs_converter_loaded")
def test_attention_nets_run_on_both_tfjs_backends_without_einsum(tmp_path) -> None:
    from pytest_modelparity import assert_outputs_close, errors, export_model, load_model
    from pytest_modelparity.formats import export_route

    model, batch = _patch_attention()
    path = export_model(model, "tfjs", tmp_path / "web")
    ops = [n["op"] for n in json.loads(path.read_text())["modelTopology"]["node"]]
    assert "Einsum" not in ops and "BatchMatMulV2" in ops
    assert "Einsum as matmul x" in (export_route(path) or "")
    for backend in ("cpu", "wasm"):  # wasm had no Einsum kernel: "Kernel 'Einsum' not registered"
        try:
            js = load_model(path, "tfjs", backend=backend)
        except errors.RuntimeMissing as exc:
            pytest.skip(f"tfjs runtime missing (python -m pytest_modelparity.tfjs_runner install): {exc}")
        with js:
            assert_outputs_close(js, model, inputs=batch)
