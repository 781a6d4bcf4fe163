"""Analytic and roofline performance models of speculative decoding with dynamic sparse attention.

Pure Python and numpy; never imports torch. Every function returns seconds, bytes or FLOPs (SI
units, the unit in the name) and documents its formula, its assumptions, what it ignores and the
seed paper and equation it comes from. ``perfmodel.step`` assembles them into per-op breakdowns
of a decode or verification step; ``perfmodel.predictor`` turns op counts into seconds with a
provenance label (``datasheet`` or ``calibrated:<profile id>``).
"""
