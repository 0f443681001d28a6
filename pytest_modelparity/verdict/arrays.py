"""One leaf as a numpy array, whatever array library made it.

numpy arrays pass through; a TensorFlow tensor has ``.numpy()``; a PyTorch tensor (or
``torch.nn.Parameter``) is recognised by duck typing on ``.detach()``, so torch is never
imported: a tensor that requires grad, lives on a GPU, is a conjugate/negative view or is
bfloat16 would make ``np.asarray`` raise torch's own ``RuntimeError``/``TypeError``, so it is
detached, moved to the CPU and resolved first. numpy only.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["as_numpy", "is_torch_like"]


def is_torch_like(x: Any) -> bool:
    """A PyTorch tensor or Parameter (anything with ``.detach()``, ``.cpu()`` and ``.numpy()``)."""
    return all(callable(getattr(x, name, None)) for name in ("detach", "cpu", "numpy"))


def as_numpy(x: Any) -> Any:
    """``x`` as a numpy array (numpy scalars and arrays unchanged)."""
    if isinstance(x, (np.ndarray, np.generic)):
        return x
    if is_torch_like(x):
        return _torch_to_numpy(x)
    numpy = getattr(x, "numpy", None)
    if callable(numpy):
        try:
            return np.asarray(numpy())
        except Exception:  # noqa: BLE001 - fall back to the array protocol
            pass
    return np.asarray(x)


def _torch_to_numpy(t: Any) -> np.ndarray:
    """detach -> cpu -> resolve conj/neg views -> numpy; bfloat16 through ml_dtypes."""
    t = t.detach().cpu()
    for resolve in ("resolve_conj", "resolve_neg"):
        fn = getattr(t, resolve, None)
        if callable(fn):
            t = fn()
    dtype = str(getattr(t, "dtype", ""))
    if dtype == "torch.bfloat16":
        import ml_dtypes  # installed with TensorFlow; numpy has no bfloat16 of its own

        int16 = t.view(_torch_int16(t))
        return np.asarray(int16.numpy()).view(ml_dtypes.bfloat16)
    try:
        return np.asarray(t.numpy())
    except (TypeError, RuntimeError) as exc:
        raise TypeError(f"cannot read a torch tensor of dtype {dtype} as a numpy array ({exc}); "
                        "convert it first, e.g. tensor.float()") from None


def _torch_int16(t: Any) -> Any:
    """torch.int16, reached through the tensor's own module (torch is not imported here)."""
    return sys.modules[type(t).__module__.split(".")[0]].int16
