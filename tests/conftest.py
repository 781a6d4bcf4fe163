"""Settings of the whole test session that keep verdicts off the wall clock and the machine's
load.

CPU thread pools: one thread each, for this process and the processes it starts (notebook
kernels, CLI subprocesses), unless the environment already says otherwise. The tests' models
and arrays are tiny: a second thread gains them nothing, while on a machine whose cores are
busy with other work a pool waits at every operation for its descheduled thread -- the engine's
CPU tests ran about 3x slower with two threads than with one beside a single busy process on a
2-core machine, and up to 70x under heavier load. Set here, before any test module imports
torch or numpy, which read these variables once, at import.

Hypothesis: no per-example deadline and no too-slow health check (both time examples on the
wall clock, which a loaded machine stretches); a property that holds passes however long its
examples take.
"""

import os

from hypothesis import HealthCheck, settings

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

settings.register_profile("untimed", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("untimed")
