"""Exporting where nothing can be written is the package's ``ExportError`` naming the path,
the format and the fix, never a raw ``PermissionError`` / TensorFlow ``PermissionDeniedError``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("tensorflow", reason="exporting needs TensorFlow: pip install 'pytest-modelparity[tensorflow]'")

from pytest_modelparity import ExportError, ModelLoadError, export_model  # noqa: E402
from pytest_modelparity.formats import missing_runtime  # noqa: E402

from models import mlp  # noqa: E402

TARGETS = (("keras", "m.keras"), ("h5", "m.h5"), ("saved_model", "sm"), ("graphdef", "g.pb"),
           ("tflite", "m.tflite"), ("onnx", "m.onnx"), ("tfjs", "tfjs"))


def _exportable() -> list[tuple[str, str]]:
    return [(f, n) for f, n in TARGETS if missing_runtime(f, export=True) is None]


def test_export_under_a_file_names_the_path_format_and_fix(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a directory")
    model = mlp()
    for fmt, name in _exportable():
        target = tmp_path / "afile" / name
        with pytest.raises(ExportError) as err:
            export_model(model, fmt, target)
        text = str(err.value)
        assert str(target) in text and f"format {fmt!r}" in text, text
        assert "fix: a part of" in text and "is a file, not a directory" in text, text
        assert isinstance(err.value, ModelLoadError) and err.value.action == "export"
        assert isinstance(err.value.__cause__, Exception)
    assert (tmp_path / "afile").read_text() == "not a directory"


_READONLY_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from models import mlp
    from pytest_modelparity import export_model
    out = {}
    model = mlp()
    for fmt, name in json.loads(sys.argv[3]):
        try:
            export_model(model, fmt, Path(sys.argv[1]) / name)
            out[fmt] = ["no error", ""]
        except Exception as exc:
            out[fmt] = [type(exc).__name__, str(exc)]
    print("RESULT" + json.dumps(out))
""")


def test_export_into_a_read_only_directory_is_an_export_error(tmp_path: Path) -> None:
    """Run in a child: as root, directory permissions only bind without CAP_DAC_OVERRIDE,
    which ``setpriv`` drops for the child alone."""
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o555)
    command = [sys.executable, "-c", _READONLY_SCRIPT, str(readonly), str(Path(__file__).parent),
               json.dumps(_exportable())]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root, which ignores directory permissions, and setpriv (util-linux) "
                        "is missing to drop that; install util-linux or run as a normal user")
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--", *command]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    finally:
        readonly.chmod(0o755)
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line is not None, done.stdout[-2000:] + done.stderr[-3000:]
    results = json.loads(line[len("RESULT"):])
    for fmt, (kind, text) in results.items():
        assert kind == "ExportError", (fmt, kind, text)
        assert f"format {fmt!r}" in text and str(readonly) in text, text
        assert "fix: export to a writable directory" in text, text
    assert list(readonly.iterdir()) == []
