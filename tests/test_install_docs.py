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
    assert re.search(r"pytest-modelparity\[all\] @ git\+https://\S+@v" + re.escape(PROJECT["project"]["version"]), text)
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


def test_a_built_wheel_registers_the_plugin_and_carries_the_tfjs_runner():
    assert PROJECT["project"]["entry-points"]["pytest11"] == {"modelparity": "pytest_modelparity.plugin"}
    data = PROJECT["tool"]["setuptools"]["package-data"]["pytest_modelparity"]
    runner = ROOT / "pytest_modelparity" / "tfjs_runner"
    for needed in ("package.json", "package-lock.json", "runner.js"):
        assert (runner / needed).is_file() and any(Path(f"tfjs_runner/{needed}").match(p) for p in data), needed


def test_install_hints_name_packages_pip_can_find():
    from pytest_modelparity.formats import _common
    from pytest_modelparity.formats.tfjs import TFJS_CONVERTER_INSTALL

    for hint in (_common.TF_INSTALL, _common.TFLITE_INSTALL, _common.ONNX_INSTALL, TFJS_CONVERTER_INSTALL):
        assert "pytest-modelparity[" not in hint and hint.startswith("pip install "), hint
