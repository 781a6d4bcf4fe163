"""Regenerate the README's calibration-accuracy block from ``ssvkit validate --markdown``.

python -m calibration.readme          # rewrites the block between the validate markers
"""

from __future__ import annotations

import io
import re
from contextlib import redirect_stdout
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"(<!-- validate:begin -->\n).*?(<!-- validate:end -->)", re.S)


def current_block() -> str:
    from ssvkit.cli import main

    buf = io.StringIO()
    with redirect_stdout(buf):
        main(["validate", "--markdown"])
    return buf.getvalue()


def render(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + current_block() + m.group(2), text)


if __name__ == "__main__":
    README.write_text(render(README.read_text()))
