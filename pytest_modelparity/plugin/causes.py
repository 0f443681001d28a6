"""Causes: what makes two failures one (shown in full once per session, then in one line), and
whether an export failed for a reason of the model itself (then a default-matrix format is not
applicable to it, NOT COMPARED, rather than an error).

Why a module of its own: the session words the failures, the report hook counts them, and
``not_compared`` reads which tests checked a candidate; none of that needs the others. Nothing
here imports TensorFlow.
"""

from __future__ import annotations

import re

from ..errors import ExportError, ModelLoadError, NotSerializable

__all__ = ["CHECKED", "cause_head", "cause_key", "model_reason"]

# The outcomes of a test whose check ran on its candidate: the format was exported and compared.
CHECKED = ("passed", "failed", "xfailed", "xpassed")


# Paths of one export attempt (a temp folder per try) that differ between two tests failing alike.
_TEMP_PART = re.compile(r"/\.[0-9a-f]{8,}\.tmp-[^/'\s]*|/tmp[^'\s]*/(?=[^/'\s]+['\s])|converter log: \S+")


def cause_key(exc: BaseException) -> str:
    """What makes two failures one cause: the error's type, format and problem (and fix), without
    the temp paths of each attempt."""
    if isinstance(exc, ModelLoadError):
        text = f"{exc.format}|{exc.action}|{exc.problem}|{exc.fix}"
    else:
        text = str(exc)
    return f"{type(exc).__name__}|{_TEMP_PART.sub('', text)}"


def cause_head(exc: BaseException, text: str) -> str:
    """The first line of a failure's text, cut short: what the one-line repeats say."""
    head = next((ln for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return head if len(head) <= 200 else head[:197] + "..."


def model_reason(exc: BaseException) -> str | None:
    """Why the model itself cannot become the format, when that is why its export failed: ops the
    converter or runtime has no mapping or kernel for (``unsupported_ops``), or a layer the file
    format cannot carry (Keras' legacy HDF5 loader refusing the file it wrote: an
    ``Embedding(mask_zero=True)``'s ``NotEqual`` layer). None for every other failure (a write
    that failed, a crash, a timeout, a file that does not validate for no named cause): those
    stay errors. Why: a newcomer's text classifier was red on the default matrix for formats it
    cannot have (issue 50); such a format is NOT COMPARED, with this reason."""
    if not isinstance(exc, ExportError) or exc.not_applicable:
        return None
    if exc.unsupported_ops and not isinstance(exc, NotSerializable):
        return exc.problem
    if "cannot carry it" in (exc.fix or "") or "cannot hold" in exc.problem:
        return exc.problem
    return None
