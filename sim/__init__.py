"""Discrete-event (simpy) models of the draft/verify loop, of PRR, Saguaro SSD and SparseSpec,
and of serving.

Every duration comes from ``perfmodel`` through cost tables built once per run
(``sim.tables``); acceptance is iid, positional, tree-shaped or replayed from a round trace
(``sim.acceptance``, ``perfmodel.trace``, format in ``docs/trace-format.md``). Entry point::

    from ssvkit.sim.config import SimConfig
    from ssvkit.sim.scenarios import simulate
    result = simulate(SimConfig(scenario="ssv", num_tokens=2048))
    result.figures["simulated_tokens_per_s"]

A module per scenario (``loop`` for ar/sd/ssv, ``prr``, ``ssd``, ``sparsespec``, ``serving``),
built by ``setup`` and run from ``scenarios``; ``writers``: CSV, Chrome trace, Gantt PNG, JSONL.
"""
