"""pytest-modelparity: prove a TensorFlow model and its exported forms agree.

Public API only. Names resolve lazily so ``import pytest_modelparity`` stays cheap and never
imports TensorFlow; the runtimes are imported by the formats when a model is loaded.
"""

from __future__ import annotations

import importlib
from typing import Any

from .runtime.resources import one_blas_thread_under_a_limit

one_blas_thread_under_a_limit()  # first, before NumPy and SciPy load their OpenBLAS (see there)

__version__ = "0.1.0"

# public name -> the module (relative to this package) that defines it
_EXPORTS = {
    "load_model": "formats",
    "export_model": "formats",
    "record_outputs": "formats.recorded",
    "write_inputs": "formats.recorded",
    "FORMATS": "formats",
    "ALL_FORMATS": "formats",
    "LoadedModel": "formats.base",
    "TensorSpec": "formats.base",
    "assert_outputs_close": "checks.assertions",
    "assert_deterministic": "checks.assertions",
    "assert_batch_invariant": "checks.assertions",
    "ComparisonReport": "verdict.compare",
    "default_tolerance": "verdict.tolerances",
    "Tolerance": "verdict.tolerances",
    "ParityError": "errors",
    "ModelLoadError": "errors",
    "ExportError": "errors",
    "InvalidArgumentError": "errors",
    "RuntimeMissing": "errors",
    "DeviceUnavailable": "errors",
    "BatchMismatchError": "errors",
    "NotApplicable": "errors",
    "localize_divergence": "diagnose",
    "strategies": "strategies",
}

# ``compare`` is both a submodule and the public function: bind the function eagerly (numpy
# only, cheap) so importing the submodule elsewhere can never shadow it with the module.
from .verdict.compare import compare  # noqa: E402,F401 - the public function, bound eagerly

__all__ = sorted([*_EXPORTS, "compare"])


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pytest_modelparity' has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
    value: Any = module if _EXPORTS[name] == name else getattr(module, name)  # ``strategies`` is a module
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
