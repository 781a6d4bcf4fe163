"""Validation: the engine and the planner run together on a GPU and compared with the
prediction -- the planner evaluation, the end-to-end campaign and its report, the producers of
the other measurements of record, and the campaign runner that regenerates them.

The top layer of the library: it imports every layer below (the engine and the planner
together only here) and nothing below imports it. The measurements of record ship as package
data under ``validation/data/`` (``validation.records``), indexed in
``validation/data/INDEX.md``. Importing this package needs neither torch nor a GPU; the
modules that decode (``bench`` and what runs on it) import torch when they build a model.
"""
