"""Programmatic dependent launch (PDL, compute capability 9.0 and later) for a chain of
dependent launches: a launch made with ``launch_pdl=True`` may start while the launch before it
on the stream still runs, do its prologue (index math, loads of inputs that launch does not
write), and then wait for it (``pdl_gate``: ``griddepcontrol.wait``, which returns once the
previous grid has finished and its stores are visible). ``pdl_gate`` also lets the next launch
start (``griddepcontrol.launch_dependents``): its programs may take free SM slots while this
one runs.

The kernels that take a ``PDL`` constexpr keep two rules (``pdl_gate``) which make any chain of
them safe; both instructions are no-ops in a launch made without PDL, so those kernels are
correct launched either way. ``LaunchChain`` hands a call's launches their keyword arguments.
The interpreter runs launches one after another: there ``pdl_gate`` is a no-op.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

try:  # Triton 3.3 and later
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_GDC = True
except ImportError:  # pragma: no cover - older Triton
    HAS_GDC = False


@triton.jit
def _probe():
    pass


# ``triton.jit`` gives interpreted functions when TRITON_INTERPRET is set as kernels are decorated.
INTERPRETED = not isinstance(_probe, triton.runtime.jit.JITFunction)

if HAS_GDC and not INTERPRETED:

    @triton.jit
    def pdl_gate(PDL: tl.constexpr):
        """With ``PDL``: wait until the previous launch has finished and its stores are
        visible, then let the next launch start.

        The kernels with a ``PDL`` constexpr keep two rules, which make any chain of them safe:

        - before ``pdl_gate`` a program stores nothing and loads only what was written before
          the previous launch began (the caching allocator may hand the previous launch's freed
          memory to this one, and the previous launch may still be writing);
        - the next launch is let go only after the wait, so when a launch starts every launch
          but the one before it has finished: its prologue may read their outputs.

        A program that neither loads what the previous launch wrote nor stores anything may
        return without waiting; every kernel has programs that store, so a launch still
        finishes only after the one before it.
        """
        if PDL:
            gdc_wait()
            gdc_launch_dependents()

else:

    @triton.jit
    def pdl_gate(PDL: tl.constexpr):
        """Launches run one after another here: nothing to wait for, and the kernels' ``PDL``
        variants run as on the GPU."""
        pass


def check_pdl(device: torch.device) -> None:
    """Raise ``ValueError`` unless launches on ``device`` can be programmatic dependents: a
    GPU of compute capability 9.0 or later with a Triton that has the instructions, or the
    interpreter."""
    device = torch.device(device)
    if INTERPRETED:
        return
    if not HAS_GDC:
        raise ValueError(
            f"pdl needs triton.language.extra.cuda.gdc_wait (Triton {triton.__version__})"
        )
    if device.type != "cuda":
        raise ValueError(f"pdl needs a CUDA device, got {device}")
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        raise ValueError(f"pdl needs compute capability >= 9.0, got {major}.{minor}")


class LaunchChain:
    """The launches of one call, in stream order, with PDL (``pdl``) or without.

    ``meta()`` gives the next launch its keyword arguments: the kernels' ``PDL`` constexpr and,
    under PDL for every launch but the first, ``launch_pdl``: the first launch of a call is an
    ordinary one, since it follows work it knows nothing about. A call makes one chain and
    passes it to every step it launches; a step given none makes its own (its first launch then
    waits for whatever came before it). ``lane`` is the arrival-counter lane of the chain's
    launches (``kernels.arrivals.arrival_counters``): 0 for a call's own stream, another for
    each chain the call forks onto a side stream, whose launches may run beside the others."""

    __slots__ = ("pdl", "lane", "_launched")

    def __init__(self, pdl: bool = False, lane: int = 0) -> None:
        if lane < 0:
            raise ValueError(f"lane must be >= 0, got {lane}")
        self.pdl = bool(pdl)
        self.lane = lane
        self._launched = False

    def meta(self) -> dict:
        out = {"PDL": self.pdl}
        if self.pdl and self._launched and not INTERPRETED:
            out["launch_pdl"] = True
        self._launched = True
        return out

    @contextlib.contextmanager
    def attempt(self):
        """A launch that may fail before it runs (a kernel that does not fit the SM, retried at
        another shape): on an error the chain is as it was, so the retry is still its first
        launch where this one would have been."""
        launched = self._launched
        try:
            yield
        except BaseException:
            self._launched = launched
            raise


def chain_for(chain: LaunchChain | None, pdl: bool = False) -> LaunchChain:
    """``chain``, or a new one (``pdl``) for a step called on its own."""
    return chain if chain is not None else LaunchChain(pdl)
