"""Strategy space, offline per-context-regime rankings from the calibrated model, and the online
controller the engine calls after each verification round.
"""
