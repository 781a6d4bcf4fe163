"""How the engine runs the decoder's element-wise ops, and which way a measured run ran them:
the implementations the cost model prices (``ELEMENTWISE``), the one each engine backend runs,
and the one a measured document's provenance implies (its backend, else when it was measured).
"""

from __future__ import annotations

# How the engine runs the decoder's element-wise ops (norms, residual adds, rotary, the KV store,
# SiLU-and-multiply): ``fused``, the Triton kernels of its ``triton`` backend (the default on a
# GPU); ``torch``, plain torch ops (its ``torch`` backend, the CPU's). ``perfmodel.ops`` prices
# each with its own ops, and the round's acceptance step (``perfmodel.accept_ops``) with the
# backend's: ``fused``, two launches of ``kernels.accept_commit``; ``torch``, batched torch ops.
# ``fused`` chains the residual adds, the norms inside the layers and SiLU-and-multiply into the
# projections' launches where every projection streams its weight (``linear_rule``).
# ``fused_torch_accept`` is the triton backend before its acceptance step ran as kernels
# (``FUSED_ACCEPT_SINCE``): fused element-wise ops, the acceptance step in torch ops;
# ``fused_unchained`` the triton backend after that and before it chained its norms
# (``CHAINED_NORMS_SINCE``); the documents measured then are priced with them.
ELEMENTWISE = ("fused", "torch", "fused_torch_accept", "fused_unchained")
BACKEND_ELEMENTWISE = {"triton": "fused", "torch": "torch"}
# When the triton backend began running the element-wise ops as fused kernels (commit cdc7fc1);
# before, both backends ran them in torch. Measured documents name their backend since.
FUSED_ELEMENTWISE_SINCE = "2026-11-26T12:44:18+00:00"
# When the triton backend's acceptance step became ``kernels.accept_commit``'s two launches.
FUSED_ACCEPT_SINCE = "2026-11-30T04:35:00+00:00"
# When the triton backend began chaining its norms into its projections (commit 8054ffc).
CHAINED_NORMS_SINCE = "2026-12-04T01:50:40+00:00"


def fused_elementwise(elementwise: str) -> float:
    """1.0 where the element-wise ops run fused (``fused``, ``fused_torch_accept``), 0.0 for
    torch's (``ELEMENTWISE``)."""
    if elementwise not in ELEMENTWISE:
        raise ValueError(
            f"elementwise must be one of {', '.join(ELEMENTWISE)}, got {elementwise!r}"
        )
    return float(elementwise != "torch")


def chains_norms(elementwise: str) -> float:
    """1.0 where the implementation chains its norms into its projections wherever they stream
    their weights (``fused``), 0.0 elsewhere (``ELEMENTWISE``)."""
    fused_elementwise(elementwise)  # validates it
    return float(elementwise == "fused")


def fused_accept(elementwise: str) -> float:
    """1.0 where the acceptance step runs as ``kernels.accept_commit`` (``fused``), 0.0 where
    it runs in torch ops (``ELEMENTWISE``)."""
    fused_elementwise(elementwise)  # validates it
    return float(elementwise in ("fused", "fused_unchained"))


def elementwise_of_backend(backend: str) -> str:
    """The element-wise implementation (``ELEMENTWISE``) an engine backend runs."""
    if backend not in BACKEND_ELEMENTWISE:
        raise ValueError(
            f"backend must be one of {', '.join(BACKEND_ELEMENTWISE)}, got {backend!r}"
        )
    return BACKEND_ELEMENTWISE[backend]


def elementwise_of_run(provenance: dict) -> str:
    """The element-wise implementation of the engine run a measured document's ``provenance``
    records: its ``backend``'s; without one, the CPU's torch backend on the CPU, and on a GPU
    (the triton backend) fused from ``FUSED_ELEMENTWISE_SINCE`` on, torch before (its
    ``timestamp``, ISO 8601 UTC). A fused run before ``FUSED_ACCEPT_SINCE`` ran the acceptance
    step in torch ops (``fused_torch_accept``), one before ``CHAINED_NORMS_SINCE`` did not chain
    its norms into its projections (``fused_unchained``)."""
    stamp = provenance.get("timestamp")
    if "backend" in provenance:
        kind = elementwise_of_backend(provenance["backend"])
    elif provenance.get("device_name") == "cpu":
        return "torch"
    elif not isinstance(stamp, str):
        raise ValueError(f"provenance names no backend and no timestamp: {provenance!r}")
    else:
        kind = "fused" if stamp >= FUSED_ELEMENTWISE_SINCE else "torch"
    if kind == "fused" and isinstance(stamp, str) and stamp < FUSED_ACCEPT_SINCE:
        return "fused_torch_accept"
    if kind == "fused" and isinstance(stamp, str) and stamp < CHAINED_NORMS_SINCE:
        return "fused_unchained"
    return kind
