"""A channels-first image batch fed to a channels-last model (PyTorch-style data, a Keras model),
or the reverse, is refused with the layout named and the transpose that fixes it."""

from __future__ import annotations

import numpy as np
import pytest

from models import tiny_cnn
from pytest_modelparity import errors
from pytest_modelparity.formats.base import layout_hint


def test_a_channels_first_batch_gets_the_transpose_that_fits_it():
    from pytest_modelparity import assert_outputs_close, load_model

    model = tiny_cnn(input_shape=(8, 8, 3))
    x = np.random.default_rng(0).random((2, 3, 8, 8)).astype("float32")
    with pytest.raises(errors.BatchMismatchError) as info:
        assert_outputs_close(load_model(model), model, inputs=x)
    text = str(info.value)
    assert "looks channels-first (N, C, H, W) while the model takes channels-last (N, H, W, C)" in text
    assert "np.transpose(x, (0, 2, 3, 1))" in text
    fixed = np.transpose(x, (0, 2, 3, 1))
    assert_outputs_close(load_model(model), model, inputs=fixed)  # the advice, followed, works


def test_the_hint_in_both_directions_and_only_where_it_fits():
    assert "(0, 2, 3, 1)" in layout_hint((2, 3, 32, 32), (None, 32, 32, 3))
    assert "(0, 3, 1, 2)" in layout_hint((2, 32, 32, 3), (None, 3, 32, 32))
    assert "(0, 2, 3, 1)" in layout_hint((2, 1, 28, 28), (None, 28, 28, 1))  # grayscale
    assert layout_hint((2, 3, 16, 16), (None, 32, 32, 3)) == ""  # wrong size, not a layout
    assert layout_hint((2, 7, 8, 8), (None, 8, 8, 7)) == ""  # 7 is not an image's channel count
    assert layout_hint((2, 8, 3), (None, 3, 8)) == ""  # not an image batch


def test_a_batch_of_the_wrong_shape_gets_the_line_that_fixes_it():
    """Issue 50: "rank 3, expects rank 4" named what was wrong and left the line to the reader.
    Each fix line names the shape the model takes, and the line, run on the batch, makes one the
    model accepts (a real Keras model: the fixed batch passes)."""
    from pytest_modelparity import assert_outputs_close, load_model
    from pytest_modelparity.formats.base import shape_fix

    model = tiny_cnn(input_shape=(8, 8, 1))
    loaded = load_model(model)
    rng = np.random.default_rng(0)
    cases = [(rng.random((8, 8, 1)), "x = x[np.newaxis]"),                 # one image, no batch axis
             (rng.random((2, 8, 8)), "x = x[..., np.newaxis]"),            # grayscale without its channel
             (rng.random((2, 8, 8, 1, 1)), "x = x[..., 0]"),               # an extra axis of 1
             (rng.random((2, 64)), "x = x.reshape((2, 8, 8, 1))")]         # flattened rows
    for x, line in cases:
        x = x.astype("float32")
        with pytest.raises(errors.BatchMismatchError) as info:
            loaded.predict(x)
        fix = [ln for ln in str(info.value).splitlines() if ln.strip().startswith("fix:")]
        assert fix and line in fix[0] and "the model takes (None, 8, 8, 1)" in fix[0], (x.shape, str(info.value))
        scope = {"x": x, "np": np}
        exec(line, scope)  # the advice, followed, works
        assert_outputs_close(loaded, model, inputs=scope["x"])
    # a size no line can know: the shape to build, and no reshape that would scramble pixels
    text = shape_fix("image", (2, 16, 16, 1), (None, 8, 8, 1))
    assert "the model takes (None, 8, 8, 1)" in text and "reshape" not in text and "(2, 8, 8, 1)" in text
    assert "i:i + 1" in shape_fix("x", (8, 5), (1, 5))  # a fixed batch of 1: fed a row at a time
