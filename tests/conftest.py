"""Settings of the whole test session that keep verdicts off the wall clock and the machine's
load.

CPU thread pools: one thread each, for this process and the processes it starts (notebook
kernels, CLI subprocesses), unless the environment already says otherwise. The tests' models
and arrays are tiny: a second thread gains them nothing, while on a machine whose cores are
busy with other work a pool waits at every operation for its descheduled thread -- the engine's
CPU tests ran about 3x slower with two threads than with one beside a single busy process on a
2-core machine, and up to 70x under heavier load. Set here, before any test module imports
torch or numpy, which read these variables once, at import.

Bare package names: the project's folders are ``ssvkit``'s subpackages, but from a clone the
repository root is on ``sys.path`` too, so ``import validation`` (or ``files("engine")``) would
quietly import a second copy where an installed ssvkit has none. A finder refuses those names.

Triton: without a CUDA GPU the kernels run under Triton's CPU interpreter. ``triton.jit`` reads
``TRITON_INTERPRET`` when a kernel is decorated, so it is set here, before any test module
imports a kernel (after the thread settings, which torch reads at its import). Five of the
interpreter's costs that change no result are cut, each falling back to the interpreter's own
routine wherever its case is not covered: the language patch at every helper call
(``_patch_once_per_launch``), integer arguments wrapped per call (``_wrap_integers_as_compiled``),
bitwise reduces run element by element (``_reduce_bitwise_in_numpy``), the dtype table rebuilt
per operand (``_np_dtypes_once``) and ``tl.sort``'s bitonic network (``_sort_in_numpy``).

Hypothesis: no per-example deadline and no too-slow health check (both time examples on the
wall clock, which a loaded machine stretches); a property that holds passes however long its
examples take.
"""

import importlib.abc
import os
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import ssvkit  # noqa: E402,F401  (pins OpenBLAS's kernels before numpy loads: ssvkit/__init__.py)

# isort: split
import torch  # noqa: E402  (after the thread settings above)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _patch_once_per_launch() -> None:
    """The interpreter patches ``triton.language`` into its interpreted builtins when a launch
    starts (restoring them when it ends) and again at every call of a ``@triton.jit`` helper
    inside the launch, though the launch's patch already covers the helper's language modules:
    an ``inspect.getmembers`` scan of four modules a call, half the time of the NSA tests. Here
    a helper's call inside a launch skips the scan when the launch patched every language
    module the helper sees; anything else patches as before. (The interpreter's private names:
    where a Triton release lacks them, it runs unchanged.)"""
    from triton.runtime import interpreter as interp

    if not all(hasattr(interp, n) for n in ("_patch_lang", "GridExecutor", "_LangPatchScope")):
        return
    patch_lang, run_grid = interp._patch_lang, interp.GridExecutor.__call__
    active: list[set] = []  # per launch in progress: the language modules it patched

    seen_by: dict = {}  # per function: the language modules its globals hold (read once)

    def langs(fn) -> set:
        if fn not in seen_by:
            mods = fn.__globals__.values()
            seen_by[fn] = {id(v) for v in mods if v is interp.tl or v is interp.tl.core}
        return seen_by[fn]

    def patch(fn):
        seen = langs(fn)
        if active and seen <= active[-1]:
            return interp._LangPatchScope()  # nothing to patch, nothing to restore
        scope = patch_lang(fn)
        if active:
            active[-1].update(seen)
        return scope

    def call(self, *args, **kwargs):
        active.append(set())
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            active.pop()

    interp._patch_lang, interp.GridExecutor.__call__ = patch, call


def _wrap_integers_as_compiled() -> None:
    """The interpreter checks every 32-bit integer add, subtract and multiply for overflow (its
    options' ``sanitize_overflow``, in int64 beside the op: a third of an NSA test's time); a
    compiled kernel does not (only under Triton's debug mode). Off here, so the interpreter runs
    the kernels' integer arithmetic as the GPU does; at the tests' shapes no index comes near
    2**31, and under ``kernels.timing.poisoned_allocations`` an unwritten index reads -7."""
    import dataclasses

    from triton.runtime import interpreter as interp

    builder = getattr(interp, "interpreter_builder", None)
    if dataclasses.is_dataclass(getattr(builder, "options", None)):
        if "sanitize_overflow" in {f.name for f in dataclasses.fields(builder.options)}:
            builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


def _reduce_bitwise_in_numpy() -> None:
    """The interpreter runs a ``tl.reduce`` whose combine function it does not know one
    element at a time, a Python call of the combine per element: ``tl.sort``'s XOR sums took
    most of a union test's time. A bitwise OR
    or XOR combine reduces here as numpy's ``bitwise_or`` / ``bitwise_xor`` ``.reduce`` along
    the same axis: the same bits, in one call. (The interpreter's private names: where a
    Triton release lacks them, it runs unchanged.)"""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as interp

    ops = getattr(interp, "ReduceOps", None)
    if ops is None or not all(hasattr(ops, n) for n in ("apply_impl", "to_tensor")):
        return
    ufuncs = {
        getattr(tl.standard, "_or_combine", None): np.bitwise_or,
        getattr(tl.standard, "_xor_combine", None): np.bitwise_xor,
    }
    ufuncs.pop(None, None)
    reduce = ops.apply_impl

    def apply_impl(self, input):
        ufunc = ufuncs.get(self.combine_fn)
        if ufunc is None or len(input) != 1:
            return reduce(self, input)
        (x,) = input
        data = ufunc.reduce(x.handle.data, axis=self.axis, keepdims=self.keep_dims)
        return self.to_tensor(data, x.dtype)

    ops.apply_impl = apply_impl


def _np_dtypes_once() -> None:
    """The interpreter maps a Triton dtype to its numpy dtype by building the whole table at
    every call (on every operand of every op); here each dtype's answer is kept after its first
    call. (Where a Triton release lacks the private name, it runs unchanged.)"""
    from triton.runtime import interpreter as interp

    table = getattr(interp, "_get_np_dtype", None)
    if table is None:
        return
    known: dict = {}

    def np_dtype(tt_dtype):
        try:
            return known[tt_dtype]
        except KeyError:
            known[tt_dtype] = got = table(tt_dtype)
            return got
        except TypeError:  # not hashable: asked afresh
            return table(tt_dtype)

    interp._get_np_dtype = np_dtype


def _sort_in_numpy() -> None:
    """The interpreter runs ``tl.sort`` as its bitonic network of interpreted ops (a sixth of the
    selection tests' time). A sort of integers, or of fp16 / fp32 / fp64 values with no NaN and
    no zero (whose signed zeros the network may order either way), along the last dimension
    runs here as ``np.sort``: a sort of values has one answer. Anything else runs the network.
    (The interpreter's private names: where a Triton release lacks them, it runs unchanged.)"""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as interp

    kind = getattr(interp, "InterpretedFunction", None)
    network = getattr(getattr(tl.standard, "sort", None), "fn", None)
    if kind is None or network is None or not hasattr(interp, "TensorHandle"):
        return
    call = kind.__call__
    floats = (tl.float16, tl.float32, tl.float64)
    unwrap = tl.core._unwrap_if_constexpr

    def sorted_in_numpy(x, dim=None, descending=False):
        dim, descending = unwrap(dim), bool(unwrap(descending))
        data = getattr(getattr(x, "handle", None), "data", None)
        if not isinstance(data, np.ndarray) or dim not in (None, -1, data.ndim - 1):
            return None
        if x.dtype in floats:
            if np.isnan(data).any() or (data == 0).any():
                return None
        elif not x.dtype.is_int():
            return None
        out = np.sort(data, axis=-1)
        out = np.ascontiguousarray(out[..., ::-1] if descending else out)
        return tl.core.tensor(interp.TensorHandle(out, x.handle.dtype), x.type)

    def __call__(self, *args, **kwargs):
        if self.fn is network:
            got = sorted_in_numpy(*args, **kwargs)
            if got is not None:
                return got
        return call(self, *args, **kwargs)

    kind.__call__ = __call__


if os.environ.get("TRITON_INTERPRET") == "1":
    _patch_once_per_launch()
    _wrap_integers_as_compiled()
    _reduce_bitwise_in_numpy()
    _np_dtypes_once()
    _sort_in_numpy()

settings.register_profile("untimed", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("untimed")

# The folders installed as ssvkit.<folder> (pyproject.toml's package-dir mapping).
_DIRS = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["tool"]
PACKAGES = tuple(p.split(".", 1)[1] for p in _DIRS["setuptools"]["package-dir"] if "." in p)


class _BarePackageRefusal(importlib.abc.MetaPathFinder):
    """Refuses a top-level import of a project folder's name: it is ``ssvkit.<name>``."""

    def find_spec(self, name, path=None, target=None):
        if path is None and name.split(".")[0] in PACKAGES:
            raise ModuleNotFoundError(f"No module named {name!r}: it is ssvkit.{name}")
        return None


sys.meta_path.insert(0, _BarePackageRefusal())


def pytest_collection_modifyitems(config, items):
    """Without CUDA, every test marked ``gpu`` is skipped, whichever folders the run collects."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tiny_cpu(monkeypatch):
    """The kernel benchmarks' inputs (``calibration.kernel_inputs``) on the CPU interpreter, in
    fp32 (its bf16 dot is wrong), at the tiny pair's attention geometry."""
    from ssvkit.calibration import kernel_inputs as ki

    monkeypatch.setattr(ki, "DEVICE", "cpu")
    monkeypatch.setattr(ki, "DTYPE", torch.float32)
    names = ("NUM_Q_HEADS", "NUM_KV_HEADS", "HEAD_DIM")
    for name, value in zip(names, ki.GEOMETRIES["tiny"], strict=True):
        monkeypatch.setattr(ki, name, value)


@pytest.fixture
def h200_without_a_profile(monkeypatch):
    """Price the H200 by transfer from the H100 SXM's profile: its own shipped profile is hidden
    (``tests/cli/test_h200_profile.py`` tests the H200 priced by its own profile)."""
    from ssvkit.perfmodel import profiles

    own = profiles.profile_path
    monkeypatch.setattr(profiles, "profile_path", lambda gpu: None if gpu == "h200" else own(gpu))
