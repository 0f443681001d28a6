"""Zero-code mode: ``pytest --modelparity-model=SOURCE`` runs a built-in parity suite.

No test file: the plugin appends these items during collection, one per check x format x
device, so ``-k``, ``-x``, ``--lf`` and pytest-xdist treat them like any other test. The
checks are the three ways parity breaks: the exported form disagrees with the source on
Hypothesis-drawn batches, it is not deterministic, or it depends on the batch size.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import pytest

from ..errors import ModelLoadError, ParityError
from .session import BATCH_SEED, IMPORT_FIX, ExportFailed, NotExportable, ParitySession, get_state
from .matrix import matrix_pairs, select_matrix

CHECKS = ("outputs_close", "deterministic", "batch_invariant")
SUITE_NODEID = "modelparity"
HYPOTHESIS_EXAMPLES = 10
MAX_BATCH = 8


class ParitySuite(pytest.Collector):
    """The parent node of the built-in checks (its items are made by ``suite_items``)."""

    def collect(self) -> list[pytest.Item]:
        return []


class ParityCheck(pytest.Item):
    """One built-in check of the source against one format on one device."""

    def __init__(self, *, check: str, format: str, device: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check
        self.modelparity_matrix = (format, device)

    def runtest(self) -> None:
        state = get_state(self.config)
        fmt, device = self.modelparity_matrix
        source = state.options.model
        # The candidate first: its reason is the specific one ("TFLite runs on CPU only").
        explain = lambda exc: str(zero_code_error(exc))  # noqa: E731
        candidate = state.candidate_or_skip(source, fmt, device, named=state.options.format_named(fmt),
                                            explain=explain, elements=state.options.input_range,
                                            dataset=state.options.data)
        reference = state.reference_or_skip(source, state.reference_device(device), explain=explain)
        itself = state.candidate_itself(source, fmt, device)
        if itself is not None and self.check == "outputs_close":  # the file against itself: no comparison
            from .not_compared import self_comparison_reason

            pytest.skip(self_comparison_reason(fmt, device, itself))
        from ..checks import quant_rows, quantized

        if quantized.variant_of(candidate) is not None:  # a decision over rows draws the rows it needs
            candidate.judging_rows = quant_rows.JudgingRows(lambda: reference, state.options.data,
                                                            state.options.input_range)
        getattr(self, f"_{self.check}")(reference, candidate)

    @property
    def _elements(self) -> Any:
        """``--modelparity-input-range``: the values the batches are drawn from."""
        return get_state(self.config).options.input_range

    def _outputs_close(self, reference: Any, candidate: Any) -> None:
        from hypothesis import given, settings
        from hypothesis import strategies as st

        from ..checks.assertions import assert_outputs_close
        from ..checks.strategies import PROFILE, batches, dataset_batches

        data = get_state(self.config).options.data  # --modelparity-data: real rows, not random ones
        drawn = (dataset_batches(reference, data, batch_size=st.integers(1, MAX_BATCH)) if data
                 else batches(reference, batch_size=st.integers(1, MAX_BATCH), elements=self._elements))

        @settings(settings.get_profile(PROFILE), max_examples=HYPOTHESIS_EXAMPLES, database=None)
        @given(batch=drawn)
        def outputs_close(batch: Any) -> None:
            assert_outputs_close(candidate, reference, inputs=batch)

        outputs_close()

    def _deterministic(self, reference: Any, candidate: Any) -> None:
        from ..checks.assertions import assert_deterministic
        from ..checks.strategies import seeded_batch

        assert_deterministic(candidate, seeded_batch(reference, batch_size=4, seed=BATCH_SEED, elements=self._elements))

    def _batch_invariant(self, reference: Any, candidate: Any) -> None:
        from ..checks.assertions import assert_batch_invariant
        from ..checks.strategies import fixed_batch, seeded_batch

        fixed = fixed_batch(reference.inputs) or fixed_batch(candidate.inputs)
        if fixed is not None:
            pytest.skip(f"the model was built for a fixed batch of {fixed}: it runs no other batch size, so "
                        "batch invariance cannot be checked; build it with batch_size=None to check it")
        assert_batch_invariant(candidate, seeded_batch(reference, batch_size=MAX_BATCH, seed=BATCH_SEED,
                                                       elements=self._elements),
                               batch_sizes=(1,))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        exc = excinfo.value
        if isinstance(exc, (ParityError, NotExportable, ExportFailed, ModelLoadError)):
            notes = "\n".join(getattr(exc, "__notes__", []) or [])
            return f"{exc}\n{notes}".rstrip()
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        fmt, device = self.modelparity_matrix
        state = get_state(self.config)
        return self.path, None, f"modelparity {self.check} [{fmt}-{state.matrix_id(device)}]"


def zero_code_error(exc: BaseException) -> BaseException:
    """The same error with a fix this mode can follow: it has no ``load_model`` call to pass
    ``inputs=``/``outputs=`` to, so name the fixture that can."""
    if not isinstance(exc, ModelLoadError) or not exc.fix or "to load_model" not in exc.fix:
        return exc
    what = exc.fix.split(" to load_model")[0].removeprefix("pass ")
    fix = (f"--modelparity-model cannot pass load options: write a test using the parity_reference / "
           f"parity_candidate fixtures and override the session fixture modelparity_load_options in "
           f"conftest.py to return the option ({what}); see docs/plugin.md")
    return ModelLoadError(exc.path, exc.format, exc.problem, fix, action=exc.action)


MODEL_SUFFIXES = (".keras", ".h5", ".hdf5", ".pb", ".tflite", ".onnx", ".json")


def check_source(text: str, cwd: Path) -> None:
    """A ``--modelparity-model`` that cannot be a source is one usage error (exit 4) at
    start-up, naming the path, the directory relative paths start from and a near miss,
    instead of the same failure in every one of the suite's items."""
    if text == "demo":
        return
    path = Path(text).expanduser()
    full = path if path.is_absolute() else cwd / path
    if full.exists() or Path(str(full) + ".index").exists() or Path(str(full) + ".meta").exists():
        return  # a path (a TF1 checkpoint prefix too): the format checks follow at load
    if ":" in text and not text.startswith(("/", ".")) and not re.match(r"^[A-Za-z]:[\\/]", text):
        module_name = text.partition(":")[0]
        try:
            found = importlib.util.find_spec(module_name)
        except (ImportError, ValueError):
            found = None
        except Exception:  # noqa: BLE001 - its package fails to import: the item says how, at run time
            return
        if found is None:
            raise pytest.UsageError(
                f"--modelparity-model={text}: module {module_name!r} cannot be imported (working directory "
                f"{cwd}).\n  fix: {IMPORT_FIX}")
        return
    near = _near_misses(text, full)
    raise pytest.UsageError(
        f"--modelparity-model={text}: {str(full)!r} does not exist (relative paths start from the directory "
        f"pytest was started in: {cwd}){near}.\n  fix: pass a model file or directory (.keras, .h5, "
        "SavedModel directory, frozen .pb, .tflite, TFJS model.json, .onnx), module:factory, or 'demo'")


def _near_misses(text: str, full: Path) -> str:
    """`` (did you mean 'demo'?)`` from 'demo' and the names in the folder the path points into."""
    where = os.path.dirname(text)
    choices = [] if where else ["demo"]
    with contextlib.suppress(OSError):
        choices += [p.name for p in full.parent.iterdir() if p.is_dir() or p.suffix in MODEL_SUFFIXES]
    close = difflib.get_close_matches(full.name, choices, n=3, cutoff=0.6)
    if not close:
        return ""
    shown = ", ".join(repr(c if c == "demo" and not where else os.path.join(where, c)) for c in close)
    return f" (did you mean {shown}?)"


def suite_items(session: pytest.Session, state: ParitySession) -> list[ParityCheck]:
    """The built-in checks for every selected format x device, in a stable order (xdist)."""
    formats, devices = select_matrix(state, None, "--modelparity-model")
    pairs = matrix_pairs(state, formats, devices)
    suite = ParitySuite.from_parent(session, name=SUITE_NODEID, path=session.path, nodeid=SUITE_NODEID)
    items = []
    for check in CHECKS:
        for fmt, device in pairs:
            items.append(ParityCheck.from_parent(suite, name=f"test_{check}[{fmt}-{state.matrix_id(device)}]",
                                                 check=check, format=fmt, device=device))
    return items
