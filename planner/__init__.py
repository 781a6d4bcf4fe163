"""Strategy space, offline per-context-regime rankings from the calibrated model, and the online
controller the engine calls after each verification round (``planner.controller``, with its
settings, estimators, acceptance trigger, shadow-walk tracker, candidate book and re-score in
modules of their own).
"""
