"""Helpers shared by the sim tests (a plain module: tests/*/conftest.py names would clash)."""

from ssvkit.sim.config import SimConfig
from ssvkit.sim.scenarios import simulate

# Short contexts keep cost tables and runs small; the physics does not change.
BASE = dict(context_len=8192, timeline_rounds=8)


def run(scenario: str, **kw):
    return simulate(SimConfig(scenario=scenario, **{**BASE, **kw}))


def value(result, name):
    return result.figures[name]["value"]
