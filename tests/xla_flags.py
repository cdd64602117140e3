"""XLA flags for test processes. Compiles are most of the suite's CPU time (a tiny model runs in
milliseconds), and the cheapest CPU backend optimisation cuts their CPU time by about a third
(tests/test_sampling.py: 81 -> 54 CPU-seconds); the tests check results, not speed."""

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
