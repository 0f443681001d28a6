"""Exceptions of pytest-modelparity.

Kept in one small module with no heavy imports so every layer (formats, comparison,
plugin) can raise and catch them without importing TensorFlow.
"""

from __future__ import annotations

import unittest
from pathlib import Path
from typing import Any, Callable


class ParityError(AssertionError):
    """Two results that should agree do not. ``.report`` holds the structured result.

    The message may be a zero-argument callable: the text (with its "Likely cause"
    diagnosis) is then built on first ``str()``, so a failure that is caught, or a failing
    Hypothesis example that is not the one reported, costs no diagnosis.
    """

    def __init__(self, message: str | Callable[[], str], report: Any = None) -> None:
        self._render: Callable[[], str] | None = None
        if callable(message):
            self._render = message
            super().__init__()
        else:
            super().__init__(message)
        self.report = report

    def __str__(self) -> str:
        if self._render is not None:
            render, self._render = self._render, None
            self.args = (render(),)
        return super().__str__()

    def __repr__(self) -> str:
        if self._render is not None:  # not rendered yet: do not diagnose just to repr
            return f"{type(self).__name__}({getattr(self.report, 'title', '')!r}: failed)"
        return super().__repr__()

    def __reduce__(self) -> Any:
        return (type(self), (str(self), self.report))


class ModelLoadError(Exception):
    """A model file or directory cannot be loaded (or exported) in the given format.

    The message always names the file, the format tried, what was wrong and, when known,
    how to fix it; the original exception is chained as ``__cause__``. ``.not_applicable``:
    the format cannot carry this kind of model at all (a string input on tfjs, a lookup table
    on graphdef/onnx), rather than this file being broken; the plugin then skips that format
    in its default matrix, as it does a format the source cannot be converted to.
    """

    def __init__(self, path: str | Path | None, format: str | None, problem: str,
                 fix: str | None = None, *, action: str = "load", not_applicable: bool = False) -> None:
        self.not_applicable = not_applicable
        self.path = None if path is None else str(path)
        self.format = format
        self.problem = problem
        self.fix = fix
        self.action = action  # "load", "export" (writing ``path``) or "convert" (reading it)
        where = f"{self.path!r}" if self.path is not None else "the model"
        if action == "export":
            text = "cannot export the model" + (f" to {where}" if self.path is not None else "") + (
                f" as format {format!r}" if format else "")
        else:
            text = f"cannot {action} {where}" + (f" as format {format!r}" if format else "")
        text += f": {problem}"
        if fix:
            text += f"\n  fix: {fix}"
        super().__init__(text)


class RuntimeMissing(ImportError):
    """An optional runtime (TensorFlow, LiteRT, onnxruntime, Node.js, tfjs) is not installed.

    ``.install`` says how to get it; the plugin turns this into a skip (or a failure
    under ``--modelparity-strict``).
    """

    def __init__(self, what: str, install: str) -> None:
        self.what = what
        self.install = install
        super().__init__(f"{what} is not available; install it with: {install}")


class DeviceUnavailable(RuntimeError):
    """The requested device (e.g. ``gpu``) does not exist on this machine or for this format."""


class BatchMismatchError(ValueError):
    """A batch does not fit the model's inputs (names, rank, dtype kind or fixed dims)."""


class ExportError(ModelLoadError):
    """An export did not produce a working file: writing it failed (read-only or missing
    directory, disk full...; the ``OSError`` is the ``__cause__``), the converter failed, or
    what it wrote does not load or run in the format's own runtime (such a file is never
    returned nor cached). A ``ModelLoadError`` with ``action="export"``.

    ``.unsupported_ops`` lists the ops the converter or runtime lacks, ``.advice`` is the
    converter's own suggestion in one line, ``.log_path`` the file holding the converter's
    full log (kept out of the terminal), ``.route`` how the export was attempted.
    """

    def __init__(self, path: str | Path | None, format: str | None, problem: str, fix: str | None = None, *,
                 unsupported_ops: tuple[str, ...] | list[str] = (), advice: str | None = None,
                 log_path: str | Path | None = None, route: str | None = None,
                 not_applicable: bool = False) -> None:
        self.unsupported_ops = tuple(unsupported_ops)
        self.advice = advice
        self.log_path = None if log_path is None else str(log_path)
        self.route = route
        if self.unsupported_ops:
            problem += f"; unsupported ops: {', '.join(self.unsupported_ops)}"
        if advice:
            problem += f"; the converter suggests: {advice}"
        super().__init__(path, format, problem, fix, action="export", not_applicable=not_applicable)
        if self.log_path:
            self.args = (f"{self.args[0]}\n  converter log: {self.log_path}",)


class NotSerializable(ExportError):
    """The model cannot be written in this format at all, whatever the converter: a subclassed
    model whose class Keras cannot rebuild has no ``.keras``/``.h5`` form. Not a broken export
    but one this source cannot have: the plugin skips the format unless the user named it."""


class NotApplicable(unittest.SkipTest):
    """A check that cannot say anything about this model, so it neither passes nor fails:
    ``assert_batch_invariant`` on a file that runs every batch one row at a time (an LSTM's
    TFLite export at a fixed batch of 1) compares that computation with itself. A
    ``unittest.SkipTest``: pytest and unittest report it as a skip with its reason."""


class InvalidArgumentError(ValueError):
    """An argument has a value it cannot take: a negative, NaN or non-numeric rtol/atol, a
    batch size below 1, an empty batch. Raised by ``validators`` for every such mistake,
    wherever it is made (assertion arguments, markers, strategies); the plugin turns the
    same mistake in an ini key or option into ``pytest.UsageError``."""


class DatasetMismatch(InvalidArgumentError):
    """Real rows (``modelparity_dataset``, ``--modelparity-data``) that do not fit the model:
    array names that match no input, or a shape of another model. Its text is the whole
    story (the names in the file, the model's inputs, the fix), so the plugin shows it alone,
    without the traceback through the fixtures that read the rows."""


class InconclusiveVerdict(UserWarning):
    """A quantised decision whose rows proved it neither within nor beyond its budget, at the
    cap of rows or with no more rows to be had (``checks/quant_rows.py``): not a pass. ``--modelparity-strict`` makes
    it a failure; the plugin's end-of-run summary counts them."""
