"""ssvkit: the console script that fronts perfmodel, sim, calibration, engine and planner."""

__version__ = "0.1.0"
