"""What-if capacity planning at scale: grids of models x GPUs x TP x context x batch x
acceptance x strategies evaluated with perfmodel's vectorised step model (optionally a DES run
per point), capacity searches on the simulator's serving scenario, and plots of saved sweeps.

``sweep.spec`` describes a grid and ``sweep.grid`` builds one from flags or a file;
``sweep.runner.run_sweep`` evaluates it on this process, local
processes or a Dask cluster (identical results); ``sweep.table`` reads and writes CSV/Parquet;
``sweep.plots`` draws heatmaps, Pareto fronts, rooflines and capacity curves. The base install
(numpy, scipy, simpy, matplotlib) runs all of it with CSV output and local processes; Parquet,
pandas frames, YAML grids and Dask come with the ``sweep`` extra.
"""
