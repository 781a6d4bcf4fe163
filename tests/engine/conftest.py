"""Engine tests: tiny random models on the CPU (torch path), the real Triton kernels under the
CPU interpreter (``tests/conftest.py`` selects it), and GPU-only tests marked ``gpu`` (skipped
without CUDA, ``tests/conftest.py``). Helpers live in ``engine_helpers.py`` (a unique module
name: several test folders have a ``conftest``).
"""
