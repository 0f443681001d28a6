"""Devices: parsing, availability errors, ONNX provider choice, and real op placement.

No GPU here: GPU requests must fail clearly, and placement is proved on a second *logical*
CPU device (``cpu:1``), in a subprocess because logical devices must be configured before
TensorFlow initialises its runtime.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_modelparity.runtime.devices import DeviceSpec, onnx_providers, parse_device, require_cpu_only
from pytest_modelparity.errors import DeviceUnavailable

TESTS = Path(__file__).parent


@pytest.mark.parametrize("text,kind,index,tf_name", [
    ("cpu", "cpu", None, "/device:CPU:0"),
    ("gpu", "gpu", None, "/device:GPU:0"),
    ("gpu:1", "gpu", 1, "/device:GPU:1"),
    ("GPU:0", "gpu", 0, "/device:GPU:0"),
    (" cpu : 1 ", "cpu", 1, "/device:CPU:1"),
    ("/device:GPU:2", "gpu", 2, "/device:GPU:2"),
])
def test_parse_device(text, kind, index, tf_name):
    spec = parse_device(text)
    assert (spec.kind, spec.index, spec.tf_name) == (kind, index, tf_name)
    assert parse_device(str(spec)) == spec


@pytest.mark.parametrize("bad", ["tpu", "gpu:-1", "cuda:0", "", "gpu:x", "cpu0"])
def test_parse_device_rejects(bad):
    with pytest.raises(ValueError, match="use 'cpu', 'gpu' or 'gpu:N'"):
        parse_device(bad)


def test_parse_device_rejects_non_string():
    with pytest.raises(ValueError, match="must be a string"):
        parse_device(0)


def test_onnx_providers():
    assert onnx_providers("cpu", available=["CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert onnx_providers("gpu:1", available=cuda) == [("CUDAExecutionProvider", {"device_id": 1}),
                                                       "CPUExecutionProvider"]
    with pytest.raises(DeviceUnavailable, match="no CUDAExecutionProvider.*onnxruntime-gpu"):
        onnx_providers("gpu", available=["CPUExecutionProvider"])


def test_onnx_providers_real_onnxruntime():
    ort = pytest.importorskip("onnxruntime", reason="pip install 'pytest-modelparity[onnx]'")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert onnx_providers("gpu")[0][0] == "CUDAExecutionProvider"
    else:
        with pytest.raises(DeviceUnavailable):
            onnx_providers("gpu")
    assert onnx_providers("cpu") == ["CPUExecutionProvider"]


def test_require_cpu_only():
    assert require_cpu_only("cpu", "tflite", "no GPU delegate", "Use cpu.") == DeviceSpec("cpu")
    with pytest.raises(DeviceUnavailable, match=r"'tflite' runs on the CPU only.*: no GPU delegate, so "
                                                r"device='gpu' cannot be honoured\. Use cpu\."):
        require_cpu_only("gpu", "tflite", "no GPU delegate", "Use cpu.")
    with pytest.raises(DeviceUnavailable, match="device='cpu:1'"):
        require_cpu_only("cpu:1", "tfjs", "Node.js", "Use cpu.")


# -- TensorFlow ------------------------------------------------------------------------

def _no_gpu():
    tf = pytest.importorskip("tensorflow", reason="pip install 'pytest-modelparity[tensorflow]'")
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU; the missing-GPU error cannot be provoked here")


def test_missing_gpu_is_a_clear_error():
    _no_gpu()
    from pytest_modelparity.runtime.devices import available_devices, require_tf_device, tf_available

    assert available_devices() == ("cpu",)
    assert not tf_available("gpu") and tf_available("cpu")
    with pytest.raises(DeviceUnavailable, match=r"(?s)'gpu:1'.*sees no GPU.*tensorflow\[and-cuda\].*device='cpu'"):
        require_tf_device("gpu:1")
    with pytest.raises(DeviceUnavailable, match=r"'cpu:3'.*only 1 CPU device"):
        require_tf_device("cpu:3")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    pytest.importorskip("tensorflow", reason="pip install 'pytest-modelparity[tensorflow]'")
    from pytest_modelparity import export_model

    import tf1_graphs
    from models import tiny_cnn

    root = tmp_path_factory.mktemp("dev")
    model = tiny_cnn()
    return {
        "keras": export_model(model, "keras", root / "m.keras"),
        "h5": export_model(model, "h5", root / "m.h5"),
        "saved_model": export_model(model, "saved_model", root / "sm"),
        "graphdef": export_model(model, "graphdef", root / "g.pb"),
        "checkpoint": tf1_graphs.save_checkpoint(root / "ckpt", dropout=False),
    }


@pytest.mark.parametrize("fmt", ["keras", "h5", "saved_model", "graphdef", "checkpoint"])
def test_every_tf_format_refuses_a_missing_gpu(artifacts, fmt):
    _no_gpu()
    from pytest_modelparity import load_model

    with pytest.raises(DeviceUnavailable, match=f"for format '{fmt}'"):
        load_model(artifacts[fmt], device="gpu")


PLACEMENT_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.debugging.set_log_device_placement(True)  # before the runtime starts, or it is ignored
    from pytest_modelparity import load_model
    paths = json.loads(sys.argv[1])
    x = np.random.default_rng(0).uniform(0, 1, (2, 8, 8, 3)).astype("float32")
    for device in sys.argv[2].split(","):  # each device's models loaded afresh, their runs between markers
        result = {}
        for fmt in ("keras", "saved_model"):
            model = load_model(paths[fmt], device=device)
            print(f"@@begin {device} {fmt}", file=sys.stderr, flush=True)
            model.predict(x)
            print(f"@@end {device} {fmt}", file=sys.stderr, flush=True)
        for fmt in ("graphdef", "checkpoint"):
            model = load_model(paths[fmt], device=device)
            feed = x if fmt == "graphdef" else np.ones((2, 12), "float32")
            meta = tf.compat.v1.RunMetadata()
            opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
            feeds = model.prepare_batch(feed)
            model.session.run(model._out, feed_dict={t: feeds[s.name] for t, s in zip(model._in, model.inputs)},
                              options=opts, run_metadata=meta)
            devices = {}
            for dev in meta.step_stats.dev_stats:
                for node in dev.node_stats:
                    devices.setdefault(dev.device.rsplit(":", 2)[-2] + ":" + dev.device.rsplit(":", 1)[-1], []).append(node.node_name)
            # Only the model's own ops count: feeds/fetches (_arg, _retval, _SOURCE) live on the client CPU.
            ops = {op.name for op in model.graph.get_operations()}
            result[fmt] = {"devices": sorted(d for d, names in devices.items() if ops.intersection(names)),
                           "imported": sorted({op.device for op in model.graph.get_operations()})}
        print(f"@@json {device} " + json.dumps(result), flush=True)
""")


DEVICES = {"cpu:1": "CPU:1", "cpu": "CPU:0"}


@pytest.fixture(scope="module")
def placement(artifacts):
    """The placement log of both devices, from one child (issue 49: the second TensorFlow import
    a child per device paid proved nothing more: each device's models are loaded afresh)."""
    pytest.importorskip("tensorflow", reason="pip install 'pytest-modelparity[tensorflow]'")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", PYTHONPATH=str(TESTS))
    paths = {k: str(v) for k, v in artifacts.items()}
    out = subprocess.run([sys.executable, "-c", PLACEMENT_SCRIPT, json.dumps(paths), ",".join(DEVICES)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180, env=env)
    text = out.stdout  # one stream, so the log lines stay between their markers
    assert out.returncode == 0, text[-3000:]
    return text


def _eager_compute_devices(text, device, fmt):
    """Devices that the compute ops (conv, matmul, softmax) of ``fmt`` were placed on."""
    import re

    block = text.split(f"@@begin {device} {fmt}")[1].split(f"@@end {device} {fmt}")[0]
    return set(re.findall(r"(?:Conv2D|MatMul|Softmax)\S*: \(\S+\): \S*device:(CPU:\d)", block))


@pytest.mark.parametrize("device,expected", list(DEVICES.items()))
def test_ops_run_on_the_requested_device(placement, device, expected):
    for fmt in ("keras", "saved_model"):
        assert _eager_compute_devices(placement, device, fmt) == {expected}, fmt
    result = json.loads(placement.split(f"@@json {device} ")[1].splitlines()[0])
    for fmt in ("graphdef", "checkpoint"):
        assert result[fmt]["imported"] == [f"/device:{expected}"], (fmt, result[fmt])
        assert result[fmt]["devices"] == [expected], (fmt, result[fmt])
