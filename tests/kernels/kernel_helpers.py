"""Helpers of the kernel tests (a module name of their own: several test folders have a
``conftest``, and ``from conftest import`` picks whichever was imported first)."""

from __future__ import annotations

import torch

HAS_CUDA = torch.cuda.is_available()

# Per-dtype tolerances (atol, rtol) for outputs stored in the input dtype; the LSE is fp32 but
# its scores come from low-precision q and k.
TOLERANCES = {
    torch.float32: {"o": (2e-5, 2e-5), "lse": (2e-5, 2e-5)},
    torch.float16: {"o": (4e-3, 4e-3), "lse": (2e-3, 2e-3)},
    torch.bfloat16: {"o": (3e-2, 3e-2), "lse": (2e-2, 2e-2)},
}


def case_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a case written for the CPU interpreter runs in here: fp32 is a CPU-interpreter
    dtype, so on the GPU such a case runs in fp16."""
    return torch.float16 if HAS_CUDA and dtype == torch.float32 else dtype


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, kind: str):
    """``torch.testing.assert_close`` at the tolerance of ``dtype`` for ``kind`` (``o`` or
    ``lse``); NaN never passes, and the message adds the mean absolute difference."""
    atol, rtol = TOLERANCES[dtype][kind]
    a, e = actual.float(), expected.float()
    finite = torch.isfinite(a) & torch.isfinite(e)
    mean_diff = (a - e)[finite].abs().mean().item() if bool(finite.any()) else 0.0
    torch.testing.assert_close(
        a, e, atol=atol, rtol=rtol, msg=lambda m: f"{kind}: {m}\nmean abs diff: {mean_diff:.3g}"
    )
