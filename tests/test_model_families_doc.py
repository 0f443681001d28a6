"""docs/model-families.md is generated, then read by people: its notes must agree with the code
and with the other pages. The string-input row's labels are the exception types the exports
raise now (they said ModelLoadError for ExportErrors), no note prints a converter log path
(docs/formats.md says where logs go; a path from the machine that generated the page is noise),
and no note's fix sends the model to a format its own row marks "not supported" (note 10 once
sent the string model to graphdef, which note 8 refuses)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from families import string_input

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "model-families.md").read_text()
FORMATS = ("keras", "h5", "saved_model", "graphdef", "tflite", "onnx", "tfjs")


def _rows() -> dict[str, dict[str, str]]:
    rows = {}
    for line in PAGE.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == len(FORMATS) + 1 and cells[0] not in ("family", "---"):
            rows[cells[0]] = dict(zip(FORMATS, cells[1:]))
    return rows


def _notes() -> dict[int, tuple[str, str, str, str]]:
    """note number -> (family, format, exception label, fix)."""
    notes = {}
    for number, family, fmt, label, rest in re.findall(r"^(\d+)\. \*\*(.+?) / (\w+)\*\* \((\w+)\): (.*)$", PAGE, re.M):
        fix = rest.split("**Fix:**", 1)[1] if "**Fix:**" in rest else ""
        notes[int(number)] = (family, fmt, label, fix)
    return notes


def test_no_note_prints_a_log_path_from_the_machine_that_generated_it():
    for family, fmt, _, _ in _notes().values():
        assert not re.search(r"/logs/|\.log\b", PAGE.split(f"**{family} / {fmt}**", 1)[1].split("\n", 1)[0])


def test_no_fix_recommends_a_format_its_own_row_does_not_support():
    rows = _rows()
    for number, (family, fmt, _, fix) in _notes().items():
        unsupported = {f for f, cell in rows[family].items() if cell.startswith("not supported")}
        recommended = set(re.findall(r"(?<![\w.-])(keras|saved_model|graphdef|tflite|onnx|tfjs)(?![\w-]|\.\w)",
                                     re.sub(r"\w+ only when[^;]*", "", fix).split("without tables")[0])) - {fmt}
        assert not (recommended & unsupported), (number, recommended & unsupported)


@pytest.mark.usefixtures("_heavy_modules_stay_loaded")
def test_the_string_row_labels_are_the_types_raised(tmp_path):
    from pytest_modelparity import export_model

    labels = {(family, fmt): label for family, fmt, label, _ in _notes().values()}
    model, _ = string_input()
    for fmt, path in (("graphdef", "m.pb"), ("onnx", "m.onnx"), ("tfjs", "web")):
        with pytest.raises(Exception) as info:
            export_model(model, fmt, tmp_path / path)
        assert labels[("string input (StringLookup)", fmt)] == type(info.value).__name__, fmt
