"""The README's "Installing into your project" commands match the package: the plugin is not on
PyPI, so the docs give a checkout, a git URL and a wheel; every extra they name exists, the wheel
name they print is the one this pyproject builds, the wheel carries the TFJS runner, and no
install hint the plugin prints sends a user to ``pip install 'pytest-modelparity[...]'``."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _install_section() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("## Installing into your project", 1)[1].split("\n## ", 1)[0]


def test_the_readme_installs_from_a_checkout_a_git_url_and_a_wheel():
    text = _install_section()
    assert "not on PyPI" in text
    assert re.search(r"pip install '/path/to/pytest-modelparity\[all\]'", text)
    # pinned to a commit: the repository has no release tags (tests/test_doc_links.py checks any tag named)
    assert re.search(r"pytest-modelparity\[all\] @ git\+https://\S+@COMMIT'", text)
    name = PROJECT["project"]["name"].replace("-", "_")
    wheel = f"{name}-{PROJECT['project']['version']}-py3-none-any.whl"
    assert "pip wheel --no-deps -w dist" in text and f"dist/{wheel}[all]" in text


def test_every_extra_the_docs_name_exists():
    extras = set(PROJECT["project"]["optional-dependencies"])
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for found in re.findall(r"pytest-modelparity\[([\w,]+)\]", page.read_text()):
            assert set(found.split(",")) <= extras, (page.name, found)
        for found in re.findall(r"`\[([a-z,]+)\]`", page.read_text()):
            if set(found.split(",")) & extras:
                assert set(found.split(",")) <= extras, (page.name, found)


def test_a_built_wheel_registers_the_plugin_and_carries_the_tfjs_runner(tmp_path):
    """Built for real (the layout moved the runner to runtime/tfjs_runner/: a package-data glob
    left behind would ship a wheel whose tfjs format cannot start)."""
    import subprocess
    import sys
    import zipfile

    assert PROJECT["project"]["entry-points"]["pytest11"] == {"modelparity": "pytest_modelparity.plugin"}
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("pytest_modelparity-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("package.json", "package-lock.json", "runner.js", "protocol.js", "__init__.py", "__main__.py"):
        assert f"pytest_modelparity/runtime/tfjs_runner/{needed}" in names, needed
    assert "pytest_modelparity/tfjs_runner/__main__.py" in names  # python -m pytest_modelparity.tfjs_runner
    for folder in ("plugin", "checks", "verdict", "reports", "exports", "runtime", "formats", "diagnose"):
        assert f"pytest_modelparity/{folder}/__init__.py" in names, folder
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "modelparity = pytest_modelparity.plugin" in zipfile.ZipFile(wheel).read(entry).decode()


def test_install_hints_name_packages_pip_can_find():
    from pytest_modelparity.formats import common
    from pytest_modelparity.formats.tfjs import TFJS_CONVERTER_INSTALL

    for hint in (common.TF_INSTALL, common.TFLITE_INSTALL, common.ONNX_INSTALL, TFJS_CONVERTER_INSTALL):
        assert "pytest-modelparity[" not in hint and hint.startswith("pip install "), hint
