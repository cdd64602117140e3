"""XLA flags for test processes. Compiles are most of the suite's CPU time (a tiny model runs in
milliseconds), and the cheapest CPU backend optimisation cuts their CPU time by about a third
(tests/test_sampling.py: 81 -> 54 CPU-seconds); the tests check results, not speed."""

import os
from pathlib import Path

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def command_env(**extra: str) -> dict[str, str]:
    """The clean environment a command under test runs in (the repository on PYTHONPATH, a bare PATH, none of the
    test process's other variables: one CPU device, as a user's shell), plus FAST_COMPILE and the session's
    persistent compilation cache (tests/conftest.py), so that a program the suite compiled once, in any process, is
    not compiled again. `extra`: more variables."""
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin", "XLA_FLAGS": FAST_COMPILE}
    env.update({k: v for k, v in os.environ.items() if k.startswith("JAX_") and "CACHE" in k})
    return {**env, **extra}
