"""pytest-modelparity: prove a TensorFlow model and its exported forms agree.

Public API only. Names resolve lazily so ``import pytest_modelparity`` stays cheap and never
imports TensorFlow; the runtimes are imported by the formats when a model is loaded.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "load_model": "formats",
    "export_model": "formats",
    "FORMATS": "formats",
    "ALL_FORMATS": "formats",
    "LoadedModel": "formats.base",
    "TensorSpec": "formats.base",
    "assert_outputs_close": "assertions",
    "assert_deterministic": "assertions",
    "assert_batch_invariant": "assertions",
    "ComparisonReport": "compare",
    "default_tolerance": "tolerances",
    "Tolerance": "tolerances",
    "ParityError": "errors",
    "ModelLoadError": "errors",
    "ExportError": "errors",
    "InvalidArgumentError": "errors",
    "RuntimeMissing": "errors",
    "DeviceUnavailable": "errors",
    "BatchMismatchError": "errors",
    "NotApplicable": "errors",
    "localize_divergence": "diagnose",
    "strategies": None,
}

# ``compare`` is both a submodule and the public function: bind the function eagerly (numpy
# only, cheap) so importing the submodule elsewhere can never shadow it with the module.
from .compare import compare  # noqa: E402,F401 - the public function, bound eagerly

__all__ = sorted([*_EXPORTS, "compare"])


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pytest_modelparity' has no attribute {name!r}")
    module = _EXPORTS[name]
    if module is None:
        value: Any = importlib.import_module(f"{__name__}.{name}")
    else:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
