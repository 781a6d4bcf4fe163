"""The argument parser of every command line (``ssvkit`` and the ``python -m`` entry points of
the packages): a usage error is one line on stderr naming what was wrong, exit code 2, no usage
block and no traceback."""

from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line on stderr, exit code 2."""

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")
