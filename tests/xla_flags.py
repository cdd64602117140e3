"""XLA flags for test processes. Compiles are most of the suite's CPU time (a tiny model runs in
milliseconds), and the cheapest CPU backend optimisation cuts their CPU time by about a third
(tests/test_sampling.py: 81 -> 54 CPU-seconds); the tests check results, not speed. XLA's older CPU fusion
emitters (`--xla_cpu_use_fusion_emitters=false`) compile the tiny GRPO step about 3x faster again (8.1 -> 2.6 s,
tests/train/test_train_step.py: 55 -> 31 CPU-seconds) and run it ~20% slower, so they are for tests only: the
commands keep XLA's defaults (benchmarks/RESULTS.md, "Test suite", 2026-12-02)."""

import os
from pathlib import Path

FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
                " --xla_cpu_use_fusion_emitters=false")


def command_env(**extra: str) -> dict[str, str]:
    """The clean environment a command under test runs in (the repository on PYTHONPATH, a bare PATH, none of the
    test process's other variables: one CPU device, as a user's shell), plus FAST_COMPILE and the session's
    persistent compilation cache (tests/conftest.py), so that a program the suite compiled once, in any process, is
    not compiled again. `extra`: more variables."""
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin", "XLA_FLAGS": FAST_COMPILE}
    env.update({k: v for k, v in os.environ.items() if k.startswith("JAX_") and "CACHE" in k})
    return {**env, **extra}
