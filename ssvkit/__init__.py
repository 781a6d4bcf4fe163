"""ssvkit: predict, simulate and measure speculative decoding with dynamic sparse attention.

One import package. Installed, its subpackages live under ``ssvkit/`` (setuptools' package-dir
mapping in pyproject.toml); in a checkout they are the project's top-level folders
(``perfmodel/``, ``kernels/``, ...), found through this package's search path, so code run from
a clone (``python -m ssvkit.kernels.benchmark``) imports the same tree it would installed.
"""

from pathlib import Path

__version__ = "0.1.0"

_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "perfmodel" / "__init__.py").is_file():
    __path__.append(str(_checkout))
