"""GPU sweeps, fitted efficiency profiles and measured-vs-predicted error reports.

Measured rows live under ``calibration/profiles/<gpu>/`` with their provenance; importing this
package needs neither torch nor a GPU.
"""
