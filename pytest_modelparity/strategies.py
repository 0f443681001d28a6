"""Hypothesis strategies, public: ``from pytest_modelparity.strategies import batches, models``.

Batches that fit a model's inputs live with the checks (``checks/strategies.py``); generated
models live with the fuzzing (``fuzz/model_draw.py``). This module only gathers them.
"""

from __future__ import annotations

from .checks.strategies import (PROFILE, Batch, batches, dataset_batches, fixed_batch, register_profile,
                                seeded_batch, specs_of)
from .fuzz.model_draw import DrawnModel, models

__all__ = ["Batch", "batches", "dataset_batches", "models", "DrawnModel", "fixed_batch", "specs_of", "seeded_batch",
           "PROFILE", "register_profile"]
