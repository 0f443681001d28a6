"""Real faults a new user meets: model paths that are pipes or devices, and machine limits.

Every fault here is real: an ``os.mkfifo`` pipe, a symlink to ``/dev/zero``, a file-size
limit set with ``resource.setrlimit`` in a child Python (a limit in this process would hit
pytest itself), a parent directory under ``/proc`` that cannot be created.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_modelparity import errors

import models

HERE = Path(__file__).resolve().parent


def _load_within(path: Path, seconds: float, **options):
    """``load_model(path)`` in a thread; fail (after unblocking it) if it is not done in ``seconds``."""
    from pytest_modelparity import load_model

    def open_for_writing() -> None:  # blocked in open(): a writer lets it go before the test fails
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    hung, took, box = models.call_with_deadline(lambda: load_model(path, **options), seconds, open_for_writing)
    if hung:
        pytest.fail(f"load_model({path}) still blocked after {seconds} s")
    if "result" in box:
        box["value"] = box.pop("result")
    return box, took


@pytest.mark.parametrize("name", ["m.tflite", "m.onnx", "m.keras", "m.pb", "m.h5", "tfjs/model.json", "tfjs"])
def test_a_fifo_model_path_is_refused_within_a_second(tmp_path: Path, name: str) -> None:
    (tmp_path / "tfjs").mkdir()
    fifo = tmp_path / name.replace("tfjs", "tfjs/model.json") if name == "tfjs" else tmp_path / name
    os.mkfifo(fifo)
    box, took = _load_within(tmp_path / name, 1.0)
    assert isinstance(box.get("error"), errors.ModelLoadError), box
    text = str(box["error"])
    assert "a FIFO (named pipe), not a regular file" in text and "fix:" in text, text
    assert took < 1.0


@pytest.mark.parametrize("format", ["tflite", "onnx"])
def test_a_symlink_to_dev_zero_is_refused_before_reading(tmp_path: Path, format: str) -> None:
    link = tmp_path / f"m.{format}"
    link.symlink_to("/dev/zero")
    box, took = _load_within(link, 1.0, format=format)
    text = str(box.get("error"))
    assert isinstance(box.get("error"), errors.ModelLoadError), box
    assert "a character device (the link leads to /dev/zero)" in text and took < 1.0


def test_the_format_modules_refuse_a_fifo_themselves(tmp_path: Path) -> None:
    """Called directly (no load_model in front), the readers open without blocking and check fstat."""
    from pytest_modelparity.formats import onnx
    from pytest_modelparity.formats import tflite

    for module, name in ((tflite, "m.tflite"), (onnx, "m.onnx")):
        fifo = tmp_path / name
        os.mkfifo(fifo)
        with pytest.raises(errors.ModelLoadError, match="FIFO"):
            module.load(fifo)


def test_a_fifo_source_fails_the_plugin_test_at_once(pytester: pytest.Pytester) -> None:
    os.mkfifo(pytester.path / "model.tflite")
    pytester.makeconftest('''
        import pytest

        @pytest.fixture(scope="session")
        def modelparity_source():
            return "model.tflite"
    ''')
    pytester.makepyfile(test_fifo='''
        def test_fifo(parity_reference, parity_batch):
            parity_reference.predict(parity_batch)
    ''')
    start = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--modelparity-formats=tflite", timeout=120)
    assert time.monotonic() - start < 60
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*a FIFO (named pipe), not a regular file*"])


def _in_child_with_file_size_limit(formats: list[str], tmp_path: Path) -> dict[str, str]:
    """Export the tiny CNN to each format in a child Python whose file-size limit is 2 KiB."""
    script = textwrap.dedent(f'''
        import json, os, resource, signal, sys
        sys.path.insert(0, {str(HERE)!r})
        import models
        from pytest_modelparity import export_model
        model = models.tiny_cnn(seed=3)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, resource.RLIM_INFINITY))
        out = {{}}
        for fmt in {formats!r}:
            try:
                export_model(model, fmt, os.path.join({str(tmp_path)!r}, fmt, "m"))
                out[fmt] = "no error"
            except Exception as exc:
                out[fmt] = type(exc).__name__ + ": " + str(exc)
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        print("RESULT" + json.dumps(out))
    ''')
    # No bytecode written: under the 2 KiB limit every .pyc the child compiles (a module the
    # exporters import lazily, autograph's generated ones) is cut at 2,048 bytes, and in the run's
    # shared bytecode folder (conftest.py) the next process that imports that module failed with
    # "EOFError: marshal data too short" (15 tests of one run). Reading the folder is harmless.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
               PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-2000:]
    import json

    return json.loads(line[len("RESULT"):])


def test_a_file_size_limit_is_named_with_its_fix_by_every_exporter(tmp_path: Path) -> None:
    """Each exporter used to wrap EFBIG in its own wrong fix (permissions, "a functional model")."""
    pytest.importorskip("tf2onnx")
    results = _in_child_with_file_size_limit(["saved_model", "tflite", "onnx", "keras"], tmp_path)
    for fmt, text in results.items():
        assert text.startswith("ExportError:"), (fmt, text)
        assert "a file grew past the file-size limit" in text and "ulimit -f" in text, (fmt, text)
        assert "permission" not in text.lower() and "functional" not in text, (fmt, text)
    assert "File too large" in results["saved_model"] and "{{function_node" not in results["saved_model"]


def test_a_parent_directory_that_cannot_be_created_is_an_export_error(tmp_path: Path) -> None:
    from pytest_modelparity import export_model

    with pytest.raises(errors.ExportError) as info:
        export_model(models.mlp(seed=1), "keras", "/proc/no-such-pid/m.keras")
    text = str(info.value)
    assert "/proc/no-such-pid" in text and "cannot be created" in text and "fix:" in text


def test_a_batch_that_cannot_fit_in_memory_is_refused_with_its_size() -> None:
    from pytest_modelparity import TensorSpec
    from pytest_modelparity.checks.strategies import seeded_batch

    with pytest.raises(errors.InvalidArgumentError, match=r"shape \(4, 1000000, 1000000, 3\) would take 131.0 TiB"):
        seeded_batch([TensorSpec("x", (None, 1_000_000, 1_000_000, 3), "float32")])
    assert seeded_batch([TensorSpec("x", (None, 6), "float32")])["x"].shape == (4, 6)


def test_resource_errors_are_told_apart() -> None:
    """The classifier on the exceptions Python itself raises for each limit."""
    import errno

    from pytest_modelparity.runtime.resources import resource_failure, resource_kind

    assert resource_kind(OSError(errno.EFBIG, "File too large")) == "file_too_large"
    assert resource_kind(OSError(errno.ENOSPC, "No space left on device")) == "disk_full"
    assert resource_kind(MemoryError()) == "memory"
    try:
        raise RuntimeError("wrapped") from RuntimeError("can't start new thread")
    except RuntimeError as exc:
        problem, fix = resource_failure(exc, "/tmp")  # type: ignore[misc]
    assert "no new thread" in problem and "ulimit -u" in fix
    assert resource_kind(ValueError("bad shape")) is None
    # protobuf's arena under an address-space limit, as CI saw it in the export worker
    from google.protobuf.message import DecodeError

    assert resource_kind(DecodeError("Error parsing message with type 'tensorflow.FunctionDef': Arena alloc failed")) \
        == "memory"


def test_a_model_past_its_formats_2_gib_container_is_refused_before_converting(tmp_path: Path, monkeypatch) -> None:
    """The real check on a real model, with the 2 GiB limit lowered to 1 KiB (a real 2 GiB model
    costs 2 GiB of memory to build): ONNX and TFLite refuse, TFLite int8 (a quarter) and a
    SavedModel (variables outside the graph) pass the check."""
    from pytest_modelparity import export_model
    from pytest_modelparity import formats

    model = models.mlp(seed=1)  # 16*32 + 32 + 32*5 + 5 floats = 2836 bytes
    assert formats.weight_bytes(model) == 4 * (16 * 32 + 32 + 32 * 5 + 5)
    monkeypatch.setattr(formats, "_TWO_GIB", 1024)
    for fmt, container in (("onnx", "protobuf"), ("tflite", "FlatBuffer")):
        start = time.monotonic()
        with pytest.raises(errors.ExportError) as info:
            export_model(model, fmt, tmp_path / fmt / "m")
        text = str(info.value)
        assert f"more than a {container} can hold (2 GiB); refused before converting" in text and "2.8 KiB" in text
        assert time.monotonic() - start < 1 and not (tmp_path / fmt).exists()
    monkeypatch.setattr(formats, "_TWO_GIB", 1000)  # int8 writes ~709 bytes of weights
    assert export_model(model, "saved_model", tmp_path / "sm").exists()
    formats._check_size_limit(model, "tflite", {"quantization": "int8"}, tmp_path / "q")


def test_a_batch_the_runtime_would_copy_into_missing_memory_is_refused(tmp_path: Path) -> None:
    """A real RLIMIT_AS in a child Python, 1 GiB above what it maps: a 3.2 GB float32 batch (a
    float64 broadcast view, which costs nothing until cast) is refused with its size, where
    numpy's cast raised a bare MemoryError (and a SavedModel predict of such a batch segfaulted)."""
    script = textwrap.dedent(f'''
        import resource, sys
        import numpy as np
        sys.path.insert(0, {str(HERE)!r})
        import models
        from pytest_modelparity import load_model
        model = load_model(models.mlp(seed=1))
        with open("/proc/self/status") as fh:
            size = next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.RLIM_INFINITY))
        batch = np.broadcast_to(np.float64(0.5), (50_000_000, 16))
        try:
            model.predict(batch)
            print("RESULT no error")
        except Exception as exc:
            print("RESULT " + type(exc).__name__ + ": " + str(exc).replace("\\n", " | "))
    ''')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), proc.stderr[-2000:])
    assert line.startswith("RESULT BatchMismatchError:"), line
    assert "input 'x' ((50000000, 16), float32) would take 3.0 GiB" in line and "memory available" in line, line
