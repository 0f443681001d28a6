"""A TF1 *training* checkpoint as third parties ship it: an ``is_training`` switch around a
fused batch norm and a dropout (``tf.cond``, v1 control flow), labels, Adam, the prefix
``<dir>/``, a state file naming the author's machine and a stale ``_output_shapes``. It loads
with ``feeds={"is_training": False}`` alone, its output found without naming it; the untaken
branches are pruned so it gets a float64 floor; its conversions take the same feeds; and
``is_training=True``, re-initialised weights and a kernel x1.01 each fail with the cause named.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import tf1_training  # noqa: E402
from pytest_modelparity import assert_outputs_close, export_model, load_model  # noqa: E402
from pytest_modelparity.formats import export_route  # noqa: E402
from pytest_modelparity.errors import ModelLoadError  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]

FEEDS = {"is_training": False}
TWIN_FLOOR = "float64 run of its graph twin"


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, np.ndarray]:
    """``(checkpoint directory, the frozen .pb made by hand, the inference truth)``."""
    root = tmp_path_factory.mktemp("tagger")
    truth = tf1_training.save_shipped(root / "ckpt", frozen=root / "frozen.pb")
    return root / "ckpt", root / "frozen.pb", truth


@pytest.mark.parametrize("slash", ["", "/"])
def test_loads_with_feeds_only_and_finds_its_output(shipped, slash: str) -> None:
    directory, _frozen, truth = shipped
    with load_model(str(directory) + slash, feeds=FEEDS) as model:
        assert model.format == "checkpoint"
        assert [s.name for s in model.inputs] == ["x"]  # not is_training, not labels
        assert [s.name for s in model.outputs] == ["predictions"]
        assert "_output_shapes" in (model.load_route or "")
        # the inference branch's values; not bit for bit: with oneDNN on (TensorFlow's default on
        # Intel CPUs with AVX512_VNNI/AMX) the pruned graph's kernels round otherwise (3e-8 here),
        # while the training branch (batch moments, dropout) is 0.29 of scale off
        np.testing.assert_allclose(model.predict(tf1_training.batch())["predictions"], truth, rtol=1e-6, atol=0)


def test_only_the_taken_branch_and_used_outputs_are_sink_candidates(shipped) -> None:
    """False: the moments' unused variance (a by-product of the mean the model uses) and the
    training branch's unused moments (never run) are no candidates. True: that branch runs, so
    its sinks are candidates again and the output must be named; the by-product stays out."""
    directory, _frozen, _truth = shipped
    with pytest.raises(ModelLoadError, match=r"3 candidate sink\(s\): predictions:0, ") as info:
        load_model(directory, feeds={"is_training": True})
    text = str(info.value)
    assert "bn_cond/batch_moments/Squeeze:0" in text and "bn_cond/batch_moments/Squeeze_1:0" in text, text
    assert "moments/Squeeze_1:0, " not in text.replace("batch_moments/Squeeze_1:0", ""), text


def test_an_unset_switch_is_named_with_its_dtype_and_the_option(shipped) -> None:
    directory, _frozen, _truth = shipped
    with pytest.raises(ModelLoadError) as info:
        load_model(directory)
    text = str(info.value)
    assert "is_training (bool scalar)" in text and "feeds={'is_training': False}" in text
    assert "must be a scalar" not in text and "You must feed" not in text


def test_a_switch_named_as_an_input_or_a_wrong_feed_is_refused(shipped) -> None:
    directory, _frozen, _truth = shipped
    with pytest.raises(ModelLoadError, match=r"a graph switch \(is_training \(bool scalar\)\), not a batch input"):
        load_model(directory, inputs=["x:0", "is_training:0"], outputs=["predictions:0"])
    with pytest.raises(ModelLoadError, match=r"(?s)feeds names 'is_trainin'.*not in the graph.*is_training"):
        load_model(directory, feeds={"is_trainin": False})
    with pytest.raises(ModelLoadError, match=r"does not fit placeholder is_training \(bool\)"):
        load_model(directory, feeds={"is_training": 0.5})


def test_untaken_branches_are_pruned_and_the_graph_gets_a_float64_floor(shipped) -> None:
    directory, frozen_pb, _truth = shipped
    with load_model(directory, feeds=FEEDS) as reference:
        graph = reference.frozen_graph().graph_def
        ops = {n.op for n in graph.node}
        assert not ops & {"Switch", "Merge", "RandomUniform"}, ops
        assert not [n.name for n in graph.node if n.op.startswith("FusedBatchNorm") and n.attr["is_training"].b]
        with load_model(frozen_pb) as frozen:
            report = assert_outputs_close(frozen, reference, inputs=tf1_training.batch(8))
        assert TWIN_FLOOR in str(report), str(report)


@pytest.mark.parametrize("bug, cause", [
    ("is_training=True", "training mode"),
    ("re-initialised weights", "hold different weights"),
    ("kernel x1.01", "conv/kernel"),
])
def test_each_planted_bug_fails_with_its_cause(shipped, tmp_path: Path, bug: str, cause: str) -> None:
    directory, _frozen, _truth = shipped
    if bug == "is_training=True":  # the training branch runs: its unused moments are sinks again
        candidate = load_model(directory, feeds={"is_training": True}, outputs=["predictions:0"])
    else:
        tf1_training.save_shipped(tmp_path / "bug", **({"seed": 7} if bug.startswith("re-") else {"kernel_scale": 1.01}))
        candidate = load_model(tmp_path / "bug", feeds=FEEDS)
    with candidate, load_model(directory, feeds=FEEDS) as reference:
        with pytest.raises(AssertionError) as info:
            assert_outputs_close(candidate, reference, inputs=tf1_training.batch(8))
        text = str(info.value)  # diagnosed while both models are open
    assert TWIN_FLOOR in text and cause in text, text


def test_export_model_takes_the_load_options(shipped, tmp_path: Path) -> None:
    directory, _frozen, truth = shipped
    written = export_model(directory, "tflite", tmp_path / "m", feeds=FEEDS)
    route = export_route(written) or ""
    assert "feeds={'is_training': False}" in route and "dropped _output_shapes" in route, route
    with load_model(written) as converted:
        out = converted.predict(tf1_training.batch())
        np.testing.assert_allclose(next(iter(out.values())), truth, atol=1e-6)
    with pytest.raises(ValueError, match="name tensors of a TF1 graph"):
        export_model(written, "onnx", tmp_path / "m2", feeds=FEEDS)  # a .tflite is no TF1 graph
    with pytest.raises(ModelLoadError, match=r"is_training \(bool scalar\)"):
        export_model(directory, "tflite", tmp_path / "m3")  # the switch unset: said, not a raw error


@pytest.mark.parametrize("format", ["h5", "graphdef"])
def test_a_format_a_checkpoint_cannot_become_calls_it_a_checkpoint(shipped, tmp_path: Path, format: str) -> None:
    """The skip and error lines of such a format named the checkpoint "a SavedModel directory"."""
    directory, _frozen, _truth = shipped
    with pytest.raises(ModelLoadError) as info:
        export_model(directory, format, tmp_path / "m", feeds=FEEDS)
    text = str(info.value)
    assert f"a TF1 checkpoint cannot be converted to '{format}'" in text, text
    assert "SavedModel directory" not in text and "tflite" in text, text
    assert ("convert_variables_to_constants" in text) == (format == "graphdef"), text


def test_the_int8_advice_for_a_checkpoint_runs_on_the_checkpoint(shipped, tmp_path: Path) -> None:
    """The quantisation hint's fix is an export_model call on the checkpoint with its feeds (the
    plugin freezes it), not a converter to rebuild by hand from a SavedModel nobody has; run as
    printed, it writes a file whose named nodes, int8 in the failing file, are float."""
    import re

    from pytest_modelparity.diagnose.quantization import cost_hint
    from pytest_modelparity.formats.tflite.load import new_interpreter

    directory, _frozen, _truth = shipped
    rows = [tf1_training.batch(8, seed=s) for s in range(4)]
    quantized = export_model(directory, "tflite", tmp_path / "q", quantization="int8", representative_data=rows,
                             feeds=FEEDS)
    sibling = export_model(directory, "tflite", tmp_path / "f", feeds=FEEDS)
    x = tf1_training.batch(8, seed=9)
    with load_model(quantized) as q, load_model(sibling) as f:
        hint = cost_hint(q, f, x, "int8")
        assert hint is not None
        message = hint[1]
    call = re.search(r"(export_model\(CHECKPOINT, .*?\)) \(from pytest_modelparity", message)
    assert call and "feeds={'is_training': False}" in call.group(1), message
    names = eval(re.search(r'"float_nodes": (\[.*?\])', call.group(1)).group(1))
    written = eval(call.group(1).replace('"model_int8.tflite"', repr(str(tmp_path / "kept.tflite"))),
                   {"export_model": export_model, "CHECKPOINT": directory, "ROWS": rows})

    def kinds(path: Path) -> dict[str, np.dtype]:
        return {d["name"]: np.dtype(d["dtype"]) for d in new_interpreter(Path(path).read_bytes()).get_tensor_details()}

    was, now = kinds(quantized), kinds(written)
    assert all(was.get(n) != np.float32 for n in names), {n: was.get(n) for n in names}
    assert all(now.get(n) == np.float32 for n in names), {n: now.get(n) for n in names}


def test_two_sink_frozen_graph_exports_with_its_outputs_named(tmp_path: Path) -> None:
    import tf1_graphs

    namespace: dict = {}
    exec(tf1_graphs.TWO_SINKS_CONFTEST, namespace)
    frozen = namespace["freeze_two_sinks"](tmp_path)
    with pytest.raises(ModelLoadError, match=r"2 candidate sink\(s\): predictions:0, mean_logit:0") as info:
        export_model(frozen, "tflite", tmp_path / "m.tflite")  # the likely output listed first
    assert "load options do not reach" not in str(info.value)
    written = export_model(frozen, "tflite", tmp_path / "m.tflite", outputs=["predictions:0"])
    batch = np.random.default_rng(0).normal(size=(4, 12)).astype("float32")
    with load_model(written) as converted, load_model(frozen, outputs=["predictions:0"]) as reference:
        assert_outputs_close(converted, reference, inputs=batch)


SUITE = textwrap.dedent('''
    import pytest
    import tf1_training
    from pytest_modelparity import assert_outputs_close

    @pytest.fixture(scope="session")
    def tagger(tmp_path_factory):
        root = tmp_path_factory.mktemp("tagger")
        tf1_training.save_shipped(root / "ckpt", frozen=root / "frozen.pb")
        return root

    @pytest.fixture(scope="session")
    def modelparity_source(tagger):
        return str(tagger / "ckpt") + "/"

    @pytest.fixture(scope="session")
    def modelparity_load_options():
        return {"feeds": {"is_training": False}}
''')

TEST = textwrap.dedent('''
    from pytest_modelparity import assert_outputs_close

    def test_export(parity_candidate, parity_reference, parity_batch):
        report = assert_outputs_close(parity_candidate, parity_reference, inputs=parity_batch)
        assert "float64 run of its graph twin" in str(report), str(report)
''')


FROZEN_TEST = textwrap.dedent('''
    from pytest_modelparity import load_model

    def test_frozen_pb(tagger, parity_reference, parity_batch):
        with load_model(tagger / "frozen.pb") as frozen:
            report = assert_outputs_close(frozen, parity_reference, inputs=parity_batch)
        assert "float64 run of its graph twin" in str(report), str(report)
''')


@pytest.mark.usefixtures("_heavy_modules_stay_loaded", "installed_node_modules")
def test_through_the_fixtures_every_conversion_takes_the_feeds(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(SUITE)
    pytester.makepyfile(test_tagger=TEST + FROZEN_TEST)
    pytester.syspathinsert(Path(__file__).parent)
    result = pytester.runpytest("-p", "no:cacheprovider", "-v", "--modelparity-formats=tflite,onnx,tfjs",
                                "--modelparity-export-process=inline")
    result.assert_outcomes(passed=4)
    assert "load options do not reach" not in result.stdout.str()


INT8_TEST = textwrap.dedent('''
    from pathlib import Path

    import numpy as np
    from pytest_modelparity.diagnose import quantization
    from pytest_modelparity.formats.tflite.load import new_interpreter

    def test_requantize(parity_candidate, parity_batch):
        sibling = parity_candidate.float_sibling
        names = quantization.kept_names(quantization.layer_costs(parity_candidate, sibling, parity_batch))
        trial = quantization.try_keeping(parity_candidate, sibling, parity_batch, names)
        assert trial.after is not None and not trial.not_run, trial
        kept = parity_candidate.requantize(names)  # the session's own export, from its cache
        details = new_interpreter(Path(kept.source).read_bytes()).get_tensor_details()
        kinds = {d["name"]: np.dtype(d["dtype"]) for d in details}
        assert all(kinds.get(n) == np.float32 for n in names), {n: kinds.get(n) for n in names}
''')


@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
def test_the_int8_advice_is_measured_on_the_checkpoint_through_the_fixtures(pytester: pytest.Pytester) -> None:
    """The session re-quantises a checkpoint source as it exported it (frozen with its feeds):
    the measured advice runs on the source it was given (issue 50)."""
    pytester.makeconftest(SUITE)
    pytester.makepyfile(test_tagger=INT8_TEST)
    pytester.syspathinsert(Path(__file__).parent)
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=tflite:int8",
                                "--modelparity-export-process=inline", "--modelparity-report=r.json")
    result.assert_outcomes(passed=1)
    routes = [a.get("route", "") for a in json.loads((pytester.path / "r.json").read_text())["artifacts"]]
    kept = [r for r in routes if "kept in float" in r]
    assert len(kept) == 1 and "TF1 checkpoint frozen" in kept[0] and "is_training" in kept[0], routes


def _keep_prob_graph(path: Path) -> Path:
    """A tutorial-style frozen graph: ``keep_prob`` declared without a shape, and an
    ``is_training`` with a default (``placeholder_with_default(False)``) around a tf.cond."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf1_training.tf1_graph() as graph:
        x = v1.placeholder(tf.float32, [None, 6], name="x")
        keep_prob = v1.placeholder(tf.float32, name="keep_prob")
        is_training = v1.placeholder_with_default(False, [], name="is_training")
        w = tf.constant(np.random.default_rng(1).normal(size=(6, 2)).astype("float32"))
        h = v1.nn.dropout(tf.matmul(x, w), keep_prob=keep_prob)
        h = v1.cond(is_training, lambda: h * 2.0, lambda: tf.identity(h))
        tf.nn.sigmoid(h, name="scores")
    path.write_bytes(graph.as_graph_def().SerializeToString())
    return path


def test_an_unshaped_keep_prob_is_a_switch_and_a_default_is_taken(tmp_path: Path) -> None:
    frozen = _keep_prob_graph(tmp_path / "tutorial.pb")
    with pytest.raises(ModelLoadError, match=r"(?s)keep_prob \(float32 unknown shape\).*feeds=\{'keep_prob': 1.0\}"):
        load_model(frozen)
    with load_model(frozen, feeds={"keep_prob": 1.0}) as model:
        assert [s.name for s in model.inputs] == ["x"] and [s.name for s in model.outputs] == ["scores"]
        ops = {n.op for n in model.frozen_graph().graph_def.node}
        assert not ops & {"Switch", "Merge"}, ops  # is_training took its default (False): its cond is gone
        batch = np.random.default_rng(2).normal(size=(3, 6)).astype("float32")
        w = np.random.default_rng(1).normal(size=(6, 2)).astype("float32")
        np.testing.assert_allclose(model.predict(batch)["scores"], 1 / (1 + np.exp(-(batch @ w))), rtol=1e-5)


@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
def test_one_cause_is_said_in_full_once_per_session(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(SUITE.replace('return {"feeds": {"is_training": False}}', "return {}"))
    pytester.makepyfile(test_tagger=TEST)
    pytester.syspathinsert(Path(__file__).parent)
    result = pytester.runpytest("-p", "no:cacheprovider", "--modelparity-formats=tflite,onnx",
                                "--modelparity-export-process=inline")  # no worker to start: nothing converts
    result.assert_outcomes(errors=2)
    out = result.stdout.str()
    assert out.count("fix: set each switch with the load option feeds={'is_training': False}") == 1, out
    assert "(the same error as the first test that needed it, where its full text and fix are shown)" in out


def test_outputs_are_found_among_cond_bookkeeping_metrics_and_summaries() -> None:
    """The issue's 118 sinks, all tf.cond bookkeeping, the real output not among them: without
    gradients to mark the loss, conds, a metric, a summary and a loss reading the labels are
    still not outputs; ``model/Sigmoid`` is the one found."""
    import tensorflow as tf

    from pytest_modelparity.formats.tensorflow.graph import find_outputs

    v1 = tf.compat.v1
    with tf1_training.tf1_graph() as graph:
        x = v1.placeholder(tf.float32, [None, 4], name="model/Placeholder")
        labels = v1.placeholder(tf.float32, [None, 2], name="model/labels")
        is_training = v1.placeholder(tf.bool, [], name="model/Placeholder_2")
        h = x
        for i in range(3):
            h = v1.cond(is_training, lambda h=h: h * 0.5, lambda h=h: h + 0.0, name=f"model/cond_{i}")
        w = tf.constant(np.ones((4, 2), "float32"))
        probs = tf.nn.sigmoid(tf.matmul(h, w), name="model/Sigmoid")
        tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=tf.matmul(h, w)), name="loss")
        _acc, _update = v1.metrics.accuracy(tf.argmax(labels, 1), tf.argmax(probs, 1))
        v1.summary.scalar("prob_mean", tf.reduce_mean(probs))
    assert find_outputs(graph) == ["model/Sigmoid:0"]


def test_the_output_search_walks_a_graph_deeper_than_pythons_stack() -> None:
    """EfficientNetB0's frozen graph overflowed the recursive walk (RecursionError in a graphdef
    export's output search); a chain of 3,000 ops below a metric-read prediction is walked."""
    import tensorflow as tf

    from pytest_modelparity.formats.tensorflow.graph import find_outputs

    v1 = tf.compat.v1
    with tf1_training.tf1_graph() as graph:
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        h = x
        for _ in range(3000):
            h = h * 1.0001
        probs = tf.nn.sigmoid(h, name="model/Sigmoid")
        deep = probs
        for _ in range(3000):  # read only by a summary, through a long chain
            deep = deep + 0.0
        v1.summary.scalar("deep", tf.reduce_mean(deep))
    assert find_outputs(graph) == ["model/Sigmoid:0"]
