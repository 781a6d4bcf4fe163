"""ssvkit: predict, simulate and measure speculative decoding with dynamic sparse attention.

One import package. Installed, its subpackages live under ``ssvkit/`` (setuptools' package-dir
mapping in pyproject.toml); in a checkout they are the project's top-level folders
(``perfmodel/``, ``kernels/``, ...), found through this package's search path, so code run from
a clone (``python -m ssvkit.kernels.benchmark``) imports the same tree it would installed.
"""

import os
import platform
from pathlib import Path

__version__ = "0.1.0"

# The calibration fits (least squares with flat optima, ``calibration.fit_class``) stop at
# points that depend on the floating-point kernels numpy's and scipy's OpenBLAS picks for the
# CPU: refitted on an AVX-512 machine, the leave-one-out and cross-GPU sets of the committed
# rows differ from an AVX2 machine's. An x86-64 process that imports ssvkit before numpy takes
# OpenBLAS's Haswell (AVX2) kernels, which every such CPU runs, so that every machine derives
# the committed figures; a value already in the environment wins.
if platform.machine().lower() in ("x86_64", "amd64"):
    os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "perfmodel" / "__init__.py").is_file():
    __path__.append(str(_checkout))
