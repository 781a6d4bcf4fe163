"""``python -m ssvkit.cli``: the console script without its installed entry point."""

import sys

from ssvkit.cli import main

sys.exit(main())
