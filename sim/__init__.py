"""Discrete-event (simpy) models of the draft/verify loop, of PRR, Saguaro SSD and SparseSpec,
and of serving.

Every duration comes from ``perfmodel`` through cost tables built once per run
(``sim.tables``); acceptance is iid, positional, tree-shaped or replayed from a round trace
(``sim.acceptance``, ``perfmodel.trace``, format in ``docs/trace-format.md``). Entry point::

    from ssvkit.sim.config import SimConfig
    from ssvkit.sim.scenarios import simulate
    result = simulate(SimConfig(scenario="ssv", num_tokens=2048))
    result.figures["simulated_tokens_per_s"]

Modules: ``config`` (frozen configs), ``acceptance``, ``overlap`` (per-layer overlaps),
``tables``, ``recorder``, ``workload`` (seeded streams, lengths, arrivals), ``setup`` (what
every scenario builds first, and its ``ScenarioRun`` result), ``loop`` (ar/sd/ssv), ``prr``,
``ssd``, ``sparsespec``, ``serving``, ``scenarios`` (the runners' table, build and run),
``writers`` (CSV, Chrome trace, Gantt PNG, trace JSONL).
"""
