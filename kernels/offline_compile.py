"""Compile a Triton kernel for a GPU without one: the checks of Triton's compiler (its frontend's
type rules, its layouts, register and shared-memory allocation, ``ptxas``) on a machine with no
GPU, where the interpreter runs the kernels and accepts code the compiler rejects (a
``constexpr`` branch that returns tensors of another dtype than the branch beside it, say).

``compile_offline`` needs the kernels imported with ``TRITON_INTERPRET`` unset (the interpreter
replaces ``triton.jit``'s functions when it is set) and the ``ptxas`` Triton ships
(``available``).
"""

from __future__ import annotations

from pathlib import Path

import triton
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

try:
    from triton.backends.compiler import GPUTarget
except ImportError:  # pragma: no cover - older Triton
    GPUTarget = None

# Hopper (the H100 and H200): compute capability 9.0, 32-lane warps.
HOPPER = 90


def available() -> bool:
    """Whether this Triton can compile for an NVIDIA target here: its target type and the
    ``ptxas`` its NVIDIA backend ships."""
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return GPUTarget is not None and ptxas.is_file()


def compile_offline(
    kernel: JITFunction,
    pointers: dict[str, str],
    constexprs: dict,
    *,
    num_warps: int,
    num_stages: int = 3,
    capability: int = HOPPER,
):
    """``kernel`` compiled for an NVIDIA GPU of ``capability``: ``pointers`` maps each pointer
    argument to its Triton type (``"*bf16"``, ``"*i32"``, ...), ``constexprs`` gives every
    ``tl.constexpr`` argument, and every other argument is an ``i32``. Returns Triton's compiled
    kernel (its ``metadata.shared``, ``n_regs`` where the driver is present); raises the
    compiler's error."""
    if not isinstance(kernel, JITFunction):
        raise TypeError(
            f"{getattr(kernel, '__name__', kernel)!r} is not a JIT function: import the kernels "
            "with TRITON_INTERPRET unset"
        )
    unknown = (set(pointers) | set(constexprs)) - set(kernel.arg_names)
    if unknown:
        raise ValueError(f"{kernel.__name__} has no argument {sorted(unknown)[0]!r}")
    signature = {
        name: "constexpr" if name in constexprs else pointers.get(name, "i32")
        for name in kernel.arg_names
    }
    source = ASTSource(kernel, signature, constexprs=dict(constexprs))
    target = GPUTarget("cuda", capability, 32)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    return triton.compile(source, target=target, options=options)
